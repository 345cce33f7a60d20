// Package agentapi is the contract between the controller and the agents: what the controller
// asks a storage or compute node to do. Every call is idempotent — asking twice for the same
// fragment, namespace, mount or stage has the effect of asking once — because the controller
// re-issues calls after it restarts.
//
// Two implementations exist: the agent itself (in-process, used by `spillway run`) and the HTTP
// client in package agentclient (a remote `spillway agent`).
package agentapi

import (
	"context"
	"strconv"
)

// FragmentSpec asks a storage node to hold part of an instance.
type FragmentSpec struct {
	ID         int64  `json:"id"`
	InstanceID int64  `json:"instance"`
	Capacity   uint64 `json:"capacity"` // bytes this fragment may hold
	// InstanceCapacity is the whole instance's capacity. A node enforces the smaller of it
	// and its own fragments' capacity: an instance on one node may use all it asked for, one
	// striped over several nodes what each node holds.
	InstanceCapacity uint64 `json:"instance_capacity"`
	// WriteLimit bytes may be written to the fragment within any WriteWindowLength seconds
	// (DataWarp's write window: the instance's write_window_multiplier × Capacity); past it
	// the fragment is read-only (EROFS) until the window cools down. 0: no window.
	WriteLimit        uint64 `json:"write_limit,omitempty"`
	WriteWindowLength int64  `json:"write_window_length,omitempty"`
	// Job is the session's token (a job id, a persistent instance's name), for the storage
	// node's log lines about the fragment.
	Job string `json:"job,omitempty"`
	// Cache is set when the fragment belongs to a cache instance (type=cache): its stripe
	// server caches the PFS files' data it holds, moving it to and from Cache.PFS as the
	// cache's user. nil for scratch.
	Cache *CacheSpec `json:"cache,omitempty"`
	// StripeIndex is the fragment's place in its cache instance's layout (Cache.Servers).
	StripeIndex int `json:"stripe_index,omitempty"`
}

// NamespaceSpec asks a storage node to create a file tree inside one of its fragments.
type NamespaceSpec struct {
	ID         int64  `json:"id"`
	FragmentID int64  `json:"fragment"`
	InstanceID int64  `json:"instance"`
	Owner      uint32 `json:"owner"` // uid of the namespace root
	Group      uint32 `json:"group"` // gid of the namespace root
	Mode       uint32 `json:"mode"`  // permission bits of the namespace root, e.g. 0o755
	// Servers and StripeSize make the namespace striped (Servers > 1): its files' data goes
	// to stripe objects on the instance's Servers fragments, StripeSize bytes at a time.
	Servers    int    `json:"servers,omitempty"`
	StripeSize uint64 `json:"stripe_size,omitempty"`
	// MaxFilesCreated is DataWarp's MFC for this namespace (a max_mds shard's share of it):
	// creates past it fail with EMFILE; 0: no limit. MaxFileSize is the MFS it reports (the
	// mount's capability enforces it).
	MaxFilesCreated uint64 `json:"max_files_created,omitempty"`
	MaxFileSize     uint64 `json:"max_file_size,omitempty"`
	// Cache is set when the namespace is a cache of a PFS directory: its names are the
	// directory's, looked up and changed there as the caller. nil for scratch.
	Cache *CacheSpec `json:"cache,omitempty"`
}

