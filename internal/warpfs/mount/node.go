package mount

// The FUSE layer of a mount: every operation the kernel asks for becomes a warpfs request to
// the server of the namespace, which confines it to the namespace (never following a link a
// user could swap), charges the instance's capacity and creates files as the caller. The
// server is another host's storage agent, reached over the network (package warpfs/client),
// or, when the namespace lives on this host, the same server code called in this process
// (server.Local, see transport.go): one implementation of the file system's semantics and its
// safety, two ways to reach it. The mount lifecycle (mount.go) only sees the root node.
//
// Nodes are named by their path in the namespace; open files are the server's handles.
// The kernel caches names and attributes for as long as the server leases them, and drops
// them when the server says another node changed them (leases.go); without leases (an older
// server, warpfs.lease = 0) nothing is cached beyond the mount's timeouts (zero by default).
// Either way every node sees every change at its next call.

import (
	"context"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"golang.org/x/sys/unix"
)

// backend is what every node of one mount shares.
type backend struct {
	client    transport
	readOnly  bool
	keepCache bool
	blockSize uint32
	timeout   time.Duration // one operation, retries after a reconnection included
	root      *node
	// local is the in-process server of a namespace on this host, or nil for a remote one.
	local *server.Local
	// passthrough hands opens to the kernel (FUSE passthrough): local namespaces of
	// read-only mounts, and of writable ones whose capacity the file system enforces
	// (kernelWrites: opens for writing too; mount.go, kernelWritesAllowed).
	passthrough  bool
	kernelWrites bool

	reads  atomic.Int64 // READ requests served (passthrough reads never reach the server)
	writes atomic.Int64 // WRITE requests served (passthrough writes never reach the server)
	kept   atomic.Int64 // opens that kept the pages the kernel held (keptdata.go)
	// directMmap says the kernel maps files opened with FOPEN_DIRECT_IO (Linux 6.6 and
	// later): then files opened O_DIRECT get it (openFlags).
	directMmap atomic.Bool

	// stripes are the servers of a striped instance's file data (striped.go), in layout
	// order; nil when files hold their own data on the namespace's server.
	stripes     []transport
	stripeNodes []string // the stripe servers' node names
	maxFileSize uint64   // DataWarp's MFS, which a striped mount's client enforces on writes
	writeBehind int64    // Limits.WriteBehind; 0: off

	// leases is the mount's side of coherent caching (leases.go); nil when the namespace's
	// server grants none.
	leases *leaseState

	// unlinkSlots bounds the removals on their way (unlinkbehind.go: Limits.UnlinksBehind);
	// nil: every unlink waits for the storage node. unlinking counts those on their way for
	// the unmount, unlinksFailed those the storage node refused after the caller had its
	// answer.
	unlinkSlots   chan struct{}
	unlinking     sync.WaitGroup
	unlinksBehind atomic.Int64 // sent behind, all told
	unlinksFailed atomic.Int64

	// createSlots bounds the creates on their way (createbehind.go: Limits.CreatesBehind);
	// nil: every create waits for the storage node. stubs are the files the storage node
	// made ahead for them; creating counts the creates and reservations on their way for
	// the unmount, createsFailed the creates the storage node refused after the caller had
	// its answer.
	createSlots   chan struct{}
	stubs         stubPool
	creating      sync.WaitGroup
	createsBehind atomic.Int64 // sent behind, all told
	placedWhole   atomic.Int64 // of those, placed with their data (placement.held)
	createsFailed atomic.Int64
	// noPlacedWriters: a storage node refused a PLACE opening the file for its writer (an
	// older version); creates behind are placed without that from then on.
	noPlacedWriters atomic.Bool
	// placeDelay is how long a create behind's PLACE waits for the file's first write
	// (Limits.CreateWriteWait; placement).
	placeDelay time.Duration
	// wholeMax is the most a create behind's creator may write before its PLACE leaves,
	// for the PLACE to carry the whole file (Limits.CreateWholeMax; placement.held); 0:
	// none. wholeOn is 1 + the metadata server's index among the stripe servers, which
	// keeps such a file's data (0: it holds no stripes, nothing goes whole).
	// noWholePlaces: a storage node refused such a PLACE (an older version).
	wholeMax      int
	wholeOn       uint32
	noWholePlaces atomic.Bool
	// lease is how long the storage node leases what it gives (0: it leases nothing).
	lease time.Duration
	log   *log.Logger
}

// logf logs a message of the mount's, where it has a log.
func (be *backend) logf(format string, args ...any) {
	if be.log != nil {
		be.log.Printf(format, args...)
	}
}

// node is one file or directory of a namespace.
type node struct {
	fs.Inode
	be *backend

	mu      sync.Mutex
	handles map[*fileHandle]struct{} // open through this mount
	// removeOnRelease is the layout of a striped file whose last name went while this node
	// had it open: its objects go with the last handle.
	removeOnRelease *removal
	// behind is the write-behind its striped writer handles share (writebehind.go,
	// shareBehind); nil when none is open.
	behind *writeBehind

	forgotten bool // the kernel forgot it (guarded by leaseState.mu)

	// A directory this mount made knows every name in it until listingUntil (leases.go,
	// proto.FlagListing): names are those that exist, absent those it answered absent
	// itself (guarded by mu).
	listingUntil time.Time
	names        map[string]struct{}
	absent       map[string]struct{}
	// recalled are the absences a recalled listing had answered alone, taken with the
	// listing's end (settleRecalled) and dropped from the kernel with the notification
	// (dropListing): a name made meanwhile is not among them.
	recalled map[string]struct{}
	// unlinks are this mount's removals of names in the directory on their way
	// (unlinkbehind.go; guarded by mu).
	unlinks pendingUnlinks
	// madeHere says this mount created the file, empty and with one link, and has neither
	// written, resized, linked nor moved it since: its removal may go behind
	// (unlinkbehind.go). Atomic: every write clears it, without the node's lock.
	madeHere atomic.Bool
	// placing is this file's create behind while it is on its way, or one that failed
	// (createbehind.go); nil once it landed, and for every other node.
	placing atomic.Pointer[placement]
	// creates counts this mount's creates in the directory while it held the listing
	// (guarded by mu): the second asks for files made ahead (createbehind.go).
	creates int
}

var (
	_ fs.NodeStatfser        = (*node)(nil)
	_ fs.NodeLookuper        = (*node)(nil)
	_ fs.NodeGetattrer       = (*node)(nil)
	_ fs.NodeSetattrer       = (*node)(nil)
	_ fs.NodeOpener          = (*node)(nil)
	_ fs.NodeCreater         = (*node)(nil)
	_ fs.NodeTmpfiler        = (*node)(nil)
	_ fs.NodeMkdirer         = (*node)(nil)
	_ fs.NodeMknoder         = (*node)(nil)
	_ fs.NodeSymlinker       = (*node)(nil)
	_ fs.NodeLinker          = (*node)(nil)
	_ fs.NodeUnlinker        = (*node)(nil)
	_ fs.NodeRmdirer         = (*node)(nil)
	_ fs.NodeRenamer         = (*node)(nil)
	_ fs.NodeReadlinker      = (*node)(nil)
	_ fs.NodeReaddirer       = (*node)(nil)
	_ fs.NodeGetxattrer      = (*node)(nil)
	_ fs.NodeListxattrer     = (*node)(nil)
	_ fs.NodeSetxattrer      = (*node)(nil)
	_ fs.NodeRemovexattrer   = (*node)(nil)
	_ fs.NodeCopyFileRanger  = (*node)(nil)
	_ fs.NodeIoctler         = (*node)(nil)
	_ fs.FileReader          = (*fileHandle)(nil)
	_ fs.FileWriter          = (*fileHandle)(nil)
	_ fs.FileReleaser        = (*fileHandle)(nil)
	_ fs.FileFlusher         = (*fileHandle)(nil)
	_ fs.FileFsyncer         = (*fileHandle)(nil)
	_ fs.FileAllocater       = (*fileHandle)(nil)
	_ fs.FileLseeker         = (*fileHandle)(nil)
	_ fs.FileGetattrer       = (*fileHandle)(nil)
	_ fs.FilePassthroughFder = (*fileHandle)(nil)
)

func newRoot(be *backend) *node {
	root := &node{be: be}
	be.root = root
	return root
}

