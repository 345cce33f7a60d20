// Package embedded is the one-machine Spillway behind `spillway run`: the controller and an
// agent in one process (the home's server, see server.go), with the state, the pool's storage
// and the mounts under one home directory ($SPILLWAY_HOME, by default a per-user data
// directory), created on first use.
//
// It is the same controller, agent, store, lifecycle and data path as a cluster install; only
// the wiring differs (in-process calls instead of the agent's HTTP API).
package embedded

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/spillway-hpc/spillway/internal/agent"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/controller"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/stage"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/engines"
	"github.com/spillway-hpc/spillway/internal/store/sqlite"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/mount"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
)

// Home is a one-machine Spillway's directory.
type Home struct {
	Dir    string
	Config config.Config
}

// DefaultDir is $SPILLWAY_HOME, else $XDG_DATA_HOME/spillway, else ~/.local/share/spillway.
func DefaultDir() (string, error) {
	if d := os.Getenv("SPILLWAY_HOME"); d != "" {
		return filepath.Abs(d)
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "spillway"), nil
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no home directory to keep Spillway's state in: %v; give one with --home DIR or SPILLWAY_HOME=DIR", err)
	}
	return filepath.Join(h, ".local", "share", "spillway"), nil
}

// ConfigName is the home's configuration file.
const ConfigName = "spillway.toml"

// Defaults is the configuration of a new home: everything under dir, one pool on dir/ssd.
func Defaults(dir string) config.Config {
	c := config.Defaults()
	c.Controller.StateDir = filepath.Join(dir, "state")
	c.Controller.Socket = filepath.Join(dir, "controller.sock")
	c.Controller.MountRoot = filepath.Join(dir, "mounts")
	c.Controller.WLMUsers = nil
	c.Agent.SSDPath = filepath.Join(dir, "ssd")
	c.Agent.Pool = "wlm_pool"
	c.Agent.Listen = ""
	c.Agent.Controller = ""
	c.Client.Controller = "unix:" + c.Controller.Socket
	c.Client.ConnectRetries = 3
	c.Client.RetryWait = config.Duration(200 * time.Millisecond)
	c.Executor.Tick = config.Duration(200 * time.Millisecond)
	c.Stage.PollInterval = config.Duration(50 * time.Millisecond)
	c.Stage.AllowRoot = os.Geteuid() == 0
	// The home runs as its user, whose own permissions decide which directories a cache may
	// front (checked as the user at setup): no site list to keep.
	c.Cache.AllowedPFS = []string{"/"}
	return c
}

// Open opens a home, creating it (and its configuration file) on first use.
func Open(dir string) (*Home, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cannot create Spillway's home %s: %w; give a directory you can write with --home DIR or SPILLWAY_HOME=DIR", dir, err)
	}
	path := filepath.Join(dir, ConfigName)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		header := "# Spillway's one-machine configuration (spillway run). Every key and its default:\n# `spillway config defaults`; the meaning of each: docs/config.md.\n\n"
		if err := os.WriteFile(path, []byte(header+config.Encode(Defaults(dir))), 0o600); err != nil {
			return nil, fmt.Errorf("spillway home %s: %w", dir, err)
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("spillway home: %w", err)
	}
	cfg, err := config.Parse(raw, path, Defaults(dir))
	if err != nil {
		return nil, err
	}
	return &Home{Dir: dir, Config: cfg}, nil
}

func (h *Home) path(name string) string { return filepath.Join(h.Dir, name) }

// NodeName is the name the home's agent registers: agent.name, else the host name.
func (h *Home) NodeName() string {
	if h.Config.Agent.Name != "" {
		return h.Config.Agent.Name
	}
	name, _ := os.Hostname()
	return name
}

// ErrInUse is returned when another process already runs this home's controller.
var ErrInUse = errors.New("in use")

// Running is a started one-machine Spillway (inside the home's server).
type Running struct {
	Home       *Home
	Controller *controller.Controller
	Agent      *agent.Agent
	NodeName   string

	cancel context.CancelFunc
	wg     sync.WaitGroup
	store  *store.Store
	closed sync.Once
}