// MountSpec asks a compute node to expose a namespace at a mount path.
type MountSpec struct {
	// Stage: the agent's own mount for its stage workers (never sent): its sessions name
	// themselves StageClient(node).
	Stage        bool   `json:"-"`
	ActivationID int64  `json:"activation"`
	MountPath    string `json:"mount_path"`
	StorageNode  string `json:"storage_node"` // the node holding the namespace
	FragmentID   int64  `json:"fragment"`
	NamespaceID  int64  `json:"namespace"`
	InstanceID   int64  `json:"instance"`
	Capacity     uint64 `json:"capacity"` // the instance's capacity (shown by df, enforced)
	ReadOnly     bool   `json:"read_only"`
	Owner        uint32 `json:"owner"`                   // the session owner
	ClientCache  bool   `json:"client_cache,omitempty"`  // DataWarp's client_cache: close-to-open caching
	MaxFileSize  uint64 `json:"max_file_size,omitempty"` // DataWarp's MFS: larger files fail with EFBIG (0 = no limit)
	Label        string `json:"label"`                   // shown as the file system name in /proc/mounts

	// DataAddress is where the storage node serves its namespaces to other hosts' mounts
	// (its agent.data_listen); "" if it serves none.
	DataAddress string `json:"data_address,omitempty"`
	// Capability and CapabilityKey are the controller's grant of this mount to this compute
	// node and its session key (package nodekey): what the storage node asks for.
	Capability    string `json:"capability,omitempty"`
	CapabilityKey string `json:"capability_key,omitempty"`

	// Stripes are the servers of a striped instance's file data, one per fragment in the
	// layout's order (package warpfs/stripe); empty when the instance has one fragment and
	// its files hold their own data.
	Stripes []StripeServer `json:"stripes,omitempty"`

	// Replicas are a loadbalance instance's copies, one per storage node: this mount's own
	// (the namespace above) first, then the others, which the client falls over to when its
	// server stops answering. Empty for an instance on one node.
	Replicas []Replica `json:"replicas,omitempty"`

	// MDS are the shards of a striped namespace spread over every server of its instance
	// (max_mds=yes), in shard order (the fragments' order); the namespace above is the first.
	// Empty for a namespace on one metadata server.
	MDS []Replica `json:"mds,omitempty"`

	// Cache is set when the namespace is a cache of a PFS directory (type=cache, issue 20):
	// what the storage nodes front and how. nil for scratch. An agent without the cache's
	// data path refuses such a mount.
	Cache *CacheSpec `json:"cache,omitempty"`
}

// CacheSpec is what a cache mount fronts, and the identity its PFS accesses are made with.
type CacheSpec struct {
	PFS               string `json:"pfs"`                // the PFS directory, absolute and clean
	ModifiedThreshold uint64 `json:"modified_threshold"` // dirty bytes of a file that start its write-back
	ReadAhead         uint64 `json:"read_ahead"`         // bytes fetched ahead of a sequential reader; 0: none
	SyncOnClose       bool   `json:"sync_on_close"`      // close() writes the file back to the PFS
	SyncToPFS         bool   `json:"sync_to_pfs"`        // fsync()/sync() reach the PFS
	HighWatermark     int    `json:"high_watermark"`     // % of capacity where eviction/write-back start
	LowWatermark      int    `json:"low_watermark"`      // % of capacity where they stop
	// UID and GID are the job user's: every PFS access is made with them (and the user's
	// supplementary groups, which the storage node's PFS door resolves from UID), never as
	// root. UID equals MountSpec.Owner.
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// Servers and StripeSize are the instance's layout (every fragment, in id order, is a
	// stripe server, even one alone); a fragment's own place in it is FragmentSpec.StripeIndex.
	Servers    int    `json:"servers,omitempty"`
	StripeSize uint64 `json:"stripe_size,omitempty"`
	// Loadbalance marks a load-balanced cache (access_mode=loadbalance): read-only, every
	// fragment serving a namespace of its own (the PFS directory; the mount's replicas) and
	// the data of whole files from its own cache. Servers is then 1 and every fragment's
	// StripeIndex 0 (a one-server layout: each holds all of every file it serves), and the
	// mount order names no stripe servers.
	Loadbalance bool `json:"loadbalance,omitempty"`
}

// Replica is one copy of a loadbalance namespace, as a client reaches it.
type Replica struct {
	Node          string `json:"node"`
	FragmentID    int64  `json:"fragment"`
	NamespaceID   int64  `json:"namespace"`
	DataAddress   string `json:"data_address,omitempty"`
	Capability    string `json:"capability,omitempty"`
	CapabilityKey string `json:"capability_key,omitempty"`
}

// StripeServer is one fragment of a striped instance, as a client reaches its objects.
type StripeServer struct {
	Node          string `json:"node"`
	FragmentID    int64  `json:"fragment"`
	DataAddress   string `json:"data_address,omitempty"`
	Capability    string `json:"capability,omitempty"`
	CapabilityKey string `json:"capability_key,omitempty"`
}

