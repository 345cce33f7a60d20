package stage

// How a worker becomes the job's user without ever being traceable by them: package asuser
// (shared with the PFS door's worker, internal/pfsio). A process the user can ptrace is
// theirs entirely (its memory, its descriptors, its code), and a worker started with the
// user's credentials was traceable from its execve until it made itself non-dumpable, long
// enough for a user watching for it to PTRACE_SEIZE it, rewrite its prctl and later read the
// instance's directories from /proc/<pid>/fd. So a root agent starts its workers as root,
// each worker makes itself non-dumpable first, and only then takes the user's groups, gid and
// uid; the agent checks all of this again before it hands over the directories (handoff.go).

import "github.com/spillway-hpc/spillway/internal/asuser"

// workerName names the stage worker in the errors of asuser.
const workerName = "the staging worker"

// becomeStageUser makes the worker non-dumpable and, when args name an identity (the agent
// started it as root), takes that identity for every thread. It returns the arguments left.
func becomeStageUser(args []string) ([]string, error) { return asuser.Become(args, workerName) }
