package lifecycle

import (
	"fmt"
	"strings"

	"github.com/spillway-hpc/spillway/internal/model"
)

// StepStatus says how far a session is with one step: what a waiting command needs.
type StepStatus struct {
	Token   string          `json:"token"`
	Step    string          `json:"step"`
	Exists  bool            `json:"exists"` // the session exists
	Phase   string          `json:"phase"`  // the last step asked of it
	Done    bool            `json:"done"`
	Failed  bool            `json:"failed"`
	Message string          `json:"message,omitempty"`
	Stages  []StageProgress `json:"stages,omitempty"`
}

// StageProgress is one stage as a waiting command shows it.
type StageProgress struct {
	ID         ID       `json:"id"`
	Direction  string   `json:"direction"`
	Type       string   `json:"type"`
	PFSPath    string   `json:"pfs_path"`
	DWPath     string   `json:"dw_path"`
	Line       int      `json:"line,omitempty"`
	Status     string   `json:"status"`
	FilesTotal int64    `json:"files_total"`
	FilesDone  int64    `json:"files_done"`
	BytesTotal uint64   `json:"bytes_total"`
	BytesDone  uint64   `json:"bytes_done"`
	Error      string   `json:"error,omitempty"`
	Warnings   []string `json:"warnings,omitempty"`
}

// Status reports a session's progress with a step.
func Status(w *World, token, step string) StepStatus {
	st := StepStatus{Token: token, Step: step}
	s := w.SessionByToken(token)
	if s == nil {
		// A missing session has finished tearing down (or never existed).
		st.Done = step == PhaseTeardown
		if !st.Done {
			st.Failed = true
			st.Message = ErrNoSession.Error()
		}
		return st
	}
	st.Exists, st.Phase = true, s.Phase
	var blown []string
	collect := func(state model.State) {
		if state.FuseBlown {
			blown = append(blown, state.Error)
		}
	}
	switch step {
	case PhaseSetup:
		for _, inst := range w.InstancesOf(s.ID) {
			for _, f := range w.FragmentsOf(inst.ID) {
				collect(f.State)
			}
			for _, c := range w.ConfigurationsOf(inst.ID) {
				for _, ns := range w.NamespacesOf(c.ID) {
					collect(ns.State)
				}
			}
		}
		st.Done = s.State.Goal == model.GoalCreate && s.State.Actualized
	case PhaseDataIn, PhaseDataOut:
		dir := model.StageIn
		if step == PhaseDataOut {
			dir = model.StageOut
		}
		st.Done = true
		var failures []string
		for _, sg := range w.StagesOf(s.ID) {
			if sg.Direction != dir {
				continue
			}
			st.Stages = append(st.Stages, progressOf(sg))
			if !sg.Ended() {
				st.Done = false
			}
			if (sg.Status == model.StageFailed || sg.Status == model.StageCanceled) && (dir == model.StageIn || holdsInstance(sg)) {
				failures = append(failures, fmt.Sprintf("%s %s -> %s: %s", stageLabel(sg), sourceOf(sg), destOf(sg), sg.Error))
			}
		}
		if st.Done && len(failures) > 0 {
			st.Failed, st.Message = true, strings.Join(failures, "; ")
		}
		return st
	case PhasePreRun:
		st.Done = true
		for _, a := range w.ActivationsOf(s.ID) {
			collect(a.State)
			if !(a.State.Goal == model.GoalCreate && a.State.Actualized) {
				st.Done = false
			}
		}
		if lost := LostSwaps(w, s); len(lost) > 0 { // the job must not start (or go on) without its swap
			st.Failed, st.Message = true, strings.Join(lost, "; ")
		}
	case PhasePostRun:
		st.Done = len(w.ActivationsOf(s.ID)) == 0
		for _, a := range w.ActivationsOf(s.ID) {
			collect(a.State)
		}
		st.Message = swapDetachErrors(w, s) // what the wait is for, while it is retried
	case PhaseTeardown:
		st.Done = false
		// Only what the teardown itself failed to remove: a fuse blown creating an object
		// (its fragment's node was away) is replaced when the teardown sets it to destroy.
		creating := collect
		collect = func(state model.State) {
			if state.Goal == model.GoalDestroy {
				creating(state)
			}
		}
		for _, a := range w.ActivationsOf(s.ID) {
			collect(a.State)
		}
		for _, inst := range w.InstancesOf(s.ID) {
			for _, f := range w.FragmentsOf(inst.ID) {
				collect(f.State)
			}
			for _, c := range w.ConfigurationsOf(inst.ID) {
				for _, ns := range w.NamespacesOf(c.ID) {
					collect(ns.State)
				}
			}
		}
		if s.State.Goal == model.GoalDestroy {
			st.Message = flushProgress(w, s) // a cache's data on its way to the PFS, if any
			if msg := swapDetachErrors(w, s); msg != "" {
				st.Message = strings.TrimPrefix(st.Message+"; "+msg, "; ")
			}
		} else {
			st.Message = "teardown was not requested"
			if s.Failure != "" { // undone: a stage-out it waited for failed
				st.Failed, st.Message = true, s.Failure
			}
		}
	default:
		st.Failed, st.Message = true, fmt.Sprintf("unknown step %q", step)
		return st
	}
	if len(blown) > 0 {
		st.Failed = true
		st.Message = strings.Join(blown, "; ") + " (an operator must look: dwstat shows the object with F)"
	}
	return st
}

// ProgressOf is a stage as status answers show it.
func ProgressOf(s *model.Stage) StageProgress { return progressOf(s) }

func progressOf(s *model.Stage) StageProgress {
	return StageProgress{ID: s.ID, Direction: s.Direction, Type: s.Type, PFSPath: s.PFSPath, DWPath: s.DWPath, Line: s.Line,
		Status: s.Status, FilesTotal: s.FilesTotal, FilesDone: s.FilesDone, BytesTotal: s.BytesTotal, BytesDone: s.BytesDone, Error: s.Error, Warnings: s.Warnings}
}

func sourceOf(s *model.Stage) string {
	if s.Direction == model.StageIn {
		return s.PFSPath
	}
	return orDefault(s.DWPath, "(list)")
}

func destOf(s *model.Stage) string {
	if s.Direction == model.StageIn {
		return orDefault(s.DWPath, "(list)")
	}
	return s.PFSPath
}

// swapDetachErrors says why the session's swap areas being detached are not yet ("" when
// none failed): a swapoff that failed or passed [swap] detach_timeout, retried meanwhile.
func swapDetachErrors(w *World, s *model.Session) string {
	var msgs []string
	for _, a := range w.ActivationsOf(s.ID) {
		if a.State.Goal == model.GoalDestroy && a.State.Error != "" && !a.State.FuseBlown && IsSwap(w, a) {
			msgs = append(msgs, a.State.Error)
		}
	}
	return strings.Join(msgs, "; ")
}
