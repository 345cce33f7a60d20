package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-hpc/spillway/internal/model"
)

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
// allowed_pfs before the refusal of what this version cannot run, and refuses a persistent
// cache Slurm could never create (it passes no pfs=).
func TestJobProcessCache(t *testing.T) {
	const site = "[cache]\nallowed_pfs = [\"/lustre\"]\n"
	cases := []struct{ script, want string }{
		{"#!/bin/bash\n#DW jobdw type=cache capacity=1TiB pfs=/home/me\n",
			"job_file_valid False\nline 2: #DW jobdw: pfs=/home/me is outside the directories this site allows for cache instances ([cache] allowed_pfs: /lustre); choose a directory under one of them, or ask the administrator to add it\n"},
		{"#!/bin/bash\n#DW jobdw capacity=1GiB\n#DW jobdw type=cache capacity=1TiB pfs=/lustre/x/../../etc\n",
			"job_file_valid False\nline 3: #DW jobdw: pfs=\"/lustre/x/../../etc\" contains \"..\": the site's allowed directories are matched against the path as written; write the directory itself, e.g. pfs=/etc\n"},
		{"#!/bin/bash\n#BB create_persistent name=pc capacity=1TiB type=cache pfs=/lustre/p\n",
			"job_file_valid False\nline 2: #BB create_persistent type=cache: Slurm passes no pfs= to create_persistent; create the persistent cache outside Slurm (spillway persistent create pc --type cache --pfs /lustre/p), then use it with #DW persistentdw name=pc\n"},
		{"#!/bin/bash\n#DW jobdw type=cache capacity=1TiB pfs=/lustre/me\n",
			"job_file_valid False\nline 2: #DW jobdw type=cache: cache data path not built in this version; use type=scratch with #DW stage_in/stage_out\n"},
	}
	for _, c := range cases {
		code, out := jobProcess(t, site, c.script)
		if code != 1 || out != c.want {
			t.Errorf("%q: exit %d\n%s\nwant\n%s", c.script, code, out, c.want)
		}
	}
	old := model.CacheDataPath
	model.CacheDataPath = true
	defer func() { model.CacheDataPath = old }()
	if code, out := jobProcess(t, site, "#!/bin/bash\n#DW jobdw type=cache capacity=1TiB pfs=/lustre/me\n"); code != 0 || out != "" {
		t.Errorf("with the data path: exit %d %s", code, out)
	}
	if code, out := jobProcess(t, "", "#!/bin/bash\n#DW jobdw type=cache capacity=1TiB pfs=/lustre/me\n"); code != 1 ||
		out != "job_file_valid False\nline 2: #DW jobdw: pfs=/lustre/me: this site allows no PFS directory for cache instances yet ([cache] allowed_pfs is empty); ask the administrator to list the PFS directories users may cache\n" {
		t.Errorf("no allowed_pfs: exit %d %s", code, out)
	}
}
