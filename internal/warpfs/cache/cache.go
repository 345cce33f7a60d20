package cache

import (
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

type extent struct {
	f      *file
	idx    uint64 // file bytes [idx×E, (idx+1)×E)
	state  State
	end    uint64 // bytes [0, end) of the extent hold data; past it the object is a hole
	charge uint64 // end rounded up to a Block: what the extent takes of the capacity

	dlo, dhi                 uint64 // hull of the writes not yet in a flush (empty: dlo ≥ dhi)
	oldest, newest           uint64 // file write seqs of the oldest and newest of them
	flo, fhi                 uint64 // hull being flushed
	flushOldest, flushNewest uint64

	pins    int32 // reads admitted and not done
	writers int32 // writes admitted and not done
	fetchID uint64
	flushID uint64
	stale   bool // its fetched data predates an invalidation: drop, never serve
	fresh   bool // made by writes not done yet, with no data before them: reads wait

	logLo, logHi, logEnd uint64 // what the log says of its dirty hull (logHi 0: nothing)

	in         *list
	prev, next *extent
}

func (e *extent) hullEmpty() bool { return e.dlo >= e.dhi }

// pendingBefore: some write with seq ≤ s is not known to be on the PFS.
func (e *extent) pendingBefore(s uint64) bool {
	if e.oldest != 0 && e.oldest <= s {
		return true
	}
	return e.state == Flushing && e.flushOldest != 0 && e.flushOldest <= s
}

type file struct {
	key      FileKey
	path     string
	layout   stripe.Layout
	striped  bool
	slot     uint64
	ext      map[uint64]*extent
	handles  int
	seen     Attrs
	pfsEnd   uint64 // the PFS holds no data of the file past this (as far as this server knows)
	doomed   bool   // unlinked: dropped at the last close, never flushed but for space
	override Override
	policy   Policy

	dirty, flushing uint64 // charged bytes of its dirty (incl. flushing) and flushing extents
	seq             uint64 // writes admitted
	unsynced        bool   // flushed since the PFS file was last synced
	err             syscall.Errno
	retryAt         time.Time
	backoff         time.Duration
	barrier         *waiter // a truncate in progress: the file's reads, writes, flushes wait
	thresh          bool    // flushing down to half its modified threshold

	logNo uint32 // its number in the log; 0: not in it
}

type handle struct {
	id     Handle
	f      *file
	objEnd uint64 // where its last read ended, in the object
	raEnd  uint64 // read ahead up to here, in the object
}

type wkind uint8

const (
	wRead wkind = iota
	wWrite
	wSync
	wTruncate
	wDrain
)

type waiter struct {
	id     WaiterID
	kind   wkind
	h      *handle
	f      *file
	off, n uint64

	space   uint64   // blocked on this many bytes of space
	fetches []uint64 // blocked on these fetches
	failErr syscall.Errno

	seq        uint64               // wSync: writes up to this seq must reach the PFS
	set        map[*extent]struct{} // wSync: extents holding such writes
	syncID     uint64               // wSync: the ActSyncPFS in flight
	closeAfter bool                 // wSync from Close: close the handle when done

	size uint64 // wTruncate
	ran  bool   // wTruncate: applied; the barrier holds until TruncateDone
}

type fetchOp struct {
	id        uint64
	f         *file
	exts      []*extent
	rng       Range
	readAhead bool
}

// Cache is one server's cache of one cache instance. It is not safe for concurrent use: the
// I/O layer serialises every call. After each call it persists Log(), then carries out the
// actions the call returned (a slice of the cache's own, valid until the next call): each
// ActFetch, ActFlush and ActSyncPFS is answered later by FetchDone, FlushDone or SyncDone
// with its ID, each held request (Result.Waiter) is answered by exactly one ActWake or
// ActFail.
type Cache struct {
	cfg     Config
	files   map[FileKey]*file
	handles map[Handle]*handle

	nextHandle, nextID, nextWaiter uint64
	nextLogNo                      uint32
	epoch                          uint64

	lru, dirtyQ           list
	lruBytes              uint64
	used, dirty, flushing uint64

	fetchQ          []*fetchOp
	fetches         map[uint64]*fetchOp
	fetchesInFlight int
	flushes         map[uint64][]*extent
	flushesInFlight int
	syncs           map[uint64]*waiter
	over            map[*file]struct{} // files past their modified threshold

	waiters      []*waiter
	spaceWaiters int
	spaceWant    uint64
	wbActive     bool
	draining     bool

	now   time.Time
	out   []Action
	log   []byte
	stats Stats
}

// New returns an empty cache.
func New(cfg Config) (*Cache, error) {
	cfg = cfg.withDefaults()
	switch {
	case cfg.ExtentSize%Block != 0 || cfg.ExtentSize > stripe.MaxSize:
		return nil, fmt.Errorf("extent size %d: expected a multiple of %d up to %d", cfg.ExtentSize, Block, stripe.MaxSize)
	case cfg.Capacity < 4*cfg.ExtentSize:
		return nil, fmt.Errorf("capacity %d: expected at least 4 extents (%d bytes)", cfg.Capacity, 4*cfg.ExtentSize)
	case !(0 < cfg.DirtyLow && cfg.DirtyLow <= cfg.DirtyHigh && cfg.DirtyHigh <= 1):
		return nil, fmt.Errorf("dirty watermarks %v/%v: expected 0 < low ≤ high ≤ 1", cfg.DirtyLow, cfg.DirtyHigh)
	case !(0 < cfg.EvictLow && cfg.EvictLow <= cfg.EvictHigh && cfg.EvictHigh <= 1):
		return nil, fmt.Errorf("eviction watermarks %v/%v: expected 0 < low ≤ high ≤ 1", cfg.EvictLow, cfg.EvictHigh)
	case cfg.MaxFlushesInFlight < 1 || cfg.MaxFetchesInFlight < 1 || cfg.MaxWaiters < 1:
		return nil, errors.New("MaxFlushesInFlight, MaxFetchesInFlight and MaxWaiters must be at least 1")
	}
	return &Cache{cfg: cfg, files: map[FileKey]*file{}, handles: map[Handle]*handle{},
		fetches: map[uint64]*fetchOp{}, flushes: map[uint64][]*extent{}, syncs: map[uint64]*waiter{},
		over: map[*file]struct{}{}}, nil
}

// Config is the cache's configuration, defaults filled in.
func (c *Cache) Config() Config { return c.cfg }

// Stats are the counters and gauges now.
func (c *Cache) Stats() Stats {
	s := c.stats
	s.Used, s.Dirty, s.Flushing = c.used, c.dirty, c.flushing
	return s
}

// MaxRequest is the longest Read or Write the cache admits. A request must also lie within
// one extent: the I/O layer cuts longer ones at extent boundaries. (A request waiting for two
// fetches could see the first evicted while it waits for the second, and many such requests
// thrash; one extent per request is admitted the moment its fetch lands.)
func (c *Cache) MaxRequest() uint64 { return c.cfg.ExtentSize }

func roundUp(n, to uint64) uint64 { return (n + to - 1) / to * to }

func (c *Cache) begin() { c.out = c.out[:0] }

func (c *Cache) emit(a Action) { c.out = append(c.out, a) }

func ready() Result                     { return Result{} }
func failed(errno syscall.Errno) Result { return Result{Status: Fail, Errno: errno} }

// --- the stripe map -----------------------------------------------------------------------

func (c *Cache) held(f *file, idx uint64) bool {
	if !f.striped {
		return true
	}
	return f.layout.Server(idx*c.cfg.ExtentSize/f.layout.Size) == c.cfg.Server
}

func (c *Cache) objOff(f *file, off uint64) uint64 {
	if !f.striped {
		return off
	}
	l := f.layout
	i := off / l.Size
	return (i/uint64(l.Width))*l.Size + off%l.Size
}

func (c *Cache) fileOff(f *file, obj uint64) uint64 {
	if !f.striped {
		return obj
	}
	l := f.layout
	i := (obj/l.Size)*uint64(l.Width) + f.slot
	return i*l.Size + obj%l.Size
}

// pfsPart is how many bytes at the start of extent idx the PFS holds (the rest are zeros).
func (c *Cache) pfsPart(f *file, idx uint64) uint64 {
	start := idx * c.cfg.ExtentSize
	if start >= f.pfsEnd {
		return 0
	}
	return min(c.cfg.ExtentSize, f.pfsEnd-start)
}

// span is the first and last extent of [off, off+n), n > 0.
func (c *Cache) span(off, n uint64) (uint64, uint64) {
	return off / c.cfg.ExtentSize, (off + n - 1) / c.cfg.ExtentSize
}

// within is the part of [off, off+n) in extent idx, relative to the extent.
func (c *Cache) within(idx, off, n uint64) (lo, hi uint64) {
	start := idx * c.cfg.ExtentSize
	lo = max(off, start) - start
	hi = min(off+n, start+c.cfg.ExtentSize) - start
	return
}

func (c *Cache) checkRange(f *file, off, n uint64) syscall.Errno {
	if off+n < off || (off+n)/c.cfg.ExtentSize >= 1<<52 {
		return syscall.EINVAL
	}
	first, last := c.span(off, n)
	if first != last || !c.held(f, first) {
		return syscall.EINVAL
	}
	return 0
}

func (c *Cache) extentRange(e *extent, lo, hi uint64) Range {
	off := e.idx*c.cfg.ExtentSize + lo
	return Range{Off: off, Len: hi - lo, ObjOff: c.objOff(e.f, off)}
}

// --- extents: charge, lists, states -------------------------------------------------------

func (c *Cache) newExtent(f *file, idx uint64) *extent {
	e := &extent{f: f, idx: idx, dlo: c.cfg.ExtentSize}
	f.ext[idx] = e
	return e
}

// setCharge changes what e takes of the capacity (the caller made room).
func (c *Cache) setCharge(e *extent, ch uint64) {
	c.used += ch - e.charge
	if e.state == Dirty || e.state == Flushing {
		c.dirty += ch - e.charge
		e.f.dirty += ch - e.charge
	}
	if e.state == Flushing {
		c.flushing += ch - e.charge
		e.f.flushing += ch - e.charge
	}
	if e.in == &c.lru {
		c.lruBytes += ch - e.charge
	}
	e.charge = ch
}

func (c *Cache) lruPush(e *extent) {
	if e.state == Clean && e.pins == 0 && e.in == nil {
		c.lru.pushBack(e)
		c.lruBytes += e.charge
	}
}

func (c *Cache) unlist(e *extent) {
	if e.in == &c.lru {
		c.lruBytes -= e.charge
	}
	e.unlink()
}

// setState moves e to s, keeping the dirty counters and lists.
func (c *Cache) setState(e *extent, s State) {
	wasDirty := e.state == Dirty || e.state == Flushing
	isDirty := s == Dirty || s == Flushing
	if wasDirty && !isDirty {
		c.dirty -= e.charge
		e.f.dirty -= e.charge
	} else if !wasDirty && isDirty {
		c.dirty += e.charge
		e.f.dirty += e.charge
	}
	if e.state == Flushing && s != Flushing {
		c.flushing -= e.charge
		e.f.flushing -= e.charge
	} else if e.state != Flushing && s == Flushing {
		c.flushing += e.charge
		e.f.flushing += e.charge
	}
	c.unlist(e)
	e.state = s
	switch s {
	case Clean:
		e.dlo, e.dhi, e.oldest, e.newest = c.cfg.ExtentSize, 0, 0, 0
		e.logLo, e.logHi, e.logEnd = 0, 0, 0
		c.lruPush(e)
	case Dirty:
		c.dirtyQ.pushBack(e)
	}
}

// remove takes e out of the cache (its data is gone or never to be used).
func (c *Cache) remove(e *extent) {
	c.setState(e, Absent)
	c.used -= e.charge
	e.charge = 0
	if e.f.ext[e.idx] == e {
		delete(e.f.ext, e.idx)
	}
}

func (c *Cache) evict(e *extent) {
	c.stats.Evictions++
	c.stats.EvictedBytes += e.charge
	c.emit(Action{Kind: ActEvict, File: e.f.key, Path: e.f.path, Range: c.extentRange(e, 0, c.cfg.ExtentSize)})
	c.remove(e)
	c.forget(e.f)
}

// forget removes a file with nothing cached and no handles.
func (c *Cache) forget(f *file) {
	if f.handles == 0 && len(f.ext) == 0 && f.barrier == nil && !f.doomed && c.files[f.key] == f {
		delete(c.files, f.key)
		delete(c.over, f)
	}
}

func (c *Cache) pin(e *extent) {
	if e.pins == 0 && e.in == &c.lru {
		c.unlist(e)
	}
	e.pins++
}

func (c *Cache) unpin(e *extent) {
	if e.pins == 0 {
		return
	}
	e.pins--
	if e.pins == 0 && e.state == Clean {
		switch {
		case e.stale:
			c.evict(e)
		case e.end == 0: // a known hole, made for the read: nothing to keep
			c.remove(e)
			c.forget(e.f)
		default:
			c.lruPush(e)
		}
	}
}

// makeRoom evicts least recently used clean extents until need bytes are free, never one of
// f's extents first..last (the request's own). It reports whether need bytes are free.
func (c *Cache) makeRoom(need uint64, f *file, first, last uint64) bool {
	for e := c.lru.head; c.used+need > c.cfg.Capacity && e != nil; {
		next := e.next
		if e.f != f || e.idx < first || e.idx > last {
			c.evict(e)
		}
		e = next
	}
	return c.used+need <= c.cfg.Capacity
}

// reserve checks that need more bytes fit, evicting clean extents for them. A request behind
// one already waiting for space waits too (FIFO), unless it is that one being retried.
func (c *Cache) reserve(w *waiter, need uint64, fifoBlocked bool) bool {
	if need == 0 {
		return true
	}
	if fifoBlocked || (w.id == 0 && c.spaceWaiters > 0) {
		w.space = need
		return false
	}
	if c.makeRoom(need, w.f, w.off/c.cfg.ExtentSize, (w.off+w.n-1)/c.cfg.ExtentSize) {
		return true
	}
	w.space = need
	return false
}

// --- open, close, policy ------------------------------------------------------------------

// Opened is what Open says.
type Opened struct {
	Handle        Handle
	Invalidated   bool   // the PFS file changed since the cache last saw it: clean data dropped
	ConflictBytes uint64 // dirty bytes kept although the PFS file changed (they win when flushed)
}

// Open opens the PFS file key (found at path, striped by layout; a zero layout: the server
// holds the whole file) whose fstat said attrs. Close-to-open: if attrs differ from what the
// cache last saw of the file, its clean extents are dropped; dirty ones are kept.
func (c *Cache) Open(key FileKey, path string, layout stripe.Layout, attrs Attrs, o Override) (Opened, []Action, error) {
	c.begin()
	f := c.files[key]
	var res Opened
	if f == nil {
		f = &file{key: key, ext: map[uint64]*extent{}, seen: attrs, pfsEnd: attrs.Size}
		if err := c.setLayout(f, layout); err != nil {
			return res, nil, err
		}
		c.files[key] = f
	}
	f.handles++
	if f.seen != attrs {
		res.Invalidated = true
		res.ConflictBytes = c.invalidate(f, attrs)
	}
	f.path = path
	f.override = o
	f.policy = o.Apply(c.cfg.Defaults)
	c.nextHandle++
	h := &handle{id: Handle(c.nextHandle), f: f}
	c.handles[h.id] = h
	res.Handle = h.id
	c.pump()
	return res, c.out, nil
}

func (c *Cache) setLayout(f *file, l stripe.Layout) error {
	if l == (stripe.Layout{}) {
		return nil
	}
	if err := l.Validate(); err != nil {
		return err
	}
	if l.Size%c.cfg.ExtentSize != 0 {
		return fmt.Errorf("stripe size %d is not a multiple of the cache's extent size %d", l.Size, c.cfg.ExtentSize)
	}
	if l.Slot(c.cfg.Server) < 0 {
		return fmt.Errorf("server %d holds no stripe of the file (%s)", c.cfg.Server, l.Text())
	}
	f.layout, f.striped, f.slot = l, true, uint64(l.Slot(c.cfg.Server))
	return nil
}

// invalidate drops f's clean data (the PFS file changed: attrs), keeps its dirty data, and
// returns the dirty bytes kept.
func (c *Cache) invalidate(f *file, attrs Attrs) uint64 {
	var kept uint64
	for _, e := range f.ext {
		switch e.state {
		case Clean:
			if e.pins == 0 {
				c.evict(e)
			} else {
				e.stale = true
			}
		case Fetching:
			e.stale = true
		case Dirty, Flushing:
			kept += e.charge
		}
	}
	f.seen, f.pfsEnd = attrs, attrs.Size
	c.stats.ConflictBytes += kept
	c.logAttrs(f)
	return kept
}

// NoteAttrs records the PFS's attributes of key after a change the instance made itself
// (truncate, utimes, another server's flush as the metadata server reports it), so that the
// next open does not take it for someone else's.
func (c *Cache) NoteAttrs(key FileKey, attrs Attrs) {
	if f := c.files[key]; f != nil {
		f.seen = attrs
		c.logAttrs(f)
	}
}

// SetOverride sets an open file's policy overrides (libdatawarp); false if it is not open.
func (c *Cache) SetOverride(key FileKey, o Override) bool {
	f := c.files[key]
	if f == nil || f.handles == 0 {
		return false
	}
	f.override, f.policy = o, o.Apply(c.cfg.Defaults)
	return true
}

// Policy is an open file's policy (the instance's defaults if the file is not open).
func (c *Cache) Policy(key FileKey) Policy {
	if f := c.files[key]; f != nil && f.handles > 0 {
		return f.policy
	}
	return c.cfg.Defaults
}

// Close closes h. With sync_on_close the close waits until the file's dirty data is on the
// PFS and synced, and fails with a flush's error.
func (c *Cache) Close(h Handle) (Result, []Action) {
	c.begin()
	hd := c.handles[h]
	if hd == nil {
		return failed(syscall.EBADF), nil
	}
	if hd.f.policy.SyncOnClose && !hd.f.doomed {
		r := c.sync(hd, true)
		c.pump()
		return r, c.out
	}
	c.closeHandle(hd)
	c.pump()
	return ready(), c.out
}

func (c *Cache) closeHandle(hd *handle) {
	delete(c.handles, hd.id)
	f := hd.f
	f.handles--
	if f.handles == 0 && f.doomed {
		c.drop(f)
		return
	}
	c.forget(f)
}

// Fsync: with sync_to_pfs, wait until the file's writes admitted so far are on the PFS and
// the PFS file is synced; a flush's error since the last sync fails it. Without, Ready (the
// I/O layer syncs the cache's own object).
func (c *Cache) Fsync(h Handle) (Result, []Action) {
	c.begin()
	hd := c.handles[h]
	if hd == nil {
		return failed(syscall.EBADF), nil
	}
	if !hd.f.policy.SyncToPFS || hd.f.doomed {
		return ready(), nil
	}
	r := c.sync(hd, false)
	c.pump()
	return r, c.out
}

// SyncToPFS waits until the file's writes admitted so far are on the PFS and the PFS file is
// synced, whatever its policy (libdatawarp's dw_wait_sync_complete); a flush's error since
// the last sync fails it. A file being removed has nothing to sync.
func (c *Cache) SyncToPFS(h Handle) (Result, []Action) {
	c.begin()
	hd := c.handles[h]
	if hd == nil {
		return failed(syscall.EBADF), nil
	}
	if hd.f.doomed {
		return ready(), nil
	}
	r := c.sync(hd, false)
	c.pump()
	return r, c.out
}

func (c *Cache) sync(hd *handle, closing bool) Result {
	f := hd.f
	if errno := f.err; errno != 0 {
		f.err = 0
		if closing {
			c.closeHandle(hd)
		}
		return failed(errno)
	}
	w := &waiter{kind: wSync, h: hd, f: f, seq: f.seq, set: map[*extent]struct{}{}, closeAfter: closing}
	for _, e := range f.ext {
		if e.pendingBefore(w.seq) {
			w.set[e] = struct{}{}
		}
	}
	if len(w.set) == 0 && !f.unsynced {
		if closing {
			c.closeHandle(hd)
		}
		return ready()
	}
	return c.hold(w)
}

// hold queues w. Past MaxWaiters the request fails EAGAIN.
func (c *Cache) hold(w *waiter) Result {
	if len(c.waiters) >= c.cfg.MaxWaiters {
		if w.closeAfter {
			c.closeHandle(w.h)
		}
		return failed(syscall.EAGAIN)
	}
	c.nextWaiter++
	w.id = WaiterID(c.nextWaiter)
	c.waiters = append(c.waiters, w)
	c.stats.Waits++
	if w.space > 0 {
		c.spaceWaiters++
		c.spaceWant += w.space
	}
	return Result{Status: Wait, Waiter: w.id}
}

// --- reads ---------------------------------------------------------------------------------

// Read admits a read of [off, off+n) of h's file (bytes this server holds, at most
// MaxRequest). Ready: read them from the object now, then ReadDone. Wait: hold it until
// ActWake (then read, then ReadDone) or ActFail.
func (c *Cache) Read(h Handle, off, n uint64) (Result, []Action) {
	c.out = c.out[:0]
	hd := c.handles[h]
	if hd == nil {
		return failed(syscall.EBADF), nil
	}
	if n == 0 {
		return ready(), nil
	}
	f := hd.f
	if errno := c.checkRange(f, off, n); errno != 0 {
		return failed(errno), nil
	}
	// The hot path: one extent, in the cache.
	if f.barrier == nil && off/c.cfg.ExtentSize == (off+n-1)/c.cfg.ExtentSize {
		if e := f.ext[off/c.cfg.ExtentSize]; e != nil && e.state >= Clean && !e.stale && !e.fresh {
			c.pin(e)
			c.stats.Hits++
			c.readAhead(hd, off, n)
			return ready(), c.out
		}
	}
	w := waiter{kind: wRead, h: hd, f: f, off: off, n: n} // on the stack unless held
	if c.admitRead(&w, false, true) {
		c.readAhead(hd, off, n)
		c.pump()
		return ready(), c.out
	}
	held := w
	r := c.hold(&held)
	c.readAhead(hd, off, n)
	c.pump()
	return r, c.out
}

func (c *Cache) admitRead(w *waiter, fifoBlocked, first bool) bool {
	f := w.f
	w.space, w.fetches = 0, w.fetches[:0]
	if f.barrier != nil {
		return false
	}
	lo, hi := c.span(w.off, w.n)
	var need uint64
	var miss []uint64
	stale := false
	for idx := lo; idx <= hi; idx++ {
		e := f.ext[idx]
		switch {
		case e == nil:
			if pp := c.pfsPart(f, idx); pp > 0 {
				need += roundUp(pp, Block)
				miss = append(miss, idx)
			}
		case e.state == Fetching:
			w.fetches = append(w.fetches, e.fetchID)
		case e.stale || e.fresh:
			stale = true // pinned by other reads, it goes at their ReadDone; being written
		}
	}
	if stale {
		return false
	}
	if len(miss) > 0 {
		if !c.reserve(w, need, fifoBlocked) {
			return false
		}
		c.stats.Misses += uint64(len(miss))
		w.fetches = append(w.fetches, c.startFetches(f, miss, nil, false)...)
	}
	if len(w.fetches) > 0 {
		return false
	}
	for idx := lo; idx <= hi; idx++ {
		e := f.ext[idx]
		if e == nil { // past the PFS's data: a known hole, zeros
			e = c.newExtent(f, idx)
			c.setState(e, Clean)
		}
		if first {
			c.stats.Hits++
		}
		c.pin(e)
	}
	return true
}

// ReadDone ends a read Read or ActWake admitted.
func (c *Cache) ReadDone(h Handle, off, n uint64) []Action {
	c.out = c.out[:0]
	hd := c.handles[h]
	if hd == nil || n == 0 {
		return nil
	}
	lo, hi := c.span(off, n)
	for idx := lo; idx <= hi; idx++ {
		if e := hd.f.ext[idx]; e != nil {
			c.unpin(e)
		}
	}
	if len(c.out) > 0 || hd.f.barrier != nil {
		c.pump()
	}
	return c.out
}

// readAhead: a read that starts where h's last one ended in the object (or at its start) is
// sequential; then up to ReadAhead bytes of this server's part of the file after it are
// fetched, into free space only (never evicting, never ahead of a request waiting for space).
func (c *Cache) readAhead(hd *handle, off, n uint64) {
	f := hd.f
	o := c.objOff(f, off)
	seq := o == hd.objEnd || o == 0
	oe := o + n
	hd.objEnd = oe
	ra := f.policy.ReadAhead
	if !seq || ra == 0 || f.barrier != nil {
		return
	}
	from := max(hd.raEnd, roundUp(oe, c.cfg.ExtentSize))
	to := oe + ra
	if from >= oe+ra/2 || from >= to {
		return
	}
	var idxs []uint64
	var need uint64
	for obj := from; obj < to; obj += c.cfg.ExtentSize {
		idx := c.fileOff(f, obj) / c.cfg.ExtentSize
		pp := c.pfsPart(f, idx)
		if pp == 0 {
			break
		}
		hd.raEnd = obj + c.cfg.ExtentSize
		if f.ext[idx] != nil {
			continue
		}
		if c.spaceWaiters > 0 || c.used+need+roundUp(pp, Block) > c.cfg.Capacity {
			break
		}
		need += roundUp(pp, Block)
		idxs = append(idxs, idx)
	}
	if len(idxs) > 0 {
		c.startFetches(f, idxs, nil, true)
	}
}

// startFetches makes the extents idxs (absent) fetching, in ops of adjacent extents, queued;
// it returns the ops' ids. ends[i], if given, is how far extent i is to hold data (≥ what the
// PFS has of it, the rest zeros).
func (c *Cache) startFetches(f *file, idxs, ends []uint64, readAhead bool) []uint64 {
	var ids []uint64
	var op *fetchOp
	for i, idx := range idxs {
		pp := c.pfsPart(f, idx)
		e := c.newExtent(f, idx)
		e.state = Fetching
		e.end = pp
		if ends != nil {
			e.end = max(pp, ends[i])
		}
		c.setCharge(e, roundUp(e.end, Block))
		r := c.extentRange(e, 0, pp)
		if op != nil && op.rng.End() == r.Off && op.rng.ObjOff+op.rng.Len == r.ObjOff &&
			op.rng.Len+r.Len <= c.cfg.MaxIOBytes && op.rng.Len%c.cfg.ExtentSize == 0 {
			op.rng.Len += r.Len
		} else {
			c.nextID++
			op = &fetchOp{id: c.nextID, f: f, rng: r, readAhead: readAhead}
			c.fetches[op.id] = op
			c.fetchQ = append(c.fetchQ, op)
			ids = append(ids, op.id)
		}
		e.fetchID = op.id
		op.exts = append(op.exts, e)
		if readAhead {
			c.stats.ReadAheadBytes += pp
		}
	}
	return ids
}

// FetchDone reports a fetch's outcome. On success its extents are clean; on failure they are
// absent again (the I/O layer punched nothing: the cache asks for it) and the requests
// waiting for them fail EIO.
func (c *Cache) FetchDone(id uint64, err error) []Action {
	c.begin()
	op := c.fetches[id]
	if op == nil {
		return nil
	}
	delete(c.fetches, id)
	c.fetchesInFlight--
	for _, e := range op.exts {
		if e.fetchID != id || e.state != Fetching || e.f.ext[e.idx] != e {
			continue
		}
		if err != nil || e.stale {
			c.emit(Action{Kind: ActEvict, File: e.f.key, Path: e.f.path, Range: c.extentRange(e, 0, c.cfg.ExtentSize)})
			c.remove(e)
			continue
		}
		c.setState(e, Clean)
	}
	if err == nil {
		c.stats.FetchedBytes += op.rng.Len
	}
	if err != nil {
		c.stats.FetchErrors++
		for _, w := range c.waiters {
			for _, fid := range w.fetches {
				if fid == id {
					w.failErr = syscall.EIO
				}
			}
		}
	}
	c.wakeWaiters(id)
	c.pump()
	c.forget(op.f)
	return c.out
}

// --- writes --------------------------------------------------------------------------------

// Write admits a write of [off, off+n) of h's file. Ready: write the data into the object,
// persist Log() (before acknowledging the write), then WriteDone. Wait: hold it until ActWake
// (then the same) or ActFail. A write never fails for the cache's own fullness: it waits
// while the cache evicts and flushes.
func (c *Cache) Write(h Handle, off, n uint64) (Result, []Action) {
	c.begin()
	hd := c.handles[h]
	if hd == nil {
		return failed(syscall.EBADF), nil
	}
	if n == 0 {
		return ready(), nil
	}
	f := hd.f
	if errno := c.checkRange(f, off, n); errno != 0 {
		return failed(errno), nil
	}
	w := waiter{kind: wWrite, h: hd, f: f, off: off, n: n} // on the stack unless held
	if c.admitWrite(&w, false) {
		c.pump()
		return ready(), c.out
	}
	held := w
	r := c.hold(&held)
	c.pump()
	return r, c.out
}

func (c *Cache) admitWrite(w *waiter, fifoBlocked bool) bool {
	f := w.f
	w.space, w.fetches = 0, w.fetches[:0]
	if f.barrier != nil {
		return false
	}
	first, last := c.span(w.off, w.n)
	var fetchNeed, grow uint64
	var rmw, ends []uint64
	for idx := first; idx <= last; idx++ {
		lo, hi := c.within(idx, w.off, w.n)
		e := f.ext[idx]
		switch {
		case e == nil:
			// Read-modify-write unless the write covers every byte the PFS holds of the extent.
			// The fetched extent is charged for the write too (past the PFS's part it is
			// zeros), so that the write goes on the moment the fetch lands.
			if pp := c.pfsPart(f, idx); pp > 0 && (lo > 0 || hi < pp) {
				rmw = append(rmw, idx)
				ends = append(ends, max(pp, hi))
				fetchNeed += roundUp(max(pp, hi), Block)
			} else {
				grow += roundUp(max(hi, pp), Block)
			}
		case e.state == Fetching:
			w.fetches = append(w.fetches, e.fetchID)
		case e.stale:
			return false // pinned by reads of its old data; it goes at their ReadDone
		default:
			grow += roundUp(max(e.end, hi), Block) - e.charge
		}
	}
	if len(rmw) > 0 {
		if !c.reserve(w, fetchNeed, fifoBlocked) {
			return false
		}
		c.stats.Misses += uint64(len(rmw))
		w.fetches = append(w.fetches, c.startFetches(f, rmw, ends, false)...)
	}
	if len(w.fetches) > 0 || !c.reserve(w, grow, fifoBlocked) {
		return false
	}
	f.seq++
	for idx := first; idx <= last; idx++ {
		lo, hi := c.within(idx, w.off, w.n)
		e := f.ext[idx]
		if e == nil {
			e = c.newExtent(f, idx)
			e.end = c.pfsPart(f, idx) // all of it overwritten, or 0
			e.fresh = true            // its bytes are neither the old nor the new data yet
		}
		e.end = max(e.end, hi)
		c.setCharge(e, roundUp(e.end, Block))
		if e.state != Dirty && e.state != Flushing {
			c.setState(e, Dirty)
		}
		e.dlo, e.dhi = min(e.dlo, lo), max(e.dhi, hi)
		if e.oldest == 0 {
			e.oldest = f.seq
		}
		e.newest = f.seq
		e.writers++
		c.logDirty(e)
	}
	if t := f.policy.ModifiedThreshold; t > 0 && f.dirty-f.flushing > t {
		c.over[f] = struct{}{}
		f.thresh = true
	}
	return true
}

// WriteDone ends a write Write or ActWake admitted (its data is in the object).
func (c *Cache) WriteDone(h Handle, off, n uint64) []Action {
	c.begin()
	hd := c.handles[h]
	if hd == nil || n == 0 {
		return nil
	}
	lo, hi := c.span(off, n)
	for idx := lo; idx <= hi; idx++ {
		if e := hd.f.ext[idx]; e != nil && e.writers > 0 {
			e.writers--
			e.fresh = e.fresh && e.writers > 0
		}
	}
	c.pump()
	return c.out
}

// --- flushing ------------------------------------------------------------------------------

// Tick lets time pass: failed flushes whose backoff is over are retried.
func (c *Cache) Tick(now time.Time) []Action {
	c.begin()
	c.now = now
	c.pump()
	return c.out
}

func (c *Cache) flushable(e *extent, force bool) bool {
	return e.state == Dirty && e.writers == 0 && e.f.barrier == nil && !e.hullEmpty() &&
		(force || !c.now.Before(e.f.retryAt))
}

// scanLimit bounds the dirty queue entries looked at for one flush pick.
const scanLimit = 256

func (c *Cache) oldestFlushable(doomedToo bool) *extent {
	n := 0
	for e := c.dirtyQ.head; e != nil && n < scanLimit; e, n = e.next, n+1 {
		if c.flushable(e, false) && (doomedToo || !e.f.doomed) {
			return e
		}
	}
	return nil
}

// pickFlush is the next extent to flush: for a sync (fsync, close, teardown), for space a
// request waits for, for the dirty watermark, for a file's modified threshold.
func (c *Cache) pickFlush() *extent {
	for _, w := range c.waiters {
		if w.kind == wSync && w.syncID == 0 {
			for e := range w.set {
				if e.f.ext[e.idx] == e && c.flushable(e, true) {
					return e
				}
			}
		}
	}
	if c.draining {
		if e := c.oldestFlushable(false); e != nil {
			return e
		}
	}
	if c.spaceWaiters > 0 {
		free := c.cfg.Capacity - min(c.used, c.cfg.Capacity)
		if c.spaceWant > free+c.lruBytes+c.flushing {
			if e := c.oldestFlushable(true); e != nil {
				return e
			}
		}
	}
	high := uint64(c.cfg.DirtyHigh * float64(c.cfg.Capacity))
	low := uint64(c.cfg.DirtyLow * float64(c.cfg.Capacity))
	if c.dirty-c.flushing > high {
		c.wbActive = true
	}
	if c.wbActive {
		if c.dirty-c.flushing <= low {
			c.wbActive = false
		} else if e := c.oldestFlushable(false); e != nil {
			return e
		}
	}
	for f := range c.over {
		t := f.policy.ModifiedThreshold
		if t == 0 || f.doomed || f.dirty-f.flushing <= t/2 || c.files[f.key] != f {
			f.thresh = false
			delete(c.over, f)
			continue
		}
		var best *extent
		for _, e := range f.ext {
			if c.flushable(e, false) && (best == nil || e.oldest < best.oldest) {
				best = e
			}
		}
		if best != nil {
			return best
		}
	}
	return nil
}

func (c *Cache) scheduleFlushes() {
	for c.flushesInFlight < c.cfg.MaxFlushesInFlight {
		e := c.pickFlush()
		if e == nil {
			return
		}
		c.startFlush(e)
	}
}

// startFlush flushes the run of adjacent dirty extents of e's file that e is in (their dirty
// bytes joining into one range), from the run's start, up to MaxIOBytes: a run is cut into the
// same pieces whichever of its extents was picked.
func (c *Cache) startFlush(e *extent) {
	f, E := e.f, c.cfg.ExtentSize
	joins := func(a, b *extent) bool { // a just before b
		return a != nil && b != nil && c.flushable(a, true) && c.flushable(b, true) && a.dhi == E && b.dlo == 0 &&
			c.objOff(f, a.idx*E)+E == c.objOff(f, b.idx*E)
	}
	first := e
	for n := 0; first.idx > 0 && n < 1024 && joins(f.ext[first.idx-1], first); n++ {
		first = f.ext[first.idx-1]
	}
	last, length := first, first.dhi-first.dlo
	for {
		nx := f.ext[last.idx+1]
		if !joins(last, nx) || length+nx.dhi-nx.dlo > c.cfg.MaxIOBytes {
			break
		}
		last, length = nx, length+nx.dhi-nx.dlo
	}
	c.nextID++
	id := c.nextID
	var run []*extent
	for idx := first.idx; idx <= last.idx; idx++ {
		x := f.ext[idx]
		c.setState(x, Flushing)
		x.flo, x.fhi, x.flushOldest, x.flushNewest = x.dlo, x.dhi, x.oldest, x.newest
		x.dlo, x.dhi, x.oldest, x.newest = E, 0, 0, 0
		x.logLo, x.logHi, x.logEnd = 0, 0, 0 // a write from now on is logged again, with its seq
		x.flushID = id
		run = append(run, x)
	}
	off := first.idx*E + first.flo
	rng := Range{Off: off, Len: last.idx*E + last.fhi - off, ObjOff: c.objOff(f, off)}
	c.flushes[id] = run
	c.flushesInFlight++
	c.emit(Action{Kind: ActFlush, ID: id, File: f.key, Path: f.path, Range: rng})
}

// permanent are the PFS's own limits: a request waiting for space that only flushing could
// make fails with them instead of waiting for ever.
func permanent(errno syscall.Errno) bool {
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG, syscall.EROFS, syscall.EACCES, syscall.EPERM:
		return true
	}
	return false
}

