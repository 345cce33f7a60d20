package spillwaycli

import (
	"os"
	"path/filepath"
	"syscall"
)

// StageWorkerName is the small stage worker binary (cmd/spillway-stage-worker), installed
// beside spillway.
const StageWorkerName = "spillway-stage-worker"

// StageWorkerCommand is how the agent of the binary exe starts a stage worker: the small
// binary beside exe when there is a fit one (it starts in a quarter of the CPU: a job that
// stages a checkpoint file by file starts one a file), else `exe stage-worker`. Fit: a
// regular file (not a link), executable, writable by its owner alone, owned by root or by
// exe's owner — no one but who could replace exe itself could replace it (the agent starts
// it as root, and it becomes the job's user as its first act, as `exe stage-worker` does).
func StageWorkerCommand(exe string) []string {
	p := filepath.Join(filepath.Dir(exe), StageWorkerName)
	if fitBeside(exe, p) {
		return []string{p}
	}
	return []string{exe, "stage-worker"}
}

func fitBeside(exe, p string) bool {
	self, err := os.Stat(exe)
	if err != nil {
		return false
	}
	info, err := os.Lstat(p)
	if err != nil || !info.Mode().IsRegular() || info.Mode().Perm()&0o111 == 0 || info.Mode().Perm()&0o022 != 0 {
		return false
	}
	owner, ok1 := info.Sys().(*syscall.Stat_t)
	selfOwner, ok2 := self.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && (owner.Uid == 0 || owner.Uid == selfOwner.Uid)
}
