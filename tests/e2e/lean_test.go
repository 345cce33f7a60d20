package e2e

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dataWarpLinks makes dw_wlm_cli, dwstat and dwcli in a new directory, links to target, as an
// install makes them; it returns the directory.
func dataWarpLinks(t *testing.T, target string) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"dw_wlm_cli", "dwstat", "dwcli"} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestLeanSameOutputAsFull: the small binary and the full one, called by DataWarp's names,
// answer the same commands byte for byte (stdout, stderr and exit status): the tables of a
// controller holding a persistent instance, JSON, listings, every usage, usage errors.
func TestLeanSameOutputAsFull(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()
	full, small := dataWarpLinks(t, binary), dataWarpLinks(t, smallBinary)
	env := []string{"SPILLWAY_CONFIG=" + c.config}
	// Something in every table the commands show: a persistent instance, made by the small
	// binary (the commands that change the state run once, not once per binary).
	r := runAs(t, filepath.Join(small, "dw_wlm_cli"), cmdOpts{env: env}, "--function", "create_persistent", "-c", "CLI", "-t", "leanbuf", "-u", "0", "-C", "wlm_pool:1073741824")
	if r.code != 0 || r.stdout != "created\n" {
		t.Fatalf("create_persistent through the small binary: %s", r)
	}
	commands := [][]string{
		{"dw_wlm_cli", "--function", "pools"},
		{"dw_wlm_cli", "--function", "show_sessions"},
		{"dw_wlm_cli", "--function", "show_instances"},
		{"dw_wlm_cli", "--function", "show_configurations"},
		{"dw_wlm_cli", "--function", "real_size", "--token", "leanbuf"},
		{"dw_wlm_cli", "--help"},
		{"dw_wlm_cli"},                                   // no --function: usage, 64
		{"dw_wlm_cli", "--function", "pools", "--bogus"}, // unknown option
		{"dw_wlm_cli", "--function", "frobnicate"},
		{"dw_wlm_cli", "--function", "setup", "--token", "1"}, // a required option missing
		{"dwstat"},
		{"dwstat", "--json", "pools"},
		{"dwstat", "-b", "pools", "sessions", "instances", "configurations"},
		{"dwstat", "controllers"},
		{"dwstat", "--help"},
		{"dwstat", "frobnicate"},
		{"dwstat", "--bogus"},
		{"dwcli", "ls", "pools"},
		{"dwcli", "ls", "sessions", "--json"},
		{"dwcli", "ls", "instances"},
		{"dwcli", "--help"},
		{"dwcli", "rm", "--help"},
		{"dwcli"},
		{"dwcli", "frobnicate"},
		{"dwcli", "ls"},
		{"dwcli", "rm", "session", "-i", "999999"}, // refused by the controller: no such session
	}
	for _, cmd := range commands {
		// The small binary runs between two runs of the full one; when those two differ, the
		// state moved under the command (the executor finishing something): run them again.
		var before, got, after result
		for attempt := 0; attempt < 5; attempt++ {
			before = runAs(t, filepath.Join(full, cmd[0]), cmdOpts{env: env}, cmd[1:]...)
			got = runAs(t, filepath.Join(small, cmd[0]), cmdOpts{env: env}, cmd[1:]...)
			after = runAs(t, filepath.Join(full, cmd[0]), cmdOpts{env: env}, cmd[1:]...)
			if before == after {
				break
			}
		}
		if before != after {
			t.Errorf("%s: the full binary answered differently at each of 5 tries (the state kept changing)\n%s\n%s", strings.Join(cmd, " "), before, after)
		} else if got != before {
			t.Errorf("%s: the small binary differs from the full one\nsmall: %s\nfull: %s", strings.Join(cmd, " "), got, before)
		}
		if before.stdout+before.stderr == "" {
			t.Errorf("%s printed nothing (the comparison shows nothing): %s", strings.Join(cmd, " "), before)
		}
	}
	if r := runAs(t, filepath.Join(small, "dwcli"), cmdOpts{env: env}, "ls", "sessions"); r.code != 0 || r.stdout == "" {
		t.Errorf("dwcli ls sessions shows no session while leanbuf exists: %s", r)
	}
	r = runAs(t, filepath.Join(small, "dw_wlm_cli"), cmdOpts{env: env}, "--function", "teardown", "--token", "leanbuf")
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("teardown through the small binary: %s", r)
	}
	c.assertClean()
}

