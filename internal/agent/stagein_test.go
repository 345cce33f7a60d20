package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
)

// A stage-in that ends while another still runs into the same instance does not rescan the
// instance: the rescan would forget what the other reserved and has not written yet, and
// let later writers past the capacity. The last one to end rescans.
func TestStageInEndingKeepsTheOthersReservations(t *testing.T) {
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: filepath.Join(t.TempDir(), "ssd"), Capacity: 256 * mib})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 5, InstanceID: 3, Capacity: 16 * mib, InstanceCapacity: 16 * mib, Job: "42"}); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: 1, FragmentID: 5, InstanceID: 3, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	tr, err := a.tracker(3)
	if err != nil {
		t.Fatal(err)
	}
	ns := a.namespaceDir(5, 1)
	stageIn := func(bytes uint64) { // a stage-in started: counted, its plan reserved
		a.mu.Lock()
		a.stageIns[3]++
		a.mu.Unlock()
		if err := tr.Reserve(bytes); err != nil {
			t.Fatal(err)
		}
	}
	stageIn(8 * mib) // still copying: nothing of it on disk yet
	stageIn(1 * mib)
	if err := os.WriteFile(filepath.Join(ns, "small"), make([]byte, mib), 0o644); err != nil {
		t.Fatal(err)
	}
	a.stageInEnded(3, tr, 1*mib, agentapi.StageStatus{Status: "complete", BytesDone: mib, BytesTotal: mib})
	if used := tr.Used(); used < 9*mib {
		t.Errorf("after one stage-in ended while another runs: %d bytes used, want at least 9 MiB (the other's 8 MiB reservation kept)", used)
	}
	// The other ends having written 2 MiB of its 8: it is the last, and the rescan counts
	// what is on disk.
	if err := os.WriteFile(filepath.Join(ns, "big"), make([]byte, 2*mib), 0o644); err != nil {
		t.Fatal(err)
	}
	a.stageInEnded(3, tr, 8*mib, agentapi.StageStatus{Status: "failed", BytesDone: 2 * mib, BytesTotal: 8 * mib})
	if used := tr.Used(); used < 3*mib || used > 3*mib+64<<10 {
		t.Errorf("after the last stage-in: %d bytes used, want what is on disk (3 MiB and the directory)", used)
	}
	if n := a.stageIns[3]; n != 0 {
		t.Errorf("%d stage-ins still counted", n)
	}
}
