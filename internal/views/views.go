// Package views renders the controller's objects in DataWarp's JSON shapes: what the REST API
// returns, what `dw_wlm_cli --function show_*` prints for Slurm, and what dwstat reads. All
// numbers are JSON integers and times are epoch seconds, as Slurm's parser requires.
package views

import (
	"slices"
	"sort"
	"strings"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
)

// State is DataWarp's state object.
type State struct {
	Actualized    bool   `json:"actualized"`
	FuseBlown     bool   `json:"fuse_blown"`
	Goal          string `json:"goal"`
	Mixed         bool   `json:"mixed"`
	Transitioning bool   `json:"transitioning"`
	Error         string `json:"error,omitempty"`
}

func stateOf(s model.State) State {
	return State{Actualized: s.Actualized, FuseBlown: s.FuseBlown, Goal: s.Goal, Mixed: s.Mixed, Transitioning: s.Transitioning, Error: s.Error}
}

// Flags renders the state as dwstat's five-character column.
func (s State) Flags() string {
	return model.State{Goal: s.Goal, Actualized: s.Actualized, FuseBlown: s.FuseBlown, Transitioning: s.Transitioning, Mixed: s.Mixed}.Flags()
}

// Pool is one element of {"pools": [...]}.
type Pool struct {
	ID          string `json:"id"`
	Units       string `json:"units"`
	Granularity uint64 `json:"granularity"`
	Quantity    uint64 `json:"quantity"`
	Free        uint64 `json:"free"`
}

// Node is a storage or compute node.
type Node struct {
	ID          string   `json:"id"`
	Pool        string   `json:"pool"`
	Online      bool     `json:"online"`
	Drain       bool     `json:"drain"`
	Granularity uint64   `json:"granularity"`
	Capacity    uint64   `json:"capacity"` // bytes offered
	Used        uint64   `json:"used"`     // bytes held by fragments
	Instances   int      `json:"instances"`
	Activations int      `json:"activations"`
	LastSeen    int64    `json:"last_seen"`
	Address     string   `json:"address,omitempty"`
	Roles       []string `json:"roles,omitempty"`
	Reason      string   `json:"reason,omitempty"`
	Health      string   `json:"health,omitempty"`
	Warnings    []string `json:"warnings,omitempty"` // configuration problems the agent started in spite of
	Written     uint64   `json:"bytes_written"`
	Version     string   `json:"version,omitempty"`
	// HeldOffline: an administrator took the node out of service (dwcli update node --offline).
	HeldOffline bool `json:"held_offline,omitempty"`
	// StorageClaim: the node's agent reports storage (pool, capacity, data address) with its
	// own node key, and no administrator admitted it: it takes no fragments (Reason says how
	// to admit it).
	StorageClaim string `json:"storage_claim,omitempty"`
	// ComputeOnly: a node whose agent serves no storage (no pool, no claim): a compute node,
	// which dwstat nodes lists apart from the storage nodes.
	ComputeOnly bool `json:"compute_only,omitempty"`

	// Health (docs/admin.md): the SSD's wear; Worn when its remaining endurance is below
	// controller.endurance_threshold (no new fragments); AutoDrained when the controller
	// drained it after repeated failures (Reason says which); RecentFailures counted toward it.
	Endurance      *NodeEndurance `json:"endurance,omitempty"`
	Worn           bool           `json:"worn,omitempty"`
	AutoDrained    bool           `json:"auto_drained,omitempty"`
	RecentFailures int            `json:"recent_failures,omitempty"`
}

// NodeEndurance is a storage node's SSD wear as its agent last read it.
type NodeEndurance struct {
	Known            bool   `json:"known"`
	PercentUsed      int    `json:"percent_used"`      // the device's figure; may pass 100
	PercentRemaining int    `json:"percent_remaining"` // 100 - used, at least 0
	Source           string `json:"source,omitempty"`
	Error            string `json:"error,omitempty"` // why it is not known
}

// Session is one element of {"sessions": [...]}.
type Session struct {
	Created    int64        `json:"created"`
	Creator    string       `json:"creator"`
	Expiration int64        `json:"expiration"`
	Expired    bool         `json:"expired"`
	ID         int64        `json:"id"`
	Links      SessionLinks `json:"links"`
	Owner      uint32       `json:"owner"`
	State      State        `json:"state"`
	Token      string       `json:"token"`
	// Spillway additions (Slurm ignores unknown keys).
	Group      uint32   `json:"group"`
	Persistent bool     `json:"persistent"`
	Phase      string   `json:"phase"`
	Hurry      bool     `json:"hurry,omitempty"`
	Failure    string   `json:"failure,omitempty"`
	Uses       []string `json:"uses,omitempty"`
}

