// Package model holds DataWarp's object model, kept as DataWarp named it: pools, nodes,
// sessions, instances, fragments, configurations, namespaces, registrations, activations and
// stages. The types are plain data: no I/O, no behaviour beyond small derived values, so the
// pure cores (allocator, lifecycle) and the store can share them.
package model

import (
	"fmt"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
)

// ID identifies an object of one kind. IDs are positive and never reused.
type ID = int64

// Goal values of State.Goal.
const (
	GoalCreate  = "create"
	GoalDestroy = "destroy"
)

// State is DataWarp's per-object state: where the object should be (Goal) and whether it is
// there (Actualized). The executor drives every object whose goal is not actualized; this is
// what makes a controller killed at any point resume correctly.
type State struct {
	Goal          string `json:"goal"`
	Actualized    bool   `json:"actualized"`
	Transitioning bool   `json:"transitioning"`
	FuseBlown     bool   `json:"fuse_blown"`
	Mixed         bool   `json:"mixed"`
	// Attempts counts failed tries of the current goal; RetryAt is when the next may start;
	// Error is the last failure. They reset when the goal changes or is reached.
	Attempts int       `json:"attempts,omitempty"`
	RetryAt  time.Time `json:"retry_at,omitzero"`
	Error    string    `json:"error,omitempty"`
}

// Flags renders the state as dwstat's five-character column: goal (C/D), actualized (A),
// fuse blown (F), transitioning (T), mixed (M); '-' where unset. Example: "CA---", "D--T-".
func (s State) Flags() string {
	b := []byte("-----")
	switch s.Goal {
	case GoalCreate:
		b[0] = 'C'
	case GoalDestroy:
		b[0] = 'D'
	}
	if s.Actualized {
		b[1] = 'A'
	}
	if s.FuseBlown {
		b[2] = 'F'
	}
	if s.Transitioning {
		b[3] = 'T'
	}
	if s.Mixed {
		b[4] = 'M'
	}
	return string(b)
}

// Creating is the state of a new object that the executor has yet to make real.
func Creating() State { return State{Goal: GoalCreate, Transitioning: true} }

// Created is the state of an object that exists as asked.
func Created() State { return State{Goal: GoalCreate, Actualized: true} }

// Destroying is the state of an object the executor has to remove.
func Destroying() State { return State{Goal: GoalDestroy, Transitioning: true} }

// Done reports whether the object has reached its goal.
func (s State) Done() bool { return s.Actualized }

// Pool is a set of storage nodes with an allocation granularity.
type Pool struct {
	Name        string `json:"id"`
	Granularity uint64 `json:"granularity"` // bytes per grain
	// StripeSize is how a striped instance of the pool cuts its files (0: 8 MiB).
	StripeSize uint64 `json:"stripe_size,omitempty"`
}

// Node is an agent: a storage server (Pool set, Capacity > 0) or a compute node, or both.
type Node struct {
	Name     string    `json:"id"`
	Pool     string    `json:"pool,omitempty"`    // "" for compute-only nodes
	Capacity uint64    `json:"capacity"`          // bytes offered for fragments
	Address  string    `json:"address,omitempty"` // agent API: unix:/path or http://host:port; "" = in-process
	Online   bool      `json:"online"`            // heartbeat within the configured timeout
	Drain    bool      `json:"drain"`             // admin drain: takes no new fragments
	LastSeen time.Time `json:"last_seen"`         //
	Reason   string    `json:"reason,omitempty"`  // why it is offline or drained, for operators
	Written  uint64    `json:"bytes_written"`     // endurance: bytes written to fragments
	Roles    []string  `json:"roles,omitempty"`   // "storage", "client"
	Version  string    `json:"version,omitempty"` // agent software version
	Health   string    `json:"health,omitempty"`  // last health message from the agent
	// Warnings are the configuration problems the agent reported it started in spite of.
	Warnings []string `json:"warnings,omitempty"`
	Labels   []string `json:"labels,omitempty"` // reserved for placement policies

	// DataAddress is where the node serves its namespaces to other hosts' mounts
	// (host:port of warpfs); "" = only its own host can mount its instances.
	DataAddress string `json:"data_address,omitempty"`

	// Endurance is the SSD wear the agent last reported (nil: never reported). Worn says
	// the remaining endurance is below controller.endurance_threshold: the node takes no new
	// fragments (set from the report by lifecycle.NodeWorn).
	Endurance *Endurance `json:"endurance,omitempty"`
	Worn      bool       `json:"worn,omitempty"`
	// AutoDrained marks a drain the controller decided itself after repeated failures on the
	// node (Reason says which); Failures are the recent failures counted toward it, at most
	// controller.auto_drain_failures of them, none older than controller.auto_drain_window.
	AutoDrained bool          `json:"auto_drained,omitempty"`
	Failures    []NodeFailure `json:"failures,omitempty"`
	// DataErrorsSeen is the agent's count of data-path errors as last reported
	// (agentapi.NodeReport.DataErrors): the controller counts what it adds.
	DataErrorsSeen uint64 `json:"data_errors_seen,omitempty"`
	// HeldOffline: an administrator took the node out of service (dwcli update node
	// --offline): the controller treats it as offline whatever its heartbeats say.
	HeldOffline bool `json:"held_offline,omitempty"`
	// PoolAssigned: an administrator put the node in Pool (dwcli update node --pool); the
	// pool its agent reports (agent.pool) no longer changes it.
	PoolAssigned bool `json:"pool_assigned,omitempty"`
	// StorageAdmitted: the node may hold fragments. An administrator grants it (dwcli update
	// node --storage or --pool), or the node's heartbeats come with an administrator's
	// credential (the cluster's secret, root on the controller's socket, the embedded home).
	// A heartbeat sent with the node's own credential never grants it (security issue 19).
	StorageAdmitted bool `json:"storage_admitted,omitempty"`
	// StorageClaim is what the heartbeats of a node not admitted for storage claimed (pool,
	// capacity, data address) and the controller ignored, for the administrator ("" = none).
	StorageClaim string `json:"storage_claim,omitempty"`
}