// opCtx bounds one operation in time: a reconnection and a reopen share the budget. A signal
// to the caller ends it only when the caller is being killed (interrupt.go).
func (be *backend) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, unwatch := killableCtx(ctx)
	ctx, cancel := context.WithTimeout(ctx, be.timeout)
	return ctx, func() { cancel(); unwatch() }
}

// caller is the uid and gid of the process making the request.
func caller(ctx context.Context) (uint32, uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}

// call forwards one request.
func (be *backend) call(ctx context.Context, op proto.Op, req, reply proto.Message) syscall.Errno {
	return be.callRoute(ctx, client.Route{}, op, req, reply)
}

// callRoute forwards one request that names entries by path (route: where they live in a
// sharded namespace, mds.go).
func (be *backend) callRoute(ctx context.Context, route client.Route, op proto.Op, req, reply proto.Message) syscall.Errno {
	_, errno := be.callLease(ctx, route, op, req, reply)
	return errno
}

// callLease is callRoute that also says how long the kernel may cache what the reply gives
// (0: not at all; leases.go).
func (be *backend) callLease(ctx context.Context, route client.Route, op proto.Op, req, reply proto.Message) (time.Duration, syscall.Errno) {
	lease, _, errno := be.callListing(ctx, route, op, req, reply, 0)
	return lease, errno
}

// callListing is callLease that also says whether the mount knows every name of the
// directory the request made (proto.FlagListing).
func (be *backend) callListing(ctx context.Context, route client.Route, op proto.Op, req, reply proto.Message, minVersion uint16) (time.Duration, bool, syscall.Errno) {
	ctx, cancel := be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	call := &client.Call{Op: op, UID: uid, GID: gid, Req: req, Reply: reply, Route: route, MinVersion: minVersion}
	errno := be.client.Do(ctx, call)
	if be.leases == nil {
		return 0, false, errno
	}
	return call.Lease, call.Listing, errno
}

// dirID is the id of directory n in a sharded namespace (mds.go): the inode number the mount
// reported for it.
func (n *node) dirID() uint64 { return n.StableAttr().Ino }

// route says where the node lives in a sharded namespace: its parent directory's id (0 when
// unknown, as for a file without a name).
func (n *node) route() client.Route {
	r := client.Route{Dir: n.StableAttr().Mode&syscall.S_IFMT == syscall.S_IFDIR}
	if _, p := n.Parent(); p != nil {
		r.Parent = p.StableAttr().Ino
	}
	return r
}

// in is the route of an entry of directory n.
func (n *node) in() client.Route { return client.Route{Parent: n.dirID()} }

// path is the node's path in the namespace ("" for the root). A node no longer in the tree
// gets a path that names nothing.
func (n *node) path() string { return n.Path(n.be.root.EmbeddedInode()) }

// nameErrno refuses, with the kernel's ENAMETOOLONG, a name that no file system takes and the
// protocol does not carry (longer than NAME_MAX), and an entry whose path in the namespace
// would be longer than the protocol's limit. The kernel lets FUSE names up to 1024 bytes
// through; the request would otherwise fail to encode (EINVAL).
func (n *node) nameErrno(name string) syscall.Errno {
	if len(name) > proto.MaxName || len(n.path())+1+len(name) > proto.MaxPath {
		return syscall.ENAMETOOLONG
	}
	return 0
}

func (n *node) childPath(name string) string {
	if p := n.path(); p != "" {
		return p + "/" + name
	}
	return name
}

// fill converts the server's attributes for the kernel.
func (be *backend) fill(out *fuse.Attr, a *proto.Attr) {
	*out = fuse.Attr{
		Ino: a.Ino, Size: a.Size, Blocks: a.Blocks,
		Atime: uint64(a.Atime.Sec), Mtime: uint64(a.Mtime.Sec), Ctime: uint64(a.Ctime.Sec),
		Atimensec: a.Atime.Nsec, Mtimensec: a.Mtime.Nsec, Ctimensec: a.Ctime.Nsec,
		Mode: a.Mode, Nlink: a.Nlink, Owner: fuse.Owner{Uid: a.UID, Gid: a.GID}, Rdev: a.Rdev,
		Blksize: a.Blksize,
	}
	if a.Mode&syscall.S_IFMT == syscall.S_IFREG && be.blockSize > 0 {
		out.Blksize = be.blockSize
	}
}

// child makes the inode of an entry the server described; the kernel may cache it for lease.
func (n *node) child(ctx context.Context, a *proto.Attr, out *fuse.EntryOut, lease time.Duration) *fs.Inode {
	n.be.fill(&out.Attr, a)
	c := &node{be: n.be}
	in := n.NewInode(ctx, c, fs.StableAttr{Mode: a.Mode & syscall.S_IFMT, Ino: a.Ino, Gen: 1})
	n.be.noteNode(c, a.Ino, lease > 0)
	n.be.entryLease(out, lease)
	return in
}

// anyHandle returns a handle open on the node, or nil. Operations on a node prefer it to the
// path: it is the very file even after the name was removed or replaced.
func (n *node) anyHandle() *fileHandle {
	n.mu.Lock()
	defer n.mu.Unlock()
	for h := range n.handles {
		h.mu.Lock()
		lazy := h.lazy
		h.mu.Unlock()
		if !lazy { // one not opened on the server would open it: the path does as well
			return h
		}
	}
	return nil
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.nameErrno(name); errno != 0 {
		return nil, errno
	}
	if n.answerAbsent(name) {
		return nil, syscall.ENOENT // kept for the negative timeout: the lease
	}
	n.settleUnlinks()
	var rep proto.AttrReply
	epoch := n.be.leases.sizeEpoch()
	lease, errno := n.be.callLease(ctx, n.in(), proto.OpLookup, &proto.PathReq{Path: n.childPath(name)}, &rep)
	if errno == syscall.ENOENT && n.be.leases != nil && lease == 0 {
		// Not leased: the kernel must not keep the absence either (the mount's negative
		// timeout is the lease's, for leased absences).
		out.SetEntryTimeout(time.Nanosecond)
	}
	if errno != 0 {
		return nil, errno
	}
	n.be.leases.leaseData(&rep.Attr, lease, epoch)
	return n.child(ctx, &rep.Attr, out, lease), 0
}

// byNode runs a request that names a node by handle or by path.
func (n *node) byNode(ctx context.Context, f fs.FileHandle, op proto.Op, build func(path string, handle uint64) proto.Message, reply proto.Message) syscall.Errno {
	_, errno := n.byNodeLease(ctx, f, op, build, reply)
	return errno
}

// byNodeLease is byNode that also says how long the kernel may cache the attributes the
// reply gives (leases.go).
func (n *node) byNodeLease(ctx context.Context, f fs.FileHandle, op proto.Op, build func(path string, handle uint64) proto.Message, reply proto.Message) (time.Duration, syscall.Errno) {
	if errno := n.placed(); errno != 0 {
		return 0, errno
	}
	h, _ := f.(*fileHandle)
	if h == nil {
		h = n.anyHandle()
	}
	if h == nil {
		return n.be.callLease(ctx, n.route(), op, build(n.path(), 0), reply)
	}
	ctx, cancel := n.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	call := &client.Call{Op: op, UID: uid, GID: gid, Reply: reply}
	errno := h.do(ctx, call, func(id uint64) { call.Req = build("", id) })
	if errno == syscall.EBADF && f == nil {
		// The handle borrowed from the node was released meanwhile (the kernel's RELEASE of a
		// file just closed races with the next call on its name): by path, as with none.
		return n.be.callLease(ctx, n.route(), op, build(n.path(), 0), reply)
	}
	if n.be.leases == nil {
		return 0, errno
	}
	return call.Lease, errno
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.settleAll() // this node's writes behind first: their size and times
	// What this node's handles wrote, before the server's (or the cached) attributes are
	// taken and after: a handle released meanwhile reported its size at close, but perhaps
	// after the server answered, and it is gone from writtenExtent after.
	written := n.writtenExtent()
	if a, lease, ok := n.be.leases.cachedAttr(n.StableAttr().Ino); ok {
		// A directory this mount just created or removed a name in, a striped file it just
		// reported the size of: the reply leased its attributes (leases.go, attrs).
		a.Size = max(a.Size, written, n.writtenExtent())
		n.be.fill(&out.Attr, &a)
		n.be.attrLease(out, lease)
		return 0
	}
	var rep proto.AttrReply
	epoch := n.be.leases.sizeEpoch()
	lease, errno := n.byNodeLease(ctx, f, proto.OpGetattr, func(p string, h uint64) proto.Message {
		return &proto.NodeReq{Path: p, Handle: h}
	}, &rep)
	if errno == 0 {
		n.be.leases.leaseData(&rep.Attr, lease, epoch)
		if n == n.be.root {
			n.be.noteRoot(rep.Attr.Ino) // before the kernel may cache them (lease)
		}
		rep.Attr.Size = max(rep.Attr.Size, written, n.writtenExtent())
		n.be.fill(&out.Attr, &rep.Attr)
		n.be.attrLease(out, lease)
	}
	return errno
}

