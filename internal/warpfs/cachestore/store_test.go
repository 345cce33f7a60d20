package cachestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/privdrop"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// The tests run on a real PFS (a temporary directory through a real door) and real object
// files, with small extents and a small capacity so that eviction and write-back matter.
const (
	testExtent   = 64 << 10
	testCapacity = 16 * testExtent // 1 MiB
)

func testConfig() cache.Config {
	return cache.Config{Capacity: testCapacity, ExtentSize: testExtent, MaxIOBytes: 4 * testExtent,
		RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newPFS is a PFS directory and a door to it.
func newPFS(t *testing.T) (string, *pfsio.Door) {
	t.Helper()
	dir := t.TempDir()
	return dir, openDoor(t, dir)
}

func openDoor(t *testing.T, dir string) *pfsio.Door {
	t.Helper()
	d, err := pfsio.Open(dir, pfsio.Options{})
	must(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

func openStore(t *testing.T, dir string, cfg cache.Config) *Store {
	t.Helper()
	s, err := Open(Options{Dir: dir, Config: cfg, TickInterval: 10 * time.Millisecond})
	must(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

func newStore(t *testing.T, cfg cache.Config) *Store {
	return openStore(t, t.TempDir(), cfg)
}

func randomBytes(seed int64, n int) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// writePFS writes a file directly on the PFS (as another user of it would) and returns its ref.
func writePFS(t *testing.T, pfs, name string, data []byte) FileRef {
	t.Helper()
	must(t, os.WriteFile(filepath.Join(pfs, name), data, 0o644))
	return refOf(t, pfs, name, stripe.Layout{})
}

func refOf(t *testing.T, pfs, name string, l stripe.Layout) FileRef {
	t.Helper()
	var st syscall.Stat_t
	must(t, syscall.Stat(filepath.Join(pfs, name), &st))
	return FileRef{Path: name, Key: cache.FileKey{Dev: uint64(st.Dev), Ino: st.Ino}, Layout: l}
}

func readPFS(t *testing.T, pfs, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(pfs, name))
	must(t, err)
	return b
}

func sum(b []byte) [32]byte { return sha256.Sum256(b) }

// readAll reads n bytes through f in chunks of size chunk (not extent-aligned on purpose).
func readAll(t *testing.T, f *File, n, chunk int) []byte {
	t.Helper()
	out := make([]byte, n)
	for off := 0; off < n; off += chunk {
		end := min(off+chunk, n)
		got, err := f.ReadAt(out[off:end], uint64(off))
		if err != nil || got != end-off {
			t.Fatalf("ReadAt(%d, %d): %d, %v", off, end-off, got, err)
		}
	}
	return out
}

func writeAll(t *testing.T, f *File, data []byte, at, chunk int) {
	t.Helper()
	for off := 0; off < len(data); off += chunk {
		end := min(off+chunk, len(data))
		got, err := f.WriteAt(data[off:end], uint64(at+off))
		if err != nil || got != end-off {
			t.Fatalf("WriteAt(%d, %d): %d, %v", at+off, end-off, got, err)
		}
	}
}

func drain(t *testing.T, s *Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must(t, s.Drain(ctx))
}

// A file written on the PFS directly reads through the cache, 3.5 times the capacity of it
// (so extents are evicted and fetched again), twice.
func TestReadThrough(t *testing.T) {
	pfs, door := newPFS(t)
	data := randomBytes(1, 7*testCapacity/2+1234)
	ref := writePFS(t, pfs, "input", data)
	s := newStore(t, testConfig())
	for pass := 0; pass < 2; pass++ {
		f, err := s.OpenFile(door, ref, false)
		must(t, err)
		if got := readAll(t, f, len(data), 100_000); sum(got) != sum(data) {
			t.Fatalf("pass %d: the file read through the cache differs from the PFS's", pass)
		}
		must(t, f.Close())
	}
	st := s.Stats()
	if st.Misses == 0 || st.Evictions == 0 || st.FetchedBytes < uint64(len(data)) {
		t.Errorf("stats %+v: expected misses, evictions and every byte fetched", st)
	}
	if st.Used > testCapacity {
		t.Errorf("%d bytes used, capacity %d", st.Used, testCapacity)
	}
}

// Writes stay on the burst buffer (no sync policy, under the dirty watermark) while other
// files' reads make the cache evict, even after close; Drain puts them on the PFS.
func TestWriteBehindVisibleOnlyAfterDrain(t *testing.T) {
	pfs, door := newPFS(t)
	old := randomBytes(2, 512<<10)
	ref := writePFS(t, pfs, "out", old)
	other := randomBytes(3, 2*testCapacity)
	otherRef := writePFS(t, pfs, "other", other)
	s := newStore(t, testConfig())

	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	update := randomBytes(4, 200<<10) // under 45 % of the capacity: no watermark flush
	writeAll(t, f, update, 100_000, 30_000)
	want := append([]byte(nil), old...)
	copy(want[100_000:], update)

	g, err := s.OpenFile(door, otherRef, false)
	must(t, err)
	if got := readAll(t, g, len(other), 64<<10); sum(got) != sum(other) {
		t.Fatal("reading another file under eviction pressure: wrong data")
	}
	must(t, g.Close())
	must(t, f.Close())
	time.Sleep(50 * time.Millisecond) // some ticks
	if sum(readPFS(t, pfs, "out")) != sum(old) {
		t.Fatal("the PFS file changed before Drain: write-behind expected")
	}
	if st := s.Stats(); st.Evictions == 0 || st.Dirty == 0 {
		t.Fatalf("stats %+v: expected evictions and dirty data kept", st)
	}
	// The dirty data is read back from the cache, not the PFS.
	f, err = s.OpenFile(door, ref, false)
	must(t, err)
	if got := readAll(t, f, len(want), 77_777); sum(got) != sum(want) {
		t.Fatal("reading back dirty data: wrong data")
	}
	must(t, f.Close())
	drain(t, s)
	if sum(readPFS(t, pfs, "out")) != sum(want) {
		t.Fatal("after Drain the PFS file is not what was written")
	}
	if st := s.Stats(); st.Dirty != 0 {
		t.Errorf("%d dirty bytes after Drain", st.Dirty)
	}
}

// Writing and reading back a working set four times the capacity never fails: writes wait
// for flushes, reads evict.
func TestWorkingSetFourTimesCapacity(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "big", nil)
	s := newStore(t, testConfig())
	data := randomBytes(5, 4*testCapacity+4321)
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	writeAll(t, f, data, 0, 96<<10+17)
	if got := readAll(t, f, len(data), 50_000); sum(got) != sum(data) {
		t.Fatal("reading back the working set: wrong data")
	}
	must(t, f.Close())
	drain(t, s)
	if sum(readPFS(t, pfs, "big")) != sum(data) {
		t.Fatal("the PFS file is not what was written")
	}
	if st := s.Stats(); st.FlushedBytes < uint64(len(data)) || st.Used > testCapacity {
		t.Errorf("stats %+v", st)
	}
}

// With sync_to_pfs, Fsync returns once the data is on the PFS.
func TestFsyncSyncToPFS(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "ckpt", nil)
	cfg := testConfig()
	cfg.Defaults.SyncToPFS = true
	s := newStore(t, cfg)
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	data := randomBytes(6, 300_000)
	writeAll(t, f, data, 0, 64<<10)
	if len(readPFS(t, pfs, "ckpt")) != 0 {
		t.Fatal("the data reached the PFS before Fsync")
	}
	must(t, f.Fsync())
	if !bytes.Equal(readPFS(t, pfs, "ckpt"), data) {
		t.Fatal("Fsync returned before the data was on the PFS")
	}
	must(t, f.Close())
}

// With sync_on_close, Close returns once the data is on the PFS.
func TestSyncOnClose(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "out", nil)
	cfg := testConfig()
	cfg.Defaults.SyncOnClose = true
	s := newStore(t, cfg)
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	data := randomBytes(7, 250_000)
	writeAll(t, f, data, 0, 40_000)
	if len(readPFS(t, pfs, "out")) != 0 {
		t.Fatal("the data reached the PFS before Close")
	}
	must(t, f.Close())
	if !bytes.Equal(readPFS(t, pfs, "out"), data) {
		t.Fatal("Close returned before the data was on the PFS")
	}
}

// A PFS file replaced underneath (another inode at the path) is ESTALE at open.
func TestReplacedFileIsStale(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "f", []byte("old"))
	s := newStore(t, testConfig())
	f, err := s.OpenFile(door, ref, false)
	must(t, err)
	must(t, f.Close())
	must(t, os.WriteFile(filepath.Join(pfs, "f.new"), []byte("new"), 0o644))
	must(t, os.Rename(filepath.Join(pfs, "f.new"), filepath.Join(pfs, "f")))
	if _, err := s.OpenFile(door, ref, false); !errors.Is(err, syscall.ESTALE) {
		t.Fatalf("open of a replaced file: %v, want ESTALE", err)
	}
	if err := s.Truncate(door, ref, 0); !errors.Is(err, syscall.ESTALE) {
		t.Fatal("truncate of a replaced file: want ESTALE")
	}
}

// A file changed on the PFS (mtime, size) since the cache read it is read fresh at the next
// open (close-to-open); unchanged, it is served from the cache.
func TestChangedFileReadFreshAtOpen(t *testing.T) {
	pfs, door := newPFS(t)
	a := randomBytes(8, 300_000)
	ref := writePFS(t, pfs, "f", a)
	s := newStore(t, testConfig())
	read := func() []byte {
		f, err := s.OpenFile(door, ref, false)
		must(t, err)
		defer f.Close()
		st, _ := os.Stat(filepath.Join(pfs, "f"))
		return readAll(t, f, int(st.Size()), 70_000)
	}
	if !bytes.Equal(read(), a) {
		t.Fatal("first read: wrong data")
	}
	fetched := s.Stats().FetchedBytes
	if !bytes.Equal(read(), a) || s.Stats().FetchedBytes != fetched {
		t.Fatal("an unchanged file was not served from the cache")
	}

	// Same size, new content and mtime, written in place (same inode).
	b := randomBytes(9, len(a))
	path := filepath.Join(pfs, "f")
	must(t, os.WriteFile(path, b, 0o644))
	future := time.Now().Add(time.Hour)
	must(t, os.Chtimes(path, future, future))
	if !bytes.Equal(read(), b) {
		t.Fatal("after an mtime change: stale data")
	}

	// A longer file.
	c := append(append([]byte(nil), b...), randomBytes(10, 100_000)...)
	must(t, os.WriteFile(path, c, 0o644))
	if !bytes.Equal(read(), c) {
		t.Fatal("after a size change: stale data")
	}

	// Emptied on the PFS: the cached extents are holes again, so a write further on leaves
	// zeros before it, not the old bytes.
	must(t, os.Truncate(path, 0))
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	writeAll(t, f, []byte("tail"), 250_000, 4)
	want := make([]byte, 250_004)
	copy(want[250_000:], "tail")
	if got := readAll(t, f, len(want), 64<<10); !bytes.Equal(got, want) {
		t.Fatal("after the PFS file was emptied: old bytes read back")
	}
	must(t, f.Close())
}

// A store closed without draining (a crash, as far as the data is concerned) recovers its
// dirty data from the log: nothing reaches the PFS at Close; Drain names the file while no
// door is known; after an OpenFile (or SetDoor) Drain puts the data on the PFS.
func TestRestartKeepsDirtyData(t *testing.T) {
	for _, how := range []string{"OpenFile", "SetDoor"} {
		t.Run(how, func(t *testing.T) {
			pfs, door := newPFS(t)
			old := randomBytes(11, 400_000)
			ref := writePFS(t, pfs, "sub.dat", old)
			dir := t.TempDir()
			s, err := Open(Options{Dir: dir, Config: testConfig()})
			must(t, err)
			f, err := s.OpenFile(door, ref, true)
			must(t, err)
			update := randomBytes(12, 150_000)
			writeAll(t, f, update, 123_456, 50_000)
			want := append([]byte(nil), old...)
			copy(want[123_456:], update)
			must(t, f.Close())
			must(t, s.Close())
			if sum(readPFS(t, pfs, "sub.dat")) != sum(old) {
				t.Fatal("Close flushed: it must not")
			}

			s2 := openStore(t, dir, testConfig())
			if st := s2.Stats(); st.Dirty == 0 {
				t.Fatalf("no dirty data recovered: %+v", st)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var fe *FileError
			if err := s2.Drain(ctx); !errors.As(err, &fe) || fe.Path != "sub.dat" || !errors.Is(err, syscall.ENOTCONN) {
				t.Fatalf("Drain with no door: %v, want a FileError naming sub.dat", err)
			}
			if how == "OpenFile" {
				f, err := s2.OpenFile(door, ref, false)
				must(t, err)
				if got := readAll(t, f, len(want), 99_999); sum(got) != sum(want) {
					t.Fatal("reading recovered dirty data: wrong data")
				}
				must(t, f.Close())
			} else {
				s2.SetDoor(func(path string) (*pfsio.Door, error) { return door, nil })
			}
			drain(t, s2)
			if sum(readPFS(t, pfs, "sub.dat")) != sum(want) {
				t.Fatal("after the restart and Drain the PFS file is not what was written")
			}
		})
	}
}

// A dirty file renamed (its directory too) after its last open, then the store restarted:
// Drain finds it by its inode under its new name, even with another file at the old one.
func TestRestartFindsRenamedDirtyFile(t *testing.T) {
	pfs, door := newPFS(t)
	must(t, os.Mkdir(filepath.Join(pfs, "d"), 0o755))
	old := randomBytes(21, 300_000)
	ref := writePFS(t, pfs, "d/f", old)
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, Config: testConfig()})
	must(t, err)
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	update := randomBytes(22, 100_000)
	writeAll(t, f, update, 5_000, 50_000)
	want := append([]byte(nil), old...)
	copy(want[5_000:], update)
	must(t, f.Close())
	must(t, s.Close())
	must(t, os.Rename(filepath.Join(pfs, "d", "f"), filepath.Join(pfs, "d", "g")))
	must(t, os.Rename(filepath.Join(pfs, "d"), filepath.Join(pfs, "e")))
	must(t, os.Mkdir(filepath.Join(pfs, "d"), 0o755))
	writePFS(t, pfs, "d/f", []byte("another file at the old name\n"))

	s2 := openStore(t, dir, testConfig())
	s2.SetDoor(func(path string) (*pfsio.Door, error) { return door, nil })
	drain(t, s2)
	if sum(readPFS(t, pfs, "e/g")) != sum(want) {
		t.Fatal("after the restart and Drain the renamed file is not what was written")
	}
	if string(readPFS(t, pfs, "d/f")) != "another file at the old name\n" {
		t.Fatal("Drain wrote over the file now at the old name")
	}
}

