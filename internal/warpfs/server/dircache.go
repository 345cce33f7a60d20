package server

// The directories a session's requests name are resolved once, not at every request: a
// session keeps descriptors of the directories it used last (dirCache), keyed by their path
// in the namespace, so that a create, stat or remove in a directory it has just used costs
// the one system call on the entry itself rather than an openat2 walk of the whole path and a
// close.
//
// Why a cached descriptor is as safe as a fresh walk:
//
//   - A descriptor refers to the directory itself, not to its path. Every cached one was
//     opened by openBeneath (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS beneath the namespace root),
//     so when it was opened it was a real directory inside the namespace, reached without a
//     symbolic link. Swapping that path for a symbolic link afterwards changes the path, not
//     the directory the descriptor holds, and every request still works on its entries with
//     *at calls that never follow a link for the last component.
//
//   - The directory can leave the namespace's tree only by a rename across the namespace
//     root, and no request can make one: both names of a RENAME are resolved beneath the
//     root. Only root on the storage node can move a directory out; users reach the
//     namespace only through the server (remote mounts and co-located ones, whose Local
//     session is this same code). So a cached descriptor never reaches outside the namespace.
//
//   - What may change is which directory a path names: a rename or rmdir of the directory or
//     of any ancestor (by any session of any namespace of this process). Every RENAME and
//     RMDIR the server makes bumps dirGeneration, after the change and before it is
//     answered; an entry opened at an older generation is not used (it is closed, and the
//     path walked again). A walk records the generation it started at, before its openat2,
//     so a walk racing a rename is stale at once. A request that took a descriptor before the
//     bump ran before the rename as far as anyone can tell: it worked on the directory that
//     the path named when it started, as a walk made at that moment would have.
//
// The cache is small and per session (dirCacheSize entries); its descriptors are closed when
// they are replaced or stale and nobody uses them, and when the session ends.

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// dirCacheSize is how many directories a session keeps open.
const dirCacheSize = 32

// dirGeneration counts the renames and directory removals of this process's servers: a
// cached directory of an older generation may no longer be under its path.
var dirGeneration atomic.Uint64

// namespaceChanged marks every cached directory stale (after a rename or an rmdir).
func namespaceChanged() { dirGeneration.Add(1) }

type dirCache struct {
	mu      sync.Mutex
	entries map[string]*cachedDir
	closed  bool
}

// cachedDir is a directory descriptor of the cache; it is closed once it is out of the cache
// and its last user is done.
type cachedDir struct {
	fd     int
	gen    uint64
	users  int  // guarded by the cache's lock
	cached bool // still in the cache
}

// get returns the cached descriptor of path, or (nil) a miss; done must be called when the
// caller has finished with the descriptor.
func (c *dirCache) get(path string) (*cachedDir, func()) {
	gen := dirGeneration.Load()
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.entries[path]
	if d == nil {
		return nil, nil
	}
	if d.gen != gen {
		c.dropLocked(path, d)
		return nil, nil
	}
	d.users++
	return d, func() { c.release(d) }
}

// put caches fd, opened for path by a walk that began at generation gen, and returns the
// function that ends the caller's use of it. A stale or unwanted descriptor is not cached:
// done then closes it.
func (c *dirCache) put(path string, fd int, gen uint64) func() {
	d := &cachedDir{fd: fd, gen: gen, users: 1}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || gen != dirGeneration.Load() {
		return func() { c.release(d) }
	}
	if c.entries == nil {
		c.entries = map[string]*cachedDir{}
	}
	if old := c.entries[path]; old != nil {
		c.dropLocked(path, old)
	} else if len(c.entries) >= dirCacheSize {
		for p, e := range c.entries { // any one: the map's order is random enough
			c.dropLocked(p, e)
			break
		}
	}
	d.cached = true
	c.entries[path] = d
	return func() { c.release(d) }
}

func (c *dirCache) release(d *cachedDir) {
	c.mu.Lock()
	d.users--
	done := d.users == 0 && !d.cached
	c.mu.Unlock()
	if done {
		unix.Close(d.fd)
	}
}

// dropLocked takes d out of the cache, closing it if nobody uses it.
func (c *dirCache) dropLocked(path string, d *cachedDir) {
	delete(c.entries, path)
	d.cached = false
	if d.users == 0 {
		unix.Close(d.fd)
	}
}

// close drops every entry (the session ends).
func (c *dirCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for p, d := range c.entries {
		c.dropLocked(p, d)
	}
}
