package e2e

import (
	"bufio"
	"bytes"
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

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/netnstest"
	"github.com/spillway-hpc/spillway/internal/nodekey"
)

// Several hosts on one machine: each "host" is a network namespace with its own address on a
// private subnet (a bridge in a namespace of its own: the machine's own interfaces and
// addresses are never touched), and each daemon runs in its own network and mount namespace
// (`ip netns exec` gives it both), so a compute node's FUSE mount is visible only inside that
// host. The controller is on 10.77.0.1, storage node hosta on .2, compute node hostb on .3.

const (
	netnsPrefix = "spwe2e-"
	subnet      = "10.77.0."
	// The bound the test configures on a dead storage node, and what it allows on top for
	// the kernel and the scheduler of a busy CI machine.
	netRequestTimeout = 2 * time.Second
	netSlack          = 2 * time.Second
)

// netHost is one namespace and the daemon in it.
// netSecret is the cluster's secret of the network-namespace tests.
const netSecret = "netns-e2e-secret"

type netHost struct {
	name   string // the node's name, e.g. hosta
	netns  string
	addr   string
	config string
	cmd    *exec.Cmd
	exited chan struct{}
}

type netCluster struct {
	t       *testing.T
	dir     string
	hosts   map[string]*netHost // ctl, hosta, hostb, and any other
	storage []string            // the storage nodes (hosta first)
	compute []string            // the compute nodes (hostb first)
	spaces  []string            // every namespace created, the bridge's included
	client  *apiclient.Client
}

// ip runs the ip command and fails the test if it fails.
func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func newNetCluster(t *testing.T) *netCluster {
	t.Helper()
	return newNetClusterOf(t, []string{"hosta"}, []string{"hostb"})
}

// newNetClusterOf is a cluster with these storage nodes and compute nodes (each a host of its
// own, addresses in the order ctl, storage, compute).
func newNetClusterOf(t *testing.T, storage, compute []string) *netCluster {
	t.Helper()
	return newNetClusterWith(t, storage, compute, "")
}