// A dirty file removed on the PFS underneath (not through the cache) while the store was
// down: Drain fails naming it (ENOENT), the data kept, rather than retrying forever.
func TestRestartDirtyFileGoneFromPFS(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "f", randomBytes(41, 10_000))
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, Config: testConfig()})
	must(t, err)
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	writeAll(t, f, randomBytes(42, 5_000), 0, 5_000)
	must(t, f.Close())
	must(t, s.Close())
	must(t, os.Remove(filepath.Join(pfs, "f")))

	s2 := openStore(t, dir, testConfig())
	s2.SetDoor(func(path string) (*pfsio.Door, error) { return door, nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var fe *FileError
	if err := s2.Drain(ctx); !errors.As(err, &fe) || fe.Path != "f" || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("Drain of a dirty file gone from the PFS: %v, want a FileError naming f (ENOENT)", err)
	}
	if st := s2.Stats(); st.Dirty == 0 {
		t.Fatalf("the data was dropped: %+v", st)
	}
}

// A removal that arrives after the PFS gave the removed file's inode number to a new file
// this store has opened since (another compute node created it between the namespace's
// unlink and the removal) is of the earlier file: the new file's data stays.
func TestStaleUnlinkOfReusedInode(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "new", nil)
	s := newStore(t, testConfig())
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	data := randomBytes(31, 35_799)
	writeAll(t, f, data, 0, 10_000)
	must(t, f.Close())
	s.Unlink(ref.Key) // late: of the file that had this inode number before
	drain(t, s)
	if sum(readPFS(t, pfs, "new")) != sum(data) {
		t.Fatal("a late removal of an earlier file with the same inode number dropped the new file's data")
	}
	// A removal of the file itself (no name has its inode any more) drops its data.
	f, err = s.OpenFile(door, ref, true)
	must(t, err)
	writeAll(t, f, randomBytes(32, 1000), 0, 1000)
	must(t, f.Close())
	must(t, os.Remove(filepath.Join(pfs, "new")))
	s.Unlink(ref.Key)
	if st := s.Stats(); st.Dirty != 0 {
		t.Fatalf("the removed file's dirty data is kept: %+v", st)
	}
}