// Errno is the error a flush's failure surfaces as: the PFS's ENOSPC, EDQUOT, EFBIG, EROFS,
// EACCES, EPERM as they are, anything else EIO.
func Errno(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) && (permanent(errno) || errno == syscall.EIO) {
		return errno
	}
	return syscall.EIO
}

// FlushDone reports a flush's outcome, with the PFS file's attributes after it. On success its
// extents are clean unless written meanwhile; on failure they stay dirty, the error is kept
// for the file's next sync, the file's flushes back off, and requests waiting for space fail
// if the error is one of the PFS's own limits.
func (c *Cache) FlushDone(now time.Time, id uint64, attrs Attrs, err error) []Action {
	c.begin()
	c.now = now
	run, ok := c.flushes[id]
	if !ok {
		return nil
	}
	delete(c.flushes, id)
	c.flushesInFlight--
	var f *file
	var errno syscall.Errno
	if err != nil {
		errno = Errno(err)
	}
	for _, e := range run {
		if e.flushID != id || e.state != Flushing || e.f.ext[e.idx] != e {
			continue
		}
		f = e.f
		if err == nil {
			c.stats.FlushedBytes += e.fhi - e.flo
			f.pfsEnd = max(f.pfsEnd, e.idx*c.cfg.ExtentSize+e.fhi)
			c.logFlushed(e)
			if e.hullEmpty() {
				c.setState(e, Clean)
			} else {
				c.setState(e, Dirty)
			}
			continue
		}
		e.dlo, e.dhi = min(e.dlo, e.flo), max(e.dhi, e.fhi)
		e.oldest = e.flushOldest
		e.newest = max(e.newest, e.flushNewest)
		c.setState(e, Dirty)
		// a write logged during the flush reset the logged hull: log all of it again
		e.logLo, e.logHi, e.logEnd = 0, 0, 0
		c.logDirty(e)
	}
	if f == nil { // the file was dropped or truncated meanwhile
		c.pump()
		return c.out
	}
	if err == nil {
		f.unsynced = true
		f.backoff = 0
		if attrs != (Attrs{}) {
			f.seen = attrs
			f.pfsEnd = max(f.pfsEnd, attrs.Size)
			c.logAttrs(f)
		}
	} else {
		c.stats.FlushErrors++
		f.err = errno
		f.backoff = min(max(2*f.backoff, c.cfg.RetryMin), c.cfg.RetryMax)
		f.retryAt = now.Add(f.backoff)
		for _, w := range c.waiters {
			if w.kind == wSync && w.f == f && w.syncID == 0 {
				for _, e := range run {
					if _, in := w.set[e]; in {
						w.failErr = errno
						f.err = 0 // reported to this sync
					}
				}
			}
			if w.space > 0 && permanent(errno) {
				w.failErr = errno
			}
		}
	}
	c.pump()
	return c.out
}

