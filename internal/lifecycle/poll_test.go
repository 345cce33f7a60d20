package lifecycle

import (
	"errors"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
)

// A poll that says of a running stage only what the stage holds records nothing (the
// executor then skips its write transaction); any news is recorded: progress, warnings, the
// end of the stage, an agent that lost it, an error.
func TestPollWithNothingNewChangesNothing(t *testing.T) {
	now := time.Unix(1700000000, 0)
	running := func() *World {
		w := NewWorld()
		w.Stages[7] = &model.Stage{ID: 7, SessionID: 1, Status: model.StageRunning, FilesTotal: 1, BytesTotal: 4096, InJob: true}
		return w
	}
	poll := Effect{Op: OpPollStage, Ref: Ref{KindStage, 7}, Node: "n1", Stage: agentapi.StageSpec{ID: 7}}
	same := agentapi.StageStatus{ID: 7, Known: true, Status: model.StageRunning, FilesTotal: 1, BytesTotal: 4096}
	w := running()
	if !PollSaysNothingNew(w, poll, Result{Stage: same}) {
		t.Errorf("a poll answering what the stage holds is news")
	}
	Complete(w, poll, Result{Stage: same}, Params{}, now)
	if n := w.ChangeCount(); n != 0 {
		t.Errorf("a poll with nothing new recorded %d changes", n)
	}
	for name, r := range map[string]Result{
		"progress": {Stage: agentapi.StageStatus{ID: 7, Known: true, Status: model.StageRunning, FilesTotal: 1, BytesTotal: 4096, BytesDone: 100}},
		"warning":  {Stage: agentapi.StageStatus{ID: 7, Known: true, Status: model.StageRunning, FilesTotal: 1, BytesTotal: 4096, Warnings: []string{"skipped a socket"}}},
		"complete": {Stage: agentapi.StageStatus{ID: 7, Known: true, Status: model.StageComplete, FilesTotal: 1, FilesDone: 1, BytesTotal: 4096, BytesDone: 4096}},
		"lost":     {Stage: agentapi.StageStatus{ID: 7}},
		"error":    {Err: errors.New("connection refused")},
	} {
		w := running()
		if PollSaysNothingNew(w, poll, r) {
			t.Errorf("%s: said to be nothing new", name)
		}
		Complete(w, poll, r, Params{StageMaxAttempts: 3}, now)
		if w.ChangeCount() == 0 {
			t.Errorf("%s: recorded nothing", name)
		}
	}
	// a retry under way is news once the agent answers (its error is cleared)
	w = running()
	w.Stages[7].State.Attempts, w.Stages[7].State.Error = 1, "timed out"
	if PollSaysNothingNew(w, poll, Result{Stage: same}) {
		t.Errorf("an answer after a failed poll is nothing new")
	}
}
