package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/metrics"
	"github.com/spillway-hpc/spillway/internal/testca"
)

// scrape is one scrape of a daemon's /metrics.
type scrape struct{ metrics.Scrape }

// scrapeUnix reads the metrics a daemon serves on its metrics_listen Unix socket.
func scrapeUnix(t *testing.T, socket string) scrape {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	resp, err := hc.Get("http://metrics/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape %s: %s %s", socket, resp.Status, body)
	}
	s, err := metrics.Parse(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", socket, err)
	}
	return scrape{s}
}

// value is one sample; a missing one fails the test.
func (s scrape) value(t *testing.T, sample string) float64 {
	t.Helper()
	v, ok := s.Samples[sample]
	if !ok {
		var near []string
		name, _, _ := strings.Cut(sample, "{")
		for k := range s.Samples {
			if strings.HasPrefix(k, name) {
				near = append(near, k)
			}
		}
		sort.Strings(near)
		t.Fatalf("no sample %s in the scrape; there are %v", sample, near)
	}
	return v
}

// within1pc checks a metric against the bytes the test moved: within 1%.
func within1pc(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > want/100 {
		t.Errorf("%s = %.0f, want %.0f within 1%%", what, got, want)
	} else {
		t.Logf("%s = %.0f for %.0f bytes moved", what, got, want)
	}
}

