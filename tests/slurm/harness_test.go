// Package slurm runs Spillway under a real, unmodified Slurm from Debian's packages: munged,
// slurmctld and slurmd started by deploy/single-host/up.sh in a throwaway directory and
// stopped by deploy/single-host/down.sh (by PID), jobs submitted with sbatch, srun and salloc
// as an ordinary user. The scenarios are those a site's users and administrators meet.
// multinode_test.go does the same on four hosts made of network namespaces (a controller host,
// a storage node and two compute nodes), with jobs spanning both compute nodes.
//
// The tests need root and the slurm-wlm packages (scripts/install-deps --test installs
// them), take a few minutes, and run only when SPILLWAY_SLURM_TESTS=1 (scripts/test-all
// sets it and runs them on their own, after the other tests):
//
//	SPILLWAY_SLURM_TESTS=1 go test -count=1 -v ./tests/slurm/
package slurm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testUser is the ordinary user jobs run as; up.sh creates it and down.sh deletes it.
const testUser = "spwtest"

var (
	top    string // the source tree
	binary string // spillway, built for these tests
	// smallBinary is the small dw_wlm_cli beside it (cmd/dw_wlm_cli): Slurm's GetSysState
	// and GetSysStatus (dw_wlm_cli, dwstat) are links to it, as installed.
	smallBinary string
)

