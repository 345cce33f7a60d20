package controller

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agent"
	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/stage"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/sqlite"
)

// TestMain lets this test binary be the stage worker of the tests' real agents, as
// `spillway stage-worker` is the agent's.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "stage-worker" {
		os.Exit(stage.WorkerMain(os.Args[2:], os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// TestTerminateRacesCompletion: a real in-job stage-out of a large file (a real controller
// running its executor, a real agent, real stage worker processes) is terminated at every
// point of its life: before its start is sent, while the start is in flight, during the
// copy, around its end. Whatever the moment, it ends either canceled — with no worker left
// and no complete copy at the destination, then or later — or complete with the whole file.
// Issue 23 item 15: the agent's cancel discarded a worker's "complete", and a stage terminated
// while its start was in flight was recorded canceled while its worker went on copying.
func TestTerminateRacesCompletion(t *testing.T) {
	if testing.Short() {
		t.Skip("copies a large file some 30 times")
	}
	cfg := config.Defaults()
	cfg.Controller.StateDir = t.TempDir()
	cfg.Pools = []config.Pool{{Name: "wlm_pool", Granularity: config.Size(1 << 20)}}
	eng, err := sqlite.Open(filepath.Join(cfg.Controller.StateDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(eng)
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(cfg, st, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	ssd := t.TempDir()
	limits := stage.DefaultLimits()
	limits.AllowRoot = true
	limits.CancelGrace = 2 * time.Second
	ag, err := agent.New(agent.Options{Name: "ssd1", Pool: "wlm_pool", SSDPath: ssd, Capacity: 4 << 30, Log: log,
		WorkerExe: []string{os.Args[0], "stage-worker"}, StageLimits: limits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ag.Close)
	c.AddLocalAgent("ssd1", ag)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rep, _ := ag.Report(ctx)
	if _, err := c.Heartbeat(ctx, rep); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	uid := uint32(os.Getuid())
	setup := lifecycle.Setup{Token: "77", Creator: "TEST", Owner: uid, Group: uint32(os.Getgid()),
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}
	if err := c.Setup(ctx, setup, false); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "setup", func() bool {
		s, err := c.Status(ctx, "77", lifecycle.PhaseSetup)
		return err == nil && s.Done
	})
	nsDir := namespaceDirOf(t, ssd)

	// The file: large enough that its copy takes a while, written with a pattern so that a
	// complete copy is told from a partial one.
	const size = 96 << 20
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i>>20)
	}
	if err := os.WriteFile(filepath.Join(nsDir, "big"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	pfs := t.TempDir()
	os.Chmod(pfs, 0o777)

	run := func(i int, delay time.Duration) (status string, took time.Duration) {
		dest := filepath.Join(pfs, "big."+strconv.Itoa(i))
		dwPath := "/big"
		req := []lifecycle.InJobStage{{Direction: model.StageOut, Type: model.StageFile, DWVar: lifecycle.VarJobStriped, DWPath: dwPath, PFSPath: dest}}
		start := time.Now()
		if err := c.JobStages(ctx, "77", req); err != nil {
			t.Fatalf("try %d: stage: %v", i, err)
		}
		if delay >= 0 {
			time.Sleep(delay)
			if _, err := c.TerminateStages(ctx, "77", lifecycle.VarJobStriped, dwPath); err != nil {
				t.Fatalf("try %d: terminate: %v", i, err)
			}
		}
		var ended *model.Stage
		waitUntil(t, 60*time.Second, "the stage's end", func() bool {
			w, err := c.World(ctx)
			if err != nil {
				return false
			}
			for _, s := range w.Stages {
				if s.PFSPath == dest && s.Ended() {
					ended = s
					return true
				}
			}
			return false
		})
		took = time.Since(start)
		alive, _ := stage.WorkerProcesses()
		switch ended.Status {
		case model.StageComplete:
			got, err := os.ReadFile(dest)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("try %d (terminate after %v): reported complete, but the destination holds %d bytes (want %d), %v", i, delay, len(got), size, err)
			}
		case model.StageCanceled:
			if alive != 0 {
				t.Fatalf("try %d (terminate after %v): recorded canceled while %d stage worker(s) still run", i, delay, alive)
			}
			time.Sleep(time.Second) // the issue saw the whole file land 2 s after "nothing pending"
			if got, err := os.ReadFile(dest); err == nil && bytes.Equal(got, data) {
				t.Fatalf("try %d (terminate after %v): recorded canceled, yet the whole file is at the destination", i, delay)
			}
		default:
			t.Fatalf("try %d (terminate after %v): ended %s: %s", i, delay, ended.Status, ended.Error)
		}
		waitUntil(t, 30*time.Second, "no stage worker left", func() bool {
			alive, _ := stage.WorkerProcesses()
			return alive == 0
		})
		os.Remove(dest)
		return ended.Status, took
	}

	// How long a whole stage takes here, now (the machine may be loaded): the terminates are
	// spread from before the start to past the end.
	_, whole := run(0, -1)
	t.Logf("a whole stage takes %v", whole)
	const tries = 30
	outcomes := map[string]int{}
	for i := 1; i <= tries; i++ {
		var delay time.Duration
		switch {
		case i <= 4:
			delay = 0 // before the start is sent, or while it is in flight
		case i <= 8:
			delay = time.Duration(i-4) * time.Millisecond
		default:
			delay = whole * time.Duration(i-8) / (tries - 12) // the copy, its end, and past it
		}
		s, _ := run(i, delay)
		outcomes[fmt.Sprintf("%s", s)]++
	}
	t.Logf("outcomes: %v", outcomes)
}

func waitUntil(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// namespaceDirOf finds the one namespace directory under an agent's SSD path.
func namespaceDirOf(t *testing.T, ssd string) string {
	t.Helper()
	var found []string
	filepath.WalkDir(ssd, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && filepath.Base(filepath.Dir(path)) == "namespace" {
			found = append(found, path)
			return fs.SkipDir
		}
		return nil
	})
	if len(found) != 1 {
		t.Fatalf("namespace directories under %s: %v", ssd, found)
	}
	return found[0]
}

// lostStart forwards the first stage start to the real agent, which starts the worker, and
// then answers with an error, as a controller that crashed after sending the start (or whose
// request timed out) finds it: the worker runs, and the state still says "pending".
type lostStart struct {
	*agent.Agent
	lost atomic.Bool
}

func (l *lostStart) StartStage(ctx context.Context, spec agentapi.StageSpec) error {
	if err := l.Agent.StartStage(ctx, spec); err != nil {
		return err
	}
	if l.lost.CompareAndSwap(false, true) {
		return errors.New("connection reset by peer (the controller died with the request)")
	}
	return nil
}

// TestTerminateAfterAStartNobodyRecorded: a stage whose start reached its agent but was never
// recorded (the controller crashed after sending it) is terminated by a new controller on
// the same state. It must end canceled with its worker stopped, or complete with the whole
// file — never "canceled" while the worker goes on copying. Issue 23 item 15, "including
// across a controller restart".
func TestTerminateAfterAStartNobodyRecorded(t *testing.T) {
	cfg := config.Defaults()
	cfg.Controller.StateDir = t.TempDir()
	cfg.Pools = []config.Pool{{Name: "wlm_pool", Granularity: config.Size(1 << 20)}}
	cfg.Executor.RetryBackoff = config.Duration(time.Hour) // the lost start is not retried
	cfg.Executor.RetryBackoffMax = config.Duration(time.Hour)
	eng, err := sqlite.Open(filepath.Join(cfg.Controller.StateDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(eng)
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ssd := t.TempDir()
	limits := stage.DefaultLimits()
	limits.AllowRoot = true
	limits.CancelGrace = 2 * time.Second
	ag, err := agent.New(agent.Options{Name: "ssd1", Pool: "wlm_pool", SSDPath: ssd, Capacity: 4 << 30, Log: log,
		WorkerExe: []string{os.Args[0], "stage-worker"}, StageLimits: limits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ag.Close)
	ctx := context.Background()

	first, err := New(cfg, st, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	first.AddLocalAgent("ssd1", &lostStart{Agent: ag})
	rep, _ := ag.Report(ctx)
	if _, err := first.Heartbeat(ctx, rep); err != nil {
		t.Fatal(err)
	}
	setup := lifecycle.Setup{Token: "78", Creator: "TEST", Owner: uint32(os.Getuid()), Group: uint32(os.Getgid()),
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}
	if err := first.Setup(ctx, setup, false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		first.RunOnce(ctx)
		if s, err := first.Status(ctx, "78", lifecycle.PhaseSetup); err == nil && s.Done {
			break
		}
	}
	nsDir := namespaceDirOf(t, ssd)
	// Large enough that the worker is still copying when the terminate comes.
	const size = 512 << 20
	data := bytes.Repeat([]byte("spillway"), size/8)
	if err := os.WriteFile(filepath.Join(nsDir, "big"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "big")
	os.Chmod(filepath.Dir(dest), 0o777)
	req := []lifecycle.InJobStage{{Direction: model.StageOut, Type: model.StageFile, DWVar: lifecycle.VarJobStriped, DWPath: "/big", PFSPath: dest}}
	if err := first.JobStages(ctx, "78", req); err != nil {
		t.Fatal(err)
	}
	first.RunOnce(ctx) // sends the start; its answer is lost
	if alive, _ := stage.WorkerProcesses(); alive != 1 {
		t.Fatalf("the start did not reach the agent: %d workers", alive)
	}

	// A new controller on the same state: it knows nothing of the start.
	second, err := New(cfg, st, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	second.AddLocalAgent("ssd1", ag)
	if _, err := second.TerminateStages(ctx, "78", lifecycle.VarJobStriped, "/big"); err != nil {
		t.Fatal(err)
	}
	var ended *model.Stage
	waitUntil(t, 60*time.Second, "the stage's end", func() bool {
		second.RunOnce(ctx)
		w, err := second.World(ctx)
		if err != nil {
			return false
		}
		for _, s := range w.Stages {
			if s.PFSPath == dest && s.Ended() {
				ended = s
				return true
			}
		}
		return false
	})
	alive, _ := stage.WorkerProcesses()
	switch ended.Status {
	case model.StageCanceled:
		if alive != 0 {
			t.Fatalf("recorded canceled while %d stage worker(s) still run: nobody will cancel or poll it", alive)
		}
		time.Sleep(time.Second)
		if got, err := os.ReadFile(dest); err == nil && bytes.Equal(got, data) {
			t.Fatal("recorded canceled, yet the whole file is at the destination")
		}
	case model.StageComplete:
		if got, err := os.ReadFile(dest); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("reported complete, but the destination holds %d bytes: %v", len(got), err)
		}
	default:
		t.Fatalf("ended %s: %s", ended.Status, ended.Error)
	}
	waitUntil(t, 30*time.Second, "no stage worker left", func() bool {
		alive, _ := stage.WorkerProcesses()
		return alive == 0
	})
}
