package spillwaycli

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spillway-hpc/spillway/internal/cli"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/runjob"
)

const runUsage = `Usage: spillway run [options] SCRIPT [ARGS...]
       spillway run [options] --retry-stage-out TOKEN

Run a job script that carries DataWarp directives (#DW jobdw, #DW persistentdw,
#DW stage_in, #DW stage_out, #BB create_persistent, #BB destroy_persistent) on this
machine, with no workload manager. Spillway goes through the same steps a DataWarp
system goes through under Slurm, and prints each with its duration:

  job_process  check the directives (errors name the line, the field and the fix)
  setup        allocate the instance in its pool
  data_in      stage the #DW stage_in files and directories in, as you
  paths        compute $DW_JOB_STRIPED, $DW_JOB_PRIVATE, $DW_PERSISTENT_STRIPED_<name>
  pre_run      mount the instance at its mount path
  job          run SCRIPT with ARGS and those variables (values end in /)
  post_run     unmount
  data_out     stage the #DW stage_out files out, as you
  teardown     release the instance

By default Spillway runs embedded: the controller and a storage agent run in a small
background server of the home $SPILLWAY_HOME (default ~/.local/share/spillway), which
holds the state, the pool's storage and the mounts, is created on first use, serves every
command on that home (concurrent runs too) and exits when idle (spillway home --help).
--controller or --config point it at a running controller instead; this machine's agent
must then be registered with it (--node names it).

The job runs as you, in the current directory, with your environment plus the DataWarp
variables, SPILLWAY_JOB_ID (the job id, also what %j becomes in directives) and
SPILLWAY_TOKEN (the session's token, run<id>).

Interrupts (SIGINT, SIGTERM, SIGHUP), in every phase:
  first   before the job: the job does not run and the burst buffer is released;
          during the job: the signal goes to the job, and its stage-out still runs;
          after the job: the stage-out goes on (it holds the job's results)
  second  hurry: the job is killed, the stage-out skipped or cancelled, the session
          torn down at once
  third   leave at once; the home's server cleans the session up
A run that is killed (SIGKILL) is cleaned up by the home's server, or by the next
command on the home: its job is killed, its stage-out run if its job had started, its
session released; the next spillway run prints what was done.

When the stage-out fails (or the unmount before it), the session is kept, since its
instance holds the only copy of the results, and the commands to retry the stage-out
(--retry-stage-out) or to discard the results are printed. --discard-failed-stage-out
releases it instead.

Exit status: the job's own status when every step succeeded; otherwise
  64  bad command line or unreadable script
  65  invalid directives (nothing was allocated)
  69  the burst buffer failed before the job ran (the job did not run)
  74  the job succeeded but stage-out or teardown failed
  128+N  interrupted by signal N before the job ran, or hurried
When the job itself failed, its status wins.

Examples:
  spillway run examples/hello-scratch.sh
  spillway run --keep-on-failure examples/stage-in-directory.sh /path/to/input
  spillway run --retry-stage-out run45
`

func runMain(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("spillway run", runUsage, stderr)
	var conn cli.Connection
	conn.Flags(fs, true)
	node := fs.String("node", "", "this compute node's name as its agent registered (default: the host name)")
	quiet := fs.Bool("quiet", false, "do not print the phases")
	keep := fs.Bool("keep-on-failure", false, "after a failure before the job, keep the session for inspection instead of tearing it down")
	discard := fs.Bool("discard-failed-stage-out", false, "when the stage-out fails, release the session anyway: the job's results in it are lost")
	retry := fs.String("retry-stage-out", "", "stage out the kept session `TOKEN` again (after a failed stage-out), then release it")
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if *retry == "" && fs.NArg() < 1 {
		fmt.Fprintln(stderr, "spillway run: no job script given")
		fs.Usage()
		return runjob.ExitUsage
	}
	if *retry != "" && fs.NArg() > 0 {
		fmt.Fprintf(stderr, "spillway run: --retry-stage-out takes no script (%s): it stages out what the kept session's #DW stage_out directives named\n", fs.Arg(0))
		return runjob.ExitUsage
	}
	if *retry == "" {
		if _, err := os.Stat(fs.Arg(0)); err != nil {
			fmt.Fprintf(stderr, "spillway run: %v\n", err)
			return runjob.ExitUsage
		}
	}
	sess, home, err := connect(&conn, true, cli.QuietLogger(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "spillway run: %v\n", err)
		return runjob.ExitBeforeJob
	}
	defer sess.Close()
	name := *node
	if name == "" {
		if home != nil {
			name = home.NodeName()
		} else if name, err = os.Hostname(); err != nil {
			fmt.Fprintf(stderr, "spillway run: %v\n", err)
			return runjob.ExitUsage
		}
	}
	o := runjob.Options{
		Client: sess.Client(), Node: name, Out: stderr,
		Poll: sess.Config().Client.PollInterval.D(), StepTimeout: sess.Config().Client.StepTimeout.D(),
		JobIDs: sess.Client().NextRunID, Quiet: *quiet, KeepOnFailed: *keep, DiscardFailedStageOut: *discard,
		TeardownAttempts: sess.Config().Client.TeardownAttempts, TeardownRetryWait: sess.Config().Client.TeardownRetryWait.D(),
		Self: self(), ConnArgs: sess.ConnArgs(),
	}
	// The job's libdatawarp and dwcli stage reach this controller with this binary.
	if exe, err := os.Executable(); err == nil && os.Getenv("SPILLWAY_BIN") == "" {
		o.JobEnv = append(o.JobEnv, "SPILLWAY_BIN="+exe)
	}
	if path := conn.SystemConfigPath(true); path != "" {
		o.JobEnv = append(o.JobEnv, "SPILLWAY_CONFIG="+cli.AbsOr(path))
	}
	if home != nil {
		o.JobEnv = append(o.JobEnv, "SPILLWAY_HOME="+home.Dir)
		o.Records = home.Records()
		o.KeepAlive = home.Config.Home.ReapInterval.D()
		if !*quiet {
			fmt.Fprintf(stderr, "[spillway] embedded: home %s\n", home.Dir)
		}
		cleanUp(sess, o.Records, stderr)
		if exe, err := os.Executable(); err == nil {
			if why := home.Stale(exe); why != "" {
				fmt.Fprintf(stderr, "[spillway] note: %s; `%s` makes the next command start a fresh one\n", why, runjob.ShellJoin(append(self(), append([]string{"home", "stop"}, sess.ConnArgs()...)...)))
			}
		}
	}
	if *retry != "" {
		return runjob.RetryStageOut(context.Background(), o, *retry)
	}
	o.Script, o.Args = fs.Arg(0), fs.Args()[1:]
	return runjob.Run(context.Background(), o)
}

// cleanUp finishes what `spillway run`s that are gone left on the home (the home's server does
// the same every home.reap_interval), waits for the hurried teardowns it asked (so that their
// capacity is free for this run), and prints what was cleaned since the last run.
func cleanUp(sess *cli.Session, records *runjob.Records, stderr io.Writer) {
	ctx := context.Background()
	cleanups, err := runjob.Reap(ctx, sess.Client(), *records)
	if err != nil {
		fmt.Fprintf(stderr, "[spillway] warning: %v\n", err)
	}
	for _, c := range cleanups {
		if c.Hurried {
			sess.Client().WaitStep(ctx, c.Token, lifecycle.PhaseTeardown, sess.Config().Client.StepTimeout.D())
		}
	}
	for _, note := range runjob.Notes(*records) {
		fmt.Fprintf(stderr, "[spillway] %s\n", note)
	}
}
