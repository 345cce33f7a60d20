package lifecycle

import (
	"errors"
	"fmt"
	"hash/fnv"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/alloc"
	"github.com/spillway-hpc/spillway/internal/directive"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/units"
)

// Params are the controller settings the decisions depend on.
type Params struct {
	MountRoot        string // where instances appear on compute nodes
	MaxSessions      int
	MaxAttempts      int           // tries of an effect before the object's fuse blows
	RetryBackoff     time.Duration // first wait between tries; doubles
	RetryBackoffMax  time.Duration
	StageMaxAttempts int // restarts of a stage after its agent lost it
	StageMaxRunning  int // stages running at once, all sessions
	// StageMaxJobConcurrency bounds the limit a job sets on its own running in-job stages.
	StageMaxJobConcurrency int
	// UserQuota bounds what one ordinary user's own requests may hold (sessions they set up
	// through `spillway run`, `spillway persistent`, the API); the workload manager's jobs are
	// bounded by the workload manager.
	UserQuota Quota
	// Limits are the site's defaults and bounds of the write protection (limits.go).
	Limits WriteLimits
	// Health excludes worn storage nodes and drains failing ones (health.go).
	Health Health
	// PersistentExpiration is the lifetime of a persistent instance created without an
	// expiration, MaxPersistentExpiration the longest one may ask for; 0: none (expire.go).
	PersistentExpiration    time.Duration
	MaxPersistentExpiration time.Duration
	// Cache is what the site allows and defaults for cache instances ([cache]).
	Cache CacheParams
	// Swap is what the site allows for swap on the burst buffer ([swap], swap.go).
	Swap SwapParams
}

// CacheParams are the site's rules for cache instances (config [cache]).
type CacheParams struct {
	// AllowedPFS are the directories a cache's pfs= must be at or under (whole components);
	// empty: no cache is allowed. A one-machine home allows "/".
	AllowedPFS []string
	// Defaults are the tunables of a job that names none (PFS unused).
	Defaults model.CacheSettings
}

// Quota is what one user may hold at once; a zero field means no limit.
type Quota struct {
	Sessions   int    // job sessions and persistent instances together
	Persistent int    // persistent instances
	Capacity   uint64 // bytes of instance capacity requested, all sessions
}

// Step names, recorded as the session's phase.
const (
	PhaseSetup    = "setup"
	PhaseDataIn   = "data_in"
	PhasePreRun   = "pre_run"
	PhasePostRun  = "post_run"
	PhaseDataOut  = "data_out"
	PhaseTeardown = "teardown"
)

// ErrNoSession is returned for a token the controller does not know. Slurm treats DataWarp's
// "No matching session" / "token not found" answers as success for data_in, data_out and
// teardown, so callers map it to those words.
var ErrNoSession = errors.New("token not found")

// ErrTokenTaken is returned when a setup names a token another user's session has: a client
// that drew the token itself (spillway run) draws another.
var ErrTokenTaken = errors.New("token taken")

// ErrBusy is returned when a request cannot be taken now but may be later (teardown of the same
// token still running); the caller retries.
var ErrBusy = errors.New("busy")

// UserError is a request that is wrong as asked: the message says what and how to fix it.
type UserError struct{ Msg string }

func (e *UserError) Error() string { return e.Msg }

func userErr(format string, args ...any) error { return &UserError{Msg: fmt.Sprintf(format, args...)} }

// LimitError is a request refused for naming more than a limit of the configuration allows
// (stage.max_paths_per_request, ...): the API answers 413, kind too_large, and libdatawarp
// E2BIG. Its message names the limit and the way out.
type LimitError struct{ Msg string }

func (e *LimitError) Error() string { return e.Msg }

func limitErr(format string, args ...any) error {
	return &LimitError{Msg: fmt.Sprintf(format, args...)}
}

// InstanceRequest describes the capacity a session asks for.
type InstanceRequest struct {
	Capacity              uint64   `json:"capacity"` // bytes; rounded up to the pool granularity
	Pool                  string   `json:"pool"`
	Type                  string   `json:"type"`         // scratch or cache; swap is refused
	AccessModes           []string `json:"access_modes"` // striped, private, loadbalance
	Strategy              string   `json:"optimization_strategy"`
	MaxFileSize           uint64   `json:"max_file_size,omitempty"`
	ClientCache           bool     `json:"client_cache,omitempty"`
	MaxMDS                bool     `json:"max_mds,omitempty"`                 // striped: a metadata shard on every fragment
	WriteWindowLength     int64    `json:"write_window_length,omitempty"`     // seconds; 0: the site's default
	WriteWindowMultiplier int64    `json:"write_window_multiplier,omitempty"` // 0: the site's default
	MaxFilesCreated       uint64   `json:"max_files_created,omitempty"`       // MFC; 0: the site's default
	// Cache is what a type=cache instance fronts (pfs=) and the tunables the job named; nil
	// for scratch.
	Cache *CacheRequest `json:"cache,omitempty"`
}

// CacheRequest is the cache part of an instance request: pfs= and the tunables the job wrote
// (absent ones take the site's [cache] defaults at setup).
type CacheRequest struct {
	PFS               string  `json:"pfs"`
	ModifiedThreshold *uint64 `json:"modified_threshold,omitempty"` // nil: the site's default
	ReadAhead         *uint64 `json:"read_ahead,omitempty"`         // nil: the site's default (0 turns it off)
	SyncOnClose       *bool   `json:"sync_on_close,omitempty"`      // nil: the site's default
	SyncToPFS         *bool   `json:"sync_to_pfs,omitempty"`        // nil: the site's default
}

// Setup creates a job session (WLM setup) or a persistent one (create_persistent).
type Setup struct {
	Token      string           `json:"token"`
	Creator    string           `json:"creator"`
	Owner      uint32           `json:"owner"`
	Group      uint32           `json:"group"`
	Persistent bool             `json:"persistent"`
	Instance   *InstanceRequest `json:"instance,omitempty"` // nil: no capacity of its own
	// More are the job's further instances, of other types than Instance's (a job may hold a
	// scratch and a cache instance: two #DW jobdw lines, DataWarp's Phase 3); a persistent
	// session has none.
	More []InstanceRequest `json:"more_instances,omitempty"`
	// Swap is the job's #DW swap: an instance of type swap of its own (swap.go).
	Swap        *SwapRequest `json:"swap,omitempty"`
	Uses        []string     `json:"uses,omitempty"` // persistent instances (#DW persistentdw)
	ClientNodes []string     `json:"client_nodes,omitempty"`
	// StageOut are the job's stage-outs (#DW stage_out), registered now as deferred and run
	// when data_out asks for them.
	StageOut []StageRequest `json:"stage_out,omitempty"`
	// Expiration is when a persistent instance expires, in seconds since the epoch; 0: the
	// site's default (controller.persistent_expiration), ExpirationNever: never (expire.go).
	Expiration int64 `json:"expiration,omitempty"`
	// Manual: the session is built object by object (dwcli create session, then create
	// instance, ...): a persistent one may come without its instance.
	Manual bool `json:"manual,omitempty"`
}

