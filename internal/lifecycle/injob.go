package lifecycle

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/model"
)

// In-job stages are the ones a job asks for while it runs, through libdatawarp's dw_stage_*
// calls or `dwcli stage`: DataWarp's stage API (docs/libdatawarp.md). Each names a file or a
// directory by its DW path; a path has at most one in-job stage record (a newer request
// replaces an ended one), and at most one active stage.

// When an in-job stage runs: DataWarp's enum dw_stage_type.
const (
	WhenImmediate = "immediate"  // DW_STAGE_IMMEDIATE: now
	WhenAtJobEnd  = "at_job_end" // DW_STAGE_AT_JOB_END: deferred, run when the job ends
	WhenRevoke    = "revoke"     // DW_REVOKE_STAGE_AT_JOB_END: forget a deferred stage-out
	WhenActivate  = "activate"   // DW_ACTIVATE_DEFERRED_STAGE: run a deferred stage-out now
)

// MaxInJobStages is the default bound on the stage records a session's job may hold (one per
// path; stage.max_job_stages): each is a row of the controller's state, which every request
// on the session reads.
const MaxInJobStages = 100000

// InJobStage is one in-job stage request.
type InJobStage struct {
	Direction string `json:"direction"`          // in | out
	Type      string `json:"type"`               // file | directory
	When      string `json:"when,omitempty"`     // immediate (default), at_job_end, revoke, activate
	DWVar     string `json:"dw_var"`             // the variable of the mount the path is under
	DWPath    string `json:"dw_path"`            // inside the namespace, starting with "/"
	PFSPath   string `json:"pfs_path,omitempty"` // absolute; ignored for revoke and activate
}

// InJobCounts are DataWarp's stage counts (dw_query_*_stage): pending counts waiting and
// running stages.
type InJobCounts struct {
	Complete int `json:"complete"`
	Pending  int `json:"pending"`
	Deferred int `json:"deferred"`
	Failed   int `json:"failed"`
}

// stageVarPath splits a stage's DW path "$VAR/rest" into its variable and its path.
func stageVarPath(st *model.Stage) (string, string, bool) {
	rest, ok := strings.CutPrefix(st.DWPath, "$")
	if !ok {
		return "", "", false
	}
	v, p, found := strings.Cut(rest, "/")
	if !found {
		return v, "/", true
	}
	return v, path.Clean("/" + p), true
}

// checkDWPath refuses a namespace path that is not absolute and clean.
func checkDWPath(field, p string) error {
	if p == "" || !strings.HasPrefix(p, "/") || path.Clean(p) != p {
		return userErr("%s %q: must start with / and contain no . or .. components (a path inside the instance)", field, p)
	}
	return nil
}

// CheckInJobStages validates a request's in-job stages on their own, before any state is
// read (the controller calls it before its write transaction): at least one and at most
// maxPerRequest (stage.max_paths_per_request; 0: no bound), each well formed, no path named
// twice. It fills in the defaults (when=immediate) and cleans the PFS paths. It costs
// O(len(reqs)).
func CheckInJobStages(reqs []InJobStage, maxPerRequest int) error {
	if len(reqs) == 0 {
		return userErr("stage: no stage requests given")
	}
	if maxPerRequest > 0 && len(reqs) > maxPerRequest {
		return limitErr("stage: %d paths in one request, more than stage.max_paths_per_request (%d): send them in requests of at most %d paths "+
			"(each is applied all or none), stage their directory rather than its files one by one, or ask the administrator to raise stage.max_paths_per_request",
			len(reqs), maxPerRequest, maxPerRequest)
	}
	seen := make(map[string]bool, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		if r.When == "" {
			r.When = WhenImmediate
		}
		switch r.Direction {
		case model.StageIn, model.StageOut:
		default:
			return userErr("stage: direction %q: expected in or out", r.Direction)
		}
		switch r.Type {
		case model.StageFile, model.StageDir:
		default:
			return userErr("stage: type %q: expected file or directory (a list is staged as its files)", r.Type)
		}
		switch r.When {
		case WhenImmediate:
		case WhenAtJobEnd, WhenRevoke, WhenActivate:
			if r.Direction != model.StageOut {
				return userErr("stage in: when=%s applies to stage-outs only; a stage-in is immediate", r.When)
			}
		default:
			return userErr("stage: when %q: expected immediate, at_job_end, revoke or activate", r.When)
		}
		if err := checkDWPath("dw_path", r.DWPath); err != nil {
			return err
		}
		if r.When == WhenImmediate || r.When == WhenAtJobEnd {
			if !path.IsAbs(r.PFSPath) {
				return userErr("stage: pfs_path %q is not an absolute path", r.PFSPath)
			}
			r.PFSPath = path.Clean(r.PFSPath)
		} else {
			r.PFSPath = ""
		}
		key := r.DWVar + r.DWPath
		if seen[key] {
			return userErr("stage: $%s%s is named twice in one request; a file has one stage at a time", r.DWVar, r.DWPath)
		}
		seen[key] = true
	}
	return nil
}