func TestMain(m *testing.M) {
	if os.Getenv("SPILLWAY_SLURM_TESTS") != "1" {
		fmt.Println("tests/slurm: skipped; they start a real Slurm as root and take minutes. Run them with SPILLWAY_SLURM_TESTS=1 (scripts/test-all does).")
		os.Exit(0)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "tests/slurm: run as root (they start slurmctld, slurmd and munged)")
		os.Exit(1)
	}
	for _, p := range []string{"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch", "/usr/sbin/munged"} {
		if _, err := os.Stat(p); err != nil {
			fmt.Fprintf(os.Stderr, "tests/slurm: %s is missing; install Slurm with scripts/install-deps --test\n", p)
			os.Exit(1)
		}
	}
	var err error
	if top, err = filepath.Abs("../.."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "spillway-slurm-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary, smallBinary = filepath.Join(dir, "spillway"), filepath.Join(dir, "dw_wlm_cli")
	build := exec.Command("go", "build", "-o", dir+"/", "github.com/spillway-hpc/spillway/cmd/spillway", "github.com/spillway-hpc/spillway/cmd/dw_wlm_cli")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building spillway and dw_wlm_cli:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cluster is one single-host Slurm + Spillway brought up by deploy/single-host/up.sh.
type cluster struct {
	t      *testing.T // the running test or scenario
	root   *testing.T // the test that brought the cluster up
	dir    string     // up.sh's --dir
	plugin string     // datawarp or lua
	pfs    string     // the user's directory: job scripts, stage sources and destinations
	uid    int
	gid    int
	env    []string // SLURM_CONF, SPILLWAY_CONFIG, PATH
	// userExisted: the test user was there before up.sh (which then leaves it alone).
	userExisted bool
	// Set for a cluster of several hosts (multinode_test.go): Slurm's commands run in the
	// network namespace of the controller host, and each compute host has its own mount table.
	netns       string   // e.g. /run/netns/NAME; "" = this host's network
	mountTables []string // /proc/PID/mounts of each compute host; nil = this process's
	stop        func()   // brings the cluster down; nil = deploy/single-host/down.sh
}

// run runs one scenario as a subtest on the cluster.
func (c *cluster) run(name string, scenario func(*cluster, *testing.T)) {
	c.root.Run(name, func(t *testing.T) {
		sc := *c
		sc.t = t
		scenario(&sc, t)
	})
}

// result is a finished command.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// up brings a cluster up; it is brought down when the test ends, with the logs printed if
// the test failed.
func up(t *testing.T, plugin, capacity string) *cluster {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "spillway-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, root: t, dir: dir, plugin: plugin}
	_, err = user.Lookup(testUser)
	c.userExisted = err == nil
	t.Cleanup(c.down)
	r := run(3*time.Minute, "", nil, filepath.Join(top, "deploy/single-host/up.sh"), "--dir", dir, "--plugin", plugin,
		"--user", testUser, "--capacity", capacity, "--no-install", "--spillway", binary, "--dw-wlm-cli", smallBinary)
	if r.code != 0 {
		t.Fatalf("up.sh: %s", r)
	}
	u, err := user.Lookup(testUser)
	if err != nil {
		t.Fatal(err)
	}
	c.uid, _ = strconv.Atoi(u.Uid)
	c.gid, _ = strconv.Atoi(u.Gid)
	c.pfs = filepath.Join(dir, "pfs", testUser)
	c.env = []string{
		"SLURM_CONF=" + filepath.Join(dir, "etc/slurm.conf"),
		"SPILLWAY_CONFIG=" + filepath.Join(dir, "etc/spillway.toml"),
		"PATH=" + filepath.Join(dir, "bin") + ":/usr/sbin:/usr/bin:/sbin:/bin",
	}
	return c
}

func (c *cluster) down() {
	c.t = c.root
	if c.t.Failed() {
		c.dumpLogs()
	}
	if c.stop != nil {
		c.stop()
		return
	}
	r := run(2*time.Minute, "", nil, filepath.Join(top, "deploy/single-host/down.sh"), "--dir", c.dir)
	if r.code != 0 {
		c.t.Errorf("down.sh: %s", r)
	}
	if _, err := os.Stat(c.dir); err == nil {
		c.t.Errorf("down.sh left %s behind", c.dir)
	}
	if _, err := user.Lookup(testUser); err == nil && !c.userExisted {
		c.t.Errorf("down.sh left user %s behind", testUser)
	}
}

// dumpLogs prints what an engineer needs to see why a test failed.
func (c *cluster) dumpLogs() {
	tail := func(name string, filter *regexp.Regexp, n int) {
		data, err := os.ReadFile(filepath.Join(c.dir, "log", name))
		if err != nil {
			return
		}
		var lines []string
		for _, l := range strings.Split(string(data), "\n") {
			if filter == nil || filter.MatchString(l) {
				lines = append(lines, l)
			}
		}
		if len(lines) > n {
			lines = lines[len(lines)-n:]
		}
		c.t.Logf("--- %s (last %d lines)\n%s", name, len(lines), strings.Join(lines, "\n"))
	}
	tail("slurmctld.log", regexp.MustCompile(`burst_buffer|error|Reason|_log_script_argv`), 80)
	logs, _ := filepath.Glob(filepath.Join(c.dir, "log", "*.log"))
	for _, l := range logs {
		if name := filepath.Base(l); name != "slurmctld.log" {
			tail(name, nil, 40)
		}
	}
	c.t.Logf("--- squeue\n%s", c.admin("squeue", "-o", "%i %T %r").stdout)
	c.t.Logf("--- dwstat all\n%s", c.admin("dwstat", "all", "stages").stdout)
}

// run runs a command with a time limit; asUID >= 0 runs it as that user.
func run(timeout time.Duration, dir string, env []string, program string, args ...string) result {
	return runAs(-1, -1, timeout, dir, env, program, args...)
}

func runAs(uid, gid int, timeout time.Duration, dir string, env []string, program string, args ...string) result {
	cmd := exec.Command(lookPath(program, env), args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}, env...)
	if uid >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		cmd.Env = append(cmd.Env, "HOME="+dir, "USER="+testUser, "LOGNAME="+testUser)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		return result{code: -1, stderr: err.Error()}
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		return result{code: -1, stdout: out.String(), stderr: errb.String() + fmt.Sprintf("\n(killed after %s)", timeout)}
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
}

