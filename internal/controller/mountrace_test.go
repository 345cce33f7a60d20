package controller

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// mountGate is the rig's agent whose mounts wait at a gate: started carries each mount path
// as it reaches the agent, release lets one through.
type mountGate struct {
	agentapi.Agent
	started chan string
	release chan struct{}
}

func (g *mountGate) Mount(ctx context.Context, spec agentapi.MountSpec) error {
	g.started <- spec.MountPath
	<-g.release
	return nil // the mount is the test's to imagine: the agent said it is there
}

// A heartbeat answered while a mount is asked of the node, or done but not yet recorded,
// lists that mount: the agent, which removes mounts its controller does not list, must not
// take away one whose job pre_run is about to release (issue 23 item 3: a job ran without its
// mount after a failover; the new leader's heartbeat answers did not list the mount it was
// confirming).
func TestHeartbeatListsTheMountsInFlight(t *testing.T) {
	r := newAcctRig(t)
	g := &mountGate{Agent: r.agent, started: make(chan string, 4), release: make(chan struct{})}
	r.c.AddLocalAgent("ssd1", g)
	ctx := context.Background()
	r.job("61")
	r.settle("61", lifecycle.PhaseSetup)
	if err := r.c.PreRun(ctx, "61", []string{"ssd1"}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	r.c.runOnce(ctx, &wg)
	var path string
	select {
	case path = <-g.started:
	case <-time.After(statusGuard):
		t.Fatal("no mount reached the agent")
	}
	listed := func() bool {
		rep, err := r.agent.Report(ctx)
		if err != nil {
			t.Fatal(err)
		}
		as, err := r.c.Heartbeat(ctx, rep)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range as.Mounts {
			if m.MountPath == path {
				return m.Capability != "" || m.StorageNode != ""
			}
		}
		return false
	}
	if !listed() {
		t.Fatalf("a heartbeat answered while the mount of %s is asked of the node does not list it", path)
	}
	close(g.release)
	wg.Wait()
	r.settle("61", lifecycle.PhasePreRun)
	if !listed() {
		t.Fatalf("a heartbeat answered after the mount of %s was recorded does not list it", path)
	}
	r.c.mu.Lock()
	left := len(r.c.mountsInFlight)
	r.c.mu.Unlock()
	if left != 0 {
		t.Fatalf("mounts in flight left after their outcomes were recorded: %d nodes", left)
	}
}
