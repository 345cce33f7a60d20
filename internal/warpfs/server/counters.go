package server

// The data path's counters (DataWarp's RUR dws / dws_server fields): per fragment, per
// namespace on it and per compute node, counted by the server as requests are done (atomic
// adds, nothing allocated per request), reported by the agent (Fragment.Usage) and saved with
// the fragment so that an agent restart carries them on (Fragment.State, RestoreFragment).

import (
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/units"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// counters are a fragment's own.
type counters struct {
	bytesRead, bytesWritten atomic.Uint64
	readOps, writeOps       atomic.Uint64
	filesCreated            atomic.Uint64
	capMax                  atomic.Uint64 // the most the fragment held (peak)
}

// nsCounters are a namespace's share of a fragment's counters, and its MFC.
type nsCounters struct {
	bytesRead, bytesWritten   atomic.Uint64
	filesCreated              atomic.Uint64
	maxOffRead, maxOffWritten atomic.Uint64
	mfc, mfs                  atomic.Uint64
	mfcLogged                 atomic.Bool
	log                       *slog.Logger
	instance, fragment        int64
	job                       *string
}

// Client is one compute node's share of a fragment's counters.
type Client struct {
	Node                    string
	bytesRead, bytesWritten atomic.Uint64
	readOps, writeOps       atomic.Uint64
	filesCreated            atomic.Uint64
}

// account is what one session counts into: its fragment, namespace and client (any may be
// nil: nothing counted). A session of stripe objects counts no files created: its creates
// are a striped file's objects, counted on the metadata server as the file; it counts the
// bytes of the namespace its capability names (the files whose objects they are), not their
// offsets (an object's are not the file's). A stage worker's session (agentapi.StageClient)
// counts in the fragment and as the stages' traffic, not in the namespace's bytes: those are
// the file system's I/O, the stages' bytes are the namespace's stage_bytes_* (DataWarp's
// split, docs/decisions.md).
type account struct {
	frag    *Fragment
	ns      *Namespace // nil: no namespace's bytes (a stage's traffic, or objects of none)
	nsFiles *Namespace // the namespace files are admitted to and counted in (MFC)
	client  *Client
	objects bool // the fragment's stripe objects, not a namespace
}

func newAccount(f *Fragment, namespace int64, client string, objects bool) account {
	if f == nil {
		return account{}
	}
	a := account{frag: f, client: f.Client(client), objects: objects}
	if !objects { // stripe objects belong to no one namespace the server knows
		a.nsFiles = f.Namespace(namespace)
		a.ns = a.nsFiles
	} else if namespace != 0 {
		a.ns = f.Namespace(namespace)
	}
	if strings.HasPrefix(client, agentapi.StageClientPrefix) {
		a.ns = nil
	}
	return a
}

func atomicMax(v *atomic.Uint64, x uint64) {
	for {
		old := v.Load()
		if x <= old || v.CompareAndSwap(old, x) {
			return
		}
	}
}

// read counts a read of n bytes ending at end (the offset after it).
func (a *account) read(n int, end uint64) {
	if a.frag == nil {
		return
	}
	a.frag.readOps.Add(1)
	a.client.readOps.Add(1)
	if n <= 0 {
		return
	}
	a.frag.bytesRead.Add(uint64(n))
	a.client.bytesRead.Add(uint64(n))
	if a.ns != nil {
		a.ns.bytesRead.Add(uint64(n))
		if !a.objects {
			atomicMax(&a.ns.maxOffRead, end)
		}
	}
}

// wrote counts a write of n bytes ending at end, in the counters and the write window.
func (a *account) wrote(n int, end uint64) {
	if a.frag == nil {
		return
	}
	a.frag.writeOps.Add(1)
	a.client.writeOps.Add(1)
	if n <= 0 {
		return
	}
	a.frag.bytesWritten.Add(uint64(n))
	a.client.bytesWritten.Add(uint64(n))
	if a.ns != nil {
		a.ns.bytesWritten.Add(uint64(n))
		if !a.objects {
			atomicMax(&a.ns.maxOffWritten, end)
		}
	}
	a.frag.wrote(uint64(n))
}

// startCreate admits a new file (EMFILE past the namespace's MFC, EROFS while the window is
// over its limit); createDone counts it, or gives the admission back.
func (a *account) startCreate() syscall.Errno {
	if a.frag == nil {
		return 0
	}
	if errno := a.frag.checkWritable(); errno != 0 {
		return errno
	}
	return a.admitFile()
}

// reservable is how many files may be made ahead (stubs.go) at most: half of what the
// namespace's MFC has left, so that the files made ahead never take every create left from
// the creates that do not use them.
func (a *account) reservable() int {
	if a.frag == nil || a.objects {
		return proto.MaxReserve
	}
	spare, limited := a.nsFiles.spareCreates()
	if !limited {
		return proto.MaxReserve
	}
	return int(min(spare/2, proto.MaxReserve))
}

// admitFile counts a file about to be created, or refuses it past the namespace's MFC
// (EMFILE); the caller checked the write window already.
func (a *account) admitFile() syscall.Errno {
	if a.frag == nil || a.objects {
		return 0
	}
	return a.nsFiles.startCreate()
}

// kernelWrote counts what the kernel wrote into a file by itself (FUSE passthrough, only for
// fragments without a write window), as the server learns it: the file's growth, up to end.
func (a *account) kernelWrote(n, end uint64) {
	if a.frag == nil || n == 0 {
		return
	}
	a.frag.bytesWritten.Add(n)
	a.client.bytesWritten.Add(n)
	if a.ns != nil {
		a.ns.bytesWritten.Add(n)
		if !a.objects {
			atomicMax(&a.ns.maxOffWritten, end)
		}
	}
}

// sizeReported records the size a striped file's writes reached (the client's report to the
// metadata server): the namespace's furthest offset written.
func (a *account) sizeReported(size uint64) {
	if a.nsFiles != nil {
		atomicMax(&a.nsFiles.maxOffWritten, size)
	}
}

func (a *account) createDone(ok bool) {
	if a.frag == nil || a.objects {
		return
	}
	if !ok {
		a.nsFiles.createFailed()
		return
	}
	a.frag.filesCreated.Add(1)
	a.client.filesCreated.Add(1)
}

// writable refuses a change while the fragment's window is over its limit.
func (a *account) writable() syscall.Errno { return a.frag.checkWritable() }

// FragmentState is what is saved of a fragment's counters: all of them, and the window's
// buckets (absolute times, so a restart goes on where it was).
type FragmentState struct {
	BytesRead      uint64           `json:"bytes_read"`
	BytesWritten   uint64           `json:"bytes_written"`
	ReadOps        uint64           `json:"read_ops"`
	WriteOps       uint64           `json:"write_ops"`
	FilesCreated   uint64           `json:"files_created"`
	CapacityMax    uint64           `json:"capacity_max"`
	WriteLimit     uint64           `json:"write_limit"`
	WindowLength   int64            `json:"window_length_ns"`
	Window         []windowSlot     `json:"window,omitempty"`
	MaxWindowWrite uint64           `json:"max_window_write"`
	Namespaces     []NamespaceState `json:"namespaces,omitempty"`
	Clients        []ClientState    `json:"clients,omitempty"`
}

// NamespaceState is what is saved of a namespace's counters, with its limits.
type NamespaceState struct {
	ID               int64  `json:"id"`
	BytesRead        uint64 `json:"bytes_read"`
	BytesWritten     uint64 `json:"bytes_written"`
	FilesCreated     uint64 `json:"files_created"`
	MaxOffsetRead    uint64 `json:"max_offset_read"`
	MaxOffsetWritten uint64 `json:"max_offset_written"`
	MaxFilesCreated  uint64 `json:"max_files_created"`
	MaxFileSize      uint64 `json:"max_file_size"`
}

// ClientState is what is saved of a compute node's counters.
type ClientState struct {
	Node         string `json:"node"`
	BytesRead    uint64 `json:"bytes_read"`
	BytesWritten uint64 `json:"bytes_written"`
	ReadOps      uint64 `json:"read_ops"`
	WriteOps     uint64 `json:"write_ops"`
	FilesCreated uint64 `json:"files_created"`
}

// NoteCapacity records the bytes the fragment holds now, for its peak (CapacityMax).
func (f *Fragment) NoteCapacity(used uint64) { atomicMax(&f.capMax, used) }

// State is a snapshot of the counters, to save.
func (f *Fragment) State() FragmentState {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := FragmentState{
		BytesRead: f.bytesRead.Load(), BytesWritten: f.bytesWritten.Load(),
		ReadOps: f.readOps.Load(), WriteOps: f.writeOps.Load(), FilesCreated: f.filesCreated.Load(),
		CapacityMax: f.capMax.Load(), WriteLimit: f.lim.WriteLimit, WindowLength: int64(f.lim.WindowLength),
		MaxWindowWrite: f.win.peak,
	}
	if f.win.width != 0 {
		for _, s := range f.win.slot {
			if s.Bytes > 0 {
				st.Window = append(st.Window, s)
			}
		}
	}
	for _, n := range f.ns {
		st.Namespaces = append(st.Namespaces, NamespaceState{ID: n.ID,
			BytesRead: n.bytesRead.Load(), BytesWritten: n.bytesWritten.Load(), FilesCreated: n.filesCreated.Load(),
			MaxOffsetRead: n.maxOffRead.Load(), MaxOffsetWritten: n.maxOffWritten.Load(),
			MaxFilesCreated: n.mfc.Load(), MaxFileSize: n.mfs.Load()})
	}
	slices.SortFunc(st.Namespaces, func(a, b NamespaceState) int { return int(a.ID - b.ID) })
	for _, c := range f.clients {
		st.Clients = append(st.Clients, ClientState{Node: c.Node,
			BytesRead: c.bytesRead.Load(), BytesWritten: c.bytesWritten.Load(),
			ReadOps: c.readOps.Load(), WriteOps: c.writeOps.Load(), FilesCreated: c.filesCreated.Load()})
	}
	slices.SortFunc(st.Clients, func(a, b ClientState) int { return cmpString(a.Node, b.Node) })
	return st
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// RestoreFragment returns fragment id's counters as saved (st nil: from zero, Restored
// reported), with the write window lim.
func RestoreFragment(id, instance int64, lim FragmentLimits, st *FragmentState, log *slog.Logger) *Fragment {
	f := NewFragment(id, instance, lim, log)
	if st == nil {
		f.restored = true
		return f
	}
	f.bytesRead.Store(st.BytesRead)
	f.bytesWritten.Store(st.BytesWritten)
	f.readOps.Store(st.ReadOps)
	f.writeOps.Store(st.WriteOps)
	f.filesCreated.Store(st.FilesCreated)
	f.capMax.Store(st.CapacityMax)
	f.mu.Lock()
	if st.WindowLength == int64(f.lim.WindowLength) {
		if total := f.win.restore(st.Window); f.lim.WriteLimit > 0 && total >= f.lim.WriteLimit {
			f.readOnly.Store(true) // the next change checks whether it cooled down meanwhile
		}
	}
	f.win.peak = st.MaxWindowWrite
	f.mu.Unlock()
	for _, ns := range st.Namespaces {
		n := f.Namespace(ns.ID)
		n.bytesRead.Store(ns.BytesRead)
		n.bytesWritten.Store(ns.BytesWritten)
		n.filesCreated.Store(ns.FilesCreated)
		n.maxOffRead.Store(ns.MaxOffsetRead)
		n.maxOffWritten.Store(ns.MaxOffsetWritten)
		n.SetLimits(ns.MaxFilesCreated, ns.MaxFileSize)
	}
	for _, cs := range st.Clients {
		c := f.Client(cs.Node)
		c.bytesRead.Store(cs.BytesRead)
		c.bytesWritten.Store(cs.BytesWritten)
		c.readOps.Store(cs.ReadOps)
		c.writeOps.Store(cs.WriteOps)
		c.filesCreated.Store(cs.FilesCreated)
	}
	return f
}

// Usage is the fragment's report (agentapi.FragmentUsage): its counters, the window's
// figures now, and capacityUsed, the bytes it holds now.
func (f *Fragment) Usage(capacityUsed uint64) agentapi.FragmentUsage {
	f.NoteCapacity(capacityUsed)
	st := f.State()
	u := agentapi.FragmentUsage{Fragment: f.ID, Instance: f.Instance,
		BytesRead: st.BytesRead, BytesWritten: st.BytesWritten, ReadOps: st.ReadOps, WriteOps: st.WriteOps,
		FilesCreated: st.FilesCreated, CapacityUsed: capacityUsed, CapacityMax: st.CapacityMax,
		WriteLimit: st.WriteLimit, WindowLength: int64(time.Duration(st.WindowLength) / time.Second),
		MaxWindowWrite: st.MaxWindowWrite, Restored: f.restored}
	f.mu.Lock()
	now := f.now().UnixNano()
	u.WindowWritten = f.win.sum(now)
	if f.lim.WriteLimit > 0 && u.WindowWritten >= f.lim.WriteLimit {
		u.ReadOnly = true
		u.ReadOnlyReason = "write window: " + units.FormatHuman(u.WindowWritten) + " written within " + f.lim.WindowLength.String() +
			", limit " + units.FormatHuman(f.lim.WriteLimit) + "; writable again at " +
			time.Unix(0, f.win.coolsAt(f.lim.WriteLimit, now)).UTC().Format(time.RFC3339)
	}
	f.mu.Unlock()
	for _, n := range st.Namespaces {
		u.Namespaces = append(u.Namespaces, agentapi.NamespaceUsage{Namespace: n.ID,
			BytesRead: n.BytesRead, BytesWritten: n.BytesWritten, FilesCreated: n.FilesCreated,
			FilesCreateLimit: n.MaxFilesCreated, FileSizeLimit: n.MaxFileSize,
			MaxOffsetRead: n.MaxOffsetRead, MaxOffsetWritten: n.MaxOffsetWritten})
	}
	for _, c := range st.Clients {
		u.Clients = append(u.Clients, agentapi.ClientUsage{Node: c.Node, BytesRead: c.BytesRead, BytesWritten: c.BytesWritten,
			ReadOps: c.ReadOps, WriteOps: c.WriteOps, FilesCreated: c.FilesCreated})
	}
	return u
}
