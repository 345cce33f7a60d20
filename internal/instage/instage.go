// Package instage is the Go client of in-job staging (DataWarp's stage API, issue 12): given
// paths under a Spillway mount it probes them as the calling user (package stagecall: the
// path with its links resolved, the Spillway mount holding it, what stat(2) and access(2)
// say of it and its directory) and sends the call to the controller (POST
// /dw/v1/job_stages), which finds the session and the variable, makes the checks and records
// the stages. libdatawarp sends the same call from C. Errors carry the errno libdatawarp
// returns (negated), with a message naming the path and the fix. `dwcli stage` uses it.
package instage

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/mounttable"
	"github.com/spillway-hpc/spillway/internal/stagecall"
	"github.com/spillway-hpc/spillway/internal/views"
	"golang.org/x/sys/unix"
)

// Error is a failure with the errno libdatawarp returns for it.
type Error = stagecall.Error

// Target is a burst buffer path resolved to its session.
type Target = stagecall.Target

// Found is a stage and the absolute path of its burst buffer side.
type Found = stagecall.Found

// Failure is one failed stage: the burst buffer path, the negative errno, the message.
type Failure = stagecall.Failure

func errorf(errno syscall.Errno, format string, args ...any) error {
	return stagecall.Errorf(errno, format, args...)
}

// ErrnoOf maps any error to the errno libdatawarp returns: an Error's own, the controller's
// kind of answer (stagecall.ErrnoOfKind), EIO for the rest (the controller unreachable).
func ErrnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Errno
	}
	var api *apiclient.Error
	if errors.As(err, &api) {
		return stagecall.ErrnoOfKind(api.Kind)
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return syscall.EIO
}

// Stager probes paths and asks for stages.
type Stager struct {
	// Dial connects to the controller, on first need.
	Dial   func() (*apiclient.Client, error)
	api    *apiclient.Client
	mounts []string // Spillway mount points, longest first (read once)
}

// API connects (once) and returns the controller's client.
func (s *Stager) API() (*apiclient.Client, error) {
	if s.api == nil {
		c, err := s.Dial()
		if err != nil {
			return nil, errorf(syscall.EIO, "%v", err)
		}
		s.api = c
	}
	return s.api, nil
}

// canonical makes p absolute and resolves its links as the calling user; a missing last
// component is kept as named.
func canonical(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r
	}
	dir, base := filepath.Split(abs)
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		return filepath.Join(r, base)
	}
	return filepath.Clean(abs)
}

// statOf is what stat(2) and access(2) say of p, as the calling user.
func statOf(p string) stagecall.Stat {
	var st unix.Stat_t
	var err error
	for {
		if err = unix.Stat(p, &st); err != unix.EINTR {
			break
		}
	}
	if err != nil {
		errno, ok := err.(syscall.Errno)
		if !ok {
			errno = syscall.EIO
		}
		return stagecall.Stat{Errno: int(errno)}
	}
	out := stagecall.Stat{Kind: stagecall.KindOther}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		out.Kind = stagecall.KindFile
	case unix.S_IFDIR:
		out.Kind = stagecall.KindDir
	}
	out.R = unix.Access(p, unix.R_OK) == nil
	out.WX = unix.Access(p, unix.W_OK|unix.X_OK) == nil
	return out
}

// probeBB probes a burst buffer path: its links resolved, the mount holding it; its
// directory too for a file staged in (the only check that reads it: a list must stay small).
func (s *Stager) probeBB(p string) (stagecall.Probe, error) {
	pr, err := s.probeBBDir(p)
	pr.Dir = stagecall.Stat{}
	return pr, err
}

func (s *Stager) probeBBDir(p string) (stagecall.Probe, error) {
	if p == "" {
		return stagecall.Probe{}, nil
	}
	if s.mounts == nil { // the mount table, read once
		points, err := mounttable.SpillwayMountPoints()
		if err != nil {
			return stagecall.Probe{}, errorf(syscall.EIO, "%v", err)
		}
		sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
		s.mounts = append(points, "") // never nil once read
	}
	abs := canonical(p)
	pr := stagecall.Probe{Given: givenIf(p, abs), Path: abs, Stat: statOf(abs), Dir: statOf(filepath.Dir(abs))}
	for _, m := range s.mounts {
		if rel, ok := strings.CutPrefix(abs, m); m != "" && ok && (rel == "" || strings.HasPrefix(rel, "/")) {
			pr.Mount = m
			break
		}
	}
	return pr, nil
}

