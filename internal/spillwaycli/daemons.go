package spillwaycli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/agent"
	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/agentclient"
	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/cli"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/controller"
	"github.com/spillway-hpc/spillway/internal/embedded"
	"github.com/spillway-hpc/spillway/internal/ha"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/metrics"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/nodekey"
	"github.com/spillway-hpc/spillway/internal/privdrop"
	"github.com/spillway-hpc/spillway/internal/store/engines"
	"github.com/spillway-hpc/spillway/internal/store/etcd"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
)

const controllerUsage = `Usage: spillway controller [--config FILE]

Run the DataWarp service: it keeps the state (an SQLite database in
controller.state_dir), serves the REST API (/dw/v1/..., OpenAPI at
/dw/v1/openapi.json) on the Unix socket controller.socket and, if controller.listen is
set, on TCP, and drives every session through its lifecycle by calling the agents.

Run it once per cluster, on the slurmctld host, as root (it needs to read nothing of the
users', but agents on other hosts trust only root or the shared token). With ha.enabled and
the state in etcd, run it on two or three hosts: one leads (runs the executor, takes
writes), the others answer reads and name the leader, and one takes over within
ha.lease_ttl when the leader dies or is cut off. It stops cleanly
on SIGTERM or SIGINT; killed at any point, it resumes where it was when started again.

Logs go to stderr (journald under systemd). See docs/admin.md and docs/config.md.
`

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// daemon is what a daemon starts with (daemonStart).
type daemon struct {
	log                  *slog.Logger
	cfg                  config.Config
	from                 string // where the configuration was read
	token                string // the role's token_file's secret
	serverTLS, clientTLS *tls.Config
	stop                 func() // ends the CPU profile, if one is written
	check                bool   // --check: validate the configuration and exit
}

// daemonStart is the start the controller and the agent share: their --config flag, the
// configuration, the CPU profile (SPILLWAY_CPUPROFILE), the token file tokenFile names and
// TLS. ok false: exit with code (the message is written).
func daemonStart(role, usage string, args []string, stdout, stderr io.Writer, tokenFile func(config.Config) string) (d daemon, code int, ok bool) {
	fs := cli.NewFlags("spillway "+role, usage, stderr)
	cfgPath := fs.String("config", "", "configuration file (default $SPILLWAY_CONFIG, else "+config.DefaultPath+")")
	var check *bool
	if role == "agent" {
		check = fs.Bool("check", false, "check the configuration (and the token file and TLS files it names) as a start would, print what is wrong, and exit")
	}
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return d, code, false
	}
	d.check = check != nil && *check
	fail := func(format string, err error) (daemon, int, bool) {
		fmt.Fprintf(stderr, "spillway %s: "+format+"\n", role, err)
		return daemon{}, 78, false
	}
	d.log = slog.New(slog.NewTextHandler(stderr, nil))
	var err error
	if d.cfg, d.from, err = cli.LoadSystemConfig(*cfgPath); err != nil {
		return fail("%v", err)
	}
	if d.check {
		d.stop = func() {}
	} else if d.stop, err = startCPUProfile(os.Getenv("SPILLWAY_CPUPROFILE"), role, d.log); err != nil {
		return fail("SPILLWAY_CPUPROFILE: %v", err)
	}
	if d.token, err = apiclient.TokenFromFile(tokenFile(d.cfg)); err != nil {
		d.stop()
		return fail("%v", err)
	}
	if d.serverTLS, d.clientTLS, err = embedded.TLS(d.cfg); err != nil {
		d.stop()
		return fail("%v", err)
	}
	return d, 0, true
}

