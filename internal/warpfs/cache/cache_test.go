package cache

import (
	"bytes"
	"errors"
	"math/rand"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

const tE = 16 << 10 // extent size of the table tests

var fk = FileKey{Dev: 7, Ino: 42}

func tConfig() Config {
	return Config{Capacity: 16 * tE, ExtentSize: tE, MaxIOBytes: 4 * tE, Defaults: Policy{}}
}

// tsim is a sim with one file on the PFS of size pfsSize.
func tsim(t *testing.T, cfg Config, pfsSize uint64) *sim {
	s := newSim(t, cfg)
	s.pfs[fk] = data(1000, pfsSize)
	s.pfsTime[fk] = 1
	return s
}

func (s *sim) open(o Override) Handle {
	res, acts, err := s.c.Open(fk, "/pfs/a", stripe.Layout{}, s.attrs(fk), o)
	if err != nil {
		s.t.Fatal(err)
	}
	s.apply(acts)
	return res.Handle
}

func (s *sim) read(h Handle, off, n uint64) Result {
	r, acts := s.c.Read(h, off, n)
	s.apply(acts)
	if r.Status == Ready {
		s.apply(s.c.ReadDone(h, off, n))
	}
	return r
}

// write admits a write; if Ready it writes pattern seq and ends it.
func (s *sim) write(h Handle, off, n, seq uint64) Result {
	r, acts := s.c.Write(h, off, n)
	s.apply(acts)
	if r.Status == Ready {
		s.finishWrite(h, off, n, seq)
	}
	return r
}

func (s *sim) finishWrite(h Handle, off, n, seq uint64) {
	o := grow(s.obj[fk], off+n)
	copy(o[off:], data(seq, n))
	s.obj[fk] = o
	s.apply(s.c.WriteDone(h, off, n))
}

func (s *sim) applyR(_ Result, acts []Action) { s.apply(acts) }

func (s *sim) state(idx uint64) State { return s.c.ExtentState(fk, idx) }

func (s *sim) wantState(idx uint64, want State) {
	s.t.Helper()
	if got := s.state(idx); got != want {
		s.t.Fatalf("extent %d: %v, want %v", idx, got, want)
	}
}

func (s *sim) wantStatus(r Result, want Status) {
	s.t.Helper()
	if r.Status != want {
		s.t.Fatalf("status %v (errno %v), want %v", r.Status, r.Errno, want)
	}
}

func (s *sim) drainAll() {
	for s.step(rand.New(rand.NewSource(1))) {
	}
}

func TestTransitions(t *testing.T) {
	yes := true
	tests := []struct {
		name string
		pfs  uint64 // the PFS file's size
		cfg  func(*Config)
		run  func(t *testing.T, s *sim)
	}{
		{name: "read miss: absent → fetching → clean, the request woken", pfs: 3 * tE, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			r := s.read(h, tE+10, 100)
			s.wantStatus(r, Wait)
			s.wantState(1, Fetching)
			if len(s.fetches) != 1 || s.fetches[0].Range != (Range{Off: tE, Len: tE, ObjOff: tE}) {
				t.Fatalf("fetches %+v", s.fetches)
			}
			s.completeFetch(0, nil)
			if !s.woken[r.Waiter] {
				t.Fatal("the read was not woken")
			}
			s.wantState(1, Clean)
			if !bytes.Equal(s.obj[fk][tE:2*tE], s.pfs[fk][tE:2*tE]) {
				t.Fatal("fetched data")
			}
			s.apply(s.c.ReadDone(h, tE+10, 100))
			s.wantStatus(s.read(h, tE, 5), Ready)
			if st := s.c.Stats(); st.Misses != 1 || st.Hits != 1 || st.FetchedBytes != tE {
				t.Fatalf("stats %+v", st)
			}
		}},
		{name: "read past the PFS file's data: no fetch", pfs: tE / 2, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			s.wantStatus(s.read(h, 2*tE, 10), Ready)
			s.wantState(2, Absent) // a known hole: pinned while read, then nothing to keep
			if s.c.Stats().Used != 0 {
				t.Fatal("a hole charged")
			}
			if len(s.fetches) != 0 {
				t.Fatal("fetched zeros")
			}
		}},
		{name: "a failed fetch: absent again, the read fails EIO", pfs: tE, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			r := s.read(h, 0, 10)
			s.completeFetch(0, syscall.EIO)
			if s.failed[r.Waiter] != syscall.EIO {
				t.Fatalf("failed %v", s.failed)
			}
			s.wantState(0, Absent)
			if s.c.Stats().Used != 0 {
				t.Fatal("space kept")
			}
		}},
		{name: "partial write of an absent extent the PFS holds: read-modify-write", pfs: 2 * tE, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			r := s.write(h, 100, 50, 1)
			s.wantStatus(r, Wait)
			s.wantState(0, Fetching)
			s.completeFetch(0, nil)
			if !s.woken[r.Waiter] {
				t.Fatal("not woken")
			}
			s.wantState(0, Dirty)
			s.finishWrite(h, 100, 50, 1)
		}},
		{name: "partial write of an extent wholly past the PFS file's end: no fetch", pfs: tE, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			s.wantStatus(s.write(h, 3*tE+100, 50, 1), Ready)
			s.wantState(3, Dirty)
			if len(s.fetches) != 0 {
				t.Fatal("fetched")
			}
		}},
		{name: "write covering every PFS byte of a straddling extent: no fetch", pfs: tE + 100, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			s.wantStatus(s.write(h, tE, 100, 1), Ready)
			s.wantState(1, Dirty)
		}},
		{name: "write missing a PFS byte of a straddling extent: fetch of the PFS part only", pfs: tE + 100, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			s.wantStatus(s.write(h, tE+1, 200, 1), Wait)
			if len(s.fetches) != 1 || s.fetches[0].Range.Len != 100 {
				t.Fatalf("fetches %+v", s.fetches)
			}
		}},
		{name: "whole-extent overwrite: no fetch", pfs: 4 * tE, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			s.wantStatus(s.write(h, 2*tE, tE, 1), Ready)
			s.wantState(2, Dirty)
		}},
		{name: "fsync with sync_to_pfs: dirty → flushing → clean, then the PFS file synced", pfs: 0, run: func(t *testing.T, s *sim) {
			h := s.open(Override{SyncToPFS: &yes})
			s.write(h, 0, 100, 1)
			r, acts := s.c.Fsync(h)
			s.apply(acts)
			s.wantStatus(r, Wait)
			s.wantState(0, Flushing)
			s.completeFlush(0)
			s.wantState(0, Clean)
			if len(s.syncs) != 1 || s.woken[r.Waiter] {
				t.Fatalf("want a PFS sync before the wake: %+v", s.syncs)
			}
			s.completeSync(0)
			if !s.woken[r.Waiter] {
				t.Fatal("not woken")
			}
			if !bytes.Equal(s.pfs[fk], data(1, 100)) {
				t.Fatal("PFS contents")
			}
		}},
		{name: "fsync without sync_to_pfs: Ready, nothing flushed", pfs: 0, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			s.write(h, 0, 100, 1)
			r, _ := s.c.Fsync(h)
			s.wantStatus(r, Ready)
			s.wantState(0, Dirty)
		}},
		{name: "written during the flush: flushing → dirty, not clean", pfs: 0, run: func(t *testing.T, s *sim) {
			h := s.open(Override{SyncToPFS: &yes})
			s.write(h, 0, 100, 1)
			r, acts := s.c.Fsync(h)
			s.apply(acts)
			s.wantStatus(s.write(h, 50, 100, 2), Ready)
			s.wantState(0, Flushing)
			s.completeFlush(0)
			s.wantState(0, Dirty)
			s.completeSync(0)
			if !s.woken[r.Waiter] {
				t.Fatal("the fsync waits only for writes before it")
			}
		}},
		{name: "a write in progress holds its extent's flush back", pfs: 0, cfg: func(c *Config) { c.Defaults.ModifiedThreshold = 1 }, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			r, acts := s.c.Write(h, 0, 100)
			s.apply(acts)
			s.wantStatus(r, Ready)
			if len(s.flushes) != 0 {
				t.Fatal("flushed data not yet written")
			}
			s.finishWrite(h, 0, 100, 1)
			if len(s.flushes) != 1 {
				t.Fatal("the threshold flush after the write")
			}
		}},
		{name: "failed flush: dirty with the error, reported once at the next sync, retried after backoff", pfs: 0, run: func(t *testing.T, s *sim) {
			h := s.open(Override{SyncToPFS: &yes})
			s.write(h, 0, 100, 1)
			s.flushErr = func(Action) error { return syscall.EDQUOT }
			r, acts := s.c.Fsync(h)
			s.apply(acts)
			s.completeFlush(0)
			if s.failed[r.Waiter] != syscall.EDQUOT {
				t.Fatalf("fsync: %v", s.failed)
			}
			s.wantState(0, Dirty)
			if s.c.Stats().FlushErrors != 1 {
				t.Fatal("counted")
			}
			// A background failure is kept for the next sync.
			s.c.cfg.Defaults.ModifiedThreshold = 0
			s.apply(s.c.Tick(s.now.Add(time.Hour)))
			d, acts := s.c.Drain()
			s.apply(acts)
			s.completeFlush(0)
			if s.c.FileError(fk) != syscall.EDQUOT {
				t.Fatal("error not kept")
			}
			if len(s.flushes) != 0 {
				t.Fatal("retried before the backoff")
			}
			s.flushErr = nil
			s.now = s.now.Add(time.Minute)
			s.apply(s.c.Tick(s.now))
			s.completeFlush(0)
			s.wantState(0, Clean)
			if !s.woken[d.Waiter] {
				t.Fatal("drain not woken")
			}
			r, _ = s.c.Fsync(h)
			if r.Status != Fail || r.Errno != syscall.EDQUOT {
				t.Fatalf("the next sync reports the error: %+v", r)
			}
			r, acts = s.c.Fsync(h)
			s.apply(acts)
			if r.Status == Fail {
				t.Fatal("reported twice")
			}
		}},
		{name: "clean → absent on eviction, least recently used first", pfs: 32 * tE, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			for i := uint64(0); i < 15; i++ { // under the 95 % eviction watermark
				s.read(h, i*tE, 1)
				s.drainAll()
				s.apply(s.c.ReadDone(h, i*tE, 1))
			}
			s.wantState(0, Clean)
			s.read(h, 0, 1) // touch extent 0
			r := s.read(h, 15*tE, 1)
			s.wantStatus(r, Wait) // past the watermark: down to 90 %, the least recently used first
			s.wantState(1, Absent)
			s.wantState(0, Clean)
			if s.c.Stats().Evictions == 0 {
				t.Fatal("no eviction")
			}
		}},
		{name: "truncate drops extents past the size, trims the last, waits for a flush in flight", pfs: 0, run: func(t *testing.T, s *sim) {
			h := s.open(Override{SyncToPFS: &yes})
			for i := uint64(0); i < 3; i++ {
				s.write(h, i*tE, tE, i+1)
			}
			r, acts := s.c.Fsync(h)
			s.apply(acts)
			tr, acts := s.c.Truncate(fk, tE+100)
			s.apply(acts)
			s.wantStatus(tr, Wait)
			if rr := s.read(h, 0, 1); rr.Status != Wait {
				t.Fatal("a read during a truncate waits")
			}
			s.drainAll()
			if !s.woken[tr.Waiter] {
				t.Fatal("truncate not woken")
			}
			s.wantState(2, Absent)
			if e := s.c.files[fk].ext[1]; e.end != 100 {
				t.Fatalf("trimmed to %d", e.end)
			}
			s.pfs[fk] = s.pfs[fk][:tE+100]
			s.apply(s.c.TruncateDone(fk, s.attrs(fk), nil))
			_ = r
		}},
		{name: "unlink of an open file: kept until the last close, then dropped unflushed", pfs: 0, run: func(t *testing.T, s *sim) {
			h := s.open(Override{SyncOnClose: &yes})
			s.write(h, 0, 100, 1)
			s.apply(s.c.Unlink(fk))
			s.wantState(0, Dirty)
			s.wantStatus(s.read(h, 0, 10), Ready)
			r, acts := s.c.Close(h)
			s.apply(acts)
			s.wantStatus(r, Ready)
			if _, ok := s.obj[fk]; ok || len(s.flushes) != 0 {
				t.Fatal("not dropped, or flushed")
			}
			if st := s.c.Stats(); st.DiscardedBytes != Block || st.Used != 0 {
				t.Fatalf("stats %+v", st)
			}
		}},
		{name: "the PFS file changed: clean dropped, dirty kept and counted", pfs: 4 * tE, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			s.read(h, 0, 1)
			s.drainAll()
			s.apply(s.c.ReadDone(h, 0, 1))
			s.write(h, 2*tE, tE, 1)
			s.applyR(s.c.Close(h))
			s.pfsTime[fk] += 5 // someone else wrote it
			res, acts, _ := s.c.Open(fk, "/pfs/a", stripe.Layout{}, s.attrs(fk), Override{})
			s.apply(acts)
			if !res.Invalidated || res.ConflictBytes != tE {
				t.Fatalf("%+v", res)
			}
			s.wantState(0, Absent)
			s.wantState(2, Dirty)
		}},
		{name: "our own flush does not invalidate", pfs: 0, run: func(t *testing.T, s *sim) {
			h := s.open(Override{SyncOnClose: &yes})
			s.write(h, 0, tE, 1)
			r, acts := s.c.Close(h)
			s.apply(acts)
			s.drainAll()
			if !s.woken[r.Waiter] {
				t.Fatal("close")
			}
			res, _, _ := s.c.Open(fk, "/pfs/a", stripe.Layout{}, s.attrs(fk), Override{})
			if res.Invalidated {
				t.Fatal("invalidated by its own flush")
			}
			s.wantState(0, Clean)
		}},
		{name: "modified_threshold: a file's dirty bytes past it are flushed to half of it", pfs: 0, run: func(t *testing.T, s *sim) {
			th := uint64(4 * tE)
			h := s.open(Override{ModifiedThreshold: &th})
			for i := uint64(0); i < 4; i++ {
				s.write(h, i*tE, tE, i+1)
			}
			if len(s.flushes) != 0 {
				t.Fatal("flushed at the threshold")
			}
			s.write(h, 4*tE, tE, 9)
			var n uint64
			for _, a := range s.flushes {
				n += a.Range.Len
			}
			if n < 3*tE {
				t.Fatalf("flushing %d bytes, want down to %d dirty", n, th/2)
			}
		}},
		{name: "dirty past the high watermark: flushed to the low, oldest first", pfs: 0, cfg: func(c *Config) { c.MaxFlushesInFlight = 100; c.MaxIOBytes = tE }, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			for i := uint64(0); i < 8; i++ { // 45 % of 16 = 7.2
				s.write(h, i*tE, tE, i+1)
			}
			if len(s.flushes) != 8-3 || s.flushes[0].Range.Off != 0 {
				t.Fatalf("flushes %+v, want 5 (down to 20 %% of 16 extents), the oldest first", s.flushes)
			}
		}},
		{name: "coalescing: adjacent dirty extents in one PFS write, bounded", pfs: 0, cfg: func(c *Config) { c.MaxIOBytes = 3 * tE }, run: func(t *testing.T, s *sim) {
			h := s.open(Override{SyncToPFS: &yes})
			for i := uint64(0); i < 5; i++ {
				s.write(h, i*tE, tE, i+1)
			}
			s.write(h, 7*tE, 10, 9)
			_, acts := s.c.Fsync(h)
			s.apply(acts)
			var lens []uint64
			for _, a := range s.flushes {
				lens = append(lens, a.Range.Len)
			}
			slices.Sort(lens)
			lens[0], lens[2] = lens[2], lens[0] // the two runs first, then the lone write
			if len(lens) != 3 || lens[0]+lens[1] != 5*tE || max(lens[0], lens[1]) != 3*tE || lens[2] != 10 {
				t.Fatalf("flush lengths %v", lens)
			}
		}},
		{name: "MaxFlushesInFlight bounds the flushes", pfs: 0, cfg: func(c *Config) { c.MaxFlushesInFlight = 2; c.MaxIOBytes = tE }, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			for i := uint64(0); i < 10; i += 2 {
				s.write(h, i*tE, tE, i+1)
			}
			d, acts := s.c.Drain()
			s.apply(acts)
			if len(s.flushes) != 2 {
				t.Fatalf("%d flushes in flight", len(s.flushes))
			}
			s.drainAll()
			if !s.woken[d.Waiter] || s.c.Stats().Dirty != 0 {
				t.Fatal("drain")
			}
		}},
		{name: "sync_on_close: close waits for the PFS", pfs: 0, run: func(t *testing.T, s *sim) {
			h := s.open(Override{SyncOnClose: &yes})
			s.write(h, 0, 10, 1)
			r, acts := s.c.Close(h)
			s.apply(acts)
			s.wantStatus(r, Wait)
			s.drainAll()
			if !s.woken[r.Waiter] || !bytes.Equal(s.pfs[fk], data(1, 10)) {
				t.Fatal("close")
			}
		}},
		{name: "Discard: teardown --hurry drops dirty data and says how much", pfs: 0, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			s.write(h, 0, tE, 1)
			s.write(h, 2*tE, 10, 2)
			s.applyR(s.c.Close(h))
			n, acts := s.c.Discard()
			s.apply(acts)
			if n != tE+Block || s.c.Stats().Used != 0 {
				t.Fatalf("discarded %d", n)
			}
		}},
		{name: "space: a write waits for a flush to make room, FIFO, never ENOSPC", pfs: 0, cfg: func(c *Config) { c.DirtyHigh, c.DirtyLow = 1, 1 }, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			for i := uint64(0); i < 16; i++ {
				s.wantStatus(s.write(h, i*tE, tE, i+1), Ready)
			}
			w1 := s.write(h, 16*tE, tE, 17)
			w2 := s.write(h, 17*tE, 10, 18)
			s.wantStatus(w1, Wait)
			s.wantStatus(w2, Wait)
			if len(s.flushes) == 0 {
				t.Fatal("no flush for space")
			}
			s.completeFlush(0)
			if !s.woken[w1.Waiter] {
				t.Fatal("first waiter not first")
			}
			s.finishWrite(h, 16*tE, tE, 17)
			s.drainAll()
			if !s.woken[w2.Waiter] {
				t.Fatal("second waiter")
			}
		}},
		{name: "space: a flush failing with the PFS's ENOSPC fails the writes waiting for space", pfs: 0, cfg: func(c *Config) { c.DirtyHigh, c.DirtyLow = 1, 1 }, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			for i := uint64(0); i < 16; i++ {
				s.write(h, i*tE, tE, i+1)
			}
			w := s.write(h, 16*tE, tE, 17)
			s.flushErr = func(Action) error { return syscall.ENOSPC }
			s.completeFlush(0)
			if s.failed[w.Waiter] != syscall.ENOSPC {
				t.Fatalf("%v", s.failed)
			}
			s.wantState(0, Dirty)
		}},
		{name: "MaxWaiters: past it a request fails EAGAIN", pfs: 16 * tE, cfg: func(c *Config) { c.MaxWaiters = 2; c.MaxFetchesInFlight = 1 }, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			s.wantStatus(s.read(h, 0, 1), Wait)
			s.wantStatus(s.read(h, tE, 1), Wait)
			if r := s.read(h, 2*tE, 1); r.Status != Fail || r.Errno != syscall.EAGAIN {
				t.Fatalf("%+v", r)
			}
		}},
		{name: "read-ahead: sequential reads fetch ahead, random ones do not", pfs: 16 * tE, run: func(t *testing.T, s *sim) {
			ra := uint64(3 * tE)
			h := s.open(Override{ReadAhead: &ra})
			s.read(h, 5*tE, 10)
			if len(s.fetches) != 1 {
				t.Fatalf("random read: %d fetches", len(s.fetches))
			}
			s.drainAll()
			s.apply(s.c.ReadDone(h, 5*tE, 10))
			s.read(h, 0, tE)
			s.drainAll()
			s.apply(s.c.ReadDone(h, 0, tE))
			s.read(h, tE, tE)
			if s.c.Stats().ReadAheadBytes == 0 {
				t.Fatal("no read-ahead")
			}
			s.drainAll()
			s.wantState(2, Clean)
			s.wantState(3, Clean)
		}},
		{name: "read-ahead never evicts", pfs: 32 * tE, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			for i := uint64(0); i < 16; i++ { // fill with clean data, random order
				s.read(h, (15-i)*tE+1, 1)
				s.drainAll()
				s.apply(s.c.ReadDone(h, (15-i)*tE+1, 1))
			}
			ev := s.c.Stats().Evictions
			ra := uint64(8 * tE)
			s.c.SetOverride(fk, Override{ReadAhead: &ra})
			s.read(h, 0, 1)
			s.read(h, 1, 1)
			if s.c.Stats().Evictions != ev || s.c.Stats().ReadAheadBytes != 0 {
				t.Fatalf("stats %+v", s.c.Stats())
			}
		}},
		{name: "a request crossing an extent boundary is refused EINVAL", pfs: 0, run: func(t *testing.T, s *sim) {
			h := s.open(Override{})
			if r := s.write(h, tE-1, 2, 1); r.Status != Fail || r.Errno != syscall.EINVAL {
				t.Fatalf("%+v", r)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			tc.run(t, tsim(t, cfg, tc.pfs))
		})
	}
}

