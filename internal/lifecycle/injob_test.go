package lifecycle

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
)

// runningJob sets up job 9 on one server and mounts it on cn1.
func runningJob(t *testing.T) *harness {
	h := newHarness(t, "ssd1")
	h.must(ApplySetup(h.w, jobSetup("9", 1<<30), h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "9", []string{"cn1"}, h, h.p))
	h.settle()
	return h
}

func out(when, p, pfs string) InJobStage {
	return InJobStage{Direction: model.StageOut, Type: model.StageFile, When: when, DWVar: VarJobStriped, DWPath: p, PFSPath: pfs}
}

func (h *harness) counts(p string) InJobCounts {
	h.t.Helper()
	c, _, err := QueryInJob(h.w, "9", VarJobStriped, p)
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

func TestInJobImmediateStageRunsWhileTheJobRuns(t *testing.T) {
	h := runningJob(t)
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{out("", "/ckpt/1", "/pfs/1")}, h, h.now))
	if c := h.counts("/ckpt/1"); c != (InJobCounts{Pending: 1}) {
		t.Fatalf("just asked: %+v", c)
	}
	st := h.w.Stages[1]
	if !st.InJob || !st.Protect || st.DWPath != "$DW_JOB_STRIPED/ckpt/1" || st.Status != model.StagePending {
		t.Fatalf("stage record: %+v", st)
	}
	h.settle()
	if c := h.counts("/ckpt/1"); c != (InJobCounts{Complete: 1}) {
		t.Fatalf("after the run: %+v", c)
	}
	if c := h.counts("/ckpt"); c != (InJobCounts{Complete: 1}) {
		t.Fatalf("the directory holding it: %+v", c)
	}
	if c := h.counts("/other"); c != (InJobCounts{}) {
		t.Fatalf("another path: %+v", c)
	}
	if s := h.w.SessionByToken("9"); s.Phase != PhasePreRun {
		t.Fatalf("an in-job stage must not change the session's phase: %s", s.Phase)
	}
	// Staging the same file again replaces the record (a second stage-out copies new content).
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{out("", "/ckpt/1", "/pfs/1b")}, h, h.now))
	if n := len(h.w.StagesOf(h.w.SessionByToken("9").ID)); n != 1 {
		t.Fatalf("one record per path: %d", n)
	}
}

func TestInJobBusyAndBadRequests(t *testing.T) {
	h := runningJob(t)
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{out("", "/a", "/pfs/a")}, h, h.now))
	err := ApplyInJobStages(h.w, "9", []InJobStage{out("", "/a", "/pfs/a2")}, h, h.now)
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("a second stage of a file being staged: %v", err)
	}
	for _, c := range []struct {
		req  InJobStage
		want string
	}{
		{out("", "a", "/pfs/a"), "must start with /"},
		{out("", "/a/../b", "/pfs/a"), "no . or .."},
		{out("", "/b", "pfs/b"), "not an absolute path"},
		{out("sometime", "/b", "/pfs/b"), "expected immediate, at_job_end"},
		{out(WhenRevoke, "/nothing", ""), "no deferred"},
		{InJobStage{Direction: "in", Type: "file", When: WhenAtJobEnd, DWVar: VarJobStriped, DWPath: "/x", PFSPath: "/p"}, "stage-outs only"},
		{InJobStage{Direction: "out", Type: "list", DWVar: VarJobStriped, DWPath: "/x", PFSPath: "/p"}, "expected file or directory"},
		{InJobStage{Direction: "out", Type: "file", DWVar: "DW_JOB_PRIVATE", DWPath: "/x", PFSPath: "/p"}, "private"},
	} {
		err := ApplyInJobStages(h.w, "9", []InJobStage{c.req}, h, h.now)
		var ue *UserError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want a user error with %q", c.req, err, c.want)
		}
	}
	if _, _, err := QueryInJob(h.w, "nosuch", VarJobStriped, "/a"); !errors.Is(err, ErrNoSession) {
		t.Fatalf("unknown token: %v", err)
	}
}

