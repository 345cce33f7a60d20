package lifecycle

import (
	"fmt"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
)

// A stage of a striped namespace on several servers is split: every server moves the stripes
// it holds, in steps (agentapi.StagePart): prepare on the metadata server, copy on every other
// server at once, finish on the metadata server; a failure in prepare or copy runs abort
// there (it removes the files prepare created) before the stage fails. Step decides, one
// step at a time, which runs to start, poll or cancel; Complete records their outcomes in
// the stage's Parts.

// splitServers reports whether a stage is split, with the instance's stripe servers and the
// index of the stage's namespace's metadata server among them. A stage is split when its
// namespace is striped over several servers and every namespace it may address is one of
// that instance's (a list may name several variables); otherwise one worker on the metadata
// server moves everything through its mount.
func splitServers(w *World, st *model.Stage, spec agentapi.StageSpec) ([]agentapi.StripeServer, int, bool) {
	ns := w.Namespaces[st.NamespaceID]
	if ns == nil || len(spec.Striped) == 0 || len(spec.Striped) != len(spec.Roots) {
		return nil, 0, false
	}
	for _, ms := range spec.Striped {
		if ms.InstanceID != spec.Instance {
			return nil, 0, false
		}
	}
	servers := stripeServers(w, spec.Instance)
	for i, srv := range servers {
		if srv.FragmentID == ns.FragmentID {
			return servers, i, true
		}
	}
	return nil, 0, false
}

// startSplit turns a pending stage into the first step of a split one.
func startSplit(w *World, st *model.Stage, node string, mds int, now time.Time) {
	st.Status, st.Started = model.StageRunning, now
	st.Attempts++
	st.FilesDone, st.BytesDone, st.StepBytes, st.CopyError, st.Error, st.Moved = 0, 0, 0, "", "", nil
	st.Step = agentapi.StepPrepare
	st.Parts = []model.StagePart{{Node: node, Server: mds, Status: model.StagePending}}
	w.put(st)
}

// stepSplit moves a running split stage on: to its next step when its runs are done, and
// the effects its runs need now.
func stepSplit(w *World, st *model.Stage, spec agentapi.StageSpec, servers []agentapi.StripeServer, mds int, now time.Time) []Effect {
	if advanceSplit(w, st, servers, mds, now) {
		return nil // ended
	}
	var effects []Effect
	failed := false
	for _, part := range st.Parts {
		failed = failed || part.Status == model.StageFailed
	}
	for i := range st.Parts {
		part := &st.Parts[i]
		switch part.Status {
		case model.StagePending:
			if failed || !ready(st.State, now) {
				continue // a failed step starts nothing more
			}
			if !nodeOnline(w, part.Node) {
				part.Status, part.Error = model.StageFailed, fmt.Sprintf("storage node %s is offline", part.Node)
				w.put(st)
				continue
			}
			run := spec
			run.Part = &agentapi.StagePart{Step: st.Step, Server: part.Server, Servers: len(servers), RestoreMode: st.ProtectedMode}
			effects = append(effects, Effect{Op: OpStartStage, Ref: Ref{KindStage, st.ID}, Part: i + 1, Node: part.Node, Stage: run})
		case model.StageRunning:
			op := OpPollStage
			if failed {
				op = OpCancelStage // another server's copy failed: stop this one before the abort
			}
			effects = append(effects, Effect{Op: op, Ref: Ref{KindStage, st.ID}, Part: i + 1, Node: part.Node,
				Stage: agentapi.StageSpec{ID: st.ID, Part: &agentapi.StagePart{Step: st.Step}}})
		}
	}
	return effects
}