func TestStripedServerHoldsItsStripesOnly(t *testing.T) {
	cfg := tConfig()
	cfg.Server = 1
	s := tsim(t, cfg, 0)
	l := stripe.Layout{Size: 2 * tE, Width: 3, Servers: 3, Start: 0}
	res, _, err := s.c.Open(fk, "/pfs/a", l, s.attrs(fk), Override{})
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := s.c.Write(res.Handle, 0, 10); r.Errno != syscall.EINVAL {
		t.Fatal("server 1 does not hold stripe 0")
	}
	r, acts := s.c.Write(res.Handle, 2*tE+tE, 10) // stripe 1, its second extent
	s.apply(acts)
	if r.Status != Ready {
		t.Fatal(r)
	}
	s.apply(s.c.WriteDone(res.Handle, 3*tE, 10))
	d, acts := s.c.Drain()
	s.apply(acts)
	if d.Status != Wait || s.flushes[0].Range != (Range{Off: 3 * tE, Len: 10, ObjOff: tE}) {
		t.Fatalf("flush %+v", s.flushes)
	}
	if _, _, err := s.c.Open(FileKey{1, 2}, "/x", stripe.Layout{Size: 3 * Block, Width: 1, Servers: 3, Start: 1}, Attrs{}, Override{}); err == nil {
		t.Fatal("a stripe size that is not a multiple of the extent size")
	}
}

