package lifecycle

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/model"
)

// This file holds the administrator's decisions (dwcli): changes to nodes and pools, fuses,
// and the removal of single objects. Like the rest of the package they only look at the
// world and change it; the controller persists what they change.

// NodeChange is an administrator's change to a node (dwcli update node); nil fields are left
// as they are. New kinds of change (clearing an automatic drain, ...) are new fields.
type NodeChange struct {
	Drain   *bool   // take no new fragments (true) or take them again (false)
	Offline *bool   // hold the node offline (true) or let its heartbeats bring it online
	Pool    *string // move the node to this pool (which admits it for storage)
	Storage *bool   // admit the node for storage (true; false is refused)
	Reason  string  // why, shown in dwstat nodes --json; replaces the last reason when given
}

// Empty reports whether the change changes nothing.
func (c NodeChange) Empty() bool {
	return c.Drain == nil && c.Offline == nil && c.Pool == nil && c.Storage == nil
}

// UpdateNode applies an administrator's change to a node. Moving a node to another pool is
// refused while it holds fragments: their instances were cut to the old pool's granularity.
func UpdateNode(w *World, name string, ch NodeChange) error {
	n := w.Nodes[name]
	if n == nil {
		return userErr("node %q does not exist; `dwstat nodes` lists them", name)
	}
	if ch.Empty() {
		return userErr("nothing to change on node %s: give --drain, --fill, --offline, --online, --pool or --storage", name)
	}
	if ch.Storage != nil && !*ch.Storage {
		return userErr("node %s: storage can only be granted (storage: true); to take a node out of service drain it (dwcli update node --name %s --drain) or remove it", name, name)
	}
	if ch.Pool != nil && *ch.Pool != n.Pool {
		p := *ch.Pool
		if w.Pools[p] == nil {
			return userErr("pool %q does not exist; `dwstat pools` lists them (dwcli create pool --name %s --granularity SIZE makes it)", p, p)
		}
		if frags := fragmentsOn(w, name); len(frags) > 0 {
			return userErr("node %s holds %s of pool %s: its instances were cut to that pool's granularity; drain it (dwcli update node --name %s --drain), wait until `dwstat fragments` shows none on it, then move it",
				name, describeFragments(w, frags), n.Pool, name)
		}
	}
	if ch.Drain != nil {
		n.Drain = *ch.Drain
		// An administrator's decision replaces an automatic one; returning the node to
		// service also forgets the failures that drained it, so that it counts afresh.
		n.AutoDrained = false
		if !n.Drain {
			n.Failures = nil
		}
	}
	if ch.Offline != nil {
		n.HeldOffline = *ch.Offline
		if n.HeldOffline {
			n.Online = false
		}
	}
	if ch.Pool != nil {
		n.Pool, n.PoolAssigned = *ch.Pool, true
		n.StorageAdmitted, n.StorageClaim = true, ""
	}
	if ch.Storage != nil {
		// The node's next heartbeat brings its pool, capacity and data address.
		n.StorageAdmitted, n.StorageClaim = true, ""
	}
	if ch.Reason != "" || (ch.Drain != nil && !*ch.Drain && !n.HeldOffline) || (ch.Offline != nil && !*ch.Offline && !n.Drain) {
		n.Reason = ch.Reason // back in service: the old reason no longer holds
	}
	w.put(n)
	return nil
}

// CheckRemoveNode says whether a node may be forgotten (dwcli rm node): it must hold no
// fragment and no mount, and its agent must have stopped sending heartbeats (else the next
// one would bring it back).
func CheckRemoveNode(w *World, name string, now time.Time, nodeTimeout time.Duration) error {
	n := w.Nodes[name]
	if n == nil {
		return userErr("node %q does not exist; `dwstat nodes` lists them", name)
	}
	if frags := fragmentsOn(w, name); len(frags) > 0 {
		return userErr("node %s holds %s: removing it would lose their data; drain it (dwcli update node --name %s --drain) and wait until its instances are gone, or remove their sessions (dwcli rm session -i ID)",
			name, describeFragments(w, frags), name)
	}
	var mounts []string
	for _, a := range w.Activations {
		if a.Node == name {
			mounts = append(mounts, fmt.Sprintf("activation %d (%s)", a.ID, a.MountPath))
		}
	}
	if len(mounts) > 0 {
		sort.Strings(mounts)
		return userErr("node %s has mounts: %s; remove their sessions or activations first (dwcli rm activation -i ID)", name, strings.Join(mounts, ", "))
	}
	if since := now.Sub(n.LastSeen); since < nodeTimeout {
		return userErr("node %s's agent is running (last heartbeat %s ago): its next heartbeat would bring the node back; stop its agent first (systemctl stop spillway-agent on %s), then remove it",
			name, since.Round(time.Second), name)
	}
	return nil
}