// SessionLinks are a session's links.
type SessionLinks struct {
	ClientNodes []string `json:"client_nodes"`
}

// Instance is one element of {"instances": [...]}.
type Instance struct {
	Capacity   Capacity      `json:"capacity"`
	Created    int64         `json:"created"`
	Expiration int64         `json:"expiration"`
	Expired    bool          `json:"expired"`
	ID         int64         `json:"id"`
	Intact     bool          `json:"intact"`
	Label      string        `json:"label"`
	Limits     Limits        `json:"limits"`
	Links      InstanceLinks `json:"links"`
	Public     bool          `json:"public"`
	State      State         `json:"state"`
	Pool       string        `json:"pool"`
	Requested  uint64        `json:"requested"`
	Strategy   string        `json:"optimization_strategy"`
}

// Capacity is an instance's size and server count.
type Capacity struct {
	Bytes uint64 `json:"bytes"`
	Nodes int    `json:"nodes"`
}

// Limits are an instance's write-window limits.
type Limits struct {
	WriteWindowLength     int64 `json:"write_window_length"`
	WriteWindowMultiplier int64 `json:"write_window_multiplier"`
}

// InstanceLinks are an instance's links.
type InstanceLinks struct {
	Configurations []int64 `json:"configurations"`
	Session        int64   `json:"session"`
}

// Configuration is one element of {"configurations": [...]}.
type Configuration struct {
	ID              int64  `json:"id"`
	Type            string `json:"type"`
	AccessType      string `json:"access_type"` // DataWarp's words: stripe, private, ldbal
	AccessMode      string `json:"access_mode"` // Spillway's: striped, private, loadbalance
	RootPermissions uint32 `json:"root_permissions"`
	Group           uint32 `json:"group"`
	BackingPath     string `json:"backing_path,omitempty"`
	// Cache is a cache configuration's PFS directory and tunables (nil for scratch): what
	// `spillway layout` gives bbsim to model its write-behind.
	Cache *model.CacheSettings `json:"cache,omitempty"`
	// SwapSize is a swap configuration's area per compute node (bytes), SwapNodes the
	// compute nodes its instance was reserved for (#DW swap, issue 22).
	SwapSize    uint64            `json:"swap_size,omitempty"`
	SwapNodes   int               `json:"swap_nodes,omitempty"`
	Activations int               `json:"activs"`
	Links       ConfigurationLink `json:"links"`
	State       State             `json:"state"`
}

// ConfigurationLink links a configuration to its instance.
type ConfigurationLink struct {
	Instance int64 `json:"instance"`
}

// Fragment is one element of {"fragments": [...]}.
type Fragment struct {
	ID       int64  `json:"id"`
	Instance int64  `json:"instance"`
	Capacity uint64 `json:"capacity"`
	Node     string `json:"node"`
	State    State  `json:"state"`
	// A cache instance's fragment during its teardown's flush (docs/cache.md, "Teardown"):
	// the bytes its node last reported not yet on the PFS, the last flush failure, and what
	// was lost with its node offline.
	CacheDirty      uint64 `json:"cache_dirty,omitempty"`
	CacheFlushError string `json:"cache_flush_error,omitempty"`
	CacheLost       string `json:"cache_lost,omitempty"`
}

// Namespace is one element of {"namespaces": [...]}.
type Namespace struct {
	ID            int64  `json:"id"`
	Configuration int64  `json:"configuration"`
	Fragment      int64  `json:"fragment"`
	Span          int    `json:"span"` // storage nodes the namespace's data spans
	ClientNode    string `json:"client_node,omitempty"`
	State         State  `json:"state"`
}

// Registration is one element of {"registrations": [...]}.
type Registration struct {
	ID            int64 `json:"id"`
	Session       int64 `json:"session"`
	Configuration int64 `json:"configuration"`
	Wait          bool  `json:"wait"`
	State         State `json:"state"`
}