// A flush that the PFS refuses (full) fails Drain with its errno and keeps the data; once
// there is room, Drain puts it there. The PFS is a small tmpfs, since root writes through
// any permission bits.
func TestFlushFailureKeepsData(t *testing.T) {
	pfs := t.TempDir()
	if err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", pfs).Run(); err != nil {
		t.Skipf("cannot mount a tmpfs for a full PFS: %v", err)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", pfs).Run() })
	door := openDoor(t, pfs)
	ref := writePFS(t, pfs, "out", nil)
	filler := filepath.Join(pfs, "filler")
	fill, err := os.Create(filler)
	must(t, err)
	fill.Write(make([]byte, 4<<20)) // ENOSPC at 2 MiB: the PFS is full
	fill.Close()

	s := newStore(t, testConfig())
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	data := randomBytes(13, 200_000)
	writeAll(t, f, data, 0, 64<<10)
	must(t, f.Close())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = s.Drain(ctx)
	var fe *FileError
	if !errors.Is(err, syscall.ENOSPC) || !errors.As(err, &fe) || fe.Path != "out" {
		t.Fatalf("Drain on a full PFS: %v, want ENOSPC naming out", err)
	}
	if st := s.Stats(); st.Dirty == 0 || st.FlushErrors == 0 {
		t.Fatalf("stats %+v: the data must be kept dirty", st)
	}
	must(t, os.Remove(filler))
	drain(t, s)
	if !bytes.Equal(readPFS(t, pfs, "out"), data) {
		t.Fatal("after room was made, Drain did not put the data on the PFS")
	}
}