// advanceSplit takes a split stage to its next step once no run of this one is under way,
// and reports whether the stage ended. mds is the metadata server's index in servers.
func advanceSplit(w *World, st *model.Stage, servers []agentapi.StripeServer, mds int, now time.Time) bool {
	var moved uint64
	failure := ""
	for _, part := range st.Parts {
		if part.Status == model.StageRunning {
			return false
		}
		moved += part.BytesDone
		switch {
		case failure != "":
		case part.Status == model.StageFailed && st.Step == agentapi.StepCopy:
			failure = fmt.Sprintf("%s (copying the stripes held by %s)", orDefault(part.Error, "failed"), part.Node)
		case part.Status == model.StageFailed || part.Status == model.StageCanceled:
			failure = orDefault(part.Error, part.Status)
		}
	}
	for _, part := range st.Parts {
		if part.Status == model.StagePending && failure == "" {
			return false
		}
	}
	if MovesData(st.Step) {
		st.StepBytes += moved
		for _, part := range st.Parts {
			if st.Moved == nil {
				st.Moved = map[string]uint64{}
			}
			st.Moved[part.Node] += part.BytesDone
		}
	}
	onMDS := []model.StagePart{{Node: servers[mds].Node, Server: mds, Status: model.StagePending}}
	next := func(step string, parts []model.StagePart) bool {
		st.Step, st.Parts = step, parts
		w.put(st)
		return false
	}
	switch {
	case failure != "" && (st.Step == agentapi.StepPrepare || st.Step == agentapi.StepCopy):
		st.CopyError = failure
		return next(agentapi.StepAbort, onMDS)
	case failure != "" && st.Step == agentapi.StepFinish:
		failStage(w, st, failure, now)
		return true
	case st.Step == agentapi.StepAbort:
		msg := st.CopyError
		switch {
		case failure == "":
		case strings.Contains(st.CopyError, failure):
			// The abort failed for the reason the copy did (a refused uid, say): say it once.
			msg += "; removing the partly staged files failed for the same reason"
		default:
			msg += "; removing the partly staged files also failed: " + failure
		}
		failStage(w, st, msg, now)
		return true
	case st.Step == agentapi.StepPrepare:
		var parts []model.StagePart
		for i, srv := range servers {
			if i != mds {
				parts = append(parts, model.StagePart{Node: srv.Node, Server: i, Status: model.StagePending})
			}
		}
		return next(agentapi.StepCopy, parts)
	case st.Step == agentapi.StepCopy:
		return next(agentapi.StepFinish, onMDS)
	default: // finish
		st.Status, st.Finished, st.State = model.StageComplete, now, model.Created()
		st.BytesDone = st.StepBytes
		w.put(st)
		return true
	}
}

// completeSplit records the outcome of an effect on a split stage's run (e.Part > 0).
func completeSplit(w *World, e Effect, r Result, p Params, now time.Time) {
	st := w.Stages[e.Ref.ID]
	if st == nil || st.Status != model.StageRunning || e.Stage.Part == nil || e.Stage.Part.Step != st.Step || e.Part > len(st.Parts) {
		return // an answer about a step or a stage that has moved on
	}
	part := &st.Parts[e.Part-1]
	defer w.put(st)
	if r.Err != nil {
		retryLater(w, &st.State, r.Err.Error(), p, now)
		if st.State.FuseBlown {
			st.State = model.Created()
			part.Status, part.Error = model.StageFailed, fmt.Sprintf("storage node %s: %v", part.Node, r.Err)
			if e.Op == OpCancelStage {
				part.Status = model.StageCanceled
			}
		}
		return
	}
	st.State.Attempts, st.State.Error = 0, ""
	switch e.Op {
	case OpStartStage:
		if part.Status == model.StagePending {
			part.Status = model.StageRunning
		}
	case OpCancelStage:
		if part.Status == model.StageRunning || part.Status == model.StagePending {
			part.Status, part.Error = model.StageCanceled, "canceled"
		}
	case OpPollStage:
		if part.Status != model.StageRunning {
			return
		}
		ss := r.Stage
		if !ss.Known {
			// The node's agent restarted and lost the run: start it again, a bounded number
			// of times (every step can be run again from its start).
			part.Attempts++
			part.Status, part.FilesDone, part.BytesDone = model.StagePending, 0, 0
			if part.Attempts >= p.StageMaxAttempts {
				part.Status = model.StageFailed
				part.Error = fmt.Sprintf("storage node %s restarted during the stage %d times (limit stage.max_attempts)", part.Node, part.Attempts)
			}
			break
		}
		part.FilesDone, part.BytesDone = ss.FilesDone, ss.BytesDone
		st.FilesTotal, st.BytesTotal = ss.FilesTotal, ss.BytesTotal
		if ss.ProtectedMode != 0 && st.Step == agentapi.StepPrepare && st.Protect {
			// The prepare step write-protected the source: finish or abort gives this back.
			st.ProtectedMode = ss.ProtectedMode & 0o7777
		}
		if len(ss.Warnings) > 0 && len(st.Warnings) < maxStageWarnings {
			st.Warnings = append(st.Warnings, ss.Warnings[:min(len(ss.Warnings), maxStageWarnings-len(st.Warnings))]...)
		}
		switch ss.Status {
		case model.StageComplete, model.StageFailed, model.StageCanceled:
			part.Status, part.Error = ss.Status, ss.Error
		}
	}
	// Progress is summed over the servers: the steps before this one, and this one's runs.
	st.BytesDone = st.StepBytes
	files := int64(-1)
	for _, pt := range st.Parts {
		if MovesData(st.Step) {
			st.BytesDone += pt.BytesDone
		}
		if files < 0 || pt.FilesDone < files {
			files = pt.FilesDone // a file is done when every server of this step is past it
		}
	}
	st.FilesDone = max(files, 0)
}

