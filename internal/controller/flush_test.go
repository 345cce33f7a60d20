package controller

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
)

// flushingAgent is the rig's real agent whose cache flushes answer what the test says, call
// by call.
type flushingAgent struct {
	agentapi.Agent
	mu      sync.Mutex
	calls   []agentapi.CacheFlushSpec
	answers []agentapi.CacheFlushStatus // the i-th call's answer; the last one after those
}

func (f *flushingAgent) FlushCache(ctx context.Context, spec agentapi.CacheFlushSpec) (agentapi.CacheFlushStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, spec)
	return f.answers[min(len(f.calls), len(f.answers))-1], nil
}

func (f *flushingAgent) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// cacheRig is the accounting rig allowing cache instances, its agent's flushes answered by
// the test; restart makes a new controller on the same state (a controller that crashed and
// started again: nothing of the old one's memory is kept).
func cacheRig(t *testing.T, answers ...agentapi.CacheFlushStatus) (*acctRig, *flushingAgent, func() *Controller) {
	t.Helper()
	oldCheck := checkPFS
	checkPFS = func(string) error { return nil }
	t.Cleanup(func() { checkPFS = oldCheck })
	r := newAcctRig(t)
	fa := &flushingAgent{Agent: r.agent, answers: answers}
	restart := func() *Controller {
		r.cfg.Cache.AllowedPFS = []string{"/lustre"}
		c, err := New(r.cfg, r.st, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		c.AddLocalAgent("ssd1", fa)
		r.c = c
		return c
	}
	restart()
	ctx := context.Background()
	err := r.c.Setup(ctx, lifecycle.Setup{Token: "c1", Creator: "TEST", Owner: 1000, Group: 1000,
		Instance: &lifecycle.InstanceRequest{Capacity: 8 << 20, Pool: "wlm_pool", Type: model.TypeCache, AccessModes: []string{"striped"},
			Cache: &lifecycle.CacheRequest{PFS: "/lustre/me/run"}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	r.settle("c1", lifecycle.PhaseSetup)
	return r, fa, restart
}

// runUntil runs the executor's passes until cond holds (polls are paced: a pass may hold
// one back a moment).
func runUntil(t *testing.T, c *Controller, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(statusGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		c.RunOnce(context.Background())
		time.Sleep(2 * time.Millisecond)
	}
}

// TestCacheFlushResumesAfterRestart: a cache instance's teardown polls its fragment's flush;
// a controller that restarts mid-flush polls on (the progress is in the state), and the
// instance goes once the agent says Done.
func TestCacheFlushResumesAfterRestart(t *testing.T) {
	r, fa, restart := cacheRig(t,
		agentapi.CacheFlushStatus{DirtyBytes: 300, FlushedBytes: 0},
		agentapi.CacheFlushStatus{DirtyBytes: 100, FlushedBytes: 200},
		agentapi.CacheFlushStatus{Done: true, FlushedBytes: 300})
	ctx := context.Background()
	if err := r.c.Teardown(ctx, "c1", false); err != nil {
		t.Fatal(err)
	}
	runUntil(t, r.c, "a first flush poll", func() bool { return fa.callCount() >= 1 })
	if st, err := r.c.Status(ctx, "c1", lifecycle.PhaseTeardown); err != nil || st.Done || st.Failed {
		t.Fatalf("teardown while flushing: %+v %v", st, err)
	}
	c := restart()
	runUntil(t, c, "the teardown's end", func() bool {
		st, err := c.Status(ctx, "c1", lifecycle.PhaseTeardown)
		return err == nil && st.Done
	})
	if n := fa.callCount(); n != 3 {
		t.Fatalf("%d flush polls, want 3 (two before Done)", n)
	}
	for _, s := range fa.calls {
		if s.Discard || s.FragmentID == 0 || s.InstanceID == 0 {
			t.Fatalf("flush order %+v", s)
		}
	}
}

// TestCacheFlushFailureShown: a flush that fails undoes the teardown; the status of the
// teardown says why, and a teardown with hurry then discards.
func TestCacheFlushFailureShown(t *testing.T) {
	r, fa, _ := cacheRig(t, agentapi.CacheFlushStatus{DirtyBytes: 4096, Error: "pfs: disk quota exceeded (EDQUOT) on /lustre/me/run/a"})
	ctx := context.Background()
	if err := r.c.Teardown(ctx, "c1", false); err != nil {
		t.Fatal(err)
	}
	var st lifecycle.StepStatus
	runUntil(t, r.c, "the teardown undone", func() bool {
		st, _ = r.c.Status(ctx, "c1", lifecycle.PhaseTeardown)
		return st.Failed
	})
	if !strings.Contains(st.Message, "could not flush to /lustre/me/run: pfs: disk quota exceeded (EDQUOT) on /lustre/me/run/a; 4096 bytes (4KiB) not yet on the PFS are kept") {
		t.Fatalf("teardown status %+v", st)
	}
	fa.mu.Lock()
	fa.answers = append(fa.answers, agentapi.CacheFlushStatus{Done: true, DiscardedBytes: 4096})
	fa.mu.Unlock()
	if err := r.c.Teardown(ctx, "c1", true); err != nil {
		t.Fatal(err)
	}
	runUntil(t, r.c, "the hurried teardown's end", func() bool {
		st, err := r.c.Status(ctx, "c1", lifecycle.PhaseTeardown)
		return err == nil && st.Done
	})
	if last := fa.calls[len(fa.calls)-1]; !last.Discard {
		t.Fatalf("the hurried flush %+v", last)
	}
	// The instance's accounting record says what was discarded.
	runUntil(t, r.c, "the accounting record", func() bool { return len(r.logLines()) == 1 })
	if rec := r.logLines()[0].Realm; rec.CacheDiscarded != 4096 || len(rec.CacheLost) != 0 {
		t.Fatalf("accounting record: discarded %d, lost %q", rec.CacheDiscarded, rec.CacheLost)
	}
}
