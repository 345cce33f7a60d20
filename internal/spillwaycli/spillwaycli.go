// Package spillwaycli holds the commands of the full, multi-call `spillway` binary: the
// daemons (controller, agent), run, home, admin, layout, stripes, and DataWarp's commands of
// package cli, with the one-machine home behind them (package embedded).
package spillwaycli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spillway-hpc/spillway/internal/cli"
	"github.com/spillway-hpc/spillway/internal/embedded"
	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/stage"
)

const mainUsage = `spillway — an open-source, DataWarp-compatible burst buffer

Usage:
  spillway <command> [options] [arguments]

Commands for everyone:
  run SCRIPT [ARGS]     run a job script with #DW/#BB directives on this machine
  persistent            create, list and destroy persistent instances
  dwstat [TABLE...]     show pools, sessions, instances, ... (DataWarp's dwstat)
  home status|stop      the background server of a one-machine home ($SPILLWAY_HOME)
  layout [-o FILE]      snapshot of pools, nodes and instances for the bbsim simulator
  stripes FILE...       which storage node holds which stripes of a file
  config defaults       print every configuration key with its default

Daemons (administrators):
  controller            the DataWarp service: state, API, executor
  agent                 the daemon of a storage and/or compute node
  dwcli                 administrative changes: pools, nodes, sessions, fuses (dwcli --help)
  dw_wlm_cli            the workload manager's interface (Slurm's GetSysState)
  node-key NAME         print node NAME's own credential, for its agent.token_file

Other:
  version               print the version
  help [COMMAND]        show a command's usage

The binary also answers to the names dwstat, dwcli and dw_wlm_cli (make symbolic links);
the small dw_wlm_cli binary installed beside it runs those three alone, starting faster.
Every command takes --help. Documentation: docs/ in the source tree (README.md to start).
`

// Main runs the command named by argv and returns the exit status.
func Main(argv []string) int {
	cli.OneMachineHome = connectHome
	if code, ok := cli.RunDataWarp(filepath.Base(argv[0]), argv[1:]); ok {
		return code
	}
	args := argv[1:]
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, mainUsage)
		return 64
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return runMain(rest, os.Stdout, os.Stderr)
	case "persistent":
		return cli.PersistentMain(rest, os.Stdout, os.Stderr)
	case "dwstat", "dwcli", "dw_wlm_cli":
		code, _ := cli.RunDataWarp(cmd, rest)
		return code
	case "layout":
		return layoutMain(rest, os.Stdout, os.Stderr)
	case "stripes":
		return stripesMain(rest, os.Stdout, os.Stderr)
	case "controller":
		return controllerMain(rest, os.Stdout, os.Stderr)
	case "agent":
		return agentMain(rest, os.Stdout, os.Stderr)
	case "config":
		return configMain(rest, os.Stdout, os.Stderr)
	case "home":
		return homeMain(rest, os.Stdout, os.Stderr)
	case "node-key":
		return nodeKeyMain(rest, os.Stdout, os.Stderr)
	case "admin":
		return adminMain(rest, os.Stdout, os.Stderr)
	case "stage-worker":
		// Hidden: the agent starts it to move one stage's data as the job's user.
		return stage.WorkerMain(rest, os.Stdin, os.Stdout)
	case "pfs-worker":
		// Hidden: a cache instance's door to the PFS, as the job's user (package pfsio).
		return pfsio.WorkerMain(rest, os.Stderr)
	case "version", "--version":
		fmt.Println("spillway", cli.Version)
		return 0
	case "help", "-h", "--help":
		// "help COMMAND" is "COMMAND --help"; help about help (or an option) is the main usage.
		if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") && rest[0] != "help" {
			return Main([]string{argv[0], rest[0], "--help"})
		}
		fmt.Print(mainUsage)
		return 0
	}
	fmt.Fprintf(os.Stderr, "spillway: unknown command %q\n\n%s", cmd, mainUsage)
	return 64
}

// connect is cli.Connection.Connect that also returns the one-machine home it reached (nil
// for a configured controller): spillway run uses more of the home than the other commands.
func connect(conn *cli.Connection, embeddedByDefault bool, log *slog.Logger) (*cli.Session, *embedded.Home, error) {
	if conn.Configured(embeddedByDefault) {
		sess, err := conn.Connect(embeddedByDefault, log)
		return sess, nil, err
	}
	return connectHomeServer(conn.HomeDir(), conn.LookOnly())
}

// connectHome reaches the one-machine home's server, started in the background when none
// runs (cli.OneMachineHome).
func connectHome(dir string, lookOnly bool) (*cli.Session, error) {
	sess, _, err := connectHomeServer(dir, lookOnly)
	return sess, err
}

func connectHomeServer(dir string, lookOnly bool) (*cli.Session, *embedded.Home, error) {
	home, err := openHome(dir, lookOnly)
	if err != nil {
		return nil, nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	cl, err := home.Client(exe)
	if err != nil {
		return nil, nil, err
	}
	var connArgs []string
	if dir != "" || os.Getenv("SPILLWAY_HOME") != "" {
		connArgs = []string{"--home", home.Dir}
	}
	return cli.NewSession(cl, home.Config, connArgs), home, nil
}

// openHome opens the one-machine home in dir, else the default; lookOnly: refuse to make one.
func openHome(dir string, lookOnly bool) (*embedded.Home, error) {
	if dir == "" {
		var err error
		if dir, err = embedded.DefaultDir(); err != nil {
			return nil, err
		}
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, embedded.ConfigName)); lookOnly && errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no Spillway home at %s: nothing has run there yet (spillway run creates one); name another with --home DIR or SPILLWAY_HOME, or a system install with --config", dir)
	}
	return embedded.Open(dir)
}

// self is how this spillway was invoked, for the commands it prints: the name found on the
// PATH, or the absolute path of the binary.
func self() []string {
	arg0 := os.Args[0]
	if filepath.Base(arg0) != "spillway" {
		// Invoked under another name (dwstat, ...): print the binary.
		if exe, err := os.Executable(); err == nil {
			return []string{exe}
		}
		return []string{"spillway"}
	}
	if strings.Contains(arg0, "/") {
		return []string{cli.AbsOr(arg0)}
	}
	return []string{arg0}
}
