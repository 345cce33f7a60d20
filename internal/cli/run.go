package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spillway-hpc/spillway/internal/runjob"
)

const runUsage = `Usage: spillway run [options] SCRIPT [ARGS...]

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

By default Spillway runs embedded: the controller and a storage agent run inside this
command, with the state, the pool's storage and the mounts under $SPILLWAY_HOME
(default ~/.local/share/spillway), created on first use. --controller or --config
point it at a running controller instead; this machine's agent must then be registered
with it (--node names it).

The job runs as you, in the current directory, with your environment plus the DataWarp
variables, SPILLWAY_JOB_ID (the job id, also what %j becomes in directives) and
SPILLWAY_TOKEN (the session's token, run<id>). SIGINT and SIGTERM are passed to the job;
stage-out and teardown still run afterwards.

Exit status: the job's own status when every step succeeded; otherwise
  64  bad command line or unreadable script
  65  invalid directives (nothing was allocated)
  69  the burst buffer failed before the job ran (the job did not run)
  74  the job succeeded but stage-out or teardown failed
When the job itself failed, its status wins.

Examples:
  spillway run examples/hello-scratch.sh
  spillway run --keep-on-failure examples/stage-in-directory.sh /path/to/input
`

func runMain(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("spillway run", runUsage, stderr)
	var conn connection
	conn.flags(fs, true)
	node := fs.String("node", "", "this compute node's name as its agent registered (default: the host name)")
	quiet := fs.Bool("quiet", false, "do not print the phases")
	keep := fs.Bool("keep-on-failure", false, "after a failed step, keep the session for inspection instead of tearing it down")
	if code, ok := parse(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() < 1 {
		fmt.Fprintln(stderr, "spillway run: no job script given")
		fs.Usage()
		return runjob.ExitUsage
	}
	if _, err := os.Stat(fs.Arg(0)); err != nil {
		fmt.Fprintf(stderr, "spillway run: %v\n", err)
		return runjob.ExitUsage
	}
	sess, err := conn.connect(true, quietLogger(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "spillway run: %v\n", err)
		return runjob.ExitBeforeJob
	}
	defer sess.Close()
	name := *node
	if name == "" {
		if sess.running != nil {
			name = sess.running.NodeName
		} else if name, err = os.Hostname(); err != nil {
			fmt.Fprintf(stderr, "spillway run: %v\n", err)
			return runjob.ExitUsage
		}
	}
	if sess.home != nil && !*quiet {
		fmt.Fprintf(stderr, "[spillway] embedded: home %s\n", sess.home.Dir)
	}
	return runjob.Run(context.Background(), runjob.Options{
		Script: fs.Arg(0), Args: fs.Args()[1:], Client: sess.client, Node: name, Out: stderr,
		Poll: sess.cfg.Client.PollInterval.D(), StepTimeout: sess.cfg.Client.StepTimeout.D(),
		JobIDs: sess.client.NextRunID, Quiet: *quiet, KeepOnFailed: *keep,
	})
}
