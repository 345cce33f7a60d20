package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/swaparea"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"golang.org/x/sys/unix"
)

// Swap areas on the burst buffer (#DW swap, issue 22; docs/architecture.md, "Swap areas on
// compute nodes"). The mechanism is package swaparea; the agent decides where the file is
// (the fragment's namespace directory when the storage node is this node, its own mount of
// the namespace otherwise), remembers each area in a record under its swap directory (so that
// a restarted agent finds its areas again, and the reaper the ones the controller forgot),
// polls detaches against their bound and reports the areas' counters.

// SwapOptions configure the agent's swap areas ([swap]).
type SwapOptions struct {
	// Dir holds the records of the node's swap areas and the mounts of remote ones: root's,
	// 0700. "" means "swap" under Options.SSDPath (which a compute-only node has too).
	Dir string
	// DetachTimeout bounds the reaper's swapoff of an area the controller no longer lists,
	// and a detach whose spec gives none ([swap] detach_timeout; 0: 5 minutes).
	DetachTimeout time.Duration
	// LockMemory: mlockall before the first remote area is attached ([swap] lock_agent_memory).
	LockMemory bool
}

// swapRecord is what the agent keeps about an area, in Dir/<id>.json.
type swapRecord struct {
	Spec      agentapi.SwapSpec `json:"spec"`
	Root      string            `json:"root"` // swaparea.Spec
	Rel       string            `json:"rel"`
	MountPath string            `json:"mount_path,omitempty"` // the agent's mount of a remote area's namespace
	Device    string            `json:"device,omitempty"`
	Base      swaparea.Counters `json:"base"` // the loop device's counters at attach
	Since     time.Time         `json:"since"`
	Pid       int               `json:"pid"` // the agent process that attached it
}

func (r swapRecord) area() swaparea.Spec {
	return swaparea.Spec{Root: r.Root, Rel: r.Rel, Name: r.Spec.FileName, Size: r.Spec.Size, Priority: r.Spec.Priority,
		Label: "spillway-" + strconv.FormatInt(r.Spec.ID, 10)}
}

// swapState is one area on this node.
type swapState struct {
	mu      sync.Mutex // serializes the area's attach, detach and release
	rec     swapRecord
	off     *swaparea.Swapoff // the swapoff under way (or ended, not yet looked at)
	failed  string            // the failure of the last detach, once reported
	problem string            // what is wrong with the area now (a storage node lost), "" if nothing
	probing bool              // a look at its file is under way
	last    swaparea.Counters // its counters when last read (the loop device goes at swapoff)
}

type swapAreas struct {
	mu     sync.Mutex
	loaded bool
	areas  map[int64]*swapState
	locked bool // mlockall done
}

func (a *Agent) swapDir() (string, error) {
	dir, err := a.swapPath()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Join(dir, "mnt"), 0o700); err != nil {
		return "", fmt.Errorf("swap areas' directory %s: %w", dir, err)
	}
	os.Chmod(dir, 0o700)
	return dir, nil
}

// swapPath is the swap areas' directory (swapDir makes it).
func (a *Agent) swapPath() (string, error) {
	dir := a.opt.Swap.Dir
	if dir == "" {
		if a.opt.SSDPath == "" {
			return "", errors.New("this agent has no directory for its swap areas' records: set agent.ssd_path (a compute-only node keeps them in its \"swap\" directory)")
		}
		ssd, err := filepath.Abs(a.opt.SSDPath)
		if err != nil {
			return "", err
		}
		dir = filepath.Join(ssd, "swap")
	}
	return dir, nil
}

