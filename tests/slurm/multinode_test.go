package slurm

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/netnstest"
)

// A Slurm cluster of several hosts on this one machine. Each host is a network namespace with
// its own address on a private subnet (joined by a bridge in a namespace of its own, so the
// machine's interfaces are never touched):
//
//	ctl  10.78.0.1   slurmctld, the Spillway controller (dw_wlm_cli runs here, as SlurmUser)
//	bb1  10.78.0.2   a Spillway storage node: the pool's SSD, the data server (warpfs)
//	bb2  10.78.0.3   a second storage node: a 2 GiB instance is striped over both
//	cn1  10.78.0.11  a compute node: slurmd and a Spillway agent (client role)
//	cn2  10.78.0.12  a compute node: slurmd and a Spillway agent (client role)
//
// A compute host's slurmd and agent share a mount and UTS namespace of their own, so a job's
// instance is mounted only on the hosts Slurm gave the job, by that host's agent, over TCP
// from the storage node — as on a real machine. Jobs use srun across both compute nodes.

const (
	multiPrefix = "spwslurm-"
	multiSubnet = "10.78.0."
)

// multiHost is one host of the cluster and the Spillway daemon in it.
type multiHost struct {
	name, netns, addr string
	argv              []string // the daemon's command line, to restart it
	daemon            *exec.Cmd
	exited            chan struct{}
}

type multiCluster struct {
	*cluster
	hosts       []*multiHost // ctl, bb1, bb2, cn1, cn2 (and ctl2 with ha)
	etcdHosts   []*multiHost // with ha: e1, e2, e3, stopped after every Spillway daemon
	bridge      string       // the bridge's namespace
	madeUser    bool
	madeMunge   bool
	slurmPIDs   []string // pid files of slurmctld and the slurmds
	spillwayBin string
}

// computeHosts are the hosts that run slurmd: cn1 and cn2.
func (m *multiCluster) computeHosts() []*multiHost {
	var out []*multiHost
	for _, h := range m.hosts {
		if strings.HasPrefix(h.name, "cn") {
			out = append(out, h)
		}
	}
	return out
}

func (m *multiCluster) host(name string) *multiHost {
	for _, h := range m.hosts {
		if h.name == name {
			return h
		}
	}
	panic("no host " + name)
}

// must runs a command as root and fails the test if it fails.
func (m *multiCluster) must(program string, args ...string) string {
	m.t.Helper()
	r := run(time.Minute, "", nil, program, args...)
	if r.code != 0 {
		m.t.Fatalf("%s %s: %s", program, strings.Join(args, " "), r)
	}
	return r.stdout
}

// upMulti brings up the four hosts with Slurm's given burst-buffer plugin.
func upMulti(t *testing.T, plugin string) *multiCluster {
	t.Helper()
	return upMultiOf(t, plugin, false)
}