// Discard drops the dirty data (teardown --hurry) and says how much: the PFS never sees it.
func TestDiscard(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "out", nil)
	s := newStore(t, testConfig())
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	writeAll(t, f, randomBytes(14, 100_000), 0, 100_000)
	must(t, f.Close())
	// Two extents: 64 KiB and 34464 bytes, charged in 4 KiB blocks.
	if lost := s.Discard(); lost != testExtent+36864 {
		t.Fatalf("Discard: %d bytes, want %d", lost, testExtent+36864)
	}
	drain(t, s)
	if len(readPFS(t, pfs, "out")) != 0 {
		t.Fatal("discarded data reached the PFS")
	}
	if st := s.Stats(); st.Dirty != 0 || st.Used != 0 {
		t.Fatalf("stats after Discard %+v", st)
	}
}

// Truncate drops the cached bytes past the size and truncates the PFS file; Unlink drops a
// closed file's dirty data without flushing it.
func TestTruncateAndUnlink(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "t", nil)
	gone := writePFS(t, pfs, "gone", nil)
	s := newStore(t, testConfig())
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	data := randomBytes(15, 300_000)
	writeAll(t, f, data, 0, 64<<10)
	must(t, s.Truncate(door, ref, 100_000))
	// Past the new size the object is a hole again: a write further on leaves zeros between.
	tail := []byte("tail")
	writeAll(t, f, tail, 250_000, 4)
	want := make([]byte, 250_004)
	copy(want, data[:100_000])
	copy(want[250_000:], tail)
	if got := readAll(t, f, len(want), 64<<10); !bytes.Equal(got, want) {
		t.Fatal("after truncate and a write past it: the bytes between are not zeros")
	}
	must(t, f.Close())
	g, err := s.OpenFile(door, gone, true)
	must(t, err)
	writeAll(t, g, data, 0, 64<<10)
	must(t, g.Close())
	// Removed on the PFS (a second name kept here to look at its inode), then Unlink.
	must(t, os.Link(filepath.Join(pfs, "gone"), filepath.Join(pfs, "gone-inode")))
	must(t, os.Remove(filepath.Join(pfs, "gone")))
	s.Unlink(gone.Key)
	drain(t, s)
	if !bytes.Equal(readPFS(t, pfs, "t"), want) {
		t.Fatal("after truncate and Drain: wrong PFS file")
	}
	if len(readPFS(t, pfs, "gone-inode")) != 0 {
		t.Fatal("an unlinked file's data was flushed")
	}
}

