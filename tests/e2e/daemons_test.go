package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/crashpoint"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// cluster is a controller and an agent as separate processes, sharing a temporary directory.
type cluster struct {
	t          *testing.T
	dir        string
	config     string
	controller *exec.Cmd
	agent      *exec.Cmd
	ctlExit    chan error
	client     *apiclient.Client
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "spillway-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	c := &cluster{t: t, dir: dir, config: filepath.Join(dir, "spillway.toml")}
	cfg := fmt.Sprintf(`[controller]
state_dir = "%[1]s/state"
socket = "%[1]s/controller.sock"
mount_root = "%[1]s/mounts"
node_timeout = "2s"
[executor]
tick = "100ms"
retry_backoff = "100ms"
retry_backoff_max = "500ms"
max_attempts = 4
[stage]
poll_interval = "50ms"
allow_root = true
[agent]
name = "storage1"
pool = "wlm_pool"
ssd_path = "%[1]s/ssd"
capacity = "4GiB"
listen = "unix:%[1]s/agent.sock"
controller = "unix:%[1]s/controller.sock"
heartbeat_interval = "200ms"
gc_grace = "1s"
[client]
controller = "unix:%[1]s/controller.sock"
`, dir)
	if err := os.WriteFile(c.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, "pfs"), 0o755)
	c.client, _ = apiclient.New("unix:"+dir+"/controller.sock", apiclient.Options{ConnectRetries: 1, RequestTimeout: 10 * time.Second})
	t.Cleanup(func() {
		c.stopController()
		c.stopAgent()
		for _, m := range mountsUnder(dir) {
			exec.Command("fusermount3", "-uz", m).Run()
		}
		os.RemoveAll(dir)
	})
	return c
}

