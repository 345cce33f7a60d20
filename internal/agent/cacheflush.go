package agent

import (
	"context"
	"sync"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
)

// cacheStore is a cache fragment's store (its stripe server's cache of the PFS directory), as
// teardown's flush sees it (FlushCache). The store is registered per fragment in
// Agent.cacheStores (setCacheStore) by the data path that holds it.
type cacheStore interface {
	// Drain moves every dirty byte to the PFS. It returns nil once none is left; the failure
	// that stops it (the PFS full, a quota, a permission, the PFS unreachable), the data
	// kept; or ctx.Err() when ctx ends first (a Discard, the agent stopping). It is called
	// again after a failure, and must start over then.
	Drain(ctx context.Context) error
	// Discard drops every dirty byte (teardown --hurry) and returns how many; a Drain under
	// way returns (its ctx is canceled first). It must not wait for PFS I/O.
	Discard() uint64
	// Stats are the store's counters now: Dirty is the progress (bytes not yet on the
	// PFS), FlushedBytes what went to the PFS. It is called at every poll, under the
	// registry's lock: it must be cheap and never wait for I/O.
	Stats() cache.Stats
}

// cacheFlushes are the registry of cache stores and the drains under way, by fragment.
type cacheFlushes struct {
	mu      sync.Mutex
	stores  map[int64]cacheStore
	flushes map[int64]*flush
	ctx     context.Context // the drains' (ended by Close)
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

// flush is one fragment's drain: one goroutine however often the controller polls.
type flush struct {
	cancel context.CancelFunc
	ended  bool  // the goroutine returned (under cacheFlushes.mu)
	err    error // what Drain returned
	// discarded: the store was discarded, and how much it dropped; every later call
	// answers the same.
	discarded      bool
	discardedBytes uint64
}

func newCacheFlushes() *cacheFlushes {
	ctx, stop := context.WithCancel(context.Background())
	return &cacheFlushes{stores: map[int64]cacheStore{}, flushes: map[int64]*flush{}, ctx: ctx, stop: stop}
}

// setCacheStore registers (nil: forgets) a fragment's cache store.
func (a *Agent) setCacheStore(fragmentID int64, s cacheStore) {
	c := a.caches
	c.mu.Lock()
	defer c.mu.Unlock()
	if s == nil {
		delete(c.stores, fragmentID)
		return
	}
	c.stores[fragmentID] = s
}

// forgetCache drops a deleted fragment's store and flush (a drain still running is stopped).
func (a *Agent) forgetCache(fragmentID int64) {
	c := a.caches
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.flushes[fragmentID]; f != nil && !f.ended {
		f.cancel()
	}
	delete(c.flushes, fragmentID)
	delete(c.stores, fragmentID)
}

// closeCaches stops the drains under way and waits for them (the agent stopping: the
// controller polls again after the restart, which starts them again).
func (a *Agent) closeCaches() {
	a.caches.stop()
	a.caches.wg.Wait()
}

// FlushCache is teardown's flush of one cache fragment (agentapi.CacheFlushSpec): the first
// call starts the fragment's drain in the background, each call answers its progress; a
// drain that failed is reported once (Error), and the next call starts it again. Discard
// drops the dirty data instead and answers Done with the bytes dropped. A fragment without a
// store (never used as a cache, or scratch) has nothing to flush: Done.
func (a *Agent) FlushCache(ctx context.Context, spec agentapi.CacheFlushSpec) (agentapi.CacheFlushStatus, error) {
	// After a restart the store may not be open yet: its log holds what is still dirty.
	if err := a.openCacheStoreOf(spec.FragmentID); err != nil {
		return agentapi.CacheFlushStatus{}, err
	}
	c := a.caches
	c.mu.Lock()
	defer c.mu.Unlock()
	id := spec.FragmentID
	f := c.flushes[id]
	if f != nil && f.discarded {
		return agentapi.CacheFlushStatus{Done: true, DiscardedBytes: f.discardedBytes}, nil
	}
	store := c.stores[id]
	if store == nil {
		return agentapi.CacheFlushStatus{Done: true}, nil
	}
	if spec.Discard {
		if f != nil && !f.ended {
			f.cancel()
		}
		n := store.Discard()
		c.flushes[id] = &flush{cancel: func() {}, ended: true, discarded: true, discardedBytes: n}
		a.opt.Log.Warn("cache flush: dirty data discarded (teardown with hurry)", "fragment", id, "instance", spec.InstanceID, "bytes", n)
		st := store.Stats()
		return agentapi.CacheFlushStatus{Done: true, DiscardedBytes: n, DirtyBytes: st.Dirty, FlushedBytes: st.FlushedBytes}, nil
	}
	st := store.Stats()
	if f == nil || f.ended && f.err == nil && st.Dirty > 0 {
		// The first call, or written again since its drain ended (a persistent instance
		// whose teardown was undone and used again): drain (again).
		f = a.startDrain(id, spec.InstanceID, store)
	}
	out := agentapi.CacheFlushStatus{DirtyBytes: st.Dirty, FlushedBytes: st.FlushedBytes}
	if !f.ended {
		return out, nil
	}
	if f.err != nil {
		out.Error = f.err.Error()
		delete(c.flushes, id) // reported: the next call drains again
		return out, nil
	}
	out.Done = true
	return out, nil
}

// startDrain runs a fragment's drain in the background (under c.mu).
func (a *Agent) startDrain(id, instance int64, store cacheStore) *flush {
	c := a.caches
	ctx, cancel := context.WithCancel(c.ctx)
	f := &flush{cancel: cancel}
	c.flushes[id] = f
	c.wg.Add(1)
	a.opt.Log.Info("cache flush: draining to the PFS", "fragment", id, "instance", instance, "dirty", store.Stats().Dirty)
	go func() {
		defer c.wg.Done()
		err := store.Drain(ctx)
		cancel()
		c.mu.Lock()
		f.ended, f.err = true, err
		c.mu.Unlock()
		if err != nil {
			a.opt.Log.Warn("cache flush failed; the data is kept", "fragment", id, "instance", instance, "err", err)
		} else {
			a.opt.Log.Info("cache flush: drained", "fragment", id, "instance", instance)
		}
	}()
	return f
}