// ApplyInJobStages records a job's in-job stage requests, all or none. A request for a path
// whose stage is waiting or running is refused with ErrBusy (DataWarp: one active stage per
// file); revoke and activate need a deferred stage-out of the path. It checks the requests
// (CheckInJobStages, with no bound on their number) and applies them
// (ApplyCheckedInJobStages).
func ApplyInJobStages(w *World, token string, reqs []InJobStage, ids IDSource, now time.Time) error {
	if _, err := liveSession(w, token, "stage"); err != nil {
		return err
	}
	if err := CheckInJobStages(reqs, 0); err != nil {
		return err
	}
	return ApplyCheckedInJobStages(w, token, reqs, MaxInJobStages, ids, now)
}

// ApplyCheckedInJobStages is ApplyInJobStages for requests CheckInJobStages accepted, with
// maxHeld the most in-job stage records the session may hold (stage.max_job_stages). Its
// work is linear in the session's stages plus the requests: the session's in-job stages are
// found by path through a map built once, and each variable's configuration and namespace
// are resolved once (a world's lookups may cost the whole world after each change).
func ApplyCheckedInJobStages(w *World, token string, reqs []InJobStage, maxHeld int, ids IDSource, now time.Time) error {
	s, err := liveSession(w, token, "stage")
	if err != nil {
		return err
	}
	if len(reqs) == 0 {
		return userErr("stage: no stage requests given")
	}
	held := w.Elsewhere.InJobStages[s.ID]
	byPath := map[string][]*model.Stage{}
	for _, st := range w.StagesOf(s.ID) {
		if st.InJob {
			held++
			byPath[st.DWPath] = append(byPath[st.DWPath], st)
		}
	}
	if held+len(reqs) > maxHeld {
		return limitErr("stage: session %s has %d stages of its own, and %d more would pass stage.max_job_stages (%d); stage directories rather than their files one by one",
			s.Token, held, len(reqs), maxHeld)
	}
	targets := map[string]*inJobTarget{}
	for _, r := range reqs {
		if r.When == WhenAtJobEnd && s.Persistent {
			return userErr("stage out when=at_job_end: session %s is a persistent instance, not a job; it has no job end", s.Token)
		}
		t := targets[r.DWVar]
		if t == nil {
			if t, err = inJobTargetOf(w, s, r.DWVar); err != nil {
				return err
			}
			targets[r.DWVar] = t
		}
		if err := applyInJob(w, s, r, t, byPath, ids); err != nil {
			return err
		}
	}
	return nil
}

// inJobTarget is where a variable's in-job stages go.
type inJobTarget struct {
	cfg *model.Configuration
	ns  *model.Namespace
}

func inJobTargetOf(w *World, s *model.Session, v string) (*inJobTarget, error) {
	cfg, err := configForVar(w, s, v)
	if err != nil {
		return nil, userErr("stage: %v", err)
	}
	ns := w.NamespaceFor(cfg, "")
	if ns == nil {
		return nil, userErr("stage: the instance of $%s has no namespace", v)
	}
	return &inJobTarget{cfg, ns}, nil
}

// applyInJob applies one request; byPath holds the session's in-job stages by DW path, and
// is kept up to date.
func applyInJob(w *World, s *model.Session, r InJobStage, t *inJobTarget, byPath map[string][]*model.Stage, ids IDSource) error {
	if t.cfg.AccessMode == model.AccessLoadbalance && r.Direction == model.StageIn {
		return userErr("stage in $%s%s: a loadbalance instance is read-only once mounted; stage in before the job starts", r.DWVar, r.DWPath)
	}
	dwPath := "$" + r.DWVar + r.DWPath
	display := dwPath
	same := byPath[dwPath]
	switch r.When {
	case WhenRevoke, WhenActivate:
		var deferred *model.Stage
		for _, st := range same {
			if st.Status == model.StageDeferred {
				deferred = st
			}
		}
		if deferred == nil {
			return userErr("stage out %s: %s: there is no deferred (at_job_end) stage-out of this path", display, r.When)
		}
		if r.When == WhenRevoke {
			w.remove(KindStage, deferred.ID)
			byPath[dwPath] = slices.DeleteFunc(slices.Clone(same), func(st *model.Stage) bool { return st == deferred })
			return nil
		}
		deferred.Status, deferred.State = model.StagePending, model.Creating()
		w.put(deferred)
		return nil
	}
	for _, st := range same {
		if st.Status == model.StagePending || st.Status == model.StageRunning {
			return fmt.Errorf("%w: %s is being staged (%s); wait for it (dw_wait_file_stage, dwcli stage wait) or terminate it first", ErrBusy, display, st.Status)
		}
	}
	for _, st := range same { // ended or deferred: the new request replaces it
		w.retire(st, s)
	}
	id, err := ids.NewID(KindStage)
	if err != nil {
		return err
	}
	status := model.StagePending
	if r.When == WhenAtJobEnd {
		status = model.StageDeferred
	}
	st := &model.Stage{
		ID: id, SessionID: s.ID, ConfigurationID: t.cfg.ID, NamespaceID: t.ns.ID,
		Direction: r.Direction, Type: r.Type, PFSPath: r.PFSPath, DWPath: dwPath,
		Status: status, State: model.Creating(), InJob: true,
		Protect: r.Direction == model.StageOut && r.Type == model.StageFile,
	}
	w.put(st)
	byPath[dwPath] = []*model.Stage{st}
	return nil
}

