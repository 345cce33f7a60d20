package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelpOnEveryCommand: every command answers --help with its usage and exit status 0, and
// the binary answers to DataWarp's command names.
func TestHelpOnEveryCommand(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"run", "--help"}, {"persistent", "--help"}, {"dwstat", "--help"}, {"dwcli", "--help"},
		{"controller", "--help"}, {"agent", "--help"}, {"config", "--help"}, {"help", "run"},
		{"help", "help"}, {"help", "--help"}, {"help", "-h"}, {"dw_wlm_cli", "--help"}, {"home", "--help"}, {"help", "home"}, {"node-key", "--help"},
	} {
		r := spillway(t, cmdOpts{}, args...)
		// The usage once, on stdout; nothing on stderr.
		if r.code != 0 || strings.Count(r.stdout, "Usage") != 1 || r.stderr != "" {
			t.Errorf("spillway %s: %s", strings.Join(args, " "), r)
		}
	}
	r := spillway(t, cmdOpts{}, "frobnicate")
	if r.code != 64 || !strings.Contains(r.stderr, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: %s", r)
	}
	dir := t.TempDir()
	for _, name := range []string{"dwstat", "dwcli"} {
		link := filepath.Join(dir, name)
		if err := os.Symlink(binary, link); err != nil {
			t.Fatal(err)
		}
		r := run(t, link, "--help")
		if r.code != 0 || !strings.Contains(r.stdout, "Usage: "+name) {
			t.Errorf("%s personality: %s", name, r)
		}
	}
}

// TestDwcliAdmin: pools, drain and fill, listing, and removing a session.
func TestDwcliAdmin(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, false)
	node, _ := os.Hostname()
	if r := w.run("dwcli", "create", "pool", "--name", "sm_pool", "--granularity", "16MiB"); r.code != 0 {
		t.Fatalf("create pool: %s", r)
	}
	if r := w.run("dwcli", "ls", "pools"); r.stdout != "sm_pool\nwlm_pool\n" {
		t.Errorf("ls pools: %s", r)
	}
	// Options anywhere, and JSON on the status command.
	if r := w.run("dwcli", "ls", "pools", "--json"); strings.Join(strings.Fields(r.stdout), "") != `{"pools":["sm_pool","wlm_pool"]}` {
		t.Errorf("ls pools --json: %s", r)
	}
	if r := w.run("dwstat", "pools", "-b"); r.code != 0 || !strings.Contains(r.stdout, "16777216") {
		t.Errorf("dwstat pools -b: %s", r)
	}
	if r := w.run("dwcli", "update", "node", "--name", node, "--drain", "--reason", "maintenance"); r.code != 0 {
		t.Fatalf("drain: %s", r)
	}
	mustContain(t, w.run("dwstat", "nodes"), node+" wlm_pool online drain")
	mustContain(t, w.run("dwstat", "pools"), "wlm_pool bytes 4GiB 0B 1GiB")
	job := w.script("j.sh", "#!/bin/sh\n#DW jobdw type=scratch capacity=1GiB\ntrue\n")
	r := w.run("run", job)
	if r.code != 69 {
		t.Fatalf("a job on a drained pool must be refused: %s", r)
	}
	mustContain(t, r, node+" drained")
	w.run("dwcli", "update", "node", "--name", node, "--fill")
	if r := w.run("run", job); r.code != 0 {
		t.Fatalf("after fill: %s", r)
	}
	if r := w.run("dwcli", "update", "node", "--name", "nosuch", "--drain"); r.code == 0 || !strings.Contains(r.stderr, `node "nosuch" does not exist`) {
		t.Errorf("drain of an unknown node: %s", r)
	}
	if r := w.run("persistent", "create", "p1", "--capacity", "1GiB"); r.code != 0 {
		t.Fatal(r)
	}
	ids := strings.Fields(w.run("dwcli", "ls", "sessions").stdout)
	if len(ids) != 1 {
		t.Fatalf("one session expected: %v", ids)
	}
	if r := w.run("dwcli", "rm", "session", "-i", "99"); r.code == 0 || !strings.Contains(r.stderr, "no session with id 99") {
		t.Errorf("rm of an unknown session: %s", r)
	}
	if r := w.run("dwcli", "rm", "session", "-i", ids[0]); r.code != 0 {
		t.Fatalf("rm session: %s", r)
	}
	w.assertClean()
}

// TestLookingNeverCreatesAHome: dwstat and dwcli ls on a home that does not exist (a mistyped
// --home) say so and create nothing — no directory, no configuration, no pool.
func TestLookingNeverCreatesAHome(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "typo")
	for _, args := range [][]string{{"dwcli", "--home", missing, "ls", "pools"}, {"dwstat", "--home", missing, "pools"}} {
		r := spillway(t, cmdOpts{}, args...)
		if r.code == 0 || !strings.Contains(r.stderr, "no Spillway home at "+missing) {
			t.Errorf("spillway %s: %s", strings.Join(args, " "), r)
		}
		if _, err := os.Stat(missing); !os.IsNotExist(err) {
			t.Fatalf("spillway %s created %s (%v)", strings.Join(args, " "), missing, err)
		}
	}
}

// Options may come before or after a command's names: spillway node-key NAME --config FILE
// is spillway node-key --config FILE NAME.
func TestNodeKeyOptionsAnywhere(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	conf := filepath.Join(dir, "spillway.toml")
	os.WriteFile(token, []byte("node-key-test-secret\n"), 0o600)
	os.WriteFile(conf, []byte("[controller]\ntoken_file = \""+token+"\"\n"), 0o644)
	after := spillway(t, cmdOpts{}, "node-key", "cn1", "--config", conf)
	before := spillway(t, cmdOpts{}, "node-key", "--config", conf, "cn1")
	if after.code != 0 || before.code != 0 || after.stdout != before.stdout || !strings.HasPrefix(after.stdout, "node:cn1:") {
		t.Errorf("node-key NAME --config FILE: %s\nnode-key --config FILE NAME: %s", after, before)
	}
}