// loadSwaps reads the records of the areas a previous run of the agent attached (once).
func (a *Agent) loadSwaps() {
	s := &a.swaps
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loaded {
		return
	}
	s.loaded = true
	if s.areas == nil {
		s.areas = map[int64]*swapState{}
	}
	dir, err := a.swapPath()
	if err != nil {
		return
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	for _, p := range names {
		raw, err := os.ReadFile(p)
		var rec swapRecord
		if err != nil || json.Unmarshal(raw, &rec) != nil || rec.Spec.ID == 0 {
			a.opt.Log.Warn("ignoring an unreadable swap area record", "path", p, "err", err)
			continue
		}
		st := &swapState{rec: rec}
		found, ok := swaparea.Find(rec.area().File())
		switch {
		case ok && rec.MountPath != "" && rec.Pid != os.Getpid():
			// The mount the loop device reads through was served by the previous agent
			// process; it died with it, and a loop device cannot be given another file.
			st.problem = fmt.Sprintf("swap area %d (%s over %s) was served by this node's agent through its mount of storage node %s's namespace, which ended when that agent process stopped: "+
				"pages paged out there cannot come back, and a process that needs one is killed (SIGBUS); detach it once its job has ended",
				rec.Spec.ID, found.Device, rec.area().File(), rec.Spec.StorageNode)
			a.opt.Log.Error("a remote swap area lost its mount when the agent restarted", "swap", rec.Spec.ID, "device", found.Device, "job", rec.Spec.Job)
		case ok:
			a.opt.Log.Info("found a swap area attached before the agent started", "swap", rec.Spec.ID, "device", found.Device, "swapping", found.Swapping, "job", rec.Spec.Job)
		default:
			// Not attached (the node restarted, or the agent died during the attach): its
			// device may be another's by now. The reaper removes it once the controller lets go.
			st.rec.Device = ""
		}
		s.areas[rec.Spec.ID] = st
	}
	// Areas over files of this agent's with no record (records removed by hand): said, left
	// alone — the agent does not know whose they are.
	known := map[string]bool{}
	for _, st := range s.areas {
		known[st.rec.area().File()] = true
	}
	roots := []string{filepath.Join(dir, "mnt")}
	if a.ssd != "" {
		roots = append(roots, filepath.Join(a.ssd, "fragment"))
	}
	for _, area := range swaparea.List(roots...) {
		if area.Swapping && !known[area.File] {
			a.opt.Log.Warn("a swap area over a file of this agent's has no record: left alone; swapoff it and detach its loop device by hand once its job is gone",
				"device", area.Device, "file", area.File)
		}
	}
}

func (a *Agent) swapState(id int64, create bool) *swapState {
	a.loadSwaps()
	a.swaps.mu.Lock()
	defer a.swaps.mu.Unlock()
	st := a.swaps.areas[id]
	if st == nil && create {
		st = &swapState{}
		a.swaps.areas[id] = st
	}
	return st
}

func (a *Agent) saveSwap(rec swapRecord) error {
	dir, err := a.swapDir()
	if err != nil {
		return err
	}
	raw, _ := json.MarshalIndent(rec, "", "  ")
	return writeFileAtomic(filepath.Join(dir, strconv.FormatInt(rec.Spec.ID, 10)+".json"), raw)
}

func (a *Agent) forgetSwap(id int64) {
	if dir, err := a.swapPath(); err == nil {
		os.Remove(filepath.Join(dir, strconv.FormatInt(id, 10)+".json"))
	}
	a.swaps.mu.Lock()
	delete(a.swaps.areas, id)
	a.swaps.mu.Unlock()
}

// lockMemory locks the agent's memory before it serves its first remote swap area. Its FUSE
// server is then on the page-out path: the kernel frees a page of a job by writing it to the
// loop device, whose writes go to the agent's mount and so to the agent, which sends them to
// the storage node. A page of the agent's own that was paged out (to that very area, or
// anywhere) would have to come back before the agent could serve the page-out that frees
// memory: under memory pressure, a deadlock. mlockall(MCL_CURRENT|MCL_FUTURE) keeps every
// page it has and will map resident. Go copes: the runtime reserves its heap with PROT_NONE
// mappings (not locked, no memory) and maps them readable as the heap grows, which
// MCL_FUTURE then makes resident at once; its scavenger's MADV_DONTNEED on locked pages fails
// and it keeps them (the agent's memory is its peak, not less). Root has CAP_IPC_LOCK, so
// RLIMIT_MEMLOCK does not apply.
func (a *Agent) lockMemory() error {
	if !a.opt.Swap.LockMemory {
		return nil
	}
	a.swaps.mu.Lock()
	defer a.swaps.mu.Unlock()
	if a.swaps.locked {
		return nil
	}
	if err := unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE); err != nil {
		return fmt.Errorf("locking the agent's memory (mlockall, [swap] lock_agent_memory) before serving a remote swap area: %w; "+
			"run the agent as root (CAP_IPC_LOCK), or set [swap] lock_agent_memory = false and accept that paging out can deadlock under memory pressure", err)
	}
	a.swaps.locked = true
	a.opt.Log.Info("locked the agent's memory: it serves a remote swap area (page-outs go through it)")
	return nil
}