// writtenExtent is how far this node's open handles of a striped file have written: the
// metadata server hears of it at close, and this node sees its own writes at once.
func (n *node) writtenExtent() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	extent := n.heldExtent() // a create behind's writes held for its PLACE
	for h := range n.handles {
		if sf := h.striped; sf != nil {
			sf.mu.Lock()
			extent = max(extent, sf.extent)
			sf.mu.Unlock()
		}
	}
	return extent
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	const passed = proto.SetMode | proto.SetUID | proto.SetGID | proto.SetSize | proto.SetAtime | proto.SetMtime |
		proto.SetAtimeNow | proto.SetMtimeNow | proto.SetKillSUIDGID
	req := proto.SetattrReq{Valid: in.Valid & passed, Mode: in.Mode, UID: in.Uid, GID: in.Gid, Size: in.Size,
		Atime: proto.Timespec{Sec: int64(in.Atime), Nsec: in.Atimensec},
		Mtime: proto.Timespec{Sec: int64(in.Mtime), Nsec: in.Mtimensec}}
	if in.Valid&fuse.FATTR_SIZE != 0 {
		n.notMadeHere()
		n.be.leases.dataWriting(n.StableAttr().Ino)
	}
	tok := n.be.leases.startChange(n.StableAttr().Ino)
	defer n.be.leases.endChange(tok, nil, 0)
	if in.Valid&fuse.FATTR_SIZE != 0 && n.be.stripes != nil {
		return n.truncateStriped(ctx, f, req, out)
	}
	n.settleAll() // a truncate, chmod or utimes comes after this node's writes

	var rep proto.AttrReply
	lease, errno := n.byNodeLease(ctx, f, proto.OpSetattr, func(p string, h uint64) proto.Message {
		r := req
		r.Path, r.Handle = p, h
		return &r
	}, &rep)
	if errno == 0 {
		n.be.fill(&out.Attr, &rep.Attr)
		n.be.attrLease(out, lease)
	}
	return errno
}

// truncateStriped sets the size of a file of a striped mount: the metadata server's logical
// size, then every object's share of it.
func (n *node) truncateStriped(ctx context.Context, f fs.FileHandle, req proto.SetattrReq, out *fuse.AttrOut) syscall.Errno {
	h, _ := f.(*fileHandle)
	if h == nil {
		// truncate(2) by name: open the file to learn its layout (a handle of another
		// descriptor could be in the middle of its release).
		opened, errno := n.open(ctx, syscall.O_WRONLY)
		if errno != 0 {
			return errno
		}
		defer opened.Release(ctx)
		h = opened
	}
	h.releaseAtLastClose()
	if errno := h.materialize(ctx); errno != 0 { // a writer is registered before its objects change
		return errno
	}
	var rep proto.AttrReply
	setattr := func() syscall.Errno {
		return h.handleCall(ctx, proto.OpSetattr, func(id uint64) proto.Message {
			r := req
			r.Handle = id
			return &r
		}, &rep)
	}
	if h.striped == nil {
		if errno := setattr(); errno != 0 {
			return errno
		}
		n.be.fill(&out.Attr, &rep.Attr)
		return 0
	}
	if mfs := n.be.maxFileSize; mfs > 0 && req.Size > mfs {
		return syscall.EFBIG
	}
	n.settleAll()
	// The objects first: a size their servers cannot hold fails with ENOSPC before the file
	// changes; if anything fails, the objects go back to what they were.
	before := h.size(ctx, 0)
	errno := h.truncateObjects(ctx, req.Size)
	if errno == 0 {
		errno = setattr()
	}
	if errno != 0 {
		h.truncateObjects(ctx, before)
		return errno
	}
	n.truncated(req.Size)
	n.be.fill(&out.Attr, &rep.Attr)
	return 0
}

// truncated tells this node's handles of a striped file that it is now size bytes long.
func (n *node) truncated(size uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for h := range n.handles {
		if sf := h.striped; sf != nil {
			sf.mu.Lock()
			sf.known, sf.extent, sf.durable = size, min(sf.extent, size), min(sf.durable, size)
			sf.mu.Unlock()
		}
	}
}

// openFlags tells the kernel how to cache a file opened with flags. Without client caching,
// a file opened only for writing bypasses the page cache (FOPEN_DIRECT_IO): its data goes
// from the writer's buffer straight into the request, saving a copy and the page cache's
// memory per byte written, and nothing stale can stay behind; such a file cannot be read or
// mapped through that descriptor anyway. A mount whose writes go through the kernel
// (kernelWrites: passthrough) leaves them to it.
//
// A file opened O_DIRECT bypasses it too, as it asked. Through the page cache's path the
// kernel would ask the server for the file's attributes before every read (it does so for
// buffered reads, to drop pages another node made stale: FUSE's auto_inval_data), which
// doubles the round trips of direct reads and sends them all to one server (a striped
// file's metadata server); direct I/O reads nothing from the cache, so it needs no check.
// The mount allows shared mappings of such files (CAP_DIRECT_IO_ALLOW_MMAP): the kernel
// writes a mapping's pages back before direct I/O of their range and drops them after a
// direct write, as for O_DIRECT on a local file system. Read-only mounts that pass reads
// to the kernel (passthrough) keep doing so; on kernels that cannot map such files
// (before 6.6) O_DIRECT files keep the page cache's path.
//
// A file opened for reading keeps the pages the kernel cached at earlier opens while nobody
// can have changed it since (keptdata.go); with client_cache on a mount whose server grants
// no leases, every open keeps them (until the file's times or size change).
//
// h is the open's handle (nil for a create's).
func (n *node) openFlags(flags uint32, h *fileHandle) uint32 {
	if n.be.keepCache && n.be.leases == nil {
		return fuse.FOPEN_KEEP_CACHE
	}
	keep := n.keepCacheFlag(flags, h) // and notes a writer's open
	if (flags&syscall.O_ACCMODE == syscall.O_WRONLY && !n.be.kernelWrites && !n.be.keepCache) ||
		(flags&syscall.O_DIRECT != 0 && !n.be.passthrough && n.be.directMmap.Load()) {
		return fuse.FOPEN_DIRECT_IO
	}
	return keep
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.be.readOnly && (flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0) {
		return nil, 0, syscall.EROFS
	}
	flags &^= fuse.FMODE_EXEC
	h := n.openLazily(ctx, flags)
	if h == nil {
		var errno syscall.Errno
		if h, errno = n.open(ctx, flags); errno != 0 {
			return nil, 0, errno
		}
	}
	return h, n.openFlags(flags, h) | h.noFlush(), 0
}

// noFlush is FOPEN_NOFLUSH for a handle whose close has nothing to do: a striped file's
// reader (not a cache instance's, whose close may flush to the PFS) queues no writes and
// reports no size, so the kernel need not ask at every close (mdtest's read phase: one round
// trip of three).
func (h *fileHandle) noFlush() uint32 {
	if h.striped != nil && h.striped.cache == nil && h.flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		return fuse.FOPEN_NOFLUSH
	}
	return 0
}

// lazyOpenFlags are the open flags that need the metadata server at the open itself.
const lazyOpenFlags = syscall.O_TRUNC | syscall.O_APPEND | syscall.O_DIRECT | syscall.O_SYNC | syscall.O_DSYNC | syscall.O_CREAT

