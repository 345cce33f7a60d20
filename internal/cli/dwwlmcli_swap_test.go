package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/dwstat"
)

// TestJobProcessSwap (issue 22): job_process refuses a bad #DW swap with the line, the field
// and the fix — zero, a word, a second #DW swap, a size above the site's [swap] max_per_node —
// and accepts one within it.
func TestJobProcessSwap(t *testing.T) {
	const site = "[swap]\nmax_per_node = \"4GiB\"\n"
	cases := []struct{ script, want string }{
		{"#!/bin/bash\n#DW swap 0GiB\n", "line 2: #DW swap: the swap size must be greater than zero; write the swap per compute node, e.g. #DW swap 4GiB"},
		{"#!/bin/bash\n#DW swap lots\n", "line 2: #DW swap"},
		{"#!/bin/bash\n#DW swap 1GiB\n#DW swap 2GiB\n", "line 3: #DW swap: only one #DW swap per job is allowed (the first is on line 2)"},
		{"#!/bin/bash\n#DW swap 5GiB\n", "line 2: #DW swap: size 5GiB is above this site's bound of 4GiB per compute node ([swap] max_per_node); ask for at most #DW swap 4GiB, or ask the administrator"},
	}
	for _, c := range cases {
		code, out := jobProcess(t, site, c.script)
		if code != 1 || !strings.HasPrefix(out, "job_file_valid False\n") || !strings.Contains(out, c.want) {
			t.Errorf("%q: exit %d\n%s\nwant it to contain\n%s", c.script, code, out, c.want)
		}
	}
	if code, out := jobProcess(t, site, "#!/bin/bash\n#DW jobdw capacity=1GiB\n#DW swap 4GiB\n"); code != 0 || out != "" {
		t.Errorf("scratch+swap within the bound: exit %d %s", code, out)
	}
}

// slurmDatawarpSize is what Slurm's burst_buffer/datawarp plugin reserves for a job before
// it calls setup (_get_bb_job): each #DW jobdw capacity= rounded up to the granularity, plus
// for #DW swap strtol() of the size — the leading number, the unit dropped — times the job's
// max_nodes (else min_nodes, else 1), rounded up to the granularity.
func slurmDatawarpSize(script string, maxNodes int, gran uint64) uint64 {
	round := func(n uint64) uint64 { return (n + gran - 1) / gran * gran }
	var total uint64
	for _, line := range strings.Split(script, "\n") {
		switch {
		case strings.HasPrefix(line, "#DW jobdw"):
			if i := strings.Index(line, "capacity="); i >= 0 {
				v := strings.Fields(line[i+9:])[0]
				n, _ := strconv.ParseUint(strings.TrimSuffix(v, "GiB"), 10, 64)
				total += round(n << 30)
			}
		case strings.HasPrefix(line, "#DW swap"):
			rest := strings.TrimSpace(strings.TrimPrefix(line, "#DW swap"))
			end := 0
			for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
				end++
			}
			n, _ := strconv.ParseUint(rest[:end], 10, 64)
			total += round(n * uint64(maxNodes))
		}
	}
	return total
}

