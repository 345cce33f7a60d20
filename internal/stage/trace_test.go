package stage

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/privdrop"
)

// traceAttacker is what a job's user runs to take over a staging worker before it protects
// itself: it watches the newest pids and PTRACE_SEIZEs each as soon as it can, from its exec
// on. A worker it seizes is its to rewrite (its prctl, its code) and later to read the
// instance's directories from. It runs as the user, in this test binary ("trace-attacker"
// in TestMain), until stdin closes, and then prints "seen N" (stage workers it watched) and
// "won M" (stage workers it seized) and the pids it won.
func traceAttacker() int {
	runtime.LockOSThread() // a tracee belongs to the thread that seized it
	stop := make(chan struct{})
	go func() {
		bufio.NewReader(os.Stdin).ReadString('\n')
		close(stop)
	}()
	seen, won := map[int]bool{}, map[int]bool{}
	selfPid := os.Getpid()
	// workerOf is the stage worker process that the thread pid belongs to (0: none). Only
	// this test binary's workers are attacked: the other processes of the user, other
	// packages' tests among them, must not be stopped by the attacker.
	self, _ := os.Executable()
	workerOf := func(pid int) int {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if !bytes.HasPrefix(b, []byte(self+"\x00stage-worker")) {
			return 0
		}
		status, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		tgid, _ := strconv.Atoi(privdrop.StatusField(string(status), "Tgid"))
		return tgid
	}
	for {
		select {
		case <-stop:
			fmt.Printf("seen %d\nwon %d\n", len(seen), len(won))
			for pid := range won {
				fmt.Printf("won worker %d\n", pid)
			}
			return 0
		default:
		}
		b, err := os.ReadFile("/proc/sys/kernel/ns_last_pid")
		if err != nil {
			fmt.Println("cannot read ns_last_pid:", err)
			return 1
		}
		last, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		for pid := last - 24; pid <= last+2; pid++ {
			if pid <= 1 || pid == selfPid {
				continue
			}
			w := workerOf(pid)
			if w == 0 {
				continue
			}
			err := unix.PtraceSeize(pid)
			if err == nil {
				// Seized: stop it (where a real attacker would rewrite it) and let it go, so
				// that its exit still reaches its parent.
				won[w] = true
				unix.PtraceInterrupt(pid)
				var ws unix.WaitStatus
				unix.Wait4(pid, &ws, unix.WALL, nil)
				unix.PtraceDetach(pid)
				continue
			}
			if err == unix.EPERM {
				seen[w] = true
			}
		}
	}
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
	var seen, won int
	fmt.Sscanf(between(report, "seen ", "\n"), "%d", &seen)
	fmt.Sscanf(between(report, "won ", "\n"), "%d", &won)
	if won != 0 {
		t.Errorf("the job's user seized %d of %d stage workers:\n%s", won, stages, report)
	}
	if seen == 0 && won == 0 {
		t.Errorf("the attacker never saw a stage worker, so this test proves nothing:\n%s", report)
	}
	t.Logf("the attacker watched %d stage workers and seized %d", seen, won)
}

