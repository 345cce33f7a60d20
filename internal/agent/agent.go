// Package agent is the daemon on every storage and compute node. Its storage role keeps
// fragments (a directory per fragment under the SSD path, capacity enforced), the namespaces
// inside them, serves them to other hosts' mounts (warpfs, ServeData), and runs its share of
// every stage as the job's user. Its client role makes namespaces appear at mount paths on
// compute nodes (the FUSE client of package mount): through a loopback when the namespace is
// on the same host, over the network otherwise.
//
// Every call is idempotent: the controller repeats calls after it restarts.
package agent

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/stage"
	"github.com/spillway-hpc/spillway/internal/units"
	"github.com/spillway-hpc/spillway/internal/warpfs/cachestore"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/mount"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
	"golang.org/x/sys/unix"
)

// Version is the software version agents report.
var Version = "dev"

// Options configure an agent.
type Options struct {
	Name     string // node name
	Pool     string // pool of this node's storage; "" for a compute-only node
	SSDPath  string // directory holding fragments
	Capacity uint64 // bytes offered; 0 = half the free space at first start, then fixed
	Address  string // where the controller reaches this agent ("" = in-process)
	// Warnings are configuration problems the agent started in spite of, reported in each
	// heartbeat (dwstat nodes shows them).
	Warnings    []string
	WorkerExe   []string // argv prefix of the stage worker, e.g. [/proc/self/exe stage-worker]
	StageLimits stage.Limits
	Mount       mount.Limits
	Log         *slog.Logger

	// Token is the cluster's shared secret: the data server checks it, and remote mounts
	// present it to other storage nodes.
	Token string
	// DataAddress is where other hosts reach this node's data server (ServeData); ""
	// when it serves none.
	DataAddress string
	// Warpfs and WarpfsServer bound the network data path: the client of remote mounts and
	// the data server.
	Warpfs       client.Limits
	WarpfsServer server.Limits
	// RemoteReadahead is the readahead of remote mounts, in bytes (0 = the mount's default).
	RemoteReadahead int
	// DataTLS is what storage nodes serving warpfs over TLS must prove ([tls] ca_file).
	DataTLS *tls.Config
	// FragmentFS is what a new fragment is (agent.fragment_filesystem): FragmentDirectory
	// ("" too) or FragmentXFSLoop, a file system of its own (fragfs.go).
	FragmentFS string
	// FragmentFSLimits bound mkfs.xfs and mount; zero values mean the defaults.
	FragmentFSLimits FragmentFSLimits
	// Endurance says how a storage node reads its SSD's wear (endurance.go); zero values
	// mean the defaults.
	Endurance EnduranceOptions
	// PFSWorkerExe is the argv prefix of a cache instance's PFS door worker, e.g.
	// [/proc/self/exe pfs-worker]; PFS bounds each door ([pfs]), PFSMaxWorkers the doors
	// running at once (pfs.max_workers; 0: 256).
	PFSWorkerExe  []string
	PFS           pfsio.Options
	PFSMaxWorkers int
	// Swap configures the node's swap areas on the burst buffer (swap.go).
	Swap SwapOptions
}

// Agent serves one node.
type Agent struct {
	opt      Options
	ssd      string
	capacity uint64
	root     bool

	trackers  *usage.Registry
	pfsDoors  *pfsDoors     // the doors of this node's cache instances to their PFS directories
	cacheOpen cacheStores   // the stores of this node's cache fragments
	caches    *cacheFlushes // cache fragments' stores and their teardown drains (cacheflush.go)

	dataMu sync.Mutex
	data   *server.Server // serves this node's namespaces to other hosts (ServeData), or nil

	mu     sync.Mutex
	mounts map[string]*mounted // by mount path
	// pathLocks serialize the mounts and unmounts of each mount path (lockPath).
	pathLocks map[string]*pathLock
	// unmountedAt are the paths the controller had unmounted (Unmount) and not mounted
	// again since, and when: a heartbeat's answer computed before the unmount was recorded
	// still lists the mount, and must not bring it back (Reconcile, within gc_grace).
	unmountedAt map[string]time.Time
	// heartbeatsSent counts the heartbeats sent (RunHeartbeats): an answer only speaks for
	// the mounts asked for before its heartbeat left (mounted.confirmed).
	heartbeatsSent atomic.Uint64
	stages         map[string]*stage.Run // by agentapi.StageSpec.Key
	// stagedDirs are the namespace directories each stage-in writes into directly (by key):
	// their mounts' caches are dropped when it ends (staged).
	stagedDirs map[string][]string
	// starting are the stages whose StartStage is under way (by key): closed when it returns.
	// A cancel that comes meanwhile waits for it, so that it cancels the worker the start
	// is about to run rather than find nothing.
	starting map[string]chan struct{}
	// stageIns counts the stage-ins running into each instance (by id) with a reservation
	// on its tracker: a rescan while one runs would forget what it reserved and has not
	// written yet.
	stageIns map[int64]int
	fragLock sync.Mutex // serializes fragment/namespace creation and removal
	// namespaceSweep is when Reconcile last looked for namespaces the controller forgot
	// (under fragLock).
	namespaceSweep time.Time

	quotaOnce sync.Once // logs whether fragments get project quotas (quota.go)

	swaps swapAreas // the node's swap areas (swap.go)

	// metas caches each fragment's fragment.json, read or written once (readFragment):
	// reports, usage and capacity look at every fragment's metadata, often. Filled on
	// create and first read, dropped when the fragment's storage is removed.
	metasMu sync.Mutex
	metas   map[int64]fragmentMeta
	// byInstance indexes metas by instance: an instance's fragments here are found without
	// reading the fragment directory and every fragment's metadata (a mount, a namespace's
	// removal and a fragment's deletion cost the instance's fragments, not the node's).
	// indexed: every fragment directory's metadata has been read into metas (scanFragments),
	// so the index holds every fragment of the node; a removal that fails half-way clears it
	// (its metadata may be read again from disk).
	byInstance map[int64]map[int64]struct{}
	indexed    bool

	countersMu    sync.Mutex
	counters      map[int64]*server.Fragment // the data path's counters and write window, by fragment (usage.go)
	countersSaved map[int64][]byte           // what was last saved of them

	endMu      sync.Mutex          // the SSD's wear (endurance.go) and the data-path errors
	endLast    *agentapi.Endurance // the last reading, nil before the first
	endAt      time.Time           // when it was read
	endReading bool                // a reading is under way
	dataErrors uint64              // data-path errors since the agent started
	lastError  string              // the latest of them
}

// stateFile records what the agent decided at its first start (its capacity), so that a
// restart offers the same capacity whatever the disk's free space is by then.
const stateFile = "agent.json"

type persisted struct {
	Capacity uint64 `json:"capacity"`
}