func controllerMain(args []string, stdout, stderr io.Writer) int {
	d, code, ok := daemonStart("controller", controllerUsage, args, stdout, stderr, func(c config.Config) string { return c.Controller.TokenFile })
	if !ok {
		return code
	}
	defer d.stop()
	log, cfg, from, token, serverTLS, clientTLS := d.log, d.cfg, d.from, d.token, d.serverTLS, d.clientTLS
	// What needs root comes first — the secrets (read by daemonStart) and the listeners, whose
	// sockets are made under /run —, then the controller becomes controller.user and opens
	// its state as that user.
	listeners := []string{"unix:" + cfg.Controller.Socket}
	if cfg.Controller.Listen != "" {
		if token == "" {
			fmt.Fprintln(stderr, "spillway controller: controller.listen is set but controller.token_file is not: TCP clients could not authenticate; set both")
			return 78
		}
		listeners = append(listeners, cfg.Controller.Listen)
	}
	var apiListeners []net.Listener
	for _, addr := range listeners {
		l, err := httpapi.Listen(addr, serverTLS)
		if err != nil {
			fmt.Fprintf(stderr, "spillway controller: listen %s: %v\n", addr, err)
			return 1
		}
		apiListeners = append(apiListeners, l)
	}
	var metricsListener net.Listener
	if cfg.Controller.MetricsListen != "" {
		l, err := metrics.Listen(cfg.Controller.MetricsListen, serverTLS)
		if err != nil {
			fmt.Fprintf(stderr, "spillway controller: metrics_listen %s: %v\n", cfg.Controller.MetricsListen, err)
			return 1
		}
		metricsListener = l
	}
	if err := becomeControllerUser(cfg); err != nil {
		fmt.Fprintf(stderr, "spillway controller: %v\n", err)
		return 1
	}
	st, err := engines.OpenState(context.Background(), &cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "spillway controller: %v\n", err)
		return 1
	}
	defer st.Close()
	dial := func(n *model.Node) (agentapi.Agent, error) {
		// Each agent is called with its own credential, which it can check without the
		// cluster's secret (package nodekey).
		return agentclient.New(n.Name, n.Address, apiclient.Options{Token: nodeCredential(token, n.Name), ConnectRetries: 1, RequestTimeout: cfg.Executor.AgentTimeout.D(), TLS: clientTLS})
	}
	ctl, err := controller.New(cfg, st, dial, log)
	if err != nil {
		fmt.Fprintf(stderr, "spillway controller: %v\n", err)
		return 1
	}
	ctx, stop := signalContext()
	defer stop()
	ctl.SetSecret(token)
	srv := controller.NewServer(ctl, token, cfg.Controller.WLMUsers, log)
	srv.Version = cli.Version
	var el *ha.Elector
	if cfg.HA.Enabled {
		if cfg.Controller.Listen == "" {
			fmt.Fprintln(stderr, "spillway controller: ha.enabled needs controller.listen: the other hosts' clients and agents reach this controller over TCP")
			return 78
		}
		eng, ok := st.Engine().(*etcd.Engine)
		if !ok { // config.Validate refuses ha.enabled on another engine
			fmt.Fprintln(stderr, "spillway controller: ha.enabled needs store.engine = \"etcd\"")
			return 78
		}
		el, err = ha.New(eng, ha.Options{Advertise: cfg.HA.Advertise, LeaseTTL: cfg.HA.LeaseTTL.D(), RetryWait: cfg.HA.RetryWait.D(),
			RequestTimeout: cfg.Store.EtcdRequestTimeout.D(), Log: log})
		if err != nil {
			fmt.Fprintf(stderr, "spillway controller: %v\n", err)
			return 78
		}
		srv.SetLeadership(el)
		ctl.Registry().MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "spillway", Subsystem: "controller", Name: "leader",
				Help: "1 while this controller leads (ha.enabled): it runs the executor and takes writes"},
				func() float64 {
					if el.Leading() {
						return 1
					}
					return 0
				}),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "spillway", Subsystem: "controller", Name: "leader_terms_total",
				Help: "times this controller was elected leader since it started"},
				func() float64 { return float64(el.Terms()) }))
	}
	var wg sync.WaitGroup
	for _, l := range apiListeners {
		wg.Add(1)
		go func() { defer wg.Done(); srv.Serve(ctx, l, embedded.APILimits(cfg, log)) }()
	}
	if metricsListener != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			metrics.Serve(ctx, metricsListener, ctl.Registry(), embedded.APILimits(cfg, log))
		}()
	}
	log.Info("controller started", "config", from, "state", engines.Describe(&cfg), "listen", listeners, "metrics_listen", cfg.Controller.MetricsListen,
		"mount_root", cfg.Controller.MountRoot, "ha", cfg.HA.Enabled, "uid", os.Getuid())
	if el != nil {
		// One of several: the executor runs only while this controller leads; a deposed
		// leader steps down (its writes fenced, its executor stopped) and campaigns again.
		wg.Add(1)
		go func() { defer wg.Done(); followChanges(ctx, el, ctl, cfg.Executor.Tick.D()) }()
		el.Run(ctx, func(lctx context.Context) { ctl.Lead(lctx) })
	} else {
		ctl.Run(ctx)
	}
	wg.Wait()
	log.Info("controller stopped")
	return 0
}

