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
	"os/signal"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/directive"
	"github.com/spillway-hpc/spillway/internal/jobspec"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/units"
)

// Exit statuses besides the job's own.
const (
	ExitUsage        = 64 // bad command line
	ExitDirectives   = 65 // the script's directives are invalid
	ExitBeforeJob    = 69 // the burst buffer failed before the job ran; the job did not run
	ExitStageOut     = 74 // the job succeeded but stage-out failed
	ExitInterrupted  = 130
	creatorRun       = "RUN"
	tokenPrefix      = "run"
	maxScriptBytes   = 16 << 20
	stepPollDefault  = 100 * time.Millisecond
	stepWaitDefault  = 10 * time.Minute
	teardownAttempts = 3
)

// Options are what `spillway run` was asked.
type Options struct {
	Script       string
	Args         []string
	Client       *apiclient.Client
	Node         string        // this compute node's name, as its agent registered
	Out          io.Writer     // phase lines (stderr)
	Poll         time.Duration // how often to ask for progress
	StepTimeout  time.Duration // the longest wait for a step that moves no data
	JobIDs       func(ctx context.Context) (int64, error)
	Quiet        bool
	KeepOnFailed bool // do not tear down after a failure (for inspection with dwstat)
}

type runner struct {
	o     Options
	ctx   context.Context
	token string
	start time.Time
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

// Run runs the script and returns the exit status `spillway run` should exit with.
func Run(ctx context.Context, o Options) int {
	if o.Poll == 0 {
		o.Poll = stepPollDefault
	}
	if o.StepTimeout == 0 {
		o.StepTimeout = stepWaitDefault
	}
	r := &runner{o: o, ctx: ctx, start: time.Now()}

	began := time.Now()
	raw, err := readScript(o.Script)
	if err != nil {
		fmt.Fprintf(o.Out, "spillway run: %v\n", err)
		return ExitUsage
	}
	id, err := o.JobIDs(ctx)
	if err != nil {
		fmt.Fprintf(o.Out, "spillway run: %v\n", err)
		return ExitBeforeJob
	}
	jobID := strconv.FormatInt(id, 10)
	r.token = tokenPrefix + jobID
	me, _ := user.Current()
	cwd, _ := os.Getwd()
	substituted := directive.Substitute(raw, directive.Symbols{
		ArrayJobID: jobID, ArrayTaskID: "0", WorkDir: cwd, JobID: jobID, User: me.Username,
		JobName: filepath.Base(o.Script),
	})
	script, err := directive.Parse(substituted)
	if err == nil {
		err = jobspec.Supported(script)
	}
	if err != nil {
		r.fail("job_process", began, fmt.Errorf("%s: invalid burst-buffer directives:\n%v", o.Script, err))
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

	uid, gid := uint32(os.Getuid()), uint32(os.Getgid())
	for _, c := range script.Create {
		began = time.Now()
		if err := r.createPersistent(c, uid, gid); err != nil {
			r.fail("create", began, err)
			return ExitBeforeJob
		}
		r.phase("create", began, "persistent instance %s (%s)", c.Name, units.FormatHuman(c.Capacity))
	}
	for _, d := range script.Destroy {
		began = time.Now()
		if err := r.destroyPersistent(d.Name, d.Hurry); err != nil {
			r.fail("destroy", began, err)
			return ExitBeforeJob
		}
		r.phase("destroy", began, "persistent instance %s", d.Name)
	}
	if script.JobDW == nil && len(script.Persistent) == 0 {
		// Nothing for the job itself: a plain script, or only #BB create/destroy.
		return r.runJob(nil)
	}

	began = time.Now()
	if err := r.step(lifecycle.PhaseSetup, func() error {
		return o.Client.Setup(ctx, jobspec.Setup(script, r.token, creatorRun, uid, gid, []string{o.Node}))
	}); err != nil {
		r.fail("setup", began, err)
		r.teardown(true)
		return ExitBeforeJob
	}
	r.phase("setup", began, "%s", r.describeSetup())

	if code, ok := r.stage(model.StageIn, script.StageIn); !ok {
		r.teardown(true)
		return code
	}

	began = time.Now()
	env, err := o.Client.Paths(ctx, r.token)
	if err != nil {
		r.fail("paths", began, err)
		r.teardown(true)
		return ExitBeforeJob
	}
	r.phase("paths", began, "%s", describeEnv(env))

	began = time.Now()
	if err := r.step(lifecycle.PhasePreRun, func() error { return o.Client.PreRun(ctx, r.token, []string{o.Node}) }); err != nil {
		r.fail("pre_run", began, err)
		r.teardown(true)
		return ExitBeforeJob
	}
	r.phase("pre_run", began, "mounted on %s", o.Node)

	status := r.runJob(env)

	began = time.Now()
	if err := r.step(lifecycle.PhasePostRun, func() error { return o.Client.PostRun(context.Background(), r.token) }); err != nil {
		r.fail("post_run", began, err)
		r.teardown(true)
		return orStatus(status, ExitStageOut)
	}
	r.phase("post_run", began, "unmounted")

	code, ok := r.stage(model.StageOut, script.StageOut)
	if !ok {
		r.teardown(true)
		return orStatus(status, code)
	}
	if !r.teardown(false) {
		return orStatus(status, ExitStageOut)
	}
	return status
}

// orStatus keeps the job's failure status, else reports ours.
func orStatus(job, ours int) int {
	if job != 0 {
		return job
	}
	return ours
}

func readScript(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("job script: %w", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxScriptBytes+1))
	if err != nil {
		return nil, fmt.Errorf("job script %s: %w", path, err)
	}
	if len(raw) > maxScriptBytes {
		return nil, fmt.Errorf("job script %s is larger than %s", path, units.FormatHuman(maxScriptBytes))
	}
	return raw, nil
}

// step sends a request and waits for its step to finish. A busy answer (the token's previous
// teardown still running) is retried.
func (r *runner) step(step string, send func() error) error {
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = send(); err == nil || !apiclient.IsBusy(err) {
			break
		}
		time.Sleep(r.o.Poll)
	}
	if err != nil {
		return err
	}
	st, err := r.o.Client.WaitStep(context.Background(), r.token, step, r.o.Poll, r.o.StepTimeout, nil)
	if err != nil {
		return err
	}
	if st.Failed {
		return errors.New(st.Message)
	}
	return nil
}

