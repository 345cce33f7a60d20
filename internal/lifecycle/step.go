package lifecycle

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// Operations an Effect asks the executor to perform on an agent.
const (
	OpCreateFragment  = "create-fragment"
	OpDeleteFragment  = "delete-fragment"
	OpCreateNamespace = "create-namespace"
	OpDeleteNamespace = "delete-namespace"
	OpMount           = "mount"
	OpUnmount         = "unmount"
	OpStartStage      = "start-stage"
	OpPollStage       = "poll-stage"
	OpCancelStage     = "cancel-stage"
	// OpFlushCache moves a cache fragment's dirty data to the PFS (or discards it) before
	// its instance is destroyed: a poll, like OpPollStage (flush.go).
	OpFlushCache = "flush-cache"
)

// maxStageWarnings bounds the warnings kept on a stage record.
const maxStageWarnings = 20

// Effect is one call the executor makes on one agent. The specs are complete: the executor
// needs nothing else to perform it.
type Effect struct {
	Op        string
	Ref       Ref
	Node      string // the agent to call
	Fragment  agentapi.FragmentSpec
	Namespace agentapi.NamespaceSpec
	Mount     agentapi.MountSpec
	Stage     agentapi.StageSpec
	Flush     agentapi.CacheFlushSpec
	// Swap and SwapDetach are a swap area's attach and detach (swap.go).
	Swap       agentapi.SwapSpec
	SwapDetach agentapi.SwapDetachSpec
	// Part is, for a split stage's runs, 1 + the run's index in Stage.Parts (0 otherwise).
	Part int
}

// EffectKey identifies an effect's object (and a split stage's run), so that the executor
// runs one effect per object at a time.
type EffectKey struct {
	Ref
	Part int
}

// Key is the effect's EffectKey.
func (e Effect) Key() EffectKey { return EffectKey{e.Ref, e.Part} }

// Result is the outcome of an effect.
type Result struct {
	Err   error
	Stage agentapi.StageStatus      // for poll-stage
	Flush agentapi.CacheFlushStatus // for flush-cache
	Swap  agentapi.SwapStatus       // for detach-swap
	// NotTheNode marks a failure that is no fault of the effect's node: the controller's own
	// or a configuration problem (an agent address it cannot dial as given, TLS or
	// credentials that do not agree). It does not count toward auto-drain.
	NotTheNode bool
	// NoAnswer marks a failure of the node not answering at all (its agent down or
	// restarting, the node unreachable: refused, reset, no connection made), not an error
	// its agent answered, nor a call it took and did not answer in time. A cache flush
	// waits on such a node until it answers or is found offline.
	NoAnswer bool
}

// Step settles what needs no agent (records whose dependents are gone, sessions that reached
// their goal) and returns the effects that can run now. Effects whose retry time has not come
// are left for a later step.
func Step(w *World, p Params, now time.Time) []Effect {
	Expire(w, now)
	var effects []Effect
	running := w.Elsewhere.RunningStages // stage.max_running holds over every session
	for _, st := range w.Stages {
		if st.Status == model.StageRunning {
			running++
		}
	}
	for _, s := range w.SortedSessions() {
		if s.State.Goal == model.GoalDestroy {
			effects = append(effects, stepDestroy(w, s, p, now, &running)...)
		} else {
			effects = append(effects, stepCreate(w, s, p, now, &running)...)
		}
	}
	return effects
}

func ready(st model.State, now time.Time) bool {
	return !st.FuseBlown && !now.Before(st.RetryAt)
}

func nodeOnline(w *World, name string) bool {
	n := w.Nodes[name]
	return n != nil && n.Online
}

