package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// wlmCall runs dw_wlm_cli under its own name, with the cluster's configuration in the
// environment, as slurmctld does; stdout and stderr are kept apart so that the test can check
// that nothing goes to stderr (Slurm merges them and would parse it as JSON).
func (c *cluster) wlm(args ...string) result {
	c.t.Helper()
	link := filepath.Join(c.dir, "dw_wlm_cli")
	if _, err := os.Lstat(link); err != nil {
		os.Symlink(smallBinary, link)
	}
	cmd := exec.Command(link, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "SPILLWAY_CONFIG=" + c.config}
	cmd.Dir = c.dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Run()
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
}

func (c *cluster) wlmOK(args ...string) string {
	c.t.Helper()
	r := c.wlm(args...)
	if r.code != 0 || r.stderr != "" {
		c.t.Fatalf("dw_wlm_cli %s: %s", strings.Join(args, " "), r)
	}
	return r.stdout
}

// checkSlurmJSON checks what Slurm's parser needs: one JSON object, integer numbers only, no
// apostrophes anywhere.
func checkSlurmJSON(t *testing.T, out, key string) []map[string]any {
	t.Helper()
	if strings.Contains(out, "'") {
		t.Errorf("apostrophe in %q", out)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.UseNumber()
	var doc map[string][]map[string]any
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: not JSON: %v\n%s", key, err, out)
	}
	rows, ok := doc[key]
	if !ok {
		t.Fatalf("no %q key in %s", key, out)
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case json.Number:
			if _, err := x.Int64(); err != nil {
				t.Errorf("%s: number %s is not an integer", key, x)
			}
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	for _, r := range rows {
		walk(r)
	}
	return rows
}

// TestSlurmProtocol drives dw_wlm_cli exactly as Slurm's burst_buffer/datawarp plugin does
// (the spec's observed call sequence), with each of the four forms of the --job file.
func TestSlurmProtocol(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()

	rows := checkSlurmJSON(t, c.wlmOK("--function", "pools"), "pools")
	if len(rows) != 1 || rows[0]["id"] != "wlm_pool" || rows[0]["granularity"].(json.Number).String() != "1073741824" || rows[0]["quantity"].(json.Number).String() != "4" {
		t.Fatalf("pools: %v", rows)
	}
	checkSlurmJSON(t, c.wlmOK("--function", "show_instances"), "instances")
	checkSlurmJSON(t, c.wlmOK("--function", "show_sessions"), "sessions")
	checkSlurmJSON(t, c.wlmOK("--function", "show_configurations"), "configurations")

	pfs := filepath.Join(c.dir, "pfs")
	os.WriteFile(filepath.Join(pfs, "data.in"), []byte("input data\n"), 0o644)
	directives := "#DW jobdw type=scratch access_mode=striped capacity=1GiB\n" +
		"#DW stage_in type=file source=" + pfs + "/data.in destination=$DW_JOB_STRIPED/data.in\n" +
		"#DW stage_out type=file source=$DW_JOB_STRIPED/data.out destination=" + pfs + "/data.out.%j\n"
	substituted := func(id string) string { return strings.ReplaceAll(directives, "%j", id) }

	variants := []struct {
		name string
		job  func(id string) string // the file Slurm passes to setup, data_in, post_run, data_out
	}{
		{"stored script ending in NUL", func(id string) string {
			return c.jobFile("script-"+id, "#!/bin/bash\n#SBATCH -N 1\n"+substituted(id)+"hostname\n\x00")
		}},
		{"interactive without final newline", func(id string) string {
			return c.jobFile("interactive-"+id, "#!/bin/bash\n"+strings.TrimSuffix(substituted(id), "\n"))
		}},
		{"memfd of slurmctld", func(id string) string { return memfd(t, "#!/bin/sh\n"+substituted(id)) }},
		{"hard link of an array master", func(id string) string {
			master := c.jobFile("master-"+id, "#!/bin/bash\n"+substituted(id)+"true\n\x00")
			link := filepath.Join(c.dir, "task-"+id)
			if err := os.Link(master, link); err != nil {
				t.Fatal(err)
			}
			return link
		}},
	}
	nodes := c.jobFile("client_nids", "storage1\n")
	for i, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			id := fmt.Sprint(10 + i)
			job := v.job(id)
			// job_process and paths get the stored, unreplaced script.
			stored := c.jobFile("stored-"+id, "#!/bin/bash\n"+directives+"true\n\x00")
			c.wlmOK("--function", "job_process", "--job", stored)
			c.wlmOK("--function", "setup", "--token", id, "--caller", "SLURM", "--user", "0", "--groupid", "0", "--capacity", "wlm_pool:1GiB", "--job", job)
			c.wlmOK("--function", "data_in", "--token", id, "--job", job)
			real := c.wlmOK("--function", "real_size", "--token", id)
			if !strings.Contains(real, `"capacity":1073741824`) || !strings.Contains(real, `"units":"bytes"`) {
				t.Errorf("real_size: %s", real)
			}
			pathfile := filepath.Join(c.dir, "path-"+id)
			c.wlmOK("--function", "paths", "--job", stored, "--token", id, "--pathfile", pathfile)
			env, _ := os.ReadFile(pathfile)
			want := "DW_JOB_STRIPED=" + c.dir + "/mounts/" + id + "_striped_scratch/\n"
			if string(env) != want {
				t.Fatalf("path file %q, want %q", env, want)
			}
			c.wlmOK("--function", "pre_run", "--token", id, "--job", stored, "--nodehostnamefile", nodes)
			mount := strings.TrimPrefix(strings.TrimSpace(string(env)), "DW_JOB_STRIPED=")
			if b, err := os.ReadFile(mount + "data.in"); err != nil || string(b) != "input data\n" {
				t.Fatalf("staged-in file in the mount: %q %v", b, err)
			}
			os.WriteFile(mount+"data.out", []byte("output of "+id+"\n"), 0o644)
			sessions := checkSlurmJSON(t, c.wlmOK("--function", "show_sessions"), "sessions")
			if len(sessions) != 1 || sessions[0]["token"] != id || sessions[0]["owner"].(json.Number).String() != "0" {
				t.Errorf("show_sessions while the job runs: %v", sessions)
			}
			instances := checkSlurmJSON(t, c.wlmOK("--function", "show_instances"), "instances")
			if len(instances) != 1 || instances[0]["capacity"].(map[string]any)["bytes"].(json.Number).String() != "1073741824" {
				t.Errorf("show_instances: %v", instances)
			}
			c.wlmOK("--function", "post_run", "--token", id, "--job", job)
			c.wlmOK("--function", "data_out", "--token", id, "--job", job)
			c.wlmOK("--function", "teardown", "--token", id, "--job", stored)
			if b, err := os.ReadFile(filepath.Join(pfs, "data.out."+id)); err != nil || string(b) != "output of "+id+"\n" {
				t.Fatalf("staged-out file: %q %v", b, err)
			}
			c.assertClean()
		})
	}

	t.Run("unknown tokens", func(t *testing.T) {
		r := c.wlm("--function", "teardown", "--token", "999", "--job", nodes)
		if r.code != 0 || !strings.Contains(r.stdout, "token not found") {
			t.Errorf("teardown of an unknown token: %s", r)
		}
		r = c.wlm("--function", "data_in", "--token", "999", "--job", c.jobFile("empty", "#!/bin/sh\n"))
		if !strings.Contains(r.stdout, "No matching session") {
			t.Errorf("data_in of an unknown token: %s", r)
		}
	})

	t.Run("invalid directive", func(t *testing.T) {
		r := c.wlm("--function", "job_process", "--job", c.jobFile("bad", "#!/bin/bash\n#SBATCH -N 1\n#DW jobdw capacity=1GiB bogus=1\n\x00"))
		if r.code == 0 || !strings.Contains(r.stdout, "line 3") || !strings.Contains(r.stdout, "bogus") {
			t.Errorf("job_process of an invalid script: %s", r)
		}
	})

	t.Run("persistent", func(t *testing.T) {
		out := c.wlmOK("--function", "create_persistent", "-c", "CLI", "-t", "foo", "-u", "0", "-C", "wlm_pool:1073741824", "-a", "striped", "-T", "scratch")
		if !strings.Contains(out, "created") {
			t.Fatalf("create_persistent must print created: %q", out)
		}
		if out := c.wlmOK("--function", "create_persistent", "-c", "CLI", "-t", "foo", "-u", "0", "-C", "wlm_pool:1073741824"); !strings.Contains(out, "created") {
			t.Errorf("a repeated create by the same user is a success: %q", out)
		}
		user := c.jobFile("use", "#!/bin/bash\n#DW persistentdw name=foo\ntrue\n\x00")
		c.wlmOK("--function", "job_process", "--job", user)
		c.wlmOK("--function", "setup", "--token", "20", "--caller", "SLURM", "--user", "0", "--groupid", "0", "--capacity", "wlm_pool:0", "--job", user)
		c.wlmOK("--function", "data_in", "--token", "20", "--job", user)
		pathfile := filepath.Join(c.dir, "path-20")
		c.wlmOK("--function", "paths", "--job", user, "--token", "20", "--pathfile", pathfile)
		env, _ := os.ReadFile(pathfile)
		if string(env) != "DW_PERSISTENT_STRIPED_foo="+c.dir+"/mounts/foo_20_striped_scratch/\n" {
			t.Errorf("paths of a persistentdw job: %q", env)
		}
		c.wlmOK("--function", "pre_run", "--token", "20", "--job", user, "--nodehostnamefile", nodes)
		r := c.wlm("--function", "teardown", "--token", "foo", "--job", user)
		if r.code == 0 || !strings.Contains(r.stdout, "in use by job(s) 20") {
			t.Errorf("destroying a persistent instance in use: %s", r)
		}
		c.wlmOK("--function", "post_run", "--token", "20", "--job", user)
		c.wlmOK("--function", "data_out", "--token", "20", "--job", user)
		c.wlmOK("--function", "teardown", "--token", "20", "--job", user)
		c.wlmOK("--function", "teardown", "--token", "foo", "--job", user)
		c.assertClean()
	})

	t.Run("concurrent invocations", func(t *testing.T) {
		script := c.jobFile("conc", "#!/bin/bash\n#DW jobdw type=scratch capacity=1GiB\ntrue\n\x00")
		var wg sync.WaitGroup
		results := make([]result, 8)
		for i := range results {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				capacity := "wlm_pool:0"
				if i < 4 {
					capacity = "wlm_pool:1GiB" // the pool holds four
				}
				results[i] = c.wlm("--function", "setup", "--token", fmt.Sprint(100+i), "--caller", "SLURM", "--user", "0", "--groupid", "0", "--capacity", capacity, "--job", script)
			}(i)
		}
		wg.Wait()
		for i, r := range results {
			if r.code != 0 {
				t.Errorf("setup %d: %s", 100+i, r)
			}
		}
		if n := len(checkSlurmJSON(t, c.wlmOK("--function", "show_sessions"), "sessions")); n != 8 {
			t.Errorf("%d sessions listed, want 8", n)
		}
		pools := checkSlurmJSON(t, c.wlmOK("--function", "pools"), "pools")
		if pools[0]["free"].(json.Number).String() != "0" {
			t.Errorf("four 1GiB instances fill the 4GiB pool: %v", pools)
		}
		for i := range results {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				results[i] = c.wlm("--function", "teardown", "--token", fmt.Sprint(100+i), "--job", script, "--hurry")
			}(i)
		}
		wg.Wait()
		for i, r := range results {
			if r.code != 0 {
				t.Errorf("teardown %d: %s", 100+i, r)
			}
		}
		c.assertClean()
	})
}

func (c *cluster) jobFile(name, content string) string {
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// memfd returns a /proc/<pid>/fd/N path of an in-memory file held by this process, as
// slurmctld hands the directives of jobs with % symbols.
func memfd(t *testing.T, content string) string {
	fd, err := unix.MemfdCreate("bb_script", 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "memfd")
	f.WriteString(content)
	t.Cleanup(func() { f.Close() })
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd)
}

// job_process reads at most jobspec.MaxScriptBytes: a script path that never ends (a device)
// is refused with the reason instead of being read without bound.
func TestJobProcessReadsABoundedScript(t *testing.T) {
	c := newCluster(t) // no daemons: job_process needs none
	// c.wlm fails the test if the command does not return within its timeout.
	if r := c.wlm("--function", "job_process", "--job", "/dev/zero"); r.code == 0 || !strings.Contains(r.stdout, "is larger than 16MiB") {
		t.Errorf("job_process of /dev/zero: %s", r)
	}
}
