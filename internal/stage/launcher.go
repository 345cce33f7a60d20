package stage

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/asuser"
	"github.com/spillway-hpc/spillway/internal/privdrop"
	"github.com/spillway-hpc/spillway/internal/units"
	"golang.org/x/sys/unix"
)

// Why a run was stopped from the agent side.
const (
	stopCanceled = "canceled"
	stopTimeout  = "timeout"
	stopStalled  = "stalled"
	stopProtocol = "protocol"
)

// Run is one stage running in a worker process. Its methods are safe for concurrent use.
type Run struct {
	spec   agentapi.StageSpec
	limits Limits
	prefix string

	mu         sync.Mutex
	status     agentapi.StageStatus
	warnings   []string
	dropped    int    // warnings beyond MaxWarnings
	stopReason string // set once, by stop
	refused    error  // the reserve function's answer
	protoErr   error
	lastSign   time.Time // the worker's last planning, plan, progress or warning line
	abandoned  bool      // killed, and still not gone CancelGrace later: the run ended without it
	ended      bool      // the worker was reaped, or is back in the pool: nothing more to signal

	proc  *proc  // the worker serving the stage
	seq   uint64 // the stage's sequence number (workerRequest.Seq)
	fresh bool   // proc was started for this stage

	// The handoff of the stage's directories (handoff.go): handed once they are, handoffDone
	// closed when handOver returned; handoffMu orders the two with the wake-up of a handOver
	// still waiting when the stage ends.
	handoffMu   sync.Mutex
	handed      bool
	handoffDone chan struct{}

	cancelCh chan struct{}
	cancel   sync.Once
	done     chan struct{}
	doneOnce sync.Once
}

// Worker processes of this agent: alive (started, not yet reaped) and, of those, stuck
// (killed with SIGKILL and still not gone CancelGrace later). A process blocked in the kernel
// on a request to a FUSE file system whose server does not answer (a user's own server they
// stopped) cannot die before the server answers or the connection is aborted; the run it
// served has ended without it.
var workersAlive, workersStuck atomic.Int64

// WorkerProcesses returns the worker processes alive on this host and, of them, those stuck
// after SIGKILL (metrics: spillway_agent_stage_worker_processes, _stage_workers_stuck).
func WorkerProcesses() (alive, stuck int64) { return workersAlive.Load(), workersStuck.Load() }

// finish marks the run ended (once).
func (r *Run) finish() { r.doneOnce.Do(func() { close(r.done) }) }

// nextSeq numbers the stages of this process (workerRequest.Seq).
var nextSeq atomic.Uint64

// Start runs spec in a worker process and returns at once; the stage's fate is read with
// Status, Wait or Done. exe is the worker's argv prefix, e.g. {"/proc/self/exe",
// "stage-worker"}; it must be executable by the stage's user. The worker is one that ended a
// stage of the same credential cleanly and waits for another (pool.go), or a new one.
//
// When the agent runs as root the worker gets the stage's uid, gid and the uid's supplementary
// groups (from the user database); otherwise the agent may only stage for its own uid.
//
// reserve is called once with the planned byte count (what the files will take on disk, in
// whole blocks, with their directories: usage.Footprint), before any byte is written, for either
// direction; an error refuses the stage (status failed, nothing written). A nil reserve
// accepts every plan.
//
// ctx bounds the whole run: canceling it cancels the stage. Pass a context that lives as long
// as the agent, not one of a single request.
func Start(ctx context.Context, exe []string, spec agentapi.StageSpec, limits Limits, reserve func(bytes uint64) error) *Run {
	r := &Run{
		spec:        spec,
		limits:      limits.WithDefaults(),
		prefix:      directivePrefix(spec),
		status:      agentapi.StageStatus{ID: spec.ID, Known: true, Status: "running"},
		cancelCh:    make(chan struct{}),
		done:        make(chan struct{}),
		handoffDone: make(chan struct{}),
	}
	if err := limits.Validate(); err != nil {
		r.finishEarly(err)
		return r
	}
	if len(exe) == 0 || exe[0] == "" {
		r.finishEarly(errors.New("no staging worker program configured"))
		return r
	}
	credential, err := workerCredential(spec, os.Getuid(), r.limits.AllowRoot, userGroups)
	if err != nil {
		r.finishEarly(err)
		return r
	}
	workerSpec, rootFiles, err := openRoots(spec)
	if err != nil {
		r.finishEarly(err)
		return r
	}
	r.seq = nextSeq.Add(1)
	request, err := json.Marshal(workerRequest{StageSpec: workerSpec, Limits: &r.limits, Seq: r.seq})
	if err != nil {
		closeAll(rootFiles)
		r.finishEarly(fmt.Errorf("cannot encode the stage request: %v", err))
		return r
	}

	// A worker for another user starts as root and takes the user's identity itself, once it
	// is non-dumpable (package asuser): started as the user, it could be traced before that.
	var id *privdrop.Identity
	if credential != nil {
		id = &privdrop.Identity{UID: credential.Uid, GID: credential.Gid, Groups: credential.Groups}
	}
	key := poolKey(exe, id, r.limits.Nice)
	p := pool.take(key)
	if p == nil {
		if p, err = spawn(exe, id, r.limits, key); err != nil {
			closeAll(rootFiles)
			r.finishEarly(fmt.Errorf("cannot start the staging worker %s as uid %d: %v", exe[0], spec.UID, err))
			return r
		}
		r.fresh = true
	}
	p.served++
	r.mu.Lock()
	r.proc, r.lastSign = p, time.Now()
	r.mu.Unlock()
	if len(rootFiles) == 0 {
		r.handed = true
		close(r.handoffDone)
	} else {
		// A stage before may have stopped its own wait on this socket (its deadline).
		p.handoff.SetReadDeadline(time.Time{})
		go r.handOff(rootFiles)
	}
	// Written aside so that a large request never blocks supervise; a worker that dies before
	// reading it is noticed by its output ending.
	go p.stdin.Write(append(request, '\n'))
	go r.watch(ctx)
	go r.supervise(reserve)
	return r
}

