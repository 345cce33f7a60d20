package cachestore

import (
	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
)

// ServerData is s as the storage server's cache namespaces and stripe sessions use it
// (server.CacheData): the one adapter between the two packages' types.
func ServerData(s *Store) server.CacheData { return serverData{s} }

type serverData struct{ s *Store }

func fileRefOf(ref server.CacheFileRef) FileRef {
	return FileRef{Path: ref.Path, Key: cache.FileKey{Dev: ref.Key.Dev, Ino: ref.Key.Ino}, Layout: ref.Layout,
		Override: ref.Override, OverrideGen: ref.OverrideGen}
}

func (d serverData) OpenFile(door *pfsio.Door, ref server.CacheFileRef, write bool) (server.CacheFile, error) {
	f, err := d.s.OpenFile(door, fileRefOf(ref), write)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (d serverData) Truncate(door *pfsio.Door, ref server.CacheFileRef, size uint64) error {
	return d.s.Truncate(door, fileRefOf(ref), size)
}

func (d serverData) Unlink(key server.CacheFileKey) {
	d.s.Unlink(cache.FileKey{Dev: key.Dev, Ino: key.Ino})
}
