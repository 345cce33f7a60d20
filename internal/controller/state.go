package controller

import (
	"fmt"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
)

// loadWorld reads every object in one transaction. Node liveness is derived from the last
// heartbeat, so a controller that was down does not trust stale "online" flags.
func loadWorld(tx *store.Tx, now time.Time, nodeTimeout time.Duration) (*lifecycle.World, error) {
	w, err := loadNodesAndPools(tx, now, nodeTimeout)
	if err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Sessions, w.Sessions, func(o *model.Session) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Instances, w.Instances, func(o *model.Instance) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Fragments, w.Fragments, func(o *model.Fragment) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Configurations, w.Configurations, func(o *model.Configuration) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Namespaces, w.Namespaces, func(o *model.Namespace) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Registrations, w.Registrations, func(o *model.Registration) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Activations, w.Activations, func(o *model.Activation) int64 { return o.ID }); err != nil {
		return nil, err
	}
	if err := loadInto(tx, store.Stages, w.Stages, func(o *model.Stage) int64 { return o.ID }); err != nil {
		return nil, err
	}
	w.Index() // a whole state: lookups by parent through an index, not a walk of everything
	return w, nil
}

// loadSessionWorld reads, through indexes, what a request about one session looks at: the
// pools and nodes, the session (found by its token) with its instance, fragments,
// configurations, namespaces, registrations, activations and stages, and the same of every
// persistent instance it uses. Its cost is that of those objects, not of the state: Status,
// Paths, the ownership checks and the requests on jobs answer from it. A missing token gives
// a world without it; more are other sessions to hold (a setup's persistent instances).
func loadSessionWorld(tx *store.Tx, token string, now time.Time, nodeTimeout time.Duration, more ...string) (*lifecycle.World, error) {
	return loadSessionWorldWhere(tx, token, now, nodeTimeout, nil, more...)
}

// stageFilter picks the stages a decision reads (nil: all). It reads what it is given and
// keeps nothing of it (store.IDTable.ChildrenWhere).
type stageFilter func(*model.Stage) bool

// loadSessionWorldWhere is loadSessionWorld holding only the stages keep keeps: the in-job
// stages it leaves out are counted in the world's Elsewhere.InJobStages.
func loadSessionWorldWhere(tx *store.Tx, token string, now time.Time, nodeTimeout time.Duration, keep stageFilter, more ...string) (*lifecycle.World, error) {
	w, err := loadNodesAndPools(tx, now, nodeTimeout)
	if err != nil {
		return nil, err
	}
	if err := addTokensWhere(tx, w, append([]string{token}, more...), keep); err != nil {
		return nil, err
	}
	return w, countElsewhere(tx, w)
}

// readSessionWorld is loadSessionWorld without the pools, the nodes and the totals: what the
// answers about a session (status, paths, its owner, its stages) read, nothing a decision
// needs.
func readSessionWorld(tx *store.Tx, token string) (*lifecycle.World, error) {
	w := lifecycle.NewWorld()
	return w, addTokens(tx, w, []string{token})
}

// addTokens adds the sessions of tokens (those that exist) with addSession.
func addTokens(tx *store.Tx, w *lifecycle.World, tokens []string) error {
	return addTokensWhere(tx, w, tokens, nil)
}

// addTokensWhere is addTokens with the stages keep keeps (addSessionWhere).
func addTokensWhere(tx *store.Tx, w *lifecycle.World, tokens []string, keep stageFilter) error {
	for _, t := range tokens {
		s, err := store.SessionByToken(tx, t)
		if store.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		if w.Sessions[s.ID] == nil {
			if err := addSessionWhere(tx, w, s, keep); err != nil {
				return err
			}
		}
	}
	return nil
}