func TestRecoverStates(t *testing.T) {
	yes := true
	s := tsim(t, tConfig(), 8*tE)
	h := s.open(Override{SyncToPFS: &yes})
	s.write(h, tE, tE, 2)   // will be flushing
	s.write(h, 3*tE, tE, 3) // will be clean
	_, acts := s.c.Fsync(h)
	s.apply(acts)
	s.write(h, 0, tE, 1) // dirty
	s.read(h, 5*tE, 1)   // fetching
	// Complete the flush of extent 3 only.
	for i, a := range s.flushes {
		if a.Range.Off == 3*tE {
			s.completeFlush(i)
			break
		}
	}
	s.log = append(s.log, s.c.Log()...)
	c, acts, err := Recover(tConfig(), s.log)
	if err != nil {
		t.Fatal(err)
	}
	want := []State{Dirty, Dirty, Absent, Absent, Absent, Absent}
	for i, w := range want {
		if got := c.ExtentState(fk, uint64(i)); got != w {
			t.Fatalf("extent %d recovered %v, want %v", i, got, w)
		}
	}
	var punched []Range
	for _, a := range acts {
		if a.Kind == ActEvict {
			punched = append(punched, a.Range)
		}
	}
	if len(punched) != 1 || punched[0].ObjOff != 2*tE || punched[0].Len != 0 {
		t.Fatalf("punched %+v: want everything past the dirty extents", punched)
	}
	if c.files[fk].path != "/pfs/a" || c.Stats().Dirty != 2*tE {
		t.Fatalf("recovered %+v", c.Stats())
	}
	// The recovered cache's snapshot recovers to the same.
	c2, _, err := Recover(tConfig(), c.Snapshot())
	if err != nil || c2.Stats().Dirty != c.Stats().Dirty {
		t.Fatalf("snapshot round trip: %v %+v", err, c2.Stats())
	}
}

