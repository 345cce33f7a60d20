package runjob

import (
	"context"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Where a run is, for what an interrupt means.
const (
	beforeJob = iota // job_process .. pre_run: the job has not started
	inJob            // the job runs
	afterJob         // post_run, data_out
	releasing        // teardown
)

// interrupts counts SIGINT, SIGTERM and SIGHUP in every phase of a run and turns them into
// three levels, as a DataWarp user expects of scancel and scancel --hurry:
//
//   - the first stops the run gracefully: before the job, the burst buffer is released and the
//     job never starts; during the job, the signal goes to the job, whose stage-out still runs
//     when it ends; after the job, the stage-out goes on (it holds the job's results);
//   - the second hurries: the job is killed, its stage-out skipped or cancelled, the session
//     torn down at once (before the job the first already did that, so the second leaves);
//   - the next one leaves at once; the home's server cleans the session up (Reap).
//
// A signal ignored when spillway started (nohup, a background job of a script) stays ignored.
type interrupts struct {
	mu    sync.Mutex
	n     int
	first syscall.Signal
	stage int
	job   int // process group of the running job, 0 when none
	// leaveFirst: the first interrupt leaves (a retried stage-out: nothing to stop but the
	// waiting, and the home's server finishes what was asked).
	leaveFirst bool

	abort, hurry, leave                   context.Context
	cancelAbort, cancelHurry, cancelLeave context.CancelFunc

	say     func(format string, args ...any)
	leaving func() string // what happens to the session when the run leaves
	ch      chan os.Signal
	done    chan struct{}
	handled chan struct{} // one value per handled signal (the test hook waits on it)
}

func watchSignals(ctx context.Context, say func(string, ...any), leaving func() string) *interrupts {
	in := &interrupts{say: say, leaving: leaving, ch: make(chan os.Signal, 8), done: make(chan struct{}), handled: make(chan struct{}, 16)}
	in.leave, in.cancelLeave = context.WithCancel(ctx)
	in.hurry, in.cancelHurry = context.WithCancel(in.leave)
	in.abort, in.cancelAbort = context.WithCancel(in.hurry)
	wanted := []os.Signal{syscall.SIGPIPE} // a closed pipe on stderr must not kill the run
	for _, s := range []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		if !signal.Ignored(s) {
			wanted = append(wanted, s)
		}
	}
	signal.Notify(in.ch, wanted...)
	go func() {
		for {
			select {
			case s := <-in.ch:
				if sig, ok := s.(syscall.Signal); ok && sig != syscall.SIGPIPE {
					in.handle(sig)
					select {
					case in.handled <- struct{}{}:
					default:
					}
				}
			case <-in.done:
				return
			}
		}
	}()
	return in
}

func (in *interrupts) stop() {
	signal.Stop(in.ch)
	close(in.done)
	in.cancelLeave()
}

func signalName(s syscall.Signal) string {
	names := map[syscall.Signal]string{syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM", syscall.SIGHUP: "SIGHUP", syscall.SIGKILL: "SIGKILL"}
	if n, ok := names[s]; ok {
		return n
	}
	return "signal " + strconv.Itoa(int(s))
}

func (in *interrupts) handle(s syscall.Signal) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.n++
	name := signalName(s)
	if in.n == 1 {
		in.first = s
	}
	switch {
	case in.leaveFirst:
		in.cancelLeave()
		in.say("%s: leaving without waiting; %s", name, in.leaving())
	case in.n == 1:
		in.first = s
		in.cancelAbort()
		switch in.stage {
		case beforeJob:
			in.cancelHurry()
			in.say("%s before the job started: the job will not run; releasing the burst buffer (interrupt again to leave at once)", name)
		case inJob:
			if in.job > 0 {
				syscall.Kill(-in.job, s)
			}
			in.say("%s passed to the job; its stage-out still runs when it ends (interrupt again to kill it and skip the stage-out)", name)
		case afterJob:
			in.say("%s: the stage-out goes on, it holds the job's results (interrupt again to cancel it and discard them)", name)
		case releasing:
			in.cancelHurry()
			in.say("%s: the burst buffer is being released (interrupt again to leave at once)", name)
		}
	case in.n == 2 && (in.stage == inJob || in.stage == afterJob):
		in.cancelHurry()
		if in.stage == inJob {
			if in.job > 0 {
				syscall.Kill(-in.job, syscall.SIGKILL)
			}
			in.say("%s again: hurrying: the job is killed, its stage-out skipped, the burst buffer released (interrupt again to leave at once)", name)
		} else {
			in.say("%s again: hurrying: the stage-out is cancelled and the burst buffer released; the job's results in it are lost (interrupt again to leave at once)", name)
		}
	default:
		in.cancelLeave()
		in.say("%s again: leaving without waiting; %s", name, in.leaving())
	}
}

// count is how many interrupts arrived.
func (in *interrupts) count() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.n
}

// status is the exit status of a run that an interrupt stopped: 128 + the first signal.
func (in *interrupts) status() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return 128 + int(in.first)
}

func (in *interrupts) aborted() bool { return in.abort.Err() != nil }
func (in *interrupts) hurried() bool { return in.hurry.Err() != nil }
func (in *interrupts) left() bool    { return in.leave.Err() != nil }

// enterJob moves to the job phase unless an interrupt came first (then the job must not run).
func (in *interrupts) enterJob() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.n > 0 {
		return false
	}
	in.stage = inJob
	return true
}

// jobStarted records the job's process group; an interrupt that came while it was being
// started reaches it now.
func (in *interrupts) jobStarted(pgid int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.job = pgid
	switch {
	case in.n == 1:
		syscall.Kill(-pgid, in.first)
	case in.n >= 2:
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

func (in *interrupts) jobEnded() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.job, in.stage = 0, afterJob
}

func (in *interrupts) leaveOnFirst() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.leaveFirst = true
}

func (in *interrupts) setStage(stage int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.stage = stage
}

// testSignals is the end-to-end tests' hook: SPILLWAY_TEST_SIGNAL=POINT:SIG[+SIG...][,...]
// makes the run send itself each signal (INT, TERM, HUP, KILL) when it reaches POINT — a real
// signal through the real handler, at an exact point. Points: setup, data_in, pre_run,
// post_run, data_out and teardown right after their request was accepted, job once the job
// runs. Without the variable nothing happens.
var testSignals = parseTestSignals(os.Getenv("SPILLWAY_TEST_SIGNAL"))

func parseTestSignals(v string) map[string][]syscall.Signal {
	if v == "" {
		return nil
	}
	byName := map[string]syscall.Signal{"INT": syscall.SIGINT, "TERM": syscall.SIGTERM, "HUP": syscall.SIGHUP, "KILL": syscall.SIGKILL}
	out := map[string][]syscall.Signal{}
	for _, item := range strings.Split(v, ",") {
		point, sigs, ok := strings.Cut(item, ":")
		if !ok {
			continue
		}
		for _, name := range strings.Split(sigs, "+") {
			if s, ok := byName[name]; ok {
				out[point] = append(out[point], s)
			}
		}
	}
	return out
}

// hit is a point of the run (see testSignals).
func (in *interrupts) hit(point string) {
	for _, s := range testSignals[point] {
		before := in.count()
		syscall.Kill(os.Getpid(), s)
		// Wait until the handler has taken it, so that the run goes on as it would after a
		// signal at this very point.
		deadline := time.After(5 * time.Second)
		for in.count() == before {
			select {
			case <-in.handled:
			case <-deadline:
				return
			}
		}
	}
}
