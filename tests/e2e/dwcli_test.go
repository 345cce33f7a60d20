package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/views"
)

// TestDwcliDrivesAgents: dwcli's administrative commands against a controller and an agent
// as daemons. An ordinary user is refused every change; a drained node takes no instance and
// a filled one does; a node held offline stays offline whatever its heartbeats say; rm session
// removes the session's fragment from the agent's disk; a fragment whose creation failed until
// its fuse blew (the agent was down) is made once the fuse is replaced; finished stages stay in
// dwstat stages after their session went, and the cluster is clean of live objects.
func TestDwcliDrivesAgents(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	// The agent is killed for a while below: the node must stay online meanwhile, so that
	// the executor keeps trying (and fails) to create the fragment on it.
	cfg, _ := os.ReadFile(c.config)
	os.WriteFile(c.config, []byte(strings.Replace(string(cfg), `node_timeout = "2s"`, `node_timeout = "60s"`, 1)), 0o644)
	c.startController()
	c.startAgent()
	ctx := context.Background()
	dwcli := func(o cmdOpts, args ...string) result {
		t.Helper()
		return spillway(t, o, append([]string{"dwcli", "--config", c.config}, args...)...)
	}
	admin := func(args ...string) result {
		t.Helper()
		r := dwcli(cmdOpts{}, args...)
		if r.code != 0 {
			t.Fatalf("dwcli %s: %s", strings.Join(args, " "), r)
		}
		return r
	}
	all := func() views.All {
		t.Helper()
		a, err := c.client.All(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	setup := func(token string) error {
		return c.client.Setup(ctx, lifecycle.Setup{Token: token, Creator: "TEST", Owner: 0, Group: 0,
			Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}})
	}
	fragmentDirs := func() []string {
		entries, _ := os.ReadDir(filepath.Join(c.dir, "ssd", "fragment"))
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}

	// A whole job, then its stages in the history.
	c.runJob("100")
	c.assertClean()
	r := spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "stages")
	mustContain(t, r, "100 in file complete", "100 out file complete")
	var doc struct {
		Stages  []views.Stage `json:"stages"`
		History []views.Stage `json:"stage_history"`
	}
	r = spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "--json", "stages")
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || len(doc.Stages) != 0 || len(doc.History) != 2 || doc.History[1].BytesDone == 0 {
		t.Errorf("dwstat --json stages after the job: %v %s", err, r)
	}

	// An ordinary user may look, and change nothing.
	if err := setup("200"); err != nil {
		t.Fatal(err)
	}
	c.step("200", lifecycle.PhaseSetup, func() error { return nil })
	sid := strconv.FormatInt(all().Sessions[0].ID, 10)
	frag := strconv.FormatInt(all().Fragments[0].ID, 10)
	for _, args := range [][]string{
		{"update", "node", "--name", "storage1", "--drain"},
		{"update", "node", "--name", "storage1", "--offline"},
		{"rm", "node", "--name", "storage1"},
		{"create", "pool", "--name", "mine", "--granularity", "1GiB"},
		{"rm", "pool", "--name", "wlm_pool"},
		{"update", "fragment", "-i", frag, "--replace-fuse"},
	} {
		r := dwcli(cmdOpts{asUser: true}, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "this operation is for administrators (root or a controller.wlm_users user)") {
			t.Errorf("nobody: dwcli %s: %s", strings.Join(args, " "), r)
		}
	}
	// Another user's session is not even visible to them (controller.private_data).
	if r := dwcli(cmdOpts{asUser: true}, "rm", "session", "-i", sid); r.code != 1 || !strings.Contains(r.stderr, "no session with id "+sid) {
		t.Errorf("nobody removes root's session: %s", r)
	}
	if r := dwcli(cmdOpts{asUser: true}, "ls", "nodes"); r.code != 0 || r.stdout != "storage1\n" {
		t.Errorf("nobody lists the nodes: %s", r)
	}
	if a := all(); len(a.Sessions) != 1 || a.Nodes[0].Drain || !a.Nodes[0].Online {
		t.Fatalf("nobody changed the state: %+v", a)
	}

	// rm session frees its fragment on the agent's disk.
	if d := fragmentDirs(); len(d) != 1 || d[0] != frag {
		t.Errorf("fragment directories before rm session: %v, want [%s]", d, frag)
	}
	admin("rm", "session", "-i", sid)
	if d := fragmentDirs(); len(d) != 0 {
		t.Errorf("fragment directories after rm session: %v", d)
	}

	// Drain and fill.
	admin("update", "node", "--name", "storage1", "--drain", "--reason", "maintenance")
	mustContain(t, spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "nodes"), "storage1 wlm_pool online drain")
	if err := setup("201"); err == nil || !strings.Contains(err.Error(), "not usable: storage1 drained") {
		t.Errorf("setup on a drained node: %v", err)
	}
	admin("update", "node", "--name", "storage1", "--fill")

	// Offline whatever the heartbeats say (the agent sends one every 200ms), then online.
	admin("update", "node", "--name", "storage1", "--offline")
	for i := 0; i < 3; i++ {
		time.Sleep(300 * time.Millisecond) // a heartbeat or more
		mustContain(t, spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "nodes"), "storage1 wlm_pool offline fill")
	}
	admin("update", "node", "--name", "storage1", "--online")
	mustContain(t, spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "nodes"), "storage1 wlm_pool online fill")

	// The agent is down while a session is set up: the fragment's creation fails until its
	// fuse blows (executor.max_attempts); the executor then leaves it alone.
	c.killAgent()
	if err := setup("202"); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the fragment's fuse to blow", func() bool { a := all(); return len(a.Fragments) == 1 && a.Fragments[0].State.FuseBlown })
	frag = strconv.FormatInt(all().Fragments[0].ID, 10)
	mustContain(t, spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "fragments"), frag+" C-FT-")
	c.startAgent()
	c.waitFor("the agent's socket", func() bool { _, err := os.Stat(filepath.Join(c.dir, "agent.sock")); return err == nil })
	if a := all(); !a.Fragments[0].State.FuseBlown || len(fragmentDirs()) != 0 {
		t.Fatalf("with its fuse blown the fragment was tried again: %+v", a.Fragments)
	}
	r = admin("update", "fragment", "-i", frag, "--replace-fuse", "--json")
	if !strings.Contains(r.stdout, `"status": "accepted"`) {
		t.Errorf("replace-fuse --json: %s", r)
	}
	c.step("202", lifecycle.PhaseSetup, func() error { return nil })
	if d := fragmentDirs(); len(d) != 1 || d[0] != frag {
		t.Errorf("after the fuse was replaced the fragment directories are %v, want [%s]", d, frag)
	}
	sid = strconv.FormatInt(all().Sessions[0].ID, 10)
	admin("rm", "session", "-i", sid)
	c.assertClean()
}
