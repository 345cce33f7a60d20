package server

// Cache namespaces: the namespace of a cache instance (#DW jobdw type=cache pfs=/dir) is the
// PFS directory itself, seen through the burst buffer. Its names, modes, owners and times are
// the PFS's; its regular files' data is striped over the instance's servers as a striped
// instance's is, each server caching the stripes it holds and moving them to and from the
// PFS itself (the data engine behind CacheData: write-behind, read-ahead). This file is the
// namespace backend, beside volume.go: when a session's Target has a Cache, every request of
// the session is served here (session.exec dispatches once, at its top), on the PFS through
// the door of the request's caller (package pfsio: the user's credentials, never root's, and
// no symbolic link of the user's is ever followed: a link in the middle of a path is ELOOP).
// cachestripes.go is the stripe servers' side: the objects of a cache fragment are the data
// engine's.
//
// # What the agent builds
//
// For a cache instance the agent's Resolver returns, for the namespace (stripes false) and
// for the stripe objects (stripes true) alike:
//
//	Target{
//		Dir:      <the fragment's directory on this node's SSD>, // the instance's SSD directory:
//		                                                        // the sizes table lives there
//		Tracker:  <the instance's tracker>,
//		Fragment: <the fragment's counters, as for any instance>,
//		Cache: &CacheTarget{
//			PFSRoot: "/lus/proj/dir",      // the directory of pfs=, as the job named it
//			Door:    doors.For,            // the door of (uid, gid) to PFSRoot: pfsio.Start as that
//			                               // user (one per user, kept and restarted by the agent)
//			Data:    store,                // this node's cachestore.Store, adapted to CacheData
//			Layout:  stripe.Layout{Size: <stripe size>, Width: <servers>, Servers: <servers>},
//			UID: owner, GID: group,       // the job's user: the root's attributes at a mount's
//			                               // handshake are looked up through their door
//		},
//	}
//
// A mount of a cache instance on one of its own storage nodes serves that node's part
// in-process (OpenLocal with LocalOptions.Cache), as for scratch; a cache file has no
// descriptor there (Local.ReadFd), so its data always goes through the data engine.
//
// Every node of the instance must be given the same Layout (its servers in the instance's
// fragment order, as for a striped instance) and the same PFSRoot: a file's layout is that
// default with an ID derived from the PFS file's (st_dev, st_ino) (cacheFileID), so every
// client and server computes the same without storing anything on the PFS.
//
// # Rules
//
//   - Inode numbers are the PFS's st_ino; a regular file's layout ID is derived from
//     (st_dev, st_ino).
//   - Sizes: a writer's mount reports a file's logical size when it closes, flushes or syncs
//     it (SetSizeAtLeast), as for a striped file; the PFS file may be shorter until the data
//     engine has written the stripes back. The namespace server keeps those reports in a
//     table (cachesizes.go, persisted in Target.Dir) and answers size = max(PFS size,
//     reported size); an entry goes when the PFS size reaches it, when the file is truncated
//     through the burst buffer or when its last name is removed through it. A truncation made
//     on the PFS directly is not seen while a larger report stands.
//   - No leases: other users of the PFS change it behind the burst buffer's back, so nothing
//     a reply says may be cached by the mount beyond the kernel's default timeouts.
//   - MKNOD makes regular files only: FIFOs, sockets and devices are EPERM (the door opens
//     regular files only). O_TMPFILE is EOPNOTSUPP; ADOPT (sharded metadata) is EOPNOTSUPP.
//   - user.spillway.layout reads a regular file's layout (a directory's: the instance's
//     default); it cannot be set (EPERM): the layout is the instance's. Other user.*
//     attributes are the PFS file's own, through the door.
//   - STATFS is the PFS's.
//   - The data of a regular file never goes through the namespace server: READ, WRITE and
//     their kin on its handles are EOPNOTSUPP (the mount sends them to the stripe servers).
//     A load-balanced cache's namespace (below) is the exception.
//
// # The load-balanced cache
//
// A cache of access_mode=loadbalance (CacheTarget.Loadbalance) is read-only, and every server
// of the instance serves the whole of it: its namespace (the PFS directory, as above) and the
// data of every file, each server fetching what it serves from the PFS once into its own data
// engine. Every server's namespace is then a replica of the others' (the PFS directory is
// the same), and a mount reads one and fails over to the next as it does for a loadbalance
// scratch instance's copies (package mount, replicas.go); the controller spreads the compute
// nodes over the servers. In this mode:
//
//   - Every change is EROFS: creates, writes, truncations, renames, removals, attribute and
//     extended attribute changes, opens for writing or with O_TRUNC.
//   - The Layout is one server's (Width 1, Servers 1): this server holds all of every file,
//     in its engine (whose cache.Config.Server is 0), at object offsets equal to file offsets.
//   - OPEN of a regular file opens it through the door (the user's rights, as above) and in
//     the engine; the reply carries neither layout nor CacheRef, so the mount reads the file
//     through this session as a plain file. READ on the handle reads the engine, bounded by
//     the file's size when it was opened (close-to-open: the engine drops what it holds of a
//     file changed on the PFS at the next open). LSEEK's SEEK_DATA and SEEK_HOLE see one
//     extent of data up to that size.
//   - There are no stripe sessions: nothing holds a stripe object of such an instance.

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// CacheTarget makes a Target a cache instance's: its namespace is the PFS directory PFSRoot
// seen through Door, and its stripe objects are Data's.
type CacheTarget struct {
	// PFSRoot is the PFS directory the instance caches (for messages: every access goes
	// through a door opened on it).
	PFSRoot string
	// Door returns the door to PFSRoot with the credentials of uid:gid (a request's caller).
	// The server never closes it: the provider keeps one per user (and starts a new one when
	// its Gone closes); it is called for every request, so it must be quick once the door
	// is open. uid 0 is root on a compute node (and the kernel's own requests, a RELEASE's
	// size report among them): the provider decides whether root gets a door. An error
	// refuses the request (its errno, or EACCES).
	Door func(uid, gid uint32) (*pfsio.Door, error)
	// Data is this node's data engine: the stripes of the files it holds.
	Data CacheData
	// Layout is the instance's default layout (ID 0, or stripe.FixedStart): every regular
	// file has it, with its own ID (cacheFileID).
	Layout stripe.Layout
	// UID and GID are the instance's owner: a mount's handshake looks the root up through
	// their door.
	UID, GID uint32
	// Defaults is the instance's cache policy, which user.spillway.cache.policy reads with a
	// file's overrides applied (cachepolicy.go).
	Defaults cache.Policy
	// Loadbalance makes the namespace a load-balanced cache's (access_mode=loadbalance, see
	// above): read-only, and serving the data of its regular files itself through Data,
	// whole. Layout must then be one server's (Width 1, Servers 1).
	Loadbalance bool
}