// SyncDone reports the outcome of an ActSyncPFS.
func (c *Cache) SyncDone(id uint64, err error) []Action {
	c.begin()
	w := c.syncs[id]
	if w == nil {
		return nil
	}
	delete(c.syncs, id)
	w.syncID = 0
	if err != nil {
		w.failErr = Errno(err)
	} else {
		w.set = nil
		w.seq = 0 // done
	}
	c.removeWaiter(w)
	c.finishSync(w, err == nil)
	c.pump()
	return c.out
}

func (c *Cache) finishSync(w *waiter, ok bool) {
	if w.closeAfter {
		c.closeHandle(w.h)
	}
	if ok {
		c.emit(Action{Kind: ActWake, Waiter: w.id})
	} else {
		c.emit(Action{Kind: ActFail, Waiter: w.id, Errno: w.failErr})
	}
}

func (c *Cache) removeWaiter(w *waiter) {
	for i, x := range c.waiters {
		if x == w {
			c.waiters = append(c.waiters[:i], c.waiters[i+1:]...)
			return
		}
	}
}

// --- waiters and the pump ------------------------------------------------------------------

// pump settles everything after an event: waiters that may go on, fetches to start, flushes
// to start, eviction down to the low watermark.
func (c *Cache) pump() {
	c.wakeWaiters(0)
	c.startQueuedFetches()
	c.scheduleFlushes()
	if float64(c.used) > c.cfg.EvictHigh*float64(c.cfg.Capacity) {
		low := uint64(c.cfg.EvictLow * float64(c.cfg.Capacity))
		for c.used > low && c.lru.head != nil {
			c.evict(c.lru.head)
		}
		c.wakeWaiters(0)
	}
}