// lookPath finds a program in the PATH of env (the command's environment, not the test's).
func lookPath(program string, env []string) string {
	if strings.Contains(program, "/") {
		return program
	}
	path := "/usr/sbin:/usr/bin:/sbin:/bin"
	for _, e := range env {
		if p, ok := strings.CutPrefix(e, "PATH="); ok {
			path = p
		}
	}
	for _, d := range filepath.SplitList(path) {
		if fi, err := os.Stat(filepath.Join(d, program)); err == nil && fi.Mode()&0o111 != 0 {
			return filepath.Join(d, program)
		}
	}
	return program
}

// user runs a command as the test user, in the user's directory.
func (c *cluster) user(program string, args ...string) result {
	if c.netns != "" {
		// Entering a namespace needs root: enter it, then become the user.
		env := append(append([]string{}, c.env...), "HOME="+c.pfs, "USER="+testUser, "LOGNAME="+testUser)
		return run(2*time.Minute, c.pfs, env, "nsenter", append([]string{"--net=" + c.netns, "--",
			"setpriv", "--reuid", strconv.Itoa(c.uid), "--regid", strconv.Itoa(c.gid), "--clear-groups", "--",
			lookPath(program, c.env)}, args...)...)
	}
	return runAs(c.uid, c.gid, 2*time.Minute, c.pfs, c.env, program, args...)
}

// admin runs a command as root with the cluster's environment.
func (c *cluster) admin(program string, args ...string) result {
	if c.netns != "" {
		return run(time.Minute, c.dir, c.env, "nsenter", append([]string{"--net=" + c.netns, "--", lookPath(program, c.env)}, args...)...)
	}
	return run(time.Minute, c.dir, c.env, program, args...)
}

// writeFile writes a file owned by the test user in the user's directory.
func (c *cluster) writeFile(name, content string, mode os.FileMode) string {
	c.t.Helper()
	p := filepath.Join(c.pfs, name)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		c.t.Fatal(err)
	}
	os.Chown(p, c.uid, c.gid)
	os.Chown(filepath.Dir(p), c.uid, c.gid)
	return p
}

// sbatch submits a script (written to the user's directory) as the user and returns the job
// id.
func (c *cluster) sbatch(name, script string, args ...string) string {
	c.t.Helper()
	c.writeFile(name, script, 0o755)
	r := c.user("sbatch", append(append([]string{"--parsable"}, args...), name)...)
	if r.code != 0 {
		c.t.Fatalf("sbatch %s: %s", name, r)
	}
	id := strings.TrimSpace(strings.Split(r.stdout, ";")[0])
	if _, err := strconv.Atoi(id); err != nil {
		c.t.Fatalf("sbatch %s printed %q, not a job id", name, r.stdout)
	}
	return id
}

// job is `scontrol show job` of one job as key=value pairs (empty if Slurm no longer knows
// it). Values with spaces (Reason=) keep them.
func (c *cluster) job(id string) map[string]string {
	r := c.admin("scontrol", "-o", "show", "job", id)
	fields := map[string]string{}
	if r.code != 0 {
		return fields
	}
	// One record, but BurstBuffer= holds the directives with their newlines.
	key := ""
	for _, word := range strings.Fields(r.stdout) {
		k, v, ok := strings.Cut(word, "=")
		if ok && k != "" && !strings.ContainsAny(k, "/:") {
			key = k
			fields[key] = v
		} else if key != "" {
			fields[key] += " " + word
		}
	}
	return fields
}

// reason is the job's reason as squeue shows it (%r), which is where users look.
func (c *cluster) reason(id string) string {
	return strings.TrimSpace(c.admin("squeue", "-h", "-j", id, "-o", "%r").stdout)
}

