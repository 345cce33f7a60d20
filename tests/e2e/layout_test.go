package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/layout"
)

// bbsimEnv names the bbsim executable the layout test feeds; scripts/test-all sets it to the
// virtual environment's .venv/bin/bbsim, which it creates before the Go tests.
const bbsimEnv = "SPILLWAY_TEST_BBSIM"

// prediction is the part of `bbsim predict --json` the test reads.
type prediction struct {
	Session    string             `json:"session"`
	Op         string             `json:"op"`
	GBps       float64            `json:"gbps"`
	Binding    string             `json:"binding"`
	Concurrent map[string]float64 `json:"concurrent"`
	Warnings   []string           `json:"warnings"`
	Jobs       []struct {
		Session     string   `json:"session"`
		Instance    int64    `json:"instance"`
		AccessMode  string   `json:"access_mode"`
		ClientNodes int      `json:"client_nodes"`
		Servers     []string `json:"servers"`
		Capacity    uint64   `json:"instance_capacity"`
	} `json:"jobs"`
	Bottlenecks []struct {
		Constraint string `json:"constraint"`
		Nodes      int    `json:"nodes"`
		Streams    int    `json:"streams"`
		Examples   []struct {
			Name string `json:"name"`
		} `json:"examples"`
	} `json:"bottlenecks"`
}

