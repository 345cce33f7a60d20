package pfsio

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestPathsAreCleanedAndConfined(t *testing.T) {
	for in, want := range map[string]string{"": "", ".": "", "a": "a", "a//b/./c/": "a/b/c", "./a": "a"} {
		if got, errno := cleanPath(in); errno != 0 || got != want {
			t.Errorf("cleanPath(%q) = %q %v, want %q", in, got, errno, want)
		}
	}
	for in, want := range map[string]syscall.Errno{"/etc": unix.EINVAL, "..": unix.EINVAL, "a/../b": unix.EINVAL,
		"a/..": unix.EINVAL, "a\x00b": unix.EINVAL, string(bytes.Repeat([]byte("x"), 256)): unix.ENAMETOOLONG} {
		if _, errno := cleanPath(in); errno != want {
			t.Errorf("cleanPath(%q): %v, want %v", in, errno, want)
		}
	}
}

// Every operation of the API, through a worker and in-process: the same answers.
func TestEveryOperation(t *testing.T) {
	eachDoor(t, Options{}, func(t *testing.T, d *Door, _ area) { everyOperation(t, d) })
}

func everyOperation(t *testing.T, d *Door) {
	must(t, d.Mkdir("dir", 0o750))
	if err := d.Mkdir("dir", 0o750); !errnoIs(err, unix.EEXIST) {
		t.Errorf("mkdir of an existing directory: %v", err)
	}
	st, err := d.Lstat("dir")
	if err != nil || st.Mode != unix.S_IFDIR|0o750 {
		t.Errorf("lstat dir: %o %v", st.Mode, err)
	}
	if st, err := d.Lstat(""); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Errorf("lstat of the root: %o %v", st.Mode, err)
	}

	// Files: create, write, read, sync, truncate, allocate.
	f, err := d.OpenFile("dir/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
	if n, err := f.WriteAt(data, 4096); n != len(data) || err != nil {
		t.Fatalf("write: %d %v", n, err)
	}
	got := make([]byte, len(data))
	if n, err := f.ReadAt(got, 4096); n != len(data) || err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %d %v, same %v", n, err, bytes.Equal(got, data))
	}
	must(t, f.Sync(false))
	must(t, f.Sync(true))
	must(t, f.Truncate(100))
	if st, _ := f.Fstat(); st.Size != 100 || st.Mode != unix.S_IFREG|0o640 {
		t.Errorf("after truncate: size %d mode %o", st.Size, st.Mode)
	}
	if err := f.Allocate(0, 0, 1<<20); err != nil && !errnoIs(err, unix.EOPNOTSUPP) {
		t.Errorf("fallocate: %v", err)
	}
	must(t, f.Close())
	if _, err := d.OpenFile("dir/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640); !errnoIs(err, unix.EEXIST) {
		t.Errorf("O_EXCL on an existing file: %v", err)
	}
	if _, err := d.OpenFile("dir/missing", os.O_RDONLY, 0); !errnoIs(err, unix.ENOENT) {
		t.Errorf("open of a missing file: %v", err)
	}
	if _, err := d.OpenFile("dir", os.O_RDONLY, 0); !errnoIs(err, unix.EISDIR) {
		t.Errorf("open of a directory: %v", err)
	}
	if _, err := d.OpenFile("dir/f", os.O_RDONLY|os.O_APPEND, 0); !errnoIs(err, unix.EINVAL) {
		t.Errorf("O_APPEND: %v", err)
	}
	ro, err := d.OpenFile("dir/f", os.O_RDONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ro.WriteAt([]byte("x"), 0); !errnoIs(err, unix.EBADF) {
		t.Errorf("write to a file opened read-only: %v", err)
	}
	ro.Close()

	// Special files are not opened (no FIFO blocks the door).
	must(t, unix.Mkfifo(filepath.Join(d.Root(), "fifo"), 0o666))
	if _, err := d.OpenFile("fifo", os.O_RDONLY, 0); !errnoIs(err, unix.ENXIO) {
		t.Errorf("open of a FIFO: %v", err)
	}

	// Names: symlink, readlink, link, rename with its flags, unlink, rmdir.
	must(t, d.Symlink("f", "dir/l"))
	if target, err := d.Readlink("dir/l"); err != nil || target != "f" {
		t.Errorf("readlink: %q %v", target, err)
	}
	if _, err := d.Readlink("dir/f"); !errnoIs(err, unix.EINVAL) {
		t.Errorf("readlink of a file: %v", err)
	}
	must(t, d.Link("dir/f", "dir/hard"))
	if st, _ := d.Lstat("dir/f"); st.Nlink != 2 {
		t.Errorf("nlink after link: %d", st.Nlink)
	}
	if err := d.Rename("dir/hard", "dir/l", unix.RENAME_NOREPLACE); !errnoIs(err, unix.EEXIST) {
		t.Errorf("RENAME_NOREPLACE onto a name: %v", err)
	}
	must(t, d.Rename("dir/hard", "dir/l", unix.RENAME_EXCHANGE))
	if st, _ := d.Lstat("dir/hard"); st.Mode&unix.S_IFMT != unix.S_IFLNK {
		t.Errorf("after RENAME_EXCHANGE dir/hard is %o, want the link", st.Mode)
	}
	must(t, d.Rename("dir/l", "moved", 0))
	must(t, d.Unlink("moved"))
	must(t, d.Unlink("dir/hard"))
	if err := d.Rmdir("dir"); !errnoIs(err, unix.ENOTEMPTY) {
		t.Errorf("rmdir of a full directory: %v", err)
	}
	if err := d.Unlink("dir"); !errnoIs(err, unix.EISDIR) {
		t.Errorf("unlink of a directory: %v", err)
	}

	// Attributes: chmod, chown (to the owner itself), utimens, xattrs, statfs.
	must(t, d.Chmod("dir/f", 0o600))
	st, _ = d.Lstat("dir/f")
	if st.Mode != unix.S_IFREG|0o600 {
		t.Errorf("mode after chmod: %o", st.Mode)
	}
	must(t, d.Chown("dir/f", int(st.Uid), -1))
	must(t, d.Utimens("dir/f", unix.Timespec{Sec: 1000, Nsec: 5}, unix.Timespec{Sec: 2000, Nsec: 7}))
	if st, _ := d.Lstat("dir/f"); st.Mtim.Sec != 2000 || st.Mtim.Nsec != 7 || st.Atim.Sec != 1000 {
		t.Errorf("times: %v %v", st.Atim, st.Mtim)
	}
	must(t, d.Utimens("dir/f", unix.Timespec{Nsec: unix.UTIME_OMIT}, unix.Timespec{Sec: 3000}))
	if st, _ := d.Lstat("dir/f"); st.Mtim.Sec != 3000 || st.Atim.Sec != 1000 {
		t.Errorf("times with UTIME_OMIT: %v %v", st.Atim, st.Mtim)
	}
	must(t, d.Setxattr("dir/f", "user.k", []byte("v"), unix.XATTR_CREATE))
	if err := d.Setxattr("dir/f", "user.k", []byte("v"), unix.XATTR_CREATE); !errnoIs(err, unix.EEXIST) {
		t.Errorf("XATTR_CREATE of an existing attribute: %v", err)
	}
	if v, err := d.Getxattr("dir/f", "user.k"); err != nil || string(v) != "v" {
		t.Errorf("getxattr: %q %v", v, err)
	}
	if names, err := d.Listxattr("dir/f"); err != nil || !slices.Equal(names, []string{"user.k"}) {
		t.Errorf("listxattr: %v %v", names, err)
	}
	must(t, d.Removexattr("dir/f", "user.k"))
	if _, err := d.Getxattr("dir/f", "user.k"); !errnoIs(err, unix.ENODATA) {
		t.Errorf("getxattr of a removed attribute: %v", err)
	}
	if err := d.Setxattr("dir/f", "trusted.k", []byte("v"), 0); !errnoIs(err, unix.EOPNOTSUPP) {
		t.Errorf("an attribute outside user.*: %v", err)
	}
	if sf, err := d.Statfs(); err != nil || sf.Blocks == 0 {
		t.Errorf("statfs: %+v %v", sf, err)
	}

	// Listing, in batches, with attributes.
	must(t, d.Mkdir("many", 0o755))
	want := []string{}
	for i := range 300 {
		name := fmt.Sprintf("f%03d", i)
		want = append(want, name)
		g, err := d.OpenFile("many/"+name, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		g.Close()
	}
	must(t, d.Symlink("nowhere", "many/link"))
	want = append(want, "link")
	var names []string
	batches := 0
	must(t, d.ReadDir("many", func(entries []Entry) error {
		batches++
		for _, e := range entries {
			names = append(names, e.Name)
			wantType := uint32(unix.S_IFREG)
			if e.Name == "link" {
				wantType = unix.S_IFLNK
			}
			if e.Type != wantType || e.Stat.Mode&unix.S_IFMT != wantType || e.Errno != 0 {
				t.Errorf("entry %s: type %o mode %o errno %d", e.Name, e.Type, e.Stat.Mode, e.Errno)
			}
		}
		return nil
	}))
	sort.Strings(names)
	sort.Strings(want)
	if !slices.Equal(names, want) || batches < 3 {
		t.Errorf("readdir: %d names in %d batches, want %d in 3 or more", len(names), batches, len(want))
	}
	var top []string
	must(t, d.ReadDir("", func(entries []Entry) error {
		for _, e := range entries {
			top = append(top, e.Name)
		}
		return nil
	}))
	sort.Strings(top)
	if !slices.Equal(top, []string{"dir", "fifo", "many"}) {
		t.Errorf("readdir of the root: %v", top)
	}
	if err := d.ReadDir("dir/f", func([]Entry) error { return nil }); !errnoIs(err, unix.ENOTDIR) {
		t.Errorf("readdir of a file: %v", err)
	}

	// Names are bytes, not text.
	odd := "\xff\xfe odd\x01name"
	g, err := d.OpenFile("many/"+odd, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	g.Close()
	found := false
	must(t, d.ReadDir("many", func(entries []Entry) error {
		for _, e := range entries {
			found = found || e.Name == odd
		}
		return nil
	}))
	if !found {
		t.Errorf("a name that is not UTF-8 did not come back as it is")
	}

	// Paths that leave the root are refused before anything is looked up.
	for _, p := range []string{"../x", "/etc/passwd", "dir/../../x"} {
		if _, err := d.Lstat(p); !errnoIs(err, unix.EINVAL) {
			t.Errorf("lstat %q: %v, want EINVAL", p, err)
		}
	}
}

// A door's worker holds the user's credentials and nothing else, cannot be reached into,
// and exits when the door is closed.
func TestWorkerHoldsOnlyTheUsersCredentials(t *testing.T) {
	needRoot(t)
	a := newArea(t)
	d := startDoor(t, a.pfs, Options{})
	if d.Root() != a.pfs {
		t.Errorf("Root() = %q, want %q", d.Root(), a.pfs)
	}
	// Named through a link, the root is where the link leads (what allowed_pfs must see).
	via := filepath.Join(a.base, "via")
	must(t, os.Symlink(a.pfs, via))
	if linked := startDoor(t, via, Options{}); linked.Root() != a.pfs {
		t.Errorf("Root() of a root named through a link = %q, want %q", linked.Root(), a.pfs)
	}
	pid := d.Pid()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	field := func(name string) string {
		for _, line := range bytes.Split(status, []byte("\n")) {
			if v, ok := bytes.CutPrefix(line, []byte(name+":")); ok {
				return string(bytes.Join(bytes.Fields(v), []byte(" ")))
			}
		}
		return ""
	}
	for name, want := range map[string]string{
		"Uid": "65534 65534 65534 65534", "Gid": "65534 65534 65534 65534", "Groups": "4242 65534",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapAmb": "0000000000000000", "TracerPid": "0",
	} {
		if got := field(name); got != want {
			t.Errorf("the worker's %s: %q, want %q", name, got, want)
		}
	}
	// Not dumpable: its /proc entries are root's, not the user's.
	var st unix.Stat_t
	must(t, unix.Stat(fmt.Sprintf("/proc/%d/fd", pid), &st))
	if st.Uid != 0 {
		t.Errorf("the worker's /proc/<pid>/fd belongs to uid %d: it is dumpable", st.Uid)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if !gone(pid, 5) {
		t.Errorf("the worker (pid %d) still runs after the door closed", pid)
	}
	if _, err := d.Lstat(""); !errnoIs(err, ErrClosed) {
		t.Errorf("a request to a closed door: %v", err)
	}
}

// gone waits up to seconds for pid to exit (or be a zombie).
func gone(pid int, seconds int) bool {
	for range seconds * 20 {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil || bytes.Contains(status, []byte("State:\tZ")) {
			return true
		}
		sleep(50)
	}
	return false
}
