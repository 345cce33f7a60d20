package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/controller"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/sqlite"
	"github.com/spillway-hpc/spillway/internal/views"
)

type cliResult struct {
	code           int
	stdout, stderr string
}

func dwcli(args ...string) cliResult {
	var out, errb bytes.Buffer
	code := dwcliMain(args, &out, &errb)
	return cliResult{code, out.String(), errb.String()}
}

// A mistake gets one line saying what is wrong, then the short usage: not the manual.
func TestDwcliMistakes(t *testing.T) {
	short := strings.Count(dwcliShort, "\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "dwcli: give a command"},
		{[]string{"frobnicate", "nodes"}, `unknown command "frobnicate"`},
		{[]string{"ls"}, "ls what? give an object"},
		{[]string{"ls", "nodez"}, `unknown object "nodez"`},
		{[]string{"ls", "nodes", "pools"}, `unexpected "pools" after ls nodes`},
		{[]string{"rm", "fragment", "-i", "3"}, "rm fragment is not a command"},
		{[]string{"create", "pool", "--name", "p"}, "create pool needs --name POOL and --granularity SIZE"},
		{[]string{"create", "pool", "--name", "p", "--granularity", "lots"}, `--granularity "lots": give a size greater than 0`},
		{[]string{"update", "node", "--drain"}, "update node needs --name NODE"},
		{[]string{"update", "node", "--name", "bb1"}, "update node needs a change"},
		{[]string{"update", "node", "--name", "bb1", "--drain", "--fill"}, "--drain and --fill contradict each other"},
		{[]string{"update", "node", "--name", "bb1", "--offline", "--online"}, "--offline and --online contradict each other"},
		{[]string{"update", "node", "--name", "bb1", "--drain", "-i", "4"}, "update node takes no -i"},
		{[]string{"update", "registration", "-i", "4"}, "update registration needs -i ID and --no-wait"},
		{[]string{"update", "fragment", "-i", "4"}, "update fragment needs -i ID and --replace-fuse"},
		{[]string{"update", "session", "-i", "4", "--replace-fuse"}, "update session is not a command"},
		{[]string{"rm", "session"}, "rm session needs -i ID"},
		{[]string{"rm", "node"}, "rm node needs --name"},
		{[]string{"rm", "session", "-i", "4", "--drain"}, "rm session takes no -drain"},
		{[]string{"ls", "nodes", "--bogus"}, "dwcli: --bogus is not an option of dwcli (dwcli --help lists them)"},
		{[]string{"create", "instance", "--session", "1", "--capacity", "1GiB", "--public"}, "dwcli: --public is a DataWarp flag this version does not support; a persistent instance is built from a session made with dwcli create session --persistent"},
	} {
		r := dwcli(tc.args...)
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		if r.code != 64 || !strings.Contains(lines[0], tc.want) || len(lines) != 1+short || !strings.HasPrefix(lines[1], "Usage: dwcli") || r.stdout != "" {
			t.Errorf("dwcli %q: exit %d, stderr\n%s\nwant exit 64, one line with %q and the %d lines of the short usage", tc.args, r.code, r.stderr, tc.want, short)
		}
	}
}

// --help is the manual; dwcli VERB --help is the synopsis and that verb's part.
func TestDwcliHelp(t *testing.T) {
	for _, tc := range []struct {
		args          []string
		want, notWant string
	}{
		{[]string{"--help"}, "update fragment|namespace|activation -i ID --replace-fuse", ""},
		{[]string{"help", "rm"}, "Forget a retired node", "--replace-fuse forgets"},
		{[]string{"update", "--help"}, "--replace-fuse forgets the failures", "Forget a retired node"},
		{[]string{"update", "node", "--help"}, "--offline   take the node out of service", ""},
		{[]string{"ls", "-h"}, "plural or singular", "Forget a retired node"},
		{[]string{"create", "--help"}, "(octal, e.g. 0755 or 2770; default 0700 for a job, 0755 for a persistent", "Forget a retired node"},
		{[]string{"stage", "--help"}, "remaining (column 8) is the files still to copy", ""},
	} {
		r := dwcli(tc.args...)
		if r.code != 0 || !strings.Contains(r.stdout, tc.want) || tc.notWant != "" && strings.Contains(r.stdout, tc.notWant) || r.stderr != "" {
			t.Errorf("dwcli %q: exit %d\n%s%s\nwant %q, not %q", tc.args, r.code, r.stdout, r.stderr, tc.want, tc.notWant)
		}
	}
}

