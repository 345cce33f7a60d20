package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/views"
)

// DataWarp's manual walk-through against a real controller: dwcli create session, instance,
// configuration (with root_permissions and group), activation, then rm session (issue 23
// item 7).
func TestDwcliCreateWalkThrough(t *testing.T) {
	c, addr := testControllerWith(t, func(cfg *config.Config) { cfg.Controller.MountRoot = "/mnt/bb" })
	ctx := context.Background()
	for _, n := range []string{"bb1", "bb2"} {
		if _, err := c.Heartbeat(ctx, agentapi.NodeReport{Name: n, Pool: "wlm_pool", Capacity: 4 << 30, Roles: []string{"storage", "client"}}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) cliResult {
		t.Helper()
		return dwcli(append([]string{"--controller", addr}, args...)...)
	}
	must := func(want string, args ...string) cliResult {
		t.Helper()
		r := run(args...)
		if r.code != 0 || r.stdout != want {
			t.Fatalf("dwcli %q: exit %d\n%s%s\nwant %q", args, r.code, r.stdout, r.stderr, want)
		}
		return r
	}
	must("create request for sessions entity with id = 1 accepted, \"dwstat sessions\" for status\n",
		"create", "session", "--token", "walk1", "--owner", "1000", "--group", "1000", "--creator", "CLI", "--hosts", "bb1,bb2")
	must("create request for instances entity with id = 1 accepted, \"dwstat instances\" for status\n",
		"create", "instance", "--session", "1", "--capacity", "2GiB", "--pool", "wlm_pool", "--optimization", "bandwidth", "--label", "walk")
	must("create request for configurations entity with id = 1 accepted, \"dwstat configurations\" for status\n",
		"create", "configuration", "--instance", "1", "--type", "scratch", "--access-mode", "stripe", "--root-permissions", "2770", "--group", "4242")
	r := run("create", "activation", "--session", "1", "--configuration", "1", "--mount", "walk1", "--json")
	if r.code != 0 || strings.Join(strings.Fields(r.stdout), " ") != `{ "entity": "activations", "ids": [ 1, 2 ], "request": "create", "status": "accepted" }` {
		t.Fatalf("create activation --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	all := waitAll(t, addr, func(a views.All) bool { return len(a.Activations) == 2 })
	s, inst, conf := all.Sessions[0], all.Instances[0], all.Configurations[0]
	if s.Token != "walk1" || s.Owner != 1000 || s.Group != 1000 || s.Creator != "CLI" || len(s.Links.ClientNodes) != 2 || s.Persistent {
		t.Errorf("session: %+v", s)
	}
	if inst.Label != "walk" || inst.Capacity.Bytes != 2<<30 || inst.Links.Session != 1 {
		t.Errorf("instance: %+v", inst)
	}
	if conf.RootPermissions != 0o2770 || conf.Group != 4242 || conf.AccessType != "stripe" || conf.Type != "scratch" {
		t.Errorf("configuration: %+v", conf)
	}
	for _, a := range all.Activations {
		if a.Mount != "/mnt/bb/walk1" || a.Configuration != 1 || a.Session != 1 {
			t.Errorf("activation: %+v", a)
		}
	}

	// Mistakes are said before connecting, with the synopsis; refusals in one line.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "session", "--owner", "1000"}, "dwcli: create session needs --token TOKEN and --owner UID"},
		{[]string{"create", "instance", "--session", "1"}, "dwcli: create instance needs --session ID and --capacity SIZE (and --pool POOL unless the default pool)"},
		{[]string{"create", "configuration", "--instance", "1", "--access-mode", "stripe", "--root-permissions", "0999"}, `dwcli: --root-permissions "0999": give octal permission bits, at most 7777, e.g. 0755 or 2770`},
		{[]string{"create", "configuration", "--instance", "1"}, "dwcli: create configuration needs --instance ID and --access-mode stripe|private|ldbal"},
		{[]string{"create", "activation", "--session", "1", "--mount", "x"}, "dwcli: create activation needs --session ID, --configuration ID and --mount PATH"},
		{[]string{"create", "instance", "--session", "1", "--capacity", "1GiB", "--mount", "x"}, "dwcli: create instance takes no -mount"},
	} {
		r := run(tc.args...)
		if r.code != 64 || strings.Split(r.stderr, "\n")[0] != tc.want {
			t.Errorf("dwcli %q: exit %d\n%s\nwant exit 64 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"create", "instance", "--session", "1", "--capacity", "1GiB"}, "dwcli create instance: session 1 (token walk1) has instance 1 already; add configurations to it (dwcli create configuration --instance 1), or create another session\n"},
		{[]string{"create", "configuration", "--instance", "1", "--access-mode", "sideways"}, `dwcli create configuration: --access-mode "sideways": expected stripe, private or ldbal (or striped, loadbalance)` + "\n"},
		{[]string{"create", "configuration", "--instance", "7", "--access-mode", "stripe"}, "dwcli create configuration: no instance with id 7 (dwstat instances lists them)\n"},
		{[]string{"create", "activation", "--session", "1", "--configuration", "1", "--mount", "/etc"}, "dwcli create activation: --mount /etc: give a name for a directory of /mnt/bb (controller.mount_root), e.g. --mount /mnt/bb/walk1_manual, or the name alone\n"},
		{[]string{"create", "session", "--token", "walk1", "--owner", "1000", "--group", "1000"}, "dwcli create session: token walk1 is session 1's already; give another --token\n"},
	} {
		if r := run(tc.args...); r.code != 1 || r.stderr != tc.want {
			t.Errorf("dwcli %q: exit %d\n%s\nwant exit 1 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	r2 := run("create", "configuration", "--instance", "1", "--access-mode", "ldbal", "--json")
	var reply struct {
		Entity, Request, Status string
		IDs                     []int64
	}
	if err := json.Unmarshal([]byte(r2.stdout), &reply); err != nil || r2.code != 0 || reply.Entity != "configurations" || len(reply.IDs) != 1 || reply.IDs[0] != 2 {
		t.Errorf("create configuration --json: %d %s %s %v", r2.code, r2.stdout, r2.stderr, err)
	}

	// A persistent instance by hand: its root 0755 unless set.
	must("create request for sessions entity with id = 2 accepted, \"dwstat sessions\" for status\n",
		"create", "session", "--token", "proj", "--owner", "1000", "--group", "1000", "--persistent", "--expiration", "never")
	must("create request for instances entity with id = 2 accepted, \"dwstat instances\" for status\n", "create", "instance", "--session", "2", "--capacity", "1GiB")
	must("create request for configurations entity with id = 3 accepted, \"dwstat configurations\" for status\n", "create", "configuration", "--instance", "2", "--access-mode", "stripe")
	all = waitAll(t, addr, func(a views.All) bool { return len(a.Configurations) == 3 })
	for _, c := range all.Configurations {
		if c.ID == 3 && (c.RootPermissions != 0o755 || c.Group != 1000) {
			t.Errorf("persistent configuration: %+v", c)
		}
	}
	for _, i := range all.Instances {
		if i.ID == 2 && (!i.Public || i.Label != "proj") {
			t.Errorf("persistent instance: %+v", i)
		}
	}

	// rm session takes it all down (the nodes held offline: no agent to ask).
	run("update", "node", "--name", "bb1,bb2", "--offline")
	if r := run("rm", "session", "-i", "1", "--hurry"); r.code != 0 {
		t.Errorf("rm session: %d %s %s", r.code, r.stdout, r.stderr)
	}
	waitAll(t, addr, func(a views.All) bool { return len(a.Sessions) == 1 && len(a.Activations) == 0 })
}
