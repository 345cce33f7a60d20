// Package runjob is `spillway run`: it runs a DataWarp job script on this machine with no
// workload manager, driving the real lifecycle through the controller's API — job_process,
// setup, data_in, paths, pre_run, the job, post_run, data_out, teardown — and printing each
// phase with its duration.
package runjob

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/directive"
	"github.com/spillway-hpc/spillway/internal/jobspec"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/units"
)

// Exit statuses besides the job's own.
const (
	ExitUsage       = 64 // bad command line
	ExitDirectives  = 65 // the script's directives are invalid
	ExitBeforeJob   = 69 // the burst buffer failed before the job ran; the job did not run
	ExitStageOut    = 74 // the job succeeded but stage-out (or post_run, or teardown) failed
	creatorRun      = "RUN"
	tokenPrefix     = "run"
	stepPollDefault = 100 * time.Millisecond
	stepWaitDefault = 10 * time.Minute
)

// Options are what `spillway run` was asked.
type Options struct {
	Script      string
	Args        []string
	Client      *apiclient.Client
	Node        string        // this compute node's name, as its agent registered
	Out         io.Writer     // phase lines (stderr)
	Poll        time.Duration // how often to ask for progress
	StepTimeout time.Duration // the longest wait for a step that moves no data
	JobIDs      func(ctx context.Context) (int64, error)
	Quiet       bool
	// KeepOnFailed keeps the session after a failure before the job (for inspection with
	// dwstat) instead of tearing it down.
	KeepOnFailed bool
	// DiscardFailedStageOut tears the session down after a failed post_run or stage-out,
	// losing the job's results; by default the session is kept so the stage-out can be retried.
	DiscardFailedStageOut bool
	// TeardownAttempts and TeardownRetryWait: how often the teardown is asked when the
	// controller refuses it or cannot be reached (client.teardown_attempts, teardown_retry_wait).
	TeardownAttempts  int
	TeardownRetryWait time.Duration
	// Self is how spillway was invoked and ConnArgs the options that reach the same controller
	// (--home DIR, --controller ADDRESS): the commands printed for a kept session use them.
	Self     []string
	ConnArgs []string
	// Records is the home's directory of run records (nil with a system install's controller),
	// which lets a later command clean up after this run if it dies (see Reap).
	Records *Records
	// KeepAlive, when set, is how often the run asks the controller about its session while
	// the job runs: a home's server that died is started again by the asking (and restores the
	// job's mount) instead of when the job ends.
	KeepAlive time.Duration
	// JobEnv is added to the job's environment (KEY=VALUE, replacing the run's own): what
	// libdatawarp and dwcli stage in the job need to reach this run's controller
	// (SPILLWAY_HOME, SPILLWAY_CONFIG) and binary (SPILLWAY_BIN).
	JobEnv []string
}

type runner struct {
	o         Options
	ctx       context.Context
	token     string
	sessionID int64
	start     time.Time
	in        *interrupts
	rec       *Record
	stageOut  []lifecycle.StageRequest
	lease     *lease // the session's lease with the controller, once it exists
}

func (r *runner) phase(name string, began time.Time, format string, args ...any) {
	if r.o.Quiet {
		return
	}
	fmt.Fprintf(r.o.Out, "[spillway] %-12s %8.3fs  %s\n", name, time.Since(began).Seconds(), fmt.Sprintf(format, args...))
}

func (r *runner) fail(name string, began time.Time, err error) {
	fmt.Fprintf(r.o.Out, "[spillway] %-12s %8.3fs  FAILED: %v\n", name, time.Since(began).Seconds(), err)
}

func (r *runner) say(format string, args ...any) {
	fmt.Fprintf(r.o.Out, "[spillway] "+format+"\n", args...)
}

func newRunner(ctx context.Context, o Options) *runner {
	if o.Poll == 0 {
		o.Poll = stepPollDefault
	}
	if o.StepTimeout == 0 {
		o.StepTimeout = stepWaitDefault
	}
	if o.TeardownAttempts <= 0 {
		o.TeardownAttempts = 1
	}
	if len(o.Self) == 0 {
		o.Self = []string{"spillway"}
	}
	r := &runner{o: o, ctx: ctx, start: time.Now()}
	r.in = watchSignals(ctx, r.say, r.leaving)
	return r
}

