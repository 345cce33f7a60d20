// Package lifecycle is the pure core of Spillway's controller: given a snapshot of every
// object (a World) it decides what a WLM request changes (Apply), what the executor must do
// next (Step) and what an effect's outcome changes (Complete). It performs no I/O and reads no
// clock: time and new ids are passed in. The executor in package controller persists every
// change before it runs the side effects Step asks for, and every side effect is idempotent,
// so a controller killed at any point resumes where it was.
//
// A job session moves through DataWarp's steps, each requested by the WLM:
//
//	setup → data_in → pre_run → (job runs) → post_run → data_out → teardown
//
// A persistent session is created by setup (Persistent) and destroyed by teardown. Every
// object carries a goal (create or destroy) and whether it is actualized; a step is finished
// when the objects it touched have reached their goals.
package lifecycle

import (
	"cmp"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"slices"
	"sort"

	"github.com/spillway-hpc/spillway/internal/model"
)

// ID is an object id.
type ID = model.ID

// World is a consistent snapshot of the controller's state.
type World struct {
	Pools          map[string]*model.Pool
	Nodes          map[string]*model.Node
	Sessions       map[ID]*model.Session
	Instances      map[ID]*model.Instance
	Fragments      map[ID]*model.Fragment
	Configurations map[ID]*model.Configuration
	Namespaces     map[ID]*model.Namespace
	Registrations  map[ID]*model.Registration
	Activations    map[ID]*model.Activation
	Stages         map[ID]*model.Stage
	// Elsewhere is what the state holds beyond this world, when it was loaded for some
	// sessions only (a request's, the executor's due ones); zero for the whole state.
	Elsewhere Elsewhere

	changes Changes

	// indexed: the world was loaded whole and asked for its parent index (Index); children
	// is that index, nil until a lookup builds it again (put and remove drop it).
	indexed  bool
	children *childIndex
	// walks counts the lookups that walked a whole map of the world, and the builds of its
	// index: what a request's cost grows with (tests check that a request makes a bounded
	// number of them, whatever the number of objects it names).
	walks int
}

// childIndex lists a world's objects by parent, each list in id order: the lookups below
// (InstanceOf, FragmentsOf, ...) answer from it in the cost of their answer, not of the
// world. Without it each lookup walks its whole map, which over a whole state of n sessions
// made a pass over all of them cost n² (20 s of CPU at 11,000 sessions).
type childIndex struct {
	instances      map[ID][]*model.Instance      // by session
	fragments      map[ID][]*model.Fragment      // by instance
	configurations map[ID][]*model.Configuration // by instance
	namespaces     map[ID][]*model.Namespace     // by configuration
	registrations  map[ID][]*model.Registration  // by session
	activations    map[ID][]*model.Activation    // by session
	stages         map[ID][]*model.Stage         // by session
	tokens         map[string]*model.Session
}

// Index makes the lookups by parent use an index, built when first needed and again after
// each change made through the lifecycle. Call it once the world is loaded (the loaders
// fill its maps directly, which the index would not see): a whole state's world.
func (w *World) Index() {
	w.indexed, w.children = true, nil
}

// index returns the parent index, building it if needed; nil when the world has none.
func (w *World) index() *childIndex {
	if !w.indexed {
		return nil
	}
	if w.children == nil {
		w.walks++
		ix := &childIndex{
			instances: byParent(w.Instances, func(o *model.Instance) ID { return o.SessionID }, func(o *model.Instance) ID { return o.ID }),
			fragments: byParent(w.Fragments, func(o *model.Fragment) ID { return o.InstanceID }, func(o *model.Fragment) ID { return o.ID }),
			configurations: byParent(w.Configurations, func(o *model.Configuration) ID { return o.InstanceID },
				func(o *model.Configuration) ID { return o.ID }),
			namespaces:    byParent(w.Namespaces, func(o *model.Namespace) ID { return o.ConfigurationID }, func(o *model.Namespace) ID { return o.ID }),
			registrations: byParent(w.Registrations, func(o *model.Registration) ID { return o.SessionID }, func(o *model.Registration) ID { return o.ID }),
			activations:   byParent(w.Activations, func(o *model.Activation) ID { return o.SessionID }, func(o *model.Activation) ID { return o.ID }),
			stages:        byParent(w.Stages, func(o *model.Stage) ID { return o.SessionID }, func(o *model.Stage) ID { return o.ID }),
			tokens:        make(map[string]*model.Session, len(w.Sessions)),
		}
		for _, s := range w.Sessions {
			ix.tokens[s.Token] = s
		}
		w.children = ix
	}
	return w.children
}