// TestMetricsMatchWhatAJobDid scrapes the controller's and the agent's metrics_listen while
// a job goes through its lifecycle: the sessions by phase follow it, the capacity the pool
// holds is the instance's, the stages' bytes are the files', the data path's bytes are what
// the job wrote and read through its mount (within 1%), and every metric the Grafana
// dashboard in deploy/grafana queries is in the scrapes.
func TestMetricsMatchWhatAJobDid(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	ctlSock, agentSock := filepath.Join(c.dir, "controller-metrics.sock"), filepath.Join(c.dir, "agent-metrics.sock")
	c.configure("controller", fmt.Sprintf("metrics_listen = \"unix:%s\"\n", ctlSock))
	wear := filepath.Join(c.dir, "wear")
	os.WriteFile(wear, []byte("7\n"), 0o644) // 7% of the SSD's life used
	c.configure("agent", fmt.Sprintf("metrics_listen = \"unix:%s\"\nendurance_file = %q\n", agentSock, wear))
	c.startController()
	c.startAgent()
	ctx := context.Background()
	const gib = 1 << 30
	// waitMetric scrapes until the sample has the value (gauges of the state follow the
	// executor's passes).
	waitMetric := func(socket, sample string, want float64) scrape {
		t.Helper()
		var s scrape
		c.waitFor(fmt.Sprintf("%s = %v", sample, want), func() bool {
			s = scrapeUnix(t, socket)
			v, ok := s.Samples[sample]
			return ok && v == want
		})
		return s
	}
	waitMetric(ctlSock, `spillway_node_online{node="storage1"}`, 1)
	s := waitMetric(ctlSock, `spillway_node_endurance_remaining_percent{node="storage1"}`, 93)
	if v := s.value(t, `spillway_node_worn{node="storage1"}`); v != 0 {
		t.Errorf("a node with 93%% of its endurance left counts as worn: %v", v)
	}
	if v := s.value(t, `spillway_pool_capacity_bytes{pool="wlm_pool"}`); v != 4*gib {
		t.Errorf("pool capacity %v, want the node's 4 GiB", v)
	}
	a := scrapeUnix(t, agentSock)
	if v := a.value(t, `spillway_agent_capacity_bytes`); v != 4*gib {
		t.Errorf("agent capacity %v, want 4 GiB", v)
	}

	// setup: one job session, its instance's grain held on the node.
	tok := "77"
	setup := lifecycle.Setup{Token: tok, Creator: "TEST", Instance: &lifecycle.InstanceRequest{Capacity: gib, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}
	c.step(tok, lifecycle.PhaseSetup, func() error { return c.client.Setup(ctx, setup) })
	// The agent logs at its first fragment whether fragments get a project quota.
	if logs, _ := os.ReadFile(filepath.Join(c.dir, "agent.log")); strings.Contains(string(logs), "fragments get a project quota") {
		t.Skip("the SSD path has project quotas: the job's writes would go to the kernel (passthrough), not through the data path's server")
	}
	s = waitMetric(ctlSock, `spillway_sessions{kind="job",phase="setup"}`, 1)
	for sample, want := range map[string]float64{
		`spillway_pool_allocated_bytes{pool="wlm_pool"}`:                 gib,
		`spillway_pool_free_bytes{pool="wlm_pool"}`:                      3 * gib,
		`spillway_node_allocated_bytes{node="storage1",pool="wlm_pool"}`: gib,
		`spillway_instance_capacity_bytes{pool="wlm_pool"}`:              gib,
		`spillway_instances{pool="wlm_pool"}`:                            1,
	} {
		if v := s.value(t, sample); v != want {
			t.Errorf("after setup %s = %v, want %v", sample, v, want)
		}
	}
	if v := s.value(t, `spillway_executor_effects_total{op="create-fragment",outcome="ok"}`); v < 1 {
		t.Errorf("no create-fragment effect counted")
	}
	if v := scrapeUnix(t, agentSock).value(t, `spillway_agent_fragments`); v != 1 {
		t.Errorf("agent fragments %v, want 1", v)
	}

	// data_in: a stage-in of a file; the stage's bytes are the file's.
	in := filepath.Join(c.dir, "pfs", "in.dat")
	const inSize = 3<<20 + 12345
	writeRandom(t, in, inSize)
	c.step(tok, lifecycle.PhaseDataIn, func() error {
		return c.client.Stages(ctx, tok, "in", []lifecycle.StageRequest{{Type: "file", PFSPath: in, DWVar: "DW_JOB_STRIPED", DWPath: "/in.dat", Line: 2}})
	})
	s = waitMetric(ctlSock, `spillway_stage_ended_total{direction="in",status="complete"}`, 1)
	if v := s.value(t, `spillway_stage_bytes_total{direction="in"}`); v != inSize {
		t.Errorf("stage-in bytes %v, want the file's %d", v, inSize)
	}
	if v := s.value(t, `spillway_stage_duration_seconds_count{direction="in"}`); v != 1 {
		t.Errorf("stage-in durations observed %v, want 1", v)
	}

	// pre_run: the job writes N bytes through its mount and reads them back.
	c.step(tok, lifecycle.PhasePreRun, func() error { return c.client.PreRun(ctx, tok, []string{"storage1"}) })
	s = waitMetric(ctlSock, `spillway_sessions{kind="job",phase="pre_run"}`, 1)
	if v := s.value(t, `spillway_sessions{kind="job",phase="setup"}`); v != 0 {
		t.Errorf("the session is still counted in setup after pre_run: %v", v)
	}
	env, err := c.client.Paths(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	mount := env["DW_JOB_STRIPED"]
	before := scrapeUnix(t, agentSock)
	const n = 48<<20 + 4321
	writeRandom(t, mount+"out.dat", n)
	got, err := os.ReadFile(mount + "out.dat")
	if err != nil || len(got) != n {
		t.Fatalf("read back %d bytes: %v", len(got), err)
	}
	after := scrapeUnix(t, agentSock)
	delta := func(sample string) float64 { return after.value(t, sample) - before.value(t, sample) }
	within1pc(t, "spillway_warpfs_written_bytes_total (local)", delta(`spillway_warpfs_written_bytes_total{transport="local"}`), n)
	within1pc(t, "spillway_warpfs_read_bytes_total (local)", delta(`spillway_warpfs_read_bytes_total{transport="local"}`), n)
	within1pc(t, "spillway_agent_used_bytes", after.value(t, `spillway_agent_used_bytes`), n+inSize)
	writes := delta(`spillway_warpfs_requests_total{op="write",transport="local"}`)
	if writes < 1 || delta(`spillway_warpfs_request_duration_seconds_count{op="write"}`) != writes {
		t.Errorf("WRITE requests %v and their latencies %v disagree", writes, delta(`spillway_warpfs_request_duration_seconds_count{op="write"}`))
	}
	if v := after.value(t, `spillway_agent_mounts{kind="local"}`); v != 1 {
		t.Errorf("agent mounts %v, want 1 local", v)
	}
	if _, err := os.Stat(mount + "no-such-file"); !os.IsNotExist(err) {
		t.Fatalf("stat of a missing file: %v", err)
	}
	if v := scrapeUnix(t, agentSock).value(t, `spillway_warpfs_errors_total{errno="ENOENT",op="lookup"}`); v < 1 {
		t.Errorf("a failed lookup is not counted: %v", v)
	}

	// post_run, data_out: the stage-out moves the file the job wrote.
	c.step(tok, lifecycle.PhasePostRun, func() error { return c.client.PostRun(ctx, tok) })
	out := filepath.Join(c.dir, "pfs", "out.dat")
	c.step(tok, lifecycle.PhaseDataOut, func() error {
		return c.client.Stages(ctx, tok, "out", []lifecycle.StageRequest{{Type: "file", PFSPath: out, DWVar: "DW_JOB_STRIPED", DWPath: "/out.dat", Line: 3}})
	})
	s = waitMetric(ctlSock, `spillway_stage_ended_total{direction="out",status="complete"}`, 1)
	if v := s.value(t, `spillway_stage_bytes_total{direction="out"}`); v != n {
		t.Errorf("stage-out bytes %v, want the file's %d", v, n)
	}

	// teardown: nothing left.
	c.step(tok, lifecycle.PhaseTeardown, func() error { return c.client.Teardown(ctx, tok, false) })
	s = waitMetric(ctlSock, `spillway_pool_allocated_bytes{pool="wlm_pool"}`, 0)
	for _, p := range []string{"setup", "data_in", "pre_run", "post_run", "data_out", "teardown"} {
		if v := s.value(t, `spillway_sessions{kind="job",phase="`+p+`"}`); v != 0 {
			t.Errorf("after teardown %v sessions in %s", v, p)
		}
	}
	a = waitMetric(agentSock, `spillway_agent_fragments`, 0)

	// Every metric the dashboard queries is in one of the scrapes.
	checkDashboard(t, "../../deploy/grafana/spillway.json", s, a)
}

func writeRandom(t *testing.T, path string, size int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	rand.Read(buf)
	for left := size; left > 0; left -= min(left, len(buf)) {
		if _, err := f.Write(buf[:min(left, len(buf))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkDashboard parses the Grafana dashboard and checks that each spillway_ metric its
// panels query is a family of one of the scrapes (a histogram's _bucket, _sum and _count are
// its family's).
func checkDashboard(t *testing.T, path string, scrapes ...scrape) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s is not valid JSON: %v", path, err)
	}
	name := regexp.MustCompile(`\bspillway_[a-z_]+`)
	queried := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				queried++
				family := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					family = strings.TrimSuffix(family, suffix)
				}
				found := false
				for _, s := range scrapes {
					found = found || s.Families[family] || s.Families[m]
				}
				if !found {
					t.Errorf("panel %q queries %s, which no scrape has", p.Title, m)
				}
			}
		}
	}
	if queried == 0 {
		t.Errorf("the dashboard queries no spillway_ metric")
	}
}