// upMultiOf is upMulti, with ha: the state in a three-member etcd cluster (e1, e2, e3 on
// 10.78.0.21-23) and a second controller on ctl2 (10.78.0.4) with [ha] enabled; ctl's
// controller starts first and leads. dw_wlm_cli, dwstat and the agents are given both
// controllers.
func upMultiOf(t *testing.T, plugin string, ha bool) *multiCluster {
	t.Helper()
	for _, tool := range []string{"ip", "nsenter", "unshare", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the multi-node tests need %s (iproute2, util-linux)", tool)
		}
	}
	netnstest.RemoveStale(multiPrefix)
	dir, err := os.MkdirTemp("/var/tmp", "spillway-slurm-multi-")
	if err != nil {
		t.Fatal(err)
	}
	m := &multiCluster{cluster: &cluster{t: t, root: t, dir: dir, plugin: plugin}}
	m.stop = m.down
	t.Cleanup(m.cluster.down)
	for _, d := range []string{"bin", "etc", "log", "run", "mounts", "ssd", "state", "slurm/state", "pfs/" + testUser} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(dir, 0o755)
	m.spillwayBin = filepath.Join(dir, "bin", "spillway")
	m.must("install", "-m", "0755", binary, m.spillwayBin)
	// Slurm's dw_wlm_cli and dwstat are the small binary, as installed.
	m.must("install", "-m", "0755", smallBinary, filepath.Join(dir, "bin", "dw_wlm_cli"))
	for _, name := range []string{"dwstat", "dwcli"} {
		os.Symlink("dw_wlm_cli", filepath.Join(dir, "bin", name))
	}

	// The ordinary user.
	if _, err := user.Lookup(testUser); err != nil {
		m.must("useradd", "--create-home", "--user-group", "--shell", "/bin/bash", testUser)
		m.madeUser = true
	}
	u, err := user.Lookup(testUser)
	if err != nil {
		t.Fatal(err)
	}
	m.uid, _ = strconv.Atoi(u.Uid)
	m.gid, _ = strconv.Atoi(u.Gid)
	m.pfs = filepath.Join(dir, "pfs", testUser)
	os.Chown(m.pfs, m.uid, m.gid)

	// The hosts.
	tag := fmt.Sprintf("%s%d-%d", multiPrefix, os.Getpid(), time.Now().UnixNano()%100000)
	m.bridge = tag + "-sw"
	m.must("ip", "netns", "add", m.bridge)
	m.must("ip", "-n", m.bridge, "link", "add", "br0", "type", "bridge")
	m.must("ip", "-n", m.bridge, "link", "set", "br0", "up")
	hostList := []struct{ name, host string }{{"ctl", "1"}, {"bb1", "2"}, {"bb2", "3"}, {"cn1", "11"}, {"cn2", "12"}}
	if ha {
		hostList = append(hostList, struct{ name, host string }{"ctl2", "4"},
			struct{ name, host string }{"e1", "21"}, struct{ name, host string }{"e2", "22"}, struct{ name, host string }{"e3", "23"})
	}
	for _, h := range hostList {
		mh := &multiHost{name: h.name, netns: tag + "-" + h.name, addr: multiSubnet + h.host}
		m.must("ip", "netns", "add", mh.netns)
		if strings.HasPrefix(h.name, "e") {
			m.etcdHosts = append(m.etcdHosts, mh)
		} else {
			m.hosts = append(m.hosts, mh)
		}
		veth := "v" + strconv.Itoa(os.Getpid()%10000) + h.name
		m.must("ip", "link", "add", veth, "netns", m.bridge, "type", "veth", "peer", "name", "eth0", "netns", mh.netns)
		m.must("ip", "-n", m.bridge, "link", "set", veth, "master", "br0", "up")
		m.must("ip", "-n", mh.netns, "addr", "add", mh.addr+"/24", "dev", "eth0")
		m.must("ip", "-n", mh.netns, "link", "set", "eth0", "up")
		m.must("ip", "-n", mh.netns, "link", "set", "lo", "up")
	}
	m.netns = "/run/netns/" + m.host("ctl").netns

	// Spillway: the controller on ctl, storage on bb1 and bb2, clients on cn1 and cn2.
	token := filepath.Join(dir, "etc", "token")
	if err := os.WriteFile(token, []byte("multi-node-test-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctl := m.host("ctl")
	conf := filepath.Join(dir, "etc", "spillway.toml")
	m.writeConfig(conf, fmt.Sprintf(`[controller]
state_dir = "%[1]s/state"
socket = "%[1]s/run/controller.sock"
listen = "%[2]s:7700"
token_file = %[3]q
mount_root = "%[1]s/mounts"
wlm_users = ["slurm"]
# A dead storage node is noticed within seconds (the storage_node_dies scenario).
node_timeout = "3s"

[agent]
# Read by the check that agents report well within node_timeout (the agents' own files say the same).
heartbeat_interval = "500ms"

[client]
controller = "unix:%[1]s/run/controller.sock"

[[pool]]
name = "wlm_pool"
granularity = "1GiB"
`, dir, ctl.addr, token))
	controllers := "http://" + ctl.addr + ":7700"
	if ha {
		controllers = m.setUpHA(conf, token)
	}
	for _, h := range m.hosts[1:] {
		if h.name == "ctl2" {
			continue
		}
		// A compute node keeps its swap areas' records and mounts under its ssd_path.
		role := fmt.Sprintf("ssd_path = \"%s/ssd/%s\"\n", dir, h.name)
		if strings.HasPrefix(h.name, "bb") {
			role = fmt.Sprintf("pool = \"wlm_pool\"\nssd_path = \"%s/ssd/%s\"\ncapacity = \"8GiB\"\ndata_listen = \"%s:7702\"\n", dir, h.name, h.addr)
		}
		m.writeConfig(filepath.Join(dir, "etc", h.name+".toml"), fmt.Sprintf(`[agent]
name = %[1]q
listen = "%[2]s:7701"
advertise = "http://%[2]s:7701"
controller = %[3]q
token_file = %[4]q
heartbeat_interval = "500ms"
gc_grace = "1s"
%[5]s
[warpfs]
request_timeout = "3s"
connect_timeout = "1s"
`, h.name, h.addr, controllers, token, role))
	}
	// A compute node's own configuration: users' commands there (dwstat, dwcli stage, the
	// libdatawarp calls) reach the controller over TCP and authenticate with MUNGE, as on a
	// cluster whose controller's socket is on another host.
	m.writeConfig(filepath.Join(dir, "etc", "compute.toml"), fmt.Sprintf("[client]\ncontroller = %q\n", controllers))
	m.env = []string{
		"SLURM_CONF=" + filepath.Join(dir, "etc/slurm.conf"),
		"SPILLWAY_CONFIG=" + conf,
		"PATH=" + filepath.Join(dir, "bin") + ":/usr/sbin:/usr/bin:/sbin:/bin",
	}
	m.startDaemon(ctl, "nsenter", "--net=/run/netns/"+ctl.netns, "--", m.spillwayBin, "controller", "--config", conf)
	m.waitFor(20*time.Second, "the Spillway controller to answer", func() bool { return m.admin("dwstat", "pools").code == 0 })
	if ha {
		m.waitFor(20*time.Second, "ctl's controller to lead", func() bool { return strings.Contains(m.logOf("ctl"), "elected leader") })
		ctl2 := m.host("ctl2")
		m.startDaemon(ctl2, "nsenter", "--net=/run/netns/"+ctl2.netns, "--", m.spillwayBin, "controller", "--config", filepath.Join(dir, "etc", "ctl2.toml"))
		m.waitFor(20*time.Second, "ctl2's controller to campaign", func() bool { return strings.Contains(m.logOf("ctl2"), "campaigning for leadership") })
	}
	for _, h := range m.hosts[1:] {
		if h.name == "ctl2" {
			continue
		}
		// A host of its own: its network, and a mount and UTS namespace that its slurmd
		// joins below (FUSE mounts made by the agent are seen by that host's jobs only).
		m.startDaemon(h, "nsenter", "--net=/run/netns/"+h.netns, "--", "unshare", "--mount", "--uts", "--propagation", "slave", "--",
			"sh", "-c", `hostname "$1" && exec "$2" agent --config "$3"`, "sh", h.name, m.spillwayBin, filepath.Join(dir, "etc", h.name+".toml"))
	}
	m.waitFor(30*time.Second, "the four agents to be online", func() bool {
		return len(regexp.MustCompile(`(?m)^ *(bb1|bb2|cn1|cn2) .* online `).FindAllString(m.admin("dwstat", "nodes").stdout, -1)) == 4
	})
	// Their node keys make bb1 and bb2 no storage nodes: the administrator admits them, and
	// their next heartbeats put them in the pool.
	for _, bb := range []string{"bb1", "bb2"} {
		if r := m.admin("dwcli", "update", "node", "--name", bb, "--storage"); r.code != 0 {
			t.Fatalf("admitting %s for storage: %s", bb, r)
		}
	}
	m.waitFor(30*time.Second, "bb1 and bb2 in wlm_pool", func() bool {
		return len(regexp.MustCompile(`(?m)^ *(bb1|bb2) +wlm_pool +online `).FindAllString(m.admin("dwstat", "nodes").stdout, -1)) == 2
	})
	for _, h := range []string{"cn1", "cn2"} {
		m.mountTables = append(m.mountTables, fmt.Sprintf("/proc/%d/mounts", m.host(h).daemon.Process.Pid))
	}

	m.startSlurm()
	return m
}

// setUpHA starts the etcd members, puts the state in them and [ha] in the controller's
// configuration conf, writes ctl2's, and returns both controllers' addresses for the clients.
// slurmctld's dw_wlm_cli reaches the controller on the other host over TCP: it reads the
// cluster's token, which SlurmUser may read (docs/admin.md, High availability).
func (m *multiCluster) setUpHA(conf, token string) string {
	m.t.Helper()
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		m.t.Fatal("the HA scenario needs etcd (Debian: etcd-server)")
	}
	var initial, endpoints []string
	for _, h := range m.etcdHosts {
		initial = append(initial, fmt.Sprintf("%s=http://%s:2380", h.name, h.addr))
		endpoints = append(endpoints, fmt.Sprintf("%q", "http://"+h.addr+":2379"))
	}
	for _, h := range m.etcdHosts {
		m.startDaemon(h, "nsenter", "--net=/run/netns/"+h.netns, "--", etcdBin, "--name", h.name, "--data-dir", filepath.Join(m.dir, "state", h.name+".etcd"),
			"--listen-client-urls", "http://"+h.addr+":2379", "--advertise-client-urls", "http://"+h.addr+":2379",
			"--listen-peer-urls", "http://"+h.addr+":2380", "--initial-advertise-peer-urls", "http://"+h.addr+":2380",
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new", "--initial-cluster-token", filepath.Base(m.dir))
	}
	m.must("chgrp", "slurm", token)
	os.Chmod(token, 0o640)
	ctl, ctl2 := m.host("ctl"), m.host("ctl2")
	controllers := "http://" + ctl.addr + ":7700,http://" + ctl2.addr + ":7700"
	body, err := os.ReadFile(conf)
	if err != nil {
		m.t.Fatal(err)
	}
	ha := fmt.Sprintf(`
[store]
engine = "etcd"
etcd_endpoints = [%s]

[ha]
enabled = true
advertise = "http://%%s:7700"
`, strings.Join(endpoints, ", "))
	// A failover takes about ha.lease_ttl (5 s), when no heartbeat lands: node_timeout must be
	// at least twice that (the configuration refuses less).
	body = []byte(strings.Replace(string(body), `node_timeout = "3s"`, `node_timeout = "15s"`, 1))
	text := strings.Replace(string(body), `controller = "unix:`+m.dir+`/run/controller.sock"`,
		fmt.Sprintf("controller = %q\ntoken_file = %q\nconnect_retries = 120\nretry_wait = \"500ms\"\nconnect_timeout = \"1s\"",
			"unix:"+m.dir+"/run/controller.sock,"+controllers, token), 1)
	m.writeConfig(conf, text+fmt.Sprintf(ha, ctl.addr))
	text2 := strings.Replace(text, ctl.addr+":7700", ctl2.addr+":7700", 1)
	text2 = strings.Replace(text2, `socket = "`+m.dir+`/run/controller.sock"`, `socket = "`+m.dir+`/run/controller2.sock"`, 1)
	m.writeConfig(filepath.Join(m.dir, "etc", "ctl2.toml"), text2+fmt.Sprintf(ha, ctl2.addr))
	return controllers
}

// logOf is the log of a host's Spillway daemon.
func (m *multiCluster) logOf(host string) string {
	raw, _ := os.ReadFile(filepath.Join(m.dir, "log", "spillway-"+host+".log"))
	return string(raw)
}

func (m *multiCluster) writeConfig(path, body string) {
	m.t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		m.t.Fatal(err)
	}
}