// loadNodeWorld reads, through indexes, what lives on a node (liveOn): its fragments with
// their namespaces, and the sessions of its activations with their objects (a mount order
// names the instance's other servers). Not a partial world for decisions: no totals.
func loadNodeWorld(tx *store.Tx, node string, now time.Time, nodeTimeout time.Duration) (*lifecycle.World, error) {
	w, err := loadNodesAndPools(tx, now, nodeTimeout)
	if err != nil {
		return nil, err
	}
	frags, err := store.Fragments.ChildrenOfKey(tx, lifecycle.KindNode, node)
	if err != nil {
		return nil, err
	}
	for _, f := range frags {
		w.Fragments[f.ID] = f
		if err := childrenInto(tx, store.Namespaces, lifecycle.KindFragment, f.ID, w.Namespaces, func(o *model.Namespace) int64 { return o.ID }); err != nil {
			return nil, err
		}
	}
	return w, addActivationSessions(tx, w, node)
}

// addActivationSessions adds the sessions of the node's activations, with their objects (a
// mount order names the instance's other servers).
func addActivationSessions(tx *store.Tx, w *lifecycle.World, node string) error {
	acts, err := store.Activations.ChildrenOfKey(tx, lifecycle.KindNode, node)
	if err != nil {
		return err
	}
	for _, a := range acts {
		if w.Sessions[a.SessionID] != nil {
			continue
		}
		s, err := store.Sessions.Get(tx, a.SessionID)
		if store.IsNotFound(err) {
			w.Activations[a.ID] = a
			continue
		}
		if err != nil {
			return err
		}
		if err := addSession(tx, w, s); err != nil {
			return err
		}
	}
	return nil
}

// nodeWorld is loadNodeWorld for a heartbeat's answer (liveOn). When the transaction knows
// its version (store.Versioned: SQLite), the node's fragments and their namespaces are
// picked from the listings' cache (c.listed), which reads again only the records written
// since the previous listing: a node holding 10,000 fragments cost a query per fragment (its
// namespaces) at every heartbeat. The objects are shared: for reading only.
func (c *Controller) nodeWorld(tx *store.Tx, node string) (*lifecycle.World, error) {
	if !tx.Versioned() {
		return loadNodeWorld(tx, node, c.now(), c.cfg.Controller.NodeTimeout.D())
	}
	w, err := loadNodesAndPools(tx, c.now(), c.cfg.Controller.NodeTimeout.D())
	if err != nil {
		return nil, err
	}
	frags, err := store.Fragments.ListShared(tx, &c.listed)
	if err != nil {
		return nil, err
	}
	for _, f := range frags {
		if f.Node == node {
			w.Fragments[f.ID] = f
		}
	}
	namespaces, err := store.Namespaces.ListShared(tx, &c.listed)
	if err != nil {
		return nil, err
	}
	for _, ns := range namespaces {
		if w.Fragments[ns.FragmentID] != nil {
			w.Namespaces[ns.ID] = ns
		}
	}
	return w, addActivationSessions(tx, w, node)
}

// countElsewhere fills a partial world's Elsewhere from the state's totals: the totals less
// what the world holds.
func countElsewhere(tx *store.Tx, w *lifecycle.World) error {
	t, err := store.ReadTotals(tx)
	if err != nil {
		return err
	}
	running := 0
	for _, st := range w.Stages {
		if st.Status == model.StageRunning {
			running++
		}
	}
	w.Elsewhere = lifecycle.Elsewhere{Sessions: max(0, t.Sessions-len(w.Sessions)), Nodes: map[string]lifecycle.NodeShare{},
		RunningStages: max(0, t.RunningStages-running), InJobStages: w.Elsewhere.InJobStages}
	for node, n := range t.Nodes {
		w.Elsewhere.Nodes[node] = lifecycle.NodeShare{Grains: n.Grains, Fragments: n.Fragments}
	}
	for _, f := range w.Fragments {
		share := w.Elsewhere.Nodes[f.Node]
		share.Grains -= min(share.Grains, f.Grains)
		share.Fragments = max(0, share.Fragments-1)
		w.Elsewhere.Nodes[f.Node] = share
		if share == (lifecycle.NodeShare{}) {
			delete(w.Elsewhere.Nodes, f.Node)
		}
	}
	return nil
}

