// Package controller is Spillway's DataWarp service: it owns all state, takes the WLM's
// requests, and drives every object to its goal by calling agents (the executor).
//
// Every request and every effect outcome is decided by the pure core (package lifecycle) on a
// world loaded inside a store transaction, and persisted in that same transaction before any
// side effect runs. Side effects are idempotent, so after a crash the executor simply looks
// again: whatever is not at its goal gets its effect re-run.
package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/crashpoint"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/nodekey"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/units"
)

// AgentDialer returns the agent of a node, given what the node registered.
type AgentDialer func(node *model.Node) (agentapi.Agent, error)

// Controller is the service. Create it with New, start the executor with Run.
type Controller struct {
	cfg    config.Config
	store  *store.Store
	dial   AgentDialer
	params lifecycle.Params
	log    *slog.Logger
	now    func() time.Time

	wake chan struct{}
	// wakeGathered wakes the executor executor.wake_delay later (wakeGather): the in-job stage
	// calls of a burst are decided in one pass.
	wakeGathered chan struct{}

	changeMu sync.Mutex
	changed  chan struct{} // closed (and replaced) whenever the state changes
	// sessionWaits: by session id, a channel closed (and dropped) at the session's next change
	sessionWaits map[int64]chan struct{}

	mu       sync.Mutex
	inflight map[lifecycle.EffectKey]bool
	// mountsInFlight are the mounts asked of each node (by node, then mount path) whose
	// outcome is not yet persisted: a heartbeat's answer lists them beside the state's, so
	// that an agent never takes away a mount whose job pre_run is about to release.
	mountsInFlight map[string]map[string]agentapi.MountSpec
	// starting are the stages whose start is decided (in flight or queued) and whose outcome
	// is not yet recorded: they hold a slot of stage.max_running that the state does not show
	// yet (startsElsewhere).
	starting map[int64]bool
	// parked: due sessions whose every effect is in flight or queued. Passes skip them until
	// an effect of theirs ends, a request or change touches them, or the tick's pass
	// (executor.go: park).
	parked map[int64]bool
	// queue: effects that found every slot (executor.max_in_flight) taken; they start, in
	// order, as slots free (executor.go: startQueued). queued holds their keys.
	queue    []queuedEffect
	queued   map[lifecycle.EffectKey]bool
	polls    map[lifecycle.EffectKey]pollState // running stages: when each was last polled, and the next gap
	local    map[string]agentapi.Agent         // in-process agents by node name
	remote   map[string]agentapi.Agent         // dialled agents by node name (and the address used)
	remoteAt map[string]string

	acctMu     sync.Mutex         // one writer of controller.accounting_log (flushAccounting)
	acctLogged time.Time          // when flushAccounting last logged a failure (under acctMu)
	metrics    *controllerMetrics // metrics.go

	// swept: the executor made a pass over the whole state (its first); later passes look at
	// the due sessions only (executor.go).
	swept atomic.Bool

	leases leaseBook // spillway run sessions' leases (RunLease)
	secret string    // the cluster's secret (controller.token_file): grants mounts (SetSecret)

	// listed keeps the records the listings (GET /dw/v1/<table>) decoded last (listing.go).
	listed store.Shared
	// usageRows keeps the fragments' usage rows the heartbeats compared their reports with
	// (recordUsage): those no commit wrote since are not read again.
	usageRows store.Rows[model.FragmentUsage]
}