// testController serves a real controller with a real state database on a Unix socket, its
// executor running; it has no agents (their effects fail as an unreachable agent's do).
func testController(t *testing.T) (*controller.Controller, string) {
	t.Helper()
	return testControllerWith(t, nil)
}

// testControllerWith is testController with the configuration changed by change.
func testControllerWith(t *testing.T, change func(*config.Config)) (*controller.Controller, string) {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Defaults()
	cfg.Controller.StateDir = dir
	cfg.Controller.NodeTimeout = config.Duration(time.Second)
	cfg.Pools = []config.Pool{{Name: "wlm_pool", Granularity: config.Size(1 << 30)}}
	cfg.Executor.MaxAttempts = 2
	cfg.Executor.Tick = config.Duration(20 * time.Millisecond)
	cfg.Executor.RetryBackoff = config.Duration(time.Millisecond)
	cfg.Executor.RetryBackoffMax = config.Duration(time.Millisecond)
	if change != nil {
		change(&cfg)
	}
	eng, err := sqlite.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := controller.New(cfg, store.New(eng), func(n *model.Node) (agentapi.Agent, error) { return nil, errors.New("no agents in this test") }, log)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "controller.sock")
	l, err := httpapi.Listen("unix:"+sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { c.Run(ctx); done <- struct{}{} }()
	go func() { controller.NewServer(c, "", nil, log).Serve(ctx, l, httpapi.Limits{}); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done; eng.Close() })
	return c, "unix:" + sock
}