// AttachSwap gives this compute node a swap area (agentapi.Agent): the file in the swap
// instance's namespace (directly when the namespace is on this node, through the agent's own
// mount of it otherwise), a loop device over it, swapon. Attaching an area attached already
// does nothing.
func (a *Agent) AttachSwap(ctx context.Context, spec agentapi.SwapSpec) error {
	if err := checkSwapSpec(spec, a.opt.Name); err != nil {
		return err
	}
	if !a.root {
		return fmt.Errorf("swap area %d: only a root agent can attach swap (loop devices, swapon)", spec.ID)
	}
	st := a.swapState(spec.ID, true)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.off != nil && !st.off.Ended() {
		return fmt.Errorf("swap area %d is being detached (swapoff of %s under way); attach it again once the detach is done", spec.ID, st.off.Device)
	}
	if st.rec.Spec.ID != 0 {
		if found, ok := swaparea.Find(st.rec.area().File()); ok && found.Swapping {
			return nil
		}
	}
	rec := swapRecord{Spec: spec, Since: time.Now(), Pid: os.Getpid()}
	local := spec.StorageNode == a.opt.Name && a.ssd != ""
	if local {
		rec.Root = a.ssd
		rec.Rel = filepath.Join("fragment", strconv.FormatInt(spec.FragmentID, 10), "namespace", strconv.FormatInt(spec.NamespaceID, 10))
		if _, err := os.Stat(filepath.Join(rec.Root, rec.Rel)); err != nil {
			return fmt.Errorf("swap area %d: namespace %d of fragment %d is missing on %s", spec.ID, spec.NamespaceID, spec.FragmentID, a.opt.Name)
		}
	} else {
		if spec.Mount == nil {
			return fmt.Errorf("swap area %d: its namespace is on storage node %s and the order has no mount of it (a controller older than this agent?)", spec.ID, spec.StorageNode)
		}
		if err := a.lockMemory(); err != nil {
			return fmt.Errorf("swap area %d: %w", spec.ID, err)
		}
		dir, err := a.swapDir()
		if err != nil {
			return err
		}
		rec.MountPath = filepath.Join(dir, "mnt", strconv.FormatInt(spec.ID, 10))
		if err := a.swapMount(ctx, spec, rec.MountPath); err != nil {
			return fmt.Errorf("swap area %d: mounting namespace %d of storage node %s: %w", spec.ID, spec.NamespaceID, spec.StorageNode, err)
		}
		rec.Root, rec.Rel = rec.MountPath, "."
	}
	// The record first: an agent that dies during the attach leaves a trace the reaper finds.
	if err := a.saveSwap(rec); err != nil {
		return fmt.Errorf("swap area %d: %w", spec.ID, err)
	}
	old := st.rec
	st.rec, st.failed, st.problem = rec, "", ""
	start := time.Now()
	area, err := swaparea.Attach(rec.area())
	if err != nil {
		st.problem = err.Error()
		a.opt.Log.Warn("cannot attach a swap area", "swap", spec.ID, "job", spec.Job, "err", err)
		return fmt.Errorf("swap area %d: %w", spec.ID, err)
	}
	st.rec.Device, st.rec.Base = area.Device, area.Base
	if area.Base == (swaparea.Counters{}) && old.Device == area.Device {
		// Found attached (switched on again after a crash): its counters at attach are the
		// old record's.
		st.rec.Base = old.Base
	}
	if err := a.saveSwap(st.rec); err != nil {
		a.opt.Log.Warn("cannot save a swap area's record", "swap", spec.ID, "err", err)
	}
	a.opt.Log.Info("attached a swap area", "swap", spec.ID, "job", spec.Job, "device", area.Device, "file", area.File, "size", spec.Size,
		"priority", area.Priority, "direct_io", area.DirectIO, "remote", !local, "ms", time.Since(start).Milliseconds())
	return nil
}