// New creates a controller over a store. Pools listed in the configuration are created if
// missing.
func New(cfg config.Config, st *store.Store, dial AgentDialer, log *slog.Logger) (*Controller, error) {
	store.SetDecodedLimit(cfg.Controller.DecodedCache) // the process's (one controller a process)
	c := &Controller{
		cfg: cfg, store: st, dial: dial, log: log, now: time.Now,
		wake:           make(chan struct{}, 1),
		wakeGathered:   make(chan struct{}, 1),
		changed:        make(chan struct{}),
		sessionWaits:   map[int64]chan struct{}{},
		inflight:       map[lifecycle.EffectKey]bool{},
		mountsInFlight: map[string]map[string]agentapi.MountSpec{},
		starting:       map[int64]bool{},
		parked:         map[int64]bool{},
		queued:         map[lifecycle.EffectKey]bool{},
		polls:          map[lifecycle.EffectKey]pollState{},
		local:          map[string]agentapi.Agent{},
		remote:         map[string]agentapi.Agent{},
		remoteAt:       map[string]string{},
		params: lifecycle.Params{
			MountRoot:              cfg.Controller.MountRoot,
			MaxSessions:            cfg.Controller.MaxSessions,
			MaxAttempts:            cfg.Executor.MaxAttempts,
			RetryBackoff:           cfg.Executor.RetryBackoff.D(),
			RetryBackoffMax:        cfg.Executor.RetryBackoffMax.D(),
			StageMaxAttempts:       cfg.Stage.MaxAttempts,
			StageMaxRunning:        cfg.Stage.MaxRunning,
			StageMaxJobConcurrency: cfg.Stage.MaxJobConcurrency,
			UserQuota: lifecycle.Quota{Sessions: cfg.Controller.MaxSessionsPerUser,
				Persistent: cfg.Controller.MaxPersistentPerUser, Capacity: uint64(cfg.Controller.MaxCapacityPerUser)},
			Limits: controllerapi.WriteLimitsOf(cfg.Limits),
			Health: lifecycle.Health{EnduranceThreshold: cfg.Controller.EnduranceThreshold,
				AutoDrainFailures: cfg.Controller.AutoDrainFailures, AutoDrainWindow: cfg.Controller.AutoDrainWindow.D()},
			PersistentExpiration:    cfg.Controller.PersistentExpiration.D(),
			MaxPersistentExpiration: cfg.Controller.MaxPersistentExpiration.D(),
			Cache:                   controllerapi.CacheParamsOf(cfg.Cache),
			Swap:                    controllerapi.SwapParamsOf(cfg.Swap),
		},
	}
	c.metrics = newControllerMetrics(c)
	err := st.Update(context.Background(), func(tx *store.Tx) error {
		for _, p := range cfg.Pools {
			existing, err := store.Pools.Get(tx, p.Name)
			if err == nil && existing.Granularity == uint64(p.Granularity) {
				continue
			}
			if err == nil && existing.Granularity != uint64(p.Granularity) {
				inUse, err := store.Instances.Filter(tx, func(i *model.Instance) bool { return i.Pool == p.Name })
				if err != nil {
					return err
				}
				if len(inUse) > 0 {
					log.Warn("pool granularity in the config differs from the live pool, which has instances; keeping the live value",
						"pool", p.Name, "config", uint64(p.Granularity), "live", existing.Granularity)
					continue
				}
			} else if !store.IsNotFound(err) {
				return err
			}
			if err := store.Pools.Put(tx, &model.Pool{Name: p.Name, Granularity: uint64(p.Granularity), StripeSize: uint64(p.StripeSize)}); err != nil {
				return err
			}
		}
		return ensureClusterID(tx)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

const clusterIDKey = "cluster_id"

// ensureClusterID gives the state database a random identity, so that agents never delete
// data on the word of a controller that lost its state (a fresh database has a new id).
func ensureClusterID(tx *store.Tx) error {
	if _, err := store.Meta.Get(tx, clusterIDKey); err == nil {
		return nil
	}
	b := make([]byte, 16)
	rand.Read(b)
	return store.Meta.Put(tx, &store.MetaValue{Key: clusterIDKey, Value: hex.EncodeToString(b)})
}

// ClusterID returns the state database's identity.
func (c *Controller) ClusterID(ctx context.Context) (string, error) {
	var id string
	err := c.store.View(ctx, func(tx *store.Tx) error {
		v, err := store.Meta.Get(tx, clusterIDKey)
		if err == nil {
			id = v.Value
		}
		return err
	})
	return id, err
}

// Params returns the decision parameters (for tests and status views).
func (c *Controller) Params() lifecycle.Params { return c.params }

// AddLocalAgent registers an in-process agent (the embedded default of `spillway run`).
func (c *Controller) AddLocalAgent(name string, a agentapi.Agent) {
	c.mu.Lock()
	c.local[name] = a
	c.mu.Unlock()
}

// notifyChange wakes everyone waiting for the state to change, and those waiting for one of
// the sessions a change touched (WaitStatus: a status waiter is woken by its own session's
// changes only, not by every other job's).
func (c *Controller) notifyChange(touched map[int64]bool) {
	c.replan(touched)
	c.announce(touched)
}

// announce wakes the waiters of a change (notifyChange without the executor's part: an
// effect's own outcome leaves its session's other queued effects queued).
func (c *Controller) announce(touched map[int64]bool) {
	c.changeMu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	for id := range touched {
		if ch := c.sessionWaits[id]; ch != nil {
			close(ch)
			delete(c.sessionWaits, id)
		}
	}
	c.changeMu.Unlock()
}

// StateChangedElsewhere wakes the waiting requests (a step's status, with a wait) to look at
// the state again: a controller that does not lead hears of no change, the leader makes them.
func (c *Controller) StateChangedElsewhere() {
	c.changeMu.Lock()
	for id, ch := range c.sessionWaits { // every session may have changed
		close(ch)
		delete(c.sessionWaits, id)
	}
	c.changeMu.Unlock()
	c.notifyChange(nil)
}

// Changed returns a channel closed at the next change of the state.
func (c *Controller) Changed() <-chan struct{} {
	c.changeMu.Lock()
	defer c.changeMu.Unlock()
	return c.changed
}

// sessionChanged returns a channel closed at the next change of a session's objects.
func (c *Controller) sessionChanged(id int64) <-chan struct{} {
	c.changeMu.Lock()
	defer c.changeMu.Unlock()
	ch := c.sessionWaits[id]
	if ch == nil {
		ch = make(chan struct{})
		c.sessionWaits[id] = ch
	}
	return ch
}

// WaitStatus is Status that waits, up to wait, for the step to finish or fail.
func (c *Controller) WaitStatus(ctx context.Context, token, step string, wait time.Duration) (lifecycle.StepStatus, error) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	id, err := c.sessionID(ctx, token)
	if err != nil {
		return lifecycle.StepStatus{}, err
	}
	for {
		// The session's next change closes changed: taken before the read, it misses none.
		var changed <-chan struct{}
		if id != 0 {
			changed = c.sessionChanged(id)
		}
		st, now, err := c.status(ctx, token, step)
		if err != nil || st.Done || st.Failed || wait <= 0 || now == 0 {
			return st, err
		}
		if now != id { // the token's session was replaced between the two reads
			id = now
			continue
		}
		select {
		case <-changed:
		case <-deadline.C:
			return st, nil
		case <-ctx.Done():
			return st, nil
		}
	}
}

// wakeUp asks the executor to look now.
func (c *Controller) wakeUp() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// wakeGather asks the executor to look executor.wake_delay from the first such call: what
// the calls until then asked for is decided in one pass, its stages started together.
func (c *Controller) wakeGather() {
	if c.cfg.Executor.WakeDelay <= 0 {
		c.wakeUp()
		return
	}
	select {
	case c.wakeGathered <- struct{}{}:
	default:
	}
}

// view loads a consistent world.
func (c *Controller) view(ctx context.Context) (*lifecycle.World, error) {
	var w *lifecycle.World
	err := c.store.View(ctx, func(tx *store.Tx) error {
		var err error
		w, err = loadWorld(tx, c.now(), c.cfg.Controller.NodeTimeout.D())
		return err
	})
	return w, err
}

// wholeTables are the tables of the state besides the pools and the nodes.
var wholeTables = []string{"sessions", "instances", "fragments", "configurations", "namespaces", "registrations", "activations", "stages"}

// viewShared is view for answers that only render the world (GET /dw/v1/all, dwstat, the
// mounts' lookup): when the read knows its version (store.Versioned: SQLite), its objects
// come from the listings' cache (c.listed), which reads again only the records written since
// the previous listing: what dwstat costs follows what changed, not the state. The objects
// are shared: read them, never change them.
func (c *Controller) viewShared(ctx context.Context) (*lifecycle.World, error) {
	return c.viewSharedOf(ctx, wholeTables)
}

// mountTables are the tables a mount's lookup reads (lifecycle.Locate): not the stages, which
// a job staging a checkpoint file by file makes the largest, and which every in-job stage
// call would otherwise list.
var mountTables = []string{"sessions", "instances", "fragments", "configurations", "namespaces", "registrations", "activations"}

// viewSharedOf is viewShared with only some tables (the others empty).
func (c *Controller) viewSharedOf(ctx context.Context, tables []string) (*lifecycle.World, error) {
	var w *lifecycle.World
	err := c.store.View(ctx, func(tx *store.Tx) error {
		var err error
		if w, err = loadNodesAndPools(tx, c.now(), c.cfg.Controller.NodeTimeout.D()); err != nil {
			return err
		}
		// A read that cannot tell its version (a commit was under way when it took its
		// snapshot, as often in a burst of calls, or an engine that does not number its
		// commits) reads the tables asked for from the store: still not the others (it read
		// the whole state, every stage of every session, at each in-job stage call).
		versioned := tx.Versioned()
		for _, t := range tables {
			if versioned {
				err = c.listInto(tx, w, t)
			} else {
				err = loadTableInto(tx, w, t)
			}
			if err != nil {
				return err
			}
		}
		w.Index()
		return nil
	})
	return w, err
}

// viewSession loads, in a read transaction, what an answer about one session looks at
// (readSessionWorld).
func (c *Controller) viewSession(ctx context.Context, token string) (*lifecycle.World, error) {
	var w *lifecycle.World
	err := c.store.View(ctx, func(tx *store.Tx) error {
		var err error
		w, err = readSessionWorld(tx, token)
		return err
	})
	return w, err
}

// sessionByToken is the session with token alone (none of its objects), nil if there is
// none: what the ownership checks read (a session may hold max_job_stages stages).
func (c *Controller) sessionByToken(ctx context.Context, token string) (*model.Session, error) {
	var s *model.Session
	err := c.store.View(ctx, func(tx *store.Tx) error {
		var err error
		s, err = store.SessionByToken(tx, token)
		if store.IsNotFound(err) {
			s, err = nil, nil
		}
		return err
	})
	return s, err
}

// sessionID is the id of the session with token, 0 if there is none.
func (c *Controller) sessionID(ctx context.Context, token string) (int64, error) {
	var id int64
	err := c.store.View(ctx, func(tx *store.Tx) error {
		s, err := store.SessionByToken(tx, token)
		if err == nil {
			id = s.ID
		} else if store.IsNotFound(err) {
			err = nil
		}
		return err
	})
	return id, err
}

// World returns a snapshot of every object, for status views.
func (c *Controller) World(ctx context.Context) (*lifecycle.World, error) { return c.view(ctx) }

// ReadWorld is World for a caller that only reads it (viewShared: on SQLite the listings'
// cache, which reads again only what changed): its objects are shared, never change them.
func (c *Controller) ReadWorld(ctx context.Context) (*lifecycle.World, error) {
	return c.viewShared(ctx)
}

// SessionWorld is the session with token and its objects, and those of the persistent
// instances it uses, read through the indexes (readSessionWorld: no pools, nodes or other
// sessions); without the session when there is none. For reading only.
func (c *Controller) SessionWorld(ctx context.Context, token string) (*lifecycle.World, error) {
	return c.viewSession(ctx, token)
}

// decide runs fn on the whole world loaded in a write transaction and persists what it
// changed.
func (c *Controller) decide(ctx context.Context, crashName string, fn func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error) error {
	return c.decideOn(ctx, "", nil, crashName, fn)
}

// decideOn is decide for a request about one job (token; more: other sessions it names, a
// setup's persistent instances): fn gets the session's world
// (loadSessionWorld: an unknown token's holds no session, and fn answers as it would on the
// whole world), or the whole world when the token names a persistent instance (its teardown
// looks at every job using it) or lifecycle.NeedsWhole says so. token "": the whole world.
func (c *Controller) decideOn(ctx context.Context, token string, more []string, crashName string, fn func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error) error {
	return c.decideOnTx(ctx, token, more, crashName, func(_ *store.Tx, w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		return fn(w, ids, now)
	})
}

// decideOnTx is decideOn whose fn also gets the transaction (to read more, never to write:
// what it decides is persisted from the world's changes).
func (c *Controller) decideOnTx(ctx context.Context, token string, more []string, crashName string, fn func(tx *store.Tx, w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error) error {
	return c.decideOnWhere(ctx, token, more, nil, crashName, fn)
}

// decideOnWhere is decideOnTx whose session world holds only the stages keep keeps (nil:
// all; a whole world holds all).
func (c *Controller) decideOnWhere(ctx context.Context, token string, more []string, keep stageFilter, crashName string, fn func(tx *store.Tx, w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error) error {
	var touched map[int64]bool
	err := c.store.Update(ctx, func(tx *store.Tx) error {
		now := c.now()
		var w *lifecycle.World
		var err error
		if token != "" {
			if w, err = loadSessionWorldWhere(tx, token, now, c.cfg.Controller.NodeTimeout.D(), keep, more...); err != nil {
				return err
			}
			if s := w.SessionByToken(token); s != nil && (s.Persistent || lifecycle.NeedsWhole(w, now)) {
				w = nil
			}
		}
		if w == nil {
			if w, err = loadWorld(tx, now, c.cfg.Controller.NodeTimeout.D()); err != nil {
				return err
			}
		}
		if err := fn(tx, w, txIDs{tx}, now); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err // the caller is gone (request_timeout): write nothing it will not hear of
		}
		touched, err = c.persistTouched(tx, w.TakeChanges())
		return err
	})
	if err != nil {
		return err
	}
	c.notifyChange(touched)
	if crashName != "" {
		crashpoint.Hit(crashName)
	}
	if gatherWake[crashName] {
		c.wakeGather()
	} else {
		c.wakeUp()
	}
	return nil
}

// gatherWake are the requests that come in bursts (a job's libdatawarp calls, one a file):
// they wake the executor executor.wake_delay later (wakeGather), the others at once.
var gatherWake = map[string]bool{"request-persisted:job_stages": true, "request-persisted:terminate": true}

// Setup creates a job or persistent session. ordinaryUser applies the per-user quota (controller.max_*_per_user); the workload manager
// and administrators are not limited.
func (c *Controller) Setup(ctx context.Context, req lifecycle.Setup, ordinaryUser bool) error {
	var err error
	if err = c.checkStages("setup stage_out", model.StageOut, req.StageOut); err != nil {
		return err
	}
	if req.Uses, err = c.uniqueUses(req.Uses); err != nil {
		return err
	}
	if req.ClientNodes, err = c.uniqueNodes("setup client_nodes", req.ClientNodes); err != nil {
		return err
	}
	if req.Instance != nil && req.Instance.Pool == "" {
		req.Instance.Pool = c.cfg.Controller.DefaultPool
	}
	for i := range req.More {
		if req.More[i].Pool == "" {
			req.More[i].Pool = c.cfg.Controller.DefaultPool
		}
	}
	if req.Swap != nil && req.Swap.Pool == "" { // #DW swap without pool=: the job's buffer's pool, else the default
		req.Swap.Pool = c.cfg.Controller.DefaultPool
		if req.Instance != nil {
			req.Swap.Pool = req.Instance.Pool
		}
	}
	if err := checkPFSAsOwner(req); err != nil {
		return err
	}
	// Setups decide on the session's world (the totals stand for the rest: the allocator's
	// used grains, the session count); an ordinary user's quota counts their sessions among
	// every session and instance, read in the same transaction (quotaWorld).
	return c.decideOnTx(ctx, req.Token, req.Uses, "request-persisted:setup", func(tx *store.Tx, w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		if ordinaryUser {
			all, err := c.quotaWorld(tx)
			if err != nil {
				return err
			}
			if err := lifecycle.CheckUserQuota(all, req, c.params.UserQuota); err != nil {
				return err
			}
		}
		return lifecycle.ApplySetup(w, req, ids, c.params, now)
	})
}

// quotaWorld is every session and instance, for reading only (lifecycle.CheckUserQuota),
// through the listings' cache: in a write transaction that has written nothing yet its
// version is the log's (SQLite), and only what changed since the previous listing is read.
func (c *Controller) quotaWorld(tx *store.Tx) (*lifecycle.World, error) {
	w := lifecycle.NewWorld()
	for _, t := range []string{"sessions", "instances"} {
		if err := c.listInto(tx, w, t); err != nil {
			return nil, err
		}
	}
	w.Index()
	return w, nil
}

// Stages asks for stage-ins (direction "in") or stage-outs ("out").
func (c *Controller) Stages(ctx context.Context, token, direction string, reqs []lifecycle.StageRequest) error {
	if direction != model.StageIn && direction != model.StageOut {
		return &lifecycle.UserError{Msg: fmt.Sprintf("stage direction %q: expected in or out", direction)}
	}
	if err := c.checkStages("data_"+direction, direction, reqs); err != nil {
		return err
	}
	return c.decideOn(ctx, token, nil, "request-persisted:data_"+direction, func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		return lifecycle.ApplyStages(w, token, direction, reqs, ids, now)
	})
}

// JobStages records a job's in-job stage requests (libdatawarp, dwcli stage). The requests
// are checked, and their number bounded by stage.max_paths_per_request, before the write
// transaction: the transaction's work is then linear in the paths and the session's stages.
func (c *Controller) JobStages(ctx context.Context, token string, reqs []lifecycle.InJobStage) error {
	if err := lifecycle.CheckInJobStages(reqs, c.cfg.Stage.MaxPathsPerRequest); err != nil {
		return err
	}
	// The decision reads the stages of the paths asked about, and counts the session's other
	// in-job stages (stage.max_job_stages): a call costs the same in a session of thousands.
	paths := make(map[string]bool, len(reqs))
	for _, r := range reqs {
		paths["$"+r.DWVar+r.DWPath] = true
	}
	keep := func(st *model.Stage) bool { return st.InJob && paths[st.DWPath] }
	return c.decideOnWhere(ctx, token, nil, keep, "request-persisted:job_stages", func(_ *store.Tx, w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		return lifecycle.ApplyCheckedInJobStages(w, token, reqs, c.cfg.Stage.MaxJobStages, ids, now)
	})
}

// TerminateStages stops a job's in-job stages of a path (dw_terminate_*).
func (c *Controller) TerminateStages(ctx context.Context, token, v, p string) (int, error) {
	var n int
	err := c.decideOn(ctx, token, nil, "request-persisted:terminate", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		var err error
		n, err = lifecycle.ApplyTerminate(w, token, v, p, now)
		return err
	})
	return n, err
}

// StageConcurrency sets how many of a job's in-job stages may run at once
// (dw_set_stage_concurrency), clamped to stage.max_job_concurrency; it returns the limit set.
func (c *Controller) StageConcurrency(ctx context.Context, token string, n int) (int, error) {
	var set int
	err := c.decideOn(ctx, token, nil, "request-persisted:stage_concurrency", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		var err error
		set, err = lifecycle.ApplyStageConcurrency(w, token, n, c.params.StageMaxJobConcurrency)
		return err
	})
	return set, err
}