// StageRequest is one stage directive, resolved by the caller to a variable and a path.
type StageRequest struct {
	Type    string `json:"type"`     // file | directory | list
	PFSPath string `json:"pfs_path"` // absolute
	DWVar   string `json:"dw_var"`   // DW_JOB_STRIPED, DW_JOB_LDBAL, DW_PERSISTENT_STRIPED_<name>; "" for list
	DWPath  string `json:"dw_path"`  // inside the namespace, starting with "/"
	Line    int    `json:"line,omitempty"`
}

// Variables that name a job's own namespaces, and the prefix of persistent ones: the
// directive parser's names.
const (
	VarJobStriped     = directive.VarJobStriped
	VarJobPrivate     = directive.VarJobPrivate
	VarJobLoadbalance = directive.VarJobLoadbalance
	VarPersistentPre  = directive.VarPersistentPrefix
)

// sameInstance refuses to "create" a persistent instance that exists with other parameters:
// answering yes would let the user believe the new capacity or access mode took effect.
func sameInstance(w *World, existing *model.Session, req Setup) error {
	inst := w.InstanceOf(existing.ID)
	if inst == nil || req.Instance == nil {
		return nil
	}
	r := req.Instance
	var differ []string
	if pool := w.Pools[inst.Pool]; pool != nil && pool.Granularity > 0 {
		if grains := (r.Capacity + pool.Granularity - 1) / pool.Granularity; grains != inst.Grains {
			differ = append(differ, fmt.Sprintf("capacity %s, not %s", units.FormatHuman(inst.Capacity), units.FormatHuman(r.Capacity)))
		}
	}
	if r.Pool != "" && r.Pool != inst.Pool {
		differ = append(differ, fmt.Sprintf("pool %s, not %s", inst.Pool, r.Pool))
	}
	var have []string
	haveType, havePFS := model.TypeScratch, ""
	for _, c := range w.ConfigurationsOf(inst.ID) {
		have = append(have, c.AccessMode)
		haveType, havePFS = c.Type, c.BackingPath
	}
	wantPFS := ""
	if r.Cache != nil {
		wantPFS = r.Cache.PFS
	}
	if t := orDefault(r.Type, model.TypeScratch); t != haveType {
		differ = append(differ, fmt.Sprintf("type %s, not %s", haveType, t))
	} else if wantPFS != havePFS {
		differ = append(differ, fmt.Sprintf("pfs %s, not %s", havePFS, wantPFS))
	}
	sort.Strings(have)
	want := append([]string(nil), r.AccessModes...)
	sort.Strings(want)
	if len(want) > 0 && strings.Join(have, ",") != strings.Join(want, ",") {
		differ = append(differ, fmt.Sprintf("access mode %s, not %s", strings.Join(have, ","), strings.Join(want, ",")))
	}
	if len(differ) > 0 {
		return userErr("persistent instance %q already exists with %s; destroy it first, or create it with the same parameters", req.Token, strings.Join(differ, ", "))
	}
	return nil
}

// ApplySetup creates the session, its instance (placed by the allocator), configurations,
// namespaces and registrations. A second setup of the same token by the same owner is a no-op.
func ApplySetup(w *World, req Setup, ids IDSource, p Params, now time.Time) error {
	if err := checkToken(req.Token); err != nil {
		return err
	}
	if existing := w.SessionByToken(req.Token); existing != nil {
		if existing.State.Goal == model.GoalDestroy {
			return fmt.Errorf("%w: %q is being torn down; try again when it is gone", ErrBusy, req.Token)
		}
		if existing.Owner != req.Owner {
			return fmt.Errorf("%w: token %q already belongs to uid %d", ErrTokenTaken, req.Token, existing.Owner)
		}
		if existing.Persistent != req.Persistent {
			return userErr("token %q is already used by a %s", req.Token, kindWord(existing))
		}
		if existing.Persistent {
			if expired(existing, now) {
				return userErr("persistent instance %q expired at %s; it is destroyed once the jobs using it end: create it again then, or under another name",
					req.Token, stamp(existing.Expiration))
			}
			if err := sameInstance(w, existing, req); err != nil {
				return err
			}
		}
		return nil // idempotent: Slurm re-sends setup after a restart
	}
	if req.Persistent {
		if err := checkPersistentName(req.Token); err != nil {
			return err
		}
		if (req.Instance == nil || req.Instance.Capacity == 0) && !req.Manual {
			return userErr("create_persistent %s: capacity must be greater than 0", req.Token)
		}
	}
	if err := checkInstances(req, p); err != nil {
		return err
	}
	if p.MaxSessions > 0 && w.SessionCount() >= p.MaxSessions {
		return userErr("too many sessions (%d, the limit controller.max_sessions); wait for some to end", w.SessionCount())
	}
	var used []*model.Session
	for _, name := range req.Uses {
		ps := w.PersistentByName(name)
		if ps == nil {
			return userErr("persistentdw name=%s: no persistent instance of that name exists; create it first with #BB create_persistent name=%s", name, name)
		}
		if ps.State.Goal == model.GoalDestroy {
			return userErr("persistentdw name=%s: the persistent instance is being destroyed", name)
		}
		if expired(ps, now) {
			return userErr("persistentdw name=%s: the persistent instance expired at %s and is being destroyed; create a new one (#BB create_persistent, spillway persistent create) for new jobs",
				name, stamp(ps.Expiration))
		}
		used = append(used, ps)
	}
	expiration, err := expirationFor(req, p, now)
	if err != nil {
		return err
	}

	sid, err := ids.NewID(KindSession)
	if err != nil {
		return err
	}
	sess := &model.Session{
		ID: sid, Token: req.Token, Creator: req.Creator, Owner: req.Owner, Group: req.Group,
		Created: now, ClientNodes: req.ClientNodes, Persistent: req.Persistent,
		State: model.Creating(), Phase: PhaseSetup, Uses: req.Uses, Expiration: expiration,
	}
	if req.Instance != nil && req.Instance.Capacity > 0 {
		if err := createInstance(w, sess, *req.Instance, ids, p, now); err != nil {
			return err
		}
	}
	for _, r := range req.More { // the job's instance of the other type (checkInstances)
		if r.Capacity > 0 {
			if err := createInstance(w, sess, r, ids, p, now); err != nil {
				return err
			}
		}
	}
	if req.Swap != nil {
		if err := createSwapInstance(w, sess, req, ids, p, now); err != nil {
			return err
		}
	}
	w.put(sess)
	for _, ps := range used {
		inst := w.InstanceOf(ps.ID)
		if inst == nil {
			continue
		}
		for _, c := range w.ConfigurationsOf(inst.ID) {
			if err := addRegistration(w, sess, c, ids); err != nil {
				return err
			}
		}
	}
	if len(req.StageOut) > 0 {
		if req.Persistent {
			return userErr("create_persistent %s: a persistent instance has no stage-out", req.Token)
		}
		return addStages(w, sess, model.StageOut, req.StageOut, ids, model.StageDeferred)
	}
	return nil
}