// Checkpoint rotation as libhio does it: the newest at job end, the previous revoked.
func TestInJobCheckpointRotation(t *testing.T) {
	h := runningJob(t)
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{out(WhenAtJobEnd, "/ckpt.1", "/pfs/ckpt.1")}, h, h.now))
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{out(WhenAtJobEnd, "/ckpt.2", "/pfs/ckpt.2")}, h, h.now))
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{out(WhenRevoke, "/ckpt.1", "")}, h, h.now))
	h.settle()
	if c := h.counts("/"); c != (InJobCounts{Deferred: 1}) {
		t.Fatalf("during the job only ckpt.2 is deferred: %+v", c)
	}
	if err := ApplyTeardown(h.w, "9", false); err == nil || !strings.Contains(err.Error(), "never run") {
		t.Fatalf("a teardown before the job end would lose the deferred stage-out: %v", err)
	}
	var started []string
	h.stageResult = func(e Effect) agentapi.StageStatus {
		return agentapi.StageStatus{Known: true, Status: model.StageComplete}
	}
	h.must(ApplyPostRun(h.w, "9"))
	for _, st := range h.w.Stages {
		if st.Status == model.StagePending {
			started = append(started, st.PFSPath)
		}
	}
	if len(started) != 1 || started[0] != "/pfs/ckpt.2" {
		t.Fatalf("at the job's end exactly ckpt.2 runs: %v", started)
	}
	h.settle()
	if st := h.status("9", PhaseDataOut); !st.Done || st.Failed {
		t.Fatalf("data_out waits for it: %+v", st)
	}
	h.must(ApplyTeardown(h.w, "9", false))
	h.settle()
	assertEmpty(t, h.w)
}

func TestInJobActivateAndTerminate(t *testing.T) {
	h := runningJob(t)
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{out(WhenAtJobEnd, "/big", "/pfs/big")}, h, h.now))
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{out(WhenActivate, "/big", "ignored")}, h, h.now))
	if c := h.counts("/big"); c != (InJobCounts{Pending: 1}) {
		t.Fatalf("activated: %+v", c)
	}
	h.stageResult = func(Effect) agentapi.StageStatus {
		return agentapi.StageStatus{Known: true, Status: model.StageRunning, BytesDone: 1}
	}
	for i := 0; i < 3; i++ {
		for _, e := range Step(h.w, h.p, h.now) {
			r := Result{}
			if e.Op == OpPollStage {
				r.Stage = h.stageResult(e)
			}
			Complete(h.w, e, r, h.p, h.now)
		}
		h.w.TakeChanges()
	}
	if h.w.Stages[1].Status != model.StageRunning {
		t.Fatalf("running: %+v", h.w.Stages[1])
	}
	n, err := ApplyTerminate(h.w, "9", VarJobStriped, "/big", h.now)
	if err != nil || n != 1 {
		t.Fatalf("terminate: %d %v", n, err)
	}
	h.w.TakeChanges()
	var ops []string
	for _, e := range Step(h.w, h.p, h.now) {
		ops = append(ops, e.Op)
		Complete(h.w, e, Result{}, h.p, h.now)
	}
	h.w.TakeChanges()
	if len(ops) != 1 || ops[0] != OpCancelStage {
		t.Fatalf("terminate of a running stage cancels it on its agent: %v", ops)
	}
	if st := h.w.Stages[1]; st.Status != model.StageCanceled || !strings.Contains(st.Error, "terminated by the job") {
		t.Fatalf("after the cancel: %+v", st)
	}
	if c := h.counts("/big"); c != (InJobCounts{}) {
		t.Fatalf("a terminated stage counts nowhere: %+v", c)
	}
	if _, err := ApplyTerminate(h.w, "9", VarJobStriped, "/never", h.now); err == nil {
		t.Fatal("terminate of a path never staged must fail")
	}
	// A stage the job terminated does not keep the instance.
	h.must(ApplyPostRun(h.w, "9"))
	h.settle()
	h.must(ApplyTeardown(h.w, "9", false))
	h.settle()
	assertEmpty(t, h.w)
}

func TestLocate(t *testing.T) {
	h := runningJob(t)
	info, err := Locate(h.w, "/mnt/bb/9_striped_scratch/", "cn1")
	if err != nil || info.Token != "9" || info.Var != VarJobStriped || info.Servers != 1 || info.Owner != 1001 {
		t.Fatalf("locate: %+v %v", info, err)
	}
	if _, err := Locate(h.w, "/mnt/bb/9_striped_scratch", "cn2"); !errors.Is(err, ErrNoSession) {
		t.Fatalf("not mounted on cn2: %v", err)
	}
}