// PreRun mounts the session's configurations on compute nodes.
func (c *Controller) PreRun(ctx context.Context, token string, nodes []string) error {
	nodes, err := c.uniqueNodes("pre_run", nodes)
	if err != nil {
		return err
	}
	return c.decideOn(ctx, token, nil, "request-persisted:pre_run", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		return lifecycle.ApplyPreRun(w, token, nodes, ids, c.params)
	})
}

// PostRun unmounts them.
func (c *Controller) PostRun(ctx context.Context, token string) error {
	return c.decideOn(ctx, token, nil, "request-persisted:post_run", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		return lifecycle.ApplyPostRun(w, token)
	})
}

// Teardown destroys a session.
func (c *Controller) Teardown(ctx context.Context, token string, hurry bool) error {
	return c.decideOn(ctx, token, nil, "request-persisted:teardown", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		return lifecycle.ApplyTeardown(w, token, hurry)
	})
}

// ReleaseRegistration lets teardown proceed without waiting for a registration's stage-outs.
func (c *Controller) ReleaseRegistration(ctx context.Context, id int64) error {
	return c.decide(ctx, "", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		return lifecycle.ReleaseRegistration(w, id)
	})
}

// SetDrain drains (or fills) a storage node.
func (c *Controller) SetDrain(ctx context.Context, node string, drain bool, reason string) error {
	return c.UpdateNode(ctx, node, lifecycle.NodeChange{Drain: &drain, Reason: reason})
}

