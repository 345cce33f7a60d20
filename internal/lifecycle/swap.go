package lifecycle

import (
	"fmt"
	"sort"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/units"
)

// Swap on the burst buffer (#DW swap <size>, issue 22; docs/swap.md).
//
// A job's swap is an instance of its own (type swap, beside its scratch or cache instance,
// or alone) of the size per compute node times the compute nodes it was reserved for at
// setup, each fragment holding whole areas. Its one configuration (type swap, no access mode,
// root's, mode 0700) is never exposed to the job. At pre_run each compute node gets a
// namespace of it (on a fragment of the node itself when it has one with room) holding the
// node's swap file, and an activation whose effects are AttachSwap and DetachSwap (a poll)
// instead of Mount and Unmount: pre_run, post_run and teardown wait for them as for mounts.

// Operations of swap activations.
const (
	OpAttachSwap = "attach-swap"
	// OpDetachSwap takes a swap area away (swapoff, then the loop device and the file): a
	// poll, like OpFlushCache.
	OpDetachSwap = "detach-swap"
)

// SwapParams are the site's rules for swap ([swap]).
type SwapParams struct {
	MaxPerNode    uint64        // bytes; 0: no bound
	Priority      int           // swapon priority; -1: the kernel's, below the node's own swap
	DetachTimeout time.Duration // how long one swapoff may take
}

// SwapRequest is a job's #DW swap: the size per compute node, and the compute nodes to
// reserve it for (Nodes 0: the setup's client nodes, or 1).
type SwapRequest struct {
	SizePerNode uint64 `json:"size_per_node"`
	Nodes       int    `json:"nodes,omitempty"`
	Pool        string `json:"pool,omitempty"`
	Line        int    `json:"line,omitempty"` // the directive's line, for errors
}

// MaxSwapNodes bounds the compute nodes one job's swap may be reserved for: past it a
// node count is a mistake (a reservation of size × nodes that no pool holds).
const MaxSwapNodes = 1 << 20

// CheckSwap checks a swap request on its own, as setup will: a size above zero and within
// [swap] max_per_node. dw_wlm_cli's job_process calls it before the job is queued.
func CheckSwap(r SwapRequest, p SwapParams) error {
	where := "#DW swap"
	if r.Line > 0 {
		where = fmt.Sprintf("line %d: #DW swap", r.Line)
	}
	if r.SizePerNode == 0 {
		return userErr("%s: size: the swap size must be greater than zero; write the swap per compute node, e.g. #DW swap 4GiB", where)
	}
	if p.MaxPerNode > 0 && r.SizePerNode > p.MaxPerNode {
		return userErr("%s: size %s is above this site's bound of %s per compute node ([swap] max_per_node); ask for at most #DW swap %s, or ask the administrator",
			where, units.FormatHuman(r.SizePerNode), units.FormatHuman(p.MaxPerNode), units.FormatHuman(p.MaxPerNode))
	}
	if r.Nodes < 0 || r.Nodes > MaxSwapNodes {
		return userErr("%s: %d compute nodes: expected 1 to %d", where, r.Nodes, MaxSwapNodes)
	}
	return nil
}

// swapNodes is how many compute nodes a setup reserves swap for: the request's count, else
// the client nodes the WLM named, else one.
func swapNodes(req Setup) int {
	switch {
	case req.Swap.Nodes > 0:
		return max(req.Swap.Nodes, len(req.ClientNodes))
	case len(req.ClientNodes) > 0:
		return len(req.ClientNodes)
	}
	return 1
}

// createSwapInstance records a job's swap instance: size per node, rounded up to whole grains,
// times its nodes, placed in whole areas; its configuration and registration.
func createSwapInstance(w *World, sess *model.Session, req Setup, ids IDSource, p Params, now time.Time) error {
	r := *req.Swap // checked by checkInstances
	pool := w.Pools[r.Pool]
	if pool == nil || pool.Granularity == 0 {
		return userErr("#DW swap pool=%s: no such pool", r.Pool)
	}
	nodes := swapNodes(req)
	perNode := units.Grains(r.SizePerNode, pool.Granularity)
	ir := InstanceRequest{Capacity: perNode * pool.Granularity * uint64(nodes), Pool: r.Pool, Type: model.TypeSwap}
	inst, frags, err := placeInstanceIn(w, sess, ir, "", perNode, ids, p, now)
	if err != nil {
		return err
	}
	inst.Requested = r.SizePerNode * uint64(nodes)
	w.put(inst)
	cid, err := ids.NewID(KindConfiguration)
	if err != nil {
		return err
	}
	// Root's, 0700: no job sees another's swap, nor its own (the kernel's pages).
	c := &model.Configuration{ID: cid, InstanceID: inst.ID, Type: model.TypeSwap, RootPermissions: 0o700,
		SwapSize: r.SizePerNode, SwapNodes: nodes, State: model.Created()}
	w.put(c)
	_ = frags
	return addRegistration(w, sess, c, ids)
}