// handOff gives the worker the stage's directories when it asks for them, and closes the
// agent's copies. A worker that never asks is not waited for past the stage's end.
func (r *Run) handOff(rootFiles []*os.File) {
	defer closeAll(rootFiles)
	go func() {
		select {
		case <-r.done:
			r.stopHandoff()
		case <-r.handoffDone:
		}
	}()
	err := handOver(r.proc.handoff, r.proc.pid, r.spec.UID, r.seq, rootFiles)
	r.handoffMu.Lock()
	r.handed = err == nil
	r.handoffMu.Unlock()
	close(r.handoffDone)
	if err != nil && !errors.Is(err, asuser.ErrNotAsked) {
		r.mu.Lock()
		if r.protoErr == nil {
			r.protoErr = err
		}
		r.mu.Unlock()
		r.stop(stopProtocol)
	}
}

// stopHandoff wakes a handOver still waiting for the worker to ask, without closing the socket.
func (r *Run) stopHandoff() {
	r.handoffMu.Lock()
	defer r.handoffMu.Unlock()
	if !r.handed {
		r.proc.handoff.SetReadDeadline(time.Now())
	}
}

// handedOver says, once the stage's result is in, whether the worker took exactly this
// stage's directories (or there were none): only then may it serve another stage.
func (r *Run) handedOver() bool {
	select {
	case <-r.handoffDone:
	default:
		r.stopHandoff()
		<-r.handoffDone
	}
	r.handoffMu.Lock()
	defer r.handoffMu.Unlock()
	return r.handed
}

// openRoots opens the stage's namespace directories for the worker, which receives them once
// it cannot be inspected any more (handoff.go) and reaches them as /proc/self/fd/N: the SSD
// tree above them is the agent's alone, so that users reach their files only through mounts
// (which count capacity and keep loadbalance read-only) and through stages — never by path.
func openRoots(spec agentapi.StageSpec) (agentapi.StageSpec, []*os.File, error) {
	names := make([]string, 0, len(spec.Roots))
	for name := range spec.Roots {
		names = append(names, name)
	}
	sort.Strings(names)
	out := spec
	out.Roots = map[string]string{}
	var files []*os.File
	for i, name := range names {
		f, err := os.OpenFile(spec.Roots[name], os.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			closeAll(files)
			return spec, nil, fmt.Errorf("cannot open the burst buffer $%s on this node: %v", name, err)
		}
		files = append(files, f)
		out.Roots[name] = fmt.Sprintf("%s%d", handoffRoot, i)
	}
	return out, files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// workerCredential decides the identity of the worker. agentUID is the agent's own uid.
func workerCredential(spec agentapi.StageSpec, agentUID int, allowRoot bool, groups func(uid, gid uint32) ([]uint32, error)) (*syscall.Credential, error) {
	if spec.UID == 0 && !allowRoot {
		return nil, errors.New("refusing to stage as uid 0 (root): [stage] allow_root is off, the default of a system install (DataWarp staged as the job's user, and a uid 0 there is almost always a missing one; a home that root runs allows it); if root's own jobs must stage, set allow_root = true under [stage] in the storage nodes' configuration and restart their agents")
	}
	if agentUID != 0 {
		if int64(spec.UID) != int64(agentUID) {
			return nil, fmt.Errorf("cannot stage as uid %d: this agent runs as uid %d, not root", spec.UID, agentUID)
		}
		return nil, nil // the worker inherits the agent's own identity
	}
	list, err := groups(spec.UID, spec.GID)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: spec.UID, Gid: spec.GID, Groups: list}, nil
}

