// Command dw_wlm_cli is the small binary of DataWarp's commands: dw_wlm_cli, and dwstat and
// dwcli as links to it (it runs the command it is called as). Slurm runs dw_wlm_cli as a
// whole process several times per job; this binary links none of the daemons, so a start
// costs a fraction of the full spillway's. The commands are package cli's: the same code the
// full binary runs under those names. A command that needs the one-machine home (no
// controller configured) runs the full spillway instead, found beside this binary or on PATH.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/cli"
)

const usage = `dw_wlm_cli — Spillway's DataWarp commands, in a small binary that starts fast

Usage:
  dw_wlm_cli --function FUNCTION [options]   the workload manager's interface (dw_wlm_cli --help)
  dwstat [TABLE...]                          pools, sessions, instances, ... (dwstat --help)
  dwcli COMMAND ...                          administrative changes (dwcli --help)

It runs the command it is called as: install it as dw_wlm_cli, with dwstat and dwcli as
links to it (scripts/install-deps and the Debian package do), or give the command as the
first argument. The commands are the full spillway binary's, which it runs instead when a
command needs the one-machine home (no controller configured): the spillway beside this
binary, else the one on PATH. See docs/admin.md.
`

func main() {
	cli.OneMachineHome = runFullBinary
	if code, ok := cli.RunDataWarp(filepath.Base(os.Args[0]), os.Args[1:]); ok {
		os.Exit(code)
	}
	if len(os.Args) > 1 {
		if code, ok := cli.RunDataWarp(os.Args[1], os.Args[2:]); ok {
			os.Exit(code)
		}
		if a := os.Args[1]; a == "-h" || a == "--help" || a == "help" {
			fmt.Print(usage)
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "%s: unknown command %q: expected %s\n\n%s", filepath.Base(os.Args[0]), os.Args[1], strings.Join(cli.DataWarpCommands, ", "), usage)
		os.Exit(64)
	}
	fmt.Fprint(os.Stderr, usage)
	os.Exit(64)
}

// runFullBinary is cli.OneMachineHome in this binary: the home's server is the full binary's
// (the embedded controller and agent), so the whole command runs there, with the same
// arguments and environment. It returns only when that binary cannot be run.
func runFullBinary(dir string, lookOnly bool) (*cli.Session, error) {
	full, err := fullBinary()
	if err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("running %s for the one-machine home: %w", full, syscall.Exec(full, os.Args, os.Environ()))
}

// fullBinary finds the full spillway: beside this binary's executable (links resolved), else
// on PATH; never this binary itself (a spillway that is a link to it would run it again).
func fullBinary() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("no controller is configured, and the one-machine home needs the full spillway binary, which is looked for beside this one: %v; give --config FILE or --controller ADDRESS", err)
	}
	selfInfo, _ := os.Stat(self)
	var notes []string // why the candidates that exist are not used
	usable := func(path string) bool {
		info, err := os.Stat(path)
		switch {
		case err != nil:
			return false
		case selfInfo != nil && os.SameFile(info, selfInfo):
			notes = append(notes, path+" is this small binary itself")
			return false
		case !info.Mode().IsRegular() || info.Mode()&0o111 == 0:
			notes = append(notes, path+" is not an executable file")
			return false
		}
		return true
	}
	beside := filepath.Join(filepath.Dir(self), "spillway")
	if usable(beside) {
		return beside, nil
	}
	if onPath, err := exec.LookPath("spillway"); err == nil && filepath.Clean(onPath) != beside && usable(onPath) {
		return filepath.Abs(onPath)
	}
	why := ""
	if len(notes) > 0 {
		why = " (" + strings.Join(notes, "; ") + ")"
	}
	return "", fmt.Errorf("no controller is configured, and the one-machine home needs the full spillway binary: there is none at %s or on PATH%s; install spillway beside this binary (scripts/install-deps does) or on PATH, or give --config FILE or --controller ADDRESS", beside, why)
}