// start brings up the controller and the agent (the server then serves the API). workerExe
// is the argv prefix of the stage worker (the spillway binary and "stage-worker", or the
// small spillway-stage-worker), pfsWorker the PFS door worker's.
func (h *Home) start(log *slog.Logger, workerExe, pfsWorker []string) (*Running, error) {
	cfg := h.Config
	st, err := engines.OpenState(context.Background(), &cfg, log)
	if err != nil {
		if errors.Is(err, sqlite.ErrLocked) {
			return nil, fmt.Errorf("%w: %v (another server of this home runs)", ErrInUse, err)
		}
		return nil, err
	}
	cfg.Controller.RunLease = 0 // this server's own reaper cleans up after gone runs (runjob.Reap)
	ctl, err := controller.New(cfg, st, nil, log)
	if err != nil {
		st.Close()
		return nil, err
	}
	name := h.NodeName()
	ag, err := agent.New(agent.Options{
		Name: name, Pool: cfg.Agent.Pool, SSDPath: cfg.Agent.SSDPath, Capacity: uint64(cfg.Agent.Capacity),
		WorkerExe: workerExe, StageLimits: StageLimits(cfg), Mount: MountLimits(cfg), Log: log,
		PFSWorkerExe: pfsWorker, PFS: PFSOptions(cfg), PFSMaxWorkers: cfg.PFS.MaxWorkers,
		FragmentFS: cfg.Agent.FragmentFilesystem, FragmentFSLimits: FragmentFSLimits(cfg), Endurance: EnduranceOptions(cfg),
		Swap: SwapOptions(cfg),
	})
	if err != nil {
		st.Close()
		return nil, err
	}
	ctl.AddLocalAgent(name, ag)
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{Home: h, Controller: ctl, Agent: ag, NodeName: name, cancel: cancel, store: st}
	// Register the node before anything asks for capacity.
	report, _ := ag.Report(ctx)
	if _, err := ctl.Heartbeat(ctx, report); err != nil {
		r.Close()
		return nil, err
	}
	r.wg.Add(2)
	go func() { defer r.wg.Done(); ctl.Run(ctx) }()
	go func() {
		defer r.wg.Done()
		ag.RunHeartbeats(ctx, cfg.Agent.HeartbeatInterval.D(), cfg.Agent.GCGrace.D(), ctl.Heartbeat)
	}()
	return r, nil
}

func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	os.Remove(path) // we hold the state lock, so any socket here is stale
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("controller socket %s: %w", path, err)
	}
	return l, nil
}

// Metrics is what a home serves at GET /metrics on its socket: the controller's registry and
// the agent's, with the names the daemons use on their metrics_listen addresses
// (spillway_controller_..., spillway_executor_..., spillway_agent_..., the data path's
// spillway_warpfs_...), and the process's and Go runtime's metrics once (both registries hold
// them: it is one process).
func (r *Running) Metrics() prometheus.Gatherer {
	ag := r.Agent.Metrics()
	return prometheus.Gatherers{r.Controller.Registry(), prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		families, err := ag.Gather()
		kept := families[:0]
		for _, f := range families {
			if name := f.GetName(); !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
				kept = append(kept, f)
			}
		}
		return kept, err
	})}
}

// handler serves the home's API (api) and, beside it, GET /metrics (Metrics). A scrape is no
// activity: it does not keep an idle home's server running.
func (r *Running) handler(api http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.Metrics(), promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.Handle("/", api)
	return mux
}