// userGroups lists the supplementary groups of uid from the user database, as login would (a
// variable: the tests give a user other groups).
var userGroups = func(uid, gid uint32) ([]uint32, error) { return privdrop.UserGroups(uid) }

// finishEarly fails a run that never started a worker.
func (r *Run) finishEarly(err error) {
	r.status.Status = "failed"
	r.status.Error = r.prefix + ": " + err.Error()
	r.finish()
}

// watch stops the worker on timeout, when it makes no progress for StallTimeout, on Cancel,
// or when ctx ends.
func (r *Run) watch(ctx context.Context) {
	timer := time.NewTimer(r.limits.Timeout)
	defer timer.Stop()
	stall := time.NewTimer(r.limits.StallTimeout)
	defer stall.Stop()
	for {
		select {
		case <-timer.C:
			r.stop(stopTimeout)
			return
		case <-stall.C:
			r.mu.Lock()
			idle := time.Since(r.lastSign)
			r.mu.Unlock()
			if idle >= r.limits.StallTimeout {
				r.stop(stopStalled)
				return
			}
			stall.Reset(r.limits.StallTimeout - idle)
		case <-ctx.Done():
			r.stop(stopCanceled)
			return
		case <-r.cancelCh:
			r.stop(stopCanceled)
			return
		case <-r.done:
			return
		}
	}
}

// alive records a sign of progress from the worker.
func (r *Run) alive() {
	r.mu.Lock()
	r.lastSign = time.Now()
	r.mu.Unlock()
}

// stop asks the worker to stop (stdin closed, SIGTERM to its group) and kills the group after
// CancelGrace. Only the first reason counts.
func (r *Run) stop(reason string) {
	r.mu.Lock()
	if r.stopReason != "" || r.ended {
		r.mu.Unlock()
		return
	}
	r.stopReason = reason
	r.mu.Unlock()
	r.proc.stdin.Close()
	r.signal(syscall.SIGTERM)
	time.AfterFunc(r.limits.CancelGrace, func() {
		r.signal(syscall.SIGKILL)
		time.AfterFunc(r.limits.CancelGrace, r.abandon)
	})
}

// abandon ends a run whose worker was killed CancelGrace ago and is still not gone: it is
// blocked in the kernel (a FUSE request its server does not answer) and dies, doing nothing
// more, once the request returns. The run's status says so; the process stays counted as
// stuck until it is reaped.
func (r *Run) abandon() {
	r.mu.Lock()
	if r.ended || r.abandoned {
		r.mu.Unlock()
		return
	}
	r.abandoned = true
	workersStuck.Add(1)
	r.settle(nil, nil, true)
	r.status.Error += fmt.Sprintf("; its worker (pid %d) did not exit %v after SIGKILL: it is blocked in the kernel, typically on a file system (a FUSE server) that does not answer, and ends when that answers (spillway_agent_stage_workers_stuck counts it)",
		r.proc.pid, r.limits.CancelGrace)
	r.mu.Unlock()
	r.finish()
}

// signal sends sig to the worker's process group while it serves this stage and is known not
// to have been reaped.
func (r *Run) signal(sig syscall.Signal) {
	r.mu.Lock()
	ended := r.ended
	r.mu.Unlock()
	if !ended {
		r.proc.signal(sig)
	}
}