// loadSessionsWorld is loadSessionWorld for several sessions, by id (the executor's due
// sessions); ids no longer in the state are left out.
func loadSessionsWorld(tx *store.Tx, ids []int64, now time.Time, nodeTimeout time.Duration) (*lifecycle.World, error) {
	w, err := loadNodesAndPools(tx, now, nodeTimeout)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if w.Sessions[id] != nil {
			continue
		}
		s, err := store.Sessions.Get(tx, id)
		if store.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := addSession(tx, w, s); err != nil {
			return nil, err
		}
	}
	// Looked up by parent through an index: a step walks a session's stages several times
	// (each walk a sort of hundreds), and the index is built once per new object.
	w.Index()
	return w, countElsewhere(tx, w)
}

// addSession adds a session, its objects, and the persistent instances it uses with theirs.
func addSession(tx *store.Tx, w *lifecycle.World, s *model.Session) error {
	return addSessionWhere(tx, w, s, nil)
}

// addSessionWhere is addSession with the stages keep keeps (loadSessionObjectsWhere).
func addSessionWhere(tx *store.Tx, w *lifecycle.World, s *model.Session, keep stageFilter) error {
	if err := loadSessionObjectsWhere(tx, w, s, keep); err != nil {
		return err
	}
	for _, name := range s.Uses {
		ps, err := store.SessionByToken(tx, name)
		if store.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		if w.Sessions[ps.ID] != nil {
			continue
		}
		if err := loadSessionObjectsWhere(tx, w, ps, keep); err != nil {
			return err
		}
	}
	return nil
}

// loadSessionObjects adds a session and its objects to w (by the child index).
func loadSessionObjects(tx *store.Tx, w *lifecycle.World, s *model.Session) error {
	return loadSessionObjectsWhere(tx, w, s, nil)
}

// loadSessionObjectsWhere is loadSessionObjects with the stages keep keeps (nil: all); the
// in-job stages it leaves out are counted in w.Elsewhere.InJobStages.
func loadSessionObjectsWhere(tx *store.Tx, w *lifecycle.World, s *model.Session, keep stageFilter) error {
	w.Sessions[s.ID] = s
	if err := childrenInto(tx, store.Registrations, lifecycle.KindSession, s.ID, w.Registrations, func(o *model.Registration) int64 { return o.ID }); err != nil {
		return err
	}
	if err := childrenInto(tx, store.Activations, lifecycle.KindSession, s.ID, w.Activations, func(o *model.Activation) int64 { return o.ID }); err != nil {
		return err
	}
	if keep == nil {
		if err := childrenInto(tx, store.Stages, lifecycle.KindSession, s.ID, w.Stages, func(o *model.Stage) int64 { return o.ID }); err != nil {
			return err
		}
	} else {
		left := 0
		stages, err := store.Stages.ChildrenWhere(tx, lifecycle.KindSession, s.ID, func(st *model.Stage) bool {
			if keep(st) {
				return true
			}
			if st.InJob {
				left++
			}
			return false
		})
		if err != nil {
			return err
		}
		for _, st := range stages {
			w.Stages[st.ID] = st
		}
		if left > 0 {
			if w.Elsewhere.InJobStages == nil {
				w.Elsewhere.InJobStages = map[int64]int{}
			}
			w.Elsewhere.InJobStages[s.ID] += left
		}
	}
	instances, err := store.Instances.ChildrenOf(tx, lifecycle.KindSession, s.ID)
	if err != nil {
		return err
	}
	for _, inst := range instances {
		w.Instances[inst.ID] = inst
		if err := childrenInto(tx, store.Fragments, lifecycle.KindInstance, inst.ID, w.Fragments, func(o *model.Fragment) int64 { return o.ID }); err != nil {
			return err
		}
		configs, err := store.Configurations.ChildrenOf(tx, lifecycle.KindInstance, inst.ID)
		if err != nil {
			return err
		}
		for _, c := range configs {
			w.Configurations[c.ID] = c
			if err := childrenInto(tx, store.Namespaces, lifecycle.KindConfiguration, c.ID, w.Namespaces, func(o *model.Namespace) int64 { return o.ID }); err != nil {
				return err
			}
		}
	}
	return nil
}

