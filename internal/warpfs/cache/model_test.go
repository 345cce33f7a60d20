package cache

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// The model test: random sequences of opens, reads, writes, fsyncs, closes, truncates,
// unlinks, changes on the PFS behind the cache's back, agent crashes and recoveries, and
// completions in any order, against a reference of what each file holds. Reads must return
// the reference; after the teardown flush the PFS must hold it; used space never exceeds the
// capacity; a working set several times the capacity never sees ENOSPC.

const mE = 16 << 10 // extent size of the model test

type mfile struct {
	key     FileKey
	layout  stripe.Layout
	ref     []byte
	handles []Handle
	o       Override
}

type pending struct {
	kind   wkind
	f      *mfile
	h      Handle
	off, n uint64
	seq    uint64
}

type driver struct {
	*sim
	r       *rand.Rand
	files   []*mfile
	pend    map[WaiterID]pending
	nextIno uint64
	seq     uint64
	maxOff  uint64
	noCrash bool
}

func (d *driver) held(f *mfile, off uint64) bool {
	if f.layout == (stripe.Layout{}) {
		return true
	}
	return f.layout.Server(off/f.layout.Size) == d.cfg.Server
}

// pick is a random range of f this server holds, within one stripe.
func (d *driver) pick(f *mfile) (uint64, uint64) {
	for {
		off := uint64(d.r.Int63n(int64(d.maxOff)))
		if d.r.Intn(3) == 0 {
			off = off / mE * mE // aligned
		}
		if !d.held(f, off) {
			continue
		}
		limit := mE - off%mE
		n := 1 + uint64(d.r.Int63n(int64(min(limit, 2*mE))))
		if d.r.Intn(3) == 0 {
			n = min(limit, mE)
		}
		return off, n
	}
}

func (d *driver) objOff(f *mfile, off uint64) uint64 {
	if f.layout == (stripe.Layout{}) {
		return off
	}
	l := f.layout
	return (off/l.Size/uint64(l.Width))*l.Size + off%l.Size
}

func (d *driver) doRead(f *mfile, off, n uint64) {
	o := d.obj[f.key]
	ref := grow(append([]byte(nil), f.ref...), off+n)
	oo := d.objOff(f, off)
	got := grow(append([]byte(nil), o...), oo+n)[oo : oo+n]
	if !bytes.Equal(got, ref[off:off+n]) {
		for i := range got {
			if got[i] != ref[off+uint64(i)] {
				at := off + uint64(i)
				cf := d.c.files[f.key]
				var st string
				if cf != nil {
					if e := cf.ext[at/mE]; e != nil {
						st = fmt.Sprintf("%v end %d hull [%d,%d) pfsEnd %d stale %v", e.state, e.end, e.dlo, e.dhi, cf.pfsEnd, e.stale)
					} else {
						st = fmt.Sprintf("absent, pfsEnd %d", cf.pfsEnd)
					}
				}
				d.t.Logf("first difference at %d (extent %d +%d): got %d want %d; pfs len %d ref len %d; extent %s",
					at, at/mE, at%mE, got[i], ref[off+uint64(i)], len(d.pfs[f.key]), len(f.ref), st)
				break
			}
		}
		d.t.Fatalf("read %v [%d,+%d): the cache's data differs from the reference (%s)", f.key, off, n, d.sim)
	}
}

func (d *driver) doWrite(f *mfile, off, n uint64) {
	if traceAll {
		d.t.Logf("write file %d [%d,+%d) obj %d", f.key.Ino, off, n, d.objOff(f, off))
	}
	d.seq++
	b := data(d.seq, n)
	oo := d.objOff(f, off)
	o := grow(d.obj[f.key], oo+n)
	copy(o[oo:], b)
	d.obj[f.key] = o
	f.ref = grow(f.ref, off+n)
	copy(f.ref[off:], b)
}

func (d *driver) doTruncate(f *mfile, size uint64) {
	if traceAll {
		d.t.Logf("truncate file %d to %d", f.key.Ino, size)
	}
	if p, ok := d.pfs[f.key]; ok {
		if uint64(len(p)) > size {
			p = p[:size]
		}
		d.pfs[f.key] = grow(p, size)
		d.pfsTime[f.key]++
	}
	if uint64(len(f.ref)) > size {
		f.ref = f.ref[:size]
	}
	f.ref = grow(f.ref, size)
	d.apply(d.c.TruncateDone(f.key, d.attrs(f.key), nil))
}

