package localfs

// The backend of this stage: the namespace is an ordinary directory on this host, served by
// go-fuse's loopback node with capacity accounting, read-only enforcement and ownership
// fix-ups added. The mount lifecycle (mount.go) only sees an fs.InodeEmbedder, so a later
// backend (warpfs) replaces this file, not the mount code.

import (
	"context"
	"log"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/usage"
)

// backend is what every node of one mount shares.
type backend struct {
	tracker     *usage.Tracker
	readOnly    bool
	keepCache   bool   // ClientCache: keep the page cache across opens when unchanged
	blockSize   uint32 // st_blksize reported for regular files
	passthrough bool   // hand read-only opens to the kernel (FUSE passthrough)
	asRoot      bool   // the server runs as root and chowns new files to their creator
	umask       uint32 // this process's umask, which the backend applies on top of the caller's
	maxFileSize int64  // DataWarp's MFS: no file may grow beyond it (EFBIG); 0 = no limit

	reads atomic.Int64 // READ requests served (passthrough reads never reach the server)

	logger     *log.Logger
	mountPath  string
	fullLogged atomic.Bool // the first ENOSPC is logged, with the numbers users do not see
}

// noteFull logs, once per mount, that the instance refused to grow: the user only sees
// "No space left on device", the administrator gets the numbers.
func (be *backend) noteFull(requested uint64) {
	if be.logger == nil || be.fullLogged.Swap(true) {
		return
	}
	full := &usage.FullError{Name: be.tracker.Name(), Requested: requested,
		Used: be.tracker.Used(), Capacity: be.tracker.Capacity()}
	be.logger.Printf("localfs: %s: %v (logged once per mount)", be.mountPath, full)
}

// node is one file or directory of the namespace. It wraps go-fuse's loopback node and
// intercepts every operation that changes a file's size or the tree, to keep the instance's
// usage tracker exact.
type node struct {
	*fs.LoopbackNode
	be *backend

	// sizeMu orders size changes of this file against writes: a write that stays inside the
	// current size holds it shared; anything that can change the size (a growing write,
	// truncate, fallocate, unlink/rename of the last link) holds it exclusively, so the size
	// observed before such an operation is the size the tracker has counted.
	sizeMu sync.RWMutex

	mu      sync.Mutex           // guards handles and orphan
	handles map[*handle]struct{} // file handles open on this node through the mount
	orphan  bool                 // the last link is gone while handles are open: release at last close
}

// orphanHandle returns an open handle of a node whose names are all gone (path-based calls
// would fail; the kernel still stats and changes such files through their descriptors), or
// nil. The caller holds sizeMu, which Release needs exclusively to close a handle.
func (n *node) orphanHandle() *handle {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.orphan {
		return nil
	}
	for h := range n.handles {
		return h
	}
	return nil
}

// isOrphan reports whether the node's names are all gone while it is open.
func (n *node) isOrphan() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.orphan
}

var (
	_ fs.NodeWrapChilder     = (*node)(nil)
	_ fs.NodeStatfser        = (*node)(nil)
	_ fs.NodeLookuper        = (*node)(nil)
	_ fs.NodeGetattrer       = (*node)(nil)
	_ fs.NodeSetattrer       = (*node)(nil)
	_ fs.NodeStatxer         = (*node)(nil)
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
	_ fs.NodeSetxattrer      = (*node)(nil)
	_ fs.NodeRemovexattrer   = (*node)(nil)
	_ fs.NodeCopyFileRanger  = (*node)(nil)
	_ fs.NodeIoctler         = (*node)(nil)
	_ fs.NodeGetxattrer      = (*node)(nil)
	_ fs.NodeListxattrer     = (*node)(nil)
	_ fs.NodeReadlinker      = (*node)(nil)
	_ fs.NodeOpendirHandler  = (*node)(nil)
	_ fs.NodeReaddirer       = (*node)(nil)
	_ fs.InodeEmbedder       = (*node)(nil)
	_ fs.FileHandle          = (*handle)(nil)
	_ fs.FileReleaser        = (*handle)(nil)
	_ fs.FileReader          = (*handle)(nil)
	_ fs.FileWriter          = (*handle)(nil)
	_ fs.FileWritever        = (*handle)(nil)
	_ fs.FileGetattrer       = (*handle)(nil)
	_ fs.FileStatxer         = (*handle)(nil)
	_ fs.FileAllocater       = (*handle)(nil)
	_ fs.FileFlusher         = (*handle)(nil)
	_ fs.FileFsyncer         = (*handle)(nil)
	_ fs.FileLseeker         = (*handle)(nil)
	_ fs.FilePassthroughFder = (*handle)(nil)
)