// openLazily opens a striped file without asking its metadata server, when this mount holds
// its attributes, leased, and its layout (leases.go, attrs and layouts): the kernel checked the
// caller's permission against those attributes (default_permissions), nobody else changed
// the file since (the server would have told this mount first), and its data is on the
// stripe servers, which a handle reaches without the metadata server's. The first request
// that needs the metadata server's handle opens it there (materialize): a write, truncate,
// fallocate or fsync, a read past the leased size once the lease ran out, or this node's
// unlink of the file (its handle keeps the file's stub, as an open one does). Returns nil
// where it cannot.
//
// What a lazy handle changes, said in docs/mounts.md: where another node renames or removes
// the file while it is open here, the first request that needs the metadata server fails with
// ESTALE (the name no longer leads to the file), where an open handle would have gone on.
func (n *node) openLazily(ctx context.Context, flags uint32) *fileHandle {
	be := n.be
	if be.leases == nil || be.stripes == nil || be.local != nil || flags&lazyOpenFlags != 0 ||
		n.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil
	}
	ls := be.leases
	epoch := ls.sizeEpoch()
	a, lease, layout, ok := ls.openable(n.StableAttr().Ino)
	if uid, _ := caller(ctx); !ok || uid != a.UID {
		// The owner only: the kernel checked the mode bits alone (default_permissions without
		// POSIX ACLs), which are exact for the owner, where an ACL on the server may refuse
		// another user that the mode bits let in. Others open on the server, as before.
		return nil
	}
	l, err := stripe.Decode(layout)
	if err != nil || int(l.Servers) != len(be.stripes) {
		return nil
	}
	h := n.addHandle(0, 0, flags)
	h.lazy = true
	h.uid, h.gid = caller(ctx)
	h.striped = &stripedFile{layout: l, objects: make([]object, l.Servers), known: a.Size}
	h.striped.uid, h.striped.gid = h.uid, h.gid
	if be.writesBehind(flags, true) {
		h.behind = n.shareBehind(h, int(l.Servers))
	}
	ls.leaseSize(h.striped, a.Ino, epoch, lease)
	return h
}

// open opens the node's file on the server and registers the handle.
func (n *node) open(ctx context.Context, flags uint32) (*fileHandle, syscall.Errno) {
	if errno := n.placed(); errno != 0 {
		return nil, errno
	}
	ctx, cancel := n.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	var rep proto.OpenReply
	call := &client.Call{Op: proto.OpOpen, UID: uid, GID: gid, Req: &proto.OpenReq{Path: n.path(), Flags: flags}, Reply: &rep, Route: n.route()}
	ls := n.be.leases
	var epoch uint64
	if ls != nil {
		epoch = ls.sizeEpoch()
	}
	if flags&syscall.O_TRUNC != 0 {
		tok := ls.startChange(n.StableAttr().Ino)
		defer ls.endChange(tok, nil, 0)
	}
	if errno := n.be.client.Do(ctx, call); errno != 0 {
		return nil, errno
	}
	h, errno := n.opened(ctx, &rep, call.UsedGen, flags)
	if errno == 0 && ls != nil && h.striped != nil && rep.Cache == nil {
		ls.noteLayout(rep.Attr.Ino, rep.Layout) // a cache file's open fetches from the PFS: never lazy
	}
	if errno == 0 && flags&syscall.O_TRUNC == 0 {
		ls.leaseData(&rep.Attr, call.Lease, epoch)
	}
	if errno == 0 && ls != nil && call.Lease > 0 && h.striped != nil {
		// A striped file: the server leased its size (attributes), so a read past it needs
		// no GETATTR until someone else changes it.
		ls.leaseSize(h.striped, rep.Attr.Ino, epoch, call.Lease)
	}
	return h, errno
}

// opened registers the handle the server opened; a striped file's objects are emptied when
// the open truncated it.
func (n *node) opened(ctx context.Context, rep *proto.OpenReply, gen uint64, flags uint32) (*fileHandle, syscall.Errno) {
	h := n.addHandle(rep.Handle, gen, flags)
	uid, gid := caller(ctx)
	if errno := h.fillOpened(rep, gen, uid, gid); errno != 0 {
		h.Release(ctx)
		return nil, errno
	}
	if rep.Truncated {
		errno := h.truncateObjects(ctx, 0)
		if errno == 0 && rep.Cache != nil {
			// A cache instance's PFS file is emptied after its objects (proto.OpenReply).
			errno = h.handleCall(ctx, proto.OpSetattr, func(id uint64) proto.Message {
				return &proto.SetattrReq{Handle: id, Valid: proto.SetSize}
			}, &proto.AttrReply{})
		}
		if errno != 0 {
			h.Release(ctx)
			return nil, errno
		}
		n.truncated(0)
	}
	return h, 0
}

// fillOpened gives h what the server opened (rep, on connection generation gen) for
// uid:gid: its handle, and a striped file's layout and write-behind. Under the node's lock,
// as the node's readers of its handles take it: a handle created behind (createbehind.go)
// is filled once its PLACE is answered, the kernel's requests on the node meanwhile.
func (h *fileHandle) fillOpened(rep *proto.OpenReply, gen uint64, uid, gid uint32) syscall.Errno {
	n := h.node
	var sf *stripedFile
	var wb *writeBehind
	if len(rep.Layout) == 0 {
		if n.be.stripes == nil && n.be.local == nil && n.be.writesBehind(h.flags, false) {
			wb = newWriteBehind(n.be.writeBehind, 1)
		}
	} else {
		l, err := stripe.Decode(rep.Layout)
		if err != nil || int(l.Servers) != len(n.be.stripes) {
			return syscall.EIO // a layout for another instance's servers: never served
		}
		sf = &stripedFile{layout: l, objects: make([]object, l.Servers), known: l.Length, cache: rep.Cache}
		sf.uid, sf.gid = uid, gid
		if n.be.writesBehind(h.flags, true) {
			if rep.Cache == nil {
				wb = n.shareBehind(h, int(l.Servers))
			} else { // a cache file's objects are opened with its opener's policy: its own
				wb = newWriteBehind(n.be.writeBehind, int(l.Servers))
			}
		}
	}
	h.mu.Lock()
	h.id, h.gen = rep.Handle, gen
	h.mu.Unlock()
	n.mu.Lock()
	h.striped, h.behind = sf, wb
	n.mu.Unlock()
	return 0
}

func (n *node) addHandle(id, gen uint64, flags uint32) *fileHandle {
	h := &fileHandle{node: n, id: id, gen: gen, flags: flags}
	if n.be.kernelWrites && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		// The kernel writes the file itself from now on: the server charges what it wrote
		// when it next handles the file's size, and at release. Every writing handle, not
		// only the one whose descriptor go-fuse registers: later opens share that one.
		n.be.local.KernelWrites(id)
	}
	n.mu.Lock()
	if n.handles == nil {
		n.handles = map[*fileHandle]struct{}{}
	}
	n.handles[h] = struct{}{}
	n.mu.Unlock()
	return h
}

// created finishes a CREATE or TMPFILE: the child inode and its handle.
func (n *node) created(ctx context.Context, op proto.Op, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.be.readOnly {
		return nil, nil, 0, syscall.EROFS
	}
	flags &^= fuse.FMODE_EXEC
	if op == proto.OpCreate {
		if ch, h, fl, ok := n.createBehind(ctx, name, flags, mode, out); ok {
			return ch, h, fl, 0
		}
	}
	n.settleUnlinks()
	ctx, cancel := n.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	var rep proto.OpenReply
	call := &client.Call{Op: op, UID: uid, GID: gid, Reply: &rep, Route: n.in(),
		Req: &proto.CreateReq{Dir: n.path(), Name: name, Flags: flags, Mode: mode}}
	ls := n.be.leases
	var epoch uint64
	var tok changeToken
	if ls != nil && op == proto.OpCreate {
		epoch, tok = ls.sizeEpoch(), n.startDirChange()
	}
	errno := n.be.client.Do(ctx, call)
	lease := call.Lease
	if ls == nil || op == proto.OpTmpfile || errno != 0 {
		lease = 0
	}
	if op == proto.OpCreate {
		ls.endChange(tok, rep.Dir, lease)
	}
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if rep.Attr.Mode&syscall.S_IFMT == syscall.S_IFREG {
		ls.createdFile(rep.Attr.Ino, epoch, lease)
		if !rep.Truncated && n.be.stripes != nil && rep.Cache == nil {
			ls.keepCreated(&rep.Attr, rep.Layout, epoch, lease)
		}
	}
	ch := n.child(ctx, &rep.Attr, out, lease)
	if op == proto.OpCreate {
		n.noteName(name, true)
		if call.Listing && lease > 0 {
			n.renewListing(lease)
		}
	}
	child, ok := ch.Operations().(*node)
	if !ok {
		return nil, nil, 0, syscall.EIO
	}
	if op == proto.OpCreate && rep.Attr.Nlink == 1 && rep.Attr.Size == 0 {
		child.madeHere.Store(true)
	}
	h, errno := child.opened(ctx, &rep, call.UsedGen, flags)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if op == proto.OpTmpfile && h.striped != nil {
		l := h.striped.layout
		child.removeOnRelease = &removal{layout: l} // a file with no name: its objects go when it is closed
	}
	return ch, h, n.openFlags(flags, nil), 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if errno := n.nameErrno(name); errno != 0 {
		return nil, nil, 0, errno
	}
	return n.created(ctx, proto.OpCreate, name, flags, mode, out)
}

