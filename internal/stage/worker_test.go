package stage

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/asuser"
	"golang.org/x/sys/unix"
)

// workerProcess is the worker driven by hand, so a test can act between plan and go.
type workerProcess struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events *bufio.Scanner
}

func startWorker(t *testing.T, s agentapi.StageSpec, asStager bool) *workerProcess {
	t.Helper()
	cmd := exec.Command(workerExe[0], workerExe[1:]...)
	cmd.Env = asuser.Env
	if asStager && isRoot() {
		uid, gid := stageIdentity()
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{gid}}}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, _ := json.Marshal(workerRequest{StageSpec: s, Limits: &Limits{ProgressInterval: 10_000_000}})
	if _, err := stdin.Write(append(line, '\n')); err != nil {
		t.Fatal(err)
	}
	return &workerProcess{cmd: cmd, stdin: stdin, events: bufio.NewScanner(stdout)}
}

func (w *workerProcess) next(t *testing.T) event {
	t.Helper()
	if !w.events.Scan() {
		t.Fatalf("worker output ended: %v", w.events.Err())
	}
	var ev event
	if err := json.Unmarshal(w.events.Bytes(), &ev); err != nil {
		t.Fatalf("worker sent %q: %v", w.events.Text(), err)
	}
	return ev
}

// finish reads the remaining events and the exit status.
func (w *workerProcess) finish(t *testing.T) (last event, status int) {
	t.Helper()
	for w.events.Scan() {
		if err := json.Unmarshal(w.events.Bytes(), &last); err != nil {
			t.Fatalf("worker sent %q: %v", w.events.Text(), err)
		}
	}
	err := w.cmd.Wait()
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		return last, exitErr.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return last, 0
}

func (w *workerProcess) answer(t *testing.T, d decision) {
	t.Helper()
	line, _ := json.Marshal(d)
	if _, err := w.stdin.Write(append(line, '\n')); err != nil {
		t.Fatal(err)
	}
}