// newLoopbackRoot returns the root node serving dir.
func newLoopbackRoot(dir string, be *backend) (*node, error) {
	inner, err := fs.NewLoopbackRoot(dir)
	if err != nil {
		return nil, err
	}
	lb := inner.(*fs.LoopbackNode)
	root := &node{LoopbackNode: lb, be: be}
	lb.RootData.RootNode = root
	return root, nil
}

// WrapChild makes every node the loopback creates one of ours.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), be: n.be}
}

// backendPath is the node's path in the namespace directory.
func (n *node) backendPath() string {
	root := n.RootData.RootNode.EmbeddedInode()
	return filepath.Join(n.RootData.Path, n.Path(root))
}

// nodeOf returns our node behind an inode, or nil.
func nodeOf(in *fs.Inode) *node {
	if in == nil {
		return nil
	}
	nd, _ := in.Operations().(*node)
	return nd
}

// Statfs reports the instance, not the host file system: size = capacity, free = capacity −
// used. Inode counts come from the backing file system.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var st unix.Statfs_t
	if err := unix.Statfs(n.RootData.Path, &st); err != nil {
		return fs.ToErrno(err)
	}
	const unit = statfsBlockSize
	capacity := n.be.tracker.Capacity()
	free := n.be.tracker.Free()
	*out = fuse.StatfsOut{
		Blocks:  capacity / unit,
		Bfree:   free / unit,
		Bavail:  free / unit,
		Files:   st.Files,
		Ffree:   st.Ffree,
		Bsize:   unit,
		NameLen: uint32(st.Namelen),
		Frsize:  unit,
	}
	return 0
}

// statfsBlockSize is the unit of the statfs block counts. 4 KiB keeps df exact for any
// capacity that is a multiple of 4 KiB (every pool granularity is).
const statfsBlockSize = 4096

// fixAttr reports the preferred I/O size of regular files. stdio and many tools size their
// buffers by st_blksize; the backing file system's 4 KiB would cost a FUSE round trip per
// 4 KiB (Lustre reports its stripe size here for the same reason).
func (n *node) fixAttr(a *fuse.Attr) {
	if a.Mode&syscall.S_IFMT == syscall.S_IFREG && n.be.blockSize > 0 {
		a.Blksize = n.be.blockSize
	}
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch, errno := n.LoopbackNode.Lookup(ctx, name, out)
	if errno == 0 {
		n.fixAttr(&out.Attr)
	}
	return ch, errno
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if f == nil && n.isOrphan() {
		n.sizeMu.RLock()
		defer n.sizeMu.RUnlock()
		if h := n.orphanHandle(); h != nil {
			f = h
		}
	}
	errno := n.LoopbackNode.Getattr(ctx, inner(f), out)
	if errno == 0 {
		n.fixAttr(&out.Attr)
	}
	return errno
}

func (n *node) Statx(ctx context.Context, f fs.FileHandle, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if f == nil && n.isOrphan() {
		n.sizeMu.RLock()
		defer n.sizeMu.RUnlock()
		if h := n.orphanHandle(); h != nil {
			f = h
		}
	}
	errno := n.LoopbackNode.Statx(ctx, inner(f), flags, mask, out)
	if errno == 0 && out.Mode&syscall.S_IFMT == syscall.S_IFREG && n.be.blockSize > 0 {
		out.Blksize = n.be.blockSize
	}
	return errno
}

// inner unwraps our handle for the loopback's methods (nil stays an untyped nil).
func inner(f fs.FileHandle) fs.FileHandle {
	if h, ok := f.(*handle); ok && h != nil {
		return h.lf
	}
	return nil
}

// stat reads the node's file: through the handle if there is one, else by its backing path.
func (n *node) stat(h *handle) (unix.Stat_t, syscall.Errno) {
	var st unix.Stat_t
	var err error
	if h != nil {
		err = unix.Fstat(h.fd, &st)
	} else {
		err = unix.Lstat(n.backendPath(), &st)
	}
	return st, fs.ToErrno(err)
}