// Activation is one element of {"activations": [...]}.
type Activation struct {
	ID            int64  `json:"id"`
	Session       int64  `json:"session"`
	Configuration int64  `json:"configuration"`
	Namespace     int64  `json:"namespace"`
	Node          string `json:"node"`
	Mount         string `json:"mount"`
	ReadOnly      bool   `json:"read_only"`
	State         State  `json:"state"`
}

// Stage is one element of {"stages": [...]}.
type Stage struct {
	ID         int64    `json:"id"`
	Session    int64    `json:"session"`
	Token      string   `json:"token"`
	Direction  string   `json:"direction"`
	Type       string   `json:"type"`
	PFSPath    string   `json:"pfs_path"`
	DWPath     string   `json:"dw_path"`
	Line       int      `json:"line,omitempty"`
	Status     string   `json:"status"`
	FilesTotal int64    `json:"files_total"`
	FilesDone  int64    `json:"files_done"`
	BytesTotal uint64   `json:"bytes_total"`
	BytesDone  uint64   `json:"bytes_done"`
	Error      string   `json:"error,omitempty"`
	Warnings   []string `json:"warnings,omitempty"`
	// InJob: the job asked for it while it ran (libdatawarp, dwcli stage).
	InJob bool `json:"in_job,omitempty"`
	// Step and BytesByNode: a stage of a striped instance runs on every server at once
	// (docs/staging.md): the step under way, and the bytes each storage node moved.
	Step        string            `json:"step,omitempty"`
	BytesByNode map[string]uint64 `json:"bytes_by_node,omitempty"`
	Started     int64             `json:"started,omitempty"`
	Finished    int64             `json:"finished,omitempty"`
	// Owner is the uid of the stage's session (a finished stage's, kept after it went).
	Owner uint32 `json:"owner"`
}

// All is every table at once: GET /dw/v1/all, dwstat all, and the layout snapshot bbsim reads.
type All struct {
	Pools          []Pool          `json:"pools"`
	Nodes          []Node          `json:"nodes"`
	Sessions       []Session       `json:"sessions"`
	Instances      []Instance      `json:"instances"`
	Configurations []Configuration `json:"configurations"`
	Fragments      []Fragment      `json:"fragments"`
	Namespaces     []Namespace     `json:"namespaces"`
	Registrations  []Registration  `json:"registrations"`
	Activations    []Activation    `json:"activations"`
	Stages         []Stage         `json:"stages"`
	// StageHistory are finished stages kept after their sessions went (stage.history of the
	// newest), oldest first: not live objects.
	StageHistory []Stage `json:"stage_history"`
	// Accounting is filled only by callers that ask for it (GET /dw/v1/accounting): Build
	// leaves it empty.
	Accounting []Accounting `json:"accounting,omitempty"`
	// Controllers is filled only by dwstat controllers, which asks each listed controller
	// (GET /dw/v1/controller): Build leaves it empty.
	Controllers []Controller `json:"controllers,omitempty"`
}

// Controller is what one controller says of itself (GET /dw/v1/controller): whether it is
// the only one, leads or follows (and whom), on which store engine, at which version.
type Controller struct {
	// Address is the address the caller reached it at (filled by the client).
	Address string `json:"address,omitempty"`
	// Role: "only" (no [ha]), "leading", "following", or "unreachable" (filled by the client,
	// with Error).
	Role string `json:"role"`
	// Leader is the leader's advertised address as the controller reads it from the
	// election ("" while none is elected, or with no [ha]).
	Leader string `json:"leader,omitempty"`
	// Advertise is its own advertised address (ha.advertise).
	Advertise string `json:"advertise,omitempty"`
	Engine    string `json:"engine,omitempty"`
	Version   string `json:"version,omitempty"`
	Error     string `json:"error,omitempty"`
}

// Tables are the tables of All that a world renders, in dwstat's order (stage_history is
// rendered from the finished stages: History).
var Tables = []string{"pools", "nodes", "sessions", "instances", "configurations", "registrations", "activations", "fragments", "namespaces", "stages"}

// Build renders the whole world.
func Build(w *lifecycle.World) All {
	a := BuildTables(w, Tables...)
	a.StageHistory = []Stage{}
	return a
}