// CacheFileKey is a PFS file's identity: (st_dev, st_ino) as the door's lstat sees it.
type CacheFileKey struct{ Dev, Ino uint64 }

// CacheFileRef names a PFS file for the data engine: its path in the PFS directory, its
// identity (the engine refuses a file at Path that is no longer Key: ESTALE) and its layout
// (what this server holds of it).
type CacheFileRef struct {
	Path   string
	Key    CacheFileKey
	Layout stripe.Layout
	// Override is the file's policy overrides (cachepolicy.go), set at OverrideGen (0:
	// never): the engine applies the newest it heard of to the file at every open.
	Override    cache.Override
	OverrideGen uint64
}

// CacheFile is a file open in the data engine: its object on this server, at object offsets
// (stripe.Layout's arithmetic maps them to the PFS file's).
type CacheFile interface {
	// ReadAt reads the object at objOff; past what the file holds it reads short (io.EOF
	// allowed, as io.ReaderAt): the mount reads zeros there.
	ReadAt(p []byte, objOff uint64) (int, error)
	WriteAt(p []byte, objOff uint64) (int, error)
	// Fsync makes what was written durable (on the PFS, or in the engine's own durable
	// state, as the engine promises).
	Fsync() error
	// SyncToPFS returns once what the file holds on this server is on the PFS and synced
	// (proto.FsyncToPFS; libdatawarp's dw_wait_sync_complete): for an engine that writes
	// through, Fsync.
	SyncToPFS() error
	// Closing is a close's sync (proto.FsyncClosing): SyncToPFS if the file's policy syncs on
	// close, else nothing.
	Closing() error
	Close() error
}

// CacheData is a node's data engine for cache instances (package cachestore): the stripe
// servers of a cache fragment serve object requests through it.
type CacheData interface {
	// OpenFile opens the file ref names, for writing if write, with the caller's door (the
	// credentials the PFS file is opened with).
	OpenFile(door *pfsio.Door, ref CacheFileRef, write bool) (CacheFile, error)
	// Truncate cuts the file to size bytes (the file's new size, not this server's object's:
	// a cache object's SETATTR carries the file's size, which the cache's decisions are made
	// in): what this server holds past it is gone, never written back. The PFS file is
	// truncated by the namespace server too (SETATTR of the size, after the objects), so an
	// engine that writes through needs do nothing more.
	Truncate(door *pfsio.Door, ref CacheFileRef, size uint64) error
	// Unlink drops everything held of the file key, whose last name is gone.
	Unlink(key CacheFileKey)
}

// cacheFileID is the layout ID of the PFS file key: the same on every node, never 0 or 1
// (stripe.FixedStart; see newFileID).
func cacheFileID(key CacheFileKey) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], key.Dev)
	binary.LittleEndian.PutUint64(b[8:], key.Ino)
	sum := sha256.Sum256(b[:])
	return binary.LittleEndian.Uint64(sum[:]) | 2
}

// fileLayout is the layout of the regular file key in the instance.
func (t *CacheTarget) fileLayout(key CacheFileKey) stripe.Layout {
	return t.Layout.ForFile(cacheFileID(key))
}

// door is the door of uid:gid, or the errno refusing the request.
func (t *CacheTarget) door(uid, gid uint32) (*pfsio.Door, syscall.Errno) {
	d, err := t.Door(uid, gid)
	if err != nil {
		var errno syscall.Errno
		if errors.As(err, &errno) {
			return nil, errno
		}
		return nil, syscall.EACCES
	}
	if d == nil {
		return nil, syscall.EACCES
	}
	return d, 0
}

// doorErrno is the errno of a door's or the data engine's error (EIO when it carries none).
func doorErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return syscall.EIO
}

// cacheBackend serves the requests of a cache session: its namespace (cacheNS) or its
// stripe objects (cacheObjects).
type cacheBackend interface {
	exec(s *session, op proto.Op, uid, gid uint32, m proto.Message, dest []byte) (proto.Message, int, syscall.Errno)
	close()
}

// openCache is the backend of a session of target t (nil: not a cache's) and the root's
// attributes for its Welcome (of the volume v when not a cache's).
func openCache(t Target, v *volume, stripes bool) (cacheBackend, proto.Attr, syscall.Errno) {
	if t.Cache == nil {
		root, errno := v.lookup("")
		return nil, root, errno
	}
	ct := t.Cache
	if ct.Door == nil || ct.Data == nil || ct.Layout.Validate() != nil || ct.Layout.ID > stripe.FixedStart {
		return nil, proto.Attr{}, syscall.EINVAL
	}
	if ct.Loadbalance && (stripes || ct.Layout.Servers != 1 || ct.Layout.Width != 1) {
		return nil, proto.Attr{}, syscall.EINVAL // one server holds all of every file: no stripe objects
	}
	if stripes {
		root, errno := v.lookup("")
		return &cacheObjects{t: ct, v: v}, root, errno
	}
	sizes, err := acquireSizes(t.Dir)
	if err != nil {
		return nil, proto.Attr{}, errnoOf(err)
	}
	c := &cacheNS{t: ct, sizes: sizes, v: v}
	door, errno := ct.door(ct.UID, ct.GID)
	if errno != 0 {
		c.close()
		return nil, proto.Attr{}, errno
	}
	root, errno := c.lookup(door, "")
	if errno != 0 {
		c.close()
		return nil, proto.Attr{}, errno
	}
	return c, root, 0
}