// startDaemon runs a Spillway daemon in the background with its output in log/HOST.log.
func (m *multiCluster) startDaemon(h *multiHost, program string, args ...string) {
	m.t.Helper()
	log, err := os.OpenFile(filepath.Join(m.dir, "log", "spillway-"+h.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		m.t.Fatal(err)
	}
	h.argv = append([]string{program}, args...)
	h.daemon = exec.Command(program, args...)
	h.daemon.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	h.daemon.Stdout, h.daemon.Stderr = log, log
	h.daemon.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := h.daemon.Start(); err != nil {
		m.t.Fatal(err)
	}
	h.exited = make(chan struct{})
	cmd, exited := h.daemon, h.exited
	go func() { cmd.Wait(); log.Close(); close(exited) }()
}

// startSlurm starts munged (unless one answers), slurmctld on ctl and a slurmd on each compute
// host, inside the namespaces of that host's agent.
func (m *multiCluster) startSlurm() {
	m.t.Helper()
	if run(10*time.Second, "", nil, "sh", "-c", "munge -n | unmunge").code != 0 {
		os.MkdirAll("/run/munge", 0o755)
		m.must("chown", "munge:munge", "/run/munge")
		m.must("runuser", "-u", "munge", "--", "/usr/sbin/munged")
		m.madeMunge = true
		m.waitFor(10*time.Second, "munged to answer", func() bool {
			return run(10*time.Second, "", nil, "sh", "-c", "munge -n | unmunge").code == 0
		})
	}
	host, _ := os.Hostname()
	host, _, _ = strings.Cut(host, ".")
	cpus := strconv.Itoa(runtime.NumCPU()) // what slurmd finds; a node may not claim more
	d := m.dir
	var nodes strings.Builder
	for _, h := range m.computeHosts() {
		os.MkdirAll(filepath.Join(d, "slurm", "spool-"+h.name), 0o755)
		fmt.Fprintf(&nodes, "NodeName=%s NodeAddr=%s CPUs=%s RealMemory=500 State=UNKNOWN\n", h.name, h.addr, cpus)
	}
	// As deploy/single-host/up.sh's, with one slurmd per compute host (%n: its node name).
	m.writeConfig(filepath.Join(d, "etc/slurm.conf"), fmt.Sprintf(`ClusterName=spwmulti
SlurmctldHost=%[2]s(%[3]s)
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=%[1]s/slurm/state
SlurmdSpoolDir=%[1]s/slurm/spool-%%n
SlurmctldPidFile=%[1]s/run/slurmctld.pid
SlurmdPidFile=%[1]s/run/slurmd-%%n.pid
SlurmctldLogFile=%[1]s/log/slurmctld.log
SlurmdLogFile=%[1]s/log/slurmd-%%n.log
SlurmctldDebug=debug
DebugFlags=BurstBuffer
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=30
MailProg=/bin/true
BurstBufferType=burst_buffer/%[4]s
MessageTimeout=10
%[5]sPartitionName=debug Nodes=cn1,cn2 Default=YES MaxTime=INFINITE State=UP
`, d, host, m.host("ctl").addr, m.plugin, nodes.String()))
	if m.plugin == "datawarp" {
		m.writeConfig(filepath.Join(d, "etc/burst_buffer.conf"), fmt.Sprintf(`GetSysState=%[1]s/bin/dw_wlm_cli
GetSysStatus=%[1]s/bin/dwstat
DefaultPool=wlm_pool
Flags=EnablePersistent
ValidateTimeout=5
OtherTimeout=300
`, d))
	} else {
		m.writeConfig(filepath.Join(d, "etc/burst_buffer.conf"), "Directive=DW\nValidateTimeout=5\nOtherTimeout=300\n")
		m.must("install", "-m", "0644", filepath.Join(top, "deploy/slurm/burst_buffer.lua"), filepath.Join(d, "etc/burst_buffer.lua"))
	}
	m.must("chown", "slurm:", filepath.Join(d, "slurm/state"), filepath.Join(d, "log"), filepath.Join(d, "run"))
	os.Chmod(filepath.Join(d, "slurm/state"), 0o700)

	ctl := m.host("ctl")
	slurmctld := append([]string{"--net=/run/netns/" + ctl.netns, "--", "env"}, m.env...)
	slurmctld = append(slurmctld, "SPILLWAY_DW_WLM_CLI="+filepath.Join(d, "bin/dw_wlm_cli"), "SPILLWAY_DWSTAT="+filepath.Join(d, "bin/dwstat"),
		"/usr/sbin/slurmctld", "-f", filepath.Join(d, "etc/slurm.conf"))
	m.must("nsenter", slurmctld...)
	m.slurmPIDs = append(m.slurmPIDs, filepath.Join(d, "run/slurmctld.pid"))
	for _, h := range m.computeHosts() {
		m.must("nsenter", "-t", strconv.Itoa(h.daemon.Process.Pid), "--net", "--mount", "--uts", "--",
			"/usr/sbin/slurmd", "-f", filepath.Join(d, "etc/slurm.conf"), "-N", h.name)
		m.slurmPIDs = append(m.slurmPIDs, filepath.Join(d, "run", "slurmd-"+h.name+".pid"))
	}
	m.waitFor(60*time.Second, "both compute nodes idle in sinfo", func() bool {
		return strings.TrimSpace(m.admin("sinfo", "-h", "-o", "%T %D").stdout) == "idle 2"
	})
	m.waitFor(30*time.Second, "Slurm seeing Spillway's pool", func() bool {
		return strings.Contains(m.admin("scontrol", "show", "burst").stdout, "TotalSpace=16GiB")
	})
}

// down stops everything by PID and removes what upMulti made.
func (m *multiCluster) down() {
	m.admin("scancel", "--hurry", "--user", testUser)
	for _, pidFile := range m.slurmPIDs {
		stopPIDFile(m.t, pidFile)
	}
	for i := len(m.hosts) - 1; i >= 0; i-- {
		if h := m.hosts[i]; h.daemon != nil {
			h.daemon.Process.Signal(syscall.SIGTERM)
			select {
			case <-h.exited:
			case <-time.After(15 * time.Second):
				m.t.Errorf("the Spillway daemon of %s did not stop within 15 s of SIGTERM; killed", h.name)
				h.daemon.Process.Kill()
				<-h.exited
			}
		}
	}
	for _, h := range m.etcdHosts {
		if h.daemon != nil {
			h.daemon.Process.Signal(syscall.SIGTERM)
			<-h.exited
		}
	}
	if m.madeMunge {
		stopPIDFile(m.t, "/run/munge/munged.pid")
	}
	for _, h := range append(m.hosts, m.etcdHosts...) {
		exec.Command("ip", "netns", "del", h.netns).Run()
	}
	if m.bridge != "" {
		exec.Command("ip", "netns", "del", m.bridge).Run()
	}
	if m.madeUser {
		exec.Command("pkill", "-KILL", "-u", testUser).Run() // job steps slurmd left would stop userdel
		if r := run(time.Minute, "", nil, "userdel", "--remove", testUser); r.code != 0 {
			m.t.Errorf("userdel %s: %s", testUser, r)
		}
	}
	if err := os.RemoveAll(m.dir); err != nil {
		m.t.Errorf("removing %s: %v", m.dir, err)
	}
}

// stopPIDFile sends SIGTERM to the process a pid file names and waits for it to end.
func stopPIDFile(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 1 {
		return
	}
	syscall.Kill(pid, syscall.SIGTERM)
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
	}
	t.Errorf("%s (pid %d) did not stop within 20 s of SIGTERM; killed", path, pid)
	syscall.Kill(pid, syscall.SIGKILL)
}