// New prepares the agent's directories.
func New(opt Options) (*Agent, error) {
	if opt.Name == "" {
		return nil, errors.New("agent: no node name")
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	a := &Agent{opt: opt, root: os.Geteuid() == 0, trackers: usage.NewRegistry(),
		mounts: map[string]*mounted{}, pathLocks: map[string]*pathLock{}, unmountedAt: map[string]time.Time{}, stages: map[string]*stage.Run{}, stagedDirs: map[string][]string{}, starting: map[string]chan struct{}{}, stageIns: map[int64]int{},
		counters: map[int64]*server.Fragment{}, countersSaved: map[int64][]byte{}, metas: map[int64]fragmentMeta{},
		cacheOpen: cacheStores{stores: map[int64]*cachestore.Store{}}, byInstance: map[int64]map[int64]struct{}{}}
	a.caches = newCacheFlushes()
	a.pfsDoors = newPFSDoors(opt.PFSWorkerExe, opt.PFS, cmp.Or(opt.PFSMaxWorkers, 256))
	if opt.Pool == "" {
		return a, nil // compute node: no storage
	}
	ssd, err := filepath.Abs(opt.SSDPath)
	if err != nil {
		return nil, err
	}
	a.ssd = ssd
	if err := os.MkdirAll(filepath.Join(ssd, "fragment"), 0o700); err != nil {
		return nil, fmt.Errorf("agent: SSD path %s: %w (set agent.ssd_path to a writable directory)", ssd, err)
	}
	// The fragments are the agent's alone: users reach their files through mounts (which count
	// capacity and keep loadbalance read-only) and stage workers (handed their namespaces as
	// open descriptors), never by path — writing there directly would bypass both.
	os.Chmod(filepath.Join(ssd, "fragment"), 0o700)
	if err := checkFragmentFS(opt.FragmentFS); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	def := DefaultFragmentFSLimits()
	if a.opt.FragmentFSLimits.Mkfs <= 0 {
		a.opt.FragmentFSLimits.Mkfs = def.Mkfs
	}
	if a.opt.FragmentFSLimits.Mount <= 0 {
		a.opt.FragmentFSLimits.Mount = def.Mount
	}
	if a.opt.Endurance.Interval <= 0 {
		a.opt.Endurance.Interval = 10 * time.Minute
	}
	if a.opt.Endurance.Timeout <= 0 {
		a.opt.Endurance.Timeout = 30 * time.Second
	}
	capacity, err := a.decideCapacity(opt.Capacity)
	if err != nil {
		return nil, err
	}
	a.capacity = capacity
	if _, err := os.Stat(a.imagesDir()); opt.FragmentFS == FragmentXFSLoop || err == nil {
		// Loop devices and mounts as root: nothing they are made from may be a user's.
		if err := a.checkOwnTree(); err != nil {
			return nil, fmt.Errorf("agent: fragment file systems: %w", err)
		}
		if !a.root {
			return nil, fmt.Errorf("agent: %s holds fragment file systems (images), which only a root agent can mount", a.imagesDir())
		}
		a.reattachFragments()
	}
	return a, nil
}

func (a *Agent) decideCapacity(configured uint64) (uint64, error) {
	path := filepath.Join(a.ssd, stateFile)
	var p persisted
	if raw, err := os.ReadFile(path); err == nil {
		json.Unmarshal(raw, &p)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(a.ssd, &st); err != nil {
		return 0, fmt.Errorf("agent: statfs %s: %w", a.ssd, err)
	}
	if size := st.Blocks * uint64(st.Frsize); configured > size {
		// Offering more than the disk holds would promise jobs space that fails with ENOSPC
		// only once they have written into it.
		return 0, fmt.Errorf("agent: agent.capacity %s is larger than the file system holding agent.ssd_path %s (%s); "+
			"set agent.capacity to at most that, or leave it unset to offer half the free space",
			units.FormatHuman(configured), a.ssd, units.FormatHuman(size))
	}
	if configured > 0 {
		p.Capacity = configured
	} else if p.Capacity == 0 {
		p.Capacity = st.Bavail * uint64(st.Bsize) / 2
		a.opt.Log.Info("offering half of the free space of the SSD path", "path", a.ssd, "capacity", units.FormatHuman(p.Capacity))
	}
	raw, _ := json.Marshal(p)
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		return 0, fmt.Errorf("agent: %s: %w", path, err)
	}
	return p.Capacity, nil
}

// Name is the node's name.
func (a *Agent) Name() string { return a.opt.Name }

// Report tells the controller about this node.
func (a *Agent) Report(ctx context.Context) (agentapi.NodeReport, error) {
	roles := []string{"client"}
	health := "ok"
	if a.opt.Pool != "" {
		roles = append([]string{"storage"}, roles...)
		var st syscall.Statfs_t
		if err := syscall.Statfs(a.ssd, &st); err != nil {
			health = "SSD path unreadable: " + err.Error()
			a.noteDataError(health)
		}
	}
	rep := agentapi.NodeReport{Name: a.opt.Name, Pool: a.opt.Pool, Capacity: a.capacity, Address: a.opt.Address,
		Roles: roles, Version: Version, Health: health, Warnings: a.opt.Warnings}
	if a.opt.Pool != "" {
		a.dataMu.Lock()
		rep.DataAddress = a.opt.DataAddress
		a.dataMu.Unlock()
		rep.Usage = a.usage()
		rep.Endurance = a.endurance()
		a.endMu.Lock()
		rep.DataErrors, rep.LastDataError = a.dataErrors, a.lastError
		a.endMu.Unlock()
	}
	if a.root {
		rep.Usage.Swaps = a.swapUsage()
	}
	return rep, nil
}

// noteDataError counts an error of the node's data path (its SSD path): the controller
// counts each toward draining the node (controller.auto_drain_failures).
func (a *Agent) noteDataError(msg string) {
	a.endMu.Lock()
	defer a.endMu.Unlock()
	a.dataErrors++
	a.lastError = msg
}

// SetDataAddress sets the address other hosts reach the data server at (reported to the
// controller, which hands it to compute nodes' mounts).
func (a *Agent) SetDataAddress(addr string) {
	a.dataMu.Lock()
	defer a.dataMu.Unlock()
	a.opt.DataAddress = addr
}

// ServeData serves this node's namespaces to the remote mounts of other hosts on l (warpfs)
// until ctx ends. Clients must present Options.Token.
func (a *Agent) ServeData(ctx context.Context, l net.Listener) error {
	if err := a.requireStorage(); err != nil {
		l.Close()
		return err
	}
	if a.opt.Token == "" {
		l.Close()
		return errors.New("agent.data_listen is set but agent.token_file is not: compute nodes could not authenticate; set both")
	}
	srv := server.New(server.Options{Token: a.opt.Token, Node: a.opt.Name, Resolve: a.resolveNamespace, Limits: a.opt.WarpfsServer, Log: a.opt.Log})
	a.dataMu.Lock()
	a.data = srv
	a.dataMu.Unlock()
	return srv.Serve(ctx, l)
}

// resolveNamespace finds the namespace (or the fragment's stripe objects) a remote mount asks
// for.
func (a *Agent) resolveNamespace(fragmentID, namespaceID, instanceID int64, stripes bool) (server.Target, error) {
	meta, err := a.readFragment(fragmentID)
	if err != nil {
		return server.Target{}, fmt.Errorf("fragment %d does not exist on %s", fragmentID, a.opt.Name)
	}
	if meta.InstanceID != instanceID {
		return server.Target{}, fmt.Errorf("fragment %d on %s belongs to instance %d, not %d", fragmentID, a.opt.Name, meta.InstanceID, instanceID)
	}
	dir := a.namespaceDir(fragmentID, namespaceID)
	if stripes {
		dir = a.stripesDir(fragmentID)
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return server.Target{}, fmt.Errorf("stripes of fragment %d on %s: %v", fragmentID, a.opt.Name, err)
		}
	}
	if _, err := os.Stat(dir); err != nil {
		return server.Target{}, fmt.Errorf("namespace %d is missing on %s", namespaceID, a.opt.Name)
	}
	t, err := a.tracker(instanceID)
	if err != nil {
		return server.Target{}, err
	}
	counters, err := a.fragmentCounters(fragmentID)
	if err != nil {
		return server.Target{}, err
	}
	var cacheTarget *server.CacheTarget
	if meta.Cache != nil {
		if cacheTarget, err = a.cacheTarget(*meta); err != nil {
			return server.Target{}, err
		}
	}
	// statfs of remote mounts then counts what co-located mounts wrote through the kernel.
	return server.Target{Dir: dir, Tracker: t, ProjectQuota: a.fragmentQuota(fragmentID), FragmentDevice: a.fragmentDevice(fragmentID),
		Fragment: counters, Cache: cacheTarget}, nil
}