func (c *cacheNS) close()      { releaseSizes(c.sizes); c.sizes = nil }
func (c *cacheObjects) close() {}

// closeCache ends the session's cache backend, if it has one.
func (s *session) closeCache() {
	if s.cache != nil {
		s.cache.close()
	}
}

// cacheHandle is what a handle of a cache session holds (handle.cache).
type cacheHandle struct {
	path string // the file's or directory's path when it was opened
	key  CacheFileKey
	door *pfsio.Door

	file    *pfsio.File    // namespace: a regular file opened as the user
	flags   int            // the flags it was opened with
	entries []proto.Dirent // namespace: a directory's listing, read at OPENDIR

	data CacheFile // stripe session: the object, in the data engine; load-balanced namespace: the file
	ref  CacheFileRef
	size uint64 // load-balanced namespace: the file's size at open (READ stops there)

	// A namespace's regular file: counted in its open files (cacheopens.go) by ns, in tbl.
	ns  *cacheNS
	tbl *sizeTable
}

func (c *cacheHandle) close() {
	if c.tbl != nil {
		c.ns.untrack(c) // first: the creator's mode is set by name, the file still open
	}
	if c.file != nil {
		c.file.Close()
	}
	if c.data != nil {
		c.data.Close()
	}
}

// cacheNS is a session's cache namespace.
type cacheNS struct {
	t     *CacheTarget
	sizes *sizeTable
	v     *volume // the session's volume on Target.Dir: read-only, limits, counters
}

// joinPath is dir/name in a namespace path ("" is the root).
func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// keyOfStat is a PFS file's identity.
func keyOfStat(st *unix.Stat_t) CacheFileKey { return CacheFileKey{Dev: st.Dev, Ino: st.Ino} }

func isRegular(st *unix.Stat_t) bool { return st.Mode&syscall.S_IFMT == syscall.S_IFREG }

// attr is a PFS node's attributes as clients see them: a regular file's size is the larger
// of the PFS's and the size reported (cachesizes.go).
func (c *cacheNS) attr(st *unix.Stat_t) proto.Attr {
	a := toAttr(st)
	if isRegular(st) {
		c.sizes.openAttr(keyOfStat(st), &a) // being created, or removed while open (cacheopens.go)
		if size := c.sizes.size(keyOfStat(st), uint64(st.Size)); size > a.Size {
			a.Size = size
			a.Blocks = max(a.Blocks, (size+511)/512)
		}
	}
	return a
}

// lstat looks path up through door.
func (c *cacheNS) lstat(door *pfsio.Door, path string) (unix.Stat_t, syscall.Errno) {
	if errno := pathErrno(path); errno != 0 {
		return unix.Stat_t{}, errno
	}
	if cache.IsUnlinkedName(path) {
		return unix.Stat_t{}, syscall.ENOENT // a file removed while open (cacheopens.go)
	}
	st, err := door.Lstat(path)
	return st, doorErrno(err)
}

func (c *cacheNS) lookup(door *pfsio.Door, path string) (proto.Attr, syscall.Errno) {
	st, errno := c.lstat(door, path)
	if errno != 0 {
		return proto.Attr{}, errno
	}
	return c.attr(&st), 0
}

// modifying says whether op changes the namespace (refused on a read-only mount).
func modifying(op proto.Op) bool {
	switch op {
	case proto.OpSetattr, proto.OpCreate, proto.OpTmpfile, proto.OpMkdir, proto.OpMknod, proto.OpSymlink,
		proto.OpLink, proto.OpUnlink, proto.OpRmdir, proto.OpRename, proto.OpSetxattr, proto.OpRemovexattr,
		proto.OpAdopt, proto.OpWrite, proto.OpWriteSync, proto.OpFallocate, proto.OpCopyRange,
		proto.OpReserve, proto.OpPlace:
		return true
	}
	return false
}

