package views

import (
	"sort"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
)

// Accounting is one instance's accounting record: DataWarp's realm (the JSON of
// dw_get_accounting_data_json in the CLE6.0UP04 spelling, the fields of RUR's dws_server and
// dws plugins) with Spillway's own fields. The API returns it for a live instance, the
// controller appends it to controller.accounting_log at teardown, one line per instance.
type Accounting struct {
	Realm Realm `json:"realm"`
}

// Realm is DataWarp's realm: the servers (fragments) and namespaces of one instance.
type Realm struct {
	RealmID        int64            `json:"realm_id"` // the instance's id
	NamespaceCount int              `json:"namespace_count"`
	ServerCount    int              `json:"server_count"`
	Fragments      []RealmFragment  `json:"fragments"`
	Namespaces     []RealmNamespace `json:"namespaces"`

	// Spillway's additions.
	RecordID string `json:"record_id,omitempty"` // <cluster id>-<instance id>: set in the log, unique
	Token    string `json:"token"`               // the session's token: the job id or the persistent name
	Session  int64  `json:"session"`
	Owner    uint32 `json:"owner"`
	Group    uint32 `json:"group"`
	Label    string `json:"label"`
	Pool     string `json:"pool"`
	// Capacity is the instance's; CapacityUsed what its fragments hold now, CapacityMax the
	// sum of their peaks.
	Capacity     uint64 `json:"capacity"`
	CapacityUsed uint64 `json:"capacity_used"`
	CapacityMax  uint64 `json:"capacity_max"`
	Created      int64  `json:"created"`         // epoch seconds
	Ended        int64  `json:"ended,omitempty"` // the teardown (records of the log only)
	Updated      int64  `json:"updated"`         // the newest counters' time (0: none reported)
	// Totals over the fragments, and the stages' bytes: in = PFS to the instance, out =
	// the instance to the PFS (every stage of the instance's configurations, in-job ones too).
	BytesRead     uint64 `json:"bytes_read"`
	BytesWritten  uint64 `json:"bytes_written"`
	ReadOps       uint64 `json:"read_ops"`
	WriteOps      uint64 `json:"write_ops"`
	FilesCreated  uint64 `json:"files_created"`
	StageBytesIn  uint64 `json:"stage_bytes_in"`
	StageBytesOut uint64 `json:"stage_bytes_out"`
	// Clients are the compute nodes' shares (RUR dws), by node name.
	Clients []RealmClient `json:"clients"`
	// StageTraffic is the data path's traffic of the stage workers (split stages of striped
	// namespaces), by the storage node they ran on: the stages' I/O, not a compute node's
	// (DataWarp counted stages in stage_bytes_*, never as a client: docs/decisions.md). It is
	// in the fragments' and the totals' bytes (what the SSDs wrote), not in the namespaces'
	// bytes_read/bytes_written.
	StageTraffic []RealmClient `json:"stage_traffic"`
	// Final: every fragment's counters were taken from its agent right before the fragment
	// was deleted. A record with final false has a fragment whose node was offline at
	// teardown: its counters are the node's last heartbeat's.
	Final bool `json:"final"`
	// Current: a live record whose every fragment's counters were read from its storage node
	// for this answer (controller.accounting_refresh_timeout); StaleNodes are the storage
	// nodes whose figures are their last heartbeat's instead (no answer in time, or beyond
	// controller.accounting_refresh_limit). Records of the log have neither.
	Current    bool     `json:"current,omitempty"`
	StaleNodes []string `json:"stale_nodes,omitempty"`
	// A cache instance's teardown flush (docs/cache.md, "Teardown"): CacheDiscarded are the
	// bytes not yet on the PFS that a teardown with --hurry discarded, CacheLost what was
	// lost with storage nodes offline at the flush (one line per fragment).
	CacheDiscarded uint64   `json:"cache_discarded,omitempty"`
	CacheLost      []string `json:"cache_lost,omitempty"`
	// Cache sums the fragments' cache counters (a cache instance; nil for scratch): the PFS
	// bytes the cache read and wrote, hits, misses, evictions, and the flush backlog now.
	Cache *agentapi.CacheUsage `json:"cache,omitempty"`
	// Swap are a swap instance's areas (#DW swap, issue 22), one per compute node: the bytes
	// the kernel paged out to (bytes_written) and in from (bytes_read) the node's area;
	// SwapBytesWritten and SwapBytesRead their sums. The file I/O of the areas on the storage
	// nodes is in the fragments' bytes as any file's.
	Swap             []RealmSwap `json:"swap,omitempty"`
	SwapBytesWritten uint64      `json:"swap_bytes_written,omitempty"`
	SwapBytesRead    uint64      `json:"swap_bytes_read,omitempty"`
}