func checkSwapSpec(spec agentapi.SwapSpec, node string) error {
	switch {
	case spec.ID <= 0:
		return fmt.Errorf("swap area: id %d must be positive", spec.ID)
	case spec.Node != "" && spec.Node != node:
		return fmt.Errorf("swap area %d is for node %s; this is %s", spec.ID, spec.Node, node)
	case spec.Size == 0:
		return fmt.Errorf("swap area %d: size 0", spec.ID)
	case spec.FileName == "" || strings.ContainsAny(spec.FileName, "/\x00") || spec.FileName == "." || spec.FileName == "..":
		return fmt.Errorf("swap area %d: file name %q must be one path component", spec.ID, spec.FileName)
	case spec.Priority < -1 || spec.Priority > 32767:
		return fmt.Errorf("swap area %d: priority %d must be -1 (the kernel's choice) or 0 to 32767", spec.ID, spec.Priority)
	}
	return nil
}

// swapMount mounts a remote area's namespace at path, the agent's own mount: the controller
// does not list it among the node's mounts, so reconcile leaves it alone.
func (a *Agent) swapMount(ctx context.Context, spec agentapi.SwapSpec, path string) error {
	ms := *spec.Mount
	ms.MountPath, ms.ReadOnly, ms.Label = path, false, "spillway-swap"
	if err := os.Mkdir(path, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := a.Mount(ctx, ms); err != nil {
		return err
	}
	a.mu.Lock()
	if m := a.mounts[path]; m != nil {
		m.swap = true
	}
	a.mu.Unlock()
	return nil
}

// DetachSwap takes a swap area away, a poll (agentapi.Agent): the first call starts swapoff;
// each call says how far it got; past the bound the swapoff is stopped and the failure
// reported, the area left attached; the next call after a reported failure tries again. Once
// swapoff is done, the loop device, the file and the mount go.
func (a *Agent) DetachSwap(ctx context.Context, spec agentapi.SwapDetachSpec) (agentapi.SwapStatus, error) {
	st := a.swapState(spec.ID, false)
	if st == nil {
		return agentapi.SwapStatus{Done: true}, nil
	}
	bound := time.Duration(spec.Timeout) * time.Millisecond
	if bound <= 0 {
		bound = cmp.Or(a.opt.Swap.DetachTimeout, 5*time.Minute)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.rec.Spec.ID == 0 { // known only from an attach that failed before its record
		a.swaps.mu.Lock()
		delete(a.swaps.areas, spec.ID)
		a.swaps.mu.Unlock()
		return agentapi.SwapStatus{Done: true}, nil
	}
	if st.rec.MountPath != "" && st.off == nil && st.problem == "" && st.rec.Device != "" {
		// Before swapoff: whether the pages can come back at all is what the job's end says.
		a.noteSwapReach(st, a.reachSwap(st.rec))
	}
	area, found := swaparea.Find(st.rec.area().File())
	// Error while not Done means the detach failed (the controller's signal to give up or
	// try again); what went wrong while the area was attached (st.problem) is said with Done.
	status := agentapi.SwapStatus{Attached: found && area.Swapping, Device: area.Device}
	if found {
		if c, err := swaparea.ReadCounters(area.Device); err == nil {
			st.last = c.Since(st.rec.Base)
		}
	}
	status.BytesWritten, status.BytesRead = st.last.BytesWritten, st.last.BytesRead
	if st.off != nil {
		v, msg := st.off.Poll(bound)
		switch {
		case v == swaparea.Running:
			return status, nil
		case v == swaparea.Failed && (!st.off.Ended() || st.failed == ""):
			if st.failed == "" {
				a.opt.Log.Warn("a swap area's detach failed; it stays attached", "swap", spec.ID, "job", st.rec.Spec.Job, "device", st.off.Device, "err", msg)
			}
			st.failed = cmp.Or(st.failed, msg)
			status.Error = st.failed
			status.Attached = true
			return status, nil
		}
		// Detached, or a failure reported already whose swapoff has ended: look again.
		st.off = nil
		area, found = swaparea.Find(st.rec.area().File())
	}
	if found && area.Swapping {
		off, err := swaparea.StartSwapoff(area.Device)
		if err != nil {
			return status, fmt.Errorf("swap area %d: %w", spec.ID, err)
		}
		st.off, st.failed = off, ""
		a.opt.Log.Info("detaching a swap area", "swap", spec.ID, "job", st.rec.Spec.Job, "device", area.Device, "bound", bound)
		return status, nil
	}
	if err := swaparea.Release(st.rec.area(), area.Device); err != nil {
		if st.rec.MountPath == "" {
			return status, fmt.Errorf("swap area %d: %w", spec.ID, err)
		}
		// Through a mount whose server is gone: the file goes with the swap instance.
		a.opt.Log.Warn("cannot remove a remote swap area's file; it goes with its instance", "swap", spec.ID, "err", err)
	}
	if st.rec.MountPath != "" {
		if err := a.Unmount(ctx, 0, st.rec.MountPath); err != nil {
			return status, fmt.Errorf("swap area %d: %w", spec.ID, err)
		}
	}
	a.opt.Log.Info("detached a swap area", "swap", spec.ID, "job", st.rec.Spec.Job, "paged_out", status.BytesWritten, "paged_in", status.BytesRead)
	a.forgetSwap(spec.ID)
	// Done, with what went wrong while it was attached (a lost storage node: its job's
	// processes were killed), for the job's record.
	return agentapi.SwapStatus{Done: true, BytesWritten: status.BytesWritten, BytesRead: status.BytesRead, Error: st.problem}, nil
}

// swapUsage is the node's areas' counters since each was attached, for the report; a remote
// area's storage node not answering is found here (and said in the log and in SwapStatus).
func (a *Agent) swapUsage() []agentapi.SwapUsage {
	a.loadSwaps()
	a.swaps.mu.Lock()
	states := make([]*swapState, 0, len(a.swaps.areas))
	for _, st := range a.swaps.areas {
		states = append(states, st)
	}
	a.swaps.mu.Unlock()
	var out []agentapi.SwapUsage
	for _, st := range states {
		if !st.mu.TryLock() { // an attach or detach under way: next report
			continue
		}
		rec := st.rec
		st.mu.Unlock()
		if rec.Device == "" {
			continue
		}
		if found, ok := swaparea.Find(rec.area().File()); !ok || found.Device != rec.Device {
			continue // not attached (any more): the device may be another's
		}
		c, err := swaparea.ReadCounters(rec.Device)
		if err != nil {
			continue
		}
		c = c.Since(rec.Base)
		out = append(out, agentapi.SwapUsage{ID: rec.Spec.ID, Instance: rec.Spec.InstanceID, Node: a.opt.Name, BytesWritten: c.BytesWritten, BytesRead: c.BytesRead})
		if rec.MountPath != "" {
			a.probeSwap(st, rec)
		}
	}
	return out
}

// probeSwap looks at a remote area's file through the agent's mount in the background (one
// look at a time): a storage node that is gone makes the kernel's page-ins of the area fail
// (the processes needing those pages are killed with SIGBUS), which the agent says plainly.
func (a *Agent) probeSwap(st *swapState, rec swapRecord) {
	if !st.mu.TryLock() { // an attach or detach under way: the report does not wait
		return
	}
	if st.probing {
		st.mu.Unlock()
		return
	}
	st.probing = true
	st.mu.Unlock()
	go func() {
		err := a.reachSwap(rec)
		st.mu.Lock()
		defer st.mu.Unlock()
		st.probing = false
		if st.rec.Spec.ID == rec.Spec.ID && st.rec.Device == rec.Device {
			a.noteSwapReach(st, err)
		}
	}()
}

// reachSwap reads the first byte of a remote area's file through the agent's mount, within
// warpfs.request_timeout (the mount's own bound on a request; a storage node that refuses
// connections fails it at once).
func (a *Agent) reachSwap(rec swapRecord) error {
	done := make(chan error, 1)
	go func() {
		a.mu.Lock()
		m := a.mounts[rec.MountPath]
		a.mu.Unlock()
		if m == nil || !m.alive() {
			done <- errors.New("the agent's mount of its namespace is gone")
			return
		}
		var buf [1]byte
		f, err := os.Open(rec.area().File())
		if err == nil {
			_, err = f.ReadAt(buf[:], 0)
			f.Close()
		}
		done <- err
	}()
	timeout := cmp.Or(a.opt.Warpfs.RequestTimeout, client.DefaultLimits().RequestTimeout) + time.Second
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("no answer within %s", timeout)
	}
}

// noteSwapReach records (and logs, once) whether a remote area's storage node answered;
// st.mu is held.
func (a *Agent) noteSwapReach(st *swapState, err error) {
	rec := st.rec
	switch {
	case err != nil && st.problem == "":
		st.problem = fmt.Sprintf("storage node %s of swap area %d (%s) cannot be reached: %v; pages paged out there cannot come back, and a process that needs one is killed (SIGBUS); the node itself is unaffected",
			rec.Spec.StorageNode, rec.Spec.ID, rec.Device, err)
		a.opt.Log.Error("a remote swap area's storage node cannot be reached: processes whose pages are there are killed (SIGBUS) when they need them",
			"swap", rec.Spec.ID, "job", rec.Spec.Job, "storage_node", rec.Spec.StorageNode, "device", rec.Device, "err", err)
	case err == nil && strings.HasPrefix(st.problem, "storage node "):
		a.opt.Log.Info("a remote swap area's storage node answers again", "swap", rec.Spec.ID, "storage_node", rec.Spec.StorageNode)
		st.problem = ""
	}
}

// reapSwaps detaches the areas the controller no longer lists, once older than grace (an
// abandoned job's): each heartbeat polls their detach.
func (a *Agent) reapSwaps(ctx context.Context, as agentapi.Assignment, grace time.Duration) {
	if as.ClusterID == "" { // not an answer of a controller that knows this node's swap areas
		return
	}
	live := map[int64]bool{}
	for _, s := range as.Swaps {
		live[s.ID] = true
	}
	a.loadSwaps()
	a.swaps.mu.Lock()
	var stale []int64
	for id, st := range a.swaps.areas {
		if !live[id] && st.mu.TryLock() {
			if st.rec.Spec.ID == 0 || time.Since(st.rec.Since) > grace {
				stale = append(stale, id)
			}
			st.mu.Unlock()
		}
	}
	a.swaps.mu.Unlock()
	for _, id := range stale {
		st, err := a.DetachSwap(ctx, agentapi.SwapDetachSpec{ID: id})
		switch {
		case err != nil:
			a.opt.Log.Warn("cannot detach a swap area the controller no longer knows", "swap", id, "err", err)
		case st.Done:
			a.opt.Log.Info("detached a swap area the controller no longer knows", "swap", id)
		}
	}
}
