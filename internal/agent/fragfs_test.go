package agent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage/xfstest"
)

// needXFSLoop skips a test that needs real loop devices, XFS and FUSE passthrough, saying why.
func needXFSLoop(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("fragment file systems (xfs-loop) need root: loop devices and mounts")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices (/dev/loop-control: %v)", err)
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		t.Skip("mkfs.xfs is not installed (xfsprogs)")
	}
}

// xfsLoopAgent is an agent making XFS fragments under a new SSD path; every fragment it
// still has is removed when the test ends.
func xfsLoopAgent(t *testing.T, ssd string, ids ...int64) *Agent {
	t.Helper()
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: ssd, Capacity: 128 << 30, FragmentFS: FragmentXFSLoop})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		for _, id := range ids {
			if err := a.DeleteFragment(context.Background(), id); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		// A failed test must not leave file systems (and their loop devices) behind.
		real, _ := filepath.EvalSymlinks(a.ssd)
		raw, _ := os.ReadFile("/proc/self/mountinfo")
		for _, line := range strings.Split(string(raw), "\n") {
			if f := strings.Fields(line); len(f) > 4 && real != "" && strings.HasPrefix(f[4], real+"/") {
				unix.Unmount(f[4], unix.MNT_DETACH)
			}
		}
	})
	return a
}

// mountOptions is what /proc/self/mountinfo says of the mount at dir ("" when none).
func mountOptions(t *testing.T, dir string) string {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == dir {
			return f[5]
		}
	}
	return ""
}

func statfsAvail(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Bavail * uint64(st.Bsize)
}

