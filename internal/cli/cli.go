// Package cli holds DataWarp's commands (dw_wlm_cli, dwstat, dwcli) and spillway persistent:
// thin layers that parse flags, connect to the controller and print. The behaviour lives in
// the libraries. It links no daemon: both the full spillway binary (package spillwaycli, which
// adds the daemons, run, home, admin, ...) and the small dw_wlm_cli binary (cmd/dw_wlm_cli)
// run these commands, the same code in both.
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
	"github.com/spillway-hpc/spillway/internal/httpapi"
)

// Version is set at build time (-ldflags "-X .../cli.Version=...").
var Version = "0.1.0-dev"

// DataWarpCommands are the commands a binary runs when called by their name (a link named
// dwstat, ...), in the full spillway binary and the small dw_wlm_cli one alike.
var DataWarpCommands = []string{"dw_wlm_cli", "dwstat", "dwcli"}

// RunDataWarp runs the DataWarp command name (one of DataWarpCommands) with args; ok is false
// when name is none of them.
func RunDataWarp(name string, args []string) (code int, ok bool) {
	switch name {
	case "dwstat":
		return dwstatMain(args, os.Stdout, os.Stderr), true
	case "dwcli":
		return dwcliMain(args, os.Stdout, os.Stderr), true
	case "dw_wlm_cli":
		// Slurm merges stdout and stderr: everything goes to stdout.
		return dwWLMMain(args, os.Stdout, os.Stdout), true
	}
	return 0, false
}

// NewFlags makes a flag set whose -h/--help prints usage to stdout and exits 0, and whose
// errors print the usage to stderr.
func NewFlags(name, usage string, stderr io.Writer) *flag.FlagSet {
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
func Parse(fs *flag.FlagSet, args []string, stdout io.Writer) (int, bool) {
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

// ParseInterspersed is parse for commands whose arguments are names, never a program's
// arguments: options may follow them (dwstat sessions --json). "--" ends the options.
func ParseInterspersed(fs *flag.FlagSet, args []string, stdout io.Writer) (int, bool) {
	var names []string
	for {
		if code, ok := Parse(fs, args, stdout); !ok {
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

// Connection says how a command reaches a controller.
type Connection struct {
	configPath string // --config: a system install's file
	controller string // --controller: an address
	tokenFile  string // --token-file
	home       string // --home: a one-machine home
	// lookOnly: the command only reads the state (dwstat, dwcli ls): it never creates a
	// one-machine home where none is (a mistyped --home must not make one, with a pool).
	lookOnly bool
}

// Flags adds the connection's options to fs; withHome: --home too.
func (c *Connection) Flags(fs *flag.FlagSet, withHome bool) {
	fs.StringVar(&c.configPath, "config", "", "configuration file of a system install (default $SPILLWAY_CONFIG, else "+config.DefaultPath+" if it exists)")
	fs.StringVar(&c.controller, "controller", "", "controller address: unix:/path/to/socket or http://host:port, or several controllers comma-separated (overrides the configuration)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the shared secret of a TCP controller")
	if withHome {
		fs.StringVar(&c.home, "home", "", "use the one-machine Spillway in this directory (default $SPILLWAY_HOME, else ~/.local/share/spillway)")
	}
}

// SystemConfigPath returns the system configuration to use, "" for none.
func (c *Connection) SystemConfigPath(embeddedByDefault bool) string {
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

// Session is a connected command: its client, the configuration it uses, and how to reach
// the same controller again.
type Session struct {
	client *apiclient.Client
	cfg    config.Config
	// connArgs reach the same controller again (for the commands a run prints).
	connArgs []string
}

// NewSession is a session on client, for a controller that cfg configures.
func NewSession(client *apiclient.Client, cfg config.Config, connArgs []string) *Session {
	return &Session{client: client, cfg: cfg, connArgs: connArgs}
}

func (s *Session) Client() *apiclient.Client { return s.client }
func (s *Session) Config() config.Config     { return s.cfg }
func (s *Session) ConnArgs() []string        { return s.connArgs }
func (s *Session) Close()                    {}

// OneMachineHome reaches the one-machine home in dir ("" for $SPILLWAY_HOME, else the
// default) when no controller is configured; lookOnly: the command only reads, so a home that
// does not exist is an error, never made. The full binary sets it (package spillwaycli: the
// home's server is the embedded controller and agent); the small dw_wlm_cli binary sets it to
// run the full binary instead (cmd/dw_wlm_cli).
var OneMachineHome func(dir string, lookOnly bool) (*Session, error)

// HomeDir is --home ("" when not given).
func (c *Connection) HomeDir() string { return c.home }

// LookOnly reports whether the command only reads the state (see Connection.lookOnly).
func (c *Connection) LookOnly() bool { return c.lookOnly }

// Configured reports whether the command reaches a configured controller (--controller, a
// system configuration) rather than a one-machine home.
func (c *Connection) Configured(embeddedByDefault bool) bool {
	return c.controller != "" || c.SystemConfigPath(embeddedByDefault) != ""
}

// Connect reaches the controller: an explicit address, a system configuration, or the
// one-machine home's server (OneMachineHome).
func (c *Connection) Connect(embeddedByDefault bool, log *slog.Logger) (*Session, error) {
	token, err := apiclient.TokenFromFile(c.tokenFile)
	if err != nil {
		return nil, err
	}
	path := c.SystemConfigPath(embeddedByDefault)
	if c.Configured(embeddedByDefault) {
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
			connArgs = append(connArgs, "--config", AbsOr(path))
		}
		if c.controller != "" {
			connArgs = append(connArgs, "--controller", c.controller)
		}
		if c.tokenFile != "" {
			connArgs = append(connArgs, "--token-file", AbsOr(c.tokenFile))
		}
		return &Session{client: cl, cfg: cfg, connArgs: connArgs}, nil
	}
	if OneMachineHome == nil {
		return nil, errors.New("no controller is configured: give --config FILE or --controller ADDRESS")
	}
	return OneMachineHome(c.home, c.lookOnly)
}

// AbsOr is p made absolute, or p itself when it cannot be.
func AbsOr(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// QuietLogger logs warnings and errors to stderr (daemons log more).
func QuietLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func background() context.Context { return context.Background() }

// LoadSystemConfig reads the system install's configuration: path, else $SPILLWAY_CONFIG, else
// /etc/spillway/spillway.toml; the built-in defaults when that does not exist. It returns
// where the configuration came from.
func LoadSystemConfig(path string) (config.Config, string, error) {
	if path == "" {
		path = os.Getenv("SPILLWAY_CONFIG")
	}
	if path == "" {
		path = config.DefaultPath
	}
	if _, err := os.Stat(path); os.IsNotExist(err) && path == config.DefaultPath {
		return config.Defaults(), "(built-in defaults)", nil
	}
	cfg, err := config.Load(path)
	return cfg, path, err
}

// WriteFileAtomic writes data to a temporary file beside path and renames it into place.
func WriteFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(tmp.Name(), 0o644)
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		os.Remove(tmp.Name())
	}
	return werr
}