// followChanges wakes a follower's waiting requests every tick: the leader changes the state
// and nothing tells this process.
func followChanges(ctx context.Context, el *ha.Elector, ctl *controller.Controller, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if !el.Leading() {
				ctl.StateChangedElsewhere()
			}
		}
	}
}

const agentUsage = `Usage: spillway agent [--config FILE] [--check]

Run the daemon of a storage node and/or compute node.

Storage role (agent.pool set): offers agent.capacity bytes of agent.ssd_path to the pool
(by default half the free space at first start, then fixed), keeps each fragment as a
directory there, and runs stages as the job's user.
Client role (always): mounts instances at their mount paths (FUSE) when a job starts and
unmounts them when it ends — a namespace on this host directly, one on another host over
the network (warpfs), from that host's agent.data_listen.

It reports to the controller (agent.controller) every agent.heartbeat_interval and serves
the controller's calls on agent.listen (a Unix socket, or host:port with
agent.token_file). A storage node with agent.data_listen serves its namespaces to the
compute nodes' agents there (TCP, authenticated with agent.token_file). Run it as root: it changes ownership of namespace roots, runs stage
workers as the job's users, and mounts with allow_other. See docs/admin.md.

--check reads the configuration, the token file and the TLS files as a start would, prints
the address the controller will call the agent at, or what is wrong, and exits: 0 when the
agent would start cleanly, 1 when it would start with warnings (printed; e.g. agent.data_listen
on a compute-only node, which is then ignored), 78 when it would refuse to start.
`