// UpdateNode applies an administrator's change to a node (dwcli update node).
func (c *Controller) UpdateNode(ctx context.Context, node string, ch lifecycle.NodeChange) error {
	return c.decide(ctx, "", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		return lifecycle.UpdateNode(w, node, ch)
	})
}

// RemoveNode forgets a retired node (dwcli rm node): refused while it holds fragments or
// mounts, or while its agent still sends heartbeats.
func (c *Controller) RemoveNode(ctx context.Context, node string) error {
	err := c.store.Update(ctx, func(tx *store.Tx) error {
		now := c.now()
		w, err := loadWorld(tx, now, c.cfg.Controller.NodeTimeout.D())
		if err != nil {
			return err
		}
		if err := lifecycle.CheckRemoveNode(w, node, now, c.cfg.Controller.NodeTimeout.D()); err != nil {
			return err
		}
		return store.Nodes.Delete(tx, node)
	})
	if err == nil {
		c.mu.Lock()
		delete(c.remote, node)
		delete(c.remoteAt, node)
		c.mu.Unlock()
		c.notifyChange(nil)
	}
	return err
}

// RemovePool removes an empty pool (dwcli rm pool). A pool of the configuration's [[pool]]
// tables is refused: the controller would make it again at its next start.
func (c *Controller) RemovePool(ctx context.Context, name string) error {
	for _, p := range c.cfg.Pools {
		if p.Name == name {
			return &lifecycle.UserError{Msg: fmt.Sprintf("pool %s is in the controller's configuration ([[pool]] name = %q), which would make it again at the next start; remove it there first", name, name)}
		}
	}
	err := c.store.Update(ctx, func(tx *store.Tx) error {
		w, err := loadWorld(tx, c.now(), c.cfg.Controller.NodeTimeout.D())
		if err != nil {
			return err
		}
		if err := lifecycle.CheckRemovePool(w, name); err != nil {
			return err
		}
		return store.Pools.Delete(tx, name)
	})
	if err == nil {
		c.notifyChange(nil)
	}
	return err
}

