package localfs

// The backend of namespaces held by another host: every operation is forwarded to that
// host's storage agent over warpfs (packages warpfs/client and warpfs/proto), which confines
// it to the namespace, charges the instance's capacity and creates files as the caller. The
// mount lifecycle (mount.go) is the same as for the loopback: this file only provides the
// root node.
//
// Nodes are named by their path in the namespace, as the loopback names them in its
// directory; open files are the server's handles. Nothing is cached beyond what the kernel
// keeps under the mount's timeouts (zero by default), so every node sees every change at
// once.

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// remoteBackend is what every node of one remote mount shares.
type remoteBackend struct {
	client    *client.Client
	readOnly  bool
	keepCache bool
	blockSize uint32
	timeout   time.Duration // one operation, retries after a reconnection included
	root      *rnode
}

// rnode is one file or directory of a remote namespace.
type rnode struct {
	fs.Inode
	be *remoteBackend

	mu      sync.Mutex
	handles map[*rhandle]struct{} // open through this mount
}

var (
	_ fs.NodeStatfser       = (*rnode)(nil)
	_ fs.NodeLookuper       = (*rnode)(nil)
	_ fs.NodeGetattrer      = (*rnode)(nil)
	_ fs.NodeSetattrer      = (*rnode)(nil)
	_ fs.NodeOpener         = (*rnode)(nil)
	_ fs.NodeCreater        = (*rnode)(nil)
	_ fs.NodeTmpfiler       = (*rnode)(nil)
	_ fs.NodeMkdirer        = (*rnode)(nil)
	_ fs.NodeMknoder        = (*rnode)(nil)
	_ fs.NodeSymlinker      = (*rnode)(nil)
	_ fs.NodeLinker         = (*rnode)(nil)
	_ fs.NodeUnlinker       = (*rnode)(nil)
	_ fs.NodeRmdirer        = (*rnode)(nil)
	_ fs.NodeRenamer        = (*rnode)(nil)
	_ fs.NodeReadlinker     = (*rnode)(nil)
	_ fs.NodeReaddirer      = (*rnode)(nil)
	_ fs.NodeGetxattrer     = (*rnode)(nil)
	_ fs.NodeListxattrer    = (*rnode)(nil)
	_ fs.NodeSetxattrer     = (*rnode)(nil)
	_ fs.NodeRemovexattrer  = (*rnode)(nil)
	_ fs.NodeCopyFileRanger = (*rnode)(nil)
	_ fs.NodeIoctler        = (*rnode)(nil)
	_ fs.FileReader         = (*rhandle)(nil)
	_ fs.FileWriter         = (*rhandle)(nil)
	_ fs.FileReleaser       = (*rhandle)(nil)
	_ fs.FileFlusher        = (*rhandle)(nil)
	_ fs.FileFsyncer        = (*rhandle)(nil)
	_ fs.FileAllocater      = (*rhandle)(nil)
	_ fs.FileLseeker        = (*rhandle)(nil)
	_ fs.FileGetattrer      = (*rhandle)(nil)
)

func newRemoteRoot(be *remoteBackend) *rnode {
	root := &rnode{be: be}
	be.root = root
	return root
}

// opCtx bounds one operation in time: a reconnection and a reopen share the budget.
func (be *remoteBackend) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, be.timeout)
}

// caller is the uid and gid of the process making the request.
func caller(ctx context.Context) (uint32, uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}

// call forwards one request.
func (be *remoteBackend) call(ctx context.Context, op proto.Op, req, reply proto.Message) syscall.Errno {
	ctx, cancel := be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	return be.client.Do(ctx, &client.Call{Op: op, UID: uid, GID: gid, Req: req, Reply: reply})
}

// path is the node's path in the namespace ("" for the root). A node no longer in the tree
// gets a path that names nothing.
func (n *rnode) path() string { return n.Path(n.be.root.EmbeddedInode()) }

func (n *rnode) childPath(name string) string {
	if p := n.path(); p != "" {
		return p + "/" + name
	}
	return name
}

