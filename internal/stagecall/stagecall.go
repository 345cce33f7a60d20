// Package stagecall is in-job staging's one decision code (DataWarp's stage API, issue 12;
// one endpoint for every client, issue 23): what a client knows about the paths it names
// (a Probe: the path, the Spillway mount holding it, and what stat(2) and access(2) said
// about it and its directory, asked as the calling user) goes to the controller in a Call
// (POST /dw/v1/job_stages), which resolves the mount to the caller's session and variable,
// makes the checks below and records, queries or stops the stages. libdatawarp (C) and
// `dwcli stage` (Go) send the same Call, so the two cannot drift.
//
// The checks are the calling user's own: the client makes the syscalls as that user and the
// controller only reads their answers; a client that lies about them gains nothing, since
// every stage worker runs as the session's user and meets the same permissions when it
// copies. The package is pure: no I/O.
package stagecall

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// Verbs of a Call.
const (
	VerbIn          = "in"
	VerbOut         = "out"
	VerbQuery       = "query"
	VerbTerminate   = "terminate"
	VerbFailed      = "failed" // dw_open_failed_stage's walk
	VerbAccounting  = "accounting"
	VerbConcurrency = "concurrency"
)

// Stat is what stat(2) and access(2) said of a path, asked as the calling user.
type Stat struct {
	Errno int    `json:"errno,omitempty"` // stat(2)'s (following links); 0: it exists
	Kind  string `json:"kind,omitempty"`  // file, dir or other, when it exists
	R     bool   `json:"r,omitempty"`     // access(R_OK) succeeded
	WX    bool   `json:"wx,omitempty"`    // access(W_OK|X_OK) succeeded
}

// Kinds of Stat.
const (
	KindFile  = "file"
	KindDir   = "dir"
	KindOther = "other"
)

// Probe is one path of a Call as the client found it.
type Probe struct {
	Given string `json:"given,omitempty"` // as the caller named it, for messages ("" = Path)
	Path  string `json:"path"`            // absolute; a burst buffer path has its links resolved
	Mount string `json:"mount,omitempty"` // burst buffer paths: the longest fuse.spillway mount point holding Path ("" none)
	Stat  Stat   `json:"stat"`
	Dir   Stat   `json:"dir,omitzero"` // Path's directory's (sent where a check reads it)
}

// Named is the name of the path in messages: as the caller named it.
func (p Probe) Named() string {
	if p.Given != "" {
		return p.Given
	}
	return p.Path
}

// Call is the body of POST /dw/v1/job_stages.
type Call struct {
	Verb string `json:"verb"`
	Type string `json:"type,omitempty"` // in, out: file, directory or list
	When string `json:"when,omitempty"` // out: immediate (default), at_job_end, revoke, activate
	// DW are the burst buffer paths: in: the file or directory (list: the directory); out:
	// the file or directory, or the list's files; the others: the paths asked about.
	DW []Probe `json:"dw"`
	// PFS are the PFS paths: in: the source (list: the files); out: the destination; out
	// --type list: the directory, then for each DW file its destination in it (the
	// directory joined with the base name of the file's Path; its Dir is the directory's,
	// and need not be sent).
	PFS         []Probe `json:"pfs,omitempty"`
	Concurrency int64   `json:"concurrency,omitempty"`
}

// Found is a stage and the absolute path of its burst buffer side.
type Found struct {
	lifecycle.StageProgress
	Path string `json:"path"`
}

// Failure is one failed stage: the burst buffer path, the negative errno, the message.
type Failure struct {
	Path  string `json:"path"`
	Errno int    `json:"errno"`
	Error string `json:"error"`
}

// Error is a failure with the errno libdatawarp returns for it.
type Error struct {
	Errno syscall.Errno
	Msg   string
}

func (e *Error) Error() string { return e.Msg }

// Errorf is an Error.
func Errorf(errno syscall.Errno, format string, args ...any) error {
	return &Error{Errno: errno, Msg: fmt.Sprintf(format, args...)}
}

