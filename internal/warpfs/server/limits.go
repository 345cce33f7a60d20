package server

// DataWarp's write protection (spec §5.3), enforced by the storage node on every request that
// reaches it, whatever the transport (a remote connection or an in-process mount) and
// whichever volume (a namespace or a fragment's stripe objects):
//
//   - the write window: a fragment takes at most WriteLimit bytes of writes within any
//     WindowLength; past it every change to the fragment (write, create, truncate, ...) fails
//     with EROFS until the window cools down (window.go);
//   - MFC: a namespace creates at most MaxFilesCreated files; the next create fails with
//     EMFILE;
//   - MFS: no file grows past MaxFileSize (EFBIG), enforced in volume.go.
//
// A Fragment also holds the data path's counters of the fragment (counters.go), which the
// agent reports to the controller (agentapi.FragmentUsage) and saves with the fragment.

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/units"
)

// FragmentLimits are a fragment's write window.
type FragmentLimits struct {
	WriteLimit   uint64        // bytes per window; 0: no window
	WindowLength time.Duration // the window's length
}

// Fragment is one fragment's counters and write window, shared by every session of the
// fragment's volumes on this node. Safe for concurrent use.
type Fragment struct {
	ID, Instance int64
	// Job is the session's token (a job id, a persistent instance's name) for the log; set
	// before the fragment is shared.
	Job string
	// OnMediaError, when set (before the fragment is shared), hears of every request its file
	// system failed with EIO or EUCLEAN: the SSD's or its file system's failures, not the
	// user's. The agent counts them toward draining the node (controller.auto_drain_failures).
	OnMediaError func(op string, errno syscall.Errno)
	log          *slog.Logger
	now          func() time.Time

	counters // atomic, counters.go

	limited  atomic.Bool // lim.WriteLimit > 0: writes go through the window
	readOnly atomic.Bool // tripped, for the hot path: writable without the lock while false

	mu       sync.Mutex
	lim      FragmentLimits
	win      window
	tripped  bool // the window was over its limit at the last look (for the log)
	ns       map[int64]*Namespace
	clients  map[string]*Client
	restored bool
}

// NewFragment returns fragment id of instance's counters, with its write window.
func NewFragment(id, instance int64, lim FragmentLimits, log *slog.Logger) *Fragment {
	if log == nil {
		log = slog.Default()
	}
	f := &Fragment{ID: id, Instance: instance, log: log, now: time.Now,
		ns: map[int64]*Namespace{}, clients: map[string]*Client{}}
	f.SetLimits(lim)
	return f
}