// TestMultiNodeDatawarp runs jobs across two compute nodes through burst_buffer/datawarp.
func TestMultiNodeDatawarp(t *testing.T) {
	m := upMulti(t, "datawarp")
	m.run("two_nodes_striped_private", (*cluster).twoNodes)
	m.run("spans_both_storage_nodes", func(c *cluster, t *testing.T) { c.spansBothStorageNodes(t, m) })
	m.run("only_the_jobs_nodes", (*cluster).onlyJobsNodes)
	m.run("persistent_on_two_nodes", (*cluster).persistentTwoNodes)
	m.run("storage_node_dies", func(c *cluster, t *testing.T) { c.storageNodeDies(t, m) })
	m.run("libdatawarp_checkpoints", func(c *cluster, t *testing.T) { c.libdatawarpCheckpoints(t, m) })
	m.run("libdatawarp_every_function", func(c *cluster, t *testing.T) { c.libdatawarpEveryFunction(t, m) })
	m.run("swap_on_two_nodes", (*cluster).swapTwoNodes)
	m.assertClean()
}

// A #SBATCH -N2 job with #DW swap 1GiB: Slurm counts the swap as 2 bytes (one granule);
// Spillway reserves 1GiB for each of the job's 2 nodes (real_size 2GiB), each compute node
// attaches its own area (remote: the storage nodes are other hosts), and both are gone after
// the job. /proc/swaps is the machine's: both nodes' areas show in it.
func (c *cluster) swapTwoNodes(t *testing.T) {
	lock, err := os.OpenFile("/run/spillway-swaptest.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if areas := procSwaps(); len(areas) != 0 {
		t.Skipf("this machine has swap already: %v", areas)
	}
	id := c.sbatch("swap2.sh", `#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 --output=swap2-%j.out
#DW swap 1GiB`+c.pool()+`
set -e
srun sh -c 'echo "$SLURMD_NODENAME swaps $(grep -c /dev/loop /proc/swaps)"' | sort
`)
	j := c.waitEnd(id, 2*time.Minute)
	out := c.read("swap2-" + id + ".out")
	if j["JobState"] != "COMPLETED" || !strings.Contains(out, "cn1 swaps 2\ncn2 swaps 2\n") {
		t.Fatalf("swap job %s: %s %s\n%s", id, j["JobState"], j["ExitCode"], out)
	}
	log, _ := os.ReadFile(filepath.Join(c.dir, "log", "slurmctld.log"))
	if !strings.Contains(string(log), "JobId="+id+" total_size increased from 1073741824 to 2147483648") {
		t.Errorf("slurmctld did not take real_size (2 nodes x 1GiB) as job %s's size", id)
	}
	c.assertGone(id)
	if areas := procSwaps(); len(areas) != 0 {
		t.Errorf("/proc/swaps after the job: %v", areas)
	}
}