// fill converts the server's attributes for the kernel.
func (be *remoteBackend) fill(out *fuse.Attr, a *proto.Attr) {
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

// child makes the inode of an entry the server described.
func (n *rnode) child(ctx context.Context, a *proto.Attr, out *fuse.EntryOut) *fs.Inode {
	n.be.fill(&out.Attr, a)
	return n.NewInode(ctx, &rnode{be: n.be}, fs.StableAttr{Mode: a.Mode & syscall.S_IFMT, Ino: a.Ino, Gen: 1})
}

// anyHandle returns a handle open on the node, or nil. Operations on a node prefer it to the
// path: it is the very file even after the name was removed or replaced.
func (n *rnode) anyHandle() *rhandle {
	n.mu.Lock()
	defer n.mu.Unlock()
	for h := range n.handles {
		return h
	}
	return nil
}

func (n *rnode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	var rep proto.AttrReply
	if errno := n.be.call(ctx, proto.OpLookup, &proto.PathReq{Path: n.childPath(name)}, &rep); errno != 0 {
		return nil, errno
	}
	return n.child(ctx, &rep.Attr, out), 0
}

// byNode runs a request that names a node by handle or by path.
func (n *rnode) byNode(ctx context.Context, f fs.FileHandle, op proto.Op, build func(path string, handle uint64) proto.Message, reply proto.Message) syscall.Errno {
	h, _ := f.(*rhandle)
	if h == nil {
		h = n.anyHandle()
	}
	if h == nil {
		return n.be.call(ctx, op, build(n.path(), 0), reply)
	}
	ctx, cancel := n.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	call := &client.Call{Op: op, UID: uid, GID: gid, Reply: reply}
	return h.do(ctx, call, func(id uint64) { call.Req = build("", id) })
}

func (n *rnode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var rep proto.AttrReply
	errno := n.byNode(ctx, f, proto.OpGetattr, func(p string, h uint64) proto.Message {
		return &proto.NodeReq{Path: p, Handle: h}
	}, &rep)
	if errno == 0 {
		n.be.fill(&out.Attr, &rep.Attr)
	}
	return errno
}

func (n *rnode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	const passed = proto.SetMode | proto.SetUID | proto.SetGID | proto.SetSize | proto.SetAtime | proto.SetMtime |
		proto.SetAtimeNow | proto.SetMtimeNow | proto.SetKillSUIDGID
	req := proto.SetattrReq{Valid: in.Valid & passed, Mode: in.Mode, UID: in.Uid, GID: in.Gid, Size: in.Size,
		Atime: proto.Timespec{Sec: int64(in.Atime), Nsec: in.Atimensec},
		Mtime: proto.Timespec{Sec: int64(in.Mtime), Nsec: in.Mtimensec}}
	var rep proto.AttrReply
	errno := n.byNode(ctx, f, proto.OpSetattr, func(p string, h uint64) proto.Message {
		r := req
		r.Path, r.Handle = p, h
		return &r
	}, &rep)
	if errno == 0 {
		n.be.fill(&out.Attr, &rep.Attr)
	}
	return errno
}

// openFlags tells the kernel how to cache a file opened with flags. Without client caching,
// a file opened only for writing bypasses the page cache (FOPEN_DIRECT_IO): its data goes
// from the writer's buffer straight into the request, saving a copy and the page cache's
// memory per byte written, and nothing stale can stay behind; such a file cannot be read or
// mapped through that descriptor anyway.
func (n *rnode) openFlags(flags uint32) uint32 {
	if n.be.keepCache {
		return fuse.FOPEN_KEEP_CACHE
	}
	if flags&syscall.O_ACCMODE == syscall.O_WRONLY {
		return fuse.FOPEN_DIRECT_IO
	}
	return 0
}

func (n *rnode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.be.readOnly && (flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0) {
		return nil, 0, syscall.EROFS
	}
	flags &^= fuse.FMODE_EXEC
	h, errno := n.open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return h, n.openFlags(flags), 0
}

// open opens the node's file on the server and registers the handle.
func (n *rnode) open(ctx context.Context, flags uint32) (*rhandle, syscall.Errno) {
	ctx, cancel := n.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	var rep proto.OpenReply
	call := &client.Call{Op: proto.OpOpen, UID: uid, GID: gid, Req: &proto.OpenReq{Path: n.path(), Flags: flags}, Reply: &rep}
	if errno := n.be.client.Do(ctx, call); errno != 0 {
		return nil, errno
	}
	return n.addHandle(rep.Handle, call.UsedGen, flags), 0
}

func (n *rnode) addHandle(id, gen uint64, flags uint32) *rhandle {
	h := &rhandle{node: n, id: id, gen: gen, flags: flags}
	n.mu.Lock()
	if n.handles == nil {
		n.handles = map[*rhandle]struct{}{}
	}
	n.handles[h] = struct{}{}
	n.mu.Unlock()
	return h
}

// created finishes a CREATE or TMPFILE: the child inode and its handle.
func (n *rnode) created(ctx context.Context, op proto.Op, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.be.readOnly {
		return nil, nil, 0, syscall.EROFS
	}
	flags &^= fuse.FMODE_EXEC
	ctx, cancel := n.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	var rep proto.OpenReply
	call := &client.Call{Op: op, UID: uid, GID: gid, Reply: &rep,
		Req: &proto.CreateReq{Dir: n.path(), Name: name, Flags: flags, Mode: mode}}
	if errno := n.be.client.Do(ctx, call); errno != 0 {
		return nil, nil, 0, errno
	}
	ch := n.child(ctx, &rep.Attr, out)
	child, ok := ch.Operations().(*rnode)
	if !ok {
		return nil, nil, 0, syscall.EIO
	}
	return ch, child.addHandle(rep.Handle, call.UsedGen, flags), n.openFlags(flags), 0
}

func (n *rnode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return n.created(ctx, proto.OpCreate, name, flags, mode, out)
}

// Tmpfile creates a file with no name (O_TMPFILE): its space is released when it is closed.
func (n *rnode) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return n.created(ctx, proto.OpTmpfile, "", flags, mode, out)
}