// Two servers of one instance (stripe_width 2) each write their object of a file; drained,
// the PFS file is their stripes interleaved.
func TestTwoServersStripes(t *testing.T) {
	pfs, door := newPFS(t)
	layout := stripe.Layout{ID: 7, Size: 2 * testExtent, Width: 2, Servers: 2}
	writePFS(t, pfs, "striped", nil)
	ref := refOf(t, pfs, "striped", layout)
	data := randomBytes(16, 3*testCapacity+5000) // not a whole number of stripes
	objects := [2][]byte{}
	for i := range objects {
		objects[i] = make([]byte, layout.ObjectSize(uint64(len(data)), i))
	}
	for _, p := range layout.Pieces(0, uint64(len(data))) {
		copy(objects[p.Server][p.ObjOffset:], data[p.BufOffset:p.BufOffset+p.Length])
	}
	var stores [2]*Store
	for i := range stores {
		cfg := testConfig()
		cfg.Server = i
		stores[i] = newStore(t, cfg)
		f, err := stores[i].OpenFile(door, ref, true)
		must(t, err)
		writeAll(t, f, objects[i], 0, 80_000)
		must(t, f.Close())
	}
	for _, s := range stores {
		drain(t, s)
	}
	if sum(readPFS(t, pfs, "striped")) != sum(data) {
		t.Fatal("the PFS file is not the servers' stripes interleaved")
	}
	// And each server reads its own stripes back from a fresh open of the PFS file.
	for i, s := range stores {
		f, err := s.OpenFile(door, ref, false)
		must(t, err)
		if got := readAll(t, f, len(objects[i]), 50_000); sum(got) != sum(objects[i]) {
			t.Fatalf("server %d reads back wrong data", i)
		}
		must(t, f.Close())
	}
}