func (a *Agent) fragmentDir(id int64) string {
	return filepath.Join(a.ssd, "fragment", strconv.FormatInt(id, 10))
}

// stripesDir holds a fragment's stripe objects: the data of a striped instance's files on
// this node, one object per file (package warpfs/stripe), reachable by root alone.
func (a *Agent) stripesDir(fragmentID int64) string {
	return filepath.Join(a.fragmentDir(fragmentID), "stripes")
}

func (a *Agent) namespaceDir(fragmentID, id int64) string {
	return filepath.Join(a.fragmentDir(fragmentID), "namespace", strconv.FormatInt(id, 10))
}

func (a *Agent) requireStorage() error {
	if a.ssd == "" {
		return fmt.Errorf("node %s has no storage role (agent.pool is empty)", a.opt.Name)
	}
	return nil
}

type fragmentMeta struct {
	ID               int64  `json:"id"`
	InstanceID       int64  `json:"instance"`
	Capacity         uint64 `json:"capacity"`
	InstanceCapacity uint64 `json:"instance_capacity"`
	// The write window (agentapi.FragmentSpec): WriteLimit bytes per WriteWindowLength
	// seconds; 0: none.
	WriteLimit        uint64 `json:"write_limit,omitempty"`
	WriteWindowLength int64  `json:"write_window_length,omitempty"`
	Job               string `json:"job,omitempty"` // the session's token, for the log
	// Cache: the fragment belongs to a cache instance, and this is what it caches.
	Cache       *agentapi.CacheSpec `json:"cache,omitempty"`
	StripeIndex int                 `json:"stripe_index,omitempty"` // its place in the cache's layout
}

// CreateFragment makes the fragment's directory, or its file system mounted there
// (agent.fragment_filesystem = "xfs-loop").
func (a *Agent) CreateFragment(ctx context.Context, spec agentapi.FragmentSpec) error {
	if err := a.requireStorage(); err != nil {
		return err
	}
	a.fragLock.Lock()
	defer a.fragLock.Unlock()
	dir := a.fragmentDir(spec.ID)
	limited := false
	if a.opt.FragmentFS == FragmentXFSLoop && spec.Capacity > 0 && !a.directoryFragment(spec.ID) {
		// The file system before anything inside: it holds the fragment to its capacity.
		if err := a.makeFragmentFS(spec.ID, spec.Capacity); err != nil {
			return fmt.Errorf("create fragment %d: its file system: %w", spec.ID, err)
		}
	} else {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return fmt.Errorf("create fragment %d: %w", spec.ID, err)
		}
		// The quota before anything inside: what is created below inherits its project.
		limited = a.limitFragment(dir, spec)
	}
	// fresh: no earlier try got as far as the metadata (looked for once the fragment's file
	// system is mounted), so no counters were ever saved.
	_, err := os.Lstat(filepath.Join(dir, "fragment.json"))
	fresh := errors.Is(err, os.ErrNotExist)
	for _, sub := range []struct {
		name string
		mode os.FileMode
	}{{"namespace", 0o711}, {"stripes", 0o700}} {
		p := filepath.Join(dir, sub.name)
		if err := os.Mkdir(p, sub.mode); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create fragment %d: %w", spec.ID, err)
		}
		if limited { // made by an earlier try, before the quota
			fd, err := openOwnDir(p)
			if err == nil {
				err = usage.SetProjectOf(fd, usage.ProjectID(spec.ID))
				unix.Close(fd)
			}
			if err != nil {
				return fmt.Errorf("create fragment %d: %s: %w", spec.ID, p, err)
			}
		}
	}
	meta := fragmentMeta{ID: spec.ID, InstanceID: spec.InstanceID, Capacity: spec.Capacity, InstanceCapacity: spec.InstanceCapacity,
		WriteLimit: spec.WriteLimit, WriteWindowLength: spec.WriteWindowLength, Job: spec.Job, Cache: spec.Cache,
		StripeIndex: spec.StripeIndex}
	raw, _ := json.Marshal(meta)
	if err := writeFileAtomic(filepath.Join(dir, "fragment.json"), raw); err != nil {
		return fmt.Errorf("create fragment %d: %w", spec.ID, err)
	}
	a.cacheFragment(meta)
	a.newFragmentCounters(meta, fresh)
	return nil
}

// DeleteFragment removes the fragment and everything in it.
func (a *Agent) DeleteFragment(ctx context.Context, id int64) error {
	if err := a.requireStorage(); err != nil {
		return err
	}
	a.fragLock.Lock()
	defer a.fragLock.Unlock()
	meta, _ := a.readFragment(id)
	if meta != nil {
		// This node's staging mounts of the instance (a split stage's copy step mounts the
		// namespace on every server) go with its fragment.
		if err := a.unmountStaging(ctx, meta.InstanceID); err != nil {
			return fmt.Errorf("delete fragment %d: %w", id, err)
		}
	}
	// Its store is closed first (teardown flushed it), its PFS doors with the last.
	a.forgetCache(id)
	if meta != nil {
		a.closeCacheStore(meta)
	}
	if err := a.removeFragmentStorage(id); err != nil {
		return fmt.Errorf("delete fragment %d: %w", id, err)
	}
	a.unlimitFragment(id)
	a.forgetCounters(id)
	if meta != nil {
		a.forgetTrackerIfUnused(meta.InstanceID)
	}
	return nil
}

// directoryFragment says whether fragment id is a directory made before the node made file
// systems of fragments: it stays one.
func (a *Agent) directoryFragment(id int64) bool {
	if a.hasImage(id) {
		return false
	}
	_, err := os.Lstat(filepath.Join(a.fragmentDir(id), "fragment.json"))
	return err == nil
}