func kindWord(s *model.Session) string {
	if s.Persistent {
		return "persistent instance"
	}
	return "job"
}

// checkToken refuses a token that could not name a session everywhere it is used: in mount
// paths (a "/" or ".." would put a mount outside the mount root), environment variables and
// dwstat's columns. Job ids, run<N> and persistent names are all letters, digits and _.
func checkToken(token string) error {
	if token == "" {
		return userErr("setup: empty token")
	}
	if len(token) > maxTokenBytes {
		return userErr("token %.40q...: longer than %d bytes", token, maxTokenBytes)
	}
	for i := 0; i < len(token); i++ {
		c := token[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return userErr("token %q: %q is not allowed; a token is letters, digits and _ (a job id, run<N> or a persistent instance's name)", token, rune(c))
		}
	}
	return nil
}

// maxTokenBytes bounds a token (a persistent name's limit is lower; job ids are short).
const maxTokenBytes = 128

func checkPersistentName(name string) error {
	if err := directive.CheckName(name); err != nil {
		return userErr("persistent instance name %q: %v", name, err)
	}
	if IsRunToken(name) {
		return userErr("persistent instance name %q is reserved: run<N> names the sessions of `spillway run`; choose another name", name)
	}
	return nil
}

// IsRunToken reports whether token has the form of `spillway run`'s sessions, run<N>.
func IsRunToken(token string) bool {
	digits := strings.TrimPrefix(token, "run")
	if len(digits) == len(token) || digits == "" {
		return false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return false
		}
	}
	return true
}

// CheckUserQuota says whether the owner of a new session may have it on top of what they
// hold (a re-sent setup of an existing session is not new and always passes). A session being
// torn down counts for as long as it still holds its instance: a teardown that waits for its
// stage-outs (which the user may stall) holds the capacity as the live session did (security
// issue 19 item 7).
func CheckUserQuota(w *World, req Setup, q Quota) error {
	if w.SessionByToken(req.Token) != nil {
		return nil
	}
	if req.Persistent { // a name that can never be had is the first thing to say
		if err := checkPersistentName(req.Token); err != nil {
			return err
		}
	}
	sessions, persistent := 0, 0
	var capacity uint64
	for _, s := range w.Sessions {
		if s.Owner != req.Owner {
			continue
		}
		insts := w.InstancesOf(s.ID)
		if s.State.Goal == model.GoalDestroy && len(insts) == 0 {
			continue // going, and it holds nothing any more
		}
		sessions++
		if s.Persistent {
			persistent++
		}
		for _, inst := range insts {
			capacity += inst.Requested
		}
	}
	if q.Sessions > 0 && sessions >= q.Sessions {
		return userErr("uid %d holds %d sessions, its limit (controller.max_sessions_per_user); end or destroy some first (a session being torn down counts until its instance is released)", req.Owner, sessions)
	}
	if req.Persistent && q.Persistent > 0 && persistent >= q.Persistent {
		return userErr("uid %d holds %d persistent instances, its limit (controller.max_persistent_per_user); destroy one first", req.Owner, persistent)
	}
	var asked uint64
	if req.Instance != nil {
		asked = req.Instance.Capacity
	}
	for _, r := range req.More {
		asked += r.Capacity
	}
	if req.Swap != nil {
		asked += req.Swap.SizePerNode * uint64(swapNodes(req))
	}
	if asked > 0 && q.Capacity > 0 && capacity+asked > q.Capacity {
		return userErr("uid %d holds %s of instances; %s more would pass its limit of %s (controller.max_capacity_per_user)",
			req.Owner, units.FormatHuman(capacity), units.FormatHuman(asked), units.FormatHuman(q.Capacity))
	}
	return nil
}

func createInstance(w *World, sess *model.Session, req InstanceRequest, ids IDSource, p Params, now time.Time) error {
	if err := checkInstance(req, sess.Persistent, p); err != nil {
		return err
	}
	typ := orDefault(req.Type, model.TypeScratch)
	var cache *model.CacheSettings
	if typ == model.TypeCache {
		cache = cacheSettings(*req.Cache, p.Cache.Defaults)
	}
	inst, frags, err := placeInstance(w, sess, req, "", ids, p, now)
	if err != nil {
		return err
	}
	modes := req.AccessModes
	if len(modes) == 0 {
		modes = []string{model.AccessStriped}
	}
	mfc := req.MaxFilesCreated
	if mfc == 0 {
		mfc = p.Limits.FilesCreated
	}
	seen := map[string]bool{}
	for _, mode := range modes {
		if seen[mode] { // two configurations would share one mount path
			return userErr("access_mode %s is given twice; give each access mode once", mode)
		}
		seen[mode] = true
		c := &model.Configuration{
			InstanceID: inst.ID, Type: typ, AccessMode: mode, Cache: cache,
			RootPermissions: DefaultRootPermissions(sess), Owner: sess.Owner, Group: sess.Group,
			MaxFileSize: req.MaxFileSize, ClientCache: req.ClientCache, State: model.Created(),
			MaxFilesCreated: mfc,
			MaxMDS:          req.MaxMDS && mode == model.AccessStriped && len(frags) > 1,
		}
		if cache != nil {
			c.BackingPath = cache.PFS
		}
		if err := addConfiguration(w, sess, c, frags, ids); err != nil {
			return err
		}
	}
	return nil
}

// DefaultRootPermissions is the mode of an instance's root when its configuration does not
// set one: a job's files are its user's alone, even on shared compute nodes (0700); a
// persistent instance is shared by its owner's jobs, and the owner may chmod (0755).
func DefaultRootPermissions(sess *model.Session) uint32 {
	if sess.Persistent {
		return 0o755
	}
	return 0o700
}