// Closed dirty files keep a PFS descriptor each, at most MaxOpenPFSFiles of them: past it the
// one closed longest ago is flushed and let go.
func TestLingeringPFSFilesBounded(t *testing.T) {
	pfs, door := newPFS(t)
	s, err := Open(Options{Dir: t.TempDir(), Config: testConfig(), MaxOpenPFSFiles: 2, TickInterval: time.Hour})
	must(t, err)
	defer s.Close()
	names := []string{"a", "b", "c", "d", "e"}
	data := randomBytes(17, 10_000)
	for _, name := range names {
		ref := writePFS(t, pfs, name, nil)
		f, err := s.OpenFile(door, ref, true)
		must(t, err)
		writeAll(t, f, data, 0, len(data))
		must(t, f.Close())
		time.Sleep(time.Millisecond) // distinct close times
	}
	s.mu.Lock()
	s.sweepLocked(nil) // what the ticker does
	held := s.openLingering()
	s.mu.Unlock()
	if held > 2 {
		t.Fatalf("%d closed dirty files hold a PFS descriptor, bound 2", held)
	}
	for i, name := range names {
		onPFS := bytes.Equal(readPFS(t, pfs, name), data)
		if flushed := i < len(names)-2; onPFS != flushed {
			t.Errorf("%s: on the PFS %v, want %v (the oldest closed are flushed first)", name, onPFS, flushed)
		}
	}
	drain(t, s)
	for _, name := range names {
		if !bytes.Equal(readPFS(t, pfs, name), data) {
			t.Errorf("%s: not on the PFS after Drain", name)
		}
	}
}

// The log is compacted past MaxLogBytes and still recovers every dirty byte.
func TestLogCompaction(t *testing.T) {
	pfs, door := newPFS(t)
	dir := t.TempDir()
	const maxLog = 2048
	s, err := Open(Options{Dir: dir, Config: testConfig(), MaxLogBytes: maxLog})
	must(t, err)
	want := map[string][]byte{}
	for i, name := range []string{"x", "y", "z"} {
		ref := writePFS(t, pfs, name, nil)
		f, err := s.OpenFile(door, ref, true)
		must(t, err)
		data := randomBytes(int64(20+i), 180_000)
		writeAll(t, f, data, 0, 1000) // many small writes: many records
		want[name] = data
		must(t, f.Close())
		st, err := os.Stat(filepath.Join(dir, "log"))
		must(t, err)
		if st.Size() > 2*maxLog {
			t.Fatalf("log of %d bytes, compaction past %d expected", st.Size(), maxLog)
		}
	}
	must(t, s.Close())
	s2 := openStore(t, dir, testConfig())
	s2.SetDoor(func(string) (*pfsio.Door, error) { return door, nil })
	drain(t, s2)
	for name, data := range want {
		if !bytes.Equal(readPFS(t, pfs, name), data) {
			t.Errorf("%s: not recovered whole from the compacted log", name)
		}
	}
}

// Concurrent writers of one file (disjoint regions, together 4 times the capacity) and
// readers of another, through one store: every byte lands where it was written.
func TestConcurrentReadersAndWriters(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "shared", nil)
	input := randomBytes(30, 2*testCapacity)
	inRef := writePFS(t, pfs, "input", input)
	s := newStore(t, testConfig())
	const writers, region = 4, testCapacity
	want := randomBytes(31, writers*region)
	errs := make(chan error, writers+2)
	for w := 0; w < writers; w++ {
		go func() {
			f, err := s.OpenFile(door, ref, true)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			rng := rand.New(rand.NewSource(int64(w)))
			base := w * region
			for off := 0; off < region; {
				n := min(1+rng.Intn(100_000), region-off)
				if _, err := f.WriteAt(want[base+off:base+off+n], uint64(base+off)); err != nil {
					errs <- err
					return
				}
				off += n
			}
			got := make([]byte, region)
			if _, err := f.ReadAt(got, uint64(base)); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, want[base:base+region]) {
				errs <- errors.New("a writer reads back other bytes than it wrote")
				return
			}
			errs <- nil
		}()
	}
	for r := 0; r < 2; r++ {
		go func() {
			f, err := s.OpenFile(door, inRef, false)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			got := make([]byte, len(input))
			for off := 0; off < len(got); off += 33_333 {
				if _, err := f.ReadAt(got[off:min(off+33_333, len(got))], uint64(off)); err != nil {
					errs <- err
					return
				}
			}
			if !bytes.Equal(got, input) {
				errs <- errors.New("a reader reads other bytes than the PFS holds")
				return
			}
			errs <- nil
		}()
	}
	for i := 0; i < writers+2; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	drain(t, s)
	if sum(readPFS(t, pfs, "shared")) != sum(want) {
		t.Fatal("the PFS file is not what the writers wrote")
	}
}