// removeFragmentStorage removes a fragment: its file system (unmounted, detached, its image
// removed), then its directory.
func (a *Agent) removeFragmentStorage(id int64) (err error) {
	a.uncacheFragment(id) // before: a removal that fails half-way is read again from disk
	defer func() {
		if err != nil { // what is left of it is found by the next whole scan
			a.metasMu.Lock()
			a.indexed = false
			a.metasMu.Unlock()
		}
	}()
	if a.hasImage(id) {
		if err := a.removeFragmentFS(id); err != nil {
			return err
		}
	}
	return removeAll(a.fragmentDir(id))
}

// readFragment returns fragment id's metadata (a copy), from the cache or its fragment.json.
func (a *Agent) readFragment(id int64) (*fragmentMeta, error) {
	a.metasMu.Lock()
	m, ok := a.metas[id]
	a.metasMu.Unlock()
	if ok {
		return &m, nil
	}
	raw, err := os.ReadFile(filepath.Join(a.fragmentDir(id), "fragment.json"))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("fragment %d: corrupt fragment.json: %w", id, err)
	}
	a.cacheFragment(m)
	return &m, nil
}

func (a *Agent) cacheFragment(m fragmentMeta) {
	a.metasMu.Lock()
	if old, ok := a.metas[m.ID]; ok && old.InstanceID != m.InstanceID {
		a.unindexLocked(old)
	}
	a.metas[m.ID] = m
	frags := a.byInstance[m.InstanceID]
	if frags == nil {
		frags = map[int64]struct{}{}
		a.byInstance[m.InstanceID] = frags
	}
	frags[m.ID] = struct{}{}
	a.metasMu.Unlock()
}

func (a *Agent) uncacheFragment(id int64) {
	a.metasMu.Lock()
	if m, ok := a.metas[id]; ok {
		a.unindexLocked(m)
	}
	delete(a.metas, id)
	a.metasMu.Unlock()
}

func (a *Agent) unindexLocked(m fragmentMeta) {
	if frags := a.byInstance[m.InstanceID]; frags != nil {
		delete(frags, m.ID)
		if len(frags) == 0 {
			delete(a.byInstance, m.InstanceID)
		}
	}
}

// scanFragments reads the fragment directory and every fragment's metadata (cached), and
// returns the fragments' ids, sorted; the index then holds every fragment of the node.
func (a *Agent) scanFragments() []int64 {
	entries, _ := os.ReadDir(filepath.Join(a.ssd, "fragment"))
	ids := make([]int64, 0, len(entries))
	for _, e := range entries {
		if id, err := strconv.ParseInt(e.Name(), 10, 64); err == nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	a.metasMu.Lock()
	a.indexed = true // before the reads: a removal failing meanwhile clears it again
	a.metasMu.Unlock()
	for _, id := range ids {
		a.readFragment(id) // caches and indexes it; one being created or removed is skipped
	}
	return ids
}

// instanceFragments is the metadata of the instance's fragments on this node, sorted by id,
// through the index (a whole scan first when the index is not complete). A fragment whose
// directory is gone (removed while its metadata was being read again) is left out.
func (a *Agent) instanceFragments(instanceID int64) []fragmentMeta {
	a.metasMu.Lock()
	indexed := a.indexed
	a.metasMu.Unlock()
	if !indexed {
		a.scanFragments()
	}
	a.metasMu.Lock()
	metas := make([]fragmentMeta, 0, len(a.byInstance[instanceID]))
	for id := range a.byInstance[instanceID] {
		metas = append(metas, a.metas[id])
	}
	a.metasMu.Unlock()
	slices.SortFunc(metas, func(x, y fragmentMeta) int { return cmp.Compare(x.ID, y.ID) })
	kept := metas[:0]
	for _, m := range metas {
		if _, err := os.Lstat(filepath.Join(a.fragmentDir(m.ID), "fragment.json")); err == nil {
			kept = append(kept, m)
		}
	}
	return kept
}

// CreateNamespace makes a namespace root owned by the session's user.
func (a *Agent) CreateNamespace(ctx context.Context, spec agentapi.NamespaceSpec) error {
	if err := a.requireStorage(); err != nil {
		return err
	}
	a.fragLock.Lock()
	defer a.fragLock.Unlock()
	if _, err := os.Stat(a.fragmentDir(spec.FragmentID)); err != nil {
		return fmt.Errorf("create namespace %d: fragment %d does not exist on %s", spec.ID, spec.FragmentID, a.opt.Name)
	}
	dir := a.namespaceDir(spec.FragmentID, spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create namespace %d: %w", spec.ID, err)
	}
	if a.root {
		if err := os.Lchown(dir, int(spec.Owner), int(spec.Group)); err != nil {
			return fmt.Errorf("create namespace %d: chown: %w", spec.ID, err)
		}
	} else if spec.Owner != uint32(os.Geteuid()) {
		return fmt.Errorf("create namespace %d for uid %d: this agent runs as uid %d, not root, and can only serve its own user", spec.ID, spec.Owner, os.Geteuid())
	}
	// chmod(2) itself: os.FileMode keeps its setgid and sticky bits elsewhere than 02000 and
	// 01000, and would drop them from a root_permissions of 2770 or 1777.
	// Through a descriptor of the directory itself, never following a link: the directory
	// belongs to the user by now.
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("create namespace %d: %w", spec.ID, err)
	}
	err = unix.Fchmod(dfd, spec.Mode&0o7777)
	unix.Close(dfd)
	if err != nil {
		return fmt.Errorf("create namespace %d: chmod: %w", spec.ID, err)
	}
	if spec.Servers > 1 {
		// The instance's default layout, which new directories inherit and new files take.
		size := spec.StripeSize
		if size == 0 {
			size = stripe.DefaultSize
		}
		l := stripe.Layout{Size: size, Width: uint32(spec.Servers), Servers: uint32(spec.Servers)}
		if err := l.Validate(); err != nil {
			return fmt.Errorf("create namespace %d: %w", spec.ID, err)
		}
		if err := unix.Setxattr(dir, server.LayoutXattr, l.Encode(), 0); err != nil {
			return fmt.Errorf("create namespace %d: a striped namespace needs a root agent on a file system with extended attributes: %w", spec.ID, err)
		}
	}
	counters, err := a.fragmentCounters(spec.FragmentID)
	if err != nil {
		return fmt.Errorf("create namespace %d: %w", spec.ID, err)
	}
	counters.Namespace(spec.ID).SetLimits(spec.MaxFilesCreated, spec.MaxFileSize)
	a.saveCounters(spec.FragmentID, counters)
	return nil
}

// DeleteNamespace removes a namespace and its files.
func (a *Agent) DeleteNamespace(ctx context.Context, fragmentID, id int64) error {
	if err := a.requireStorage(); err != nil {
		return err
	}
	if err := a.Unmount(ctx, 0, a.stagingMountPath(id)); err != nil {
		return fmt.Errorf("delete namespace %d: %w", id, err)
	}
	a.fragLock.Lock()
	defer a.fragLock.Unlock()
	if err := removeAll(a.namespaceDir(fragmentID, id)); err != nil {
		return fmt.Errorf("delete namespace %d: %w", id, err)
	}
	if meta, err := a.readFragment(fragmentID); err == nil {
		if t, ok := a.trackers.Lookup(meta.InstanceID); ok {
			a.rescan(meta.InstanceID, t)
		}
	}
	return nil
}