// serve carries out the requests woken or failed since the last call.
func (d *driver) serve() {
	for again := true; again; {
		again = false
		for id, p := range d.pend {
			if errno, ok := d.failed[id]; ok {
				if errno == syscall.ENOSPC {
					d.t.Fatalf("ENOSPC for %+v", p)
				}
				if p.kind != wSync {
					d.t.Fatalf("request %+v failed: %v", p, errno)
				}
				delete(d.pend, id)
				continue
			}
			if !d.woken[id] {
				continue
			}
			delete(d.pend, id)
			again = true
			switch p.kind {
			case wRead:
				d.doRead(p.f, p.off, p.n)
				d.apply(d.c.ReadDone(p.h, p.off, p.n))
			case wWrite:
				d.doWrite(p.f, p.off, p.n)
				d.apply(d.c.WriteDone(p.h, p.off, p.n))
			case wTruncate:
				d.doTruncate(p.f, p.n)
			}
			break // d.pend changed
		}
	}
}

func (d *driver) busy(f *mfile) bool {
	for _, p := range d.pend {
		if p.f == f {
			return true
		}
	}
	for _, as := range [][]Action{d.fetches, d.flushes, d.syncs} {
		for _, a := range as {
			if a.File == f.key {
				return true
			}
		}
	}
	return false
}

func (d *driver) op() {
	f := d.files[d.r.Intn(len(d.files))]
	switch k := d.r.Intn(100); {
	case k < 10 || len(f.handles) == 0:
		if f.key.Ino == 0 {
			d.nextIno++
			f.key = FileKey{Dev: 1, Ino: d.nextIno}
			d.pfs[f.key] = nil
			d.pfsTime[f.key] = 1
			f.ref = nil
		}
		res, acts, err := d.c.Open(f.key, "/pfs/f", f.layout, d.attrs(f.key), f.o)
		if err != nil {
			d.t.Fatal(err)
		}
		d.apply(acts)
		f.handles = append(f.handles, res.Handle)
	case k < 40:
		h := f.handles[d.r.Intn(len(f.handles))]
		off, n := d.pick(f)
		r, acts := d.c.Read(h, off, n)
		d.apply(acts)
		switch r.Status {
		case Ready:
			d.doRead(f, off, n)
			d.apply(d.c.ReadDone(h, off, n))
		case Wait:
			d.pend[r.Waiter] = pending{kind: wRead, f: f, h: h, off: off, n: n}
		default:
			d.t.Fatalf("read failed: %v", r.Errno)
		}
	case k < 75:
		h := f.handles[d.r.Intn(len(f.handles))]
		off, n := d.pick(f)
		r, acts := d.c.Write(h, off, n)
		switch r.Status {
		case Ready:
			d.apply(acts)
			d.doWrite(f, off, n)
			d.apply(d.c.WriteDone(h, off, n))
		case Wait:
			d.apply(acts)
			d.pend[r.Waiter] = pending{kind: wWrite, f: f, h: h, off: off, n: n}
		default:
			d.t.Fatalf("write failed: %v", r.Errno)
		}
	case k < 80:
		h := f.handles[d.r.Intn(len(f.handles))]
		r, acts := d.c.Fsync(h)
		d.apply(acts)
		if r.Status == Wait {
			d.pend[r.Waiter] = pending{kind: wSync, f: f}
		}
	case k < 86:
		i := d.r.Intn(len(f.handles))
		h := f.handles[i]
		for _, p := range d.pend {
			if p.h == h {
				return // the I/O layer closes a handle after its requests
			}
		}
		f.handles = append(f.handles[:i], f.handles[i+1:]...)
		r, acts := d.c.Close(h)
		d.apply(acts)
		if r.Status == Wait {
			d.pend[r.Waiter] = pending{kind: wSync, f: f}
		}
	case k < 89:
		for _, p := range d.pend {
			if p.f == f && p.kind == wTruncate {
				return
			}
		}
		size := uint64(d.r.Int63n(int64(d.maxOff)))
		r, acts := d.c.Truncate(f.key, size)
		d.apply(acts)
		switch r.Status {
		case Ready:
			d.doTruncate(f, size)
		case Wait:
			d.pend[r.Waiter] = pending{kind: wTruncate, f: f, n: size}
		default:
			d.t.Fatalf("truncate: %v", r.Errno)
		}
	case k < 90:
		if len(f.handles) > 0 || d.busy(f) {
			return
		}
		d.apply(d.c.Unlink(f.key))
		delete(d.pfs, f.key)
		if _, ok := d.obj[f.key]; ok {
			d.t.Fatalf("unlinked file %v keeps its object", f.key)
		}
		f.key = FileKey{}
		f.handles = nil
		f.ref = nil
	case k < 91:
		// Someone changes the PFS file behind the cache's back (close-to-open).
		if len(f.handles) > 0 || d.busy(f) {
			return
		}
		if cf := d.c.files[f.key]; cf != nil && cf.dirty > 0 {
			return
		}
		off, n := d.pick(f)
		d.seq++
		p := grow(d.pfs[f.key], off+n)
		copy(p[off:], data(d.seq, n))
		d.pfs[f.key] = p
		d.pfsTime[f.key] += 1000
		f.ref = grow(f.ref, uint64(len(p)))
		copy(f.ref, p)
	case k < 92:
		if !d.noCrash {
			d.crash()
		}
	default:
		for i := 0; i < 3; i++ {
			d.step(d.r)
		}
		d.now = d.now.Add(time.Second) // time passes: failed flushes are retried
		d.apply(d.c.Tick(d.now))
	}
}

