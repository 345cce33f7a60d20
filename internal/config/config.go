// Package config is Spillway's configuration: one TOML file in which every queue, retry,
// timeout and size limit has a name. `spillway config defaults` prints this file with every
// key and its default; docs/config.md explains each.
package config

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/spillway-hpc/spillway/internal/units"
)

// Size is a byte count written like "1GiB" or "3.5TB" in the file.
type Size uint64

// UnmarshalText reads a size with every DataWarp unit.
func (s *Size) UnmarshalText(b []byte) error {
	n, err := units.ParseSize(string(b))
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

// MarshalText writes the size exactly.
func (s Size) MarshalText() ([]byte, error) { return []byte(units.FormatExact(uint64(s))), nil }

// Duration is a time span written like "30s" or "5m" in the file.
type Duration time.Duration

// UnmarshalText reads a Go duration ("250ms", "30s", "24h").
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration; write it like 250ms, 30s, 5m or 24h", string(b))
	}
	if v < 0 {
		return fmt.Errorf("%q is negative", string(b))
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Config is the whole file.
type Config struct {
	Controller Controller `toml:"controller"`
	Store      Store      `toml:"store"`
	HA         HA         `toml:"ha"`
	Executor   Executor   `toml:"executor"`
	Stage      Stage      `toml:"stage"`
	Agent      Agent      `toml:"agent"`
	Mount      Mount      `toml:"mount"`
	Warpfs     Warpfs     `toml:"warpfs"`
	PFS        PFS        `toml:"pfs"`
	TLS        TLS        `toml:"tls"`
	Client     Client     `toml:"client"`
	Home       Home       `toml:"home"`
	Limits     Limits     `toml:"limits"`
	Cache      Cache      `toml:"cache"`
	Swap       Swap       `toml:"swap"`
	Pools      []Pool     `toml:"pool"`
}

// Cache is what the site allows and defaults for cache instances (#DW jobdw type=cache
// pfs=<dir>, issue 20): the PFS directories a cache may front, and the tunables of a job
// that names none (docs/directives.md, "Cache instances").
type Cache struct {
	// AllowedPFS are the directories (prefixes, whole path components) a cache's pfs= must be
	// at or under. A system install allows none until the administrator lists them (as
	// DataWarp's admins restrict pfs=); a one-machine home, which runs as its user, allows "/".
	AllowedPFS []string `toml:"allowed_pfs"`
	// ModifiedThreshold: a file's dirty bytes in the cache that start its write-back to the
	// PFS (#DW jobdw modified_threshold=); it also bounds what a lost storage node costs per file.
	ModifiedThreshold Size `toml:"modified_threshold"`
	// ReadAhead: how far ahead of a sequential reader the cache fetches from the PFS
	// (#DW jobdw read_ahead=); 0 turns read-ahead off.
	ReadAhead Size `toml:"read_ahead"`
	// SyncOnClose: close() writes the file's dirty data back to the PFS (#DW jobdw sync_on_close=).
	SyncOnClose bool `toml:"sync_on_close"`
	// SyncToPFS: fsync() and sync() return once the data is on the PFS (#DW jobdw sync_to_pfs=).
	SyncToPFS bool `toml:"sync_to_pfs"`
	// HighWatermark and LowWatermark are percentages of a cache instance's capacity: above
	// the high one (data held, or dirty data) eviction and write-back start, and they run
	// down to the low one.
	HighWatermark int `toml:"high_watermark"`
	LowWatermark  int `toml:"low_watermark"`
}

// Swap is what the site allows for swap on the burst buffer (#DW swap <size>, issue 22;
// docs/swap.md): the size a job may ask per compute node, how the areas are switched on, and
// how long taking one away may take.
type Swap struct {
	// MaxPerNode bounds #DW swap's size per compute node; 0: no bound.
	MaxPerNode Size `toml:"max_per_node"`
	// Priority is the swapon priority of a burst-buffer swap area: -1 lets the kernel give it
	// one below every area attached before it, so the node's own swap is used first.
	Priority int `toml:"priority"`
	// DetachTimeout bounds swapoff at post_run and teardown: the pages must come back into
	// memory; past it the detach is reported failed and the area stays attached.
	DetachTimeout Duration `toml:"detach_timeout"`
	// LockAgentMemory: a compute node's agent locks its memory (mlockall) once it serves a
	// swap area through its mount, so that paging out never waits for the agent's own pages.
	LockAgentMemory bool `toml:"lock_agent_memory"`
}

// Limits are the site's defaults and bounds of DataWarp's write protection (spec §5.3),
// applied to what jobs ask with #DW jobdw write_window_length=, write_window_multiplier= and
// access_mode=...(MFC=N). A job asking past a bound is refused at job_process and setup.
type Limits struct {
	// WriteWindowLength is the write window of a job that names none (DataWarp: 86400 s).
	WriteWindowLength Duration `toml:"write_window_length"`
	// WriteWindowLengthMinimum is the shortest window a job may ask for (a shorter window
	// lets it write more per hour); 0: no minimum.
	WriteWindowLengthMinimum Duration `toml:"write_window_length_minimum"`
	// WriteWindowMultiplier is the multiplier of a job that names none: each fragment takes
	// this many times its capacity of writes per window (DataWarp: 10). 0: no write window.
	WriteWindowMultiplier int64 `toml:"write_window_multiplier"`
	// WriteWindowMultiplierMaximum is the largest multiplier a job may ask for; 0: no maximum.
	WriteWindowMultiplierMaximum int64 `toml:"write_window_multiplier_maximum"`
	// FilesCreated is the MFC of a job that names none: the files a namespace may create; 0:
	// no limit.
	FilesCreated uint64 `toml:"files_created"`
	// FilesCreatedMaximum is the largest MFC a job may ask for (and then a job must not ask
	// for none, MFC=0); 0: no maximum.
	FilesCreatedMaximum uint64 `toml:"files_created_maximum"`
}

// Controller is the DataWarp service.
type Controller struct {
	StateDir string `toml:"state_dir"` // where the state database lives
	Socket   string `toml:"socket"`    // Unix socket of the API (always on)
	Listen   string `toml:"listen"`    // optional TCP address of the API, e.g. "10.0.0.1:7700"
	// TokenFile holds the shared secret that TCP clients and agents present. Required when
	// Listen is set or agents are remote.
	TokenFile   string   `toml:"token_file"`
	WLMUsers    []string `toml:"wlm_users"`    // users allowed to act on any session (the SlurmUser)
	MountRoot   string   `toml:"mount_root"`   // where job instances appear on compute nodes
	DefaultPool string   `toml:"default_pool"` // pool used when a directive names none
	// NodeTimeout is how long an agent may stay silent before its node counts as offline.
	NodeTimeout Duration `toml:"node_timeout"`
	// RequestTimeout bounds one API request (the long lifecycle steps return at once and are
	// polled, so no request needs long).
	RequestTimeout Duration `toml:"request_timeout"`
	// MaxStatusWait bounds how long a status request waits for its job to change before it
	// answers anyway (a waiting command's long poll; also at most half of request_timeout).
	MaxStatusWait Duration `toml:"max_status_wait"`
	// MaxRequestBytes bounds a request body (a job script travels in it).
	MaxRequestBytes Size `toml:"max_request_bytes"`
	// MaxSessions bounds the number of sessions (jobs + persistent instances) alive at once.
	MaxSessions int `toml:"max_sessions"`
	// IdleTimeout closes an API connection kept alive with no next request.
	IdleTimeout Duration `toml:"idle_timeout"`
	// MaxConnections bounds the API connections of all callers but root; MaxConnectionsPerPeer
	// those of one caller (a uid on the socket, an address on TCP). Agents' APIs too.
	MaxConnections        int `toml:"max_connections"`
	MaxConnectionsPerPeer int `toml:"max_connections_per_peer"`
	// MaxConnectionsPerNetwork bounds the TCP connections not yet authenticated from one
	// network (a /24, a /64); ReservedConnections of MaxConnections are only for connections
	// whose first request authenticates (httpapi.LimitListener).
	MaxConnectionsPerNetwork int `toml:"max_connections_per_network"`
	ReservedConnections      int `toml:"reserved_connections"`
	// Per-user quotas of what ordinary users set up themselves (spillway run, spillway
	// persistent, the API); the workload manager's jobs are not counted against them.
	MaxSessionsPerUser   int `toml:"max_sessions_per_user"`   // sessions (jobs and persistent instances)
	MaxPersistentPerUser int `toml:"max_persistent_per_user"` // persistent instances
	// MaxNodesPerRequest bounds the compute nodes one request names (pre_run's nodes, a
	// setup's client_nodes; repeated names count once), MaxUsesPerJob the persistent
	// instances one job uses (#DW persistentdw): checked before the write transaction.
	MaxNodesPerRequest int  `toml:"max_nodes_per_request"`
	MaxUsesPerJob      int  `toml:"max_uses_per_job"`
	MaxCapacityPerUser Size `toml:"max_capacity_per_user"` // instance capacity, all sessions; 0 = no limit
	// PrivateData shows ordinary users only their own sessions (and everything under them)
	// and the persistent instances, as Slurm's PrivateData does; off, everyone sees all.
	PrivateData bool `toml:"private_data"`
	// RunLease is how long a `spillway run` session outlives its run's last sign of life (the
	// run renews it a few times per lease); past it the controller finishes the session as
	// the run would have: unmount, stage out, release (or keep the results if the stage-out
	// fails). 0 turns it off (a one-machine home has its own cleanup of gone runs).
	RunLease Duration `toml:"run_lease"`
	// MountCapabilityLifetime is how long the capability the controller grants a compute node
	// for one mount stays valid (reconnections after it fail; a remount gets a fresh one).
	MountCapabilityLifetime Duration `toml:"mount_capability_lifetime"`
	// MungeSocket is the local munged's socket, which decodes the MUNGE credentials of users
	// on TCP. "" = munge's default (/run/munge/munge.socket.2).
	MungeSocket string `toml:"munge_socket"`
	// User is whom a controller started as root becomes, for good, once it has read its
	// secrets and made its sockets (the package makes "spillway" and sets it): its state
	// directory and accounting log are given to that user. "" = stay as started.
	User string `toml:"user"`
	// MungeFailuresPerMinute bounds the MUNGE credentials that munged refuses from one
	// network (an IPv4 /24, an IPv6 /64) in a minute; past it that network's credentials are
	// refused (429) without being decoded until the minute's budget refills.
	MungeFailuresPerMinute int `toml:"munge_failures_per_minute"`
	// MaxMungeDecodes bounds the credentials being decoded by munged at once (one connection
	// to its socket each); a request waits for a slot within request_timeout.
	MaxMungeDecodes int `toml:"max_munge_decodes"`
	// MungeConnectionLifetime bounds how long a TCP connection keeps the identity its MUNGE
	// credential proved, for later requests on it that claim it (Authorization:
	// MUNGE-connection, libdatawarp's kept connection); 0 = never kept (each request brings
	// a credential).
	MungeConnectionLifetime Duration `toml:"munge_connection_lifetime"`

	// EnduranceThreshold is the remaining SSD endurance, in percent of the rated life, below
	// which a storage node takes no new fragments (DataWarp); 0 turns it off.
	EnduranceThreshold int `toml:"endurance_threshold"`
	// AutoDrainFailures failures on one storage node within AutoDrainWindow (fragments and
	// namespaces it failed to create or delete, stages it failed to start, data-path errors
	// its agent reports) drain it automatically; 0 turns auto-drain off.
	AutoDrainFailures int      `toml:"auto_drain_failures"`
	AutoDrainWindow   Duration `toml:"auto_drain_window"`
	// PersistentExpiration is the lifetime of a persistent instance created without an
	// expiration (0: never expires); MaxPersistentExpiration the longest lifetime one may ask
	// for (0: no maximum).
	PersistentExpiration    Duration `toml:"persistent_expiration"`
	MaxPersistentExpiration Duration `toml:"max_persistent_expiration"`
	// MetricsListen is the address of the controller's Prometheus metrics (GET /metrics),
	// served without authentication; "" = none (docs/admin.md, "Metrics").
	MetricsListen string `toml:"metrics_listen"`
	// AccountingLog is the file the controller appends one JSON line to per instance at its
	// teardown (its accounting record, docs/admin.md); "" = accounting.log in StateDir.
	AccountingLog string `toml:"accounting_log"`
	// AccountingBatch is the most fragments' counters one heartbeat writes to the state (the
	// stalest first; the others at the next heartbeat), and the most counter rows one
	// transaction deletes after a record is written: a transaction's writes stay bounded
	// (etcd refuses more than store.etcd_max_txn_ops).
	AccountingBatch int `toml:"accounting_batch"`
	// DecodedCache is how many decoded stage records the controller keeps by their bytes
	// (store.Decoded): every decision on a session reads all its stages, and one whose bytes
	// did not change is copied instead of decoded again. 0 keeps none.
	DecodedCache int `toml:"decoded_cache"`
	// AccountingRefreshTimeout is how long a query of a live instance's accounting waits for
	// the storage nodes holding its fragments to report their counters now (the answer is
	// then current, not the last heartbeat's); a node that has not answered by then keeps
	// its last heartbeat's figures, and the answer says so (stale_nodes).
	AccountingRefreshTimeout Duration `toml:"accounting_refresh_timeout"`
	// AccountingRefreshLimit is the most fragments one accounting query asks their nodes
	// about (0: none; the heartbeats' figures only).
	AccountingRefreshLimit int `toml:"accounting_refresh_limit"`
}

// AccountingLogPath is where the accounting records go: controller.accounting_log, or
// accounting.log in the state directory.
func (c Controller) AccountingLogPath() string {
	if c.AccountingLog != "" {
		return c.AccountingLog
	}
	return filepath.Join(c.StateDir, "accounting.log")
}

// Store chooses and reaches the engine that keeps the controller's state.
type Store struct {
	// Engine is "sqlite" (one file under controller.state_dir, one controller) or "etcd".
	Engine string `toml:"engine"`
	// EtcdEndpoints are the etcd members' client URLs ("https://10.0.0.1:2379").
	EtcdEndpoints []string `toml:"etcd_endpoints"`
	// EtcdPrefix is put before every key, so that one etcd can hold several clusters' state.
	EtcdPrefix string `toml:"etcd_prefix"`
	// TLS to etcd: the CA that signed the members' certificates, and this client's own
	// certificate and key (etcd's --client-cert-auth). "" = none.
	EtcdCAFile   string `toml:"etcd_ca_file"`
	EtcdCertFile string `toml:"etcd_cert_file"`
	EtcdKeyFile  string `toml:"etcd_key_file"`
	// etcd's own authentication: a user and the file holding its password. "" = none.
	EtcdUsername     string `toml:"etcd_username"`
	EtcdPasswordFile string `toml:"etcd_password_file"`
	// EtcdDialTimeout bounds connecting to etcd; EtcdRequestTimeout one request to it.
	EtcdDialTimeout    Duration `toml:"etcd_dial_timeout"`
	EtcdRequestTimeout Duration `toml:"etcd_request_timeout"`
	// EtcdTxnRetries is how often an Update that lost a race with another writer is run
	// again before it fails.
	EtcdTxnRetries int `toml:"etcd_txn_retries"`
	// EtcdMaxTxnOps and EtcdMaxRequestBytes are the etcd members' --max-txn-ops and
	// --max-request-bytes: a transaction writing more is refused before it is sent, naming them.
	EtcdMaxTxnOps       int  `toml:"etcd_max_txn_ops"`
	EtcdMaxRequestBytes Size `toml:"etcd_max_request_bytes"`
	// RestoreBatch is how many keys `spillway admin restore` writes per transaction (at most
	// etcd_max_txn_ops - 2).
	RestoreBatch int `toml:"restore_batch"`
}

// HA runs several controllers on one etcd store, one of them leading (docs/admin.md, "High
// availability").
type HA struct {
	// Enabled makes this controller one of several: it campaigns for leadership and runs the
	// executor and takes writes only while it leads. Needs store.engine = "etcd".
	Enabled bool `toml:"enabled"`
	// Advertise is this controller's API address as clients and agents reach it
	// ("https://10.0.0.1:7700"); followers name the leader's in their not_leader answers.
	Advertise string `toml:"advertise"`
	// LeaseTTL is the etcd lease of the controller's session: a leader killed or cut off is
	// replaced at most this long after (whole seconds).
	LeaseTTL Duration `toml:"lease_ttl"`
	// RetryWait is the pause before campaigning again after leadership was lost or etcd failed.
	RetryWait Duration `toml:"retry_wait"`
}

// Executor drives every object to its goal.
type Executor struct {
	// MaxAttempts is how often an effect (create a fragment, mount, ...) is tried before the
	// object's fuse blows and an operator must look.
	MaxAttempts     int      `toml:"max_attempts"`
	RetryBackoff    Duration `toml:"retry_backoff"`     // first wait between attempts; doubles
	RetryBackoffMax Duration `toml:"retry_backoff_max"` // the longest wait between attempts
	MaxInFlight     int      `toml:"max_in_flight"`     // agent calls running at once
	Tick            Duration `toml:"tick"`              // how often the executor looks even if nothing woke it
	AgentTimeout    Duration `toml:"agent_timeout"`     // one call to an agent
	// YieldToRequests is how many API requests' write transactions one of the executor's
	// lets go first while it waits for its turn (SQLite takes writers one at a time): a
	// libdatawarp call waits for the transaction under way, not for the executor's queue.
	YieldToRequests int `toml:"yield_to_requests"`
	// WakeDelay gathers the executor's wake-ups by requests: the first wakes it this long
	// after it, and the requests until then are decided in one pass (a burst of in-job stage
	// calls starts its stages together, not a pass each). 0: at once.
	WakeDelay Duration `toml:"wake_delay"`
}

// Stage limits the data movers.
type Stage struct {
	MaxRunning int `toml:"max_running"` // stages running at once, all sessions
	// MaxJobConcurrency bounds the limit a job may set on its own running in-job stages
	// (dw_set_stage_concurrency, dwcli stage concurrency): a larger request is clamped to it.
	MaxJobConcurrency int      `toml:"max_job_concurrency"`
	FilesInFlight     int      `toml:"files_in_flight"` // files copied at once within one stage
	PollInterval      Duration `toml:"poll_interval"`   // the longest wait between polls of a running stage (the first ones are sooner)
	Timeout           Duration `toml:"timeout"`         // one stage, end to end
	// StallTimeout ends a stage that moves nothing (no file, no byte, nothing planned) for
	// that long: a source or destination that stopped answering (a user's stalled FUSE
	// server) must not hold the stage, and the session's instance, until Timeout.
	StallTimeout     Duration `toml:"stall_timeout"`
	MaxAttempts      int      `toml:"max_attempts"`        // restarts of a stage interrupted by an agent restart
	ProgressInterval Duration `toml:"progress_interval"`   // how often a worker reports progress
	MaxFilesPerStage int64    `toml:"max_files_per_stage"` // a directory or list larger than this is refused
	// MaxPathsPerRequest bounds the paths of one request that takes a list of stages (an
	// in-job stage request: dwcli stage, libdatawarp's lists; data_in, data_out, a setup's
	// stage-outs): a longer one is refused before the controller's write transaction.
	MaxPathsPerRequest int `toml:"max_paths_per_request"`
	// MaxJobStages bounds the in-job stage records one session may hold (one per path): every
	// request on the session reads them in the controller's write transaction.
	MaxJobStages int `toml:"max_job_stages"`
	// AllowRoot lets stages run for uid 0. Off on system installs (Slurm never runs root
	// jobs; a uid of 0 there is a bug); `spillway run` started by root turns it on.
	AllowRoot         bool `toml:"allow_root"`
	WorkerOutputLimit Size `toml:"worker_output_limit"` // longest line a stage worker may print
	// CancelGrace is how long a worker asked to stop (teardown, timeout) may take to remove
	// its partial file and exit before it is killed.
	CancelGrace       Duration `toml:"cancel_grace"`
	MaxParallel       int      `toml:"max_parallel"`        // cap on the files one stage copies at once, whatever it asks
	MaxListSize       Size     `toml:"max_list_size"`       // largest list file (type=list)
	CopyChunkSize     Size     `toml:"copy_chunk_size"`     // bytes one copy call moves before progress and cancellation are checked
	CopyBufferSize    Size     `toml:"copy_buffer_size"`    // buffer of one copy when the kernel cannot copy itself
	MaxWarnings       int      `toml:"max_warnings"`        // warnings kept per stage; later ones are counted
	WorkerStderrLimit Size     `toml:"worker_stderr_limit"` // a worker's standard error kept to explain a crash
	// WorkerNice is the nice value stage workers run at (0 to 19; 0: the agent's own): copies
	// yield the CPU to the data path and the requests sharing the node.
	WorkerNice int `toml:"worker_nice"`
	// A stage worker that ended a stage cleanly waits WorkerIdleTimeout for the next stage of
	// the same credential; at most MaxIdleWorkers wait so, and a worker exits after
	// WorkerMaxStages stages (1: a process per stage).
	WorkerIdleTimeout Duration `toml:"worker_idle_timeout"`
	MaxIdleWorkers    int      `toml:"max_idle_workers"`
	WorkerMaxStages   int      `toml:"worker_max_stages"`

	// History is how many finished stages the controller keeps after their sessions went
	// (dwstat stages, GET /dw/v1/stage_history), the newest; 0 keeps none.
	History int `toml:"history"`
}

// Agent is a storage and/or compute node daemon.
type Agent struct {
	Name       string `toml:"name"`       // node name; default the host name
	Pool       string `toml:"pool"`       // pool of this node's storage; "" = compute only
	SSDPath    string `toml:"ssd_path"`   // directory holding fragments
	Capacity   Size   `toml:"capacity"`   // bytes offered; 0 = half the free space at first start
	Listen     string `toml:"listen"`     // "unix:/path" or "host:port"
	Advertise  string `toml:"advertise"`  // address the controller uses; default Listen
	Controller string `toml:"controller"` // the controller's API address
	TokenFile  string `toml:"token_file"` // shared secret (see controller.token_file)
	// ControllerUser is the user a controller on this host runs as (the packaged unit's
	// User=spillway): its uid may call the agent on its Unix socket, as root may. "" or a
	// user this host does not know: none.
	ControllerUser    string   `toml:"controller_user"`
	HeartbeatInterval Duration `toml:"heartbeat_interval"` // how often it reports to the controller
	// GCGrace is how old a fragment or namespace the controller no longer knows must be before
	// the agent removes it (younger ones may simply be newer than the controller's answer).
	GCGrace Duration `toml:"gc_grace"`
	// DataListen is the TCP address where a storage node serves its namespaces to the
	// compute nodes' agents (warpfs); "" = only this host can mount its instances. Needs
	// TokenFile.
	DataListen string `toml:"data_listen"`
	// DataAdvertise is the address compute nodes dial, if not DataListen (e.g. when
	// DataListen is 0.0.0.0:7702).
	DataAdvertise string `toml:"data_advertise"`
	// FragmentFilesystem is what a new fragment is: "directory" (a directory on ssd_path's
	// file system) or "xfs-loop" (an XFS file system of its own, in a sparse image under
	// ssd_path on a loop device, mounted at the fragment's directory: it enforces the
	// capacity itself, so co-located mounts write at the disk's speed). Needs root, loop
	// devices and xfsprogs.
	FragmentFilesystem string `toml:"fragment_filesystem"`
	// FragmentMkfsTimeout bounds one mkfs.xfs of an "xfs-loop" fragment.
	FragmentMkfsTimeout Duration `toml:"fragment_mkfs_timeout"`
	// FragmentMountTimeout bounds one mount of an "xfs-loop" fragment's file system, and the
	// wait for a busy one to unmount before it is detached lazily.
	FragmentMountTimeout Duration `toml:"fragment_mount_timeout"`

	// EnduranceFile names a file holding the SSD's wear as a percentage used (e.g. "7"),
	// written by the site's own tooling; "" = read it with smartctl or nvme from the device
	// under ssd_path.
	EnduranceFile string `toml:"endurance_file"`
	// EnduranceInterval is how often the agent reads the wear; EnduranceTimeout bounds one
	// run of smartctl or nvme.
	EnduranceInterval Duration `toml:"endurance_interval"`
	EnduranceTimeout  Duration `toml:"endurance_timeout"`
	// MetricsListen is the address of the agent's Prometheus metrics (GET /metrics), served
	// without authentication; "" = none (docs/admin.md, "Metrics").
	MetricsListen string `toml:"metrics_listen"`
}

// TLS encrypts and authenticates the HTTP APIs on TCP (the controller's, the agents'): with
// CertFile and KeyFile, a daemon's TCP listener speaks TLS; CAFile is what clients (commands,
// agents, the controller calling agents) trust for https:// addresses (empty: the system's
// roots). Unix sockets never use it.
type TLS struct {
	CertFile string `toml:"cert_file"` // this host's certificate (PEM), for its TCP listeners
	KeyFile  string `toml:"key_file"`  // its private key (PEM)
	CAFile   string `toml:"ca_file"`   // the certificate authority clients trust (PEM)
}

// Warpfs is the network data path between compute nodes' mounts and storage nodes.
type Warpfs struct {
	ConnectTimeout    Duration `toml:"connect_timeout"`    // one connection attempt, handshake included
	RequestTimeout    Duration `toml:"request_timeout"`    // one file operation: the bound on a dead storage node
	KeepaliveInterval Duration `toml:"keepalive_interval"` // ping a quiet connection; close it if unanswered as long
	ReconnectWait     Duration `toml:"reconnect_wait"`     // pause between connection attempts
	IdleTimeout       Duration `toml:"idle_timeout"`       // storage side: drop a client silent this long
	MaxInFlight       int      `toml:"max_in_flight"`      // requests in flight on one connection
	MaxConnections    int      `toml:"max_connections"`    // storage side: authenticated connections (mounts) served at once
	MaxHandshakes     int      `toml:"max_handshakes"`     // storage side: connections not yet authenticated, all peers
	// MaxHandshakesPerPeer: storage side, connections not yet authenticated from one address.
	MaxHandshakesPerPeer int      `toml:"max_handshakes_per_peer"`
	RefusalLogInterval   Duration `toml:"refusal_log_interval"` // storage side: log a refusal at most once per interval
	MaxOpenFiles         int      `toml:"max_open_files"`       // storage side: files one connection keeps open
	Readahead            Size     `toml:"readahead"`            // how far ahead a remote mount reads sequential files
	// Lease: how long a mount may cache a name or attributes the storage node leased it (it
	// is told first of any change by another mount); 0 turns caching off.
	Lease Duration `toml:"lease"`
	// TLS makes a storage node serve its data port over TLS with its [tls] certificate (it
	// then advertises tls://host:port); compute nodes trust [tls] ca_file.
	TLS bool `toml:"tls"`
}

// PFS is how a storage node reaches the parallel file system for a cache instance: through a
// door (package pfsio), a worker process per PFS directory and user holding only the user's
// credentials.
type PFS struct {
	// MaxInFlight bounds the requests in flight to one door's worker (and in it): a request
	// past it waits for a slot within RequestTimeout.
	MaxInFlight int `toml:"max_in_flight"`
	// RequestTimeout bounds one request to the PFS: past it the caller gets ETIMEDOUT (a hung
	// PFS), while the request keeps its slot until the PFS answers.
	RequestTimeout Duration `toml:"request_timeout"`
	// MaxWorkers bounds the door workers a storage node runs at once (one per PFS directory
	// and user of its cache instances); past it a new user's first access fails EAGAIN with
	// this key's name, until an instance ends.
	MaxWorkers int `toml:"max_workers"`
}

// Mount is the compute-node side: how instances appear to jobs.
type Mount struct {
	// ClientCacheTimeout is the attribute/entry cache of a client_cache mount; without
	// client_cache nothing is cached, so every node sees every change at once.
	ClientCacheTimeout Duration `toml:"client_cache_timeout"`
	MaxWrite           Size     `toml:"max_write"`       // largest FUSE request
	UnmountTimeout     Duration `toml:"unmount_timeout"` // wait for open files before a lazy unmount
	// WriteBehind is how many bytes of a striped file's writes may be on their way to the
	// servers after write(2) returned, per open file; 0 turns it off.
	WriteBehind Size `toml:"write_behind"`
	// UnlinksBehind is how many removals of files a mount may have on their way to the
	// storage node after unlink(2) returned (in directories it made); 0 turns it off.
	UnlinksBehind int `toml:"unlinks_behind"`
	// CreatesBehind is how many creates of files a mount may have on their way to the
	// storage node after open(2) returned (in directories it made); 0 turns it off.
	CreatesBehind int `toml:"creates_behind"`
	// CreateWriteWait is how long a create that went behind waits for the new file's first
	// write before it is sent, so that the create opens the file for that write (no open,
	// no release on the metadata server); 0 sends it at once.
	CreateWriteWait Duration `toml:"create_write_wait"`
	// CreateWholeMax is the most a create behind's creator may write before the create is
	// sent, for the create to carry the whole file (a small file written and closed at once
	// is one request); 0 turns it off.
	CreateWholeMax Size `toml:"create_whole_max"`
}

// Client is how commands (dw_wlm_cli, dwstat, spillway run) reach the controller.
type Client struct {
	Controller string `toml:"controller"` // "unix:/path" or "http://host:port"
	TokenFile  string `toml:"token_file"` // for TCP controllers
	// MungeSocket is the local munged's socket; without a token, commands authenticate to a
	// TCP controller as their user with MUNGE. "" = munge's default.
	MungeSocket    string `toml:"munge_socket"`
	ConnectRetries int    `toml:"connect_retries"` // attempts while the controller restarts
	// ConnectTimeout bounds opening a connection to one TCP controller: with several
	// controllers listed, a host cut off is given up after it and the next one tried.
	ConnectTimeout Duration `toml:"connect_timeout"`
	// UnreachableRounds: with several controllers, one found unreachable is tried again only
	// every this many rounds of a request while another answers.
	UnreachableRounds int      `toml:"unreachable_rounds"`
	RetryWait         Duration `toml:"retry_wait"` // wait between them
	// PollInterval paces a command's retries while a token's previous teardown finishes
	// (waiting for a step is a long poll: the controller answers when the job changes).
	PollInterval Duration `toml:"poll_interval"`
	StepTimeout  Duration `toml:"step_timeout"` // the longest a command waits for one non-staging step
	// TeardownAttempts is how often `spillway run` asks for its session's teardown when the
	// controller refuses or cannot be reached, TeardownRetryWait apart.
	TeardownAttempts  int      `toml:"teardown_attempts"`
	TeardownRetryWait Duration `toml:"teardown_retry_wait"`
}

// Home is the one-machine server behind `spillway run`, dwstat, dwcli and `spillway
// persistent` when they use a home ($SPILLWAY_HOME) rather than a system install.
type Home struct {
	// IdleTimeout: the server exits once nothing has moved (no session being set up, staged,
	// mounted or torn down) and no command has asked anything for this long.
	IdleTimeout Duration `toml:"idle_timeout"`
	// StartTimeout bounds how long a command waits for the server it started to answer.
	StartTimeout Duration `toml:"start_timeout"`
	// StopTimeout bounds how long `spillway home stop` waits for the server to exit.
	StopTimeout Duration `toml:"stop_timeout"`
	// ReapInterval is how often the server looks for sessions of `spillway run`s that are
	// gone (killed) and cleans them up.
	ReapInterval Duration `toml:"reap_interval"`
	// LogMaxSize: the server's log (server.log in the home) is moved to server.log.1 when the
	// server starts and finds it larger than this.
	LogMaxSize Size `toml:"log_max_size"`
}

// Pool is a pool the controller creates at start if missing.
type Pool struct {
	Name        string `toml:"name"`
	Granularity Size   `toml:"granularity"`
	// StripeSize is the stripe size of the pool's striped instances: how much of a file one
	// server holds before the next server's turn. A multiple of 4 KiB; 0 means 8 MiB.
	StripeSize Size `toml:"stripe_size"`
}

// Defaults returns the configuration of a system install (root, systemd).
func Defaults() Config {
	return Config{
		Controller: Controller{
			StateDir:                 "/var/lib/spillway/controller",
			Socket:                   "/run/spillway/controller.sock",
			WLMUsers:                 []string{"slurm"},
			MountRoot:                "/var/opt/spillway/mounts/batch",
			DefaultPool:              "wlm_pool",
			NodeTimeout:              Duration(30 * time.Second),
			RequestTimeout:           Duration(30 * time.Second),
			MaxStatusWait:            Duration(10 * time.Second),
			MaxRequestBytes:          Size(4 << 20),
			MaxSessions:              100000,
			IdleTimeout:              Duration(time.Minute),
			MaxConnections:           1024,
			MaxConnectionsPerPeer:    64,
			MaxConnectionsPerNetwork: 256,
			ReservedConnections:      128,
			MungeFailuresPerMinute:   60,
			MaxMungeDecodes:          16,
			MungeConnectionLifetime:  Duration(5 * time.Minute),
			MaxSessionsPerUser:       100,
			MaxPersistentPerUser:     10,
			MaxNodesPerRequest:       100_000,
			MaxUsesPerJob:            100,
			PrivateData:              true,
			RunLease:                 Duration(2 * time.Minute),
			MountCapabilityLifetime:  Duration(7 * 24 * time.Hour),
			AccountingBatch:          64,
			DecodedCache:             50_000,
			AccountingRefreshTimeout: Duration(2 * time.Second),
			AccountingRefreshLimit:   64,
			EnduranceThreshold:       10,
			AutoDrainFailures:        5,
			AutoDrainWindow:          Duration(10 * time.Minute),
		},
		Limits: Limits{
			WriteWindowLength:     Duration(24 * time.Hour),
			WriteWindowMultiplier: 10,
		},
		Cache: Cache{
			AllowedPFS:        []string{},
			ModifiedThreshold: Size(1 << 30),
			ReadAhead:         Size(4 << 20),
			HighWatermark:     45,
			LowWatermark:      20,
		},
		Swap: Swap{
			MaxPerNode:      Size(64 << 30),
			Priority:        -1,
			DetachTimeout:   Duration(5 * time.Minute),
			LockAgentMemory: true,
		},
		Store: Store{
			Engine:              "sqlite",
			EtcdPrefix:          "/spillway/",
			EtcdDialTimeout:     Duration(5 * time.Second),
			EtcdRequestTimeout:  Duration(10 * time.Second),
			EtcdTxnRetries:      20,
			EtcdMaxTxnOps:       128,
			EtcdMaxRequestBytes: Size(1536 << 10),
			RestoreBatch:        100,
		},
		HA: HA{
			LeaseTTL:  Duration(5 * time.Second),
			RetryWait: Duration(1 * time.Second),
		},
		Executor: Executor{
			MaxAttempts:     5,
			RetryBackoff:    Duration(500 * time.Millisecond),
			RetryBackoffMax: Duration(30 * time.Second),
			MaxInFlight:     32,
			Tick:            Duration(500 * time.Millisecond),
			YieldToRequests: 16,
			WakeDelay:       Duration(20 * time.Millisecond),
			AgentTimeout:    Duration(60 * time.Second),
		},
		Stage: Stage{
			MaxRunning:         8,
			MaxJobConcurrency:  8,
			History:            1000,
			FilesInFlight:      8,
			PollInterval:       Duration(200 * time.Millisecond),
			Timeout:            Duration(24 * time.Hour),
			StallTimeout:       Duration(10 * time.Minute),
			MaxAttempts:        3,
			ProgressInterval:   Duration(250 * time.Millisecond),
			MaxFilesPerStage:   2_000_000,
			MaxPathsPerRequest: 10_000,
			MaxJobStages:       100_000,
			WorkerOutputLimit:  Size(1 << 20),
			CancelGrace:        Duration(10 * time.Second),
			MaxParallel:        64,
			MaxListSize:        Size(64 << 20),
			CopyChunkSize:      Size(64 << 20),
			CopyBufferSize:     Size(1 << 20),
			MaxWarnings:        100,
			WorkerStderrLimit:  Size(16 << 10),
			WorkerNice:         10,
			WorkerIdleTimeout:  Duration(5 * time.Second),
			MaxIdleWorkers:     8,
			WorkerMaxStages:    100,
		},
		Agent: Agent{
			SSDPath:              "/var/lib/spillway/ssd",
			Listen:               "unix:/run/spillway/agent.sock",
			Controller:           "unix:/run/spillway/controller.sock",
			ControllerUser:       "spillway",
			HeartbeatInterval:    Duration(5 * time.Second),
			GCGrace:              Duration(2 * time.Minute),
			FragmentFilesystem:   "directory",
			FragmentMkfsTimeout:  Duration(time.Minute),
			FragmentMountTimeout: Duration(30 * time.Second),
			EnduranceInterval:    Duration(10 * time.Minute),
			EnduranceTimeout:     Duration(30 * time.Second),
		},
		Mount: Mount{
			ClientCacheTimeout: Duration(1 * time.Second),
			MaxWrite:           Size(1 << 20),
			WriteBehind:        Size(16 << 20),
			UnlinksBehind:      32,
			CreatesBehind:      32,
			CreateWriteWait:    Duration(2 * time.Millisecond),
			CreateWholeMax:     Size(64 << 10),
			UnmountTimeout:     Duration(10 * time.Second),
		},
		Warpfs: Warpfs{
			ConnectTimeout:       Duration(5 * time.Second),
			RequestTimeout:       Duration(30 * time.Second),
			KeepaliveInterval:    Duration(5 * time.Second),
			ReconnectWait:        Duration(200 * time.Millisecond),
			IdleTimeout:          Duration(time.Minute),
			MaxInFlight:          64,
			MaxConnections:       1024,
			MaxHandshakes:        64,
			MaxHandshakesPerPeer: 8,
			RefusalLogInterval:   Duration(time.Minute),
			MaxOpenFiles:         16384,
			Readahead:            Size(4 << 20),
			Lease:                Duration(10 * time.Second),
		},
		PFS: PFS{
			MaxInFlight:    16,
			RequestTimeout: Duration(2 * time.Minute),
			MaxWorkers:     256,
		},
		Client: Client{
			Controller:        "unix:/run/spillway/controller.sock",
			ConnectRetries:    30,
			ConnectTimeout:    Duration(3 * time.Second),
			UnreachableRounds: 4,
			RetryWait:         Duration(1 * time.Second),
			PollInterval:      Duration(100 * time.Millisecond),
			StepTimeout:       Duration(10 * time.Minute),
			// A refused teardown is usually a controller restarting or a step still settling.
			TeardownAttempts:  3,
			TeardownRetryWait: Duration(1 * time.Second),
		},
		Home: Home{
			IdleTimeout:  Duration(1 * time.Minute),
			StartTimeout: Duration(30 * time.Second),
			StopTimeout:  Duration(30 * time.Second),
			ReapInterval: Duration(2 * time.Second),
			LogMaxSize:   Size(1 << 20),
		},
		Pools: []Pool{{Name: "wlm_pool", Granularity: Size(1 << 30)}},
	}
}

// DefaultPath is where system installs keep the file; SPILLWAY_CONFIG overrides it.
const DefaultPath = "/etc/spillway/spillway.toml"

// Load reads a file over the defaults. Unknown keys are errors (a misspelt limit must not be
// silently ignored).
func Load(path string) (Config, error) {
	cfg := Defaults()
	raw, err := os.ReadFile(path)
	if err != nil {
		return cfg, fmt.Errorf("config: %w", err)
	}
	return Parse(raw, path, cfg)
}

// Parse reads TOML text over base.
func Parse(raw []byte, name string, base Config) (Config, error) {
	cfg := base
	// [[pool]] tables replace the default pool list rather than append to it.
	var probe struct {
		Pools []Pool `toml:"pool"`
	}
	if _, err := toml.Decode(string(raw), &probe); err == nil && len(probe.Pools) > 0 {
		cfg.Pools = nil
	}
	md, err := toml.Decode(string(raw), &cfg)
	if err != nil {
		return cfg, fmt.Errorf("config %s: %w", name, err)
	}
	if undecoded := md.Undecoded(); len(undecoded) > 0 {
		var keys []string
		for _, k := range undecoded {
			keys = append(keys, k.String())
		}
		sort.Strings(keys)
		return cfg, fmt.Errorf("config %s: unknown key(s) %s; `spillway config defaults` lists every key", name, strings.Join(keys, ", "))
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("config %s: %w", name, err)
	}
	return cfg, nil
}

// Bounds of limits that cannot work outside them.
const (
	minWorkerOutput = 1 << 10 // the stage worker's shortest usable protocol line
	maxListSize     = 1 << 30
)

// Validate checks the limits make sense.
func (c *Config) Validate() error {
	var problems []string
	positive := func(name string, v int64) {
		if v <= 0 {
			problems = append(problems, fmt.Sprintf("%s must be greater than 0", name))
		}
	}
	positive("limits.write_window_length", int64(c.Limits.WriteWindowLength))
	if c.Limits.WriteWindowLength < c.Limits.WriteWindowLengthMinimum {
		problems = append(problems, fmt.Sprintf("limits.write_window_length (%s) is below limits.write_window_length_minimum (%s); raise it or lower the minimum",
			c.Limits.WriteWindowLength.D(), c.Limits.WriteWindowLengthMinimum.D()))
	}
	if c.Limits.WriteWindowMultiplier < 0 || c.Limits.WriteWindowMultiplierMaximum < 0 {
		problems = append(problems, "limits.write_window_multiplier and limits.write_window_multiplier_maximum must be 0 or more")
	}
	if m := c.Limits.WriteWindowMultiplierMaximum; m > 0 && (c.Limits.WriteWindowMultiplier > m || c.Limits.WriteWindowMultiplier == 0) {
		problems = append(problems, fmt.Sprintf("limits.write_window_multiplier (%d) must be between 1 and limits.write_window_multiplier_maximum (%d)",
			c.Limits.WriteWindowMultiplier, m))
	}
	if m := c.Limits.FilesCreatedMaximum; m > 0 && (c.Limits.FilesCreated > m || c.Limits.FilesCreated == 0) {
		problems = append(problems, fmt.Sprintf("limits.files_created (%d) must be between 1 and limits.files_created_maximum (%d)",
			c.Limits.FilesCreated, m))
	}
	if c.Cache.LowWatermark < 0 || c.Cache.LowWatermark >= c.Cache.HighWatermark || c.Cache.HighWatermark > 100 {
		problems = append(problems, fmt.Sprintf("cache.low_watermark (%d) and cache.high_watermark (%d) are percentages of a cache's capacity: 0 <= low < high <= 100 (the defaults are 20 and 45)",
			c.Cache.LowWatermark, c.Cache.HighWatermark))
	}
	positive("cache.modified_threshold", int64(c.Cache.ModifiedThreshold))
	if c.Swap.Priority < -1 || c.Swap.Priority > 32767 {
		problems = append(problems, fmt.Sprintf("swap.priority is %d; write -1 (the kernel's choice, below the node's own swap) or 0 to 32767", c.Swap.Priority))
	}
	positive("swap.detach_timeout", int64(c.Swap.DetachTimeout))
	for _, dir := range c.Cache.AllowedPFS {
		if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
			problems = append(problems, fmt.Sprintf("cache.allowed_pfs %q: give absolute directories in clean form (no .., no trailing /), e.g. \"/lustre\"", dir))
		}
	}
	positive("executor.max_attempts", int64(c.Executor.MaxAttempts))
	positive("executor.max_in_flight", int64(c.Executor.MaxInFlight))
	positive("executor.tick", int64(c.Executor.Tick))
	if c.Executor.YieldToRequests < 0 {
		problems = append(problems, "executor.yield_to_requests must be 0 (writers in turn) or more")
	}
	if c.Executor.WakeDelay < 0 || c.Executor.WakeDelay > c.Executor.Tick {
		problems = append(problems, fmt.Sprintf("executor.wake_delay (%s) must be from 0 (at once) to executor.tick (%s), e.g. \"5ms\"", c.Executor.WakeDelay.D(), c.Executor.Tick.D()))
	}
	positive("executor.retry_backoff", int64(c.Executor.RetryBackoff))
	positive("executor.agent_timeout", int64(c.Executor.AgentTimeout))
	positive("stage.max_running", int64(c.Stage.MaxRunning))
	positive("stage.max_job_concurrency", int64(c.Stage.MaxJobConcurrency))
	if c.Stage.History < 0 {
		problems = append(problems, "stage.history must be 0 (keep no finished stages) or more")
	}
	if c.Mount.UnlinksBehind < 0 {
		problems = append(problems, "mount.unlinks_behind must be 0 (every unlink waits for the storage node) or more")
	}
	if c.Mount.CreatesBehind < 0 {
		problems = append(problems, "mount.creates_behind must be 0 (every create waits for the storage node) or more")
	}
	if w := c.Mount.CreateWriteWait.D(); w < 0 || w > time.Second {
		problems = append(problems, "mount.create_write_wait must be between 0 (a create behind is sent at once) and 1s (each one waiting holds a slot of mount.creates_behind)")
	}
	if c.Mount.CreateWholeMax > 1<<20 {
		problems = append(problems, "mount.create_whole_max must be between 0 (no file is placed whole) and 1MiB (one request's data)")
	}
	positive("stage.files_in_flight", int64(c.Stage.FilesInFlight))
	positive("stage.poll_interval", int64(c.Stage.PollInterval))
	positive("stage.timeout", int64(c.Stage.Timeout))
	positive("stage.stall_timeout", int64(c.Stage.StallTimeout))
	if c.Stage.StallTimeout > 0 && c.Stage.ProgressInterval > 0 && c.Stage.StallTimeout < 10*c.Stage.ProgressInterval {
		problems = append(problems, fmt.Sprintf("stage.stall_timeout (%s) is under 10 times stage.progress_interval (%s): a stage moving steadily could be taken for stalled; raise stage.stall_timeout (the default is 10m) or lower stage.progress_interval",
			c.Stage.StallTimeout.D(), c.Stage.ProgressInterval.D()))
	}
	positive("stage.max_attempts", int64(c.Stage.MaxAttempts))
	positive("stage.max_files_per_stage", c.Stage.MaxFilesPerStage)
	positive("stage.max_paths_per_request", int64(c.Stage.MaxPathsPerRequest))
	positive("stage.max_job_stages", int64(c.Stage.MaxJobStages))
	positive("client.connect_timeout", int64(c.Client.ConnectTimeout))
	if c.Warpfs.Lease < 0 || c.Warpfs.Lease > Duration(time.Hour) {
		problems = append(problems, fmt.Sprintf("warpfs.lease %s: give a duration from 0 (no caching) to 1h; a node that stops answering holds other nodes' changes back this long", c.Warpfs.Lease.D()))
	}
	positive("client.unreachable_rounds", int64(c.Client.UnreachableRounds))
	if c.HA.Enabled {
		if c.Store.Engine != "etcd" {
			problems = append(problems, fmt.Sprintf("ha.enabled needs store.engine = \"etcd\" (it is %q): several controllers share their state in etcd, and SQLite's file belongs to one controller; "+
				"move the state to etcd first (docs/admin.md, \"Moving the state between engines\") or set ha.enabled = false", c.Store.Engine))
		}
		if c.HA.LeaseTTL < Duration(time.Second) || c.HA.LeaseTTL%Duration(time.Second) != 0 {
			problems = append(problems, fmt.Sprintf("ha.lease_ttl %s: etcd leases count whole seconds; give at least 1s", c.HA.LeaseTTL.D()))
		}
		if c.Controller.NodeTimeout < 2*c.HA.LeaseTTL {
			// A failover takes about lease_ttl, and no heartbeat lands meanwhile.
			problems = append(problems, fmt.Sprintf("controller.node_timeout %s must be at least twice ha.lease_ttl %s: no heartbeat reaches a controller while a failover runs (about lease_ttl), and every node would show offline after it",
				c.Controller.NodeTimeout.D(), c.HA.LeaseTTL.D()))
		}
		positive("ha.retry_wait", int64(c.HA.RetryWait))
	}
	positive("controller.node_timeout", int64(c.Controller.NodeTimeout))
	positive("controller.request_timeout", int64(c.Controller.RequestTimeout))
	positive("controller.max_status_wait", int64(c.Controller.MaxStatusWait))
	positive("controller.max_request_bytes", int64(c.Controller.MaxRequestBytes))
	positive("controller.munge_failures_per_minute", int64(c.Controller.MungeFailuresPerMinute))
	positive("controller.max_munge_decodes", int64(c.Controller.MaxMungeDecodes))
	if c.Controller.MungeConnectionLifetime < 0 {
		problems = append(problems, "controller.munge_connection_lifetime must be 0 (a credential per request) or more, e.g. \"5m\" (munged's credential lifetime)")
	}
	positive("controller.max_sessions", int64(c.Controller.MaxSessions))
	if p := c.Controller.AccountingLog; p != "" && !filepath.IsAbs(p) {
		problems = append(problems, fmt.Sprintf("controller.accounting_log %q must be an absolute path (or \"\" for accounting.log in controller.state_dir)", p))
	}
	positive("agent.heartbeat_interval", int64(c.Agent.HeartbeatInterval))
	positive("agent.fragment_mkfs_timeout", int64(c.Agent.FragmentMkfsTimeout))
	positive("agent.fragment_mount_timeout", int64(c.Agent.FragmentMountTimeout))
	positive("agent.endurance_interval", int64(c.Agent.EnduranceInterval))
	positive("agent.endurance_timeout", int64(c.Agent.EnduranceTimeout))
	if t := c.Controller.EnduranceThreshold; t < 0 || t > 100 {
		problems = append(problems, fmt.Sprintf("controller.endurance_threshold %d must be a percentage of remaining SSD endurance from 0 (off) to 100, e.g. 10", t))
	}
	if c.Controller.AutoDrainFailures < 0 {
		problems = append(problems, "controller.auto_drain_failures must be 0 (off) or more")
	}
	if c.Controller.AutoDrainFailures > 0 && c.Controller.AutoDrainWindow <= 0 {
		problems = append(problems, "controller.auto_drain_window must be greater than 0 when controller.auto_drain_failures is set, e.g. \"10m\"")
	}
	if m := c.Controller.MaxPersistentExpiration; m > 0 && c.Controller.PersistentExpiration > m {
		problems = append(problems, fmt.Sprintf("controller.persistent_expiration (%s) is longer than controller.max_persistent_expiration (%s); shorten it or raise the maximum",
			c.Controller.PersistentExpiration.D(), m.D()))
	}
	switch c.Agent.FragmentFilesystem {
	case "directory", "xfs-loop":
	default:
		problems = append(problems, fmt.Sprintf("agent.fragment_filesystem %q must be \"directory\" (a directory per fragment on ssd_path's file system) "+
			"or \"xfs-loop\" (an XFS file system per fragment, in an image under ssd_path on a loop device; needs root, loop devices and xfsprogs)",
			c.Agent.FragmentFilesystem))
	}
	positive("client.connect_retries", int64(c.Client.ConnectRetries))
	positive("client.poll_interval", int64(c.Client.PollInterval))
	positive("client.step_timeout", int64(c.Client.StepTimeout))
	positive("warpfs.connect_timeout", int64(c.Warpfs.ConnectTimeout))
	positive("warpfs.request_timeout", int64(c.Warpfs.RequestTimeout))
	positive("warpfs.keepalive_interval", int64(c.Warpfs.KeepaliveInterval))
	positive("warpfs.reconnect_wait", int64(c.Warpfs.ReconnectWait))
	positive("warpfs.idle_timeout", int64(c.Warpfs.IdleTimeout))
	positive("warpfs.max_in_flight", int64(c.Warpfs.MaxInFlight))
	positive("pfs.max_in_flight", int64(c.PFS.MaxInFlight))
	positive("pfs.max_workers", int64(c.PFS.MaxWorkers))
	positive("pfs.request_timeout", int64(c.PFS.RequestTimeout))
	positive("controller.idle_timeout", int64(c.Controller.IdleTimeout))
	positive("controller.max_connections", int64(c.Controller.MaxConnections))
	positive("controller.max_connections_per_peer", int64(c.Controller.MaxConnectionsPerPeer))
	positive("controller.max_connections_per_network", int64(c.Controller.MaxConnectionsPerNetwork))
	if r, m := c.Controller.ReservedConnections, c.Controller.MaxConnections; r < 0 || m > 0 && r >= m {
		problems = append(problems, fmt.Sprintf("controller.reserved_connections %d must be from 0 (no reserve) to below controller.max_connections (%d), "+
			"e.g. an eighth of it: the slots kept for callers that authenticate (a token, a node key, MUNGE)", r, m))
	}
	positive("controller.max_sessions_per_user", int64(c.Controller.MaxSessionsPerUser))
	positive("controller.mount_capability_lifetime", int64(c.Controller.MountCapabilityLifetime))
	positive("controller.max_persistent_per_user", int64(c.Controller.MaxPersistentPerUser))
	positive("controller.max_nodes_per_request", int64(c.Controller.MaxNodesPerRequest))
	positive("controller.max_uses_per_job", int64(c.Controller.MaxUsesPerJob))
	positive("warpfs.max_connections", int64(c.Warpfs.MaxConnections))
	positive("warpfs.max_handshakes", int64(c.Warpfs.MaxHandshakes))
	positive("warpfs.max_handshakes_per_peer", int64(c.Warpfs.MaxHandshakesPerPeer))
	positive("warpfs.refusal_log_interval", int64(c.Warpfs.RefusalLogInterval))
	positive("warpfs.max_open_files", int64(c.Warpfs.MaxOpenFiles))
	if c.Warpfs.KeepaliveInterval >= c.Warpfs.IdleTimeout {
		problems = append(problems, "warpfs.keepalive_interval must be shorter than warpfs.idle_timeout, or storage nodes drop idle mounts")
	}
	positive("client.teardown_attempts", int64(c.Client.TeardownAttempts))
	positive("stage.cancel_grace", int64(c.Stage.CancelGrace))
	positive("stage.max_parallel", int64(c.Stage.MaxParallel))
	positive("stage.max_list_size", int64(c.Stage.MaxListSize))
	positive("stage.copy_chunk_size", int64(c.Stage.CopyChunkSize))
	positive("stage.copy_buffer_size", int64(c.Stage.CopyBufferSize))
	positive("stage.max_warnings", int64(c.Stage.MaxWarnings))
	positive("stage.worker_stderr_limit", int64(c.Stage.WorkerStderrLimit))
	positive("stage.worker_idle_timeout", int64(c.Stage.WorkerIdleTimeout))
	positive("stage.max_idle_workers", int64(c.Stage.MaxIdleWorkers))
	positive("stage.worker_max_stages", int64(c.Stage.WorkerMaxStages))
	if c.Stage.WorkerNice < 0 || c.Stage.WorkerNice > 19 {
		problems = append(problems, fmt.Sprintf("stage.worker_nice = %d: give a nice value from 0 (stage workers run at the agent's priority) to 19 (the lowest)", c.Stage.WorkerNice))
	}
	positive("home.idle_timeout", int64(c.Home.IdleTimeout))
	positive("home.start_timeout", int64(c.Home.StartTimeout))
	positive("home.stop_timeout", int64(c.Home.StopTimeout))
	positive("home.reap_interval", int64(c.Home.ReapInterval))
	positive("home.log_max_size", int64(c.Home.LogMaxSize))
	// The stage worker's protocol lines carry a plan or a shortened message: below this a
	// worker could not report at all.
	if c.Stage.WorkerOutputLimit < minWorkerOutput {
		problems = append(problems, fmt.Sprintf("stage.worker_output_limit must be at least %s", units.FormatExact(minWorkerOutput)))
	}
	if c.Stage.FilesInFlight > c.Stage.MaxParallel && c.Stage.MaxParallel > 0 {
		problems = append(problems, fmt.Sprintf("stage.files_in_flight (%d) is above stage.max_parallel (%d); raise max_parallel or lower files_in_flight", c.Stage.FilesInFlight, c.Stage.MaxParallel))
	}
	if int64(c.Stage.MaxListSize) > maxListSize {
		problems = append(problems, fmt.Sprintf("stage.max_list_size must be at most %s (the stage worker reads the whole list into memory)", units.FormatExact(maxListSize)))
	}
	if c.Agent.HeartbeatInterval >= c.Controller.NodeTimeout {
		problems = append(problems, "agent.heartbeat_interval must be shorter than controller.node_timeout, or nodes flap offline")
	}
	if !filepath.IsAbs(c.Controller.MountRoot) {
		problems = append(problems, fmt.Sprintf("controller.mount_root %q must be an absolute path", c.Controller.MountRoot))
	}
	seen := map[string]bool{}
	for i, p := range c.Pools {
		if p.Name == "" {
			problems = append(problems, fmt.Sprintf("pool #%d has no name", i+1))
		}
		if seen[p.Name] {
			problems = append(problems, fmt.Sprintf("pool %q is declared twice", p.Name))
		}
		seen[p.Name] = true
		if p.Granularity == 0 {
			problems = append(problems, fmt.Sprintf("pool %q: granularity must be greater than 0 (e.g. \"1GiB\")", p.Name))
		}
		if s := uint64(p.StripeSize); s%4096 != 0 || s > 1<<30 {
			problems = append(problems, fmt.Sprintf("pool %q: stripe_size %d must be a multiple of 4KiB up to 1GiB (e.g. \"8MiB\"), or 0 for the default 8MiB", p.Name, s))
		}
	}
	positive("store.restore_batch", int64(c.Store.RestoreBatch))
	positive("controller.accounting_batch", int64(c.Controller.AccountingBatch))
	if c.Controller.DecodedCache < 0 {
		problems = append(problems, "controller.decoded_cache must be 0 (keep no decoded stages) or more")
	}
	if c.Controller.AccountingRefreshLimit < 0 {
		problems = append(problems, "controller.accounting_refresh_limit must be 0 (no refresh) or more")
	}
	if c.Controller.AccountingRefreshLimit > 0 && c.Controller.AccountingRefreshTimeout <= 0 {
		problems = append(problems, "controller.accounting_refresh_timeout must be greater than 0 (e.g. \"2s\") while controller.accounting_refresh_limit is not 0")
	}
	switch c.Store.Engine {
	case "sqlite":
	case "etcd":
		if len(c.Store.EtcdEndpoints) == 0 {
			problems = append(problems, `store.engine is "etcd" but store.etcd_endpoints is empty; list the etcd members' client URLs, e.g. ["https://10.0.0.1:2379"]`)
		}
		if !strings.HasPrefix(c.Store.EtcdPrefix, "/") || !strings.HasSuffix(c.Store.EtcdPrefix, "/") {
			problems = append(problems, fmt.Sprintf("store.etcd_prefix %q must begin and end with \"/\" (e.g. \"/spillway/cluster1/\")", c.Store.EtcdPrefix))
		}
		if (c.Store.EtcdCertFile == "") != (c.Store.EtcdKeyFile == "") {
			problems = append(problems, "store.etcd_cert_file and store.etcd_key_file go together: set both or neither")
		}
		if (c.Store.EtcdUsername == "") != (c.Store.EtcdPasswordFile == "") {
			problems = append(problems, "store.etcd_username and store.etcd_password_file go together: set both or neither")
		}
		positive("store.etcd_dial_timeout", int64(c.Store.EtcdDialTimeout))
		positive("store.etcd_request_timeout", int64(c.Store.EtcdRequestTimeout))
		positive("store.etcd_txn_retries", int64(c.Store.EtcdTxnRetries))
		positive("store.etcd_max_request_bytes", int64(c.Store.EtcdMaxRequestBytes))
		if c.Controller.AccountingBatch > c.Store.EtcdMaxTxnOps-8 {
			problems = append(problems, fmt.Sprintf("controller.accounting_batch (%d) must be at most store.etcd_max_txn_ops - 8 (%d): a heartbeat's transaction writes one batch of counters and the node", c.Controller.AccountingBatch, c.Store.EtcdMaxTxnOps-8))
		}
		if c.Store.RestoreBatch > c.Store.EtcdMaxTxnOps-2 {
			problems = append(problems, fmt.Sprintf("store.restore_batch (%d) must be at most store.etcd_max_txn_ops - 2 (%d): a restore transaction writes one batch and two keys of its own", c.Store.RestoreBatch, c.Store.EtcdMaxTxnOps-2))
		}
	default:
		problems = append(problems, fmt.Sprintf("store.engine %q must be \"sqlite\" (a file under controller.state_dir, one controller) or \"etcd\" (store.etcd_endpoints)", c.Store.Engine))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// Encode renders a configuration as TOML (used by `spillway config defaults` and to write the
// embedded home's file).
func Encode(c Config) string {
	var buf bytes.Buffer
	enc := toml.NewEncoder(&buf)
	enc.Indent = ""
	enc.Encode(c)
	return buf.String()
}

// AgentAdvertise is the address the controller dials to call this host's agent: agent.advertise
// when set, else agent.listen. A Unix socket (unix:/path, /path) is given as it is; a TCP
// address (host:port, tcp:host:port) becomes http://host:port, or https://host:port when this
// host serves its TCP listeners over TLS ([tls] cert_file): the controller would otherwise
// take a bare host:port for the path of a Unix socket. A wildcard listen address (0.0.0.0:7701,
// [::]:7701, :7701) names no host the controller could dial: then agent.advertise is needed,
// and the error says so.
func (c Config) AgentAdvertise() (string, error) {
	scheme := "http://"
	if c.TLS.CertFile != "" {
		scheme = "https://"
	}
	a := c.Agent
	key, addr := "agent.advertise", a.Advertise
	if addr == "" {
		key, addr = "agent.listen", a.Listen
	}
	switch {
	case addr == "":
		return "", fmt.Errorf("agent.listen is empty: give a Unix socket (unix:/run/spillway/agent.sock) or host:port with agent.token_file")
	case strings.HasPrefix(addr, "unix:") || strings.HasPrefix(addr, "/"):
		return addr, nil
	case strings.HasPrefix(addr, "http://") || strings.HasPrefix(addr, "https://"):
		if key == "agent.listen" {
			return "", fmt.Errorf("agent.listen %q: give host:port (the agent listens there; agent.advertise takes the URL, e.g. \"http://node17:7701\")", addr)
		}
		return strings.TrimRight(addr, "/"), nil
	}
	hostPort := strings.TrimPrefix(addr, "tcp:")
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil || port == "" {
		return "", fmt.Errorf("%s %q is neither a Unix socket (unix:/path) nor host:port (\"10.0.0.17:7701\")", key, addr)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		if key == "agent.listen" {
			return "", fmt.Errorf("agent.listen %q is a wildcard address the controller cannot dial: set agent.advertise to this node's address as the controller reaches it, e.g. advertise = \"%snode17:%s\"", addr, scheme, port)
		}
		return "", fmt.Errorf("agent.advertise %q is a wildcard address the controller cannot dial: give this node's address as the controller reaches it, e.g. \"%snode17:%s\"", addr, scheme, port)
	}
	return scheme + hostPort, nil
}
