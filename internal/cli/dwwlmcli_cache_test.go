package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/dwstat"
)

func apiclientFor(t *testing.T, addr string) *apiclient.Client {
	t.Helper()
	cl, err := apiclient.New(addr, apiclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// jobProcess runs dw_wlm_cli --function job_process on script under a system config.
func jobProcess(t *testing.T, config, script string) (int, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "spillway.toml")
	job := filepath.Join(dir, "job.sh")
	os.WriteFile(cfg, []byte(config), 0o600)
	os.WriteFile(job, []byte(script), 0o600)
	t.Setenv("SPILLWAY_CONFIG", cfg)
	var out, errb bytes.Buffer
	code := dwWLMMain([]string{"--function", "job_process", "--job", job}, &out, &errb)
	return code, out.String() + errb.String()
}

// TestJobProcessCache: job_process checks a cache's pfs= against the site's [cache]
// allowed_pfs, refuses a persistent cache Slurm could never create (it passes no pfs=), and
// passes a striped and a load-balanced cache.
func TestJobProcessCache(t *testing.T) {
	const site = "[cache]\nallowed_pfs = [\"/lustre\"]\n"
	cases := []struct{ script, want string }{
		{"#!/bin/bash\n#DW jobdw type=cache capacity=1TiB pfs=/home/me\n",
			"job_file_valid False\nline 2: #DW jobdw: pfs=/home/me is outside the directories this site allows for cache instances ([cache] allowed_pfs: /lustre); choose a directory under one of them, or ask the administrator to add it\n"},
		{"#!/bin/bash\n#DW jobdw capacity=1GiB\n#DW jobdw type=cache capacity=1TiB pfs=/lustre/x/../../etc\n",
			"job_file_valid False\nline 3: #DW jobdw: pfs=\"/lustre/x/../../etc\" contains \"..\": the site's allowed directories are matched against the path as written; write the directory itself, e.g. pfs=/etc\n"},
		{"#!/bin/bash\n#BB create_persistent name=pc capacity=1TiB type=cache pfs=/lustre/p\n",
			"job_file_valid False\nline 2: #BB create_persistent type=cache: Slurm passes no pfs= to create_persistent; create the persistent cache outside Slurm (spillway persistent create pc --type cache --pfs /lustre/p), then use it with #DW persistentdw name=pc\n"},
	}
	for _, c := range cases {
		code, out := jobProcess(t, site, c.script)
		if code != 1 || out != c.want {
			t.Errorf("%q: exit %d\n%s\nwant\n%s", c.script, code, out, c.want)
		}
	}
	if code, out := jobProcess(t, site, "#!/bin/bash\n#DW jobdw type=cache capacity=1TiB pfs=/lustre/me\n"); code != 0 || out != "" {
		t.Errorf("with the data path: exit %d %s", code, out)
	}
	if code, out := jobProcess(t, site, "#!/bin/bash\n#DW jobdw type=cache access_mode=loadbalance capacity=1TiB pfs=/lustre/me\n"); code != 0 || out != "" {
		t.Errorf("a load-balanced cache: exit %d %s", code, out)
	}
	if code, out := jobProcess(t, "", "#!/bin/bash\n#DW jobdw type=cache capacity=1TiB pfs=/lustre/me\n"); code != 1 ||
		out != "job_file_valid False\nline 2: #DW jobdw: pfs=/lustre/me: this site allows no PFS directory for cache instances yet ([cache] allowed_pfs is empty); ask the administrator to list the PFS directories users may cache\n" {
		t.Errorf("no allowed_pfs: exit %d %s", code, out)
	}
}

// TestWLMScratchAndCacheJob (issue 20 item 10, Slurm's path): dw_wlm_cli setup of a job with
// a scratch and a cache instance (Slurm's --capacity is their sum) sets up both, each with its
// own capacity and the job's pool; paths prints both variables; dwstat configurations --cd
// shows the cache with its backing path; real_size sums both.
func TestWLMScratchAndCacheJob(t *testing.T) {
	c, addr := testControllerWith(t, func(cfg *config.Config) {
		cfg.Cache.AllowedPFS = []string{"/lustre"}
		cfg.Controller.MountRoot = "/mnt/bb"
	})
	ctx := context.Background()
	for _, n := range []string{"bb1", "bb2"} {
		if _, err := c.Heartbeat(ctx, agentapi.NodeReport{Name: n, Pool: "wlm_pool", Capacity: 8 << 30, Roles: []string{"storage"}}); err != nil {
			t.Fatal(err)
		}
	}
	wlm := wlmAt(t, addr)
	dir := t.TempDir()
	job := filepath.Join(dir, "script")
	os.WriteFile(job, []byte("#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=2GiB\n#DW jobdw type=cache access_mode=striped capacity=3GiB pfs=/lustre/me/run\n"), 0o644)
	// The setup's effects fail (no agents in this test): what counts is what was set up.
	wlm("--function", "setup", "--token", "5", "--caller", "SLURM", "--user", "1000", "--groupid", "1000", "--capacity", "wlm_pool:5GiB", "--job", job)
	all, err := apiclientFor(t, addr).All(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sess int64
	for _, s := range all.Sessions {
		if s.Token == "5" {
			sess = s.ID
		}
	}
	var caps []uint64
	for _, i := range all.Instances {
		if i.Links.Session == sess {
			caps = append(caps, i.Capacity.Bytes)
		}
	}
	if sess == 0 || len(caps) != 2 || caps[0] != 2<<30 || caps[1] != 3<<30 {
		t.Fatalf("session %d instances %v", sess, caps)
	}
	pathfile := filepath.Join(dir, "path")
	if r := wlm("--function", "paths", "--token", "5", "--job", job, "--pathfile", pathfile); r.code != 0 {
		t.Fatalf("paths: %+v", r)
	}
	if raw, _ := os.ReadFile(pathfile); string(raw) != "DW_JOB_STRIPED=/mnt/bb/5_striped_scratch/\nDW_JOB_STRIPED_CACHE=/mnt/bb/5_striped_cache/\n" {
		t.Errorf("pathfile:\n%s", raw)
	}
	if r := wlm("--function", "real_size", "--token", "5"); r.code != 0 || r.stdout != "{\"token\":\"5\",\"capacity\":5368709120,\"units\":\"bytes\"}\n" {
		t.Errorf("real_size: %+v", r)
	}
	table := dwstat.Render(all, []string{"configurations"}, false, dwstat.Options{ConfigDetails: true})
	if !strings.Contains(table, "cache") || !strings.Contains(table, "/lustre/me/run") {
		t.Errorf("dwstat configurations --cd:\n%s", table)
	}
}
