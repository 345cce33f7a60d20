package stage

import (
	"context"

	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/asuser"
)

// poolLimits are testLimits with the pool's limits given: what a worker kept between stages
// may do.
func poolLimits(idle time.Duration, maxStages int) Limits {
	l := testLimits()
	l.WorkerIdleTimeout, l.WorkerMaxStages, l.MaxIdleWorkers = idle, maxStages, 4
	return l
}

// freshPool starts a test with no idle worker of an earlier test.
func freshPool(t *testing.T) {
	t.Helper()
	CloseIdleWorkers(10 * time.Second)
	t.Cleanup(func() { CloseIdleWorkers(10 * time.Second) })
}

// stageFile stages a file of its own into a namespace of its own and returns the run, done.
func stageFile(t *testing.T, limits Limits, exe []string, s func(agentapi.StageSpec) agentapi.StageSpec) (*Run, area) {
	t.Helper()
	a := newArea(t)
	src := filepath.Join(a.pfs, "in.dat")
	writeFile(t, src, "content of "+a.base, 0o644, past)
	sp := spec(a, "in", "file", src, "$DW_JOB_STRIPED/in.dat")
	if s != nil {
		sp = s(sp)
	}
	r := Start(context.Background(), exe, sp, limits, nil)
	if st := r.Wait(); st.Status != "complete" {
		t.Fatalf("stage into %s: %s %s", a.ns, st.Status, st.Error)
	}
	if got := readFile(t, filepath.Join(a.ns, "in.dat")); got != "content of "+a.base {
		t.Fatalf("staged file holds %q, want its own source's", got)
	}
	return r, a
}

// fdsUnder lists the descriptors of process pid that lead to dir or below (read as root).
func fdsUnder(t *testing.T, pid int, dir string) []string {
	t.Helper()
	dirFd := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dirFd)
	if err != nil {
		t.Fatalf("the worker's descriptors: %v", err)
	}
	var found []string
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dirFd, e.Name()))
		if err == nil && (target == dir || strings.HasPrefix(target, dir+"/")) {
			found = append(found, e.Name()+" -> "+target)
		}
	}
	return found
}

// gone waits until the worker p is reaped.
func gone(t *testing.T, p *proc, within time.Duration, what string) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(within):
		t.Fatalf("%s: worker pid %d still there %v later", what, p.pid, within)
	}
}

// Two stages of one user in a row run in one worker process, each with its own directories:
// between them the worker holds no descriptor of the first stage's namespace, so the second
// stage (and anyone who could take over the worker) cannot reach it.
func TestWorkerServesStagesOfOneUserInARow(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root: reads the worker's /proc/<pid>/fd")
	}
	freshPool(t)
	limits := poolLimits(30*time.Second, 10)
	r1, a1 := stageFile(t, limits, workerExe, nil)
	pid := r1.proc.pid
	if IdleWorkers() != 1 {
		t.Fatalf("after a clean stage: %d idle workers, want 1", IdleWorkers())
	}
	if held := fdsUnder(t, pid, a1.ns); len(held) != 0 {
		t.Errorf("the idle worker still holds the first stage's namespace: %v", held)
	}
	r2, a2 := stageFile(t, limits, workerExe, nil)
	if r2.proc.pid != pid {
		t.Errorf("the second stage ran in pid %d, the first in %d: the worker was not reused", r2.proc.pid, pid)
	}
	if r2.fresh || !r1.fresh || r2.seq == r1.seq {
		t.Errorf("fresh %v then %v, sequence numbers %d and %d", r1.fresh, r2.fresh, r1.seq, r2.seq)
	}
	for _, a := range []area{a1, a2} {
		if held := fdsUnder(t, pid, a.ns); len(held) != 0 {
			t.Errorf("after the second stage the worker holds %v", held)
		}
		ownedByStager(t, a.ns)
	}
	if exists(filepath.Join(a2.ns, "in.dat")) && readFile(t, filepath.Join(a1.ns, "in.dat")) != "content of "+a1.base {
		t.Error("the second stage changed the first one's namespace")
	}
	if alive, _ := WorkerProcesses(); alive != 1 {
		t.Errorf("%d worker processes alive, want the one idle", alive)
	}
}