// StageSpec asks the storage node holding the namespace to move data for a session, as the
// session's user. DW-side paths start with a variable such as $DW_JOB_STRIPED that Roots
// resolves to a namespace directory on this node.
type StageSpec struct {
	ID        int64             `json:"id"`
	Direction string            `json:"direction"` // in | out
	Type      string            `json:"type"`      // file | directory | list
	PFSPath   string            `json:"pfs_path"`  // absolute; for list: the list file
	DWPath    string            `json:"dw_path"`   // "$DW_JOB_STRIPED/sub/file"; empty for list
	Roots     map[string]string `json:"roots"`     // variable name -> namespace directory on this node
	// Striped are the striped namespaces among Roots, by variable: the agent stages them
	// through a mount of its own (the data is on every server of the instance), whose spec
	// this is.
	Striped map[string]MountSpec `json:"striped,omitempty"`
	// Instance is the instance whose capacity a stage-in is charged to: the one holding the
	// stage's namespace.
	Instance int64  `json:"instance"`
	UID      uint32 `json:"uid"`
	GID      uint32 `json:"gid"`
	Line     int    `json:"line,omitempty"` // directive line, for messages
	Parallel int    `json:"parallel"`       // files copied at once
	// Protect: a file stage-out removes the source's write bits while it copies and puts them
	// back at its end (DataWarp write-protects a file being staged out; SEACAS relies on it).
	Protect bool `json:"protect,omitempty"`
	// Part makes this run one step of a stage split over a striped instance's servers, each
	// server moving the stripes it holds (docs/staging.md); nil runs the whole stage.
	Part *StagePart `json:"part,omitempty"`
}

// The steps of a stage split over a striped instance's servers, in order.
const (
	// StepPrepare runs on the namespace's metadata server: directories and links, every
	// file created at its final size (mode 0600 until StepFinish), and this server's stripes.
	// A protected file stage-out (StageSpec.Protect) first removes the source's write bits
	// and reports the mode it had (StageStatus.ProtectedMode).
	StepPrepare = "prepare"
	// StepCopy runs on every other server at once: the stripes that server holds.
	StepCopy = "copy"
	// StepFinish runs on the metadata server once every server copied: the files' and
	// directories' modes and times, and the flush; a protected source gets its mode back
	// (StagePart.RestoreMode).
	StepFinish = "finish"
	// StepAbort runs on the metadata server after a copy failed, or when a stage with a
	// protected source is canceled: it removes the files StepPrepare created, so that no
	// half-written file poses as complete, and gives a protected source its mode back.
	StepAbort = "abort"
)

// StagePart is one step of a split stage (StageSpec.Part).
type StagePart struct {
	Step    string `json:"step"`
	Server  int    `json:"server"`  // this node's index among the instance's stripe servers
	Servers int    `json:"servers"` // how many servers the instance has
	// RestoreMode is the mode a protected source had before StepPrepare removed its write
	// bits (0: none was removed): StepFinish and StepAbort give it back, and the destination
	// gets it. The source keeps a mode its owner set meanwhile.
	RestoreMode uint32 `json:"restore_mode,omitempty"`
}

// Key names a stage's run on an agent: the stage's id, and the step for a split stage.
func (s StageSpec) Key() string { return StageKey(s.ID, s.Part) }

// StageKey is the agent's name for stage id's run of part (nil: the whole stage).
func StageKey(id int64, part *StagePart) string {
	if part == nil {
		return strconv.FormatInt(id, 10)
	}
	return strconv.FormatInt(id, 10) + "-" + part.Step
}

// StageStatus is what a storage node knows about a stage it was asked to run.
type StageStatus struct {
	ID         int64  `json:"id"`
	Known      bool   `json:"known"`  // false: never started here (or the agent restarted)
	Status     string `json:"status"` // running | complete | failed | canceled
	FilesTotal int64  `json:"files_total"`
	FilesDone  int64  `json:"files_done"`
	BytesTotal uint64 `json:"bytes_total"`
	BytesDone  uint64 `json:"bytes_done"`
	Error      string `json:"error,omitempty"`
	// Warnings are what the stage skipped or could not keep (special files, metadata).
	Warnings []string `json:"warnings,omitempty"`
	// ProtectedMode is the mode (permission bits) the source of a protected file stage-out
	// had before a split stage's StepPrepare removed its write bits; 0 when it removed none.
	ProtectedMode uint32 `json:"protected_mode,omitempty"`
}

// CacheFlushSpec asks a storage node to move a cache fragment's dirty data (written by the
// job, not yet on the PFS) to the cache's PFS directory before the fragment is deleted:
// teardown's flush. It is a poll: the first call starts the drain, every call (the same spec
// again) answers how far it got; asking again after Done answers Done.
type CacheFlushSpec struct {
	FragmentID int64 `json:"fragment"`
	InstanceID int64 `json:"instance"`
	// Discard drops the dirty data instead (teardown --hurry): the answer is Done at once,
	// with the bytes dropped.
	Discard bool `json:"discard,omitempty"`
}