// swapConfigOf returns the session's swap configuration, or nil.
func swapConfigOf(w *World, s *model.Session) *model.Configuration {
	for _, inst := range w.InstancesOf(s.ID) {
		for _, c := range w.ConfigurationsOf(inst.ID) {
			if c.Type == model.TypeSwap {
				return c
			}
		}
	}
	return nil
}

// IsSwap reports whether an activation is a swap area (not a mount).
func IsSwap(w *World, a *model.Activation) bool {
	c := w.Configurations[a.ConfigurationID]
	return c != nil && c.Type == model.TypeSwap
}

// activateSwap gives each compute node of a pre_run its swap area: a namespace of the swap
// configuration on one fragment (the node's own when it has room: the node then uses the
// fragment's file system directly) and an activation. A node that has one keeps it.
func activateSwap(w *World, s *model.Session, c *model.Configuration, nodes []string, ids IDSource, what string) error {
	if len(nodes) > c.SwapNodes {
		return userErr("%s: the job runs on %d compute nodes but its #DW swap was reserved for %d at setup (size per node × nodes); "+
			"give the node count at submission (#SBATCH --nodes=%d, or the WLM's node list at setup)", what, len(nodes), c.SwapNodes, len(nodes))
	}
	inst := w.Instances[c.InstanceID]
	pool := w.Pools[inst.Pool]
	if pool == nil || pool.Granularity == 0 {
		return fmt.Errorf("%s: the swap instance's pool %s is gone", what, inst.Pool)
	}
	perNode := units.Grains(c.SwapSize, pool.Granularity)
	frags := w.FragmentsOf(inst.ID)
	slots := map[ID]uint64{} // areas each fragment can still hold
	for _, f := range frags {
		slots[f.ID] = f.Grains / max(perNode, 1)
	}
	have := map[string]*model.Namespace{}
	for _, ns := range w.NamespacesOf(c.ID) {
		have[ns.ClientNode] = ns
		if slots[ns.FragmentID] > 0 {
			slots[ns.FragmentID]--
		}
	}
	active := map[string]bool{}
	for _, a := range w.ActivationsOf(s.ID) {
		if a.ConfigurationID == c.ID && a.State.Goal == model.GoalCreate {
			active[a.Node] = true
		}
	}
	for _, node := range nodes {
		ns := have[node]
		if ns == nil {
			f := swapFragment(frags, slots, node)
			if f == nil {
				return fmt.Errorf("%s: no fragment of the swap instance has room for node %s's area", what, node)
			}
			slots[f.ID]--
			nid, err := ids.NewID(KindNamespace)
			if err != nil {
				return err
			}
			ns = &model.Namespace{ID: nid, ConfigurationID: c.ID, FragmentID: f.ID, ClientNode: node, State: model.Creating()}
			w.put(ns)
			have[node] = ns
		}
		if active[node] {
			continue
		}
		aid, err := ids.NewID(KindActivation)
		if err != nil {
			return err
		}
		w.put(&model.Activation{ID: aid, SessionID: s.ID, ConfigurationID: c.ID, NamespaceID: ns.ID, Node: node, State: model.Creating()})
		active[node] = true
	}
	return nil
}

// swapFragment chooses the fragment of a node's swap area: the node's own when it has room,
// else the one with the most room left (the first of those in id order).
func swapFragment(frags []*model.Fragment, slots map[ID]uint64, node string) *model.Fragment {
	var best *model.Fragment
	for _, f := range frags {
		if slots[f.ID] == 0 {
			continue
		}
		if f.Node == node {
			return f
		}
		if best == nil || slots[f.ID] > slots[best.ID] {
			best = f
		}
	}
	return best
}

// SwapFileName is the name of a compute node's swap file in its namespace.
func SwapFileName(s *model.Session, node string) string {
	return fmt.Sprintf("swap-%s-%s", s.Token, node)
}