// cancelSplit stops a split stage's running runs for a teardown or a terminate, and reports
// whether some still run. A stage whose prepare step write-protected its source runs the
// abort step on the metadata server before it ends canceled: it removes the partly staged
// files and gives the source its write bits back. spec, servers and mds are the stage's
// (ok false when they can no longer be known: the stage then ends without that step).
func cancelSplit(w *World, st *model.Stage, spec agentapi.StageSpec, servers []agentapi.StripeServer, mds int, ok bool, now time.Time) (effects []Effect, busy bool) {
	restoring := st.Step == agentapi.StepAbort && st.ProtectedMode != 0 && ok
	for i := range st.Parts {
		part := &st.Parts[i]
		switch part.Status {
		case model.StagePending:
			if restoring && nodeOnline(w, part.Node) {
				busy = true
				if ready(st.State, now) {
					run := spec
					run.Part = &agentapi.StagePart{Step: st.Step, Server: part.Server, Servers: len(servers), RestoreMode: st.ProtectedMode}
					effects = append(effects, Effect{Op: OpStartStage, Ref: Ref{KindStage, st.ID}, Part: i + 1, Node: part.Node, Stage: run})
				}
				continue
			}
			if !restoring && ok && nodeOnline(w, part.Node) && st.Step != agentapi.StepAbort {
				// Its start may be on its way to the node (in flight, or sent before a
				// controller restart): the node's agent is asked to cancel the run first,
				// after the start's outcome is known (one effect per run at a time).
				busy = true
				if ready(st.State, now) {
					effects = append(effects, Effect{Op: OpCancelStage, Ref: Ref{KindStage, st.ID}, Part: i + 1, Node: part.Node,
						Stage: agentapi.StageSpec{ID: st.ID, Part: &agentapi.StagePart{Step: st.Step}}})
				}
				continue
			}
			part.Status = model.StageCanceled
			w.put(st)
		case model.StageRunning:
			busy = true
			if !nodeOnline(w, part.Node) {
				part.Status = model.StageCanceled
				w.put(st)
				continue
			}
			if ready(st.State, now) {
				op := OpCancelStage
				if restoring {
					op = OpPollStage // the abort step is what the cancel waits for
				}
				effects = append(effects, Effect{Op: op, Ref: Ref{KindStage, st.ID}, Part: i + 1, Node: part.Node,
					Stage: agentapi.StageSpec{ID: st.ID, Part: &agentapi.StagePart{Step: st.Step}}})
			}
		}
	}
	if len(effects) == 0 {
		busy = false
		for _, part := range st.Parts {
			busy = busy || part.Status == model.StageRunning || restoring && part.Status == model.StagePending && nodeOnline(w, part.Node) ||
				!restoring && ok && st.Step != agentapi.StepAbort && part.Status == model.StagePending && nodeOnline(w, part.Node)
		}
	}
	if busy {
		return effects, true
	}
	if st.ProtectedMode != 0 && ok && st.Step != agentapi.StepAbort && nodeOnline(w, servers[mds].Node) {
		// Every run has stopped: the abort step cleans up after them before the stage ends.
		st.CopyError = cancelMessage(st)
		st.Step, st.Parts = agentapi.StepAbort, []model.StagePart{{Node: servers[mds].Node, Server: mds, Status: model.StagePending}}
		w.put(st)
		return cancelSplit(w, st, spec, servers, mds, ok, now)
	}
	st.Status, st.Error, st.Finished = model.StageCanceled, cancelMessage(st), now
	w.put(st)
	return nil, false
}

// MovesData reports whether a step's runs move file data (and so count in the stage's bytes).
func MovesData(step string) bool { return step == agentapi.StepPrepare || step == agentapi.StepCopy }
