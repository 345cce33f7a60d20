package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/views"
)

// DataWarp's own grammar of dwcli stage (--session, --configuration, --backing-path, --dir)
// against a real controller: the requests are the path form's, query prints DataWarp's
// columns (column 8 the files remaining), and a flag this version lacks is said in one line
// (issue 23 item 6).
func TestDwcliStageDataWarpForm(t *testing.T) {
	c, addr := testController(t)
	ctx := context.Background()
	if _, err := c.Heartbeat(ctx, agentapi.NodeReport{Name: "bb1", Pool: "wlm_pool", Capacity: 4 << 30, Roles: []string{"storage", "client"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Setup(ctx, lifecycle.Setup{Token: "901", Creator: "SLURM", Owner: 1000, Group: 1000, ClientNodes: []string{"bb1"},
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}, Strategy: "interference"}}, false); err != nil {
		t.Fatal(err)
	}
	all := waitAll(t, addr, func(a views.All) bool { return len(a.Namespaces) == 1 })
	sess, conf := itoa(all.Sessions[0].ID), itoa(all.Configurations[0].ID)
	pfs := t.TempDir()
	run := func(args ...string) cliResult {
		t.Helper()
		return dwcli(append([]string{"--controller", addr, "stage"}, args...)...)
	}
	named := func(verb string, more ...string) []string {
		return append([]string{verb, "--session", sess, "--configuration", conf}, more...)
	}

	r := run(named("in", "--backing-path", pfs+"/", "--dir", "/input")...)
	if want := "stage in request for session " + sess + " configuration " + conf + " dir /input accepted, \"dwcli stage query --session " + sess + " --configuration " + conf + "\" for status\n"; r.code != 0 || r.stdout != want {
		t.Fatalf("stage in: exit %d\n%s%s\nwant %q", r.code, r.stdout, r.stderr, want)
	}
	// --dir without its leading "/" (${path#$DW_JOB_STRIPED} of a variable ending in /).
	if r = run(named("out", "--backing-path", pfs, "--dir", "results")...); r.code != 0 || !strings.Contains(r.stdout, "dir /results accepted") {
		t.Fatalf("stage out: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = run(named("query")...)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if r.code != 0 || len(lines) != 3 || strings.Join(strings.Fields(lines[0]), " ") != "sess conf dir direction state backing_path files remaining bytes error" {
		t.Fatalf("stage query: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	rows := map[string][]string{}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		rows[f[2]] = f
	}
	in, out := rows["/input"], rows["/results"]
	if in == nil || out == nil || in[0] != sess || in[1] != conf || in[3] != "in" || out[3] != "out" || in[5] != pfs || out[5] != pfs || in[6] != "0" {
		t.Errorf("stage query rows:\n%s", r.stdout)
	}
	for _, row := range [][]string{in, out} { // column 8: files remaining, "-" once ended
		if row != nil && (row[4] == "pending" || row[4] == "running") != (row[7] == "1") {
			t.Errorf("column 8 of %q: %q", row, row[7])
		}
	}
	// --dir narrows the query; --json is the machine form.
	r = run(named("query", "--dir", "/input", "--json")...)
	var reply struct {
		Errno  int
		Stages []namedRow
	}
	if err := json.Unmarshal([]byte(r.stdout), &reply); err != nil || r.code != 0 || reply.Errno != 0 || len(reply.Stages) != 1 || reply.Stages[0].Dir != "/input" || reply.Stages[0].BackingPath != pfs {
		t.Errorf("stage query --json: %d %s %s %v", r.code, r.stdout, r.stderr, err)
	}
	// The same stages through the path form's query show in dwcli stage list.
	if r = run(named("list")...); r.code != 0 || !strings.Contains(r.stdout, " in /input "+pfs) || !strings.Contains(r.stdout, " out /results "+pfs) {
		t.Errorf("stage list: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = run(named("terminate", "--dir", "/input")...); r.code != 0 || r.stdout != "1 stage(s) terminated\n" {
		t.Errorf("stage terminate: %d %q %s", r.code, r.stdout, r.stderr)
	}
	waitAll(t, addr, func(a views.All) bool {
		for _, s := range a.Stages {
			if s.DWPath == "$DW_JOB_STRIPED/input" && s.Status != "canceled" {
				return false
			}
		}
		return true
	})
	if r = run(named("query", "--dir", "input")...); r.code != 0 || !strings.Contains(r.stdout, " canceled ") || strings.Fields(strings.Split(r.stdout, "\n")[1])[7] != "-" {
		t.Errorf("query of a terminated stage: %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Mistakes: one line each, exit 64, not the flag package's words nor the usage.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{named("in", "--backing-path", pfs, "--file", "/x"), "dwcli stage: --file is a DataWarp flag this version does not support; DataWarp's form takes --session ID --configuration ID --backing-path PFS_DIR/ --dir /DIR (dwcli stage --help)\n"},
		{[]string{"query", "--bogus", "/x"}, "dwcli stage: --bogus is not an option of dwcli stage (dwcli stage --help lists them)\n"},
	} {
		if r := run(tc.args...); r.code != 64 || r.stderr != tc.want || r.stdout != "" {
			t.Errorf("dwcli stage %q: exit %d\n%s%s\nwant exit 64 and %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"in", "--session", sess, "--backing-path", pfs, "--dir", "/x"}, "dwcli stage in: DataWarp's form needs --session ID and --configuration ID (dwstat sessions, dwstat configurations)\n"},
		{named("in", "--dir", "/x"), "dwcli stage in: stage in needs --backing-path PFS_DIR/ (the PFS directory to copy from)\n"},
		{named("in", "--backing-path", pfs, "--type", "file"), "dwcli stage in: -type is not an option of DataWarp's form (--session, --configuration, --backing-path, --dir): it stages directories; give a path instead to use the path form\n"},
		{named("in", "--backing-path", pfs, "--dir", "../x"), "dwcli stage in: --dir ../x: give a directory inside the instance, relative to its root (e.g. /results), without ..\n"},
		{named("accounting"), "dwcli stage accounting: stage accounting has no DataWarp form: give a path (dwcli stage --help)\n"},
	} {
		r := run(tc.args...)
		if first := strings.SplitAfter(r.stderr, "\n")[0]; r.code == 0 || first != tc.want {
			t.Errorf("dwcli stage %q: exit %d\n%s%s\nwant %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	// A persistent instance's own session and configuration: $DW_PERSISTENT_STRIPED_proj.
	if err := c.Setup(ctx, lifecycle.Setup{Token: "proj", Creator: "CLI", Owner: 1000, Group: 1000, Persistent: true, Expiration: lifecycle.ExpirationNever,
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}, false); err != nil {
		t.Fatal(err)
	}
	all = waitAll(t, addr, func(a views.All) bool { return len(a.Configurations) == 2 })
	psess, pconf := itoa(all.Sessions[1].ID), itoa(all.Configurations[1].ID)
	if r := run("in", "--session", psess, "--configuration", pconf, "--backing-path", pfs, "--dir", "/data"); r.code != 0 {
		t.Errorf("stage into a persistent instance: %d %s %s", r.code, r.stdout, r.stderr)
	}
	waitAll(t, addr, func(a views.All) bool {
		for _, s := range a.Stages {
			if s.DWPath == "$DW_PERSISTENT_STRIPED_proj/data" {
				return true
			}
		}
		return false
	})
	// Another session's configuration, which the job does not use: the controller says so.
	if r := run("in", "--session", sess, "--configuration", pconf, "--backing-path", pfs); r.code != 1 || r.stderr != "dwcli stage in: stage: $DW_PERSISTENT_STRIPED_proj: the job has no #DW persistentdw name=proj\n" {
		t.Errorf("a configuration the session does not use: %d %q", r.code, r.stderr)
	}
	if r := run("in", "--session", "99", "--configuration", conf, "--backing-path", pfs); r.code != 1 || r.stderr != "dwcli stage in: no session 99 (dwstat sessions lists yours)\n" {
		t.Errorf("no such session: %d %q", r.code, r.stderr)
	}
	if r := run("in", "--session", sess, "--configuration", "99", "--backing-path", pfs); r.code != 1 || r.stderr != "dwcli stage in: no configuration 99 (dwstat configurations lists them)\n" {
		t.Errorf("no such configuration: %d %q", r.code, r.stderr)
	}
	if r := run("in", "--session", sess, "--configuration", conf, "--backing-path", pfs+"/nosuch/"); r.code != 1 || r.stderr != "dwcli stage in: PFS directory "+pfs+"/nosuch does not exist\n" {
		t.Errorf("no such PFS directory: %d %q", r.code, r.stderr)
	}
}
