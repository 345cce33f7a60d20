package controller

// Accounting (docs/admin.md#accounting): the data path's counters arrive with every storage
// node's heartbeat (agentapi.NodeReport.Usage) and are kept in the state per fragment
// (store.Usage), written only when they changed. Right before a fragment is deleted the
// executor asks its agent for a report (the heartbeat before may be older than the last
// writes) and persists it, marked final, before the delete runs. When the lifecycle removes an
// instance, the same transaction turns the instance, its session, configurations, stages and
// counters into its accounting record (views.BuildAccounting) and keeps it as pending
// (store.AccountingRecords); the executor then appends it to controller.accounting_log, one
// line, exactly once (appendRecord).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/crashpoint"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/views"
)

// recordUsage keeps the counters a storage node reported for its fragments, writing a
// fragment's row only when they changed, at most limit rows (controller.accounting_batch; the
// stalest first, the others at the next report), and returns the bytes written since the
// counters it had (the node's endurance figure grows by them). Fragments the state does not
// know, or knows on another node, are ignored. finalID's counters are marked as the last.
func recordUsage(tx *store.Tx, rows *store.Rows[model.FragmentUsage], node string, reports []agentapi.FragmentUsage, now time.Time, finalID int64, limit int) (uint64, error) {
	type change struct {
		row   *model.FragmentUsage
		fu    agentapi.FragmentUsage
		final bool
	}
	var changes []change
	for _, fu := range reports {
		row, err := store.Usage.GetCached(tx, rows, fu.Fragment) // the rows not written since the last heartbeat are not read again
		if store.IsNotFound(err) {
			f, ferr := store.Fragments.Get(tx, fu.Fragment)
			if store.IsNotFound(ferr) {
				continue // deleted, or never ours
			}
			if ferr != nil {
				return 0, ferr
			}
			if f.Node != node {
				continue
			}
			row, err = &model.FragmentUsage{Fragment: f.ID, Instance: f.InstanceID, Node: f.Node, Capacity: f.Capacity}, nil
		}
		if err != nil {
			return 0, err
		}
		if row.Node != node || (row.Final && fu.Fragment != finalID) {
			continue // a heartbeat sent before the final report
		}
		if fu.Fragment != finalID && !fu.Restored && (fu.BytesWritten < row.Counters.BytesWritten || fu.BytesRead < row.Counters.BytesRead) {
			continue // counters only grow: this report is older than the one kept (the final one is the agent's latest)
		}
		final := row.Final || fu.Fragment == finalID
		fu.Instance = row.Instance
		if reflect.DeepEqual(row.Counters, fu) && final == row.Final {
			continue
		}
		changes = append(changes, change{row, fu, final})
	}
	sort.SliceStable(changes, func(i, j int) bool { return changes[i].row.Updated.Before(changes[j].row.Updated) })
	var written uint64
	for _, ch := range changes[:min(len(changes), max(limit, 1))] {
		row, fu, old := ch.row, ch.fu, ch.row.Counters
		switch {
		case fu.BytesWritten >= old.BytesWritten:
			written += fu.BytesWritten - old.BytesWritten
		case fu.Restored: // the agent started again from zero: what it counted since
			written += fu.BytesWritten
		}
		row.Counters, row.Updated, row.Final = fu, now, ch.final
		if err := store.Usage.Put(tx, row); err != nil {
			return 0, err
		}
	}
	return written, nil
}

// finalUsage asks a storage node for its counters right before fragment id is deleted there
// and persists them, marked final (the delete runs only after). A fragment the report does not
// count keeps the heartbeats' figures, marked final all the same. An agent that does not
// answer leaves them unmarked; its delete is likely to fail too and be retried.
func (c *Controller) finalUsage(ctx context.Context, agent agentapi.Agent, node string, id int64) {
	fu, found, err := agent.FragmentUsage(ctx, id)
	if err != nil {
		c.log.Warn("accounting: no report from the node before deleting a fragment; its record keeps the last heartbeat's counters", "node", node, "fragment", id, "err", err)
		return
	}
	var own []agentapi.FragmentUsage
	if found {
		own = append(own, fu)
	}
	err = c.store.Update(ctx, func(tx *store.Tx) error {
		if len(own) == 0 {
			row, err := usageRow(tx, id)
			if err != nil || row == nil || row.Final {
				return err
			}
			row.Final = true
			return store.Usage.Put(tx, row)
		}
		written, err := recordUsage(tx, &c.usageRows, node, own, c.now(), id, c.cfg.Controller.AccountingBatch)
		if err != nil || written == 0 {
			return err
		}
		n, err := store.Nodes.Get(tx, node)
		if err != nil {
			return err
		}
		n.Written += written
		return store.Nodes.Put(tx, n)
	})
	if err != nil && ctx.Err() == nil {
		c.log.Warn("accounting: cannot keep a fragment's final counters", "fragment", id, "err", err)
	}
}