// Tmpfile creates a file with no name (O_TMPFILE): its space is released when it is closed.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return n.created(ctx, proto.OpTmpfile, "", flags, mode, out)
}

// made finishes MKDIR, MKNOD, SYMLINK and LINK.
func (n *node) made(ctx context.Context, op proto.Op, req proto.Message, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.madeRoute(ctx, n.in(), op, req, out)
}

func (n *node) madeRoute(ctx context.Context, route client.Route, op proto.Op, req proto.Message, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.be.readOnly {
		return nil, syscall.EROFS
	}
	n.settleUnlinks()
	var rep proto.AttrReply
	tok := n.startDirChange()
	lease, listing, errno := n.be.callListing(ctx, route, op, req, &rep, 0)
	if errno != 0 {
		lease = 0
	}
	n.be.leases.endChange(tok, rep.Dir, lease)
	if errno != 0 {
		return nil, errno
	}
	ch := n.child(ctx, &rep.Attr, out, lease)
	if c, ok := ch.Operations().(*node); ok && listing {
		c.setListing(lease) // a directory it just made: it knows every name in it (none)
	}
	n.noteName(madeName(req), true)
	return ch, 0
}

// madeName is the name a MKDIR, MKNOD, SYMLINK or LINK makes.
func madeName(req proto.Message) string {
	switch r := req.(type) {
	case *proto.MkdirReq:
		return r.Name
	case *proto.SymlinkReq:
		return r.Name
	case *proto.LinkReq:
		return r.Name
	}
	return ""
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.nameErrno(name); errno != 0 {
		return nil, errno
	}
	return n.made(ctx, proto.OpMkdir, &proto.MkdirReq{Dir: n.path(), Name: name, Mode: mode}, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.nameErrno(name); errno != 0 {
		return nil, errno
	}
	return n.made(ctx, proto.OpMknod, &proto.MkdirReq{Dir: n.path(), Name: name, Mode: mode, Rdev: rdev}, out)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.nameErrno(name); errno != 0 {
		return nil, errno
	}
	return n.made(ctx, proto.OpSymlink, &proto.SymlinkReq{Dir: n.path(), Name: name, Target: target}, out)
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := n.nameErrno(name); errno != 0 {
		return nil, errno
	}
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	// A file with no name (O_TMPFILE) cannot be linked by path.
	if _, parent := t.Parent(); parent == nil {
		return nil, syscall.EXDEV
	}
	if errno := t.placed(); errno != 0 {
		return nil, errno
	}
	route := n.in()
	route.NewParent = t.route().Parent
	t.notMadeHere()
	tok := n.be.leases.startChange(t.StableAttr().Ino) // its link count
	defer n.be.leases.endChange(tok, nil, 0)
	return n.madeRoute(ctx, route, proto.OpLink, &proto.LinkReq{Path: t.path(), Dir: n.path(), Name: name}, out)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if errno := n.nameErrno(name); errno != 0 {
		return errno
	}
	if n.be.readOnly {
		return syscall.EROFS
	}
	if n.unlinkBehind(ctx, name) {
		return 0
	}
	n.settleUnlinks()
	var rep proto.RemovedReply
	n.materializeChild(ctx, name)
	defer n.childChanging(name)()
	tok := n.startDirChange()
	req := &proto.EntryReq{Dir: n.path(), Name: name}
	var minVersion uint16
	if be := n.be; be.wholeOn > 0 && !be.noWholePlaces.Load() && !n.childOpen(name) {
		// The metadata server removes the object it holds itself (a file placed whole has
		// no other): one request. Not for a file open here, whose objects wait for its
		// last close (removed).
		req.Local, minVersion = be.wholeOn, proto.InlinePlaceVersion
	}
	lease, listing, errno := n.be.callListing(ctx, n.in(), proto.OpUnlink, req, &rep, minVersion)
	if errno == syscall.EPROTONOSUPPORT && req.Local > 0 {
		n.be.noWholePlaces.Store(true) // a storage node of a version before: as before
		req.Local = 0
		rep = proto.RemovedReply{}
		lease, listing, errno = n.be.callListing(ctx, n.in(), proto.OpUnlink, req, &rep, 0)
	}
	n.be.leases.endChange(tok, rep.Dir, lease)
	if errno == 0 {
		n.noteName(name, false)
		if listing {
			n.renewListing(lease)
		}
		n.removed(ctx, name, &rep)
	}
	return errno
}

// childOpen says whether this node has the file named name in n open.
func (n *node) childOpen(name string) bool {
	ch := n.GetChild(name)
	if ch == nil {
		return false
	}
	child, ok := ch.Operations().(*node)
	if !ok {
		return false
	}
	child.mu.Lock()
	defer child.mu.Unlock()
	return len(child.handles) > 0
}

// startDirChange starts a change of directory n's entries (leases.go, startChange). The
// root's inode number in the kernel is FUSE's own, not the server's: the attributes a reply
// gives it are taken as its own (its path names nothing else).
func (n *node) startDirChange() changeToken {
	tok := n.be.leases.startChange(n.dirID())
	tok.root = n == n.be.root
	return tok
}

// childChanging brackets a change of the node named name in n (its link count, its ctime),
// if the kernel holds it (leases.go, attrs). The function it returns ends the change.
func (n *node) childChanging(name string) func() {
	ls := n.be.leases
	if ls == nil {
		return func() {}
	}
	ch := n.GetChild(name)
	if ch == nil {
		return func() {}
	}
	tok := ls.startChange(ch.StableAttr().Ino)
	return func() { ls.endChange(tok, nil, 0) }
}

// removed removes the objects of a striped file whose last name (name in n) went, now or,
// if this node has it open, at its last close. Another node that has it open reads holes
// from then on (docs/mounts.md).
//
// The metadata server says which servers may hold them when it knows (rep.ObjectsKnown): only
// those are asked (none for a file that never had data); otherwise every server is.
func (n *node) removed(ctx context.Context, name string, rep *proto.RemovedReply) {
	if len(rep.Layout) == 0 || n.be.stripes == nil {
		return
	}
	var on []byte // nil: every server
	if rep.ObjectsKnown {
		on = append([]byte{}, rep.Objects...)
	}
	l, err := stripe.Decode(rep.Layout)
	if err != nil || int(l.Servers) != len(n.be.stripes) {
		return
	}
	if ch := n.GetChild(name); ch != nil {
		if child, ok := ch.Operations().(*node); ok {
			child.mu.Lock()
			open := len(child.handles) > 0
			if open {
				child.removeOnRelease = &removal{layout: l, cache: rep.Cache}
			}
			child.mu.Unlock()
			if open {
				return
			}
		}
	}
	n.be.removeObjects(ctx, removal{layout: l, cache: rep.Cache}, on)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if errno := n.nameErrno(name); errno != 0 {
		return errno
	}
	if n.be.readOnly {
		return syscall.EROFS
	}
	n.settleUnlinks()
	n.settleChildUnlinks(name) // its names must be gone first
	tok := n.be.leases.startChange(n.dirID())
	errno := n.be.callRoute(ctx, n.in(), proto.OpRmdir, &proto.EntryReq{Dir: n.path(), Name: name}, nil)
	n.be.leases.endChange(tok, nil, 0)
	if errno == 0 {
		n.noteName(name, false)
	}
	return errno
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	dst, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	if errno := n.nameErrno(name); errno != 0 {
		return errno
	}
	if errno := dst.nameErrno(newName); errno != 0 {
		return errno
	}
	var rep proto.RemovedReply
	route := client.Route{Parent: n.dirID(), NewParent: dst.dirID()}
	ls := n.be.leases
	n.settleUnlinks()
	dst.settleUnlinks()
	n.settleChildUnlinks(name) // a directory moved: its removals under its old path first
	dst.settleChildUnlinks(newName)
	if c := n.childNode(name); c != nil {
		c.notMadeHere() // where it goes, its links may be others' too
	}
	n.materializeChild(ctx, name)      // its handles then follow it by the server's handle
	dst.materializeChild(ctx, newName) // the file it replaces: kept while open
	defer n.childChanging(name)()
	defer dst.childChanging(newName)() // the file it replaces
	tok, dstTok := ls.startChange(n.dirID()), ls.startChange(dst.dirID())
	errno := n.be.callRoute(ctx, route, proto.OpRename, &proto.RenameReq{Dir: n.path(), Name: name, NewDir: dst.path(), NewName: newName, Flags: flags}, &rep)
	ls.endChange(tok, nil, 0)
	ls.endChange(dstTok, nil, 0)
	if errno == 0 {
		if flags&unix.RENAME_EXCHANGE == 0 {
			n.noteName(name, false)
		}
		dst.noteName(newName, true)
		dst.removed(ctx, newName, &rep)
	}
	return errno
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	var rep proto.DataReply
	if errno := n.be.callRoute(ctx, n.route(), proto.OpReadlink, &proto.PathReq{Path: n.path()}, &rep); errno != 0 {
		return nil, errno
	}
	return rep.Data, 0
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var rep proto.StatfsReply
	if errno := n.be.call(ctx, proto.OpStatfs, &proto.Empty{}, &rep); errno != 0 {
		return errno
	}
	*out = fuse.StatfsOut{Blocks: rep.Blocks, Bfree: rep.Bfree, Bavail: rep.Bavail, Files: rep.Files,
		Ffree: rep.Ffree, Bsize: rep.Bsize, NameLen: rep.NameLen, Frsize: rep.Frsize}
	if n.be.stripes != nil {
		return n.be.statfsStriped(ctx, out)
	}
	return 0
}

func (n *node) xattr(ctx context.Context, op proto.Op, req proto.XattrReq, reply proto.Message) syscall.Errno {
	return n.byNode(ctx, nil, op, func(p string, h uint64) proto.Message {
		r := req
		r.Path, r.Handle = p, h
		return &r
	}, reply)
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if attr == ServersXattr && n.be.stripes != nil {
		return clientXattr(dest, strings.Join(n.be.stripeNodes, " "))
	}
	if f, ok := n.be.client.(*failover); ok && (attr == ReplicasXattr || attr == ReplicaXattr) {
		nodes, current := f.where()
		if attr == ReplicaXattr {
			return clientXattr(dest, current)
		}
		return clientXattr(dest, strings.Join(nodes, " "))
	}
	if attr == capabilityXattr && n.be.leases.hasNoCaps(n.StableAttr().Ino) {
		return 0, syscall.ENODATA // a file this mount created, unchanged since (leases.go, noCaps)
	}
	var rep proto.XattrReply
	if errno := n.xattr(ctx, proto.OpGetxattr, proto.XattrReq{Name: attr, Size: uint32(len(dest))}, &rep); errno != 0 {
		return 0, errno
	}
	return xattrResult(dest, &rep), 0
}

// xattrChanging notes that this mount sets or removes an extended attribute of n (its
// ctime changes; it may get a security.capability): what the mount kept of its attributes
// goes (leases.go). The function it returns ends the change.
func (n *node) xattrChanging() func() {
	ls := n.be.leases
	if ls == nil {
		return func() {}
	}
	ls.xattrChanging(n.StableAttr().Ino)
	tok := ls.startChange(n.dirID())
	return func() { ls.endChange(tok, nil, 0) }
}

// capabilityXattr is the attribute the kernel asks for at a file's first write, to drop its
// file capabilities.
const capabilityXattr = "security.capability"

// clientXattr answers an attribute the client knows itself (never stored).
func clientXattr(dest []byte, value string) (uint32, syscall.Errno) {
	if len(dest) == 0 {
		return uint32(len(value)), 0
	}
	if len(dest) < len(value) {
		return 0, syscall.ERANGE
	}
	return uint32(copy(dest, value)), 0
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	var rep proto.XattrReply
	if errno := n.xattr(ctx, proto.OpListxattr, proto.XattrReq{Size: uint32(len(dest))}, &rep); errno != 0 {
		return 0, errno
	}
	return xattrResult(dest, &rep), 0
}

// xattrResult is what the kernel is told: the size when it asked for the size only (an
// empty buffer), else the bytes copied.
func xattrResult(dest []byte, rep *proto.XattrReply) uint32 {
	if len(dest) == 0 {
		return rep.Size
	}
	return uint32(copy(dest, rep.Data))
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	if data == nil {
		data = []byte{} // nil stands for a removal in cacheSetxattr
	}
	if errno, handled := n.cacheSetxattr(ctx, attr, data, flags); handled {
		return errno
	}
	defer n.xattrChanging()()
	return n.xattr(ctx, proto.OpSetxattr, proto.XattrReq{Name: attr, Value: data, Flags: flags}, nil)
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	if errno, handled := n.cacheSetxattr(ctx, attr, nil, 0); handled {
		return errno
	}
	defer n.xattrChanging()()
	return n.xattr(ctx, proto.OpRemovexattr, proto.XattrReq{Name: attr}, nil)
}

// CopyFileRange copies on the storage node: no data crosses the network.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode,
	fhOut fs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	hin, ok1 := fhIn.(*fileHandle)
	hout, ok2 := fhOut.(*fileHandle)
	if !ok1 || !ok2 {
		return 0, syscall.ENOTSUP
	}
	if errno := hin.node.placed(); errno != 0 {
		return 0, errno
	}
	if errno := hout.node.placed(); errno != 0 {
		return 0, errno
	}
	if hin.striped != nil || hout.striped != nil {
		return 0, syscall.ENOTSUP // the kernel copies through read and write
	}
	hin.node.settleAll() // the server copies what it holds: this node's writes first
	hout.node.settleAll()
	hout.node.notMadeHere()
	in, inGen := hin.current()
	outID, outGen := hout.current()
	if inGen != outGen {
		return 0, syscall.ENOTSUP // opened on different connections: let the kernel copy
	}
	ctx, cancel := n.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	var rep proto.CountReply
	errno := n.be.client.Do(ctx, &client.Call{Op: proto.OpCopyRange, UID: uid, GID: gid, Gen: inGen, Reply: &rep,
		Req: &proto.CopyRangeReq{In: in, OffIn: offIn, Out: outID, OffOut: offOut, Length: length, Flags: flags}})
	if errno == syscall.ESTALE {
		return 0, syscall.ENOTSUP
	}
	return uint32(rep.N), errno
}

