package controller

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
)

// gatedAgent is the rig's real agent with its fragment creations held at a gate: each
// creation announces itself on started, then waits for a value on release.
type gatedAgent struct {
	agentapi.Agent
	started chan int64
	release chan struct{}
}

func (g *gatedAgent) CreateFragment(ctx context.Context, spec agentapi.FragmentSpec) error {
	g.started <- spec.ID
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Agent.CreateFragment(ctx, spec)
}

// gatedRig is the accounting rig (a real controller, state database and agent) with the
// agent's fragment creations gated.
func gatedRig(t *testing.T, maxInFlight int) (*acctRig, *gatedAgent) {
	r := newAcctRig(t)
	r.c.cfg.Executor.MaxInFlight = maxInFlight
	g := &gatedAgent{Agent: r.agent, started: make(chan int64, 16), release: make(chan struct{})}
	r.c.AddLocalAgent("ssd1", g)
	return r, g
}

// job asks for a job's instance; its setup then needs one fragment created.
func (r *acctRig) job(token string) int64 {
	r.t.Helper()
	ctx := context.Background()
	err := r.c.Setup(ctx, lifecycle.Setup{Token: token, Creator: "TEST", Owner: 1000, Group: 1000,
		Instance: &lifecycle.InstanceRequest{Capacity: 8 << 20, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}, false)
	if err != nil {
		r.t.Fatal(err)
	}
	id, err := r.c.sessionID(ctx, token)
	if err != nil || id == 0 {
		r.t.Fatalf("session of %s: %d %v", token, id, err)
	}
	return id
}

func (r *acctRig) isParked(id int64) bool {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.c.parked[id]
}

func (r *acctRig) queueLen() int {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return len(r.c.queue)
}

// waitStarted waits for the gate to hold a fragment creation, and returns its fragment.
func waitStarted(t *testing.T, g *gatedAgent) int64 {
	t.Helper()
	select {
	case id := <-g.started:
		return id
	case <-time.After(statusGuard):
		t.Fatal("no fragment creation reached the agent")
	}
	return 0
}

// parkedJob sets up a job whose fragment creation is held at the gate, after a pass that
// parked its session (the first pass reads the whole state and parks nothing).
func parkedJob(t *testing.T, token string) (*acctRig, *gatedAgent, int64, *sync.WaitGroup) {
	t.Helper()
	r, g := gatedRig(t, 32)
	ctx := context.Background()
	r.c.RunOnce(ctx)
	id := r.job(token)
	var wg sync.WaitGroup
	r.c.runOnce(ctx, &wg)
	waitStarted(t, g)
	if !r.isParked(id) {
		t.Fatal("the session is not parked while its only effect is in flight")
	}
	return r, g, id, &wg
}

// A due session whose every effect is in flight is parked: passes skip it until the effect
// ends, and then it is looked at again and finishes.
func TestSessionWithItsEffectInFlightIsParkedUntilTheEffectEnds(t *testing.T) {
	r, g, id, wg := parkedJob(t, "51")
	ctx := context.Background()
	r.c.runOnce(ctx, wg) // skips the session: no second creation reaches the agent
	select {
	case <-g.started:
		t.Fatal("a pass decided again on a parked session and sent its effect twice")
	default:
	}
	g.release <- struct{}{}
	wg.Wait()
	if r.isParked(id) {
		t.Fatal("the session stayed parked after its effect ended")
	}
	close(g.release) // later creations pass at once
	r.settle("51", lifecycle.PhaseSetup)
}

// A request about a parked session unparks it: the next pass decides again.
func TestRequestUnparksASession(t *testing.T) {
	r, g, id, wg := parkedJob(t, "52")
	ctx := context.Background()
	if err := r.c.Teardown(ctx, "52", false); err != nil {
		t.Fatal(err)
	}
	if r.isParked(id) {
		t.Fatal("a teardown request left its session parked")
	}
	close(g.release)
	wg.Wait()
	r.settle("52", lifecycle.PhaseTeardown)
}

// An effect that finds every slot taken waits in the queue, its session parked, and starts
// when a slot frees, without another pass.
func TestQueuedEffectStartsWhenASlotFrees(t *testing.T) {
	r, g := gatedRig(t, 1)
	ctx := context.Background()
	r.c.RunOnce(ctx)
	first, second := r.job("53"), r.job("54")
	var wg sync.WaitGroup
	r.c.runOnce(ctx, &wg)
	running := waitStarted(t, g)
	if n := r.queueLen(); n != 1 {
		t.Fatalf("queued effects: %d, want 1 (one slot, two creations)", n)
	}
	if !r.isParked(first) || !r.isParked(second) {
		t.Fatal("sessions with their effects in flight or queued are not parked")
	}
	// The first creation ends: its slot starts the queued creation, before the next step of
	// the first session (queued behind it: first come, first started).
	g.release <- struct{}{}
	if next := waitStarted(t, g); next == running {
		t.Fatalf("fragment %d was created twice; the queued creation did not start", next)
	}
	g.release <- struct{}{}
	wg.Wait()
	close(g.release)
	r.settle("53", lifecycle.PhaseSetup)
	r.settle("54", lifecycle.PhaseSetup)
}

// A request about a session drops its queued effects, decided before the request: a teardown
// is not followed by the creation it made pointless.
func TestRequestDropsAQueuedEffect(t *testing.T) {
	r, g := gatedRig(t, 1)
	ctx := context.Background()
	r.c.RunOnce(ctx)
	r.job("55")
	r.job("56")
	var wg sync.WaitGroup
	r.c.runOnce(ctx, &wg)
	waitStarted(t, g)
	r.c.mu.Lock()
	q := r.c.queue[0]
	r.c.mu.Unlock()
	token := q.w.Sessions[q.session].Token // the session whose creation waits
	if err := r.c.Teardown(ctx, token, false); err != nil {
		t.Fatal(err)
	}
	if n := r.queueLen(); n != 0 {
		t.Fatalf("queued effects after a teardown of their session: %d, want 0", n)
	}
	g.release <- struct{}{}
	wg.Wait() // the dropped effect is no longer counted: the pass's effects end
	select {
	case <-g.started:
		t.Fatal("the dropped creation reached the agent")
	default:
	}
	close(g.release)
	r.settle(token, lifecycle.PhaseTeardown)
}

// A success's outcome steps its session in the same transaction and starts what comes next
// at once: once the fragment is created, the setup finishes without another pass.
func TestAnEffectsOutcomeStartsTheSessionsNextEffect(t *testing.T) {
	r, g, _, wg := parkedJob(t, "57")
	close(g.release)
	wg.Wait() // the creation, and every effect started from its outcome on
	st, err := r.c.Status(context.Background(), "57", lifecycle.PhaseSetup)
	if err != nil || !st.Done {
		t.Fatalf("setup after its fragment's creation, with no pass since: %+v %v", st, err)
	}
}

// A poll's answer that says nothing new of a running stage skips its outcome's transaction
// only when the stage as recorded holds what the answer says: after a failed poll (a retry
// count and an error recorded since the pass that sent this one saw the stage), the answer
// is news, and is recorded to clear them.
func TestPollSkippedOnlyWhenTheRecordedStageHoldsItsAnswer(t *testing.T) {
	r := newAcctRig(t)
	ctx := context.Background()
	running := &model.Stage{ID: 41, SessionID: 9, Direction: "in", Type: "file", Status: model.StageRunning,
		FilesTotal: 1, BytesTotal: 4096, InJob: true}
	put := func(st *model.Stage) {
		t.Helper()
		if err := r.st.Update(ctx, func(tx *store.Tx) error { return store.Stages.Put(tx, st) }); err != nil {
			t.Fatal(err)
		}
	}
	poll := lifecycle.Effect{Op: lifecycle.OpPollStage, Ref: lifecycle.Ref{Kind: lifecycle.KindStage, ID: 41}, Node: "ssd1", Stage: agentapi.StageSpec{ID: 41}}
	answer := lifecycle.Result{Stage: agentapi.StageStatus{ID: 41, Known: true, Status: model.StageRunning, FilesTotal: 1, BytesTotal: 4096}}
	put(running)
	if !r.c.pollSaysNothingNew(ctx, poll, answer) {
		t.Errorf("an answer the recorded stage holds is news")
	}
	failed := *running
	failed.State.Attempts, failed.State.Error = 1, "poll-stage: connection refused"
	put(&failed)
	if r.c.pollSaysNothingNew(ctx, poll, answer) {
		t.Errorf("an answer after a failed poll was recorded is said to be nothing new: the retry count would stay")
	}
	gone := lifecycle.Effect{Op: lifecycle.OpPollStage, Ref: lifecycle.Ref{Kind: lifecycle.KindStage, ID: 42}, Node: "ssd1"}
	if r.c.pollSaysNothingNew(ctx, gone, answer) {
		t.Errorf("a poll of a stage no longer recorded is said to be nothing new")
	}
}