// placeInstance places an instance of req's capacity in req's pool for sess and records it
// and its fragments (no configuration yet); label "" is DataWarp's I<id>-0, or the name of
// a persistent instance.
func placeInstance(w *World, sess *model.Session, req InstanceRequest, label string, ids IDSource, p Params, now time.Time) (*model.Instance, []*model.Fragment, error) {
	return placeInstanceIn(w, sess, req, label, 1, ids, p, now)
}

// placeInstanceIn is placeInstance with fragments of whole units of unit grains: a swap
// instance's fragments each hold whole swap areas (a file is never split over fragments).
func placeInstanceIn(w *World, sess *model.Session, req InstanceRequest, label string, unit uint64, ids IDSource, p Params, now time.Time) (*model.Instance, []*model.Fragment, error) {
	pool := w.Pools[req.Pool]
	if pool == nil {
		var names []string
		for n := range w.Pools {
			names = append(names, n)
		}
		return nil, nil, userErr("pool %q does not exist; pools: %s", req.Pool, strings.Join(sortedStrings(names), ", "))
	}
	grains := units.Grains(req.Capacity, pool.Granularity)
	var candidates []alloc.Node
	for _, name := range w.NodeNames() {
		n := w.Nodes[name]
		if n.Pool != req.Pool {
			continue
		}
		u := w.UsageOfNode(name)
		total, used := u.Grains, u.Used
		if unit > 1 { // counted in units: a node offers the whole units its free grains hold
			free := uint64(0)
			if total > used {
				free = total - used
			}
			used = units.Grains(used, unit)
			total = used + free/unit
		}
		candidates = append(candidates, alloc.Node{Name: name, Grains: total, Used: used, Instances: u.Instances, Online: n.Online, Drain: n.Drain, Worn: n.Worn})
	}
	placements, err := alloc.Place(candidates, grains/max(unit, 1), req.Strategy)
	for i := range placements {
		placements[i].Grains *= max(unit, 1)
	}
	if err != nil {
		var ie *alloc.InsufficientError
		if errors.As(err, &ie) {
			return nil, nil, userErr("pool %s cannot hold %s (%s of %s): %s; %s free in the pool",
				req.Pool, units.FormatHuman(req.Capacity), alloc.Grains(grains), units.FormatHuman(pool.Granularity), ie.Error(),
				units.FormatHuman(w.UsageOfPool(req.Pool).Free*pool.Granularity))
		}
		return nil, nil, userErr("pool %s: %v", req.Pool, err)
	}
	iid, err := ids.NewID(KindInstance)
	if err != nil {
		return nil, nil, err
	}
	inst := &model.Instance{
		ID: iid, SessionID: sess.ID, Pool: req.Pool, Requested: req.Capacity,
		Capacity: grains * pool.Granularity, Grains: grains, Label: model.InstanceLabel(iid),
		Public: sess.Persistent, Strategy: orDefault(req.Strategy, alloc.Bandwidth), Created: now,
		State:                 model.Creating(),
		WriteWindowLength:     orDefault64(req.WriteWindowLength, p.Limits.windowLength()),
		WriteWindowMultiplier: orDefault64(req.WriteWindowMultiplier, p.Limits.Multiplier),
	}
	switch {
	case label != "":
		inst.Label = label
	case sess.Persistent:
		inst.Label = sess.Token
	}
	w.put(inst)
	var frags []*model.Fragment
	for _, pl := range placements {
		fid, err := ids.NewID(KindFragment)
		if err != nil {
			return nil, nil, err
		}
		f := &model.Fragment{ID: fid, InstanceID: iid, Node: pl.Node, Grains: pl.Grains, Capacity: pl.Grains * pool.Granularity, State: model.Creating()}
		w.put(f)
		frags = append(frags, f)
	}
	return inst, frags, nil
}

// addConfiguration records configuration c (its ID given here) of an instance whose
// fragments are frags, its namespaces and, for a job, its registration.
func addConfiguration(w *World, sess *model.Session, c *model.Configuration, frags []*model.Fragment, ids IDSource) error {
	mode := c.AccessMode
	if mode != model.AccessStriped && mode != model.AccessPrivate && mode != model.AccessLoadbalance {
		return userErr("access_mode=%s: expected striped, private or loadbalance", mode)
	}
	if len(frags) == 0 {
		return userErr("instance %d has no fragments", c.InstanceID)
	}
	cid, err := ids.NewID(KindConfiguration)
	if err != nil {
		return err
	}
	c.ID = cid
	w.put(c)
	switch {
	case mode == model.AccessPrivate: // private namespaces are made per compute node at pre_run
	case mode == model.AccessLoadbalance && len(frags) > 1, c.MaxMDS:
		// Loadbalance: a replica on every server; each stages in its own copy, each compute
		// node reads one. max_mds: a shard of the one namespace on every server, in
		// fragment order (the first is the one staging and the mount orders name).
		for _, f := range frags {
			if err := addNamespace(w, c, f, "", ids); err != nil {
				return err
			}
		}
	default:
		if err := addNamespace(w, c, frags[0], "", ids); err != nil {
			return err
		}
	}
	if !sess.Persistent {
		return addRegistration(w, sess, c, ids)
	}
	return nil
}

func addNamespace(w *World, c *model.Configuration, mds *model.Fragment, node string, ids IDSource) error {
	nid, err := ids.NewID(KindNamespace)
	if err != nil {
		return err
	}
	w.put(&model.Namespace{ID: nid, ConfigurationID: c.ID, FragmentID: mds.ID, ClientNode: node, State: model.Creating()})
	return nil
}

// spreadIndex maps a compute node to one of n servers: deterministic, and even over many nodes.
func spreadIndex(node string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(node))
	return int(h.Sum32() % uint32(n))
}

func addRegistration(w *World, s *model.Session, c *model.Configuration, ids IDSource) error {
	rid, err := ids.NewID(KindRegistration)
	if err != nil {
		return err
	}
	w.put(&model.Registration{ID: rid, SessionID: s.ID, ConfigurationID: c.ID, Wait: true, State: model.Created()})
	return nil
}

// liveSession finds a session that may take a lifecycle request.
func liveSession(w *World, token, step string) (*model.Session, error) {
	s := w.SessionByToken(token)
	if s == nil {
		return nil, ErrNoSession
	}
	if s.State.Goal == model.GoalDestroy {
		return nil, userErr("%s: %q is being torn down", step, token)
	}
	return s, nil
}

