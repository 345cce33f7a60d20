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

// workerRequest is the first line the worker reads: a StageSpec (so a bare StageSpec line is a
// valid request) plus the limits the agent runs with.
type workerRequest struct {
	agentapi.StageSpec
	Limits *Limits `json:"limits,omitempty"`
}

// errAgentGone stops a worker whose agent closed the pipe or stopped reading.
var errAgentGone = errors.New("the agent went away")

// WorkerMain runs one stage as the job's user: it takes their identity when args name one
// (identity.go), reads the request from stdin, plans, waits for the agent's go-ahead, copies,
// and reports on stdout (see the package comment). It returns the process exit status: 0
// only when the stage completed.
func WorkerMain(args []string, stdin io.Reader, stdout io.Writer) int {
	defaults := DefaultLimits()
	out := &emitter{w: stdout, maxLine: defaults.MaxLineBytes, maxWarnings: defaults.MaxWarnings}
	// First of all: the job's user must never reach into this process (/proc/<pid>/fd, mem,
	// ptrace), which will hold the instance's directories (handoff.go).
	if _, err := becomeStageUser(args); err != nil {
		out.failed("stage: " + err.Error())
		return 1
	}
	in := bufio.NewReaderSize(stdin, 64<<10)

	line, err := readLine(in, MaxRequestBytes)
	if err != nil {
		out.failed("stage: cannot read the stage request: " + err.Error())
		return 1
	}
	var req workerRequest
	if err := json.Unmarshal(line, &req); err != nil {
		out.failed("stage: the stage request is not valid JSON: " + err.Error())
		return 1
	}
	limits := defaults
	if req.Limits != nil {
		limits = req.Limits.WithDefaults()
	}
	prefix := directivePrefix(req.StageSpec)
	if err := limits.Validate(); err != nil {
		out.failed(prefix + ": " + err.Error())
		return 1
	}
	out.maxLine, out.maxWarnings = limits.MaxLineBytes, limits.MaxWarnings

	// Only the parents a stage creates without a source directory are subject to the umask;
	// make them the same (0755) whatever umask the agent runs with.
	unix.Umask(0o022)
	// A vanished agent must turn into a write error the worker handles (remove the partial
	// file, stop), not a silent death by SIGPIPE.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stopSignals := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopSignals()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	out.onBroken = func() { cancel(errAgentGone) }

	if err := receiveRoots(req.StageSpec.Roots); err != nil {
		out.failed(prefix + ": " + err.Error())
		return 1
	}
	w, err := newWorker(req.StageSpec, limits, out)
	if err != nil {
		out.failed(prefix + ": " + err.Error())
		return 1
	}
	defer w.close()

	stopPlanning := w.reportProgress(ctx, eventPlanning, func() (int64, uint64) { return w.planned.Load(), 0 })
	p, err := w.plan(ctx)
	stopPlanning()
	if err != nil {
		return w.fail(ctx, err)
	}
	out.send(event{Event: eventPlan, Files: p.files, Bytes: p.bytes, Charge: p.charge})

	// Wait for the answer, or a stop: SIGTERM must end a worker even while it waits.
	type reply struct {
		line []byte
		err  error
	}
	replies := make(chan reply, 1)
	go func() {
		line, err := readLine(in, MaxRequestBytes)
		replies <- reply{line, err}
	}()
	select {
	case r := <-replies:
		line, err = r.line, r.err
	case <-ctx.Done():
		return w.fail(ctx, errCanceled)
	}
	if err != nil {
		return w.fail(ctx, fmt.Errorf("no answer from the agent to the plan: %v", err))
	}
	var answer decision
	if err := json.Unmarshal(line, &answer); err != nil {
		return w.fail(ctx, fmt.Errorf("the agent's answer to the plan is not valid JSON: %v", err))
	}
	switch {
	case answer.Refuse != "":
		return w.fail(ctx, fmt.Errorf("not started: %s", answer.Refuse))
	case !answer.Go:
		return w.fail(ctx, errors.New(`the agent answered the plan with neither "go" nor "refuse"`))
	}
	// From here on, the end of stdin means "stop".
	go func() {
		io.Copy(io.Discard, in)
		cancel(errCanceled)
	}()

	stopProgress := w.reportProgress(ctx, eventProgress, func() (int64, uint64) { return w.filesDone.Load(), w.bytesDone.Load() })
	if w.spec.Part != nil {
		err = w.runPart(ctx, p)
	} else {
		err = w.copy(ctx, p)
	}
	stopProgress()
	if err != nil {
		return w.fail(ctx, err)
	}
	out.flushWarnings()
	out.send(event{Event: eventDone, Files: w.filesDone.Load(), Bytes: w.bytesDone.Load()})
	return 0
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
			return nil, errors.New("end of input")
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
}

func (e *emitter) send(ev event) {
	budget := e.maxLine - 256
	var line []byte
	for {
		ev.Message = shorten(ev.Message, budget)
		ev.Error = shorten(ev.Error, budget)
		line, _ = json.Marshal(ev)
		// JSON escaping can grow a message up to six times; shrink until the line fits.
		if len(line) < e.maxLine || budget < 64 {
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

// fail reports err (or "canceled" when the stop came first) and returns the exit status.
func (w *worker) fail(ctx context.Context, err error) int {
	if cause := context.Cause(ctx); cause != nil {
		if errors.Is(cause, errAgentGone) {
			err = errAgentGone
		} else {
			err = errCanceled
		}
	}
	w.out.flushWarnings()
	w.out.failed(w.prefix + ": " + err.Error())
	return 1
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
