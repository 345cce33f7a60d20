package spillwaycli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spillway-hpc/spillway/internal/cli"
	"github.com/spillway-hpc/spillway/internal/layout"
)

const layoutUsage = `Usage: spillway layout [-o FILE] [--compact] [connection options]

Write a layout snapshot of the running burst buffer: its pools, storage nodes, instances
with their fragments, configurations and sessions with their compute nodes, in the JSON
format the bbsim simulator reads ("Spillway layout snapshot" in docs/bbsim.md; JSON Schemas
sim/bbsim/schemas/spillway-layout-v1.json and -v2.json). bbsim places the
snapshot on a model of the machine's network and predicts the bandwidth a job will get from
its instance, and what limits it:

  spillway layout -o snap.json
  bbsim predict snap.json --machine MACHINE --session JOBID [--concurrent JOBID2]

The snapshot is one read of the controller's state (GET /dw/v1/all, as dwstat all), so its
objects are consistent with each other. What it holds:
  pools           granularity in bytes; quantity and free in grains
  nodes           storage nodes only (nodes in a pool): capacity in bytes, online, drain
  instances       capacity in bytes, the owning session's token (job id or persistent
                  name), the pool, and the fragments: which storage node holds how many bytes
  configurations  type (scratch, cache, swap) and access mode (striped, private, loadbalance);
                  a cache's settings (PFS directory, dirty watermarks, modified_threshold,
                  read_ahead), which make the snapshot format version 2 (version 1
                  otherwise, so an older bbsim still reads a snapshot without caches)
  sessions        token, owner uid and client_nodes: the job's compute nodes, known once the
                  workload manager has named them (dw_wlm_cli setup or pre_run); empty for a
                  persistent instance
Every other field of the controller (states, times, paths, stages) is left out. An instance
without fragments cannot be placed and is left out, with its configurations, with a warning
on standard error.

Output goes to standard output, or to FILE with -o (written beside it and renamed into place,
so a reader never sees half a snapshot; - is standard output).

The controller is found as dwstat finds it: --controller, else --config or $SPILLWAY_CONFIG
(a system install, default /etc/spillway/spillway.toml if it exists), else the one-machine
home (--home, $SPILLWAY_HOME or ~/.local/share/spillway).

Exit status: 0 written; 1 the controller could not be reached, its state could not be
converted, or FILE could not be written; 64 bad usage.

Examples:
  spillway layout                                    print the snapshot
  spillway layout -o /tmp/snap.json --config /etc/spillway/spillway.toml
  spillway layout --controller unix:/run/spillway/controller.sock --compact | jq .sessions
`

func layoutMain(args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("spillway layout", layoutUsage, stderr)
	var conn cli.Connection
	conn.Flags(fs, true)
	var output string
	fs.StringVar(&output, "o", "-", "write the snapshot to `FILE` (- for standard output)")
	fs.StringVar(&output, "output", "-", "the same as -o")
	compact := fs.Bool("compact", false, "print the JSON on one line instead of indented")
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "spillway layout: unexpected argument %q (the snapshot goes to -o FILE or standard output)\n", fs.Arg(0))
		return 64
	}
	sess, err := conn.Connect(false, cli.QuietLogger(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "spillway layout: %v\n", err)
		return 1
	}
	defer sess.Close()
	all, err := sess.Client().All(context.Background())
	if err != nil {
		fmt.Fprintf(stderr, "spillway layout: %v\n", err)
		return 1
	}
	snap, warnings, err := layout.FromAll(all, layout.Options{Generated: time.Now(), Controller: sess.Client().Address()})
	if err != nil {
		fmt.Fprintf(stderr, "spillway layout: the controller's state cannot be converted: %v\n", err)
		return 1
	}
	for _, w := range warnings {
		fmt.Fprintf(stderr, "spillway layout: warning: %s\n", w)
	}
	var data []byte
	if *compact {
		data, err = json.Marshal(snap)
	} else {
		data, err = json.MarshalIndent(snap, "", "  ")
	}
	if err != nil {
		fmt.Fprintf(stderr, "spillway layout: %v\n", err)
		return 1
	}
	data = append(data, '\n')
	if output == "-" || output == "" {
		if _, err := stdout.Write(data); err != nil {
			fmt.Fprintf(stderr, "spillway layout: %v\n", err)
			return 1
		}
		return 0
	}
	if err := cli.WriteFileAtomic(output, data); err != nil {
		fmt.Fprintf(stderr, "spillway layout: -o %s: %v\n", output, err)
		return 1
	}
	return 0
}
