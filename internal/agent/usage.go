package agent

// The data path's counters and write limits of this node's fragments (package server,
// limits.go and counters.go): one server.Fragment per fragment, shared by every mount and
// connection of it, reported with every heartbeat (NodeReport.Usage) and saved with the
// fragment (accounting/counters.json inside it) at each report and at shutdown, so that a
// restarted agent carries them on. The file is written through the fragment directory's
// descriptor, never by a path a user could swap.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
)

const (
	// accountingDir holds a fragment's saved counters: a directory of its own, so that saving
	// them never changes the fragment directory's modification time (reconcile's age).
	accountingDir = "accounting"
	countersFile  = "counters.json"
	// maxCountersFile bounds what is read back (a fragment with many clients and namespaces
	// stays far below).
	maxCountersFile = 16 << 20
)

// fragmentLimits is the write window a fragment was created with.
func (m *fragmentMeta) limits() server.FragmentLimits {
	return server.FragmentLimits{WriteLimit: m.WriteLimit, WindowLength: time.Duration(m.WriteWindowLength) * time.Second}
}

// fragmentCounters is fragment id's counters and write window: made from what was saved on
// first use after a start.
func (a *Agent) fragmentCounters(id int64) (*server.Fragment, error) {
	a.countersMu.Lock()
	defer a.countersMu.Unlock()
	if f := a.counters[id]; f != nil {
		return f, nil
	}
	meta, err := a.readFragment(id)
	if err != nil {
		return nil, err
	}
	st, err := a.loadCounters(id)
	if err != nil {
		a.opt.Log.Warn("the fragment's saved counters are unreadable: counting from zero", "fragment", id, "err", err)
	}
	f := server.RestoreFragment(id, meta.InstanceID, meta.limits(), st, a.opt.Log)
	f.Job, f.OnMediaError = meta.Job, a.mediaError(id)
	a.counters[id] = f
	if err == nil {
		// What was read (or nothing: zero counters) is what a restart restores: nothing to
		// save until they change (a restarted agent's first report wrote and synced the
		// counters of every fragment of the node).
		a.countersSaved[id], _ = json.Marshal(f.State())
	}
	return f, nil
}

// newFragmentCounters starts the counters of a fragment just created, or updates the limits
// of one known already (CreateFragment is repeated). A fresh fragment's counters are zero:
// nothing is read, and nothing is written until they change (a sync per creation saved).
func (a *Agent) newFragmentCounters(meta fragmentMeta, fresh bool) {
	a.countersMu.Lock()
	f := a.counters[meta.ID]
	if f == nil {
		var st *server.FragmentState
		if !fresh {
			st, _ = a.loadCounters(meta.ID)
		}
		if st == nil {
			st = &server.FragmentState{}
		}
		f = server.RestoreFragment(meta.ID, meta.InstanceID, meta.limits(), st, a.opt.Log)
		f.Job, f.OnMediaError = meta.Job, a.mediaError(meta.ID)
		a.counters[meta.ID] = f
		if fresh { // zero, as a load after a restart finds them with no file: nothing to save
			a.countersSaved[meta.ID], _ = json.Marshal(f.State())
		}
	} else {
		f.SetLimits(meta.limits())
	}
	a.countersMu.Unlock()
	a.saveCounters(meta.ID, f)
}

func (a *Agent) forgetCounters(id int64) {
	a.countersMu.Lock()
	delete(a.counters, id)
	delete(a.countersSaved, id)
	a.countersMu.Unlock()
}

// openAccounting opens the fragment's accounting directory (made if missing), beneath the
// fragment directory's descriptor, following no link.
func (a *Agent) openAccounting(id int64) (int, error) {
	dirfd, err := openOwnDir(a.fragmentDir(id))
	if err != nil {
		return -1, err
	}
	defer unix.Close(dirfd)
	if err := unix.Mkdirat(dirfd, accountingDir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, fmt.Errorf("fragment %d: %s: %w", id, accountingDir, err)
	}
	fd, err := unix.Openat(dirfd, accountingDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("fragment %d: %s: %w", id, accountingDir, err)
	}
	return fd, nil
}

// loadCounters reads what was saved of fragment id's counters; nil when nothing was.
func (a *Agent) loadCounters(id int64) (*server.FragmentState, error) {
	dirfd, err := a.openAccounting(id)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dirfd)
	fd, err := unix.Openat(dirfd, countersFile, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), countersFile)
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, maxCountersFile))
	if err != nil {
		return nil, err
	}
	var st server.FragmentState
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", countersFile, err)
	}
	return &st, nil
}