// covers reports whether a stage concerns the path p of variable v: the stage's path is p or
// lies under it, or the stage is a directory stage holding p.
func covers(st *model.Stage, v, p string) bool {
	sv, sp, ok := stageVarPath(st)
	if !ok || sv != v {
		return false
	}
	if sp == p || p == "/" || strings.HasPrefix(sp, p+"/") {
		return true
	}
	return st.Type == model.StageDir && (sp == "/" || strings.HasPrefix(p, sp+"/"))
}

// QueryInJob counts the session's stages that concern the path (covers) and returns them.
// Canceled stages (terminated, or by teardown) count in no state.
func QueryInJob(w *World, token, v, p string) (InJobCounts, []*model.Stage, error) {
	var c InJobCounts
	s := w.SessionByToken(token)
	if s == nil {
		return c, nil, ErrNoSession
	}
	if err := checkDWPath("path", p); err != nil {
		return c, nil, err
	}
	var found []*model.Stage
	for _, st := range w.StagesOf(s.ID) {
		if st.Type == model.StageList || !covers(st, v, p) {
			continue
		}
		found = append(found, st)
		c.add(st, p)
	}
	return c, found, nil
}

// add counts the stage st for a query of path p. DataWarp stages a directory's files one by
// one, so its counts are in files: a directory stage the query covers whole counts each file
// it has moved as complete and the rest in the stage's own state (at least one, so that a
// stage still running, deferred or failed is never counted as nothing). A file stage, or a
// query of one path inside a staged directory, counts one.
func (c *InJobCounts) add(st *model.Stage, p string) {
	done, rest := 0, 1
	if _, sp, _ := stageVarPath(st); st.Type == model.StageDir && (sp == p || p == "/" || strings.HasPrefix(sp, p+"/")) {
		done = int(max(st.FilesDone, 0))
		rest = max(int(st.FilesTotal)-done, 1)
	}
	switch st.Status {
	case model.StageComplete:
		c.Complete += max(done, rest, int(st.FilesTotal))
	case model.StagePending, model.StageRunning:
		c.Complete += done
		c.Pending += rest
	case model.StageDeferred:
		c.Deferred += rest
	case model.StageFailed:
		c.Complete += done
		c.Failed += rest
	}
}

// ApplyTerminate stops the session's in-job stages that concern the path and have not ended
// (deferred ones stay: revoke them): each ends canceled once its agent has confirmed that
// nothing of it runs (a waiting one's start may be on its way there), or complete when its
// copy finished first. It returns how many it stops; a path with no in-job stage at all is a
// user error (DataWarp's -EINVAL).
func ApplyTerminate(w *World, token, v, p string, now time.Time) (int, error) {
	s, err := liveSession(w, token, "terminate")
	if err != nil {
		return 0, err
	}
	if err := checkDWPath("path", p); err != nil {
		return 0, err
	}
	any, n := false, 0
	for _, st := range w.StagesOf(s.ID) {
		if !st.InJob || !covers(st, v, p) {
			continue
		}
		any = true
		switch st.Status {
		case model.StagePending:
			// Its start may be on its way to the agent: the stage ends once the agent has
			// confirmed that nothing of it runs (cancelPending), or reported it complete.
			if !st.Terminate {
				st.Terminate = true
				// Not after the backoff of a start that failed (or whose answer was lost):
				// the agent is asked now.
				st.State.RetryAt = time.Time{}
				w.put(st)
			}
			n++
		case model.StageRunning:
			if !st.Terminate {
				st.Terminate = true
				w.put(st)
			}
			n++
		}
	}
	if !any {
		return 0, userErr("terminate $%s%s: nothing was staged there by the job", v, p)
	}
	return n, nil
}