// TestMultiNodeLua runs a job across two compute nodes through burst_buffer/lua.
func TestMultiNodeLua(t *testing.T) {
	m := upMulti(t, "lua")
	m.run("two_nodes_striped_private", (*cluster).twoNodes)
	m.run("only_the_jobs_nodes", (*cluster).onlyJobsNodes)
	m.run("libdatawarp_checkpoints", func(c *cluster, t *testing.T) { c.libdatawarpCheckpoints(t, m) })
	m.run("libdatawarp_every_function", func(c *cluster, t *testing.T) { c.libdatawarpEveryFunction(t, m) })
	m.assertClean()
}

// A two-node job: both nodes see one striped namespace (each reads the staged-in data and
// sees what the other wrote), each has its own private namespace, the storage node holds the
// data, and the directory both wrote is staged out.
func (c *cluster) twoNodes(t *testing.T) {
	c.writeFile("in2/data", "from the PFS\n", 0o644)
	id := c.sbatch("two.sh", `#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 --output=two-%j.out
#DW jobdw type=scratch access_mode=striped,private capacity=2GiB`+c.pool()+`
#DW stage_in type=directory source=%d/in2 destination=$DW_JOB_STRIPED/in
#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination=%d/out-%j
set -e
mkdir "$DW_JOB_STRIPED/out"
srun sh -c 'cat "$DW_JOB_STRIPED/in/data" > "$DW_JOB_STRIPED/out/from-$SLURMD_NODENAME"; echo "$SLURMD_NODENAME" > "$DW_JOB_PRIVATE/mine"'
srun sh -c 'echo "$(hostname) sees [$(ls "$DW_JOB_STRIPED/out" | tr "\n" " ")] private [$(ls "$DW_JOB_PRIVATE" | tr "\n" " ")$(cat "$DW_JOB_PRIVATE/mine")]"' | sort
`)
	j := c.waitEnd(id, 2*time.Minute)
	out := c.read("two-" + id + ".out")
	if j["JobState"] != "COMPLETED" || j["ExitCode"] != "0:0" {
		t.Fatalf("job %s: %s %s on %s\n%s", id, j["JobState"], j["ExitCode"], j["NodeList"], out)
	}
	for _, want := range []string{
		"cn1 sees [from-cn1 from-cn2 ] private [mine cn1]\n",
		"cn2 sees [from-cn1 from-cn2 ] private [mine cn2]\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("job output lacks %q:\n%s", want, out)
		}
	}
	for _, node := range []string{"cn1", "cn2"} {
		if got := c.read("out-" + id + "/from-" + node); got != "from the PFS\n" {
			t.Errorf("staged-out out-%s/from-%s: %q", id, node, got)
		}
	}
	c.assertGone(id)
}

