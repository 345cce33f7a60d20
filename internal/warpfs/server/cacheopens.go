package server

// The files a cache namespace has open (cachens.go), across all the sessions of the
// namespace on this server (the table lives beside the sizes table, cachesizes.go), for two
// POSIX rules the stripe servers' way of reaching the PFS would break otherwise: each stripe
// server opens a file's PFS path, as the user, when the file's first I/O reaches it (and
// again later for write-behind, after a restart).
//
//   - A file whose name is removed while open stays readable and writable through the
//     descriptors open on it. UNLINK of such a file's name, or a RENAME over it, renames it
//     instead to its hidden name in the same directory (cache.UnlinkedPath: NFS's "silly
//     rename"; RENAME_NOREPLACE, with the remover's door), where the stripe servers look for
//     it when its path is gone; the namespace hides those names (READDIR leaves them out, a
//     lookup is ENOENT, a new entry of such a name EPERM). The hidden name goes at the last
//     release of the file's handles, with the remover's door. The remover's client is told
//     to remove the file's objects (RemovedReply) if every handle open on it is its own (it
//     removes them at its own last close); else the other clients still use them, and at the
//     last release this server's data engine drops what it holds of the file (the other
//     servers' copies go when they are evicted: the file is gone).
//   - The descriptor of a file's creation may write it whatever its mode. A file created
//     without read and write permission for its owner (open(O_CREAT|O_RDWR, 0)) is created
//     with them, so that the stripe servers can open it for writing as the user; the mode
//     asked is what the namespace shows (stat, and a chmod meanwhile changes it, keeping the
//     owner's read and write on the PFS), and is set on the PFS at the last release of the
//     creating handle. Data written back later goes through the write descriptors the stripe
//     servers keep while it is dirty; a stripe server restarted meanwhile reopens the file
//     as the user and is refused (docs/mounts.md).

