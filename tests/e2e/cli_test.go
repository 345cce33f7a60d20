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
	} {
		r := spillway(t, cmdOpts{}, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage") {
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