// waitNoLoop waits (briefly: autoclear runs as the last user goes) until no loop device is
// attached to image.
func waitNoLoop(t *testing.T, image string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); len(loopsOf(image)) > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("loop devices %v are still attached to %s", loopsOf(image), image)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A fragment of its own XFS: mounted nodev,nosuid,noexec on a loop device with direct I/O,
// offering its capacity (and no more than the headroom beyond); creating it again changes
// nothing; the co-located mount of its one-node instance writes through the kernel (the
// server sees no WRITE), ENOSPC comes at the capacity, df reports the lesser of the
// tracker's and the file system's room; an agent restarted after the file system went (a
// reboot) mounts it again with its files; delete leaves no mount, loop device or image.
func TestXFSLoopFragment(t *testing.T) {
	needXFSLoop(t)
	xfstest.NeedPassthrough(t)
	ctx := context.Background()
	base := t.TempDir()
	ssd := filepath.Join(base, "ssd")
	a := xfsLoopAgent(t, ssd, 5, 6)
	const capacity = 64 * mib
	spec := agentapi.FragmentSpec{ID: 5, InstanceID: 3, Capacity: capacity, InstanceCapacity: capacity}
	start := time.Now()
	if err := a.CreateFragment(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Logf("fragment file system made and mounted in %v", time.Since(start))
	dir, image := a.fragmentDir(5), a.imagePath(5)
	dev, mounted, err := a.fragmentMount(5)
	if err != nil || !mounted {
		t.Fatalf("the fragment's file system is not mounted at %s: %v", dir, err)
	}
	opts := mountOptions(t, dir)
	for _, o := range []string{"nodev", "nosuid", "noexec"} {
		if !strings.Contains(","+opts+",", ","+o+",") {
			t.Errorf("the fragment is mounted %q, without %s", opts, o)
		}
	}
	loops := loopsOf(image)
	if len(loops) != 1 {
		t.Fatalf("loop devices of the image: %v, want one", loops)
	}
	if raw, _ := os.ReadFile("/sys/block/" + filepath.Base(loops[0]) + "/loop/dio"); strings.TrimSpace(string(raw)) != "1" {
		t.Errorf("%s does not use direct I/O (dio %q)", loops[0], raw)
	}
	if avail := statfsAvail(t, dir); avail < capacity || avail > capacity+fragmentHeadroom(capacity)+mib {
		t.Errorf("the fragment's file system offers %d bytes for a capacity of %d (headroom %d)", avail, capacity, fragmentHeadroom(capacity))
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Mode&0o7777 != 0o711 || st.Uid != 0 {
		t.Errorf("the fragment's root: mode %#o uid %d (%v), want 0711 root's", st.Mode&0o7777, st.Uid, err)
	}

	// Again (the controller retries): nothing changes.
	if err := a.CreateFragment(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if again, _, _ := a.fragmentMount(5); again != dev || len(loopsOf(image)) != 1 {
		t.Errorf("creating the fragment again: device %d (was %d), loop devices %v", again, dev, loopsOf(image))
	}

	// A striped instance's fragment is a file system too, but its mounts get no kernel writes.
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 6, InstanceID: 4, Capacity: capacity, InstanceCapacity: 2 * capacity}); err != nil {
		t.Fatal(err)
	}
	if _, mounted, _ := a.fragmentMount(6); !mounted {
		t.Error("the striped instance's fragment has no file system")
	}
	if a.fragmentDevice(6) != 0 {
		t.Error("the fragment of a striped instance counts as holding its instance")
	}
	if a.fragmentDevice(5) != dev {
		t.Errorf("fragmentDevice(5) = %d, want %d", a.fragmentDevice(5), dev)
	}

	if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: 1, FragmentID: 5, InstanceID: 3, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	ms := agentapi.MountSpec{MountPath: filepath.Join(base, "mnt"), StorageNode: "ssd1", FragmentID: 5,
		NamespaceID: 1, InstanceID: 3, Capacity: capacity, Label: "I3-0"}
	if err := a.Mount(ctx, ms); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	m := a.mounts[ms.MountPath].m
	a.mu.Unlock()
	if !m.KernelWrites() {
		t.Fatal("the co-located mount of a one-node instance on its own file system does not hand writes to the kernel")
	}
	// The capacity, less what the namespace's root directory takes (the instance counts
	// directories' blocks: a block at most).
	if avail := statfsAvail(t, ms.MountPath); avail > capacity || avail < capacity-4096 {
		t.Errorf("df of the empty mount: %d available, want the capacity %d less its root directory", avail, capacity)
	}
	// Root writing into the fragment beside the namespace (the tracker does not see it):
	// df shows the file system's room, now the smaller.
	if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, 24*mib), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, fsRoom := statfsAvail(t, ms.MountPath), statfsAvail(t, dir); got != fsRoom/4096*4096 || got >= capacity-16*mib {
		t.Errorf("df with 24 MiB written behind the tracker: %d available; the file system offers %d", got, fsRoom)
	}
	if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); statfsAvail(t, dir) < capacity; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("XFS did not give back the filler's blocks")
		}
	}

	f, err := os.Create(filepath.Join(ms.MountPath, "big"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, mib)
	var written uint64
	var werr error
	for written <= 2*capacity {
		n, err := f.Write(buf)
		written += uint64(n)
		if err != nil {
			werr = err
			break
		}
	}
	if err := f.Close(); werr == nil {
		werr = err
	}
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Errorf("writing past the capacity: %v, want ENOSPC", werr)
	}
	if written < capacity || written > capacity+fragmentHeadroom(capacity) {
		t.Errorf("ENOSPC after %d bytes in a fragment of %d (headroom %d)", written, capacity, fragmentHeadroom(capacity))
	}
	t.Logf("ENOSPC after %d bytes (capacity %d)", written, capacity)
	if w := m.ServerWrites(); w != 0 {
		t.Errorf("the mount's server served %d WRITE requests; passthrough should have spared them all", w)
	}
	// Full: less room than the write that failed. XFS may give back a few blocks of its
	// speculative preallocation once the file is closed (seen: 28 KiB), so not always 0.
	if avail := statfsAvail(t, ms.MountPath); avail >= mib {
		t.Errorf("df of the full mount: %d available, want less than the 1 MiB write that failed", avail)
	}
	if err := a.Unmount(ctx, 0, ms.MountPath); err != nil {
		t.Fatal(err)
	}

	// A reboot: the fragment's file system and its loop device are gone; the next agent
	// mounts it again, with the data.
	a.Close()
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	waitNoLoop(t, image)
	b := xfsLoopAgent(t, ssd)
	if _, mounted, err := b.fragmentMount(5); err != nil || !mounted {
		t.Fatalf("the restarted agent did not mount the fragment's file system again: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(b.namespaceDir(5, 1), "big")); err != nil || uint64(fi.Size()) != written {
		t.Errorf("after the restart the file written is %v (%v), want %d bytes", fi, err, written)
	}

	if err := b.DeleteFragment(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteFragment(ctx, 5); err != nil {
		t.Errorf("deleting a deleted fragment: %v", err)
	}
	if opts := mountOptions(t, dir); opts != "" {
		t.Errorf("%s is still mounted (%s)", dir, opts)
	}
	waitNoLoop(t, image)
	for _, p := range []string{image, dir} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left behind (%v)", p, err)
		}
	}
}