// wakeWaiters retries the held requests in order (those waiting for fetch first first, if
// given). Once one waits for space, later ones needing space wait behind it (FIFO).
func (c *Cache) wakeWaiters(fetch uint64) {
	if len(c.waiters) == 0 {
		return
	}
	if fetch != 0 {
		for _, w := range append([]*waiter(nil), c.waiters...) {
			for _, id := range w.fetches {
				if id == fetch && w.failErr == 0 {
					if c.retry(w, false) {
						c.removeWaiter(w)
					}
					break
				}
			}
		}
	}
	c.spaceWaiters, c.spaceWant = 0, 0
	blocked := false
	for _, w := range append([]*waiter(nil), c.waiters...) {
		if c.retry(w, blocked) {
			c.removeWaiter(w)
			continue
		}
		if w.space > 0 {
			blocked = true
			c.spaceWaiters++
			c.spaceWant += w.space
		}
	}
}

// retry re-evaluates a held request; true when it is answered (woken or failed).
func (c *Cache) retry(w *waiter, fifoBlocked bool) bool {
	if w.failErr != 0 && w.syncID == 0 {
		if w.kind == wSync {
			c.finishSync(w, false)
			return true
		}
		c.emit(Action{Kind: ActFail, Waiter: w.id, Errno: w.failErr})
		return true
	}
	switch w.kind {
	case wRead:
		if c.admitRead(w, fifoBlocked, false) {
			c.emit(Action{Kind: ActWake, Waiter: w.id})
			return true
		}
	case wWrite:
		if c.admitWrite(w, fifoBlocked) {
			c.emit(Action{Kind: ActWake, Waiter: w.id})
			return true
		}
	case wSync:
		if w.syncID != 0 {
			return false
		}
		f := w.f
		if f.doomed || c.files[f.key] != f {
			c.finishSync(w, true)
			return true
		}
		for e := range w.set {
			if f.ext[e.idx] != e || !e.pendingBefore(w.seq) {
				delete(w.set, e)
			}
		}
		if len(w.set) > 0 {
			return false
		}
		if !f.unsynced {
			c.finishSync(w, true)
			return true
		}
		f.unsynced = false
		c.nextID++
		w.syncID = c.nextID
		c.syncs[w.syncID] = w
		c.emit(Action{Kind: ActSyncPFS, ID: w.syncID, File: f.key, Path: f.path})
	case wTruncate:
		if !w.ran && c.tryTruncate(w) {
			w.ran = true
			c.emit(Action{Kind: ActWake, Waiter: w.id})
		}
		return false // stays until TruncateDone, holding the barrier
	case wDrain:
		if c.dirty == 0 {
			c.draining = false
			c.emit(Action{Kind: ActWake, Waiter: w.id})
			return true
		}
	}
	return false
}

