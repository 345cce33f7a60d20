package stage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/agentapi"
)

// directivePrefix names the directive a message is about: "stage_in line 4" or "stage_out".
func directivePrefix(spec agentapi.StageSpec) string {
	name := "stage"
	switch spec.Direction {
	case "in":
		name = "stage_in"
	case "out":
		name = "stage_out"
	}
	if spec.Line > 0 {
		return fmt.Sprintf("%s line %d", name, spec.Line)
	}
	return name
}

// errCanceled is what a worker reports when the agent asked it to stop.
var errCanceled = errors.New("canceled")

// reason turns a system error into the words users read: the errno text, with the identity
// staging runs as when the kernel said no, and the fix when there is an obvious one.
func (w *worker) reason(err error) string {
	if errors.Is(err, context.Canceled) || errors.Is(err, errCanceled) {
		return "canceled"
	}
	if errEscapes(err) {
		return "leads outside the instance (through \"..\" or a symbolic link); staging never leaves the instance"
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			return pathErr.Err.Error()
		}
		return err.Error()
	}
	switch errno {
	case syscall.EACCES, syscall.EPERM:
		return fmt.Sprintf("permission denied (staging runs as uid %d)", w.uid)
	case syscall.ELOOP:
		return "too many levels of symbolic links"
	default:
		return errno.Error()
	}
}

// writeReason explains a failed write on side s, where "full" means the instance capacity.
func (w *worker) writeReason(s *side, err error) string {
	var errno syscall.Errno
	if s.dw && errors.As(err, &errno) && (errno == syscall.ENOSPC || errno == syscall.EDQUOT) {
		return errno.Error() + " (the burst buffer instance is full; request a larger capacity)"
	}
	return w.reason(err)
}

// isDestinationErrno reports errors that can only come from the writing side of a copy.
func isDestinationErrno(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG, syscall.EROFS:
		return true
	}
	return false
}

func isPermission(err error) bool {
	return errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)
}

// shorten cuts a message to at most n bytes, saying so.
func shorten(s string, n int) string {
	const mark = " …(shortened)"
	if len(s) <= n {
		return s
	}
	if n <= len(mark) {
		return s[:n]
	}
	return s[:n-len(mark)] + mark
}