func TestWorkerExitStatusAgreesWithItsLastEvent(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "f")
	writeFile(t, src, "12345", 0o644, past)

	cases := []struct {
		name       string
		spec       agentapi.StageSpec
		act        func(t *testing.T, w *workerProcess)
		wantEvent  string
		wantStatus int
		wantError  string
	}{
		{"go", spec(a, "in", "file", src, "$DW_JOB_STRIPED/ok"), func(t *testing.T, w *workerProcess) {
			if ev := w.next(t); ev.Event != eventPlan || ev.Files != 1 || ev.Bytes != 5 {
				t.Errorf("plan %+v", ev)
			}
			w.answer(t, decision{Go: true})
		}, eventDone, 0, ""},
		{"refuse", spec(a, "in", "file", src, "$DW_JOB_STRIPED/refused"), func(t *testing.T, w *workerProcess) {
			w.next(t)
			w.answer(t, decision{Refuse: "pool is full"})
		}, eventFailed, 1, "stage_in: not started: pool is full"},
		{"agent gone before answering", spec(a, "in", "file", src, "$DW_JOB_STRIPED/gone"), func(t *testing.T, w *workerProcess) {
			w.next(t)
			w.stdin.Close()
		}, eventFailed, 1, "stage_in: no answer from the agent to the plan: end of input"},
		{"missing source", spec(a, "in", "file", src+"-missing", "$DW_JOB_STRIPED/m"), func(t *testing.T, w *workerProcess) {}, eventFailed, 1, "stage_in: source " + src + "-missing does not exist"},
		{"neither go nor refuse", spec(a, "in", "file", src, "$DW_JOB_STRIPED/x"), func(t *testing.T, w *workerProcess) {
			w.next(t)
			w.answer(t, decision{})
		}, eventFailed, 1, `stage_in: the agent answered the plan with neither "go" nor "refuse"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := startWorker(t, c.spec, true)
			c.act(t, w)
			last, status := w.finish(t)
			if last.Event != c.wantEvent || status != c.wantStatus || last.Error != c.wantError {
				t.Errorf("last event %+v, exit status %d; want %s %q and status %d", last, status, c.wantEvent, c.wantError, c.wantStatus)
			}
		})
	}
	if readFile(t, filepath.Join(a.ns, "ok")) != "12345" {
		t.Error("the accepted stage did not copy")
	}
	for _, name := range []string{"refused", "gone", "m", "x"} {
		if exists(filepath.Join(a.ns, name)) {
			t.Errorf("%s was written by a stage that did not go", name)
		}
	}
}

func TestWorkerFailsWhenTheSourceGrowsAfterThePlan(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "growing")
	writeFile(t, src, "1234", 0o644, past)
	w := startWorker(t, spec(a, "in", "file", src, "$DW_JOB_STRIPED/growing"), true)
	if ev := w.next(t); ev.Bytes != 4 {
		t.Fatalf("plan %+v", ev)
	}
	f, err := os.OpenFile(src, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("5678")
	f.Close()
	w.answer(t, decision{Go: true})
	last, status := w.finish(t)
	if status == 0 || !strings.Contains(last.Error, "source "+src+" grew after the plan (4 bytes planned, 8 now); the capacity reserved for the stage would be exceeded") {
		t.Errorf("last event %+v, status %d", last, status)
	}
	if exists(filepath.Join(a.ns, "growing")) {
		t.Error("a file larger than reserved was written")
	}
}

// A link planted between the plan and the copy (another job on a persistent buffer) must not
// lead the copy out of the instance: the copy itself is confined, not just the plan.
func TestWorkerStaysConfinedWhenLinksAppearAfterThePlan(t *testing.T) {
	a := newArea(t)
	tree := filepath.Join(a.pfs, "tree")
	mkdir(t, filepath.Join(tree, "sub"), 0o755)
	writeFile(t, filepath.Join(tree, "sub/f"), "payload", 0o644, past)
	mkdir(t, filepath.Join(a.ns, "dst"), 0o755)

	w := startWorker(t, spec(a, "in", "directory", tree, "$DW_JOB_STRIPED/dst"), true)
	w.next(t) // plan
	if err := os.Remove(filepath.Join(a.ns, "dst")); err != nil {
		t.Fatal(err)
	}
	symlink(t, a.outside, filepath.Join(a.ns, "dst"))
	w.answer(t, decision{Go: true})
	last, status := w.finish(t)
	if status == 0 || !strings.Contains(last.Error, "$DW_JOB_STRIPED/dst/sub: leads outside the instance") {
		t.Errorf("last event %+v, status %d", last, status)
	}
	emptyDir(t, a.outside)
}

func TestWorkerRefusesToActForAnotherUser(t *testing.T) {
	a := newArea(t)
	s := spec(a, "in", "file", "/etc/hostname", "$DW_JOB_STRIPED/x")
	s.UID = uint32(os.Getuid()) + 1
	w := startWorker(t, s, false) // runs as the test's own uid, not s.UID
	last, status := w.finish(t)
	want := fmt.Sprintf("stage_in: the staging worker runs as uid %d (effective %d) but the stage is for uid %d; refusing to stage on another user's behalf", os.Getuid(), os.Geteuid(), s.UID)
	if status != 1 || last.Error != want {
		t.Errorf("last event %+v, status %d", last, status)
	}
}

// fakeWorker runs a shell script as the worker, to see what the launcher does with a worker
// that misbehaves, and what a worker process is given.
func fakeWorker(t *testing.T, a area, script string, limits Limits) agentapi.StageStatus {
	t.Helper()
	r := Start(context.Background(), []string{"/bin/sh", "-c", script}, spec(a, "in", "file", "/etc/hostname", "$DW_JOB_STRIPED/x"), limits, nil)
	return r.Wait()
}

func TestLauncherEnforcesTheProtocol(t *testing.T) {
	a := newArea(t)
	plan := `echo '{"event":"plan","files":1,"bytes":9}'; read answer; `
	cases := []struct {
		name, script, want string
	}{
		{"line too long", `head -c 100000 /dev/zero | tr '\0' a; echo; sleep 30`, "stage_in: the staging worker sent a line longer than 65536 bytes (limit stage.worker_output_limit)"},
		{"not JSON", `echo hello; sleep 30`, "stage_in: the staging worker sent a line that is not a JSON event"},
		{"progress before plan", `echo '{"event":"progress","files":1,"bytes":1}'; sleep 30`, `stage_in: the staging worker sent an unexpected "progress" event`},
		{"no result", plan + `exit 0`, "stage_in: the staging worker exited with status 0 without reporting a result"},
		{"crash", plan + `echo 'panic: something broke' >&2; exit 2`, "stage_in: the staging worker exited with status 2 without reporting a result; its error output: panic: something broke"},
		{"done then failure", plan + `echo '{"event":"done","files":1,"bytes":9}'; exit 3`, "stage_in: the staging worker reported success but then exited with status 3"},
		{"failed then success", plan + `echo '{"event":"failed","error":"stage_in: it broke"}'; exit 0`, "stage_in: it broke (the staging worker then exited with status 0)"},
		{"no worker", `exec /nonexistent/worker`, "stage_in: the staging worker exited with status 127 without reporting a result"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := fakeWorker(t, a, c.script, testLimits())
			if st.Status != "failed" || !strings.HasPrefix(st.Error, c.want) {
				t.Errorf("status %q error %q\nwant prefix %q", st.Status, st.Error, c.want)
			}
		})
	}
}

func TestWorkerGetsTheUserIdentityAndNothingElse(t *testing.T) {
	a := newArea(t)
	t.Setenv("SPILLWAY_AGENT_SECRET", "hunter2")
	// An inheritable descriptor, as an agent started by a careless parent would hold.
	leak, err := unix.Dup(1)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(leak)
	// The real worker's way to the user's identity (identity.go), then a shell that reports
	// what it was given.
	probe := []string{workerExe[0], "stage-worker-probe", "/bin/sh", "-c", `echo "ids=$(id -u):$(id -g):$(id -G | tr ' ' ,)" >&2; open=; for n in $(seq 0 1023); do [ -e /proc/$$/fd/$n ] && open="$open$n "; done; echo "fds=$open" >&2; echo "fd3=$(readlink /proc/$$/fd/3)" >&2; echo "cwd=$(pwd)" >&2; env >&2; exit 1`}
	r := Start(context.Background(), probe, spec(a, "in", "file", "/etc/hostname", "$DW_JOB_STRIPED/x"), testLimits(), nil)
	st := r.Wait()
	uid, gid := stageIdentity()
	wantGroups := []string{fmt.Sprint(gid)}
	if !isRoot() {
		groups, _ := os.Getgroups()
		wantGroups = nil
		for _, g := range groups {
			wantGroups = append(wantGroups, fmt.Sprint(g))
		}
		if len(wantGroups) == 0 {
			wantGroups = []string{fmt.Sprint(gid)}
		}
	}
	out := st.Error
	idLine := between(out, "ids=", "\n")
	parts := strings.Split(idLine, ":")
	if len(parts) != 3 || parts[0] != fmt.Sprint(uid) || parts[1] != fmt.Sprint(gid) {
		t.Errorf("worker identity %q, want uid %d gid %d", idLine, uid, gid)
	} else {
		got := strings.Split(parts[2], ",")
		slices.Sort(got)
		slices.Sort(wantGroups)
		if !slices.Equal(got, wantGroups) {
			t.Errorf("worker groups %v, want %v (the user's, not the agent's)", got, wantGroups)
		}
	}
	// Outside a redirection or a glob the shell holds no descriptor of its own: these are
	// inherited. Besides 0, 1 and 2, the worker holds the socket it asks for its namespace on
	// (fd 3), never the namespace itself (handoff.go).
	fds := strings.Fields(between(out, "fds=", "\n"))
	slices.Sort(fds)
	if !slices.Equal(fds, []string{"0", "1", "2", "3"}) {
		t.Errorf("worker holds descriptors %v, want only 0, 1, 2 and its handoff socket (3)", fds)
	}
	if fd3 := between(out, "fd3=", "\n"); !strings.HasPrefix(fd3, "socket:[") {
		t.Errorf("descriptor 3 of the worker is %q, want the handoff socket (not the namespace %s)", fd3, a.ns)
	}
	if cwd := between(out, "cwd=", "\n"); cwd != "/" {
		t.Errorf("worker runs in %q, want /", cwd)
	}
	if strings.Contains(out, "hunter2") || strings.Contains(out, "HOME=") {
		t.Errorf("the agent's environment reached the worker: %q", out)
	}
}

func between(s, start, end string) string {
	i := strings.Index(s, start)
	if i < 0 {
		return ""
	}
	s = s[i+len(start):]
	if j := strings.Index(s, end); j >= 0 {
		return s[:j]
	}
	return s
}

func TestUserGroupsComeFromTheUserDatabase(t *testing.T) {
	out, err := exec.Command("id", "-G", "nobody").Output()
	if err != nil {
		t.Skip("no user nobody here:", err)
	}
	var want []uint32
	for _, f := range strings.Fields(string(out)) {
		var n uint32
		fmt.Sscan(f, &n)
		want = append(want, n)
	}
	got, err := userGroups(65534, 65534)
	slices.Sort(got)
	slices.Sort(want)
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("userGroups(nobody) = %v %v, want %v as id -G says", got, err, want)
	}
	if _, err := userGroups(3999999, 1); err == nil || !strings.Contains(err.Error(), "cannot find the groups of uid 3999999") {
		t.Errorf("unknown uid: %v", err)
	}
}

// copyData never writes more than the plan allows, whatever the source holds by then. From
// ext4 to ext4 the kernel copies (copy_file_range); from tmpfs (/dev/shm) to ext4 it refuses
// (EXDEV) and the buffered path runs: both must agree.
func TestCopyDataStopsAtThePlannedSize(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "dst")
	sources := map[string]string{"same file system": t.TempDir()}
	if shm, err := os.MkdirTemp("/dev/shm", "stage-test-"); err == nil {
		defer os.RemoveAll(shm)
		sources["across file systems"] = shm
	} else {
		t.Log("no /dev/shm: the buffered path is not exercised:", err)
	}
	w := &worker{limits: Limits{ChunkBytes: 3}}
	for name, dir := range sources {
		src := filepath.Join(dir, "src")
		if err := os.WriteFile(src, []byte("0123456789"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			limit   int64
			grew    bool
			written string
		}{{10, false, "0123456789"}, {20, false, "0123456789"}, {4, true, "0123"}, {0, true, ""}} {
			in, _ := os.Open(src)
			out, _ := os.Create(dst)
			buf := make([]byte, 2)
			err := w.copyData(context.Background(), int(out.Fd()), int(in.Fd()), c.limit, &buf)
			in.Close()
			out.Close()
			if errors.Is(err, errGrewBeyondPlan) != c.grew || (!c.grew && err != nil) {
				t.Errorf("%s, limit %d: err %v, want grew=%v", name, c.limit, err, c.grew)
			}
			if got := readFile(t, dst); got != c.written {
				t.Errorf("%s, limit %d: wrote %q, want %q", name, c.limit, got, c.written)
			}
		}
	}
}

// An agent that dies closes the worker's stdin: the worker stops, removes its partial file and
// says so, rather than copying on for nobody.
func TestWorkerStopsWhenItsStdinEnds(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "huge")
	sparseFile(t, src, 64<<30)
	w := startWorker(t, spec(a, "in", "file", src, "$DW_JOB_STRIPED/huge"), true)
	w.next(t) // plan
	w.answer(t, decision{Go: true})
	if ev := w.next(t); ev.Event != eventProgress || ev.Bytes == 0 {
		t.Fatalf("expected progress, got %+v", ev)
	}
	w.stdin.Close()
	last, status := w.finish(t)
	if status != 1 || last.Event != eventFailed || last.Error != "stage_in: canceled" {
		t.Errorf("last event %+v, exit status %d", last, status)
	}
	if exists(filepath.Join(a.ns, "huge")) {
		t.Error("the partial file was left behind")
	}
}

func TestWorkerWaitingForAnAnswerStopsOnSIGTERM(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "f")
	writeFile(t, src, "x", 0o644, past)
	w := startWorker(t, spec(a, "in", "file", src, "$DW_JOB_STRIPED/f"), true)
	w.next(t) // plan; the stdin stays open and unanswered
	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	last, status := w.finish(t)
	if status != 1 || last.Error != "stage_in: canceled" {
		t.Errorf("last event %+v, exit status %d", last, status)
	}
}

// While a worker holds the instance's directories, the job's user (the worker's own uid)
// cannot reach them through the worker: /proc/<pid>/fd, cwd, root and mem are refused, and
// so is ptrace. (The old worker inherited the namespace as fd 3 and stayed dumpable: the
// user opened /proc/<pid>/fd/3 and wrote past the capacity, or into a loadbalance instance.)
func TestUserCannotReachTheWorkersDirectories(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root: the worker must run as another user than the agent")
	}
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("/usr/bin/python3 (the attacker) is not installed")
	}
	a := newArea(t)
	src := filepath.Join(a.pfs, "in.dat")
	writeFile(t, src, strings.Repeat("x", 4096), 0o644, time.Now())
	planned := make(chan struct{})
	release := make(chan struct{})
	r := Start(context.Background(), workerExe, spec(a, "in", "file", src, "$DW_JOB_STRIPED/in.dat"), testLimits(), func(uint64) error {
		close(planned) // the worker holds its directories now, and waits for the answer
		<-release
		return nil
	})
	select {
	case <-planned:
	case <-r.Done():
		t.Fatalf("the stage ended before its plan: %+v", r.Status())
	}
	pid := r.proc.pid
	out, err := reachAsStager(t, python, pid)
	close(release)
	if err != nil {
		t.Fatalf("the attacker: %v %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "reached nothing" {
		t.Errorf("the job's user, attacking its stage worker: %s", got)
	}
	if st := r.Wait(); st.Status != "complete" {
		t.Errorf("the stage after the attack: %+v", st)
	}
	if got := readFile(t, filepath.Join(a.ns, "in.dat")); len(got) != 4096 {
		t.Errorf("staged file has %d bytes, want 4096", len(got))
	}
}

// reachScript is what the job's user tries against a worker process (argv[1]): its
// descriptors, cwd, root, memory, and ptrace.
const reachScript = `
import ctypes, os, sys
pid = sys.argv[1]
got = []
def attempt(what, fn):
    try:
        fn()
        got.append(what)
    except OSError:
        pass
attempt("list fds", lambda: os.listdir("/proc/%s/fd" % pid))
for n in range(3, 16):
    attempt("open fd %d" % n, lambda n=n: os.close(os.open("/proc/%s/fd/%d" % (pid, n), os.O_RDONLY | os.O_DIRECTORY)))
attempt("cwd", lambda: os.listdir("/proc/%s/cwd" % pid))
attempt("root", lambda: os.readlink("/proc/%s/root" % pid))
attempt("mem", lambda: os.close(os.open("/proc/%s/mem" % pid, os.O_RDONLY)))
libc = ctypes.CDLL(None, use_errno=True)
if libc.ptrace(16, int(pid), None, None) == 0:  # PTRACE_ATTACH
    got.append("ptrace")
print("reached: " + ", ".join(got) if got else "reached nothing")
`

// reachAsStager runs reachScript as the staging user against the worker pid.
func reachAsStager(t *testing.T, python string, pid int) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(python, "-c", reachScript, fmt.Sprint(pid))
	uid, gid := stageIdentity()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	cmd.Dir = "/"
	return cmd.CombinedOutput()
}