// sizeOf is the apparent size of the node's file.
func (n *node) sizeOf(h *handle) (int64, syscall.Errno) {
	st, errno := n.stat(h)
	return st.Size, errno
}

// dropSetID clears the set-user-ID bit (and set-group-ID with group execute) of a file being
// modified by a caller other than root, as a local file system does: someone who may write
// another user's set-ID program must not keep it set-ID. The kernel leaves this to the server
// (FUSE_HANDLE_KILLPRIV_V2), and the backing file system would not do it since this server
// writes as root.
func (n *node) dropSetID(ctx context.Context, h *handle, mode uint32, always bool) {
	if !n.be.asRoot {
		return // we write as the caller: the backing file system clears them itself
	}
	kill := mode & syscall.S_ISUID
	if mode&(syscall.S_ISGID|syscall.S_IXGRP) == syscall.S_ISGID|syscall.S_IXGRP {
		kill |= syscall.S_ISGID
	}
	if kill == 0 {
		return
	}
	if !always {
		if caller, ok := fuse.FromContext(ctx); ok && caller.Uid == 0 {
			return // root keeps them, as CAP_FSETID does
		}
	}
	newMode := mode & 0o7777 &^ kill
	if h != nil {
		unix.Fchmod(h.fd, newMode)
	} else {
		unix.Fchmodat(unix.AT_FDCWD, n.backendPath(), newMode, 0)
	}
}

// settle corrects the tracker once a size change is done: reserved bytes were counted
// beforehand, the file went from before to after.
func (n *node) settle(reserved uint64, before, after int64) {
	t := n.be.tracker
	if after >= before {
		grew := uint64(after - before)
		switch {
		case grew < reserved:
			t.Release(reserved - grew)
		case grew > reserved:
			t.Charge(grew - reserved)
		}
		return
	}
	t.Release(reserved + uint64(before-after))
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	newSize, sizing := in.GetSize()
	if !sizing {
		n.sizeMu.RLock()
		defer n.sizeMu.RUnlock()
	} else {
		n.sizeMu.Lock()
		defer n.sizeMu.Unlock()
	}
	h, _ := f.(*handle)
	if h == nil {
		h = n.orphanHandle()
		if h != nil {
			f = h
		}
	}
	if !sizing {
		errno := n.LoopbackNode.Setattr(ctx, inner(f), in, out)
		if errno == 0 {
			n.fixAttr(&out.Attr)
		}
		return errno
	}
	if limit := n.be.maxFileSize; limit > 0 && int64(newSize) > limit {
		return syscall.EFBIG
	}
	before, errno := n.sizeOf(h)
	if errno != 0 {
		return errno
	}
	var reserved uint64
	if int64(newSize) > before {
		reserved = newSize - uint64(before)
		if err := n.be.tracker.Reserve(reserved); err != nil {
			n.be.noteFull(reserved)
			return syscall.ENOSPC
		}
	}
	errno = n.LoopbackNode.Setattr(ctx, inner(f), in, out)
	if errno == 0 && in.Valid&fuse.FATTR_KILL_SUIDGID != 0 && in.Valid&fuse.FATTR_MODE == 0 {
		// An unprivileged truncate: the kernel asks us to clear set-ID bits.
		n.dropSetID(ctx, h, out.Attr.Mode, true)
		if st, serr := n.stat(h); serr == 0 {
			out.Attr.Mode = st.Mode
		}
	}
	after, serr := n.sizeOf(h)
	if serr != 0 {
		after = before // cannot tell; keep the old count rather than guess
		if errno == 0 {
			after = int64(newSize)
		}
	}
	n.settle(reserved, before, after)
	if errno == 0 {
		n.fixAttr(&out.Attr)
	}
	return errno
}