// leaving says what becomes of the session when the run leaves without waiting.
func (r *runner) leaving() string {
	if r.token == "" {
		return "nothing was allocated"
	}
	if r.o.Records != nil {
		return fmt.Sprintf("the home's server cleans session %s up", r.token)
	}
	return fmt.Sprintf("session %s is left to the controller (spillway dwstat sessions shows it)", r.token)
}

// Run runs the script and returns the exit status `spillway run` should exit with.
func Run(ctx context.Context, o Options) int {
	r := newRunner(ctx, o)
	defer r.endLease(false)
	defer r.in.stop()

	began := time.Now()
	raw, err := jobspec.ReadScript(o.Script)
	if err != nil {
		fmt.Fprintf(o.Out, "spillway run: %v\n", err)
		return ExitUsage
	}
	id, err := o.JobIDs(r.in.abort)
	if err != nil {
		if r.in.aborted() {
			return r.in.status()
		}
		fmt.Fprintf(o.Out, "spillway run: %v\n", err)
		return ExitBeforeJob
	}
	jobID := strconv.FormatInt(id, 10)
	r.token = tokenPrefix + jobID
	r.begin(id)
	me, _ := user.Current()
	cwd, _ := os.Getwd()
	substituted := directive.Substitute(raw, directive.Symbols{
		ArrayJobID: jobID, ArrayTaskID: "0", WorkDir: cwd, JobID: jobID, User: me.Username,
		JobName: filepath.Base(o.Script),
	})
	script, err := directive.Parse(substituted)
	if err == nil {
		// spillway run is the user's own process: it checks, as the user, that every cache's
		// pfs= can be entered (before the refusal of what this version cannot run yet).
		err = jobspec.CheckPFSAsUser(script)
	}
	if err == nil {
		err = jobspec.Supported(script)
	}
	if err == nil {
		r.stageOut, err = jobspec.Stages(script.StageOut, model.StageOut)
	}
	if err != nil {
		r.fail("job_process", began, fmt.Errorf("%s: invalid burst-buffer directives:\n%v", o.Script, err))
		r.released()
		return ExitDirectives
	}
	// Warnings are about what the user wrote: a literal %% must not read as an unknown
	// symbol once substituted.
	warnings := script.Warnings
	if original, err := directive.Parse(raw); err == nil {
		warnings = original.Warnings
	}
	for _, w := range warnings {
		fmt.Fprintf(o.Out, "[spillway] warning: %s: %s\n", o.Script, w)
	}
	r.phase("job_process", began, "job %s (token %s): %s", jobID, r.token, jobspec.Summary(script))
	if r.in.aborted() {
		r.released()
		return r.in.status()
	}

	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	for _, c := range script.Create {
		began = time.Now()
		r.enter("create")
		if err := r.createPersistent(c, uid, gid); err != nil {
			return r.failBeforeSession("create", began, jobspec.CreateError(c.Line, "create_persistent", c.Name, err))
		}
		r.phase("create", began, "persistent instance %s (%s)", c.Name, units.FormatHuman(c.Capacity))
	}
	for _, d := range script.Destroy {
		began = time.Now()
		r.enter("destroy")
		if err := r.destroyPersistent(d.Name, d.Hurry); err != nil {
			return r.failBeforeSession("destroy", began, jobspec.CreateError(d.Line, "destroy_persistent", d.Name, err))
		}
		r.phase("destroy", began, "persistent instance %s", d.Name)
	}
	if script.JobDW == nil && len(script.Persistent) == 0 && script.Swap == nil {
		// Nothing for the job itself: a plain script, or only #BB create/destroy.
		if r.in.aborted() {
			r.released()
			return r.in.status()
		}
		r.enter("job")
		status, ran := r.runJob(nil)
		r.released()
		if !ran && r.in.aborted() {
			return r.in.status()
		}
		return status
	}

	began = time.Now()
	r.enter(lifecycle.PhaseSetup)
	if err := r.step(r.in.abort, lifecycle.PhaseSetup, func() error {
		req, err := jobspec.Setup(script, r.token, creatorRun, uid, gid, []string{o.Node})
		if err != nil {
			return err
		}
		return o.Client.Setup(r.in.abort, req)
	}); err != nil {
		return r.failBeforeJob("setup", began, jobspec.SetupError(script, err))
	}
	r.holdLease()
	r.phase("setup", began, "%s", r.describeSetup())

	r.enter(lifecycle.PhaseDataIn)
	stageIn, err := jobspec.Stages(script.StageIn, model.StageIn)
	if err != nil {
		return r.failBeforeJob("data_in", time.Now(), err)
	}
	if _, ok := r.stage(r.in.abort, model.StageIn, stageIn); !ok {
		return r.failBeforeJob("data_in", time.Now(), nil)
	}

	began = time.Now()
	r.enter("paths")
	env, err := o.Client.Paths(r.in.abort, r.token)
	if err != nil {
		return r.failBeforeJob("paths", began, err)
	}
	r.phase("paths", began, "%s", describeEnv(env))

	began = time.Now()
	r.enter(lifecycle.PhasePreRun)
	if err := r.step(r.in.abort, lifecycle.PhasePreRun, func() error { return o.Client.PreRun(r.in.abort, r.token, []string{o.Node}) }); err != nil {
		return r.failBeforeJob("pre_run", began, err)
	}
	r.phase("pre_run", began, "mounted on %s", o.Node)

	if r.in.aborted() {
		return r.failBeforeJob("pre_run", began, nil)
	}
	r.enter("job")
	status, ran := r.runJob(env)
	if !ran {
		return r.failBeforeJob("job", time.Now(), nil)
	}
	return r.afterJob(status)
}

