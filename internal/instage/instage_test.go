package instage

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/apiclient"
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