func TestDecodeTornAndCorrupt(t *testing.T) {
	s := tsim(t, tConfig(), 0)
	h := s.open(Override{})
	s.write(h, 0, 100, 1)
	s.write(h, tE, 100, 2)
	log := append(s.log, s.c.Log()...)
	full, err := Decode(log)
	if err != nil {
		t.Fatal(err)
	}
	torn, err := Decode(log[:len(log)-3])
	if err != nil || len(torn) != len(full)-1 {
		t.Fatalf("a torn last record ends the log: %v, %d of %d", err, len(torn), len(full))
	}
	if recs, err := Decode(append(append([]byte(nil), log...), make([]byte, 100)...)); err != nil || len(recs) != len(full) {
		t.Fatal("trailing zeros")
	}
	bad := append([]byte(nil), log...)
	bad[len(bad)/2] ^= 0x40
	if _, err := Decode(bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a flipped bit: %v", err)
	}
	cfg := tConfig()
	cfg.ExtentSize = 2 * tE
	if _, _, err := Recover(cfg, log); !errors.Is(err, ErrCorrupt) {
		t.Fatal("another extent size")
	}
}

func FuzzDecode(f *testing.F) {
	s := tsim(&testing.T{}, tConfig(), 2*tE)
	h := s.open(Override{})
	s.write(h, 0, 100, 1)
	s.write(h, tE, tE, 2)
	s.applyR(s.c.Truncate(fk, tE+10))
	s.apply(s.c.TruncateDone(fk, s.attrs(fk), nil))
	f.Add(append(s.log, s.c.Log()...))
	f.Add(s.c.Snapshot())
	f.Add([]byte{})
	f.Add([]byte{recDirty, 6, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := Decode(b)
		if err != nil {
			return
		}
		_ = recs
		c, _, err := Recover(tConfig(), b)
		if err != nil {
			return
		}
		if c.used > 1<<62 || c.dirty != c.used {
			t.Fatalf("recovered used %d dirty %d", c.used, c.dirty)
		}
		c2, _, err := Recover(tConfig(), c.Snapshot())
		if err != nil || c2.dirty != c.dirty || len(c2.files) != len(c.files) {
			t.Fatalf("snapshot of a recovered cache: %v, dirty %d vs %d", err, c2.dirty, c.dirty)
		}
	})
}