// afterJob unmounts, stages out and releases the session of a job that ran.
func (r *runner) afterJob(status int) int {
	r.in.setStage(afterJob)
	interrupted := func() (int, bool) {
		switch {
		case r.in.left():
			r.exited("interrupted; it left without waiting")
			return orStatus(status, r.in.status()), true
		case r.in.hurried():
			return r.hurriedEnd(status), true
		}
		return 0, false
	}
	if code, ok := interrupted(); ok {
		return code
	}
	began := time.Now()
	r.enter(lifecycle.PhasePostRun)
	if err := r.step(r.in.hurry, lifecycle.PhasePostRun, func() error { return r.o.Client.PostRun(r.in.hurry, r.token) }); err != nil {
		if code, ok := interrupted(); ok {
			r.phase("post_run", began, "interrupted")
			return code
		}
		r.fail("post_run", began, err)
		return r.keepResults(status, "post_run failed: "+err.Error())
	}
	r.phase("post_run", began, "unmounted")

	r.enter(lifecycle.PhaseDataOut)
	if msg, ok := r.stage(r.in.hurry, model.StageOut, r.stageOut); !ok {
		if code, ok := interrupted(); ok {
			return code
		}
		return r.keepResults(status, msg)
	}
	r.enter(lifecycle.PhaseTeardown)
	if !r.teardown(false) {
		return r.endWithout(status, ExitStageOut)
	}
	return status
}

// hurriedEnd tears the session down at once after a second interrupt.
func (r *runner) hurriedEnd(status int) int {
	r.enter(lifecycle.PhaseTeardown)
	if !r.teardown(true) {
		return r.endWithout(status, r.in.status())
	}
	return orStatus(status, r.in.status())
}

// endWithout is the status of a run that could not release its session.
func (r *runner) endWithout(status, ours int) int {
	if r.in.left() {
		return orStatus(status, r.in.status())
	}
	return orStatus(status, ours)
}

// failBeforeSession ends a run whose #BB create/destroy failed: nothing of the job exists.
func (r *runner) failBeforeSession(name string, began time.Time, err error) int {
	r.released()
	if r.in.aborted() {
		r.phase(name, began, "interrupted")
		return r.in.status()
	}
	r.fail(name, began, err)
	return ExitBeforeJob
}