// made finishes MKDIR, MKNOD, SYMLINK and LINK.
func (n *rnode) made(ctx context.Context, op proto.Op, req proto.Message, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.be.readOnly {
		return nil, syscall.EROFS
	}
	var rep proto.AttrReply
	if errno := n.be.call(ctx, op, req, &rep); errno != 0 {
		return nil, errno
	}
	return n.child(ctx, &rep.Attr, out), 0
}

func (n *rnode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.made(ctx, proto.OpMkdir, &proto.MkdirReq{Dir: n.path(), Name: name, Mode: mode}, out)
}

func (n *rnode) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.made(ctx, proto.OpMknod, &proto.MkdirReq{Dir: n.path(), Name: name, Mode: mode, Rdev: rdev}, out)
}

func (n *rnode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.made(ctx, proto.OpSymlink, &proto.SymlinkReq{Dir: n.path(), Name: name, Target: target}, out)
}

func (n *rnode) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, ok := target.(*rnode)
	if !ok {
		return nil, syscall.EXDEV
	}
	// A file with no name (O_TMPFILE) cannot be linked by path.
	if _, parent := t.Parent(); parent == nil {
		return nil, syscall.EXDEV
	}
	return n.made(ctx, proto.OpLink, &proto.LinkReq{Path: t.path(), Dir: n.path(), Name: name}, out)
}

func (n *rnode) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	return n.be.call(ctx, proto.OpUnlink, &proto.EntryReq{Dir: n.path(), Name: name}, nil)
}

func (n *rnode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	return n.be.call(ctx, proto.OpRmdir, &proto.EntryReq{Dir: n.path(), Name: name}, nil)
}

func (n *rnode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	dst, ok := newParent.(*rnode)
	if !ok {
		return syscall.EXDEV
	}
	return n.be.call(ctx, proto.OpRename, &proto.RenameReq{Dir: n.path(), Name: name, NewDir: dst.path(), NewName: newName, Flags: flags}, nil)
}