func BenchmarkReadHit(b *testing.B) {
	c, _ := New(Config{Capacity: 1 << 30})
	o, _, _ := c.Open(fk, "/pfs/a", stripe.Layout{}, Attrs{}, Override{})
	c.Write(o.Handle, 0, 1<<20)
	c.WriteDone(o.Handle, 0, 1<<20)
	b.ReportAllocs()
	for b.Loop() {
		c.Read(o.Handle, 4096, 65536)
		c.ReadDone(o.Handle, 4096, 65536)
	}
}

func BenchmarkWriteDirty(b *testing.B) {
	c, _ := New(Config{Capacity: 1 << 30})
	o, _, _ := c.Open(fk, "/pfs/a", stripe.Layout{}, Attrs{}, Override{})
	c.Write(o.Handle, 0, 1<<20)
	c.WriteDone(o.Handle, 0, 1<<20)
	c.Log()
	b.ReportAllocs()
	for b.Loop() {
		c.Write(o.Handle, 4096, 65536)
		c.WriteDone(o.Handle, 4096, 65536)
	}
}

func BenchmarkStripedReadHit(b *testing.B) {
	c, _ := New(Config{Capacity: 1 << 30, Server: 2})
	l := stripe.Layout{Size: 8 << 20, Width: 4, Servers: 4, Start: 0}
	o, _, _ := c.Open(fk, "/pfs/a", l, Attrs{}, Override{})
	off := uint64(2 * (8 << 20))
	c.Write(o.Handle, off, 1<<20)
	c.WriteDone(o.Handle, off, 1<<20)
	b.ReportAllocs()
	for b.Loop() {
		c.Read(o.Handle, off+4096, 65536)
		c.ReadDone(o.Handle, off+4096, 65536)
	}
}