// exec serves one request of a cache namespace's session (session.exec's counterpart).
func (c *cacheNS) exec(s *session, op proto.Op, uid, gid uint32, m proto.Message, dest []byte) (proto.Message, int, syscall.Errno) {
	if (c.v.readOnly || c.t.Loadbalance) && modifying(op) {
		return nil, 0, syscall.EROFS
	}
	if op == proto.OpReserve || op == proto.OpPlace {
		return nil, 0, syscall.EOPNOTSUPP // a cache file is the PFS's: made there, by its user
	}
	switch r := m.(type) {
	case *proto.HandleReq:
		return &proto.Empty{}, 0, s.release(r.Handle)
	case *proto.ReadReq:
		if c.t.Loadbalance {
			return c.read(s, r, dest)
		}
	case *proto.LseekReq:
		if c.t.Loadbalance {
			return c.lseek(s, r)
		}
	}
	switch r := m.(type) {
	case *proto.ReaddirReq:
		hd := s.get(r.Handle)
		if hd == nil {
			return nil, 0, syscall.EBADF
		}
		defer s.put(hd)
		rep, errno := c.readdir(hd, r.Offset)
		return &rep, 0, errno
	case *proto.FsyncReq:
		// The namespace's part of fsync(2): the sizes table is written at every change.
		hd := s.get(r.Handle)
		if hd == nil {
			return nil, 0, syscall.EBADF
		}
		s.put(hd)
		return &proto.Empty{}, 0, 0
	case *proto.ReadReq, *proto.WriteReq, *proto.WriteSyncReq, *proto.FallocateReq, *proto.LseekReq, *proto.CopyRangeReq, *proto.AdoptReq:
		return nil, 0, syscall.EOPNOTSUPP // a cache file's data is on the stripe servers
	}
	door, errno := c.t.door(uid, gid)
	if errno != 0 {
		return nil, 0, errno
	}
	attrReply := func(a proto.Attr, errno syscall.Errno) (proto.Message, int, syscall.Errno) {
		return &proto.AttrReply{Attr: a}, 0, errno
	}
	empty := func(errno syscall.Errno) (proto.Message, int, syscall.Errno) { return &proto.Empty{}, 0, errno }
	opened := func(hd *cacheHandle, rep *proto.OpenReply, errno syscall.Errno) (proto.Message, int, syscall.Errno) {
		if errno != 0 {
			return nil, 0, errno
		}
		id, errno := s.add(&handle{cache: hd})
		rep.Handle = id
		return rep, 0, errno
	}
	switch r := m.(type) {
	case *proto.PathReq:
		switch op {
		case proto.OpLookup:
			return attrReply(c.lookup(door, r.Path))
		case proto.OpReadlink:
			if errno := pathErrno(r.Path); errno != 0 {
				return nil, 0, errno
			}
			target, err := door.Readlink(r.Path)
			return &proto.DataReply{Data: []byte(target)}, 0, doorErrno(err)
		case proto.OpOpendir:
			hd, errno := c.opendir(door, r.Path)
			if errno != 0 {
				return nil, 0, errno
			}
			id, errno := s.add(&handle{cache: hd, dir: true})
			return &proto.HandleReply{Handle: id}, 0, errno
		}
	case *proto.NodeReq:
		if r.Handle == 0 {
			return attrReply(c.lookup(door, r.Path))
		}
		hd := s.get(r.Handle)
		if hd == nil {
			return nil, 0, syscall.EBADF
		}
		defer s.put(hd)
		return attrReply(c.getattr(door, hd.cache))
	case *proto.SetattrReq:
		var ch *cacheHandle
		if r.Handle != 0 {
			hd := s.get(r.Handle)
			if hd == nil {
				return nil, 0, syscall.EBADF
			}
			defer s.put(hd)
			ch = hd.cache
		}
		return attrReply(c.setattr(door, r, ch))
	case *proto.OpenReq:
		return opened(c.open(door, r.Path, r.Flags, false, 0))
	case *proto.CreateReq:
		if op == proto.OpTmpfile {
			return nil, 0, syscall.EOPNOTSUPP
		}
		path, errno := c.newPath(r.Dir, r.Name)
		if errno != 0 {
			return nil, 0, errno
		}
		return opened(c.create(door, path, r.Flags, r.Mode))
	case *proto.MkdirReq:
		if op == proto.OpMknod {
			return attrReply(c.mknod(door, r))
		}
		path, errno := c.newPath(r.Dir, r.Name)
		if errno != 0 {
			return nil, 0, errno
		}
		if errno := c.v.acct.writable(); errno != 0 {
			return nil, 0, errno
		}
		if errno := doorErrno(door.Mkdir(path, r.Mode&0o7777)); errno != 0 {
			return nil, 0, errno
		}
		return attrReply(c.lookup(door, path))
	case *proto.SymlinkReq:
		path, errno := c.newPath(r.Dir, r.Name)
		if errno != 0 {
			return nil, 0, errno
		}
		if r.Target == "" || strings.IndexByte(r.Target, 0) >= 0 {
			return nil, 0, syscall.EINVAL
		}
		if errno := c.v.acct.startCreate(); errno != 0 {
			return nil, 0, errno
		}
		errno = doorErrno(door.Symlink(r.Target, path))
		c.v.acct.createDone(errno == 0)
		if errno != 0 {
			return nil, 0, errno
		}
		return attrReply(c.lookup(door, path))
	case *proto.LinkReq:
		path, errno := c.newPath(r.Dir, r.Name)
		if errno != 0 {
			return nil, 0, errno
		}
		if errno := pathErrno(r.Path); errno != 0 {
			return nil, 0, errno
		}
		if r.Path == "" {
			return nil, 0, syscall.EPERM // the root is a directory
		}
		if errno := c.v.acct.writable(); errno != 0 {
			return nil, 0, errno
		}
		if errno := doorErrno(door.Link(r.Path, path)); errno != 0 {
			return nil, 0, errno
		}
		return attrReply(c.lookup(door, path))
	case *proto.EntryReq:
		rep, errno := c.unlink(door, uid, gid, r, op == proto.OpRmdir)
		if op == proto.OpRmdir {
			return empty(errno)
		}
		return rep, 0, errno
	case *proto.RenameReq:
		rep, errno := c.rename(door, uid, gid, r)
		return rep, 0, errno
	case *proto.Empty: // STATFS
		rep, errno := pfsStatfs(door, 1)
		return &rep, 0, errno
	case *proto.XattrReq:
		var ch *cacheHandle
		if r.Handle != 0 {
			hd := s.get(r.Handle)
			if hd == nil {
				return nil, 0, syscall.EBADF
			}
			defer s.put(hd)
			ch = hd.cache
		}
		rep, errno := c.xattr(door, op, r, ch)
		if op == proto.OpSetxattr || op == proto.OpRemovexattr {
			return empty(errno)
		}
		return &rep, 0, errno
	}
	return nil, 0, syscall.ENOSYS
}

// newPath is the path of a new entry name in dir.
func (c *cacheNS) newPath(dir, name string) (string, syscall.Errno) {
	if errno := nameErrno(name); errno != 0 {
		return "", errno
	}
	if errno := pathErrno(dir); errno != 0 {
		return "", errno
	}
	if cache.IsUnlinkedName(name) {
		return "", syscall.EPERM // the hidden names of files removed while open (cacheopens.go)
	}
	return joinPath(dir, name), 0
}

// getattr is the attributes of a handle's node: a file's through its descriptor (the file
// it opened, whatever its name now), a directory's by its path.
func (c *cacheNS) getattr(door *pfsio.Door, h *cacheHandle) (proto.Attr, syscall.Errno) {
	if h.file != nil {
		st, err := h.file.Fstat()
		if err != nil {
			return proto.Attr{}, doorErrno(err)
		}
		return c.attr(&st), 0
	}
	return c.lookup(door, h.path)
}

