package instage

import (
	"context"
	"path"
	"strings"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
)

// DataWarp's dwcli stage names what it stages by ids: --session and --configuration, a
// directory of the instance (--dir, relative to its root) and a PFS directory
// (--backing-path). Named turns them into the Target a path under the mount resolves to, so
// that both forms go through the same requests. The Target has no local path: the caller
// need not be on a node where the instance is mounted (an administrator on a login node), so
// what only the mount could show (the burst buffer side exists) is checked by the stage
// itself, as the session's user.

// Named resolves --session session --configuration conf --dir dir.
func (s *Stager) Named(ctx context.Context, session, conf int64, dir string) (Target, error) {
	rel, err := instanceDir(dir)
	if err != nil {
		return Target{}, err
	}
	api, err := s.API()
	if err != nil {
		return Target{}, err
	}
	all, err := api.All(ctx)
	if err != nil {
		return Target{}, errorf(syscall.EIO, "%v", err)
	}
	var token string
	var persistentSession bool
	for _, x := range all.Sessions {
		if x.ID == session {
			token, persistentSession = x.Token, x.Persistent
		}
	}
	if token == "" {
		return Target{}, errorf(syscall.ENOENT, "no session %d (dwstat sessions lists yours)", session)
	}
	for _, c := range all.Configurations {
		if c.ID != conf {
			continue
		}
		for _, i := range all.Instances {
			if i.ID != c.Links.Instance {
				continue
			}
			owner := ""
			for _, x := range all.Sessions {
				if x.ID == i.Links.Session {
					owner = x.Token
				}
			}
			info := lifecycle.MountInfo{Token: token, Session: session, Configuration: conf, AccessMode: c.AccessMode, Instance: i.ID}
			switch {
			case i.Links.Session == session && !persistentSession:
				info.Var = lifecycle.JobVar(&model.Configuration{Type: c.Type, AccessMode: c.AccessMode})
			case owner != "": // a persistent instance: its own session's, or one the job uses
				info.Var = lifecycle.VarPersistentPre + owner
			}
			if info.Var == "" {
				return Target{}, errorf(syscall.EINVAL, "configuration %d (type=%s, access_mode=%s) is not one session %d can stage into", conf, c.Type, c.AccessMode, session)
			}
			return Target{Rel: rel, Info: info}, nil
		}
	}
	return Target{}, errorf(syscall.ENOENT, "no configuration %d (dwstat configurations lists them)", conf)
}

// instanceDir cleans a --dir: relative to the instance's root, with or without the leading
// "/" DataWarp asked for (${path#$DW_JOB_STRIPED} drops it when the variable ends in "/").
func instanceDir(dir string) (string, error) {
	if dir == "" {
		return "/", nil
	}
	for _, c := range strings.Split(dir, "/") {
		if c == ".." {
			return "", errorf(syscall.EINVAL, "--dir %s: give a directory inside the instance, relative to its root (e.g. /results), without ..", dir)
		}
	}
	return path.Clean("/" + dir), nil
}

// QueryTarget is the controller's answer about the stages under t: counts and stages.
func (s *Stager) QueryTarget(ctx context.Context, t Target) (controllerapi.JobStagesReply, error) {
	api, err := s.API()
	if err != nil {
		return controllerapi.JobStagesReply{}, err
	}
	return api.QueryJobStages(ctx, t.Info.Token, t.Info.Var, t.Rel)
}

// TerminateTarget stops the waiting and running stages under t.
func (s *Stager) TerminateTarget(ctx context.Context, t Target) (int, error) {
	api, err := s.API()
	if err != nil {
		return 0, err
	}
	return api.TerminateJobStages(ctx, t.Info.Token, t.Info.Var, t.Rel)
}
