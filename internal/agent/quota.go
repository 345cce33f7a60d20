package agent

// Fragments under project quotas: when the SSD path's file system enforces them, a fragment
// holding a whole instance gets a project id and a hard limit of its capacity, and the
// co-located mounts of its namespaces write through the kernel (FUSE passthrough) at the
// speed of the disk. See usage/quota.go and docs/decisions.md.

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// openOwnDir opens a directory of the agent's own tree (the fragments, root's alone) without
// following a link.
func openOwnDir(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// limitFragment puts the fragment directory dir (just made, its subdirectories not yet)
// under a project quota of the fragment's capacity when the instance lies wholly in it and
// the file system enforces project quotas on root's writes (XFS with prjquota). It reports
// whether the fragment has its quota; the first call logs which mode the node runs in.
func (a *Agent) limitFragment(dir string, spec agentapi.FragmentSpec) bool {
	if !a.root || spec.Capacity == 0 || spec.Capacity < spec.InstanceCapacity {
		// A striped instance's files are spread over servers: the kernel cannot write them,
		// so a quota would only change how capacity is counted.
		return false
	}
	fd, err := openOwnDir(dir)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	id := usage.ProjectID(spec.ID)
	if _, err := usage.CheckProjectQuota(fd, id); err == nil {
		return true // set by an earlier try of this creation
	}
	err = usage.SetProjectQuota(fd, id, spec.Capacity)
	if err == nil {
		_, err = usage.CheckProjectQuota(fd, id) // enforced on root's writes (XFS)?
		if err != nil {
			usage.ClearProjectQuota(fd, id)
		}
	}
	a.quotaOnce.Do(func() {
		if err != nil {
			a.opt.Log.Info("fragments get no project quota: co-located mounts write through the agent "+
				"(put agent.ssd_path on XFS mounted with prjquota to write at the disk's speed)",
				"ssd_path", a.ssd, "reason", err)
		} else {
			a.opt.Log.Info("fragments get a project quota of their capacity: co-located mounts of instances "+
				"on one node write through the kernel (FUSE passthrough)", "ssd_path", a.ssd)
		}
	})
	return err == nil
}

// fragmentQuota is the project id of the fragment when its directory is under its quota, or 0.
func (a *Agent) fragmentQuota(fragmentID int64) uint32 {
	if !a.root {
		return 0
	}
	fd, err := openOwnDir(a.fragmentDir(fragmentID))
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	id := usage.ProjectID(fragmentID)
	if _, err := usage.CheckProjectQuota(fd, id); err != nil {
		return 0
	}
	return id
}

// unlimitFragment removes the limit of a removed fragment's project, if it had one.
func (a *Agent) unlimitFragment(fragmentID int64) {
	if !a.root {
		return
	}
	fd, err := openOwnDir(filepath.Join(a.ssd, "fragment"))
	if err != nil {
		return
	}
	defer unix.Close(fd)
	id := usage.ProjectID(fragmentID)
	if _, limit, err := usage.ProjectUsage(fd, id); err != nil || limit == 0 {
		return // no quotas here, or none set
	}
	if err := usage.ClearProjectQuota(fd, id); err != nil && !errors.Is(err, unix.ENOENT) {
		a.opt.Log.Warn("cannot remove the project quota of a deleted fragment", "fragment", fragmentID, "err", err)
	}
}
