// Package instage is the client side of in-job staging (DataWarp's stage API, issue 12):
// given paths under a Spillway mount it finds the mount, the session and the variable (asking
// the controller, as the calling user), checks what the calling user can check (the file
// exists, the PFS directory is writable) and asks the controller for the stages. Errors carry
// the errno libdatawarp returns (negated), with a message naming the path and the fix.
// `dwcli stage` and libdatawarp (through `dwcli stage --json`) use it.
package instage

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/spillway-hpc/spillway/internal/views"
	"golang.org/x/sys/unix"
)

// Error is a failure with the errno libdatawarp returns for it.
type Error struct {
	Errno syscall.Errno
	Msg   string
}

func (e *Error) Error() string { return e.Msg }

func errorf(errno syscall.Errno, format string, args ...any) error {
	return &Error{Errno: errno, Msg: fmt.Sprintf(format, args...)}
}

// ErrnoOf maps any error to the errno libdatawarp returns: an Error's own, the controller's
// kind of answer (busy: EBUSY, user: EINVAL, too_large: E2BIG, not_found: ENOENT, forbidden: EACCES), EIO for
// the rest (the controller unreachable, an internal error).
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
		switch api.Kind {
		case "busy":
			return syscall.EBUSY
		case "user":
			return syscall.EINVAL
		case "too_large": // a list over stage.max_paths_per_request (the message says so)
			return syscall.E2BIG
		case "not_found":
			return syscall.ENOENT
		case "forbidden", "unauthorized":
			return syscall.EACCES
		}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return syscall.EIO
}

// Target is a path resolved to its mount.
type Target struct {
	Path  string // absolute, links resolved
	Mount string // the mount point
	Rel   string // inside the namespace, starting with "/"
	Info  lifecycle.MountInfo
}

// Var is the target as a DW path: "$DW_JOB_STRIPED/rel".
func (t Target) Var() string { return "$" + t.Info.Var + t.Rel }

// Stager resolves paths and asks for stages.
type Stager struct {
	// Dial connects to the controller, on first need: a path outside every mount is refused
	// without one.
	Dial   func() (*apiclient.Client, error)
	api    *apiclient.Client
	mounts []string                       // Spillway mount points, longest first
	infos  map[string]lifecycle.MountInfo // by mount point
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
func canonical(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r, nil
	}
	dir, base := filepath.Split(abs)
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		return filepath.Join(r, base), nil
	}
	return filepath.Clean(abs), nil
}

// Resolve finds the Spillway mount holding p and what it is.
func (s *Stager) Resolve(ctx context.Context, p string) (Target, error) {
	if p == "" {
		return Target{}, errorf(syscall.EINVAL, "empty path: give a path under a burst buffer mount ($DW_JOB_STRIPED/...)")
	}
	abs, err := canonical(p)
	if err != nil {
		return Target{}, errorf(syscall.EINVAL, "%s: %v", p, err)
	}
	if s.infos == nil { // the mount table, read once
		points, err := mounttable.SpillwayMountPoints()
		if err != nil {
			return Target{}, errorf(syscall.EIO, "%v", err)
		}
		sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
		s.mounts, s.infos = points, map[string]lifecycle.MountInfo{}
	}
	for _, m := range s.mounts {
		rel, ok := strings.CutPrefix(abs, m)
		if !ok || rel != "" && !strings.HasPrefix(rel, "/") {
			continue
		}
		if rel == "" {
			rel = "/"
		}
		info, known := s.infos[m]
		if !known {
			api, err := s.API()
			if err != nil {
				return Target{}, err
			}
			if info, err = api.Mount(ctx, m, ""); err != nil {
				if ErrnoOf(err) == syscall.ENOENT {
					return Target{}, errorf(syscall.EINVAL, "%s is in %s, a burst buffer mount that is not one of your jobs' (the controller knows no session of yours mounted there)", p, m)
				}
				return Target{}, err
			}
			s.infos[m] = info
		}
		return Target{Path: abs, Mount: m, Rel: filepath.Clean(rel), Info: info}, nil
	}
	return Target{}, errorf(syscall.EINVAL, "%s is not in a burst buffer: give a path under $DW_JOB_STRIPED or another of the job's burst buffer mounts", p)
}

// kind of a file the caller must name.
const (
	wantFile = iota
	wantDir
	wantAny
)

