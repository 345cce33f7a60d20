package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/swaprace"
)

// attackEnv makes the test binary the attacker of package swaprace (see TestMain): the job
// scripts below run it, as the job's ordinary user, against their own instances.
const attackEnv = "SPILLWAY_E2E_ATTACK"

// TestJobCannotReachRootFilesThroughItsMount runs jobs as nobody against a root controller
// and agent: each job swaps a directory of its own instance with a link to a root-owned
// directory while chmod, truncate and create race through the agent's mount (package
// swaprace) — in a job instance and in a persistent instance. Root's files outside keep their
// mode and contents, and nothing is created beside them.
func TestJobCannotReachRootFilesThroughItsMount(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()

	victim := filepath.Join(c.dir, "victim") // root's 0755 directory outside every instance
	os.Mkdir(victim, 0o755)
	secret := []byte("root's file: mode 600, never truncated\n")
	target := filepath.Join(victim, swaprace.TargetName)
	attacker := filepath.Join(filepath.Dir(binary), "e2e-attacker.test") // nobody can run it
	if data, err := os.ReadFile(os.Args[0]); err != nil || os.WriteFile(attacker, data, 0o755) != nil {
		t.Fatalf("installing the attacker: %v", err)
	}
	jobs := filepath.Join(c.dir, "jobs")
	os.Mkdir(jobs, 0o777)
	// script is a job that attacks the instance whose mount path is in the variable mount.
	script := func(name, directives, mount string) string {
		body := fmt.Sprintf(`#!/bin/bash
%s
set -eu
export %s="{\"Work\":\"${%s%%/}\",\"Victim\":\"%s\",\"Duration\":%d}"
%s
`, directives, attackEnv, mount, victim, int64(3*time.Second), attacker)
		p := filepath.Join(jobs, name)
		os.WriteFile(p, []byte(body), 0o755)
		return p
	}
	runJob := func(script string) result {
		return spillway(t, cmdOpts{dir: jobs, asUser: true, timeout: time.Minute}, "run", "--config", c.config, "--node", "storage1", script)
	}

	create := filepath.Join(jobs, "create.sh")
	os.WriteFile(create, []byte("#!/bin/bash\n#BB create_persistent name=shared capacity=1GiB access_mode=striped type=scratch\n"), 0o755)
	if r := runJob(create); r.code != 0 {
		t.Fatalf("creating the persistent instance as nobody: %s", r)
	}
	for _, tc := range []struct{ name, directives, mount string }{
		{"job instance", "#DW jobdw type=scratch access_mode=striped capacity=1GiB", "DW_JOB_STRIPED"},
		{"persistent instance", "#DW persistentdw name=shared", "DW_PERSISTENT_STRIPED_shared"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(target, secret, 0o600); err != nil {
				t.Fatal(err)
			}
			r := runJob(script(strings.ReplaceAll(tc.name, " ", "-")+".sh", tc.directives, tc.mount))
			// The job's output holds the attacker's report: one JSON line.
			_, report, found := strings.Cut(r.stdout, `{"Exchanges":`)
			if r.code != 0 || !found {
				t.Fatalf("the attacking job: %s", r)
			}
			var rep swaprace.Report
			json.Unmarshal([]byte(`{"Exchanges":`+strings.SplitN(report, "\n", 2)[0]), &rep)
			t.Logf("%s: %s", tc.name, rep)
			if rep.Exchanges < 10 || rep.Chmods < 10 || rep.Creates < 10 {
				t.Fatalf("the attack did not run (%s): the test would prove nothing\n%s", rep, r)
			}
			st, err := os.Lstat(target)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("root's file outside the instance has mode %v after the attack, want 600", st.Mode())
			}
			if data, _ := os.ReadFile(target); !bytes.Equal(data, secret) {
				t.Errorf("root's file outside the instance holds %q after the attack, want it unchanged", data)
			}
			if entries, _ := os.ReadDir(victim); len(entries) != 1 {
				t.Errorf("the attack created files in root's directory outside the instance: %v", entries)
			}
		})
	}
	destroy := filepath.Join(jobs, "destroy.sh")
	os.WriteFile(destroy, []byte("#!/bin/bash\n#BB destroy_persistent name=shared\n"), 0o755)
	if r := runJob(destroy); r.code != 0 {
		t.Errorf("destroying the persistent instance: %s", r)
	}
	c.assertClean()
}