// TestMetricsAcrossHosts: a job on compute node hostb writes and reads a file through its
// mount of an instance on storage node hosta (hosts as network namespaces); hosta's agent
// counts the bytes as remote traffic within 1%, and hostb's shows its remote mount. Each
// agent's metrics_listen is a Unix socket in the cluster's directory, which the test reaches
// from outside the hosts' namespaces.
func TestMetricsAcrossHosts(t *testing.T) {
	c := newNetCluster(t)
	sockets := map[string]string{}
	for _, name := range []string{"hosta", "hostb"} {
		h := c.hosts[name]
		sockets[name] = filepath.Join(c.dir, name+"-metrics.sock")
		cfg, err := os.ReadFile(h.config)
		if err != nil {
			t.Fatal(err)
		}
		cfg = []byte(strings.Replace(string(cfg), "[agent]\n", fmt.Sprintf("[agent]\nmetrics_listen = \"unix:%s\"\n", sockets[name]), 1))
		if err := os.WriteFile(h.config, cfg, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	c.start("ctl")
	c.start("hosta")
	c.start("hostb")
	job := c.jobFile("job.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\nsrun ./a.out\n\x00")
	nodes := c.jobFile("nodes", "hostb\n")
	c.wlm("--function", "job_process", "--job", job)
	c.wlm("--function", "setup", "--token", "60", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:1GiB", "--job", job)
	pathfile := filepath.Join(c.dir, "paths")
	c.wlm("--function", "paths", "--token", "60", "--job", job, "--pathfile", pathfile)
	env, _ := os.ReadFile(pathfile)
	mount := strings.TrimPrefix(strings.TrimSpace(string(env)), "DW_JOB_STRIPED=")
	c.wlm("--function", "pre_run", "--token", "60", "--job", job, "--nodehostnamefile", nodes)

	before := scrapeUnix(t, sockets["hosta"])
	const n = 32 << 20
	out, err := c.onHost("hostb", "set -e; cd "+mount+"; head -c "+strconv.Itoa(n)+" /dev/urandom > out.dat; cat out.dat > /dev/null; stat -c %s out.dat").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != strconv.Itoa(n) {
		t.Fatalf("the job on hostb: %v\n%s", err, out)
	}
	after := scrapeUnix(t, sockets["hosta"])
	delta := func(sample string) float64 { return after.value(t, sample) - before.value(t, sample) }
	within1pc(t, "hosta's spillway_warpfs_written_bytes_total (remote)", delta(`spillway_warpfs_written_bytes_total{transport="remote"}`), n)
	within1pc(t, "hosta's spillway_warpfs_read_bytes_total (remote)", delta(`spillway_warpfs_read_bytes_total{transport="remote"}`), n)
	if v := after.value(t, `spillway_agent_warpfs_connections`); v < 1 {
		t.Errorf("hosta counts %v connections to its data server with hostb's mount on it", v)
	}
	b := scrapeUnix(t, sockets["hostb"])
	if v := b.value(t, `spillway_agent_mounts{kind="remote"}`); v != 1 {
		t.Errorf("hostb counts %v remote mounts, want 1", v)
	}
	if _, ok := b.Samples[`spillway_agent_capacity_bytes`]; ok {
		t.Errorf("compute-only hostb reports a storage capacity")
	}
	c.wlm("--function", "post_run", "--token", "60", "--job", job)
	c.wlm("--function", "teardown", "--token", "60", "--job", job)
	c.assertClean()
}

// TestMetricsOverTLS: with a [tls] certificate, the controller's TCP metrics_listen speaks TLS
// only, with no credential: a scraper that trusts the site's CA reads the metrics, plain
// HTTP gets none.
func TestMetricsOverTLS(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	ca, cert, key, err := testca.Write(c.dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c.configure("controller", fmt.Sprintf("metrics_listen = %q\n", addr))
	os.WriteFile(c.config, append(must(os.ReadFile(c.config)), []byte(fmt.Sprintf("[tls]\ncert_file = %q\nkey_file = %q\nca_file = %q\n", cert, key, ca))...), 0o644)
	c.startController()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(must(os.ReadFile(ca)))
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	var s metrics.Scrape
	c.waitFor("a scrape over TLS", func() bool {
		resp, err := hc.Get("https://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		s, err = metrics.Parse(resp.Body)
		return err == nil && resp.StatusCode == 200
	})
	if _, ok := s.Samples[`spillway_executor_in_flight`]; !ok {
		t.Errorf("the scrape over TLS has no spillway_executor_in_flight")
	}
	if resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "spillway_") {
			t.Errorf("plain HTTP to the TLS metrics port got the metrics")
		}
	}
	if resp, err := hc.Get("https://" + addr + "/dw/v1/sessions"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("the metrics port answers an API route: %s", resp.Status)
		}
	}
}
