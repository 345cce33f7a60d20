package controller

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/sqlite"
)

// In-job stage calls come in bursts (a checkpoint library calls once a file): they wake the
// executor executor.wake_delay after the first of them, and the burst is decided in one
// pass; any other wake-up (a request of another kind, an effect's end) starts a pass at once
// and takes the gathered ones with it.
func TestInJobCallsWakeTheExecutorTogether(t *testing.T) {
	if !gatherWake["request-persisted:job_stages"] || !gatherWake["request-persisted:terminate"] || gatherWake["request-persisted:setup"] {
		t.Fatalf("the requests that gather their wake-ups: %v; want job_stages and terminate alone", gatherWake)
	}
	cfg := config.Defaults()
	cfg.Controller.StateDir = t.TempDir()
	cfg.Executor.Tick = config.Duration(time.Minute) // no pass but those woken
	cfg.Executor.WakeDelay = config.Duration(400 * time.Millisecond)
	eng, err := sqlite.Open(filepath.Join(cfg.Controller.StateDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(eng)
	t.Cleanup(func() { st.Close() })
	c, err := New(cfg, st, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	passes := func() int {
		var m dto.Metric
		if err := c.metrics.passes.Write(&m); err != nil {
			t.Fatal(err)
		}
		return int(m.GetCounter().GetValue())
	}
	deadline := time.Now().Add(5 * time.Second)
	for passes() < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if passes() != 1 {
		t.Fatalf("%d passes after the start, want the first one", passes())
	}
	start := time.Now()
	for i := 0; i < 20; i++ {
		c.wakeGather()
		time.Sleep(2 * time.Millisecond)
	}
	if time.Since(start) < 300*time.Millisecond && passes() != 1 {
		t.Fatalf("%d passes within the window, want none but the first", passes()-1)
	}
	for passes() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Fatalf("the gathered pass came %s after the first call, before executor.wake_delay (400ms)", waited)
	}
	time.Sleep(500 * time.Millisecond)
	if passes() != 2 {
		t.Fatalf("the burst of 20 calls made %d passes, want 1", passes()-1)
	}
	// An immediate wake-up takes a gathered one with it: one pass, at once.
	c.wakeGather()
	c.wakeUp()
	time.Sleep(600 * time.Millisecond)
	if passes() != 3 {
		t.Fatalf("a gathered and an immediate wake-up made %d passes, want 1", passes()-2)
	}
}
