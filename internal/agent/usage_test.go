package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
)

// The agent reports what its data path counted (NodeReport.Usage): exactly the bytes a job
// wrote through a mount, its files, its client; the write window and MFC it was given trip
// with EROFS and EMFILE; and a restarted agent carries the counters on from what it saved.
func TestUsageReportedAndKeptAcrossARestart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts need root")
	}
	base := t.TempDir()
	ssd := filepath.Join(base, "ssd")
	ctx := context.Background()
	var logged syncBuffer
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: ssd, Capacity: 256 * mib, Log: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	const limit = 24 * mib
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 5, InstanceID: 3, Capacity: 64 * mib, InstanceCapacity: 64 * mib,
		WriteLimit: limit, WriteWindowLength: 3600, Job: "4242"}); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: 1, FragmentID: 5, InstanceID: 3, Mode: 0o755, MaxFilesCreated: 3}); err != nil {
		t.Fatal(err)
	}
	spec := agentapi.MountSpec{MountPath: filepath.Join(base, "mnt"), StorageNode: "ssd1", FragmentID: 5,
		NamespaceID: 1, InstanceID: 3, Capacity: 64 * mib, Label: "I3-0"}
	if err := a.Mount(ctx, spec); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if m := a.mounts[spec.MountPath]; m.m.KernelWrites() {
		t.Error("a fragment with a write window is written by the kernel directly: its writes would not count")
	}
	const size = 10 * mib
	for i := 0; i < 2; i++ {
		if err := os.WriteFile(filepath.Join(spec.MountPath, fmt.Sprintf("f%d", i)), make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := a.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u := fragmentUsage(t, rep, 5)
	// Capacity used: the data, and the blocks of the namespace's directories (a few KiB).
	dirs := func(used uint64) bool { return used >= 2*size && used <= 2*size+64<<10 }
	if u.BytesWritten != 2*size || u.FilesCreated != 2 || u.WriteLimit != limit || u.WindowLength != 3600 ||
		u.WindowWritten != 2*size || u.ReadOnly || !dirs(u.CapacityUsed) || u.CapacityMax != u.CapacityUsed || u.Restored {
		t.Errorf("usage after writing 2 × 10 MiB: %+v", u)
	}
	if len(u.Namespaces) != 1 || u.Namespaces[0].BytesWritten != 2*size || u.Namespaces[0].FilesCreateLimit != 3 ||
		len(u.Clients) != 1 || u.Clients[0].Node != "ssd1" || u.Clients[0].BytesWritten != 2*size {
		t.Errorf("namespace and client usage: %+v %+v", u.Namespaces, u.Clients)
	}
	// One fragment's counters alone (what the controller reads before deleting it).
	if one, found, err := a.FragmentUsage(ctx, 5); err != nil || !found || one.BytesWritten != u.BytesWritten || one.CapacityUsed != u.CapacityUsed {
		t.Errorf("FragmentUsage(5): %+v %v %v, want the report's %+v", one, found, err, u)
	}
	if _, found, err := a.FragmentUsage(ctx, 99); found || err != nil {
		t.Errorf("FragmentUsage of a fragment the node does not hold: found %v, %v", found, err)
	}

	// MFC=3: the third file is the last.
	if err := os.WriteFile(filepath.Join(spec.MountPath, "f2"), []byte("x"), 0o644); err != nil {
		t.Fatalf("the third file, of MFC=3: %v", err)
	}
	if err := os.WriteFile(filepath.Join(spec.MountPath, "f3"), nil, 0o644); !errors.Is(err, syscall.EMFILE) {
		t.Errorf("a fourth file, past MFC=3: %v, want EMFILE", err)
	}
	// The write window: 24 MiB per hour; 20 MiB are written, the next 8 MiB cross it.
	if err := os.WriteFile(filepath.Join(spec.MountPath, "f0"), make([]byte, 8*mib), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("writing past the write window: %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(spec.MountPath, "f3"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("a create past the write window: %v, want EROFS", err)
	}
	for _, line := range []string{"write limit reached", "maximum files created reached"} {
		if !strings.Contains(logged.String(), line) || !strings.Contains(logged.String(), "job=4242 instance=3 fragment=5") {
			t.Errorf("no %q line naming the job, instance and fragment in the log:\n%s", line, logged.String())
		}
	}
	rep, _ = a.Report(ctx)
	before := fragmentUsage(t, rep, 5)
	// The write that crosses the limit is done; the next ones are refused.
	if !before.ReadOnly || before.ReadOnlyReason == "" || before.BytesWritten < limit || before.BytesWritten > limit+2*mib ||
		before.WindowWritten != before.BytesWritten || before.FilesCreated != 3 {
		t.Errorf("usage past the window: %+v", before)
	}

	// A restart: the counters go on from what was saved.
	a.Close()
	b, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: ssd, Capacity: 256 * mib})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rep, _ = b.Report(ctx)
	after := fragmentUsage(t, rep, 5)
	if after.BytesWritten != before.BytesWritten || after.FilesCreated != before.FilesCreated || after.WriteOps != before.WriteOps ||
		after.MaxWindowWrite != before.MaxWindowWrite || !after.ReadOnly || after.Restored ||
		len(after.Namespaces) != 1 || after.Namespaces[0].FilesCreated != 3 || after.Namespaces[0].FilesCreateLimit != 3 {
		t.Errorf("after a restart:\n%+v\nbefore:\n%+v", after, before)
	}
	spec.MountPath = filepath.Join(base, "mnt2")
	if err := b.Mount(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(spec.MountPath, "f4"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("a create after the restart, still past the window: %v, want EROFS", err)
	}
	// The saved counters are the agent's, inside the fragment, not the user's.
	st, err := os.Lstat(filepath.Join(ssd, "fragment", "5", accountingDir, countersFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the saved counters: %v %v", st, err)
	}
}

// syncBuffer is a log destination safe for the agent's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func fragmentUsage(t *testing.T, rep agentapi.NodeReport, id int64) agentapi.FragmentUsage {
	t.Helper()
	for _, f := range rep.Usage.Fragments {
		if f.Fragment == id {
			return f
		}
	}
	t.Fatalf("no usage of fragment %d in %+v", id, rep.Usage)
	return agentapi.FragmentUsage{}
}

// A fragment created fresh writes no counters (they are zero: nothing to save, no sync), and
// its metadata cache goes with it: the same id created again for another instance is that
// instance's, on a restarted agent too.
func TestFreshFragmentSavesNothingAndItsMetadataGoesWithIt(t *testing.T) {
	ssd := filepath.Join(t.TempDir(), "ssd")
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: ssd, Capacity: 256 * mib, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	spec := agentapi.FragmentSpec{ID: 7, InstanceID: 3, Capacity: 64 * mib, InstanceCapacity: 64 * mib}
	if err := a.CreateFragment(ctx, spec); err != nil {
		t.Fatal(err)
	}
	counters := filepath.Join(a.fragmentDir(7), accountingDir, countersFile)
	if _, err := os.Lstat(counters); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a fresh fragment saved its zero counters: %v", err)
	}
	if u, found, err := a.FragmentUsage(ctx, 7); err != nil || !found || u.BytesWritten != 0 {
		t.Fatalf("fresh fragment's usage: %+v %v %v", u, found, err)
	}
	if err := a.DeleteFragment(ctx, 7); err != nil {
		t.Fatal(err)
	}
	if m, err := a.readFragment(7); err == nil {
		t.Fatalf("a deleted fragment's metadata is still read: %+v", m)
	}
	spec.InstanceID = 4
	if err := a.CreateFragment(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if got := a.instanceCapacities(); got[4] != 64*mib || got[3] != 0 {
		t.Fatalf("capacities after the id was reused for instance 4: %v", got)
	}
	b, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: ssd, Capacity: 256 * mib, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := b.readFragment(7); err != nil || m.InstanceID != 4 {
		t.Fatalf("a restarted agent reads fragment 7 as %+v, %v; want instance 4", m, err)
	}
}

// An instance's fragments, capacity and namespace directories are found through the index of
// the metadata by instance, as a whole scan of the fragment directory finds them: fragments
// made before the agent started, created, deleted, an id reused by another instance, and a
// fragment left on disk by a removal that failed half-way.
func TestInstanceFragmentsThroughTheIndex(t *testing.T) {
	ssd := filepath.Join(t.TempDir(), "ssd")
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	open := func() *Agent {
		a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: ssd, Capacity: 1024 * mib, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a := open()
	create := func(a *Agent, id, instance int64, capacity, instanceCapacity uint64) {
		t.Helper()
		if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: id, InstanceID: instance, Capacity: capacity, InstanceCapacity: instanceCapacity}); err != nil {
			t.Fatal(err)
		}
		if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: 100 + id, FragmentID: id, Owner: uint32(os.Getuid()), Group: uint32(os.Getgid()), Mode: 0o700}); err != nil {
			t.Fatal(err)
		}
	}
	create(a, 1, 10, 64*mib, 64*mib)
	create(a, 2, 20, 32*mib, 96*mib) // instance 20 striped: 32 MiB here of 96
	create(a, 3, 20, 32*mib, 96*mib)
	check := func(a *Agent, want map[int64]uint64, nsDirs map[int64]int) {
		t.Helper()
		whole := a.instanceCapacities()
		for inst, c := range want {
			if got := a.instanceCapacity(inst); got != c || whole[inst] != c {
				t.Errorf("instance %d: capacity %d through the index, %d by a whole scan; want %d", inst, got, whole[inst], c)
			}
			if got := len(a.instanceNamespaceDirs(inst)); got != nsDirs[inst] {
				t.Errorf("instance %d: %d namespace and stripe directories, want %d: %v", inst, got, nsDirs[inst], a.instanceNamespaceDirs(inst))
			}
		}
	}
	// Each fragment holds one namespace and its stripes directory.
	check(a, map[int64]uint64{10: 64 * mib, 20: 64 * mib, 30: 0}, map[int64]int{10: 2, 20: 4, 30: 0})
	// A fresh agent (a restart) indexes what it finds on disk at the first lookup.
	b := open()
	check(b, map[int64]uint64{10: 64 * mib, 20: 64 * mib}, map[int64]int{10: 2, 20: 4})
	if err := b.DeleteFragment(ctx, 3); err != nil {
		t.Fatal(err)
	}
	create(b, 4, 30, 16*mib, 32*mib)
	check(b, map[int64]uint64{10: 64 * mib, 20: 32 * mib, 30: 16 * mib}, map[int64]int{10: 2, 20: 2, 30: 2})
	if err := b.DeleteFragment(ctx, 1); err != nil {
		t.Fatal(err)
	}
	create(b, 1, 30, 16*mib, 32*mib) // id 1 reused by instance 30
	check(b, map[int64]uint64{10: 0, 20: 32 * mib, 30: 32 * mib}, map[int64]int{10: 0, 20: 2, 30: 4})
	// A removal that fails half-way leaves the fragment on disk: the next lookup finds it
	// again, as a whole scan does.
	b.uncacheFragment(2)
	b.metasMu.Lock()
	b.indexed = false
	b.metasMu.Unlock()
	check(b, map[int64]uint64{20: 32 * mib}, map[int64]int{20: 2})
}