// probePFS probes a PFS path, made absolute.
func probePFS(p string) stagecall.Probe {
	if p == "" {
		return stagecall.Probe{}
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return stagecall.Probe{Given: p, Path: p}
	}
	return stagecall.Probe{Given: givenIf(p, abs), Path: abs, Stat: statOf(abs), Dir: statOf(filepath.Dir(abs))}
}

// givenIf is the name the caller gave when it is not the path sent (a list of 10,000 paths
// must fit in controller.max_request_bytes).
func givenIf(given, path string) string {
	if given == path {
		return ""
	}
	return given
}

func (s *Stager) probeAll(paths []string) ([]stagecall.Probe, error) {
	out := make([]stagecall.Probe, 0, len(paths))
	for _, p := range paths {
		pr, err := s.probeBB(p)
		if err != nil {
			return nil, err
		}
		out = append(out, pr)
	}
	return out, nil
}

// call sends a call and turns a non-zero errno into an Error.
func (s *Stager) call(ctx context.Context, c stagecall.Call) (apiclient.StageCallReply, error) {
	api, err := s.API()
	if err != nil {
		return apiclient.StageCallReply{}, err
	}
	reply, err := api.StageCall(ctx, c)
	if err != nil {
		return reply, err
	}
	if reply.Errno != 0 {
		return reply, &Error{Errno: syscall.Errno(reply.Errno), Msg: reply.Error}
	}
	return reply, nil
}

// StageIn copies pfs into dw now (typ file or directory).
func (s *Stager) StageIn(ctx context.Context, typ, dw, pfs string) error {
	t, err := s.probeBBDir(dw)
	if err != nil {
		return err
	}
	_, err = s.call(ctx, stagecall.Call{Verb: stagecall.VerbIn, Type: typ, DW: []stagecall.Probe{t}, PFS: []stagecall.Probe{probePFS(pfs)}})
	return err
}

// StageInTarget copies pfs into t now (typ file or directory): DataWarp's named form, whose
// target has no local path (the stage checks it, as the session's user); the PFS side is
// checked here with stagecall's checks.
func (s *Stager) StageInTarget(ctx context.Context, t Target, typ, pfs string) error {
	if _, err := s.API(); err != nil {
		return err
	}
	req, err := stagecall.In(t, typ, probePFS(pfs), uint32(os.Getuid()))
	if err != nil {
		return err
	}
	return s.api.JobStages(ctx, t.Info.Token, []lifecycle.InJobStage{req})
}

// StageInList copies each PFS file into directory dwDir.
func (s *Stager) StageInList(ctx context.Context, dwDir string, pfs []string) error {
	t, err := s.probeBB(dwDir)
	if err != nil {
		return err
	}
	c := stagecall.Call{Verb: stagecall.VerbIn, Type: model.StageList, DW: []stagecall.Probe{t}}
	for _, p := range pfs {
		c.PFS = append(c.PFS, probePFS(p))
	}
	_, err = s.call(ctx, c)
	return err
}

// StageOut copies dw to pfs (typ file or directory), when says when; pfs is ignored for
// revoke and activate.
func (s *Stager) StageOut(ctx context.Context, typ, when, dw, pfs string) error {
	t, err := s.probeBB(dw)
	if err != nil {
		return err
	}
	_, err = s.call(ctx, stagecall.Call{Verb: stagecall.VerbOut, Type: typ, When: when, DW: []stagecall.Probe{t}, PFS: []stagecall.Probe{probePFS(pfs)}})
	return err
}

// StageOutTarget copies t to pfs: DataWarp's named form (see StageInTarget).
func (s *Stager) StageOutTarget(ctx context.Context, t Target, typ, when, pfs string) error {
	if _, err := s.API(); err != nil {
		return err
	}
	req, err := stagecall.Out(t, typ, when, probePFS(pfs), uint32(os.Getuid()))
	if err != nil {
		return err
	}
	return s.api.JobStages(ctx, t.Info.Token, []lifecycle.InJobStage{req})
}

// StageOutList copies each burst buffer file into the existing PFS directory pfsDir.
func (s *Stager) StageOutList(ctx context.Context, when string, dws []string, pfsDir string) error {
	ts, err := s.probeAll(dws)
	if err != nil {
		return err
	}
	c := stagecall.Call{Verb: stagecall.VerbOut, Type: model.StageList, When: when, DW: ts}
	if when != lifecycle.WhenRevoke && when != lifecycle.WhenActivate {
		dir := probePFS(pfsDir)
		c.PFS = append(c.PFS, dir)
		for _, t := range ts {
			dest := filepath.Join(dir.Path, filepath.Base(t.Path))
			c.PFS = append(c.PFS, stagecall.Probe{Path: dest, Stat: statOf(dest)}) // its directory is dir
		}
	}
	_, err = s.call(ctx, c)
	return err
}