// supervise reads the worker's events until the stage's result (or the worker's end), answers
// its plan, settles the status, and keeps the worker for another stage when the stage ended
// cleanly.
func (r *Run) supervise(reserve func(bytes uint64) error) {
	p := r.proc
	var final *event
	planned := false
	var protoErr error
	clean := false // the stage's result came, numbered, from a worker that waits for more
	for line := range p.lines {
		if protoErr != nil {
			continue // until the worker is gone
		}
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			protoErr = fmt.Errorf("the staging worker sent a line that is not a JSON event: %v", err)
			r.stopForProtocol(protoErr)
			continue
		}
		// A worker's first stage may speak without numbers (a worker that serves one stage,
		// or one that failed before it read the request); any other line must be this stage's.
		if ev.Seq != r.seq && !(ev.Seq == 0 && r.fresh) {
			protoErr = fmt.Errorf("the staging worker sent a line of stage %d during stage %d", ev.Seq, r.seq)
			r.stopForProtocol(protoErr)
			continue
		}
		switch {
		case final != nil:
			protoErr = fmt.Errorf("the staging worker sent %q after its final event", ev.Event)
		case ev.Event == eventWarning:
			r.alive()
			r.addWarning(ev.Message)
		case ev.Event == eventPlanning && !planned:
			r.alive()
		case ev.Event == eventProtected && planned && r.spec.Protect && r.spec.Part != nil && ev.Mode != 0 && ev.Mode&^0o7777 == 0:
			r.mu.Lock()
			r.status.ProtectedMode = ev.Mode
			r.mu.Unlock()
		case ev.Event == eventPlan && !planned:
			planned = true
			r.alive()
			r.mu.Lock()
			r.status.FilesTotal, r.status.BytesTotal = ev.Files, ev.Bytes
			r.mu.Unlock()
			d := r.decide(reserve, max(ev.Bytes, ev.Charge))
			d.Seq = r.seq
			answer, _ := json.Marshal(d)
			p.stdin.Write(append(answer, '\n')) // a worker that is gone is noticed by its output ending
		case ev.Event == eventProgress && planned, ev.Event == eventDone && planned:
			r.alive()
			r.mu.Lock()
			r.status.FilesDone = max(r.status.FilesDone, ev.Files)
			r.status.BytesDone = max(r.status.BytesDone, ev.Bytes)
			r.mu.Unlock()
			if ev.Event == eventDone {
				final = &ev
			}
		case ev.Event == eventFailed:
			final = &ev
		default:
			protoErr = fmt.Errorf("the staging worker sent an unexpected %q event", ev.Event)
		}
		if protoErr != nil {
			r.stopForProtocol(protoErr)
			continue
		}
		if final != nil && final.Seq == r.seq && final.More {
			clean = true
			break // the worker now waits for another request: nothing more comes
		}
	}
	if clean {
		// From here on a stop (a cancel, the timeout) comes too late and does nothing: the
		// worker may serve another stage soon.
		r.mu.Lock()
		stopping := r.stopReason != ""
		r.ended = r.ended || !stopping
		r.mu.Unlock()
		if !stopping {
			r.endCleanly(final)
			return
		}
		// Stopped meanwhile: its stdin is closed and it is going; wait for it as for any.
		go func() {
			for range p.lines {
			}
		}()
	}
	if err := p.readErr; err != nil && protoErr == nil && !clean {
		if errors.Is(err, bufio.ErrTooLong) {
			protoErr = fmt.Errorf("the staging worker sent a line longer than %d bytes (limit stage.worker_output_limit)", r.limits.MaxLineBytes)
		} else {
			protoErr = fmt.Errorf("cannot read the staging worker's output: %v", err)
		}
		r.stopForProtocol(protoErr)
	}
	<-p.exited
	r.mu.Lock()
	r.ended = true
	abandoned := r.abandoned
	if !abandoned { // else the run has ended already, saying why
		if clean {
			r.settle(final, nil, false)
		} else {
			r.settle(final, p.waitErr, true)
		}
	}
	r.mu.Unlock()
	if abandoned {
		workersStuck.Add(-1)
	}
	r.finish()
}

// stopForProtocol records the first protocol error and stops the worker.
func (r *Run) stopForProtocol(err error) {
	r.mu.Lock()
	if r.protoErr == nil {
		r.protoErr = err
	}
	r.mu.Unlock()
	r.stop(stopProtocol)
}

// endCleanly settles a stage whose numbered result came from a worker waiting for more, and
// keeps the worker for the next stage of its credential when nothing speaks against it.
func (r *Run) endCleanly(final *event) {
	p := r.proc
	handed := r.handedOver()
	r.mu.Lock()
	r.settle(final, nil, false)
	r.mu.Unlock()
	switch {
	case !handed, p.stderr.Wrote():
		// It did not take this stage's directories as it should have, or it complained:
		// nothing of it is trusted for another stage.
		p.kill()
	default:
		pool.put(p, r.limits)
	}
	r.finish()
}

