package mount

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage/xfstest"
)

// withKernelWritesWithoutQuota lets a writable local mount pass writes to the kernel on a
// file system without project quotas: the data path's mechanics, testable on any kernel.
func withKernelWritesWithoutQuota(t *testing.T) {
	testKernelWritesWithoutQuota = true
	t.Cleanup(func() { testKernelWritesWithoutQuota = false })
}

// colocatedIO writes, appends, reads back, truncates and removes files through m, and checks
// the data and the tracker's count after each step.
func colocatedIO(t *testing.T, m *Mounted, tr *usage.Tracker, src string) {
	t.Helper()
	p := filepath.Join(m.Path(), "f")
	data := bytes.Repeat([]byte("0123456789abcdef"), 2*mib/16)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return tr.Used() == 2*mib }, "the tracker to count the file written (2 MiB)")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data[:mib]); err != nil {
		t.Fatal(err)
	}
	if st, err := f.Stat(); err != nil || st.Size() != 3*mib {
		t.Errorf("size after appending through the mount: %v, %v; want 3 MiB", st.Size(), err)
	}
	// A truncate goes to the server while the kernel holds the file for writing: it must
	// count the appended MiB first.
	if err := f.Truncate(mib / 2); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data[:mib]); err != nil { // O_APPEND: at 512 KiB
		t.Fatal(err)
	}
	f.Close()
	waitFor(t, func() bool { return tr.Used() == mib+mib/2 }, "the tracker to count 1.5 MiB")
	got, err := os.ReadFile(p)
	want := append(append([]byte{}, data[:mib/2]...), data[:mib]...)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, len(want))
	}
	checkAccounting(t, tr, src)
	var st unix.Statfs_t
	if err := unix.Statfs(m.Path(), &st); err != nil {
		t.Fatal(err)
	}
	if free := st.Bavail * uint64(st.Bsize); free > tr.Free() || free < tr.Free()-min(tr.Free(), mib) {
		t.Errorf("df: %d free, the tracker %d", free, tr.Free())
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return tr.Used() == 0 }, "the tracker to give the file back")

	// A file removed while it is being written keeps its space until its last close, what
	// was written after the removal included, and then gives all of it back (and no more:
	// another file keeps its count).
	keep := filepath.Join(m.Path(), "keep")
	if err := os.WriteFile(keep, data[:mib], 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return tr.Used() == mib }, "the tracker to count a 1 MiB file")
	g, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Write(data[:mib]); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Write(data[:mib]); err != nil {
		t.Fatal(err)
	}
	if got := tr.Used(); got < 2*mib || got > 3*mib {
		t.Errorf("while an unlinked file of 2 MiB (1 MiB at its unlink) is open beside one of 1 MiB the tracker counts %d", got)
	}
	g.Close()
	waitFor(t, func() bool { return tr.Used() == mib }, "the tracker to give the unlinked file back at its close")
	checkAccounting(t, tr, src)
	if err := os.Remove(keep); err != nil {
		t.Fatal(err)
	}
}

// A writable co-located mount whose capacity the file system enforces hands writes to the
// kernel: the server sees no WRITE (nor READ) request, the data and sizes are right, and the
// tracker still counts every byte once the writers are done (for df and the other writers).
func TestColocatedWritesThroughPassthrough(t *testing.T) {
	xfstest.NeedPassthrough(t)
	withKernelWritesWithoutQuota(t)
	src, mp := dirs(t)
	tr := usage.New("instance 31", 16*mib)
	m := mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr})
	if !m.backend.kernelWrites {
		t.Fatal("a writable local mount without MFS does not hand writes to the kernel")
	}
	colocatedIO(t, m, tr, src)
	if w, r := m.backend.writes.Load(), m.backend.reads.Load(); w != 0 || r != 0 {
		t.Errorf("with passthrough the server still served %d writes and %d reads", w, r)
	}
}

// Without a project quota, or with MFS, or with passthrough disabled, writes go through the
// server and are charged as they happen, as before.
func TestColocatedWritesThroughServerWithoutQuota(t *testing.T) {
	xfstest.NeedPassthrough(t)
	cases := []struct {
		name      string
		forceTest bool // the test switch that stands in for a quota
		spec      Spec
	}{
		{"no quota", false, Spec{}},
		{"MFS", true, Spec{MaxFileSize: 8 * mib}},
		{"disabled", true, Spec{DisablePassthrough: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.forceTest {
				withKernelWritesWithoutQuota(t)
			}
			src, mp := dirs(t)
			tr := usage.New("instance 32", 16*mib)
			spec := c.spec
			spec.MountPath, spec.SourceDir, spec.Tracker = mp, src, tr
			m := mount(t, spec)
			if m.backend.kernelWrites {
				t.Fatal("the mount hands writes to the kernel")
			}
			colocatedIO(t, m, tr, src)
			if m.backend.writes.Load() == 0 {
				t.Error("the server served no writes: the counter is broken")
			}
		})
	}
}