// The image holds the fragment's capacity and XFS's own needs at any size (creation fails
// when the file system offers less), stays sparse, and the file system offers no more than
// the capacity and its headroom.
func TestXFSLoopFragmentSizes(t *testing.T) {
	needXFSLoop(t)
	ctx := context.Background()
	ssd := filepath.Join(t.TempDir(), "ssd")
	sizes := []uint64{16 * mib, 1 << 30, 64 << 30}
	a := xfsLoopAgent(t, ssd, 1, 2, 3)
	for i, c := range sizes {
		id := int64(i + 1)
		start := time.Now()
		if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: id, InstanceID: id, Capacity: c, InstanceCapacity: c}); err != nil {
			t.Fatalf("capacity %d: %v", c, err)
		}
		took := time.Since(start)
		avail := statfsAvail(t, a.fragmentDir(id))
		var st unix.Stat_t
		if err := unix.Stat(a.imagePath(id), &st); err != nil {
			t.Fatal(err)
		}
		t.Logf("capacity %d MiB: image %d MiB (%d MiB allocated), file system offers %d MiB, made in %v",
			c/mib, st.Size/mib, st.Blocks*512/mib, avail/mib, took)
		if avail < c || avail > c+fragmentHeadroom(c)+mib {
			t.Errorf("capacity %d: the file system offers %d (headroom %d)", c, avail, fragmentHeadroom(c))
		}
		if st.Blocks*512 > 128*mib {
			t.Errorf("capacity %d: the image takes %d bytes on the SSD path before any data", c, st.Blocks*512)
		}
	}
}