// openFlags are the flags a namespace open passes to the door: the access mode and the
// creation flags (the data is opened by the stripe servers, with their own).
func cacheOpenFlags(flags uint32) int {
	const keep = unix.O_ACCMODE | unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC | unix.O_NOATIME
	return int(flags) & keep
}

// open opens (create: creates if need be) the regular file at path as the user: the door's
// open checks the user's rights on the PFS, and the reply gives the file's layout and
// CacheRef for its stripe objects.
func (c *cacheNS) open(door *pfsio.Door, path string, flags uint32, create bool, mode uint32) (*cacheHandle, *proto.OpenReply, syscall.Errno) {
	if flags&unix.O_ACCMODE == unix.O_ACCMODE {
		return nil, nil, syscall.EINVAL
	}
	if errno := pathErrno(path); errno != 0 {
		return nil, nil, errno
	}
	if path == "" {
		return nil, nil, syscall.EISDIR
	}
	of := cacheOpenFlags(flags)
	if create {
		of |= unix.O_CREAT
	} else {
		of &^= unix.O_CREAT | unix.O_EXCL
	}
	if writes(flags) || flags&unix.O_TRUNC != 0 {
		if c.v.readOnly || c.t.Loadbalance {
			return nil, nil, syscall.EROFS
		}
		if errno := c.v.acct.writable(); errno != 0 {
			return nil, nil, errno
		}
	}
	truncated := flags&unix.O_TRUNC != 0
	if truncated {
		// Not truncated here: the client truncates the file's objects first (the data
		// engines drop what they hold of it, dirty or not, before the PFS file is emptied:
		// else they could write old data back into it), then the file, through this handle
		// (proto.OpenReply.Truncated). Opened for writing, so that a user who may not write
		// it is refused before the engines drop anything.
		of &^= unix.O_TRUNC
		if of&unix.O_ACCMODE == unix.O_RDONLY {
			of = of&^unix.O_ACCMODE | unix.O_RDWR
		}
	}
	f, err := door.OpenFile(path, of, mode&0o7777)
	if err != nil {
		return nil, nil, doorErrno(err)
	}
	st := f.Stat
	key := keyOfStat(&st)
	l := c.t.fileLayout(key)
	a := c.attr(&st)
	if truncated {
		a.Size, a.Blocks = 0, 0 // what it is once the client has truncated it
	}
	if c.t.Loadbalance {
		return c.openWhole(door, path, f, key, a)
	}
	l.Length = a.Size // the logical size, as a striped stub's layout carries it
	rep := &proto.OpenReply{Attr: a, Layout: l.Encode(), Truncated: truncated,
		Cache: &proto.CacheRef{Path: path, Dev: key.Dev, Ino: key.Ino, Policy: policyOf(c.sizes.policy(key))}}
	h := &cacheHandle{path: path, key: key, door: door, file: f, flags: of}
	c.track(h)
	return h, rep, 0
}

// create opens the regular file at path, creating it if need be (O_CREAT): counted against
// the namespace's MFC, as a create of any namespace (past it an existing file still opens,
// as O_CREAT allows).
func (c *cacheNS) create(door *pfsio.Door, path string, flags, mode uint32) (*cacheHandle, *proto.OpenReply, syscall.Errno) {
	if errno := c.v.acct.startCreate(); errno != 0 {
		if flags&unix.O_EXCL == 0 && errno == syscall.EMFILE {
			return c.open(door, path, flags, false, 0)
		}
		return nil, nil, errno
	}
	// A file its owner may not read and write is made so until the creating handle's release
	// (cacheopens.go): the stripe servers open it as the user.
	asked := mode & 0o7777
	h, rep, errno := c.open(door, path, flags|unix.O_EXCL, true, asked|ownerRW)
	created := errno == 0
	if errno == syscall.EEXIST && flags&unix.O_EXCL == 0 {
		h, rep, errno = c.open(door, path, flags, false, 0) // it was there, or another made it
	}
	c.v.acct.createDone(created)
	if created && asked&ownerRW != ownerRW && !c.t.Loadbalance {
		c.creating(h, asked)
		rep.Attr = c.attr(&h.file.Stat)
	}
	if created {
		c.inheritPolicy(door, path, h.key)
		rep.Cache.Policy = policyOf(c.sizes.policy(h.key))
	}
	if created && rep.Truncated {
		rep.Truncated = false // a new file: nothing of it to truncate
		rep.Attr = c.attr(&h.file.Stat)
	}
	return h, rep, errno
}

// mknod makes regular files only (the door opens nothing else).
func (c *cacheNS) mknod(door *pfsio.Door, r *proto.MkdirReq) (proto.Attr, syscall.Errno) {
	path, errno := c.newPath(r.Dir, r.Name)
	if errno != 0 {
		return proto.Attr{}, errno
	}
	if r.Mode&syscall.S_IFMT != syscall.S_IFREG && r.Mode&syscall.S_IFMT != 0 {
		return proto.Attr{}, syscall.EPERM
	}
	if errno := c.v.acct.startCreate(); errno != 0 {
		return proto.Attr{}, errno
	}
	f, err := door.OpenFile(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, r.Mode&0o7777)
	c.v.acct.createDone(err == nil)
	if err != nil {
		return proto.Attr{}, doorErrno(err)
	}
	st := f.Stat
	f.Close()
	return c.attr(&st), 0
}