// CacheFlushStatus is how far a fragment's flush got.
type CacheFlushStatus struct {
	// Done: nothing of the fragment is left to move (or it was discarded); a fragment
	// without a cache (never written, scratch) is Done.
	Done bool `json:"done"`
	// DirtyBytes are the bytes not yet on the PFS now; FlushedBytes those written to the PFS
	// since the fragment's cache started; DiscardedBytes those dropped by a Discard.
	DirtyBytes     uint64 `json:"dirty_bytes"`
	FlushedBytes   uint64 `json:"flushed_bytes"`
	DiscardedBytes uint64 `json:"discarded_bytes,omitempty"`
	// Error is the failure that stopped the drain ("pfs: no space left on device (ENOSPC) on
	// ..."): the data is kept; the next call starts the drain again.
	Error string `json:"error,omitempty"`
}

// SwapSpec asks a compute node to attach a swap area (#DW swap, issue 22): a file of Size
// bytes in a swap instance's namespace, reached through a loop device, made a swap area
// (mkswap) and switched on (swapon) at Priority. Attaching the same ID again does nothing.
//
// The file lives in namespace NamespaceID of fragment FragmentID on StorageNode: the swap
// instance's namespaces are root's (mode 0700), never a job's namespace, so the job does not
// see its swap files. When StorageNode is this node the agent uses the fragment's file system
// directly (the namespace directory); otherwise it mounts the namespace itself (Mount: the
// controller's grant, MountPath left empty — the agent picks a private path under its state
// directory) and reaches the file through the mount.
type SwapSpec struct {
	ID         int64  `json:"id"`       // the swap area: one per compute node of a job's swap
	InstanceID int64  `json:"instance"` // the swap instance
	Job        string `json:"job,omitempty"`
	Owner      uint32 `json:"owner"` // the job's user (logs, accounting); the file is root's
	Node       string `json:"node"`  // the compute node (this node)
	Size       uint64 `json:"size"`  // bytes of swap
	// Priority is the swapon priority; -1 leaves it to the kernel, which gives each new area
	// a priority below every area attached before it (the node's own swap is used first).
	Priority    int        `json:"priority"`
	StorageNode string     `json:"storage_node"`
	FragmentID  int64      `json:"fragment"`
	NamespaceID int64      `json:"namespace"`
	FileName    string     `json:"file_name"` // the swap file in the namespace root, e.g. "swap-17-c1"
	Mount       *MountSpec `json:"mount,omitempty"`
}

// SwapDetachSpec asks a compute node to take a swap area away: swapoff (the kernel brings
// the swapped pages back into memory), then the loop device, the file and the agent's mount
// of the namespace go. It is a poll: the first call starts it, every call answers how far it
// got; a swap area the node does not have answers Done.
type SwapDetachSpec struct {
	ID int64 `json:"id"`
	// Timeout bounds swapoff ([swap] detach_timeout); past it the detach is reported failed
	// (SwapStatus.Error) and the area stays attached: the node stays usable, its pages safe.
	Timeout int64 `json:"timeout_ms"`
}

// SwapStatus is a swap area's state on its compute node.
type SwapStatus struct {
	Attached bool   `json:"attached"`         // the area is in /proc/swaps
	Done     bool   `json:"done"`             // detached: nothing of the area is left on the node
	Device   string `json:"device,omitempty"` // the loop device, e.g. /dev/loop7
	// Error is why the last attach or detach failed ("swapoff /dev/loop7: cannot allocate
	// memory: the swapped pages do not fit in the node's memory").
	Error string `json:"error,omitempty"`
	// BytesWritten and BytesRead are what the kernel paged out to and in from the area since
	// it was attached (the loop device's counters).
	BytesWritten uint64 `json:"bytes_written"`
	BytesRead    uint64 `json:"bytes_read"`
}