// ErrnoOfKind is the errno of a controller's kind of error answer: busy EBUSY, user EINVAL,
// too_large E2BIG (a list over stage.max_paths_per_request), not_found ENOENT, forbidden and
// unauthorized EACCES; EIO for the rest (an internal error).
func ErrnoOfKind(kind string) syscall.Errno {
	switch kind {
	case "busy":
		return syscall.EBUSY
	case "user":
		return syscall.EINVAL
	case "too_large":
		return syscall.E2BIG
	case "not_found":
		return syscall.ENOENT
	case "forbidden", "unauthorized":
		return syscall.EACCES
	}
	return syscall.EIO
}

// Target is a burst buffer path resolved to the caller's session.
type Target struct {
	Path  string // absolute, links resolved ("" for DataWarp's named form: no local path)
	Mount string // the mount point
	Rel   string // inside the namespace, starting with "/"
	Info  lifecycle.MountInfo
	Stat  Stat // of Path
	Dir   Stat // of Path's directory
}

// Var is the target as a DW path: "$DW_JOB_STRIPED/rel".
func (t Target) Var() string { return "$" + t.Info.Var + t.Rel }

// PathOf turns a stage's "$VAR/rest" into a path under t's mount.
func (t Target) PathOf(dwPath string) string {
	rest, ok := strings.CutPrefix(dwPath, "$"+t.Info.Var)
	if !ok {
		return dwPath
	}
	return path.Join(t.Mount, "/"+strings.TrimPrefix(rest, "/"))
}

// Locator says what burst buffer of the caller's is mounted at a mount point: lifecycle's
// MountInfo, or an error (lifecycle.ErrNoSession: none of the caller's).
type Locator func(mount string) (lifecycle.MountInfo, error)

// Resolve finds the session and variable of a probed burst buffer path.
func Resolve(p Probe, locate Locator) (Target, error) {
	if p.Path == "" {
		return Target{}, Errorf(syscall.EINVAL, "empty path: give a path under a burst buffer mount ($DW_JOB_STRIPED/...)")
	}
	abs := path.Clean(p.Path)
	m := path.Clean(p.Mount)
	rel, ok := strings.CutPrefix(abs, m)
	if p.Mount == "" || !path.IsAbs(abs) || !ok || rel != "" && !strings.HasPrefix(rel, "/") {
		return Target{}, Errorf(syscall.EINVAL, "%s is not in a burst buffer: give a path under $DW_JOB_STRIPED or another of the job's burst buffer mounts", p.Named())
	}
	if rel == "" {
		rel = "/"
	}
	info, err := locate(m)
	if err != nil {
		if errors.Is(err, lifecycle.ErrNoSession) {
			return Target{}, Errorf(syscall.EINVAL, "%s is in %s, a burst buffer mount that is not one of your jobs' (the controller knows no session of yours mounted there)", p.Named(), m)
		}
		return Target{}, err
	}
	return Target{Path: abs, Mount: m, Rel: path.Clean(rel), Info: info, Stat: p.Stat, Dir: p.Dir}, nil
}

// kind of a file the caller must name.
const (
	wantFile = iota
	wantDir
	wantAny
)

// mustExist checks that p exists (ENOENT), has the kind asked (EISDIR, ENOTDIR) and is
// readable by the caller (EACCES).
func mustExist(p string, st Stat, role string, kind int, uid uint32) error {
	if st.Errno != 0 {
		if syscall.Errno(st.Errno) == syscall.ENOENT {
			return Errorf(syscall.ENOENT, "%s %s does not exist", role, p)
		}
		return Errorf(syscall.Errno(st.Errno), "%s %s: %v", role, p, syscall.Errno(st.Errno))
	}
	switch {
	case kind == wantFile && st.Kind == KindDir:
		return Errorf(syscall.EISDIR, "%s %s is a directory; stage it as a directory (dw_stage_directory_*, dwcli stage --type directory)", role, p)
	case kind == wantFile && st.Kind != KindFile:
		return Errorf(syscall.EINVAL, "%s %s is not a regular file; only regular files are staged", role, p)
	case kind == wantDir && st.Kind != KindDir:
		return Errorf(syscall.ENOTDIR, "%s %s is not a directory", role, p)
	}
	if !st.R {
		return Errorf(syscall.EACCES, "%s %s: you may not read it (staging runs as you, uid %d)", role, p, uid)
	}
	return nil
}