// saveCounters writes fragment id's counters if they changed since last saved: a temporary
// file, synced, renamed over the old one. The caller holds fragLock.
func (a *Agent) saveCounters(id int64, f *server.Fragment) {
	raw, _ := json.Marshal(f.State())
	a.countersMu.Lock()
	same := string(a.countersSaved[id]) == string(raw)
	a.countersMu.Unlock()
	if same {
		return
	}
	err := func() error {
		dirfd, err := a.openAccounting(id)
		if err != nil {
			return err
		}
		defer unix.Close(dirfd)
		tmp := countersFile + ".tmp"
		fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		file := os.NewFile(uintptr(fd), tmp)
		_, err = file.Write(raw)
		if err == nil {
			err = file.Sync()
		}
		if cerr := file.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = unix.Renameat(dirfd, tmp, dirfd, countersFile)
		}
		return err
	}()
	if err != nil {
		if _, gone := a.readFragment(id); gone != nil {
			return // deleted meanwhile
		}
		a.opt.Log.Warn("cannot save the fragment's counters", "fragment", id, "err", err)
		return
	}
	a.countersMu.Lock()
	a.countersSaved[id] = raw
	a.countersMu.Unlock()
}

// usage reports every fragment of this node and saves their counters, unless a fragment is
// being created or removed (fragLock held): saving makes the accounting directory, which must
// not appear in a fragment directory being removed or not yet mounted on; the next report
// saves them.
func (a *Agent) usage() agentapi.NodeUsage {
	save := a.fragLock.TryLock()
	if save {
		defer a.fragLock.Unlock()
	}
	var u agentapi.NodeUsage
	ids := a.scanFragments()
	capacities := a.capacitiesOf(ids)
	for _, id := range ids {
		f, err := a.fragmentCounters(id)
		if err != nil {
			continue // being created or removed
		}
		u.Fragments = append(u.Fragments, a.fragmentUsage(f, capacities[f.Instance]))
		if save {
			a.saveCounters(id, f)
		}
	}
	return u
}

// fragmentUsage is fragment f's report, with the usage of its instance on this node (whose
// capacity here is capacity).
func (a *Agent) fragmentUsage(f *server.Fragment, capacity uint64) agentapi.FragmentUsage {
	var used uint64
	if t, err := a.trackerOf(f.Instance, capacity); err == nil {
		used = t.Used()
		f.NoteCapacity(t.Peak())
	}
	u := f.Usage(used)
	if s := a.openCacheStore(f.ID); s != nil {
		st := s.Stats()
		u.Cache = &agentapi.CacheUsage{PFSBytesRead: st.FetchedBytes, PFSBytesWritten: st.FlushedBytes, ReadAheadBytes: st.ReadAheadBytes,
			Hits: st.Hits, Misses: st.Misses, Evictions: st.Evictions, EvictedBytes: st.EvictedBytes, FlushErrors: st.FlushErrors,
			FetchErrors: st.FetchErrors, DiscardedBytes: st.DiscardedBytes, ConflictBytes: st.ConflictBytes, Dirty: st.Dirty, Used: st.Used}
	}
	return u
}

// FragmentUsage is one fragment's counters now: what the controller keeps of them right
// before it deletes the fragment (its accounting record's final figures). found is false when
// the node holds no such fragment.
func (a *Agent) FragmentUsage(ctx context.Context, id int64) (agentapi.FragmentUsage, bool, error) {
	f, err := a.fragmentCounters(id)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return agentapi.FragmentUsage{}, false, nil
		}
		return agentapi.FragmentUsage{}, false, err
	}
	return a.fragmentUsage(f, a.instanceCapacity(f.Instance)), true, nil
}

// saveAllCounters saves the counters of every fragment known (at shutdown).
func (a *Agent) saveAllCounters() {
	a.fragLock.Lock()
	defer a.fragLock.Unlock()
	a.countersMu.Lock()
	all := make(map[int64]*server.Fragment, len(a.counters))
	for id, f := range a.counters {
		all[id] = f
	}
	a.countersMu.Unlock()
	for id, f := range all {
		a.saveCounters(id, f)
	}
}

// mediaError is what fragment id's data path calls when its file system fails a request
// with EIO or EUCLEAN: a data-path error of the node, counted toward its auto-drain.
func (a *Agent) mediaError(id int64) func(op string, errno syscall.Errno) {
	return func(op string, errno syscall.Errno) {
		a.noteDataError(fmt.Sprintf("fragment %d: %s: %s (%s)", id, op, errno.Error(), unix.ErrnoName(errno)))
	}
}