// A worker serves one credential only: another uid, or the same uid with other supplementary
// groups, gets another process; the same again gets the first one back.
func TestWorkerOfAnotherCredentialIsAnotherProcess(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root: the workers run as other users than the agent")
	}
	freshPool(t)
	groups := map[uint32][]uint32{}
	saved := userGroups
	userGroups = func(uid, gid uint32) ([]uint32, error) { return groups[uid], nil }
	t.Cleanup(func() { userGroups = saved })
	limits := poolLimits(30*time.Second, 10)
	uid, gid := stageIdentity()

	groups[uid] = []uint32{gid}
	first, _ := stageFile(t, limits, workerExe, nil)
	groups[uid] = []uint32{gid, 100}
	otherGroups, _ := stageFile(t, limits, workerExe, nil)
	if otherGroups.proc.pid == first.proc.pid {
		t.Errorf("uid %d with groups %v ran in the worker of groups [%d] (pid %d)", uid, groups[uid], gid, first.proc.pid)
	}
	other := uid - 1
	groups[other] = []uint32{gid}
	otherUID, _ := stageFile(t, limits, workerExe, func(s agentapi.StageSpec) agentapi.StageSpec {
		// the other uid may write there: the directories belong to the first one
		for _, dir := range []string{filepath.Dir(s.PFSPath), s.Roots["DW_JOB_STRIPED"]} {
			os.Chown(dir, int(other), int(gid))
		}
		s.UID = other
		return s
	})
	if pid := otherUID.proc.pid; pid == first.proc.pid || pid == otherGroups.proc.pid {
		t.Errorf("uid %d ran in pid %d, a worker of uid %d", other, pid, uid)
	}
	groups[uid] = []uint32{gid}
	again, _ := stageFile(t, limits, workerExe, nil)
	if again.proc.pid != first.proc.pid {
		t.Errorf("the first credential again ran in pid %d, not its idle worker %d", again.proc.pid, first.proc.pid)
	}
}

// A stage canceled or timed out kills its worker as before: it is never handed another stage.
func TestStoppedStagesWorkerIsNotReused(t *testing.T) {
	freshPool(t)
	for _, how := range []string{"canceled", "timed out"} {
		t.Run(how, func(t *testing.T) {
			a := newArea(t)
			src := filepath.Join(a.pfs, "huge")
			sparseFile(t, src, 64<<30)
			limits := poolLimits(30*time.Second, 10)
			if how == "timed out" {
				limits.Timeout = 500 * time.Millisecond
			}
			r := Start(context.Background(), workerExe, spec(a, "in", "file", src, "$DW_JOB_STRIPED/huge"), limits, nil)
			if how == "canceled" {
				time.Sleep(300 * time.Millisecond)
				r.Cancel()
			}
			st := r.Wait()
			if st.Status == "complete" {
				t.Fatalf("a 64 GiB stage completed: %+v", st)
			}
			gone(t, r.proc, 5*time.Second, "the worker of a "+how+" stage")
			if IdleWorkers() != 0 {
				t.Errorf("%d idle workers after a %s stage", IdleWorkers(), how)
			}
			next, _ := stageFile(t, limits, workerExe, nil)
			if next.proc == r.proc || !next.fresh {
				t.Errorf("the stage after a %s one was handed its worker (pid %d)", how, r.proc.pid)
			}
		})
	}
}

