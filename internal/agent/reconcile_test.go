package agent

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
)

// Reconcile removes a namespace the controller no longer knows once it is older than grace,
// looking for them at most every quarter of grace: a heartbeat of a node holding thousands of
// fragments does not read every fragment's namespace directory.
func TestReconcileSweepsNamespacesAtMostEveryQuarterOfGrace(t *testing.T) {
	ctx := context.Background()
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: filepath.Join(t.TempDir(), "ssd"), Capacity: 256 * mib, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 1, InstanceID: 1, Capacity: 64 * mib, InstanceCapacity: 64 * mib}); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	namespace := func(id int64) string {
		t.Helper()
		if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: id, FragmentID: 1, Owner: uint32(os.Getuid()), Group: uint32(os.Getgid()), Mode: 0o700}); err != nil {
			t.Fatal(err)
		}
		dir := a.namespaceDir(1, id)
		if err := os.Chtimes(dir, old, old); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	exists := func(dir string) bool { _, err := os.Stat(dir); return err == nil }
	kept, forgotten := namespace(11), namespace(12)
	live := agentapi.Assignment{ClusterID: "c1", Fragments: []int64{1}, Namespaces: []agentapi.NamespaceSpec{{ID: 11, FragmentID: 1, InstanceID: 1}}}
	const grace = 4 * time.Second
	a.Reconcile(ctx, live, grace)
	if !exists(kept) || exists(forgotten) {
		t.Fatalf("after the first reconcile: namespace 11 kept %v (want true), 12 kept %v (want false)", exists(kept), exists(forgotten))
	}
	later := namespace(13)
	a.Reconcile(ctx, live, grace)
	if !exists(later) {
		t.Fatal("namespace 13 was looked for within a quarter of grace of the last sweep")
	}
	a.namespaceSweep = time.Now().Add(-grace / 4)
	a.Reconcile(ctx, live, grace)
	if exists(later) || !exists(kept) {
		t.Fatalf("a quarter of grace later: namespace 13 kept %v (want false), 11 kept %v (want true)", exists(later), exists(kept))
	}
}

// A heartbeat's answer speaks only for the mounts asked for before the heartbeat left: a
// mount the controller asked for (again) afterwards is kept even if the answer does not list
// it and grace has passed (issue 23 item 3: after a failover the new leader confirmed a
// mount, pre_run released the job, and an answer computed before the confirmation was
// recorded took the mount away under the job). The answer to a later heartbeat does remove it.
func TestReconcileKeepsAMountAskedForAfterItsHeartbeatLeft(t *testing.T) {
	ctx := context.Background()
	a, spec, mounted := mountReconcileAgent(t)
	if err := a.Mount(ctx, spec); err != nil {
		t.Fatal(err)
	}
	sent := a.heartbeatsSent.Add(1) // a heartbeat leaves; its answer will not list the mount
	time.Sleep(20 * time.Millisecond)
	if err := a.Mount(ctx, spec); err != nil { // the controller asks for it again meanwhile
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	keptThenTakenAway(t, a, spec.MountPath, mounted, agentapi.Assignment{}, sent,
		"the answer to a heartbeat sent before the mount was asked for")
}

// A heartbeat's answer that lists a mount as expected (wanted, its outcome not yet recorded:
// a new leader's first answers after its predecessor asked for it) keeps it, however old;
// the next answer that names it neither way takes it away.
func TestReconcileKeepsAMountTheControllerExpects(t *testing.T) {
	ctx := context.Background()
	a, spec, mounted := mountReconcileAgent(t)
	if err := a.Mount(ctx, spec); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // older than the grace below
	sent := a.heartbeatsSent.Add(1)   // left after the mount was asked for
	keptThenTakenAway(t, a, spec.MountPath, mounted, agentapi.Assignment{Expected: []string{spec.MountPath}}, sent,
		"an answer that expects the mount")
}

// keptThenTakenAway checks that answer, to heartbeat number sent, keeps the mount at path
// (grace 10 ms, passed) and that it still serves a job, then that the answer to the next
// heartbeat, listing nothing, takes it away.
func keptThenTakenAway(t *testing.T, a *Agent, path string, mounted func() bool, answer agentapi.Assignment, sent uint64, what string) {
	t.Helper()
	ctx := context.Background()
	a.reconcile(ctx, answer, 10*time.Millisecond, sent)
	if !mounted() {
		t.Fatalf("%s took it away", what)
	}
	if err := os.WriteFile(filepath.Join(path, "job"), []byte("runs\n"), 0o644); err != nil {
		t.Fatalf("the job's mount after the reconcile: %v", err)
	}
	a.reconcile(ctx, agentapi.Assignment{}, 10*time.Millisecond, a.heartbeatsSent.Add(1))
	if mounted() {
		t.Fatal("the answer to a later heartbeat, naming the mount neither made nor expected, kept it past grace")
	}
}

// An answer computed before the controller recorded an unmount (post_run's) still lists the
// mount: it must not bring it back (a job's mount reappeared after post_run, and stayed for
// gc_grace after its teardown). A mount the controller asks for again is restored as before.
func TestReconcileDoesNotRestoreAMountJustUnmounted(t *testing.T) {
	ctx := context.Background()
	a, spec, mounted := mountReconcileAgent(t)
	if err := a.Mount(ctx, spec); err != nil {
		t.Fatal(err)
	}
	stale := agentapi.Assignment{Mounts: []agentapi.MountSpec{spec}} // computed before the unmount was recorded
	if err := a.Unmount(ctx, 3, spec.MountPath); err != nil {
		t.Fatal(err)
	}
	a.Reconcile(ctx, stale, time.Minute)
	if mounted() {
		t.Fatal("an answer listing a mount the controller just had unmounted brought it back")
	}
	if err := a.Mount(ctx, spec); err != nil { // asked for again
		t.Fatal(err)
	}
	if err := a.Unmount(ctx, 3, spec.MountPath); err != nil {
		t.Fatal(err)
	}
	a.Reconcile(ctx, stale, 0) // the unmount is older than grace: every answer now knows of it
	if !mounted() {
		t.Fatal("a mount the controller lists, unmounted longer than grace ago, was not restored")
	}
	a.Unmount(ctx, 3, spec.MountPath)
}

// mountReconcileAgent is an agent (root only) with a fragment and namespace, and the spec of a
// mount of it, not yet made; mounted says whether the agent has that mount.
func mountReconcileAgent(t *testing.T) (a *Agent, spec agentapi.MountSpec, mounted func() bool) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	ctx := context.Background()
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: filepath.Join(t.TempDir(), "ssd"), Capacity: 256 * mib, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 1, InstanceID: 1, Capacity: 64 * mib, InstanceCapacity: 64 * mib}); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: 2, FragmentID: 1, InstanceID: 1, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	spec = agentapi.MountSpec{ActivationID: 3, MountPath: filepath.Join(t.TempDir(), "mnt"), StorageNode: "ssd1", FragmentID: 1,
		NamespaceID: 2, InstanceID: 1, Capacity: 64 * mib, Label: "I1-0"}
	mounted = func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		m := a.mounts[spec.MountPath]
		return m != nil && m.alive()
	}
	return a, spec, mounted
}
