package agent

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
)

// A cancel that comes while the stage's start is still under way on the agent (its roots
// being resolved: a striped namespace's staging mount may take a while, and the controller's
// start request may have timed out meanwhile) waits for it and cancels what it started,
// instead of answering "unknown" and leaving the stage to run with nobody to poll or cancel
// it. Issue 23 item 15.
func TestCancelDuringStartCancelsWhatItStarts(t *testing.T) {
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
	inStart, release := make(chan struct{}), make(chan struct{})
	startStageHook = func(string) { close(inStart); <-release }
	defer func() { startStageHook = nil }()
	spec := agentapi.StageSpec{ID: 7, Instance: 3, Direction: model.StageOut, Type: model.StageFile,
		Roots: map[string]string{"DW_JOB_STRIPED": "fragment/5/namespace/1"}}
	started := make(chan error, 1)
	go func() { started <- a.StartStage(ctx, spec) }()
	<-inStart
	canceled := make(chan agentapi.StageStatus, 1)
	go func() {
		st, err := a.CancelStage(ctx, spec.Key())
		if err != nil {
			t.Error(err)
		}
		canceled <- st
	}()
	time.Sleep(100 * time.Millisecond) // the cancel is there before the start ends
	close(release)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	st := <-canceled
	if !st.Known {
		t.Fatalf("the cancel answered %+v: it did not wait for the start under way, whose stage now runs unknown to the controller", st)
	}
	a.mu.Lock()
	left := a.stages[spec.Key()]
	a.mu.Unlock()
	if left != nil {
		t.Fatalf("the canceled stage is still held: %+v", left.Status())
	}
}