// A failed in-job stage the job saw does not keep the instance; a failed at_job_end one does.
func TestInJobFailuresAndTheInstance(t *testing.T) {
	for _, when := range []string{WhenImmediate, WhenAtJobEnd} {
		t.Run(when, func(t *testing.T) {
			h := runningJob(t)
			h.stageResult = func(Effect) agentapi.StageStatus {
				return agentapi.StageStatus{Known: true, Status: model.StageFailed, Error: "permission denied"}
			}
			h.must(ApplyInJobStages(h.w, "9", []InJobStage{out(when, "/r", "/pfs/r")}, h, h.now))
			h.settle()
			h.must(ApplyPostRun(h.w, "9"))
			h.settle()
			if c := h.counts("/r"); c != (InJobCounts{Failed: 1}) {
				t.Fatalf("failed: %+v", c)
			}
			err := ApplyTeardown(h.w, "9", false)
			if when == WhenImmediate && err != nil {
				t.Fatalf("the job saw its immediate stage fail; teardown must go on: %v", err)
			}
			if when == WhenAtJobEnd && (err == nil || !strings.Contains(err.Error(), "failed")) {
				t.Fatalf("a failed at_job_end stage-out keeps the instance: %v", err)
			}
		})
	}
}

// data_out again (a retry of the stage-out) runs a failed at_job_end stage-out again.
func TestInJobAtJobEndRetriedByDataOut(t *testing.T) {
	h := runningJob(t)
	h.stageResult = func(Effect) agentapi.StageStatus {
		return agentapi.StageStatus{Known: true, Status: model.StageFailed, Error: "permission denied"}
	}
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{out(WhenAtJobEnd, "/r", "/pfs/r")}, h, h.now))
	h.must(ApplyPostRun(h.w, "9"))
	h.settle()
	if st := h.status("9", PhaseDataOut); !st.Done || !st.Failed {
		t.Fatalf("data_out reports the failure: %+v", st)
	}
	h.stageResult = func(Effect) agentapi.StageStatus {
		return agentapi.StageStatus{Known: true, Status: model.StageComplete}
	}
	h.must(ApplyStages(h.w, "9", model.StageOut, nil, h, h.now))
	h.settle()
	if st := h.status("9", PhaseDataOut); !st.Done || st.Failed {
		t.Fatalf("the retry completes: %+v", st)
	}
	h.must(ApplyTeardown(h.w, "9", false))
	h.settle()
	assertEmpty(t, h.w)
}

// A file stage-out of a striped instance on two servers is split, and still write-protects
// its source: the prepare step removes the write bits and reports the mode the file had, and
// the finish step, or the abort step after a failed copy or a terminate, is told to give it
// back. A stage whose prepare removed nothing ends a terminate without an abort, as before.
func TestSplitInJobStageOutWriteProtection(t *testing.T) {
	for _, tc := range []struct {
		name      string
		protected uint32 // the mode the prepare step reports
		outcome   string // of the copy: complete, failed, or terminated while it runs
		wantRuns  string
		wantEnd   string
	}{
		{"complete", 0o640, "complete", "prepare:0 copy:640 finish:640", model.StageComplete},
		{"copy_fails", 0o640, "failed", "prepare:0 copy:640 abort:640", model.StageFailed},
		{"terminated", 0o600, "terminated", "prepare:0 copy:600 abort:600", model.StageCanceled},
		{"terminated_unprotected", 0, "terminated", "prepare:0 copy:0", model.StageCanceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, "ssd1", "ssd2")
			h.must(ApplySetup(h.w, jobSetup("9", 2<<30, "striped"), h, h.p, h.now))
			h.settle()
			h.must(ApplyPreRun(h.w, "9", []string{"cn1"}, h, h.p))
			h.settle()
			h.must(ApplyInJobStages(h.w, "9", []InJobStage{out("", "/ckpt", "/pfs/ckpt")}, h, h.now))
			var runs []string
			h.fail = func(e Effect) error {
				if e.Op == OpStartStage {
					if e.Stage.Part == nil || !e.Stage.Protect {
						t.Fatalf("an in-job file stage-out of a 2-server instance: part %+v, protect %v", e.Stage.Part, e.Stage.Protect)
					}
					runs = append(runs, fmt.Sprintf("%s:%o", e.Stage.Part.Step, e.Stage.Part.RestoreMode))
				}
				return nil
			}
			h.stageResult = func(e Effect) agentapi.StageStatus {
				st := agentapi.StageStatus{Known: true, Status: model.StageComplete, FilesTotal: 1, FilesDone: 1}
				switch e.Stage.Part.Step {
				case agentapi.StepPrepare:
					st.ProtectedMode = tc.protected
				case agentapi.StepCopy:
					switch tc.outcome {
					case "failed":
						st.Status, st.Error = model.StageFailed, "cannot read: Input/output error"
					case "terminated":
						st.Status = model.StageRunning
					}
				}
				return st
			}
			if tc.outcome != "terminated" {
				h.settle()
			} else {
				for i := 0; i < 10 && (len(runs) == 0 || !strings.HasPrefix(runs[len(runs)-1], "copy")); i++ {
					h.stepOnce()
				}
				h.stepOnce() // the copy is running
				if st := h.w.Stages[1]; st.Step != agentapi.StepCopy || st.Status != model.StageRunning {
					t.Fatalf("before the terminate: %+v", st)
				}
				if n, err := ApplyTerminate(h.w, "9", VarJobStriped, "/ckpt", h.now); err != nil || n != 1 {
					t.Fatalf("terminate: %d %v", n, err)
				}
				h.w.TakeChanges()
				h.stageResult = func(e Effect) agentapi.StageStatus {
					return agentapi.StageStatus{Known: true, Status: model.StageComplete}
				}
				h.settle()
			}
			st := h.w.Stages[1]
			if got := strings.Join(runs, " "); got != tc.wantRuns {
				t.Errorf("runs (step:restore mode) %q, want %q", got, tc.wantRuns)
			}
			if st.Status != tc.wantEnd || st.ProtectedMode != tc.protected {
				t.Errorf("stage %s (%s), protected mode %o; want %s, %o", st.Status, st.Error, st.ProtectedMode, tc.wantEnd, tc.protected)
			}
			if tc.outcome == "terminated" && !strings.Contains(st.Error, "terminated by the job") {
				t.Errorf("a terminated stage's error: %q", st.Error)
			}
		})
	}
}

