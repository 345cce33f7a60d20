package lifecycle

import (
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
)

// An abort that fails for the reason the copy did says so once, not the message twice
// (issue 23 item 12: the root-staging refusal repeated itself); a different reason is kept.
func TestSplitAbortFailureSaidOnce(t *testing.T) {
	refusal := "refusing to stage as uid 0 (root)"
	for _, tc := range []struct{ copyErr, abortErr, want string }{
		{refusal, refusal, refusal + "; removing the partly staged files failed for the same reason"},
		{refusal + " (copying the stripes held by bb2)", refusal, refusal + " (copying the stripes held by bb2); removing the partly staged files failed for the same reason"},
		{"no space left on device", "permission denied", "no space left on device; removing the partly staged files also failed: permission denied"},
		{"no space left on device", "", "no space left on device"},
	} {
		w := NewWorld()
		status := model.StageFailed
		if tc.abortErr == "" {
			status = model.StageComplete
		}
		st := &model.Stage{ID: 1, Status: model.StageRunning, Step: agentapi.StepAbort, CopyError: tc.copyErr,
			Parts: []model.StagePart{{Node: "bb1", Status: status, Error: tc.abortErr}}}
		w.put(st)
		servers := []agentapi.StripeServer{{Node: "bb1"}, {Node: "bb2"}}
		if !advanceSplit(w, st, servers, 0, time.Now()) {
			t.Fatalf("%q: the aborted stage did not end", tc.copyErr)
		}
		if st.Status != model.StageFailed || st.Error != tc.want {
			t.Errorf("stage %s: %q\nwant failed: %q", st.Status, st.Error, tc.want)
		}
	}
}