// Endurance is a storage node's SSD wear.
type Endurance struct {
	Known bool `json:"known"`
	// PercentUsed is the device's estimate of its life used (NVMe percentage_used; SATA
	// 100 - the remaining-life attribute). It may pass 100.
	PercentUsed int    `json:"percent_used"`
	Source      string `json:"source,omitempty"` // how it was read: "smartctl /dev/nvme0n1", "file /path", ...
	Error       string `json:"error,omitempty"`  // why it is not known
}

// Remaining is the endurance left, in percent of the device's rated life (0 when worn out).
func (e Endurance) Remaining() int { return max(0, 100-e.PercentUsed) }

// NodeFailure is one failure counted toward a node's auto-drain.
type NodeFailure struct {
	At    time.Time `json:"at"`
	Error string    `json:"error"`
}

// Session owns storage: one job (token = job id) or one persistent instance (token = name).
type Session struct {
	ID          ID        `json:"id"`
	Token       string    `json:"token"`
	Creator     string    `json:"creator"` // SLURM, CLI, RUN (spillway run)
	Owner       uint32    `json:"owner"`   // uid
	Group       uint32    `json:"group"`   // gid
	Created     time.Time `json:"created"`
	Expiration  int64     `json:"expiration"` // epoch seconds, 0 = never
	ClientNodes []string  `json:"client_nodes"`
	Persistent  bool      `json:"persistent"`
	State       State     `json:"state"`
	Phase       string    `json:"phase"`             // lifecycle phase, see package lifecycle
	Hurry       bool      `json:"hurry"`             // teardown without waiting for stage-out
	Failure     string    `json:"failure,omitempty"` // why the last step failed
	Uses        []string  `json:"uses,omitempty"`    // persistent instances named by #DW persistentdw
	// StageConcurrency is how many of the job's in-job stages may run at once
	// (dw_set_stage_concurrency); 0: no limit of its own (the system's stage.max_running).
	StageConcurrency int `json:"stage_concurrency,omitempty"`

	// Expired marks a persistent instance past its expiration: no new job may use it, and it
	// is destroyed once no job uses it (lifecycle.Expire).
	Expired bool `json:"expired,omitempty"`
}

// IsJob reports whether the session belongs to a job (its token is the job id).
func (s *Session) IsJob() bool { return !s.Persistent }