// An idle worker exits after stage.worker_idle_timeout, and one that served
// stage.worker_max_stages stages exits after the last.
func TestIdleWorkerExitsAfterItsTimeoutAndAfterItsStages(t *testing.T) {
	freshPool(t)
	r, _ := stageFile(t, poolLimits(300*time.Millisecond, 10), workerExe, nil)
	if IdleWorkers() != 1 {
		t.Fatalf("%d idle workers after a clean stage, want 1", IdleWorkers())
	}
	gone(t, r.proc, 10*time.Second, "a worker idle past its timeout of 300ms")
	if IdleWorkers() != 0 {
		t.Errorf("%d idle workers after the timeout", IdleWorkers())
	}
	if r.proc.waitErr != nil {
		t.Errorf("the idle worker told to go exited with %v, want status 0", r.proc.waitErr)
	}

	limits := poolLimits(30*time.Second, 2)
	one, _ := stageFile(t, limits, workerExe, nil)
	two, _ := stageFile(t, limits, workerExe, nil)
	if two.proc != one.proc {
		t.Fatalf("the second stage ran in another worker (%d, %d)", one.proc.pid, two.proc.pid)
	}
	gone(t, one.proc, 10*time.Second, "a worker that served stage.worker_max_stages = 2 stages")
	three, _ := stageFile(t, limits, workerExe, nil)
	if three.proc == one.proc || !three.fresh {
		t.Errorf("the third stage ran in the retired worker")
	}
}

// A worker killed while idle is not handed a stage: the next stage starts a fresh one, and
// completes.
func TestWorkerKilledWhileIdleIsNotHandedAStage(t *testing.T) {
	freshPool(t)
	limits := poolLimits(30*time.Second, 10)
	r, _ := stageFile(t, limits, workerExe, nil)
	if err := syscall.Kill(r.proc.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Until the kernel has it dead (a zombie, or reaped): what the agent can see.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.proc.pid))
		if err != nil || strings.Contains(string(status), "State:\tZ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("SIGKILL did not kill the idle worker")
		}
	}
	next, _ := stageFile(t, limits, workerExe, nil)
	if next.proc == r.proc || !next.fresh {
		t.Errorf("the killed worker (pid %d) was handed the next stage", r.proc.pid)
	}
}

// fakeSeqScript is a shell worker that speaks the numbered protocol for one stage without
// directories, then does what follows.
const fakeSeqScript = `read req; seq=$(echo "$req" | sed 's/.*"seq":\([0-9]*\).*/\1/')
echo '{"event":"plan","files":1,"bytes":9,"seq":'$seq'}'; read answer
`

// fakeSpec is a stage for the fake workers: no directories to hand over, run as the agent's
// own identity (a shell cannot take another's; the re-check finds root as root).
func fakeSpec(a area) (agentapi.StageSpec, Limits) {
	s := spec(a, "in", "file", "/etc/hostname", "$DW_JOB_STRIPED/x")
	s.Roots = nil
	s.UID, s.GID = uint32(os.Getuid()), uint32(os.Getgid())
	limits := poolLimits(30*time.Second, 10)
	limits.AllowRoot = true
	return s, limits
}

// A worker is not kept, or is killed, when it misbehaves around its result: a line while idle,
// error output, a line numbered for an earlier stage.
func TestMisbehavingWorkerIsNotReused(t *testing.T) {
	freshPool(t)
	a := newArea(t)
	s, limits := fakeSpec(a)
	done := `echo '{"event":"done","files":1,"bytes":9,"seq":'$seq',"more":true}'` + "\n"

	t.Run("talks while idle", func(t *testing.T) {
		exe := []string{"/bin/sh", "-c", fakeSeqScript + done + "sleep 0.3; echo hello; sleep 30"}
		r := Start(context.Background(), exe, s, limits, nil)
		if st := r.Wait(); st.Status != "complete" {
			t.Fatalf("%s %s", st.Status, st.Error)
		}
		gone(t, r.proc, 10*time.Second, "a worker that wrote a line while idle")
		if IdleWorkers() != 0 {
			t.Errorf("%d idle workers", IdleWorkers())
		}
	})
	t.Run("error output", func(t *testing.T) {
		exe := []string{"/bin/sh", "-c", fakeSeqScript + "echo 'something odd' >&2; sleep 0.2\n" + done + "sleep 30"}
		r := Start(context.Background(), exe, s, limits, nil)
		if st := r.Wait(); st.Status != "complete" {
			t.Fatalf("%s %s", st.Status, st.Error)
		}
		gone(t, r.proc, 10*time.Second, "a worker that wrote on stderr")
	})
	t.Run("a line of the stage before", func(t *testing.T) {
		exe := []string{"/bin/sh", "-c", fakeSeqScript + done +
			`read req2; echo '{"event":"plan","files":1,"bytes":9,"seq":'$seq'}'; sleep 30`}
		first := Start(context.Background(), exe, s, limits, nil)
		if st := first.Wait(); st.Status != "complete" {
			t.Fatalf("%s %s", st.Status, st.Error)
		}
		second := Start(context.Background(), exe, s, limits, nil)
		st := second.Wait()
		if second.proc != first.proc {
			t.Fatalf("the second stage did not run in the idle worker")
		}
		want := fmt.Sprintf("stage_in: the staging worker sent a line of stage %d during stage %d", first.seq, second.seq)
		if st.Status != "failed" || !strings.HasPrefix(st.Error, want) {
			t.Errorf("status %q error %q, want %q", st.Status, st.Error, want)
		}
		gone(t, first.proc, 10*time.Second, "a worker that sent a line of the stage before")
	})
}