// swapSpec is the compute node's order to attach a swap activation. A remote node reaches
// the file through a mount of the namespace (the controller signs its grant).
func swapSpec(w *World, s *model.Session, a *model.Activation, p Params) agentapi.SwapSpec {
	c := w.Configurations[a.ConfigurationID]
	ns := w.Namespaces[a.NamespaceID]
	spec := agentapi.SwapSpec{ID: a.ID, InstanceID: c.InstanceID, Job: s.Token, Owner: s.Owner, Node: a.Node,
		Size: c.SwapSize, Priority: p.Swap.Priority, NamespaceID: a.NamespaceID, FileName: SwapFileName(s, a.Node)}
	if ns == nil {
		return spec
	}
	f := w.Fragments[ns.FragmentID]
	if f == nil {
		return spec
	}
	spec.StorageNode, spec.FragmentID = f.Node, f.ID
	if f.Node != a.Node {
		m := agentapi.MountSpec{ActivationID: a.ID, NamespaceID: ns.ID, InstanceID: c.InstanceID, Owner: 0,
			StorageNode: f.Node, FragmentID: f.ID, Label: fmt.Sprintf("spillway:swap-%d", a.ID)}
		if n := w.Nodes[f.Node]; n != nil {
			m.DataAddress = n.DataAddress
		}
		if inst := w.Instances[c.InstanceID]; inst != nil {
			m.Capacity = inst.Capacity
		}
		spec.Mount = &m
	}
	return spec
}

// stepSwap is stepActivation for a swap area.
func stepSwap(w *World, s *model.Session, a *model.Activation, p Params, now time.Time) []Effect {
	if a.State.Goal == model.GoalDestroy {
		if !nodeOnline(w, a.Node) {
			// The compute node is gone (rebooted or lost), and its swap areas with it; its
			// agent reaps what the controller no longer lists if it comes back.
			w.remove(KindActivation, a.ID)
			return nil
		}
		if !ready(a.State, now) {
			return nil
		}
		return []Effect{{Op: OpDetachSwap, Ref: Ref{KindActivation, a.ID}, Node: a.Node,
			SwapDetach: agentapi.SwapDetachSpec{ID: a.ID, Timeout: p.Swap.DetachTimeout.Milliseconds()}}}
	}
	if a.State.Actualized {
		noteLostSwap(w, s, a)
		return nil
	}
	ns := w.Namespaces[a.NamespaceID]
	if ns == nil || !ns.State.Actualized || !ready(a.State, now) {
		return nil
	}
	return []Effect{{Op: OpAttachSwap, Ref: Ref{KindActivation, a.ID}, Node: a.Node, Swap: swapSpec(w, s, a, p)}}
}

// noteLostSwap records on the session an attached swap area whose storage node went offline
// (lostSwap), when a step looks at the session; listings and step answers say it at once
// (LostSwaps).
func noteLostSwap(w *World, s *model.Session, a *model.Activation) {
	if msg := lostSwap(w, a); msg != "" && s.Failure != msg {
		s.Failure = msg
		w.put(s)
	}
}

// lostSwap says why an attached swap area is lost ("" when it is not): its storage node is
// offline, the pages the job swapped out there are gone, and the kernel kills what needs them.
func lostSwap(w *World, a *model.Activation) string {
	if !a.State.Actualized || a.State.Goal != model.GoalCreate || !IsSwap(w, a) {
		return ""
	}
	ns := w.Namespaces[a.NamespaceID]
	if ns == nil {
		return ""
	}
	f := w.Fragments[ns.FragmentID]
	if f == nil || w.Nodes[f.Node] == nil || nodeOnline(w, f.Node) {
		return ""
	}
	return fmt.Sprintf("swap area %d of compute node %s lost: its storage node %s is offline; pages the job swapped out there cannot come back, so the job's processes that need them are killed",
		a.ID, a.Node, f.Node)
}

// LostSwaps lists why the session's attached swap areas are lost, if any are: what the
// session's failure says in listings (dwstat sessions) and step answers while the session is
// settled and no step records it.
func LostSwaps(w *World, s *model.Session) []string {
	var out []string
	for _, a := range w.ActivationsOf(s.ID) {
		if msg := lostSwap(w, a); msg != "" {
			out = append(out, msg)
		}
	}
	return out
}