// ApplyStages adds stage-in (direction in) or stage-out (out) requests to a session. Asking
// again for a stage that exists keeps it; a failed one is retried.
func ApplyStages(w *World, token, direction string, reqs []StageRequest, ids IDSource, now time.Time) error {
	step := PhaseDataIn
	if direction == model.StageOut {
		step = PhaseDataOut
	}
	s, err := liveSession(w, token, step)
	if err != nil {
		return err
	}
	if err := addStages(w, s, direction, reqs, ids, model.StagePending); err != nil {
		return err
	}
	if direction == model.StageOut {
		activateAtJobEnd(w, s)
	}
	s.Phase = step
	s.Failure = ""
	w.put(s)
	return nil
}

// addStages creates the session's stages for reqs with the given status (pending: run now;
// deferred: stage-outs registered at setup), or, for a stage that exists already, makes a
// failed, canceled or deferred one pending again when status is pending. Its work is linear
// in the requests and the session's stages: each variable is resolved once, and the
// session's stages are found through a map built once (a world's lookups may cost the whole
// world after each change).
func addStages(w *World, s *model.Session, direction string, reqs []StageRequest, ids IDSource, status string) error {
	step := PhaseDataIn
	if direction == model.StageOut {
		step = PhaseDataOut
	}
	type target struct {
		config *model.Configuration
		ns     []*model.Namespace
	}
	configs := map[string]*model.Configuration{} // by variable; "" the list target
	namespaces := map[ID]*model.Namespace{}      // by configuration
	mounted := len(w.ActivationsOf(s.ID)) > 0
	if err := CheckStageRequests(direction, reqs); err != nil {
		return err
	}
	var resolved []target
	for _, r := range reqs {
		key := r.DWVar
		if r.Type == model.StageList && r.DWVar == "" {
			key = ""
		}
		cfg := configs[key]
		if cfg == nil {
			if key == "" {
				// A list names its files inside the list; it stages into the job's striped namespace
				// or the first persistent one when the job has no instance of its own.
				cfg = listTarget(w, s)
				if cfg == nil {
					return userErr("%s line %d: type=list needs a striped instance (#DW jobdw access_mode=striped or #DW persistentdw)", step, r.Line)
				}
			} else {
				var err error
				if cfg, err = configForVar(w, s, r.DWVar); err != nil {
					return userErr("%s line %d: %v", step, r.Line, err)
				}
			}
			configs[key] = cfg
		}
		if cfg.AccessMode == model.AccessLoadbalance && direction == model.StageIn && mounted {
			return userErr("%s line %d: a loadbalance instance is read-only once mounted; stage in before the job starts", step, r.Line)
		}
		ns, ok := namespaces[cfg.ID]
		if !ok {
			ns = w.NamespaceFor(cfg, "")
			namespaces[cfg.ID] = ns
		}
		if ns == nil {
			return userErr("%s line %d: the instance has no namespace to stage into", step, r.Line)
		}
		nss := []*model.Namespace{ns}
		if cfg.AccessMode == model.AccessLoadbalance && direction == model.StageIn {
			nss = w.NamespacesOf(cfg.ID) // every replica, each staged by its own server
		}
		resolved = append(resolved, target{cfg, nss})
	}
	existing := map[stageKey]*model.Stage{} // the newest of each
	for _, st := range w.StagesOf(s.ID) {
		existing[stageKey{st.Direction, st.Type, st.PFSPath, st.DWPath, st.NamespaceID}] = st
	}
	for i, r := range reqs {
		for _, ns := range resolved[i].ns {
			if err := addStage(w, s, existing, direction, r, resolved[i].config, ns, ids, status); err != nil {
				return err
			}
		}
	}
	return nil
}

// CheckStageRequests checks the paths of stage requests (direction in: data_in, out:
// data_out and a setup's stage-outs) on their own, before any state is read.
func CheckStageRequests(direction string, reqs []StageRequest) error {
	step := PhaseDataIn
	if direction == model.StageOut {
		step = PhaseDataOut
	}
	for _, r := range reqs {
		if !path.IsAbs(r.PFSPath) {
			return userErr("%s line %d: %q is not an absolute path", step, r.Line, r.PFSPath)
		}
		if r.Type != model.StageList && (r.DWPath == "" || !strings.HasPrefix(r.DWPath, "/") || path.Clean(r.DWPath) != r.DWPath && path.Clean(r.DWPath)+"/" != r.DWPath) {
			return userErr("%s line %d: instance path %q must start with / and must not contain . or .. components", step, r.Line, r.DWPath)
		}
	}
	return nil
}

// stageKey is what makes a stage request the same as an existing stage.
type stageKey struct {
	direction, typ, pfsPath, dwPath string
	namespace                       ID
}

// addStage creates one stage of a request into namespace ns, or retries the existing one.
func addStage(w *World, s *model.Session, existing map[stageKey]*model.Stage, direction string, r StageRequest,
	config *model.Configuration, ns *model.Namespace, ids IDSource, status string) error {
	found := existing[stageKey{direction, r.Type, r.PFSPath, dwPathOf(r), ns.ID}]
	if found != nil {
		again := found.Status == model.StageFailed || found.Status == model.StageCanceled || found.Status == model.StageDeferred
		if again && status == model.StagePending {
			found.Status, found.Error, found.Attempts = model.StagePending, "", 0
			found.FilesDone, found.BytesDone = 0, 0
			found.State = model.Creating()
			w.put(found)
		}
		return nil
	}
	id, err := ids.NewID(KindStage)
	if err != nil {
		return err
	}
	w.put(&model.Stage{
		ID: id, SessionID: s.ID, ConfigurationID: config.ID, NamespaceID: ns.ID,
		Direction: direction, Type: r.Type, PFSPath: r.PFSPath, DWPath: dwPathOf(r),
		Line: r.Line, Status: status, State: model.Creating(),
	})
	return nil
}

// dwPathOf writes a stage's DW path the way the stage worker resolves it: "$VAR/rest"; empty
// for a list, whose lines carry their own paths.
func dwPathOf(r StageRequest) string {
	if r.DWVar == "" || r.Type == model.StageList {
		return ""
	}
	return "$" + r.DWVar + r.DWPath
}