// write performs a write-like operation of length bytes at off through h, reserving growth
// first. A write that would cross the capacity is shortened to what fits (as a full disk
// does) and fails with ENOSPC when nothing fits.
func (n *node) write(ctx context.Context, h *handle, length int64, off int64, do func(length int64) (int, error)) (uint32, syscall.Errno) {
	if n.be.readOnly {
		return 0, syscall.EROFS
	}
	if length <= 0 {
		w, err := do(0)
		return uint32(max(w, 0)), fs.ToErrno(err)
	}
	if limit := n.be.maxFileSize; limit > 0 && off+length > limit {
		// Past the maximum file size: write what fits, then EFBIG (as RLIMIT_FSIZE does).
		if off >= limit {
			return 0, syscall.EFBIG
		}
		length = limit - off
	}
	end := off + length

	// Fast path: the write stays inside the file, its size cannot change meanwhile.
	n.sizeMu.RLock()
	st, errno := n.stat(h)
	if errno != 0 {
		n.sizeMu.RUnlock()
		return 0, errno
	}
	if end <= st.Size {
		n.dropSetID(ctx, h, st.Mode, false)
		w, err := do(length)
		n.sizeMu.RUnlock()
		return uint32(max(w, 0)), fs.ToErrno(err)
	}
	n.sizeMu.RUnlock()

	n.sizeMu.Lock()
	defer n.sizeMu.Unlock()
	if st, errno = n.stat(h); errno != 0 {
		return 0, errno
	}
	n.dropSetID(ctx, h, st.Mode, false)
	size := st.Size
	if end <= size { // another writer grew it while we waited
		w, err := do(length)
		return uint32(max(w, 0)), fs.ToErrno(err)
	}
	growth := uint64(end - size)
	granted := n.be.tracker.ReserveUpTo(growth)
	if granted < growth {
		n.be.noteFull(growth)
		allowedEnd := size + int64(granted)
		if h.flags&syscall.O_DIRECT != 0 {
			allowedEnd &^= directIOAlign - 1 // O_DIRECT needs aligned lengths
		}
		if allowedEnd <= off {
			n.be.tracker.Release(granted)
			return 0, syscall.ENOSPC
		}
		length = allowedEnd - off
	}
	w, err := do(length)
	after, serr := n.sizeOf(h)
	if serr != 0 {
		after = size + int64(granted) // count what we reserved: never under-count
	}
	n.settle(granted, size, after)
	return uint32(max(w, 0)), fs.ToErrno(err)
}

// directIOAlign is the alignment O_DIRECT needs on the backing file system.
const directIOAlign = 4096

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.be.readOnly && (flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0) {
		return nil, 0, syscall.EROFS
	}
	f, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	h, errno := n.newHandle(f, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return h, fuseFlags | n.openFlags(), 0
}

func (n *node) openFlags() uint32 {
	if n.be.keepCache {
		return fuse.FOPEN_KEEP_CACHE
	}
	return 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.be.readOnly {
		return nil, nil, 0, syscall.EROFS
	}
	// O_NOFOLLOW: never create through a symbolic link planted under the name as root.
	// O_TRUNC is applied below with accounting, for the rare case the name already exists.
	ch, f, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, (flags&^syscall.O_TRUNC)|syscall.O_NOFOLLOW, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	child := nodeOf(ch)
	if child == nil {
		return nil, nil, 0, syscall.EIO
	}
	h, errno := child.newHandle(f, flags)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	p := filepath.Join(n.backendPath(), name)
	n.fixNewEntry(p, mode, &out.Attr)
	if flags&syscall.O_TRUNC != 0 && out.Attr.Size > 0 {
		in := &fuse.SetAttrIn{}
		in.Valid = fuse.FATTR_SIZE
		in.Size = 0
		var ao fuse.AttrOut
		if errno := child.Setattr(ctx, h, in, &ao); errno == 0 {
			out.Attr = ao.Attr
		}
	}
	n.fixAttr(&out.Attr)
	return ch, h, fuseFlags | n.openFlags(), 0
}

// Tmpfile creates a file with no name (O_TMPFILE): its size is released when it is closed.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.be.readOnly {
		return nil, nil, 0, syscall.EROFS
	}
	ch, f, fuseFlags, errno := n.LoopbackNode.Tmpfile(ctx, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	child := nodeOf(ch)
	if child == nil {
		return nil, nil, 0, syscall.EIO
	}
	h, errno := child.newHandle(f, flags)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if n.be.asRoot {
		if caller, ok := fuse.FromContext(ctx); ok {
			if err := unix.Fchown(h.fd, int(caller.Uid), int(caller.Gid)); err == nil {
				out.Attr.Uid, out.Attr.Gid = caller.Uid, caller.Gid
			}
		}
	}
	child.mu.Lock()
	child.orphan = true
	child.mu.Unlock()
	n.fixAttr(&out.Attr)
	return ch, h, fuseFlags | n.openFlags(), 0
}