// Query adds up the stage counts of paths. A file (or list entry) that was never staged is
// EINVAL, as in DataWarp; a directory with nothing staged counts zeros.
func (s *Stager) Query(ctx context.Context, paths []string) (lifecycle.InJobCounts, []Found, error) {
	ps, err := s.probeAll(paths)
	if err != nil {
		return lifecycle.InJobCounts{}, nil, err
	}
	reply, err := s.call(ctx, stagecall.Call{Verb: stagecall.VerbQuery, DW: ps})
	if err != nil {
		return lifecycle.InJobCounts{}, nil, err
	}
	var failed int
	if err := unmarshal(reply.Failed, &failed); err != nil {
		return lifecycle.InJobCounts{}, nil, err
	}
	return lifecycle.InJobCounts{Complete: reply.Complete, Pending: reply.Pending, Deferred: reply.Deferred, Failed: failed}, reply.Stages, nil
}

// Wait polls the paths' stages until none is waiting or running (deferred ones do not hold
// it: they run when the job ends). It returns EIO naming the first failed stage, if any.
//
// With failedOK a failed stage ends the wait as a complete one does (DataWarp's dw_wait_*
// returned 0 then, and clients such as AXL take any other answer for fatal): the failure
// stays visible to query, list --failed and dwstat.
func (s *Stager) Wait(ctx context.Context, paths []string, poll time.Duration, failedOK bool) error {
	if poll <= 0 {
		poll = 10 * time.Millisecond
	}
	delay := poll
	for {
		c, found, err := s.Query(ctx, paths)
		if err != nil {
			return err
		}
		if c.Pending == 0 {
			for _, f := range found {
				if failedOK {
					break
				}
				if f.Status == model.StageFailed {
					return errorf(syscall.EIO, "the stage of %s failed: %s", f.Path, f.Error)
				}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return errorf(syscall.ETIMEDOUT, "%s: still staging after the timeout (%d pending)", strings.Join(paths, " "), c.Pending)
		case <-time.After(delay):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// Terminate stops the paths' waiting and running in-job stages.
func (s *Stager) Terminate(ctx context.Context, paths []string) (int, error) {
	ps, err := s.probeAll(paths)
	if err != nil {
		return 0, err
	}
	reply, err := s.call(ctx, stagecall.Call{Verb: stagecall.VerbTerminate, DW: ps})
	return reply.Terminated, err
}

// SetConcurrency sets how many of the job's stages may run at once (dw_set_stage_concurrency)
// for the session holding p, which must exist and be readable; it returns the limit the
// controller set (a larger request is clamped to its stage.max_job_concurrency).
func (s *Stager) SetConcurrency(ctx context.Context, p string, n int64) (int, error) {
	pr, err := s.probeBB(p)
	if err != nil {
		return 0, err
	}
	reply, err := s.call(ctx, stagecall.Call{Verb: stagecall.VerbConcurrency, DW: []stagecall.Probe{pr}, Concurrency: n})
	return reply.Concurrency, err
}

// Failed lists the failed stages under p (dw_open_failed_stage's walk): each one's burst
// buffer path and the errno its message suggests.
func (s *Stager) Failed(ctx context.Context, p string) ([]Failure, error) {
	pr, err := s.probeBB(p)
	if err != nil {
		return nil, err
	}
	reply, err := s.call(ctx, stagecall.Call{Verb: stagecall.VerbFailed, DW: []stagecall.Probe{pr}})
	if err != nil {
		return nil, err
	}
	out := []Failure{}
	return out, unmarshal(reply.Failed, &out)
}

// Accounting is DataWarp's accounting JSON (dw_get_accounting_data_json, the CLE6.0UP04
// spelling) for the instance holding p: the controller's live record of it, {"realm": {...}}
// with the data path's counters per server and namespace, the stages' bytes, and Spillway's
// own fields (docs/libdatawarp.md).
func (s *Stager) Accounting(ctx context.Context, p string) (views.Accounting, error) {
	pr, err := s.probeBB(p)
	if err != nil {
		return views.Accounting{}, err
	}
	reply, err := s.call(ctx, stagecall.Call{Verb: stagecall.VerbAccounting, DW: []stagecall.Probe{pr}})
	if err != nil {
		return views.Accounting{}, err
	}
	var a views.Accounting
	return a, unmarshal(reply.Realm, &a.Realm)
}

func unmarshal(raw []byte, into any) error {
	if len(raw) == 0 {
		return nil
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return errorf(syscall.EIO, "the controller's answer: %v", err)
	}
	return nil
}
