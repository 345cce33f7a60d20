package lifecycle

import (
	"fmt"
	"testing"
)

// stage.max_running holds over the stages a world does not hold (Elsewhere.RunningStages:
// other sessions' running stages and starts in flight), not only over its own.
func TestMaxRunningCountsStagesElsewhere(t *testing.T) {
	for elsewhere, want := range map[int]int{0: 4, 1: 3, 3: 1, 4: 0, 9: 0} {
		h := runningJob(t)
		var reqs []InJobStage
		for i := 0; i < 6; i++ {
			reqs = append(reqs, out("", fmt.Sprintf("/f%d", i), "/pfs/f"))
		}
		h.must(ApplyInJobStages(h.w, "9", reqs, h, h.now))
		h.w.Elsewhere.RunningStages = elsewhere
		starts := 0
		for _, e := range Step(h.w, h.p, h.now) {
			if e.Op == OpStartStage {
				starts++
			}
		}
		if starts != want {
			t.Errorf("max_running %d with %d running elsewhere: %d stages started, want %d", h.p.StageMaxRunning, elsewhere, starts, want)
		}
	}
}