func agentMain(args []string, stdout, stderr io.Writer) int {
	d, code, ok := daemonStart("agent", agentUsage, args, stdout, stderr, func(c config.Config) string { return c.Agent.TokenFile })
	if !ok {
		return code
	}
	defer d.stop()
	log, cfg, from, token, serverTLS, clientTLS := d.log, d.cfg, d.from, d.token, d.serverTLS, d.clientTLS
	name := cfg.Agent.Name
	if name == "" {
		name, _ = os.Hostname()
	}
	advertise, warnings, err := agentChecks(cfg, token, serverTLS)
	if err != nil {
		fmt.Fprintf(stderr, "spillway agent: %v\n", err)
		return 78
	}
	if d.check {
		for _, w := range warnings {
			fmt.Fprintf(stderr, "spillway agent: warning: %s\n", w)
		}
		role := "compute-only"
		if cfg.Agent.Pool != "" {
			role = "storage node of pool " + cfg.Agent.Pool
		}
		fmt.Fprintf(stdout, "spillway agent: %s: node %s (%s), called by the controller at %s, reporting to %s\n", from, name, role, advertise, cfg.Agent.Controller)
		if len(warnings) > 0 {
			return 1
		}
		return 0
	}
	for _, w := range warnings {
		log.Warn("configuration problem, ignored: the agent starts without it (dwstat nodes shows it)", "warning", w)
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "spillway agent: %v\n", err)
		return 1
	}
	var dataListener net.Listener
	dataAddress := cfg.Agent.DataAdvertise
	if cfg.Agent.DataListen != "" && cfg.Agent.Pool != "" {
		dataListener, err = net.Listen("tcp", cfg.Agent.DataListen)
		if err != nil {
			fmt.Fprintf(stderr, "spillway agent: data_listen %s: %v\n", cfg.Agent.DataListen, err)
			return 1
		}
		if dataAddress == "" {
			dataAddress = cfg.Agent.DataListen
		}
		if cfg.Warpfs.TLS {
			dataListener = tls.NewListener(dataListener, serverTLS)
			dataAddress = client.TLSScheme + strings.TrimPrefix(dataAddress, client.TLSScheme)
		}
	}
	ag, err := agent.New(agent.Options{
		Name: name, Pool: cfg.Agent.Pool, SSDPath: cfg.Agent.SSDPath, Capacity: uint64(cfg.Agent.Capacity), Address: advertise,
		WorkerExe: StageWorkerCommand(exe), StageLimits: embedded.StageLimits(cfg), Mount: embedded.MountLimits(cfg), Log: log,
		PFSWorkerExe: []string{exe, "pfs-worker"}, PFS: embedded.PFSOptions(cfg), PFSMaxWorkers: cfg.PFS.MaxWorkers,
		Token: token, Warpfs: embedded.WarpfsClientLimits(cfg), WarpfsServer: embedded.WarpfsServerLimits(cfg),
		RemoteReadahead: int(cfg.Warpfs.Readahead), DataTLS: clientTLS,
		FragmentFS: cfg.Agent.FragmentFilesystem, FragmentFSLimits: embedded.FragmentFSLimits(cfg),
		Endurance: embedded.EnduranceOptions(cfg), Warnings: warnings, Swap: embedded.SwapOptions(cfg),
	})
	if err != nil {
		fmt.Fprintf(stderr, "spillway agent: %v\n", err)
		return 1
	}
	defer ag.Close()
	if dataListener != nil {
		ag.SetDataAddress(dataAddress)
	}
	l, err := httpapi.Listen(cfg.Agent.Listen, serverTLS)
	if err != nil {
		fmt.Fprintf(stderr, "spillway agent: listen %s: %v\n", cfg.Agent.Listen, err)
		return 1
	}
	// The agent presents its node's own credential, never the cluster's secret: a node can
	// heartbeat for itself and nothing an administrator does.
	client, err := apiclient.New(cfg.Agent.Controller, apiclient.Options{Token: nodeCredential(token, name), ConnectRetries: 1, RequestTimeout: cfg.Controller.RequestTimeout.D(),
		ConnectTimeout: cfg.Client.ConnectTimeout.D(), UnreachableRounds: cfg.Client.UnreachableRounds, TLS: clientTLS})
	if err != nil {
		fmt.Fprintf(stderr, "spillway agent: %v\n", err)
		return 78
	}
	ctx, stop := signalContext()
	defer stop()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		agent.Serve(ctx, l, ag, nodeCredential(token, name), embedded.APILimits(cfg, log), agent.ControllerUIDs(cfg.Agent.ControllerUser)...)
	}()
	if dataListener != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ag.ServeData(ctx, dataListener); err != nil {
				log.Error("the data server stopped; remote mounts of this node's instances fail", "err", err)
			}
		}()
	}
	if cfg.Agent.MetricsListen != "" {
		ml, err := metrics.Listen(cfg.Agent.MetricsListen, serverTLS)
		if err != nil {
			fmt.Fprintf(stderr, "spillway agent: metrics_listen %s: %v\n", cfg.Agent.MetricsListen, err)
			return 1
		}
		wg.Add(1)
		go func() { defer wg.Done(); metrics.Serve(ctx, ml, ag.Metrics(), embedded.APILimits(cfg, log)) }()
	}
	log.Info("agent started", "config", from, "node", name, "pool", cfg.Agent.Pool, "ssd_path", cfg.Agent.SSDPath, "listen", cfg.Agent.Listen, "data_listen", cfg.Agent.DataListen, "metrics_listen", cfg.Agent.MetricsListen, "controller", cfg.Agent.Controller)
	ag.RunHeartbeats(ctx, cfg.Agent.HeartbeatInterval.D(), cfg.Agent.GCGrace.D(), client.Heartbeat)
	wg.Wait()
	log.Info("agent stopped")
	return 0
}