// stepOnce runs one step and completes its effects.
func (h *harness) stepOnce() {
	for _, e := range Step(h.w, h.p, h.now) {
		r := Result{Err: h.fail(e)}
		if e.Op == OpPollStage && r.Err == nil {
			r.Stage = h.stageResult(e)
		}
		if e.Op == OpFlushCache && r.Err == nil {
			r.Flush = h.flushResult(e)
		}
		Complete(h.w, e, r, h.p, h.now)
	}
	h.w.TakeChanges()
	h.now = h.now.Add(time.Second)
}

// dw_set_stage_concurrency: at most that many of the job's own stages run at once (the others
// wait their turn), a request above stage.max_job_concurrency is clamped to it, and 0 is
// refused. The script's own stages are not counted.
func TestInJobStageConcurrency(t *testing.T) {
	h := runningJob(t)
	if _, err := ApplyStageConcurrency(h.w, "9", 0, 4); err == nil || !strings.Contains(err.Error(), "1 or more") {
		t.Fatalf("concurrency 0: %v", err)
	}
	if _, err := ApplyStageConcurrency(h.w, "nope", 2, 4); err == nil {
		t.Fatal("a session that does not exist must be refused")
	}
	if n, err := ApplyStageConcurrency(h.w, "9", 100, 4); err != nil || n != 4 || h.w.SessionByToken("9").StageConcurrency != 4 {
		t.Fatalf("clamped: %d %v", n, err)
	}
	n, err := ApplyStageConcurrency(h.w, "9", 2, 4)
	if err != nil || n != 2 {
		t.Fatalf("2: %d %v", n, err)
	}
	h.w.TakeChanges()
	var reqs []InJobStage
	for i := 0; i < 5; i++ {
		reqs = append(reqs, out("", fmt.Sprintf("/ckpt/%d", i), fmt.Sprintf("/pfs/%d", i)))
	}
	h.must(ApplyInJobStages(h.w, "9", reqs, h, h.now))
	// Every stage runs for three polls; count how many of the job's run at once.
	polls := map[ID]int{}
	h.stageResult = func(e Effect) agentapi.StageStatus {
		polls[e.Ref.ID]++
		if polls[e.Ref.ID] < 3 {
			return agentapi.StageStatus{Known: true, Status: model.StageRunning}
		}
		return agentapi.StageStatus{Known: true, Status: model.StageComplete}
	}
	most := 0
	for i := 0; i < 40; i++ {
		h.stepOnce()
		running := 0
		for _, st := range h.w.StagesOf(h.w.SessionByToken("9").ID) {
			if st.Status == model.StageRunning {
				running++
			}
		}
		most = max(most, running)
	}
	if most != 2 {
		t.Errorf("at most %d of the job's stages ran at once, want 2 (its limit)", most)
	}
	if c := h.counts("/ckpt"); c != (InJobCounts{Complete: 5}) {
		t.Errorf("every stage ran in the end: %+v", c)
	}
}