// failBeforeJob ends a run that failed or was interrupted before its job: the job does not
// run and the session is released (or kept for inspection with --keep-on-failure). err nil:
// the failure was printed already.
func (r *runner) failBeforeJob(name string, began time.Time, err error) int {
	if r.in.aborted() {
		if err != nil {
			r.phase(name, began, "interrupted")
		}
		r.teardown(true)
		return r.in.status()
	}
	if err != nil {
		r.fail(name, began, err)
	}
	if r.o.KeepOnFailed {
		id := r.lookupSessionID()
		if id == 0 {
			r.released() // the setup was refused: there is nothing to keep
			return ExitBeforeJob
		}
		_, discard := Commands(r.o.Self, r.o.ConnArgs, r.token, id)
		inspect := ShellJoin(append(append(append([]string{}, r.o.Self...), "dwstat"), append(append([]string{}, r.o.ConnArgs...), "all")...))
		note := fmt.Sprintf("session %s (id %d) is kept for inspection (`%s`); remove it with `%s`", r.token, id, inspect, discard)
		r.say("%s", note)
		r.kept(note)
		return ExitBeforeJob
	}
	if r.sessionAbsent() {
		r.released()
		r.phase("teardown", time.Now(), "nothing to release: the setup created nothing")
		return ExitBeforeJob
	}
	r.teardown(true)
	return ExitBeforeJob
}

// sessionAbsent reports whether the controller answered that the job has no session (a
// refused setup); false when it does, or did not answer (then teardown must still be asked).
func (r *runner) sessionAbsent() bool {
	if r.sessionID != 0 {
		return false
	}
	all, err := r.o.Client.Session(context.Background(), r.token)
	return err == nil && sessionOf(all, r.token) == nil
}

// keepResults keeps the session of a job whose results could not be staged out: its instance
// holds the only copy. With --discard-failed-stage-out it is torn down instead.
func (r *runner) keepResults(status int, why string) int {
	if r.o.DiscardFailedStageOut {
		r.say("discarding the job's results as asked (--discard-failed-stage-out)")
		r.enter(lifecycle.PhaseTeardown)
		if !r.teardown(true) {
			return r.endWithout(status, ExitStageOut)
		}
		return orStatus(status, ExitStageOut)
	}
	id := r.lookupSessionID()
	retry, discard := Commands(r.o.Self, r.o.ConnArgs, r.token, id)
	r.say("keeping session %s (id %d): its instance holds the job's results, which were not staged out", r.token, id)
	r.say("  retry the stage-out once the cause is fixed:  %s", retry)
	r.say("  or discard the results and release it:        %s", discard)
	r.kept(fmt.Sprintf("session %s (id %d) was kept after %s; retry the stage-out with `%s`, or discard the results with `%s`", r.token, id, why, retry, discard))
	return orStatus(status, ExitStageOut)
}

// lookupSessionID returns the session's id (0 if the controller cannot say).
func (r *runner) lookupSessionID() int64 {
	if r.sessionID != 0 {
		return r.sessionID
	}
	all, err := r.o.Client.Session(context.Background(), r.token)
	if err == nil {
		if s := sessionOf(all, r.token); s != nil {
			r.sessionID = s.ID
		}
	}
	return r.sessionID
}

