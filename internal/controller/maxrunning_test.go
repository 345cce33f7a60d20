package controller

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
)

// stagingAgent is the rig's real agent (fragments, namespaces) whose stages run until
// finish is set: each then completes at its next poll. It counts the stages running at once.
type stagingAgent struct {
	agentapi.Agent
	mu        sync.Mutex
	running   map[string]bool
	started   int
	mostAtOne int
	finish    bool
}

func (a *stagingAgent) StartStage(ctx context.Context, spec agentapi.StageSpec) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.running[spec.Key()] {
		a.running[spec.Key()] = true
		a.started++
	}
	a.mostAtOne = max(a.mostAtOne, len(a.running))
	return nil
}

func (a *stagingAgent) StageStatus(ctx context.Context, key string) (agentapi.StageStatus, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.running[key] {
		return agentapi.StageStatus{Known: true, Status: model.StageComplete}, nil
	}
	if a.finish {
		delete(a.running, key)
		return agentapi.StageStatus{Known: true, Status: model.StageComplete}, nil
	}
	return agentapi.StageStatus{Known: true, Status: model.StageRunning}, nil
}

func (a *stagingAgent) counts() (running, started, most int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.running), a.started, a.mostAtOne
}

// Security issue 19, item 8: stage.max_running bounds the stages running at once over every
// session, not within each session the executor steps (with max_running = 1, 4 stage-ins of
// different jobs ran at once). Four jobs ask for a stage-in each, with max_running = 1: one
// runs at a time, whatever the passes and outcomes that step the sessions, and all end.
func TestMaxRunningHoldsAcrossSessions(t *testing.T) {
	r := newAcctRig(t)
	r.c.cfg.Stage.MaxRunning, r.c.params.StageMaxRunning = 1, 1
	r.c.cfg.Stage.PollInterval = config.Duration(30 * time.Millisecond)
	a := &stagingAgent{Agent: r.agent, running: map[string]bool{}}
	r.c.AddLocalAgent("ssd1", a)
	ctx := context.Background()
	const jobs = 4
	for i := 0; i < jobs; i++ {
		r.job(fmt.Sprint("j", i))
	}
	for i := 0; i < 10; i++ { // the instances are created
		r.c.RunOnce(ctx)
	}
	for i := 0; i < jobs; i++ {
		token := fmt.Sprint("j", i)
		req := []lifecycle.StageRequest{{Type: model.StageFile, PFSPath: "/pfs/in", DWVar: lifecycle.VarJobStriped, DWPath: "/in"}}
		if err := r.c.Stages(ctx, token, model.StageIn, req); err != nil {
			t.Fatal(err)
		}
	}
	// The executor as it runs: passes, and outcomes stepping their own sessions, at once.
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.c.Run(rctx) }()
	defer func() { cancel(); <-done }()
	for i := 0; i < 100; i++ { // polls come and go (every 2 ms to 30 ms)
		time.Sleep(5 * time.Millisecond)
		r.c.wakeUp()
	}
	running, started, most := a.counts()
	if started == 0 {
		t.Fatal("no stage started")
	}
	if most > 1 || running > 1 {
		t.Fatalf("stage.max_running = 1, but %d stages of different jobs ran at once (%d now)", most, running)
	}
	a.mu.Lock()
	a.finish = true
	a.mu.Unlock()
	deadline := time.Now().Add(statusGuard)
	for {
		running, started, most = a.counts()
		if started == jobs && running == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if started != jobs || running != 0 || most > 1 {
		t.Fatalf("after the first ended: %d of %d stages started, %d running, at most %d at once", started, jobs, running, most)
	}
}