// fixNewEntry completes what the loopback does for a new file, directory, node or symlink:
// the permission bits the caller asked for (the backing file system applied this process's
// umask on top of the caller's), and the group of a set-group-ID parent directory (the
// loopback gives the creator's primary group).
func (n *node) fixNewEntry(p string, mode uint32, a *fuse.Attr) {
	isLink := a.Mode&syscall.S_IFMT == syscall.S_IFLNK
	want := mode & 0o777
	if !isLink && n.be.umask&want != 0 && a.Mode&0o777 != want {
		if unix.Fchmodat(unix.AT_FDCWD, p, want|(a.Mode&0o7000), 0) == nil {
			a.Mode = a.Mode&^0o777 | want
		}
	}
	if !n.be.asRoot {
		return // created as ourselves: the kernel's own rules applied
	}
	var parent unix.Stat_t
	if unix.Lstat(n.backendPath(), &parent) != nil || parent.Mode&syscall.S_ISGID == 0 {
		return
	}
	if a.Gid != parent.Gid && unix.Fchownat(unix.AT_FDCWD, p, -1, int(parent.Gid), unix.AT_SYMLINK_NOFOLLOW) == nil {
		a.Gid = parent.Gid
	}
	if a.Mode&syscall.S_IFMT == syscall.S_IFDIR && a.Mode&syscall.S_ISGID == 0 {
		if unix.Fchmodat(unix.AT_FDCWD, p, (a.Mode&0o7777)|syscall.S_ISGID, 0) == nil {
			a.Mode |= syscall.S_ISGID
		}
	}
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.be.readOnly {
		return nil, syscall.EROFS
	}
	ch, errno := n.LoopbackNode.Mkdir(ctx, name, mode, out)
	if errno == 0 {
		n.fixNewEntry(filepath.Join(n.backendPath(), name), mode, &out.Attr)
	}
	return ch, errno
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.be.readOnly {
		return nil, syscall.EROFS
	}
	ch, errno := n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
	if errno == 0 {
		n.fixNewEntry(filepath.Join(n.backendPath(), name), mode, &out.Attr)
		n.fixAttr(&out.Attr)
	}
	return ch, errno
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.be.readOnly {
		return nil, syscall.EROFS
	}
	ch, errno := n.LoopbackNode.Symlink(ctx, target, name, out)
	if errno == 0 {
		n.fixNewEntry(filepath.Join(n.backendPath(), name), 0o777, &out.Attr)
	}
	return ch, errno
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.be.readOnly {
		return nil, syscall.EROFS
	}
	ch, errno := n.LoopbackNode.Link(ctx, target, name, out)
	if errno == 0 {
		n.fixAttr(&out.Attr)
	}
	return ch, errno
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	return n.LoopbackNode.Rmdir(ctx, name)
}

// removal is what dropping one name of a regular file gives back.
type removal struct {
	victim *node // our node for the file, if the kernel knows it
	size   int64
	last   bool // the name was the file's last link
	ino    uint64
}

// prepareRemoval inspects the regular file about to lose the name p and locks its node
// against size changes; finish must follow.
func prepareRemoval(victim *node, p string) (removal, bool) {
	if victim != nil && victim.Mode()&syscall.S_IFMT != syscall.S_IFREG {
		victim = nil // only regular files count
	}
	if victim != nil {
		victim.sizeMu.Lock()
	}
	var st unix.Stat_t
	if unix.Lstat(p, &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		if victim != nil {
			victim.sizeMu.Unlock()
		}
		return removal{}, false
	}
	return removal{victim: victim, size: st.Size, last: st.Nlink == 1, ino: st.Ino}, true
}