// mustExist checks, as the calling user, that p exists (ENOENT), has the kind asked (EISDIR,
// ENOTDIR) and is readable (EACCES).
func mustExist(p, role string, kind int) error {
	fi, err := os.Stat(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return errorf(syscall.ENOENT, "%s %s does not exist", role, p)
		}
		return errorf(ErrnoOf(err), "%s %s: %v", role, p, unwrapPath(err))
	}
	switch {
	case kind == wantFile && fi.IsDir():
		return errorf(syscall.EISDIR, "%s %s is a directory; stage it as a directory (dw_stage_directory_*, dwcli stage --type directory)", role, p)
	case kind == wantFile && !fi.Mode().IsRegular():
		return errorf(syscall.EINVAL, "%s %s is not a regular file; only regular files are staged", role, p)
	case kind == wantDir && !fi.IsDir():
		return errorf(syscall.ENOTDIR, "%s %s is not a directory", role, p)
	}
	if unix.Access(p, unix.R_OK) != nil {
		return errorf(syscall.EACCES, "%s %s: you may not read it (staging runs as you, uid %d)", role, p, os.Getuid())
	}
	return nil
}

// mustWriteDir checks, as the calling user, that directory d exists and is writable.
func mustWriteDir(d, role string) error {
	if err := mustExist(d, role, wantDir); err != nil {
		var e *Error
		if errors.As(err, &e) && e.Errno == syscall.ENOENT {
			return errorf(syscall.ENOENT, "%s %s does not exist; create it first", role, d)
		}
		return err
	}
	if unix.Access(d, unix.W_OK|unix.X_OK) != nil {
		return errorf(syscall.EACCES, "cannot create files in %s %s: permission denied (staging runs as you, uid %d); choose a directory you may write", role, d, os.Getuid())
	}
	return nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func absPFS(p string) (string, error) {
	if p == "" {
		return "", errorf(syscall.EINVAL, "no PFS path given")
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", errorf(syscall.EINVAL, "PFS path %s: %v", p, err)
	}
	return abs, nil
}

// send asks for reqs, grouped by session.
func (s *Stager) send(ctx context.Context, tokens []string, reqs []lifecycle.InJobStage) error {
	by := map[string][]lifecycle.InJobStage{}
	var order []string
	for i, t := range tokens {
		if _, ok := by[t]; !ok {
			order = append(order, t)
		}
		by[t] = append(by[t], reqs[i])
	}
	for _, t := range order {
		if err := s.api.JobStages(ctx, t, by[t]); err != nil {
			return err
		}
	}
	return nil
}

// StageIn copies pfs into dw now (typ file or directory).
func (s *Stager) StageIn(ctx context.Context, typ, dw, pfs string) error {
	t, err := s.Resolve(ctx, dw)
	if err != nil {
		return err
	}
	return s.StageInTarget(ctx, t, typ, pfs)
}

// StageInTarget copies pfs into t now (typ file or directory). A target without a local
// path (Named) is not checked here: the stage checks it, as the session's user.
func (s *Stager) StageInTarget(ctx context.Context, t Target, typ, pfs string) error {
	var err error
	if pfs, err = absPFS(pfs); err != nil {
		return err
	}
	if _, err := s.API(); err != nil {
		return err
	}
	switch typ {
	case model.StageFile:
		if err := mustExist(pfs, "PFS file", wantFile); err != nil {
			return err
		}
		if t.Path != "" {
			if err := mustWriteDir(filepath.Dir(t.Path), "burst buffer directory"); err != nil {
				return err
			}
		}
	case model.StageDir:
		if err := mustExist(pfs, "PFS directory", wantDir); err != nil {
			return err
		}
		if t.Path != "" {
			if err := mustWriteDir(t.Path, "burst buffer directory"); err != nil {
				return err
			}
		}
	default:
		return errorf(syscall.EINVAL, "type %q: expected file or directory", typ)
	}
	return s.send(ctx, []string{t.Info.Token}, []lifecycle.InJobStage{{Direction: model.StageIn, Type: typ, DWVar: t.Info.Var, DWPath: t.Rel, PFSPath: pfs}})
}

// StageInList copies each PFS file into directory dwDir.
func (s *Stager) StageInList(ctx context.Context, dwDir string, pfs []string) error {
	t, err := s.Resolve(ctx, dwDir)
	if err != nil {
		return err
	}
	if err := mustWriteDir(t.Path, "burst buffer directory"); err != nil {
		return err
	}
	if len(pfs) == 0 {
		return errorf(syscall.EINVAL, "the list is empty: name at least one PFS file")
	}
	var tokens []string
	var reqs []lifecycle.InJobStage
	for _, p := range pfs {
		if p, err = absPFS(p); err != nil {
			return err
		}
		if err := mustExist(p, "PFS file", wantFile); err != nil {
			return err
		}
		tokens = append(tokens, t.Info.Token)
		reqs = append(reqs, lifecycle.InJobStage{Direction: model.StageIn, Type: model.StageFile, DWVar: t.Info.Var,
			DWPath: filepath.Join(t.Rel, filepath.Base(p)), PFSPath: p})
	}
	return s.send(ctx, tokens, reqs)
}

// StageOut copies dw to pfs (typ file or directory), when says when; pfs is ignored for
// revoke and activate.
func (s *Stager) StageOut(ctx context.Context, typ, when, dw, pfs string) error {
	t, err := s.Resolve(ctx, dw)
	if err != nil {
		return err
	}
	return s.StageOutTarget(ctx, t, typ, when, pfs)
}

// StageOutTarget copies t to pfs (typ file or directory), when says when. A target without a
// local path (Named) is not checked here: the stage checks it, as the session's user.
func (s *Stager) StageOutTarget(ctx context.Context, t Target, typ, when, pfs string) error {
	if _, err := s.API(); err != nil {
		return err
	}
	req := lifecycle.InJobStage{Direction: model.StageOut, Type: typ, When: when, DWVar: t.Info.Var, DWPath: t.Rel}
	if err := s.checkOut(t, typ, when, pfs, &req); err != nil {
		return err
	}
	return s.send(ctx, []string{t.Info.Token}, []lifecycle.InJobStage{req})
}

func (s *Stager) checkOut(t Target, typ, when, pfs string, req *lifecycle.InJobStage) error {
	switch when {
	case "", lifecycle.WhenImmediate, lifecycle.WhenAtJobEnd:
	case lifecycle.WhenRevoke, lifecycle.WhenActivate:
		return nil // the PFS path is ignored; the file may be gone already
	default:
		return errorf(syscall.EINVAL, "when %q: expected immediate, at_job_end, revoke or activate", when)
	}
	var err error
	if req.PFSPath, err = absPFS(pfs); err != nil {
		return err
	}
	switch typ {
	case model.StageFile:
		if t.Path != "" {
			if err := mustExist(t.Path, "burst buffer file", wantFile); err != nil {
				return err
			}
		}
		if fi, err := os.Stat(req.PFSPath); err == nil && fi.IsDir() {
			return mustWriteDir(req.PFSPath, "PFS directory")
		}
		return mustWriteDir(filepath.Dir(req.PFSPath), "PFS directory")
	case model.StageDir:
		if t.Path != "" {
			if err := mustExist(t.Path, "burst buffer directory", wantDir); err != nil {
				return err
			}
		}
		return mustWriteDir(req.PFSPath, "PFS directory")
	}
	return errorf(syscall.EINVAL, "type %q: expected file or directory", typ)
}

// StageOutList copies each burst buffer file into the existing PFS directory pfsDir.
func (s *Stager) StageOutList(ctx context.Context, when string, dws []string, pfsDir string) error {
	if len(dws) == 0 {
		return errorf(syscall.EINVAL, "the list is empty: name at least one burst buffer file")
	}
	var tokens []string
	var reqs []lifecycle.InJobStage
	for _, dw := range dws {
		t, err := s.Resolve(ctx, dw)
		if err != nil {
			return err
		}
		req := lifecycle.InJobStage{Direction: model.StageOut, Type: model.StageFile, When: when, DWVar: t.Info.Var, DWPath: t.Rel}
		dest := ""
		if when != lifecycle.WhenRevoke && when != lifecycle.WhenActivate {
			if pfsDir, err = absPFS(pfsDir); err != nil {
				return err
			}
			if err := mustWriteDir(pfsDir, "PFS directory"); err != nil {
				return err
			}
			dest = filepath.Join(pfsDir, filepath.Base(t.Path))
		}
		if err := s.checkOut(t, model.StageFile, when, dest, &req); err != nil {
			return err
		}
		tokens, reqs = append(tokens, t.Info.Token), append(reqs, req)
	}
	return s.send(ctx, tokens, reqs)
}

// Query adds up the stage counts of paths. A file (or list entry) that was never staged is
// EINVAL, as in DataWarp; a directory with nothing staged counts zeros.
func (s *Stager) Query(ctx context.Context, paths []string) (lifecycle.InJobCounts, []Found, error) {
	var total lifecycle.InJobCounts
	var all []Found
	if len(paths) == 0 {
		return total, nil, errorf(syscall.EINVAL, "no path given")
	}
	for _, p := range paths {
		t, err := s.Resolve(ctx, p)
		if err != nil {
			return total, nil, err
		}
		fi, statErr := os.Stat(t.Path)
		if statErr != nil && !errors.Is(statErr, os.ErrNotExist) {
			return total, nil, errorf(ErrnoOf(statErr), "%s: %v", p, unwrapPath(statErr))
		}
		reply, err := s.api.QueryJobStages(ctx, t.Info.Token, t.Info.Var, t.Rel)
		if err != nil {
			return total, nil, err
		}
		switch {
		case statErr != nil && len(reply.Stages) == 0:
			// A file a stage-in is creating does not exist yet, and is no error.
			return total, nil, errorf(syscall.ENOENT, "%s does not exist", p)
		case statErr == nil && !fi.IsDir() && len(reply.Stages) == 0:
			return total, nil, errorf(syscall.EINVAL, "%s was never staged", p)
		}
		c := reply.Counts
		total.Complete += c.Complete
		total.Pending += c.Pending
		total.Deferred += c.Deferred
		total.Failed += c.Failed
		for _, st := range reply.Stages {
			all = append(all, Found{StageProgress: st, Path: t.pathOf(st.DWPath)})
		}
	}
	return total, all, nil
}

// Found is a stage and the absolute path of its burst buffer side.
type Found struct {
	lifecycle.StageProgress
	Path string `json:"path"`
}

// pathOf turns a stage's "$VAR/rest" into a path under t's mount.
func (t Target) pathOf(dwPath string) string {
	rest, ok := strings.CutPrefix(dwPath, "$"+t.Info.Var)
	if !ok {
		return dwPath
	}
	return filepath.Join(t.Mount, "/"+strings.TrimPrefix(rest, "/"))
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
	n := 0
	if len(paths) == 0 {
		return 0, errorf(syscall.EINVAL, "no path given")
	}
	for _, p := range paths {
		t, err := s.Resolve(ctx, p)
		if err != nil {
			return n, err
		}
		if _, err := os.Lstat(t.Path); errors.Is(err, os.ErrNotExist) {
			return n, errorf(syscall.ENOENT, "%s does not exist", p)
		}
		k, err := s.api.TerminateJobStages(ctx, t.Info.Token, t.Info.Var, t.Rel)
		if err != nil {
			return n, err
		}
		n += k
	}
	return n, nil
}

// SetConcurrency sets how many of the job's stages may run at once (dw_set_stage_concurrency)
// for the session holding p, which must exist and be readable; it returns the limit the
// controller set (a larger request is clamped to its stage.max_job_concurrency).
func (s *Stager) SetConcurrency(ctx context.Context, p string, n int64) (int, error) {
	if n < 1 {
		return 0, errorf(syscall.EINVAL, "stage concurrency %d: give the number of stages the job may run at once, 1 or more", n)
	}
	n = min(n, 1<<31-1) // the controller clamps it further
	t, err := s.Resolve(ctx, p)
	if err != nil {
		return 0, err
	}
	if err := mustExist(t.Path, "path", wantAny); err != nil {
		return 0, err
	}
	return s.api.SetStageConcurrency(ctx, t.Info.Token, int(n))
}

// Failed lists the failed stages under p (dw_open_failed_stage's walk): each one's burst
// buffer path and the errno its message suggests.
func (s *Stager) Failed(ctx context.Context, p string) ([]Failure, error) {
	t, err := s.Resolve(ctx, p)
	if err != nil {
		return nil, err
	}
	if err := mustExist(t.Path, "path", wantAny); err != nil {
		return nil, err
	}
	reply, err := s.api.QueryJobStages(ctx, t.Info.Token, t.Info.Var, t.Rel)
	if err != nil {
		return nil, err
	}
	out := []Failure{}
	for _, st := range reply.Stages {
		if st.Status == model.StageFailed {
			out = append(out, Failure{Path: t.pathOf(st.DWPath), Errno: -int(errnoOfMessage(st.Error)), Error: st.Error})
		}
	}
	return out, nil
}

// Failure is one failed stage: the burst buffer path, the negative errno, the message.
type Failure struct {
	Path  string `json:"path"`
	Errno int    `json:"errno"`
	Error string `json:"error"`
}

// errnoOfMessage guesses the errno behind a stage's failure from the worker's message.
func errnoOfMessage(msg string) syscall.Errno {
	for _, m := range []struct {
		text  string
		errno syscall.Errno
	}{
		{"permission denied", syscall.EACCES},
		{"no space left", syscall.ENOSPC},
		{"does not exist", syscall.ENOENT},
		{"no such file", syscall.ENOENT},
		{"is a directory", syscall.EISDIR},
		{"not a directory", syscall.ENOTDIR},
		{"read-only file system", syscall.EROFS},
		{"file too large", syscall.EFBIG},
		{"timed out", syscall.ETIMEDOUT},
		{"disk quota", syscall.EDQUOT},
	} {
		if strings.Contains(strings.ToLower(msg), m.text) {
			return m.errno
		}
	}
	return syscall.EIO
}

// Accounting is DataWarp's accounting JSON (dw_get_accounting_data_json, the CLE6.0UP04
// spelling) for the instance holding p: the controller's live record of it (GET
// /dw/v1/instances/{id}/accounting), {"realm": {...}} with the data path's counters per
// server and namespace, the stages' bytes, and Spillway's own fields (docs/libdatawarp.md).
func (s *Stager) Accounting(ctx context.Context, p string) (views.Accounting, error) {
	t, err := s.Resolve(ctx, p)
	if err != nil {
		return views.Accounting{}, err
	}
	return s.api.Accounting(ctx, t.Info.Instance)
}