// decide asks reserve about the plan unless the run is already stopping.
func (r *Run) decide(reserve func(bytes uint64) error, bytes uint64) decision {
	r.mu.Lock()
	stopping := r.stopReason != ""
	r.mu.Unlock()
	if stopping {
		return decision{Refuse: "canceled"}
	}
	if reserve != nil {
		if err := reserve(bytes); err != nil {
			r.mu.Lock()
			r.refused = err
			r.mu.Unlock()
			return decision{Refuse: err.Error()}
		}
	}
	return decision{Go: true}
}

// settle decides the final status from the last event, the exit status (when exitKnown: the
// worker served this stage only, or did not end it cleanly) and why the agent stopped the
// worker, if it did. The worker's exit status and final event must agree.
func (r *Run) settle(final *event, waitErr error, exitKnown bool) {
	s := &r.status
	fail := func(format string, args ...any) {
		s.Status = "failed"
		s.Error = r.prefix + ": " + fmt.Sprintf(format, args...)
	}
	switch {
	case final != nil && final.Event == eventDone && waitErr == nil:
		s.Status = "complete"
	case r.stopReason == stopCanceled:
		s.Status = "canceled"
		s.Error = r.prefix + ": canceled"
	case r.stopReason == stopTimeout:
		fail("timed out after %v (limit stage.timeout) with %d of %d files and %s of %s copied", r.limits.Timeout, s.FilesDone, s.FilesTotal, units.FormatHuman(s.BytesDone), units.FormatHuman(s.BytesTotal))
	case r.stopReason == stopStalled:
		fail("no progress for %v (stage.stall_timeout) with %d of %d files and %s of %s copied: a source or destination stopped answering; the worker was stopped",
			r.limits.StallTimeout, s.FilesDone, s.FilesTotal, units.FormatHuman(s.BytesDone), units.FormatHuman(s.BytesTotal))
	case r.protoErr != nil:
		fail("%v", r.protoErr)
	case r.refused != nil:
		fail("not started: %v", r.refused)
	case final != nil && final.Event == eventFailed:
		s.Status = "failed"
		s.Error = final.Error
		if waitErr == nil && exitKnown {
			s.Error += " (the staging worker then exited with status 0)"
		}
	case final != nil && final.Event == eventDone:
		fail("the staging worker reported success but then %v", exitText(waitErr))
	default:
		fail("the staging worker %s without reporting a result%s", exitText(waitErr), stderrTail(r.proc.stderr))
	}
}

func exitText(err error) string {
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "was killed by " + ws.Signal().String()
		}
		return fmt.Sprintf("exited with status %d", exitErr.ExitCode())
	}
	if err != nil {
		return "failed: " + err.Error()
	}
	return "exited with status 0"
}

func (r *Run) addWarning(message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.warnings) >= r.limits.MaxWarnings {
		r.dropped++
		return
	}
	r.warnings = append(r.warnings, message)
}

// Status returns a snapshot of the stage's status.
func (r *Run) Status() agentapi.StageStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status
}

// Warnings returns the warnings the worker reported (skipped special files, metadata it could
// not keep), at most MaxWarnings, and how many more were dropped.
func (r *Run) Warnings() (warnings []string, dropped int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.warnings...), r.dropped
}

// Cancel asks the stage to stop and returns at once; Wait reports the outcome ("canceled",
// or "complete" if it finished first). Canceling twice is canceling once.
func (r *Run) Cancel() {
	r.cancel.Do(func() { close(r.cancelCh) })
}

// Done is closed when the stage has ended and its worker is gone, or idle (pool.go) for the
// next stage of its credential having closed this one's directories.
func (r *Run) Done() <-chan struct{} { return r.done }

// Wait blocks until the stage has ended and returns its final status.
func (r *Run) Wait() agentapi.StageStatus {
	<-r.done
	return r.Status()
}

// stderrTail is a worker's error output for a message ("" when it wrote none).
func stderrTail(b *asuser.HeadBuffer) string {
	text := b.Text()
	if text == "" {
		return ""
	}
	return "; its error output: " + text
}

// lowerPriority gives every thread of process pid the nice value n, at once after its exec
// (most of a small file's stage is the worker's start). setpriority(2) sets one thread on
// Linux, and a thread takes the value of the thread that makes it: every thread listed is
// set, twice over for one made while the first pass ran. Best effort: a worker that is gone
// already is noticed by Wait.
func lowerPriority(pid, n int) {
	set := map[int]bool{}
	for pass := 0; pass < 2; pass++ {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || set[tid] {
				continue
			}
			unix.Setpriority(unix.PRIO_PROCESS, tid, n)
			set[tid] = true
		}
	}
}