// setattr changes what r.Valid says of the node at r.Path, or of h's. A size report
// (SetSizeAtLeast) goes to the sizes table; a truncation truncates the PFS file as the user
// (the stripe servers' cached data is truncated by the client, object by object).
func (c *cacheNS) setattr(door *pfsio.Door, r *proto.SetattrReq, h *cacheHandle) (proto.Attr, syscall.Errno) {
	path := r.Path
	if h != nil {
		path = c.handlePath(h)
	}
	if r.Valid&proto.SetSync != 0 && h == nil {
		return proto.Attr{}, syscall.EINVAL
	}
	stat := func() (unix.Stat_t, syscall.Errno) {
		if h != nil && h.file != nil {
			st, err := h.file.Fstat()
			return st, doorErrno(err)
		}
		return c.lstat(door, path)
	}
	st, errno := stat()
	if errno != 0 {
		return proto.Attr{}, errno
	}
	key := keyOfStat(&st)
	if r.Valid&(proto.SetSize|proto.SetSizeAtLeast) != 0 {
		switch {
		case st.Mode&syscall.S_IFMT == syscall.S_IFDIR:
			return proto.Attr{}, syscall.EISDIR
		case !isRegular(&st):
			return proto.Attr{}, syscall.EINVAL
		}
		if c.v.maxFileSize > 0 && r.Size > uint64(c.v.maxFileSize) || r.Size > 1<<62 {
			return proto.Attr{}, syscall.EFBIG
		}
	}
	switch {
	case r.Valid&proto.SetSizeAtLeast != 0:
		c.v.acct.sizeReported(r.Size)
		if errno := c.sizes.report(key, r.Size, uint64(st.Size)); errno != 0 {
			return proto.Attr{}, errno
		}
	case r.Valid&proto.SetSize != 0:
		if errno := c.v.acct.writable(); errno != 0 {
			return proto.Attr{}, errno
		}
		var err error
		if h != nil && h.file != nil && writes(uint32(h.fileFlags())) {
			err = h.file.Truncate(int64(r.Size))
		} else {
			var f *pfsio.File
			f, err = door.OpenFile(path, unix.O_WRONLY, 0)
			if err == nil {
				if keyOfStat(&f.Stat) != key {
					err = syscall.ESTALE // renamed over meanwhile
				} else {
					err = f.Truncate(int64(r.Size))
				}
				f.Close()
			}
		}
		if err != nil {
			return proto.Attr{}, doorErrno(err)
		}
		c.sizes.forget(key)
	}
	const byPath = proto.SetMode | proto.SetUID | proto.SetGID | proto.SetAtime | proto.SetMtime | proto.SetAtimeNow | proto.SetMtimeNow
	if r.Valid&byPath != 0 && h != nil {
		// The door changes these by name: the handle's name must still be its file's.
		if errno := c.samePath(door, h); errno != 0 {
			if r.Valid&byPath != proto.SetMtimeNow || r.Valid&proto.SetSizeAtLeast == 0 {
				return proto.Attr{}, errno
			}
			r.Valid &^= proto.SetMtimeNow // a size report's touch of a file renamed since: left out
		}
	}
	if r.Valid&proto.SetMode != 0 {
		mode := r.Mode & 0o7777
		if _, creating := c.sizes.pendingMode(key); creating && isRegular(&st) {
			mode |= ownerRW // being created: the mode asked is set at the creator's release
		}
		if errno := doorErrno(door.Chmod(path, mode)); errno != 0 {
			return proto.Attr{}, errno
		}
		if mode != r.Mode&0o7777 && !c.sizes.setPendingMode(key, r.Mode&0o7777) {
			door.Chmod(path, r.Mode&0o7777) // the creator closed meanwhile
		}
	}
	if r.Valid&(proto.SetUID|proto.SetGID) != 0 {
		uid, gid := -1, -1
		if r.Valid&proto.SetUID != 0 {
			uid = int(r.UID)
		}
		if r.Valid&proto.SetGID != 0 {
			gid = int(r.GID)
		}
		if errno := doorErrno(door.Chown(path, uid, gid)); errno != 0 {
			return proto.Attr{}, errno
		}
	}
	if r.Valid&(proto.SetAtime|proto.SetMtime|proto.SetAtimeNow|proto.SetMtimeNow) != 0 {
		at, mt := timeOf(r.Valid, proto.SetAtime, proto.SetAtimeNow, r.Atime), timeOf(r.Valid, proto.SetMtime, proto.SetMtimeNow, r.Mtime)
		if errno := doorErrno(door.Utimens(path, at, mt)); errno != 0 {
			return proto.Attr{}, errno
		}
	}
	// SetSync asks nothing more: the sizes table is durable at every change, the door's
	// changes are the PFS's own, and the data's durability is the stripe servers' FSYNC.
	st, errno = stat()
	if errno != 0 {
		return proto.Attr{}, errno
	}
	return c.attr(&st), 0
}

// samePath says whether the handle's path still names its node (ESTALE: renamed, replaced or
// removed since it was opened): what the door does by name to a handle's node must reach it.
func (c *cacheNS) samePath(door *pfsio.Door, h *cacheHandle) syscall.Errno {
	path := c.handlePath(h)
	if errno := pathErrno(path); errno != 0 {
		return errno
	}
	st, err := door.Lstat(path) // not c.lstat: a hidden name is the handle's own
	errno := doorErrno(err)
	if errno == syscall.ENOENT || errno == 0 && keyOfStat(&st) != h.key {
		return syscall.ESTALE
	}
	return errno
}

// fileFlags is the access mode the handle's PFS file was opened with.
func (c *cacheHandle) fileFlags() int {
	if c.file == nil {
		return unix.O_RDONLY
	}
	return c.flags
}

// timeOf is the Timespec of one time of a SETATTR: given, now, or left alone.
func timeOf(valid uint32, set, now uint32, t proto.Timespec) unix.Timespec {
	switch {
	case valid&now != 0:
		return unix.Timespec{Nsec: unix.UTIME_NOW}
	case valid&set != 0:
		return unix.Timespec{Sec: t.Sec, Nsec: int64(t.Nsec)}
	}
	return unix.Timespec{Nsec: unix.UTIME_OMIT}
}

// removedRef is what a RemovedReply says of a regular file whose last name went: its layout
// and CacheRef, so that the client removes its objects.
func (c *cacheNS) removedRef(path string, st *unix.Stat_t) *proto.RemovedReply {
	key := keyOfStat(st)
	c.sizes.forget(key)
	c.sizes.dropPolicy(key)
	return c.removedObjects(path, st)
}