func stepCreate(w *World, s *model.Session, p Params, now time.Time, running *int) []Effect {
	var effects []Effect
	insts := w.InstancesOf(s.ID)
	allReady := true
	for _, inst := range insts {
		for _, f := range w.FragmentsOf(inst.ID) {
			if f.State.Actualized {
				continue
			}
			allReady = false
			if ready(f.State, now) {
				fragCap, instCap := swapCapacities(w, inst, f)
				effects = append(effects, Effect{Op: OpCreateFragment, Ref: Ref{KindFragment, f.ID}, Node: f.Node,
					Fragment: agentapi.FragmentSpec{ID: f.ID, InstanceID: inst.ID, Capacity: fragCap, InstanceCapacity: instCap,
						WriteLimit: WriteLimit(inst.WriteWindowMultiplier, f.Capacity), WriteWindowLength: inst.WriteWindowLength, Job: s.Token,
						Cache: instanceCache(w, inst.ID), StripeIndex: cacheStripeIndex(w, inst.ID, f)}})
			}
		}
		for _, c := range w.ConfigurationsOf(inst.ID) {
			for _, ns := range w.NamespacesOf(c.ID) {
				if ns.State.Actualized || ns.State.Goal != model.GoalCreate {
					continue
				}
				if ns.ClientNode == "" {
					allReady = false
				}
				f := w.Fragments[ns.FragmentID]
				if f == nil || !f.State.Actualized || !ready(ns.State, now) {
					continue
				}
				spec := agentapi.NamespaceSpec{ID: ns.ID, FragmentID: f.ID, InstanceID: inst.ID, Owner: c.Owner, Group: c.Group, Mode: c.RootPermissions,
					MaxFilesCreated: c.MaxFilesCreated, MaxFileSize: c.MaxFileSize, Cache: cacheSpec(w, c)}
				if c.MaxMDS { // each shard counts its own files: it enforces its share
					spec.MaxFilesCreated = stripe.ShardLimit(c.MaxFilesCreated, len(w.NamespacesOf(c.ID)))
				}
				if striped(w, c) {
					spec.Servers, spec.StripeSize = len(w.FragmentsOf(inst.ID)), w.StripeSize(inst)
				}
				effects = append(effects, Effect{Op: OpCreateNamespace, Ref: Ref{KindNamespace, ns.ID}, Node: f.Node, Namespace: spec})
			}
		}
	}
	if allReady && !s.State.Actualized {
		s.State = model.Created()
		w.put(s)
		for _, inst := range insts {
			if !inst.State.Actualized {
				inst.State = model.Created()
				w.put(inst)
			}
		}
	}
	effects = append(effects, stepStages(w, s, p, now, running)...)
	for _, a := range w.ActivationsOf(s.ID) {
		effects = append(effects, stepActivation(w, s, a, p, now)...)
	}
	return effects
}

// stepStages starts pending stages (within the global limit) and polls running ones.
func stepStages(w *World, s *model.Session, p Params, now time.Time, running *int) []Effect {
	var effects []Effect
	stages := w.StagesOf(s.ID)
	inJobRunning := 0 // the job's own stages running, for its dw_set_stage_concurrency
	for _, st := range stages {
		if st.InJob && st.Status == model.StageRunning {
			inJobRunning++
		}
	}
	for _, st := range stages {
		switch st.Status {
		case model.StagePending:
			if st.Terminate { // the job terminated it before it was known to run
				effects = append(effects, cancelPending(w, s, st, now)...)
				continue
			}
			ns := w.Namespaces[st.NamespaceID]
			if ns == nil || !ns.State.Actualized || !ready(st.State, now) || *running >= p.StageMaxRunning {
				continue
			}
			if st.InJob && s.StageConcurrency > 0 && inJobRunning >= s.StageConcurrency {
				continue // the job's own limit: this one waits for one of its others to end
			}
			if st.InJob {
				inJobRunning++
			}
			spec, node, err := stageSpec(w, s, st)
			if err != nil {
				failStage(w, st, err.Error(), now)
				continue
			}
			if !nodeOnline(w, node) {
				retryLater(w, &st.State, fmt.Sprintf("storage node %s is offline", node), p, now)
				w.put(st)
				if st.State.FuseBlown {
					failStage(w, st, st.State.Error, now)
				}
				continue
			}
			*running++
			if servers, mds, split := splitServers(w, st, spec); split {
				startSplit(w, st, node, mds, now)
				effects = append(effects, stepSplit(w, st, spec, servers, mds, now)...)
				continue
			}
			effects = append(effects, Effect{Op: OpStartStage, Ref: Ref{KindStage, st.ID}, Node: node, Stage: spec})
		case model.StageRunning:
			spec, node, err := stageSpec(w, s, st)
			if st.Terminate { // the job asked to stop it (dw_terminate_*)
				if st.Step != "" {
					servers, mds, split := splitServers(w, st, spec)
					cancels, _ := cancelSplit(w, st, spec, servers, mds, err == nil && split, now)
					effects = append(effects, cancels...)
					continue
				}
				if !nodeOnline(w, node) {
					st.Status, st.Error, st.Finished = model.StageCanceled, cancelMessage(st), now
					w.put(st)
					continue
				}
				if ready(st.State, now) {
					effects = append(effects, Effect{Op: OpCancelStage, Ref: Ref{KindStage, st.ID}, Node: node, Stage: agentapi.StageSpec{ID: st.ID}})
				}
				continue
			}
			if st.Step != "" {
				servers, mds, split := splitServers(w, st, spec)
				if err != nil || !split {
					failStage(w, st, fmt.Sprintf("the instance's servers changed during the stage: %v", err), now)
					continue
				}
				effects = append(effects, stepSplit(w, st, spec, servers, mds, now)...)
				continue
			}
			if !ready(st.State, now) {
				continue
			}
			effects = append(effects, Effect{Op: OpPollStage, Ref: Ref{KindStage, st.ID}, Node: node, Stage: agentapi.StageSpec{ID: st.ID}})
		}
	}
	return effects
}