// completeSwap records the outcome of an attach or a detach.
func completeSwap(w *World, e Effect, r Result, p Params, now time.Time) {
	a := w.Activations[e.Ref.ID]
	if a == nil {
		return
	}
	switch e.Op {
	case OpAttachSwap:
		if a.State.Goal == model.GoalCreate {
			settle(w, a, &a.State, r.Err, fmt.Sprintf("attach swap area %d (%s) on compute node %s", a.ID, units.FormatHuman(e.Swap.Size), a.Node), p, now)
		}
	case OpDetachSwap:
		if a.State.Goal != model.GoalDestroy {
			return
		}
		what := fmt.Sprintf("detach swap area %d on compute node %s", a.ID, a.Node)
		switch {
		case r.Err != nil:
			removeOrRetry(w, KindActivation, a.ID, a, &a.State, r.Err, what, p, now)
		case r.Swap.Done:
			// The detach's counters are the area's last: the accounting record keeps them.
			if c := w.Configurations[a.ConfigurationID]; c != nil {
				if inst := w.Instances[c.InstanceID]; inst != nil && NoteSwapUsage(inst, agentapi.SwapUsage{ID: a.ID, Node: a.Node,
					BytesWritten: r.Swap.BytesWritten, BytesRead: r.Swap.BytesRead}) {
					w.put(inst)
				}
			}
			w.remove(KindActivation, a.ID)
		case r.Swap.Error != "":
			// swapoff failed or passed [swap] detach_timeout: the area stays attached and the
			// node usable; the detach is tried again within the executor's bounds, and the
			// session says why it waits.
			retryLater(w, &a.State, what+": "+r.Swap.Error, p, now)
			if s := w.Sessions[a.SessionID]; s != nil {
				s.Failure = a.State.Error
				w.put(s)
			}
			w.put(a)
		default: // on its way: the executor polls again
			if a.State.Error != "" || a.State.Attempts > 0 {
				a.State.Error = ""
				w.put(a)
			}
		}
	}
}

// LiveSwaps lists the swap areas a compute node should have now (heartbeat answers): its
// swap activations not being taken away. An agent reaps areas not listed.
func LiveSwaps(w *World, node string, p Params) []agentapi.SwapSpec {
	var out []agentapi.SwapSpec
	for _, id := range sortedIDs(w.Activations) {
		a := w.Activations[id]
		if a.Node != node || !IsSwap(w, a) || a.State.Goal != model.GoalCreate {
			continue
		}
		if s := w.Sessions[a.SessionID]; s != nil {
			out = append(out, swapSpec(w, s, a, p))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// NoteSwapUsage records a swap area's counters on its instance, and reports whether they
// changed. Counters only grow: an older report (a heartbeat sent before the detach's final
// answer) changes nothing.
func NoteSwapUsage(inst *model.Instance, u agentapi.SwapUsage) bool {
	u.Instance = inst.ID
	for i := range inst.Swap {
		have := &inst.Swap[i]
		if have.ID != u.ID {
			continue
		}
		if u.BytesWritten <= have.BytesWritten && u.BytesRead <= have.BytesRead {
			return false
		}
		have.BytesWritten, have.BytesRead = max(have.BytesWritten, u.BytesWritten), max(have.BytesRead, u.BytesRead)
		return true
	}
	if u.BytesWritten == 0 && u.BytesRead == 0 && u.Node == "" {
		return false
	}
	inst.Swap = append(inst.Swap, u)
	sort.Slice(inst.Swap, func(i, j int) bool { return inst.Swap[i].ID < inst.Swap[j].ID })
	return true
}

// SwapAreaSlack is what a swap area's namespace holds besides the area's file: its directory
// and the file's metadata, which the storage node counts against the fragment's capacity. A
// swap fragment's capacity as its agent counts it is its grains plus this per area, so that an
// area of exactly whole grains fits (the pool still counts whole grains).
const SwapAreaSlack = 1 << 20

// swapCapacities are the capacities a fragment's agent counts for it and its instance: the
// fragment's and the instance's, plus SwapAreaSlack per area for a swap instance.
func swapCapacities(w *World, inst *model.Instance, f *model.Fragment) (fragment, instance uint64) {
	fragment, instance = f.Capacity, inst.Capacity
	for _, c := range w.ConfigurationsOf(inst.ID) {
		if c.Type != model.TypeSwap || c.SwapSize == 0 {
			continue
		}
		pool := w.Pools[inst.Pool]
		if pool == nil || pool.Granularity == 0 {
			continue
		}
		perNode := max(units.Grains(c.SwapSize, pool.Granularity), 1)
		fragment += f.Grains / perNode * SwapAreaSlack
		instance += inst.Grains / perNode * SwapAreaSlack
	}
	return fragment, instance
}