// removedObjects is removedRef's reply alone: the file's size report and policy stay (a file
// removed while open, cacheopens.go: they go at its last release).
func (c *cacheNS) removedObjects(path string, st *unix.Stat_t) *proto.RemovedReply {
	key := keyOfStat(st)
	return &proto.RemovedReply{Layout: c.t.fileLayout(key).Encode(),
		Cache: &proto.CacheRef{Path: path, Dev: key.Dev, Ino: key.Ino}}
}

// unlink removes a name (dir: a directory). A regular file's last name going (as far as the
// lstat just before says) tells the client to remove its objects.
func (c *cacheNS) unlink(door *pfsio.Door, uid, gid uint32, r *proto.EntryReq, dir bool) (*proto.RemovedReply, syscall.Errno) {
	path, errno := c.newPath(r.Dir, r.Name)
	if errno != 0 {
		return nil, errno
	}
	if dir {
		return nil, doorErrno(door.Rmdir(path))
	}
	st, err := door.Lstat(path)
	if err != nil {
		return nil, doorErrno(err)
	}
	return c.removeName(door, uid, gid, path, &st) // an open file's is renamed (cacheopens.go)
}

func (c *cacheNS) rename(door *pfsio.Door, uid, gid uint32, r *proto.RenameReq) (*proto.RemovedReply, syscall.Errno) {
	from, errno := c.newPath(r.Dir, r.Name)
	if errno != 0 {
		return nil, errno
	}
	to, errno := c.newPath(r.NewDir, r.NewName)
	if errno != 0 {
		return nil, errno
	}
	src, srcErr := door.Lstat(from)
	var replaced unix.Stat_t
	replacing, hidden, tell := false, false, false
	if r.Flags&(unix.RENAME_EXCHANGE|unix.RENAME_NOREPLACE) == 0 && srcErr == nil {
		if st, err := door.Lstat(to); err == nil && isRegular(&st) && keyOfStat(&src) != keyOfStat(&st) {
			// The file renamed over, if open, keeps a hidden name until its last release
			// (cacheopens.go): renamed there first, and back if the rename fails.
			c.sizes.omu.Lock()
			hidden, tell, errno = c.hideLocked(door, uid, gid, to, &st)
			c.sizes.omu.Unlock()
			if errno != 0 {
				return nil, errno
			}
			replaced, replacing = st, !hidden && st.Nlink <= 1
		}
	}
	if err := door.Rename(from, to, uint(r.Flags)); err != nil {
		if hidden {
			c.unhide(door, keyOfStat(&replaced), to)
		}
		return nil, doorErrno(err)
	}
	if srcErr == nil {
		c.renamed(keyOfStat(&src), to)
		if r.Flags&unix.RENAME_EXCHANGE != 0 {
			if st, err := door.Lstat(from); err == nil {
				c.renamed(keyOfStat(&st), from)
			}
		}
	}
	switch {
	case hidden && tell:
		return c.removedObjects(to, &replaced), 0
	case replacing:
		return c.removedRef(to, &replaced), 0
	}
	return &proto.RemovedReply{}, 0
}

// opendir reads the directory's listing whole: the door lists a directory in one pass, and
// READDIR serves it from offsets into it ("." and ".." first, as getdents gives them).
func (c *cacheNS) opendir(door *pfsio.Door, path string) (*cacheHandle, syscall.Errno) {
	st, errno := c.lstat(door, path)
	if errno != 0 {
		return nil, errno
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil, syscall.ENOTDIR
	}
	entries := []proto.Dirent{{Ino: st.Ino, Off: 1, Type: syscall.S_IFDIR, Name: "."}, {Ino: st.Ino, Off: 2, Type: syscall.S_IFDIR, Name: ".."}}
	err := door.ReadDir(path, func(batch []pfsio.Entry) error {
		for _, e := range batch {
			if cache.IsUnlinkedName(e.Name) {
				continue // a file removed while open (cacheopens.go)
			}
			entries = append(entries, proto.Dirent{Ino: e.Stat.Ino, Off: uint64(len(entries) + 1), Type: e.Type & syscall.S_IFMT, Name: e.Name})
		}
		return nil
	})
	if err != nil {
		return nil, doorErrno(err)
	}
	return &cacheHandle{path: path, key: keyOfStat(&st), door: door, entries: entries}, 0
}

// readdir serves a directory handle's listing from offset (an entry's Off: the index of the
// one after it).
func (c *cacheNS) readdir(h *handle, offset uint64) (proto.ReaddirReply, syscall.Errno) {
	if h.cache == nil || !h.dir {
		return proto.ReaddirReply{}, syscall.ENOTDIR
	}
	all := h.cache.entries
	if offset > uint64(len(all)) {
		return proto.ReaddirReply{EOF: true}, 0
	}
	var out proto.ReaddirReply
	room := proto.MaxDirReply - 64
	for _, e := range all[offset:] {
		need := 8 + 8 + 4 + 2 + len(e.Name)
		if need > room {
			return out, 0
		}
		room -= need
		out.Entries = append(out.Entries, e)
	}
	out.EOF = true
	return out, 0
}

// pfsStatfs is the PFS's statfs through door, its space divided by share (a stripe server of
// n reports 1/n of it: a striped mount adds its servers' sizes up).
func pfsStatfs(door *pfsio.Door, share uint64) (proto.StatfsReply, syscall.Errno) {
	st, err := door.Statfs()
	if err != nil {
		return proto.StatfsReply{}, doorErrno(err)
	}
	share = max(share, 1)
	return proto.StatfsReply{Blocks: st.Blocks / share, Bfree: st.Bfree / share, Bavail: st.Bavail / share,
		Files: st.Files, Ffree: st.Ffree, Bsize: uint32(st.Bsize), Frsize: uint32(st.Frsize), NameLen: uint32(st.Namelen)}, 0
}