// newNetClusterWith is newNetClusterOf with extra configuration appended to every host's
// (e.g. "[cache]" and "[[pool]]" tables); "$DIR" in it is the cluster's directory.
func newNetClusterWith(t *testing.T, storage, compute []string, extra string) *netCluster {
	t.Helper()
	requireRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2 (ip) for network namespaces")
	}
	for _, tool := range []string{"nsenter", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (util-linux)", tool)
		}
	}
	netnstest.RemoveStale(netnsPrefix)
	dir, err := os.MkdirTemp("", "spillway-netns-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	c := &netCluster{t: t, dir: dir, hosts: map[string]*netHost{}, storage: storage, compute: compute}
	t.Cleanup(c.cleanup)

	tag := fmt.Sprintf("%s%d-%d", netnsPrefix, os.Getpid(), time.Now().UnixNano()%100000)
	sw := tag + "-sw"
	ip(t, "netns", "add", sw)
	c.spaces = append(c.spaces, sw)
	ip(t, "-n", sw, "link", "add", "br0", "type", "bridge")
	ip(t, "-n", sw, "link", "set", "br0", "up")
	for i, name := range append(append([]string{"ctl"}, storage...), compute...) {
		h := &netHost{name: name, netns: tag + "-" + name, addr: subnet + strconv.Itoa(i+1)}
		ip(t, "netns", "add", h.netns)
		c.spaces = append(c.spaces, h.netns)
		veth := "v" + name
		ip(t, "link", "add", veth, "netns", sw, "type", "veth", "peer", "name", "eth0", "netns", h.netns)
		ip(t, "-n", sw, "link", "set", veth, "master", "br0", "up")
		ip(t, "-n", h.netns, "addr", "add", h.addr+"/24", "dev", "eth0")
		ip(t, "-n", h.netns, "link", "set", "eth0", "up")
		ip(t, "-n", h.netns, "link", "set", "lo", "up")
		c.hosts[name] = h
	}

	token := filepath.Join(dir, "token") // the cluster's secret: the controller's host only
	if err := os.WriteFile(token, []byte(netSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, "pfs"), 0o755)
	os.Chown(filepath.Join(dir, "pfs"), nobodyUID, nobodyGID)
	ctl := c.hosts["ctl"]
	common := fmt.Sprintf(`[controller]
state_dir = "%[1]s/state"
socket = "%[1]s/controller.sock"
listen = "%[2]s:7700"
token_file = "%[3]s"
mount_root = "%[1]s/mounts"
node_timeout = "2s"
[executor]
tick = "100ms"
retry_backoff = "100ms"
retry_backoff_max = "500ms"
max_attempts = 4
[stage]
poll_interval = "50ms"
[client]
controller = "unix:%[1]s/controller.sock"
[warpfs]
request_timeout = "%[4]s"
connect_timeout = "1s"
keepalive_interval = "500ms"
reconnect_wait = "100ms"
idle_timeout = "5s"
[cache]
allowed_pfs = ["%[1]s/pfs"]
`, dir, ctl.addr, token, netRequestTimeout) + strings.ReplaceAll(extra, "$DIR", dir)
	agent := func(h *netHost, storage bool) string {
		// Each other host holds its own node credential, never the cluster's secret.
		token := filepath.Join(dir, h.name+".token")
		if err := os.WriteFile(token, []byte(nodekey.Derive(netSecret, h.name)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := fmt.Sprintf(`[agent]
name = %q
listen = "%[2]s:7701"
advertise = "http://%[2]s:7701"
controller = "http://%[3]s:7700"
token_file = %[4]q
heartbeat_interval = "200ms"
gc_grace = "1s"
`, h.name, h.addr, ctl.addr, token)
		if storage {
			cfg += fmt.Sprintf("pool = \"wlm_pool\"\nssd_path = %q\ncapacity = \"4GiB\"\ndata_listen = \"%s:7702\"\n",
				filepath.Join(dir, h.name, "ssd"), h.addr)
		}
		return cfg
	}
	bodies := map[string]string{"ctl": common + "[agent]\nheartbeat_interval = \"200ms\"\ntoken_file = \"" + token + "\"\n"}
	for _, name := range storage {
		bodies[name] = strings.Replace(common, "[controller]", agent(c.hosts[name], true)+"[controller]", 1)
	}
	for _, name := range compute {
		bodies[name] = strings.Replace(common, "[controller]", agent(c.hosts[name], false)+"[controller]", 1)
	}
	for name, body := range bodies {
		h := c.hosts[name]
		h.config = filepath.Join(dir, name+".toml")
		if err := os.WriteFile(h.config, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.client, _ = apiclient.New("unix:"+dir+"/controller.sock", apiclient.Options{ConnectRetries: 1, RequestTimeout: 10 * time.Second})
	return c
}

// start runs a host's daemon in its namespaces.
func (c *netCluster) start(name string) {
	c.t.Helper()
	h := c.hosts[name]
	role := "agent"
	if name == "ctl" {
		role = "controller"
	}
	log, _ := os.OpenFile(filepath.Join(c.dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	// ip netns exec enters the network namespace and a new mount namespace, then execs the
	// daemon: the process is the daemon.
	h.cmd = exec.Command("ip", "netns", "exec", h.netns, binary, role, "--config", h.config)
	h.cmd.Env = []string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin"}
	h.cmd.Stdout, h.cmd.Stderr = log, log
	if err := h.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	h.exited = make(chan struct{})
	cmd, exited := h.cmd, h.exited
	go func() { cmd.Wait(); log.Close(); close(exited) }()
	running := func() bool {
		select {
		case <-exited:
			logs, _ := os.ReadFile(filepath.Join(c.dir, name+".log"))
			c.t.Fatalf("the %s of %s exited:\n%s", role, name, logs)
		default:
		}
		return true
	}
	if name == "ctl" {
		c.waitFor("the controller to answer", func() bool {
			_, err := c.client.All(context.Background())
			return running() && err == nil
		})
		return
	}
	storage := false
	for _, s := range c.storage {
		storage = storage || s == name
	}
	c.waitFor(name+" to be online", func() bool {
		running()
		all, err := c.client.All(context.Background())
		if err != nil {
			return false
		}
		for _, n := range all.Nodes {
			if n.ID == name && n.Online {
				if storage && n.Pool == "" {
					// Its node key makes it no storage node: the administrator admits it
					// (dwcli update node --name NAME --storage), its next heartbeat counts.
					admit := true
					c.client.UpdateNode(context.Background(), name, controllerapi.NodeUpdate{Storage: &admit})
					return false
				}
				return true
			}
		}
		return false
	})
}

// stop ends a host's daemon: SIGTERM, or SIGKILL when kill (a crash).
func (c *netCluster) stop(name string, kill bool) {
	h := c.hosts[name]
	if h == nil || h.cmd == nil {
		return
	}
	sig := syscall.SIGTERM
	if kill {
		sig = syscall.SIGKILL
	}
	h.cmd.Process.Signal(sig)
	select {
	case <-h.exited:
	case <-time.After(10 * time.Second):
		h.cmd.Process.Kill()
		<-h.exited
	}
	h.cmd = nil
}

func (c *netCluster) cleanup() {
	for _, name := range append(append(append([]string(nil), c.compute...), c.storage...), "ctl") {
		c.stop(name, false)
	}
	for i := len(c.spaces) - 1; i >= 0; i-- {
		if out, err := exec.Command("ip", "netns", "del", c.spaces[i]).CombinedOutput(); err != nil {
			c.t.Errorf("removing network namespace %s: %v: %s", c.spaces[i], err, out)
		}
	}
	if c.t.Failed() {
		logs, _ := exec.Command("sh", "-c", "tail -n 30 "+c.dir+"/*.log").CombinedOutput()
		c.t.Logf("daemon logs:\n%s", logs)
	}
	for _, m := range mountsUnder(c.dir) {
		syscall.Unmount(m, syscall.MNT_DETACH)
	}
	os.RemoveAll(c.dir)
}

func (c *netCluster) waitFor(what string, ok func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// wlm runs dw_wlm_cli as slurmctld would, against the controller's socket.
func (c *netCluster) wlm(args ...string) string {
	c.t.Helper()
	link := filepath.Join(c.dir, "dw_wlm_cli")
	if _, err := os.Lstat(link); err != nil {
		os.Symlink(smallBinary, link)
	}
	cmd := exec.Command(link, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "SPILLWAY_CONFIG=" + c.hosts["ctl"].config}
	cmd.Dir = c.dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 0 || errb.Len() > 0 {
		c.t.Fatalf("dw_wlm_cli %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
	}
	return out.String()
}

// onHost returns a command that runs script as nobody inside a host's network and mount
// namespaces (those of its agent): what a job's process on that node sees.
func (c *netCluster) onHost(name, script string) *exec.Cmd {
	pid := strconv.Itoa(c.hosts[name].cmd.Process.Pid)
	cmd := exec.Command("nsenter", "-t", pid, "-m", "-n", "--",
		"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/"}
	cmd.Dir = "/"
	return cmd
}

// spillwayMounts lists the Spillway mounts under this cluster's directory in a host's mount
// namespace (the namespace starts as a copy of the machine's, which may hold other mounts).
func (c *netCluster) spillwayMounts(name string) []string {
	raw, _ := os.ReadFile("/proc/" + strconv.Itoa(c.hosts[name].cmd.Process.Pid) + "/mountinfo")
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, " - fuse.spillway ") {
			if mp := strings.Fields(line)[4]; strings.HasPrefix(mp, c.dir+"/") {
				out = append(out, mp)
			}
		}
	}
	return out
}

// fragments lists the fragment directories on the storage nodes (hosta, or those named).
func (c *netCluster) fragments(hosts ...string) []os.DirEntry {
	if len(hosts) == 0 {
		hosts = []string{"hosta"}
	}
	var out []os.DirEntry
	for _, h := range hosts {
		entries, _ := os.ReadDir(filepath.Join(c.dir, h, "ssd", "fragment"))
		out = append(out, entries...)
	}
	return out
}

// jobFile writes a job script as Slurm stores it.
func (c *netCluster) jobFile(name, body string) string {
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		c.t.Fatal(err)
	}
	return p
}

func (c *netCluster) assertClean() {
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
	if f := c.fragments(c.storage...); len(f) != 0 {
		c.t.Errorf("%d fragment directories left on the storage nodes", len(f))
	}
	for _, h := range append(append([]string(nil), c.compute...), c.storage...) {
		if c.hosts[h].cmd == nil {
			continue
		}
		if m := c.spillwayMounts(h); len(m) != 0 {
			c.t.Errorf("mounts left on %s: %v", h, m)
		}
	}
	if m := mountsUnder(c.dir); len(m) != 0 {
		c.t.Errorf("mounts leaked into the test's own mount namespace: %v", m)
	}
}

// TestRemoteMountAcrossHosts drives a job with dw_wlm_cli as Slurm does, its instance on
// storage node hosta and its process on compute node hostb, which mounts the namespace over
// the network; then kills hosta under a running job.
func TestRemoteMountAcrossHosts(t *testing.T) {
	c := newNetCluster(t)
	c.start("ctl")
	c.start("hosta")
	c.start("hostb")

	// Root on compute node hostb holds hostb's credential: it cannot administer the
	// controller, nor speak for another node.
	hostb := nodekey.Derive(netSecret, "hostb")
	for _, tc := range []struct{ path, body string }{
		{"/dw/v1/pools", `{"id":"evil","granularity":1}`},
		{"/dw/v1/nodes/hosta/heartbeat", `{"name":"hosta"}`},
	} {
		out, _ := exec.Command("ip", "netns", "exec", c.hosts["hostb"].netns, "/usr/bin/python3", "-c", `
import http.client, sys
c = http.client.HTTPConnection(sys.argv[1])
c.request("POST", sys.argv[2], body=sys.argv[3], headers={"Authorization": "Bearer " + sys.argv[4]})
r = c.getresponse()
print(r.status, r.read().decode())
`, c.hosts["ctl"].addr+":7700", tc.path, tc.body, hostb).CombinedOutput()
		if !strings.HasPrefix(string(out), "403 ") {
			t.Errorf("hostb's credential, POST %s: %s, want 403", tc.path, out)
		}
	}

	pfs := filepath.Join(c.dir, "pfs")
	in := filepath.Join(pfs, "in.dat")
	if err := os.WriteFile(in, []byte("staged in from the PFS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chown(in, nobodyUID, nobodyGID)
	job := c.jobFile("job.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n"+
		"#DW stage_in type=file source="+in+" destination=$DW_JOB_STRIPED/in.dat\n"+
		"#DW stage_out type=file source=$DW_JOB_STRIPED/out.dat destination="+pfs+"/out.dat\n"+
		"srun ./a.out\n\x00")
	nodes := c.jobFile("nodes", "hostb\n")

	c.wlm("--function", "job_process", "--job", job)
	c.wlm("--function", "setup", "--token", "50", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:1GiB", "--job", job)
	c.wlm("--function", "data_in", "--token", "50", "--job", job)
	pathfile := filepath.Join(c.dir, "paths")
	c.wlm("--function", "paths", "--token", "50", "--job", job, "--pathfile", pathfile)
	env, _ := os.ReadFile(pathfile)
	mount := strings.TrimPrefix(strings.TrimSpace(string(env)), "DW_JOB_STRIPED=")
	if !strings.HasPrefix(mount, c.dir+"/mounts/") {
		t.Fatalf("path file: %q", env)
	}
	c.wlm("--function", "pre_run", "--token", "50", "--job", job, "--nodehostnamefile", nodes)

	// The job's process on hostb, as its user.
	out, err := c.onHost("hostb", "set -e; cd "+mount+"; cat in.dat; echo 'result from hostb' > out.dat; "+
		"stat -c '%u:%g %s' out.dat; df -B1 --output=size,target . | tail -1").CombinedOutput()
	if err != nil {
		t.Fatalf("the job on hostb: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "staged in from the PFS") || !strings.Contains(string(out), "65534:65534 18") ||
		!strings.Contains(string(out), strconv.Itoa(1<<30)) {
		t.Errorf("the job on hostb saw:\n%s", out)
	}
	if m := c.spillwayMounts("hostb"); len(m) != 1 || m[0] != strings.TrimSuffix(mount, "/") {
		t.Errorf("hostb's mounts: %v", m)
	}
	if m := mountsUnder(c.dir); len(m) != 0 {
		t.Errorf("hostb's mount is visible outside its mount namespace: %v", m)
	}
	written, _ := filepath.Glob(filepath.Join(c.dir, "hosta", "ssd", "fragment", "*", "namespace", "*", "out.dat"))
	if len(written) != 1 {
		t.Fatalf("out.dat is not in hosta's fragment: %v", written)
	}
	if st, err := os.Stat(written[0]); err != nil || st.Sys().(*syscall.Stat_t).Uid != nobodyUID {
		t.Errorf("out.dat on hosta: %v %v; want it owned by nobody", st, err)
	}

	c.wlm("--function", "post_run", "--token", "50", "--job", job)
	if m := c.spillwayMounts("hostb"); len(m) != 0 {
		t.Errorf("post_run left %v mounted on hostb", m)
	}
	c.wlm("--function", "data_out", "--token", "50", "--job", job)
	if got, err := os.ReadFile(filepath.Join(pfs, "out.dat")); err != nil || string(got) != "result from hostb\n" {
		t.Errorf("staged out: %q %v", got, err)
	}
	c.wlm("--function", "teardown", "--token", "50", "--job", job)
	c.assertClean()

	t.Run("storage node killed", func(t *testing.T) { c.killStorageUnderAJob(t) })
	c.assertClean()
}

// killStorageUnderAJob: hosta dies while a process on hostb writes into the mount; the
// process gets an error within the configured bound, the job is torn down, and hosta cleans
// its disk when it comes back.
func (c *netCluster) killStorageUnderAJob(t *testing.T) {
	job := c.jobFile("job51.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n\x00")
	nodes := c.jobFile("nodes51", "hostb\n")
	c.wlm("--function", "setup", "--token", "51", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:1GiB", "--job", job)
	pathfile := filepath.Join(c.dir, "paths51")
	c.wlm("--function", "paths", "--token", "51", "--job", job, "--pathfile", pathfile)
	env, _ := os.ReadFile(pathfile)
	mount := strings.TrimPrefix(strings.TrimSpace(string(env)), "DW_JOB_STRIPED=")
	c.wlm("--function", "pre_run", "--token", "51", "--job", job, "--nodehostnamefile", nodes)

	// A writer with its file open, and a process that stats every 100ms.
	writer := c.onHost("hostb", "exec 3>"+mount+"log; echo started; while echo line >&3; do sleep 0.1; done; echo writer-failed")
	stdout, _ := writer.StdoutPipe()
	writer.Stderr = writer.Stdout
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	// One goroutine reads the writer's output and reaps it; the cleanup kills it if the test
	// ends first.
	started, failed, writerDone := make(chan string, 1), make(chan string, 1), make(chan struct{})
	go func() {
		lines := bufio.NewScanner(stdout)
		lines.Scan()
		started <- lines.Text()
		var rest []string
		for lines.Scan() {
			rest = append(rest, lines.Text())
		}
		writer.Wait()
		close(writerDone)
		failed <- strings.Join(rest, "\n")
	}()
	t.Cleanup(func() {
		writer.Process.Kill()
		<-writerDone
	})
	select {
	case first := <-started:
		if first != "started" {
			t.Fatalf("the writer on hostb did not start: %q", first)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the writer on hostb did not start within 30s")
	}
	time.Sleep(300 * time.Millisecond)

	c.stop("hosta", true)
	killed := time.Now()
	select {
	case rest := <-failed:
		took := time.Since(killed)
		if !strings.Contains(rest, "writer-failed") ||
			!(strings.Contains(rest, "I/O error") || strings.Contains(rest, "Input/output error") || strings.Contains(rest, "not connected")) {
			t.Errorf("the writer ended with %q", rest)
		}
		if took > netRequestTimeout+netSlack {
			t.Errorf("the writer got its error %s after the storage node died; the bound is %s", took, netRequestTimeout)
		}
		t.Logf("the writer on hostb failed %s after hosta died: %s", took.Round(10*time.Millisecond), rest)
	case <-time.After(netRequestTimeout + netSlack + 5*time.Second):
		t.Fatal("the writer on hostb still runs: a dead storage node must fail its I/O, not hang it")
	}
	start := time.Now()
	if out, err := c.onHost("hostb", "ls -l "+mount).CombinedOutput(); err == nil {
		t.Errorf("listing the mount of a dead storage node worked: %s", out)
	}
	if took := time.Since(start); took > netRequestTimeout+netSlack {
		t.Errorf("ls took %s on a dead storage node", took)
	}

	// The job ends: unmount, and a teardown that does not wait for the dead node.
	c.wlm("--function", "post_run", "--token", "51", "--job", job)
	if m := c.spillwayMounts("hostb"); len(m) != 0 {
		t.Errorf("post_run left %v mounted on hostb", m)
	}
	c.waitFor("hosta to go offline", func() bool {
		all, _ := c.client.All(context.Background())
		for _, n := range all.Nodes {
			if n.ID == "hosta" {
				return !n.Online
			}
		}
		return false
	})
	c.wlm("--function", "teardown", "--token", "51", "--job", job, "--hurry")
	if len(c.fragments()) != 1 {
		t.Fatalf("hosta's fragment should wait on its disk for hosta to return: %v", c.fragments())
	}
	c.start("hosta")
	c.waitFor("hosta to remove the orphan fragment", func() bool { return len(c.fragments()) == 0 })
}