func listTarget(w *World, s *model.Session) *model.Configuration {
	scratch := func(c *model.Configuration) bool { return c != nil && c.Type != model.TypeCache } // a cache is never staged
	for _, inst := range w.InstancesOf(s.ID) {
		if c := w.ConfigurationByMode(inst.ID, model.AccessStriped); scratch(c) {
			return c
		}
		if c := w.ConfigurationByMode(inst.ID, model.AccessLoadbalance); scratch(c) {
			return c
		}
	}
	for _, name := range s.Uses {
		if ps := w.PersistentByName(name); ps != nil {
			if inst := w.InstanceOf(ps.ID); inst != nil {
				if c := w.ConfigurationByMode(inst.ID, model.AccessStriped); scratch(c) {
					return c
				}
			}
		}
	}
	return nil
}

// configForVar resolves a DW variable to the configuration it names for this session; a
// cache configuration is never staged (it reads and writes its PFS directory itself).
func configForVar(w *World, s *model.Session, v string) (*model.Configuration, error) {
	c, err := configForVarAny(w, s, v)
	if err == nil && c.Type == model.TypeCache {
		return nil, fmt.Errorf("$%s: the instance is type=cache, which is not staged: it reads and writes its pfs= directory itself; stage into a scratch instance", v)
	}
	return c, err
}

func configForVarAny(w *World, s *model.Session, v string) (*model.Configuration, error) {
	switch {
	case v == directive.VarJobStripedCache || v == directive.VarJobLoadbalanceCache || directive.IsPersistentCacheVar(v):
		return nil, fmt.Errorf("$%s: a cache instance is not staged: it reads and writes its pfs= directory itself; stage into a scratch instance", v)
	case v == VarJobStriped || v == VarJobLoadbalance || v == VarJobPrivate:
		if v == VarJobPrivate {
			return nil, fmt.Errorf("$%s: staging is not supported for access_mode=private (by design in DataWarp); use access_mode=striped,private and stage through $%s", v, VarJobStriped)
		}
		mode := model.AccessStriped
		if v == VarJobLoadbalance {
			mode = model.AccessLoadbalance
		}
		insts := w.InstancesOf(s.ID)
		if len(insts) == 0 {
			return nil, fmt.Errorf("$%s: the job has no #DW jobdw instance", v)
		}
		// The job's scratch instance: with a scratch and a cache, $DW_JOB_STRIPED is the
		// scratch one's (the cache's is $DW_JOB_STRIPED_CACHE).
		var found *model.Configuration
		for _, inst := range insts {
			if c := w.ConfigurationByMode(inst.ID, mode); c != nil && (found == nil || found.Type == model.TypeCache) {
				found = c
			}
		}
		if found == nil {
			return nil, fmt.Errorf("$%s: the job's instance has no access_mode=%s", v, mode)
		}
		return found, nil
	case strings.HasPrefix(v, VarPersistentPre):
		name := strings.TrimPrefix(v, VarPersistentPre)
		if !contains(s.Uses, name) && !(s.Persistent && s.Token == name) {
			return nil, fmt.Errorf("$%s: the job has no #DW persistentdw name=%s", v, name)
		}
		ps := w.PersistentByName(name)
		if ps == nil {
			return nil, fmt.Errorf("$%s: persistent instance %s does not exist", v, name)
		}
		inst := w.InstanceOf(ps.ID)
		if inst == nil {
			return nil, fmt.Errorf("$%s: persistent instance %s has no capacity", v, name)
		}
		if c := w.ConfigurationByMode(inst.ID, model.AccessStriped); c != nil {
			return c, nil
		}
		return nil, fmt.Errorf("$%s: persistent instance %s is not striped", v, name)
	}
	return nil, fmt.Errorf("unknown variable $%s; expected $%s, $%s or $%s<name>", v, VarJobStriped, VarJobLoadbalance, VarPersistentPre)
}

// MountPath is where a configuration appears on a compute node, DataWarp's way:
// <root>/<token>_striped_scratch, and <root>/<name>_<job>_striped_scratch for a persistent
// instance used by a job.
func MountPath(root string, job *model.Session, owner *model.Session, c *model.Configuration) string {
	base := job.Token
	if owner.ID != job.ID {
		base = owner.Token + "_" + job.Token
	}
	return path.Join(root, fmt.Sprintf("%s_%s_%s", base, c.AccessMode, c.Type))
}

// Exposure is one configuration a job sees, and the variable that names it.
type Exposure struct {
	Var    string
	Config *model.Configuration
	Owner  *model.Session // the session owning the instance (the job or a persistent one)
}

// Exposures lists what a job sees: its own configurations and the striped configuration of
// every persistent instance it uses.
func Exposures(w *World, s *model.Session) []Exposure {
	var out []Exposure
	for _, inst := range w.InstancesOf(s.ID) {
		for _, c := range w.ConfigurationsOf(inst.ID) {
			if v := JobVar(c); v != "" {
				out = append(out, Exposure{Var: v, Config: c, Owner: s})
			}
		}
	}
	for _, name := range s.Uses {
		ps := w.PersistentByName(name)
		if ps == nil {
			continue
		}
		if inst := w.InstanceOf(ps.ID); inst != nil {
			if c := w.ConfigurationByMode(inst.ID, model.AccessStriped); c != nil && c.Type != model.TypeCache {
				out = append(out, Exposure{Var: VarPersistentPre + name, Config: c, Owner: ps})
			}
			// A persistent cache: each of its access modes (striped, loadbalance).
			for _, c := range w.ConfigurationsOf(inst.ID) {
				if c.Type == model.TypeCache {
					if v := directive.PersistentCacheVar(name, c.AccessMode); v != "" {
						out = append(out, Exposure{Var: v, Config: c, Owner: ps})
					}
				}
			}
		}
	}
	return out
}

// JobVar is the variable naming a job's own configuration c: DW_JOB_STRIPED, DW_JOB_PRIVATE,
// DW_JOB_LDBAL for scratch; DW_JOB_STRIPED_CACHE, DW_JOB_LDBAL_CACHE for cache.
func JobVar(c *model.Configuration) string {
	if c.Type == model.TypeCache {
		return map[string]string{model.AccessStriped: directive.VarJobStripedCache, model.AccessLoadbalance: directive.VarJobLoadbalanceCache}[c.AccessMode]
	}
	return map[string]string{model.AccessStriped: VarJobStriped, model.AccessPrivate: VarJobPrivate, model.AccessLoadbalance: VarJobLoadbalance}[c.AccessMode]
}

// Paths returns the job's environment: each variable and its mount path, ending in "/".
func Paths(w *World, token, root string) (map[string]string, error) {
	s := w.SessionByToken(token)
	if s == nil {
		return nil, ErrNoSession
	}
	env := map[string]string{}
	for _, e := range Exposures(w, s) {
		env[e.Var] = MountPath(root, s, e.Owner, e.Config) + "/"
	}
	return env, nil
}

