package controller

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/metrics"
	"github.com/spillway-hpc/spillway/internal/model"
)

// The controller's metrics (docs/admin.md, "Metrics"). The gauges of the state (sessions,
// capacity, stages, nodes) are computed at scrape time from the whole state: the world the
// executor loaded at its latest pass when that pass looked at everything (its first), else
// read in a read transaction at the scrape (the executor's passes look at the due sessions
// only, executor.go). The executor's and the stages' counters are counted as
// effects run and as the passes see stages finish.

var sessionPhases = []string{lifecycle.PhaseSetup, lifecycle.PhaseDataIn, lifecycle.PhasePreRun,
	lifecycle.PhasePostRun, lifecycle.PhaseDataOut, lifecycle.PhaseTeardown}

var stageStatuses = []string{model.StageDeferred, model.StagePending, model.StageRunning,
	model.StageComplete, model.StageFailed, model.StageCanceled}

var stageDirections = []string{model.StageIn, model.StageOut}

var effectOps = []string{lifecycle.OpCreateFragment, lifecycle.OpDeleteFragment, lifecycle.OpCreateNamespace,
	lifecycle.OpDeleteNamespace, lifecycle.OpMount, lifecycle.OpUnmount, lifecycle.OpStartStage,
	lifecycle.OpPollStage, lifecycle.OpCancelStage, lifecycle.OpFlushCache}

var objectKinds = []string{lifecycle.KindSession, lifecycle.KindInstance, lifecycle.KindFragment,
	lifecycle.KindConfiguration, lifecycle.KindNamespace, lifecycle.KindRegistration,
	lifecycle.KindActivation, lifecycle.KindStage}

// effectMetrics are one effect operation's counters, resolved once.
type effectMetrics struct {
	ok, failed prometheus.Counter
	retries    prometheus.Counter
	seconds    prometheus.Observer
}

type controllerMetrics struct {
	reg *prometheus.Registry

	world atomic.Pointer[lifecycle.World] // the latest pass's
	c     *Controller

	effectsDue prometheus.Gauge
	passes     prometheus.Counter
	effects    map[string]*effectMetrics // by lifecycle.Op*

	stageBytes    *prometheus.CounterVec
	stageSeconds  *prometheus.HistogramVec
	stagesEnded   *prometheus.CounterVec
	stagesMu      sync.Mutex
	stagesSeeded  bool
	stagesCounted map[int64]int64 // terminal stages already counted, and their sessions
	// stale: the latest pass looked at some sessions only (the due ones): a scrape reads the
	// state instead of the pass's world.
	stale atomic.Bool

	sessions, sessionsFailed, instances, instanceBytes, poolCapacity, poolAllocated, poolFree,
	nodeCapacity, nodeAllocated, nodeFree, nodeOnline, nodeDrained, nodeWorn, nodeEndurance, stages, activations,
	fuseBlown, inFlight *prometheus.Desc
}