// tracker returns the capacity tracker of an instance, scanning its namespaces on first use
// (after a restart the files on disk are the truth). The capacity is the instance's, as its
// fragments on this node recorded it.
func (a *Agent) tracker(instanceID int64) (*usage.Tracker, error) {
	return a.trackerOf(instanceID, a.instanceCapacity(instanceID))
}

// trackerOf is tracker for an instance whose capacity on this node the caller knows
// (instanceCapacity reads every fragment's metadata).
func (a *Agent) trackerOf(instanceID int64, capacity uint64) (*usage.Tracker, error) {
	if capacity == 0 {
		return nil, fmt.Errorf("instance %d has no fragment on %s", instanceID, a.opt.Name)
	}
	t, created := a.trackers.Get(instanceID, capacity)
	if created {
		if err := a.rescan(instanceID, t); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// rescan recomputes an instance's usage from its namespaces on this node.
func (a *Agent) rescan(instanceID int64, t *usage.Tracker) error {
	return t.Scan(a.instanceNamespaceDirs(instanceID)...)
}

// instanceCapacity is what the instance may hold on this node: all it asked for when it lives
// here alone, its fragments' capacity when it is striped over several nodes. It reads the
// instance's fragments alone (instanceFragments).
func (a *Agent) instanceCapacity(instanceID int64) uint64 {
	return capacityOf(a.instanceFragments(instanceID))
}

// capacityOf is instanceCapacity from the metadata of the instance's fragments here.
func capacityOf(metas []fragmentMeta) uint64 {
	var instance, here uint64
	for _, m := range metas {
		instance = m.InstanceCapacity
		here += m.Capacity
	}
	if here > 0 {
		instance = min(instance, here)
	}
	return instance
}

// instanceCapacities is instanceCapacity of every instance with a fragment here, from one
// read of the fragment directory.
func (a *Agent) instanceCapacities() map[int64]uint64 {
	return a.capacitiesOf(a.scanFragments())
}

// capacitiesOf is instanceCapacities of the fragments ids (scanFragments).
func (a *Agent) capacitiesOf(ids []int64) map[int64]uint64 {
	byInstance := map[int64][]fragmentMeta{}
	for _, id := range ids {
		if meta, err := a.readFragment(id); err == nil {
			byInstance[meta.InstanceID] = append(byInstance[meta.InstanceID], *meta)
		}
	}
	instance := make(map[int64]uint64, len(byInstance))
	for id, metas := range byInstance {
		instance[id] = capacityOf(metas)
	}
	return instance
}

// instanceNamespaceDirs are the directories of the instance's namespaces and stripes on this
// node (instanceFragments: its fragments alone are read).
func (a *Agent) instanceNamespaceDirs(instanceID int64) []string {
	var dirs []string
	for _, meta := range a.instanceFragments(instanceID) {
		id := meta.ID
		nss, _ := os.ReadDir(filepath.Join(a.fragmentDir(id), "namespace"))
		for _, ns := range nss {
			dirs = append(dirs, filepath.Join(a.fragmentDir(id), "namespace", ns.Name()))
		}
		if _, err := os.Stat(a.stripesDir(id)); err == nil {
			dirs = append(dirs, a.stripesDir(id))
		}
	}
	return dirs
}

func (a *Agent) forgetTrackerIfUnused(instanceID int64) {
	if len(a.instanceNamespaceDirs(instanceID)) == 0 {
		a.trackers.Forget(instanceID)
	}
}

// Mount exposes a namespace at a mount path: a namespace on this node through the loopback
// (the fast path), one on another node through that node's data server (warpfs).
func (a *Agent) Mount(ctx context.Context, spec agentapi.MountSpec) error {
	a.mu.Lock()
	delete(a.unmountedAt, spec.MountPath) // asked for again: the restores may bring it back
	a.mu.Unlock()
	return a.mount(ctx, spec)
}

// mount is Mount without forgetting an unmount (a reconcile's restore).
func (a *Agent) mount(ctx context.Context, spec agentapi.MountSpec) error {
	if spec.Cache != nil && spec.Cache.Loadbalance && len(spec.Stripes) > 0 {
		return fmt.Errorf("mount %s: type=cache access_mode=loadbalance of pfs=%s: the mount order names stripe servers, which a load-balanced cache has none of", spec.MountPath, spec.Cache.PFS)
	}
	if spec.Cache != nil && !spec.Cache.Loadbalance && len(spec.Stripes) == 0 {
		// A cache namespace must never be served as a scratch one: its data is in stripe
		// objects, always (lifecycle: striped()), but for a load-balanced cache, whose every
		// server serves whole files behind its own namespace.
		return fmt.Errorf("mount %s: type=cache of pfs=%s: the mount order names no stripe servers (a controller older than this agent?)", spec.MountPath, spec.Cache.PFS)
	}
	// One mount or unmount of a path at a time: an unmount of a path under way (a reconcile's)
	// must not answer a mount of it "already mounted" and then take it away.
	unlock := a.lockPath(spec.MountPath)
	defer unlock()
	a.mu.Lock()
	if m := a.mounts[spec.MountPath]; m != nil && m.alive() {
		// The controller counts on it as of now: a heartbeat's answer computed before it
		// knew that must not take it away (unmountUnknown).
		m.since, m.confirmed = time.Now(), a.heartbeatsSent.Load()
		a.mu.Unlock()
		return nil
	}
	a.mu.Unlock()
	// Not under a.mu: reaching storage nodes may take warpfs.connect_timeout, and the
	// heartbeat must not wait.
	ls, remote, err := a.mountSource(spec)
	if err != nil {
		return fmt.Errorf("mount %s: %w", spec.MountPath, err)
	}
	m, err := mount.Mount(ls)
	if err != nil {
		return fmt.Errorf("mount %s: %w", spec.MountPath, err)
	}
	a.mu.Lock()
	a.mounts[spec.MountPath] = &mounted{m: m, instance: spec.InstanceID, since: time.Now(), confirmed: a.heartbeatsSent.Load(), remote: remote}
	a.mu.Unlock()
	return nil
}

// lockPath serializes the mounts and unmounts of one mount path; the returned function
// unlocks it. The locks of paths nobody waits for are forgotten.
func (a *Agent) lockPath(path string) (unlock func()) {
	a.mu.Lock()
	l := a.pathLocks[path]
	if l == nil {
		l = &pathLock{}
		a.pathLocks[path] = l
	}
	l.users++
	a.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		a.mu.Lock()
		if l.users--; l.users == 0 {
			delete(a.pathLocks, path)
		}
		a.mu.Unlock()
	}
}

// pathLock is one mount path's lock and the number of its holders and waiters (under a.mu).
type pathLock struct {
	sync.Mutex
	users int
}

// mountSource says where a mount's namespace and, for a striped instance, its file data are:
// in this process for what this node holds, over the network for the rest. remote is true
// when nothing of it is on this node.
func (a *Agent) mountSource(spec agentapi.MountSpec) (ls mount.Spec, remote bool, err error) {
	ls = mount.Spec{
		MountPath: spec.MountPath, ReadOnly: spec.ReadOnly, AllowOther: a.root, FsName: spec.Label,
		ClientCache: spec.ClientCache, MaxFileSize: spec.MaxFileSize, Limits: a.opt.Mount, Client: a.opt.Name,
	}
	if spec.Stage { // the stage workers' traffic, not a compute node's (agentapi.StageClient)
		ls.Client = agentapi.StageClient(a.opt.Name)
	}
	here := func(node string) bool { return node == a.opt.Name && a.ssd != "" }
	if spec.Cache != nil && spec.Cache.Loadbalance {
		ls.ReadOnly = true // a load-balanced cache: every change is EROFS on its servers too
	}
	if len(spec.Replicas) > 1 {
		// A loadbalance namespace with a copy on every server: read-only, any copy will do.
		ls.ReadOnly, remote = true, true
		for _, r := range spec.Replicas {
			if here(r.Node) {
				t, err := a.tracker(spec.InstanceID)
				if err != nil {
					return ls, false, err
				}
				counters, err := a.fragmentCounters(r.FragmentID)
				if err != nil {
					return ls, false, err
				}
				srv := mount.Server{Node: r.Node, Dir: a.namespaceDir(r.FragmentID, r.NamespaceID), Tracker: t,
					Fragment: counters, NamespaceID: r.NamespaceID}
				if spec.Cache != nil {
					// A load-balanced cache's replica here: the PFS directory, whole files from
					// this node's cache of the fragment.
					if srv.Cache, err = a.cacheTargetOf(r.FragmentID); err != nil {
						return ls, false, err
					}
				}
				ls.Replicas = append(ls.Replicas, srv)
				remote = false
				continue
			}
			rs := a.remoteSpec(spec, r.DataAddress, r.FragmentID, r.Capability, r.CapabilityKey)
			rs.NamespaceID = r.NamespaceID
			ls.Replicas = append(ls.Replicas, mount.Server{Node: r.Node, Remote: rs})
		}
		return ls, remote, nil
	}
	if here(spec.StorageNode) {
		ls.SourceDir = a.namespaceDir(spec.FragmentID, spec.NamespaceID)
		if _, err := os.Stat(ls.SourceDir); err != nil {
			return ls, false, fmt.Errorf("namespace %d is missing on %s", spec.NamespaceID, a.opt.Name)
		}
		if ls.Tracker, err = a.tracker(spec.InstanceID); err != nil {
			return ls, false, err
		}
		if ls.Fragment, err = a.fragmentCounters(spec.FragmentID); err != nil {
			return ls, false, err
		}
		ls.NamespaceID = spec.NamespaceID
		if spec.Cache != nil {
			if ls.Cache, err = a.cacheTargetOf(spec.FragmentID); err != nil {
				return ls, false, err
			}
		}
		if len(spec.Stripes) == 0 && len(spec.MDS) <= 1 {
			// The file system enforces the capacity: df counts what it counts, and the kernel
			// may write the files itself where the mount enforces nothing more (no MFS).
			ls.ProjectQuota = a.fragmentQuota(spec.FragmentID)
			ls.FragmentDevice = a.fragmentDevice(spec.FragmentID)
		}
	} else {
		if spec.DataAddress == "" {
			return ls, false, fmt.Errorf("the namespace lives on storage node %s, which serves no remote mounts; "+
				"set agent.data_listen (and agent.token_file) on %s, or run the job on %s", spec.StorageNode, spec.StorageNode, spec.StorageNode)
		}
		remote = true
		ls.Remote = a.remoteSpec(spec, spec.DataAddress, spec.FragmentID, spec.Capability, spec.CapabilityKey)
	}
	for i, st := range spec.Stripes {
		if here(st.Node) {
			t, err := a.tracker(spec.InstanceID)
			if err != nil {
				return ls, false, err
			}
			dir := a.stripesDir(st.FragmentID)
			if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
				return ls, false, err
			}
			counters, err := a.fragmentCounters(st.FragmentID)
			if err != nil {
				return ls, false, err
			}
			srv := mount.Server{Node: st.Node, Dir: dir, Tracker: t, Fragment: counters}
			if spec.Cache != nil {
				if srv.Cache, err = a.cacheTargetOf(st.FragmentID); err != nil {
					return ls, false, err
				}
			}
			ls.Stripes = append(ls.Stripes, srv)
			remote = false
			continue
		}
		if st.DataAddress == "" {
			return ls, false, fmt.Errorf("stripe server %d of %d, storage node %s, serves no remote mounts; set agent.data_listen (and agent.token_file) on it",
				i+1, len(spec.Stripes), st.Node)
		}
		ls.Stripes = append(ls.Stripes, mount.Server{Node: st.Node, Remote: a.remoteSpec(spec, st.DataAddress, st.FragmentID, st.Capability, st.CapabilityKey)})
	}
	// A namespace spread over every server (max_mds): a shard on each, the first being the
	// namespace above.
	for i, r := range spec.MDS {
		if here(r.Node) {
			t, err := a.tracker(spec.InstanceID)
			if err != nil {
				return ls, false, err
			}
			dir := a.namespaceDir(r.FragmentID, r.NamespaceID)
			if _, err := os.Stat(dir); err != nil {
				return ls, false, fmt.Errorf("namespace shard %d of %d (namespace %d) is missing on %s", i+1, len(spec.MDS), r.NamespaceID, a.opt.Name)
			}
			counters, err := a.fragmentCounters(r.FragmentID)
			if err != nil {
				return ls, false, err
			}
			ls.MDS = append(ls.MDS, mount.Server{Node: r.Node, Dir: dir, Tracker: t, Fragment: counters, NamespaceID: r.NamespaceID})
			remote = false
			continue
		}
		if r.DataAddress == "" {
			return ls, false, fmt.Errorf("namespace shard %d of %d, storage node %s, serves no remote mounts; set agent.data_listen (and agent.token_file) on it",
				i+1, len(spec.MDS), r.Node)
		}
		rs := a.remoteSpec(spec, r.DataAddress, r.FragmentID, r.Capability, r.CapabilityKey)
		rs.NamespaceID = r.NamespaceID
		ls.MDS = append(ls.MDS, mount.Server{Node: r.Node, Remote: rs})
	}
	return ls, remote, nil
}