// Instance is capacity allocated to a session in a pool.
type Instance struct {
	ID        ID        `json:"id"`
	SessionID ID        `json:"session"`
	Pool      string    `json:"pool"`
	Requested uint64    `json:"requested"` // bytes asked for
	Capacity  uint64    `json:"capacity"`  // bytes granted: grains × granularity
	Grains    uint64    `json:"grains"`
	Label     string    `json:"label"` // I<id>-0 for job instances, the name for persistent ones
	Public    bool      `json:"public"`
	Strategy  string    `json:"optimization_strategy"`
	Created   time.Time `json:"created"`
	State     State     `json:"state"`
	// WriteWindowLength (seconds) and WriteWindowMultiplier (× capacity per window) are the
	// endurance limits DataWarp exposes as instance limits.
	WriteWindowLength     int64 `json:"write_window_length"`
	WriteWindowMultiplier int64 `json:"write_window_multiplier"`
	// CacheDiscarded are the bytes of a cache instance's data a teardown with --hurry
	// discarded instead of flushing them to the PFS, CacheLost what was lost with storage
	// nodes offline at the flush: set when the flush ends, for the accounting record.
	CacheDiscarded uint64   `json:"cache_discarded,omitempty"`
	CacheLost      []string `json:"cache_lost,omitempty"`
	// Swap are a swap instance's areas' counters (the bytes the kernel paged out to and in
	// from each, per compute node), from the compute nodes' heartbeats and the final detach;
	// they outlive the areas, for the accounting record.
	Swap []agentapi.SwapUsage `json:"swap,omitempty"`
}

// Fragment is the part of an instance on one storage node.
type Fragment struct {
	ID         ID     `json:"id"`
	InstanceID ID     `json:"instance"`
	Node       string `json:"node"`
	Grains     uint64 `json:"grains"`
	Capacity   uint64 `json:"capacity"`
	State      State  `json:"state"`

	// The teardown's flush of a cache instance's fragment (lifecycle, OpFlushCache): its
	// dirty data (written by the job, not yet on the PFS) goes to the PFS, or is discarded
	// (--hurry), before the fragment is deleted. CacheFlushed: nothing is left to wait for;
	// CacheDirty and CacheFlushedBytes are the last progress its node reported; the error of
	// the last failed flush (kept until the next teardown); the bytes a --hurry dropped; and
	// CacheLost says what was lost with a node that went offline before its data was out.
	CacheFlushed      bool   `json:"cache_flushed,omitempty"`
	CacheDirty        uint64 `json:"cache_dirty,omitempty"`
	CacheFlushedBytes uint64 `json:"cache_flushed_bytes,omitempty"`
	CacheFlushError   string `json:"cache_flush_error,omitempty"`
	CacheDiscarded    uint64 `json:"cache_discarded,omitempty"`
	CacheLost         string `json:"cache_lost,omitempty"`
}

// FragmentUsage is what the data path counted on one fragment (agentapi.FragmentUsage, from
// the storage node's heartbeats), kept in the state from the fragment's first report until
// its instance's accounting record is written at teardown. It outlives the fragment: the
// fragment's node, capacity and namespaces are copied here when they are deleted.
type FragmentUsage struct {
	Fragment ID     `json:"fragment"`
	Instance ID     `json:"instance"`
	Node     string `json:"node"`
	Capacity uint64 `json:"capacity"`
	// Namespaces are the namespaces the fragment held (their metadata), copied when each
	// was deleted.
	Namespaces []Namespace `json:"namespaces,omitempty"`
	// Updated is when the counters last changed; Final that they were taken from the agent
	// right before the fragment was deleted (nothing can change them after).
	Updated  time.Time              `json:"updated,omitzero"`
	Final    bool                   `json:"final,omitempty"`
	Counters agentapi.FragmentUsage `json:"counters"`
}

// StageBytes are the bytes moved by an instance's stages that no longer exist while the
// instance does (an in-job request replaced by a newer one for its path, the stages of a job
// that used a persistent instance): carried for the instance's accounting record.
type StageBytes struct {
	Instance   ID                    `json:"instance"`
	In         uint64                `json:"in"`  // stage-ins: PFS to the instance
	Out        uint64                `json:"out"` // stage-outs: the instance to the PFS
	Namespaces []NamespaceStageBytes `json:"namespaces,omitempty"`
}

// NamespaceStageBytes is one namespace's share of StageBytes.
type NamespaceStageBytes struct {
	Namespace ID     `json:"namespace"`
	In        uint64 `json:"in"`
	Out       uint64 `json:"out"`
}

// Add counts an ended stage's bytes.
func (b *StageBytes) Add(st *Stage) {
	in, out := uint64(0), uint64(0)
	switch st.Direction {
	case StageIn:
		in = st.BytesDone
	case StageOut:
		out = st.BytesDone
	}
	b.In += in
	b.Out += out
	for i := range b.Namespaces {
		if b.Namespaces[i].Namespace == st.NamespaceID {
			b.Namespaces[i].In += in
			b.Namespaces[i].Out += out
			return
		}
	}
	b.Namespaces = append(b.Namespaces, NamespaceStageBytes{Namespace: st.NamespaceID, In: in, Out: out})
}

