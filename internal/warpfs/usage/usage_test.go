package usage

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestReserveRefusesBeyondCapacity(t *testing.T) {
	tr := New("instance 7", 1000)
	if err := tr.Reserve(600); err != nil {
		t.Fatalf("Reserve(600) of 1000: %v", err)
	}
	err := tr.Reserve(401)
	if err == nil {
		t.Fatal("Reserve(401) with 400 free succeeded")
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("error %v does not wrap ENOSPC", err)
	}
	var full *FullError
	if !errors.As(err, &full) || full.Used != 600 || full.Capacity != 1000 || full.Requested != 401 {
		t.Errorf("error %#v does not carry used 600, capacity 1000, requested 401", err)
	}
	for _, want := range []string{"instance 7", "600B used", "1000B", "400B free"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	if got := tr.Used(); got != 600 {
		t.Errorf("a refused reservation changed Used to %d", got)
	}
	if err := tr.Reserve(400); err != nil {
		t.Errorf("Reserve(400) filling exactly to capacity: %v", err)
	}
	if tr.Free() != 0 {
		t.Errorf("Free = %d at capacity", tr.Free())
	}
	if err := tr.Reserve(0); err != nil {
		t.Errorf("Reserve(0) when full: %v", err)
	}
	tr.Release(250)
	if got := tr.Used(); got != 750 {
		t.Errorf("Used after Release(250) = %d, want 750", got)
	}
	tr.Release(10_000)
	if got := tr.Used(); got != 0 {
		t.Errorf("Used after releasing more than used = %d, want 0", got)
	}
}

func TestReserveUpToAndCharge(t *testing.T) {
	tr := New("i", 100)
	if got := tr.ReserveUpTo(70); got != 70 {
		t.Errorf("ReserveUpTo(70) of 100 free = %d", got)
	}
	if got := tr.ReserveUpTo(70); got != 30 {
		t.Errorf("ReserveUpTo(70) of 30 free = %d", got)
	}
	if got := tr.ReserveUpTo(1); got != 0 {
		t.Errorf("ReserveUpTo(1) when full = %d", got)
	}
	tr.Charge(50)
	if tr.Used() != 150 || tr.Free() != 0 {
		t.Errorf("after Charge(50) beyond capacity: used %d free %d, want 150 and 0", tr.Used(), tr.Free())
	}
	if err := tr.Reserve(1); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Reserve over capacity after Charge: %v", err)
	}
	tr.SetCapacity(1000)
	if tr.Free() != 850 {
		t.Errorf("Free after SetCapacity(1000) = %d, want 850", tr.Free())
	}
}

// Many writers racing for the last bytes never push Used past the capacity, and every byte
// granted is accounted for.
func TestConcurrentReservationsNeverExceedCapacity(t *testing.T) {
	const capacity = 10_000
	tr := New("i", capacity)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var granted uint64
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				if tr.Reserve(7) == nil {
					mu.Lock()
					granted += 7
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if granted > capacity {
		t.Fatalf("granted %d bytes of %d", granted, capacity)
	}
	if tr.Used() != granted {
		t.Errorf("Used %d, granted %d", tr.Used(), granted)
	}
	if capacity-granted >= 7 {
		t.Errorf("%d bytes left unreserved though writers kept asking for 7", capacity-granted)
	}
}

func TestScanCountsFootprintsOnce(t *testing.T) {
	root := t.TempDir()
	other := t.TempDir()
	write := func(path string, size int64) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if size > 0 {
			// A sparse file: one byte at the end, the rest a hole.
			if _, err := f.WriteAt([]byte{1}, size-1); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(filepath.Join(root, "a"), 1000)
	write(filepath.Join(root, "sub", "deeper", "b"), 5<<20) // sparse 5 MiB
	write(filepath.Join(root, "empty"), 0)
	write(filepath.Join(other, "c"), 24)
	// Space allocated past the end (FALLOC_FL_KEEP_SIZE) counts: the file's size stays 0.
	write(filepath.Join(root, "kept"), 0)
	f, err := os.OpenFile(filepath.Join(root, "kept"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, 3<<20); err != nil {
		t.Skipf("fallocate KEEP_SIZE here: %v", err)
	}
	f.Close()
	// A second link to b counts once; a symlink to a big file outside counts as a link.
	if err := os.Link(filepath.Join(root, "sub", "deeper", "b"), filepath.Join(root, "b-link")); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "outside")
	write(outside, 1<<30)
	if err := os.Symlink(outside, filepath.Join(root, "sym")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "emptydir"), 0o755); err != nil {
		t.Fatal(err)
	}

	tr := New("instance 3", 1<<30)
	if err := tr.Reserve(12345); err != nil {
		t.Fatal(err)
	}
	if err := tr.Scan(root, other); err != nil {
		t.Fatal(err)
	}
	var want uint64
	for _, p := range []string{root, other, "a", "sub", "sub/deeper", "sub/deeper/b", "empty", "kept", "sym", "emptydir", other + "/c"} {
		if !filepath.IsAbs(p) {
			p = filepath.Join(root, p)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		want += Footprint(&st)
	}
	if got := tr.Used(); got != want {
		t.Errorf("Used after Scan = %d, want %d", got, want)
	}
	var kept unix.Stat_t
	unix.Lstat(filepath.Join(root, "kept"), &kept)
	if kept.Size != 0 || Footprint(&kept) < 3<<20 {
		t.Errorf("a file of size %d with 3 MiB allocated past its end has a footprint of %d", kept.Size, Footprint(&kept))
	}
	var b unix.Stat_t
	unix.Lstat(filepath.Join(root, "sub", "deeper", "b"), &b)
	if Footprint(&b) != 5<<20 {
		t.Errorf("a sparse 5 MiB file has a footprint of %d, want its length", Footprint(&b))
	}
}

func TestScanErrorsNameThePath(t *testing.T) {
	tr := New("instance 9", 100)
	if err := tr.Reserve(42); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "gone")
	err := tr.Scan(missing)
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "instance 9") {
		t.Errorf("Scan of a missing directory: %v; want an error naming %s and the instance", err, missing)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = tr.Scan(file)
	if err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("Scan of a regular file: %v", err)
	}
	if tr.Used() != 42 {
		t.Errorf("a failed Scan changed Used to %d", tr.Used())
	}
}