// mustWriteDir checks that directory d exists and the caller may create files in it.
func mustWriteDir(d string, st Stat, role string, uid uint32) error {
	if err := mustExist(d, st, role, wantDir, uid); err != nil {
		var e *Error
		if errors.As(err, &e) && e.Errno == syscall.ENOENT {
			return Errorf(syscall.ENOENT, "%s %s does not exist; create it first", role, d)
		}
		return err
	}
	if !st.WX {
		return Errorf(syscall.EACCES, "cannot create files in %s %s: permission denied (staging runs as you, uid %d); choose a directory you may write", role, d, uid)
	}
	return nil
}

func absPFS(p Probe) (string, error) {
	if p.Path == "" {
		return "", Errorf(syscall.EINVAL, "no PFS path given")
	}
	if !path.IsAbs(p.Path) {
		return "", Errorf(syscall.EINVAL, "PFS path %s: not absolute", p.Path)
	}
	return path.Clean(p.Path), nil
}

// In is the stage-in of pfs into t now (typ file or directory). A target without a local
// path (DataWarp's named form) is not checked here: the stage checks it, as the session's
// user.
func In(t Target, typ string, pfs Probe, uid uint32) (lifecycle.InJobStage, error) {
	src, err := absPFS(pfs)
	if err != nil {
		return lifecycle.InJobStage{}, err
	}
	switch typ {
	case "file":
		if err := mustExist(src, pfs.Stat, "PFS file", wantFile, uid); err != nil {
			return lifecycle.InJobStage{}, err
		}
		if t.Path != "" {
			if err := mustWriteDir(path.Dir(t.Path), t.Dir, "burst buffer directory", uid); err != nil {
				return lifecycle.InJobStage{}, err
			}
		}
	case "directory":
		if err := mustExist(src, pfs.Stat, "PFS directory", wantDir, uid); err != nil {
			return lifecycle.InJobStage{}, err
		}
		if t.Path != "" {
			if err := mustWriteDir(t.Path, t.Stat, "burst buffer directory", uid); err != nil {
				return lifecycle.InJobStage{}, err
			}
		}
	default:
		return lifecycle.InJobStage{}, Errorf(syscall.EINVAL, "type %q: expected file or directory", typ)
	}
	return lifecycle.InJobStage{Direction: "in", Type: typ, DWVar: t.Info.Var, DWPath: t.Rel, PFSPath: src}, nil
}

// InList is the stage-in of each PFS file into directory t.
func InList(t Target, pfs []Probe, uid uint32) ([]lifecycle.InJobStage, error) {
	if err := mustWriteDir(t.Path, t.Stat, "burst buffer directory", uid); err != nil {
		return nil, err
	}
	if len(pfs) == 0 {
		return nil, Errorf(syscall.EINVAL, "the list is empty: name at least one PFS file")
	}
	reqs := make([]lifecycle.InJobStage, 0, len(pfs))
	for _, p := range pfs {
		src, err := absPFS(p)
		if err != nil {
			return nil, err
		}
		if err := mustExist(src, p.Stat, "PFS file", wantFile, uid); err != nil {
			return nil, err
		}
		reqs = append(reqs, lifecycle.InJobStage{Direction: "in", Type: "file", DWVar: t.Info.Var,
			DWPath: path.Join(t.Rel, path.Base(src)), PFSPath: src})
	}
	return reqs, nil
}