func (r *runner) describeSetup() string {
	all, err := r.o.Client.All(r.ctx)
	if err != nil {
		return ""
	}
	for _, s := range all.Sessions {
		if s.Token != r.token {
			continue
		}
		for _, i := range all.Instances {
			if i.Links.Session == s.ID {
				var nodes []string
				for _, f := range all.Fragments {
					if f.Instance == i.ID {
						nodes = append(nodes, f.Node)
					}
				}
				return fmt.Sprintf("instance %s: %s in pool %s on %s", i.Label, units.FormatHuman(i.Capacity.Bytes), i.Pool, strings.Join(nodes, ", "))
			}
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

// stage runs the stage-ins or stage-outs and prints their progress.
func (r *runner) stage(direction string, stages []directive.Stage) (int, bool) {
	name, failCode := "data_in", ExitBeforeJob
	if direction == model.StageOut {
		name, failCode = "data_out", ExitStageOut
	}
	began := time.Now()
	if len(stages) == 0 {
		// Slurm calls data_in/data_out for every job; there is nothing to ask for here.
		r.phase(name, began, "nothing to stage")
		return 0, true
	}
	reqs, err := jobspec.Stages(stages, direction)
	if err == nil {
		if direction == model.StageIn {
			err = r.o.Client.Stages(r.ctx, r.token, direction, reqs)
		} else {
			err = r.o.Client.Stages(context.Background(), r.token, direction, reqs)
		}
	}
	if err != nil {
		r.fail(name, began, err)
		return failCode, false
	}
	st, err := r.o.Client.WaitStep(context.Background(), r.token, name, r.o.Poll, 0, nil)
	if err != nil {
		r.fail(name, began, err)
		return failCode, false
	}
	var files int64
	var bytes uint64
	for _, s := range st.Stages {
		files += s.FilesDone
		bytes += s.BytesDone
		for _, w := range s.Warnings {
			fmt.Fprintf(r.o.Out, "[spillway] warning: %s line %d: %s\n", name, s.Line, w)
		}
	}
	if st.Failed {
		r.fail(name, began, errors.New(st.Message))
		return failCode, false
	}
	secs := time.Since(began).Seconds()
	rate := ""
	if secs > 0 && bytes > 0 {
		rate = fmt.Sprintf(" (%s/s)", units.FormatHuman(uint64(float64(bytes)/secs)))
	}
	r.phase(name, began, "%d stage(s), %d file(s), %s%s", len(st.Stages), files, units.FormatHuman(bytes), rate)
	return 0, true
}

// teardown destroys the job's session. It waits for stage-out unless hurry. It reports whether
// the teardown completed.
func (r *runner) teardown(hurry bool) bool {
	if r.o.KeepOnFailed && hurry {
		fmt.Fprintf(r.o.Out, "[spillway] keeping session %s for inspection (dwstat all); remove it with: spillway persistent destroy --token %s --hurry\n", r.token, r.token)
		return false
	}
	began := time.Now()
	var err error
	for attempt := 0; attempt < teardownAttempts; attempt++ {
		err = r.o.Client.Teardown(context.Background(), r.token, hurry)
		if err == nil || apiclient.IsNotFound(err) {
			err = nil
			break
		}
	}
	if err == nil {
		var st lifecycle.StepStatus
		st, err = r.o.Client.WaitStep(context.Background(), r.token, lifecycle.PhaseTeardown, r.o.Poll, r.o.StepTimeout, nil)
		if err == nil && st.Failed {
			err = errors.New(st.Message)
		}
	}
	if err != nil {
		r.fail("teardown", began, err)
		return false
	}
	how := ""
	if hurry {
		how = " (hurry)"
	}
	r.phase("teardown", began, "instance released%s; total %.3fs", how, time.Since(r.start).Seconds())
	return true
}

func (r *runner) createPersistent(c directive.CreatePersistent, uid, gid uint32) error {
	req := jobspec.CreatePersistent(c, creatorRun, uid, gid)
	if err := r.o.Client.Setup(r.ctx, req); err != nil {
		return err
	}
	st, err := r.o.Client.WaitStep(r.ctx, c.Name, lifecycle.PhaseSetup, r.o.Poll, r.o.StepTimeout, nil)
	if err == nil && st.Failed {
		err = errors.New(st.Message)
	}
	return err
}

func (r *runner) destroyPersistent(name string, hurry bool) error {
	if err := r.o.Client.Teardown(r.ctx, name, hurry); err != nil {
		if apiclient.IsNotFound(err) {
			return fmt.Errorf("no persistent instance named %s", name)
		}
		return err
	}
	st, err := r.o.Client.WaitStep(r.ctx, name, lifecycle.PhaseTeardown, r.o.Poll, r.o.StepTimeout, nil)
	if err == nil && st.Failed {
		err = errors.New(st.Message)
	}
	return err
}

// runJob runs the script with the DataWarp variables, forwarding SIGINT and SIGTERM to it, and
// returns its exit status.
func (r *runner) runJob(env map[string]string) int {
	began := time.Now()
	argv, err := interpreter(r.o.Script)
	if err != nil {
		r.fail("job", began, err)
		return ExitBeforeJob
	}
	cmd := exec.Command(argv[0], append(argv[1:], r.o.Args...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, "SPILLWAY_JOB_ID="+strings.TrimPrefix(r.token, tokenPrefix), "SPILLWAY_TOKEN="+r.token)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !r.o.Quiet {
		fmt.Fprintf(r.o.Out, "[spillway] %-12s %8s  %s\n", "job", "", strings.Join(cmd.Args, " "))
	}
	if err := cmd.Start(); err != nil {
		r.fail("job", began, err)
		return ExitBeforeJob
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				syscall.Kill(-cmd.Process.Pid, s.(syscall.Signal))
			case <-done:
				return
			}
		}
	}()
	err = cmd.Wait()
	close(done)
	signal.Stop(sigs)
	status := 0
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				status = 128 + int(ws.Signal())
			} else {
				status = ee.ExitCode()
			}
		} else {
			r.fail("job", began, err)
			return ExitBeforeJob
		}
	}
	r.phase("job", began, "exit status %d", status)
	return status
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