// RetryStageOut stages out a session kept after its stage-out (or post_run) failed, and
// releases it once that succeeds: `spillway run --retry-stage-out TOKEN`. It asks again for
// the session's own stage-outs, as the script's #DW stage_out directives named them.
func RetryStageOut(ctx context.Context, o Options, token string) int {
	r := newRunner(ctx, o)
	defer r.endLease(false)
	defer r.in.stop()
	r.token = token
	// Any interrupt leaves: the stage-out goes on in the controller, and the home's server
	// finishes it (releasing the session, or keeping it again) once this command is gone.
	all, err := o.Client.Session(r.in.abort, token)
	if err != nil {
		fmt.Fprintf(o.Out, "spillway run --retry-stage-out: %v\n", err)
		return ExitStageOut
	}
	sess := sessionOf(all, token)
	switch {
	case sess == nil:
		fmt.Fprintf(o.Out, "spillway run --retry-stage-out: no session %s (%s lists them)\n", token,
			ShellJoin(append(append(append([]string{}, r.o.Self...), "dwstat"), append(append([]string{}, r.o.ConnArgs...), "sessions")...)))
		return ExitUsage
	case sess.Persistent:
		fmt.Fprintf(o.Out, "spillway run --retry-stage-out: %s is a persistent instance, not a job's session\n", token)
		return ExitUsage
	case sess.State.Goal == model.GoalDestroy:
		fmt.Fprintf(o.Out, "spillway run --retry-stage-out: session %s is being torn down; its data can no longer be staged out\n", token)
		return ExitStageOut
	}
	r.sessionID = sess.ID
	r.holdLease()
	jobID, _ := strconv.ParseInt(strings.TrimPrefix(token, tokenPrefix), 10, 64)
	if o.Records != nil {
		if rec, err := o.Records.Adopt(token, jobID, o.Self, o.ConnArgs); err == nil {
			r.rec = rec
		}
	}
	for _, st := range all.Stages {
		if st.Session != sess.ID || st.Direction != model.StageOut || st.InJob {
			continue // the job's own (libdatawarp) are retried by data_out itself
		}
		req, err := stageRequestOf(st)
		if err != nil {
			fmt.Fprintf(o.Out, "spillway run --retry-stage-out: %v\n", err)
			return ExitStageOut
		}
		r.stageOut = append(r.stageOut, req)
	}
	if len(r.stageOut) == 0 && r.rec != nil {
		r.stageOut = r.rec.StageOut // kept before its stage-out was asked (post_run failed)
	}
	r.phase("retry", r.start, "session %s (id %d): %d stage-out(s)", token, sess.ID, len(r.stageOut))
	r.in.leaveOnFirst()
	return r.afterJob(0)
}

// orStatus keeps the job's failure status, else reports ours.
func orStatus(job, ours int) int {
	if job != 0 {
		return job
	}
	return ours
}

// step sends a request and waits for its step to finish, until ctx ends. A busy answer (the
// token's previous teardown still running) is retried.
func (r *runner) step(ctx context.Context, step string, send func() error) error {
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = send(); err == nil || !apiclient.IsBusy(err) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(r.o.Poll):
		}
	}
	if err != nil {
		return err
	}
	r.in.hit(step)
	st, err := r.o.Client.WaitStep(ctx, r.token, step, r.o.StepTimeout)
	if err != nil {
		return err
	}
	if st.Failed {
		return errors.New(st.Message)
	}
	return nil
}

func (r *runner) describeSetup() string {
	all, err := r.o.Client.Session(r.ctx, r.token)
	if err != nil {
		return ""
	}
	for _, s := range all.Sessions {
		if s.Token != r.token {
			continue
		}
		var parts []string // a job may hold a scratch and a cache instance
		for _, i := range all.Instances {
			if i.Links.Session == s.ID {
				var nodes []string
				for _, f := range all.Fragments {
					if f.Instance == i.ID {
						nodes = append(nodes, f.Node)
					}
				}
				parts = append(parts, fmt.Sprintf("instance %s: %s in pool %s on %s", i.Label, units.FormatHuman(i.Capacity.Bytes), i.Pool, strings.Join(nodes, ", ")))
			}
		}
		if len(parts) > 0 {
			return strings.Join(parts, "; ")
		}
		if len(s.Uses) > 0 {
			return "uses " + strings.Join(s.Uses, ", ")
		}
	}
	return ""
}

func describeEnv(env map[string]string) string {
	var keys []string
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+"="+env[k])
	}
	return strings.Join(parts, " ")
}

