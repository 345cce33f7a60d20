package spillwaycli

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/spillway-hpc/spillway/internal/cli"
)

const homeUsage = `Usage: spillway home [--home DIR] status
       spillway home [--home DIR] stop [--force]

A one-machine home ($SPILLWAY_HOME, default ~/.local/share/spillway) keeps its controller
and storage agent in a small background server: the first command that needs it (spillway
run, dwstat, dwcli, spillway persistent) starts it, every command on the home talks to it,
and it exits by itself once nothing has moved and nobody has asked anything for
home.idle_timeout (default 1m). Its output goes to server.log in the home. It also cleans
up after spillway runs that were killed (see spillway run --help). It serves Prometheus
metrics on its socket (curl --unix-socket HOME/controller.sock http://home/metrics), with
the names the controller and agent daemons use.

  status   whether the server runs: its pid, since when, its socket and log
  stop     stop it now (to use a changed spillway.toml or a rebuilt binary at once).
           Refused while jobs have the burst buffer mounted, unless --force: stopping
           unmounts their files. Sessions and data stay; the next command starts it again.
`

func homeMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, homeUsage)
		if len(args) == 0 {
			return 64
		}
		return 0
	}
	fs := cli.NewFlags("spillway home", homeUsage, stderr)
	var homeDir string
	fs.StringVar(&homeDir, "home", "", "the home directory (default $SPILLWAY_HOME, else ~/.local/share/spillway)")
	force := fs.Bool("force", false, "stop: even while jobs have the burst buffer mounted")
	if code, ok := cli.ParseInterspersed(fs, args, stdout); !ok {
		return code
	}
	words := fs.Args()
	if len(words) != 1 {
		fmt.Fprint(stderr, homeUsage)
		return 64
	}
	home, err := openHome(homeDir, false)
	if err != nil {
		fmt.Fprintf(stderr, "spillway home: %v\n", err)
		return 1
	}
	switch words[0] {
	case "serve":
		// Started by the commands (see package embedded); its output is the home's log.
		log := slog.New(slog.NewTextHandler(stderr, nil))
		exe, err := os.Executable()
		if err != nil {
			fmt.Fprintf(stderr, "spillway home serve: %v\n", err)
			return 1
		}
		stop, err := startCPUProfile(os.Getenv("SPILLWAY_CPUPROFILE"), "home server", log)
		if err != nil {
			fmt.Fprintf(stderr, "spillway home serve: SPILLWAY_CPUPROFILE: %v\n", err)
			return 78
		}
		defer stop()
		if err := home.Serve(log, StageWorkerCommand(exe), []string{exe, "pfs-worker"}); err != nil {
			fmt.Fprintf(stderr, "spillway home serve: %v\n", err)
			return 1
		}
		return 0
	case "status":
		info := home.Server()
		if info == nil {
			fmt.Fprintf(stdout, "no server runs for home %s\n", home.Dir)
			return 0
		}
		fmt.Fprintf(stdout, "home %s: server pid %d, running since %s\n  socket %s\n  log    %s\n",
			home.Dir, info.PID, info.Started.Format("2006-01-02 15:04:05"), home.Config.Controller.Socket, home.LogPath())
		return 0
	case "stop":
		exe, _ := os.Executable()
		cl, err := home.Client(exe)
		if err != nil {
			fmt.Fprintf(stderr, "spillway home stop: %v\n", err)
			return 1
		}
		if home.Server() == nil {
			fmt.Fprintf(stdout, "no server runs for home %s\n", home.Dir)
			return 0
		}
		began := time.Now()
		stopped, err := home.Stop(*force, cl)
		if err != nil {
			fmt.Fprintf(stderr, "spillway home stop: %v\n", err)
			return 1
		}
		if stopped {
			fmt.Fprintf(stdout, "stopped the server of home %s (%.1fs)\n", home.Dir, time.Since(began).Seconds())
		} else {
			fmt.Fprintf(stdout, "no server runs for home %s\n", home.Dir)
		}
		return 0
	}
	fmt.Fprintf(stderr, "spillway home: unknown verb %q\n\n%s", words[0], homeUsage)
	return 64
}