func (c *Cache) startQueuedFetches() {
	for c.fetchesInFlight < c.cfg.MaxFetchesInFlight && len(c.fetchQ) > 0 {
		op := c.fetchQ[0]
		c.fetchQ = c.fetchQ[1:]
		live := false
		for _, e := range op.exts {
			if e.fetchID == op.id && e.state == Fetching && e.f.ext[e.idx] == e {
				live = true
			}
		}
		if !live {
			delete(c.fetches, op.id)
			continue
		}
		c.fetchesInFlight++
		c.emit(Action{Kind: ActFetch, ID: op.id, File: op.f.key, Path: op.f.path, Range: op.rng})
	}
}

// --- truncate, unlink, teardown ------------------------------------------------------------

// Truncate sets key's size. Ready: the cache dropped the extents past size and trimmed the
// last one; truncate the PFS file (and the object) now, then TruncateDone. Wait: until
// ActWake, when flushes, fetches, reads or writes of the bytes past size are over (a flush
// landing after the PFS truncate would bring them back), then the same. Until TruncateDone
// the file's reads, writes and flushes wait.
func (c *Cache) Truncate(key FileKey, size uint64) (Result, []Action) {
	c.begin()
	f := c.files[key]
	if f == nil {
		return ready(), nil
	}
	if f.barrier != nil {
		return failed(syscall.EBUSY), nil // the I/O layer serialises a file's truncates
	}
	w := &waiter{kind: wTruncate, f: f, size: size}
	f.barrier = w
	if c.tryTruncate(w) {
		w.ran = true
		c.nextWaiter++
		w.id = WaiterID(c.nextWaiter)
		c.waiters = append(c.waiters, w)
		return ready(), c.out
	}
	r := c.hold(w)
	if r.Status == Fail {
		f.barrier = nil
	}
	return r, c.out
}

