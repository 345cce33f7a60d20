package stage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Security issue 19, item 7: a stage whose source stops answering (the user's own FUSE
// server, SIGSTOPped) held its session's instance until stage.timeout (24 h). Now a stage that
// moves nothing for stage.stall_timeout fails, saying so, and its worker — which does not heed
// SIGTERM while it is blocked — is killed CancelGrace later.
func TestStalledStageIsEnded(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "input")
	writeFile(t, src, strings.Repeat("x", 1<<20), 0o644, past)
	limits := testLimits()
	limits.StallTimeout = 500 * time.Millisecond
	limits.CancelGrace = 300 * time.Millisecond
	CloseIdleWorkers(10 * time.Second) // the earlier tests' idle workers: only this stage's is counted
	exe := []string{workerExe[0], "stage-worker-stalls"}
	r := Start(context.Background(), exe, spec(a, "in", "file", src, "$DW_JOB_STRIPED/input"), limits, nil)
	select {
	case <-r.Done():
	case <-time.After(30 * time.Second):
		r.Cancel()
		t.Fatalf("a stage that makes no progress is still running 30 s later (stall timeout 500ms): %+v", r.Status())
	}
	st := r.Status()
	if st.Status != "failed" || !strings.Contains(st.Error, "stage_in: no progress for 500ms (stage.stall_timeout)") {
		t.Errorf("status %q error %q, want failed with no progress for 500ms (stage.stall_timeout)", st.Status, st.Error)
	}
	if err := syscall.Kill(r.proc.pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the stalled worker (pid %d) is still there: %v", r.proc.pid, err)
	}
	if alive, stuck := WorkerProcesses(); alive != 0 || stuck != 0 {
		t.Errorf("worker processes counted after the stage ended: %d alive, %d stuck", alive, stuck)
	}
}

// A stage that moves its data slowly but steadily, for longer than stage.stall_timeout in all,
// is not ended: only a stage without progress is.
func TestSlowStageIsNotStalled(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "input")
	writeFile(t, src, strings.Repeat("x", 2<<20), 0o644, past)
	limits := testLimits()
	limits.StallTimeout = time.Second
	limits.ChunkBytes = 64 << 10 // 32 chunks of 50 ms each: longer than the stall timeout
	exe := []string{workerExe[0], "stage-worker-slow"}
	st := Start(context.Background(), exe, spec(a, "in", "file", src, "$DW_JOB_STRIPED/input"), limits, nil).Wait()
	if st.Status != "complete" || st.BytesDone != 2<<20 {
		t.Errorf("a slow, steady stage: status %q error %q, %d bytes", st.Status, st.Error, st.BytesDone)
	}
}

// A worker runs at stage.worker_nice from its start, every thread of it (setpriority(2) is
// per thread on Linux): a copy yields the CPU to the requests and the data path beside it.
func TestWorkerRunsAtItsNiceValue(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "input")
	writeFile(t, src, strings.Repeat("x", 1<<20), 0o644, past)
	limits := testLimits()
	limits.Nice = 7
	limits.ChunkBytes = 64 << 10 // 16 chunks of 50 ms each: time to look at it
	exe := []string{workerExe[0], "stage-worker-slow"}
	r := Start(context.Background(), exe, spec(a, "in", "file", src, "$DW_JOB_STRIPED/input"), limits, nil)
	defer r.Cancel()
	r.mu.Lock()
	pid := r.proc.pid
	r.mu.Unlock()
	time.Sleep(200 * time.Millisecond) // copying: its threads are all made
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("the worker's threads: %v", err)
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue // gone meanwhile
		}
		// after the command's closing parenthesis: state is field 3, nice field 19
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
		if fields[16] != "7" {
			t.Errorf("worker thread %s runs at nice %s, want 7 (stage.worker_nice)", task.Name(), fields[16])
		}
	}
	if st := r.Wait(); st.Status != "complete" {
		t.Errorf("the stage at nice 7: %s %s", st.Status, st.Error)
	}
	limits.Nice = 20
	if st := Start(context.Background(), exe, spec(a, "in", "file", src, "$DW_JOB_STRIPED/input2"), limits, nil).Wait(); st.Status != "failed" || !strings.Contains(st.Error, "Nice is 20") {
		t.Errorf("a nice value of 20: %s %q, want a refusal naming it", st.Status, st.Error)
	}
}