import (
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// openFile is a regular file open through the namespace.
type openFile struct {
	handles map[*cacheNS]int // open handles, by session
	path    string           // its path as the namespace last knew it (hidden: the hidden one)

	// Removed while open: hidden is its hidden path; the door of uid:gid removes it at the
	// last release. told: the remover's client was told to remove its objects.
	hidden   string
	uid, gid uint32
	told     bool

	// Created without the owner's read and write: the mode asked, set at the release of
	// the creating handle (creator).
	mode    uint32
	creator *cacheHandle
}

// opens is the open files of a namespace (sizeTable.opens), under sizeTable.omu, which
// serialises the renames to hidden names with the last releases.
func (t *sizeTable) openEntry(key CacheFileKey) *openFile {
	if t.opens == nil {
		t.opens = map[CacheFileKey]*openFile{}
	}
	return t.opens[key]
}

// track counts the regular file handle h of session c as open.
func (c *cacheNS) track(h *cacheHandle) {
	t := c.sizes
	t.omu.Lock()
	defer t.omu.Unlock()
	o := t.openEntry(h.key)
	if o == nil {
		o = &openFile{handles: map[*cacheNS]int{}, path: h.path}
		t.opens[h.key] = o
	}
	o.handles[c]++
	h.ns, h.tbl = c, t
}

// pendingMode is the mode asked at the creation of the file key, if its creating handle is
// still open (the PFS file then has the owner's read and write added).
func (t *sizeTable) pendingMode(key CacheFileKey) (uint32, bool) {
	t.omu.Lock()
	defer t.omu.Unlock()
	if o := t.opens[key]; o != nil && o.creator != nil {
		return o.mode, true
	}
	return 0, false
}

// openAttr makes a the attributes the namespace shows of the open file key: while it is
// being created, the mode asked; once removed, its link count without the hidden name.
func (t *sizeTable) openAttr(key CacheFileKey, a *proto.Attr) {
	t.omu.Lock()
	defer t.omu.Unlock()
	o := t.opens[key]
	if o == nil {
		return
	}
	if o.creator != nil {
		a.Mode = a.Mode&^0o7777 | o.mode
	}
	if o.hidden != "" && a.Nlink > 0 {
		a.Nlink--
	}
}

// ownerRW is the owner's read and write permission, which a file being created keeps.
const ownerRW = 0o600

// setPendingMode makes mode the mode the file key is to have once created, if its creation
// is still open (false: it is not).
func (t *sizeTable) setPendingMode(key CacheFileKey, mode uint32) bool {
	t.omu.Lock()
	defer t.omu.Unlock()
	if o := t.opens[key]; o != nil && o.creator != nil {
		o.mode = mode
		return true
	}
	return false
}

// handlePath is the path of h's file now: its hidden one once its name was removed, or where
// a rename through the namespace moved it.
func (c *cacheNS) handlePath(h *cacheHandle) string {
	t := c.sizes
	t.omu.Lock()
	defer t.omu.Unlock()
	if o := t.opens[h.key]; o != nil && h.tbl == t {
		return o.path
	}
	return h.path
}

// renamed notes that the open file key (if open) is at path now.
func (c *cacheNS) renamed(key CacheFileKey, path string) {
	t := c.sizes
	t.omu.Lock()
	defer t.omu.Unlock()
	if o := t.opens[key]; o != nil && o.hidden == "" {
		o.path = path
	}
}

// hide renames the regular file st at path to its hidden name if the namespace has it open
// (and it has none yet): hidden says it did (the name is gone, as an unlink would have it),
// and tell whether the remover's client is to remove the file's objects (every handle open
// on it is of session c). Called with t.omu held.
func (c *cacheNS) hideLocked(door *pfsio.Door, uid, gid uint32, path string, st *unix.Stat_t) (hidden, tell bool, errno syscall.Errno) {
	t := c.sizes
	key := keyOfStat(st)
	o := t.openEntry(key)
	if o == nil || o.hidden != "" {
		return false, false, 0
	}
	to := cache.UnlinkedPath(path, st.Ino)
	for range 2 {
		err := door.Rename(path, to, unix.RENAME_NOREPLACE)
		if doorErrno(err) != syscall.EEXIST {
			if err != nil {
				return false, false, doorErrno(err)
			}
			break
		}
		// A leftover of another file of that inode number (a crash): it goes.
		old, lerr := door.Lstat(to)
		if lerr != nil || keyOfStat(&old) == key {
			return false, false, 0 // this very file: its name is removed as usual
		}
		door.Unlink(to)
	}
	tell = len(o.handles) == 1 && o.handles[c] > 0
	o.hidden, o.path, o.uid, o.gid, o.told = to, to, uid, gid, tell
	return true, tell, 0
}

// removeName removes the name path of the file st (an unlink), or renames the file to its
// hidden name if it is open: the reply to give.
func (c *cacheNS) removeName(door *pfsio.Door, uid, gid uint32, path string, st *unix.Stat_t) (*proto.RemovedReply, syscall.Errno) {
	t := c.sizes
	t.omu.Lock()
	hidden, tell, errno := false, false, syscall.Errno(0)
	if isRegular(st) {
		hidden, tell, errno = c.hideLocked(door, uid, gid, path, st)
	}
	t.omu.Unlock()
	if errno != 0 {
		return nil, errno
	}
	if hidden {
		if tell {
			return c.removedObjects(path, st), 0
		}
		return &proto.RemovedReply{}, 0
	}
	if err := door.Unlink(path); err != nil {
		return nil, doorErrno(err)
	}
	if isRegular(st) && st.Nlink <= 1 {
		return c.removedRef(path, st), 0
	}
	return &proto.RemovedReply{}, 0
}

// untrack ends h's count (its last use ended): at the release of a file's creating handle
// the mode asked is set; at the file's last release its hidden name goes.
func (c *cacheNS) untrack(h *cacheHandle) {
	t := h.tbl // c's own may be released already (the session ended)
	t.omu.Lock()
	o := t.opens[h.key]
	if o == nil {
		t.omu.Unlock()
		return
	}
	if o.handles[c]--; o.handles[c] <= 0 {
		delete(o.handles, c)
	}
	setMode := o.creator == h
	if setMode {
		o.creator = nil
	}
	mode, path := o.mode, o.path
	last := len(o.handles) == 0
	if last {
		delete(t.opens, h.key)
	}
	if setMode {
		// Under omu: a rename to the hidden name waits, so that path is the file's.
		if st, err := h.door.Lstat(path); err == nil && keyOfStat(&st) == h.key {
			h.door.Chmod(path, mode) // the owner's own change: refused only if the PFS broke

		}
	}
	if !last || o.hidden == "" {
		t.omu.Unlock()
		return
	}
	door, errno := c.t.door(o.uid, o.gid)
	gone := false
	if errno == 0 {
		if st, err := door.Lstat(o.hidden); err == nil && keyOfStat(&st) == h.key {
			gone = door.Unlink(o.hidden) == nil && st.Nlink <= 1
		}
	}
	t.omu.Unlock()
	if gone {
		t.forget(h.key)
		t.dropPolicy(h.key)
		if !o.told {
			c.t.Data.Unlink(h.key) // this server's copy; the remover's client removes them all if told
		}
	}
}

// unhide renames the open file key back from its hidden name to path (a rename over it that
// failed after hideLocked).
func (c *cacheNS) unhide(door *pfsio.Door, key CacheFileKey, path string) {
	t := c.sizes
	t.omu.Lock()
	defer t.omu.Unlock()
	o := t.opens[key]
	if o == nil || o.hidden == "" {
		return
	}
	if door.Rename(o.hidden, path, unix.RENAME_NOREPLACE) == nil {
		o.hidden, o.path, o.told = "", path, false
	}
}

// creating marks h as the creating handle of its file, created with the owner's read and
// write added to mode, the mode asked.
func (c *cacheNS) creating(h *cacheHandle, mode uint32) {
	t := c.sizes
	t.omu.Lock()
	defer t.omu.Unlock()
	if o := t.opens[h.key]; o != nil && h.tbl == t {
		o.mode, o.creator = mode, h
	}
}
