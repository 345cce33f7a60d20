package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// started is a command running in the background.
type started struct {
	cmd  *exec.Cmd
	out  *bytes.Buffer
	errb *bytes.Buffer
	done chan struct{}
}

func (w *world) start(env []string, args ...string) *started {
	w.t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Dir = w.root
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=" + w.home, "SPILLWAY_HOME=" + w.home}, env...)
	if w.asUser {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID}}
	}
	s := &started{cmd: cmd, out: &bytes.Buffer{}, errb: &bytes.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = s.out, s.errb
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	go func() { cmd.Wait(); close(s.done) }()
	return s
}

func (s *started) wait(t *testing.T) result {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(2 * time.Minute):
		s.cmd.Process.Kill()
		<-s.done
		t.Fatalf("%s did not finish:\n%s\n%s", strings.Join(s.cmd.Args, " "), s.out, s.errb)
	}
	return result{code: s.cmd.ProcessState.ExitCode(), stdout: s.out.String(), stderr: s.errb.String()}
}

// runEnv runs spillway in the world with extra environment.
func (w *world) runEnv(env []string, args ...string) result {
	w.t.Helper()
	return spillway(w.t, cmdOpts{home: w.home, asUser: w.asUser, dir: w.root, env: env}, args...)
}

// shell runs a command line as the world's user, as a user would paste it.
func (w *world) shell(line string) result {
	w.t.Helper()
	return runAs(w.t, "/bin/sh", cmdOpts{home: w.home, asUser: w.asUser, dir: w.root}, "-c", line)
}

// waitFor polls cond until it holds (a generous deadline: this is not a timing test).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitNoSessions waits until the home holds no session.
func (w *world) waitNoSessions() {
	w.t.Helper()
	waitFor(w.t, "every session to be gone", func() bool {
		r := w.run("dwstat", "--json", "sessions")
		return r.code == 0 && strings.Contains(r.stdout, `"sessions": []`)
	})
}

// sessionCount is how many sessions dwstat lists.
func (w *world) sessionCount() int {
	r := w.run("dwstat", "--json", "sessions")
	return strings.Count(r.stdout, `"token"`)
}

// pfsDir makes a directory under the PFS owned by the world's user.
func (w *world) pfsDir(rel string) string {
	p := filepath.Join(w.pfs, rel)
	os.MkdirAll(p, 0o755)
	if w.asUser {
		os.Chown(p, nobodyUID, nobodyGID)
	}
	return p
}