// remoteSpec is how this node reaches a fragment on another node for a mount.
func (a *Agent) remoteSpec(spec agentapi.MountSpec, address string, fragmentID int64, capability, key string) *mount.Remote {
	client := a.opt.Name
	if spec.Stage {
		client = agentapi.StageClient(a.opt.Name)
	}
	return &mount.Remote{Address: address, Token: a.opt.Token, Client: client,
		Capability: capability, CapabilityKey: key,
		FragmentID: fragmentID, NamespaceID: spec.NamespaceID, InstanceID: spec.InstanceID, Limits: a.opt.Warpfs,
		Readahead: a.opt.RemoteReadahead, TLS: a.opt.DataTLS}
}

// Unmount removes a mount.
func (a *Agent) Unmount(ctx context.Context, activationID int64, mountPath string) error {
	unlock := a.lockPath(mountPath)
	defer unlock()
	a.mu.Lock()
	a.unmountedAt[mountPath] = time.Now()
	a.mu.Unlock()
	return a.unmountLocked(mountPath)
}

// unmountLocked unmounts a path whose lock (lockPath) the caller holds.
func (a *Agent) unmountLocked(mountPath string) error {
	a.mu.Lock()
	m := a.mounts[mountPath]
	delete(a.mounts, mountPath)
	a.mu.Unlock()
	var err error
	if m != nil {
		err = m.m.Unmount()
	} else {
		err = mount.UnmountPath(mountPath, a.opt.Mount)
	}
	if errors.Is(err, mount.ErrDetached) {
		a.opt.Log.Warn("unmount detached a busy mount lazily", "path", mountPath, "err", err)
		err = nil
	}
	if err != nil {
		return fmt.Errorf("unmount %s: %w", mountPath, err)
	}
	os.Remove(mountPath) // the empty mount point; harmless if it is not empty or gone
	return nil
}