// DataWarp stages a directory's files one by one, so a query of a staged directory counts
// files: those moved as complete, the rest in the stage's state.
func TestInJobDirectoryCountsFiles(t *testing.T) {
	h := runningJob(t)
	dir := InJobStage{Direction: model.StageOut, Type: model.StageDir, DWVar: VarJobStriped, DWPath: "/ckpt", PFSPath: "/pfs/ckpt"}
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{dir, out("", "/log", "/pfs/log")}, h, h.now))
	var st *model.Stage
	for _, s := range h.w.Stages {
		if s.Type == model.StageDir {
			st = s
		}
	}
	if c := h.counts("/ckpt"); c != (InJobCounts{Pending: 1}) {
		t.Fatalf("not started, its files not yet counted: %+v", c)
	}
	st.Status, st.FilesTotal, st.FilesDone = model.StageRunning, 4, 1
	for _, c := range []struct {
		path string
		want InJobCounts
	}{
		{"/ckpt", InJobCounts{Complete: 1, Pending: 3}},
		{"/", InJobCounts{Complete: 1, Pending: 4}}, // and /log
		{"/ckpt/a", InJobCounts{Pending: 1}},        // one file inside: its stage's state
	} {
		if got := h.counts(c.path); got != c.want {
			t.Errorf("running, 1 of 4 files moved, query %s: %+v, want %+v", c.path, got, c.want)
		}
	}
	st.FilesDone = 4
	if c := h.counts("/ckpt"); c != (InJobCounts{Complete: 4, Pending: 1}) {
		t.Errorf("every file moved but the stage not ended is still pending: %+v", c)
	}
	st.Status = model.StageComplete
	if c := h.counts("/ckpt"); c != (InJobCounts{Complete: 4}) {
		t.Errorf("complete: %+v", c)
	}
	st.Status, st.FilesDone = model.StageFailed, 2
	if c := h.counts("/ckpt"); c != (InJobCounts{Complete: 2, Failed: 2}) {
		t.Errorf("failed after 2 of 4: %+v", c)
	}
	st.Status, st.FilesTotal, st.FilesDone = model.StageComplete, 0, 0
	if c := h.counts("/ckpt"); c != (InJobCounts{Complete: 1}) {
		t.Errorf("an empty directory staged is still staged: %+v", c)
	}
}

// One in-job stage request costs the same few walks of the world whatever the number of
// paths it names and of stages the session holds (security issue 19: the session's stages
// were scanned once per path, and 25,000 paths held the controller's write transaction for
// 22 s). The request below names 4,000 paths of a session holding 4,000 stages: replaced
// ended stages, revoked and activated deferred ones, new ones, and a busy one that refuses
// the whole request; in a partial world and in an indexed whole one (whose index each new
// stage drops).
func TestInJobStagesCostIsLinear(t *testing.T) {
	for _, indexed := range []bool{false, true} {
		h := runningJob(t)
		if indexed {
			h.w.Index()
		}
		const n = 1000
		p := func(dir string, i int) string { return fmt.Sprintf("/%s/%d", dir, i) }
		var held []InJobStage
		for i := 0; i < n; i++ {
			held = append(held, out(WhenAtJobEnd, p("revoke", i), "/pfs/r"), out(WhenAtJobEnd, p("activate", i), "/pfs/a"),
				out("", p("done", i), "/pfs/d"), out("", p("busy", i), "/pfs/b"))
		}
		h.must(ApplyInJobStages(h.w, "9", held, h, h.now))
		h.w.TakeChanges()
		for _, st := range h.w.Stages {
			if strings.Contains(st.DWPath, "/done/") {
				st.Status = model.StageComplete
			}
		}
		var reqs []InJobStage
		for i := 0; i < n; i++ {
			reqs = append(reqs, out(WhenRevoke, p("revoke", i), ""), out(WhenActivate, p("activate", i), ""),
				out("", p("done", i), "/pfs/d2"), out("", p("new", i), "/pfs/n"))
		}
		before := h.w.walks
		if err := ApplyInJobStages(h.w, "9", reqs, h, h.now); err != nil {
			t.Fatal(err)
		}
		t.Logf("indexed %v: %d walks", indexed, h.w.walks-before)
		if walks := h.w.walks - before; walks > 10 {
			t.Errorf("indexed %v: %d paths on a session holding %d stages walked the world %d times; want a few, whatever the numbers",
				indexed, len(reqs), len(held), walks)
		}
		count := map[string]int{}
		for _, st := range h.w.Stages {
			dir := strings.Split(st.DWPath, "/")[1]
			count[dir+" "+st.Status]++
			if dir == "done" && st.PFSPath != "/pfs/d2" {
				t.Fatalf("indexed %v: a replaced stage: %+v", indexed, st)
			}
		}
		want := map[string]int{"activate " + model.StagePending: n, "done " + model.StagePending: n, "busy " + model.StagePending: n, "new " + model.StagePending: n}
		if fmt.Sprint(count) != fmt.Sprint(want) {
			t.Errorf("indexed %v: stages by directory and status %v, want %v", indexed, count, want)
		}
		if archived := len(h.w.TakeChanges().Archive); archived != n {
			t.Errorf("indexed %v: %d replaced stages kept in the history, want %d", indexed, archived, n)
		}
		// A busy path anywhere in a request refuses it whole.
		reqs = append(reqs[:0], out("", "/fresh/1", "/pfs/f"), out("", p("busy", n-1), "/pfs/b2"))
		if err := ApplyInJobStages(h.w, "9", reqs, h, h.now); !errors.Is(err, ErrBusy) {
			t.Fatalf("indexed %v: a busy path: %v", indexed, err)
		}
	}
}