// After the store is closed, what would wait for the PFS fails EIO at once.
func TestClosedStoreFailsHeldRequests(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "f", nil)
	cfg := testConfig()
	cfg.Defaults.SyncOnClose = true
	s := newStore(t, cfg)
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	writeAll(t, f, randomBytes(40, 10_000), 0, 10_000)
	must(t, s.Close())
	done := make(chan error, 1)
	go func() { done <- f.Close() }()
	select {
	case err := <-done:
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("close with sync_on_close after the store closed: %v, want EIO", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("close with sync_on_close after the store closed hangs")
	}
	if err := s.Drain(context.Background()); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Drain after Close: %v, want EIO", err)
	}
	if _, err := s.OpenFile(door, ref, false); !errors.Is(err, syscall.EIO) {
		t.Fatalf("OpenFile after Close: %v, want EIO", err)
	}
}

// copyDir copies a fragment's directory as it is on disk now: what a crash would leave.
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	must(t, filepath.Walk(from, func(path string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		if info.IsDir() {
			return os.MkdirAll(filepath.Join(to, rel), 0o700)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(to, rel), b, 0o600)
	}))
}

// A write is in the log when WriteAt returns: a copy of the directory taken then (the store
// still running, nothing closed) recovers it.
func TestAcknowledgedWriteIsInTheLog(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "f", nil)
	dir := t.TempDir()
	s := openStore(t, dir, testConfig())
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	data := randomBytes(50, 200_000)
	writeAll(t, f, data, 0, 30_000)
	crashed := t.TempDir()
	copyDir(t, dir, crashed)

	s2 := openStore(t, crashed, testConfig())
	s2.SetDoor(func(string) (*pfsio.Door, error) { return door, nil })
	drain(t, s2)
	if !bytes.Equal(readPFS(t, pfs, "f"), data) {
		t.Fatal("the acknowledged writes were not recovered from the log as it was on disk")
	}
	must(t, f.Close())
}

// A dirty closed file whose door was closed (the job's worker gone) is not lost: Drain names
// it, and a new door (SetDoor) flushes it.
func TestClosedDoorIsReplaced(t *testing.T) {
	pfs := t.TempDir()
	door, err := pfsio.Open(pfs, pfsio.Options{})
	must(t, err)
	ref := writePFS(t, pfs, "f", nil)
	s := newStore(t, testConfig())
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	data := randomBytes(60, 100_000)
	writeAll(t, f, data, 0, 100_000)
	must(t, f.Close())
	door.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var fe *FileError
	if err := s.Drain(ctx); !errors.As(err, &fe) || fe.Path != "f" || !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("Drain through a closed door: %v, want ENOTCONN naming f", err)
	}
	door2 := openDoor(t, pfs)
	s.SetDoor(func(string) (*pfsio.Door, error) { return door2, nil })
	drain(t, s)
	if !bytes.Equal(readPFS(t, pfs, "f"), data) {
		t.Fatal("after a new door, Drain did not put the data on the PFS")
	}
}

// Truncates of one file at once are taken one after the other (the core refuses a second one
// in progress).
func TestConcurrentTruncates(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "f", randomBytes(70, 500_000))
	s := newStore(t, testConfig())
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	defer f.Close()
	readAll(t, f, 500_000, 64<<10)
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		go func() { errs <- s.Truncate(door, ref, uint64(400_000-i*10_000)) }()
	}
	for i := 0; i < 8; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent truncate: %v", err)
		}
	}
}

// The defaults (1 MiB extents, coalesced flushes of up to 8 MiB) with a working set four
// times the capacity, written and read back in large requests.
func TestDefaultExtentSize(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "big", nil)
	s := newStore(t, cache.Config{Capacity: 4 << 20, RetryMin: 20 * time.Millisecond})
	data := randomBytes(80, 16<<20+12345)
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	writeAll(t, f, data, 0, 3<<20+7)
	if got := readAll(t, f, len(data), 5<<20); sum(got) != sum(data) {
		t.Fatal("reading back: wrong data")
	}
	must(t, f.Close())
	drain(t, s)
	if sum(readPFS(t, pfs, "big")) != sum(data) {
		t.Fatal("the PFS file is not what was written")
	}
}

