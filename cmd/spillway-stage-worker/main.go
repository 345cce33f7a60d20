// Command spillway-stage-worker is the stage worker alone (package stage's WorkerMain, what
// `spillway stage-worker` runs): the agent starts one per stage, as the job's user, and a
// libdatawarp job starts one per file. It links none of the daemons' libraries, so it starts
// in about 1.7 ms of CPU instead of the full spillway binary's 7.5 ms (deps_test.go keeps it
// so). The agent uses it when it lies beside its own binary (spillwaycli.StageWorkerCommand).
package main

import (
	"os"

	"github.com/spillway-hpc/spillway/internal/stage"
)

func main() { os.Exit(stage.WorkerMain(os.Args[1:], os.Stdin, os.Stdout)) }