// Every dwcli command against a real controller, in text and in JSON.
func TestDwcliCommands(t *testing.T) {
	c, addr := testController(t)
	ctx := context.Background()
	heartbeat := func(name, pool string) {
		t.Helper()
		if _, err := c.Heartbeat(ctx, agentapi.NodeReport{Name: name, Pool: pool, Capacity: 4 << 30, Roles: []string{"storage", "client"}}); err != nil {
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
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("dwcli %q: exit %d\n%s%s\nwant %q", args, r.code, r.stdout, r.stderr, want)
		}
		return r
	}
	refused := func(want string, args ...string) {
		t.Helper()
		r := run(args...)
		if r.code != 1 || !strings.Contains(r.stderr, want) || strings.Count(r.stderr, "\n") != 1 {
			t.Fatalf("dwcli %q: exit %d\n%s%s\nwant exit 1 and one line with %q", args, r.code, r.stdout, r.stderr, want)
		}
	}
	node := func(name string) views.Node {
		t.Helper()
		all, err := (&Connection{controller: addr}).connectAll()
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range all.Nodes {
			if n.ID == name {
				return n
			}
		}
		t.Fatalf("no node %s", name)
		return views.Node{}
	}
	heartbeat("bb1", "wlm_pool")
	heartbeat("bb2", "wlm_pool")

	// Pools.
	must(`create request for pools entity with id = sm_pool accepted, "dwstat pools" for status`, "create", "pool", "--name", "sm_pool", "--granularity", "16MiB")
	must("sm_pool\nwlm_pool\n", "ls", "pool")
	r := must("", "ls", "pools", "--json")
	if strings.Join(strings.Fields(r.stdout), "") != `{"pools":["sm_pool","wlm_pool"]}` {
		t.Errorf("ls pools --json: %s", r.stdout)
	}
	r = must(`"status": "accepted"`, "create", "pool", "--name", "tmp_pool", "--granularity", "1GiB", "--json")
	var reply struct {
		Request, Entity, Status string
		IDs                     []any
	}
	if err := json.Unmarshal([]byte(r.stdout), &reply); err != nil || reply.Request != "create" || reply.Entity != "pools" || len(reply.IDs) != 1 || reply.IDs[0] != "tmp_pool" {
		t.Errorf("create pool --json: %s %v", r.stdout, err)
	}
	must("delete request for pools entity with id = tmp_pool done", "rm", "pool", "--name", "tmp_pool")
	refused("pool wlm_pool is in the controller's configuration", "rm", "pool", "--name", "wlm_pool")

	// Nodes: drain, fill, offline, online, move, several at once.
	must("update request for nodes entity with id = bb1 accepted", "update", "node", "--name", "bb1", "--drain", "--reason", "SSD errors")
	if n := node("bb1"); !n.Drain || n.Reason != "SSD errors" {
		t.Errorf("drained: %+v", n)
	}
	must("", "update", "node", "--name", "bb1", "--fill")
	must("", "update", "node", "--name", "bb1", "--offline")
	heartbeat("bb1", "wlm_pool")
	if n := node("bb1"); n.Online || !n.HeldOffline {
		t.Errorf("held offline, after a heartbeat: %+v", n)
	}
	must("", "update", "node", "--name", "bb1", "--online")
	if n := node("bb1"); !n.Online || n.Drain {
		t.Errorf("online again: %+v", n)
	}
	r = must("id = bb2", "update", "node", "--name", "bb1,bb2", "--pool", "sm_pool")
	if !strings.Contains(r.stdout, "id = bb1") || node("bb2").Pool != "sm_pool" {
		t.Errorf("move two nodes: %s %+v", r.stdout, node("bb2"))
	}
	refused("pool sm_pool has node(s) bb1, bb2", "rm", "pool", "--name", "sm_pool")
	must("", "update", "node", "--name", "bb1,bb2", "--pool", "wlm_pool")
	refused(`node "nosuch" does not exist`, "update", "node", "--name", "nosuch", "--drain")
	r = run("update", "node", "--name", "nosuch", "--drain", "--json")
	if r.code != 1 || !strings.Contains(r.stdout, `"error": "node \"nosuch\" does not exist`) {
		t.Errorf("--json error: %d %s %s", r.code, r.stdout, r.stderr)
	}

	// A session: its fragment's creation fails (no agent) until its fuse blows.
	setup := func(token string) {
		t.Helper()
		if err := c.Setup(ctx, lifecycle.Setup{Token: token, Creator: "SLURM", Owner: 1000, Group: 1000, ClientNodes: []string{"bb2"},
			Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}, Strategy: "interference"}}, false); err != nil {
			t.Fatal(err)
		}
	}
	setup("801")
	all := waitAll(t, addr, func(a views.All) bool { return len(a.Fragments) == 1 && a.Fragments[0].State.FuseBlown })
	frag, inst, conf := all.Fragments[0], all.Instances[0], all.Configurations[0]
	must("update request for fragments entity with id = "+itoa(frag.ID)+" accepted", "update", "fragment", "-i", itoa(frag.ID), "--replace-fuse")
	waitAll(t, addr, func(a views.All) bool { return len(a.Fragments) == 1 && a.Fragments[0].State.FuseBlown }) // tried again, and blown again
	ns := itoa(all.Namespaces[0].ID)
	refused("the fuse of namespace "+ns+" is not blown", "update", "namespace", "-i", ns, "--replace-fuse")
	refused("namespace 999 does not exist", "update", "namespace", "-i", "999", "--replace-fuse")
	refused(`node bb`, "rm", "node", "--name", frag.Node) // holds the fragment
	must("", "update", "registration", "-i", "1", "--no-wait")

	// rm instance tears the session down (its node held offline: no agent to ask).
	must("", "update", "node", "--name", frag.Node, "--offline")
	r = must("instance "+itoa(inst.ID)+" belongs to session 1 (token 801): removing the session", "rm", "instance", "-i", itoa(inst.ID), "--hurry")
	if !strings.Contains(r.stdout, "delete request for instances entity with id = "+itoa(inst.ID)+" done") {
		t.Errorf("rm instance: %s", r.stdout)
	}
	must("", "update", "node", "--name", frag.Node, "--online")
	setup("802")
	all = waitAll(t, addr, func(a views.All) bool { return len(a.Configurations) == 1 })
	conf = all.Configurations[0]
	must("", "update", "node", "--name", all.Fragments[0].Node, "--offline")
	must("configuration "+itoa(conf.ID)+" belongs to session", "rm", "configuration", "-i", itoa(conf.ID), "--hurry")
	must("", "update", "node", "--name", all.Fragments[0].Node, "--online")
	setup("803")
	all = waitAll(t, addr, func(a views.All) bool { return len(a.Sessions) == 1 })
	must("", "update", "node", "--name", all.Fragments[0].Node, "--offline")
	r = must(`"ids": [`, "rm", "session", "-i", itoa(all.Sessions[0].ID), "--hurry", "--json")
	if !strings.Contains(r.stdout, `"status": "done"`) {
		t.Errorf("rm session --json: %s", r.stdout)
	}
	must("", "update", "node", "--name", all.Fragments[0].Node, "--online")
	refused("no session with id 99", "rm", "session", "-i", "99")
	refused("no instance with id 99", "rm", "instance", "-i", "99")

	// An activation: mounted on bb2 (its mount fails: no agent), removed.
	setup("804")
	waitAll(t, addr, func(a views.All) bool { return len(a.Namespaces) == 1 })
	if err := c.PreRun(ctx, "804", []string{"bb2"}); err != nil {
		t.Fatal(err)
	}
	all = waitAll(t, addr, func(a views.All) bool { return len(a.Activations) == 1 })
	must("", "update", "node", "--name", "bb2", "--offline")
	must("delete request for activations entity with id = "+itoa(all.Activations[0].ID)+" done", "rm", "activation", "-i", itoa(all.Activations[0].ID))
	waitAll(t, addr, func(a views.All) bool { return len(a.Activations) == 0 && len(a.Sessions) == 1 })
	must("", "update", "node", "--name", "bb1,bb2", "--offline")
	must("", "rm", "session", "-i", itoa(all.Sessions[0].ID), "--hurry")

	// ls every object, singular and plural.
	for _, obj := range []string{"nodes", "node", "sessions", "sess", "instances", "inst", "configurations", "conf", "fragments", "frag",
		"namespaces", "nss", "registrations", "reg", "activations", "activ", "stages", "stage", "pools"} {
		if r := run("ls", obj, "--json"); r.code != 0 || !strings.HasPrefix(r.stdout, "{") {
			t.Errorf("ls %s: %d %s %s", obj, r.code, r.stdout, r.stderr)
		}
	}
	// rm node: refused while its agent sends heartbeats; done once it is silent.
	refused("stop its agent first", "rm", "node", "--name", "bb1")
	time.Sleep(1100 * time.Millisecond) // controller.node_timeout
	must("delete request for nodes entity with id = bb1 done", "rm", "node", "--name", "bb1")
	must("bb2\n", "ls", "nodes")
	r = run("config", "backup")
	if r.code != 0 || !strings.Contains(r.stdout, `"format": "spillway-dwcli-config"`) || !strings.Contains(r.stdout, `"id": "bb2"`) {
		t.Errorf("config backup: %+v", r)
	}
	if r = run("config", "restore"); r.code != 64 || !strings.Contains(r.stderr, "config restore takes FILE") {
		t.Errorf("config restore without a file: %+v", r)
	}
}

// waitAll polls the controller until ok says so.
func waitAll(t *testing.T, addr string, ok func(views.All) bool) views.All {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		all, err := (&Connection{controller: addr}).connectAll()
		if err != nil {
			t.Fatal(err)
		}
		if ok(all) {
			return all
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out; the state is %+v", all)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *Connection) connectAll() (views.All, error) {
	sess, err := c.Connect(false, QuietLogger(io.Discard))
	if err != nil {
		return views.All{}, err
	}
	return sess.client.All(context.Background())
}

func itoa(i int64) string { b, _ := json.Marshal(i); return string(b) }