// ApplyPreRun mounts every configuration the job sees on every compute node.
func ApplyPreRun(w *World, token string, nodes []string, ids IDSource, p Params) error {
	s, err := liveSession(w, token, PhasePreRun)
	if err != nil {
		return err
	}
	if len(nodes) == 0 {
		nodes = s.ClientNodes
	}
	if len(nodes) == 0 {
		return userErr("pre_run %s: no compute nodes given", token)
	}
	for _, node := range nodes {
		if _, ok := w.Nodes[node]; !ok {
			return userErr("pre_run %s: compute node %q has no Spillway agent registered (start `spillway agent` there)", token, node)
		}
	}
	// What each node needs is found through maps built once per request (the session's
	// activations, each configuration's namespaces by client node): the work is linear in
	// the nodes, however many the job runs on.
	mounted := map[mountKey]bool{}
	for _, a := range w.ActivationsOf(s.ID) {
		mounted[mountKey{a.ConfigurationID, a.Node}] = true
	}
	for _, e := range Exposures(w, s) {
		if err := activate(w, s, e.Config, nodes, MountPath(p.MountRoot, s, e.Owner, e.Config), mounted, ids, "pre_run "+token); err != nil {
			return err
		}
	}
	if c := swapConfigOf(w, s); c != nil { // each node's swap area (swap.go)
		if err := activateSwap(w, s, c, nodes, ids, "pre_run "+token); err != nil {
			return err
		}
	}
	s.ClientNodes = nodes
	s.Phase = PhasePreRun
	s.Failure = ""
	w.put(s)
	return nil
}

// mountKey is a configuration mounted on a node.
type mountKey struct {
	config ID
	node   string
}

// activate records the activations of configuration c on nodes at mountPath for session s,
// but those mounted says exist (it is kept up to date); a private configuration gets each
// node's namespace here. what prefixes its errors.
func activate(w *World, s *model.Session, c *model.Configuration, nodes []string, mountPath string, mounted map[mountKey]bool, ids IDSource, what string) error {
	nss := w.NamespacesOf(c.ID)
	private := map[string]*model.Namespace{} // by client node, the first of each
	for i := len(nss) - 1; i >= 0; i-- {
		private[nss[i].ClientNode] = nss[i]
	}
	var frags []*model.Fragment
	for _, node := range nodes {
		ns := namespaceIn(c, nss, private, node)
		if ns == nil && c.AccessMode == model.AccessPrivate {
			if frags == nil {
				frags = w.FragmentsOf(c.InstanceID)
			}
			if len(frags) == 0 {
				return userErr("%s: instance has no fragments", what)
			}
			// Each compute node's private namespace has its own metadata server, spread over
			// the instance's servers by the node's name; its data is striped over all.
			nid, err := ids.NewID(KindNamespace)
			if err != nil {
				return err
			}
			ns = &model.Namespace{ID: nid, ConfigurationID: c.ID, FragmentID: frags[spreadIndex(node, len(frags))].ID, ClientNode: node, State: model.Creating()}
			w.put(ns)
			private[node] = ns
		}
		if ns == nil {
			return fmt.Errorf("%s: configuration %d has no namespace", what, c.ID)
		}
		if mounted[mountKey{c.ID, node}] {
			continue
		}
		aid, err := ids.NewID(KindActivation)
		if err != nil {
			return err
		}
		w.put(&model.Activation{
			ID: aid, SessionID: s.ID, ConfigurationID: c.ID, NamespaceID: ns.ID, Node: node,
			MountPath: mountPath, ReadOnly: c.AccessMode == model.AccessLoadbalance, State: model.Creating(),
		})
		mounted[mountKey{c.ID, node}] = true
	}
	return nil
}

// namespaceIn is NamespaceFor over the configuration's namespaces nss (in id order) and its
// private ones by client node.
func namespaceIn(c *model.Configuration, nss []*model.Namespace, private map[string]*model.Namespace, node string) *model.Namespace {
	switch {
	case c.AccessMode == model.AccessPrivate:
		return private[node]
	case c.AccessMode == model.AccessLoadbalance && len(nss) > 1:
		if node == "" {
			return nss[0]
		}
		return nss[spreadIndex(node, len(nss))]
	case len(nss) > 0:
		return nss[0]
	}
	return nil
}

// ApplyPostRun unmounts the job's configurations from its compute nodes.
func ApplyPostRun(w *World, token string) error {
	s, err := liveSession(w, token, PhasePostRun)
	if err != nil {
		return err
	}
	for _, a := range w.ActivationsOf(s.ID) {
		if a.State.Goal != model.GoalDestroy {
			a.State = model.Destroying()
			w.put(a)
		}
	}
	// The job has ended: its DW_STAGE_AT_JOB_END stage-outs start now (their worker reads the
	// namespace itself, not this mount).
	activateAtJobEnd(w, s)
	s.Phase = PhasePostRun
	s.Failure = ""
	w.put(s)
	return nil
}

// ApplyTeardown destroys a session. Without hurry it first lets the session's stage-outs
// finish (unless every registration was released with --no-wait); with hurry they are cancelled.
func ApplyTeardown(w *World, token string, hurry bool) error {
	s := w.SessionByToken(token)
	if s == nil {
		return ErrNoSession
	}
	if s.Persistent {
		users := usersOf(w, s)
		if len(users) > 0 && !hurry {
			return userErr("persistent instance %s is in use by job(s) %s; destroy it after they end, or with hurry "+
				"(spillway persistent destroy %s --hurry, dwcli rm session --hurry), which unmounts it from those jobs",
				s.Token, strings.Join(users, ", "), s.Token)
		}
		if len(users) > 0 {
			detachPersistent(w, s)
		}
	}
	if !hurry && !s.Hurry {
		if kept := unfinishedStageOuts(w, s); len(kept) > 0 {
			return userErr("session %s keeps its instance: %s; stage them out (spillway run --retry-stage-out %s, or data_out again) "+
				"or tear down with hurry to discard the results", s.Token, strings.Join(kept, "; "), s.Token)
		}
	}
	if s.State.Goal != model.GoalDestroy {
		s.State = model.Destroying()
	}
	// A cache flush that failed and undid the previous teardown is tried again (the PFS
	// may be fixed), or its data discarded with hurry (flush.go).
	for _, inst := range w.InstancesOf(s.ID) {
		for _, f := range w.FragmentsOf(inst.ID) {
			if f.CacheFlushError != "" {
				f.CacheFlushError = ""
				w.put(f)
				s.Failure = ""
			}
		}
	}
	s.Hurry = s.Hurry || hurry
	s.Phase = PhaseTeardown
	w.put(s)
	return nil
}