// agentChecks checks what an agent's configuration needs beyond config.Validate, as a start
// and `spillway agent --check` do: the address the controller dials (config.AgentAdvertise),
// and the data server's needs. An error refuses the start; warnings are problems the agent
// starts in spite of (it logs them and reports them in its heartbeats: dwstat nodes shows
// them).
func agentChecks(cfg config.Config, token string, serverTLS *tls.Config) (advertise string, warnings []string, err error) {
	// The controller dials what the agent advertises: a TCP listen becomes http(s)://host:port
	// (a bare host:port would be taken for a Unix socket's path); a wildcard one needs
	// agent.advertise.
	if advertise, err = cfg.AgentAdvertise(); err != nil {
		return "", nil, err
	}
	if cfg.Agent.DataListen == "" {
		return advertise, nil, nil
	}
	if cfg.Agent.Pool == "" {
		// A file shared by every node is the usual cause: the compute node works without it.
		return advertise, []string{fmt.Sprintf("agent.data_listen %q is set on a compute-only node (agent.pool is empty): it has no namespaces to serve, so it serves none; remove agent.data_listen from this node's configuration", cfg.Agent.DataListen)}, nil
	}
	if token == "" {
		return "", nil, errors.New("agent.data_listen is set but agent.token_file is not: compute nodes could not authenticate; set both")
	}
	if cfg.Warpfs.TLS && serverTLS == nil {
		return "", nil, errors.New("warpfs.tls is set but this host has no [tls] cert_file and key_file; set them, or warpfs.tls = false")
	}
	return advertise, nil, nil
}

const configUsage = `Usage: spillway config defaults

Print the configuration file with every key at its default value. Every queue, retry,
timeout and size limit has a key; docs/config.md explains each.
`

func configMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && args[0] == "defaults" {
		fmt.Fprint(stdout, config.Encode(config.Defaults()))
		return 0
	}
	if len(args) == 1 && (args[0] == "--help" || args[0] == "-h") {
		fmt.Fprint(stdout, configUsage)
		return 0
	}
	fmt.Fprint(stderr, configUsage)
	return 64
}

// nodeCredential is node's own credential, from the cluster's secret or from the node's own
// credential in token_file; "" when there is no token (single host, Unix sockets only).
func nodeCredential(token, node string) string {
	if token == "" {
		return ""
	}
	return nodekey.For(token, node)
}

const nodeKeyUsage = `Usage: spillway node-key [--config FILE] NAME

Print node NAME's own credential, derived from the cluster's secret (controller.token_file):
put it in that node's agent.token_file instead of the secret. With it the node's agent
heartbeats for NAME, is called by the controller, and mounts the namespaces the controller
grants it; it can do nothing an administrator does, and another node's credential cannot be
made from it (docs/security.md). Run it on the controller's host, as the secret's owner.

It does not make NAME a storage node: the storage its agent reports (agent.pool, capacity,
data_listen) counts once an administrator admits it, dwcli update node --name NAME --storage
(dwstat nodes shows it "unadmitted" until then).

Example:
  spillway node-key cn017 > /tmp/cn017.key   # then install it as cn017's /etc/spillway/token, 0600
  spillway node-key bb01 > /tmp/bb01.key     # a storage node: then dwcli update node --name bb01 --storage
`