func stepActivation(w *World, s *model.Session, a *model.Activation, p Params, now time.Time) []Effect {
	if IsSwap(w, a) {
		return stepSwap(w, s, a, p, now)
	}
	if a.State.Actualized && a.State.Goal == model.GoalCreate {
		return nil
	}
	if a.State.Goal == model.GoalDestroy {
		if !nodeOnline(w, a.Node) {
			// The node is gone, and its mounts with it.
			w.remove(KindActivation, a.ID)
			return nil
		}
		if !ready(a.State, now) {
			return nil
		}
		return []Effect{{Op: OpUnmount, Ref: Ref{KindActivation, a.ID}, Node: a.Node, Mount: agentapi.MountSpec{ActivationID: a.ID, MountPath: a.MountPath}}}
	}
	ns := w.Namespaces[a.NamespaceID]
	if ns == nil || !ns.State.Actualized || !ready(a.State, now) {
		return nil
	}
	return []Effect{{Op: OpMount, Ref: Ref{KindActivation, a.ID}, Node: a.Node, Mount: mountSpec(w, a)}}
}

// mountSpec is the agent's order to mount an activation.
func mountSpec(w *World, a *model.Activation) agentapi.MountSpec {
	spec := agentapi.MountSpec{ActivationID: a.ID, MountPath: a.MountPath, ReadOnly: a.ReadOnly,
		Label: "spillway:" + path.Base(a.MountPath)}
	ns := w.Namespaces[a.NamespaceID]
	c := w.Configurations[a.ConfigurationID]
	if ns == nil || c == nil {
		return spec
	}
	spec.NamespaceID, spec.Owner, spec.InstanceID = ns.ID, c.Owner, c.InstanceID
	spec.ClientCache, spec.MaxFileSize = c.ClientCache, c.MaxFileSize
	if f := w.Fragments[ns.FragmentID]; f != nil {
		spec.StorageNode, spec.FragmentID = f.Node, f.ID
		if n := w.Nodes[f.Node]; n != nil {
			spec.DataAddress = n.DataAddress
		}
	}
	if inst := w.Instances[c.InstanceID]; inst != nil {
		spec.Capacity = inst.Capacity
	}
	if striped(w, c) {
		spec.Stripes = stripeServers(w, c.InstanceID)
	}
	spec.Replicas = replicas(w, c, ns)
	spec.MDS = shards(w, c)
	spec.Cache = cacheSpec(w, c)
	return spec
}

// cacheSpec is what the agents need of a cache configuration (nil for scratch): the mount,
// the namespace server and every stripe server of its instance.
func cacheSpec(w *World, c *model.Configuration) *agentapi.CacheSpec {
	k := c.Cache
	if k == nil {
		return nil
	}
	spec := &agentapi.CacheSpec{PFS: k.PFS, ModifiedThreshold: k.ModifiedThreshold, ReadAhead: k.ReadAhead,
		SyncOnClose: k.SyncOnClose, SyncToPFS: k.SyncToPFS, HighWatermark: k.HighWatermark, LowWatermark: k.LowWatermark,
		UID: c.Owner, GID: c.Group, Servers: len(w.FragmentsOf(c.InstanceID))}
	if c.AccessMode == model.AccessLoadbalance {
		// The load-balanced cache: every fragment serves whole files from its own cache (a
		// one-server layout) behind a namespace of its own, each a replica of the others.
		spec.Loadbalance, spec.Servers = true, 1
	}
	if inst := w.Instances[c.InstanceID]; inst != nil {
		spec.StripeSize = w.StripeSize(inst)
	}
	return spec
}

// stripeIndex is fragment f's place in its instance's layout (fragments in id order).
func stripeIndex(w *World, f *model.Fragment) int {
	for i, g := range w.FragmentsOf(f.InstanceID) {
		if g.ID == f.ID {
			return i
		}
	}
	return 0
}

// cacheStripeIndex is fragment f's place in its instance's cache layout: stripeIndex, or 0 for
// a load-balanced cache, whose every fragment holds all of the files it serves.
func cacheStripeIndex(w *World, instanceID ID, f *model.Fragment) int {
	if spec := instanceCache(w, instanceID); spec != nil && spec.Loadbalance {
		return 0
	}
	return stripeIndex(w, f)
}

// instanceCache is the cache an instance's fragments hold (nil: a scratch instance). An
// instance has one cache configuration at most (a job's scratch and cache are two instances).
func instanceCache(w *World, instanceID ID) *agentapi.CacheSpec {
	for _, c := range w.ConfigurationsOf(instanceID) {
		if spec := cacheSpec(w, c); spec != nil {
			return spec
		}
	}
	return nil
}