// CheckInJobStages refuses a request over the bound, naming the setting and the way out,
// before any state is read.
func TestCheckInJobStagesBoundsTheRequest(t *testing.T) {
	reqs := make([]InJobStage, 11)
	for i := range reqs {
		reqs[i] = out("", fmt.Sprintf("/f%d", i), "/pfs/f")
	}
	err := CheckInJobStages(reqs, 10)
	var le *LimitError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "stage.max_paths_per_request (10)") || !strings.Contains(err.Error(), "at most 10 paths") {
		t.Fatalf("11 paths over a bound of 10: %v", err)
	}
	if err := CheckInJobStages(reqs[:10], 10); err != nil {
		t.Fatalf("10 paths at a bound of 10: %v", err)
	}
	if err := CheckInJobStages(append(reqs[:2:2], reqs[0]), 10); err == nil || !strings.Contains(err.Error(), "named twice") {
		t.Fatalf("a path twice: %v", err)
	}
}

func BenchmarkApplyInJobStages(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				h := runningJob(&testing.T{})
				var reqs []InJobStage
				for j := 0; j < n; j++ {
					reqs = append(reqs, out("", fmt.Sprintf("/f/%d", j), "/pfs/f"))
				}
				b.StartTimer()
				if err := ApplyInJobStages(h.w, "9", reqs, h, h.now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// data_in, data_out and pre_run cost a few walks of the world whatever the number of stages
// and nodes they name (security issue 19: the same shape as the in-job stage requests').
func TestStagesAndPreRunCostIsLinear(t *testing.T) {
	const n = 2000
	h := newHarness(t, "ssd1")
	var nodes []string
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("cn%d", i+10)
		h.w.Nodes[name] = &model.Node{Name: name, Online: true}
		nodes = append(nodes, name)
	}
	h.must(ApplySetup(h.w, jobSetup("9", 1<<30, model.AccessStriped, model.AccessPrivate), h, h.p, h.now))
	h.settle()
	stages := func(from int) []StageRequest {
		var reqs []StageRequest
		for i := from; i < from+n; i++ {
			reqs = append(reqs, StageRequest{Type: model.StageFile, PFSPath: fmt.Sprintf("/pfs/%d", i), DWVar: VarJobStriped, DWPath: fmt.Sprintf("/%d", i), Line: i})
		}
		return reqs
	}
	sid := h.w.SessionByToken("9").ID
	for _, c := range []struct {
		what  string
		apply func() error
		want  int // the session's stages or activations after it
	}{
		{"data_in", func() error { return ApplyStages(h.w, "9", model.StageIn, stages(0), h, h.now) }, n},
		{"data_in of more", func() error { return ApplyStages(h.w, "9", model.StageIn, stages(n), h, h.now) }, 2 * n},
		{"data_in again", func() error { return ApplyStages(h.w, "9", model.StageIn, stages(0), h, h.now) }, 2 * n},
		{"pre_run", func() error { return ApplyPreRun(h.w, "9", nodes, h, h.p) }, 2 * n},
		{"pre_run again", func() error { return ApplyPreRun(h.w, "9", nodes, h, h.p) }, 2 * n},
	} {
		before := h.w.walks
		h.must(c.apply())
		if walks := h.w.walks - before; walks > 20 {
			t.Errorf("%s: %d stages or nodes walked the world %d times; want a few, whatever the numbers", c.what, n, walks)
		}
		got := len(h.w.StagesOf(sid))
		if strings.HasPrefix(c.what, "pre_run") {
			got = len(h.w.ActivationsOf(sid))
		}
		if got != c.want {
			t.Errorf("%s: %d, want %d", c.what, got, c.want)
		}
	}
	private := 0
	for _, ns := range h.w.Namespaces {
		if ns.ClientNode != "" {
			private++
		}
	}
	if private != n {
		t.Errorf("%d private namespaces, want one per node (%d)", private, n)
	}
}

// A terminate that comes while the stage's start is on its way to the agent (the start
// effect in flight, or sent by a controller that then restarted) must not leave a worker
// nobody cancels or polls: the stage stays pending (the job's query still counts it) until
// its agent confirms that nothing of it runs; a start that lands meanwhile makes it running,
// and its terminate cancels it. A cancel that finds the copy finished reports it complete.
// Issue 23 item 15.
func TestTerminateRacesTheStart(t *testing.T) {
	for _, tc := range []struct {
		name        string
		startLands  bool                 // the start in flight reaches the agent
		cancelFinds agentapi.StageStatus // what the agent's cancel answers
		want        string
	}{
		{"start-lands-then-canceled", true, agentapi.StageStatus{Known: true, Status: model.StageCanceled}, model.StageCanceled},
		{"start-lands-copy-finished-first", true, agentapi.StageStatus{Known: true, Status: model.StageComplete, FilesDone: 1, FilesTotal: 1, BytesDone: 7, BytesTotal: 7}, model.StageComplete},
		{"start-fails", false, agentapi.StageStatus{Known: false}, model.StageCanceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := runningJob(t)
			h.must(ApplyInJobStages(h.w, "9", []InJobStage{out(WhenImmediate, "/big", "/pfs/big")}, h, h.now))
			h.w.TakeChanges()
			// The pass that starts it: the start effect is now in flight.
			var start *Effect
			for _, e := range Step(h.w, h.p, h.now) {
				if e.Op == OpStartStage {
					start = &e
				}
			}
			h.w.TakeChanges()
			if start == nil {
				t.Fatal("no start effect")
			}
			if n, err := ApplyTerminate(h.w, "9", VarJobStriped, "/big", h.now); err != nil || n != 1 {
				t.Fatalf("terminate: %d %v", n, err)
			}
			h.w.TakeChanges()
			if st := h.w.Stages[start.Ref.ID]; st.Ended() {
				t.Fatalf("a terminated stage whose start may have reached its agent ended before the agent said so: %+v", st)
			}
			if c := h.counts("/big"); c != (InJobCounts{Pending: 1}) {
				t.Fatalf("until then the job's query counts it pending: %+v", c)
			}
			// Now the start's outcome is recorded.
			r := Result{}
			if !tc.startLands {
				r.Err = errors.New("agent unreachable")
			}
			Complete(h.w, *start, r, h.p, h.now)
			h.w.TakeChanges()
			canceled := 0
			for i := 0; i < 5 && !h.w.Stages[start.Ref.ID].Ended(); i++ {
				h.now = h.now.Add(time.Hour) // past any retry backoff
				for _, e := range Step(h.w, h.p, h.now) {
					switch e.Op {
					case OpStartStage:
						t.Fatalf("a terminated stage is started again: %+v", e)
					case OpCancelStage:
						canceled++
						Complete(h.w, e, Result{Stage: tc.cancelFinds}, h.p, h.now)
					case OpPollStage:
						Complete(h.w, e, Result{Stage: agentapi.StageStatus{Known: true, Status: model.StageRunning}}, h.p, h.now)
					}
				}
				h.w.TakeChanges()
			}
			st := h.w.Stages[start.Ref.ID]
			if canceled == 0 {
				t.Fatalf("the agent was never asked to cancel the stage: %+v", st)
			}
			if st.Status != tc.want {
				t.Fatalf("ended %s, want %s: %+v", st.Status, tc.want, st)
			}
			if tc.want == model.StageComplete && (st.BytesDone != 7 || st.FilesDone != 1) {
				t.Fatalf("a complete stage keeps its figures: %+v", st)
			}
		})
	}
}

