package lifecycle

import (
	"fmt"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/units"
)

// The teardown's flush of a cache instance (docs/cache.md, "Teardown"). Each storage server
// of a cache instance holds, per fragment, dirty data: written by the job, not yet on the
// PFS. Once nothing mounts the session's instances any more and before any of them is
// destroyed, every fragment of its cache instances is flushed: OpFlushCache, a poll whose
// first call starts the agent's drain, repeated (paced like a stage poll) until the agent
// answers Done. Progress is kept on the fragment, so that a controller that restarts mid-flush
// polls on (the agent's drain never stopped).
//
//   - A flush that fails (the PFS full, a quota, a permission, the PFS unreachable), or whose
//     node answers but keeps failing the call, undoes the teardown as a failed stage-out does: the session
//     back to created, in data_out, its failure naming the fragment's node, the PFS directory
//     and the error, and the ways out (fix the PFS and tear down again, or tear down with
//     --hurry to discard the data). Nothing was destroyed: the instance is whole.
//   - With --hurry the agents discard the data instead (Discard); the bytes discarded are
//     reported on the session (its failure text, for the rest of the teardown) and in the
//     instance's accounting record (Instance.CacheDiscarded).
//   - A fragment whose node is offline (no heartbeat for controller.node_timeout) is not
//     waited for: its unflushed data is lost with the node, and said so the same ways
//     (Instance.CacheLost). A node that does not answer at all (Result.NoAnswer: its agent
//     restarting, or the node dying and not yet offline) is asked again until it answers
//     or is found offline.

// flushCaches drives the flush of the session's cache instances. wait is true while a
// fragment is not flushed yet (effects: the polls due now), or when a failed flush undid the
// teardown; false once every fragment is flushed, the losses reported.
func flushCaches(w *World, s *model.Session, p Params, now time.Time) (effects []Effect, wait bool) {
	var failed []string
	var caches []*model.Instance
	for _, inst := range w.InstancesOf(s.ID) {
		spec := instanceCache(w, inst.ID)
		if spec == nil || inst.State.Goal == model.GoalDestroy {
			continue // scratch, or being destroyed already: flushed before that began
		}
		caches = append(caches, inst)
		for _, f := range w.FragmentsOf(inst.ID) {
			if f.CacheFlushed || !f.State.Actualized {
				continue // done, or never made: no data
			}
			if !nodeOnline(w, f.Node) {
				f.CacheFlushed = true
				f.CacheLost = fmt.Sprintf("storage node %s offline: its unflushed data (%s) is lost", f.Node, lastReported(f))
				f.State = model.Created() // no retry of a flush is due any more
				w.put(f)
				continue
			}
			if f.CacheFlushError != "" && !s.Hurry {
				failed = append(failed, flushFailure(f, spec.PFS))
				continue
			}
			wait = true
			if ready(f.State, now) {
				effects = append(effects, Effect{Op: OpFlushCache, Ref: Ref{KindFragment, f.ID}, Node: f.Node,
					Flush: agentapi.CacheFlushSpec{FragmentID: f.ID, InstanceID: inst.ID, Discard: s.Hurry}})
			}
		}
	}
	if len(failed) > 0 {
		undoFlush(w, s, caches, failed)
		return nil, true
	}
	if wait {
		return effects, true
	}
	// Every fragment is flushed: what did not reach the PFS is said once, as the instances'
	// destruction begins (it sets them destroying in this same step).
	var report []string
	for _, inst := range caches {
		var discarded uint64
		var lost []string
		for _, f := range w.FragmentsOf(inst.ID) {
			discarded += f.CacheDiscarded
			if f.CacheLost != "" {
				lost = append(lost, fmt.Sprintf("fragment %d: %s", f.ID, f.CacheLost))
			}
		}
		if discarded == 0 && len(lost) == 0 {
			continue
		}
		inst.CacheDiscarded, inst.CacheLost = discarded, lost
		w.put(inst)
		if discarded > 0 {
			report = append(report, fmt.Sprintf("teardown with hurry: %d bytes (%s) of cache data not yet on the PFS (%s) discarded",
				discarded, units.FormatHuman(discarded), cachePFS(w, inst)))
		}
		report = append(report, lost...)
	}
	if len(report) > 0 {
		s.Failure = strings.Join(report, "; ")
		w.put(s)
	}
	return nil, false
}

// undoFlush keeps the instances: a flush failed and the teardown was not hurried. The
// session is created again, as after a failed stage-out, and its fragments will be flushed
// again at the next teardown (the instance may be written again meanwhile: a persistent one).
func undoFlush(w *World, s *model.Session, caches []*model.Instance, failed []string) {
	for _, inst := range caches {
		for _, f := range w.FragmentsOf(inst.ID) {
			changed := false
			if f.CacheLost == "" && f.CacheFlushed {
				f.CacheFlushed, changed = false, true
			}
			if f.State.Actualized && f.State != model.Created() {
				f.State, changed = model.Created(), true // a flush call's retry: no longer due
			}
			if changed {
				w.put(f)
			}
		}
	}
	s.State = model.Created()
	s.Phase = PhaseDataOut
	s.Failure = "teardown undone, the instance is kept: " + strings.Join(failed, "; ")
	w.put(s)
}