// shards are the namespace shards of a striped configuration spread over every server
// (max_mds=yes), in fragment order; none for a namespace on one server.
func shards(w *World, c *model.Configuration) []agentapi.Replica {
	nss := w.NamespacesOf(c.ID)
	if !c.MaxMDS || !striped(w, c) || len(nss) < 2 {
		return nil
	}
	out := make([]agentapi.Replica, 0, len(nss))
	for _, ns := range nss {
		f := w.Fragments[ns.FragmentID]
		if f == nil {
			return nil // a shard is gone: the namespace cannot be served whole
		}
		r := agentapi.Replica{Node: f.Node, FragmentID: f.ID, NamespaceID: ns.ID}
		if n := w.Nodes[f.Node]; n != nil {
			r.DataAddress = n.DataAddress
		}
		out = append(out, r)
	}
	return out
}

// striped reports whether a configuration's files are striped over its instance's servers:
// every access mode of an instance on several nodes but loadbalance, which has a replica on
// each.
// A load-balanced cache is not striped: each of its servers serves whole files (cacheSpec).
func striped(w *World, c *model.Configuration) bool {
	if c.Type == model.TypeSwap {
		return false // a swap area's file is whole on its namespace's fragment (swap.go)
	}
	if c.Type == model.TypeCache && c.AccessMode == model.AccessStriped {
		return true // even on one node: a cache's file data is always in stripe objects, one data path
	}
	return c.AccessMode != model.AccessLoadbalance && len(w.FragmentsOf(c.InstanceID)) > 1
}

// replicas are a loadbalance configuration's replicas for a client that reads ns: ns first,
// then the others in order, to fail over to; none for a configuration with one namespace.
func replicas(w *World, c *model.Configuration, ns *model.Namespace) []agentapi.Replica {
	nss := w.NamespacesOf(c.ID)
	if c.AccessMode != model.AccessLoadbalance || len(nss) < 2 {
		return nil
	}
	var out []agentapi.Replica
	for i := range nss {
		r := nss[(indexOf(nss, ns)+i)%len(nss)]
		f := w.Fragments[r.FragmentID]
		if f == nil {
			continue
		}
		rep := agentapi.Replica{Node: f.Node, FragmentID: f.ID, NamespaceID: r.ID}
		if n := w.Nodes[f.Node]; n != nil {
			rep.DataAddress = n.DataAddress
		}
		out = append(out, rep)
	}
	return out
}

func indexOf(nss []*model.Namespace, ns *model.Namespace) int {
	for i, n := range nss {
		if n == ns {
			return i
		}
	}
	return 0
}

// stripeServers are the servers of a striped instance's data: its fragments in id order (the
// layout's order). Callers ask striped() first: a scratch instance on one fragment keeps its
// data in its namespace, a cache's is in stripe objects even then.
func stripeServers(w *World, instanceID ID) []agentapi.StripeServer {
	frags := w.FragmentsOf(instanceID)
	if len(frags) == 0 {
		return nil
	}
	out := make([]agentapi.StripeServer, len(frags))
	for i, f := range frags {
		out[i] = agentapi.StripeServer{Node: f.Node, FragmentID: f.ID}
		if n := w.Nodes[f.Node]; n != nil {
			out[i].DataAddress = n.DataAddress
		}
	}
	return out
}

// LiveMounts lists the mounts that should exist on a compute node now: its actualized
// activations. An agent that restarted uses it to restore them.
func LiveMounts(w *World, node string) []agentapi.MountSpec {
	var out []agentapi.MountSpec
	for _, id := range sortedIDs(w.Activations) {
		a := w.Activations[id]
		if a.Node == node && a.State.Goal == model.GoalCreate && a.State.Actualized && !IsSwap(w, a) {
			out = append(out, mountSpec(w, a))
		}
	}
	return out
}

// ExpectedMounts are the mount paths of the mounts the world wants on node and has not
// recorded as made (agentapi.Assignment.Expected): a heartbeat's answer lists them so that the
// agent does not take away a mount whose outcome a controller (perhaps one that since lost its
// leadership) had not persisted yet.
func ExpectedMounts(w *World, node string) []string {
	var out []string
	for _, id := range sortedIDs(w.Activations) {
		a := w.Activations[id]
		if a.Node == node && a.State.Goal == model.GoalCreate && !a.State.Actualized && !IsSwap(w, a) && a.MountPath != "" {
			out = append(out, a.MountPath)
		}
	}
	return out
}

// NamespaceLocator is how the controller names a namespace to the agent that holds it; the
// agent turns it into a directory under its SSD path.
func NamespaceLocator(fragmentID, namespaceID ID) string {
	return fmt.Sprintf("fragment/%d/namespace/%d", fragmentID, namespaceID)
}

