package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBurstBufferLua runs deploy/slurm/burst_buffer.lua under the Lua interpreters Slurm
// embeds (5.1 in Debian's Slurm, 5.3 in other builds), calling its slurm_bb_* functions in the
// order the burst_buffer/lua plugin does, against a real controller and agent. (Running it
// inside a real slurmctld is tests/slurm's part; here the lua's own logic — argument mapping,
// exit statuses, real_size parsing — is checked, except pre_run's node lookup, which needs
// Slurm's squeue.)
func TestBurstBufferLua(t *testing.T) {
	requireRoot(t)
	for _, interpreter := range []string{"lua5.1", "lua5.3"} {
		t.Run(interpreter, func(t *testing.T) {
			lua, err := exec.LookPath(interpreter)
			if err != nil {
				t.Skipf("%s is not installed (scripts/install-deps --test installs it)", interpreter)
			}
			testBurstBufferLua(t, lua)
		})
	}
}

func testBurstBufferLua(t *testing.T, lua string) {
	c := newCluster(t)
	c.startController()
	c.startAgent()
	link := filepath.Join(c.dir, "dw_wlm_cli")
	os.Symlink(smallBinary, link)
	dwstatLink := filepath.Join(c.dir, "dwstat")
	os.Symlink(smallBinary, dwstatLink)
	script, _ := filepath.Abs("../../deploy/slurm/burst_buffer.lua")
	pfs := filepath.Join(c.dir, "pfs")
	os.WriteFile(filepath.Join(pfs, "in"), []byte("lua in\n"), 0o644)
	job := c.jobFile("script", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=wlm_pool\n"+
		"#DW stage_in type=file source="+pfs+"/in destination=$DW_JOB_STRIPED/in\n"+
		"#DW stage_out type=file source=$DW_JOB_STRIPED/out destination="+pfs+"/out\ntrue\n\x00")
	bad := c.jobFile("bad", "#!/bin/bash\n#DW jobdw capacity=1GiB pool=wlm_pool bogus=1\n\x00")
	pathfile := filepath.Join(c.dir, "path")
	driver := `
slurm = { SUCCESS = 0, ERROR = -1, log_info = function(...) end }
dofile(` + luaString(script) + `)
local function check(name, rc, out, want_rc)
	want_rc = want_rc or 0
	if rc ~= want_rc then
		io.write("FAIL ", name, " rc=", tostring(rc), " out=", tostring(out), "\n")
		os.exit(1)
	end
	io.write("ok ", name, " ", tostring(out or ""):gsub("\n", " "), "\n")
end
local job, bad = ` + luaString(job) + `, ` + luaString(bad) + `
check("job_process", slurm_bb_job_process(job))
local rc, out = slurm_bb_job_process(bad)
check("job_process bad", rc, out, -1)
check("pools", slurm_bb_pools())
check("setup", slurm_bb_setup("42", "0", "0", "wlm_pool", "1073741824", job))
check("data_in", slurm_bb_data_in("42", job))
check("real_size", slurm_bb_real_size("42"))
check("paths", slurm_bb_paths("42", job, ` + luaString(pathfile) + `))
os.execute(` + luaString(link+" --function pre_run --token 42 --job "+job+" --nodes storage1") + `)
local f = io.open(` + luaString(c.dir+"/mounts/42_striped_scratch/out") + `, "w"); f:write("lua out\n"); f:close()
check("post_run", slurm_bb_post_run("42", job))
check("data_out", slurm_bb_data_out("42", job))
check("get_status", slurm_bb_get_status("0", "0", "sessions"))
check("teardown", slurm_bb_job_teardown("42", job, "false"))
check("teardown unknown", slurm_bb_job_teardown("43", job, "true"))
check("setup without capacity", slurm_bb_setup("44", "0", "0", "(null)", "0", job))
check("teardown hurry", slurm_bb_job_teardown("44", job, "true"))
`
	cmd := exec.Command(lua, "-")
	cmd.Stdin = strings.NewReader(driver)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "SPILLWAY_CONFIG=" + c.config, "SPILLWAY_DW_WLM_CLI=" + link, "SPILLWAY_DWSTAT=" + dwstatLink}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("lua driver: %v\n%s", err, out)
	}
	for _, want := range []string{
		"ok job_process bad", "line 2", "bogus",
		`ok pools {"pools":[{"id":"wlm_pool","units":"bytes","granularity":1073741824,"quantity":4,"free":4}]}`,
		"ok real_size 1073741824", "ok get_status", "sess state token creator owner", "ok teardown unknown token not found",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("lua output lacks %q\n%s", want, out)
		}
	}
	if env, _ := os.ReadFile(pathfile); string(env) != "DW_JOB_STRIPED="+c.dir+"/mounts/42_striped_scratch/\n" {
		t.Errorf("paths file: %q", env)
	}
	if b, err := os.ReadFile(filepath.Join(pfs, "out")); err != nil || string(b) != "lua out\n" {
		t.Errorf("stage-out through the lua: %q %v", b, err)
	}
	c.assertClean()
}

func luaString(s string) string {
	return "\"" + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\x00", `\0`).Replace(s) + "\""
}
