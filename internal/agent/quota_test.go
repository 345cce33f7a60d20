package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage/xfstest"
)

const mib = 1 << 20

// A fragment holding a whole instance on XFS with prjquota gets a project quota of its
// capacity: its co-located mount writes through the kernel, ENOSPC at the capacity, and
// deleting the fragment removes the limit. A striped instance's fragment gets none, and MFS
// mounts keep writing through the agent.
func TestFragmentProjectQuota(t *testing.T) {
	base := t.TempDir()
	mnt := xfstest.Mount(t, base, 320*mib)
	ctx := context.Background()
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: filepath.Join(mnt, "ssd"), Capacity: 64 * mib})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 5, InstanceID: 3, Capacity: 16 * mib, InstanceCapacity: 16 * mib}); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 6, InstanceID: 4, Capacity: 16 * mib, InstanceCapacity: 32 * mib}); err != nil {
		t.Fatal(err)
	}
	if a.fragmentQuota(5) == 0 {
		t.Fatal("the fragment of an instance on one node got no project quota")
	}
	if a.fragmentQuota(6) != 0 {
		t.Error("the fragment of a striped instance got a project quota")
	}
	if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: 1, FragmentID: 5, InstanceID: 3, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	spec := agentapi.MountSpec{MountPath: filepath.Join(base, "mnt"), StorageNode: "ssd1", FragmentID: 5,
		NamespaceID: 1, InstanceID: 3, Capacity: 16 * mib, Label: "I3-0"}
	// MFS is the agent's to enforce: such a mount writes through it.
	mfs := spec
	mfs.MountPath, mfs.MaxFileSize = filepath.Join(base, "mfs"), 4*mib
	if err := a.Mount(ctx, mfs); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mfs.MountPath, "f"), make([]byte, 5*mib), 0o644); !errors.Is(err, syscall.EFBIG) {
		t.Errorf("writing 5 MiB on a mount with MFS=4MiB: %v, want EFBIG", err)
	}
	if err := os.Remove(filepath.Join(mfs.MountPath, "f")); err != nil {
		t.Fatal(err)
	}
	if err := a.Unmount(ctx, 0, mfs.MountPath); err != nil {
		t.Fatal(err)
	}
	if err := a.Mount(ctx, spec); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(spec.MountPath, "big"))
	if err != nil {
		t.Fatal(err)
	}
	var written int
	for written <= 32*mib {
		n, err := f.Write(make([]byte, mib))
		written += n
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("a write past the capacity: %v, want ENOSPC", err)
			}
			break
		}
	}
	f.Close()
	if written > 16*mib || written < 15*mib {
		t.Errorf("wrote %d bytes into a 16 MiB instance", written)
	}
	if err := a.Unmount(ctx, 0, spec.MountPath); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteFragment(ctx, 5); err != nil {
		t.Fatal(err)
	}
	fd, err := openOwnDir(filepath.Join(a.ssd, "fragment"))
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if _, limit, err := usage.ProjectUsage(fd, usage.ProjectID(5)); err != nil || limit != 0 {
		t.Errorf("after deleting the fragment its project's limit is %d (%v)", limit, err)
	}
}

// On a file system without project quotas fragments are plain directories and co-located
// mounts write through the agent, as before.
func TestFragmentWithoutProjectQuota(t *testing.T) {
	ctx := context.Background()
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: t.TempDir(), Capacity: 64 * mib})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 5, InstanceID: 3, Capacity: 16 * mib, InstanceCapacity: 16 * mib}); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: 1, FragmentID: 5, InstanceID: 3, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	if a.fragmentQuota(5) != 0 {
		t.Error("a fragment on a file system without project quotas has one")
	}
	ls, _, err := a.mountSource(agentapi.MountSpec{MountPath: "/nonexistent/mnt", StorageNode: "ssd1", FragmentID: 5,
		NamespaceID: 1, InstanceID: 3, Capacity: 16 * mib})
	if err != nil || ls.ProjectQuota != 0 {
		t.Errorf("mount source: project quota %d, %v; want none", ls.ProjectQuota, err)
	}
	if err := a.DeleteFragment(ctx, 5); err != nil {
		t.Fatal(err)
	}
}