// A split stage (a file of a 2-server instance: each server copies its part) terminated while
// the starts of its copy runs are in flight: each run whose start lands is canceled on its
// node before the stage ends; none is left running unknown to the controller. Issue 23 #15.
func TestTerminateRacesTheStartOfASplitStage(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	h.must(ApplySetup(h.w, jobSetup("9", 2<<30, "striped"), h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "9", []string{"cn1"}, h, h.p))
	h.settle()
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{out("", "/ckpt", "/pfs/ckpt")}, h, h.now))
	h.w.TakeChanges()
	done := func(e Effect) Result {
		return Result{Stage: agentapi.StageStatus{Known: true, Status: model.StageComplete, FilesTotal: 1, FilesDone: 1}}
	}
	// Run until the copy step's starts are decided; hold them (in flight).
	var inflight []Effect
	for i := 0; i < 20 && len(inflight) == 0; i++ {
		for _, e := range Step(h.w, h.p, h.now) {
			if e.Op == OpStartStage && e.Stage.Part != nil && e.Stage.Part.Step == agentapi.StepCopy {
				inflight = append(inflight, e)
				continue
			}
			Complete(h.w, e, done(e), h.p, h.now)
		}
		h.w.TakeChanges()
		h.now = h.now.Add(time.Second)
	}
	if len(inflight) == 0 {
		t.Fatal("the copy step never started")
	}
	if n, err := ApplyTerminate(h.w, "9", VarJobStriped, "/ckpt", h.now); err != nil || n != 1 {
		t.Fatalf("terminate: %d %v", n, err)
	}
	h.w.TakeChanges()
	busy := map[EffectKey]bool{}
	for _, e := range inflight {
		busy[e.Key()] = true
	}
	// A pass while the starts are in flight: the executor runs nothing on their keys.
	for _, e := range Step(h.w, h.p, h.now) {
		if !busy[e.Key()] {
			Complete(h.w, e, done(e), h.p, h.now)
		}
	}
	h.w.TakeChanges()
	// The starts land: the runs are started on their nodes.
	running := map[EffectKey]bool{}
	for _, e := range inflight {
		Complete(h.w, e, Result{}, h.p, h.now)
		running[e.Key()] = true
	}
	h.w.TakeChanges()
	for i := 0; i < 20 && !h.w.Stages[1].Ended(); i++ {
		h.now = h.now.Add(time.Second)
		for _, e := range Step(h.w, h.p, h.now) {
			if e.Op == OpCancelStage {
				delete(running, e.Key())
				Complete(h.w, e, Result{Stage: agentapi.StageStatus{Known: true, Status: model.StageCanceled}}, h.p, h.now)
				continue
			}
			Complete(h.w, e, done(e), h.p, h.now)
		}
		h.w.TakeChanges()
	}
	if st := h.w.Stages[1]; !st.Ended() || st.Status != model.StageCanceled {
		t.Fatalf("the stage: %s (%s)", st.Status, st.Error)
	}
	if len(running) > 0 {
		t.Fatalf("the stage ended while %d of its copy runs, started on their nodes, were never canceled there", len(running))
	}
}