// CacheSettings are what a cache configuration fronts and how (#DW jobdw type=cache pfs=...
// and its tunables, the site's [cache] defaults filled in at setup).
type CacheSettings struct {
	PFS               string `json:"pfs"`                // the PFS directory cached, absolute and clean
	ModifiedThreshold uint64 `json:"modified_threshold"` // dirty bytes of a file that start its write-back
	ReadAhead         uint64 `json:"read_ahead"`         // bytes fetched ahead of a sequential reader; 0: none
	SyncOnClose       bool   `json:"sync_on_close"`      // close() writes the file back to the PFS
	SyncToPFS         bool   `json:"sync_to_pfs"`        // fsync()/sync() reach the PFS
	HighWatermark     int    `json:"high_watermark"`     // % of capacity: eviction/write-back start
	LowWatermark      int    `json:"low_watermark"`      // % of capacity: they stop
}

// Configuration types.
const (
	TypeScratch = "scratch"
	TypeCache   = "cache"
	TypeSwap    = "swap"
)

// Access modes (canonical spellings; the parser accepts DataWarp's aliases).
const (
	AccessStriped     = "striped"
	AccessPrivate     = "private"
	AccessLoadbalance = "loadbalance"
)

// Configuration is one way an instance is used.
type Configuration struct {
	ID              ID     `json:"id"`
	InstanceID      ID     `json:"instance"`
	Type            string `json:"type"`
	AccessMode      string `json:"access_mode"`
	RootPermissions uint32 `json:"root_permissions"`
	Owner           uint32 `json:"owner"`
	Group           uint32 `json:"group"`
	BackingPath     string `json:"backing_path,omitempty"` // cache: the PFS directory
	// Cache is a cache configuration's PFS directory and tunables; nil for scratch.
	Cache           *CacheSettings `json:"cache,omitempty"`
	MaxFileSize     uint64         `json:"max_file_size,omitempty"`
	MaxFilesCreated uint64         `json:"max_files_created,omitempty"` // MFC: files a namespace may create (0: no limit)
	ClientCache     bool           `json:"client_cache,omitempty"`
	// MaxMDS spreads a striped configuration's namespace over every fragment of its instance
	// (DataWarp's max_mds=yes): one namespace shard per fragment, in fragment order.
	MaxMDS bool `json:"max_mds,omitempty"`
	// SwapSize is a swap configuration's area per compute node (#DW swap <size>, bytes) and
	// SwapNodes the compute nodes its instance was reserved for at setup (issue 22).
	SwapSize  uint64 `json:"swap_size,omitempty"`
	SwapNodes int    `json:"swap_nodes,omitempty"`
	State     State  `json:"state"`
}

// Namespace is the file tree of a configuration: one for striped and loadbalance, one per
// compute node (ClientNode) for private. It lives on the fragment named by FragmentID (its
// metadata server).
type Namespace struct {
	ID              ID     `json:"id"`
	ConfigurationID ID     `json:"configuration"`
	FragmentID      ID     `json:"fragment"`
	ClientNode      string `json:"client_node,omitempty"`
	State           State  `json:"state"`
}

// Registration ties a session to a configuration it uses; while Wait is true, teardown waits
// for the session's stage-outs from that configuration.
type Registration struct {
	ID              ID    `json:"id"`
	SessionID       ID    `json:"session"`
	ConfigurationID ID    `json:"configuration"`
	Wait            bool  `json:"wait"`
	State           State `json:"state"`
}

// Activation is a configuration mounted on one compute node at a mount path.
type Activation struct {
	ID              ID     `json:"id"`
	SessionID       ID     `json:"session"`
	ConfigurationID ID     `json:"configuration"`
	NamespaceID     ID     `json:"namespace"`
	Node            string `json:"node"`
	MountPath       string `json:"mount"`
	ReadOnly        bool   `json:"read_only"`
	State           State  `json:"state"`
}

// Stage directions and types.
const (
	StageIn   = "in"
	StageOut  = "out"
	StageFile = "file"
	StageDir  = "directory"
	StageList = "list"
	// StageDeferred is a stage-out registered at setup (from the job's #DW stage_out) that
	// waits for data_out: the controller knows it from the start, so a session whose job never
	// reached data_out is never released with its results unstaged.
	StageDeferred = "deferred"
	StagePending  = "pending"
	StageRunning  = "running"
	StageComplete = "complete"
	StageFailed   = "failed"
	StageCanceled = "canceled"
)

