package agentapi

// What a storage node's data path counted, reported to the controller with every heartbeat
// (NodeReport.Usage). The data path (warpfs/server) fills it; the controller keeps it in the
// state and turns it into accounting records (DataWarp's RUR dws / dws_server fields and
// dw_get_accounting_data_json) and into the write-window figures dwstat shows.
//
// Counters are monotonic for as long as the fragment lives on the node: an agent that restarts
// carries them on from what it saved with the fragment (Restored tells the controller the
// agent had to start again from zero because nothing was saved).

// NodeUsage is one storage node's counters: one entry per fragment it holds.
type NodeUsage struct {
	Fragments []FragmentUsage `json:"fragments,omitempty"`
	// Swaps are a compute node's swap areas (issue 22): what the kernel paged out and in.
	Swaps []SwapUsage `json:"swaps,omitempty"`
}

// SwapUsage is one swap area's counters on its compute node since it was attached.
type SwapUsage struct {
	ID           int64  `json:"id"` // SwapSpec.ID
	Instance     int64  `json:"instance"`
	Node         string `json:"node"`
	BytesWritten uint64 `json:"bytes_written"` // paged out
	BytesRead    uint64 `json:"bytes_read"`    // paged in
}

// FragmentUsage is the data path's counters for one fragment (DataWarp's realm fragment).
type FragmentUsage struct {
	Fragment int64 `json:"fragment"`
	Instance int64 `json:"instance"`

	BytesRead    uint64 `json:"bytes_read"`
	BytesWritten uint64 `json:"bytes_written"`
	ReadOps      uint64 `json:"read_ops"`
	WriteOps     uint64 `json:"write_ops"`
	FilesCreated uint64 `json:"files_created"` // on this node's metadata (namespace) shards

	CapacityUsed uint64 `json:"capacity_used"` // bytes the fragment holds now
	CapacityMax  uint64 `json:"capacity_max"`  // the most it has held (peak)

	// The write window (DataWarp's write protection, spec §5.3): WriteLimit bytes may be
	// written to this fragment within any WindowLength seconds; 0 = no limit.
	WriteLimit     uint64 `json:"write_limit"`
	WindowLength   int64  `json:"window_length"`
	WindowWritten  uint64 `json:"window_written"`   // bytes written within the current window
	MaxWindowWrite uint64 `json:"max_window_write"` // the most ever written within one window
	ReadOnly       bool   `json:"read_only"`        // the window tripped: writes get EROFS
	ReadOnlyReason string `json:"read_only_reason,omitempty"`

	Namespaces []NamespaceUsage `json:"namespaces,omitempty"`
	Clients    []ClientUsage    `json:"clients,omitempty"`

	Restored bool `json:"restored,omitempty"` // counters restarted from zero (nothing saved)

	// Cache is a cache fragment's store's counters (issue 20), since the agent opened the
	// store (an agent restart starts them again from zero); nil for scratch.
	Cache *CacheUsage `json:"cache,omitempty"`
}

// CacheUsage is what a cache fragment's store moved and decided: the PFS traffic it made,
// how reads were served, what it evicted, and its flush backlog.
type CacheUsage struct {
	PFSBytesRead    uint64 `json:"pfs_bytes_read"`    // fetched from the PFS (misses and read-ahead)
	PFSBytesWritten uint64 `json:"pfs_bytes_written"` // flushed to the PFS
	ReadAheadBytes  uint64 `json:"read_ahead_bytes"`  // of PFSBytesRead, fetched ahead of readers
	Hits            uint64 `json:"hits"`              // extents of reads served from the SSD
	Misses          uint64 `json:"misses"`            // extents of reads fetched from the PFS first
	Evictions       uint64 `json:"evictions"`         // clean extents dropped for room
	EvictedBytes    uint64 `json:"evicted_bytes"`
	FlushErrors     uint64 `json:"flush_errors"` // failed writes to the PFS (retried)
	FetchErrors     uint64 `json:"fetch_errors"` // failed reads from the PFS
	DiscardedBytes  uint64 `json:"discarded_bytes"`
	ConflictBytes   uint64 `json:"conflict_bytes"` // dirty bytes kept over a file changed on the PFS
	Dirty           uint64 `json:"dirty"`          // the flush backlog now: bytes not yet on the PFS
	Used            uint64 `json:"used"`           // bytes the store holds now
}

// NamespaceUsage is one namespace's share of a fragment's counters (DataWarp's realm
// namespace).
type NamespaceUsage struct {
	Namespace        int64  `json:"namespace"`
	BytesRead        uint64 `json:"bytes_read"`
	BytesWritten     uint64 `json:"bytes_written"`
	FilesCreated     uint64 `json:"files_created"`
	FilesCreateLimit uint64 `json:"files_create_threshold"` // MFC; 0 = unlimited
	FileSizeLimit    uint64 `json:"file_size_limit"`        // MFS; 0 = unlimited
	MaxOffsetRead    uint64 `json:"max_offset_read"`
	MaxOffsetWritten uint64 `json:"max_offset_written"`
}

// StageClientPrefix starts the client name a storage node's stage workers use in the data
// path (their staging mounts of striped namespaces): their traffic is the stages', counted
// as such (views.Realm.StageTraffic, docs/decisions.md), never as a compute node's.
const StageClientPrefix = "stage@"

// StageClient is the client name of node's stage workers.
func StageClient(node string) string { return StageClientPrefix + node }

// ClientUsage is one compute node's share of a fragment's counters (DataWarp's RUR dws
// plugin, per client).
type ClientUsage struct {
	Node         string `json:"node"`
	BytesRead    uint64 `json:"bytes_read"`
	BytesWritten uint64 `json:"bytes_written"`
	ReadOps      uint64 `json:"read_ops"`
	WriteOps     uint64 `json:"write_ops"`
	FilesCreated uint64 `json:"files_created"`
}

// FragmentUsageReply is the agent API's answer to GET /agent/v1/fragments/{id}/usage.
type FragmentUsageReply struct {
	Found bool          `json:"found"`
	Usage FragmentUsage `json:"usage"`
}