// finish releases the file's size if the name removed was its last link, or defers that to
// the last close while the file is still open.
func (r removal) finish(t *usage.Tracker, removed bool) {
	if r.victim != nil {
		defer r.victim.sizeMu.Unlock()
	}
	if !removed || !r.last {
		return
	}
	if r.victim != nil {
		r.victim.mu.Lock()
		open := len(r.victim.handles) > 0
		if open {
			r.victim.orphan = true
		}
		r.victim.mu.Unlock()
		if open {
			return
		}
	}
	t.Release(uint64(r.size))
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	p := filepath.Join(n.backendPath(), name)
	r, isFile := prepareRemoval(nodeOf(n.GetChild(name)), p)
	errno := n.LoopbackNode.Unlink(ctx, name)
	if isFile {
		r.finish(n.be.tracker, errno == 0)
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
	// A rename that replaces a regular file removes the replaced file's name.
	var r removal
	replacing := false
	if flags&(unix.RENAME_EXCHANGE|unix.RENAME_NOREPLACE) == 0 {
		victim := nodeOf(dst.GetChild(newName))
		if src := nodeOf(n.GetChild(name)); victim != nil && victim == src {
			victim = nil // renaming a link onto another link of the same file: no-op
		}
		r, replacing = prepareRemoval(victim, filepath.Join(dst.backendPath(), newName))
		if replacing {
			var st unix.Stat_t
			if unix.Lstat(filepath.Join(n.backendPath(), name), &st) == nil && st.Ino == r.ino {
				r.last = false // same inode under both names: nothing is removed
			}
		}
	}
	errno := n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
	if replacing {
		r.finish(n.be.tracker, errno == 0)
	}
	return errno
}

// withOrphanFd runs fn on the descriptor of an open handle if the node's names are all gone
// (the loopback's path-based calls would fail), and reports whether it did.
func (n *node) withOrphanFd(fn func(fd int)) bool {
	if !n.isOrphan() {
		return false
	}
	n.sizeMu.RLock()
	defer n.sizeMu.RUnlock()
	h := n.orphanHandle()
	if h == nil {
		return false
	}
	fn(h.fd)
	return true
}

func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	var size int
	var err error
	if n.withOrphanFd(func(fd int) { size, err = unix.Fgetxattr(fd, attr, dest) }) {
		return uint32(max(size, 0)), fs.ToErrno(err)
	}
	return n.LoopbackNode.Getxattr(ctx, attr, dest)
}

func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	var size int
	var err error
	if n.withOrphanFd(func(fd int) { size, err = unix.Flistxattr(fd, dest) }) {
		return uint32(max(size, 0)), fs.ToErrno(err)
	}
	return n.LoopbackNode.Listxattr(ctx, dest)
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	var err error
	if n.withOrphanFd(func(fd int) { err = unix.Fsetxattr(fd, attr, data, int(flags)) }) {
		return fs.ToErrno(err)
	}
	return n.LoopbackNode.Setxattr(ctx, attr, data, flags)
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.be.readOnly {
		return syscall.EROFS
	}
	var err error
	if n.withOrphanFd(func(fd int) { err = unix.Fremovexattr(fd, attr) }) {
		return fs.ToErrno(err)
	}
	return n.LoopbackNode.Removexattr(ctx, attr)
}

// CopyFileRange copies inside the backing file system (no data through this process),
// reserving the growth of the destination first.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode,
	fhOut fs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	hin, ok1 := fhIn.(*handle)
	hout, ok2 := fhOut.(*handle)
	dst := nodeOf(out)
	if !ok1 || !ok2 || dst == nil {
		return 0, syscall.ENOTSUP
	}
	// Callers such as cp ask for far more than the source holds; reserve only what exists.
	srcSize, errno := n.sizeOf(hin)
	if errno != 0 {
		return 0, errno
	}
	if int64(offIn) >= srcSize {
		return 0, 0
	}
	length = min(length, uint64(srcSize)-offIn, maxCopyChunk)
	return dst.write(ctx, hout, int64(length), int64(offOut), func(l int64) (int, error) {
		inOff, outOff := int64(offIn), int64(offOut)
		return unix.CopyFileRange(hin.fd, &inOff, hout.fd, &outOff, int(l), int(flags))
	})
}

// maxCopyChunk bounds one copy_file_range request (the kernel loops over short copies).
const maxCopyChunk = 1 << 30

// Ioctl is refused: the server runs as root, and forwarding arbitrary ioctls (chattr +i,
// reflinks…) to the backing file system would let users do what they otherwise cannot.
func (n *node) Ioctl(ctx context.Context, f fs.FileHandle, cmd uint32, arg uint64, input []byte, output []byte) (int32, syscall.Errno) {
	return 0, syscall.ENOTTY
}