// RealmSwap is one compute node's swap area of a swap instance.
type RealmSwap struct {
	Node         string `json:"node"`
	Area         int64  `json:"area"` // the area's id (its activation)
	BytesWritten uint64 `json:"bytes_written"`
	BytesRead    uint64 `json:"bytes_read"`
}

// RealmFragment is one server of the realm: a fragment on one storage node.
type RealmFragment struct {
	ServerHostname string `json:"server_hostname"`
	FSCapacity     uint64 `json:"fs_capacity"`
	FilesCreated   uint64 `json:"files_created"`
	CapacityUsed   uint64 `json:"capacity_used"`
	CapacityMax    uint64 `json:"capacity_max"`
	// The write window (spec §5.3): MaxWindowWrite the most written within one window,
	// WriteHighWater what the current window holds, WriteMovingAvg that over the window's
	// length (bytes per second), WriteLimit the bytes a window allows (0: no limit).
	MaxWindowWrite uint64 `json:"max_window_write"`
	WriteHighWater uint64 `json:"write_high_water"`
	WriteMovingAvg uint64 `json:"write_moving_avg"`
	WriteLimit     uint64 `json:"write_limit"`
	BytesWritten   uint64 `json:"bytes_written"`
	BytesRead      uint64 `json:"bytes_read"`
	// Spillway's additions.
	Fragment       int64  `json:"fragment"`
	ReadOps        uint64 `json:"read_ops"`
	WriteOps       uint64 `json:"write_ops"`
	WindowLength   int64  `json:"window_length"`
	WindowWritten  uint64 `json:"window_written"`
	ReadOnly       bool   `json:"read_only"`
	ReadOnlyReason string `json:"read_only_reason,omitempty"`
	Updated        int64  `json:"updated"`
	// Cache: the fragment's cache store's counters (a cache instance's; nil for scratch).
	Cache *agentapi.CacheUsage `json:"cache,omitempty"`
}

// RealmNamespace is one namespace of the realm.
type RealmNamespace struct {
	NamespaceID          int64  `json:"namespace_id"`
	StripeWidth          int    `json:"stripe_width"`
	StripeSize           uint64 `json:"stripe_size"`
	FilesCreateThreshold uint64 `json:"files_create_threshold"`
	FileSizeLimit        uint64 `json:"file_size_limit"`
	FilesCreated         uint64 `json:"files_created"`
	BytesRead            uint64 `json:"bytes_read"`
	BytesWritten         uint64 `json:"bytes_written"`
	MaxOffsetRead        uint64 `json:"max_offset_read"`
	MaxOffsetWritten     uint64 `json:"max_offset_written"`
	StageBytesRead       uint64 `json:"stage_bytes_read"`    // staged out of it
	StageBytesWritten    uint64 `json:"stage_bytes_written"` // staged into it
	// Spillway's additions.
	Configuration int64  `json:"configuration,omitempty"`
	ClientNode    string `json:"client_node,omitempty"` // a private namespace's compute node
}

// RealmClient is one compute node's share of the realm (RUR dws).
type RealmClient struct {
	Node         string `json:"node"`
	BytesRead    uint64 `json:"bytes_read"`
	BytesWritten uint64 `json:"bytes_written"`
	ReadOps      uint64 `json:"read_ops"`
	WriteOps     uint64 `json:"write_ops"`
	FilesCreated uint64 `json:"files_created"`
}