// A 2 GiB job on 1 GiB grains is striped over both storage nodes: a file written on cn1 is
// read whole on cn2, its stripes are on bb1 and bb2, and it is staged out whole.
func (c *cluster) spansBothStorageNodes(t *testing.T, m *multiCluster) {
	id := c.sbatch("span.sh", `#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 --output=span-%j.out
#DW jobdw type=scratch access_mode=striped capacity=2GiB`+c.pool()+`
#DW stage_out type=file source=$DW_JOB_STRIPED/data destination=%d/span-%j.data
set -e
srun -N1 -n1 -w cn1 sh -c 'head -c 25000000 /dev/urandom > "$DW_JOB_STRIPED/data"; sha256sum < "$DW_JOB_STRIPED/data" > "$DW_JOB_STRIPED/sum"'
srun -N1 -n1 -w cn2 sh -c 'echo "cn2 reads $(sha256sum < "$DW_JOB_STRIPED/data") wrote $(cat "$DW_JOB_STRIPED/sum")"'
`+m.spillwayBin+` stripes "$DW_JOB_STRIPED/data"
cat "$DW_JOB_STRIPED/sum" > span-sum
`)
	j := c.waitEnd(id, 2*time.Minute)
	out := c.read("span-" + id + ".out")
	if j["JobState"] != "COMPLETED" {
		t.Fatalf("job %s: %s %s\n%s", id, j["JobState"], j["ExitCode"], out)
	}
	if m := regexp.MustCompile(`cn2 reads (\w+)  - wrote (\w+)  -`).FindStringSubmatch(out); m == nil || m[1] != m[2] {
		t.Errorf("cn2 does not read what cn1 wrote:\n%s", out)
	}
	// spillway stripes: SERVER NODE STRIPES BYTES FIRST, a line per storage node.
	for _, server := range []string{"bb1", "bb2"} {
		if !regexp.MustCompile(`(?m)^\s+\d+\s+` + server + `\s+[1-9]\d*\s+[1-9]`).MatchString(out) {
			t.Errorf("%s holds none of the striped file:\n%s", server, out)
		}
	}
	staged, _ := os.ReadFile(filepath.Join(c.pfs, "span-"+id+".data"))
	sum := sha256.Sum256(staged)
	if want := c.read("span-sum"); len(staged) != 25000000 || !strings.HasPrefix(want, hex.EncodeToString(sum[:])) {
		t.Errorf("staged out %d bytes, sha256 %x; the job wrote %s", len(staged), sum, want)
	}
	c.assertGone(id)
}