// startStageHook, when set (tests only), is called by StartStage once the start is under way.
var startStageHook func(key string)

// StartStage begins a stage as the session's user.
func (a *Agent) StartStage(ctx context.Context, spec agentapi.StageSpec) error {
	if err := a.requireStorage(); err != nil {
		return err
	}
	key := spec.Key()
	a.mu.Lock()
	known := a.stages[key] != nil
	other := a.starting[key]
	var started chan struct{}
	if !known && other == nil {
		started = make(chan struct{})
		a.starting[key] = started
	}
	a.mu.Unlock()
	if other != nil { // a start of it is under way (a request repeated): its outcome is ours
		select {
		case <-other:
		case <-ctx.Done():
			return ctx.Err()
		}
		a.mu.Lock()
		known = a.stages[key] != nil
		a.mu.Unlock()
		if !known {
			return fmt.Errorf("stage %d: a concurrent start of it failed", spec.ID)
		}
	}
	if known {
		return nil // already running or finished: the controller polls it
	}
	defer func() {
		a.mu.Lock()
		delete(a.starting, key)
		a.mu.Unlock()
		close(started)
	}()
	if startStageHook != nil {
		startStageHook(key)
	}
	if len(spec.Roots) == 0 {
		return fmt.Errorf("stage %d: no namespace of the session lives on %s", spec.ID, a.opt.Name)
	}
	roots := map[string]string{}
	var direct []string // namespaces the worker writes into beside their server
	for v, loc := range spec.Roots {
		if ms, striped := spec.Striped[v]; striped {
			// A striped namespace's data is on every server of the instance: the worker
			// reaches it through a mount, as a job does, and each server charges what lands.
			path, err := a.stagingMount(ms)
			if err != nil {
				return fmt.Errorf("stage %d: %w", spec.ID, err)
			}
			roots[v] = path
			continue
		}
		dir, err := a.locate(loc)
		if err != nil {
			return fmt.Errorf("stage %d: %w", spec.ID, err)
		}
		roots[v] = dir
		if spec.Direction == model.StageIn || spec.Protect {
			// A stage-in writes the namespace; a protected stage-out changes its file's
			// mode (write bits off while it runs, back at its end).
			direct = append(direct, dir)
		}
	}
	spec.Roots = roots
	if spec.Direction == model.StageOut {
		// The job's removals still on their way from its compute nodes land before the
		// worker reads the namespace (warpfs unlinks behind).
		for _, dir := range roots {
			server.RecallListings(dir)
		}
	}
	var charged *usage.Tracker
	if spec.Direction == model.StageIn && len(spec.Striped) == 0 {
		t, err := a.tracker(spec.Instance)
		if err != nil {
			return fmt.Errorf("stage %d: %w", spec.ID, err)
		}
		charged = t
	}
	// The worker plans first; the bytes it will write are reserved before it writes any.
	var reserved uint64
	reserve := func(bytes uint64) error {
		if charged == nil {
			return nil
		}
		if err := charged.Reserve(bytes); err != nil {
			return err
		}
		reserved = bytes
		return nil
	}
	// Roots resolved (a staging mount may take a while): now the stage, once.
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stages[key] != nil {
		return nil
	}
	run := stage.Start(context.Background(), a.opt.WorkerExe, spec, a.opt.StageLimits, reserve)
	a.stages[key] = run
	if len(direct) > 0 {
		a.stagedDirs[key] = direct
	}
	if spec.Protect && spec.Direction == model.StageOut && len(direct) > 0 {
		go protectedVisible(run, direct)
	}
	if charged != nil {
		a.stageIns[spec.Instance]++
		go func() {
			st := run.Wait()
			a.stageInEnded(spec.Instance, charged, reserved, st)
		}()
	}
	return nil
}

// protectedVisible makes the mounts of a write-protected stage-out's namespaces drop what they
// cache once its copy has begun — the worker removes the file's write bits before it copies a
// byte — so that the job sees the file read-only while it is staged out (a mount caches
// attributes for its lease, warpfs.lease). The end of the stage drops them again (staged):
// the write bits are back then.
func protectedVisible(run *stage.Run, dirs []string) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-run.Done():
			return
		case <-tick.C:
		}
		if st := run.Status(); st.BytesDone > 0 || st.FilesDone > 0 {
			for _, dir := range dirs {
				server.InvalidateNamespace(dir)
			}
			return
		}
	}
}

// stageInEnded settles a finished stage-in's reservation of reserved bytes on the instance's
// tracker. Usage after a stage-in is what landed on disk (files overwritten, a stage that
// failed half way): the instance is rescanned when nothing else is writing into it here — no
// mount, and no other stage-in, whose reservation for what it has not written yet a rescan
// would forget (8 concurrent stage-ins of 200 MiB once showed 1.57 GiB used of a 1 GiB
// instance). Otherwise the stage gives back what it reserved and did not write. The
// reservation is the plan's footprint (whole blocks, directories): it stands for a stage that
// wrote everything; one that stopped half way gives back what it did not write (its
// directories and partial blocks are then counted by the next rescan).
func (a *Agent) stageInEnded(instance int64, charged *usage.Tracker, reserved uint64, st agentapi.StageStatus) {
	a.mu.Lock()
	a.stageIns[instance]--
	others := a.stageIns[instance] > 0
	if !others {
		delete(a.stageIns, instance)
	}
	a.mu.Unlock()
	done := st.BytesDone
	if st.BytesTotal > 0 && st.BytesDone >= st.BytesTotal {
		done = reserved
	}
	if !others && !a.mountedHere(instance) {
		a.rescan(instance, charged)
	} else if done < reserved {
		charged.Release(reserved - done)
	}
}

// mountedHere reports whether a mount writes into the instance's files on this node: a local
// mount, or a remote one through this node's data server.
func (a *Agent) mountedHere(instanceID int64) bool {
	a.mu.Lock()
	for _, m := range a.mounts {
		if m.instance == instanceID && !m.remote && m.alive() {
			a.mu.Unlock()
			return true
		}
	}
	a.mu.Unlock()
	a.dataMu.Lock()
	data := a.data
	a.dataMu.Unlock()
	return data != nil && data.Active(instanceID)
}

