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

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage/xfstest"
)

// A fragment whose file system fails (an XFS shut down, as XFS does itself on a metadata I/O
// error) gives the job EIO, and the agent reports each such error as a data-path error of the
// node, which the controller counts toward draining it (controller.auto_drain_failures).
func TestMediaErrorsAreReported(t *testing.T) {
	xfsIO, err := exec.LookPath("xfs_io")
	if err != nil {
		if xfsIO, err = exec.LookPath("/usr/sbin/xfs_io"); err != nil {
			t.Skip("xfs_io (xfsprogs) is not installed")
		}
	}
	fs := xfstest.MountPlain(t, t.TempDir(), 320*mib)
	ctx := context.Background()
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: filepath.Join(fs, "ssd"), Capacity: 128 * mib})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 5, InstanceID: 3, Capacity: 64 * mib, InstanceCapacity: 64 * mib,
		WriteLimit: 640 * mib, WriteWindowLength: 3600, Job: "4242"}); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: 1, FragmentID: 5, InstanceID: 3, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	spec := agentapi.MountSpec{MountPath: filepath.Join(t.TempDir(), "mnt"), StorageNode: "ssd1", FragmentID: 5,
		NamespaceID: 1, InstanceID: 3, Capacity: 64 * mib, Label: "I3-0"}
	if err := a.Mount(ctx, spec); err != nil {
		t.Fatal(err)
	}
	defer a.Unmount(ctx, 0, spec.MountPath)
	if err := os.WriteFile(filepath.Join(spec.MountPath, "before"), []byte("fine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if rep, _ := a.Report(ctx); rep.DataErrors != 0 {
		t.Fatalf("data errors before any: %d (%s)", rep.DataErrors, rep.LastDataError)
	}
	if out, err := exec.Command(xfsIO, "-x", "-c", "shutdown", fs).CombinedOutput(); err != nil {
		t.Fatalf("xfs_io shutdown: %v: %s", err, out)
	}
	err = os.WriteFile(filepath.Join(spec.MountPath, "after"), []byte("lost\n"), 0o644)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("a write to a shut-down file system: %v, want EIO", err)
	}
	rep, err := a.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.DataErrors == 0 || !strings.Contains(rep.LastDataError, "fragment 5") || !strings.Contains(rep.LastDataError, "EIO") {
		t.Fatalf("after EIO from the fragment's file system: %d data errors, last %q; want them counted, naming the fragment", rep.DataErrors, rep.LastDataError)
	}
}