// usersOf lists the other sessions that use a persistent session's instance.
// detachPersistent takes a persistent instance away from the jobs using it (a hurried destroy
// by its owner or an administrator: another user's job must not keep it for ever). Their
// mounts of it are removed, their pending stages into it fail, and their paths no longer name
// it; the instance itself is destroyed once those mounts are gone (stepTeardown waits).
func detachPersistent(w *World, ps *model.Session) {
	inst := w.InstanceOf(ps.ID)
	for _, s := range w.SortedSessions() {
		if s.ID == ps.ID || !contains(s.Uses, ps.Token) {
			continue
		}
		var uses []string
		for _, u := range s.Uses {
			if u != ps.Token {
				uses = append(uses, u)
			}
		}
		s.Uses = uses
		w.put(s)
		if inst == nil {
			continue
		}
		for _, a := range w.ActivationsOf(s.ID) {
			if c := w.Configurations[a.ConfigurationID]; c != nil && c.InstanceID == inst.ID && a.State.Goal != model.GoalDestroy {
				a.State = model.Destroying()
				w.put(a)
			}
		}
		for _, st := range w.StagesOf(s.ID) {
			ns := w.Namespaces[st.NamespaceID]
			if st.Status != model.StagePending || ns == nil {
				continue
			}
			if c := w.Configurations[ns.ConfigurationID]; c != nil && c.InstanceID == inst.ID {
				st.Status, st.Error = model.StageFailed, "persistent instance "+ps.Token+" was destroyed with hurry by its owner or an administrator"
				w.put(st)
			}
		}
	}
}

// mountedElsewhere reports whether another session still has the instance mounted (a job
// that used a persistent instance destroyed with hurry, until its unmount is done).
func mountedElsewhere(w *World, s *model.Session, inst *model.Instance) bool {
	for _, a := range w.Activations {
		if a.SessionID == s.ID {
			continue
		}
		if c := w.Configurations[a.ConfigurationID]; c != nil && c.InstanceID == inst.ID {
			return true
		}
	}
	return false
}

// unfinishedStageOuts describes the session's stage-outs that would be lost by releasing its
// instance: never run (deferred: data_out never came), failed or canceled, on a configuration
// whose registration waits for them (dwcli update registration --no-wait lets one go).
func unfinishedStageOuts(w *World, s *model.Session) []string {
	var out []string
	for _, st := range w.StagesOf(s.ID) {
		if st.Direction != model.StageOut || !registrationWaits(w, s, st) {
			continue
		}
		if !holdsInstance(st) {
			continue
		}
		switch st.Status {
		case model.StageDeferred:
			out = append(out, fmt.Sprintf("%s %s -> %s was never run", stageLabel(st), sourceOf(st), destOf(st)))
		case model.StageFailed, model.StageCanceled:
			out = append(out, fmt.Sprintf("%s %s -> %s %s: %s", stageLabel(st), sourceOf(st), destOf(st), st.Status, st.Error))
		}
	}
	return out
}

// registrationWaits reports whether the session's teardown waits for the stage's
// configuration (its registration's wait flag).
func registrationWaits(w *World, s *model.Session, st *model.Stage) bool {
	for _, r := range w.RegistrationsOf(s.ID) {
		if r.ConfigurationID == st.ConfigurationID && r.Wait {
			return true
		}
	}
	return false
}

func usersOf(w *World, ps *model.Session) []string {
	var users []string
	for _, s := range w.SortedSessions() {
		if s.ID != ps.ID && contains(s.Uses, ps.Token) {
			users = append(users, s.Token)
		}
	}
	return users
}

// ReleaseRegistration clears a registration's wait flag (dwcli update registration --no-wait).
func ReleaseRegistration(w *World, id ID) error {
	r := w.Registrations[id]
	if r == nil {
		return userErr("registration %d does not exist", id)
	}
	r.Wait = false
	w.put(r)
	return nil
}

// SetNodeDrain drains or fills a node (UpdateNode's drain alone).
func SetNodeDrain(w *World, name string, drain bool, reason string) error {
	return UpdateNode(w, name, NodeChange{Drain: &drain, Reason: reason})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

func orDefault64(v, d int64) int64 {
	if v == 0 {
		return d
	}
	return v
}

func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// AdvanceAbandoned takes one step, as its run would have, toward the end of a `spillway run`
// session whose run is gone (killed with its node, or its lease ran out): unmount, run the
// stage-outs registered at setup, release the instance — or keep it when a stage-out fails
// (the results are its only copy). A session whose job never started is released at once.
// It reports true when nothing more is to do: released or being released, or kept (Failure
// says why).
func AdvanceAbandoned(w *World, token string) (bool, error) {
	s := w.SessionByToken(token)
	if s == nil || s.State.Goal == model.GoalDestroy {
		return true, nil
	}
	switch s.Phase {
	case PhaseSetup, PhaseDataIn:
		return true, ApplyTeardown(w, token, true) // the job never ran: nothing to keep
	}
	for _, a := range w.ActivationsOf(s.ID) {
		if a.State.Goal == model.GoalCreate {
			return false, ApplyPostRun(w, token)
		}
	}
	if len(w.ActivationsOf(s.ID)) > 0 {
		return false, nil // unmounting
	}
	var deferred, failed []*model.Stage
	for _, st := range w.StagesOf(s.ID) {
		if st.Direction != model.StageOut {
			continue
		}
		switch st.Status {
		case model.StageDeferred:
			deferred = append(deferred, st)
		case model.StagePending, model.StageRunning:
			return false, nil
		case model.StageFailed, model.StageCanceled:
			if holdsInstance(st) {
				failed = append(failed, st)
			}
		}
	}
	if len(deferred) > 0 {
		for _, st := range deferred {
			st.Status, st.State = model.StagePending, model.Creating()
			w.put(st)
		}
		s.Phase = PhaseDataOut
		w.put(s)
		return false, nil
	}
	if kept := unfinishedStageOuts(w, s); len(kept) > 0 || len(failed) > 0 {
		s.Failure = fmt.Sprintf("its spillway run is gone and its stage-out failed; the instance is kept: %s "+
			"(spillway run --retry-stage-out %s, or dwcli rm session --hurry to discard)", strings.Join(kept, "; "), s.Token)
		w.put(s)
		return true, nil
	}
	return true, ApplyTeardown(w, token, false)
}