// BuildTables renders the named tables of the world (see Tables) and leaves the others nil:
// a listing renders its table alone, from a world holding what that table needs.
func BuildTables(w *lifecycle.World, tables ...string) All {
	var a All
	for _, t := range tables {
		switch t {
		case "pools":
			a.Pools = buildPools(w)
		case "nodes":
			a.Nodes = buildNodes(w)
		case "sessions":
			a.Sessions = buildSessions(w)
		case "instances":
			a.Instances = buildInstances(w)
		case "configurations":
			a.Configurations = buildConfigurations(w)
		case "fragments":
			a.Fragments = buildFragments(w)
		case "namespaces":
			a.Namespaces = buildNamespaces(w)
		case "registrations":
			a.Registrations = buildRegistrations(w)
		case "activations":
			a.Activations = buildActivations(w)
		case "stages":
			a.Stages = buildStages(w)
		}
	}
	return a
}

func buildPools(w *lifecycle.World) []Pool {
	out := []Pool{}
	var poolNames []string
	for n := range w.Pools {
		poolNames = append(poolNames, n)
	}
	sort.Strings(poolNames)
	for _, name := range poolNames {
		u := w.UsageOfPool(name)
		out = append(out, Pool{ID: name, Units: "bytes", Granularity: u.Pool.Granularity, Quantity: u.Quantity, Free: u.Free})
	}
	return out
}

func buildNodes(w *lifecycle.World) []Node {
	out := []Node{}
	for _, name := range w.NodeNames() {
		n := w.Nodes[name]
		u := w.UsageOfNode(name)
		var gran uint64
		if p := w.Pools[n.Pool]; p != nil {
			gran = p.Granularity
		}
		out = append(out, Node{ID: name, Pool: n.Pool, Online: n.Online, Drain: n.Drain, Granularity: gran,
			Capacity: n.Capacity, Used: u.Used * gran, Instances: u.Instances, Activations: u.Activations,
			LastSeen: n.LastSeen.Unix(), Address: n.Address, Roles: n.Roles, Reason: n.Reason, Health: n.Health, Warnings: n.Warnings, Written: n.Written, Version: n.Version,
			HeldOffline: n.HeldOffline, Worn: n.Worn, AutoDrained: n.AutoDrained, RecentFailures: len(n.Failures), StorageClaim: n.StorageClaim})
		v := &out[len(out)-1]
		v.ComputeOnly = n.Pool == "" && n.StorageClaim == ""
		if n.StorageClaim != "" && v.Reason == "" {
			v.Reason = "not admitted for storage (claims " + n.StorageClaim + "): dwcli update node --name " + name + " --storage"
		}
		if e := n.Endurance; e != nil {
			v.Endurance = &NodeEndurance{Known: e.Known, PercentUsed: e.PercentUsed, PercentRemaining: e.Remaining(), Source: e.Source, Error: e.Error}
		}
		if n.Worn && v.Reason == "" {
			v.Reason = lifecycle.WornReason(n)
		}
		if len(n.Warnings) > 0 && v.Reason == "" {
			v.Reason = "agent configuration: " + strings.Join(n.Warnings, "; ")
		}
	}
	return out
}

func buildSessions(w *lifecycle.World) []Session {
	out := make([]Session, 0, len(w.Sessions))
	for _, id := range ids(w.Sessions) {
		s := w.Sessions[id]
		nodes := s.ClientNodes
		if nodes == nil {
			nodes = []string{}
		}
		out = append(out, Session{Created: s.Created.Unix(), Creator: s.Creator, Expiration: s.Expiration, Expired: s.Expired, ID: s.ID,
			Links: SessionLinks{ClientNodes: nodes}, Owner: s.Owner, State: stateOf(s.State), Token: s.Token,
			Group: s.Group, Persistent: s.Persistent, Phase: s.Phase, Hurry: s.Hurry, Failure: failureOf(w, s), Uses: s.Uses})
	}
	return out
}