// Ioctl is refused: the server runs as root, and forwarding arbitrary ioctls (chattr +i,
// reflinks…) to the backing file system would let users do what they otherwise cannot.
func (n *node) Ioctl(ctx context.Context, f fs.FileHandle, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	return 0, syscall.ENOTTY
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	n.settleUnlinks()
	d := &dirStream{node: n}
	if errno := d.open(ctx); errno != 0 {
		return nil, errno
	}
	return d, 0
}

// fileHandle is a file open on the server.
type fileHandle struct {
	node  *node
	flags uint32

	mu  sync.Mutex
	id  uint64
	gen uint64 // the connection generation the handle belongs to
	// lazy says the metadata server has not opened the file yet (openLazily): the first
	// request that needs it opens it (materialize) as its opener, uid:gid.
	lazy     bool
	uid, gid uint32

	// closeByReport says the handle is the one the PLACE of the file's create behind opened
	// for its first write (proto.PlaceReq.Writer): its size report at close releases it on
	// the metadata server in the same request (sendReport, proto.SetattrReq.Release), and
	// it is lazy again after. A write holds writing (read) from its look at the handle
	// (materialize) until its pieces are queued; that report holds it (write) until it is
	// answered, so that it names every server the handle's writes made objects on, and a
	// write after it opens the file again.
	writing       sync.RWMutex
	closeByReport bool

	// striped is set for a file of a striped instance, whose data is in stripe objects.
	striped *stripedFile
	// behind carries the handle's writes after write(2) returned (writebehind.go); nil:
	// every write waits for its server.
	behind *writeBehind

	// keepAfter: the kernel dropped the file's pages at this open, under a lease; at the
	// handle's first request (the kernel is done with the open then) what is read from
	// then on is fresh (keptdata.go), unless something ended that meanwhile: keepTok and
	// keepGen, set before the open returned.
	keepAfter        atomic.Bool
	keepTok, keepGen uint64
}