// A restarted agent's first report does not write the counters it read back (a synced write
// per fragment of the node); counters that change after are written.
func TestRestartDoesNotRewriteTheCountersItRead(t *testing.T) {
	ssd := filepath.Join(t.TempDir(), "ssd")
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	open := func() *Agent {
		a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: ssd, Capacity: 256 * mib, Log: log})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a := open()
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 7, InstanceID: 3, Capacity: 64 * mib, InstanceCapacity: 64 * mib}); err != nil {
		t.Fatal(err)
	}
	f, err := a.fragmentCounters(7)
	if err != nil {
		t.Fatal(err)
	}
	f.NoteCapacity(12345)
	a.Report(ctx)
	counters := filepath.Join(a.fragmentDir(7), accountingDir, countersFile)
	inode := func() uint64 {
		t.Helper()
		st, err := os.Stat(counters)
		if err != nil {
			t.Fatalf("the counters were not saved: %v", err)
		}
		return st.Sys().(*syscall.Stat_t).Ino
	}
	saved := inode()
	b := open()
	rep, _ := b.Report(ctx)
	if got := inode(); got != saved {
		t.Fatal("a restarted agent's report wrote the counters it had just read")
	}
	if u := fragmentUsage(t, rep, 7); u.CapacityMax != 12345 {
		t.Fatalf("restored capacity_max %d, want 12345", u.CapacityMax)
	}
	g, _ := b.fragmentCounters(7)
	g.NoteCapacity(99999)
	b.Report(ctx)
	if got := inode(); got == saved {
		t.Fatal("counters that changed were not written")
	}
}
