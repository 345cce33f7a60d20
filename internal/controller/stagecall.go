package controller

import (
	"context"
	"errors"
	"net/http"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/stagecall"
)

// stageCall answers POST /dw/v1/job_stages: in-job staging by path (libdatawarp, dwcli
// stage), package stagecall. The answer is always 200 with libdatawarp's result, {"errno": N,
// ...} (what `dwcli stage --json` prints): the call was served, and its outcome is an errno.
// Only a request that is not one (bad JSON, no credential, not the leader) gets an error
// status.
func (s *Server) stageCall(w http.ResponseWriter, r *http.Request) {
	var call stagecall.Call
	if !httpapi.Decode(w, r, &call) {
		return
	}
	out, err := s.runStageCall(r.Context(), who(r), call)
	if out == nil {
		out = map[string]any{}
	}
	errno := syscall.Errno(0)
	if err != nil {
		var e *stagecall.Error
		if errors.As(err, &e) {
			errno = e.Errno
		} else {
			kind := ErrorKind(err)
			if kind == "internal" {
				s.log.Error("stage call failed", "verb", call.Verb, "err", err)
			}
			errno = stagecall.ErrnoOfKind(kind)
		}
		out["error"] = err.Error()
	}
	out["errno"] = int(errno)
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) runStageCall(ctx context.Context, c caller, call stagecall.Call) (map[string]any, error) {
	world, err := s.c.viewSharedOf(ctx, mountTables) // the mounts' lookup reads no stage
	if err != nil {
		return nil, err
	}
	known := map[string]lifecycle.MountInfo{}
	locate := func(mount string) (lifecycle.MountInfo, error) {
		if info, ok := known[mount]; ok {
			return info, nil
		}
		info, err := lifecycle.Locate(world, mount, "")
		if err == nil && !c.privileged && info.Owner != c.uid {
			err = lifecycle.ErrNoSession // another user's mount: say nothing about it
		}
		if err != nil {
			return info, err
		}
		known[mount] = info
		return info, nil
	}
	resolve := func(i int) (stagecall.Target, error) {
		if i >= len(call.DW) {
			return stagecall.Target{}, stagecall.Errorf(syscall.EINVAL, "no path given")
		}
		return stagecall.Resolve(call.DW[i], locate)
	}
	pfs := func(i int) stagecall.Probe {
		if i < len(call.PFS) {
			return call.PFS[i]
		}
		return stagecall.Probe{}
	}
	switch call.Verb {
	case stagecall.VerbIn:
		t, err := resolve(0)
		if err != nil {
			return nil, err
		}
		var reqs []lifecycle.InJobStage
		if call.Type == model.StageList {
			reqs, err = stagecall.InList(t, call.PFS, c.uid)
		} else {
			var req lifecycle.InJobStage
			req, err = stagecall.In(t, call.Type, pfs(0), c.uid)
			reqs = []lifecycle.InJobStage{req}
		}
		if err != nil {
			return nil, err
		}
		return nil, s.c.JobStages(ctx, t.Info.Token, reqs)
	case stagecall.VerbOut:
		if call.Type == model.StageList {
			ts := make([]stagecall.Target, 0, len(call.DW))
			for i := range call.DW {
				t, err := resolve(i)
				if err != nil {
					return nil, err
				}
				ts = append(ts, t)
			}
			reqs, err := stagecall.OutList(ts, call.When, call.PFS, c.uid)
			if err != nil {
				return nil, err
			}
			// One request per session, each all or none (a list is one job's files).
			by, order := map[string][]lifecycle.InJobStage{}, []string{}
			for i, t := range ts {
				if _, ok := by[t.Info.Token]; !ok {
					order = append(order, t.Info.Token)
				}
				by[t.Info.Token] = append(by[t.Info.Token], reqs[i])
			}
			for _, token := range order {
				if err := s.c.JobStages(ctx, token, by[token]); err != nil {
					return nil, err
				}
			}
			return nil, nil
		}
		t, err := resolve(0)
		if err != nil {
			return nil, err
		}
		req, err := stagecall.Out(t, call.Type, call.When, pfs(0), c.uid)
		if err != nil {
			return nil, err
		}
		return nil, s.c.JobStages(ctx, t.Info.Token, []lifecycle.InJobStage{req})
	case stagecall.VerbQuery:
		if len(call.DW) == 0 {
			return nil, stagecall.Errorf(syscall.EINVAL, "no path given")
		}
		var total lifecycle.InJobCounts
		all := []stagecall.Found{}
		for i, p := range call.DW {
			t, err := resolve(i)
			if err != nil {
				return nil, err
			}
			counts, found, err := s.queryTarget(ctx, t)
			if err != nil {
				return nil, err
			}
			if err := stagecall.QueryCheck(t, p.Named(), len(found)); err != nil {
				return nil, err
			}
			total.Complete += counts.Complete
			total.Pending += counts.Pending
			total.Deferred += counts.Deferred
			total.Failed += counts.Failed
			for _, st := range found {
				all = append(all, stagecall.Found{StageProgress: lifecycle.ProgressOf(st), Path: t.PathOf(st.DWPath)})
			}
		}
		return map[string]any{"complete": total.Complete, "pending": total.Pending, "deferred": total.Deferred, "failed": total.Failed, "stages": all}, nil
	case stagecall.VerbTerminate:
		if len(call.DW) == 0 {
			return nil, stagecall.Errorf(syscall.EINVAL, "no path given")
		}
		n := 0
		for i, p := range call.DW {
			t, err := resolve(i)
			if err == nil {
				err = stagecall.TerminateCheck(t, p.Named())
			}
			if err != nil {
				return map[string]any{"terminated": n}, err
			}
			k, err := s.c.TerminateStages(ctx, t.Info.Token, t.Info.Var, t.Rel)
			if err != nil {
				return map[string]any{"terminated": n}, err
			}
			n += k
		}
		return map[string]any{"terminated": n}, nil
	case stagecall.VerbConcurrency:
		n, err := stagecall.ConcurrencyCheck(call.Concurrency)
		if err != nil {
			return nil, err
		}
		t, err := resolve(0)
		if err == nil {
			err = stagecall.ExistCheck(t, c.uid)
		}
		if err != nil {
			return nil, err
		}
		set, err := s.c.StageConcurrency(ctx, t.Info.Token, n)
		return map[string]any{"concurrency": set}, err
	case stagecall.VerbFailed:
		t, err := resolve(0)
		if err == nil {
			err = stagecall.ExistCheck(t, c.uid)
		}
		if err != nil {
			return nil, err
		}
		_, found, err := s.queryTarget(ctx, t)
		if err != nil {
			return nil, err
		}
		out := []stagecall.Failure{}
		for _, st := range found {
			if st.Status == model.StageFailed {
				out = append(out, stagecall.Failure{Path: t.PathOf(st.DWPath), Errno: -int(stagecall.ErrnoOfMessage(st.Error)), Error: st.Error})
			}
		}
		return map[string]any{"failed": out}, nil
	case stagecall.VerbAccounting:
		t, err := resolve(0)
		if err != nil {
			return nil, err
		}
		a, _, err := s.c.Accounting(ctx, t.Info.Instance)
		if err != nil {
			return nil, err
		}
		return map[string]any{"realm": a.Realm}, nil // the realm last: libdatawarp takes it from there
	}
	return nil, stagecall.Errorf(syscall.EINVAL, "verb %q: expected in, out, query, terminate, failed, accounting or concurrency", call.Verb)
}

// queryTarget counts and lists the stages concerning t.
func (s *Server) queryTarget(ctx context.Context, t stagecall.Target) (lifecycle.InJobCounts, []*model.Stage, error) {
	world, err := s.c.viewSession(ctx, t.Info.Token)
	if err != nil {
		return lifecycle.InJobCounts{}, nil, err
	}
	return lifecycle.QueryInJob(world, t.Info.Token, t.Info.Var, t.Rel)
}