// byParent groups a map's objects by parent, each group in id order.
func byParent[T any](m map[ID]*T, parent, id func(*T) ID) map[ID][]*T {
	out := map[ID][]*T{}
	for _, o := range m {
		out[parent(o)] = append(out[parent(o)], o)
	}
	for _, list := range out {
		slices.SortFunc(list, func(a, b *T) int { return cmp.Compare(id(a), id(b)) })
	}
	return out
}

// Elsewhere counts the objects of the state a partial world does not hold, as far as the
// core needs them: the sessions (controller.max_sessions) and, by node, the grains and
// fragments (the allocator's used grains and instances: an instance has at most one
// fragment on a node).
type Elsewhere struct {
	Sessions int
	Nodes    map[string]NodeShare
	// RunningStages are the stages running, or being started, that this world does not
	// count itself: stage.max_running holds over every session (Step).
	RunningStages int
	// InJobStages are, by session, the in-job stages (libdatawarp's, dwcli stage's) this
	// world does not hold: a request recording in-job stages loads only those of the paths it
	// names, and counts the others for stage.max_job_stages (ApplyCheckedInJobStages).
	InJobStages map[ID]int
}

// NodeShare is what fragments add up to on one node.
type NodeShare struct {
	Grains    uint64
	Fragments int
}

// SessionCount is the number of sessions in the state.
func (w *World) SessionCount() int { return len(w.Sessions) + w.Elsewhere.Sessions }

// NewWorld returns an empty world.
func NewWorld() *World {
	return &World{
		Pools:          map[string]*model.Pool{},
		Nodes:          map[string]*model.Node{},
		Sessions:       map[ID]*model.Session{},
		Instances:      map[ID]*model.Instance{},
		Fragments:      map[ID]*model.Fragment{},
		Configurations: map[ID]*model.Configuration{},
		Namespaces:     map[ID]*model.Namespace{},
		Registrations:  map[ID]*model.Registration{},
		Activations:    map[ID]*model.Activation{},
		Stages:         map[ID]*model.Stage{},
	}
}

// Kinds of objects, as the store names them.
const (
	KindPool          = "pool"
	KindNode          = "node"
	KindSession       = "session"
	KindInstance      = "instance"
	KindFragment      = "fragment"
	KindConfiguration = "configuration"
	KindNamespace     = "namespace"
	KindRegistration  = "registration"
	KindActivation    = "activation"
	KindStage         = "stage"
)

// Ref names one object.
type Ref struct {
	Kind string
	ID   ID
}

// Changes is what a decision did to the world: objects to store (new or modified) and
// objects to delete. The executor persists them in one transaction.
type Changes struct {
	Put    []any // *model.Session, *model.Fragment, ...
	Delete []Ref
	// Archive are finished stages removed with their session (or replaced by a newer
	// request) to keep in the stage history (stage.history of them, the newest).
	Archive []*model.FinishedStage
}

// Empty reports whether nothing changed.
func (c Changes) Empty() bool { return len(c.Put) == 0 && len(c.Delete) == 0 && len(c.Archive) == 0 }

// ChangeCount counts the changes recorded since the last TakeChanges: a caller that steps
// again while it grows knows a step changed something.
func (w *World) ChangeCount() int {
	return len(w.changes.Put) + len(w.changes.Delete) + len(w.changes.Archive)
}

// TakeChanges returns the changes recorded since the last call and forgets them.
func (w *World) TakeChanges() Changes {
	c := w.changes
	w.changes = Changes{}
	return dedupe(c)
}

