package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteProtectionAcrossHosts: DataWarp's three write-protection policies on remote mounts
// (the job's process on compute node hostb, its instance on storage nodes hosta and hostc): MFS
// gives EFBIG, MFC EMFILE, the write window EROFS until it cools down, on an instance on one
// server and on one striped over both; a job asking past the site's maximum is refused at
// job_process; the storage nodes save what they counted.
func TestWriteProtectionAcrossHosts(t *testing.T) {
	c := newNetClusterOf(t, []string{"hosta", "hostc"}, []string{"hostb"})
	// Small grains, so that a write window is a few MiB; a site maximum on the multiplier.
	ctl := c.hosts["ctl"].config
	raw, err := os.ReadFile(ctl)
	if err != nil {
		t.Fatal(err)
	}
	extra := "[limits]\nwrite_window_multiplier = 2\nwrite_window_multiplier_maximum = 4\n[[pool]]\nname = \"wlm_pool\"\ngranularity = \"16MiB\"\n"
	if err := os.WriteFile(ctl, append(raw, extra...), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"ctl", "hosta", "hostc", "hostb"} {
		c.start(h)
	}

	greedy := c.jobFile("greedy.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=16MiB write_window_multiplier=5\nsrun ./a.out\n\x00")
	os.Symlink(smallBinary, filepath.Join(c.dir, "dw_wlm_cli"))
	cmd := exec.Command(filepath.Join(c.dir, "dw_wlm_cli"), "--function", "job_process", "--job", greedy)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "SPILLWAY_CONFIG=" + ctl}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "write_window_multiplier=5") || !strings.Contains(string(out), "maximum of 4") ||
		!strings.Contains(string(out), "job_file_valid False") {
		t.Errorf("job_process of a job past the site's maximum multiplier: %v\n%s", err, out)
	}

	// 2 × 16 MiB of writes per fragment per 3 s; at most 3 files; none larger than 4 MiB.
	for i, capacity := range []string{"16MiB", "32MiB"} {
		token := fmt.Sprint(70 + i)
		t.Run(capacity, func(t *testing.T) {
			job := c.jobFile("job"+token+".sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped(MFC=3,MFS=4MiB) capacity="+capacity+
				" write_window_length=3 write_window_multiplier=2\nsrun ./a.out\n\x00")
			nodes := c.jobFile("nodes", "hostb\n")
			c.wlm("--function", "job_process", "--job", job)
			c.wlm("--function", "setup", "--token", token, "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
				"--capacity", "wlm_pool:"+capacity, "--job", job)
			c.wlm("--function", "data_in", "--token", token, "--job", job)
			mount := c.jobPath(token, job, "DW_JOB_STRIPED")
			c.wlm("--function", "pre_run", "--token", token, "--job", job, "--nodehostnamefile", nodes)
			writeProtection(t, c, mount, token)
			c.wlm("--function", "post_run", "--token", token, "--job", job)
			// The storage nodes saved what they counted: every byte hostb wrote over the network.
			c.waitFor("the counters saved after the job's last write", func() bool {
				saved, _ := filepath.Glob(filepath.Join(c.dir, "host[ac]", "ssd", "fragment", "*", "accounting", "counters.json"))
				var total uint64
				for _, p := range saved {
					raw, _ := os.ReadFile(p)
					var st struct {
						BytesWritten uint64 `json:"bytes_written"`
						Clients      []struct {
							Node string `json:"node"`
						} `json:"clients"`
					}
					json.Unmarshal(raw, &st)
					if len(st.Clients) == 0 || st.Clients[0].Node != "hostb" {
						return false
					}
					total += st.BytesWritten
				}
				return total >= 32<<20+1<<20
			})
			c.wlm("--function", "data_out", "--token", token, "--job", job)
			c.wlm("--function", "teardown", "--token", token, "--job", job)
		})
	}
	c.assertClean()
}

// writeProtection trips the three policies of a mount with MFS=4MiB, MFC=3 and a write window
// of 32 MiB per fragment per 3 s, on compute node hostb.
func writeProtection(t *testing.T, c *netCluster, mount, token string) {
	t.Helper()
	run := func(script string) string {
		out, _ := c.onHost("hostb", "cd "+mount+" && "+script).CombinedOutput()
		return string(out)
	}
	if out := run("dd if=/dev/zero of=big bs=1M count=5 2>&1; echo rc=$?"); !strings.Contains(out, "File too large") {
		t.Errorf("writing 5 MiB with MFS=4MiB:\n%s", out)
	}
	if out := run("touch a b && touch c 2>&1; echo rc=$?"); !strings.Contains(out, "Too many open files") {
		t.Errorf("a fourth file with MFC=3 (big, a, b made):\n%s", out)
	}
	// Overwrite 4 MiB again and again: past 32 MiB within 3 s its fragment is read-only.
	trip := run("for i in $(seq 1 40); do dd if=/dev/zero of=a bs=1M count=4 conv=notrunc,fsync 2>&1 || { echo tripped after $i; exit 0; }; done; echo never tripped")
	if !strings.Contains(trip, "Read-only file system") || !strings.Contains(trip, "tripped after") {
		t.Errorf("overwriting past the write window:\n%s", trip)
	}
	// The job reads its accounting at once: read-only, what it wrote (issue 23 item 9).
	if a, err := c.client.SessionAccounting(context.Background(), token); err != nil {
		t.Error(err)
	} else {
		ro := false
		for _, f := range a.Realm.Fragments {
			ro = ro || f.ReadOnly
		}
		if !ro || !a.Realm.Current || a.Realm.BytesWritten < 32<<20 {
			t.Errorf("accounting at EROFS: read-only %v, current %v, written %d (want true, true, 32 MiB or more): %+v", ro, a.Realm.Current, a.Realm.BytesWritten, a.Realm.Fragments)
		}
	}
	// Reads go on; writes come back once the window cooled down (a bounded wait).
	if out := run("cat a | wc -c"); strings.TrimSpace(out) != "4194304" {
		t.Errorf("reading while read-only: %q", out)
	}
	if out := run("for i in $(seq 1 60); do dd if=/dev/zero of=a bs=1M count=1 conv=notrunc,fsync 2>/dev/null && { echo writable; exit 0; }; sleep 0.5; done; echo still read-only"); !strings.Contains(out, "writable") {
		t.Errorf("after the window: %s", out)
	}
}