func (c *Cache) tryTruncate(w *waiter) bool {
	f, E := w.f, c.cfg.ExtentSize
	for _, e := range f.ext {
		if e.idx*E+E > w.size && (e.state == Fetching || e.state == Flushing || e.pins > 0 || e.writers > 0) {
			return false
		}
	}
	for _, e := range f.ext {
		start := e.idx * E
		switch {
		case start >= w.size:
			c.emit(Action{Kind: ActEvict, File: f.key, Path: f.path, Range: c.extentRange(e, 0, E)})
			c.remove(e)
		case start+e.end > w.size:
			cut := w.size - start
			c.emit(Action{Kind: ActEvict, File: f.key, Path: f.path, Range: c.extentRange(e, cut, E)})
			e.end = cut
			c.setCharge(e, roundUp(cut, Block))
			e.dhi = min(e.dhi, cut)
			if e.state == Dirty && e.hullEmpty() {
				c.setState(e, Clean)
			}
			// The log's end goes down with the extent's even where its dirty hull lies below the
			// cut: a later dirty record carries logEnd, and replayed after the truncate's record
			// it would bring back the bytes cut (and their charge: past the capacity).
			e.logHi, e.logEnd = min(e.logHi, cut), min(e.logEnd, cut)
		}
	}
	f.pfsEnd = min(f.pfsEnd, w.size)
	c.logTruncate(f, w.size)
	return true
}