// TestWLMSwapCapacity (issue 22, Slurm's path): Slurm's own arithmetic counts #DW swap 1GiB
// on 3 nodes as 3 bytes (one granule), so the --capacity it passes to setup is short by the
// swap. setup reserves size x nodes whatever Slurm passed (the nodes of --nodehostnamefile,
// else the script's #SBATCH --nodes maximum, as Slurm counts them); real_size answers the
// whole reservation, which Slurm takes as the job's size (it is larger than it asked), and
// pools shows it gone from the free space, which Slurm's later capacity waits subtract; paths
// gives the job no swap variable; dwstat configurations shows the swap configuration.
func TestWLMSwapCapacity(t *testing.T) {
	c, addr := testControllerWith(t, func(cfg *config.Config) { cfg.Controller.MountRoot = "/mnt/bb" })
	ctx := context.Background()
	for _, n := range []string{"bb1", "bb2"} {
		if _, err := c.Heartbeat(ctx, agentapi.NodeReport{Name: n, Pool: "wlm_pool", Capacity: 16 << 30, Roles: []string{"storage"}}); err != nil {
			t.Fatal(err)
		}
	}
	wlm := wlmAt(t, addr)
	dir := t.TempDir()
	free := func() uint64 {
		r := wlm("--function", "pools")
		var p struct {
			Pools []struct {
				Free        uint64 `json:"free"`
				Granularity uint64 `json:"granularity"`
			} `json:"pools"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &p); err != nil || len(p.Pools) != 1 {
			t.Fatalf("pools: %+v %v", r, err)
		}
		return p.Pools[0].Free * p.Pools[0].Granularity
	}
	const gran = 1 << 30
	before := free()

	script := "#!/bin/bash\n#SBATCH --nodes=2-3\n#DW jobdw type=scratch access_mode=striped capacity=2GiB\n#DW swap 1GiB\nhostname\n"
	job := filepath.Join(dir, "job1")
	os.WriteFile(job, []byte(script), 0o644)
	slurm := slurmDatawarpSize(script, 3, gran)
	if slurm != 3<<30 {
		t.Fatalf("Slurm's arithmetic: %d", slurm)
	}
	wlm("--function", "setup", "--token", "11", "--caller", "SLURM", "--user", "1000", "--groupid", "1000",
		"--capacity", "wlm_pool:"+strconv.FormatUint(slurm>>30, 10)+"GiB", "--job", job)
	r := wlm("--function", "real_size", "--token", "11")
	want := uint64(2<<30 + 3*(1<<30)) // the scratch, and 1GiB on each of the 3 nodes
	if r.code != 0 || r.stdout != "{\"token\":\"11\",\"capacity\":"+strconv.FormatUint(want, 10)+",\"units\":\"bytes\"}\n" {
		t.Errorf("real_size: %+v, want %d bytes", r, want)
	}
	if want <= slurm {
		t.Errorf("Slurm takes real_size only when larger than its own %d", slurm)
	}
	if got := before - free(); got != want {
		t.Errorf("pools: free dropped by %d, want %d", got, want)
	}
	pathfile := filepath.Join(dir, "path")
	if r := wlm("--function", "paths", "--token", "11", "--job", job, "--pathfile", pathfile); r.code != 0 {
		t.Fatalf("paths: %+v", r)
	}
	if raw, _ := os.ReadFile(pathfile); string(raw) != "DW_JOB_STRIPED=/mnt/bb/11_striped_scratch/\n" {
		t.Errorf("pathfile:\n%s", raw)
	}
	all, err := apiclientFor(t, addr).All(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, json := range []bool{false, true} {
		table := dwstat.Render(all, []string{"configurations"}, json, dwstat.Options{})
		if !strings.Contains(table, "swap") {
			t.Errorf("dwstat configurations (json %v) shows no swap configuration:\n%s", json, table)
		}
	}

	// A swap-only job, its nodes named (--nodehostnamefile): 2 areas of 3GiB, not the 8 of
	// its #SBATCH -N (the nodes Slurm planned are the ones it runs on). The lua plugin
	// counts no swap at all (capacity :0): the swap is reserved all the same.
	job2 := filepath.Join(dir, "job2")
	os.WriteFile(job2, []byte("#!/bin/bash\n#SBATCH -N 8\n#DW swap 3GiB\n"), 0o644)
	nodefile := filepath.Join(dir, "nodes")
	os.WriteFile(nodefile, []byte("cn1\ncn2\n"), 0o644)
	before = free()
	wlm("--function", "setup", "--token", "12", "--caller", "SLURM", "--user", "1000", "--groupid", "1000",
		"--capacity", ":0", "--job", job2, "--nodehostnamefile", nodefile)
	if r := wlm("--function", "real_size", "--token", "12"); r.code != 0 || !strings.Contains(r.stdout, "\"capacity\":"+strconv.Itoa(2*3<<30)+",") {
		t.Errorf("real_size of a swap-only job on its 2 named nodes (the hosts file Slurm planned beats #SBATCH -N): %+v", r)
	}
	if got := before - free(); got != 2*3<<30 {
		t.Errorf("pools: free dropped by %d", got)
	}
}
