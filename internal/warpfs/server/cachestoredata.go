package server

import (
	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/cachestore"
)

// StoreData is a cache store (package cachestore) as this server's cache namespaces and
// stripe sessions use it: the one adapter between the two packages' types.
func StoreData(s *cachestore.Store) CacheData { return storeData{s} }

type storeData struct{ s *cachestore.Store }

func storeRef(ref CacheFileRef) cachestore.FileRef {
	return cachestore.FileRef{Path: ref.Path, Key: cache.FileKey{Dev: ref.Key.Dev, Ino: ref.Key.Ino}, Layout: ref.Layout,
		Override: ref.Override, OverrideGen: ref.OverrideGen}
}

func (d storeData) OpenFile(door *pfsio.Door, ref CacheFileRef, write bool) (CacheFile, error) {
	f, err := d.s.OpenFile(door, storeRef(ref), write)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (d storeData) Truncate(door *pfsio.Door, ref CacheFileRef, size uint64) error {
	return d.s.Truncate(door, storeRef(ref), size)
}

func (d storeData) Unlink(key CacheFileKey) { d.s.Unlink(cache.FileKey{Dev: key.Dev, Ino: key.Ino}) }