// handle is an open file. It wraps the loopback's file so that every size change goes
// through the node's accounting.
type handle struct {
	node        *node
	lf          *fs.LoopbackFile
	fd          int
	flags       uint32
	passthrough bool
}

func (n *node) newHandle(f fs.FileHandle, flags uint32) (*handle, syscall.Errno) {
	lf, ok := f.(*fs.LoopbackFile)
	if !ok {
		if r, ok := f.(fs.FileReleaser); ok {
			r.Release(context.Background())
		}
		return nil, syscall.EIO
	}
	fd, ok := lf.PassthroughFd() // the descriptor; it lives as long as lf
	if !ok {
		lf.Release(context.Background())
		return nil, syscall.EBADF
	}
	h := &handle{
		node:  n,
		lf:    lf,
		fd:    fd,
		flags: flags,
		// Only opens that cannot write may bypass this server: writes must be counted.
		passthrough: n.be.passthrough && flags&syscall.O_ACCMODE == syscall.O_RDONLY,
	}
	n.mu.Lock()
	if n.handles == nil {
		n.handles = map[*handle]struct{}{}
	}
	n.handles[h] = struct{}{}
	n.mu.Unlock()
	return h, 0
}

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.node.be.reads.Add(1)
	return h.lf.Read(ctx, dest, off)
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	return h.node.write(ctx, h, int64(len(data)), off, func(l int64) (int, error) {
		return unix.Pwrite(h.fd, data[:l], off)
	})
}

func (h *handle) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	var total int64
	for _, b := range data {
		total += int64(len(b))
	}
	return h.node.write(ctx, h, total, off, func(l int64) (int, error) {
		return unix.Pwritev(h.fd, truncateIovec(data, l), off)
	})
}

// truncateIovec returns the first l bytes of data.
func truncateIovec(data [][]byte, l int64) [][]byte {
	var out [][]byte
	for _, b := range data {
		if l <= 0 {
			break
		}
		if int64(len(b)) > l {
			b = b[:l]
		}
		out = append(out, b)
		l -= int64(len(b))
	}
	return out
}

func (h *handle) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	n := h.node
	if n.be.readOnly {
		return syscall.EROFS
	}
	n.sizeMu.Lock()
	defer n.sizeMu.Unlock()
	st, errno := n.stat(h)
	if errno != 0 {
		return errno
	}
	before := st.Size
	n.dropSetID(ctx, h, st.Mode, false)
	worst := usage.FallocateGrowth(mode, off, size, before) // the most the file can grow
	if limit := n.be.maxFileSize; limit > 0 && int64(uint64(before)+worst) > limit {
		return syscall.EFBIG
	}
	if err := n.be.tracker.Reserve(worst); err != nil {
		n.be.noteFull(worst)
		return syscall.ENOSPC
	}
	errno = h.lf.Allocate(ctx, off, size, mode)
	after, serr := n.sizeOf(h)
	if serr != 0 {
		after = before + int64(worst)
	}
	n.settle(worst, before, after)
	return errno
}

func (h *handle) Release(ctx context.Context) syscall.Errno {
	n := h.node
	// Exclusive: nobody may be using this descriptor (orphanHandle borrows it under sizeMu).
	n.sizeMu.Lock()
	defer n.sizeMu.Unlock()
	n.mu.Lock()
	delete(n.handles, h)
	releaseSize := len(n.handles) == 0 && n.orphan
	if releaseSize {
		n.orphan = false
	}
	n.mu.Unlock()
	if releaseSize {
		// The last close of a file whose names are all gone: its space comes back now.
		var st unix.Stat_t
		if unix.Fstat(h.fd, &st) == nil {
			n.be.tracker.Release(uint64(st.Size))
		}
	}
	return h.lf.Release(ctx)
}

func (h *handle) PassthroughFd() (int, bool) {
	if !h.passthrough {
		return 0, false
	}
	return h.fd, true
}

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.lf.Getattr(ctx, out)
}

func (h *handle) Statx(ctx context.Context, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	return h.lf.Statx(ctx, flags, mask, out)
}

func (h *handle) Flush(ctx context.Context) syscall.Errno { return h.lf.Flush(ctx) }

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.lf.Fsync(ctx, flags)
}

func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return h.lf.Lseek(ctx, off, whence)
}