func nodeKeyMain(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("spillway node-key", nodeKeyUsage, stderr)
	cfgPath := fs.String("config", "", "configuration file (default $SPILLWAY_CONFIG, else "+config.DefaultPath+")")
	if code, ok := cli.ParseInterspersed(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() != 1 || fs.Arg(0) == "" {
		fmt.Fprintf(stderr, "spillway node-key: give one node NAME (as its agent.name)\n\n%s", nodeKeyUsage)
		return 64
	}
	cfg, _, err := cli.LoadSystemConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "spillway node-key: %v\n", err)
		return 78
	}
	secret, err := apiclient.TokenFromFile(cfg.Controller.TokenFile)
	if err != nil || secret == "" {
		fmt.Fprintf(stderr, "spillway node-key: cannot read the cluster's secret from controller.token_file (%q): %v\n", cfg.Controller.TokenFile, err)
		return 78
	}
	if _, isNode := nodekey.Node(secret); isNode {
		fmt.Fprintln(stderr, "spillway node-key: controller.token_file holds a node's credential, not the cluster's secret; run this on the controller's host")
		return 78
	}
	fmt.Fprintln(stdout, nodekey.Derive(secret, fs.Arg(0)))
	return 0
}

// startCPUProfile writes a CPU profile of the process (go tool pprof) to path until the
// returned function runs (the daemon's clean stop, SIGTERM or SIGINT): opt-in, for measuring
// the data path and the controller's requests (docs/admin.md). An empty path profiles nothing.
func startCPUProfile(path, daemon string, log *slog.Logger) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	log.Info("writing a CPU profile until the "+daemon+" stops", "file", path)
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			log.Error("the CPU profile is incomplete", "file", path, "err", err)
		}
	}, nil
}

// becomeControllerUser makes a controller started as root controller.user for good, once it
// read its secrets and made its sockets: its state directory (SQLite) and its accounting log
// are given to that user first. Without controller.user, or already that user, nothing
// changes.
func becomeControllerUser(cfg config.Config) error {
	name := cfg.Controller.User
	if name == "" {
		return nil
	}
	id, err := privdrop.Lookup(name)
	if err != nil {
		return fmt.Errorf("controller.user: %v (the package makes the user spillway; or set controller.user = \"\" to run as root)", err)
	}
	if uint32(os.Geteuid()) == id.UID {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("controller.user = %q needs the controller started as root (which it leaves at once) or as %s; it runs as uid %d", name, name, os.Geteuid())
	}
	var own []string
	if cfg.Store.Engine == "" || cfg.Store.Engine == "sqlite" {
		if err := os.MkdirAll(cfg.Controller.StateDir, 0o700); err != nil {
			return fmt.Errorf("controller.state_dir: %v", err)
		}
		own = append(own, cfg.Controller.StateDir)
	}
	if log := cfg.Controller.AccountingLogPath(); filepath.Dir(log) != cfg.Controller.StateDir {
		// Made now if missing: the user may not create files where the log lives.
		if err := os.MkdirAll(filepath.Dir(log), 0o755); err != nil {
			return fmt.Errorf("controller.accounting_log: %v", err)
		}
		// Never through a link (whoever could write its directory could point it anywhere),
		// and given to the user by its descriptor.
		fd, err := unix.Open(log, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o640)
		if err != nil {
			return fmt.Errorf("controller.accounting_log %s: %v", log, err)
		}
		err = unix.Fchown(fd, int(id.UID), int(id.GID))
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("cannot give controller.accounting_log %s to controller.user %s: %v", log, name, err)
		}
	}
	for _, path := range own {
		if err := giveTo(path, id); err != nil {
			return fmt.Errorf("cannot give %s to controller.user %s: %v", path, name, err)
		}
	}
	if err := privdrop.Become(id); err != nil {
		return fmt.Errorf("cannot become controller.user %s: the controller %v", name, err)
	}
	return nil
}

// giveTo makes path, and what a directory holds, id's (no link followed). A directory that
// is id's already is left as it is: its contents were given with it.
func giveTo(path string, id privdrop.Identity) error {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return err
	}
	if st.Uid == id.UID && st.Gid == id.GID {
		return nil
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := giveTo(filepath.Join(path, e.Name()), id); err != nil {
				return err
			}
		}
	}
	// The directory last: an interrupted walk is done again at the next start.
	return unix.Lchown(path, int(id.UID), int(id.GID))
}