func newControllerMetrics(c *Controller) *controllerMetrics {
	ns := metrics.Namespace
	m := &controllerMetrics{reg: metrics.NewRegistry(), c: c, effects: map[string]*effectMetrics{}, stagesCounted: map[int64]int64{}}
	m.effectsDue = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: "executor", Name: "effects_due",
		Help: "Effects (agent calls) the executor's latest pass found due: its queue, in flight ones included."})
	m.passes = prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "executor", Name: "passes_total",
		Help: "Passes of the executor over the state."})
	effects := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "executor", Name: "effects_total",
		Help: "Effects run on agents, by operation and outcome (ok, failed)."}, []string{"op", "outcome"})
	retries := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "executor", Name: "retries_total",
		Help: "Effects run again after a failed attempt on the same object, by operation."}, []string{"op"})
	seconds := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: "executor", Name: "effect_duration_seconds",
		Help: "Time of one effect's call to its agent, by operation.", Buckets: metrics.EffectBuckets}, []string{"op"})
	for _, op := range effectOps {
		m.effects[op] = &effectMetrics{ok: effects.WithLabelValues(op, "ok"), failed: effects.WithLabelValues(op, "failed"),
			retries: retries.WithLabelValues(op), seconds: seconds.WithLabelValues(op)}
	}
	m.stageBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "stage", Name: "bytes_total",
		Help: "Bytes moved by stages that ended (complete, failed or canceled), by direction (in: PFS to the burst buffer; out: back)."}, []string{"direction"})
	m.stageSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: "stage", Name: "duration_seconds",
		Help: "Time from a stage's start to its end, by direction.", Buckets: metrics.EffectBuckets}, []string{"direction"})
	m.stagesEnded = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "stage", Name: "ended_total",
		Help: "Stages that ended, by direction and status (complete, failed, canceled)."}, []string{"direction", "status"})
	for _, d := range stageDirections {
		m.stageBytes.WithLabelValues(d)
		m.stageSeconds.WithLabelValues(d)
		for _, s := range []string{model.StageComplete, model.StageFailed, model.StageCanceled} {
			m.stagesEnded.WithLabelValues(d, s)
		}
	}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, "", name), help, labels, nil)
	}
	m.sessions = d("sessions", "Sessions by the step they are in (setup, data_in, pre_run, post_run, data_out, teardown) and kind (job, persistent).", "phase", "kind")
	m.sessionsFailed = d("sessions_failed", "Sessions whose last step failed or whose fuse blew: they wait for an operator or a teardown.", "kind")
	m.instances = d("instances", "Instances, by pool.", "pool")
	m.instanceBytes = d("instance_capacity_bytes", "Capacity granted to instances (whole grains), by pool.", "pool")
	m.poolCapacity = d("pool_capacity_bytes", "Capacity the pool's storage nodes offer, all of them.", "pool")
	m.poolAllocated = d("pool_allocated_bytes", "Capacity of the pool held by fragments.", "pool")
	m.poolFree = d("pool_free_bytes", "Capacity a new instance can get: what fragments leave free on the pool's online nodes that are neither drained nor worn.", "pool")
	m.nodeCapacity = d("node_capacity_bytes", "Capacity a storage node offers.", "node", "pool")
	m.nodeAllocated = d("node_allocated_bytes", "Capacity of a storage node held by fragments.", "node", "pool")
	m.nodeFree = d("node_free_bytes", "Capacity of a storage node no fragment holds (offline and drained nodes included).", "node", "pool")
	m.nodeOnline = d("node_online", "1 when the node's agent reported within controller.node_timeout and no administrator holds it offline.", "node")
	m.nodeDrained = d("node_drained", "1 when the node is drained, by an administrator or by auto-drain.", "node")
	m.nodeWorn = d("node_worn", "1 when the node's SSD endurance is below controller.endurance_threshold: it takes no new fragments.", "node")
	m.nodeEndurance = d("node_endurance_remaining_percent", "SSD endurance left, in percent of the device's rated life, as the node's agent last reported it (nodes whose wear is unknown have none).", "node")
	m.stages = d("stages", "Stages by direction and status (deferred, pending, running, complete, failed, canceled).", "direction", "status")
	m.activations = d("activations", "Mounts of configurations on compute nodes (activations), by goal (create, destroy).", "goal")
	m.fuseBlown = d("fuse_blown_objects", "Objects whose effect failed executor.max_attempts times (F in dwstat): they wait for an operator.", "kind")
	m.inFlight = prometheus.NewDesc(prometheus.BuildFQName(ns, "executor", "in_flight"), "Effects running on agents now (at most executor.max_in_flight).", nil, nil)
	m.reg.MustRegister(m.effectsDue, m.passes, effects, retries, seconds, m.stageBytes, m.stageSeconds, m.stagesEnded, m)
	return m
}

// Registry is the controller's metrics registry (served on controller.metrics_listen).
func (c *Controller) Registry() *prometheus.Registry { return c.metrics.reg }

// pass records one executor pass: its world (for the gauges), the effects it found due, and
// the stages that ended since the last one.
func (m *controllerMetrics) pass(w *lifecycle.World, due int) { m.passOver(w, due, true) }

// passOver records a pass over w, the whole state or (whole false) the due sessions only;
// w nil: a pass that found no session to look at (the state's gauges are read at the scrape,
// as after any pass that did not see the whole state).
func (m *controllerMetrics) passOver(w *lifecycle.World, due int, whole bool) {
	m.passes.Inc()
	m.effectsDue.Set(float64(due))
	if w == nil {
		m.stale.Store(true)
		return
	}
	m.world.Store(w)
	m.stale.Store(!whole)
	m.stagesOver(w, whole)
}