// dedupe keeps one Put per object (the last state wins: they are the same pointer) and drops
// Puts of objects deleted afterwards.
func dedupe(c Changes) Changes {
	deleted := map[Ref]bool{}
	for _, r := range c.Delete {
		deleted[r] = true
	}
	seen := map[any]bool{}
	var puts []any
	for _, p := range c.Put {
		if seen[p] || deleted[refOf(p)] {
			continue
		}
		seen[p] = true
		puts = append(puts, p)
	}
	return Changes{Put: puts, Delete: c.Delete, Archive: c.Archive}
}

func refOf(obj any) Ref {
	switch o := obj.(type) {
	case *model.Session:
		return Ref{KindSession, o.ID}
	case *model.Instance:
		return Ref{KindInstance, o.ID}
	case *model.Fragment:
		return Ref{KindFragment, o.ID}
	case *model.Configuration:
		return Ref{KindConfiguration, o.ID}
	case *model.Namespace:
		return Ref{KindNamespace, o.ID}
	case *model.Registration:
		return Ref{KindRegistration, o.ID}
	case *model.Activation:
		return Ref{KindActivation, o.ID}
	case *model.Stage:
		return Ref{KindStage, o.ID}
	case *model.Node:
		return Ref{KindNode, 0}
	case *model.Pool:
		return Ref{KindPool, 0}
	}
	panic("lifecycle: unknown object type")
}

// put records a new or modified object and adds it to the world.
func (w *World) put(obj any) {
	if w.children != nil && !w.holds(obj) {
		w.children = nil // a new object: the index is built again when next needed
	}
	switch o := obj.(type) {
	case *model.Session:
		w.Sessions[o.ID] = o
	case *model.Instance:
		w.Instances[o.ID] = o
	case *model.Fragment:
		w.Fragments[o.ID] = o
	case *model.Configuration:
		w.Configurations[o.ID] = o
	case *model.Namespace:
		w.Namespaces[o.ID] = o
	case *model.Registration:
		w.Registrations[o.ID] = o
	case *model.Activation:
		w.Activations[o.ID] = o
	case *model.Stage:
		w.Stages[o.ID] = o
	case *model.Node:
		w.Nodes[o.Name] = o
	}
	w.changes.Put = append(w.changes.Put, obj)
}

// holds says whether obj is in the world already, as this very object (a state change
// made in place leaves the parent index as it was).
func (w *World) holds(obj any) bool {
	switch o := obj.(type) {
	case *model.Session:
		return w.Sessions[o.ID] == o
	case *model.Instance:
		return w.Instances[o.ID] == o
	case *model.Fragment:
		return w.Fragments[o.ID] == o
	case *model.Configuration:
		return w.Configurations[o.ID] == o
	case *model.Namespace:
		return w.Namespaces[o.ID] == o
	case *model.Registration:
		return w.Registrations[o.ID] == o
	case *model.Activation:
		return w.Activations[o.ID] == o
	case *model.Stage:
		return w.Stages[o.ID] == o
	}
	return true // nodes and pools are not indexed
}

// remove deletes an object from the world and records the deletion.
func (w *World) remove(kind string, id ID) {
	w.children = nil
	switch kind {
	case KindSession:
		delete(w.Sessions, id)
	case KindInstance:
		delete(w.Instances, id)
	case KindFragment:
		delete(w.Fragments, id)
	case KindConfiguration:
		delete(w.Configurations, id)
	case KindNamespace:
		delete(w.Namespaces, id)
	case KindRegistration:
		delete(w.Registrations, id)
	case KindActivation:
		delete(w.Activations, id)
	case KindStage:
		delete(w.Stages, id)
	}
	w.changes.Delete = append(w.changes.Delete, Ref{kind, id})
}

// retire removes a stage, keeping it in the stage history when it has ended.
func (w *World) retire(st *model.Stage, s *model.Session) {
	if st.Ended() && s != nil {
		w.changes.Archive = append(w.changes.Archive, &model.FinishedStage{Stage: *st, Token: s.Token, Owner: s.Owner})
	}
	w.remove(KindStage, st.ID)
}