// flushFailure says why a fragment's flush failed, and the ways out.
func flushFailure(f *model.Fragment, pfs string) string {
	kept, discard := "its unflushed data is kept", "its unflushed data" // never reported
	if f.CacheDirty > 0 {
		discard = fmt.Sprintf("%d bytes (%s)", f.CacheDirty, units.FormatHuman(f.CacheDirty))
		kept = discard + " not yet on the PFS are kept"
	}
	return fmt.Sprintf("the cache on storage node %s (fragment %d) could not flush to %s: %s; %s. "+
		"Fix the PFS (space, quota, permissions, reachability) and tear down again, or tear down with --hurry to discard %s",
		f.Node, f.ID, pfs, f.CacheFlushError, kept, discard)
}

// lastReported is the dirty data a fragment's node last reported.
func lastReported(f *model.Fragment) string {
	if f.CacheDirty == 0 && f.CacheFlushedBytes == 0 {
		return "never reported"
	}
	return fmt.Sprintf("last reported %d bytes, %s", f.CacheDirty, units.FormatHuman(f.CacheDirty))
}

// cachePFS is the PFS directory a cache instance caches.
func cachePFS(w *World, inst *model.Instance) string {
	if spec := instanceCache(w, inst.ID); spec != nil {
		return spec.PFS
	}
	return "?"
}

// completeFlush records a flush poll's answer on its fragment.
func completeFlush(w *World, e Effect, r Result, p Params, now time.Time) {
	f := w.Fragments[e.Ref.ID]
	if f == nil || f.CacheFlushed {
		return
	}
	inst := w.Instances[f.InstanceID]
	if inst == nil {
		return
	}
	s := w.Sessions[inst.SessionID]
	if s == nil || s.State.Goal != model.GoalDestroy {
		return // the teardown was undone meanwhile: the next one polls again
	}
	if r.Err != nil {
		retryLater(w, &f.State, fmt.Sprintf("flush the cache of fragment %d on %s: %v", f.ID, f.Node, r.Err), p, now)
		if f.State.FuseBlown && r.NoAnswer && !e.Flush.Discard && !s.Hurry {
			// The node does not answer at all: its agent is restarting (and will drain what
			// its log holds), or the node is lost, which flushCaches reports once it is
			// offline (controller.node_timeout). Neither is a failed flush, whose message
			// would blame the PFS: ask again, at the slowest retry pace, meanwhile.
			f.State.FuseBlown = false
			f.State.RetryAt = now.Add(p.RetryBackoffMax)
		}
		if f.State.FuseBlown {
			// The node answers, but not the flush: without hurry the teardown is undone
			// (flushCaches), with hurry the data goes with the fragment.
			msg := fmt.Sprintf("the storage node did not answer the flush %d times: %v", f.State.Attempts, r.Err)
			if e.Flush.Discard || s.Hurry {
				f.CacheFlushed = true
				f.CacheLost = fmt.Sprintf("storage node %s could not discard its unflushed data (%s): it is deleted with the fragment; %s",
					f.Node, lastReported(f), msg)
			} else {
				f.CacheFlushError = msg
			}
			f.State = model.Created()
		}
		w.put(f)
		return
	}
	fs := r.Flush
	f.State = model.Created() // a poll answered: no retry pending
	f.CacheDirty, f.CacheFlushedBytes = fs.DirtyBytes, fs.FlushedBytes
	switch {
	case fs.Done:
		f.CacheFlushed = true
		f.CacheFlushError = ""
		f.CacheDiscarded = fs.DiscardedBytes
		f.CacheDirty = 0
	case fs.Error != "":
		f.CacheFlushError = fs.Error
	}
	w.put(f)
}

// flushProgress says what a teardown waits for while it flushes the session's cache
// instances ("" when it does not): the bytes their nodes last reported not yet on the PFS.
func flushProgress(w *World, s *model.Session) string {
	var parts []string
	for _, inst := range w.InstancesOf(s.ID) {
		if inst.State.Goal == model.GoalDestroy || instanceCache(w, inst.ID) == nil {
			continue
		}
		waiting, dirty := 0, uint64(0)
		for _, f := range w.FragmentsOf(inst.ID) {
			if !f.CacheFlushed && f.State.Actualized {
				waiting++
				dirty += f.CacheDirty
			}
		}
		if waiting > 0 {
			parts = append(parts, fmt.Sprintf("flushing the cache to %s: %s not yet on the PFS (%d of its storage nodes to finish)",
				cachePFS(w, inst), units.FormatHuman(dirty), waiting))
		}
	}
	return strings.Join(parts, "; ")
}
