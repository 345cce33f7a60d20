package agent

// The data path of this node's cache instances (issue 20): every fragment of a cache instance
// is a stripe server whose objects are a cache store (package warpfs/cachestore) of the PFS
// files' data, and the instance's namespace is its PFS directory (server.CacheTarget), both
// reaching the PFS through the doors of the users they act for (pfsdoors.go).

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/cachestore"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// cacheStores are the open stores of this node's cache fragments, by fragment.
type cacheStores struct {
	mu     sync.Mutex
	stores map[int64]*cachestore.Store
}

// cacheStoreDir holds a cache fragment's store: its objects and its log.
func (a *Agent) cacheStoreDir(fragmentID int64) string {
	return filepath.Join(a.fragmentDir(fragmentID), "cache")
}

// cacheStore opens (once) the store of a cache fragment, recovering what its log holds, and
// registers it for teardown's flush.
func (a *Agent) cacheStore(meta fragmentMeta) (*cachestore.Store, error) {
	a.cacheOpen.mu.Lock()
	defer a.cacheOpen.mu.Unlock()
	if s := a.cacheOpen.stores[meta.ID]; s != nil {
		return s, nil
	}
	k := meta.Cache
	index := meta.StripeIndex
	if k.Loadbalance {
		index = 0 // a load-balanced cache: this fragment holds all of every file it serves
	}
	cfg := cache.Config{Server: index, Capacity: meta.Capacity, ExtentSize: extentSize(k.StripeSize),
		Defaults: cache.Policy{ModifiedThreshold: k.ModifiedThreshold, ReadAhead: k.ReadAhead, SyncOnClose: k.SyncOnClose, SyncToPFS: k.SyncToPFS}}
	if k.HighWatermark > 0 && k.LowWatermark > 0 && k.LowWatermark < k.HighWatermark {
		cfg.DirtyHigh, cfg.DirtyLow = float64(k.HighWatermark)/100, float64(k.LowWatermark)/100
	}
	s, err := cachestore.Open(cachestore.Options{Dir: a.cacheStoreDir(meta.ID), Config: cfg, Log: a.opt.Log.With("fragment", meta.ID)})
	if err != nil {
		return nil, fmt.Errorf("cache of fragment %d: %w", meta.ID, err)
	}
	// Dirty data recovered from the log goes to the PFS as the instance's owner.
	s.SetDoor(func(string) (*pfsio.Door, error) { return a.pfsDoors.door(k.PFS, k.UID, k.GID) })
	a.cacheOpen.stores[meta.ID] = s
	a.setCacheStore(meta.ID, s)
	return s, nil
}

// extentSize is the cache's unit for an instance of stripe size: DataWarp's 1 MiB, or the
// largest power of two that divides a smaller or odd stripe size (a pool's stripe_size is a
// multiple of 4 KiB; an extent must never span two servers).
func extentSize(stripeSize uint64) uint64 {
	if stripeSize == 0 {
		return cache.DefaultExtentSize // the instance's layout then takes stripe.DefaultSize, a multiple
	}
	e := uint64(cache.DefaultExtentSize)
	for e > cache.Block && stripeSize%e != 0 {
		e /= 2
	}
	return e
}

// openCacheStore is fragment id's store if it is open (nil otherwise: scratch, or not used
// since the agent started).
func (a *Agent) openCacheStore(id int64) *cachestore.Store {
	a.cacheOpen.mu.Lock()
	defer a.cacheOpen.mu.Unlock()
	return a.cacheOpen.stores[id]
}

// openCacheStoreOf opens the store of fragment id if it is a cache fragment (after a restart
// a flush may come before any mount).
func (a *Agent) openCacheStoreOf(id int64) error {
	meta, err := a.readFragment(id)
	if err != nil || meta.Cache == nil {
		return nil // no such fragment, or scratch: nothing cached
	}
	_, err = a.cacheStore(*meta)
	return err
}

// closeCacheStore closes a deleted fragment's store, and the doors to its PFS directory if no
// other cache fragment of this node fronts it.
func (a *Agent) closeCacheStore(meta *fragmentMeta) {
	a.cacheOpen.mu.Lock()
	s := a.cacheOpen.stores[meta.ID]
	delete(a.cacheOpen.stores, meta.ID)
	a.cacheOpen.mu.Unlock()
	if s != nil {
		s.Close()
	}
	if meta.Cache == nil {
		return
	}
	entries, _ := os.ReadDir(filepath.Join(a.ssd, "fragment"))
	for _, e := range entries {
		var other int64
		if _, err := fmt.Sscan(e.Name(), &other); err != nil || other == meta.ID {
			continue
		}
		if m, err := a.readFragment(other); err == nil && m.Cache != nil && m.Cache.PFS == meta.Cache.PFS {
			return
		}
	}
	a.pfsDoors.closeRoot(meta.Cache.PFS)
}

func (a *Agent) closeCacheStores() {
	a.cacheOpen.mu.Lock()
	stores := a.cacheOpen.stores
	a.cacheOpen.stores = map[int64]*cachestore.Store{}
	a.cacheOpen.mu.Unlock()
	for _, s := range stores {
		s.Close() // flushes nothing: the dirty state is in the log, for the next start
	}
}

// cacheTarget is how the servers of fragment meta serve its cache: its namespace (the PFS
// directory) and its stripe objects (the store); for a load-balanced cache, the namespace
// of the fragment and the whole files' data it serves (the store, with a one-server layout).
func (a *Agent) cacheTarget(meta fragmentMeta) (*server.CacheTarget, error) {
	k := meta.Cache
	s, err := a.cacheStore(meta)
	if err != nil {
		return nil, err
	}
	servers := max(k.Servers, 1)
	if k.Loadbalance {
		servers = 1 // one server's layout: whole files, served with the namespace
	}
	size := k.StripeSize
	if size == 0 {
		size = stripe.DefaultSize
	}
	return &server.CacheTarget{PFSRoot: k.PFS, Data: server.StoreData(s), UID: k.UID, GID: k.GID, Defaults: s.Defaults(), Loadbalance: k.Loadbalance,
		Layout: stripe.Layout{Size: size, Width: uint32(servers), Servers: uint32(servers)},
		Door: func(uid, gid uint32) (*pfsio.Door, error) {
			if uid == 0 {
				// Root on a compute node (or the kernel's own requests) reaches the PFS as
				// the instance's owner: never with more than the owner's rights.
				uid, gid = k.UID, k.GID
			}
			return a.pfsDoors.door(k.PFS, uid, gid)
		}}, nil
}

// cacheTargetOf is fragment id's cache target, or nil for a scratch fragment.
func (a *Agent) cacheTargetOf(id int64) (*server.CacheTarget, error) {
	meta, err := a.readFragment(id)
	if err != nil {
		return nil, fmt.Errorf("fragment %d does not exist on %s", id, a.opt.Name)
	}
	if meta.Cache == nil {
		return nil, nil
	}
	return a.cacheTarget(*meta)
}