// TruncateDone reports that the PFS file was truncated (attrs: its attributes after; err: it
// failed, and the PFS file keeps its old size: the cache's data past it is gone all the same,
// as a failed truncate may leave it).
func (c *Cache) TruncateDone(key FileKey, attrs Attrs, err error) []Action {
	c.begin()
	f := c.files[key]
	if f == nil || f.barrier == nil {
		return nil
	}
	c.removeWaiter(f.barrier)
	f.barrier = nil
	if err == nil && attrs != (Attrs{}) {
		f.seen = attrs
		c.logAttrs(f)
	} else if err != nil {
		f.pfsEnd = ^uint64(0) >> 1 // unknown: fetch rather than assume zeros
	}
	c.pump()
	c.forget(f)
	return c.out
}

// Unlink: the PFS file's last name is gone. Its cache data is dropped at its last close (now,
// if none is open), never flushed but to make space while it is still open. The I/O layer
// removes the PFS file at that last close.
func (c *Cache) Unlink(key FileKey) []Action {
	c.begin()
	f := c.files[key]
	if f == nil {
		return nil
	}
	f.doomed = true
	if f.handles == 0 {
		c.drop(f)
	}
	c.pump()
	return c.out
}

// drop forgets everything of f: ActDrop removes its object.
func (c *Cache) drop(f *file) uint64 {
	var lost uint64
	for _, e := range f.ext {
		if e.state == Dirty || e.state == Flushing {
			lost += e.charge
		}
		c.remove(e)
	}
	c.stats.DiscardedBytes += lost
	c.logDrop(f)
	delete(c.files, f.key)
	delete(c.over, f)
	c.emit(Action{Kind: ActDrop, File: f.key, Path: f.path})
	for _, w := range append([]*waiter(nil), c.waiters...) {
		if w.f == f && w.kind != wSync {
			c.removeWaiter(w)
			c.emit(Action{Kind: ActFail, Waiter: w.id, Errno: syscall.EIO})
		}
	}
	if f.barrier != nil {
		f.barrier = nil
	}
	return lost
}