func (h *fileHandle) current() (uint64, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.id, h.gen
}

// do runs a request on the handle. If the connection was re-established since the file was
// opened, the file is opened again by its path (creation and truncation flags dropped) and
// the request sent once more; a file that has no name any more fails with EIO.
func (h *fileHandle) do(ctx context.Context, call *client.Call, setID func(uint64)) syscall.Errno {
	if errno := h.materialize(ctx); errno != 0 {
		return errno
	}
	for attempt := 0; ; attempt++ {
		id, gen := h.current()
		setID(id)
		call.Gen = gen
		errno := h.node.be.client.Do(ctx, call)
		if errno != syscall.ESTALE || attempt > 0 {
			return errno
		}
		if errno := h.reopen(ctx, gen); errno != 0 {
			if errno == syscall.EINTR {
				// The reopen's redial was interrupted (a signal to the caller: FUSE
				// cancels the request): the caller restarts the call, which reopens again.
				return syscall.EINTR
			}
			return syscall.EIO
		}
	}
}

// materialize opens a handle opened lazily (openLazily) on the metadata server, as its opener
// did, by the name this node knows the file by. A name that no longer leads to the file
// (another node renamed or removed it) gives ESTALE: the file's layout ID tells.
func (h *fileHandle) materialize(_ context.Context) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.lazy {
		return 0
	}
	be := h.node.be
	// Not ended by the caller's interruption (a signal to the calling thread: FUSE's
	// INTERRUPT, which Go programs get from their runtime's preemption alone): an OPEN that
	// landed after its caller stopped waiting would leave a handle open on the server and be
	// sent again, and a removal that goes on after it (materializeHandles) would leave the
	// descriptor nothing to open. Bounded by the request timeout.
	ctx, cancel := be.opCtx(context.Background())
	defer cancel()
	var rep proto.OpenReply
	call := &client.Call{Op: proto.OpOpen, UID: h.uid, GID: h.gid, Req: &proto.OpenReq{Path: h.node.path(), Flags: h.flags}, Reply: &rep, Route: h.node.route()}
	errno := be.client.Do(ctx, call)
	if errno == syscall.ENOENT {
		return syscall.ESTALE
	}
	if errno != 0 {
		return errno
	}
	if l, err := stripe.Decode(rep.Layout); err != nil || l.ID != h.striped.layout.ID {
		be.client.Do(ctx, &client.Call{Op: proto.OpRelease, Gen: call.UsedGen, NoReconnect: true, OneWay: true, Req: &proto.HandleReq{Handle: rep.Handle}})
		return syscall.ESTALE
	}
	h.id, h.gen, h.lazy = rep.Handle, call.UsedGen, false
	return 0
}

// materializeChild is materializeHandles of the child name of n, if this node knows it.
func (n *node) materializeChild(ctx context.Context, name string) {
	if n.be.leases == nil {
		return // no lazy handles
	}
	if c := n.childNode(name); c != nil {
		c.materializeHandles(ctx)
	}
}

// childNode is n's child name, if this mount knows it (nil otherwise).
func (n *node) childNode(name string) *node {
	if ch := n.GetChild(name); ch != nil {
		c, _ := ch.Operations().(*node)
		return c
	}
	return nil
}

// materializeHandles opens on the metadata server this node's handles of n opened lazily,
// before this node removes n's name: an open handle keeps the file (and its size reports) as
// POSIX says, where its name would then lead nowhere.
func (n *node) materializeHandles(ctx context.Context) {
	n.mu.Lock()
	var lazy []*fileHandle
	for h := range n.handles {
		h.mu.Lock()
		if h.lazy {
			lazy = append(lazy, h)
		}
		h.mu.Unlock()
	}
	n.mu.Unlock()
	for _, h := range lazy {
		h.materialize(ctx) // a failure is the handle's next request's to report
	}
}

func (h *fileHandle) reopen(ctx context.Context, stale uint64) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gen != stale {
		return 0 // another request reopened it
	}
	uid, gid := caller(ctx)
	var rep proto.OpenReply
	flags := h.flags &^ (syscall.O_CREAT | syscall.O_EXCL | syscall.O_TRUNC)
	call := &client.Call{Op: proto.OpOpen, UID: uid, GID: gid, Req: &proto.OpenReq{Path: h.node.path(), Flags: flags}, Reply: &rep, Route: h.node.route()}
	if errno := h.node.be.client.Do(ctx, call); errno != 0 {
		return errno
	}
	h.id, h.gen = rep.Handle, call.UsedGen
	return 0
}

func (h *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.node.be.reads.Add(1)
	h.openDone()
	if errno := h.node.placed(); errno != 0 {
		return nil, errno
	}
	if h.striped != nil {
		return h.readStriped(ctx, dest, off)
	}
	h.node.settleAll() // this node's writes behind first
	if local := h.node.be.local; local != nil {
		// A file of this host: go-fuse reads (or splices) it straight from the descriptor.
		// A load-balanced cache's file has none: its reads go through the server (Exec).
		id, _ := h.current()
		fd, ok := local.ReadFd(id, off, len(dest))
		if !ok {
			return nil, syscall.EBADF
		}
		if fd >= 0 {
			local.CountSplicedRead(fd, off, len(dest))
			return fuse.ReadResultFd(uintptr(fd), off, len(dest)), 0
		}
	}
	ctx, cancel := h.node.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	call := &client.Call{Op: proto.OpRead, UID: uid, GID: gid, Dest: dest}
	errno := h.do(ctx, call, func(id uint64) {
		call.Req = &proto.ReadReq{Handle: id, Offset: uint64(off), Size: uint32(len(dest))}
	})
	if errno != 0 {
		return nil, errno
	}
	return fuse.ReadResultData(dest[:call.N]), 0
}

func (h *fileHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	h.node.be.writes.Add(1)
	if h.node.hold(h, data, off) {
		h.node.notMadeHere() // it holds data: its removal frees space, which waits
		return uint32(len(data)), 0
	}
	if errno := h.node.placedAsWriter(h); errno != 0 {
		return 0, errno
	}
	h.node.notMadeHere() // it holds data: its removal frees space, which waits
	if h.node.be.readOnly {
		return 0, syscall.EROFS
	}
	if h.striped != nil {
		return h.writeStriped(ctx, data, off)
	}
	if n, errno, plain := h.writeOrBehind(ctx, data, off); !plain {
		return n, errno
	}
	ctx, cancel := h.node.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	var rep proto.CountReply
	call := &client.Call{Op: proto.OpWrite, UID: uid, GID: gid, Data: data, Reply: &rep}
	errno := h.do(ctx, call, func(id uint64) {
		call.Req = &proto.WriteReq{Handle: id, Offset: uint64(off)}
	})
	return uint32(rep.N), errno
}

func (h *fileHandle) Release(ctx context.Context) syscall.Errno {
	h.openDone()
	n := h.node
	failed := n.placed() // its create behind first: the handle is the PLACE's
	n.mu.Lock()
	delete(n.handles, h)
	n.mu.Unlock()
	if failed != 0 {
		return 0 // never opened on the server
	}
	ctx, cancel := n.be.opCtx(ctx)
	defer cancel()
	h.settle() // an error was the close's to report (Flush)
	h.leaveBehind()
	if h.flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		n.be.leases.dataWriting(n.StableAttr().Ino) // what it wrote is all in now
	}
	if h.striped != nil {
		h.reportSize(ctx)
		h.releaseObjects(ctx)
		if ls := n.be.leases; ls != nil {
			ls.unleaseSize(h.striped)
		}
	}
	id, gen := h.current()
	h.mu.Lock()
	lazy := h.lazy
	h.mu.Unlock()
	// A handle of a connection that is gone is gone with it.
	release := &client.Call{Op: proto.OpRelease, Gen: gen, NoReconnect: true, OneWay: true, Req: &proto.HandleReq{Handle: id}}
	if lazy {
		release = nil // never opened on the metadata server: nothing to release there
	} else if h.striped != nil && (h.flags&syscall.O_ACCMODE != syscall.O_RDONLY || h.flags&syscall.O_TRUNC != 0) {
		// A writer says where it made objects: the metadata server then knows which servers
		// to ask when the file is removed (proto.HandleReq.Objects).
		reported := *release
		reported.Req = &proto.HandleReq{Handle: id, Reported: true, Objects: h.madeObjects()}
		reported.MinVersion = proto.ObjectsVersion
		if n.be.client.Do(ctx, &reported) != syscall.EPROTONOSUPPORT {
			release = nil
		}
	}
	if release != nil {
		n.be.client.Do(ctx, release)
	}
	n.mu.Lock()
	var remove *removal
	if len(n.handles) == 0 {
		remove, n.removeOnRelease = n.removeOnRelease, nil
	}
	n.mu.Unlock()
	if remove != nil {
		n.be.removeObjects(ctx, *remove, nil)
	}
	return 0
}

