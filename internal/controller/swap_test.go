package controller

import (
	"context"
	"sync"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/views"
)

// swapAgent is the rig's real agent whose swap areas are recorded: attach succeeds, a detach
// answers what the test says, call by call.
type swapAgent struct {
	agentapi.Agent
	mu       sync.Mutex
	attached []agentapi.SwapSpec
	detached []agentapi.SwapDetachSpec
	answers  []agentapi.SwapStatus // the i-th detach's answer; the last one after those
}

func (s *swapAgent) AttachSwap(ctx context.Context, spec agentapi.SwapSpec) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attached = append(s.attached, spec)
	return nil
}

func (s *swapAgent) DetachSwap(ctx context.Context, spec agentapi.SwapDetachSpec) (agentapi.SwapStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.detached = append(s.detached, spec)
	return s.answers[min(len(s.detached), len(s.answers))-1], nil
}

func (s *swapAgent) counts() (int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.attached), len(s.detached)
}

// TestSwapThroughTheExecutor (issue 22): a swap-only job's pre_run makes the executor call
// AttachSwap on the compute node (the storage node itself: no mount), and pre_run is done
// only then; the node's heartbeat answer lists the area (Assignment.Swaps) so its agent
// keeps it; post_run polls DetachSwap with [swap] detach_timeout until done, and the next
// heartbeat lists nothing (an agent reaps what is not listed).
func TestSwapThroughTheExecutor(t *testing.T) {
	r := newAcctRig(t)
	sa := &swapAgent{Agent: r.agent, answers: []agentapi.SwapStatus{{Attached: true}, {Done: true, BytesWritten: 3 << 20, BytesRead: 2 << 20}}}
	r.c.AddLocalAgent("ssd1", sa)
	ctx := context.Background()
	if err := r.c.Setup(ctx, lifecycle.Setup{Token: "s1", Creator: "TEST", Owner: 1000, Group: 1000,
		Swap: &lifecycle.SwapRequest{SizePerNode: 8 << 20}}, false); err != nil {
		t.Fatal(err)
	}
	r.settle("s1", lifecycle.PhaseSetup)
	if err := r.c.PreRun(ctx, "s1", []string{"ssd1"}); err != nil {
		t.Fatal(err)
	}
	r.settle("s1", lifecycle.PhasePreRun)
	if n, _ := sa.counts(); n != 1 {
		t.Fatalf("%d attaches", n)
	}
	spec := sa.attached[0]
	if spec.Node != "ssd1" || spec.StorageNode != "ssd1" || spec.Mount != nil || spec.Size != 8<<20 || spec.Priority != -1 || spec.FileName != "swap-s1-ssd1" {
		t.Errorf("attach spec %+v", spec)
	}
	rep, err := r.agent.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rep.Usage.Swaps = []agentapi.SwapUsage{{ID: spec.ID, Instance: spec.InstanceID, Node: "ssd1", BytesWritten: 1 << 20, BytesRead: 1 << 10}}
	as, err := r.c.Heartbeat(ctx, rep)
	if err != nil || len(as.Swaps) != 1 || as.Swaps[0].ID != spec.ID {
		t.Fatalf("heartbeat answer swaps %+v %v", as.Swaps, err)
	}
	live, _, err := r.c.Accounting(ctx, spec.InstanceID)
	if err != nil || len(live.Realm.Swap) != 1 || live.Realm.Swap[0].Node != "ssd1" || live.Realm.SwapBytesWritten != 1<<20 || live.Realm.SwapBytesRead != 1<<10 {
		t.Fatalf("live accounting of the swap instance: %+v %v", live.Realm.Swap, err)
	}
	if err := r.c.PostRun(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	runUntil(t, r.c, "post_run's end", func() bool {
		st, err := r.c.Status(ctx, "s1", lifecycle.PhasePostRun)
		return err == nil && st.Done
	})
	if _, n := sa.counts(); n != 2 {
		t.Errorf("%d detach polls, want 2 (one in progress, then done)", n)
	}
	if d := sa.detached[0]; d.ID != spec.ID || d.Timeout != r.cfg.Swap.DetachTimeout.D().Milliseconds() {
		t.Errorf("detach spec %+v", d)
	}
	if as, err = r.c.Heartbeat(ctx, rep); err != nil || len(as.Swaps) != 0 {
		t.Errorf("heartbeat after post_run lists %+v %v", as.Swaps, err)
	}
	if err := r.c.Teardown(ctx, "s1", false); err != nil {
		t.Fatal(err)
	}
	r.settle("s1", lifecycle.PhaseTeardown)
	// The record counts what the area paged out and in, its detach's final counters.
	runUntil(t, r.c, "the accounting record", func() bool { return len(r.logLines()) == 1 })
	rec := r.logLines()[0].Realm
	if len(rec.Swap) != 1 || rec.Swap[0] != (views.RealmSwap{Node: "ssd1", Area: spec.ID, BytesWritten: 3 << 20, BytesRead: 2 << 20}) ||
		rec.SwapBytesWritten != 3<<20 || rec.SwapBytesRead != 2<<20 {
		t.Errorf("accounting record's swap: %+v written %d read %d", rec.Swap, rec.SwapBytesWritten, rec.SwapBytesRead)
	}
}