// stageSpec builds the agent's order for a stage: every namespace of the session on the stage's
// storage node, by variable, so that lists may address any of them.
func stageSpec(w *World, s *model.Session, st *model.Stage) (agentapi.StageSpec, string, error) {
	ns := w.Namespaces[st.NamespaceID]
	if ns == nil {
		return agentapi.StageSpec{}, "", fmt.Errorf("the stage's namespace is gone")
	}
	f := w.Fragments[ns.FragmentID]
	if f == nil {
		return agentapi.StageSpec{}, "", fmt.Errorf("the stage's fragment is gone")
	}
	spec := agentapi.StageSpec{
		ID: st.ID, Direction: st.Direction, Type: st.Type, PFSPath: st.PFSPath, DWPath: st.DWPath,
		Roots: map[string]string{}, UID: s.Owner, GID: s.Group, Line: st.Line, Protect: st.Protect,
	}
	if c := w.Configurations[st.ConfigurationID]; c != nil {
		spec.Instance = c.InstanceID
	}
	for _, e := range Exposures(w, s) {
		ens := w.NamespaceFor(e.Config, "")
		if e.Config.ID == st.ConfigurationID {
			ens = ns // a loadbalance replica's stage fills that replica
		}
		if ens == nil || e.Config.AccessMode == model.AccessPrivate || e.Config.Type == model.TypeCache { // a cache is never staged
			continue
		}
		ef := w.Fragments[ens.FragmentID]
		if ef == nil || ef.Node != f.Node {
			continue
		}
		spec.Roots[e.Var] = NamespaceLocator(ef.ID, ens.ID)
		if stripes := stripeServers(w, e.Config.InstanceID); stripes != nil && striped(w, e.Config) {
			// The storage node stages a striped namespace through a mount of its own.
			if spec.Striped == nil {
				spec.Striped = map[string]agentapi.MountSpec{}
			}
			spec.Striped[e.Var] = agentapi.MountSpec{StorageNode: ef.Node, FragmentID: ef.ID, NamespaceID: ens.ID,
				InstanceID: e.Config.InstanceID, Owner: e.Config.Owner, MaxFileSize: e.Config.MaxFileSize,
				DataAddress: w.Nodes[ef.Node].DataAddress, Stripes: stripes, MDS: shards(w, e.Config)}
		}
	}
	return spec, f.Node, nil
}

func stepDestroy(w *World, s *model.Session, p Params, now time.Time, running *int) []Effect {
	var effects []Effect
	stages := w.StagesOf(s.ID)
	if waitsForStageOut(w, s, stages) {
		// Let the stage-outs run to their end; nothing is destroyed meanwhile.
		return stepStages(w, s, p, now, running)
	}
	if !s.Hurry {
		if kept := unfinishedStageOuts(w, s); len(kept) > 0 {
			// A stage-out failed while the teardown waited for it: nothing is destroyed yet,
			// and nothing will be until the results are out or an explicit hurry discards them.
			s.State = model.Created()
			s.Phase = PhaseDataOut
			s.Failure = "teardown undone, the instance is kept: " + strings.Join(kept, "; ")
			w.put(s)
			return nil
		}
	}
	busyStages := false
	for _, st := range stages {
		switch st.Status {
		case model.StagePending:
			// Its start may be on its way to the agent (cancelPending): the teardown waits
			// until the agent confirms that nothing of it runs.
			if cancels := cancelPending(w, s, st, now); len(cancels) > 0 || !st.Ended() {
				effects = append(effects, cancels...)
				busyStages = true
			}
		case model.StageDeferred:
			st.Status = model.StageCanceled
			st.Error = "canceled by teardown"
			st.Finished = now
			w.put(st)
		case model.StageRunning:
			if st.Step != "" {
				spec, _, err := stageSpec(w, s, st)
				servers, mds, split := splitServers(w, st, spec)
				cancels, busy := cancelSplit(w, st, spec, servers, mds, err == nil && split, now)
				effects = append(effects, cancels...)
				busyStages = busyStages || busy
				continue
			}
			busyStages = true
			_, node, _ := stageSpec(w, s, st)
			if !nodeOnline(w, node) {
				st.Status, st.Error, st.Finished = model.StageCanceled, "canceled by teardown (storage node offline)", now
				w.put(st)
				continue
			}
			if ready(st.State, now) {
				effects = append(effects, Effect{Op: OpCancelStage, Ref: Ref{KindStage, st.ID}, Node: node, Stage: agentapi.StageSpec{ID: st.ID}})
			}
		}
	}
	activations := w.ActivationsOf(s.ID)
	for _, a := range activations {
		if a.State.Goal != model.GoalDestroy {
			a.State = model.Destroying()
			w.put(a)
		}
		effects = append(effects, stepActivation(w, s, a, p, now)...)
	}
	if busyStages || len(w.ActivationsOf(s.ID)) > 0 {
		return effects
	}
	instsLeft := false
	for _, inst := range w.InstancesOf(s.ID) {
		if mountedElsewhere(w, s, inst) {
			return effects // a hurried persistent destroy: the jobs that used it unmount it first
		}
	}
	// Nothing mounts the instances any more: a cache's dirty data goes to the PFS before
	// any of them is touched (a failed flush undoes the teardown, which must find them whole).
	if more, wait := flushCaches(w, s, p, now); wait {
		return append(effects, more...)
	}
	// Each instance (a job may hold a scratch and a cache) goes at its own pace; the session
	// goes once all of them are gone.
	for _, inst := range w.InstancesOf(s.ID) {
		more, done := destroyInstance(w, inst, now)
		effects = append(effects, more...)
		instsLeft = instsLeft || !done
	}
	if instsLeft {
		return effects
	}
	for _, r := range w.RegistrationsOf(s.ID) {
		w.remove(KindRegistration, r.ID)
	}
	for _, st := range stages {
		w.retire(st, s)
	}
	w.remove(KindSession, s.ID)
	return effects
}

