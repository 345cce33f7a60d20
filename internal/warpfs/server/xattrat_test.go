package server

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// lgetxattrAt reads an entry's attribute through its directory's descriptor, with getxattrat
// where the kernel has it and by the /proc name where it has not, alike: never through a
// symbolic link of that name (a user could swap one in for a stub), nor a name with a slash.
func TestLgetxattrAtFollowsNoLink(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("trusted attributes: root only")
	}
	dir := t.TempDir()
	stub := filepath.Join(dir, "stub")
	if err := os.WriteFile(stub, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want := []byte("layout of the stub")
	if err := unix.Setxattr(stub, LayoutXattr, want, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("stub", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	dirfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirfd)
	defer noXattrat.Store(noXattrat.Load())
	for _, proc := range []bool{false, true} {
		noXattrat.Store(proc)
		buf := make([]byte, maxStub)
		n, err := lgetxattrAt(dirfd, "stub", LayoutXattr, buf)
		if err != nil || !bytes.Equal(buf[:n], want) {
			t.Errorf("/proc %v: the stub's layout: %q %v, want %q", proc, buf[:max(n, 0)], err, want)
		}
		if n, err := lgetxattrAt(dirfd, "link", LayoutXattr, buf); err == nil {
			t.Errorf("/proc %v: a link to the stub read as %q, want no attribute (not followed)", proc, buf[:n])
		}
		if _, err := lgetxattrAt(dirfd, "sub/../stub", LayoutXattr, buf); err != unix.EINVAL {
			t.Errorf("/proc %v: a name with a slash: %v, want EINVAL", proc, err)
		}
	}
}
