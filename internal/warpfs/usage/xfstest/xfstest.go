// Package xfstest gives tests a real XFS file system with project quotas on: a loop file made
// with mkfs.xfs and mounted with -o prjquota, removed when the test ends; and the check of the
// FUSE passthrough the co-located tests on it need.
package xfstest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Mount makes an XFS file system of size bytes (at least 300 MiB, XFS's minimum) in a sparse
// file, mounts it with project quotas at a new directory under base (0755, so that other
// users can reach what is beneath) and returns that directory. It skips the test, saying why,
// when it is not run as root or the machine has no loop devices, mkfs.xfs or XFS.
func Mount(t *testing.T, base string, size int64) string {
	t.Helper()
	return mount(t, base, size, true)
}

// MountPlain is Mount without project quotas: for what XFS does without them (project ids
// can still be set), on any kernel with XFS.
func MountPlain(t *testing.T, base string, size int64) string {
	t.Helper()
	return mount(t, base, size, false)
}

// MountWith is MountPlain with extra mount options (e.g. usage.XFSFragmentOptions).
func MountWith(t *testing.T, base string, size int64, options string) string {
	t.Helper()
	return mount(t, base, size, false, options)
}

func mount(t *testing.T, base string, size int64, prjquota bool, extra ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("an XFS loop mount needs root")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices (/dev/loop-control: %v)", err)
	}
	mkfs, err := exec.LookPath("mkfs.xfs")
	if err != nil {
		t.Skip("mkfs.xfs is not installed (xfsprogs)")
	}
	dir, err := os.MkdirTemp(base, "xfs-")
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "image")
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if out, err := exec.Command(mkfs, "-q", "-f", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	options := "loop"
	if prjquota {
		options += ",prjquota"
	}
	for _, o := range extra {
		if o != "" {
			options += "," + o
		}
	}
	out, err := exec.Command("mount", "-o", options, img, mnt).CombinedOutput()
	if err != nil && !prjquota {
		if strings.Contains(string(out), "loop") || strings.Contains(string(out), "unknown filesystem") {
			t.Skipf("cannot mount an XFS loop file: %s", strings.TrimSpace(string(out)))
		}
		t.Fatalf("mount -o loop: %v: %s", err, out)
	}
	if err != nil {
		// Tell a kernel without XFS quotas (CONFIG_XFS_QUOTA unset: "quota support not
		// available in this kernel") from a broken mount.
		if plain, perr := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); perr == nil {
			syscall.Unmount(mnt, 0)
			t.Skip("this kernel's XFS has no quota support (CONFIG_XFS_QUOTA is not set): " +
				"project quotas cannot be tested here")
		} else if strings.Contains(string(plain), "loop") || strings.Contains(string(plain), "unknown filesystem") {
			t.Skipf("cannot mount an XFS loop file: %s", strings.TrimSpace(string(plain)))
		}
		t.Fatalf("mount -o loop,prjquota: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmounting the XFS loop mount %s: %v", mnt, err)
			syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
	})
	return mnt
}

// NeedPassthrough skips the test on kernels without FUSE passthrough (before Linux 6.9).
func NeedPassthrough(t *testing.T) {
	t.Helper()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &major, &minor)
	if major < 6 || major == 6 && minor < 9 {
		t.Skipf("kernel %d.%d has no FUSE passthrough", major, minor)
	}
}