// stagesOver counts the stages of w that ended since they were last seen (a pass's world, or
// an effect's outcome's: an outcome that steps its session may settle it with its stage
// ended, and no pass then looks at it).
func (m *controllerMetrics) stagesOver(w *lifecycle.World, whole bool) {
	m.stagesMu.Lock()
	defer m.stagesMu.Unlock()
	for id, s := range w.Stages {
		if _, counted := m.stagesCounted[id]; !stageEnded(s.Status) || counted {
			continue
		}
		m.stagesCounted[id] = s.SessionID
		if !m.stagesSeeded {
			continue // ended before this controller started: counted by the one before
		}
		m.stageBytes.WithLabelValues(s.Direction).Add(float64(s.BytesDone))
		m.stagesEnded.WithLabelValues(s.Direction, s.Status).Inc()
		if !s.Started.IsZero() && !s.Finished.IsZero() && s.Finished.After(s.Started) {
			m.stageSeconds.WithLabelValues(s.Direction).Observe(s.Finished.Sub(s.Started).Seconds())
		}
	}
	m.stagesSeeded = true
	for id, session := range m.stagesCounted {
		if _, ok := w.Stages[id]; !ok && (whole || w.Sessions[session] != nil) {
			delete(m.stagesCounted, id)
		}
	}
}

func stageEnded(status string) bool {
	return status == model.StageComplete || status == model.StageFailed || status == model.StageCanceled
}

// effect records one effect's call: its duration and outcome, and whether it was a retry.
func (m *controllerMetrics) effect(w *lifecycle.World, e lifecycle.Effect, elapsed time.Duration, err error) {
	em := m.effects[e.Op]
	if em == nil {
		return
	}
	em.seconds.Observe(elapsed.Seconds())
	if err != nil {
		em.failed.Inc()
	} else {
		em.ok.Inc()
	}
	if st := stateOf(w, e.Ref); st != nil && st.Attempts > 0 && !isPoll(e) {
		em.retries.Inc()
	}
}

// stateOf is the state of the object an effect is for, nil if it is gone.
func stateOf(w *lifecycle.World, r lifecycle.Ref) *model.State {
	switch r.Kind {
	case lifecycle.KindFragment:
		if o := w.Fragments[r.ID]; o != nil {
			return &o.State
		}
	case lifecycle.KindNamespace:
		if o := w.Namespaces[r.ID]; o != nil {
			return &o.State
		}
	case lifecycle.KindActivation:
		if o := w.Activations[r.ID]; o != nil {
			return &o.State
		}
	case lifecycle.KindStage:
		if o := w.Stages[r.ID]; o != nil {
			return &o.State
		}
	}
	return nil
}

// Describe implements prometheus.Collector.
func (m *controllerMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.sessions, m.sessionsFailed, m.instances, m.instanceBytes, m.poolCapacity,
		m.poolAllocated, m.poolFree, m.nodeCapacity, m.nodeAllocated, m.nodeFree, m.nodeOnline, m.nodeDrained,
		m.nodeWorn, m.nodeEndurance, m.stages, m.activations, m.fuseBlown, m.inFlight} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the gauges of the latest pass's world.