// TestLayoutSnapshotFeedsBbsim proves that the Go exporter and the simulator agree on the
// snapshot format: a real controller and agent, two jobs set up as Slurm does it (dw_wlm_cli
// setup with the job's node list), `spillway layout -o FILE`, then the real `bbsim predict`
// on that file, whose answer must follow from what the controller holds.
func TestLayoutSnapshotFeedsBbsim(t *testing.T) {
	requireRoot(t)
	bbsim := os.Getenv(bbsimEnv)
	if bbsim == "" {
		t.Skipf("%s is unset: set it to a bbsim executable (pip install ./sim) to run this test; scripts/test-all does", bbsimEnv)
	}
	if _, err := exec.LookPath(bbsim); err != nil {
		t.Fatalf("%s=%s: %v", bbsimEnv, bbsim, err)
	}
	c := newCluster(t)
	c.startController()
	c.startAgent()

	r := spillway(t, cmdOpts{}, "layout", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "Usage: spillway layout") || !strings.Contains(r.stdout, "bbsim predict") {
		t.Fatalf("layout --help: %s", r)
	}
	if r := spillway(t, cmdOpts{}, "layout", "--config", c.config, "stray"); r.code != 64 {
		t.Errorf("a stray argument is a usage error: %s", r)
	}

	// Two jobs, each with a 1 GiB striped instance on the one storage node, and 8 compute
	// nodes named as Cray names them (nid = position on the machine).
	script := c.jobFile("job.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\ntrue\n\x00")
	c.wlmOK("--function", "job_process", "--job", script)
	for _, job := range []struct{ token, first string }{{"4242", "nid00100"}, {"4243", "nid00200"}} {
		var nodes strings.Builder
		var base int
		fmt.Sscanf(job.first, "nid%d", &base)
		for i := 0; i < 8; i++ {
			fmt.Fprintf(&nodes, "nid%05d\n", base+i)
		}
		nodefile := c.jobFile("nodes-"+job.token, nodes.String())
		c.wlmOK("--function", "setup", "--token", job.token, "--caller", "SLURM", "--user", "0", "--groupid", "0",
			"--capacity", "wlm_pool:1GiB", "--job", script, "--nodehostnamefile", nodefile)
	}

	snapPath := filepath.Join(c.dir, "snap.json")
	r = spillway(t, cmdOpts{}, "layout", "--config", c.config, "-o", snapPath)
	if r.code != 0 || r.stdout != "" || r.stderr != "" {
		t.Fatalf("spillway layout -o: %s", r)
	}
	raw, err := os.ReadFile(snapPath)
	if err != nil {
		t.Fatal(err)
	}
	var snap layout.Snapshot
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&snap); err != nil {
		t.Fatalf("snapshot: %v\n%s", err, raw)
	}
	// Standard output carries the same snapshot (up to the time stamp).
	r = spillway(t, cmdOpts{}, "layout", "--config", c.config, "--compact")
	var printed layout.Snapshot
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &printed) != nil || strings.Count(strings.TrimSpace(r.stdout), "\n") != 0 {
		t.Fatalf("spillway layout --compact: %s", r)
	}
	printed.Generated = snap.Generated
	if fmt.Sprint(printed) != fmt.Sprint(snap) {
		t.Errorf("stdout and -o differ:\n%+v\n%+v", printed, snap)
	}

	// The snapshot says what the controller holds.
	all, err := c.client.All(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if snap.Format != "spillway-layout" || snap.Version != 1 || snap.Generated == "" || !strings.HasSuffix(snap.Controller, "controller.sock") {
		t.Errorf("header: %+v", snap)
	}
	if len(snap.Pools) != 1 || snap.Pools[0].ID != "wlm_pool" || snap.Pools[0].Granularity != 1<<30 || snap.Pools[0].Quantity != 4 || snap.Pools[0].Free != 2 {
		t.Errorf("pools: %+v", snap.Pools)
	}
	if len(snap.Nodes) != 1 || snap.Nodes[0] != (layout.Node{ID: "storage1", Pool: "wlm_pool", Capacity: 4 << 30, Online: true}) {
		t.Errorf("nodes: %+v", snap.Nodes)
	}
	instanceOf := map[string]int64{}
	for _, s := range all.Sessions {
		for _, i := range all.Instances {
			if i.Links.Session == s.ID {
				instanceOf[s.Token] = i.ID
			}
		}
	}
	if len(snap.Instances) != 2 || len(snap.Sessions) != 2 || len(snap.Configurations) != 2 {
		t.Fatalf("snapshot: %s", raw)
	}
	for _, inst := range snap.Instances {
		if inst.ID != instanceOf[inst.Session] || inst.Capacity != 1<<30 || len(inst.Fragments) != 1 ||
			inst.Fragments[0].Node != "storage1" || inst.Fragments[0].Capacity != 1<<30 {
			t.Errorf("instance: %+v (controller: %v)", inst, instanceOf)
		}
	}
	for _, s := range snap.Sessions {
		if len(s.ClientNodes) != 8 || (s.Token == "4242") != (s.ClientNodes[0] == "nid00100") {
			t.Errorf("session: %+v", s)
		}
	}

	// bbsim reads the file on a model of Trinity. storage1 is not a Cray nid name: the
	// machine's hostname map puts it at nid 4, a DataWarp slot; the jobs' nids are where
	// their names say.
	predict := func(args ...string) prediction {
		t.Helper()
		argv := append([]string{"predict", snapPath, "--machine", "trinity", "--set", "hostnames.map={storage1: 4}",
			"--op", "write", "--json"}, args...)
		cmd := exec.Command(bbsim, argv...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("bbsim %s: %v\n%s%s", strings.Join(argv, " "), err, out.String(), errb.String())
		}
		var p prediction
		if err := json.Unmarshal(out.Bytes(), &p); err != nil {
			t.Fatalf("bbsim predict --json: %v\n%s", err, out.String())
		}
		return p
	}
	alone := predict("--session", "4242")
	if alone.Session != "4242" || alone.Op != "write" || len(alone.Jobs) != 1 {
		t.Fatalf("prediction: %+v", alone)
	}
	job := alone.Jobs[0]
	if job.Instance != instanceOf["4242"] || job.ClientNodes != 8 || len(job.Servers) != 1 || job.Servers[0] != "storage1" ||
		job.AccessMode != "striped" || job.Capacity != 1<<30 {
		t.Errorf("the job bbsim modelled: %+v", job)
	}
	// 8 nodes x 32 streams against one server: the server binds (the nodes could inject
	// 8 x 2 GB/s), and it gets a server's sustained bandwidth, below its 8 GB/s node link.
	if alone.Binding != "server bandwidth" || len(alone.Bottlenecks) != 1 || alone.Bottlenecks[0].Nodes != 8 ||
		alone.Bottlenecks[0].Streams != 256 || len(alone.Bottlenecks[0].Examples) == 0 ||
		alone.Bottlenecks[0].Examples[0].Name != "server bandwidth storage1" {
		t.Errorf("bottleneck: %+v", alone)
	}
	if alone.GBps < 4 || alone.GBps > 8 {
		t.Errorf("one DataWarp-class server delivers %.2f GB/s; expected 4-8", alone.GBps)
	}
	// The other job's instance sits on the same server: with equal stream counts, per-stream
	// fairness gives each job half of what 4242 gets alone.
	both := predict("--session", "4242", "--concurrent", "4243")
	if math.Abs(both.GBps-alone.GBps/2) > 1e-3*alone.GBps || math.Abs(both.Concurrent["4243"]-both.GBps) > 1e-3*alone.GBps {
		t.Errorf("sharing the server: 4242 %.3f GB/s, 4243 %.3f GB/s; alone %.3f", both.GBps, both.Concurrent["4243"], alone.GBps)
	}

	// The storage node going offline shows in the next snapshot, and bbsim refuses to place
	// an instance with no server left, naming the instance.
	c.killAgent()
	c.waitFor("the node to go offline", func() bool {
		all, _ := c.client.All(context.Background())
		return len(all.Nodes) == 1 && !all.Nodes[0].Online
	})
	r = spillway(t, cmdOpts{}, "layout", "--config", c.config, "-o", snapPath)
	if r.code != 0 {
		t.Fatalf("spillway layout with the node offline: %s", r)
	}
	cmd := exec.Command(bbsim, "predict", snapPath, "--machine", "trinity", "--set", "hostnames.map={storage1: 4}", "--session", "4242")
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), fmt.Sprintf("instance %d", instanceOf["4242"])) ||
		!strings.Contains(string(out), "offline") || strings.Contains(string(out), "Traceback") {
		t.Errorf("prediction on an offline node: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
	c.startAgent()

	for _, token := range []string{"4242", "4243"} {
		c.wlmOK("--function", "teardown", "--token", token, "--job", script)
	}
	c.assertClean()
}