// What a crash leaves, the next try finishes: an image whose mkfs.xfs never ended, an image
// made but not mounted, a file system mounted without its reserve; and a delete interrupted
// after the unmount is re-mounted by the next agent and removed by the retried delete.
func TestXFSLoopFragmentCrashes(t *testing.T) {
	needXFSLoop(t)
	ctx := context.Background()
	ssd := filepath.Join(t.TempDir(), "ssd")
	a := xfsLoopAgent(t, ssd, 1, 2, 3)
	const c = 32 * mib
	spec := func(id int64) agentapi.FragmentSpec {
		return agentapi.FragmentSpec{ID: id, InstanceID: id, Capacity: c, InstanceCapacity: c}
	}
	check := func(id int64) {
		t.Helper()
		if _, mounted, err := a.fragmentMount(id); err != nil || !mounted {
			t.Errorf("fragment %d: not mounted (%v)", id, err)
		}
		if avail := statfsAvail(t, a.fragmentDir(id)); avail < c || avail > c+fragmentHeadroom(c)+mib {
			t.Errorf("fragment %d: its file system offers %d", id, avail)
		}
		if _, err := os.Stat(filepath.Join(a.fragmentDir(id), "fragment.json")); err != nil {
			t.Errorf("fragment %d: %v", id, err)
		}
		if n := len(loopsOf(a.imagePath(id))); n != 1 {
			t.Errorf("fragment %d: %d loop devices", id, n)
		}
	}
	// 1: mkfs.xfs died half way.
	if err := os.MkdirAll(a.imagesDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(a.imagePath(1)+".tmp", []byte("half an XFS"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateFragment(ctx, spec(1)); err != nil {
		t.Fatal(err)
	}
	check(1)
	if _, err := os.Stat(a.imagePath(1) + ".tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the half-made image is left: %v", err)
	}
	// 2: the image made, the agent gone before mounting it.
	if err := a.makeImage(a.imagePath(2), c); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateFragment(ctx, spec(2)); err != nil {
		t.Fatal(err)
	}
	check(2)
	// 3: mounted, the agent gone before the reserve was made.
	if err := a.makeImage(a.imagePath(3), c); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(a.fragmentDir(3), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := a.mountImage(a.imagePath(3), a.fragmentDir(3)); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateFragment(ctx, spec(3)); err != nil {
		t.Fatal(err)
	}
	check(3)
	// A delete interrupted after the unmount: the next agent mounts it again, and the
	// retried delete removes everything.
	if err := unix.Unmount(a.fragmentDir(3), 0); err != nil {
		t.Fatal(err)
	}
	waitNoLoop(t, a.imagePath(3))
	b := xfsLoopAgent(t, ssd)
	if _, mounted, _ := b.fragmentMount(3); !mounted {
		t.Fatal("a fragment left unmounted by a crash was not mounted again at the start")
	}
	if err := b.DeleteFragment(ctx, 3); err != nil {
		t.Fatal(err)
	}
	waitNoLoop(t, a.imagePath(3))
	if _, err := os.Lstat(a.imagePath(3)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted fragment's image is left: %v", err)
	}
}

// A fragment made as a directory before the mode was turned on stays a directory.
func TestXFSLoopKeepsDirectoryFragments(t *testing.T) {
	needXFSLoop(t)
	ctx := context.Background()
	ssd := filepath.Join(t.TempDir(), "ssd")
	old, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: ssd, Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.CreateFragment(ctx, agentapi.FragmentSpec{ID: 1, InstanceID: 1, Capacity: 16 * mib, InstanceCapacity: 16 * mib}); err != nil {
		t.Fatal(err)
	}
	a := xfsLoopAgent(t, ssd, 1)
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 1, InstanceID: 1, Capacity: 16 * mib, InstanceCapacity: 16 * mib}); err != nil {
		t.Fatal(err)
	}
	if _, mounted, _ := a.fragmentMount(1); mounted || a.hasImage(1) {
		t.Error("an existing directory fragment was turned into a file system")
	}
}

// Bad settings are refused with the key's name.
func TestFragmentFSSetting(t *testing.T) {
	_, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: t.TempDir(), Capacity: mib, FragmentFS: "zfs"})
	if err == nil || !strings.Contains(err.Error(), `agent.fragment_filesystem "zfs"`) {
		t.Errorf("FragmentFS zfs: %v", err)
	}
	if os.Geteuid() != 0 {
		_, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: t.TempDir(), Capacity: mib, FragmentFS: FragmentXFSLoop})
		if err == nil || !strings.Contains(err.Error(), "root") {
			t.Errorf("xfs-loop without root: %v", err)
		}
	}
	if os.Geteuid() == 0 {
		// An SSD path others may write: they could swap the directories the agent mounts on.
		ssd := t.TempDir()
		os.Chmod(ssd, 0o777)
		_, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: ssd, Capacity: mib, FragmentFS: FragmentXFSLoop})
		if err == nil || !strings.Contains(err.Error(), "only root may write") {
			t.Errorf("xfs-loop on an SSD path mode 0777: %v", err)
		}
	}
	for _, c := range []uint64{0, mib, 1 << 30, 1 << 40, 100 << 40} {
		if s := imageSize(c); s < c+fragmentHeadroom(c)+160*mib || s < xfsMinImage || s%mib != 0 {
			t.Errorf("imageSize(%d) = %d", c, s)
		}
	}
}

