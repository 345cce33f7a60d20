package runjob

import (
	"context"
	"fmt"
	"strings"

	"github.com/spillway-hpc/spillway/internal/directive"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/views"
)

// Ops is what cleaning up a gone run needs of the controller: the API client in a command,
// the controller itself in the home's server.
type Ops interface {
	// Session is the session with token and its objects (no session when there is none):
	// a pass reads the sessions of its records only, never the whole state.
	Session(ctx context.Context, token string) (views.All, error)
	PostRun(ctx context.Context, token string) error
	Stages(ctx context.Context, token, direction string, reqs []lifecycle.StageRequest) error
	Teardown(ctx context.Context, token string, hurry bool) error
}

// Cleanup is what one pass of Reap did about one run.
type Cleanup struct {
	Token   string
	Message string
	Hurried bool // a hurried teardown was asked: it ends within a step, worth waiting for
}

// Reap cleans up after runs that are gone: for every run record whose owner no longer
// exists (or exited without releasing its session), it finishes what the run would have done:
//
//   - killed before its job started (setup, data_in, paths, pre_run): the session is torn down
//     at once (the job never ran; its stage-ins are cancelled);
//   - killed during or after its job: what is left of the job is killed, the instance is
//     unmounted, the job's stage-outs run (as under Slurm, where a job that ends badly is still
//     staged out), and the session is released once they complete; when one fails the session
//     is kept, as `spillway run` keeps it, with the commands to retry or discard it;
//   - already being torn down: the teardown finishes on its own.
//
// A pass never waits: a stage-out in progress is looked at again on the next pass. It returns
// what it did in this pass. Records are locked for the pass, so commands and the home's server
// may call it at the same time.
func Reap(ctx context.Context, ops Ops, rs Records) ([]Cleanup, error) {
	unlock, err := rs.Lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	var done []Cleanup
	for _, rec := range rs.List() {
		switch rec.State {
		case StateCleaned:
			continue
		case StateRunning:
			if Alive(rec.PID, rec.PIDStart) {
				continue
			}
		}
		all, err := ops.Session(ctx, rec.Token)
		if err != nil {
			return done, err
		}
		if rec.State == StateKept {
			if sessionOf(all, rec.Token) == nil {
				rs.Remove(rec.Token) // retried or removed since
			}
			continue
		}
		c, err := reapOne(ctx, ops, rs, all, rec)
		if err != nil {
			return done, fmt.Errorf("cleaning up %s: %w", rec.Token, err)
		}
		if c != nil {
			done = append(done, *c)
		}
	}
	return done, nil
}

// reapOne advances the cleanup of one gone run; all holds its session's objects (Ops.Session).
func reapOne(ctx context.Context, ops Ops, rs Records, all views.All, rec *Record) (*Cleanup, error) {
	sess := sessionOf(all, rec.Token)
	// record notes what was done, in the state given, and returns it as this pass's cleanup.
	record := func(state string, hurried bool, what ...string) (*Cleanup, error) {
		rec.Actions = append(rec.Actions, what...)
		rec.State, rec.Note, rec.Reported = state, rec.describe()+": "+strings.Join(rec.Actions, "; "), false
		if err := rs.Save(rec); err != nil {
			return nil, err
		}
		return &Cleanup{Token: rec.Token, Message: rec.Note, Hurried: hurried}, nil
	}
	if sess == nil {
		if rec.State == StateCleaning {
			return record(StateCleaned, false, "its burst buffer was released")
		}
		if rec.Phase == lifecycle.PhaseTeardown {
			return record(StateCleaned, false, "the teardown it had asked for finished without it")
		}
		// Killed before its session existed, or after it was released: nothing is left.
		// (What is left of a job without a burst buffer is the user's own business.)
		rs.Remove(rec.Token)
		return nil, nil
	}
	var what []string
	if rec.State != StateCleaning {
		if killed, _ := killJob(rec); killed {
			what = append(what, fmt.Sprintf("what was left of its job (process group %d) was killed", rec.JobPID))
		}
	}
	if sess.State.Goal == model.GoalDestroy {
		if rec.State == StateCleaning {
			return nil, nil // our teardown is running
		}
		return record(StateCleaned, false, append(what, "it was already being torn down; the teardown finishes on its own")...)
	}
	if !rec.JobRan {
		if err := ops.Teardown(ctx, rec.Token, true); err != nil {
			return nil, err
		}
		return record(StateCleaned, true, append(what, "its job had not started; its burst buffer was released")...)
	}
	// The job ran: unmount, stage out, release.
	for _, a := range all.Activations {
		if a.Session == sess.ID && a.State.Goal == model.GoalCreate {
			if err := ops.PostRun(ctx, rec.Token); err != nil {
				return nil, err
			}
			break
		}
	}
	var outs []views.Stage
	for _, st := range all.Stages {
		if st.Session == sess.ID && st.Direction == model.StageOut {
			outs = append(outs, st)
		}
	}
	requests := deferredStageOuts(outs)
	if len(outs) == 0 {
		requests = rec.StageOut // a session set up before stage-outs were registered at setup
	}
	if len(requests) > 0 {
		if err := ops.Stages(ctx, rec.Token, model.StageOut, requests); err != nil {
			// The stage-outs cannot even be asked: keep the session rather than lose its data.
			return rec.keep(rs, sess.ID, append(what, "its stage-out could not be started: "+err.Error()))
		}
		return record(StateCleaning, false, append(what, "its stage-out was started")...)
	}
	var failed []string
	for _, st := range outs {
		switch st.Status {
		case model.StageFailed, model.StageCanceled:
			failed = append(failed, fmt.Sprintf("line %d: %s", st.Line, st.Error))
		case model.StageComplete:
		default:
			if rec.State != StateCleaning {
				return record(StateCleaning, false, append(what, "its stage-out is running")...)
			}
			return nil, nil // still running: the next pass looks again
		}
	}
	if len(failed) > 0 {
		return rec.keep(rs, sess.ID, append(what, "its stage-out failed ("+strings.Join(failed, "; ")+")"))
	}
	if err := ops.Teardown(ctx, rec.Token, false); err != nil {
		return nil, err
	}
	if len(outs) > 0 {
		what = append(what, "its results were staged out and its burst buffer released")
	} else {
		what = append(what, "its burst buffer was released (it had no stage-out)")
	}
	return record(StateCleaned, false, what...)
}

