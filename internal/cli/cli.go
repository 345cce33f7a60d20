// Package cli holds the command mains of the multi-call `spillway` binary: thin layers that
// parse flags, connect to the controller and print. The behaviour lives in the libraries.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/embedded"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/stage"
)

// Version is set at build time (-ldflags "-X .../cli.Version=...").
var Version = "0.1.0-dev"

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

The binary also answers to the names dwstat, dwcli and dw_wlm_cli (make symbolic links).
Every command takes --help. Documentation: docs/ in the source tree (README.md to start).
`

// Main runs the command named by argv and returns the exit status.
func Main(argv []string) int {
	name := filepath.Base(argv[0])
	args := argv[1:]
	switch name {
	case "dwstat":
		return dwstatMain(args, os.Stdout, os.Stderr)
	case "dwcli":
		return dwcliMain(args, os.Stdout, os.Stderr)
	case "dw_wlm_cli":
		// Slurm merges stdout and stderr: everything goes to stdout.
		return dwWLMMain(args, os.Stdout, os.Stdout)
	}
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, mainUsage)
		return 64
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return runMain(rest, os.Stdout, os.Stderr)
	case "persistent":
		return persistentMain(rest, os.Stdout, os.Stderr)
	case "dwstat":
		return dwstatMain(rest, os.Stdout, os.Stderr)
	case "layout":
		return layoutMain(rest, os.Stdout, os.Stderr)
	case "stripes":
		return stripesMain(rest, os.Stdout, os.Stderr)
	case "dwcli":
		return dwcliMain(rest, os.Stdout, os.Stderr)
	case "dw_wlm_cli":
		return dwWLMMain(rest, os.Stdout, os.Stdout)
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
		// Hidden: the agent starts it, as the job's user, to move one stage's data.
		return stage.WorkerMain(os.Stdin, os.Stdout)
	case "version", "--version":
		fmt.Println("spillway", Version)
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

// newFlags makes a flag set whose -h/--help prints usage to stdout and exits 0, and whose
// errors print the usage to stderr.
func newFlags(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fmt.Fprintln(fs.Output(), "\nOptions:")
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags; it returns (exit status, false) when the command should stop. Help
// goes to stdout once; a bad flag prints the flag package's message and the usage to stderr.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) (int, bool) {
	usage := fs.Usage
	fs.Usage = func() {} // the flag package would print it on -h too, to stderr
	err := fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		return 0, false
	}
	if err != nil {
		fs.Usage()
		return 64, false
	}
	return 0, true
}

// parseInterspersed is parse for commands whose arguments are names, never a program's
// arguments: options may follow them (dwstat sessions --json). "--" ends the options.
func parseInterspersed(fs *flag.FlagSet, args []string, stdout io.Writer) (int, bool) {
	var names []string
	for {
		if code, ok := parse(fs, args, stdout); !ok {
			return code, false
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if len(args) > 0 && len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			names = append(names, rest...) // everything after "--" is a name
			break
		}
		names, args = append(names, rest[0]), rest[1:]
	}
	fs.Parse(append([]string{"--"}, names...)) // leaves fs.Args() == names
	return 0, true
}

// connection says how a command reaches a controller.
type connection struct {
	configPath string // --config: a system install's file
	controller string // --controller: an address
	tokenFile  string // --token-file
	home       string // --home: a one-machine home
	// lookOnly: the command only reads the state (dwstat, dwcli ls): it never creates a
	// one-machine home where none is (a mistyped --home must not make one, with a pool).
	lookOnly bool
}

func (c *connection) flags(fs *flag.FlagSet, withHome bool) {
	fs.StringVar(&c.configPath, "config", "", "configuration file of a system install (default $SPILLWAY_CONFIG, else "+config.DefaultPath+" if it exists)")
	fs.StringVar(&c.controller, "controller", "", "controller address: unix:/path/to/socket or http://host:port, or several controllers comma-separated (overrides the configuration)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the shared secret of a TCP controller")
	if withHome {
		fs.StringVar(&c.home, "home", "", "use the one-machine Spillway in this directory (default $SPILLWAY_HOME, else ~/.local/share/spillway)")
	}
}

// systemConfigPath returns the system configuration to use, "" for none.
func (c *connection) systemConfigPath(embeddedByDefault bool) string {
	if c.configPath != "" {
		return c.configPath
	}
	if p := os.Getenv("SPILLWAY_CONFIG"); p != "" {
		return p
	}
	if embeddedByDefault || c.home != "" {
		return ""
	}
	if _, err := os.Stat(config.DefaultPath); err == nil {
		return config.DefaultPath
	}
	return ""
}

// anyTCP reports whether a controller address (or any of a comma-separated list) is TCP.
func anyTCP(addr string) bool {
	for _, a := range strings.Split(addr, ",") {
		if strings.HasPrefix(strings.TrimSpace(a), "http") {
			return true
		}
	}
	return false
}

// session is a connected command: its client, and the one-machine home it uses (if any).
type session struct {
	client *apiclient.Client
	cfg    config.Config
	home   *embedded.Home
	// connArgs reach the same controller again (for the commands a run prints).
	connArgs []string
}

func (s *session) Close() {}

// connect reaches the controller: an explicit address, a system configuration, or the
// one-machine home's server (started in the background when none runs).
func (c *connection) connect(embeddedByDefault bool, log *slog.Logger) (*session, error) {
	token, err := apiclient.TokenFromFile(c.tokenFile)
	if err != nil {
		return nil, err
	}
	path := c.systemConfigPath(embeddedByDefault)
	if c.controller != "" || path != "" {
		cfg := config.Defaults()
		if path != "" {
			if cfg, err = config.Load(path); err != nil {
				return nil, err
			}
		}
		addr := c.controller
		if addr == "" {
			addr = cfg.Client.Controller
		}
		if token == "" && cfg.Client.TokenFile != "" && anyTCP(addr) {
			if token, err = apiclient.TokenFromFile(cfg.Client.TokenFile); err != nil {
				return nil, err
			}
		}
		clientTLS, err := httpapi.ClientTLS(cfg.TLS.CAFile)
		if err != nil {
			return nil, err
		}
		cl, err := apiclient.New(addr, apiclient.Options{Token: token, ConnectRetries: cfg.Client.ConnectRetries, RetryWait: cfg.Client.RetryWait.D(),
			RequestTimeout: cfg.Controller.RequestTimeout.D() + 5*time.Second, ConnectTimeout: cfg.Client.ConnectTimeout.D(), UnreachableRounds: cfg.Client.UnreachableRounds, Munge: true, MungeSocket: cfg.Client.MungeSocket, TLS: clientTLS})
		if err != nil {
			return nil, err
		}
		var connArgs []string
		if c.configPath != "" || os.Getenv("SPILLWAY_CONFIG") != "" {
			connArgs = append(connArgs, "--config", absOr(path))
		}
		if c.controller != "" {
			connArgs = append(connArgs, "--controller", c.controller)
		}
		if c.tokenFile != "" {
			connArgs = append(connArgs, "--token-file", absOr(c.tokenFile))
		}
		return &session{client: cl, cfg: cfg, connArgs: connArgs}, nil
	}
	home, err := c.openHome()
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cl, err := home.Client(exe)
	if err != nil {
		return nil, err
	}
	var connArgs []string
	if c.home != "" || os.Getenv("SPILLWAY_HOME") != "" {
		connArgs = []string{"--home", home.Dir}
	}
	return &session{client: cl, cfg: home.Config, home: home, connArgs: connArgs}, nil
}

// openHome opens the one-machine home: --home, else the default.
func (c *connection) openHome() (*embedded.Home, error) {
	dir := c.home
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
	if _, err := os.Stat(filepath.Join(dir, embedded.ConfigName)); c.lookOnly && errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no Spillway home at %s: nothing has run there yet (spillway run creates one); name another with --home DIR or SPILLWAY_HOME, or a system install with --config", dir)
	}
	return embedded.Open(dir)
}

func absOr(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
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
		return []string{absOr(arg0)}
	}
	return []string{arg0}
}

// quietLogger logs warnings and errors to stderr (daemons log more).
func quietLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func background() context.Context { return context.Background() }
