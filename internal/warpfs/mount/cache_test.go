package mount

import (
	"bytes"
	"errors"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// writeThrough is a real data engine for cache instances without the cache: every object
// read and write goes to the PFS file at once, through the file the user's door opened.
// server is this node's index among the instance's servers (object offsets to the file's).
type writeThrough struct {
	server int

	mu        sync.Mutex
	opens     int
	truncates int
	unlinked  []server.CacheFileKey
}

func (w *writeThrough) OpenFile(door *pfsio.Door, ref server.CacheFileRef, write bool) (server.CacheFile, error) {
	flags := unix.O_RDONLY
	if write {
		flags = unix.O_RDWR
	}
	f, err := door.OpenFile(ref.Path, flags, 0)
	if err != nil {
		return nil, err
	}
	if (server.CacheFileKey{Dev: f.Stat.Dev, Ino: f.Stat.Ino}) != ref.Key {
		f.Close()
		return nil, syscall.ESTALE
	}
	w.mu.Lock()
	w.opens++
	w.mu.Unlock()
	return &wtFile{f: f, l: ref.Layout, server: w.server}, nil
}

func (w *writeThrough) Truncate(door *pfsio.Door, ref server.CacheFileRef, size uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.truncates++
	return nil // the namespace server truncated the PFS file; nothing is cached here
}

func (w *writeThrough) Unlink(key server.CacheFileKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unlinked = append(w.unlinked, key)
}

type wtFile struct {
	f      *pfsio.File
	l      stripe.Layout
	server int
}

// chunks cuts the object range [objOff, objOff+n) at stripe boundaries, each with its offset
// in the file (stripe i of the file is at (i / Width) × Size in its server's object).
func (f *wtFile) chunks(objOff uint64, n int, fn func(bufOff int, fileOff uint64, length int) (int, error)) (int, error) {
	slot := uint64(f.l.Slot(f.server))
	done := 0
	for done < n {
		o := objOff + uint64(done)
		within := o % f.l.Size
		length := min(n-done, int(f.l.Size-within))
		fileOff := ((o/f.l.Size)*uint64(f.l.Width)+slot)*f.l.Size + within
		got, err := fn(done, fileOff, length)
		done += got
		if err != nil {
			return done, err
		}
		if got < length {
			return done, io.EOF
		}
	}
	return done, nil
}

func (f *wtFile) ReadAt(p []byte, objOff uint64) (int, error) {
	return f.chunks(objOff, len(p), func(b int, off uint64, n int) (int, error) {
		return f.f.ReadAt(p[b:b+n], int64(off))
	})
}

func (f *wtFile) WriteAt(p []byte, objOff uint64) (int, error) {
	return f.chunks(objOff, len(p), func(b int, off uint64, n int) (int, error) {
		return f.f.WriteAt(p[b:b+n], int64(off))
	})
}

func (f *wtFile) Fsync() error     { return f.f.Sync(false) }
func (f *wtFile) SyncToPFS() error { return f.f.Sync(false) }
func (f *wtFile) Closing() error   { return nil }
func (f *wtFile) Close() error     { return f.f.Close() }

// pfsDoors opens one in-process door per (uid, gid) to a PFS directory and records who
// asked (the tests run as root: the door's process is this one).
type pfsDoors struct {
	root string

	mu    sync.Mutex
	open  map[[2]uint32]*pfsio.Door
	asked map[[2]uint32]int
}

func newPFSDoors(t testing.TB, root string) *pfsDoors {
	d := &pfsDoors{root: root, open: map[[2]uint32]*pfsio.Door{}, asked: map[[2]uint32]int{}}
	t.Cleanup(func() {
		for _, door := range d.open {
			door.Close()
		}
	})
	return d
}

func (d *pfsDoors) For(uid, gid uint32) (*pfsio.Door, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := [2]uint32{uid, gid}
	d.asked[k]++
	if door := d.open[k]; door != nil {
		return door, nil
	}
	door, err := pfsio.Open(d.root, pfsio.Options{RequestTimeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	d.open[k] = door
	return door, nil
}

func (d *pfsDoors) askedBy(uid, gid uint32) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.asked[[2]uint32{uid, gid}]
}

// A cache instance mounted as a job sees it: a namespace server over the PFS directory and
// two stripe servers whose data engines write through to the PFS. What is written through
// the mount is in the PFS files, what is on the PFS reads through the mount, and names,
// truncations and removals act on the PFS directory.
func TestCacheInstanceWritesThroughToThePFS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a FUSE mount")
	}
	pfs, mountPath := dirs(t)
	if err := os.Chmod(pfs, 0o1777); err != nil {
		t.Fatal(err)
	}
	layout := stripe.Layout{Size: testStripeSize, Width: 2, Servers: 2}
	nsDoors := newPFSDoors(t, pfs)
	ns := startServerFor(t, "", server.Target{Dir: t.TempDir(), Tracker: usage.New("cache ns", 1<<30), Cache: &server.CacheTarget{
		PFSRoot: pfs, Door: nsDoors.For, Data: &writeThrough{}, Layout: layout}}, quietSlog(t), nil)
	var engines []*writeThrough
	var stripeDoors []*pfsDoors
	spec := Spec{MountPath: mountPath, AllowOther: true,
		Remote: &Remote{Address: ns.addr, Token: testToken, Client: "cn1", FragmentID: 1, NamespaceID: 2, InstanceID: 3}}
	for i := range 2 {
		e := &writeThrough{server: i}
		d := newPFSDoors(t, pfs)
		engines, stripeDoors = append(engines, e), append(stripeDoors, d)
		s := startServerFor(t, "", server.Target{Dir: t.TempDir(), Tracker: usage.New("cache stripes", 1<<30), Cache: &server.CacheTarget{
			PFSRoot: pfs, Door: d.For, Data: e, Layout: layout}}, quietSlog(t), nil)
		spec.Stripes = append(spec.Stripes, Server{Remote: &Remote{Address: s.addr, Token: testToken, Client: "cn1", FragmentID: int64(10 + i), InstanceID: 3}})
	}
	m := mount(t, spec)
	root := m.Path()

	rng := rand.New(rand.NewSource(11))
	sizes := []int{0, 100, testStripeSize - 1, testStripeSize, 5*testStripeSize + 123, 3 << 20}
	want := map[string][]byte{}
	for i, size := range sizes {
		data := make([]byte, size)
		rng.Read(data)
		name := filepath.Join("sub", string(rune('a'+i)))
		if i == 0 {
			if err := os.Mkdir(filepath.Join(root, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(root, name), data, 0o644); err != nil {
			t.Fatalf("writing %d bytes: %v", size, err)
		}
		want[name] = data
	}
	for name, data := range want {
		if got, err := os.ReadFile(filepath.Join(pfs, name)); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: the PFS file holds %d bytes (%v), not the %d written", name, len(got), err, len(data))
		}
		if got, err := os.ReadFile(filepath.Join(root, name)); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: read back %d bytes (%v), want the %d written", name, len(got), err, len(data))
		}
		if st, err := os.Stat(filepath.Join(root, name)); err != nil || st.Size() != int64(len(data)) {
			t.Errorf("%s: stat %v %v, want %d bytes", name, st, err, len(data))
		}
	}
	for i, e := range engines {
		if e.opens == 0 {
			t.Errorf("stripe server %d opened nothing in its engine", i)
		}
	}

	// Inode numbers are the PFS's.
	var inMount, inPFS unix.Stat_t
	unix.Stat(filepath.Join(root, "sub", "e"), &inMount)
	unix.Stat(filepath.Join(pfs, "sub", "e"), &inPFS)
	if inMount.Ino != inPFS.Ino {
		t.Errorf("inode %d through the mount, %d on the PFS", inMount.Ino, inPFS.Ino)
	}

	// A file made on the PFS directly reads through the mount.
	direct := make([]byte, 3*testStripeSize+17)
	rng.Read(direct)
	if err := os.WriteFile(filepath.Join(pfs, "direct"), direct, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "direct")); err != nil || !bytes.Equal(got, direct) {
		t.Errorf("a PFS file read through the mount: %d bytes, %v", len(got), err)
	}

	// A user's file: its objects are opened with that user's door.
	if out, err := asNobody(t, "echo hello from nobody > "+filepath.Join(root, "nobody.txt")); err != nil {
		t.Fatalf("writing as nobody: %v: %s", err, out)
	}
	if got, _ := os.ReadFile(filepath.Join(pfs, "nobody.txt")); string(got) != "hello from nobody\n" {
		t.Errorf("nobody's file on the PFS: %q", got)
	}
	asked := 0
	for _, d := range stripeDoors {
		asked += d.askedBy(65534, 65534)
	}
	if asked == 0 || nsDoors.askedBy(65534, 65534) == 0 {
		t.Errorf("nobody's requests asked for nobody's doors %d times on the stripe servers, %d on the namespace server", asked, nsDoors.askedBy(65534, 65534))
	}

	// Rewriting a file (O_TRUNC) leaves only the new data.
	rewritten := filepath.Join("sub", "f")
	if err := os.WriteFile(filepath.Join(root, rewritten), []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(pfs, rewritten)); err != nil || string(got) != "short" {
		t.Errorf("rewritten: the PFS file holds %d bytes (%v)", len(got), err)
	}
	if got, err := os.ReadFile(filepath.Join(root, rewritten)); err != nil || string(got) != "short" {
		t.Errorf("rewritten, read through the mount: %d bytes (%v)", len(got), err)
	}

	// Rename, truncate, unlink act on the PFS; the engines are told.
	if err := os.Rename(filepath.Join(root, "sub", "e"), filepath.Join(root, "moved")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(pfs, "moved")); err != nil || !bytes.Equal(got, want[filepath.Join("sub", "e")]) {
		t.Errorf("renamed: %d bytes on the PFS, %v", len(got), err)
	}
	if err := os.Truncate(filepath.Join(root, "moved"), testStripeSize+5); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(pfs, "moved")); err != nil || st.Size() != testStripeSize+5 {
		t.Errorf("truncated: %v %v on the PFS", st, err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "moved")); err != nil || !bytes.Equal(got, want[filepath.Join("sub", "e")][:testStripeSize+5]) {
		t.Errorf("truncated, read through the mount: %d bytes, %v", len(got), err)
	}
	truncates := 0
	for _, e := range engines {
		truncates += e.truncates
	}
	if truncates == 0 {
		t.Errorf("no engine was told of the truncation")
	}
	movedKey := server.CacheFileKey{Dev: inPFS.Dev, Ino: inPFS.Ino}
	if err := os.Remove(filepath.Join(root, "moved")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(pfs, "moved")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed through the mount, still on the PFS: %v", err)
	}
	for i, e := range engines {
		e.mu.Lock()
		if len(e.unlinked) != 1 || e.unlinked[0] != movedKey {
			t.Errorf("stripe server %d's engine was told of unlinks %v, want %v", i, e.unlinked, movedKey)
		}
		e.mu.Unlock()
	}

	// A symbolic link and a directory listing are the PFS's.
	if err := os.Symlink("sub/a", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(pfs, "link")); err != nil || target != "sub/a" {
		t.Errorf("the link on the PFS: %q %v", target, err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 4 || names[0] != "direct" || names[1] != "link" || names[2] != "nobody.txt" || names[3] != "sub" {
		t.Errorf("the mount lists %v", names)
	}

	// df is the PFS's.
	var got, pfsFS unix.Statfs_t
	if err := unix.Statfs(root, &got); err != nil {
		t.Fatal(err)
	}
	unix.Statfs(pfs, &pfsFS)
	if got.Blocks+2 < pfsFS.Blocks || got.Blocks > pfsFS.Blocks {
		t.Errorf("statfs of the mount: %d blocks, the PFS has %d", got.Blocks, pfsFS.Blocks)
	}
}