// crash kills the agent: flushes in flight landed or not, everything else in flight lost,
// open handles gone; the cache is recovered from its log.
func (d *driver) crash() {
	if traceAll {
		d.t.Logf("crash")
	}
	for _, a := range d.flushes {
		if d.r.Intn(2) == 0 {
			if _, ok := d.pfs[a.File]; ok {
				p := grow(d.pfs[a.File], a.Range.End())
				o := grow(d.obj[a.File], a.Range.ObjOff+a.Range.Len)
				copy(p[a.Range.Off:], o[a.Range.ObjOff:a.Range.ObjOff+a.Range.Len])
				d.pfs[a.File] = p
				d.pfsTime[a.File]++
			}
		}
	}
	d.log = append(d.log, d.c.Log()...)
	c, acts, err := Recover(d.cfg, d.log)
	if err != nil {
		d.t.Fatalf("recover: %v", err)
	}
	d.c = c
	d.fetches, d.flushes, d.syncs = nil, nil, nil
	for id, p := range d.pend {
		if p.kind == wTruncate {
			// not done: the model applies a truncate when it is admitted
			_ = id
		}
	}
	d.pend = map[WaiterID]pending{}
	d.woken, d.failed = map[WaiterID]bool{}, map[WaiterID]syscall.Errno{}
	for _, f := range d.files {
		f.handles = nil
	}
	for k := range d.obj {
		if c.files[k] == nil {
			delete(d.obj, k)
		}
	}
	d.apply(acts)
	d.log = c.Snapshot()
	d.c.begin()
}