// ReplaceFuse resets the blown fuse of a fragment, namespace or activation: the executor
// tries its effect again.
func (c *Controller) ReplaceFuse(ctx context.Context, kind string, id int64) error {
	return c.decide(ctx, "", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		return lifecycle.ReplaceFuse(w, kind, id)
	})
}

// RemoveActivation unmounts one activation (dwcli rm activation).
func (c *Controller) RemoveActivation(ctx context.Context, id int64) error {
	return c.decide(ctx, "", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		return lifecycle.RemoveActivation(w, id)
	})
}

// StageHistory returns the finished stages kept after their sessions went, oldest first.
func (c *Controller) StageHistory(ctx context.Context) ([]*model.FinishedStage, error) {
	var out []*model.FinishedStage
	err := c.store.View(ctx, func(tx *store.Tx) error {
		var err error
		out, err = loadStageHistory(tx)
		return err
	})
	return out, err
}

// CreatePool adds a pool, or changes the granularity of an unused one.
func (c *Controller) CreatePool(ctx context.Context, name string, granularity uint64) error {
	if name == "" || granularity == 0 {
		return &lifecycle.UserError{Msg: "a pool needs a name and a granularity greater than 0"}
	}
	return c.store.Update(ctx, func(tx *store.Tx) error {
		inUse, err := store.Instances.Filter(tx, func(i *model.Instance) bool { return i.Pool == name })
		if err != nil {
			return err
		}
		if existing, err := store.Pools.Get(tx, name); err == nil && existing.Granularity != granularity && len(inUse) > 0 {
			return &lifecycle.UserError{Msg: fmt.Sprintf("pool %s has %d instance(s); its granularity cannot change until they are gone", name, len(inUse))}
		}
		return store.Pools.Put(tx, &model.Pool{Name: name, Granularity: granularity})
	})
}

// NextRunID draws the job id of a `spillway run` job for uid, who alone may then set up
// run<id> (see RunIDDrawnBy).
func (c *Controller) NextRunID(ctx context.Context, uid uint32) (int64, error) {
	var id int64
	err := c.store.Update(ctx, func(tx *store.Tx) error {
		var err error
		id, err = tx.DrawRunID(uid)
		return err
	})
	return id, err
}

// RunIDDrawnBy reports whether uid drew run id n: an ordinary user may set up run<n> only
// then, so that nobody can take the token of another user's run, drawn or future.
func (c *Controller) RunIDDrawnBy(ctx context.Context, n int64, uid uint32) (bool, error) {
	var drawer uint32
	var found bool
	err := c.store.View(ctx, func(tx *store.Tx) error {
		var err error
		drawer, found, err = tx.RunIDDrawer(n)
		return err
	})
	return found && drawer == uid, err
}

