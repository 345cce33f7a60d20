package controller

import (
	"os"
	"path"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/pfsaccess"
)

// euid is the controller's effective uid, checkPFS the check made as it (variables for tests).
var (
	euid     = os.Geteuid
	checkPFS = pfsaccess.Check
)

// checkPFSAsOwner checks that the owner of a setup can enter each cache's PFS directory, when
// the controller can tell honestly: only when it runs as that owner, not as root (a
// one-machine home, which is its user's own process). A system controller runs as a service
// user and cannot decide for the job's user: there the storage node's PFS door, running as
// the user, checks at setup (the data path's integration, issue 20).
func checkPFSAsOwner(req lifecycle.Setup) error {
	id := euid()
	if id == 0 || uint32(id) != req.Owner {
		return nil
	}
	var all []lifecycle.InstanceRequest
	if req.Instance != nil {
		all = append(all, *req.Instance)
	}
	all = append(all, req.More...)
	for _, r := range all {
		// A path the lifecycle refuses anyway (relative, not clean) is not looked up.
		if r.Type == model.TypeCache && r.Cache != nil && path.IsAbs(r.Cache.PFS) && path.Clean(r.Cache.PFS) == r.Cache.PFS {
			if err := checkPFS(r.Cache.PFS); err != nil {
				return &lifecycle.UserError{Msg: err.Error()}
			}
		}
	}
	return nil
}
