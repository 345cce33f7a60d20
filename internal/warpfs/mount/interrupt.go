package mount

// FUSE tells the mount when the process a request is for gets a signal (FUSE_INTERRUPT), and
// go-fuse then cancels the request's context. A request given up there fails with EINTR, and
// the kernel hands EINTR to the system call: stat(2), read(2), open(2) of a process that
// merely got a signal it handles (a timer, an MPI runtime's or a profiler's signal, SIGCHLD
// with a handler) fail, where on a local file system they never do, restart flag or not. So a
// request stops waiting only when its caller is being killed: the kernel turns every signal
// that will end a process (SIGKILL, and any signal without a handler whose default is to end
// it) into SIGKILL pending on each of its threads, which /proc/<tid>/status shows (SigPnd).
// Anything else is answered normally, and the process's handler runs once the call returns,
// as after a local file system's. A request whose caller dies later is given up then too (the
// kernel interrupts a request once): the mount looks again every interruptPoll while it waits.
// The request's own deadline (Limits.Timeout) still bounds everything.

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// interruptPoll is how often a request interrupted by a signal its caller survives checks
// whether the caller is being killed since.
const interruptPoll = 50 * time.Millisecond

// killableCtx returns ctx (go-fuse's context of a request) without its cancellation, which
// comes back only when the caller is dying; stop ends the watch.
func killableCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	fc, ok := ctx.(*fuse.Context)
	if !ok || fc.Cancel == nil {
		return ctx, func() {}
	}
	tid := int(fc.Pid)
	base, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		if tid <= 0 { // a caller we cannot see (another PID namespace): as it asks
			cancel()
			return
		}
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-base.Done():
				return
			case <-t.C:
			}
			if dying(tid) {
				cancel()
				return
			}
			t.Reset(interruptPoll)
		}
	})
	return base, func() { stop(); cancel() }
}

// dying says whether thread tid is being killed (SIGKILL pending), or is gone.
func dying(tid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return true
	}
	const sigkill = 1 << (9 - 1)
	for line := range strings.Lines(string(b)) {
		for _, field := range []string{"SigPnd:", "ShdPnd:"} {
			if rest, ok := strings.CutPrefix(line, field); ok {
				if mask, err := strconv.ParseUint(strings.TrimSpace(rest), 16, 64); err == nil && mask&sigkill != 0 {
					return true
				}
			}
		}
	}
	return false
}