// Status reports a session's progress with a step.
func (c *Controller) Status(ctx context.Context, token, step string) (lifecycle.StepStatus, error) {
	st, _, err := c.status(ctx, token, step)
	return st, err
}

// status is Status and the session's id (0: no such session).
func (c *Controller) status(ctx context.Context, token, step string) (lifecycle.StepStatus, int64, error) {
	w, err := c.viewSession(ctx, token)
	if err != nil {
		return lifecycle.StepStatus{}, 0, err
	}
	var id int64
	if s := w.SessionByToken(token); s != nil {
		id = s.ID
	}
	return lifecycle.Status(w, token, step), id, nil
}

// Paths returns the job's DataWarp environment variables.
func (c *Controller) Paths(ctx context.Context, token string) (map[string]string, error) {
	w, err := c.viewSession(ctx, token)
	if err != nil {
		return nil, err
	}
	return lifecycle.Paths(w, token, c.params.MountRoot)
}

// Heartbeat records an agent's report, sent with an administrator's credential (the cluster's
// secret, root on the socket, an embedded agent), and returns what lives on its node. A
// storage node reporting this way is admitted for storage.
func (c *Controller) Heartbeat(ctx context.Context, r agentapi.NodeReport) (agentapi.Assignment, error) {
	return c.heartbeat(ctx, r, true)
}

// NodeHeartbeat records a report sent with the node's own credential (package nodekey): its
// claims to storage (pool, capacity, data address) count only once an administrator admitted
// the node (dwcli update node --storage); until then they are recorded as its StorageClaim.
func (c *Controller) NodeHeartbeat(ctx context.Context, r agentapi.NodeReport) (agentapi.Assignment, error) {
	return c.heartbeat(ctx, r, false)
}

// withoutStorage strips a report of a node not admitted for storage of its storage claims;
// it returns them described ("" when it claims none).
func withoutStorage(r *agentapi.NodeReport) string {
	var claim []string
	if r.Pool != "" {
		claim = append(claim, "pool "+r.Pool)
	}
	if r.Capacity > 0 {
		claim = append(claim, units.FormatHuman(r.Capacity))
	}
	if r.DataAddress != "" {
		claim = append(claim, "data "+r.DataAddress)
	}
	var roles []string
	for _, role := range r.Roles {
		if role == "storage" {
			if len(claim) == 0 {
				claim = append(claim, "role storage")
			}
			continue
		}
		roles = append(roles, role)
	}
	r.Pool, r.Capacity, r.DataAddress, r.Roles = "", 0, "", roles
	return strings.Join(claim, ", ")
}

func (c *Controller) heartbeat(ctx context.Context, r agentapi.NodeReport, admin bool) (agentapi.Assignment, error) {
	var reply agentapi.Assignment
	if r.Name == "" {
		return reply, &lifecycle.UserError{Msg: "heartbeat without a node name"}
	}
	err := c.store.Update(ctx, func(tx *store.Tx) error {
		n, err := store.Nodes.Get(tx, r.Name)
		if store.IsNotFound(err) {
			n = &model.Node{Name: r.Name}
		} else if err != nil {
			return err
		}
		wasOnline := c.now().Sub(n.LastSeen) < c.cfg.Controller.NodeTimeout.D()
		if n.Pool != "" || n.Capacity > 0 {
			n.StorageAdmitted = true // a storage node recorded before admission existed, or put in a pool by an administrator
		}
		claim := ""
		switch {
		case n.StorageAdmitted:
		case admin:
			n.StorageAdmitted = r.Pool != "" || r.Capacity > 0
		default:
			claim = withoutStorage(&r)
		}
		if claim != n.StorageClaim && claim != "" {
			c.log.Warn("node claims storage without an administrator's grant; it takes no fragments until one admits it (dwcli update node --name "+r.Name+" --storage)",
				"node", r.Name, "claim", claim)
		}
		n.StorageClaim = claim
		if n.PoolAssigned {
			r.Pool = n.Pool // an administrator's choice (dwcli update node --pool) outranks agent.pool
		} else if r.Pool != "" {
			if _, err := store.Pools.Get(tx, r.Pool); err != nil {
				return &lifecycle.UserError{Msg: fmt.Sprintf("node %s reports pool %q, which does not exist; create it (dwcli create pool --name %s --granularity 1GiB) or fix agent.pool", r.Name, r.Pool, r.Pool)}
			}
		}
		n.Pool, n.Capacity, n.Address, n.Roles = r.Pool, r.Capacity, r.Address, r.Roles
		n.DataAddress = r.DataAddress
		n.Version, n.Health = r.Version, r.Health
		if !slices.Equal(n.Warnings, r.Warnings) && len(r.Warnings) > 0 {
			c.log.Warn("node reports a configuration problem", "node", r.Name, "warnings", strings.Join(r.Warnings, "; "))
		}
		n.Warnings = r.Warnings
		// Endurance: the bytes the data path wrote to the node's fragments, summed from
		// the counters' growth (they outlive the fragments); an agent reporting more of its
		// own (r.Written) is believed.
		written, err := recordUsage(tx, &c.usageRows, r.Name, r.Usage.Fragments, c.now(), 0, c.cfg.Controller.AccountingBatch)
		if err != nil {
			return err
		}
		n.Written = max(n.Written+written, r.Written)
		if err := recordSwapUsage(tx, r.Name, r.Usage.Swaps); err != nil {
			return err
		}
		n.LastSeen = c.now()
		n.Online = true
		if !wasOnline {
			c.log.Info("node online", "node", r.Name, "address", r.Address)
		}
		c.noteHealth(n, r)
		if err := store.Nodes.Put(tx, n); err != nil {
			return err
		}
		return nil
	})
	if err == nil {
		// The mounts asked of the node and not yet recorded, read before the state: one
		// recorded after this read is in the snapshot below (mountsInFlight).
		c.mu.Lock()
		var asked []agentapi.MountSpec
		for _, m := range c.mountsInFlight[r.Name] {
			asked = append(asked, m)
		}
		c.mu.Unlock()
		// What lives on the node, read after the report is in (a snapshot as consistent as
		// the write's, which writers need not wait for): the node's objects by index.
		err = c.store.View(ctx, func(tx *store.Tx) error {
			w, err := c.nodeWorld(tx, r.Name)
			if err != nil {
				return err
			}
			reply = liveOn(w, r.Name)
			reply.Swaps = lifecycle.LiveSwaps(w, r.Name, c.params)
			for i := range reply.Mounts {
				reply.Mounts[i] = c.grant(reply.Mounts[i], r.Name)
			}
			for _, m := range asked {
				if !slices.ContainsFunc(reply.Mounts, func(l agentapi.MountSpec) bool { return l.MountPath == m.MountPath }) {
					reply.Mounts = append(reply.Mounts, m)
				}
			}
			v, err := store.Meta.Get(tx, clusterIDKey)
			if err != nil {
				return err
			}
			reply.ClusterID = v.Value
			return nil
		})
	}
	c.mu.Lock()
	if c.remoteAt[r.Name] != r.Address {
		delete(c.remote, r.Name)
	}
	c.mu.Unlock()
	c.wakeUp()
	return reply, err
}