// stage runs the stage-ins or stage-outs and prints their progress, until ctx ends. It
// returns whether they all succeeded, and why not.
func (r *runner) stage(ctx context.Context, direction string, reqs []lifecycle.StageRequest) (string, bool) {
	name := "data_in"
	if direction == model.StageOut {
		name = "data_out"
	}
	began := time.Now()
	// The stages that had ended before this step: the job's own (libdatawarp, dwcli stage)
	// that it saw to their end. The summary counts only what this step ran or waited for.
	prior, priorErr := r.o.Client.Status(ctx, r.token, name, 0)
	before := endedStages(prior)
	if len(reqs) == 0 {
		// Slurm calls data_in/data_out for every job; there is nothing to ask for here, but
		// the job may have asked for stage-outs itself (libdatawarp: at its end, or still
		// running): they are waited for as the script's.
		if direction != model.StageOut || priorErr != nil || len(prior.Stages) == 0 {
			r.phase(name, began, "nothing to stage")
			return "", true
		}
	}
	failed := func(err error) (string, bool) {
		if ctx.Err() != nil {
			r.phase(name, began, "interrupted")
			return name + " interrupted", false
		}
		r.fail(name, began, err)
		return name + " failed: " + err.Error(), false
	}
	// Asked even with no request of the script's: data_out starts (or retries) the job's
	// own stage-outs deferred to its end.
	if err := r.o.Client.Stages(ctx, r.token, direction, reqs); err != nil {
		return failed(err)
	}
	r.in.hit(name)
	st, err := r.o.Client.WaitStep(ctx, r.token, name, 0)
	if err != nil {
		return failed(err)
	}
	var files int64
	var bytes uint64
	counted, earlier := 0, 0
	for _, s := range st.Stages {
		if p, ok := before[s.ID]; ok && sameEnd(p, s) {
			earlier++ // ended before this step, as the job's own calls left it
			continue
		}
		counted++
		files += s.FilesDone
		bytes += s.BytesDone
		for _, w := range s.Warnings {
			fmt.Fprintf(r.o.Out, "[spillway] warning: %s line %d: %s\n", name, s.Line, w)
		}
	}
	if st.Failed {
		return failed(errors.New(st.Message))
	}
	secs := time.Since(began).Seconds()
	rate := ""
	if secs > 0 && bytes > 0 {
		rate = fmt.Sprintf(" (%s/s)", units.FormatHuman(uint64(float64(bytes)/secs)))
	}
	also := ""
	if earlier > 0 {
		also = fmt.Sprintf("; %d stage(s) the job ran itself had ended before", earlier)
	}
	r.phase(name, began, "%d stage(s), %d file(s), %s%s%s", counted, files, units.FormatHuman(bytes), rate, also)
	return "", true
}

// endedStages are a step status's stages that have ended (complete, failed, canceled), by id.
func endedStages(st lifecycle.StepStatus) map[lifecycle.ID]lifecycle.StageProgress {
	out := map[lifecycle.ID]lifecycle.StageProgress{}
	for _, s := range st.Stages {
		switch s.Status {
		case model.StageComplete, model.StageFailed, model.StageCanceled:
			out[s.ID] = s
		}
	}
	return out
}

// sameEnd says whether a stage that had ended before a step is still as it was (the step did
// not run it again: a retried stage starts over and ends anew).
func sameEnd(before, now lifecycle.StageProgress) bool {
	return before.Status == now.Status && before.FilesDone == now.FilesDone && before.BytesDone == now.BytesDone && before.Error == now.Error
}

// teardown destroys the job's session, asking up to client.teardown_attempts times. It waits
// for stage-out unless hurry, and gives up waiting when the run leaves (a third interrupt). It
// reports whether the session was released.
func (r *runner) teardown(hurry bool) bool {
	began := time.Now()
	r.enter(lifecycle.PhaseTeardown)
	r.in.setStage(releasing)
	ctx := r.in.leave
	var err error
	attempts := 0
	for attempts < r.o.TeardownAttempts {
		if attempts > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(r.o.TeardownRetryWait):
			}
		}
		attempts++
		err = r.o.Client.Teardown(ctx, r.token, hurry)
		if err == nil || apiclient.IsNotFound(err) {
			err = nil
			break
		}
		if ctx.Err() != nil {
			break
		}
	}
	if err == nil {
		r.in.hit(lifecycle.PhaseTeardown)
		var st lifecycle.StepStatus
		st, err = r.o.Client.WaitStep(ctx, r.token, lifecycle.PhaseTeardown, r.o.StepTimeout)
		if err == nil && st.Failed {
			err = errors.New(st.Message)
		}
	} else if attempts > 1 {
		err = fmt.Errorf("%w (asked %d times, client.teardown_attempts)", err, attempts)
	}
	if err != nil {
		if r.in.left() {
			r.phase("teardown", began, "not waited for (interrupted)")
			r.exited("interrupted; it left without waiting")
			return false
		}
		r.fail("teardown", began, err)
		r.exited("teardown failed: " + err.Error())
		if r.o.Records != nil {
			r.say("the home's server retries releasing session %s", r.token)
		}
		return false
	}
	r.released()
	how := ""
	if hurry {
		how = " (hurry)"
	}
	r.phase("teardown", began, "instance released%s; total %.3fs", how, time.Since(r.start).Seconds())
	return true
}

