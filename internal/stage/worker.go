package stage

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"golang.org/x/sys/unix"
)

// workerRequest is the line that starts a stage: a StageSpec (so a bare StageSpec line is a
// valid request) plus the limits the agent runs with and the stage's sequence number.
type workerRequest struct {
	agentapi.StageSpec
	Limits *Limits `json:"limits,omitempty"`
	// Seq numbers the stage among all the agent starts (0: a worker for this stage only, that
	// exits after it). Every line either side writes for the stage carries it, so that no line
	// of one stage is ever taken for another's when the worker serves several (pool.go).
	Seq uint64 `json:"seq,omitempty"`
}

// errAgentGone stops a worker whose agent closed the pipe or stopped reading.
var errAgentGone = errors.New("the agent went away")

// WorkerMain runs stages as the job's user: it takes their identity when args name one
// (identity.go), then for each request it reads from stdin plans, waits for the agent's
// go-ahead, copies, and reports on stdout (see the package comment). A request with a
// sequence number may be followed by another of the same user, once the worker has closed
// the first one's directories and said so in its result ("more"); the end of stdin while it
// waits for one is the agent's "no more". It returns the process exit status: 0 only when
// the last stage completed (or the worker had served stages and was told no more).
func WorkerMain(args []string, stdin io.Reader, stdout io.Writer) int {
	defaults := DefaultLimits()
	out := &emitter{w: stdout, maxLine: defaults.MaxLineBytes, maxWarnings: defaults.MaxWarnings}
	// First of all: the job's user must never reach into this process (/proc/<pid>/fd, mem,
	// ptrace), which will hold the instance's directories (handoff.go).
	if _, err := becomeStageUser(args); err != nil {
		out.failed("stage: " + err.Error())
		return 1
	}
	// Only the parents a stage creates without a source directory are subject to the umask;
	// make them the same (0755) whatever umask the agent runs with.
	unix.Umask(0o022)
	// A vanished agent must turn into a write error the worker handles (remove the partial
	// file, stop), not a silent death by SIGPIPE.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	lines := readLines(bufio.NewReaderSize(stdin, 64<<10), MaxRequestBytes)

	for served := 0; ; served++ {
		var in stdinLine
		var ok bool
		select {
		case in, ok = <-lines:
		case <-ctx.Done():
			if served > 0 {
				return 0 // stopped while idle: nothing to report
			}
			out.failed("stage: canceled before the stage request")
			return 1
		}
		if !ok || in.err != nil {
			if served > 0 && (!ok || errors.Is(in.err, errEndOfInput)) {
				return 0 // the agent has no more stages for this worker
			}
			out.failed("stage: cannot read the stage request: " + lineError(in, ok).Error())
			return 1
		}
		var req workerRequest
		if err := json.Unmarshal(in.line, &req); err != nil {
			out.failed("stage: the stage request is not valid JSON: " + err.Error())
			return 1
		}
		final, fatal := serveStage(ctx, req, lines, out)
		// This stage's directories, files and goroutines are all gone by now: only then may
		// the agent hear that the worker takes another stage.
		final.More = req.Seq != 0 && !fatal && ctx.Err() == nil && !out.isBroken()
		out.send(final)
		status := 1
		if final.Event == eventDone {
			status = 0
		}
		if !final.More {
			return status
		}
	}
}

// stdinLine is one line the worker read, or why it could read no more.
type stdinLine struct {
	line []byte
	err  error
}

// errEndOfInput: the agent closed the worker's stdin.
var errEndOfInput = errors.New("end of input")

func lineError(in stdinLine, ok bool) error {
	if !ok {
		return errEndOfInput
	}
	return in.err
}