func TestPolicyText(t *testing.T) {
	o, err := ParseOverride("modified_threshold=1048576 sync_on_close=yes", Override{})
	if err != nil {
		t.Fatal(err)
	}
	p := o.Apply(Policy{ReadAhead: 4 << 20, SyncToPFS: true})
	if got, want := p.Text(), "modified_threshold=1048576 read_ahead=4194304 sync_on_close=yes sync_to_pfs=yes"; got != want {
		t.Fatalf("policy %q, want %q", got, want)
	}
	o, err = ParseOverride("sync_on_close=default read_ahead=0", o)
	if err != nil || o.SyncOnClose != nil || o.ReadAhead == nil || *o.ReadAhead != 0 || *o.ModifiedThreshold != 1<<20 {
		t.Fatalf("after reset: %+v %v", o, err)
	}
	for _, bad := range []string{"", "read_ahead", "read_ahead=-1", "sync_to_pfs=maybe", "colour=blue"} {
		if _, err := ParseOverride(bad, Override{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A truncate that cuts an extent whose dirty bytes lie below the cut but whose end lies past
// it: a later write's record must carry the cut end, or the recovered cache brings the bytes
// cut back, charged (the model test once found the recovered cache over its capacity so).
func TestRecoveredExtentKeepsItsTruncatedEnd(t *testing.T) {
	s := tsim(t, tConfig(), tE)
	h := s.open(Override{})
	if r := s.read(h, 0, tE); r.Status == Wait { // fetched: clean, its end tE
		s.settle(rand.New(rand.NewSource(1)), r.Waiter)
		s.apply(s.c.ReadDone(h, 0, tE))
	}
	s.wantState(0, Clean)
	s.write(h, 0, 100, 2) // dirty [0,100), its end still tE
	s.applyR(s.c.Truncate(fk, 1000))
	s.apply(s.c.TruncateDone(fk, s.attrs(fk), nil))
	s.write(h, 100, 100, 3) // the hull grows: a new dirty record
	live := s.c.used
	c, _, err := Recover(tConfig(), append(s.log, s.c.Log()...))
	if err != nil {
		t.Fatal(err)
	}
	if c.used != live || c.used != roundUp(1000, Block) {
		t.Fatalf("recovered used %d, live %d, want %d (the truncated extent's)", c.used, live, roundUp(1000, Block))
	}
}
