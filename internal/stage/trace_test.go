package stage

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/traceattack"
)

// traceAttacker is what a job's user runs to take over a staging worker before it protects
// itself (package traceattack), run as the user in this test binary ("trace-attacker" in
// TestMain) until stdin closes.
func traceAttacker() int {
	self, _ := os.Executable()
	return traceattack.Main([]string{self, "stage-worker"})
}

// The job's user, watching for their stage workers and seizing each the moment it may, never
// traces one: a worker is root until it is non-dumpable, and the user's only after. (Before,
// a worker ran as the user from its execve and protected itself only once the Go runtime
// ran: the attacker seized every one, could rewrite its prctl and then read the instance's
// directories from /proc/<pid>/fd.)
func TestUserCannotTraceAStartingWorker(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root: the worker must run as another user than the agent")
	}
	a := newArea(t)
	src := filepath.Join(a.pfs, "in.dat")
	writeFile(t, src, strings.Repeat("x", 4096), 0o644, time.Now())

	attacker := exec.Command(workerExe[0], "trace-attacker")
	uid, gid := stageIdentity()
	attacker.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	attacker.Dir = "/"
	stdin, err := attacker.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	attacker.Stdout, attacker.Stderr = &out, &out
	if err := attacker.Start(); err != nil {
		t.Fatal(err)
	}
	defer attacker.Process.Kill()
	time.Sleep(100 * time.Millisecond) // let it start watching

	const stages = 12
	for i := range stages {
		s := spec(a, "in", "file", src, fmt.Sprintf("$DW_JOB_STRIPED/in-%d.dat", i))
		st, _ := runStage(t, s)
		if st.Status != "complete" {
			t.Errorf("stage %d under attack: %+v", i, st)
		}
	}
	stdin.Close()
	done := make(chan error, 1)
	go func() { done <- attacker.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the attacker: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the attacker did not stop:\n%s", out.String())
	}
	report := out.String()
	seen, won := traceattack.Result(report)
	if won != 0 {
		t.Errorf("the job's user seized %d of %d stage workers:\n%s", won, stages, report)
	}
	if seen == 0 && won == 0 {
		t.Errorf("the attacker never saw a stage worker, so this test proves nothing:\n%s", report)
	}
	t.Logf("the attacker watched %d stage workers and seized %d", seen, won)
}
