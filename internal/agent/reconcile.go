package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
)

// clusterFile remembers which controller this node serves, so that a controller with a
// fresh, empty state database cannot make the agent delete everything.
const clusterFile = "cluster-id"

// Reconcile applies the controller's view of this node: it restores mounts the controller
// counts on, and removes fragments and namespaces the controller no longer knows, if they are
// older than grace (a fragment created a moment ago may not be in an answer computed earlier).
func (a *Agent) Reconcile(ctx context.Context, as agentapi.Assignment, grace time.Duration) {
	a.reconcile(ctx, as, grace, a.heartbeatsSent.Load()+1)
}

// reconcile applies the answer to heartbeat number sent (RunHeartbeats): it says nothing of
// the mounts the controller asked for after that heartbeat left.
func (a *Agent) reconcile(ctx context.Context, as agentapi.Assignment, grace time.Duration, sent uint64) {
	a.mu.Lock()
	recentlyUnmounted := map[string]bool{}
	for path, at := range a.unmountedAt {
		if time.Since(at) > grace {
			delete(a.unmountedAt, path) // every answer since was computed after it was recorded
		} else {
			recentlyUnmounted[path] = true
		}
	}
	a.mu.Unlock()
	for _, m := range as.Mounts {
		if recentlyUnmounted[m.MountPath] {
			continue // the answer predates the controller's record of its unmount (post_run)
		}
		if err := a.mount(ctx, m); err != nil {
			a.opt.Log.Warn("cannot restore a mount the controller expects", "path", m.MountPath, "err", err)
		}
	}
	a.unmountUnknown(as.Mounts, as.Expected, grace, sent)
	if a.root {
		a.reapSwaps(ctx, as, grace)
	}
	if a.ssd == "" {
		return
	}
	if !a.sameCluster(as.ClusterID) {
		return
	}
	liveFrag := map[int64]bool{}
	for _, id := range as.Fragments {
		liveFrag[id] = true
	}
	liveNS := map[[2]int64]bool{}
	for _, ns := range as.Namespaces {
		liveNS[[2]int64{ns.FragmentID, ns.ID}] = true
	}
	a.fragLock.Lock()
	defer a.fragLock.Unlock()
	// Namespaces are looked for at most every quarter of grace (and 30 s): a readdir per
	// fragment, most of a heartbeat's cost on a node holding thousands; one the controller
	// forgot is removed once older than grace all the same, at most that much later.
	sweep := time.Since(a.namespaceSweep) >= min(grace/4, 30*time.Second)
	if sweep {
		a.namespaceSweep = time.Now()
	}
	entries, _ := os.ReadDir(filepath.Join(a.ssd, "fragment"))
	for _, e := range entries {
		fid, err := strconv.ParseInt(e.Name(), 10, 64)
		if err != nil {
			continue
		}
		dir := a.fragmentDir(fid)
		if !liveFrag[fid] {
			if olderThan(dir, grace) {
				a.opt.Log.Info("removing a fragment the controller no longer knows", "fragment", fid)
				if err := a.removeFragmentStorage(fid); err != nil {
					a.opt.Log.Warn("cannot remove a fragment the controller no longer knows", "fragment", fid, "err", err)
				}
			}
			continue
		}
		if !sweep {
			continue
		}
		nss, _ := os.ReadDir(filepath.Join(dir, "namespace"))
		for _, ns := range nss {
			nid, err := strconv.ParseInt(ns.Name(), 10, 64)
			if err != nil || liveNS[[2]int64{fid, nid}] {
				continue
			}
			nsDir := a.namespaceDir(fid, nid)
			if olderThan(nsDir, grace) {
				a.opt.Log.Info("removing a namespace the controller no longer knows", "fragment", fid, "namespace", nid)
				removeAll(nsDir)
			}
		}
	}
}

// sameCluster adopts the first controller id it hears and refuses to clean up for another.
func (a *Agent) sameCluster(id string) bool {
	if id == "" {
		return false
	}
	path := filepath.Join(a.ssd, clusterFile)
	raw, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return os.WriteFile(path, []byte(id+"\n"), 0o644) == nil
	}
	if err != nil {
		return false
	}
	if stored := strings.TrimSpace(string(raw)); stored != id {
		a.opt.Log.Error("this node's fragments belong to another controller state (cluster id differs); not removing anything. If the old state is gone for good, delete the fragments by hand and remove "+path,
			"node_cluster", strings.TrimSpace(string(raw)), "controller_cluster", id)
		return false
	}
	return true
}

// unmountUnknown unmounts the mounts the answer to heartbeat number sent does not list (as
// made or as expected), but those the controller asked for within grace or after that
// heartbeat left (its answer was computed before the controller recorded them: a job may
// already be running in them).
func (a *Agent) unmountUnknown(live []agentapi.MountSpec, expected []string, grace time.Duration, sent uint64) {
	keep := map[string]bool{}
	for _, m := range live {
		keep[m.MountPath] = true
	}
	for _, path := range expected {
		keep[path] = true
	}
	stale := func(path string, m *mounted) bool {
		return !keep[path] && !m.staging && !m.swap && time.Since(m.since) > grace && m.confirmed < sent
	}
	a.mu.Lock()
	var candidates []string
	for path, m := range a.mounts {
		if stale(path, m) {
			candidates = append(candidates, path)
		}
	}
	a.mu.Unlock()
	for _, path := range candidates {
		unlock := a.lockPath(path)
		a.mu.Lock()
		m := a.mounts[path]
		still := m != nil && stale(path, m) // not asked for again while we waited for the lock
		a.mu.Unlock()
		if still {
			a.opt.Log.Info("unmounting a mount the controller no longer knows", "path", path)
			a.unmountLocked(path)
		}
		unlock()
	}
}

func olderThan(path string, d time.Duration) bool {
	st, err := os.Stat(path)
	return err == nil && time.Since(st.ModTime()) > d
}

// RunHeartbeats reports to the controller every interval until ctx ends, and reconciles with
// each answer. send is the controller's Heartbeat (in-process) or the API client's.
func (a *Agent) RunHeartbeats(ctx context.Context, interval, grace time.Duration, send func(context.Context, agentapi.NodeReport) (agentapi.Assignment, error)) {
	failing := false
	for {
		report, _ := a.Report(ctx)
		sent := a.heartbeatsSent.Add(1)
		as, err := send(ctx, report)
		switch {
		case err != nil && ctx.Err() == nil:
			if !failing {
				a.opt.Log.Warn("cannot report to the controller; retrying", "err", err)
			}
			failing = true
		case err == nil:
			if failing {
				a.opt.Log.Info("reporting to the controller again")
			}
			failing = false
			a.reconcile(ctx, as, grace, sent)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}