func buildInstances(w *lifecycle.World) []Instance {
	out := make([]Instance, 0, len(w.Instances))
	// Each instance's configurations and fragments, gathered in one walk of each table.
	type fragments struct {
		count int
		blown bool // a fragment's fuse is blown
	}
	confsOf, fragsOf := make(map[int64][]int64, len(w.Instances)), make(map[int64]fragments, len(w.Instances))
	for _, id := range ids(w.Configurations) {
		c := w.Configurations[id]
		confsOf[c.InstanceID] = append(confsOf[c.InstanceID], c.ID)
	}
	for _, f := range w.Fragments {
		fs := fragsOf[f.InstanceID]
		fs.count++
		fs.blown = fs.blown || f.State.FuseBlown
		fragsOf[f.InstanceID] = fs
	}
	for _, id := range ids(w.Instances) {
		i := w.Instances[id]
		confs := confsOf[i.ID]
		if confs == nil {
			confs = []int64{}
		}
		frags := fragsOf[i.ID]
		out = append(out, Instance{Capacity: Capacity{Bytes: i.Capacity, Nodes: frags.count}, Created: i.Created.Unix(),
			ID: i.ID, Intact: !frags.blown, Label: i.Label, Limits: Limits{i.WriteWindowLength, i.WriteWindowMultiplier},
			Links: InstanceLinks{Configurations: confs, Session: i.SessionID}, Public: i.Public, State: stateOf(i.State),
			Pool: i.Pool, Requested: i.Requested, Strategy: i.Strategy})
		if s := w.Sessions[i.SessionID]; s != nil { // an instance expires with its session
			out[len(out)-1].Expiration, out[len(out)-1].Expired = s.Expiration, s.Expired
		}
	}
	return out
}

func buildConfigurations(w *lifecycle.World) []Configuration {
	activs := map[int64]int{}
	for _, act := range w.Activations {
		activs[act.ConfigurationID]++
	}
	out := make([]Configuration, 0, len(w.Configurations))
	for _, id := range ids(w.Configurations) {
		c := w.Configurations[id]
		out = append(out, Configuration{ID: c.ID, Type: c.Type, AccessType: AccessType(c.AccessMode), AccessMode: c.AccessMode,
			RootPermissions: c.RootPermissions, Group: c.Group, BackingPath: c.BackingPath, Cache: cacheSettings(c.Cache), Activations: activs[c.ID],
			SwapSize: c.SwapSize, SwapNodes: c.SwapNodes,
			Links: ConfigurationLink{Instance: c.InstanceID}, State: stateOf(c.State)})
	}
	return out
}

// cacheSettings copies a configuration's cache settings (the view never aliases the world).
func cacheSettings(c *model.CacheSettings) *model.CacheSettings {
	if c == nil {
		return nil
	}
	cp := *c
	return &cp
}

func buildFragments(w *lifecycle.World) []Fragment {
	out := make([]Fragment, 0, len(w.Fragments))
	for _, id := range ids(w.Fragments) {
		f := w.Fragments[id]
		out = append(out, Fragment{ID: f.ID, Instance: f.InstanceID, Capacity: f.Capacity, Node: f.Node, State: stateOf(f.State),
			CacheDirty: f.CacheDirty, CacheFlushError: f.CacheFlushError, CacheLost: f.CacheLost})
	}
	return out
}

func buildNamespaces(w *lifecycle.World) []Namespace {
	out := make([]Namespace, 0, len(w.Namespaces))
	for _, id := range ids(w.Namespaces) {
		ns := w.Namespaces[id]
		out = append(out, Namespace{ID: ns.ID, Configuration: ns.ConfigurationID, Fragment: ns.FragmentID, Span: 1, ClientNode: ns.ClientNode, State: stateOf(ns.State)})
	}
	return out
}

func buildRegistrations(w *lifecycle.World) []Registration {
	out := make([]Registration, 0, len(w.Registrations))
	for _, id := range ids(w.Registrations) {
		r := w.Registrations[id]
		out = append(out, Registration{ID: r.ID, Session: r.SessionID, Configuration: r.ConfigurationID, Wait: r.Wait, State: stateOf(r.State)})
	}
	return out
}

func buildActivations(w *lifecycle.World) []Activation {
	out := make([]Activation, 0, len(w.Activations))
	for _, id := range ids(w.Activations) {
		act := w.Activations[id]
		out = append(out, Activation{ID: act.ID, Session: act.SessionID, Configuration: act.ConfigurationID, Namespace: act.NamespaceID,
			Node: act.Node, Mount: act.MountPath, ReadOnly: act.ReadOnly, State: stateOf(act.State)})
	}
	return out
}

func buildStages(w *lifecycle.World) []Stage {
	out := make([]Stage, 0, len(w.Stages))
	for _, id := range ids(w.Stages) {
		s := w.Stages[id]
		var token string
		var owner uint32
		if sess := w.Sessions[s.SessionID]; sess != nil {
			token, owner = sess.Token, sess.Owner
		}
		out = append(out, stageOf(s, token, owner))
	}
	return out
}