// noteHealth records a storage node's reported wear and data-path errors (lifecycle decides
// what they mean) and logs what changed.
func (c *Controller) noteHealth(n *model.Node, r agentapi.NodeReport) {
	wasWorn := n.Worn
	if drained := lifecycle.NodeReported(n, r, c.params.Health, c.now()); drained != "" {
		c.log.Warn("node drained", "node", n.Name, "reason", drained)
	}
	if n.Worn && !wasWorn {
		c.log.Warn("node takes no new fragments", "node", n.Name, "reason", lifecycle.WornReason(n))
	}
}

// liveOn lists the fragments, namespaces and actualized mounts the world keeps on a node.
func liveOn(w *lifecycle.World, node string) agentapi.Assignment {
	var r agentapi.Assignment
	for _, f := range w.Fragments {
		if f.Node == node {
			r.Fragments = append(r.Fragments, f.ID)
		}
	}
	for _, ns := range w.Namespaces {
		if f := w.Fragments[ns.FragmentID]; f != nil && f.Node == node {
			r.Namespaces = append(r.Namespaces, agentapi.NamespaceSpec{ID: ns.ID, FragmentID: f.ID, InstanceID: f.InstanceID})
		}
	}
	r.Mounts = lifecycle.LiveMounts(w, node)
	r.Expected = lifecycle.ExpectedMounts(w, node)
	return r
}

// agentFor returns the agent of a node.
func (c *Controller) agentFor(w *lifecycle.World, name string) (agentapi.Agent, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a, ok := c.local[name]; ok {
		return a, nil
	}
	n := w.Nodes[name]
	if n == nil {
		return nil, fmt.Errorf("node %s is not registered", name)
	}
	if a, ok := c.remote[name]; ok && c.remoteAt[name] == n.Address {
		return a, nil
	}
	if c.dial == nil || n.Address == "" {
		return nil, fmt.Errorf("node %s has no agent address", name)
	}
	a, err := c.dial(n)
	if err != nil {
		return nil, err
	}
	c.remote[name], c.remoteAt[name] = a, n.Address
	return a, nil
}

// ErrorKind classifies an error for the API: user (400), not_found (404), busy (409),
// not_leader (503: a highly available controller that does not lead), internal (500).
func ErrorKind(err error) string {
	var ue *lifecycle.UserError
	var le *lifecycle.LimitError
	switch {
	case errors.Is(err, store.ErrFenced):
		return "not_leader"
	case errors.As(err, &ue):
		return "user"
	case errors.As(err, &le):
		return "too_large"
	case errors.Is(err, lifecycle.ErrNoSession):
		return "not_found"
	case errors.Is(err, lifecycle.ErrBusy):
		return "busy"
	case errors.Is(err, lifecycle.ErrTokenTaken):
		return "taken"
	}
	return "internal"
}

// leaseBook holds the leases of `spillway run` sessions, in memory: after a restart every run
// session gets a fresh lease, which its run, if alive, renews.
type leaseBook struct {
	mu        sync.Mutex
	expires   map[string]time.Time
	released  map[string]bool // the run ended on purpose, keeping the session: no cleanup
	abandoned map[string]bool // cleaned up after its run (released, or kept on a failure)
}

// RenewLease extends the lease of a run session (release: the run ends and keeps the session
// on purpose) and returns the lease's length (0: leases are off).
func (c *Controller) RenewLease(ctx context.Context, token string, release bool) (time.Duration, error) {
	w, err := c.viewSession(ctx, token)
	if err != nil {
		return 0, err
	}
	if w.SessionByToken(token) == nil {
		return 0, lifecycle.ErrNoSession
	}
	lease := c.cfg.Controller.RunLease.D()
	b := &c.leases
	b.mu.Lock()
	defer b.mu.Unlock()
	b.init()
	if release {
		b.released[token] = true
		delete(b.expires, token)
		return lease, nil
	}
	delete(b.released, token)
	delete(b.abandoned, token) // a retry of a kept session is its run again
	b.expires[token] = c.now().Add(lease)
	return lease, nil
}

// Lead runs the executor for one term of a highly available controller's leadership (package
// ha), until ctx ends. The run leases of an earlier term are forgotten, as after a restart:
// the runs renewed them with another leader meanwhile.
func (c *Controller) Lead(ctx context.Context) error {
	c.leases.mu.Lock()
	c.leases.expires, c.leases.released, c.leases.abandoned = nil, nil, nil
	c.leases.mu.Unlock()
	return c.Run(ctx)
}

func (b *leaseBook) init() {
	if b.expires == nil {
		b.expires, b.released, b.abandoned = map[string]time.Time{}, map[string]bool{}, map[string]bool{}
	}
}