// Drain is teardown's flush: every dirty extent goes to the PFS; Ready when none is left,
// else Wait until ActWake. Failed flushes are retried with backoff (Tick); the waiter stays
// until they succeed or Discard.
func (c *Cache) Drain() (Result, []Action) {
	c.begin()
	if c.dirty == 0 {
		return ready(), nil
	}
	c.draining = true
	r := c.hold(&waiter{kind: wDrain})
	c.pump()
	return r, c.out
}

// Discard drops all cached data, dirty data included (teardown --hurry), and fails every held
// request EIO. It returns the dirty bytes discarded.
func (c *Cache) Discard() (uint64, []Action) {
	c.begin()
	var lost uint64
	for _, f := range c.files {
		lost += c.drop(f)
	}
	for _, w := range c.waiters {
		c.emit(Action{Kind: ActFail, Waiter: w.id, Errno: syscall.EIO})
	}
	c.waiters = nil
	c.spaceWaiters, c.spaceWant, c.draining = 0, 0, false
	return lost, c.out
}

// ExtentState is extent idx of key's state (for tests and dwstat-like inspection).
func (c *Cache) ExtentState(key FileKey, idx uint64) State {
	if f := c.files[key]; f != nil {
		if e := f.ext[idx]; e != nil {
			return e.state
		}
	}
	return Absent
}

// FileError is the flush error key's next sync will report (0: none).
func (c *Cache) FileError(key FileKey) syscall.Errno {
	if f := c.files[key]; f != nil {
		return f.err
	}
	return 0
}

// DirtyFiles lists the files with dirty data and how much (dwstat, teardown's report).
func (c *Cache) DirtyFiles() map[string]uint64 {
	out := map[string]uint64{}
	for _, f := range c.files {
		if f.dirty > 0 {
			out[f.path] += f.dirty
		}
	}
	return out
}