func TestRegistryGetOrCreate(t *testing.T) {
	r := NewRegistry()
	a, created := r.Get(42, 1000)
	if !created || a.Capacity() != 1000 || a.Name() != "instance 42" {
		t.Fatalf("first Get: created=%v capacity=%d name=%q", created, a.Capacity(), a.Name())
	}
	if err := a.Reserve(10); err != nil {
		t.Fatal(err)
	}
	b, created := r.Get(42, 2000)
	if created || b != a {
		t.Fatal("second Get of the same instance made a new tracker")
	}
	if b.Capacity() != 2000 || b.Used() != 10 {
		t.Errorf("after Get with a new capacity: capacity %d used %d, want 2000 and 10", b.Capacity(), b.Used())
	}
	if got, ok := r.Lookup(42); !ok || got != a {
		t.Error("Lookup(42) did not find the tracker")
	}
	if _, ok := r.Lookup(43); ok {
		t.Error("Lookup(43) found a tracker never created")
	}
	if ids := r.IDs(); len(ids) != 1 || ids[0] != 42 {
		t.Errorf("IDs = %v", ids)
	}
	r.Forget(42)
	if _, ok := r.Lookup(42); ok {
		t.Error("Lookup after Forget found the tracker")
	}
	c, created := r.Get(42, 1000)
	if !created || c == a || c.Used() != 0 {
		t.Error("Get after Forget did not make a fresh tracker")
	}
}

func TestRegistryConcurrentGetReturnsOneTracker(t *testing.T) {
	r := NewRegistry()
	var wg sync.WaitGroup
	got := make([]*Tracker, 32)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], _ = r.Get(5, 100)
		}()
	}
	wg.Wait()
	for _, tr := range got {
		if tr != got[0] {
			t.Fatal("concurrent Get returned different trackers for one instance")
		}
	}
}

func TestFallocateWorst(t *testing.T) {
	const keep = unix.FALLOC_FL_KEEP_SIZE
	for _, tc := range []struct {
		mode            uint32
		off, length     uint64
		size            int64
		allocated       uint64
		worst, allocEnd uint64
	}{
		{0, 0, 100, 0, 0, 4096, 100},                        // a new file's first 100 bytes: a block
		{0, 50, 100, 100, 4096, 8192, 150},                  // the block it touches may be a hole, for all it knows
		{0, 0, 8192, 8192, 8192, 16384, 8192},               // the range may be a hole: counted again at worst
		{keep, 0, 1 << 30, 10, 4096, 1<<30 + 4096, 1 << 30}, // the size stays; the blocks count
		{keep, 1 << 20, 4096, 0, 0, 4096, 1<<20 + 4096},     // past the end, with a gap
		{keep, 0, 4096, 1 << 30, 0, 1 << 30, 4096},          // a sparse file's length covers it
		{unix.FALLOC_FL_PUNCH_HOLE | keep, 0, 4096, 8192, 8192, 8192, 0},
		{unix.FALLOC_FL_COLLAPSE_RANGE, 0, 4096, 8192, 8192, 8192, 0},
		{unix.FALLOC_FL_INSERT_RANGE, 0, 4096, 8192, 8192, 12288, 12288},
		{unix.FALLOC_FL_ZERO_RANGE | keep, 0, 1 << 20, 0, 0, 1 << 20, 1 << 20},
	} {
		worst, end := FallocateWorst(tc.mode, tc.off, tc.length, tc.size, tc.allocated, 4096)
		if worst != tc.worst || end != tc.allocEnd {
			t.Errorf("FallocateWorst(%#x, %d, %d, size %d, allocated %d) = %d, %d; want %d, %d",
				tc.mode, tc.off, tc.length, tc.size, tc.allocated, worst, end, tc.worst, tc.allocEnd)
		}
	}
}

func TestTrackerPeak(t *testing.T) {
	tr := New("instance 1", 100)
	tr.Reserve(40)
	tr.Charge(20)
	tr.Release(50)
	tr.ReserveUpTo(10)
	if tr.Used() != 20 || tr.Peak() != 60 {
		t.Errorf("used %d, peak %d; want 20 and 60", tr.Used(), tr.Peak())
	}
}