// SetLimits changes the write window (what was written stays counted).
func (f *Fragment) SetLimits(lim FragmentLimits) {
	if lim.WriteLimit == 0 || lim.WindowLength <= 0 {
		lim = FragmentLimits{}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lim.WindowLength != lim.WindowLength {
		f.win = newWindow(int64(lim.WindowLength))
	}
	f.lim = lim
	f.limited.Store(lim.WriteLimit > 0)
}

// Limits is the fragment's write window.
func (f *Fragment) Limits() FragmentLimits {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lim
}

// WindowLimited says whether the fragment has a write window: then every write must go
// through the server, which counts it (no FUSE write passthrough).
func (f *Fragment) WindowLimited() bool {
	return f != nil && f.limited.Load()
}

// Namespace returns namespace id's share of the fragment's counters, made on first use.
func (f *Fragment) Namespace(id int64) *Namespace {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.ns[id]
	if n == nil {
		n = &Namespace{ID: id}
		n.log, n.instance, n.fragment, n.job = f.log, f.Instance, f.ID, &f.Job
		f.ns[id] = n
	}
	return n
}

// Client returns compute node name's share of the fragment's counters, made on first use.
func (f *Fragment) Client(name string) *Client {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.clients[name]
	if c == nil {
		c = &Client{Node: name}
		f.clients[name] = c
	}
	return c
}

// checkWritable refuses a change to the fragment while its window is over the limit.
func (f *Fragment) checkWritable() syscall.Errno {
	if f == nil || !f.limited.Load() || !f.readOnly.Load() {
		return 0 // only a write trips the window (wrote), and it sets readOnly
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lim.WriteLimit == 0 {
		return 0
	}
	now := f.now().UnixNano()
	if f.win.sum(now) >= f.lim.WriteLimit {
		f.trip(now)
		return syscall.EROFS
	}
	f.cooled()
	return 0
}

// wrote counts n bytes written to the fragment in its window. The write that crosses the
// limit is done; the fragment is read-only from then on.
func (f *Fragment) wrote(n uint64) {
	if !f.limited.Load() {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now().UnixNano()
	if f.win.add(n, now) >= f.lim.WriteLimit && f.lim.WriteLimit > 0 {
		f.trip(now)
	}
}

// trip logs, once per crossing, that the window is over its limit; f.mu is held.
func (f *Fragment) trip(now int64) {
	if f.tripped {
		return
	}
	f.tripped = true
	f.readOnly.Store(true)
	f.log.Warn("warpfs: write limit reached: the fragment is read-only (EROFS) until its write window cools down",
		"job", f.Job, "instance", f.Instance, "fragment", f.ID,
		"written", units.FormatHuman(f.win.sum(now)), "write_limit", units.FormatHuman(f.lim.WriteLimit),
		"window", f.lim.WindowLength.String(),
		"writable_at", time.Unix(0, f.win.coolsAt(f.lim.WriteLimit, now)).UTC().Format(time.RFC3339))
}

// cooled logs that a fragment that was read-only takes writes again; f.mu is held.
func (f *Fragment) cooled() {
	if !f.tripped {
		return
	}
	f.tripped = false
	f.readOnly.Store(false)
	f.log.Info("warpfs: write window cooled down: the fragment takes writes again", "job", f.Job, "instance", f.Instance, "fragment", f.ID)
}

// Namespace is one namespace's share of a fragment's counters and its MFC.
type Namespace struct {
	ID int64
	nsCounters
}

// SetLimits sets the namespace's MFC (files it may create here; 0: no limit) and the MFS it
// reports (enforced through the mount's capability, volume.maxFileSize).
func (n *Namespace) SetLimits(maxFilesCreated, maxFileSize uint64) {
	n.mfc.Store(maxFilesCreated)
	n.mfs.Store(maxFileSize)
}

// MaxFilesCreated is the namespace's MFC here (0: no limit).
func (n *Namespace) MaxFilesCreated() uint64 { return n.mfc.Load() }

// startCreate counts a file about to be created, or refuses it with EMFILE past the MFC.
// done(false) gives the count back when the create failed.
func (n *Namespace) startCreate() syscall.Errno {
	if n == nil {
		return 0
	}
	c := n.filesCreated.Add(1)
	if limit := n.mfc.Load(); limit > 0 && c > limit {
		n.filesCreated.Add(^uint64(0))
		if n.mfcLogged.CompareAndSwap(false, true) && n.log != nil {
			n.log.Warn("warpfs: maximum files created reached (MFC): creates fail with EMFILE (logged once per namespace)",
				"job", *n.job, "instance", n.instance, "fragment", n.fragment, "namespace", n.ID, "files_created", c-1, "max_files_created", limit)
		}
		return syscall.EMFILE
	}
	return 0
}

// createFailed gives back the count of a create startCreate admitted that did not happen.
// spareCreates is how many more files the namespace may create under its MFC, and whether
// it has one.
func (n *Namespace) spareCreates() (uint64, bool) {
	if n == nil {
		return 0, false
	}
	limit := n.mfc.Load()
	if limit == 0 {
		return 0, false
	}
	return limit - min(limit, n.filesCreated.Load()), true
}

func (n *Namespace) createFailed() {
	if n != nil {
		n.filesCreated.Add(^uint64(0))
	}
}