func runModel(t *testing.T, seed int64, ops int, cfg Config, noCrash bool) *driver {
	r := rand.New(rand.NewSource(seed))
	d := &driver{sim: newSim(t, cfg), r: r, pend: map[WaiterID]pending{}, maxOff: 24 * mE, noCrash: noCrash}
	yes := true
	d.files = []*mfile{
		{},
		{layout: stripe.Layout{Size: 2 * mE, Width: 2, Servers: 2, Start: 0}, o: Override{SyncToPFS: &yes}},
		{layout: stripe.Layout{Size: 4 * mE, Width: 2, Servers: 3, Start: uint32(2+2*cfg.Server) % 3}, o: Override{SyncOnClose: &yes}},
	}
	if os.Getenv("TRACE") != "" {
		traceAll = true // TRACE=1 SEED=n: every action and write of seed n
	}
	if !noCrash { // the PFS fails some flushes (EIO: retried, reported to syncs, never lost)
		d.flushErr = func(Action) error {
			if r.Intn(10) == 0 {
				return syscall.EIO
			}
			return nil
		}
	}
	for i := 0; i < ops; i++ {
		d.op()
		d.serve()
	}
	d.flushErr = nil
	// Teardown: close everything (after the requests), drain, check the PFS.
	for iter := 0; len(d.pend) > 0; iter++ {
		if iter > 100000 {
			for _, w := range d.c.waiters {
				t.Logf("waiter %d kind %d off %d n %d space %d fetches %v fail %v set %d", w.id, w.kind, w.off, w.n, w.space, w.fetches, w.failErr, len(w.set))
			}
			t.Fatalf("livelock: %s %+v", d.sim, d.c.Stats())
		}
		if iter%64 == 63 { // time passes, as the backend's ticker says
			d.now = d.now.Add(d.c.cfg.RetryMin)
			d.apply(d.c.Tick(d.now))
		}
		if !d.step(r) {
			d.now = d.now.Add(2 * d.c.cfg.RetryMax)
			d.apply(d.c.Tick(d.now))
			if len(d.fetches)+len(d.flushes)+len(d.syncs) == 0 {
				d.serve()
				if len(d.pend) > 0 {
					t.Fatalf("deadlock with %d requests held: %s", len(d.pend), d.sim)
				}
			}
		}
		d.serve()
	}
	for _, f := range d.files {
		for _, h := range f.handles {
			r, acts := d.c.Close(h)
			d.apply(acts)
			if r.Status == Wait {
				d.settle(d.r, r.Waiter)
			}
		}
		f.handles = nil
	}
	res, acts := d.c.Drain()
	d.apply(acts)
	if res.Status == Wait {
		d.settle(r, res.Waiter)
		if !d.woken[res.Waiter] {
			t.Fatalf("drain not woken")
		}
	}
	d.settle(r, 0)
	if d.c.dirty != 0 {
		t.Fatalf("dirty after the drain: %d", d.c.dirty)
	}
	for _, f := range d.files {
		if f.key.Ino == 0 {
			continue
		}
		p := d.pfs[f.key]
		n := max(len(p), len(f.ref))
		pp, ref := grow(append([]byte(nil), p...), uint64(n)), grow(append([]byte(nil), f.ref...), uint64(n))
		for i := 0; i < n; i++ {
			if d.held(f, uint64(i)) && pp[i] != ref[i] {
				t.Fatalf("seed %d: PFS file %v differs from the reference at %d (%d vs %d); %s", seed, f.key, i, pp[i], ref[i], d.sim)
			}
		}
	}
	if d.enospc > 0 {
		t.Fatalf("ENOSPC %d times", d.enospc)
	}
	return d
}

func modelConfig() Config {
	return Config{Capacity: 16 * mE, ExtentSize: mE, MaxFlushesInFlight: 2, MaxFetchesInFlight: 3, MaxIOBytes: 3 * mE,
		Defaults: Policy{ReadAhead: 3 * mE, ModifiedThreshold: 6 * mE}}
}

func TestModel(t *testing.T) {
	seeds := 60
	if testing.Short() {
		seeds = 10
	}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		if os.Getenv("SEED") != "" && fmt.Sprint(seed) != os.Getenv("SEED") {
			continue
		}
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runModel(t, seed, 1500, modelConfig(), false) })
	}
}

// TestModelOtherServer: the model test as server 1, which holds the other stripes of the
// files (and the first stripe of the third, whose object offsets then start at 0).
func TestModelOtherServer(t *testing.T) {
	cfg := modelConfig()
	cfg.Server = 1
	for seed := int64(100); seed < 110; seed++ {
		runModel(t, seed, 1500, cfg, false)
	}
}

// TestWorkingSetFourTimesTheCapacity: three files of 24 extents each through a cache of 16
// (4.5×), written and read sequentially and at random: no ENOSPC, no request failed, the PFS
// right at the end.
func TestWorkingSetFourTimesTheCapacity(t *testing.T) {
	cfg := modelConfig()
	d := runModel(t, 99, 4000, cfg, true)
	st := d.c.Stats()
	if st.Evictions == 0 || st.FlushedBytes == 0 || st.FetchedBytes == 0 {
		t.Fatalf("a working set past the capacity must evict, flush and fetch: %+v", st)
	}
}