// The run's record (see Record): what a later command needs to clean up if this run dies.

func (r *runner) begin(jobID int64) {
	if r.o.Records == nil {
		return
	}
	rec, err := r.o.Records.Begin(r.token, jobID, absPath(r.o.Script), r.o.Self, r.o.ConnArgs)
	if err != nil {
		r.say("warning: cannot record this run in %s (%v): if it is killed, its session stays until removed by hand", r.o.Records.Dir, err)
		return
	}
	r.rec = rec
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func (r *runner) save() {
	if r.rec != nil {
		r.o.Records.Save(r.rec)
	}
}

// enter records the phase the run is in.
func (r *runner) enter(phase string) {
	if r.rec != nil && r.rec.Phase != phase {
		r.rec.Phase = phase
		if phase == "job" || phase == lifecycle.PhasePreRun {
			r.rec.StageOut = r.stageOut
		}
		r.save()
	}
}

// released forgets the run: its session is gone (or never existed).
func (r *runner) released() {
	if r.rec != nil {
		r.o.Records.Remove(r.token)
		r.rec = nil
	}
}

// kept marks the session as kept on purpose: cleanups leave it alone.
func (r *runner) kept(note string) {
	r.endLease(true)
	if r.rec != nil {
		r.rec.State, r.rec.Note, r.rec.Reported = StateKept, note, true
		r.save()
	}
}

// exited hands the session over to the cleanup of gone runs (Reap).
func (r *runner) exited(why string) {
	if r.rec != nil {
		r.rec.State, r.rec.Exit = StateExited, why
		r.save()
	}
}

func (r *runner) createPersistent(c directive.CreatePersistent, uid, gid uint32) error {
	req := jobspec.CreatePersistent(c, creatorRun, uid, gid)
	if err := r.o.Client.Setup(r.in.abort, req); err != nil {
		return err
	}
	st, err := r.o.Client.WaitStep(r.in.abort, c.Name, lifecycle.PhaseSetup, r.o.StepTimeout)
	if err == nil && st.Failed {
		err = errors.New(st.Message)
	}
	return err
}

func (r *runner) destroyPersistent(name string, hurry bool) error {
	if err := r.o.Client.Teardown(r.in.abort, name, hurry); err != nil {
		if apiclient.IsNotFound(err) {
			return fmt.Errorf("no persistent instance named %s", name)
		}
		return err
	}
	st, err := r.o.Client.WaitStep(r.in.abort, name, lifecycle.PhaseTeardown, r.o.StepTimeout)
	if err == nil && st.Failed {
		err = errors.New(st.Message)
	}
	return err
}

// runJob runs the script with the DataWarp variables in its own process group (interrupts
// reach it through the run's handler, see interrupts) and returns its exit status; ran is
// false when the job did not start (an interrupt came first, or it could not be executed).
func (r *runner) runJob(env map[string]string) (status int, ran bool) {
	began := time.Now()
	argv, err := interpreter(r.o.Script)
	if err != nil {
		r.fail("job", began, err)
		return ExitBeforeJob, false
	}
	cmd := exec.Command(argv[0], append(argv[1:], r.o.Args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = os.Environ()
	for _, kv := range r.o.JobEnv {
		key, _, _ := strings.Cut(kv, "=")
		cmd.Env = slices.DeleteFunc(cmd.Env, func(e string) bool { return strings.HasPrefix(e, key+"=") })
		cmd.Env = append(cmd.Env, kv)
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "SPILLWAY_JOB_ID="+strings.TrimPrefix(r.token, tokenPrefix), "SPILLWAY_TOKEN="+r.token)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !r.in.enterJob() {
		return r.in.status(), false
	}
	if !r.o.Quiet {
		fmt.Fprintf(r.o.Out, "[spillway] %-12s %8s  %s\n", "job", "", strings.Join(cmd.Args, " "))
	}
	if err := cmd.Start(); err != nil {
		r.in.jobEnded()
		r.fail("job", began, err)
		return ExitBeforeJob, false
	}
	if r.rec != nil {
		r.rec.JobRan, r.rec.JobPID = true, cmd.Process.Pid
		r.rec.JobStart, _ = ProcStart(cmd.Process.Pid)
		r.save()
	}
	r.in.jobStarted(cmd.Process.Pid)
	r.in.hit("job")
	stopKeepAlive := r.keepAlive(env != nil)
	// When the script ends, what it left running in its process group is killed, as Slurm
	// does at a job's end: nothing may write into the instance while it is unmounted and
	// staged out. The script is waited for without being reaped first, so that its pid, the
	// group's id, cannot be reused meanwhile.
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	err = cmd.Wait()
	stopKeepAlive()
	r.in.jobEnded()
	if r.rec != nil {
		r.rec.JobPID, r.rec.JobStart = 0, 0
		r.save()
	}
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			r.fail("job", began, err)
			return ExitBeforeJob, true
		}
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			status = 128 + int(ws.Signal())
		} else {
			status = ee.ExitCode()
		}
	}
	r.phase("job", began, "exit status %d", status)
	return status, true
}