// Out is the stage-out of t to pfs (typ file or directory), when says when; pfs is ignored
// for revoke and activate. A target without a local path is not checked here (as In).
func Out(t Target, typ, when string, pfs Probe, uid uint32) (lifecycle.InJobStage, error) {
	req := lifecycle.InJobStage{Direction: "out", Type: typ, When: when, DWVar: t.Info.Var, DWPath: t.Rel}
	switch when {
	case "", lifecycle.WhenImmediate, lifecycle.WhenAtJobEnd:
	case lifecycle.WhenRevoke, lifecycle.WhenActivate:
		return req, nil // the PFS path is ignored; the file may be gone already
	default:
		return req, Errorf(syscall.EINVAL, "when %q: expected immediate, at_job_end, revoke or activate", when)
	}
	var err error
	if req.PFSPath, err = absPFS(pfs); err != nil {
		return req, err
	}
	switch typ {
	case "file":
		if t.Path != "" {
			if err := mustExist(t.Path, t.Stat, "burst buffer file", wantFile, uid); err != nil {
				return req, err
			}
		}
		if pfs.Stat.Errno == 0 && pfs.Stat.Kind == KindDir {
			return req, mustWriteDir(req.PFSPath, pfs.Stat, "PFS directory", uid)
		}
		return req, mustWriteDir(path.Dir(req.PFSPath), pfs.Dir, "PFS directory", uid)
	case "directory":
		if t.Path != "" {
			if err := mustExist(t.Path, t.Stat, "burst buffer directory", wantDir, uid); err != nil {
				return req, err
			}
		}
		return req, mustWriteDir(req.PFSPath, pfs.Stat, "PFS directory", uid)
	}
	return req, Errorf(syscall.EINVAL, "type %q: expected file or directory", typ)
}

// OutList is the stage-out of each target file into the existing PFS directory pfs[0]; pfs[1+i]
// is ts[i]'s destination in it (ignored, with the directory, for revoke and activate).
func OutList(ts []Target, when string, pfs []Probe, uid uint32) ([]lifecycle.InJobStage, error) {
	if len(ts) == 0 {
		return nil, Errorf(syscall.EINVAL, "the list is empty: name at least one burst buffer file")
	}
	reqs := make([]lifecycle.InJobStage, 0, len(ts))
	for i, t := range ts {
		dest := Probe{}
		if when != lifecycle.WhenRevoke && when != lifecycle.WhenActivate {
			if len(pfs) != len(ts)+1 {
				return nil, Errorf(syscall.EINVAL, "out --type list: give the PFS directory and, for each burst buffer file, its destination in it")
			}
			dir, err := absPFS(pfs[0])
			if err != nil {
				return nil, err
			}
			if err := mustWriteDir(dir, pfs[0].Stat, "PFS directory", uid); err != nil {
				return nil, err
			}
			dest = pfs[1+i]
			dest.Path = path.Join(dir, path.Base(t.Path)) // the name is the controller's to make
			dest.Dir = pfs[0].Stat
		}
		req, err := Out(t, "file", when, dest, uid)
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, req)
	}
	return reqs, nil
}

// QueryCheck decides a query of t once its stages are known: a path that does not exist and
// has no stage is ENOENT (a file a stage-in is creating does not exist yet, and is no
// error); a file never staged is EINVAL, as in DataWarp; a directory with nothing staged
// counts zeros.
func QueryCheck(t Target, given string, stages int) error {
	st := t.Stat
	exists := st.Errno == 0
	if !exists && syscall.Errno(st.Errno) != syscall.ENOENT {
		return Errorf(syscall.Errno(st.Errno), "%s: %v", given, syscall.Errno(st.Errno))
	}
	switch {
	case !exists && stages == 0:
		return Errorf(syscall.ENOENT, "%s does not exist", given)
	case exists && st.Kind != KindDir && stages == 0:
		return Errorf(syscall.EINVAL, "%s was never staged", given)
	}
	return nil
}

// TerminateCheck: the path must exist.
func TerminateCheck(t Target, given string) error {
	if syscall.Errno(t.Stat.Errno) == syscall.ENOENT {
		return Errorf(syscall.ENOENT, "%s does not exist", given)
	}
	return nil
}

// ExistCheck: a path a call names as a whole (concurrency, the failed-stage walk) must exist
// and be readable.
func ExistCheck(t Target, uid uint32) error { return mustExist(t.Path, t.Stat, "path", wantAny, uid) }

// ConcurrencyCheck: a job runs at least one stage at a time; the controller clamps the rest.
func ConcurrencyCheck(n int64) (int, error) {
	if n < 1 {
		return 0, Errorf(syscall.EINVAL, "stage concurrency %d: give the number of stages the job may run at once, 1 or more", n)
	}
	return int(min(n, 1<<31-1)), nil
}

// ErrnoOfMessage guesses the errno behind a stage's failure from the worker's message.
func ErrnoOfMessage(msg string) syscall.Errno {
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