// destroyInstance drives one instance of a session being torn down towards its removal:
// namespaces first, then fragments, then its configurations and itself. done is true once
// the instance is gone.
func destroyInstance(w *World, inst *model.Instance, now time.Time) (effects []Effect, done bool) {
	if inst.State.Goal != model.GoalDestroy {
		inst.State = model.Destroying()
		w.put(inst)
	}
	nsLeft := false
	for _, c := range w.ConfigurationsOf(inst.ID) {
		for _, ns := range w.NamespacesOf(c.ID) {
			f := w.Fragments[ns.FragmentID]
			if ns.State.Goal != model.GoalDestroy {
				ns.State = model.Destroying()
				w.put(ns)
			}
			if f == nil || !nodeOnline(w, f.Node) {
				// The node is offline: its agent deletes what the controller no longer
				// knows when it comes back.
				w.remove(KindNamespace, ns.ID)
				continue
			}
			nsLeft = true
			if ready(ns.State, now) {
				effects = append(effects, Effect{Op: OpDeleteNamespace, Ref: Ref{KindNamespace, ns.ID}, Node: f.Node,
					Namespace: agentapi.NamespaceSpec{ID: ns.ID, FragmentID: f.ID, InstanceID: inst.ID}})
			}
		}
	}
	if nsLeft {
		return effects, false
	}
	fragsLeft := false
	for _, f := range w.FragmentsOf(inst.ID) {
		if f.State.Goal != model.GoalDestroy {
			f.State = model.Destroying()
			w.put(f)
		}
		if !nodeOnline(w, f.Node) {
			w.remove(KindFragment, f.ID)
			continue
		}
		fragsLeft = true
		if ready(f.State, now) {
			effects = append(effects, Effect{Op: OpDeleteFragment, Ref: Ref{KindFragment, f.ID}, Node: f.Node,
				Fragment: agentapi.FragmentSpec{ID: f.ID, InstanceID: inst.ID, Capacity: f.Capacity}})
		}
	}
	if fragsLeft {
		return effects, false
	}
	for _, c := range w.ConfigurationsOf(inst.ID) {
		for _, r := range w.Registrations {
			if r.ConfigurationID == c.ID {
				w.remove(KindRegistration, r.ID)
			}
		}
		w.remove(KindConfiguration, c.ID)
	}
	w.remove(KindInstance, inst.ID)
	return effects, true
}

// waitsForStageOut reports whether a teardown must still wait: not hurried, a stage-out is
// unfinished, and its configuration's registration still asks to wait.
func waitsForStageOut(w *World, s *model.Session, stages []*model.Stage) bool {
	if s.Hurry {
		return false
	}
	for _, st := range stages {
		if st.Direction == model.StageOut && !st.Ended() && st.Status != model.StageDeferred && registrationWaits(w, s, st) {
			return true
		}
	}
	return false
}

// retryLater records a failed attempt and when to try again; after MaxAttempts the object's
// fuse blows and it waits for an operator.
func retryLater(w *World, st *model.State, msg string, p Params, now time.Time) {
	st.Attempts++
	st.Error = msg
	st.Transitioning = true
	if st.Attempts >= p.MaxAttempts {
		st.FuseBlown = true
		return
	}
	wait := p.RetryBackoff << (st.Attempts - 1)
	if wait > p.RetryBackoffMax || wait <= 0 {
		wait = p.RetryBackoffMax
	}
	st.RetryAt = now.Add(wait)
}

func failStage(w *World, st *model.Stage, msg string, now time.Time) {
	st.Status = model.StageFailed
	st.Error = msg
	st.Finished = now
	st.State.Transitioning = false
	w.put(st)
	if s := w.Sessions[st.SessionID]; s != nil {
		s.Failure = stageLabel(st) + ": " + msg
		w.put(s)
	}
}

func stageLabel(st *model.Stage) string {
	dir := "stage_in"
	if st.Direction == model.StageOut {
		dir = "stage_out"
	}
	if st.Line > 0 {
		return fmt.Sprintf("%s (line %d)", dir, st.Line)
	}
	return dir
}