// The agent checks an idle worker again before it hands it a stage: one that is traced (even
// by root) gets no directories. A traced main thread is seen when the worker is taken (the
// stage runs in a fresh worker); any other traced thread by the handoff's full check (the
// stage fails saying so, and the worker is killed).
func TestTracedIdleWorkerIsNotHandedAStage(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root: traces a non-dumpable worker")
	}
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("/usr/bin/python3 (the tracer) is not installed")
	}
	for _, thread := range []string{"main", "other"} {
		t.Run(thread, func(t *testing.T) {
			freshPool(t)
			limits := poolLimits(30*time.Second, 10)
			// A traced thread stops at the SIGTERM and waits for its tracer: it dies only
			// from the SIGKILL, and is reaped once the tracer goes.
			limits.CancelGrace = 300 * time.Millisecond
			r, _ := stageFile(t, limits, workerExe, nil)
			tid := r.proc.pid
			if thread == "other" {
				tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", r.proc.pid))
				for _, task := range tasks {
					if n, _ := strconv.Atoi(task.Name()); n != r.proc.pid {
						tid = n
					}
				}
				if tid == r.proc.pid {
					t.Fatal("the worker has one thread only")
				}
			}
			tracer := exec.Command(python, "-c", `
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
ok = libc.ptrace(0x4206, int(sys.argv[1]), None, None) == 0  # PTRACE_SEIZE
print("seized" if ok else "not seized: errno %d" % ctypes.get_errno(), flush=True)
sys.stdin.read()
`, strconv.Itoa(tid))
			stdin, _ := tracer.StdinPipe()
			stdout, _ := tracer.StdoutPipe()
			if err := tracer.Start(); err != nil {
				t.Fatal(err)
			}
			stopTracer := func() { stdin.Close(); tracer.Wait() }
			defer stopTracer()
			line := make([]byte, 64)
			n, _ := stdout.Read(line)
			if got := strings.TrimSpace(string(line[:n])); got != "seized" {
				t.Fatalf("the tracer: %q", got)
			}
			if thread == "main" {
				next, _ := stageFile(t, limits, workerExe, nil)
				if next.proc == r.proc || !next.fresh {
					t.Errorf("the traced worker (pid %d) was handed the next stage", r.proc.pid)
				}
			} else {
				a := newArea(t)
				src := filepath.Join(a.pfs, "in.dat")
				writeFile(t, src, "x", 0o644, past)
				r2 := Start(context.Background(), workerExe, spec(a, "in", "file", src, "$DW_JOB_STRIPED/in.dat"), limits, nil)
				st := r2.Wait()
				if r2.proc != r.proc {
					t.Fatalf("the stage did not go to the idle worker (pid %d), the test tests nothing", r.proc.pid)
				}
				want := fmt.Sprintf("thread %d) is traced by pid", tid)
				if st.Status != "failed" || !strings.Contains(st.Error, want) {
					t.Errorf("a stage given the worker with a traced thread: %s %q, want failed with %q", st.Status, st.Error, want)
				}
				if exists(filepath.Join(a.ns, "in.dat")) {
					t.Error("the stage wrote into its namespace")
				}
			}
			stopTracer() // the killed worker is the tracer's to reap first
			gone(t, r.proc, 10*time.Second, "a traced idle worker")
		})
	}
}