// TestLeanHomeThroughFullBinary: with no controller configured, the small binary's dwcli and
// dwstat reach the one-machine home through the full spillway: the one beside the small
// binary, else the one on PATH.
func TestLeanHomeThroughFullBinary(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, false)
	beside := dataWarpLinks(t, smallBinary) // smallBinary's directory holds spillway
	opts := cmdOpts{home: w.home, dir: w.root}
	// --home names the home whatever /etc/spillway holds: no system configuration is used.
	r := runAs(t, filepath.Join(beside, "dwcli"), opts, "--home", w.home, "create", "pool", "--name", "lean_pool", "--granularity", "16MiB")
	if r.code != 0 {
		t.Fatalf("dwcli create pool on the home through the small binary: %s", r)
	}
	if r := runAs(t, filepath.Join(beside, "dwcli"), opts, "--home", w.home, "ls", "pools"); r.code != 0 || r.stdout != "lean_pool\nwlm_pool\n" {
		t.Errorf("dwcli ls pools on the home: %s", r)
	}
	// The same answer as the full binary's own.
	want := spillway(t, opts, "dwstat", "--home", w.home, "--json", "pools")
	if got := runAs(t, filepath.Join(beside, "dwstat"), opts, "--home", w.home, "--json", "pools"); got != want || got.code != 0 {
		t.Errorf("dwstat --json pools on the home: small %s\nfull %s", got, want)
	}

	// Alone in its directory, the small binary finds spillway on PATH.
	alone := t.TempDir()
	copyFile(t, smallBinary, filepath.Join(alone, "dw_wlm_cli"), 0o755)
	os.Symlink("dw_wlm_cli", filepath.Join(alone, "dwcli"))
	onPath := opts
	onPath.env = []string{"PATH=" + filepath.Dir(binary) + ":/usr/bin:/bin"}
	if r := runAs(t, filepath.Join(alone, "dwcli"), onPath, "--home", w.home, "ls", "pools"); r.code != 0 || r.stdout != "lean_pool\nwlm_pool\n" {
		t.Errorf("dwcli ls pools through the spillway on PATH: %s", r)
	}
}

// TestLeanWithoutFullBinary: alone, with no spillway on PATH, a command that needs the home
// says in one line what is missing and how to fix it, and exits 1; a command that needs no
// home still runs.
func TestLeanWithoutFullBinary(t *testing.T) {
	alone := t.TempDir()
	copyFile(t, smallBinary, filepath.Join(alone, "dw_wlm_cli"), 0o755)
	os.Symlink("dw_wlm_cli", filepath.Join(alone, "dwstat"))
	empty := t.TempDir()
	opts := cmdOpts{home: t.TempDir(), env: []string{"PATH=" + empty}}
	r := runAs(t, filepath.Join(alone, "dwstat"), opts, "--home", opts.home, "pools")
	if r.code != 1 || r.stdout != "" || strings.Count(r.stderr, "\n") != 1 ||
		!strings.Contains(r.stderr, "full spillway binary") || !strings.Contains(r.stderr, filepath.Join(alone, "spillway")) ||
		!strings.Contains(r.stderr, "on PATH") || !strings.Contains(r.stderr, "--config") {
		t.Errorf("dwstat on a home without the full binary: %s", r)
	}
	if r := runAs(t, filepath.Join(alone, "dwstat"), opts, "--help"); r.code != 0 || !strings.HasPrefix(r.stdout, "Usage: dwstat") {
		t.Errorf("dwstat --help without the full binary: %s", r)
	}
	// A spillway that is a link to the small binary is not the full one: said, not run again.
	os.Symlink("dw_wlm_cli", filepath.Join(alone, "spillway"))
	r = runAs(t, filepath.Join(alone, "dwstat"), opts, "--home", opts.home, "pools")
	if r.code != 1 || strings.Count(r.stderr, "\n") != 1 || !strings.Contains(r.stderr, filepath.Join(alone, "spillway")+" is this small binary itself") {
		t.Errorf("dwstat with spillway linked to the small binary: %s", r)
	}
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