// Stage is one stage-in or stage-out directive (or API call) of a session.
type Stage struct {
	ID              ID        `json:"id"`
	SessionID       ID        `json:"session"`
	ConfigurationID ID        `json:"configuration"`
	NamespaceID     ID        `json:"namespace"`
	Direction       string    `json:"direction"` // in | out
	Type            string    `json:"type"`      // file | directory | list
	PFSPath         string    `json:"pfs_path"`  // absolute path on the PFS
	DWPath          string    `json:"dw_path"`   // path inside the namespace, starting with /
	Line            int       `json:"line,omitempty"`
	Status          string    `json:"status"` // pending | running | complete | failed | canceled
	Attempts        int       `json:"attempts"`
	FilesTotal      int64     `json:"files_total"`
	FilesDone       int64     `json:"files_done"`
	BytesTotal      uint64    `json:"bytes_total"`
	BytesDone       uint64    `json:"bytes_done"`
	Error           string    `json:"error,omitempty"`
	Warnings        []string  `json:"warnings,omitempty"` // what the stage skipped or could not keep
	Started         time.Time `json:"started,omitzero"`
	Finished        time.Time `json:"finished,omitzero"`
	State           State     `json:"state"`
	// A stage of a striped namespace on several servers is split: every server moves the
	// stripes it holds (agentapi.StagePart, docs/staging.md). Step is the step under way
	// (agentapi.StepPrepare, StepCopy, StepFinish, StepAbort; empty for an unsplit stage),
	// Parts its runs, one per server taking part in it, and StepBytes what the steps before
	// it moved. CopyError is the failure an abort step is cleaning up after.
	Step      string      `json:"step,omitempty"`
	Parts     []StagePart `json:"parts,omitempty"`
	StepBytes uint64      `json:"step_bytes,omitempty"`
	// Moved is what each storage node moved in the steps before this one.
	Moved     map[string]uint64 `json:"moved,omitempty"`
	CopyError string            `json:"copy_error,omitempty"`
	// InJob marks a stage the job asked for while it ran (libdatawarp's dw_stage_*, dwcli
	// stage): it is found by its DW path, replaced by a newer request for that path, revoked
	// or terminated by the job (docs/libdatawarp.md). A deferred one runs at the job's end.
	InJob bool `json:"in_job,omitempty"`
	// Terminate asks for a running stage to be stopped (dw_terminate_*): the executor cancels
	// it and it ends canceled.
	Terminate bool `json:"terminate,omitempty"`
	// AtJobEnd marks an in-job stage-out deferred until the job's end that was started
	// there: its failure keeps the instance, as a failed #DW stage_out does.
	AtJobEnd bool `json:"at_job_end,omitempty"`
	// Protect makes a file stage-out remove the source's write bits while it runs, and put
	// them back at its end (DataWarp write-protects a file being staged out).
	Protect bool `json:"protect,omitempty"`
	// ProtectedMode is the mode the source of a split protected stage-out had before its
	// prepare step removed the write bits (0: none removed); the finish or abort step gives
	// it back. A stage canceled after its prepare step runs abort first for it.
	ProtectedMode uint32 `json:"protected_mode,omitempty"`
}

// StagePart is one server's run in a step of a split stage.
type StagePart struct {
	Node      string `json:"node"`
	Server    int    `json:"server"` // the node's index among the instance's stripe servers
	Status    string `json:"status"` // pending | running | complete | failed | canceled
	FilesDone int64  `json:"files_done"`
	BytesDone uint64 `json:"bytes_done"`
	Error     string `json:"error,omitempty"`
	Attempts  int    `json:"attempts,omitempty"` // restarts after its agent lost it
}

// FinishedStage is a stage kept after its session went (the stage history, bounded by
// stage.history): its final status, bytes and error, and whose it was.
type FinishedStage struct {
	Stage
	Token string `json:"token"`
	Owner uint32 `json:"owner"`
}

// Ended reports whether the stage will move no more data.
func (s *Stage) Ended() bool {
	return s.Status == StageComplete || s.Status == StageFailed || s.Status == StageCanceled
}

// InstanceLabel is DataWarp's label for a job instance.
func InstanceLabel(id ID) string { return fmt.Sprintf("I%d-0", id) }