// Through a door whose worker runs as an ordinary user, a flush the PFS refuses the user
// (EACCES: the file was made read-only while its dirty data waited, across a restart) fails
// Drain naming the file and keeps the data; once the user may write again, Drain puts it
// there, written by the user.
func TestUserDoorFlushRefused(t *testing.T) {
	if workerExe == nil {
		t.Skip("needs root: the door's worker must run as another user")
	}
	const nobody = 65534
	base, err := os.MkdirTemp("", "cachestore-user-") // t.TempDir's parent is root's only
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(base) })
	must(t, os.Chmod(base, 0o755))
	pfs := filepath.Join(base, "pfs")
	must(t, os.Mkdir(pfs, 0o755))
	must(t, os.Chown(pfs, nobody, nobody))
	old := randomBytes(90, 150_000)
	ref := writePFS(t, pfs, "f", old)
	path := filepath.Join(pfs, "f")
	must(t, os.Chown(path, nobody, nobody))
	door, err := pfsio.Start(workerExe, pfs, &privdrop.Identity{UID: nobody, GID: nobody, Groups: []uint32{nobody}}, pfsio.Options{})
	must(t, err)
	t.Cleanup(func() { door.Close() })

	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, Config: testConfig()})
	must(t, err)
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	if got := readAll(t, f, len(old), 40_000); !bytes.Equal(got, old) {
		t.Fatal("read through the user's door: wrong data")
	}
	update := randomBytes(91, 70_000)
	writeAll(t, f, update, 50_000, 70_000)
	want := append([]byte(nil), old...)
	copy(want[50_000:], update)
	must(t, f.Close())
	must(t, s.Close())

	must(t, os.Chmod(path, 0o444))
	if _, err := door.OpenFile("f", syscall.O_WRONLY, 0); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("the user opens a read-only file for writing: %v, want EACCES", err)
	}
	s2 := openStore(t, dir, testConfig())
	s2.SetDoor(func(string) (*pfsio.Door, error) { return door, nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var fe *FileError
	if err := s2.Drain(ctx); !errors.Is(err, syscall.EACCES) || !errors.As(err, &fe) || fe.Path != "f" {
		t.Fatalf("Drain of a file the user may not write: %v, want EACCES naming f", err)
	}
	if st := s2.Stats(); st.Dirty == 0 {
		t.Fatal("the dirty data was not kept")
	}
	must(t, os.Chmod(path, 0o644))
	drain(t, s2)
	if !bytes.Equal(readPFS(t, pfs, "f"), want) {
		t.Fatal("after the user may write again, Drain did not put the data on the PFS")
	}
	var st syscall.Stat_t
	must(t, syscall.Stat(path, &st))
	if st.Uid != nobody {
		t.Errorf("the PFS file's owner is %d, want the user's %d", st.Uid, nobody)
	}
}

// The store's own flushes do not look like someone else's change at the next open: what it
// wrote and flushed is read back from the cache, not fetched again.
func TestOwnFlushesKeepTheCacheValid(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "f", nil)
	s := newStore(t, testConfig())
	data := randomBytes(100, 700_000) // past the dirty watermark: flushes while writing
	for round := 0; round < 3; round++ {
		f, err := s.OpenFile(door, ref, true)
		must(t, err)
		writeAll(t, f, data, 0, 20_000)
		must(t, f.Close())
		drain(t, s)
		fetched := s.Stats().FetchedBytes
		f, err = s.OpenFile(door, ref, false)
		must(t, err)
		if got := readAll(t, f, len(data), 64<<10); !bytes.Equal(got, data) {
			t.Fatal("wrong data read back")
		}
		must(t, f.Close())
		if st := s.Stats(); st.FetchedBytes != fetched || st.ConflictBytes != 0 {
			t.Fatalf("round %d: reading back its own flushed data fetched %d bytes (conflicts %d): the open took the file for changed", round, st.FetchedBytes-fetched, st.ConflictBytes)
		}
	}
}

// A per-file override (libdatawarp's sync_to_pfs) makes that file's Fsync reach the PFS.
func TestSetOverride(t *testing.T) {
	pfs, door := newPFS(t)
	ref := writePFS(t, pfs, "f", nil)
	s := newStore(t, testConfig())
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	data := randomBytes(110, 100_000)
	writeAll(t, f, data, 0, 50_000)
	must(t, f.Fsync())
	if len(readPFS(t, pfs, "f")) != 0 {
		t.Fatal("Fsync without sync_to_pfs reached the PFS")
	}
	yes := true
	f.SetOverride(cache.Override{SyncToPFS: &yes})
	must(t, f.Fsync())
	if !bytes.Equal(readPFS(t, pfs, "f"), data) {
		t.Fatal("Fsync with sync_to_pfs set for the file did not reach the PFS")
	}
	must(t, f.Close())
}