// keepAccounting runs in persist's transaction before its deletions: a deleted namespace or
// fragment leaves its metadata with its fragment's counters, a deleted stage of an instance
// that stays leaves its bytes (store.StageBytes), and a deleted instance becomes its pending
// accounting record, its counters gone with it.
func keepAccounting(tx *store.Tx, ch lifecycle.Changes, now time.Time) error {
	var instances []int64
	going := map[int64]bool{}
	for _, r := range ch.Delete {
		if r.Kind == lifecycle.KindInstance {
			going[r.ID] = true
		}
	}
	for _, r := range ch.Delete {
		switch r.Kind {
		case lifecycle.KindStage:
			if err := carryStage(tx, r.ID, going); err != nil {
				return err
			}
		case lifecycle.KindNamespace:
			ns, err := store.Namespaces.Get(tx, r.ID)
			if store.IsNotFound(err) {
				continue
			}
			if err != nil {
				return err
			}
			row, err := usageRow(tx, ns.FragmentID)
			if err != nil || row == nil {
				return err
			}
			known := false
			for _, n := range row.Namespaces {
				known = known || n.ID == ns.ID
			}
			if !known {
				row.Namespaces = append(row.Namespaces, model.Namespace{ID: ns.ID, ConfigurationID: ns.ConfigurationID, FragmentID: ns.FragmentID, ClientNode: ns.ClientNode})
				if err := store.Usage.Put(tx, row); err != nil {
					return err
				}
			}
		case lifecycle.KindFragment:
			if _, err := usageRow(tx, r.ID); err != nil {
				return err
			}
		case lifecycle.KindInstance:
			instances = append(instances, r.ID)
		}
	}
	for _, id := range instances {
		if err := pendRecord(tx, id, now); err != nil {
			return err
		}
	}
	return nil
}

// carryStage keeps the bytes of stage id, about to be deleted, for its instance's record,
// unless the instance goes in the same transaction (its record counts the stage then).
func carryStage(tx *store.Tx, id int64, going map[int64]bool) error {
	st, err := store.Stages.Get(tx, id)
	if store.IsNotFound(err) {
		return nil
	}
	if err != nil || st.BytesDone == 0 {
		return err
	}
	c, err := store.Configurations.Get(tx, st.ConfigurationID)
	if store.IsNotFound(err) || err == nil && going[c.InstanceID] {
		return nil
	}
	if err != nil {
		return err
	}
	row, err := store.StageBytes.Get(tx, c.InstanceID)
	if store.IsNotFound(err) {
		row, err = &model.StageBytes{Instance: c.InstanceID}, nil
	}
	if err != nil {
		return err
	}
	row.Add(st)
	return store.StageBytes.Put(tx, row)
}

// stageBytes is instance id's carried stage bytes, nil if none.
func stageBytes(tx *store.Tx, id int64) (*model.StageBytes, error) {
	row, err := store.StageBytes.Get(tx, id)
	if store.IsNotFound(err) {
		return nil, nil
	}
	return row, err
}

// usageRow is fragment id's counters row, made (zero counters) and stored if it has none yet;
// nil if the fragment is unknown.
func usageRow(tx *store.Tx, id int64) (*model.FragmentUsage, error) {
	row, err := store.Usage.Get(tx, id)
	if err == nil || !store.IsNotFound(err) {
		return row, err
	}
	f, err := store.Fragments.Get(tx, id)
	if store.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	row = &model.FragmentUsage{Fragment: f.ID, Instance: f.InstanceID, Node: f.Node, Capacity: f.Capacity}
	return row, store.Usage.Put(tx, row)
}