func (n *rnode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	var rep proto.DataReply
	if errno := n.be.call(ctx, proto.OpReadlink, &proto.PathReq{Path: n.path()}, &rep); errno != 0 {
		return nil, errno
	}
	return rep.Data, 0
}

func (n *rnode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var rep proto.StatfsReply
	if errno := n.be.call(ctx, proto.OpStatfs, &proto.Empty{}, &rep); errno != 0 {
		return errno
	}
	*out = fuse.StatfsOut{Blocks: rep.Blocks, Bfree: rep.Bfree, Bavail: rep.Bavail, Files: rep.Files,
		Ffree: rep.Ffree, Bsize: rep.Bsize, NameLen: rep.NameLen, Frsize: rep.Frsize}
	return 0
}

func (n *rnode) xattr(ctx context.Context, op proto.Op, req proto.XattrReq, reply proto.Message) syscall.Errno {
	return n.byNode(ctx, nil, op, func(p string, h uint64) proto.Message {
		r := req
		r.Path, r.Handle = p, h
		return &r
	}, reply)
}

func (n *rnode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	var rep proto.XattrReply
	if errno := n.xattr(ctx, proto.OpGetxattr, proto.XattrReq{Name: attr, Size: uint32(len(dest))}, &rep); errno != 0 {
		return 0, errno
	}
	return xattrResult(dest, &rep), 0
}

func (n *rnode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
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

func (n *rnode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	return n.xattr(ctx, proto.OpSetxattr, proto.XattrReq{Name: attr, Value: data, Flags: flags}, nil)
}

func (n *rnode) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	return n.xattr(ctx, proto.OpRemovexattr, proto.XattrReq{Name: attr}, nil)
}

// CopyFileRange copies on the storage node: no data crosses the network.
func (n *rnode) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode,
	fhOut fs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	hin, ok1 := fhIn.(*rhandle)
	hout, ok2 := fhOut.(*rhandle)
	if !ok1 || !ok2 {
		return 0, syscall.ENOTSUP
	}
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

// Ioctl is refused: the server runs as root, and forwarding arbitrary ioctls to the backing
// file system would let users do what they otherwise cannot.
func (n *rnode) Ioctl(ctx context.Context, f fs.FileHandle, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	return 0, syscall.ENOTTY
}

func (n *rnode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	d := &rdir{node: n}
	if errno := d.open(ctx); errno != 0 {
		return nil, errno
	}
	return d, 0
}

// rhandle is a file open on the server.
type rhandle struct {
	node  *rnode
	flags uint32

	mu  sync.Mutex
	id  uint64
	gen uint64 // the connection generation the handle belongs to
}

func (h *rhandle) current() (uint64, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.id, h.gen
}

// do runs a request on the handle. If the connection was re-established since the file was
// opened, the file is opened again by its path (creation and truncation flags dropped) and
// the request sent once more; a file that has no name any more fails with EIO.
func (h *rhandle) do(ctx context.Context, call *client.Call, setID func(uint64)) syscall.Errno {
	for attempt := 0; ; attempt++ {
		id, gen := h.current()
		setID(id)
		call.Gen = gen
		errno := h.node.be.client.Do(ctx, call)
		if errno != syscall.ESTALE || attempt > 0 {
			return errno
		}
		if errno := h.reopen(ctx, gen); errno != 0 {
			return syscall.EIO
		}
	}
}

func (h *rhandle) reopen(ctx context.Context, stale uint64) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gen != stale {
		return 0 // another request reopened it
	}
	uid, gid := caller(ctx)
	var rep proto.OpenReply
	flags := h.flags &^ (syscall.O_CREAT | syscall.O_EXCL | syscall.O_TRUNC)
	call := &client.Call{Op: proto.OpOpen, UID: uid, GID: gid, Req: &proto.OpenReq{Path: h.node.path(), Flags: flags}, Reply: &rep}
	if errno := h.node.be.client.Do(ctx, call); errno != 0 {
		return errno
	}
	h.id, h.gen = rep.Handle, call.UsedGen
	return 0
}