// A one-node job on cn2: its instance is mounted on cn2, not on cn1.
func (c *cluster) onlyJobsNodes(t *testing.T) {
	os.Remove(filepath.Join(c.pfs, "release"))
	id := c.sbatch("one.sh", `#!/bin/bash
#SBATCH -N1 -w cn2 --output=one-%j.out
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
echo running > "$DW_JOB_STRIPED/flag"
for i in $(seq 600); do [ -e release ] && exit 0; sleep 0.2; done
exit 1
`)
	c.waitState(id, time.Minute, "RUNNING")
	mount := filepath.Join(c.dir, "mounts", id+"_striped_scratch")
	c.waitFor(30*time.Second, "the instance mounted on cn2", func() bool {
		return strings.Contains(strings.Join(mountsIn(c.mountTables[1], filepath.Join(c.dir, "mounts")), " "), mount)
	})
	if on1 := mountsIn(c.mountTables[0], filepath.Join(c.dir, "mounts")); len(on1) != 0 {
		t.Errorf("a job on cn2 has mounts on cn1: %v", on1)
	}
	c.writeFile("release", "", 0o644)
	if j := c.waitEnd(id, time.Minute); j["JobState"] != "COMPLETED" {
		t.Errorf("job %s: %s\n%s", id, j["JobState"], c.read("one-"+id+".out"))
	}
	c.assertGone(id)
}

// A persistent instance made by a #BB job is used by a two-node job: data written on cn1 is
// read on cn2, and kept for the next job.
func (c *cluster) persistentTwoNodes(t *testing.T) {
	create := c.sbatch("mcreate.sh", "#!/bin/bash\n#BB create_persistent name=shared2 capacity=1GiB access_mode=striped type=scratch\n", "-N0")
	c.waitEnd(create, time.Minute)
	c.waitFor(20*time.Second, "shared2 to exist", func() bool { return c.sessions()["shared2"] })
	id := c.sbatch("muse.sh", `#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 --output=muse-%j.out
#DW persistentdw name=shared2
set -e
srun -N1 -n1 -w cn1 sh -c 'echo "written on $(hostname)" > "$DW_PERSISTENT_STRIPED_shared2/note"'
srun -N1 -n1 -w cn2 sh -c 'echo "$(hostname) reads: $(cat "$DW_PERSISTENT_STRIPED_shared2/note")"'
`)
	j := c.waitEnd(id, 2*time.Minute)
	out := c.read("muse-" + id + ".out")
	if j["JobState"] != "COMPLETED" || !strings.Contains(out, "cn2 reads: written on cn1\n") {
		t.Fatalf("job %s: %s\n%s", id, j["JobState"], out)
	}
	c.assertGone(id)
	if !c.sessions()["shared2"] {
		t.Fatalf("the persistent session shared2 vanished after the job")
	}
	destroy := c.sbatch("mdestroy.sh", "#!/bin/bash\n#BB destroy_persistent name=shared2\n", "-N0")
	c.waitEnd(destroy, time.Minute)
	c.waitFor(20*time.Second, "shared2 to be gone", func() bool { return !c.sessions()["shared2"] })
}