// BuildAccounting is instance inst's record from the world (its session, configurations,
// namespaces, fragments and stages, those that still exist), the data path's counters of its
// fragments (usage; the fragments' and namespaces' metadata kept there after they were
// deleted) and the bytes of its stages that are gone (carried; nil: none).
func BuildAccounting(w *lifecycle.World, inst *model.Instance, usage []*model.FragmentUsage, carried *model.StageBytes) Accounting {
	r := Realm{RealmID: inst.ID, Session: inst.SessionID, Label: inst.Label, Pool: inst.Pool,
		Capacity: inst.Capacity, Created: inst.Created.Unix(),
		Fragments: []RealmFragment{}, Namespaces: []RealmNamespace{}, Clients: []RealmClient{}, StageTraffic: []RealmClient{},
		CacheDiscarded: inst.CacheDiscarded, CacheLost: inst.CacheLost}
	if s := w.Sessions[inst.SessionID]; s != nil {
		r.Token, r.Owner, r.Group = s.Token, s.Owner, s.Group
	}
	// Fragments: the live ones and those only their counters remember.
	byFrag := map[int64]*model.FragmentUsage{}
	for _, u := range usage {
		if u.Instance == inst.ID {
			byFrag[u.Fragment] = u
		}
	}
	frags := map[int64]RealmFragment{}
	for _, f := range w.FragmentsOf(inst.ID) {
		frags[f.ID] = RealmFragment{Fragment: f.ID, ServerHostname: f.Node, FSCapacity: f.Capacity}
	}
	for id, u := range byFrag {
		if _, ok := frags[id]; !ok {
			frags[id] = RealmFragment{Fragment: id, ServerHostname: u.Node, FSCapacity: u.Capacity}
		}
	}
	r.Final = len(frags) > 0
	clients := map[string]*RealmClient{}
	nsCounters := map[int64]*RealmNamespace{}
	nsOf := func(id int64) *RealmNamespace {
		if nsCounters[id] == nil {
			nsCounters[id] = &RealmNamespace{NamespaceID: id}
		}
		return nsCounters[id]
	}
	for _, id := range sortedKeys(frags) {
		rf := frags[id]
		u := byFrag[id]
		if u == nil || !u.Final {
			r.Final = false
		}
		if u != nil {
			c := u.Counters
			rf.FilesCreated, rf.CapacityUsed, rf.CapacityMax = c.FilesCreated, c.CapacityUsed, c.CapacityMax
			rf.MaxWindowWrite, rf.WriteHighWater, rf.WriteLimit = c.MaxWindowWrite, c.WindowWritten, c.WriteLimit
			if c.WindowLength > 0 {
				rf.WriteMovingAvg = c.WindowWritten / uint64(c.WindowLength)
			}
			rf.BytesWritten, rf.BytesRead, rf.ReadOps, rf.WriteOps = c.BytesWritten, c.BytesRead, c.ReadOps, c.WriteOps
			rf.WindowLength, rf.WindowWritten, rf.ReadOnly, rf.ReadOnlyReason = c.WindowLength, c.WindowWritten, c.ReadOnly, c.ReadOnlyReason
			if c.Cache != nil {
				rf.Cache = c.Cache
				r.Cache = addCacheUsage(r.Cache, c.Cache)
			}
			if !u.Updated.IsZero() {
				rf.Updated = u.Updated.Unix()
				r.Updated = max(r.Updated, rf.Updated)
			}
			for _, ns := range u.Namespaces {
				n := nsOf(ns.ID)
				n.Configuration, n.ClientNode = ns.ConfigurationID, ns.ClientNode
			}
			for _, nc := range c.Namespaces {
				n := nsOf(nc.Namespace)
				n.FilesCreated += nc.FilesCreated
				n.BytesRead += nc.BytesRead
				n.BytesWritten += nc.BytesWritten
				n.MaxOffsetRead = max(n.MaxOffsetRead, nc.MaxOffsetRead)
				n.MaxOffsetWritten = max(n.MaxOffsetWritten, nc.MaxOffsetWritten)
				n.FilesCreateThreshold = max(n.FilesCreateThreshold, nc.FilesCreateLimit)
				n.FileSizeLimit = max(n.FileSizeLimit, nc.FileSizeLimit)
			}
			for _, cc := range c.Clients {
				cl := clients[cc.Node]
				if cl == nil {
					cl = &RealmClient{Node: cc.Node}
					clients[cc.Node] = cl
				}
				cl.BytesRead += cc.BytesRead
				cl.BytesWritten += cc.BytesWritten
				cl.ReadOps += cc.ReadOps
				cl.WriteOps += cc.WriteOps
				cl.FilesCreated += cc.FilesCreated
			}
		}
		r.Fragments = append(r.Fragments, rf)
		r.BytesRead += rf.BytesRead
		r.BytesWritten += rf.BytesWritten
		r.ReadOps += rf.ReadOps
		r.WriteOps += rf.WriteOps
		r.FilesCreated += rf.FilesCreated
		r.CapacityUsed += rf.CapacityUsed
		r.CapacityMax += rf.CapacityMax
	}
	// Namespaces: the live ones of the instance's configurations, and those the counters know.
	configs := map[int64]*model.Configuration{}
	for _, c := range w.ConfigurationsOf(inst.ID) {
		configs[c.ID] = c
		for _, ns := range w.NamespacesOf(c.ID) {
			n := nsOf(ns.ID)
			n.Configuration, n.ClientNode = ns.ConfigurationID, ns.ClientNode
		}
	}
	width := len(frags)
	stripeSize := w.StripeSize(inst)
	for _, st := range w.Stages {
		if configs[st.ConfigurationID] == nil {
			continue
		}
		n := nsOf(st.NamespaceID)
		if n.Configuration == 0 {
			n.Configuration = st.ConfigurationID
		}
		switch st.Direction {
		case model.StageIn:
			n.StageBytesWritten += st.BytesDone
			r.StageBytesIn += st.BytesDone
		case model.StageOut:
			n.StageBytesRead += st.BytesDone
			r.StageBytesOut += st.BytesDone
		}
	}
	if carried != nil && carried.Instance == inst.ID {
		r.StageBytesIn += carried.In
		r.StageBytesOut += carried.Out
		for _, c := range carried.Namespaces {
			n := nsOf(c.Namespace)
			n.StageBytesWritten += c.In
			n.StageBytesRead += c.Out
		}
	}
	for _, id := range sortedKeys(nsCounters) {
		n := nsCounters[id]
		if id == 0 { // a stage of no namespace of its own: counted in the instance's totals only
			continue
		}
		n.StripeWidth, n.StripeSize = 1, stripeSize
		if c := configs[n.Configuration]; c != nil {
			if c.AccessMode != model.AccessLoadbalance {
				n.StripeWidth = width
			}
			if n.FileSizeLimit == 0 {
				n.FileSizeLimit = c.MaxFileSize
			}
		} else if width > 0 {
			n.StripeWidth = width
		}
		r.Namespaces = append(r.Namespaces, *n)
	}
	for _, name := range sortedKeys(clients) {
		if node, ok := strings.CutPrefix(name, agentapi.StageClientPrefix); ok {
			c := *clients[name]
			c.Node = node
			r.StageTraffic = append(r.StageTraffic, c)
			continue
		}
		r.Clients = append(r.Clients, *clients[name])
	}
	for _, u := range inst.Swap {
		r.Swap = append(r.Swap, RealmSwap{Node: u.Node, Area: u.ID, BytesWritten: u.BytesWritten, BytesRead: u.BytesRead})
		r.SwapBytesWritten += u.BytesWritten
		r.SwapBytesRead += u.BytesRead
	}
	r.ServerCount, r.NamespaceCount = len(r.Fragments), len(r.Namespaces)
	return Accounting{Realm: r}
}

