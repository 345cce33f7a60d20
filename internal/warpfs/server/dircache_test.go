package server

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// A session resolves a directory once and keeps it open (dircache.go): a second request in
// it does not walk its path again. Seen from outside: moving the directory on disk behind the
// server's back leaves the session working in it by its old path (no server request renamed
// anything), where a fresh walk would find nothing.
func TestDirectoriesAreResolvedOnce(t *testing.T) {
	l, ns := localNamespace(t)
	os.MkdirAll(filepath.Join(ns, "a", "b"), 0o755)
	create(t, l, "a/b", "f1", 0)
	if err := os.Rename(filepath.Join(ns, "a", "b"), filepath.Join(ns, "a", "moved")); err != nil {
		t.Fatal(err)
	}
	create(t, l, "a/b", "f2", 0)
	if _, err := os.Stat(filepath.Join(ns, "a", "moved", "f2")); err != nil {
		t.Errorf("the second create did not use the directory resolved by the first: %v", err)
	}
}

// A rename or rmdir through any session makes every cached directory stale: requests by the
// old path then find what is there now, never the directory that was there, and a directory
// swapped for a symbolic link to outside the namespace is refused as by a fresh walk.
func TestCachedDirectoriesFollowRenames(t *testing.T) {
	l, ns := localNamespace(t)
	other, err := OpenLocal(LocalOptions{Dir: ns, Tracker: usage.New("other", 1<<30), Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	outside := t.TempDir()
	os.MkdirAll(filepath.Join(ns, "a", "b"), 0o755)
	create(t, l, "a/b", "f1", 0)

	// Another session (another client's mount) renames an ancestor.
	if _, _, errno := other.Exec(proto.OpRename, 0, 0, &proto.RenameReq{Name: "a", NewName: "a2"}, nil); errno != 0 {
		t.Fatal(errno)
	}
	create(t, l, "a/b", "f2", syscall.ENOENT)
	// ... and the user puts a symbolic link to outside the namespace where it was.
	if err := os.Symlink(outside, filepath.Join(ns, "a")); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(filepath.Join(outside, "b"), 0o755)
	create(t, l, "a/b", "f3", syscall.ELOOP)
	if entries, _ := os.ReadDir(filepath.Join(outside, "b")); len(entries) != 0 {
		t.Fatalf("a file was created outside the namespace: %v", entries)
	}

	// An rmdir and a new directory under the same name.
	create(t, l, "a2/b", "f4", 0)
	os.Remove(filepath.Join(ns, "a2", "b", "f1"))
	os.Remove(filepath.Join(ns, "a2", "b", "f4"))
	if _, _, errno := other.Exec(proto.OpRmdir, 0, 0, &proto.EntryReq{Dir: "a2", Name: "b"}, nil); errno != 0 {
		t.Fatal(errno)
	}
	create(t, l, "a2/b", "f5", syscall.ENOENT)
	os.Mkdir(filepath.Join(ns, "a2", "b"), 0o755)
	create(t, l, "a2/b", "f6", 0)
	if _, err := os.Stat(filepath.Join(ns, "a2", "b", "f6")); err != nil {
		t.Error(err)
	}
}

// The cache holds a bounded number of descriptors, and the session's end closes them all.
func TestDirectoryCacheIsBounded(t *testing.T) {
	ns := t.TempDir()
	l, err := OpenLocal(LocalOptions{Dir: ns, Tracker: usage.New("bounded", 1<<30), Name: "bounded"})
	if err != nil {
		t.Fatal(err)
	}
	before := openFds(t)
	for i := range 3 * dirCacheSize {
		dir := filepath.Join("d", string(rune('a'+i%26))+string(rune('a'+i/26)))
		os.MkdirAll(filepath.Join(ns, dir), 0o755)
		if _, _, errno := l.Exec(proto.OpLookup, 0, 0, &proto.PathReq{Path: dir + "/x"}, nil); errno != syscall.ENOENT {
			t.Fatal(errno)
		}
	}
	if n := openFds(t) - before; n > dirCacheSize {
		t.Errorf("%d descriptors open for %d directories used: more than the cache's %d", n, 3*dirCacheSize, dirCacheSize)
	}
	l.Close()
	if n := openFds(t); n >= before {
		t.Errorf("%d descriptors open after the session closed, %d before it used any directory (its root included)", n, before)
	}
}

func localNamespace(t *testing.T) (*Local, string) {
	t.Helper()
	if unix.Geteuid() != 0 {
		t.Skip("files are created as their caller: root only")
	}
	ns := t.TempDir()
	l, err := OpenLocal(LocalOptions{Dir: ns, Tracker: usage.New("dircache", 1<<30), Name: "dircache"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l, ns
}

func create(t *testing.T, l *Local, dir, name string, want syscall.Errno) {
	t.Helper()
	rep, _, errno := l.Exec(proto.OpCreate, 0, 0, &proto.CreateReq{Dir: dir, Name: name, Flags: syscall.O_WRONLY | syscall.O_CREAT | syscall.O_EXCL, Mode: 0o644}, nil)
	if errno != want {
		t.Fatalf("create %s/%s: %v, want %v", dir, name, errno, want)
	}
	if errno == 0 {
		l.Exec(proto.OpRelease, 0, 0, &proto.HandleReq{Handle: rep.(*proto.OpenReply).Handle}, nil)
	}
}

func openFds(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}