// SessionByToken finds a session by token.
func (w *World) SessionByToken(token string) *model.Session {
	if ix := w.index(); ix != nil {
		return ix.tokens[token]
	}
	w.walks++
	for _, s := range w.Sessions {
		if s.Token == token {
			return s
		}
	}
	return nil
}

// InstanceOf returns the session's instance, or nil when it has no capacity of its own.
// InstancesOf returns every instance of a session in id order: a job may hold a scratch and
// a cache instance (#DW jobdw of each type); a persistent session holds one.
func (w *World) InstancesOf(sessionID ID) []*model.Instance {
	if ix := w.index(); ix != nil {
		return slices.Clone(ix.instances[sessionID])
	}
	w.walks++
	return matching(w.Instances, func(i *model.Instance) bool { return i.SessionID == sessionID }, func(i *model.Instance) ID { return i.ID })
}

func (w *World) InstanceOf(sessionID ID) *model.Instance {
	if ix := w.index(); ix != nil {
		if list := ix.instances[sessionID]; len(list) > 0 {
			return list[0]
		}
		return nil
	}
	w.walks++
	var found *model.Instance
	for _, i := range w.Instances {
		if i.SessionID == sessionID && (found == nil || i.ID < found.ID) {
			found = i
		}
	}
	return found
}

// StripeSize is the stripe size of an instance's pool.
func (w *World) StripeSize(inst *model.Instance) uint64 {
	if p := w.Pools[inst.Pool]; p != nil && p.StripeSize > 0 {
		return p.StripeSize
	}
	return stripe.DefaultSize
}

// FragmentsOf returns an instance's fragments in id order.
func (w *World) FragmentsOf(instanceID ID) []*model.Fragment {
	if ix := w.index(); ix != nil {
		return slices.Clone(ix.fragments[instanceID])
	}
	w.walks++
	return matching(w.Fragments, func(f *model.Fragment) bool { return f.InstanceID == instanceID }, func(f *model.Fragment) ID { return f.ID })
}

// ConfigurationsOf returns an instance's configurations in id order.
func (w *World) ConfigurationsOf(instanceID ID) []*model.Configuration {
	if ix := w.index(); ix != nil {
		return slices.Clone(ix.configurations[instanceID])
	}
	w.walks++
	return matching(w.Configurations, func(c *model.Configuration) bool { return c.InstanceID == instanceID }, func(c *model.Configuration) ID { return c.ID })
}

// ConfigurationByMode returns the instance's configuration with the access mode, or nil.
func (w *World) ConfigurationByMode(instanceID ID, mode string) *model.Configuration {
	for _, c := range w.ConfigurationsOf(instanceID) {
		if c.AccessMode == mode {
			return c
		}
	}
	return nil
}

// NamespacesOf returns a configuration's namespaces in id order.
func (w *World) NamespacesOf(configID ID) []*model.Namespace {
	if ix := w.index(); ix != nil {
		return slices.Clone(ix.namespaces[configID])
	}
	w.walks++
	return matching(w.Namespaces, func(n *model.Namespace) bool { return n.ConfigurationID == configID }, func(n *model.Namespace) ID { return n.ID })
}

// NamespaceFor returns the namespace of a configuration seen by a client node: the shared one
// for striped and loadbalance, the node's own for private.
func (w *World) NamespaceFor(c *model.Configuration, node string) *model.Namespace {
	nss := w.NamespacesOf(c.ID)
	if c.AccessMode == model.AccessLoadbalance && len(nss) > 1 {
		// Replicas: each compute node reads the one its name picks (the first for staging).
		if node == "" {
			return nss[0]
		}
		return nss[spreadIndex(node, len(nss))]
	}
	for _, n := range nss {
		if c.AccessMode != model.AccessPrivate || n.ClientNode == node {
			return n
		}
	}
	return nil
}

// ActivationsOf returns a session's activations in id order.
func (w *World) ActivationsOf(sessionID ID) []*model.Activation {
	if ix := w.index(); ix != nil {
		return slices.Clone(ix.activations[sessionID])
	}
	w.walks++
	return matching(w.Activations, func(a *model.Activation) bool { return a.SessionID == sessionID }, func(a *model.Activation) ID { return a.ID })
}

