package mount

import (
	"bytes"
	"errors"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/mounttable"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage/xfstest"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

// checkAccounting asserts the invariant of the whole package: what the tracker counts is the
// footprint of what is in the namespace (usage.Charged: files, directories, links) — less
// what its root directories took when they were made (an empty directory's footprint) for a
// tracker that started at 0 rather than from a Scan, as the agent's do.
func checkAccounting(t *testing.T, tr *usage.Tracker, src string) {
	t.Helper()
	dirs := []string{src}
	for _, dir := range append(stripeDirs(src), shardDirs(src, testShards)[1:]...) { // a striped backend's data, a max_mds one's shards
		if _, err := os.Stat(dir); err == nil {
			dirs = append(dirs, dir)
		}
	}
	roots := uint64(len(dirs)) * emptyDirFootprint(t, filepath.Dir(src))
	// The kernel releases a closed file after close() returns, and a striped file's objects
	// go at its release: the two agree once the releases are done (a few milliseconds; a
	// leak never does).
	deadline := time.Now().Add(10 * time.Second)
	for {
		want, err := usage.Charged(dirs...)
		if err != nil {
			t.Fatal(err)
		}
		got := tr.Used()
		if got == want || got == want-min(want, roots) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("tracker counts %d bytes used, the namespace holds %d (%d without what its roots took when made)", got, want, want-min(want, roots))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// onDisk is what n bytes of data written into a file of the namespace src take on its file
// system: whole blocks.
func onDisk(t *testing.T, src string, n uint64) uint64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(src, &st); err != nil {
		t.Fatal(err)
	}
	bs := uint64(st.Bsize)
	return (n + bs - 1) / bs * bs
}

// backingPath is where the namespace src holds rel on disk: in src, or for a max_mds backend
// in the shard holding it.
func backingPath(src, rel string) string {
	for _, dir := range shardDirs(src, testShards) {
		if _, err := os.Lstat(filepath.Join(dir, rel)); err == nil {
			return filepath.Join(dir, rel)
		}
	}
	return filepath.Join(src, rel)
}

// readBacking is what the storage side holds for the file rel of namespace src: the file itself,
// or for a striped file, its stripes gathered from the objects of the stripe directories as its
// layout says.
func readBacking(t *testing.T, src, rel string) []byte {
	t.Helper()
	l, striped := backingLayout(t, src, rel)
	if !striped {
		got, _ := os.ReadFile(backingPath(src, rel))
		return got
	}
	out := make([]byte, l.Length)
	dirs := stripeDirs(src)
	for _, p := range l.Pieces(0, l.Length) {
		obj, err := os.ReadFile(filepath.Join(dirs[p.Server], stripe.ObjectName(l.ID)))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		if p.ObjOffset < uint64(len(obj)) {
			copy(out[p.BufOffset:p.BufOffset+p.Length], obj[p.ObjOffset:])
		}
	}
	return out
}

// settled waits, on a backend that writes behind, until f's writes reached the servers: they
// go on behind the writer (Limits.WriteBehind) until an fsync or close.
func settled(t *testing.T, b testBackend, f *os.File) {
	t.Helper()
	if b.writesBehind() {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

// backingLayout is the stripe layout of the file rel of namespace src, if it is striped.
func backingLayout(t *testing.T, src, rel string) (stripe.Layout, bool) {
	t.Helper()
	buf := make([]byte, 128)
	n, err := unix.Getxattr(backingPath(src, rel), server.LayoutXattr, buf)
	if err != nil {
		return stripe.Layout{}, false
	}
	l, err := stripe.Decode(buf[:min(n, stripe.EncodedSize)]) // then the record of its objects
	if err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return l, true
}

// backingSize is the size the storage side records for the file rel of namespace src.
func backingSize(t *testing.T, src, rel string) int64 {
	t.Helper()
	if l, striped := backingLayout(t, src, rel); striped {
		return int64(l.Length)
	}
	return statOf(t, backingPath(src, rel)).Size
}

func statOf(t *testing.T, path string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func TestRoundTrips(t *testing.T) { eachBackend(t, testRoundTrips) }

func testRoundTrips(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 1", 64*mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, FsName: "I1-0"})
	root := m.Path()

	if err := os.MkdirAll(filepath.Join(root, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "a", "b", "file")
	if err := os.WriteFile(file, []byte("hello, burst buffer"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(file); err != nil || string(got) != "hello, burst buffer" {
		t.Fatalf("read back %q, %v", got, err)
	}
	if got := readBacking(t, src, "a/b/file"); string(got) != "hello, burst buffer" {
		t.Errorf("backend holds %q", got)
	}

	renamed := filepath.Join(root, "a", "renamed")
	if err := os.Rename(file, renamed); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(src, "a", "b", "file")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old name still on the backend: %v", err)
	}
	if err := os.Symlink("a/renamed", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(root, "link")); err != nil || target != "a/renamed" {
		t.Errorf("readlink = %q, %v", target, err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "link")); err != nil || string(got) != "hello, burst buffer" {
		t.Errorf("read through the symlink: %q, %v", got, err)
	}
	if err := os.Chmod(renamed, 0o600); err != nil {
		t.Fatal(err)
	}
	if mode := statOf(t, backingPath(src, "a/renamed")).Mode & 0o7777; mode != 0o600 {
		t.Errorf("backend mode after chmod 0600 = %o", mode)
	}
	if err := os.Link(renamed, filepath.Join(root, "hard")); b.striped {
		// A striped file has one name (docs/mounts.md): a second one is refused.
		if !errors.Is(err, syscall.EPERM) {
			t.Fatalf("hard link of a striped file: %v, want EPERM", err)
		}
		if err := os.WriteFile(filepath.Join(root, "hard"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"a", "hard", "link"}; !slices.Equal(names, want) {
		t.Errorf("readdir = %v, want %v", names, want)
	}
	if st := statOf(t, renamed); st.Blksize != mib || st.Nlink != 2 && !b.striped {
		t.Errorf("stat: blksize %d (want the preferred I/O size 1 MiB), nlink %d (want 2)", st.Blksize, st.Nlink)
	}
	checkAccounting(t, tr, src)

	for _, p := range []string{renamed, filepath.Join(root, "hard"), filepath.Join(root, "link")} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(root, "a", "b")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(src, "a", "b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("rmdir did not reach the backend: %v", err)
	}
	checkAccounting(t, tr, src) // directory a is left

	mounts, err := mounttable.At(root)
	if err != nil || len(mounts) != 1 {
		t.Fatalf("mount table entries at %s: %v, %v", root, mounts, err)
	}
	if mounts[0].FSType != "fuse.spillway" || mounts[0].Source != "I1-0" {
		t.Errorf("mount table shows type %q source %q, want fuse.spillway and I1-0", mounts[0].FSType, mounts[0].Source)
	}
	opts := mountOptionsOf(t, root)
	for _, want := range []string{"nosuid", "nodev", "default_permissions", "max_read=1048576"} {
		if !slices.Contains(opts, want) {
			t.Errorf("mount options %v lack %s", opts, want)
		}
	}
}

// mountOptionsOf returns the options /proc/mounts shows for the mount at path.
func mountOptionsOf(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && mounttable.Unescape(f[1]) == path {
			return strings.Split(f[3], ",")
		}
	}
	t.Fatalf("%s not in /proc/mounts", path)
	return nil
}

func TestWriteBeyondCapacityFailsWithENOSPC(t *testing.T) {
	eachBackend(t, testWriteBeyondCapacityFailsWithENOSPC)
}

func testWriteBeyondCapacityFailsWithENOSPC(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 2", 1*mib)
	var logged bytes.Buffer
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, Logger: log.New(&logged, "", 0)})
	first := filepath.Join(m.Path(), "first")
	if err := os.WriteFile(first, make([]byte, 768*kib), 0o644); err != nil {
		t.Fatalf("writing 768 KiB of 1 MiB: %v", err)
	}

	f, err := os.Create(filepath.Join(m.Path(), "second"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := f.Write(make([]byte, 512*kib))
	if err == nil && b.writesBehind() {
		// A striped file's writes, and a remote one-server instance's, go on behind the
		// writer (mount.write_behind): their error comes with the next write, fsync or close.
		err = f.Sync()
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing 512 KiB with 256 KiB free: %v, want ENOSPC", err)
	}
	// The write fills the instance to the brim, as a full disk does, then fails. A striped
	// write's stripes go to their servers at once: it may stop at the first stripe that did
	// not fit, with later ones written (docs/mounts.md).
	if n != 256*kib && !(b.writesBehind() && n <= 512*kib) {
		t.Errorf("wrote %d bytes before ENOSPC, want the 256 KiB that fit", n)
	}
	if tr.Used() != 1*mib && !b.striped {
		t.Errorf("Used = %d, want exactly the capacity", tr.Used())
	}
	_, err = f.Write([]byte{1})
	if err == nil && b.writesBehind() {
		err = f.Sync()
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("one more byte at capacity: %v, want ENOSPC", err)
	}
	// The administrator learns why, once: users only see "No space left on device".
	// (Once per server session: a striped mount has one per server.)
	if got := logged.String(); strings.Count(got, "instance 2 is full") != 1 && !b.striped || !strings.Contains(got, "of 1MiB") {
		t.Errorf("agent log after ENOSPC: %q", got)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(m.Path(), &sfs); err != nil || sfs.Bavail != 0 {
		t.Errorf("statfs of a full instance: %d blocks available, %v", sfs.Bavail, err)
	}
	checkAccounting(t, tr, src)

	// Deleting a file gives its space back; writing works again.
	if err := os.Remove(first); err != nil {
		t.Fatal(err)
	}
	if tr.Used() != 256*kib {
		t.Errorf("Used after deleting 768 KiB = %d, want 256 KiB", tr.Used())
	}
	// (At the start: a striped file's offset went past the writes that met ENOSPC behind it.)
	if n, err := f.WriteAt(make([]byte, 512*kib), 0); err != nil || n != 512*kib {
		t.Errorf("writing 512 KiB after freeing space: %d, %v", n, err)
	}
	settled(t, b, f)
	checkAccounting(t, tr, src)
}

func TestTruncateAccounting(t *testing.T) { eachBackend(t, testTruncateAccounting) }

func testTruncateAccounting(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 3", 1*mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr})
	p := filepath.Join(m.Path(), "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, 600*kib); err != nil {
		t.Fatal(err)
	}
	if tr.Used() != 600*kib {
		t.Errorf("Used after truncate up to 600 KiB = %d", tr.Used())
	}
	if err := os.Truncate(p, 2*mib); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("truncate to 2 MiB in a 1 MiB instance: %v, want ENOSPC", err)
	}
	if size := backingSize(t, src, "f"); size != 600*kib {
		t.Errorf("a refused truncate changed the size to %d", size)
	}
	// Overwriting inside the file changes nothing.
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{7}, 100*kib), 50*kib); err != nil {
		t.Fatal(err)
	}
	if tr.Used() != 600*kib {
		t.Errorf("Used after an overwrite inside the file = %d", tr.Used())
	}
	if err := f.Truncate(100 * kib); err != nil { // ftruncate through the open handle
		t.Fatal(err)
	}
	if tr.Used() != 100*kib {
		t.Errorf("Used after ftruncate down to 100 KiB = %d", tr.Used())
	}
	f.Close()
	checkAccounting(t, tr, src)

	// O_TRUNC on open releases everything.
	f, err = os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if tr.Used() != 0 {
		t.Errorf("Used after open(O_TRUNC) = %d", tr.Used())
	}
	checkAccounting(t, tr, src)
}

func TestSparseWritesCountApparentSize(t *testing.T) {
	eachBackend(t, testSparseWritesCountApparentSize)
}

func testSparseWritesCountApparentSize(t *testing.T, b testBackend) {
	if b.striped {
		// Each server charges the apparent size of its own objects: a byte far into a striped
		// file costs up to a stripe on one server (docs/mounts.md), see TestStripedSparseFile.
		t.Skip("striped files are charged per server object")
	}
	src, mp := dirs(t)
	tr := usage.New("instance 4", 4*mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr})
	f, err := os.Create(filepath.Join(m.Path(), "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{1}, 3*mib); err != nil {
		t.Fatal(err)
	}
	settled(t, b, f)
	if tr.Used() != 3*mib+1 {
		t.Errorf("Used after one byte at 3 MiB = %d, want %d", tr.Used(), 3*mib+1)
	}
	// Filling the hole does not grow the file.
	if _, err := f.WriteAt(make([]byte, 64*kib), 0); err != nil {
		t.Fatal(err)
	}
	settled(t, b, f)
	if tr.Used() != 3*mib+1 {
		t.Errorf("Used after writing into the hole = %d", tr.Used())
	}
	// A byte at 5 MiB would make the file 5 MiB long: more than the instance.
	_, err = f.WriteAt([]byte{1}, 5*mib)
	if err == nil && b.writesBehind() {
		err = f.Sync()
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("one byte at 5 MiB in a 4 MiB instance: %v, want ENOSPC", err)
	}
	if st := statOf(t, filepath.Join(src, "sparse")); st.Size != 3*mib+1 {
		t.Errorf("backend size = %d after a refused sparse write", st.Size)
	}
	checkAccounting(t, tr, src)
}

func TestStatfsShowsTheInstance(t *testing.T) { eachBackend(t, testStatfsShowsTheInstance) }

func testStatfsShowsTheInstance(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 5", 100*mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, FsName: "I5-0"})
	if err := os.WriteFile(filepath.Join(m.Path(), "data"), make([]byte, 10*mib), 0o644); err != nil {
		t.Fatal(err)
	}
	// The stage engine shares the tracker: what it reserves is gone for the mount too.
	if err := tr.Reserve(5 * mib); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(m.Path(), &st); err != nil {
		t.Fatal(err)
	}
	// A striped instance is the sum of its servers, and as free what striping can still use:
	// the servers times the least free. (Here every server reports the same tracker.)
	servers := uint64(1)
	if b.striped {
		servers = testStripeServers
	}
	if size := st.Blocks * uint64(st.Frsize); size != servers*100*mib {
		t.Errorf("statfs size = %d, want the capacity %d", size, servers*100*mib)
	}
	if avail := st.Bavail * uint64(st.Frsize); avail != servers*85*mib {
		t.Errorf("statfs available = %d, want %d", avail, servers*85*mib)
	}
	if st.Bfree != st.Bavail {
		t.Errorf("free %d and available %d differ; no blocks are reserved for root", st.Bfree, st.Bavail)
	}

	// What users run: df.
	out, err := exec.Command("df", "-B1", "--output=source,size,avail,target", m.Path()).Output()
	if err != nil {
		t.Fatalf("df: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	fields := strings.Fields(lines[len(lines)-1])
	if len(fields) != 4 || fields[0] != "I5-0" || fields[1] != strconv.Itoa(int(servers)*100*mib) ||
		fields[2] != strconv.Itoa(int(servers)*85*mib) || fields[3] != m.Path() {
		t.Errorf("df shows %q; want I5-0 %d %d %s", lines[len(lines)-1], int(servers)*100*mib, int(servers)*85*mib, m.Path())
	}
	tr.Release(5 * mib)
}

func TestReadOnlyMountRefusesEveryChange(t *testing.T) {
	eachBackend(t, testReadOnlyMountRefusesEveryChange)
}

func testReadOnlyMountRefusesEveryChange(t *testing.T, b testBackend) {
	if b.shards > 1 {
		t.Skip("the test prepares the namespace on disk as one directory; max_mds is for striped (writable) configurations")
	}
	src, mp := dirs(t)
	if err := os.WriteFile(filepath.Join(src, "input"), []byte("staged in"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	tr := usage.New("instance 6", 1*mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, ReadOnly: true})
	if err := tr.Scan(namespaceDirs(src)...); err != nil { // a striped backend's too, made by mount
		t.Fatal(err)
	}
	root := m.Path()
	if got, err := os.ReadFile(filepath.Join(root, "input")); err != nil || string(got) != "staged in" {
		t.Fatalf("reading a read-only mount: %q, %v", got, err)
	}
	in, dir := filepath.Join(root, "input"), filepath.Join(root, "dir")
	changes := map[string]func() error{
		"create":   func() error { return os.WriteFile(filepath.Join(root, "new"), nil, 0o644) },
		"open rw":  func() error { f, err := os.OpenFile(in, os.O_RDWR, 0); f.Close(); return err },
		"append":   func() error { f, err := os.OpenFile(in, os.O_WRONLY|os.O_APPEND, 0); f.Close(); return err },
		"truncate": func() error { return os.Truncate(in, 0) },
		"mkdir":    func() error { return os.Mkdir(filepath.Join(root, "d2"), 0o755) },
		"rmdir":    func() error { return os.Remove(dir) },
		"unlink":   func() error { return os.Remove(in) },
		"rename":   func() error { return os.Rename(in, filepath.Join(root, "moved")) },
		"chmod":    func() error { return os.Chmod(in, 0o600) },
		"chown":    func() error { return os.Chown(in, 65534, 65534) },
		"symlink":  func() error { return os.Symlink("input", filepath.Join(root, "sl")) },
		"link":     func() error { return os.Link(in, filepath.Join(root, "hl")) },
		"utimes":   func() error { return unix.UtimesNano(in, []unix.Timespec{{Sec: 1}, {Sec: 1}}) },
		"setxattr": func() error { return unix.Setxattr(in, "user.k", []byte("v"), 0) },
	}
	for name, change := range changes {
		if err := change(); !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s on a read-only mount: %v, want EROFS", name, err)
		}
	}
	if !slices.Contains(mountOptionsOf(t, root), "ro") {
		t.Errorf("/proc/mounts does not show the mount read-only: %v", mountOptionsOf(t, root))
	}
	if got, _ := os.ReadFile(filepath.Join(src, "input")); string(got) != "staged in" {
		t.Errorf("backend changed: %q", got)
	}
	checkAccounting(t, tr, src)
}

// As root with allow_other, files a user creates through the mount are the user's, and the
// kernel checks modes on the server's behalf.
func TestRootMountCreatesFilesAsTheCaller(t *testing.T) {
	eachBackend(t, testRootMountCreatesFilesAsTheCaller)
}

func testRootMountCreatesFilesAsTheCaller(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	if err := os.Chown(src, 65534, 65534); err != nil { // the namespace root belongs to the job's user
		t.Fatal(err)
	}
	// Directories are on every shard of a max_mds backend; a file on the one its name picks.
	for _, dir := range b.backingDirs(t, src) {
		if err := os.Mkdir(filepath.Join(dir, "root-only"), 0o755); err != nil {
			t.Fatal(err)
		}
		shared := filepath.Join(dir, "shared")
		if err := os.Mkdir(shared, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(shared, 0, 100); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Chmod(shared, 0o2777); err != nil { // set-group-ID directory, group 100
			t.Fatal(err)
		}
	}
	setuid := filepath.Join(b.backingDirs(t, src)[stripe.Shard(stripe.RootDirID, "setuid-program", len(b.backingDirs(t, src)))], "setuid-program")
	if err := os.WriteFile(setuid, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(setuid, 0o4777); err != nil {
		t.Fatal(err)
	}
	if statOf(t, setuid).Mode&syscall.S_ISUID == 0 {
		t.Fatal("could not make the test program set-user-ID")
	}
	tr := usage.New("instance 7", 16*mib)
	b.backingDirs(t, src)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, AllowOther: true})
	if err := tr.Scan(namespaceDirs(src)...); err != nil { // a striped backend's too, made by mount
		t.Fatal(err)
	}
	root := m.Path()

	out, err := asNobody(t, "set -e; umask 002; cd "+root+"; echo data > mine; mkdir mydir; ln -s mine mylink; "+
		"echo x > shared/grouped; mkdir shared/sub; echo more >> setuid-program")
	if err != nil {
		t.Fatalf("nobody working in the mount: %v: %s", err, out)
	}
	for _, name := range []string{"mine", "mydir", "mylink"} {
		if st := statOf(t, backingPath(src, name)); st.Uid != 65534 || st.Gid != 65534 {
			t.Errorf("backend %s is owned by %d:%d, want nobody 65534:65534", name, st.Uid, st.Gid)
		}
	}
	// The caller's umask (002) decides the mode, not the agent's (022).
	if mode := statOf(t, backingPath(src, "mine")).Mode & 0o777; mode != 0o664 {
		t.Errorf("a file created with umask 002 has mode %o, want 664", mode)
	}
	if st := statOf(t, backingPath(src, "shared/grouped")); st.Gid != 100 {
		t.Errorf("file in a set-group-ID directory has group %d, want the directory's 100", st.Gid)
	}
	for _, dir := range b.backingDirs(t, src) {
		if st := statOf(t, filepath.Join(dir, "shared", "sub")); st.Gid != 100 || st.Mode&syscall.S_ISGID == 0 {
			t.Errorf("directory in a set-group-ID directory (%s): group %d mode %o, want group 100 and set-group-ID", dir, st.Gid, st.Mode)
		}
	}
	// Writing someone else's set-user-ID program takes its set-user-ID bit away.
	if mode := statOf(t, setuid).Mode & 0o7777; mode != 0o777 {
		t.Errorf("set-user-ID program written by nobody has mode %o, want 777", mode)
	}
	// The kernel enforces modes: nobody may not write in root's 0755 directory.
	if out, err := asNobody(t, "echo x > "+filepath.Join(root, "root-only", "f")); err == nil ||
		!strings.Contains(out, "Permission denied") {
		t.Errorf("nobody writing into a root-owned 0755 directory: %v: %s", err, out)
	}
	if _, err := os.Stat(backingPath(src, "root-only/f")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused file exists on the backend: %v", err)
	}
	checkAccounting(t, tr, src)
}

// A user can mount as well (spillway run without root): through fusermount3.
func TestNonRootMount(t *testing.T) {
	// As Debian's udev rule would; FUSE for non-root needs it.
	if err := os.Chmod("/dev/fuse", 0o666); err != nil {
		t.Fatal(err)
	}
	src, mp := dirs(t)
	parent := filepath.Dir(src)
	for _, p := range []string{parent, src} {
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	h := startHelper(t, helperSpec{MountPath: mp, SourceDir: src, Capacity: 1 * mib}, 65534)
	out, err := asNobody(t, "set -e; echo written-by-nobody > "+mp+"/f; cat "+mp+"/f; df -B1 --output=size "+mp)
	if err != nil {
		t.Fatalf("nobody using its own mount: %v: %s", err, out)
	}
	if !strings.Contains(out, "written-by-nobody") || !strings.Contains(out, strconv.Itoa(1*mib)) {
		t.Errorf("nobody's view of its mount: %q", out)
	}
	if st := statOf(t, filepath.Join(src, "f")); st.Uid != 65534 {
		t.Errorf("file created through nobody's mount is owned by %d", st.Uid)
	}
	// Without allow_other, even root is kept out of a user's FUSE mount.
	if _, err := os.ReadDir(mp); !errors.Is(err, syscall.EACCES) {
		t.Errorf("root listing nobody's mount: %v, want EACCES", err)
	}
	if got := h.stop(t); got != "unmounted" {
		t.Errorf("helper said %q", got)
	}
	if mounts, _ := mounttable.At(mp); len(mounts) != 0 {
		t.Errorf("nobody's unmount left %v", mounts)
	}

	// A root agent restarted without the handle removes a user's mount it cannot even stat.
	h = startHelper(t, helperSpec{MountPath: mp, SourceDir: src, Capacity: 1 * mib}, 65534)
	if err := UnmountPath(mp, Limits{}); err != nil {
		t.Errorf("root UnmountPath of nobody's mount: %v", err)
	}
	if mounts, _ := mounttable.At(mp); len(mounts) != 0 {
		t.Errorf("UnmountPath left %v", mounts)
	}
	h.stop(t)
}

// A non-root agent asking for allow_other without user_allow_other in /etc/fuse.conf gets a
// clear refusal, not fusermount3's bare exit code.
func TestNonRootAllowOtherIsExplained(t *testing.T) {
	if err := os.Chmod("/dev/fuse", 0o666); err != nil {
		t.Fatal(err)
	}
	if (fuseEnv{fuseConf: "/etc/fuse.conf"}).userAllowOther() {
		t.Skip("/etc/fuse.conf allows allow_other to users on this machine")
	}
	src, mp := dirs(t)
	if err := os.Chown(filepath.Dir(src), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(testBase, "mount-helper.test")
	if _, err := os.Stat(exe); err != nil {
		t.Skip("runs after TestNonRootMount, which installs the helper binary")
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{helperEnv + `={"MountPath":"` + mp + `","SourceDir":"` + src + `","Capacity":1,"AllowOther":true}`,
		"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "user_allow_other") || !strings.Contains(string(out), "/etc/fuse.conf") {
		t.Errorf("non-root allow_other: %s", out)
	}
}

// A crashed agent leaves a dead mount ("transport endpoint is not connected"); mounting there
// again cleans it up.
func TestMountCleansStaleMount(t *testing.T) {
	src, mp := dirs(t)
	h := startHelper(t, helperSpec{MountPath: mp, SourceDir: src, Capacity: 1 * mib}, 0)
	if err := os.WriteFile(filepath.Join(mp, "survivor"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.cmd.Process.Kill()
	h.cmd.Wait()
	if _, err := os.Stat(mp); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("stat of a killed server's mount: %v, want ENOTCONN", err)
	}

	tr := usage.New("instance 8", 1*mib)
	if err := tr.Scan(src); err != nil {
		t.Fatal(err)
	}
	m := mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, Logger: quietLogger(t)})
	if !m.CleanedStaleMount() {
		t.Error("Mount did not report the stale mount it replaced")
	}
	if got, err := os.ReadFile(filepath.Join(mp, "survivor")); err != nil || string(got) != "data" {
		t.Errorf("data through the new mount: %q, %v", got, err)
	}
	if mounts, _ := mounttable.At(m.Path()); len(mounts) != 1 {
		t.Errorf("%d mounts at the path, want 1 (the stale one removed)", len(mounts))
	}
}

func TestUnmountPathCleansStaleMount(t *testing.T) {
	src, mp := dirs(t)
	h := startHelper(t, helperSpec{MountPath: mp, SourceDir: src, Capacity: 1 * mib}, 0)
	h.cmd.Process.Kill()
	h.cmd.Wait()
	if err := UnmountPath(mp, Limits{}); err != nil {
		t.Fatalf("UnmountPath of a stale mount: %v", err)
	}
	if mounts, _ := mounttable.At(mp); len(mounts) != 0 {
		t.Errorf("stale mount still there: %v", mounts)
	}
	if err := UnmountPath(mp, Limits{}); err != nil {
		t.Errorf("UnmountPath of a path no longer mounted: %v", err)
	}
}

// A server that stops answering (hung, not dead) is aborted after ProbeTimeout.
func TestMountReplacesHungMount(t *testing.T) {
	src, mp := dirs(t)
	h := startHelper(t, helperSpec{MountPath: mp, SourceDir: src, Capacity: 1 * mib}, 0)
	if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// kill(2) returns before every thread has stopped; a running one could still answer.
	waitFor(t, func() bool { return allThreadsStopped(h.cmd.Process.Pid) }, "the helper to stop")
	tr := usage.New("instance 9", 1*mib)
	m := mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, Logger: quietLogger(t),
		Limits: Limits{ProbeTimeout: 300 * time.Millisecond}})
	if !m.CleanedStaleMount() {
		t.Error("Mount did not report the hung mount it replaced")
	}
	if err := os.WriteFile(filepath.Join(mp, "after"), []byte("ok"), 0o644); err != nil {
		t.Errorf("writing through the new mount: %v", err)
	}
}

func TestMountAndUnmountAreIdempotent(t *testing.T) {
	src, mp := dirs(t)
	tr := usage.New("instance 10", 1*mib)
	spec := Spec{MountPath: mp, SourceDir: src, Tracker: tr}
	// The controller may ask twice at once (a retry racing the first call): one mount results.
	got := make([]*Mounted, 4)
	var wg sync.WaitGroup
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if got[i], err = Mount(spec); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	m1 := got[0]
	if m1 == nil {
		t.FailNow()
	}
	for _, m := range got {
		if m != m1 {
			t.Fatal("concurrent Mounts of the same namespace returned different mounts")
		}
	}
	if mounts, _ := mounttable.At(m1.Path()); len(mounts) != 1 {
		t.Fatalf("%d mounts at the path after concurrent Mounts", len(mounts))
	}
	m2, err := Mount(spec)
	if err != nil || m2 != m1 {
		t.Fatalf("second Mount of the same namespace: %p %v, want the first mount %p", m2, err, m1)
	}
	other := filepath.Join(filepath.Dir(src), "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Mount(Spec{MountPath: mp, SourceDir: other, Tracker: tr}); !errors.Is(err, ErrAlreadyMounted) ||
		!strings.Contains(err.Error(), src) {
		t.Errorf("mounting another namespace on a used path: %v", err)
	}
	if err := m1.Unmount(); err != nil {
		t.Fatal(err)
	}
	if err := m1.Unmount(); err != nil {
		t.Errorf("second Unmount: %v", err)
	}
	select {
	case <-m1.Done():
	default:
		t.Error("Done not closed after Unmount")
	}
	if _, err := os.Stat(mp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the mount path Mount created is still there: %v", err)
	}
	if err := UnmountPath(mp, Limits{}); err != nil {
		t.Errorf("UnmountPath of an unmounted path: %v", err)
	}
	if err := UnmountPath(filepath.Join(mp, "no", "such", "dir"), Limits{}); err != nil {
		t.Errorf("UnmountPath of a path that does not exist: %v", err)
	}
	// Mounting again after an unmount works.
	m3 := mount(t, spec)
	if err := os.WriteFile(filepath.Join(m3.Path(), "again"), nil, 0o644); err != nil {
		t.Error(err)
	}
	// UnmountPath finds this process's own mount too.
	if err := UnmountPath(mp, Limits{}); err != nil {
		t.Errorf("UnmountPath of our live mount: %v", err)
	}
	if mounts, _ := mounttable.At(m3.Path()); len(mounts) != 0 {
		t.Errorf("UnmountPath left %v", mounts)
	}
}

func TestMountRefusesToCoverAnotherFileSystem(t *testing.T) {
	src, mp := dirs(t)
	if err := os.MkdirAll(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mp, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mp, unix.MNT_DETACH) })
	_, err := Mount(Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("i", 1)})
	if !errors.Is(err, ErrAlreadyMounted) || !strings.Contains(err.Error(), "tmpfs") {
		t.Errorf("Mount over a tmpfs: %v", err)
	}
	if err := UnmountPath(mp, Limits{}); err == nil || !strings.Contains(err.Error(), "not a Spillway mount") {
		t.Errorf("UnmountPath of a tmpfs: %v", err)
	}
	if mounts, _ := mounttable.At(mp); len(mounts) != 1 || mounts[0].FSType != "tmpfs" {
		t.Errorf("the tmpfs was touched: %v", mounts)
	}
}

func TestMountRejectsBadSpecs(t *testing.T) {
	src, mp := dirs(t)
	tr := usage.New("i", 1)
	file := filepath.Join(filepath.Dir(src), "a-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		spec Spec
		want string
	}{
		{"relative mount path", Spec{MountPath: "mnt", SourceDir: src, Tracker: tr}, "not an absolute path"},
		{"missing namespace", Spec{MountPath: mp, SourceDir: src + "-gone", Tracker: tr}, "does not exist"},
		{"namespace is a file", Spec{MountPath: mp, SourceDir: file, Tracker: tr}, "is not a directory"},
		{"no tracker", Spec{MountPath: mp, SourceDir: src}, "no usage tracker"},
		{"mount path is a file", Spec{MountPath: file, SourceDir: src, Tracker: tr}, "exists and is not a directory"},
		{"mount inside the namespace", Spec{MountPath: filepath.Join(src, "m"), SourceDir: src, Tracker: tr}, "contain one another"},
	}
	for _, c := range cases {
		_, err := Mount(c.spec)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	// The good spec creates the missing parents 0711: users reach their own mount by its
	// path, and cannot list the others' (TestMountParentsCannotBeListed).
	m := mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr})
	if st := statOf(t, filepath.Dir(m.Path())); st.Mode&0o777 != 0o711 {
		t.Errorf("created parent has mode %o, want 711", st.Mode&0o777)
	}
}

// Unmounting while a process still has a file open detaches lazily after the limit and says
// who was holding it; the open file keeps working until closed.
func TestUnmountBusyDetachesLazily(t *testing.T) { eachBackend(t, testUnmountBusyDetachesLazily) }

func testUnmountBusyDetachesLazily(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 11", 1*mib)
	m, err := Mount(b.prepare(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr,
		Limits: Limits{UnmountBusyTimeout: 300 * time.Millisecond, UnmountRetryInterval: 50 * time.Millisecond}}))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(m.Path(), "open"))
	if err != nil {
		t.Fatal(err)
	}
	err = m.Unmount()
	if !errors.Is(err, ErrDetached) {
		f.Close()
		m.Unmount()
		t.Fatalf("Unmount with a file open: %v, want ErrDetached", err)
	}
	var d *DetachedError
	if !errors.As(err, &d) || !strings.Contains(err.Error(), strconv.Itoa(os.Getpid())) ||
		!strings.Contains(err.Error(), filepath.Join(m.Path(), "open")) {
		t.Errorf("the error does not name this process and its open file: %v", err)
	}
	if mounts, _ := mounttable.At(m.Path()); len(mounts) != 0 {
		t.Errorf("mount still visible after the lazy detach: %v", mounts)
	}
	if _, err := f.Write([]byte("still served")); err != nil {
		t.Errorf("writing to the file kept open: %v", err)
	}
	f.Sync() // a striped file's size reaches the metadata server at close, sync or flush
	if got := readBacking(t, src, "open"); string(got) != "still served" {
		t.Errorf("backend holds %q", got)
	}
	f.Close()
	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Error("the server still runs 10s after the last file was closed")
	}
	if err := m.Unmount(); err != nil {
		t.Errorf("Unmount after the lazy detach: %v", err)
	}
}

func TestUnlinkedOpenFileReleasesAtLastClose(t *testing.T) {
	eachBackend(t, testUnlinkedOpenFileReleasesAtLastClose)
}

func testUnlinkedOpenFileReleasesAtLastClose(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 12", 1*mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, Debug: os.Getenv("XDEBUG") != ""})
	p := filepath.Join(m.Path(), "tmp")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 100*kib)); err != nil {
		t.Fatal(err)
	}
	settled(t, b, f)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if tr.Used() != 100*kib {
		t.Errorf("Used after unlinking an open file = %d; its space is held until close", tr.Used())
	}
	if _, err := f.Write(make([]byte, 50*kib)); err != nil {
		t.Fatal(err)
	}
	settled(t, b, f)
	if want := onDisk(t, src, 150*kib); tr.Used() != want { // its last block is allocated whole
		t.Errorf("Used after writing to the unlinked file = %d, want %d", tr.Used(), want)
	}
	f.Close()
	waitFor(t, func() bool { return tr.Used() == 0 }, "Used to drop to 0 after the last close")

	// A file born without a name (O_TMPFILE) counts while open, and not after.
	fd, err := unix.Open(m.Path(), unix.O_TMPFILE|unix.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(fd, make([]byte, 70*kib)); err != nil {
		t.Fatal(err)
	}
	if b.writesBehind() {
		unix.Fsync(fd)
	}
	if want := onDisk(t, src, 70*kib); tr.Used() != want {
		t.Errorf("Used with a 70 KiB O_TMPFILE file open = %d, want %d", tr.Used(), want)
	}
	unix.Close(fd)
	waitFor(t, func() bool { return tr.Used() == 0 }, "Used to drop to 0 after closing the O_TMPFILE file")
	checkAccounting(t, tr, src)
}

func TestHardLinksAndRenameOver(t *testing.T) { eachBackend(t, testHardLinksAndRenameOver) }

func testHardLinksAndRenameOver(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 13", 1*mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr})
	root := m.Path()
	if err := os.WriteFile(filepath.Join(root, "a"), make([]byte, 300*kib), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "a"), filepath.Join(root, "a2")); b.striped {
		// A striped file has one name (docs/mounts.md): renaming stands in for the link.
		if !errors.Is(err, syscall.EPERM) {
			t.Fatalf("hard link of a striped file: %v, want EPERM", err)
		}
		if err := os.Rename(filepath.Join(root, "a"), filepath.Join(root, "a2")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "a"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	} else if err != nil {
		t.Fatal(err)
	}
	if tr.Used() != 300*kib {
		t.Errorf("a hard link changed Used to %d", tr.Used())
	}
	if err := os.Remove(filepath.Join(root, "a")); err != nil {
		t.Fatal(err)
	}
	if tr.Used() != 300*kib {
		t.Errorf("removing one of two links changed Used to %d", tr.Used())
	}
	if err := os.WriteFile(filepath.Join(root, "b"), make([]byte, 200*kib), 0o644); err != nil {
		t.Fatal(err)
	}
	// Renaming b over a2 removes a2's last link.
	if err := os.Rename(filepath.Join(root, "b"), filepath.Join(root, "a2")); err != nil {
		t.Fatal(err)
	}
	// The replaced file's blocks come back when its last handle goes, and the kernel releases
	// a closed file's handle after close returns: wait for it (bounded).
	for deadline := time.Now().Add(10 * time.Second); tr.Used() != 200*kib && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if tr.Used() != 200*kib {
		t.Errorf("Used after renaming a 200 KiB file over a 300 KiB one = %d", tr.Used())
	}
	checkAccounting(t, tr, src)
}

func TestFallocateAndCopyFileRange(t *testing.T) { eachBackend(t, testFallocateAndCopyFileRange) }

func testFallocateAndCopyFileRange(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 14", 1*mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr})
	f, err := os.Create(filepath.Join(m.Path(), "prealloc"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := fallocate(int(f.Fd()), 0, 0, 256*kib); err != nil {
		t.Fatal(err)
	}
	if tr.Used() != 256*kib {
		t.Errorf("Used after fallocate 256 KiB = %d", tr.Used())
	}
	if err := fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, 512*kib); err != nil {
		t.Fatal(err)
	}
	// Blocks allocated past the end count as what they take, though the size stays.
	if tr.Used() != 512*kib {
		t.Errorf("Used after fallocate KEEP_SIZE of 512 KiB = %d, want 512 KiB", tr.Used())
	}
	if err := fallocate(int(f.Fd()), 0, 0, 2*mib); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("fallocate past the capacity: %v, want ENOSPC", err)
	}

	// copy_file_range: cp asks for far more than the source holds.
	dst, err := os.Create(filepath.Join(m.Path(), "copy"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	var offIn, offOut int64
	n, err := copyFileRange(int(f.Fd()), &offIn, int(dst.Fd()), &offOut, 1<<30, 0)
	if err != nil || n != 256*kib {
		t.Fatalf("copy_file_range of a 256 KiB file: %d, %v", n, err)
	}
	settled(t, b, dst)
	want := uint64(768 * kib) // 512 KiB allocated, 256 KiB copied
	if b.striped {
		// The refused fallocate's servers that did allocate were truncated back to the file's
		// size, which gave back what KEEP_SIZE had allocated past its end.
		want = 512 * kib
	}
	if tr.Used() != want {
		t.Errorf("Used after copying 256 KiB = %d, want %d", tr.Used(), want)
	}
	checkAccounting(t, tr, src)
}

// Writers racing on one shared file (N-to-1, as MPI-IO does) and on their own files keep the
// count exact.
func TestConcurrentWritersKeepCountExact(t *testing.T) {
	eachBackend(t, testConcurrentWritersKeepCountExact)
}

func testConcurrentWritersKeepCountExact(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 15", 64*mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr})
	shared, err := os.Create(filepath.Join(m.Path(), "shared"))
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	const writers, blocks, block = 4, 16, 64 * kib
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own, err := os.Create(filepath.Join(m.Path(), "own"+strconv.Itoa(w)))
			if err != nil {
				t.Error(err)
				return
			}
			defer own.Close()
			buf := bytes.Repeat([]byte{byte(w)}, block)
			for b := 0; b < blocks; b++ {
				// Interleaved blocks of the shared file: each write may extend it.
				if _, err := shared.WriteAt(buf, int64((b*writers+w)*block)); err != nil {
					t.Error(err)
				}
				if _, err := own.Write(buf); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	settled(t, b, shared)
	if want := uint64(2 * writers * blocks * block); tr.Used() != want {
		t.Errorf("Used = %d, want %d", tr.Used(), want)
	}
	checkAccounting(t, tr, src)
}

func TestClientCacheMount(t *testing.T) { eachBackend(t, testClientCacheMount) }

func testClientCacheMount(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 16", 1*mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, ClientCache: true})
	p := filepath.Join(m.Path(), "f")
	for _, content := range []string{"first", "second version"} {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		// Close-to-open: a reopen sees the last close's data.
		if got, err := os.ReadFile(p); err != nil || string(got) != content {
			t.Errorf("read %q, %v; want %q", got, err, content)
		}
	}
	checkAccounting(t, tr, src)
}

func TestFUSEEnvironmentChecks(t *testing.T) {
	dir := t.TempDir()
	device := filepath.Join(dir, "fuse")
	if err := unix.Mknod(device, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "fuse.conf")
	if err := os.WriteFile(conf, []byte("#user_allow_other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	helper := filepath.Join(dir, "fusermount3")
	if err := os.WriteFile(helper, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(helper, 0o4755); err != nil {
		t.Fatal(err)
	}
	found := func(string) (string, error) { return helper, nil }
	env := fuseEnv{device: device, uid: 1000, gids: []int{1000}, fuseConf: conf, lookPath: found}

	err := env.check(false)
	if err == nil || !strings.Contains(err.Error(), "FUSE is not available to uid 1000: "+device+" is mode 0600") ||
		!strings.Contains(err.Error(), "mode 0666") || !strings.Contains(err.Error(), "run the agent as root") {
		t.Errorf("device mode 0600 for uid 1000: %v", err)
	}
	if err := (fuseEnv{device: device, uid: 0}).check(true); err != nil {
		t.Errorf("root: %v", err)
	}
	if err := os.Chmod(device, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := env.check(false); err != nil {
		t.Errorf("device mode 0666 with fusermount3: %v", err)
	}
	err = env.check(true)
	if err == nil || !strings.Contains(err.Error(), "user_allow_other") {
		t.Errorf("allow_other without user_allow_other: %v", err)
	}
	if err := os.WriteFile(conf, []byte("user_allow_other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := env.check(true); err != nil {
		t.Errorf("allow_other with user_allow_other: %v", err)
	}
	noHelper := env
	noHelper.lookPath = func(string) (string, error) { return "", errors.New("not found") }
	if err := noHelper.check(false); err == nil || !strings.Contains(err.Error(), "no fusermount3") {
		t.Errorf("without fusermount3: %v", err)
	}
	if err := os.Chmod(helper, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := env.check(false); err == nil || !strings.Contains(err.Error(), "not setuid root") {
		t.Errorf("fusermount3 without its setuid bit: %v", err)
	}
	missing := env
	missing.device = filepath.Join(dir, "nodev")
	if err := missing.check(false); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("no device: %v", err)
	}
	notChar := env
	notChar.device = conf
	if err := notChar.check(false); err == nil || !strings.Contains(err.Error(), "not a character device") {
		t.Errorf("device is a regular file: %v", err)
	}
}

// allThreadsStopped reports whether every thread of pid is stopped (state T in /proc).
func allThreadsStopped(pid int) bool {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + task.Name() + "/stat")
		if err != nil {
			return false
		}
		// The state follows the command name in parentheses: "123 (name) T ...".
		rest := stat[bytes.LastIndexByte(stat, ')')+1:]
		if f := strings.Fields(string(rest)); len(f) == 0 || f[0] != "T" {
			return false
		}
	}
	return true
}

// On a read-only mount a root agent hands reads to the kernel (FUSE passthrough, Linux 6.9+):
// they never reach the server.
func TestReadOnlyMountReadsThroughPassthrough(t *testing.T) {
	xfstest.NeedPassthrough(t)
	src, _ := dirs(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 256*kib/16)
	if err := os.WriteFile(filepath.Join(src, "input"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	tr := usage.New("instance 17", 1*mib)
	for _, disable := range []bool{false, true} {
		mp := filepath.Join(filepath.Dir(src), "mnt-"+strconv.FormatBool(disable))
		m := mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, ReadOnly: true, DisablePassthrough: disable})
		got, err := os.ReadFile(filepath.Join(m.Path(), "input"))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("reading through the mount (passthrough disabled: %v): %d bytes, %v", disable, len(got), err)
		}
		reads := m.backend.reads.Load()
		if !disable && reads != 0 {
			t.Errorf("with passthrough the server still served %d reads", reads)
		}
		if disable && reads == 0 {
			t.Error("without passthrough the server served no reads: the counter is broken")
		}
	}
}

// DataWarp's MFS: no file grows beyond the maximum file size.
func TestMaxFileSize(t *testing.T) { eachBackend(t, testMaxFileSize) }

func testMaxFileSize(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 18", 4*mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, MaxFileSize: 100 * kib})
	f, err := os.Create(filepath.Join(m.Path(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := f.Write(make([]byte, 150*kib))
	if n != 100*kib || !errors.Is(err, syscall.EFBIG) {
		t.Errorf("writing 150 KiB with a 100 KiB limit: %d bytes, %v; want 100 KiB then EFBIG", n, err)
	}
	if err := f.Truncate(200 * kib); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("truncate past the limit: %v, want EFBIG", err)
	}
	if err := fallocate(int(f.Fd()), 0, 0, 200*kib); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("fallocate past the limit: %v, want EFBIG", err)
	}
	// A striped file's writes go on behind the writer (refused truncates and fallocates need
	// not wait for them): what it holds is counted once fsync returns.
	if err := f.Sync(); err != nil {
		t.Errorf("fsync after the refusals: %v", err)
	}
	// Other files have their own limit; the instance's capacity is untouched by refusals.
	if err := os.WriteFile(filepath.Join(m.Path(), "g"), make([]byte, 100*kib), 0o644); err != nil {
		t.Errorf("a second file up to the limit: %v", err)
	}
	// f's writes may still be on their way to a striped file's servers (write-behind: the
	// refusals above are the client's own, and wait for nothing).
	if err := f.Sync(); err != nil {
		t.Error(err)
	}
	if tr.Used() != 200*kib {
		t.Errorf("Used = %d, want 200 KiB", tr.Used())
	}
	checkAccounting(t, tr, src)
}

// emptyDirFootprint is what an empty directory made in dir is charged (its blocks).
func emptyDirFootprint(t *testing.T, dir string) uint64 {
	t.Helper()
	empty, err := os.MkdirTemp(dir, "empty-")
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	err = unix.Lstat(empty, &st)
	os.Remove(empty)
	if err != nil {
		t.Fatal(err)
	}
	return usage.Footprint(&st)
}