// The real thing: the fragment on XFS with a project quota of the instance's capacity.
// Writes pass through the kernel, a write past the capacity fails with ENOSPC, and df shows
// what the quota counts.
func TestColocatedWritesUnderProjectQuota(t *testing.T) {
	xfstest.NeedPassthrough(t)
	mnt := xfstest.Mount(t, testBase, 320*mib)
	frag := filepath.Join(mnt, "fragment", "9")
	src := filepath.Join(frag, "namespace", "1")
	if err := os.MkdirAll(frag, 0o700); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(frag, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	const capacity = 16 * mib
	id := usage.ProjectID(9)
	if err := usage.SetProjectQuota(fd, id, capacity); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	tr := usage.New("instance 33", capacity)
	m := mount(t, Spec{MountPath: filepath.Join(mnt, "mnt"), SourceDir: src, Tracker: tr, ProjectQuota: id})
	if !m.backend.kernelWrites {
		t.Fatal("a writable local mount under a project quota does not hand writes to the kernel")
	}
	colocatedIO(t, m, tr, src)

	f, err := os.Create(filepath.Join(m.Path(), "big"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, mib)
	var written int
	for written <= 2*capacity {
		n, err := f.Write(buf)
		written += n
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("a write past the capacity failed with %v, want ENOSPC", err)
			}
			break
		}
	}
	f.Close()
	if written > capacity || written < capacity-mib {
		t.Errorf("wrote %d bytes into an instance of %d", written, capacity)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(m.Path(), &st); err != nil {
		t.Fatal(err)
	}
	used, _, err := usage.ProjectUsage(fd, id)
	if err != nil {
		t.Fatal(err)
	}
	if size := st.Blocks * uint64(st.Bsize); size != capacity {
		t.Errorf("df: size %d, want the capacity %d", size, capacity)
	}
	if free := st.Bavail * uint64(st.Bsize); free != (capacity-min(used, capacity))/4096*4096 {
		t.Errorf("df: %d free; the quota counts %d used of %d", free, used, capacity)
	}
	if w := m.backend.writes.Load(); w != 0 {
		t.Errorf("with passthrough the server still served %d writes", w)
	}
}

// A namespace on a file system of its own (the agent's xfs-loop fragments) hands writes to
// the kernel, and df reports the lesser of the file system's room and the tracker's; a
// FragmentDevice the namespace root is not on is refused (writes go through the server).
func TestColocatedWritesOnFragmentFileSystem(t *testing.T) {
	xfstest.NeedPassthrough(t)
	mnt := xfstest.MountPlain(t, testBase, 320*mib)
	src := filepath.Join(mnt, "namespace")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(src, &st); err != nil {
		t.Fatal(err)
	}
	var fsBefore unix.Statfs_t
	if err := unix.Statfs(src, &fsBefore); err != nil {
		t.Fatal(err)
	}
	fsRoom := fsBefore.Bavail * uint64(fsBefore.Bsize)

	wrong := mount(t, Spec{MountPath: filepath.Join(mnt, "wrong"), SourceDir: src,
		Tracker: usage.New("instance 35", 16*mib), FragmentDevice: st.Dev + 1})
	if wrong.KernelWrites() {
		t.Error("a mount whose namespace is not on the FragmentDevice it was given hands writes to the kernel")
	}
	if err := wrong.Unmount(); err != nil {
		t.Fatal(err)
	}

	// A tracker larger than the file system: df shows the file system's room.
	tr := usage.New("instance 34", 1<<40)
	m := mount(t, Spec{MountPath: filepath.Join(mnt, "mnt"), SourceDir: src, Tracker: tr, FragmentDevice: st.Dev})
	if !m.KernelWrites() {
		t.Fatal("a writable local mount on its fragment's own file system does not hand writes to the kernel")
	}
	var got unix.Statfs_t
	if err := unix.Statfs(m.Path(), &got); err != nil {
		t.Fatal(err)
	}
	if size, free := got.Blocks*uint64(got.Bsize), got.Bavail*uint64(got.Bsize); size != 1<<40 || free > fsRoom || free < fsRoom-mib {
		t.Errorf("df: size %d, %d free; want the tracker's capacity %d and the file system's room %d", size, free, uint64(1<<40), fsRoom)
	}
	if err := os.WriteFile(filepath.Join(m.Path(), "f"), make([]byte, 4*mib), 0o644); err != nil {
		t.Fatal(err)
	}
	if w := m.ServerWrites(); w != 0 {
		t.Errorf("the server served %d writes", w)
	}
}