// The storage node dies while a two-node job writes to its instance: the job's writes fail
// with EIO within warpfs.request_timeout (they do not hang), the job ends, Slurm's
// post_run and teardown complete with the node still down, and when the node comes back its
// agent deletes the orphaned fragment: the pool is whole again.
func (c *cluster) storageNodeDies(t *testing.T, m *multiCluster) {
	// The job's instance on bb1 alone: bb2 takes no new instance meanwhile.
	if r := c.admin("dwcli", "update", "node", "--name", "bb2", "--drain"); r.code != 0 {
		t.Fatalf("draining bb2: %v", r)
	}
	defer c.admin("dwcli", "update", "node", "--name", "bb2", "--fill")
	id := c.sbatch("dies.sh", `#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 --output=dies-%j.out
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
srun sh -c 'for i in $(seq 3000); do
	if ! out=$(dd if=/dev/zero of="$DW_JOB_STRIPED/f-$SLURMD_NODENAME" bs=64k count=16 conv=fsync 2>&1); then
		echo "$(hostname): write failed: $(echo "$out" | head -1)"; exit 3
	fi
	sleep 0.1
done; echo "$(hostname): never failed"'
`)
	c.waitState(id, time.Minute, "RUNNING")
	// The job's files as the storage node holds them.
	files := func() string {
		out, _ := exec.Command("find", filepath.Join(m.dir, "ssd"), "-name", "f-cn*").Output()
		return string(out)
	}
	c.waitFor(30*time.Second, "both nodes writing", func() bool {
		return strings.Contains(files(), "f-cn1") && strings.Contains(files(), "f-cn2")
	})
	bb1 := m.host("bb1")
	bb1.daemon.Process.Signal(syscall.SIGKILL)
	<-bb1.exited
	j := c.waitEnd(id, 2*time.Minute)
	out := c.read("dies-" + id + ".out")
	// docs/mounts.md: EIO (ENOTCONN, what older versions gave, is still tolerated here).
	ioError := regexp.MustCompile(`(?m)^cn[12]: write failed: .*(Input/output error|Transport endpoint is not connected)$`)
	if j["JobState"] != "FAILED" || len(ioError.FindAllString(out, -1)) != 2 {
		t.Errorf("job %s on a dead storage node: %s, want FAILED with an I/O error on each node:\n%s", id, j["JobState"], out)
	}
	c.assertGone(id)
	if r := c.admin("dwstat", "nodes"); !regexp.MustCompile(`(?m)^ *bb1 .* offline `).MatchString(r.stdout) {
		t.Errorf("dwstat nodes does not show bb1 offline:\n%s", r.stdout)
	}
	m.startDaemon(bb1, bb1.argv[0], bb1.argv[1:]...)
	c.waitFor(30*time.Second, "bb1 back online with the job's data deleted", func() bool {
		return files() == "" && regexp.MustCompile(`(?m)^ *bb1 .* online `).MatchString(c.admin("dwstat", "nodes").stdout)
	})
}

// TestMultiNodeFailover: two controllers on a three-member etcd (upMultiOf with ha); a job
// across both compute nodes runs while the leading controller (ctl's) is killed with SIGKILL;
// ctl2 leads within the bound, slurmctld's dw_wlm_cli (given both controllers) finds it, and
// the job's post_run, stage-out and teardown complete through it.
func TestMultiNodeFailover(t *testing.T) {
	m := upMultiOf(t, "datawarp", true)
	m.run("job_across_a_failover", func(c *cluster, t *testing.T) { c.jobAcrossFailover(t, m) })
	m.assertClean()
}

func (c *cluster) jobAcrossFailover(t *testing.T, m *multiCluster) {
	c.writeFile("in3/data", "staged in before the failover\n", 0o644)
	id := c.sbatch("failover.sh", `#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 --output=failover-%j.out
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
#DW stage_in type=directory source=%d/in3 destination=$DW_JOB_STRIPED/in
#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination=%d/out-%j
set -e
mkdir "$DW_JOB_STRIPED/out"
while [ ! -e failed-over ]; do sleep 0.2; done
srun sh -c 'cat "$DW_JOB_STRIPED/in/data" > "$DW_JOB_STRIPED/out/from-$SLURMD_NODENAME"'
`)
	c.waitState(id, 2*time.Minute, "RUNNING")
	ctl := m.host("ctl")
	killed := time.Now()
	ctl.daemon.Process.Signal(syscall.SIGKILL)
	<-ctl.exited
	c.waitFor(30*time.Second, "ctl2's controller to lead", func() bool { return strings.Contains(m.logOf("ctl2"), "elected leader") })
	t.Logf("ctl's controller killed; ctl2's led within %v", time.Since(killed).Round(100*time.Millisecond))
	c.writeFile("failed-over", "", 0o644)
	j := c.waitEnd(id, 3*time.Minute)
	out := c.read("failover-" + id + ".out")
	if j["JobState"] != "COMPLETED" || j["ExitCode"] != "0:0" {
		t.Fatalf("job %s: %s %s\n%s", id, j["JobState"], j["ExitCode"], out)
	}
	for _, node := range []string{"cn1", "cn2"} {
		if got := c.read("out-" + id + "/from-" + node); got != "staged in before the failover\n" {
			t.Errorf("staged-out out-%s/from-%s: %q", id, node, got)
		}
	}
	c.assertGone(id)
}