// StagesOf returns a session's stages in id order.
func (w *World) StagesOf(sessionID ID) []*model.Stage {
	if ix := w.index(); ix != nil {
		return slices.Clone(ix.stages[sessionID])
	}
	w.walks++
	return matching(w.Stages, func(s *model.Stage) bool { return s.SessionID == sessionID }, func(s *model.Stage) ID { return s.ID })
}

// RegistrationsOf returns a session's registrations in id order.
func (w *World) RegistrationsOf(sessionID ID) []*model.Registration {
	if ix := w.index(); ix != nil {
		return slices.Clone(ix.registrations[sessionID])
	}
	w.walks++
	return matching(w.Registrations, func(r *model.Registration) bool { return r.SessionID == sessionID }, func(r *model.Registration) ID { return r.ID })
}

// PersistentByName returns the persistent session with the name, or nil.
func (w *World) PersistentByName(name string) *model.Session {
	s := w.SessionByToken(name)
	if s != nil && s.Persistent {
		return s
	}
	return nil
}

// SortedSessions returns every session in id order.
func (w *World) SortedSessions() []*model.Session {
	var out []*model.Session
	for _, id := range sortedIDs(w.Sessions) {
		out = append(out, w.Sessions[id])
	}
	return out
}

// matching returns the objects of m that keep accepts, in id order: one walk over the map
// and a sort of what matched (not of the whole map).
func matching[T any](m map[ID]*T, keep func(*T) bool, id func(*T) ID) []*T {
	var out []*T
	for _, o := range m {
		if keep(o) {
			out = append(out, o)
		}
	}
	// slices.SortFunc: sort.Slice's reflection cost most of a session's walk (hundreds of
	// stages, walked several times a decision).
	slices.SortFunc(out, func(a, b *T) int { return cmp.Compare(id(a), id(b)) })
	return out
}

func sortedIDs[T any](m map[ID]T) []ID {
	ids := make([]ID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// NodeNames returns the node names in order.
func (w *World) NodeNames() []string {
	names := make([]string, 0, len(w.Nodes))
	for n := range w.Nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// PoolUsage is a pool's size as DataWarp reports it: quantity and free in grains.
type PoolUsage struct {
	Pool     *model.Pool
	Quantity uint64 // grains on every node of the pool
	Free     uint64 // grains free on nodes that take new fragments (online, not drained)
}

// NodeUsage is one storage node's share of its pool.
type NodeUsage struct {
	Node        *model.Node
	Grains      uint64
	Used        uint64
	Instances   int
	Activations int
}

// UsageOfNode computes a node's grains, used grains, instance and activation counts.
func (w *World) UsageOfNode(name string) NodeUsage {
	n := w.Nodes[name]
	u := NodeUsage{Node: n}
	if n == nil {
		return u
	}
	if p := w.Pools[n.Pool]; p != nil && p.Granularity > 0 {
		u.Grains = n.Capacity / p.Granularity
	}
	instances := map[ID]bool{}
	elsewhere := w.Elsewhere.Nodes[name]
	u.Used = elsewhere.Grains
	for _, f := range w.Fragments {
		if f.Node == name {
			u.Used += f.Grains
			instances[f.InstanceID] = true
		}
	}
	u.Instances = len(instances) + elsewhere.Fragments
	for _, a := range w.Activations {
		if a.Node == name {
			u.Activations++
		}
	}
	return u
}

// UsageOfPool computes a pool's quantity and free grains.
func (w *World) UsageOfPool(name string) PoolUsage {
	u := PoolUsage{Pool: w.Pools[name]}
	for _, nodeName := range w.NodeNames() {
		n := w.Nodes[nodeName]
		if n.Pool != name {
			continue
		}
		nu := w.UsageOfNode(nodeName)
		u.Quantity += nu.Grains
		if n.Online && !n.Drain && !n.Worn && nu.Grains > nu.Used {
			u.Free += nu.Grains - nu.Used
		}
	}
	return u
}

// IDSource hands out new object ids (from the store's sequences, inside the transaction).
type IDSource interface {
	NewID(kind string) (ID, error)
}