// configure adds lines (TOML keys) to a section of the cluster's configuration, before the
// daemons start.
func (c *cluster) configure(section, lines string) {
	c.t.Helper()
	cfg, err := os.ReadFile(c.config)
	if err != nil {
		c.t.Fatal(err)
	}
	header := "[" + section + "]\n"
	if !strings.Contains(string(cfg), header) {
		c.t.Fatalf("the cluster's configuration has no %s", header)
	}
	if err := os.WriteFile(c.config, []byte(strings.Replace(string(cfg), header, header+lines, 1)), 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// nobodysJob writes a job script for nobody in a work directory of nobody's, whose
// #DW stage_out puts $DW_JOB_STRIPED/result at the returned result path (in a PFS directory of
// nobody's); body follows the directives.
func (c *cluster) nobodysJob(body string) (work, script, result string) {
	work, pfs := filepath.Join(c.dir, "work"), filepath.Join(c.dir, "pfs")
	for _, d := range []string{work, pfs} {
		os.MkdirAll(d, 0o755)
		os.Chown(d, nobodyUID, nobodyGID)
	}
	result, script = filepath.Join(pfs, "result"), filepath.Join(work, "job.sh")
	os.WriteFile(script, []byte("#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n"+
		"#DW stage_out type=file source=$DW_JOB_STRIPED/result destination="+result+"\n"+body), 0o755)
	return work, script, result
}

func (c *cluster) daemon(name string, env ...string) *exec.Cmd {
	log, _ := os.OpenFile(filepath.Join(c.dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	cmd := exec.Command(binary, name, "--config", c.config)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin"}, env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	return cmd
}

func (c *cluster) startController(env ...string) {
	c.controller = c.daemon("controller", env...)
	c.ctlExit = make(chan error, 1)
	cmd := c.controller
	go func() { c.ctlExit <- cmd.Wait() }()
	c.waitFor("the controller to answer", func() bool { _, err := c.client.All(context.Background()); return err == nil })
}

func (c *cluster) stopController() {
	if c.controller != nil && c.controller.ProcessState == nil {
		c.controller.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.ctlExit:
		case <-time.After(10 * time.Second):
			c.controller.Process.Kill()
			<-c.ctlExit
		}
	}
	c.controller = nil
}

func (c *cluster) startAgent() {
	c.agent = c.daemon("agent")
	admitted := false
	c.waitFor("the agent to be online", func() bool {
		all, err := c.client.All(context.Background())
		if err != nil {
			return true // no controller yet: the agent retries on its own
		}
		for _, n := range all.Nodes {
			if n.ID == "storage1" && n.Online {
				if n.Pool == "" && n.StorageClaim != "" {
					// An agent with a token presents its node key, which makes it no storage
					// node: the administrator admits it, and its next heartbeat counts.
					admit := true
					if c.client.UpdateNode(context.Background(), "storage1", controllerapi.NodeUpdate{Storage: &admit}) == nil {
						admitted = true
					}
					return false
				}
				return !admitted || n.Pool != ""
			}
		}
		return false
	})
}

func (c *cluster) killAgent() {
	if c.agent != nil {
		c.agent.Process.Kill()
		c.agent.Wait()
		c.agent = nil
	}
}

func (c *cluster) stopAgent() {
	if c.agent != nil {
		c.agent.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { c.agent.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			c.agent.Process.Kill()
			<-done
		}
		c.agent = nil
	}
}

func (c *cluster) waitFor(what string, ok func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			logs, _ := exec.Command("sh", "-c", "tail -n 20 "+c.dir+"/*.log").CombinedOutput()
			c.t.Fatalf("timed out waiting for %s\n%s", what, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// controllerCrashed reports whether the controller process ended by a crash point, and if so
// starts it again (without the crash) — the test plays the init system.
func (c *cluster) restartIfCrashed() bool {
	select {
	case err := <-c.ctlExit:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != crashpoint.ExitCode {
			logs, _ := os.ReadFile(filepath.Join(c.dir, "controller.log"))
			c.t.Fatalf("controller ended unexpectedly: %v\n%s", err, logs)
		}
		c.controller = nil
		c.startController()
		return true
	default:
		return false
	}
}

// step sends a request and waits for its step, riding out controller crashes: every request
// is idempotent, so after a restart it is simply sent again.
func (c *cluster) step(token, step string, send func() error) {
	c.t.Helper()
	for attempt := 0; attempt < 20; attempt++ {
		err := send()
		if err == nil {
			st, werr := c.client.WaitStep(context.Background(), token, step, 60*time.Second)
			if werr == nil {
				if st.Failed {
					c.t.Fatalf("%s failed: %s", step, st.Message)
				}
				return
			}
			err = werr
		}
		if apiclient.IsBusy(err) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		time.Sleep(100 * time.Millisecond)
		if !c.restartIfCrashed() {
			var un *apiclient.Unreachable
			if !errors.As(err, &un) {
				c.t.Fatalf("%s: %v", step, err)
			}
		}
	}
	c.t.Fatalf("%s did not complete after 20 attempts", step)
}

// runJob drives one job through the whole lifecycle over the API, writing into the mount as
// the job would.
func (c *cluster) runJob(token string) {
	c.t.Helper()
	ctx := context.Background()
	in := filepath.Join(c.dir, "pfs", "in.txt")
	os.WriteFile(in, []byte("payload "+token+"\n"), 0o644)
	out := filepath.Join(c.dir, "pfs", "out-"+token+".txt")
	setup := lifecycle.Setup{Token: token, Creator: "TEST", Owner: 0, Group: 0,
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}
	c.step(token, lifecycle.PhaseSetup, func() error { return c.client.Setup(ctx, setup) })
	c.step(token, lifecycle.PhaseDataIn, func() error {
		return c.client.Stages(ctx, token, "in", []lifecycle.StageRequest{{Type: "file", PFSPath: in, DWVar: "DW_JOB_STRIPED", DWPath: "/in.txt", Line: 2}})
	})
	c.step(token, lifecycle.PhasePreRun, func() error { return c.client.PreRun(ctx, token, []string{"storage1"}) })
	var env map[string]string
	c.waitFor("paths", func() bool {
		var err error
		env, err = c.client.Paths(ctx, token)
		if err != nil {
			c.restartIfCrashed()
		}
		return err == nil
	})
	mount := env["DW_JOB_STRIPED"]
	data, err := os.ReadFile(mount + "in.txt")
	if err != nil || string(data) != "payload "+token+"\n" {
		c.t.Fatalf("the job cannot read its staged-in file at %s: %q %v", mount, data, err)
	}
	if err := os.WriteFile(mount+"out.txt", []byte("result "+token+"\n"), 0o644); err != nil {
		c.t.Fatalf("the job cannot write: %v", err)
	}
	c.step(token, lifecycle.PhasePostRun, func() error { return c.client.PostRun(ctx, token) })
	c.step(token, lifecycle.PhaseDataOut, func() error {
		return c.client.Stages(ctx, token, "out", []lifecycle.StageRequest{{Type: "file", PFSPath: out, DWVar: "DW_JOB_STRIPED", DWPath: "/out.txt", Line: 3}})
	})
	c.step(token, lifecycle.PhaseTeardown, func() error {
		err := c.client.Teardown(ctx, token, false)
		if apiclient.IsNotFound(err) {
			return nil // the teardown before the crash finished
		}
		return err
	})
	got, err := os.ReadFile(out)
	if err != nil || string(got) != "result "+token+"\n" {
		c.t.Fatalf("staged-out file: %q %v", got, err)
	}
}

// assertClean checks that the controller holds nothing, the agent's disk holds no fragment and
// no mount is left.
func (c *cluster) assertClean() {
	c.t.Helper()
	all, err := c.client.All(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	if n := len(all.Sessions) + len(all.Instances) + len(all.Fragments) + len(all.Namespaces) + len(all.Activations) + len(all.Stages) + len(all.Registrations) + len(all.Configurations); n != 0 {
		c.t.Errorf("%d objects left in the controller: %+v", n, all)
	}
	// Finished stages stay in the stage history (stage.history), not as live objects.
	for _, st := range all.StageHistory {
		if st.Status != "complete" && st.Status != "failed" && st.Status != "canceled" {
			c.t.Errorf("an unfinished stage in the stage history: %+v", st)
		}
	}
	if frags, _ := os.ReadDir(filepath.Join(c.dir, "ssd", "fragment")); len(frags) != 0 {
		c.t.Errorf("%d fragment directories left on the agent's disk", len(frags))
	}
	if m := mountsUnder(c.dir); len(m) != 0 {
		c.t.Errorf("mounts left: %v", m)
	}
}

// TestSeparateProcesses runs a job with the controller and agent as daemons.
func TestSeparateProcesses(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()
	c.runJob("100")
	c.assertClean()
	// spillway run and dwstat against the daemons.
	script := filepath.Join(c.dir, "job.sh")
	os.WriteFile(script, []byte("#!/bin/sh\n#DW jobdw type=scratch capacity=1GiB\necho in $DW_JOB_STRIPED\n"), 0o755)
	r := spillway(t, cmdOpts{dir: c.dir}, "run", "--config", c.config, "--node", "storage1", script)
	if r.code != 0 || !strings.Contains(r.stdout, "in "+c.dir+"/mounts/run1_striped_scratch/") {
		t.Fatalf("spillway run --config: %s", r)
	}
	r = spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "nodes")
	mustContain(t, r, "storage1 wlm_pool online fill 1GiB 4GiB 0 0")
	c.assertClean()
}

// TestControllerKilledAtEveryStep kills the controller at each of its crash points in turn —
// after each request is persisted, before and after each side effect — restarts it, and checks
// that the job still finishes correctly and nothing leaks.
func TestControllerKilledAtEveryStep(t *testing.T) {
	requireRoot(t)
	controllerKilledAtEveryStep(t, func(*cluster) {})
}

// controllerKilledAtEveryStep is TestControllerKilledAtEveryStep with each cluster's state
// where setStore puts it.
func controllerKilledAtEveryStep(t *testing.T, setStore func(*cluster)) {
	// Count the crash points one job passes.
	c := newCluster(t)
	setStore(c)
	logPath := filepath.Join(c.dir, "crash.log")
	c.startController("SPILLWAY_CRASH_LOG=" + logPath)
	c.startAgent()
	c.runJob("1")
	c.assertClean()
	c.waitFor("the reference job's accounting record", func() bool { // written, and out of the state: past its crash points
		list, err := c.client.AllAccounting(context.Background())
		return err == nil && list.PendingRecords != nil && *list.PendingRecords == 0 && len(recordsOf(c.accountingLog(), "1")) == 1
	})
	raw, _ := os.ReadFile(logPath)
	points := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(points) < 20 {
		t.Fatalf("only %d crash points on a job's path: %v", len(points), points)
	}
	t.Logf("%d crash points on one job's path", len(points))
	// Effects that run concurrently may pass their points in another order from run to run:
	// each run must crash at its k-th point, and together the runs must crash at every point
	// of the reference job.
	crashedAt := map[string]bool{}
	hit := regexp.MustCompile(`crash point (\d+) \(([^)]*)\)`)
	for k := 1; k <= len(points); k++ {
		name := strings.SplitN(points[k-1], " ", 2)[1]
		t.Run(strconv.Itoa(k)+"-"+name, func(t *testing.T) {
			c := newCluster(t)
			setStore(c)
			c.startController("SPILLWAY_CRASH_AFTER=" + strconv.Itoa(k))
			c.startAgent()
			c.runJob(strconv.Itoa(1000 + k))
			// The crash may come after the last request: make sure the controller ran it.
			c.restartIfCrashed()
			c.waitFor("the teardown to finish", func() bool {
				c.restartIfCrashed()
				all, err := c.client.All(context.Background())
				return err == nil && len(all.Sessions) == 0
			})
			c.waitFor("the agent's disk to be empty", func() bool {
				frags, _ := os.ReadDir(filepath.Join(c.dir, "ssd", "fragment"))
				return len(frags) == 0
			})
			// The instance's accounting record is in the log once, whatever the crash (the
			// last crash points of a job come while it is written).
			token := strconv.Itoa(1000 + k)
			c.waitFor("the job's accounting record", func() bool {
				c.restartIfCrashed()
				list, err := c.client.AllAccounting(context.Background())
				return err == nil && list.PendingRecords != nil && *list.PendingRecords == 0 && len(recordsOf(c.accountingLog(), token)) > 0
			})
			if recs := recordsOf(c.accountingLog(), token); len(recs) != 1 || !recs[0].Final {
				t.Errorf("accounting records of the job: %+v, want one, final", recs)
			}
			c.assertClean()
			logs, _ := os.ReadFile(filepath.Join(c.dir, "controller.log"))
			crashed := false
			for _, m := range hit.FindAllStringSubmatch(string(logs), -1) {
				if m[1] == strconv.Itoa(k) {
					crashed, crashedAt[m[2]] = true, true
				}
			}
			if !crashed {
				t.Fatalf("the controller never crashed at point %d (%s in the reference run):\n%s", k, name, logs)
			}
		})
	}
	for _, p := range points {
		if name := strings.SplitN(p, " ", 2)[1]; !crashedAt[name] {
			t.Errorf("no run crashed at %s", name)
		}
	}
}

// TestAgentRestartKeepsTheJobGoing: the agent holding the mount dies mid-job and comes back; it
// restores the mount, and the job's data is still there.
func TestAgentRestartKeepsTheJobGoing(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()
	ctx := context.Background()
	setup := lifecycle.Setup{Token: "7", Creator: "TEST", Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch"}}
	c.step("7", lifecycle.PhaseSetup, func() error { return c.client.Setup(ctx, setup) })
	c.step("7", lifecycle.PhasePreRun, func() error { return c.client.PreRun(ctx, "7", []string{"storage1"}) })
	env, _ := c.client.Paths(ctx, "7")
	mount := env["DW_JOB_STRIPED"]
	os.WriteFile(mount+"before.txt", []byte("kept"), 0o644)
	c.killAgent()
	if _, err := os.ReadFile(mount + "before.txt"); err == nil {
		t.Fatal("the mount should be dead while its agent is")
	}
	c.startAgent()
	c.waitFor("the mount to come back", func() bool {
		b, err := os.ReadFile(mount + "before.txt")
		return err == nil && string(b) == "kept"
	})
	c.step("7", lifecycle.PhasePostRun, func() error { return c.client.PostRun(ctx, "7") })
	c.step("7", lifecycle.PhaseTeardown, func() error { return c.client.Teardown(ctx, "7", false) })
	c.assertClean()
}

// TestDeadStorageNode: a storage node that stops answering goes offline; new jobs are refused
// with a reason, a job on it can still be torn down, and the node cleans its disk when it
// returns.
func TestDeadStorageNode(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()
	ctx := context.Background()
	setup := func(tok string) lifecycle.Setup {
		return lifecycle.Setup{Token: tok, Creator: "TEST", Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch"}}
	}
	c.step("1", lifecycle.PhaseSetup, func() error { return c.client.Setup(ctx, setup("1")) })
	c.killAgent()
	c.waitFor("the node to go offline", func() bool {
		all, _ := c.client.All(ctx)
		return len(all.Nodes) == 1 && !all.Nodes[0].Online
	})
	err := c.client.Setup(ctx, setup("2"))
	if err == nil || !strings.Contains(err.Error(), "storage1 offline") {
		t.Fatalf("setup on a pool whose only node is offline: %v", err)
	}
	in := filepath.Join(c.dir, "pfs", "x")
	os.WriteFile(in, []byte("x"), 0o644)
	c.client.Stages(ctx, "1", "in", []lifecycle.StageRequest{{Type: "file", PFSPath: in, DWVar: "DW_JOB_STRIPED", DWPath: "/x"}})
	st, _ := c.client.WaitStep(ctx, "1", lifecycle.PhaseDataIn, 30*time.Second)
	if !st.Failed || !strings.Contains(st.Message, "offline") {
		t.Fatalf("a stage on an offline node must fail and say why: %+v", st)
	}
	c.step("1", lifecycle.PhaseTeardown, func() error { return c.client.Teardown(ctx, "1", true) })
	if frags, _ := os.ReadDir(filepath.Join(c.dir, "ssd", "fragment")); len(frags) != 1 {
		t.Fatalf("the dead node's fragment is still on its disk (%d), to be removed when it returns", len(frags))
	}
	c.startAgent()
	c.waitFor("the returning node to remove the orphan fragment", func() bool {
		frags, _ := os.ReadDir(filepath.Join(c.dir, "ssd", "fragment"))
		return len(frags) == 0
	})
	c.assertClean()
}