func childrenInto[T any](tx *store.Tx, table store.IDTable[T], parentKind string, parentID int64, into map[int64]*T, id func(*T) int64) error {
	children, err := table.ChildrenOf(tx, parentKind, parentID)
	if err != nil {
		return err
	}
	for _, o := range children {
		into[id(o)] = o
	}
	return nil
}

// loadNodesAndPools starts a world with every pool and node.
func loadNodesAndPools(tx *store.Tx, now time.Time, nodeTimeout time.Duration) (*lifecycle.World, error) {
	w := lifecycle.NewWorld()
	pools, err := store.Pools.List(tx)
	if err != nil {
		return nil, err
	}
	for _, p := range pools {
		w.Pools[p.Name] = p
	}
	nodes, err := store.Nodes.List(tx)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		n.Online = !n.HeldOffline && now.Sub(n.LastSeen) < nodeTimeout
		w.Nodes[n.Name] = n
	}
	return w, nil
}

func loadInto[T any](tx *store.Tx, table store.IDTable[T], into map[int64]*T, id func(*T) int64) error {
	all, err := table.List(tx)
	if err != nil {
		return err
	}
	for _, o := range all {
		into[id(o)] = o
	}
	return nil
}

// persist writes a decision's changes in the caller's transaction, and keeps the newest
// stage.history finished stages of those it archives.
// Every session whose objects it changes is marked due (the executor looks at it next).
func (c *Controller) persist(tx *store.Tx, ch lifecycle.Changes) error {
	_, err := c.persistTouched(tx, ch)
	return err
}

// persistTouched is persist that returns the sessions it marked due.
func (c *Controller) persistTouched(tx *store.Tx, ch lifecycle.Changes) (map[int64]bool, error) {
	touched := map[int64]bool{}
	for _, r := range ch.Delete { // while the objects are still there to say whose they are
		if err := touchedBy(tx, r, nil, touched); err != nil {
			return nil, err
		}
	}
	if err := persistObjects(tx, ch, c.now()); err != nil {
		return nil, err
	}
	for _, obj := range ch.Put {
		if err := touchedBy(tx, lifecycle.Ref{}, obj, touched); err != nil {
			return nil, err
		}
	}
	for id := range touched {
		if err := store.MarkDue(tx, id, time.Time{}); err != nil {
			return nil, err
		}
	}
	if len(ch.Archive) == 0 {
		return touched, nil
	}
	for _, st := range ch.Archive {
		if err := store.StageHistory.Put(tx, st); err != nil {
			return nil, err
		}
	}
	return touched, pruneStageHistory(tx, c.cfg.Stage.History)
}

// pruneStageHistory deletes the oldest finished stages beyond keep.
// It reads their ids, not their records: every transaction that ends an in-job stage
// replaced by a newer one archives it, and decoding the whole history each time cost more
// than the rest of the transaction.
func pruneStageHistory(tx *store.Tx, keep int) error {
	kept, err := store.StageHistory.IDs(tx)
	if err != nil {
		return err
	}
	for i := 0; i < len(kept)-keep; i++ {
		if err := store.StageHistory.Delete(tx, kept[i]); err != nil {
			return err
		}
	}
	return nil
}

// loadStageHistory reads the finished stages kept, oldest first.
func loadStageHistory(tx *store.Tx) ([]*model.FinishedStage, error) {
	return store.StageHistory.List(tx)
}