// Close stops everything: unmounts, stops stages, closes the state.
func (r *Running) Close() {
	r.closed.Do(func() {
		r.cancel()
		r.wg.Wait()
		r.Agent.Close()
		r.store.Close()
		os.Remove(r.Home.Config.Controller.Socket)
	})
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// StageLimits maps the configuration onto the stage engine's limits.
func StageLimits(cfg config.Config) stage.Limits {
	return stage.Limits{
		Timeout:          cfg.Stage.Timeout.D(),
		StallTimeout:     cfg.Stage.StallTimeout.D(),
		CancelGrace:      cfg.Stage.CancelGrace.D(),
		ProgressInterval: cfg.Stage.ProgressInterval.D(),
		ChunkBytes:       int64(cfg.Stage.CopyChunkSize),
		BufferBytes:      int(cfg.Stage.CopyBufferSize),
		DefaultParallel:  cfg.Stage.FilesInFlight,
		MaxParallel:      cfg.Stage.MaxParallel,
		MaxEntries:       int(cfg.Stage.MaxFilesPerStage),
		MaxListBytes:     int64(cfg.Stage.MaxListSize),
		MaxLineBytes:     int(cfg.Stage.WorkerOutputLimit),
		MaxWarnings:      cfg.Stage.MaxWarnings,
		MaxStderrBytes:   int(cfg.Stage.WorkerStderrLimit),
		Nice:             cfg.Stage.WorkerNice,
		AllowRoot:        cfg.Stage.AllowRoot,

		WorkerIdleTimeout: cfg.Stage.WorkerIdleTimeout.D(),
		MaxIdleWorkers:    cfg.Stage.MaxIdleWorkers,
		WorkerMaxStages:   cfg.Stage.WorkerMaxStages,
	}
}

// PFSOptions are the bounds of a cache instance's doors to the PFS ([pfs]).
func PFSOptions(cfg config.Config) pfsio.Options {
	return pfsio.Options{MaxInFlight: cfg.PFS.MaxInFlight, RequestTimeout: cfg.PFS.RequestTimeout.D()}
}

// WarpfsClientLimits are the network client's limits of remote mounts.
func WarpfsClientLimits(cfg config.Config) client.Limits {
	w := cfg.Warpfs
	return client.Limits{ConnectTimeout: w.ConnectTimeout.D(), RequestTimeout: w.RequestTimeout.D(),
		KeepaliveInterval: w.KeepaliveInterval.D(), ReconnectWait: w.ReconnectWait.D(), MaxInFlight: w.MaxInFlight}
}

// TLS loads the [tls] section: the server side for a daemon's TCP listeners (nil: plain TCP)
// and the client side for https:// addresses (nil: the system's roots).
func TLS(cfg config.Config) (server, client *tls.Config, err error) {
	if server, err = httpapi.ServerTLS(cfg.TLS.CertFile, cfg.TLS.KeyFile); err != nil {
		return nil, nil, err
	}
	client, err = httpapi.ClientTLS(cfg.TLS.CAFile)
	return server, client, err
}

// APILimits are the limits of the controller's and the agents' HTTP APIs.
func APILimits(cfg config.Config, log *slog.Logger) httpapi.Limits {
	c := cfg.Controller
	return httpapi.Limits{RequestTimeout: c.RequestTimeout.D(), IdleTimeout: c.IdleTimeout.D(),
		MaxConnections: c.MaxConnections, MaxConnectionsPerPeer: c.MaxConnectionsPerPeer,
		MaxConnectionsPerNetwork: c.MaxConnectionsPerNetwork, ReservedConnections: c.ReservedConnections, Log: log}
}

// WarpfsServerLimits are the limits of a storage node's data server.
func WarpfsServerLimits(cfg config.Config) server.Limits {
	w := cfg.Warpfs
	return server.Limits{HandshakeTimeout: w.ConnectTimeout.D(), IdleTimeout: w.IdleTimeout.D(),
		MaxInFlight: w.MaxInFlight, MaxConnections: w.MaxConnections, MaxOpenFiles: w.MaxOpenFiles,
		MaxHandshakes: w.MaxHandshakes, MaxHandshakesPerPeer: w.MaxHandshakesPerPeer, RefusalLogInterval: w.RefusalLogInterval.D(),
		Lease: leaseOf(cfg)}
}

// leaseOf is warpfs.lease as the data path takes it: 0 (off) is negative there.
func leaseOf(cfg config.Config) time.Duration {
	if l := cfg.Warpfs.Lease.D(); l > 0 {
		return l
	}
	return -1
}

// MountLimits maps the configuration onto the FUSE client's limits.
func MountLimits(cfg config.Config) mount.Limits {
	return mount.Limits{
		ClientCacheTimeout: cfg.Mount.ClientCacheTimeout.D(),
		MaxWrite:           int(cfg.Mount.MaxWrite),
		UnmountBusyTimeout: cfg.Mount.UnmountTimeout.D(),
		WriteBehind:        writeBehind(cfg.Mount.WriteBehind),
		UnlinksBehind:      unlinksBehind(cfg.Mount.UnlinksBehind),
		CreatesBehind:      unlinksBehind(cfg.Mount.CreatesBehind),
		CreateWriteWait:    createWriteWait(cfg.Mount.CreateWriteWait.D()),
		CreateWholeMax:     createWholeMax(cfg.Mount.CreateWholeMax),
		Lease:              leaseOf(cfg),
	}
}

// FragmentFSLimits maps the configuration onto the bounds of making fragment file systems.
func FragmentFSLimits(cfg config.Config) agent.FragmentFSLimits {
	return agent.FragmentFSLimits{Mkfs: cfg.Agent.FragmentMkfsTimeout.D(), Mount: cfg.Agent.FragmentMountTimeout.D()}
}

// EnduranceOptions maps the configuration onto how a storage agent reads its SSD's wear.
func EnduranceOptions(cfg config.Config) agent.EnduranceOptions {
	return agent.EnduranceOptions{File: cfg.Agent.EnduranceFile, Interval: cfg.Agent.EnduranceInterval.D(), Timeout: cfg.Agent.EnduranceTimeout.D()}
}

// SwapOptions is [swap] as the agent takes it: its swap areas' records and remote mounts go
// under agent.ssd_path ("swap"), on a compute-only node too.
func SwapOptions(cfg config.Config) agent.SwapOptions {
	return agent.SwapOptions{DetachTimeout: cfg.Swap.DetachTimeout.D(), LockMemory: cfg.Swap.LockAgentMemory}
}

// unlinksBehind is mount.unlinks_behind (or creates_behind) as package mount takes it: 0
// (off) is negative there.
func unlinksBehind(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}

// createWholeMax is mount.create_whole_max as package mount takes it: 0 (off) is negative
// there.
func createWholeMax(s config.Size) int {
	if s == 0 {
		return -1
	}
	return int(s)
}

// createWriteWait is mount.create_write_wait as package mount takes it: 0 (none) is negative
// there.
func createWriteWait(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

// writeBehind is mount.write_behind as package mount takes it: 0 (off) is negative there.
func writeBehind(size config.Size) int {
	if size == 0 {
		return -1
	}
	return int(min(size, 1<<30))
}