// A teardown (with hurry) that comes while a stage's start is in flight cancels the stage on
// its agent once the start has landed, before it ends; it does not end it on the controller's
// word, leaving a worker writing into an instance being destroyed. Issue 23 item 15.
func TestTeardownRacesTheStart(t *testing.T) {
	h := runningJob(t)
	h.must(ApplyInJobStages(h.w, "9", []InJobStage{out(WhenImmediate, "/big", "/pfs/big")}, h, h.now))
	h.w.TakeChanges()
	var start *Effect
	for _, e := range Step(h.w, h.p, h.now) {
		if e.Op == OpStartStage {
			start = &e
		}
	}
	h.w.TakeChanges()
	if start == nil {
		t.Fatal("no start effect")
	}
	h.must(ApplyTeardown(h.w, "9", true))
	h.w.TakeChanges()
	// A pass while the start is in flight: nothing runs on the stage's key.
	for _, e := range Step(h.w, h.p, h.now) {
		if e.Key() != start.Key() {
			Complete(h.w, e, Result{}, h.p, h.now)
		}
	}
	h.w.TakeChanges()
	Complete(h.w, *start, Result{}, h.p, h.now) // the worker runs on the node now
	h.w.TakeChanges()
	canceled := false
	for i := 0; i < 30; i++ {
		h.now = h.now.Add(time.Second)
		effects := Step(h.w, h.p, h.now)
		if len(effects) == 0 {
			break
		}
		for _, e := range effects {
			r := Result{}
			switch e.Op {
			case OpCancelStage:
				canceled = true
				r.Stage = agentapi.StageStatus{Known: true, Status: model.StageCanceled}
			case OpPollStage:
				r.Stage = agentapi.StageStatus{Known: true, Status: model.StageRunning}
			}
			Complete(h.w, e, r, h.p, h.now)
		}
		h.w.TakeChanges()
	}
	if !canceled {
		t.Fatal("the teardown ended a stage whose start had landed without canceling it on its agent")
	}
}