// BenchmarkXFSLoopFragment is the cost of a fragment file system: creating a fragment of
// 1 GiB (image, mkfs.xfs, loop device, mount, reserve, directories) and deleting it, against
// a directory fragment.
//
//	go test -run XXX -bench XFSLoopFragment -benchtime 20x ./internal/agent/
func BenchmarkXFSLoopFragment(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		b.Skip("mkfs.xfs is not installed (xfsprogs)")
	}
	for _, mode := range []string{FragmentXFSLoop, FragmentDirectory} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: filepath.Join(b.TempDir(), "ssd"), Capacity: 128 << 30, FragmentFS: mode})
			if err != nil {
				b.Fatal(err)
			}
			var create, remove time.Duration
			for i := 0; i < b.N; i++ {
				id := int64(i + 1)
				t0 := time.Now()
				if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: id, InstanceID: id, Capacity: 1 << 30, InstanceCapacity: 1 << 30}); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := a.DeleteFragment(ctx, id); err != nil {
					b.Fatal(err)
				}
				create += t1.Sub(t0)
				remove += time.Since(t1)
			}
			b.ReportMetric(float64(create.Microseconds())/1000/float64(b.N), "create-ms/op")
			b.ReportMetric(float64(remove.Microseconds())/1000/float64(b.N), "delete-ms/op")
		})
	}
}

// An SSD path reached through a symbolic link: the kernel names the image by its real path,
// the agent still recognises its fragment's file system (by the image's identity).
func TestXFSLoopFragmentSymlinkedSSDPath(t *testing.T) {
	needXFSLoop(t)
	ctx := context.Background()
	base := t.TempDir()
	if err := os.Mkdir(filepath.Join(base, "real"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("real", filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	a := xfsLoopAgent(t, filepath.Join(base, "link", "ssd"), 1)
	spec := agentapi.FragmentSpec{ID: 1, InstanceID: 1, Capacity: 16 * mib, InstanceCapacity: 16 * mib}
	if err := a.CreateFragment(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateFragment(ctx, spec); err != nil {
		t.Fatalf("creating it again: %v", err)
	}
	if a.fragmentDevice(1) == 0 {
		t.Error("the fragment's file system is not recognised as its own")
	}
	if err := a.DeleteFragment(ctx, 1); err != nil {
		t.Fatal(err)
	}
	waitNoLoop(t, filepath.Join(base, "real", "ssd", "fragment", "images", "1.img"))
}

// mkfs.xfs is bounded by agent.fragment_mkfs_timeout: past it the creation fails, naming
// the key, and leaves no image; the next try (with time enough) makes the fragment.
func TestXFSLoopMkfsTimeout(t *testing.T) {
	needXFSLoop(t)
	ctx := context.Background()
	ssd := filepath.Join(t.TempDir(), "ssd")
	a := xfsLoopAgent(t, ssd, 1)
	a.opt.FragmentFSLimits.Mkfs = time.Microsecond
	spec := agentapi.FragmentSpec{ID: 1, InstanceID: 1, Capacity: 16 * mib, InstanceCapacity: 16 * mib}
	err := a.CreateFragment(ctx, spec)
	if err == nil || !strings.Contains(err.Error(), "agent.fragment_mkfs_timeout") {
		t.Fatalf("mkfs.xfs with a timeout of 1µs: %v", err)
	}
	for _, p := range []string{a.imagePath(1), a.imagePath(1) + ".tmp"} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left after a timed-out mkfs.xfs (%v)", p, err)
		}
	}
	a.opt.FragmentFSLimits = DefaultFragmentFSLimits()
	if err := a.CreateFragment(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, mounted, _ := a.fragmentMount(1); !mounted {
		t.Error("the retried creation did not mount the fragment")
	}
}