// NodeReport is what an agent tells the controller about itself.
type NodeReport struct {
	Name     string   `json:"name"`
	Pool     string   `json:"pool,omitempty"`
	Capacity uint64   `json:"capacity"`
	Address  string   `json:"address"`
	Roles    []string `json:"roles"`
	Version  string   `json:"version"`
	Health   string   `json:"health"`
	Written  uint64   `json:"bytes_written"`

	// DataAddress is where a storage node serves its namespaces to other hosts (warpfs).
	DataAddress string `json:"data_address,omitempty"`

	// Usage is what the node's data path counted, per fragment (usage.go).
	Usage NodeUsage `json:"usage,omitempty"`

	// Endurance is the SSD wear of a storage node (nil: not a storage node, or not read yet).
	Endurance *Endurance `json:"endurance,omitempty"`
	// DataErrors counts the data-path errors the agent met since it started (I/O errors of
	// its SSD path); the controller counts each new one toward auto-drain. LastDataError is
	// the latest.
	DataErrors    uint64 `json:"data_errors,omitempty"`
	LastDataError string `json:"last_data_error,omitempty"`
	// Warnings are the agent's configuration problems it started in spite of (a
	// compute-only node with agent.data_listen): dwstat nodes shows them as the reason.
	Warnings []string `json:"warnings,omitempty"`
}

// Endurance is a storage node's SSD wear, as the agent read it.
type Endurance struct {
	Known bool `json:"known"`
	// PercentUsed is the device's estimate of its life used, in percent (NVMe
	// percentage_used; may pass 100).
	PercentUsed int    `json:"percent_used"`
	Source      string `json:"source,omitempty"` // "smartctl /dev/nvme0n1", "nvme /dev/nvme0", "file PATH"
	Error       string `json:"error,omitempty"`  // why it is not known: no tool, no device, a failing tool
}

// Agent is everything the controller asks of one node.
type Agent interface {
	Report(ctx context.Context) (NodeReport, error)
	// FragmentUsage is one fragment's data-path counters now (found: the node holds it), read
	// right before the fragment is deleted: its accounting record's final figures.
	FragmentUsage(ctx context.Context, id int64) (usage FragmentUsage, found bool, err error)

	CreateFragment(ctx context.Context, spec FragmentSpec) error
	DeleteFragment(ctx context.Context, id int64) error
	CreateNamespace(ctx context.Context, spec NamespaceSpec) error
	DeleteNamespace(ctx context.Context, fragmentID, id int64) error

	Mount(ctx context.Context, spec MountSpec) error
	Unmount(ctx context.Context, activationID int64, mountPath string) error

	// StartStage begins a stage and returns at once; StageStatus polls it; CancelStage stops it
	// and returns what its worker ended with once it is gone: "canceled", or "complete" (or
	// "failed") when it ended on its own first; Known false when the agent has no such stage
	// (never started here, or already reported). A stage is forgotten once canceled.
	StartStage(ctx context.Context, spec StageSpec) error
	StageStatus(ctx context.Context, key string) (StageStatus, error) // key: StageSpec.Key
	CancelStage(ctx context.Context, key string) (StageStatus, error)

	// FlushCache drains a cache fragment's dirty data to its PFS directory (or discards it),
	// a poll: see CacheFlushSpec.
	FlushCache(ctx context.Context, spec CacheFlushSpec) (CacheFlushStatus, error)

	// AttachSwap gives this compute node a swap area backed by a swap instance (#DW swap,
	// issue 22); DetachSwap takes it away, a poll: see SwapSpec and SwapDetachSpec.
	AttachSwap(ctx context.Context, spec SwapSpec) error
	DetachSwap(ctx context.Context, spec SwapDetachSpec) (SwapStatus, error)
}

// Assignment is the controller's answer to a heartbeat: what it keeps on the node. An agent
// that restarted restores the mounts; an agent that holds fragments or namespaces the
// controller no longer knows removes them (after a grace period, and only if the controller
// is the one it has served before: same ClusterID).
type Assignment struct {
	ClusterID  string          `json:"cluster_id"`
	Fragments  []int64         `json:"fragments"`
	Namespaces []NamespaceSpec `json:"namespaces"`
	Mounts     []MountSpec     `json:"mounts"`
	// Expected are the mount paths of mounts the controller wants on the node but has not
	// recorded as made (a mount asked for whose outcome is not persisted, or not asked yet:
	// after a failover the new leader asks again). The agent keeps such a mount if it has it,
	// and does not make it on this list's word: the controller's own request does.
	Expected []string `json:"expected,omitempty"`
	// Swaps are the swap areas the node should have: an agent detaches (and removes) an area
	// it has that is not listed, after the same grace period as fragments (an abandoned job's).
	Swaps []SwapSpec `json:"swaps,omitempty"`
}