// finishAbandonedRuns takes the sessions of `spillway run`s whose lease ran out one step
// further toward their end (lifecycle.AdvanceAbandoned), every RunLease/4.
func (c *Controller) finishAbandonedRuns(ctx context.Context) {
	lease := c.cfg.Controller.RunLease.D()
	if lease <= 0 {
		return
	}
	tick := time.NewTicker(max(lease/4, 50*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var sessions []*model.Session // the sessions alone: none of their objects is needed
		if err := c.store.View(ctx, func(tx *store.Tx) error {
			var err error
			sessions, err = store.Sessions.List(tx)
			return err
		}); err != nil {
			continue
		}
		now := c.now()
		var due []string
		b := &c.leases
		b.mu.Lock()
		b.init()
		live := map[string]bool{}
		for _, s := range sessions {
			if s.Creator != runCreator || s.Persistent || s.State.Goal == model.GoalDestroy {
				continue
			}
			live[s.Token] = true
			expires, seen := b.expires[s.Token]
			switch {
			case b.released[s.Token] || b.abandoned[s.Token]:
			case !seen:
				b.expires[s.Token] = now.Add(lease) // first seen (or the controller restarted)
			case now.After(expires):
				due = append(due, s.Token)
			}
		}
		for token := range b.expires {
			if !live[token] {
				delete(b.expires, token)
				delete(b.released, token)
				delete(b.abandoned, token)
			}
		}
		b.mu.Unlock()
		for _, token := range due {
			var done bool
			err := c.decideOn(ctx, token, nil, "", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
				var err error
				done, err = lifecycle.AdvanceAbandoned(w, token)
				return err
			})
			if err != nil {
				c.log.Warn("finishing the session of a gone spillway run", "token", token, "err", err)
				continue
			}
			if done {
				c.log.Info("finished the session of a spillway run that stopped renewing its lease (controller.run_lease)", "token", token)
				b.mu.Lock()
				b.abandoned[token] = true
				b.mu.Unlock()
			}
		}
	}
}

// runCreator is the creator of `spillway run`'s sessions.
const runCreator = "RUN"

// SetSecret gives the controller the cluster's secret, with which it grants each remote mount
// a capability (package nodekey). Without it mounts carry none, and storage nodes that hold
// the secret themselves accept the secret instead.
func (c *Controller) SetSecret(secret string) {
	if _, isNode := nodekey.Node(secret); !isNode {
		c.secret = secret
	}
}

// grant adds to a mount order for compute node client the capability to open its namespace on
// its storage node, valid controller.mount_capability_lifetime.
func (c *Controller) grant(spec agentapi.MountSpec, client string) agentapi.MountSpec {
	if c.secret == "" || spec.StorageNode == "" {
		return spec
	}
	// sign grants client one fragment's namespace (or stripe objects) on storage node.
	sign := func(node string, fragment, namespace int64, stripes bool) (capability, key string) {
		capability = nodekey.Capability{Fragment: fragment, Namespace: namespace, Instance: spec.InstanceID, Stripes: stripes,
			Client: client, ReadOnly: spec.ReadOnly, MaxFileSize: spec.MaxFileSize,
			Expires: c.now().Add(c.cfg.Controller.MountCapabilityLifetime.D()).Unix()}.String()
		return capability, nodekey.SessionKey(nodekey.Derive(c.secret, node), capability)
	}
	spec.Capability, spec.CapabilityKey = sign(spec.StorageNode, spec.FragmentID, spec.NamespaceID, false)
	// A striped instance's data: each server's stripe objects. A loadbalance one's: each
	// replica. A max_mds namespace's: each shard.
	if len(spec.Stripes) > 0 {
		stripes := make([]agentapi.StripeServer, len(spec.Stripes))
		for i, st := range spec.Stripes {
			// The namespace whose files' data the objects hold: what the session counts to.
			st.Capability, st.CapabilityKey = sign(st.Node, st.FragmentID, spec.NamespaceID, true)
			stripes[i] = st
		}
		spec.Stripes = stripes
	}
	if len(spec.Replicas) > 0 {
		replicas := make([]agentapi.Replica, len(spec.Replicas))
		for i, r := range spec.Replicas {
			r.Capability, r.CapabilityKey = sign(r.Node, r.FragmentID, r.NamespaceID, false)
			replicas[i] = r
		}
		spec.Replicas = replicas
	}
	if len(spec.MDS) > 0 { // the shards of a namespace spread over every server (max_mds)
		shards := make([]agentapi.Replica, len(spec.MDS))
		for i, r := range spec.MDS {
			r.Capability, r.CapabilityKey = sign(r.Node, r.FragmentID, r.NamespaceID, false)
			shards[i] = r
		}
		spec.MDS = shards
	}
	return spec
}

// CreateInstance places an instance by hand for the session of token (dwcli create instance)
// and returns its id.
func (c *Controller) CreateInstance(ctx context.Context, token string, req lifecycle.ManualInstance) (int64, error) {
	var id int64
	err := c.decide(ctx, "", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		var err error
		id, err = lifecycle.ApplyCreateInstance(w, token, req, ids, c.params, now)
		return err
	})
	return id, err
}

// CreateConfiguration adds a configuration by hand to an instance of the session of token
// (dwcli create configuration) and returns its id.
func (c *Controller) CreateConfiguration(ctx context.Context, token string, req lifecycle.ManualConfiguration) (int64, error) {
	var id int64
	err := c.decide(ctx, "", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		var err error
		id, err = lifecycle.ApplyCreateConfiguration(w, token, req, ids, c.params)
		return err
	})
	return id, err
}

// CreateActivation mounts a configuration by hand on the compute nodes of the session of
// token (dwcli create activation) and returns the activations' ids.
func (c *Controller) CreateActivation(ctx context.Context, token string, req lifecycle.ManualActivation) ([]int64, error) {
	var made []int64
	err := c.decide(ctx, "", func(w *lifecycle.World, ids lifecycle.IDSource, now time.Time) error {
		var err error
		made, err = lifecycle.ApplyCreateActivation(w, token, req, ids, c.params)
		return err
	})
	return made, err
}