func (m *controllerMetrics) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	m.c.mu.Lock()
	inFlight := len(m.c.inflight)
	m.c.mu.Unlock()
	gauge(m.inFlight, float64(inFlight))
	w := m.world.Load()
	if w == nil {
		return // no pass yet
	}
	if m.stale.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), m.c.cfg.Controller.RequestTimeout.D())
		whole, err := m.c.viewShared(ctx) // read only
		cancel()
		if err != nil {
			return
		}
		w = whole
	}
	kind := func(persistent bool) string {
		if persistent {
			return "persistent"
		}
		return "job"
	}
	type phaseKind struct{ phase, kind string }
	sessions := map[phaseKind]int{}
	for _, p := range sessionPhases {
		sessions[phaseKind{p, "job"}] = 0
		sessions[phaseKind{p, "persistent"}] = 0
	}
	failed := map[string]int{"job": 0, "persistent": 0}
	for _, s := range w.Sessions {
		sessions[phaseKind{s.Phase, kind(s.Persistent)}]++
		if s.Failure != "" || s.State.FuseBlown {
			failed[kind(s.Persistent)]++
		}
	}
	for k, n := range sessions {
		gauge(m.sessions, float64(n), k.phase, k.kind)
	}
	for k, n := range failed {
		gauge(m.sessionsFailed, float64(n), k)
	}
	type poolSums struct{ instances, instanceBytes, capacity, allocated, free float64 }
	pools := map[string]*poolSums{}
	for name := range w.Pools {
		pools[name] = &poolSums{}
	}
	pool := func(name string) *poolSums {
		p := pools[name]
		if p == nil {
			p = &poolSums{}
			pools[name] = p
		}
		return p
	}
	for _, in := range w.Instances {
		p := pool(in.Pool)
		p.instances++
		p.instanceBytes += float64(in.Capacity)
	}
	allocated := map[string]uint64{}
	for _, f := range w.Fragments {
		allocated[f.Node] += f.Capacity
	}
	for _, n := range w.Nodes {
		gauge(m.nodeOnline, b2f(n.Online), n.Name)
		gauge(m.nodeDrained, b2f(n.Drain), n.Name)
		if n.Pool == "" {
			continue // compute only
		}
		gauge(m.nodeWorn, b2f(n.Worn), n.Name)
		if n.Endurance != nil && n.Endurance.Known {
			gauge(m.nodeEndurance, float64(n.Endurance.Remaining()), n.Name)
		}
		used := allocated[n.Name]
		free := n.Capacity - min(used, n.Capacity)
		gauge(m.nodeCapacity, float64(n.Capacity), n.Name, n.Pool)
		gauge(m.nodeAllocated, float64(used), n.Name, n.Pool)
		gauge(m.nodeFree, float64(free), n.Name, n.Pool)
		p := pool(n.Pool)
		p.capacity += float64(n.Capacity)
		p.allocated += float64(used)
		if n.Online && !n.Drain && !n.Worn { // as alloc's eligible nodes
			p.free += float64(free)
		}
	}
	for name, p := range pools {
		gauge(m.instances, p.instances, name)
		gauge(m.instanceBytes, p.instanceBytes, name)
		gauge(m.poolCapacity, p.capacity, name)
		gauge(m.poolAllocated, p.allocated, name)
		gauge(m.poolFree, p.free, name)
	}
	type dirStatus struct{ dir, status string }
	stages := map[dirStatus]int{}
	for _, d := range stageDirections {
		for _, s := range stageStatuses {
			stages[dirStatus{d, s}] = 0
		}
	}
	for _, s := range w.Stages {
		stages[dirStatus{s.Direction, s.Status}]++
	}
	for k, n := range stages {
		gauge(m.stages, float64(n), k.dir, k.status)
	}
	activations := map[string]int{model.GoalCreate: 0, model.GoalDestroy: 0}
	for _, a := range w.Activations {
		activations[a.State.Goal]++
	}
	for g, n := range activations {
		gauge(m.activations, float64(n), g)
	}
	blown := map[string]int{}
	for _, k := range objectKinds {
		blown[k] = 0
	}
	count := func(k string, st model.State) {
		if st.FuseBlown {
			blown[k]++
		}
	}
	for _, o := range w.Sessions {
		count(lifecycle.KindSession, o.State)
	}
	for _, o := range w.Instances {
		count(lifecycle.KindInstance, o.State)
	}
	for _, o := range w.Fragments {
		count(lifecycle.KindFragment, o.State)
	}
	for _, o := range w.Configurations {
		count(lifecycle.KindConfiguration, o.State)
	}
	for _, o := range w.Namespaces {
		count(lifecycle.KindNamespace, o.State)
	}
	for _, o := range w.Registrations {
		count(lifecycle.KindRegistration, o.State)
	}
	for _, o := range w.Activations {
		count(lifecycle.KindActivation, o.State)
	}
	for _, o := range w.Stages {
		count(lifecycle.KindStage, o.State)
	}
	for k, n := range blown {
		gauge(m.fuseBlown, float64(n), k)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
