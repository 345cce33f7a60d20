package stagecall

import (
	"errors"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

func errnoOf(err error) syscall.Errno {
	var e *Error
	if errors.As(err, &e) {
		return e.Errno
	}
	return 0
}

func TestErrnoOfMessage(t *testing.T) {
	for msg, want := range map[string]syscall.Errno{
		"stage_out: cannot create files in /p: permission denied (staging runs as uid 1001)": syscall.EACCES,
		"cannot write /p/x: no space left on device":                                         syscall.ENOSPC,
		"source $DW_JOB_STRIPED/x does not exist":                                            syscall.ENOENT,
		"something else": syscall.EIO,
	} {
		if got := ErrnoOfMessage(msg); got != want {
			t.Errorf("%q: %v, want %v", msg, got, want)
		}
	}
}

// A path outside every Spillway mount is refused without looking for a session.
func TestResolveOutsideEveryMount(t *testing.T) {
	never := func(string) (lifecycle.MountInfo, error) {
		t.Fatal("no session may be looked for a path outside every mount")
		return lifecycle.MountInfo{}, nil
	}
	for _, p := range []Probe{
		{Given: "/etc/passwd", Path: "/etc/passwd"},
		{},
		{Given: "/bbx/a", Path: "/bbx/a", Mount: "/bb"}, // a prefix, not a parent
	} {
		if _, err := Resolve(p, never); errnoOf(err) != syscall.EINVAL {
			t.Errorf("%+v: got %v, want EINVAL", p, err)
		}
	}
	_, err := Resolve(Probe{Given: "x", Path: "/bb/x", Mount: "/bb"}, func(string) (lifecycle.MountInfo, error) { return lifecycle.MountInfo{}, lifecycle.ErrNoSession })
	if errnoOf(err) != syscall.EINVAL {
		t.Errorf("another user's mount: got %v, want EINVAL", err)
	}
	tg, err := Resolve(Probe{Given: "x", Path: "/bb/d/x", Mount: "/bb"}, func(m string) (lifecycle.MountInfo, error) {
		return lifecycle.MountInfo{Var: "DW_JOB_STRIPED"}, nil
	})
	if err != nil || tg.Rel != "/d/x" || tg.Var() != "$DW_JOB_STRIPED/d/x" {
		t.Errorf("got %+v, %v", tg, err)
	}
}

func TestPathOf(t *testing.T) {
	tg := Target{Mount: "/bb/run1_striped_scratch", Info: lifecycle.MountInfo{Var: "DW_JOB_STRIPED"}}
	for in, want := range map[string]string{
		"$DW_JOB_STRIPED/a/b": "/bb/run1_striped_scratch/a/b",
		"$DW_JOB_STRIPED":     "/bb/run1_striped_scratch",
		"$OTHER/a":            "$OTHER/a",
	} {
		if got := tg.PathOf(in); got != want {
			t.Errorf("PathOf(%q) = %q, want %q", in, got, want)
		}
	}
}

// The checks read the caller's own stat(2) and access(2) answers: each documented errno.
func TestChecks(t *testing.T) {
	file := Stat{Kind: KindFile, R: true}
	dir := Stat{Kind: KindDir, R: true, WX: true}
	bb := Target{Path: "/bb/x", Mount: "/bb", Rel: "/x", Info: lifecycle.MountInfo{Var: "DW_JOB_STRIPED"}, Stat: file, Dir: dir}
	noent := Stat{Errno: int(syscall.ENOENT)}
	for _, c := range []struct {
		name string
		err  error
		want syscall.Errno
	}{
		{"in ok", second(In(bb, "file", Probe{Path: "/p/x", Stat: file}, 1)), 0},
		{"in no source", second(In(bb, "file", Probe{Path: "/p/x", Stat: noent}, 1)), syscall.ENOENT},
		{"in unreadable", second(In(bb, "file", Probe{Path: "/p/x", Stat: Stat{Kind: KindFile}}, 1)), syscall.EACCES},
		{"in a directory as a file", second(In(bb, "file", Probe{Path: "/p/x", Stat: dir}, 1)), syscall.EISDIR},
		{"in a file as a directory", second(In(bb, "directory", Probe{Path: "/p/x", Stat: file}, 1)), syscall.ENOTDIR},
		{"in relative", second(In(bb, "file", Probe{Path: "p/x", Stat: file}, 1)), syscall.EINVAL},
		{"in bad type", second(In(bb, "list", Probe{Path: "/p/x", Stat: file}, 1)), syscall.EINVAL},
		{"in unwritable bb dir", second(In(Target{Path: "/bb/x", Dir: Stat{Kind: KindDir, R: true}}, "file", Probe{Path: "/p/x", Stat: file}, 1)), syscall.EACCES},
		{"out ok", second(Out(bb, "file", "", Probe{Path: "/p/x", Stat: noent, Dir: dir}, 1)), 0},
		{"out no pfs dir", second(Out(bb, "file", "", Probe{Path: "/p/x", Stat: noent, Dir: noent}, 1)), syscall.ENOENT},
		{"out unwritable pfs dir", second(Out(bb, "file", "", Probe{Path: "/p/x", Stat: noent, Dir: Stat{Kind: KindDir, R: true}}, 1)), syscall.EACCES},
		{"out no bb file", second(Out(Target{Path: "/bb/x", Stat: noent}, "file", "", Probe{Path: "/p/x", Dir: dir}, 1)), syscall.ENOENT},
		{"out bad when", second(Out(bb, "file", "later", Probe{}, 1)), syscall.EINVAL},
		{"revoke needs no pfs", second(Out(bb, "file", lifecycle.WhenRevoke, Probe{}, 1)), 0},
		{"out no pfs", second(Out(bb, "file", "", Probe{}, 1)), syscall.EINVAL},
		{"list in empty", second(InList(Target{Path: "/bb/d", Stat: dir}, nil, 1)), syscall.EINVAL},
		{"list out empty", second(OutList(nil, "", nil, 1)), syscall.EINVAL},
		{"query never staged", QueryCheck(bb, "x", 0), syscall.EINVAL},
		{"query missing", QueryCheck(Target{Stat: noent}, "x", 0), syscall.ENOENT},
		{"query being created", QueryCheck(Target{Stat: noent}, "x", 1), 0},
		{"query empty directory", QueryCheck(Target{Stat: dir}, "x", 0), 0},
		{"terminate missing", TerminateCheck(Target{Stat: noent}, "x"), syscall.ENOENT},
		{"concurrency 0", second(ConcurrencyCheck(0)), syscall.EINVAL},
	} {
		if got := errnoOf(c.err); got != c.want {
			t.Errorf("%s: %v (%v), want %v", c.name, got, c.err, c.want)
		}
	}
}

func second[T any](_ T, err error) error { return err }