// readLines reads stdin one line at a time for whoever waits for one (the next request, the
// answer to a plan, the end of input during a copy); the channel closes after an error.
func readLines(in *bufio.Reader, max int) <-chan stdinLine {
	ch := make(chan stdinLine)
	go func() {
		defer close(ch)
		for {
			line, err := readLine(in, max)
			ch <- stdinLine{line, err}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// serveStage runs the stage req and returns its final event (done or failed), to be sent
// once every resource of the stage is released, and whether the worker must stop after it
// (fatal: stopped, the agent gone, or the agent's side of the protocol not as expected).
func serveStage(procCtx context.Context, req workerRequest, lines <-chan stdinLine, out *emitter) (final event, fatal bool) {
	defaults := DefaultLimits()
	limits := defaults
	if req.Limits != nil {
		limits = req.Limits.WithDefaults()
	}
	prefix := directivePrefix(req.StageSpec)
	out.begin(req.Seq, defaults)
	ctx, cancel := context.WithCancelCause(procCtx)
	defer cancel(nil)
	out.setOnBroken(func() { cancel(errAgentGone) })
	failed := func(err error) event { return event{Event: eventFailed, Error: prefix + ": " + err.Error()} }

	// The directories first, before anything can fail: a worker that takes another stage
	// has taken (and closed, below) exactly this one's.
	fds, err := receiveRoots(req.StageSpec.Roots, req.Seq)
	if err != nil {
		return failed(err), true
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if err := limits.Validate(); err != nil {
		return failed(err), false
	}
	out.begin(req.Seq, limits)

	w, err := newWorker(req.StageSpec, limits, out)
	if err != nil {
		return failed(err), false
	}
	defer w.close()

	stopPlanning := w.reportProgress(ctx, eventPlanning, func() (int64, uint64) { return w.planned.Load(), 0 })
	p, err := w.plan(ctx)
	stopPlanning()
	if err != nil {
		return w.failEvent(ctx, err), ctx.Err() != nil
	}
	out.send(event{Event: eventPlan, Files: p.files, Bytes: p.bytes, Charge: p.charge})

	// Wait for the answer, or a stop: SIGTERM must end a worker even while it waits.
	var in stdinLine
	var ok bool
	select {
	case in, ok = <-lines:
	case <-ctx.Done():
		return w.failEvent(ctx, errCanceled), true
	}
	if !ok || in.err != nil {
		return w.failEvent(ctx, fmt.Errorf("no answer from the agent to the plan: %v", lineError(in, ok))), true
	}
	var answer decision
	if err := json.Unmarshal(in.line, &answer); err != nil {
		return w.failEvent(ctx, fmt.Errorf("the agent's answer to the plan is not valid JSON: %v", err)), true
	}
	switch {
	case answer.Seq != req.Seq:
		return w.failEvent(ctx, fmt.Errorf("the agent's answer to the plan is for stage %d, not %d", answer.Seq, req.Seq)), true
	case answer.Refuse != "":
		return w.failEvent(ctx, fmt.Errorf("not started: %s", answer.Refuse)), false
	case !answer.Go:
		return w.failEvent(ctx, errors.New(`the agent answered the plan with neither "go" nor "refuse"`)), true
	}
	// From here on, the end of stdin means "stop"; so does a line from an agent that serves
	// several stages (it writes nothing before the result), and the worker then stops.
	var stray atomic.Bool
	watchDone, watchStopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchStopped)
		for {
			select {
			case in, ok := <-lines:
				if ok && in.err == nil && req.Seq == 0 {
					continue // a worker of one stage ignores what follows the answer
				}
				if ok && in.err == nil {
					stray.Store(true)
				}
				cancel(errCanceled)
				return
			case <-watchDone:
				return
			}
		}
	}()
	stopProgress := w.reportProgress(ctx, eventProgress, func() (int64, uint64) { return w.filesDone.Load(), w.bytesDone.Load() })
	if w.spec.Part != nil {
		err = w.runPart(ctx, p)
	} else {
		err = w.copy(ctx, p)
	}
	stopProgress()
	close(watchDone)
	<-watchStopped
	stopped := ctx.Err() != nil || stray.Load()
	if err != nil {
		return w.failEvent(ctx, err), stopped
	}
	out.flushWarnings()
	return event{Event: eventDone, Files: w.filesDone.Load(), Bytes: w.bytesDone.Load()}, stopped
}

// readLine reads one line of at most max bytes.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > max {
			return nil, fmt.Errorf("line longer than %d bytes", max)
		}
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return line, nil
		case errors.Is(err, io.EOF):
			return nil, errEndOfInput
		default:
			return nil, err
		}
	}
}

// emitter writes worker events, one line each, never longer than maxLine bytes.
type emitter struct {
	mu          sync.Mutex
	w           io.Writer
	maxLine     int
	maxWarnings int
	warnings    int // sent
	suppressed  int // counted, not sent
	broken      bool
	onBroken    func()
	seq         uint64 // of the stage being served: stamped on every line
}

// begin starts a stage's lines: its sequence number, its limits, no warning counted yet.
func (e *emitter) begin(seq uint64, limits Limits) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq, e.maxLine, e.maxWarnings = seq, limits.MaxLineBytes, limits.MaxWarnings
	e.warnings, e.suppressed = 0, 0
}

func (e *emitter) setOnBroken(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onBroken = f
}

func (e *emitter) isBroken() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.broken
}

