package cache

import (
	"fmt"
	"math/rand"
	"syscall"
	"testing"
	"time"
)

// sim is an I/O layer over memory: a PFS (file contents by key), the server's stripe objects,
// and the actions in flight, completed when the test says.
type sim struct {
	t   testing.TB
	c   *Cache
	cfg Config
	now time.Time

	pfs     map[FileKey][]byte
	pfsTime map[FileKey]int64
	obj     map[FileKey][]byte

	fetches []Action
	flushes []Action
	syncs   []Action
	woken   map[WaiterID]bool
	failed  map[WaiterID]syscall.Errno
	log     []byte // persisted snapshot + log

	flushErr func(Action) error // injected PFS failures
	enospc   int                // ENOSPC answers seen (must stay 0 without injection)
}

var traceAll bool

func newSim(t testing.TB, cfg Config) *sim {
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &sim{t: t, c: c, cfg: cfg, now: time.Unix(1_000_000, 0), pfs: map[FileKey][]byte{}, pfsTime: map[FileKey]int64{},
		obj: map[FileKey][]byte{}, woken: map[WaiterID]bool{}, failed: map[WaiterID]syscall.Errno{}}
	s.log = c.Snapshot()
	return s
}

func grow(b []byte, n uint64) []byte {
	if uint64(len(b)) < n {
		b = append(b, make([]byte, n-uint64(len(b)))...)
	}
	return b
}

func (s *sim) attrs(k FileKey) Attrs {
	return Attrs{Size: uint64(len(s.pfs[k])), Mtime: s.pfsTime[k], Ctime: s.pfsTime[k]}
}

// apply carries out actions; asynchronous ones are queued.
func (s *sim) apply(acts []Action) {
	s.log = append(s.log, s.c.Log()...)
	for _, a := range append([]Action(nil), acts...) {
		if traceAll {
			s.t.Logf("action %v id %d file %d range %+v waiter %d", a.Kind, a.ID, a.File.Ino, a.Range, a.Waiter)
		}
		switch a.Kind {
		case ActFetch:
			s.fetches = append(s.fetches, a)
		case ActFlush:
			s.flushes = append(s.flushes, a)
		case ActSyncPFS:
			s.syncs = append(s.syncs, a)
		case ActEvict:
			o := s.obj[a.File]
			end := a.Range.ObjOff + a.Range.Len
			if a.Range.Len == 0 || end > uint64(len(o)) {
				end = uint64(len(o))
			}
			for i := a.Range.ObjOff; i < end; i++ {
				o[i] = 0
			}
		case ActDrop:
			delete(s.obj, a.File)
		case ActWake:
			s.woken[a.Waiter] = true
		case ActFail:
			s.failed[a.Waiter] = a.Errno
			if a.Errno == syscall.ENOSPC && s.flushErr == nil {
				s.enospc++
			}
		}
	}
	s.check()
}

func (s *sim) completeFetch(i int, err error) {
	a := s.fetches[i]
	s.fetches = append(s.fetches[:i], s.fetches[i+1:]...)
	if err == nil {
		p := s.pfs[a.File]
		o := grow(s.obj[a.File], a.Range.ObjOff+a.Range.Len)
		for j := uint64(0); j < a.Range.Len; j++ {
			if a.Range.Off+j < uint64(len(p)) {
				o[a.Range.ObjOff+j] = p[a.Range.Off+j]
			}
		}
		s.obj[a.File] = o
	}
	s.apply(s.c.FetchDone(a.ID, err))
}

func (s *sim) completeFlush(i int) {
	a := s.flushes[i]
	s.flushes = append(s.flushes[:i], s.flushes[i+1:]...)
	var err error
	if s.flushErr != nil {
		err = s.flushErr(a)
	}
	if err == nil {
		if _, ok := s.pfs[a.File]; ok {
			p := grow(s.pfs[a.File], a.Range.End())
			o := grow(s.obj[a.File], a.Range.ObjOff+a.Range.Len)
			copy(p[a.Range.Off:a.Range.End()], o[a.Range.ObjOff:a.Range.ObjOff+a.Range.Len])
			s.pfs[a.File] = p
			s.pfsTime[a.File]++
		}
	}
	s.apply(s.c.FlushDone(s.now, a.ID, s.attrs(a.File), err))
}

func (s *sim) completeSync(i int) {
	a := s.syncs[i]
	s.syncs = append(s.syncs[:i], s.syncs[i+1:]...)
	s.apply(s.c.SyncDone(a.ID, nil))
}

