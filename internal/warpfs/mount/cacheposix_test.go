package mount

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
)

// create0Env selects the role of the test binary that creates a file without write
// permission (0400) through a cache mount as an ordinary user and uses the creating
// descriptor (TestCacheMountKeepsOpenFilesPOSIX). Not mode 0: the mount shows a mode of 0 as
// 0644 (go-fuse's default without NullPermissions), which the fstat below would trip on.
const create0Env = "SPILLWAY_CACHE_TEST_CREATE0"

// create0 creates path with mode 0400 and writes, truncates, allocates and reads it through the
// descriptor of its creation, on every stripe server.
func create0(path string) error {
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR, 0o400)
	if err != nil {
		return fmt.Errorf("open(O_CREAT|O_RDWR, 0400): %w", err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), (5<<20)/2/16) // 2.5 MiB: 3 servers
	if n, err := unix.Pwrite(fd, data, 0); err != nil || n != len(data) {
		return fmt.Errorf("pwrite: %d %v", n, err)
	}
	if err := unix.Ftruncate(fd, 2<<20); err != nil {
		return fmt.Errorf("ftruncate: %w", err)
	}
	size := int64(3 << 20)
	if err := unix.Fallocate(fd, 0, 0, size); err == unix.EOPNOTSUPP {
		size = 2 << 20 // the PFS (or its stand-in) allocates nothing
	} else if err != nil {
		return fmt.Errorf("posix_fallocate: %w", err)
	}
	got := make([]byte, 2<<20)
	if n, err := unix.Pread(fd, got, 0); err != nil || n != len(got) || !bytes.Equal(got, data[:len(got)]) {
		return fmt.Errorf("pread: %d %v, same %v", n, err, bytes.Equal(got, data[:len(got)]))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&0o7777 != 0o400 || st.Size != size {
		return fmt.Errorf("fstat: mode %o size %d %v", st.Mode, st.Size, err)
	}
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}

// On a cache mount (3 stripe servers with cache stores over a PFS directory, the doors as the
// agent opens them), open files behave as POSIX says: a file whose name is removed while open
// is still read and written through its descriptor (and its data is not lost at close), and
// the descriptor of a file created without write permission for its owner writes,
// truncates and allocates it (as an ordinary user: root's permission is not checked).
func TestCacheMountKeepsOpenFilesPOSIX(t *testing.T) {
	exe := runnableByNobody(t)
	pfs, mountPath := dirs(t)
	m := mountCache(t, pfs, mountPath, exe)
	root := m.Path()
	listPFS := func() []string {
		var names []string
		entries, _ := os.ReadDir(pfs)
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("%s: not after 5s", what)
				return
			}
		}
	}

	// Removed while open.
	rng := rand.New(rand.NewSource(14))
	data := make([]byte, 3<<20+4321)
	rng.Read(data)
	f, err := os.OpenFile(filepath.Join(root, "open"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data[:1<<20], 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "open")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data[1<<20:], 1<<20); err != nil {
		t.Errorf("write after unlink: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil || st.Nlink != 0 {
		t.Errorf("fstat after unlink: nlink %d %v", st.Nlink, err)
	}
	got := make([]byte, len(data))
	if n, err := f.ReadAt(got, 0); n != len(data) || !bytes.Equal(got, data) {
		t.Errorf("read after unlink: %d %v, same %v", n, err, bytes.Equal(got, data))
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("the mount lists %v", entries)
	}
	if err := f.Close(); err != nil {
		t.Errorf("close after unlink: %v", err)
	}
	eventually("the hidden name goes at the last close", func() bool {
		for _, n := range listPFS() {
			if strings.HasPrefix(n, cache.UnlinkedPrefix) {
				return false
			}
		}
		return true
	})

	// Created read-only by an ordinary user.
	dir := filepath.Join(root, "shared")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/", create0Env + "=" + filepath.Join(dir, "zero")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("a file created with mode 0400 by nobody, used through its creating descriptor: %v: %s", err, out)
	}
	eventually("the PFS file gets mode 0400 at the creator's close", func() bool {
		var st unix.Stat_t
		return unix.Lstat(filepath.Join(pfs, "shared", "zero"), &st) == nil && st.Mode&0o7777 == 0o400
	})
}