// xattr serves the extended attributes: user.spillway.layout from the instance's layout,
// the others the PFS node's own (user.* only: the door refuses the rest).
func (c *cacheNS) xattr(door *pfsio.Door, op proto.Op, r *proto.XattrReq, h *cacheHandle) (proto.XattrReply, syscall.Errno) {
	if op != proto.OpListxattr && (r.Name == "" || strings.IndexByte(r.Name, 0) >= 0) {
		return proto.XattrReply{}, syscall.EINVAL
	}
	path := r.Path
	if h != nil {
		path = c.handlePath(h)
		if errno := c.samePath(door, h); errno != 0 {
			return proto.XattrReply{}, errno
		}
	}
	if errno := pathErrno(path); errno != 0 {
		return proto.XattrReply{}, errno
	}
	sized := func(data []byte) (proto.XattrReply, syscall.Errno) {
		if r.Size == 0 {
			return proto.XattrReply{Size: uint32(len(data))}, 0
		}
		if int(r.Size) < len(data) {
			return proto.XattrReply{}, syscall.ERANGE
		}
		return proto.XattrReply{Size: uint32(len(data)), Data: data}, 0
	}
	if cacheXattr(r.Name) {
		return c.policyXattr(door, op, r, path, sized)
	}
	if r.Name == UserLayoutXattr || hiddenXattr(r.Name) {
		if op != proto.OpGetxattr {
			return proto.XattrReply{}, syscall.EPERM // the layout is the instance's
		}
		if hiddenXattr(r.Name) {
			return proto.XattrReply{}, syscall.ENODATA
		}
		st, errno := c.lstat(door, path)
		if errno != 0 {
			return proto.XattrReply{}, errno
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFREG:
			return sized([]byte(c.t.fileLayout(keyOfStat(&st)).Text()))
		case syscall.S_IFDIR:
			return sized([]byte(c.t.Layout.Text()))
		}
		return proto.XattrReply{}, syscall.ENODATA
	}
	switch op {
	case proto.OpGetxattr:
		v, err := door.Getxattr(path, r.Name)
		if errno := doorErrno(err); errno != 0 {
			if errno == syscall.EOPNOTSUPP {
				errno = syscall.ENODATA // not user.*: none the burst buffer shows
			}
			return proto.XattrReply{}, errno
		}
		return sized(v)
	case proto.OpListxattr:
		names, err := door.Listxattr(path)
		if err != nil {
			return proto.XattrReply{}, doorErrno(err)
		}
		var list []byte
		for _, n := range names {
			if !hiddenXattr(n) {
				list = append(append(list, n...), 0)
			}
		}
		return sized(list)
	case proto.OpSetxattr:
		return proto.XattrReply{}, doorErrno(door.Setxattr(path, r.Name, r.Value, int(r.Flags)))
	case proto.OpRemovexattr:
		return proto.XattrReply{}, doorErrno(door.Removexattr(path, r.Name))
	}
	return proto.XattrReply{}, syscall.ENOSYS
}

// openWhole opens, for a load-balanced cache, the regular file f (opened through door at path)
// in the data engine, whole: the reply names no layout, so the mount reads it through this
// session (read).
func (c *cacheNS) openWhole(door *pfsio.Door, path string, f *pfsio.File, key CacheFileKey, a proto.Attr) (*cacheHandle, *proto.OpenReply, syscall.Errno) {
	ref := CacheFileRef{Path: path, Key: key, Layout: c.t.fileLayout(key)}
	data, err := c.t.Data.OpenFile(door, ref, false)
	if err != nil {
		f.Close()
		return nil, nil, doorErrno(err)
	}
	h := &cacheHandle{path: path, key: key, door: door, file: f, flags: unix.O_RDONLY, data: data, ref: ref, size: uint64(f.Stat.Size)}
	return h, &proto.OpenReply{Attr: a}, 0
}

// wholeFile is the handle id's load-balanced cache file (EBADF: none, or not a file's).
func wholeFile(s *session, id uint64) (*handle, syscall.Errno) {
	hd := s.get(id)
	if hd == nil {
		return nil, syscall.EBADF
	}
	if hd.cache == nil || hd.cache.data == nil {
		s.put(hd)
		return nil, syscall.EBADF
	}
	return hd, 0
}

// read serves READ of a load-balanced cache's file from the data engine, up to the file's
// size at open (the engine reads zeros past what the file holds).
func (c *cacheNS) read(s *session, r *proto.ReadReq, dest []byte) (proto.Message, int, syscall.Errno) {
	if r.Offset > 1<<62 {
		return nil, 0, syscall.EINVAL
	}
	hd, errno := wholeFile(s, r.Handle)
	if errno != 0 {
		return nil, 0, errno
	}
	defer s.put(hd)
	h := hd.cache
	if r.Offset >= h.size {
		return nil, 0, 0
	}
	want := min(uint64(r.Size), uint64(len(dest)), h.size-r.Offset)
	n, err := h.data.ReadAt(dest[:want], r.Offset)
	if errors.Is(err, io.EOF) {
		err = nil
	}
	if errno := doorErrno(err); errno != 0 {
		return nil, 0, errno
	}
	c.v.acct.read(n, r.Offset+uint64(n))
	return nil, n, 0
}

// lseek serves SEEK_DATA and SEEK_HOLE of a load-balanced cache's file: data up to its size
// at open, no holes before it.
func (c *cacheNS) lseek(s *session, r *proto.LseekReq) (proto.Message, int, syscall.Errno) {
	hd, errno := wholeFile(s, r.Handle)
	if errno != 0 {
		return nil, 0, errno
	}
	defer s.put(hd)
	size := hd.cache.size
	switch r.Whence {
	case unix.SEEK_DATA, unix.SEEK_HOLE:
		if r.Offset >= size {
			return nil, 0, syscall.ENXIO
		}
		if r.Whence == unix.SEEK_DATA {
			return &proto.CountReply{N: r.Offset}, 0, 0
		}
		return &proto.CountReply{N: size}, 0, 0
	}
	return nil, 0, syscall.EINVAL
}