// step completes one random thing in flight; false if nothing is.
func (s *sim) step(r *rand.Rand) bool {
	n := len(s.fetches) + len(s.flushes) + len(s.syncs)
	if n == 0 {
		return false
	}
	i := r.Intn(n)
	switch {
	case i < len(s.fetches):
		s.completeFetch(i, nil)
	case i < len(s.fetches)+len(s.flushes):
		s.completeFlush(i - len(s.fetches))
	default:
		s.completeSync(i - len(s.fetches) - len(s.flushes))
	}
	return true
}

// settle completes everything in flight until id is answered (0: until nothing is left),
// letting time pass for backoffs.
func (s *sim) settle(r *rand.Rand, id WaiterID) {
	for i := 0; i < 1_000_000; i++ {
		if id != 0 && (s.woken[id] || s.failed[id] != 0) {
			return
		}
		if !s.step(r) {
			if id == 0 {
				return
			}
			s.now = s.now.Add(2 * s.c.cfg.RetryMax)
			s.apply(s.c.Tick(s.now))
			if len(s.fetches)+len(s.flushes)+len(s.syncs) == 0 && !s.woken[id] && s.failed[id] == 0 {
				s.t.Fatalf("deadlock: waiter %d held with nothing in flight; stats %+v", id, s.c.Stats())
			}
		}
	}
	s.t.Fatal("settle did not end")
}

// check verifies the cache's counters and lists against its extents.
func (s *sim) check() {
	c := s.c
	var used, dirty, flushing, lruBytes uint64
	for k, f := range c.files {
		if f.key != k {
			s.t.Fatalf("file %v under key %v", f.key, k)
		}
		var fd, ff uint64
		for idx, e := range f.ext {
			if e.idx != idx || e.f != f || e.state == Absent {
				s.t.Fatalf("extent %d of %v: %+v", idx, k, e)
			}
			if e.charge != roundUp(e.end, Block) || e.end > c.cfg.ExtentSize {
				s.t.Fatalf("extent %d of %v: end %d charge %d", idx, k, e.end, e.charge)
			}
			used += e.charge
			switch e.state {
			case Dirty:
				if e.in != &c.dirtyQ {
					s.t.Fatalf("dirty extent %d of %v not in the dirty queue", idx, k)
				}
				if e.hullEmpty() || e.dhi > e.end {
					s.t.Fatalf("dirty extent %d of %v: hull [%d,%d) end %d", idx, k, e.dlo, e.dhi, e.end)
				}
				fd += e.charge
			case Flushing:
				fd += e.charge
				ff += e.charge
				if e.in != nil {
					s.t.Fatalf("flushing extent %d in a list", idx)
				}
			case Clean:
				if (e.pins == 0) != (e.in == &c.lru) {
					s.t.Fatalf("clean extent %d of %v: pins %d, in lru %v", idx, k, e.pins, e.in == &c.lru)
				}
				if e.in == &c.lru {
					lruBytes += e.charge
				}
			case Fetching:
				if e.in != nil {
					s.t.Fatalf("fetching extent %d in a list", idx)
				}
			}
		}
		if fd != f.dirty || ff != f.flushing {
			s.t.Fatalf("file %v: dirty %d/%d flushing %d/%d", k, f.dirty, fd, f.flushing, ff)
		}
		dirty += fd
		flushing += ff
	}
	if used != c.used || dirty != c.dirty || flushing != c.flushing || lruBytes != c.lruBytes {
		s.t.Fatalf("counters: used %d/%d dirty %d/%d flushing %d/%d lru %d/%d",
			c.used, used, c.dirty, dirty, c.flushing, flushing, c.lruBytes, lruBytes)
	}
	if c.used > c.cfg.Capacity {
		s.t.Fatalf("used %d > capacity %d", c.used, c.cfg.Capacity)
	}
	if c.flushesInFlight > c.cfg.MaxFlushesInFlight || c.fetchesInFlight > c.cfg.MaxFetchesInFlight {
		s.t.Fatalf("in flight: %d flushes, %d fetches", c.flushesInFlight, c.fetchesInFlight)
	}
	n := 0
	for e := c.lru.head; e != nil; e = e.next {
		n++
	}
	if n != c.lru.n {
		s.t.Fatalf("lru length %d, counted %d", c.lru.n, n)
	}
}

// data is what the job's write number seq writes: a recognisable pattern.
func data(seq, n uint64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seq*131+uint64(i)*7) | 1
	}
	return b
}

func (s *sim) String() string {
	return fmt.Sprintf("used %d dirty %d flushing %d waiters %d in flight %d/%d/%d",
		s.c.used, s.c.dirty, s.c.flushing, len(s.c.waiters), len(s.fetches), len(s.flushes), len(s.syncs))
}