// keep marks a gone run's session as kept after its stage-out failed.
func (rec *Record) keep(rs Records, sessionID int64, what []string) (*Cleanup, error) {
	retry, discard := Commands(rec.Self, rec.ConnArgs, rec.Token, sessionID)
	rec.Actions = append(rec.Actions, what...)
	rec.State, rec.Reported = StateKept, false
	rec.Note = fmt.Sprintf("%s: %s; the session is kept, its instance holds the job's results: retry the stage-out with `%s` once the cause is fixed, or discard them with `%s`",
		rec.describe(), strings.Join(rec.Actions, "; "), retry, discard)
	if err := rs.Save(rec); err != nil {
		return nil, err
	}
	return &Cleanup{Token: rec.Token, Message: rec.Note}, nil
}

// describe names a gone run for messages.
func (rec *Record) describe() string {
	phase := rec.Phase
	if phase == "job" {
		phase = "its job"
	}
	how := "ended during " + phase
	if rec.Exit != "" {
		how = "exited during " + phase + " (" + rec.Exit + ")"
	}
	script := ""
	if rec.Script != "" {
		script = " of " + rec.Script
	}
	return fmt.Sprintf("session %s (the spillway run%s, pid %d, started %s, %s)",
		rec.Token, script, rec.PID, rec.Started.Format("2006-01-02 15:04:05"), how)
}

// Notes returns what cleanups did that no run printed yet, and forgets the cleaned runs.
func Notes(rs Records) []string {
	unlock, err := rs.Lock()
	if err != nil {
		return nil
	}
	defer unlock()
	var notes []string
	for _, rec := range rs.List() {
		if rec.Reported || rec.Note == "" {
			continue
		}
		switch rec.State {
		case StateCleaned:
			notes = append(notes, "cleaned up "+rec.Note)
			rs.Remove(rec.Token)
		case StateCleaning, StateKept:
			notes = append(notes, "cleaning up "+rec.Note)
			rec.Reported = true
			rs.Save(rec)
		}
	}
	return notes
}

func sessionOf(all views.All, token string) *views.Session {
	for i := range all.Sessions {
		if all.Sessions[i].Token == token {
			return &all.Sessions[i]
		}
	}
	return nil
}

// Commands are the commands that retry a kept session's stage-out and discard it (with its
// data). self is how spillway was invoked, connArgs the options that reach the same
// controller (--home DIR, --controller ADDRESS, ...).
func Commands(self, connArgs []string, token string, sessionID int64) (retry, discard string) {
	words := func(parts ...[]string) string {
		var all []string
		for _, p := range parts {
			all = append(all, p...)
		}
		return ShellJoin(all)
	}
	retry = words(self, []string{"run"}, connArgs, []string{"--retry-stage-out", token})
	discard = words(self, []string{"dwcli", "rm", "session", "-i", fmt.Sprint(sessionID), "--hurry"}, connArgs)
	return retry, discard
}

// ShellJoin quotes words for a POSIX shell where they need it.
func ShellJoin(words []string) string {
	out := make([]string, len(words))
	for i, w := range words {
		if w != "" && strings.IndexFunc(w, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
		}) < 0 {
			out[i] = w
			continue
		}
		out[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}

// deferredStageOuts are the requests of the stage-outs registered at setup and never asked for
// (data_out did not come: the run died, or post_run failed).
func deferredStageOuts(outs []views.Stage) []lifecycle.StageRequest {
	var reqs []lifecycle.StageRequest
	for _, st := range outs {
		if st.Status != model.StageDeferred {
			continue
		}
		if req, err := stageRequestOf(st); err == nil {
			reqs = append(reqs, req)
		}
	}
	return reqs
}

// stageRequestOf turns a stage back into the request that made it.
func stageRequestOf(st views.Stage) (lifecycle.StageRequest, error) {
	req := lifecycle.StageRequest{Type: st.Type, PFSPath: st.PFSPath, Line: st.Line}
	if st.DWPath != "" {
		v, rest, ok := directive.SplitDWPath(st.DWPath)
		if !ok {
			return req, fmt.Errorf("stage %d: unexpected instance path %q", st.ID, st.DWPath)
		}
		req.DWVar, req.DWPath = v, rest
	}
	return req, nil
}
