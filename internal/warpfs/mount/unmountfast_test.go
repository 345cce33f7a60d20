package mount

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// TestUnmountDoesNotWaitForServerExitTimeout: a clean unmount of an idle mount returns as
// soon as the server has stopped, for root as for a user, whether files were opened through
// the kernel (FUSE passthrough, a root agent's read-only mounts and quota-held writable
// ones) or through the server; it does not sit out Limits.ServerExitTimeout (root's post_run
// once took 5.0 s every time). The timeout is 20 s here and the bound 10 s: a loaded machine
// does not make the test fail, a wait for the timeout does.
func TestUnmountDoesNotWaitForServerExitTimeout(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		readOnly, kernelWrites bool
	}{{"writable", false, false}, {"read-only", true, false}, {"kernel-writes", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b testBackend) {
				if tc.kernelWrites {
					testKernelWritesWithoutQuota = true
					t.Cleanup(func() { testKernelWritesWithoutQuota = false })
				}
				src, mp := dirs(t)
				if err := os.WriteFile(filepath.Join(src, "g"), []byte("staged in"), 0o644); err != nil {
					t.Fatal(err)
				}
				tr := usage.New("instance 1", 64*mib)
				m, err := Mount(b.prepare(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, FsName: "I1-0", Logger: quietLogger(t), ReadOnly: tc.readOnly,
					Limits: Limits{ServerExitTimeout: 20 * time.Second, UnmountBusyTimeout: 2 * time.Second}}))
				if err != nil {
					t.Fatal(err)
				}
				if !tc.readOnly {
					if err := os.WriteFile(filepath.Join(m.Path(), "f"), []byte("x"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				os.ReadFile(filepath.Join(m.Path(), "g"))
				start := time.Now()
				if err := m.Unmount(); err != nil {
					t.Fatal(err)
				}
				if took := time.Since(start); took > 10*time.Second {
					t.Fatalf("Unmount took %v: it waited for ServerExitTimeout (20s) instead of the server's exit", took)
				}
			})
		})
	}
}

// TestUnmountWithACopyInAnotherNamespace: a mount copied into another mount namespace while
// it was mounted (unshare -m, a service with a private /tmp, a container: root's doing) keeps
// the FUSE connection, and so the server, alive after the unmount here. The unmount does not
// wait Limits.ServerExitTimeout for a server that will not stop (root's post_run took 5.0 s
// every time): it cuts the connection at once and returns. 20 s timeout, 10 s bound: a loaded
// machine does not fail the test, a wait for the timeout does.
func TestUnmountWithACopyInAnotherNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a mount namespace takes root")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1)")
	}
	src, mp := dirs(t)
	m, err := Mount(Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("instance 1", 64*mib), FsName: "I1-0", Logger: quietLogger(t),
		Limits: Limits{ServerExitTimeout: 20 * time.Second, UnmountBusyTimeout: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	// A private copy of this namespace, holding its own copy of the mount, kept while the
	// unmount runs.
	holder := exec.Command(unshare, "-m", "--propagation", "private", "sleep", "120")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	waitFor(t, func() bool {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", holder.Process.Pid))
		return err == nil && strings.Contains(string(data), " "+mp+" ")
	}, "the copy of the mount in the new namespace")
	start := time.Now()
	if err := m.Unmount(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("unmount took %v", took)
	if took > 10*time.Second {
		t.Fatalf("Unmount took %v: it waited for ServerExitTimeout (20s) for a server kept alive by a copy of the mount in another namespace", took)
	}
	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the server still runs after the unmount")
	}
}