// ApplyStageConcurrency sets how many of the job's in-job stages may run at once
// (dw_set_stage_concurrency, dwcli stage concurrency): n, clamped to max (the configuration's
// stage.max_job_concurrency). It returns the limit set. Stages already running are not
// stopped; pending ones wait until fewer than the limit run. The system-wide
// stage.max_running bounds them too.
func ApplyStageConcurrency(w *World, token string, n, max int) (int, error) {
	s, err := liveSession(w, token, "stage concurrency")
	if err != nil {
		return 0, err
	}
	if n < 1 {
		return 0, userErr("stage concurrency %d: give the number of stages the job may run at once, 1 or more", n)
	}
	if max > 0 && n > max {
		n = max
	}
	s.StageConcurrency = n
	w.put(s)
	return n, nil
}

const terminatedMsg = "terminated by the job (dw_terminate_*, dwcli stage terminate)"

// cancelMessage is what a canceled stage says: terminated by the job, or by teardown.
func cancelMessage(st *model.Stage) string {
	if st.Terminate {
		return terminatedMsg
	}
	return "canceled by teardown"
}

// activateAtJobEnd turns the job's deferred in-job stage-outs (DW_STAGE_AT_JOB_END) pending:
// the job has ended (post_run, data_out). They run before the instance is released, as the
// script's own #DW stage_out; one that failed at the job's end is tried again (data_out
// again: spillway run --retry-stage-out, Slurm).
func activateAtJobEnd(w *World, s *model.Session) {
	for _, st := range w.StagesOf(s.ID) {
		if !st.InJob {
			continue
		}
		again := st.AtJobEnd && !st.Terminate && (st.Status == model.StageFailed || st.Status == model.StageCanceled)
		if st.Status == model.StageDeferred || again {
			st.Status, st.State, st.AtJobEnd = model.StagePending, model.Creating(), true
			st.Error, st.Attempts, st.FilesDone, st.BytesDone = "", 0, 0, 0
			w.put(st)
		}
	}
}

// holdsInstance reports whether a stage-out that did not complete keeps the session's
// instance from being released without hurry: the script's own stage-outs and the job's
// DW_STAGE_AT_JOB_END ones (deferred, or run at the job's end: nobody else saw them fail);
// not an in-job stage the job ran while it ran (it was told of the failure: query, wait, the
// failed-stage walk), nor one it terminated.
func holdsInstance(st *model.Stage) bool {
	if !st.InJob {
		return true
	}
	if st.Terminate {
		return false
	}
	return st.Status == model.StageDeferred || st.AtJobEnd
}

// MountInfo is what a mount path is: the session and the variable naming it.
type MountInfo struct {
	Token         string `json:"token"`
	Session       ID     `json:"session"`
	Owner         uint32 `json:"owner"`
	Var           string `json:"var"`
	Configuration ID     `json:"configuration"`
	AccessMode    string `json:"access_mode"`
	Node          string `json:"node"`
	// Servers and StripeSize are the instance's stripe servers and its stripe size (the
	// defaults a file's stripe configuration answers).
	Servers    int    `json:"servers"`
	StripeSize uint64 `json:"stripe_size"`
	MaxMDS     bool   `json:"max_mds,omitempty"`
	Capacity   uint64 `json:"capacity"`
	Instance   ID     `json:"instance"`
}

// Locate finds the activation mounted at mount (on node, or on any node when node is ""):
// what libdatawarp needs to turn a file's path into a session and a DW path.
func Locate(w *World, mount, node string) (MountInfo, error) {
	mount = path.Clean(mount)
	for _, s := range w.SortedSessions() {
		for _, a := range w.ActivationsOf(s.ID) {
			if a.MountPath != mount || (node != "" && a.Node != node) {
				continue
			}
			info := MountInfo{Token: s.Token, Session: s.ID, Owner: s.Owner, Configuration: a.ConfigurationID, Node: a.Node}
			for _, e := range Exposures(w, s) {
				if e.Config.ID == a.ConfigurationID {
					info.Var, info.AccessMode, info.MaxMDS = e.Var, e.Config.AccessMode, e.Config.MaxMDS
					if inst := w.Instances[e.Config.InstanceID]; inst != nil {
						info.Capacity, info.StripeSize, info.Instance = inst.Capacity, w.StripeSize(inst), inst.ID
						info.Servers = 1
						if striped(w, e.Config) {
							info.Servers = len(w.FragmentsOf(inst.ID))
						}
					}
				}
			}
			if info.Var == "" {
				continue
			}
			return info, nil
		}
	}
	return MountInfo{}, ErrNoSession
}
