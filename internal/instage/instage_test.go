package instage

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

func TestErrnoOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		want syscall.Errno
	}{
		{nil, 0},
		{errorf(syscall.ENOENT, "x"), syscall.ENOENT},
		{fmt.Errorf("wrapped: %w", errorf(syscall.EACCES, "x")), syscall.EACCES},
		{&apiclient.Error{Kind: "busy"}, syscall.EBUSY},
		{&apiclient.Error{Kind: "user"}, syscall.EINVAL},
		{&apiclient.Error{Kind: "too_large"}, syscall.E2BIG},
		{&apiclient.Error{Kind: "not_found"}, syscall.ENOENT},
		{&apiclient.Error{Kind: "forbidden"}, syscall.EACCES},
		{&apiclient.Error{Kind: "internal"}, syscall.EIO},
		{errors.New("controller unreachable"), syscall.EIO},
	} {
		if got := ErrnoOf(c.err); got != c.want {
			t.Errorf("ErrnoOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestErrnoOfMessage(t *testing.T) {
	for msg, want := range map[string]syscall.Errno{
		"stage_out: cannot create files in /p: permission denied (staging runs as uid 1001)": syscall.EACCES,
		"cannot write /p/x: no space left on device":                                         syscall.ENOSPC,
		"source $DW_JOB_STRIPED/x does not exist":                                            syscall.ENOENT,
		"something else": syscall.EIO,
	} {
		if got := errnoOfMessage(msg); got != want {
			t.Errorf("%q: %v, want %v", msg, got, want)
		}
	}
}

// A path outside every Spillway mount is refused without reaching a controller.
func TestResolveOutsideEveryMount(t *testing.T) {
	s := &Stager{Dial: func() (*apiclient.Client, error) {
		t.Fatal("no controller may be asked about a path outside every mount")
		return nil, nil
	}}
	_, err := s.Resolve(context.Background(), "/etc/passwd")
	if ErrnoOf(err) != syscall.EINVAL {
		t.Fatalf("got %v (%v), want EINVAL", err, ErrnoOf(err))
	}
	if _, err := s.Resolve(context.Background(), ""); ErrnoOf(err) != syscall.EINVAL {
		t.Fatalf("empty path: %v", err)
	}
}

func TestPathOf(t *testing.T) {
	tg := Target{Mount: "/bb/run1_striped_scratch", Info: lifecycle.MountInfo{Var: "DW_JOB_STRIPED"}}
	for in, want := range map[string]string{
		"$DW_JOB_STRIPED/a/b": "/bb/run1_striped_scratch/a/b",
		"$DW_JOB_STRIPED":     "/bb/run1_striped_scratch",
		"$OTHER/a":            "$OTHER/a",
	} {
		if got := tg.pathOf(in); got != want {
			t.Errorf("pathOf(%q) = %q, want %q", in, got, want)
		}
	}
}