// History renders the finished stages kept after their sessions went.
func History(h []*model.FinishedStage) []Stage {
	out := []Stage{}
	for _, f := range h {
		out = append(out, stageOf(&f.Stage, f.Token, f.Owner))
	}
	return out
}

func stageOf(s *model.Stage, token string, owner uint32) Stage {
	v := Stage{ID: s.ID, Session: s.SessionID, Token: token, Direction: s.Direction, Type: s.Type, PFSPath: s.PFSPath, DWPath: s.DWPath, Line: s.Line,
		Status: s.Status, FilesTotal: s.FilesTotal, FilesDone: s.FilesDone, BytesTotal: s.BytesTotal, BytesDone: s.BytesDone, Error: s.Error, Warnings: s.Warnings,
		InJob: s.InJob, Owner: owner}
	if s.Step != "" {
		v.Step, v.BytesByNode = s.Step, map[string]uint64{}
		for node, n := range s.Moved {
			v.BytesByNode[node] += n
		}
		for _, part := range s.Parts {
			if s.Status == model.StageRunning && lifecycle.MovesData(s.Step) {
				v.BytesByNode[part.Node] += part.BytesDone
			}
		}
	}
	if !s.Started.IsZero() {
		v.Started = s.Started.Unix()
	}
	if !s.Finished.IsZero() {
		v.Finished = s.Finished.Unix()
	}
	return v
}

// AccessType is DataWarp's word for an access mode in configuration listings.
func AccessType(mode string) string {
	switch mode {
	case model.AccessStriped:
		return "stripe"
	case model.AccessLoadbalance:
		return "ldbal"
	}
	return mode
}

func ids[T any](m map[int64]T) []int64 {
	out := make([]int64, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// VisibleTo keeps what an ordinary user may see (DataWarp: "non-administrators can only see
// persistent instances and any configuration data associated with their userid"): the pools
// and nodes; their own sessions with everything under them; and every persistent instance
// (any user's job may use one with #DW persistentdw) with its configurations, fragments and
// namespaces — but not other users' registrations, mounts or stages on it.
func (a All) VisibleTo(uid uint32) All {
	sessions := map[int64]bool{} // visible sessions
	own := map[int64]bool{}      // the user's own sessions
	// Empty, not nil: a user with nothing to see gets [] (Slurm and dwstat read a list).
	out := All{Pools: a.Pools, Nodes: a.Nodes, Sessions: []Session{}, Instances: []Instance{}, Configurations: []Configuration{},
		Fragments: []Fragment{}, Namespaces: []Namespace{}, Registrations: []Registration{}, Activations: []Activation{}, Stages: []Stage{}}
	for _, s := range a.Sessions {
		if s.Owner == uid || s.Persistent {
			sessions[s.ID] = true
			own[s.ID] = s.Owner == uid
			out.Sessions = append(out.Sessions, s)
		}
	}
	instances := map[int64]bool{}
	for _, in := range a.Instances {
		if sessions[in.Links.Session] {
			instances[in.ID] = true
			out.Instances = append(out.Instances, in)
		}
	}
	configs := map[int64]bool{}
	for _, c := range a.Configurations {
		if instances[c.Links.Instance] {
			configs[c.ID] = true
			out.Configurations = append(out.Configurations, c)
		}
	}
	for _, f := range a.Fragments {
		if instances[f.Instance] {
			out.Fragments = append(out.Fragments, f)
		}
	}
	for _, n := range a.Namespaces {
		if configs[n.Configuration] {
			out.Namespaces = append(out.Namespaces, n)
		}
	}
	for _, r := range a.Registrations {
		if own[r.Session] {
			out.Registrations = append(out.Registrations, r)
		}
	}
	for _, act := range a.Activations {
		if own[act.Session] {
			out.Activations = append(out.Activations, act)
		}
	}
	for _, st := range a.Stages {
		if own[st.Session] {
			out.Stages = append(out.Stages, st)
		}
	}
	out.StageHistory = []Stage{}
	for _, st := range a.StageHistory {
		if st.Owner == uid {
			out.StageHistory = append(out.StageHistory, st)
		}
	}
	return out
}

// failureOf is a session's failure as listings show it: the one recorded, else its lost swap
// areas (a storage node gone under a settled job: no step has recorded it yet).
func failureOf(w *lifecycle.World, s *model.Session) string {
	if s.Failure != "" {
		return s.Failure
	}
	return strings.Join(lifecycle.LostSwaps(w, s), "; ")
}