// persistObjects writes the changed objects (now: when). A deleted instance becomes its
// pending accounting record in the same transaction (keepAccounting).
func persistObjects(tx *store.Tx, ch lifecycle.Changes, now time.Time) error {
	for _, obj := range ch.Put {
		if err := store.PutObject(tx, obj); err != nil {
			return fmt.Errorf("persist: %w", err)
		}
	}
	if err := keepAccounting(tx, ch, now); err != nil {
		return err
	}
	for _, r := range ch.Delete {
		var err error
		switch r.Kind {
		case lifecycle.KindSession:
			s, gerr := store.Sessions.Get(tx, r.ID)
			if store.IsNotFound(gerr) {
				continue
			}
			if gerr != nil {
				return gerr
			}
			err = store.DeleteSession(tx, s)
		case lifecycle.KindInstance:
			err = store.Instances.Delete(tx, r.ID)
		case lifecycle.KindFragment:
			err = store.Fragments.Delete(tx, r.ID)
		case lifecycle.KindConfiguration:
			err = store.Configurations.Delete(tx, r.ID)
		case lifecycle.KindNamespace:
			err = store.Namespaces.Delete(tx, r.ID)
		case lifecycle.KindRegistration:
			err = store.Registrations.Delete(tx, r.ID)
		case lifecycle.KindActivation:
			err = store.Activations.Delete(tx, r.ID)
		case lifecycle.KindStage:
			err = store.Stages.Delete(tx, r.ID)
		default:
			err = fmt.Errorf("persist: cannot delete kind %q", r.Kind)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// txIDs draws new ids from the store inside the transaction.
type txIDs struct{ tx *store.Tx }

func (t txIDs) NewID(kind string) (int64, error) { return t.tx.NextSeq(kind) }

// touchedBy adds to touched the session whose object a change stores (obj) or deletes (r):
// the due index gets every session a decision changed. A deleted session touches the
// persistent instances it used (an expired one waits for its jobs to end).
func touchedBy(tx *store.Tx, r lifecycle.Ref, obj any, touched map[int64]bool) error {
	if obj == nil {
		var err error
		switch r.Kind {
		case lifecycle.KindSession:
			obj, err = store.Sessions.Get(tx, r.ID)
		case lifecycle.KindInstance:
			obj, err = store.Instances.Get(tx, r.ID)
		case lifecycle.KindFragment:
			obj, err = store.Fragments.Get(tx, r.ID)
		case lifecycle.KindConfiguration:
			obj, err = store.Configurations.Get(tx, r.ID)
		case lifecycle.KindNamespace:
			obj, err = store.Namespaces.Get(tx, r.ID)
		case lifecycle.KindRegistration:
			obj, err = store.Registrations.Get(tx, r.ID)
		case lifecycle.KindActivation:
			obj, err = store.Activations.Get(tx, r.ID)
		case lifecycle.KindStage:
			obj, err = store.Stages.Get(tx, r.ID)
		default:
			return nil
		}
		if store.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if s, ok := obj.(*model.Session); ok {
			for _, name := range s.Uses {
				if ps, err := store.SessionByToken(tx, name); err == nil {
					touched[ps.ID] = true
				} else if !store.IsNotFound(err) {
					return err
				}
			}
		}
	}
	ofInstance := func(id int64) error {
		inst, err := store.Instances.Get(tx, id)
		if store.IsNotFound(err) {
			return nil
		}
		if err == nil {
			touched[inst.SessionID] = true
		}
		return err
	}
	switch o := obj.(type) {
	case *model.Session:
		touched[o.ID] = true
	case *model.Instance:
		touched[o.SessionID] = true
	case *model.Registration:
		touched[o.SessionID] = true
	case *model.Activation:
		touched[o.SessionID] = true
	case *model.Stage:
		touched[o.SessionID] = true
	case *model.Fragment:
		return ofInstance(o.InstanceID)
	case *model.Configuration:
		return ofInstance(o.InstanceID)
	case *model.Namespace:
		c, err := store.Configurations.Get(tx, o.ConfigurationID)
		if store.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return ofInstance(c.InstanceID)
	}
	return nil
}