// CheckRemovePool says whether a pool may be removed (dwcli rm pool): no node and no instance
// may be in it.
func CheckRemovePool(w *World, name string) error {
	if w.Pools[name] == nil {
		return userErr("pool %q does not exist; `dwstat pools` lists them", name)
	}
	var insts []string
	for _, id := range sortedIDs(w.Instances) {
		if i := w.Instances[id]; i.Pool == name {
			insts = append(insts, fmt.Sprint(i.ID))
		}
	}
	if len(insts) > 0 {
		return userErr("pool %s has instance(s) %s; remove their sessions first (dwcli rm session -i ID)", name, strings.Join(insts, ", "))
	}
	var nodes []string
	for _, n := range w.NodeNames() {
		if w.Nodes[n].Pool == name {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) > 0 {
		return userErr("pool %s has node(s) %s; move them to another pool (dwcli update node --name NODE --pool OTHER) or remove them (dwcli rm node --name NODE) first", name, strings.Join(nodes, ", "))
	}
	return nil
}

// FuseKinds are the objects whose fuse an administrator may replace: those the executor
// drives on agents, whose effect can fail (executor.max_attempts times) and blow the fuse.
var FuseKinds = []string{KindFragment, KindNamespace, KindActivation}

// ReplaceFuse resets a blown fuse (dwcli update KIND -i ID --replace-fuse): the object's
// failed attempts are forgotten and the executor tries its effect again at once.
func ReplaceFuse(w *World, kind string, id ID) error {
	var st *model.State
	var obj any
	var sid ID
	switch kind {
	case KindFragment:
		if f := w.Fragments[id]; f != nil {
			st, obj = &f.State, f
			if inst := w.Instances[f.InstanceID]; inst != nil {
				sid = inst.SessionID
			}
		}
	case KindNamespace:
		if ns := w.Namespaces[id]; ns != nil {
			st, obj = &ns.State, ns
			if c := w.Configurations[ns.ConfigurationID]; c != nil {
				if inst := w.Instances[c.InstanceID]; inst != nil {
					sid = inst.SessionID
				}
			}
		}
	case KindActivation:
		if a := w.Activations[id]; a != nil {
			st, obj, sid = &a.State, a, a.SessionID
		}
	case KindStage:
		return userErr("a stage has no fuse to replace: a failed stage-out is retried by staging again (spillway run --retry-stage-out TOKEN, dwcli stage out) or discarded (dwcli rm session -i ID --hurry)")
	default:
		return userErr("%ss have no fuse to replace; fuses are on %s", kind, strings.Join(pluralKinds(FuseKinds), ", "))
	}
	if st == nil {
		return userErr("%s %d does not exist; `dwstat %ss` lists them", kind, id, kind)
	}
	if !st.FuseBlown {
		return userErr("the fuse of %s %d is not blown (state %s): there is nothing to replace", kind, id, st.Flags())
	}
	failure := st.Error
	st.FuseBlown, st.Attempts, st.RetryAt = false, 0, time.Time{}
	st.Transitioning = true
	w.put(obj)
	if s := w.Sessions[sid]; s != nil && s.Failure == failure {
		s.Failure = ""
		w.put(s)
	}
	return nil
}

// RemoveActivation unmounts one activation (dwcli rm activation): its goal becomes destroy
// and the executor unmounts it from its compute node.
func RemoveActivation(w *World, id ID) error {
	a := w.Activations[id]
	if a == nil {
		return userErr("activation %d does not exist; `dwstat activations` lists them", id)
	}
	if a.State.Goal == model.GoalDestroy {
		return nil
	}
	a.State = model.Destroying()
	w.put(a)
	return nil
}

// SessionOwning returns the session an instance, configuration or activation belongs to.
func SessionOwning(w *World, kind string, id ID) (*model.Session, error) {
	var sid ID
	switch kind {
	case KindSession:
		sid = id
	case KindInstance:
		if i := w.Instances[id]; i != nil {
			sid = i.SessionID
		}
	case KindConfiguration:
		if c := w.Configurations[id]; c != nil {
			if i := w.Instances[c.InstanceID]; i != nil {
				sid = i.SessionID
			}
		}
	case KindActivation:
		if a := w.Activations[id]; a != nil {
			sid = a.SessionID
		}
	}
	s := w.Sessions[sid]
	if s == nil {
		return nil, userErr("%s %d does not exist; `dwstat %ss` lists them", kind, id, kind)
	}
	return s, nil
}

func fragmentsOn(w *World, node string) []*model.Fragment {
	var out []*model.Fragment
	for _, id := range sortedIDs(w.Fragments) {
		if f := w.Fragments[id]; f.Node == node {
			out = append(out, f)
		}
	}
	return out
}

// describeFragments names fragments and the sessions they belong to.
func describeFragments(w *World, frags []*model.Fragment) string {
	var ids, tokens []string
	seen := map[string]bool{}
	for _, f := range frags {
		ids = append(ids, fmt.Sprint(f.ID))
		if inst := w.Instances[f.InstanceID]; inst != nil {
			if s := w.Sessions[inst.SessionID]; s != nil && !seen[s.Token] {
				seen[s.Token] = true
				tokens = append(tokens, fmt.Sprintf("%d (token %s)", s.ID, s.Token))
			}
		}
	}
	what := "fragment " + ids[0]
	if len(ids) > 1 {
		what = "fragments " + strings.Join(ids, ", ")
	}
	if len(tokens) > 0 {
		what += " of session " + strings.Join(tokens, ", ")
	}
	return what
}

func pluralKinds(kinds []string) []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = k + "s"
	}
	return out
}