// pendRecord turns instance id, about to be deleted, into its pending accounting record.
func pendRecord(tx *store.Tx, id int64, now time.Time) error {
	if _, err := store.AccountingRecords.Get(tx, id); err == nil {
		return nil
	}
	inst, err := store.Instances.Get(tx, id)
	if store.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	w, err := loadSessionsWorld(tx, []int64{inst.SessionID}, now, 0) // the record's session and fragments
	if err != nil {
		return err
	}
	if w.Instances[id] != nil {
		inst = w.Instances[id]
	}
	usage, err := store.Usage.ChildrenOf(tx, lifecycle.KindInstance, id)
	if err != nil {
		return err
	}
	cluster, err := store.Meta.Get(tx, clusterIDKey)
	if err != nil {
		return err
	}
	carried, err := stageBytes(tx, id)
	if err != nil {
		return err
	}
	recordID := fmt.Sprintf("%s-%d", cluster.Value, id)
	line, err := json.Marshal(views.AccountingOf(w, inst, usage, carried, recordID, now))
	if err != nil {
		return err
	}
	if err := store.StageBytes.Delete(tx, id); err != nil {
		return err
	}
	// The counters' rows go after the line is written (appendRecord), a batch per
	// transaction: here they would make this transaction as large as the instance is wide.
	return store.AccountingRecords.Put(tx, &store.AccountingRecord{Instance: id, ID: recordID, Line: line})
}