func sortedKeys[K int64 | string, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// AccountingOf is BuildAccounting with the time of the teardown and the record's id: a line
// of the accounting log.
func AccountingOf(w *lifecycle.World, inst *model.Instance, usage []*model.FragmentUsage, carried *model.StageBytes, recordID string, ended time.Time) Accounting {
	a := BuildAccounting(w, inst, usage, carried)
	a.Realm.RecordID, a.Realm.Ended = recordID, ended.Unix()
	return a
}

// addCacheUsage is sum plus u (a new sum when sum is nil): counters add, gauges too (each
// fragment's backlog and holdings are its own).
func addCacheUsage(sum, u *agentapi.CacheUsage) *agentapi.CacheUsage {
	if sum == nil {
		sum = &agentapi.CacheUsage{}
	}
	sum.PFSBytesRead += u.PFSBytesRead
	sum.PFSBytesWritten += u.PFSBytesWritten
	sum.ReadAheadBytes += u.ReadAheadBytes
	sum.Hits += u.Hits
	sum.Misses += u.Misses
	sum.Evictions += u.Evictions
	sum.EvictedBytes += u.EvictedBytes
	sum.FlushErrors += u.FlushErrors
	sum.FetchErrors += u.FetchErrors
	sum.DiscardedBytes += u.DiscardedBytes
	sum.ConflictBytes += u.ConflictBytes
	sum.Dirty += u.Dirty
	sum.Used += u.Used
	return sum
}