// keepAlive asks about the session every Options.KeepAlive while the job runs (see there).
func (r *runner) keepAlive(hasSession bool) (stop func()) {
	if r.o.KeepAlive <= 0 || !hasSession {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(r.o.KeepAlive)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				ctx, cancel := context.WithCancel(r.in.leave)
				go func() {
					select {
					case <-done:
						cancel()
					case <-ctx.Done():
					}
				}()
				r.o.Client.Status(ctx, r.token, lifecycle.PhasePreRun, 0)
				cancel()
			}
		}
	}()
	return func() { close(done); <-finished }
}

// interpreter returns how to run the script: its #! line, or /bin/sh.
func interpreter(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	line, _ := bufio.NewReader(f).ReadString('\n')
	line = strings.TrimRight(line, "\r\n")
	if strings.HasPrefix(line, "#!") {
		fields := strings.Fields(strings.TrimPrefix(line, "#!"))
		if len(fields) > 0 {
			// Like the kernel: the interpreter and at most one argument.
			argv := []string{fields[0]}
			if len(fields) > 1 {
				argv = append(argv, strings.Join(fields[1:], " "))
			}
			return append(argv, path), nil
		}
	}
	return []string{"/bin/sh", path}, nil
}

// lease keeps the controller from finishing this run's session as abandoned
// (controller.run_lease): from setup to the run's end it is renewed three times per lease.
type lease struct {
	stop chan struct{}
	done chan struct{}
}

// holdLease starts renewing the session's lease; a controller that keeps none (a home, or
// run_lease 0) is asked once.
func (r *runner) holdLease() {
	if r.lease != nil {
		return
	}
	l := &lease{stop: make(chan struct{}), done: make(chan struct{})}
	r.lease = l
	go func() {
		defer close(l.done)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { <-l.stop; cancel() }()
		every := time.Duration(0)
		for {
			d, err := r.o.Client.RenewLease(ctx, r.token, false)
			switch {
			case err == nil && d <= 0:
				return // no lease kept
			case err == nil:
				every = max(d/3, 10*time.Millisecond)
			case every == 0:
				every = time.Second // unanswered yet (the controller restarts): ask again soon
			}
			select {
			case <-l.stop:
				return
			case <-time.After(every):
			}
		}
	}()
}

// endLease stops renewing; release tells the controller the run keeps the session on purpose.
func (r *runner) endLease(release bool) {
	l := r.lease
	if l == nil {
		return
	}
	r.lease = nil
	close(l.stop)
	<-l.done
	if release {
		ctx, cancel := context.WithTimeout(context.Background(), r.o.StepTimeout)
		defer cancel()
		r.o.Client.RenewLease(ctx, r.token, true)
	}
}
