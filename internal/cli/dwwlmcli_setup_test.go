package cli

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
)

// A refused setup under Slurm names the script's line and quotes the directive as the user
// wrote it (capacity=3.5TB, not a rewritten 3500GB), as spillway run does (issue 23 item 12).
func TestWLMSetupRefusalQuotesTheDirective(t *testing.T) {
	c, addr := testController(t)
	if _, err := c.Heartbeat(context.Background(), agentapi.NodeReport{Name: "bb1", Pool: "wlm_pool", Capacity: 4 << 30, Roles: []string{"storage"}}); err != nil {
		t.Fatal(err)
	}
	wlm := wlmAt(t, addr)
	job := filepath.Join(t.TempDir(), "script")
	os.WriteFile(job, []byte("#!/bin/bash\n#SBATCH -N 1\n#DW jobdw type=scratch access_mode=striped capacity=3.5TB\necho hi\n"), 0o644)
	r := wlm("--function", "setup", "--token", "7", "--caller", "SLURM", "--user", "1000", "--groupid", "1000", "--capacity", "wlm_pool:3.5TB", "--job", job)
	want := "line 3: #DW jobdw capacity=3.5TB: pool wlm_pool cannot hold 3.18TiB (3260 grains of 1GiB): requested 3260 grains but only 4 are free on 1 usable node(s) of 1; 4GiB free in the pool\n"
	if r.code != 1 || r.stdout+r.stderr != want {
		t.Errorf("setup: exit %d\n%s%s\nwant exit 1 and\n%s", r.code, r.stdout, r.stderr, want)
	}
}