func processAlive(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

// TestRunKilledInEveryPhaseIsCleanedUp: a `spillway run` killed with SIGKILL at each phase of
// its job leaves nothing behind for good: the next run on the home reports the cleanup, what
// is left of the job is killed, a job that had started still gets its stage-out, and in the
// end no session, fragment or mount remains. As an ordinary user.
func TestRunKilledInEveryPhaseIsCleanedUp(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	w.file("in.txt", "input\n", 0o644)
	out := w.pfsDir("out")
	flags := w.pfsDir("flags")
	next := w.script("next.sh", "#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\necho next ran\n")
	for i, point := range []string{"setup", "data_in", "pre_run", "job", "post_run", "data_out", "teardown"} {
		t.Run(point, func(t *testing.T) {
			marker := filepath.Join(flags, "ran-"+point)
			pidFile := filepath.Join(flags, "pid-"+point)
			body := fmt.Sprintf(`#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_in type=file source=%s/in.txt destination=$DW_JOB_STRIPED/in.txt
#DW stage_out type=file source=$DW_JOB_STRIPED/result destination=%s/%s.%%j
tr a-z A-Z < "$DW_JOB_STRIPED/in.txt" > "$DW_JOB_STRIPED/result"
touch %s || exit 5
`, w.pfs, out, point, marker)
			var env []string
			if point == "job" {
				// Killed by its own job, which then goes on running: the cleanup must stop it.
				body += fmt.Sprintf("echo $$ > %s\nkill -KILL $PPID\nsleep 300\n", pidFile)
			} else {
				env = []string{"SPILLWAY_TEST_SIGNAL=" + point + ":KILL"}
			}
			script := w.script("killed-"+point+".sh", body)
			r := w.runEnv(env, "run", script)
			if r.code != -1 {
				t.Fatalf("the run must die of SIGKILL at %s: %s", point, r)
			}
			token := fmt.Sprintf("run%d", 2*i+1)
			r = w.run("run", next)
			if r.code != 0 || !strings.Contains(r.stdout, "next ran") {
				t.Fatalf("the next run must work: %s", r)
			}
			mustContain(t, r, "session "+token)
			w.waitNoSessions()
			staged := filepath.Join(out, fmt.Sprintf("%s.%d", point, 2*i+1))
			got, err := os.ReadFile(staged)
			switch point {
			case "setup", "data_in", "pre_run":
				if _, err := os.Stat(marker); err == nil {
					t.Error("the job ran although its run was killed before it")
				}
				if err == nil {
					t.Error("a job that never ran was staged out")
				}
				mustContain(t, r, "its job had not started; its burst buffer was released")
			case "job", "post_run", "data_out":
				// The job ran: its results must be staged out, by the cleanup if need be.
				waitFor(t, "the stage-out of "+token, func() bool {
					got, err = os.ReadFile(staged)
					return err == nil
				})
				if string(got) != "INPUT\n" {
					t.Errorf("staged-out result %q", got)
				}
			}
			if point == "job" {
				pid, _ := strconv.Atoi(strings.TrimSpace(string(must(os.ReadFile(pidFile)))))
				waitFor(t, "the orphaned job to be killed", func() bool { return !processAlive(pid) })
				mustContain(t, r, "what was left of its job")
			}
			w.assertClean()
		})
	}
	// Every cleanup was reported once; nothing is left to report.
	if r := w.run("run", next); strings.Contains(r.stderr, "cleaned up") || strings.Contains(r.stderr, "cleaning up") {
		t.Errorf("cleanups must be reported once: %s", r)
	}
	if entries, _ := os.ReadDir(filepath.Join(w.home, "runs")); len(entries) > 1 { // .lock
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("run records left: %v", names)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// TestInterruptsInEveryPhase: SIGINT/SIGTERM/SIGHUP are handled before, during and after the
// job: the first before the job releases the buffer without running it; during the job it
// reaches the job, whose stage-out still runs; a second one hurries; a third leaves, and the
// home's server finishes the cleanup.
func TestInterruptsInEveryPhase(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	w.file("in.txt", "input\n", 0o644)
	out := w.pfsDir("out")
	job := func(name, body string) string {
		return w.script(name, fmt.Sprintf(`#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_in type=file source=%s/in.txt destination=$DW_JOB_STRIPED/in.txt
#DW stage_out type=file source=$DW_JOB_STRIPED/result destination=%s/%s.%%j
%s
`, w.pfs, out, strings.TrimSuffix(name, ".sh"), body))
	}

	t.Run("TERM during data_in", func(t *testing.T) {
		marker := filepath.Join(w.pfsDir("flags"), "ran-data-in")
		r := w.runEnv([]string{"SPILLWAY_TEST_SIGNAL=data_in:TERM"}, "run", job("a.sh", "touch "+marker))
		if r.code != 128+15 {
			t.Fatalf("want 143: %s", r)
		}
		mustContain(t, r, "SIGTERM before the job started: the job will not run", "data_in", "interrupted", "instance released (hurry)")
		if _, err := os.Stat(marker); err == nil {
			t.Error("the job ran")
		}
		w.assertClean()
	})

	t.Run("HUP during the job", func(t *testing.T) {
		// The terminal closes while the job runs: the job gets SIGHUP, and its results are
		// still staged out.
		// Everything after the kill is parsed before it: bash 5.2 reports "unexpected EOF while
		// looking for matching )" when a trapped signal lands while it parses a $(...) (seen
		// once in CI on a loaded machine).
		r := w.run("run", job("b.sh", `trap 'echo saved > "$DW_JOB_STRIPED/result"; exit 3' HUP
wait_for_hup() {
	kill -HUP $PPID
	for ((i = 0; i < 600; i++)); do sleep 0.1; done
	exit 9
}
sleep 300 &
wait_for_hup`))
		if r.code != 3 {
			t.Fatalf("the job's own status (3) must pass through: %s", r)
		}
		mustContain(t, r, "SIGHUP passed to the job; its stage-out still runs", "data_out", "instance released")
		if got, err := os.ReadFile(filepath.Join(out, "b.2")); err != nil || string(got) != "saved\n" {
			t.Errorf("the interrupted job's results must be staged out: %q %v", got, err)
		}
		w.assertClean()
	})

	t.Run("TERM twice during the job", func(t *testing.T) {
		r := w.runEnv([]string{"SPILLWAY_TEST_SIGNAL=job:TERM+TERM"}, "run", job("c.sh", `trap '' TERM
echo partial > "$DW_JOB_STRIPED/result"
sleep 300`))
		if r.code != 128+9 && r.code != 128+15 {
			t.Fatalf("the job must be stopped (143 or 137): %s", r)
		}
		mustContain(t, r, "SIGTERM again: hurrying: the job is killed, its stage-out skipped", "instance released (hurry)")
		if _, err := os.Stat(filepath.Join(out, "c.3")); err == nil {
			t.Error("a hurried job was staged out")
		}
		w.assertClean()
	})

	t.Run("TERM once during data_out", func(t *testing.T) {
		r := w.runEnv([]string{"SPILLWAY_TEST_SIGNAL=data_out:TERM"}, "run", job("d.sh", `tr a-z A-Z < "$DW_JOB_STRIPED/in.txt" > "$DW_JOB_STRIPED/result"`))
		if r.code != 0 {
			t.Fatalf("one interrupt lets the stage-out finish: %s", r)
		}
		mustContain(t, r, "SIGTERM: the stage-out goes on")
		if got, _ := os.ReadFile(filepath.Join(out, "d.4")); string(got) != "INPUT\n" {
			t.Errorf("staged-out result %q", got)
		}
		w.assertClean()
	})

	t.Run("INT twice during data_out", func(t *testing.T) {
		r := w.runEnv([]string{"SPILLWAY_TEST_SIGNAL=data_out:INT+INT"}, "run", job("e.sh", `echo x > "$DW_JOB_STRIPED/result"`))
		if r.code != 128+2 {
			t.Fatalf("want 130: %s", r)
		}
		mustContain(t, r, "SIGINT again: hurrying: the stage-out is cancelled", "instance released (hurry)")
		w.assertClean()
	})

	t.Run("twice before the job: leave", func(t *testing.T) {
		r := w.runEnv([]string{"SPILLWAY_TEST_SIGNAL=setup:TERM+TERM"}, "run", job("f.sh", "true"))
		if r.code != 128+15 {
			t.Fatalf("want 143: %s", r)
		}
		mustContain(t, r, "SIGTERM again: leaving without waiting; the home's server cleans session run6 up")
		// Nobody else runs anything: the home's server cleans up on its own.
		w.waitNoSessions()
		w.assertClean()
		mustContain(t, w.run("run", job("g.sh", "true")), "session run6", "its job had not started")
	})
}

// printed returns the command a run printed after prefix.
func printed(t *testing.T, r result, prefix string) string {
	t.Helper()
	m := regexp.MustCompile(regexp.QuoteMeta(prefix) + ` *(.+)`).FindStringSubmatch(r.stderr)
	if m == nil {
		t.Fatalf("no %q line: %s", prefix, r)
	}
	return strings.TrimSpace(m[1])
}

// TestFailedStageOutKeepsTheResults: when the stage-out fails, the session (the only copy of
// the results) is kept, and the printed commands work: the retry stages out once the cause is
// fixed, the discard command releases it. --discard-failed-stage-out releases it at once.
func TestFailedStageOutKeepsTheResults(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	locked := filepath.Join(w.pfs, "locked")
	os.MkdirAll(locked, 0o755) // root's: nobody cannot write into it
	script := w.script("out.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_out type=file source=$DW_JOB_STRIPED/result destination=`+locked+`/result.%j
echo precious > "$DW_JOB_STRIPED/result"
`)
	r := w.run("run", script)
	if r.code != 74 {
		t.Fatalf("want 74: %s", r)
	}
	mustContain(t, r, "data_out", "FAILED", "keeping session run1")
	if strings.Contains(r.stderr, "teardown") {
		t.Errorf("the session must not be torn down: %s", r)
	}
	if n := w.sessionCount(); n != 1 {
		t.Fatalf("the session must be kept, dwstat shows %d", n)
	}
	retry := printed(t, r, "retry the stage-out once the cause is fixed:")
	// The cause is fixed; the printed command, as printed, stages out and releases.
	os.Chown(locked, nobodyUID, nobodyGID)
	if r := w.shell(retry); r.code != 0 {
		t.Fatalf("%s: %s", retry, r)
	}
	if got, _ := os.ReadFile(filepath.Join(locked, "result.1")); string(got) != "precious\n" {
		t.Errorf("retried stage-out: %q", got)
	}
	w.assertClean()

	// The same failure, then the printed discard command.
	os.Chown(locked, 0, 0)
	r = w.run("run", script)
	if r.code != 74 {
		t.Fatalf("want 74: %s", r)
	}
	if r := w.shell(retry); r.code == 0 || !strings.Contains(r.stderr, "no session run1") {
		t.Errorf("a retry of a released session must say so: %s", r)
	}
	if r := w.shell(printed(t, r, "retry the stage-out once the cause is fixed:")); r.code != 74 || !strings.Contains(r.stderr, "keeping session run2") {
		t.Errorf("a retry that fails again keeps the session again: %s", r)
	}
	discard := printed(t, r, "or discard the results and release it:")
	if r := w.shell(discard); r.code != 0 {
		t.Fatalf("%s: %s", discard, r)
	}
	w.waitNoSessions()
	w.assertClean()

	// The reviewer's case: a destination that can never exist.
	proc := w.script("proc.sh", "#!/bin/bash\n#DW jobdw type=scratch capacity=1GiB\n#DW stage_out type=file source=$DW_JOB_STRIPED/r destination=/proc/nope/result\necho r > $DW_JOB_STRIPED/r\n")
	r = w.run("run", proc)
	if r.code != 74 || strings.Contains(r.stderr, "instance released") || w.sessionCount() != 1 {
		t.Fatalf("the results must be kept: %s", r)
	}
	if r := w.shell(printed(t, r, "or discard the results and release it:")); r.code != 0 {
		t.Fatalf("discard: %s", r)
	}
	w.waitNoSessions()

	// Discarding is an explicit choice.
	r = w.run("run", "--discard-failed-stage-out", script)
	if r.code != 74 {
		t.Fatalf("want 74: %s", r)
	}
	mustContain(t, r, "discarding the job's results as asked (--discard-failed-stage-out)", "instance released (hurry)")
	w.assertClean()

	// --keep-on-failure before the job prints commands that exist too.
	bad := w.script("bad-in.sh", "#!/bin/bash\n#DW jobdw type=scratch capacity=1GiB\n#DW stage_in type=file source=/nonexistent/x destination=$DW_JOB_STRIPED/x\n")
	r = w.run("run", "--keep-on-failure", bad)
	if r.code != 69 || w.sessionCount() != 1 {
		t.Fatalf("kept for inspection: %s", r)
	}
	m := regexp.MustCompile("inspection \\(`([^`]+)`\\); remove it with `([^`]+)`").FindStringSubmatch(r.stderr)
	if m == nil {
		t.Fatalf("no commands printed: %s", r)
	}
	if r := w.shell(m[1]); r.code != 0 || !strings.Contains(r.stdout, "run") {
		t.Errorf("%s: %s", m[1], r)
	}
	if r := w.shell(m[2]); r.code != 0 {
		t.Errorf("%s: %s", m[2], r)
	}
	w.waitNoSessions()
	w.assertClean()
}

// TestOverlappingRunsOnOneHome: two runs on one home, the first ending while the second's job
// runs: both succeed, and the second's files stay while the first ends.
func TestOverlappingRunsOnOneHome(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	out := w.pfsDir("out")
	flag := func(name string) string { return filepath.Join(w.root, name) }
	for _, f := range []string{"a-ready", "b-running", "a-done"} {
		os.Remove(flag(f))
	}
	os.Chmod(w.root, 0o777) // the jobs leave their flags here
	wait := func(name string) string {
		return fmt.Sprintf("for i in $(seq 600); do [ -e %s ] && break; sleep 0.1; done; [ -e %s ] || exit 9", flag(name), flag(name))
	}
	a := w.script("a.sh", fmt.Sprintf(`#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_out type=file source=$DW_JOB_STRIPED/a destination=%s/a.txt
echo from-a > "$DW_JOB_STRIPED/a"
touch %s
%s
`, out, flag("a-ready"), wait("b-running")))
	b := w.script("b.sh", fmt.Sprintf(`#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_out type=file source=$DW_JOB_STRIPED/b destination=%s/b.txt
echo from-b > "$DW_JOB_STRIPED/b"
touch %s
%s
cat "$DW_JOB_STRIPED/b" > "$DW_JOB_STRIPED/b.check" || exit 7
cp "$DW_JOB_STRIPED/b.check" "$DW_JOB_STRIPED/b"
`, out, flag("b-running"), wait("a-done")))
	ra := w.start(nil, "run", a)
	waitFor(t, "job a to run", func() bool { _, err := os.Stat(flag("a-ready")); return err == nil })
	rb := w.start(nil, "run", b)
	resA := ra.wait(t)
	if resA.code != 0 {
		t.Fatalf("first run: %s", resA)
	}
	os.WriteFile(flag("a-done"), nil, 0o644) // the first has ended; the second's job goes on
	resB := rb.wait(t)
	if resB.code != 0 {
		t.Fatalf("second run (its files must survive the first run's end): %s", resB)
	}
	for name, want := range map[string]string{"a.txt": "from-a\n", "b.txt": "from-b\n"} {
		if got, _ := os.ReadFile(filepath.Join(out, name)); string(got) != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	w.assertClean()
}

// TestConcurrentStartsOnAFreshHome: dwstat and spillway run started at once on a home that has
// no server yet all succeed, with one server.
func TestConcurrentStartsOnAFreshHome(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	// Five jobs at once must fit in the 4GiB pool.
	w.writeConfig("[[pool]]\nname = \"wlm_pool\"\ngranularity = \"256MiB\"\n")
	job := w.script("j.sh", "#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity=256MiB\necho \"$DW_JOB_STRIPED\"\n")
	var wg sync.WaitGroup
	results := make([]result, 10)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				results[i] = w.run("dwstat", "pools")
			} else {
				results[i] = w.run("run", job)
			}
		}()
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 0 {
			t.Errorf("command %d: %s", i, r)
		}
	}
	if r := w.run("home", "status"); !strings.Contains(r.stdout, "server pid") {
		t.Errorf("one server must run: %s", r)
	}
	w.assertClean()
}

// TestHomeServerExitsWhenIdle: the home's server stops by itself once idle, and the next
// command starts it again.
func TestHomeServerExitsWhenIdle(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	w.writeConfig("[home]\nidle_timeout = \"1s\"\nreap_interval = \"200ms\"\n")
	job := w.script("j.sh", "#!/bin/sh\n#DW jobdw type=scratch capacity=1GiB\necho hi > \"$DW_JOB_STRIPED/x\"\n")
	if r := w.run("run", job); r.code != 0 || strings.Contains(r.stderr, "level=") {
		t.Fatalf("the server's log must not reach the command: %s", r)
	}
	waitFor(t, "the idle server to exit", func() bool {
		return strings.Contains(w.run("home", "status").stdout, "no server runs")
	})
	log, _ := os.ReadFile(filepath.Join(w.home, "server.log"))
	if !strings.Contains(string(log), "idle for 1s (home.idle_timeout)") {
		t.Errorf("the log must say why it stopped:\n%s", log)
	}
	if r := w.run("run", job); r.code != 0 {
		t.Fatalf("the next run starts it again: %s", r)
	}
	w.assertClean()
}

// TestHomeStopRefusesWhileJobsRun: stopping the server would unmount a job's files.
func TestHomeStopRefusesWhileJobsRun(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	os.Chmod(w.root, 0o777)
	ready := filepath.Join(w.root, "ready")
	done := filepath.Join(w.root, "done")
	job := w.script("j.sh", fmt.Sprintf("#!/bin/bash\n#DW jobdw type=scratch capacity=1GiB\ntouch %s\nfor i in $(seq 600); do [ -e %s ] && exit 0; sleep 0.1; done\nexit 9\n", ready, done))
	run := w.start(nil, "run", job)
	waitFor(t, "the job to run", func() bool { _, err := os.Stat(ready); return err == nil })
	if r := w.run("home", "stop"); r.code == 0 || !strings.Contains(r.stderr, "run1 use the burst buffer") {
		t.Errorf("stop must refuse: %s", r)
	}
	os.WriteFile(done, nil, 0o644)
	if r := run.wait(t); r.code != 0 {
		t.Fatalf("%s", r)
	}
	if r := w.run("home", "stop"); r.code != 0 || !strings.Contains(r.stdout, "stopped the server") {
		t.Errorf("stop: %s", r)
	}
	w.assertClean()
}

// TestLimitsHaveKeys: a stage limit set in the home's configuration reaches the stage worker,
// and its error names the key.
func TestLimitsHaveKeys(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	w.writeConfig("max_list_size = \"1KiB\"\n") // appended to [stage]
	w.file("big.list", strings.Repeat("# a comment line that pads the list\n", 40), 0o644)
	script := w.script("list.sh", "#!/bin/bash\n#DW jobdw type=scratch capacity=1GiB\n#DW stage_in type=list source="+w.pfs+"/big.list destination=$DW_JOB_STRIPED\n")
	r := w.run("run", script)
	if r.code != 69 {
		t.Fatalf("want 69: %s", r)
	}
	mustContain(t, r, "is larger than 1024 bytes (limit stage.max_list_size)")
	w.assertClean()
}

// TestErrorsSayTheFix: an unusable home names the options that choose another.
func TestErrorsSayTheFix(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	job := w.script("j.sh", "#!/bin/sh\ntrue\n")
	r := runAs(t, binary, cmdOpts{asUser: true, dir: w.root, env: []string{"HOME=/nonexistent"}}, "run", job)
	if r.code != 69 {
		t.Fatalf("want 69: %s", r)
	}
	mustContain(t, r, "/nonexistent/.local/share/spillway", "permission denied", "--home DIR", "SPILLWAY_HOME=DIR")
}

// TestHomeServerKilledDuringAJob: the home's server dies while a job runs (its mount goes
// dead): the run starts a new server, which restores the mount, and the job's files survive.
func TestHomeServerKilledDuringAJob(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	out := w.pfsDir("out")
	job := w.script("j.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_out type=file source=$DW_JOB_STRIPED/out destination=`+out+`/out.txt
echo before > "$DW_JOB_STRIPED/out"
kill -KILL $(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' `+w.home+`/server.json) || exit 8
for i in $(seq 600); do cat "$DW_JOB_STRIPED/out" >/dev/null 2>&1 && break; sleep 0.1; done
echo after >> "$DW_JOB_STRIPED/out" || exit 9
`)
	r := w.run("run", job)
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	if got, _ := os.ReadFile(filepath.Join(out, "out.txt")); string(got) != "before\nafter\n" {
		t.Errorf("staged-out file %q", got)
	}
	w.assertClean()
}

// TestWhatAJobLeavesRunningIsKilled: when the job's script ends, what it left running in its
// process group is killed before the instance is unmounted and staged out, as Slurm does.
func TestWhatAJobLeavesRunningIsKilled(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	flags := w.pfsDir("flags")
	job := w.script("j.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
(cd "$DW_JOB_STRIPED" && exec sleep 300) &
echo $! > `+flags+`/left
`)
	r := spillway(t, cmdOpts{home: w.home, asUser: true, dir: w.root, timeout: 30 * time.Second}, "run", job)
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	mustContain(t, r, "post_run", "unmounted", "instance released")
	pid, _ := strconv.Atoi(strings.TrimSpace(string(must(os.ReadFile(filepath.Join(flags, "left"))))))
	if processAlive(pid) {
		t.Errorf("the job's leftover process %d still runs", pid)
	}
	w.assertClean()
}

// TestHomeServerExitsWhenItsHomeIsRemoved: nothing can reach a home server whose home
// directory was removed (its socket went with it), so it must not run on for ever.
func TestHomeServerExitsWhenItsHomeIsRemoved(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	w.writeConfig("[home]\nidle_timeout = \"1h\"\nreap_interval = \"200ms\"\n")
	job := w.script("j.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\necho ok\n")
	if r := w.run("run", job); r.code != 0 {
		t.Fatalf("%s", r)
	}
	info, err := os.ReadFile(filepath.Join(w.home, "server.json"))
	if err != nil {
		t.Fatal(err)
	}
	var server struct{ PID int }
	if err := json.Unmarshal(info, &server); err != nil || server.PID == 0 {
		t.Fatalf("server.json %s: %v", info, err)
	}
	if err := os.RemoveAll(w.home); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(server.PID) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if processAlive(server.PID) {
		syscall.Kill(server.PID, syscall.SIGKILL)
		t.Fatalf("the home server %d still runs 10s after its home was removed (home.reap_interval 200ms)", server.PID)
	}
	os.MkdirAll(w.home, 0o755) // for the cleanup's `spillway home stop`
	os.Chown(w.home, nobodyUID, nobodyGID)
}

// TestRetryStageOutAfterTheControllerWasAway: the job ends while the system controller is
// away (a routine restart), so post_run fails and the session is kept; the printed retry,
// run once the controller is back, stages the results out and only then releases the
// instance. (The old retry found no stage-out to do — data_out had never been asked — and
// released the instance with the results in it.) Until then a teardown without hurry is
// refused.
func TestRetryStageOutAfterTheControllerWasAway(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.configure("client", "connect_retries = 3\nretry_wait = \"100ms\"\nteardown_attempts = 1\n")
	c.startController()
	c.startAgent()
	work, script, resultPath := c.nobodysJob(`echo precious > "$DW_JOB_STRIPED/result"
touch ran
for i in $(seq 600); do [ -e go ] && exit 0; sleep 0.1; done
exit 3
`)
	done := make(chan result, 1)
	go func() {
		cmd := exec.Command(binary, "run", "--config", c.config, "--node", "storage1", script)
		cmd.Dir, cmd.Env = work, []string{"PATH=/usr/bin:/bin", "HOME=/"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID}}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		cmd.Run()
		done <- result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
	}()
	waitFor(t, "the job to run", func() bool { _, err := os.Stat(filepath.Join(work, "ran")); return err == nil })
	c.stopController() // the routine restart, while the job ends
	os.WriteFile(filepath.Join(work, "go"), nil, 0o644)
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("spillway run did not end within 2 minutes")
	}
	if r.code != 74 {
		t.Fatalf("a run whose post_run could not reach the controller: want 74 (results kept): %s", r)
	}
	retry := printed(t, r, "retry the stage-out once the cause is fixed:")
	c.startController()
	all, err := c.client.All(context.Background())
	if err != nil || len(all.Sessions) != 1 {
		t.Fatalf("the kept session: %v %v", all.Sessions, err)
	}
	token := all.Sessions[0].Token
	if err := c.client.Teardown(context.Background(), token, false); err == nil || !strings.Contains(err.Error(), "was never run") {
		t.Errorf("a teardown without hurry of a session whose stage-out never ran: %v, want it refused", err)
	}
	rr := runAs(t, "/bin/sh", cmdOpts{asUser: true, dir: work}, "-c", retry)
	if rr.code != 0 {
		t.Fatalf("%s: %s", retry, rr)
	}
	if got, _ := os.ReadFile(resultPath); string(got) != "precious\n" {
		t.Errorf("the retried stage-out wrote %q, want the job's result", got)
	}
	c.assertClean()
}

// TestKilledRunIsFinishedByTheSystemController: a `spillway run` against a system controller
// is killed (with its job) while the job runs. Its session stops renewing its lease
// (controller.run_lease), and the controller finishes it as the run would have: unmounts it,
// stages the results out, releases the instance. (Before, only a home's server cleaned up
// after gone runs: the session stayed mounted, its capacity held, its results never staged.)
func TestKilledRunIsFinishedByTheSystemController(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.configure("controller", "run_lease = \"1s\"\n")
	c.startController()
	c.startAgent()
	work, script, resultPath := c.nobodysJob(`echo precious > "$DW_JOB_STRIPED/result"
echo $$ > job.pid
exec sleep 300
`)
	cmd := exec.Command(binary, "run", "--config", c.config, "--node", "storage1", script)
	cmd.Dir, cmd.Env = work, []string{"PATH=/usr/bin:/bin", "HOME=/"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the job to run", func() bool { _, err := os.Stat(filepath.Join(work, "job.pid")); return err == nil })
	// The node's reboot, as far as this run is concerned: the run and its job die at once.
	cmd.Process.Kill()
	cmd.Wait()
	if pid, err := strconv.Atoi(strings.TrimSpace(string(must(os.ReadFile(filepath.Join(work, "job.pid")))))); err == nil {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	waitFor(t, "the controller to finish the gone run's session", func() bool {
		all, err := c.client.All(context.Background())
		return err == nil && len(all.Sessions) == 0
	})
	if got, _ := os.ReadFile(resultPath); string(got) != "precious\n" {
		t.Errorf("the gone run's results were staged out as %q, want the job's result", got)
	}
	c.assertClean()
}