// The job's user cannot use their own idle worker to reach the directories of a stage: not
// those it served (closed), not the next one's (it is non-dumpable and untraceable, and
// checked again before the handoff).
func TestUserCannotReachAnIdleWorker(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root: the worker must run as another user than the agent")
	}
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("/usr/bin/python3 (the attacker) is not installed")
	}
	freshPool(t)
	limits := poolLimits(30*time.Second, 10)
	r, _ := stageFile(t, limits, workerExe, nil)
	out, err := reachAsStager(t, python, r.proc.pid)
	if err != nil {
		t.Fatalf("the attacker: %v %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "reached nothing" {
		t.Errorf("the job's user, attacking its idle stage worker: %s", got)
	}
	next, _ := stageFile(t, limits, workerExe, nil)
	if next.proc != r.proc {
		t.Errorf("the idle worker the user failed to reach was not reused (pid %d, then %d)", r.proc.pid, next.proc.pid)
	}
}

// An agent that runs as an ordinary user (a one-machine home) keeps its workers too. The test
// binary runs this test again as nobody.
func TestNonRootAgentReusesWorkers(t *testing.T) {
	if isRoot() {
		cmd := exec.Command(workerExe[0], "-test.run=^TestNonRootAgentReusesWorkers$", "-test.count=1", "-test.v")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
		cmd.Dir = "/"
		cmd.Env = append(asuser.Env, "TMPDIR=/tmp")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestNonRootAgentReusesWorkers") {
			t.Fatalf("as nobody: %v\n%s", err, out)
		}
		return
	}
	freshPool(t)
	limits := poolLimits(30*time.Second, 10)
	one, _ := stageFile(t, limits, workerExe, nil)
	two, _ := stageFile(t, limits, workerExe, nil)
	if two.proc != one.proc {
		t.Errorf("as uid %d: the second stage ran in pid %d, the first in %d", os.Getuid(), two.proc.pid, one.proc.pid)
	}
	if one.proc.served != 2 {
		t.Errorf("the worker served %d stages", one.proc.served)
	}
}

// A worker that kept a directory (or a file) open after its stage (it said it had closed
// them) is not handed the next one; the same worker without it is.
func TestWorkerHoldingADirectoryIsNotReused(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root: the agent reads the worker's descriptors")
	}
	freshPool(t)
	a := newArea(t)
	s, limits := fakeSpec(a)
	serve := `while read req; do seq=$(echo "$req" | sed 's/.*"seq":\([0-9]*\).*/\1/')
echo '{"event":"plan","files":1,"bytes":9,"seq":'$seq'}'; read answer
echo '{"event":"done","files":1,"bytes":9,"seq":'$seq',"more":true}'; done`
	for _, c := range []struct {
		name, script string
		reused       bool
	}{
		{"closes its directories", serve, true},
		{"keeps one open", "exec 5</\n" + serve, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			exe := []string{"/bin/sh", "-c", c.script}
			first := Start(context.Background(), exe, s, limits, nil)
			if st := first.Wait(); st.Status != "complete" {
				t.Fatalf("%s %s", st.Status, st.Error)
			}
			second := Start(context.Background(), exe, s, limits, nil)
			if st := second.Wait(); st.Status != "complete" {
				t.Fatalf("%s %s", st.Status, st.Error)
			}
			if reused := second.proc == first.proc; reused != c.reused {
				t.Errorf("the second stage ran in the first one's worker: %v, want %v", reused, c.reused)
			}
		})
	}
}