// waitFor polls cond every 200 ms until it holds or the limit passes.
func (c *cluster) waitFor(limit time.Duration, what string, cond func() bool) {
	c.t.Helper()
	end := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(end) {
			c.t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// finished states of a job.
var finished = map[string]bool{"COMPLETED": true, "FAILED": true, "CANCELLED": true, "TIMEOUT": true, "NODE_FAIL": true, "OUT_OF_MEMORY": true, "BOOT_FAIL": true, "DEADLINE": true, "PREEMPTED": true}

// waitEnd waits until the job has finished, stage-out included, and returns its record.
func (c *cluster) waitEnd(id string, limit time.Duration) map[string]string {
	c.t.Helper()
	var j map[string]string
	c.waitFor(limit, "job "+id+" to finish", func() bool {
		j = c.job(id)
		return finished[j["JobState"]] && !strings.Contains(j["BurstBufferState"], "staging")
	})
	return j
}

// waitState waits until the job is in one of the states.
func (c *cluster) waitState(id string, limit time.Duration, states ...string) map[string]string {
	c.t.Helper()
	var j map[string]string
	c.waitFor(limit, fmt.Sprintf("job %s to be %v", id, states), func() bool {
		j = c.job(id)
		for _, s := range states {
			if j["JobState"] == s {
				return true
			}
		}
		return false
	})
	return j
}

// read reads a file of the user's directory.
func (c *cluster) read(name string) string {
	c.t.Helper()
	b, err := os.ReadFile(filepath.Join(c.pfs, name))
	if err != nil {
		c.t.Fatalf("%v", err)
	}
	return string(b)
}

// sessions are Spillway's sessions by token.
func (c *cluster) sessions() map[string]bool {
	c.t.Helper()
	r := c.admin("dwstat", "--json", "sessions")
	if r.code != 0 {
		c.t.Fatalf("dwstat sessions: %s", r)
	}
	var doc struct {
		Sessions []struct {
			Token string `json:"token"`
		} `json:"sessions"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		c.t.Fatalf("dwstat --json sessions: %v\n%s", err, r.stdout)
	}
	tokens := map[string]bool{}
	for _, s := range doc.Sessions {
		tokens[s.Token] = true
	}
	return tokens
}

// mounts lists the mount points under the cluster's mount root, on every compute host.
func (c *cluster) mounts() []string {
	var found []string
	tables := c.mountTables
	if tables == nil {
		tables = []string{"/proc/self/mounts"}
	}
	for _, table := range tables {
		found = append(found, mountsIn(table, filepath.Join(c.dir, "mounts"))...)
	}
	return found
}

// mountsIn lists the mount points under root in one mount table (/proc/PID/mounts).
func mountsIn(table, root string) []string {
	f, err := os.Open(table)
	if err != nil {
		return nil
	}
	defer f.Close()
	var found []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 1 && strings.HasPrefix(fields[1], root+"/") {
			found = append(found, fields[1])
		}
	}
	return found
}

// assertGone checks that nothing of the job is left: no Spillway session, no mount, and no
// buffer in Slurm's records, shortly after the job ended.
func (c *cluster) assertGone(id string) {
	c.t.Helper()
	c.waitFor(20*time.Second, "job "+id+"'s burst buffer to be gone", func() bool {
		return !c.sessions()[id] && len(c.mounts()) == 0 &&
			!strings.Contains(c.admin("scontrol", "show", "burst").stdout, "JobID="+id+" ")
	})
}

// assertClean checks that the whole system is back to empty: no sessions, no instances,
// no mounts, and every grain of the pool free again.
func (c *cluster) assertClean() {
	c.t.Helper()
	c.waitFor(20*time.Second, "no sessions, instances or mounts left", func() bool {
		return len(c.sessions()) == 0 && len(c.mounts()) == 0 &&
			strings.Contains(c.admin("dwstat", "instances").stdout, "no instances")
	})
	r := c.admin("dw_wlm_cli", "--function", "pools")
	var doc struct {
		Pools []struct {
			ID             string `json:"id"`
			Quantity, Free int64
		} `json:"pools"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || len(doc.Pools) == 0 {
		c.t.Fatalf("pools: %v %s", err, r)
	}
	for _, p := range doc.Pools {
		if p.Free != p.Quantity {
			c.t.Errorf("pool %s: %d of %d grains free after every job ended", p.ID, p.Free, p.Quantity)
		}
	}
}