// refreshUsage asks the storage nodes holding fragments for their counters now (at most
// controller.accounting_refresh_limit fragments, all at once, for at most
// controller.accounting_refresh_timeout) and keeps them as a heartbeat's would be kept: a query
// of a running instance's accounting reads what its data path counted up to the query, not
// up to the last heartbeat. It returns the fragments whose figures stay the last heartbeat's
// (no answer in time, or beyond the limit).
func (c *Controller) refreshUsage(ctx context.Context, frags []*model.Fragment) map[int64]bool {
	stale := map[int64]bool{}
	limit := c.cfg.Controller.AccountingRefreshLimit
	if len(frags) == 0 {
		return stale
	}
	if limit <= 0 {
		for _, f := range frags {
			stale[f.ID] = true
		}
		return stale
	}
	for _, f := range frags[min(len(frags), limit):] {
		stale[f.ID] = true
	}
	frags = frags[:min(len(frags), limit)]
	var w *lifecycle.World // the nodes alone: where each fragment's agent is
	err := c.store.View(ctx, func(tx *store.Tx) (err error) {
		w, err = loadNodesAndPools(tx, c.now(), c.cfg.Controller.NodeTimeout.D())
		return err
	})
	if err != nil {
		for _, f := range frags {
			stale[f.ID] = true
		}
		return stale
	}
	rctx, cancel := context.WithTimeout(ctx, c.cfg.Controller.AccountingRefreshTimeout.D())
	defer cancel()
	type answer struct {
		frag *model.Fragment
		fu   agentapi.FragmentUsage
		ok   bool
	}
	answers := make(chan answer, len(frags))
	for _, f := range frags {
		go func(f *model.Fragment) {
			a := answer{frag: f}
			if agent, err := c.agentFor(w, f.Node); err == nil {
				fu, found, err := agent.FragmentUsage(rctx, f.ID)
				a.fu, a.ok = fu, err == nil && found
			}
			answers <- a
		}(f)
	}
	byNode := map[string][]agentapi.FragmentUsage{}
	answered := map[int64]bool{}
wait:
	for range frags {
		select {
		case a := <-answers:
			if a.ok {
				byNode[a.frag.Node] = append(byNode[a.frag.Node], a.fu)
				answered[a.frag.ID] = true
			}
		case <-rctx.Done():
			break wait // the others' figures stay the heartbeat's
		}
	}
	for _, f := range frags {
		if !answered[f.ID] {
			stale[f.ID] = true
		}
	}
	if len(byNode) == 0 {
		return stale
	}
	err = c.store.Update(ctx, func(tx *store.Tx) error {
		for _, node := range sortedNodes(byNode) {
			written, err := recordUsage(tx, &c.usageRows, node, byNode[node], c.now(), 0, len(byNode[node]))
			if err != nil || written == 0 {
				if err != nil {
					return err
				}
				continue
			}
			n, err := store.Nodes.Get(tx, node)
			if store.IsNotFound(err) {
				continue
			}
			if err != nil {
				return err
			}
			n.Written += written
			if err := store.Nodes.Put(tx, n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		// A follower (high availability) writes nothing: it answers with the leader's
		// figures, named stale.
		if ctx.Err() == nil && !errors.Is(err, store.ErrFenced) {
			c.log.Warn("accounting: cannot keep the counters the nodes reported for a query; it answers with the last heartbeat's", "err", err)
		}
		for id := range answered {
			stale[id] = true
		}
	}
	return stale
}

func sortedNodes(m map[string][]agentapi.FragmentUsage) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// markStale says in a record which storage nodes' figures are their last heartbeat's (its
// fragments in stale), and whether every figure was read now.
func markStale(a *views.Accounting, stale map[int64]bool) {
	a.Realm.StaleNodes = nil
	for _, f := range a.Realm.Fragments {
		if stale[f.Fragment] && !slices.Contains(a.Realm.StaleNodes, f.ServerHostname) {
			a.Realm.StaleNodes = append(a.Realm.StaleNodes, f.ServerHostname)
		}
	}
	sort.Strings(a.Realm.StaleNodes)
	a.Realm.Current = len(a.Realm.Fragments) > 0 && len(a.Realm.StaleNodes) == 0
}

// liveFragments is instance id's fragments in the state (nil: the instance is unknown).
func (c *Controller) liveFragments(ctx context.Context, id int64) []*model.Fragment {
	var frags []*model.Fragment
	c.store.View(ctx, func(tx *store.Tx) error {
		var err error
		frags, err = store.Fragments.ChildrenOf(tx, lifecycle.KindInstance, id)
		return err
	})
	return frags
}

// Accounting is instance id's live accounting record (views.BuildAccounting), its
// fragments' counters asked of their nodes first (refreshUsage).
func (c *Controller) Accounting(ctx context.Context, id int64) (views.Accounting, *model.Session, error) {
	var a views.Accounting
	var sess *model.Session
	stale := c.refreshUsage(ctx, c.liveFragments(ctx, id))
	err := c.store.View(ctx, func(tx *store.Tx) error {
		inst, err := store.Instances.Get(tx, id)
		if store.IsNotFound(err) {
			return lifecycle.ErrNoSession
		}
		if err != nil {
			return err
		}
		w, err := loadSessionsWorld(tx, []int64{inst.SessionID}, c.now(), c.cfg.Controller.NodeTimeout.D())
		if err != nil {
			return err
		}
		usage, err := store.Usage.ChildrenOf(tx, lifecycle.KindInstance, id)
		if err != nil {
			return err
		}
		carried, err := stageBytes(tx, id)
		if err != nil {
			return err
		}
		a, sess = views.BuildAccounting(w, inst, usage, carried), w.Sessions[inst.SessionID]
		return nil
	})
	markStale(&a, stale)
	return a, sess, err
}

// AllAccounting is the live accounting record of every instance, in id order, and how many
// records of torn-down instances wait to be appended to controller.accounting_log.
func (c *Controller) AllAccounting(ctx context.Context) ([]views.Accounting, int, *lifecycle.World, error) {
	var out []views.Accounting
	var world *lifecycle.World
	var pending int
	var frags []*model.Fragment
	c.store.View(ctx, func(tx *store.Tx) error {
		var err error
		frags, err = store.Fragments.List(tx)
		return err
	})
	stale := c.refreshUsage(ctx, frags)
	err := c.store.View(ctx, func(tx *store.Tx) error {
		recs, err := store.AccountingRecords.List(tx)
		if err != nil {
			return err
		}
		pending = len(recs)
		w, err := loadWorld(tx, c.now(), c.cfg.Controller.NodeTimeout.D())
		if err != nil {
			return err
		}
		usage, err := store.Usage.List(tx)
		if err != nil {
			return err
		}
		carried, err := store.StageBytes.List(tx)
		if err != nil {
			return err
		}
		byInstance := map[int64]*model.StageBytes{}
		for _, b := range carried {
			byInstance[b.Instance] = b
		}
		world = w
		for _, s := range w.SortedSessions() {
			for _, inst := range w.InstancesOf(s.ID) {
				a := views.BuildAccounting(w, inst, usage, byInstance[inst.ID])
				markStale(&a, stale)
				out = append(out, a)
			}
		}
		return nil
	})
	return out, pending, world, err
}

// flushAccounting appends the pending accounting records to controller.accounting_log.
func (c *Controller) flushAccounting(ctx context.Context) {
	// One writer, reading the pending records under the lock: runOnce may run from Run and
	// from RunOnce at once, and a record another pass wrote must not be seen as pending.
	c.acctMu.Lock()
	defer c.acctMu.Unlock()
	var pending []*store.AccountingRecord
	err := c.store.View(ctx, func(tx *store.Tx) error {
		var err error
		pending, err = store.AccountingRecords.List(tx)
		return err
	})
	if err != nil || len(pending) == 0 {
		return
	}
	for _, rec := range pending {
		if err := c.appendRecord(ctx, rec); err != nil {
			// Logged once a minute at most: the executor passes every executor.tick.
			if now := c.now(); ctx.Err() == nil && now.Sub(c.acctLogged) >= time.Minute {
				c.acctLogged = now
				c.log.Error("accounting: cannot append records to controller.accounting_log; they wait in the state and are retried at every executor pass",
					"pending", len(pending), "instance", rec.Instance, "log", c.cfg.Controller.AccountingLogPath(), "err", err)
			}
			return
		}
	}
}

// appendRecord appends one record exactly once. Before it writes, it persists the log's size
// and identity (the offset the line will start at); a record found with them after a crash
// was written if the line at that offset is its own (same record_id), and is not written
// again. The record leaves the state after the line is synced.
func (c *Controller) appendRecord(ctx context.Context, rec *store.AccountingRecord) error {
	path := c.cfg.Controller.AccountingLogPath()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	inode := st.Sys().(*syscall.Stat_t).Ino
	written := false
	if rec.Appending && rec.Inode == inode && rec.Offset < st.Size() {
		written, err = lineAt(path, rec.Offset, rec.ID)
		if err != nil {
			return err
		}
		if !written { // a torn line of this record (nothing is appended after a pending one)
			if err := f.Truncate(rec.Offset); err != nil {
				return err
			}
			if st, err = f.Stat(); err != nil {
				return err
			}
		}
	}
	if !written {
		rec.Appending, rec.Offset, rec.Inode = true, st.Size(), inode
		if err := c.store.Update(ctx, func(tx *store.Tx) error { return store.AccountingRecords.Put(tx, rec) }); err != nil {
			return err
		}
		crashpoint.Hit("accounting:offset-persisted")
		if _, err := f.Write(append(append([]byte{}, rec.Line...), '\n')); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		c.log.Info("accounting: record written", "instance", rec.Instance, "record_id", rec.ID, "log", path)
		crashpoint.Hit("accounting:appended")
	}
	return c.retireRecord(ctx, rec.Instance)
}

// retireRecord deletes a written record's instance's usage rows, in transactions of at most
// controller.accounting_batch rows, and the record with the last of them.
func (c *Controller) retireRecord(ctx context.Context, instance int64) error {
	for {
		more := false
		err := c.store.Update(ctx, func(tx *store.Tx) error {
			rows, err := store.Usage.ChildrenOf(tx, lifecycle.KindInstance, instance)
			if err != nil {
				return err
			}
			batch := max(c.cfg.Controller.AccountingBatch, 1)
			more = len(rows) > batch
			for _, u := range rows[:min(len(rows), batch)] {
				if err := store.Usage.Delete(tx, u.Fragment); err != nil {
					return err
				}
			}
			if more {
				return nil
			}
			return store.AccountingRecords.Delete(tx, instance)
		})
		if err != nil || !more {
			return err
		}
	}
}

// lineAt reports whether the line starting at offset in path is the record id's.
func lineAt(path string, offset int64, id string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return false, err
	}
	line, err := bufio.NewReader(f).ReadBytes('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return false, err
	}
	var rec views.Accounting
	if json.Unmarshal(line, &rec) != nil {
		return false, nil // torn: the crash came in the middle of the write
	}
	return rec.Realm.RecordID == id, nil
}

// recordSwapUsage keeps the counters a compute node reported for its swap areas (issue 22)
// on their instances, for the accounting record: only areas the state has on that node, and
// an instance is written only when its counters grew.
func recordSwapUsage(tx *store.Tx, node string, reports []agentapi.SwapUsage) error {
	for _, u := range reports {
		a, err := store.Activations.Get(tx, u.ID)
		if store.IsNotFound(err) {
			continue // detached: its final counters came with the detach
		}
		if err != nil {
			return err
		}
		if a.Node != node {
			continue
		}
		cfg, err := store.Configurations.Get(tx, a.ConfigurationID)
		if store.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		inst, err := store.Instances.Get(tx, cfg.InstanceID)
		if store.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		if cfg.Type != model.TypeSwap {
			continue
		}
		u.Node = node
		if lifecycle.NoteSwapUsage(inst, u) {
			if err := store.Instances.Put(tx, inst); err != nil {
				return err
			}
		}
	}
	return nil
}