// locate turns the controller's namespace locator into a directory on this node.
func (a *Agent) locate(loc string) (string, error) {
	var fid, nid int64
	if _, err := fmt.Sscanf(loc, "fragment/%d/namespace/%d", &fid, &nid); err != nil {
		return "", fmt.Errorf("bad namespace locator %q", loc)
	}
	dir := a.namespaceDir(fid, nid)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("namespace %d of fragment %d is missing on %s", nid, fid, a.opt.Name)
	}
	return dir, nil
}

// stagingMount mounts a striped namespace for staging, on this node (the namespace's
// metadata server), under the storage root where no user looks; it stays until the namespace
// is deleted.
func (a *Agent) stagingMount(ms agentapi.MountSpec) (string, error) {
	ms.MountPath = a.stagingMountPath(ms.NamespaceID)
	ms.ReadOnly = false
	ms.Label = "spillway-stage"
	ms.Stage = true
	if err := os.MkdirAll(filepath.Dir(ms.MountPath), 0o711); err != nil {
		return "", err
	}
	if err := a.Mount(context.Background(), ms); err != nil {
		return "", err
	}
	a.mu.Lock()
	if m := a.mounts[ms.MountPath]; m != nil {
		m.staging = true // the controller does not know it: reconcile leaves it alone
	}
	a.mu.Unlock()
	return ms.MountPath, nil
}

// unmountStaging unmounts this node's staging mounts of an instance.
func (a *Agent) unmountStaging(ctx context.Context, instanceID int64) error {
	var paths []string
	a.mu.Lock()
	for path, m := range a.mounts {
		if m.staging && m.instance == instanceID {
			paths = append(paths, path)
		}
	}
	a.mu.Unlock()
	for _, path := range paths {
		if err := a.Unmount(ctx, 0, path); err != nil {
			return err
		}
	}
	return nil
}

func (a *Agent) stagingMountPath(namespaceID int64) string {
	return filepath.Join(a.ssd, "stage-mounts", strconv.FormatInt(namespaceID, 10))
}

// StageStatus reports a stage's progress.
func (a *Agent) StageStatus(ctx context.Context, key string) (agentapi.StageStatus, error) {
	a.mu.Lock()
	r := a.stages[key]
	a.mu.Unlock()
	id, _, _ := strings.Cut(key, "-")
	stageID, _ := strconv.ParseInt(id, 10, 64)
	if r == nil {
		return agentapi.StageStatus{ID: stageID, Known: false}, nil
	}
	st := r.Status()
	st.ID, st.Known = stageID, true
	st.Warnings, _ = r.Warnings()
	if st.Status != "running" {
		a.staged(key)
		// Finished stages are forgotten once reported; the controller has recorded them.
		a.mu.Lock()
		delete(a.stages, key)
		a.mu.Unlock()
	}
	return st, nil
}

// CancelStage stops a stage and returns what its worker ended with, once the worker is gone:
// "canceled", or "complete" when it finished first (a terminate that races the end of the
// copy: the files are all there, and the controller must say so). The run stays known until
// then, so a cancel that the controller repeats (its request timed out) waits for the same
// worker instead of finding nothing. An unknown key (never started here, or already
// reported) answers Known false: nothing of it runs here.
func (a *Agent) CancelStage(ctx context.Context, key string) (agentapi.StageStatus, error) {
	id, _, _ := strings.Cut(key, "-")
	stageID, _ := strconv.ParseInt(id, 10, 64)
	a.mu.Lock()
	r, starting := a.stages[key], a.starting[key]
	a.mu.Unlock()
	if r == nil && starting != nil {
		select { // a start of it is under way: cancel what it starts
		case <-starting:
		case <-ctx.Done():
			return agentapi.StageStatus{}, fmt.Errorf("stage %s: it is being started: %w", key, ctx.Err())
		}
		a.mu.Lock()
		r = a.stages[key]
		a.mu.Unlock()
	}
	if r == nil {
		return agentapi.StageStatus{ID: stageID, Known: false}, nil
	}
	r.Cancel()
	select {
	case <-r.Done():
	case <-ctx.Done():
		return agentapi.StageStatus{}, fmt.Errorf("stage %s: its worker has not stopped yet: %w", key, ctx.Err())
	}
	a.mu.Lock()
	if a.stages[key] == r {
		delete(a.stages, key)
	}
	a.mu.Unlock()
	st := r.Status()
	st.ID, st.Known = stageID, true
	st.Warnings, _ = r.Warnings()
	a.staged(key)
	return st, nil
}

// staged makes the mounts of the namespaces a finished stage wrote into beside their server
// forget the names and attributes they cache (warpfs leases), before the stage is reported
// ended: a job then finds what was staged in at its next call.
func (a *Agent) staged(key string) {
	a.mu.Lock()
	dirs := a.stagedDirs[key]
	delete(a.stagedDirs, key)
	a.mu.Unlock()
	for _, dir := range dirs {
		server.InvalidateNamespace(dir)
	}
}

// Close unmounts everything this agent serves and stops its stages.
func (a *Agent) Close() {
	defer a.pfsDoors.closeAll()
	defer a.closeCacheStores()
	a.closeCaches()
	a.mu.Lock()
	mounts := a.mounts
	a.mounts = map[string]*mounted{}
	stages := a.stages
	a.stages = map[string]*stage.Run{}
	a.mu.Unlock()
	for _, r := range stages {
		r.Cancel()
	}
	for _, r := range stages {
		r.Wait()
	}
	// Workers kept for a next stage hold nothing, and have no next stage now.
	stage.CloseIdleWorkers(a.opt.StageLimits.WithDefaults().CancelGrace)
	for path, m := range mounts {
		if m.swap {
			// A swap area's loop device reads through it: an unmount would fail (busy) or
			// detach it lazily; it ends with this process either way, and the log says so.
			a.opt.Log.Warn("the agent stops while serving a remote swap area: its pages there cannot come back", "path", path)
			continue
		}
		if err := m.m.Unmount(); err != nil {
			a.opt.Log.Warn("unmount at shutdown", "path", path, "err", err)
		}
	}
	if a.ssd != "" {
		a.saveAllCounters()
	}
}

// mounted is a mount this agent serves.
type mounted struct {
	m        *mount.Mounted
	instance int64
	since    time.Time
	// confirmed is the number of heartbeats sent when the controller last asked for the
	// mount: the answers to those heartbeats, computed before, may not list it yet.
	confirmed uint64
	remote    bool // the namespace is on another node
	staging   bool // the agent's own mount of a striped namespace, for its stage workers
	swap      bool // the agent's own mount of a remote swap area's namespace (swap.go)
}

// alive reports whether the mount is still served.
func (m *mounted) alive() bool {
	select {
	case <-m.m.Done():
		return false
	default:
		return true
	}
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// removeAll deletes a tree (os.RemoveAll works with *at calls and follows no link). A user
// may chmod their own directories 0555: a non-root agent, which is that user, makes them
// writable and tries again. Root needs no second try, and must not chmod by path in a tree a
// user may still be changing.
func removeAll(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil || errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if os.Geteuid() == 0 {
		return err
	}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