// Complete records an effect's outcome.
func Complete(w *World, e Effect, r Result, p Params, now time.Time) {
	noteEffectFailure(w, e, r, p, now)
	if e.Part > 0 {
		completeSplit(w, e, r, p, now)
		return
	}
	switch e.Op {
	case OpCreateFragment:
		if f := w.Fragments[e.Ref.ID]; f != nil && f.State.Goal == model.GoalCreate {
			settle(w, f, &f.State, r.Err, fmt.Sprintf("create fragment %d on %s", f.ID, f.Node), p, now)
		}
	case OpCreateNamespace:
		if ns := w.Namespaces[e.Ref.ID]; ns != nil && ns.State.Goal == model.GoalCreate {
			settle(w, ns, &ns.State, r.Err, fmt.Sprintf("create namespace %d on %s", ns.ID, e.Node), p, now)
		}
	case OpMount:
		if a := w.Activations[e.Ref.ID]; a != nil && a.State.Goal == model.GoalCreate {
			settle(w, a, &a.State, r.Err, fmt.Sprintf("mount %s on %s", a.MountPath, a.Node), p, now)
		}
	case OpDeleteFragment:
		if f := w.Fragments[e.Ref.ID]; f != nil && f.State.Goal == model.GoalDestroy {
			removeOrRetry(w, KindFragment, f.ID, f, &f.State, r.Err, fmt.Sprintf("delete fragment %d on %s", f.ID, f.Node), p, now)
		}
	case OpDeleteNamespace:
		if ns := w.Namespaces[e.Ref.ID]; ns != nil && ns.State.Goal == model.GoalDestroy {
			removeOrRetry(w, KindNamespace, ns.ID, ns, &ns.State, r.Err, fmt.Sprintf("delete namespace %d on %s", ns.ID, e.Node), p, now)
		}
	case OpUnmount:
		if a := w.Activations[e.Ref.ID]; a != nil && a.State.Goal == model.GoalDestroy {
			removeOrRetry(w, KindActivation, a.ID, a, &a.State, r.Err, fmt.Sprintf("unmount %s on %s", a.MountPath, a.Node), p, now)
		}
	case OpStartStage:
		st := w.Stages[e.Ref.ID]
		if st == nil || st.Status != model.StagePending {
			return
		}
		if r.Err != nil {
			retryLater(w, &st.State, r.Err.Error(), p, now)
			w.put(st)
			if st.State.FuseBlown {
				failStage(w, st, "could not start: "+r.Err.Error(), now)
			}
			return
		}
		st.Status = model.StageRunning
		st.Started = now
		st.Attempts++
		w.put(st)
	case OpPollStage:
		st := w.Stages[e.Ref.ID]
		if st == nil || st.Status != model.StageRunning {
			return
		}
		if r.Err != nil {
			// The agent did not answer: try again later; a node that stays away goes offline
			// and the stage fails then.
			retryLater(w, &st.State, r.Err.Error(), p, now)
			w.put(st)
			if st.State.FuseBlown {
				failStage(w, st, "lost contact with the storage node: "+r.Err.Error(), now)
			}
			return
		}
		applyStageStatus(w, st, r.Stage, p, now)
	case OpFlushCache:
		completeFlush(w, e, r, p, now)
	case OpAttachSwap, OpDetachSwap:
		completeSwap(w, e, r, p, now)
	case OpCancelStage:
		st := w.Stages[e.Ref.ID]
		if st == nil || st.Ended() {
			return
		}
		if r.Err != nil {
			retryLater(w, &st.State, r.Err.Error(), p, now)
			if st.State.FuseBlown {
				st.Status, st.Finished = model.StageCanceled, now
			}
			w.put(st)
			return
		}
		if r.Stage.Known && r.Stage.Status == model.StageComplete {
			// The worker finished its copy before the cancel reached it: every file is
			// there, and the stage says so (a terminate that races the end of a copy).
			applyStageStatus(w, st, r.Stage, p, now)
			return
		}
		st.Status, st.Error, st.Finished = model.StageCanceled, cancelMessage(st), now
		st.State.Transitioning = false
		if r.Stage.Known {
			st.FilesDone, st.BytesDone = r.Stage.FilesDone, r.Stage.BytesDone
		}
		w.put(st)
	}
}