// PassthroughFd lets the kernel read a file of a local read-only mount itself, at the speed of
// the backing file system: nothing can write there, so nothing needs counting. On a writable
// mount whose capacity the file system enforces (kernelWrites) it writes it too. go-fuse asks
// only the first open of a file; later opens share its backing file (the kernel reopens it
// with each open's own flags).
func (h *fileHandle) PassthroughFd() (int, bool) {
	be := h.node.be
	if !be.passthrough || be.local == nil || h.striped != nil {
		return 0, false
	}
	if h.flags&syscall.O_ACCMODE != syscall.O_RDONLY && !be.kernelWrites {
		return 0, false
	}
	id, _ := h.current()
	return be.local.Fd(id)
}

// Flush waits for the handle's writes behind (and returns the first error one met); without
// them it needs no round trip: every write already reached the server. A striped file's
// writer reports the size its writes reached, so that stat is exact after close on every
// node.
func (h *fileHandle) Flush(ctx context.Context) syscall.Errno {
	if errno, held := h.node.closeHeld(h); held {
		if errno != 0 {
			return errno
		}
	} else if done, errno := h.node.placedYet(); !done || errno != 0 {
		// Created behind and on its way: nothing was written (a write waits for it), so
		// nothing to flush, and the close does not wait; one refused is the close's error.
		return errno
	}
	if errno := h.settle(); errno != 0 || h.striped == nil {
		return errno
	}
	ctx, cancel := h.node.be.opCtx(ctx)
	defer cancel()
	if errno := h.reportSize(ctx); errno != 0 || h.striped.cache == nil {
		return errno
	}
	return h.closingSync(ctx)
}

func (h *fileHandle) handleCall(ctx context.Context, op proto.Op, build func(id uint64) proto.Message, reply proto.Message) syscall.Errno {
	ctx, cancel := h.node.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	call := &client.Call{Op: op, UID: uid, GID: gid, Reply: reply}
	return h.do(ctx, call, func(id uint64) { call.Req = build(id) })
}

func (h *fileHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if errno := h.node.placed(); errno != 0 {
		return errno
	}
	if h.striped != nil {
		return h.fsyncStriped(ctx, flags)
	}
	// Writes still queued go with the sync (askSync): then no FSYNC is owed.
	marked := h.askSync(flags)
	if errno := h.settle(); errno != 0 {
		return errno
	}
	if marked && h.writesSynced() {
		return 0
	}
	return h.handleCall(ctx, proto.OpFsync, func(id uint64) proto.Message {
		return &proto.FsyncReq{Handle: id, Flags: flags}
	}, nil)
}

func (h *fileHandle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	if errno := h.node.placed(); errno != 0 {
		return errno
	}
	h.node.notMadeHere()
	if h.node.be.readOnly {
		return syscall.EROFS
	}
	tok := h.node.be.leases.startChange(h.node.StableAttr().Ino)
	defer h.node.be.leases.endChange(tok, nil, 0)
	if h.striped != nil {
		// MFS bounds what a file may allocate, past its end too (FALLOC_FL_KEEP_SIZE): each
		// server sees only its objects' offsets.
		if mfs := h.node.be.maxFileSize; mfs > 0 && off+size > mfs && mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_COLLAPSE_RANGE) == 0 {
			return syscall.EFBIG
		}
		return h.allocateStriped(ctx, off, size, mode)
	}
	h.node.settleAll()
	return h.handleCall(ctx, proto.OpFallocate, func(id uint64) proto.Message {
		return &proto.FallocateReq{Handle: id, Offset: off, Length: size, Mode: mode}
	}, nil)
}

func (h *fileHandle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	if errno := h.node.placed(); errno != 0 {
		return 0, errno
	}
	if h.striped != nil {
		// A striped file is data from start to end as far as seeking goes: no server is
		// asked where its holes are.
		ctx, cancel := h.node.be.opCtx(ctx)
		defer cancel()
		size := h.size(ctx, off+1)
		if off >= size {
			return 0, syscall.ENXIO
		}
		if whence == unix.SEEK_HOLE {
			return size, 0
		}
		return off, 0
	}
	h.node.settleAll() // holes and data as this node wrote them
	var rep proto.CountReply
	errno := h.handleCall(ctx, proto.OpLseek, func(id uint64) proto.Message {
		return &proto.LseekReq{Handle: id, Offset: off, Whence: whence}
	}, &rep)
	return rep.N, errno
}

func (h *fileHandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.node.Getattr(ctx, h, out)
}

// dirStream reads a directory from the server in batches.
type dirStream struct {
	node *node

	mu      sync.Mutex
	id, gen uint64
	entries []proto.Dirent
	off     uint64 // where the next batch starts
	eof     bool
	errno   syscall.Errno
}

func (d *dirStream) open(ctx context.Context) syscall.Errno {
	ctx, cancel := d.node.be.opCtx(ctx)
	defer cancel()
	var rep proto.HandleReply
	call := &client.Call{Op: proto.OpOpendir, Req: &proto.PathReq{Path: d.node.path()}, Reply: &rep, Route: d.node.route()}
	if errno := d.node.be.client.Do(ctx, call); errno != 0 {
		return errno
	}
	d.id, d.gen = rep.Handle, call.UsedGen
	return 0
}

// fetch reads the next batch; after a reconnection it reopens the directory and seeks.
func (d *dirStream) fetch() {
	for attempt := 0; ; attempt++ {
		ctx, cancel := d.node.be.opCtx(context.Background())
		var rep proto.ReaddirReply
		errno := d.node.be.client.Do(ctx, &client.Call{Op: proto.OpReaddir, Gen: d.gen, Reply: &rep,
			Req: &proto.ReaddirReq{Handle: d.id, Offset: d.off}})
		if errno == syscall.ESTALE && attempt == 0 {
			errno = d.open(ctx)
			cancel()
			if errno == 0 {
				continue
			}
		} else {
			cancel()
		}
		if errno != 0 {
			d.errno = errno
			return
		}
		d.entries = rep.Entries
		if n := len(rep.Entries); n > 0 {
			d.off = rep.Entries[n-1].Off
		}
		d.eof = rep.EOF || len(rep.Entries) == 0
		return
	}
}

func (d *dirStream) HasNext() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.entries) == 0 && !d.eof && d.errno == 0 {
		d.fetch()
	}
	return len(d.entries) > 0 || d.errno != 0
}

func (d *dirStream) Next() (fuse.DirEntry, syscall.Errno) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.errno != 0 {
		errno := d.errno
		d.errno = 0
		d.eof = true
		return fuse.DirEntry{}, errno
	}
	if len(d.entries) == 0 {
		return fuse.DirEntry{}, syscall.EIO
	}
	e := d.entries[0]
	d.entries = d.entries[1:]
	return fuse.DirEntry{Mode: e.Type, Name: e.Name, Ino: e.Ino, Off: e.Off}, 0
}

// Seekdir restarts the listing at an offset the kernel had from an entry.
func (d *dirStream) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.entries, d.off, d.eof, d.errno = nil, off, false, 0
	return 0
}

func (d *dirStream) Close() {
	d.mu.Lock()
	id, gen := d.id, d.gen
	d.mu.Unlock()
	ctx, cancel := d.node.be.opCtx(context.Background())
	defer cancel()
	d.node.be.client.Do(ctx, &client.Call{Op: proto.OpRelease, Gen: gen, NoReconnect: true, OneWay: true, Req: &proto.HandleReq{Handle: id}})
}

// remoteEqual reports whether two specs name the same remote namespace.
func remoteEqual(a, b *Remote) bool {
	return a != nil && b != nil && a.Address == b.Address && a.FragmentID == b.FragmentID && a.NamespaceID == b.NamespaceID
}
