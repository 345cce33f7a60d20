package slurm

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLuaPlugin drives Spillway through Slurm's burst_buffer/lua plugin and Spillway's
// deploy/slurm/burst_buffer.lua: the core scenarios of the datawarp plugin, and persistent
// instances made with `spillway persistent` (the lua plugin has no #BB directives).
func TestLuaPlugin(t *testing.T) {
	c := up(t, "lua", "16GiB")
	c.run("stage_in_and_out", (*cluster).stageInAndOut)
	c.run("striped_private", (*cluster).stripedPrivate)
	c.run("srun_bb_and_salloc_bbf", (*cluster).interactive)
	c.run("persistent_by_command", (*cluster).persistentByCommand)
	c.run("capacity_exhausted", (*cluster).capacityExhausted)
	c.run("invalid_directives", (*cluster).invalidDirectives)
	c.run("unreadable_stage_in", (*cluster).unreadableStageIn)
	c.run("scancel_hurry", (*cluster).cancelHurry)
	c.run("scontrol_show_bbstat", (*cluster).showDwstat)
	c.run("cache_and_scratch_cache", (*cluster).cacheJobs)
	c.run("swap", (*cluster).swapJobs)
	c.assertClean()
}

// A persistent instance created and destroyed by its owner with `spillway persistent`,
// used by a job with #DW persistentdw.
func (c *cluster) persistentByCommand(t *testing.T) {
	if r := c.user("spillway", "persistent", "create", "keep2", "--capacity", "1GiB"); r.code != 0 {
		t.Fatalf("spillway persistent create: %s", r)
	}
	id := c.sbatch("use-lua.sh", `#!/bin/bash
#SBATCH --output=use-lua-%j.out
#DW persistentdw name=keep2
set -e
echo "P=$DW_PERSISTENT_STRIPED_keep2"
echo kept > "$DW_PERSISTENT_STRIPED_keep2/f"
`)
	if j := c.waitEnd(id, 2*time.Minute); j["JobState"] != "COMPLETED" {
		t.Fatalf("persistentdw job %s: %s (%s)", id, j["JobState"], j["Reason"])
	}
	if out := c.read("use-lua-" + id + ".out"); !strings.Contains(out, "P="+filepath.Join(c.dir, "mounts", "keep2_"+id+"_striped_scratch")+"/") {
		t.Errorf("job output: %q", out)
	}
	c.assertGone(id)
	if r := c.user("spillway", "persistent", "list"); !strings.Contains(r.stdout, "keep2") {
		t.Errorf("spillway persistent list after the job: %s", r)
	}
	if r := c.user("spillway", "persistent", "destroy", "keep2"); r.code != 0 {
		t.Fatalf("spillway persistent destroy: %s", r)
	}
	c.assertClean()
}