// cancelPending ends a pending stage the job terminated. Its start may have been sent (the
// start effect was in flight when the terminate came, or the controller restarted after
// sending it and before recording it): the stage's agent is asked to cancel it, which is
// harmless when nothing was started, and the stage ends with what the agent answers
// (canceled, or complete when the copy finished first). The executor never runs the cancel
// while the start is still in flight (one effect per stage at a time), and a start that
// lands meanwhile makes the stage running, whose terminate cancels it in turn. Only a stage
// that no agent can have been asked to run, or whose node is offline, ends at once.
func cancelPending(w *World, s *model.Session, st *model.Stage, now time.Time) []Effect {
	_, node, err := stageSpec(w, s, st)
	if err != nil || node == "" || !nodeOnline(w, node) {
		st.Status, st.Error, st.Finished = model.StageCanceled, cancelMessage(st), now
		st.State.Transitioning = false
		w.put(st)
		return nil
	}
	if !ready(st.State, now) {
		return nil
	}
	return []Effect{{Op: OpCancelStage, Ref: Ref{KindStage, st.ID}, Node: node, Stage: agentapi.StageSpec{ID: st.ID}}}
}

// stageStatusAsKnown reports whether an agent's answer about a running stage says nothing
// the stage does not hold already: still running, the same counts and warnings, no retry
// under way. applyStageStatus then changes nothing.
func stageStatusAsKnown(st *model.Stage, ss agentapi.StageStatus) bool {
	warnings := st.Warnings
	if len(ss.Warnings) > 0 {
		warnings = ss.Warnings[:min(len(ss.Warnings), maxStageWarnings)]
	}
	return ss.Known && ss.Status == model.StageRunning && st.Status == model.StageRunning &&
		st.FilesTotal == ss.FilesTotal && st.FilesDone == ss.FilesDone &&
		st.BytesTotal == ss.BytesTotal && st.BytesDone == ss.BytesDone &&
		slices.Equal(warnings, st.Warnings) && st.State.Attempts == 0 && st.State.Error == ""
}

// PollSaysNothingNew reports whether Complete(w, e, r) would change nothing: e is a poll of a
// running stage (not a part of a split one) that w holds, answered without error with what
// the stage holds already. The executor then records nothing (no write transaction, which
// the requests would wait for).
func PollSaysNothingNew(w *World, e Effect, r Result) bool {
	if e.Op != OpPollStage || e.Part > 0 || r.Err != nil {
		return false
	}
	st := w.Stages[e.Ref.ID]
	return st != nil && stageStatusAsKnown(st, r.Stage)
}

func applyStageStatus(w *World, st *model.Stage, ss agentapi.StageStatus, p Params, now time.Time) {
	if !ss.Known {
		// The agent restarted and lost the stage: start it again, a bounded number of times.
		if st.Attempts >= p.StageMaxAttempts {
			failStage(w, st, fmt.Sprintf("the storage node restarted during the stage %d times (limit stage.max_attempts)", st.Attempts), now)
			return
		}
		st.Status = model.StagePending
		st.FilesDone, st.BytesDone = 0, 0
		w.put(st)
		return
	}
	if stageStatusAsKnown(st, ss) {
		return // no news: nothing to write (most polls of a short stage)
	}
	st.FilesTotal, st.FilesDone = ss.FilesTotal, ss.FilesDone
	st.BytesTotal, st.BytesDone = ss.BytesTotal, ss.BytesDone
	if len(ss.Warnings) > 0 {
		st.Warnings = ss.Warnings[:min(len(ss.Warnings), maxStageWarnings)]
	}
	st.State.Attempts, st.State.Error = 0, ""
	switch ss.Status {
	case model.StageComplete:
		st.Status = model.StageComplete
		st.Finished = now
		st.State = model.Created()
	case model.StageFailed:
		failStage(w, st, ss.Error, now)
		return
	case model.StageCanceled:
		st.Status, st.Finished, st.Error = model.StageCanceled, now, orDefault(ss.Error, "canceled")
	}
	w.put(st)
}

func settle(w *World, obj any, st *model.State, err error, what string, p Params, now time.Time) {
	if err == nil {
		*st = model.Created()
	} else {
		retryLater(w, st, what+": "+err.Error(), p, now)
		if st.FuseBlown {
			noteFailure(w, obj, st.Error)
		}
	}
	w.put(obj)
}

func removeOrRetry(w *World, kind string, id ID, obj any, st *model.State, err error, what string, p Params, now time.Time) {
	if err == nil {
		w.remove(kind, id)
		return
	}
	retryLater(w, st, what+": "+err.Error(), p, now)
	if st.FuseBlown {
		noteFailure(w, obj, st.Error)
	}
	w.put(obj)
}

// noteFailure records on the owning session why an object gave up, for the WLM to show.
func noteFailure(w *World, obj any, msg string) {
	var sid ID
	switch o := obj.(type) {
	case *model.Fragment:
		if inst := w.Instances[o.InstanceID]; inst != nil {
			sid = inst.SessionID
		}
	case *model.Namespace:
		if c := w.Configurations[o.ConfigurationID]; c != nil {
			if inst := w.Instances[c.InstanceID]; inst != nil {
				sid = inst.SessionID
			}
		}
	case *model.Activation:
		sid = o.SessionID
	}
	if s := w.Sessions[sid]; s != nil {
		s.Failure = msg
		w.put(s)
	}
}