func (h *rhandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
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

func (h *rhandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if h.node.be.readOnly {
		return 0, syscall.EROFS
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

func (h *rhandle) Release(ctx context.Context) syscall.Errno {
	n := h.node
	n.mu.Lock()
	delete(n.handles, h)
	n.mu.Unlock()
	id, gen := h.current()
	ctx, cancel := n.be.opCtx(ctx)
	defer cancel()
	// A handle of a connection that is gone is gone with it.
	n.be.client.Do(ctx, &client.Call{Op: proto.OpRelease, Gen: gen, NoReconnect: true, Req: &proto.HandleReq{Handle: id}})
	return 0
}

// Flush needs no round trip: every write already reached the server.
func (h *rhandle) Flush(ctx context.Context) syscall.Errno { return 0 }

func (h *rhandle) handleCall(ctx context.Context, op proto.Op, build func(id uint64) proto.Message, reply proto.Message) syscall.Errno {
	ctx, cancel := h.node.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	call := &client.Call{Op: op, UID: uid, GID: gid, Reply: reply}
	return h.do(ctx, call, func(id uint64) { call.Req = build(id) })
}

func (h *rhandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.handleCall(ctx, proto.OpFsync, func(id uint64) proto.Message {
		return &proto.FsyncReq{Handle: id, Flags: flags}
	}, nil)
}

func (h *rhandle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	if h.node.be.readOnly {
		return syscall.EROFS
	}
	return h.handleCall(ctx, proto.OpFallocate, func(id uint64) proto.Message {
		return &proto.FallocateReq{Handle: id, Offset: off, Length: size, Mode: mode}
	}, nil)
}

func (h *rhandle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	var rep proto.CountReply
	errno := h.handleCall(ctx, proto.OpLseek, func(id uint64) proto.Message {
		return &proto.LseekReq{Handle: id, Offset: off, Whence: whence}
	}, &rep)
	return rep.N, errno
}

func (h *rhandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.node.Getattr(ctx, h, out)
}

// rdir reads a directory from the server in batches.
type rdir struct {
	node *rnode

	mu      sync.Mutex
	id, gen uint64
	entries []proto.Dirent
	off     uint64 // where the next batch starts
	eof     bool
	errno   syscall.Errno
}

func (d *rdir) open(ctx context.Context) syscall.Errno {
	ctx, cancel := d.node.be.opCtx(ctx)
	defer cancel()
	var rep proto.HandleReply
	call := &client.Call{Op: proto.OpOpendir, Req: &proto.PathReq{Path: d.node.path()}, Reply: &rep}
	if errno := d.node.be.client.Do(ctx, call); errno != 0 {
		return errno
	}
	d.id, d.gen = rep.Handle, call.UsedGen
	return 0
}

// fetch reads the next batch; after a reconnection it reopens the directory and seeks.
func (d *rdir) fetch() {
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

func (d *rdir) HasNext() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.entries) == 0 && !d.eof && d.errno == 0 {
		d.fetch()
	}
	return len(d.entries) > 0 || d.errno != 0
}

func (d *rdir) Next() (fuse.DirEntry, syscall.Errno) {
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
func (d *rdir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.entries, d.off, d.eof, d.errno = nil, off, false, 0
	return 0
}

func (d *rdir) Close() {
	d.mu.Lock()
	id, gen := d.id, d.gen
	d.mu.Unlock()
	ctx, cancel := d.node.be.opCtx(context.Background())
	defer cancel()
	d.node.be.client.Do(ctx, &client.Call{Op: proto.OpRelease, Gen: gen, NoReconnect: true, Req: &proto.HandleReq{Handle: id}})
}

// remoteEqual reports whether two specs name the same remote namespace.
func remoteEqual(a, b *Remote) bool {
	return a != nil && b != nil && a.Address == b.Address && a.FragmentID == b.FragmentID && a.NamespaceID == b.NamespaceID
}