func (e *emitter) send(ev event) {
	e.mu.Lock()
	maxLine := e.maxLine
	ev.Seq = e.seq
	e.mu.Unlock()
	budget := maxLine - 256
	var line []byte
	for {
		ev.Message = shorten(ev.Message, budget)
		ev.Error = shorten(ev.Error, budget)
		line, _ = json.Marshal(ev)
		// JSON escaping can grow a message up to six times; shrink until the line fits.
		if len(line) < maxLine || budget < 64 {
			break
		}
		budget /= 2
	}
	line = append(line, '\n')
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.broken {
		return
	}
	if _, err := e.w.Write(line); err != nil {
		e.broken = true
		if e.onBroken != nil {
			e.onBroken()
		}
	}
}

func (e *emitter) warn(message string) {
	e.mu.Lock()
	if e.warnings >= e.maxWarnings {
		e.suppressed++
		e.mu.Unlock()
		return
	}
	e.warnings++
	e.mu.Unlock()
	e.send(event{Event: eventWarning, Message: message})
}

// flushWarnings reports how many warnings were counted but not sent.
func (e *emitter) flushWarnings() {
	e.mu.Lock()
	n := e.suppressed
	e.suppressed = 0
	e.mu.Unlock()
	if n > 0 {
		e.send(event{Event: eventWarning, Message: fmt.Sprintf("%d more warnings not shown (limit stage.max_warnings)", n)})
	}
}

func (e *emitter) failed(message string) {
	e.send(event{Event: eventFailed, Error: message})
}

// worker is one stage in progress inside the worker process.
type worker struct {
	spec     agentapi.StageSpec
	limits   Limits
	out      *emitter
	uid      int
	gid      int
	prefix   string
	parallel int

	pfs     *side
	dwSides map[string]*side

	filesDone atomic.Int64
	bytesDone atomic.Uint64
	planned   atomic.Int64 // entries listed while planning
}

func newWorker(spec agentapi.StageSpec, limits Limits, out *emitter) (*worker, error) {
	w := &worker{
		spec: spec, limits: limits, out: out,
		uid: os.Getuid(), gid: os.Getgid(),
		prefix:  directivePrefix(spec),
		pfs:     pfsSide(),
		dwSides: map[string]*side{},
	}
	// The launcher sets the identity; checking it again here means a misconfigured agent can
	// never make the worker act as someone else, root included.
	if uint32(w.uid) != spec.UID || uint32(os.Geteuid()) != spec.UID {
		return nil, fmt.Errorf("the staging worker runs as uid %d (effective %d) but the stage is for uid %d; refusing to stage on another user's behalf", w.uid, os.Geteuid(), spec.UID)
	}
	if spec.Direction != "in" && spec.Direction != "out" {
		return nil, fmt.Errorf("direction %q is not in or out", spec.Direction)
	}
	if spec.Type != "file" && spec.Type != "directory" && spec.Type != "list" {
		return nil, fmt.Errorf("type %q is not file, directory or list", spec.Type)
	}
	for name, dir := range spec.Roots {
		if !validName(name) {
			return nil, fmt.Errorf("namespace variable %q is not a valid name (letters, digits and _)", name)
		}
		if !filepath.IsAbs(dir) {
			return nil, fmt.Errorf("namespace directory %q of $%s is not an absolute path", dir, name)
		}
	}
	if spec.Part != nil {
		if err := validatePart(spec.Part); err != nil {
			return nil, err
		}
	}
	w.parallel = spec.Parallel
	if w.parallel <= 0 {
		w.parallel = limits.DefaultParallel
	}
	w.parallel = min(w.parallel, limits.MaxParallel)
	return w, nil
}

func (w *worker) close() {
	for _, s := range w.dwSides {
		s.close()
	}
}

// failEvent flushes the warnings and returns the failure of err (or "canceled" when the stop
// came first).
func (w *worker) failEvent(ctx context.Context, err error) event {
	if cause := context.Cause(ctx); cause != nil {
		if errors.Is(cause, errAgentGone) {
			err = errAgentGone
		} else {
			err = errCanceled
		}
	}
	w.out.flushWarnings()
	return event{Event: eventFailed, Error: w.prefix + ": " + err.Error()}
}

// reportProgress sends a line of kind (progress, planning) every ProgressInterval while the
// counters move.
func (w *worker) reportProgress(ctx context.Context, kind string, counters func() (int64, uint64)) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		ticker := time.NewTicker(w.limits.ProgressInterval)
		defer ticker.Stop()
		var lastFiles int64
		var lastBytes uint64
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-ticker.C:
				files, bytes := counters()
				if files != lastFiles || bytes != lastBytes {
					lastFiles, lastBytes = files, bytes
					w.out.send(event{Event: kind, Files: files, Bytes: bytes})
				}
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
