package server

// The metadata side of a striped instance. Its namespace (on the instance's metadata server)
// holds directories, links and one stub per regular file; a stub's data lives in stripe
// objects on every server of the instance (package stripe), which the compute nodes' clients
// read and write directly. The stub carries the file's layout and logical size in an extended
// attribute in the trusted namespace, which only root can touch: the stub itself stays empty,
// so capacity is charged where the data is, on the servers holding the objects. A namespace
// is striped when its root directory carries a layout: the instance's default, which new
// directories inherit and new files take with an id of their own.

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// LayoutXattr holds a stub's or a directory's layout. The agent sets it on a striped
// namespace's root.
const LayoutXattr = "trusted.spillway.layout"

// UserLayoutXattr is how users read and set a file's or a directory's striping: text such as
// "stripe_size=8388608 stripe_width=4 start=2" (package stripe's Text).
const UserLayoutXattr = stripe.UserXattr

// hiddenXattrPrefix is the server's own attributes: never shown to clients, never set by them.
const hiddenXattrPrefix = "trusted.spillway."

// maxStub bounds a stub's attribute: its layout and the record of its objects.
const maxStub = stripe.EncodedSize + 1 + proto.MaxObjects

// readLayout reads the layout of the node open as fd (any descriptor, O_PATH included).
func readLayout(fd int) (stripe.Layout, bool) {
	l, _, ok := readStub(fd)
	return l, ok
}

// readStub reads the layout of the node open as fd and, for a file's stub, the record of
// where its objects are that follows it in the attribute (ObjectsRecord; nil: none).
// A real descriptor is read through itself; an O_PATH one, which the f* calls refuse (EBADF),
// by its /proc name (a walk of /proc/self/fd/N: a create and its release pay several).
func readStub(fd int) (stripe.Layout, []byte, bool) {
	var buf [maxStub]byte
	n, err := unix.Fgetxattr(fd, LayoutXattr, buf[:])
	if err == unix.EBADF {
		n, err = unix.Getxattr(procPath(fd), LayoutXattr, buf[:])
	}
	return decodeStub(buf[:max(n, 0)], err)
}

func decodeStub(b []byte, err error) (stripe.Layout, []byte, bool) {
	if err != nil || len(b) < stripe.EncodedSize {
		return stripe.Layout{}, nil, false
	}
	l, err := stripe.Decode(b[:stripe.EncodedSize])
	if err != nil {
		return stripe.Layout{}, nil, false
	}
	var rec []byte
	if len(b) > stripe.EncodedSize {
		rec = append([]byte(nil), b[stripe.EncodedSize:]...)
	}
	return l, rec, true
}

// readLayoutAt reads the layout of dirfd/name without opening it: through the directory's
// descriptor (lgetxattrAt: the directory itself, not a path resolved again), and without
// following name if it is a symbolic link (whose trusted attributes no user can set).
func readLayoutAt(dirfd int, name string) (stripe.Layout, bool) {
	l, _, ok := readStubAt(dirfd, name)
	return l, ok
}

func readStubAt(dirfd int, name string) (stripe.Layout, []byte, bool) {
	var buf [maxStub]byte
	n, err := lgetxattrAt(dirfd, name, LayoutXattr, buf[:])
	return decodeStub(buf[:max(n, 0)], err)
}

// writeLayout writes a layout with no record of objects (a directory's; a stub's whose
// objects are then unknown).
func writeLayout(fd int, l stripe.Layout) syscall.Errno {
	return writeStub(fd, l, nil)
}

// writeStub writes a stub's layout and the record of its objects (nil: none, unknown).
// As readStub, through the descriptor itself unless it is an O_PATH one.
func writeStub(fd int, l stripe.Layout, rec []byte) syscall.Errno {
	b := append(l.Encode(), rec...)
	err := unix.Fsetxattr(fd, LayoutXattr, b, 0)
	if err == unix.EBADF {
		err = unix.Setxattr(procPath(fd), LayoutXattr, b, 0)
	}
	return errnoOf(err)
}

// newFileID is a file's object name: random, so that no two files of an instance share
// objects, even across a metadata server's restarts and reused inode numbers.
func newFileID() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) | 2 // never 0 or 1 (stripe.FixedStart): directories' layouts
}

// layoutFor gives a regular file just created under a directory of a striped namespace its
// layout; nothing in an unstriped one. rec is the record of its objects: noObjects() when
// the file is not opened for writing as it is made, nil (none, unknown, until its writer
// closes) when it is.
func (v *volume) layoutFor(fd, dirfd int, rec []byte) (stripe.Layout, bool, syscall.Errno) {
	if !v.striped {
		inheritKept(fd, dirfd)
		return stripe.Layout{}, false, 0
	}
	dir, ok := readLayout(dirfd)
	if !ok {
		dir = v.rootLayout
	}
	l := dir.ForFile(newFileID())
	return l, true, writeStub(fd, l, rec)
}

// writeObject writes data at off of the stripe object name, created if missing (flags may
// add O_EXCL), and closes it: WRITE_NAME, and a file placed whole (stubs.go, writeWhole). It
// counts what it wrote.
func (v *volume) writeObject(name string, off uint64, data []byte, uid, gid, flags uint32) (int, syscall.Errno) {
	hd, _, errno := v.create(&proto.CreateReq{Name: name, Flags: unix.O_WRONLY | unix.O_CREAT | flags, Mode: 0o600}, uid, gid)
	if errno != 0 {
		return 0, errno
	}
	defer v.closeFile(hd)
	hd.grows = true // a new object, most often (volume.write)
	n, errno := v.write(hd, int64(len(data)), int64(min(off, 1<<62)), uid, func(l int64) (int, error) {
		return unix.Pwrite(hd.fd, data[:l], int64(off))
	})
	if n > 0 || errno == 0 {
		v.acct.wrote(n, off+uint64(n))
	}
	return n, errno
}

// createStub creates a striped file: made without a name, given its owner and layout, then
// linked in, so that no other client can ever open it before it has its layout (and would
// take it for a file holding its own data). A name another client created meanwhile is
// opened instead, unless the caller asked for O_EXCL.
// created says whether the stub was made (not found there already).
func (v *volume) createStub(dirfd int, parent *unix.Stat_t, r *proto.CreateReq, uid, gid uint32) (h *handle, a proto.Attr, created bool, errno syscall.Errno) {
	base := openFlags(r.Flags)
	fd, err := unix.Openat(dirfd, ".", unix.O_RDWR|unix.O_TMPFILE|unix.O_CLOEXEC, r.Mode&0o7777)
	if err != nil {
		return nil, proto.Attr{}, false, errnoOf(err)
	}
	// A regular file: own stats it (after its owner is set), no need to before.
	t := &target{fd: fd, real: true, st: unix.Stat_t{Mode: syscall.S_IFREG}}
	v.own(t, parent, uid, gid, r.Mode)
	layout, _, errno := v.layoutFor(fd, dirfd, recordFor(r.Flags))
	if errno != 0 {
		unix.Close(fd)
		return nil, proto.Attr{}, false, errno
	}
	dir, err := v.linkIn(fd, dirfd, parent, r.Name)
	if err == nil {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, proto.Attr{}, true, errnoOf(err)
		}
		v.tracker.Charge(usage.Footprint(&st)) // its layout's attribute, if it takes a block
		h, a, errno = v.finishOpenStat(fd, &st, r.Flags, false, nil, 0, 0, 0, &layout)
		if h != nil {
			h.dirAttr = dir
		}
		return h, a, true, errno
	}
	unix.Close(fd)
	if !errors.Is(err, syscall.EEXIST) || r.Flags&unix.O_EXCL != 0 {
		return nil, proto.Attr{}, false, errnoOf(err)
	}
	fd, err = unix.Openat(dirfd, r.Name, base, 0)
	if err != nil {
		return nil, proto.Attr{}, false, errnoOf(err)
	}
	h, a, errno = v.finishOpen(fd, r.Flags, false, nil, 0, 0, 0, nil)
	return h, a, false, errno
}

// stubAttr is a node's attributes as clients see them: a striped file's size is its logical
// size, and its blocks what its stripes hold at most.
func (v *volume) stubAttr(fd int, st *unix.Stat_t) proto.Attr {
	a := toAttr(st)
	if v.striped && st.Mode&syscall.S_IFMT == syscall.S_IFREG {
		if l, ok := readLayout(fd); ok && l.ID != 0 {
			a.Size = l.Length
			a.Blocks = (l.Length + 511) / 512
		}
	}
	return a
}

// attrAt is stubAttr of dirfd/name, a node just stat'ed as st.
func (v *volume) attrAt(dirfd int, name string, st *unix.Stat_t) proto.Attr {
	a := toAttr(st)
	if !v.striped || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return a
	}
	if l, ok := readLayoutAt(dirfd, name); ok && l.ID != 0 {
		a.Size = l.Length
		a.Blocks = (l.Length + 511) / 512
	}
	return a
}

// stubOf is the layout of a striped file's stub open as t.
func (v *volume) stubOf(t *target) (stripe.Layout, bool) {
	if !v.striped || !t.regular() {
		return stripe.Layout{}, false
	}
	l, ok := readLayout(t.fd)
	return l, ok && l.ID != 0
}

// setLength changes a stub's logical size: to size, or (atLeast) to size if larger. Stripe
// objects are the client's business; the stub's own size stays 0. It returns the logical size
// it left.
func (v *volume) setLength(t *target, size uint64, atLeast bool) (uint64, syscall.Errno) {
	if v.maxFileSize > 0 && size > uint64(v.maxFileSize) || size > 1<<62 {
		return 0, syscall.EFBIG
	}
	in := v.inodes.get(keyOf(&t.st))
	defer v.inodes.put(in)
	in.sizeMu.Lock()
	defer in.sizeMu.Unlock()
	l, rec, ok := readStub(t.fd)
	if !ok {
		return 0, syscall.EIO
	}
	if atLeast {
		v.acct.sizeReported(size)
	}
	if atLeast && l.Length >= size || l.Length == size {
		return l.Length, 0
	}
	l.Length = size
	if !atLeast && in.stubWriters == 0 {
		rec = nil // a truncate by name, not through a writer's handle: objects may follow
	}
	return size, writeStub(t.fd, l, rec)
}

// removedLayout is the layout of the regular file dirfd/name if it is a striped stub, and
// where its objects are if that is known. in is its inode, locked (prepareRemoval), or nil.
func (v *volume) removedLayout(dirfd int, name string, in *inode) proto.RemovedReply {
	if !v.striped {
		return proto.RemovedReply{}
	}
	l, rec, ok := readStubAt(dirfd, name)
	if !ok || l.ID == 0 {
		return proto.RemovedReply{}
	}
	rep := proto.RemovedReply{Layout: l.Encode()}
	if in != nil && in.stubWriters > 0 {
		return rep // being written: anywhere
	}
	if set, known := decodeObjects(rec); known {
		rep.ObjectsKnown, rep.Objects = true, set
	}
	return rep
}

// The record of a stub's objects follows its layout in its attribute (LayoutXattr): which
// servers hold the file's objects, so that removing it asks only those. It is a byte 0
// (known) or 1 (unknown: being written, or a writer left without saying), then a bit per
// server in layout order. A stub without one (a new one, one an older version wrote, one
// adopted from another shard, one whose layout was set again) is unknown: its objects are
// looked for on every server. A handle opened for writing (truncates and fallocate write
// through one too) makes it unknown until the file's last writer closes; each writer's
// RELEASE says where it made objects (proto.HandleReq.Objects), and if every writer said,
// the record is known again: the union of what they said and what it was. In the same
// attribute as the layout, it takes no room of its own: a second attribute would not fit in
// the inode of some file systems (ext4's 256 bytes) and take a block per file.

func decodeObjects(rec []byte) (set []byte, known bool) {
	if len(rec) == 0 || rec[0] != 0 {
		return nil, false
	}
	return append([]byte{}, rec[1:]...), true
}

// recordFor is the record of the objects of a file just made and opened with flags: none,
// known, unless it is opened for writing.
func recordFor(flags uint32) []byte {
	if writes(flags) || flags&unix.O_TRUNC != 0 {
		return nil
	}
	return objectsRecord(nil, true)
}

func objectsRecord(set []byte, known bool) []byte {
	rec := make([]byte, 1, 1+len(set))
	if !known {
		rec[0] = 1
	}
	return append(rec, set...)
}

// writerOpened notes a handle of a striped stub opened for writing: the record of its
// objects is unknown from now on (on disk first, so that it stays so if this server or the
// writer stops), until its last writer closes (writerClosed). created says the stub was
// just made (it has no objects and no record, which reads as unknown already).
func (v *volume) writerOpened(h *handle, created bool) syscall.Errno {
	in := h.in
	in.sizeMu.Lock()
	defer in.sizeMu.Unlock()
	if in.stubWriters == 0 {
		if created {
			in.stubObjects, in.stubUnknown = nil, false
		} else {
			l, rec, ok := readStub(h.fd)
			if !ok {
				return syscall.EIO
			}
			var known bool
			in.stubObjects, known = decodeObjects(rec)
			in.stubUnknown = !known
			if known {
				if errno := writeStub(h.fd, l, objectsRecord(in.stubObjects, false)); errno != 0 {
					return errno
				}
			}
		}
	}
	in.stubWriters++
	h.stubWriter = true
	return 0
}

// writerClosed is writerOpened's close (closeFile, holding the inode's sizeMu): the last
// writer records the objects as known if every writer said where its objects are.
func (v *volume) writerClosed(h *handle) {
	in := h.in
	in.stubWriters--
	if h.reported {
		for i, b := range h.objects {
			if i >= len(in.stubObjects) {
				in.stubObjects = append(in.stubObjects, 0)
			}
			in.stubObjects[i] |= b
		}
	} else {
		in.stubUnknown = true // a writer whose connection ended, or of an older version
	}
	if in.stubWriters > 0 {
		return
	}
	if !in.stubUnknown {
		if l, _, ok := readStub(h.fd); ok && len(in.stubObjects) <= proto.MaxObjects {
			writeStub(h.fd, l, objectsRecord(in.stubObjects, true)) // if it fails, it stays unknown
		}
	}
	in.stubObjects, in.stubUnknown = nil, false
}

// reported notes what a RELEASE said of the servers its handle made objects on.
func (h *handle) noteReported(objects []byte) {
	if h.in == nil {
		return
	}
	h.in.sizeMu.Lock()
	h.reported, h.objects = true, append([]byte(nil), objects...)
	h.in.sizeMu.Unlock()
}

// inheritLayout gives a new directory its parent's default layout.
func (v *volume) inheritLayout(parentFd, dirfd int, name string) {
	if !v.striped {
		return
	}
	l, ok := readLayout(parentFd)
	if !ok {
		return
	}
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	writeLayout(fd, l)
}

// layoutXattr answers the striping attributes: users read and set user.spillway.layout, and
// never see the server's own. handled is false for every other attribute.
// The cache's attributes (cachepolicy.go) are not a scratch instance's: EOPNOTSUPP, so that
// libdatawarp's cache calls fail clearly rather than store an attribute.
func (v *volume) layoutXattr(op proto.Op, r *proto.XattrReq, t *target) (rep proto.XattrReply, errno syscall.Errno, handled bool) {
	if cacheXattr(r.Name) {
		return rep, syscall.EOPNOTSUPP, true
	}
	if hiddenXattr(r.Name) {
		if op == proto.OpGetxattr {
			return rep, syscall.ENODATA, true
		}
		return rep, syscall.EPERM, true
	}
	if r.Name != UserLayoutXattr {
		return rep, 0, false
	}
	if !v.striped {
		rep, errno = v.keptLayout(op, r, t)
		return rep, errno, true
	}
	dir := t.st.Mode&syscall.S_IFMT == syscall.S_IFDIR
	if !dir && !t.regular() {
		return rep, syscall.ENODATA, true
	}
	l, ok := readLayout(t.fd)
	if !ok {
		if !dir {
			return rep, syscall.ENODATA, true // an unstriped file (staged in by an older version)
		}
		l = v.rootLayout
	}
	switch op {
	case proto.OpGetxattr:
		text := []byte(l.Text())
		rep.Size = uint32(len(text))
		if r.Size > 0 {
			if int(r.Size) < len(text) {
				return proto.XattrReply{}, syscall.ERANGE, true
			}
			rep.Data = text
		}
		return rep, 0, true
	case proto.OpSetxattr:
		if v.readOnly {
			return rep, syscall.EROFS, true
		}
		next, err := stripe.ParseText(string(r.Value), l)
		if err != nil {
			return rep, syscall.EINVAL, true
		}
		if dir {
			next.ID, next.Length = 0, 0
			if strings.Contains(string(r.Value), "start=") {
				next.ID = stripe.FixedStart // every new file starts there
			} else {
				next.Start = 0
			}
			return rep, writeLayout(t.fd, next), true
		}
		// A file's layout is fixed once it holds data: its objects are laid out by it.
		in := v.inodes.get(keyOf(&t.st))
		defer v.inodes.put(in)
		in.sizeMu.Lock()
		defer in.sizeMu.Unlock()
		if cur, ok := readLayout(t.fd); !ok || cur.Length > 0 {
			return rep, syscall.EEXIST, true
		}
		next.ID, next.Length = newFileID(), 0
		if !strings.Contains(string(r.Value), "start=") {
			next.Start = uint32(next.ID % uint64(next.Servers))
		}
		return rep, writeLayout(t.fd, next), true
	default: // remove
		return rep, syscall.EPERM, true
	}
}

// KeptXattr holds the stripe configuration a user set on a file or directory of a namespace
// on one server (dw_set_stripe_configuration, user.spillway.layout): one server holds all
// of every file, so nothing is laid out by it, but it is kept and read back as DataWarp
// kept it (issue 23 item 10; docs/decisions.md). Its width can only be 1. It is in the user
// namespace, hidden from clients as the server's trusted ones are: a server that is not root
// (a home run by a user) can keep it too.
const KeptXattr = "user.spillway.stripe"

// hiddenXattr says whether name is one of the server's own attributes.
func hiddenXattr(name string) bool {
	return strings.HasPrefix(name, hiddenXattrPrefix) || name == KeptXattr
}

// keptLayout answers user.spillway.layout in a namespace on one server: the configuration
// kept (ENODATA: none set, the instance's default), set on a directory (the default of the
// files created in it afterwards, not of its subdirectories) or an empty file.
func (v *volume) keptLayout(op proto.Op, r *proto.XattrReq, t *target) (rep proto.XattrReply, errno syscall.Errno) {
	dir := t.st.Mode&syscall.S_IFMT == syscall.S_IFDIR
	if !dir && !t.regular() {
		return rep, syscall.ENODATA
	}
	switch op {
	case proto.OpGetxattr:
		var buf [128]byte
		n, err := unix.Getxattr(procPath(t.fd), KeptXattr, buf[:])
		if err != nil {
			return rep, errnoOf(err)
		}
		rep.Size = uint32(n)
		if r.Size > 0 {
			if int(r.Size) < n {
				return proto.XattrReply{}, syscall.ERANGE
			}
			rep.Data = append([]byte(nil), buf[:n]...)
		}
		return rep, 0
	case proto.OpSetxattr:
		if v.readOnly {
			return rep, syscall.EROFS
		}
		l, err := stripe.ParseText(string(r.Value), stripe.Layout{Size: stripe.DefaultSize, Width: 1, Servers: 1})
		if err != nil {
			return rep, syscall.EINVAL // a width above 1: the instance has one server
		}
		if !dir && t.st.Size > 0 {
			return rep, syscall.EEXIST // a file's is set while it is empty, as a striped file's
		}
		return rep, errnoOf(unix.Setxattr(procPath(t.fd), KeptXattr, []byte(l.Text()), 0))
	default: // remove
		return rep, syscall.EPERM
	}
}

// inheritKept gives a file just created in a namespace on one server its directory's kept
// stripe configuration, if it has one.
func inheritKept(fd, dirfd int) {
	var buf [128]byte
	n, err := unix.Getxattr(procPath(dirfd), KeptXattr, buf[:])
	if err != nil {
		return
	}
	unix.Setxattr(procPath(fd), KeptXattr, buf[:n], 0)
}

// hideXattrs drops the server's own attributes from a listing.
func hideXattrs(list []byte) []byte {
	out := list[:0]
	for _, name := range strings.SplitAfter(string(list), "\x00") {
		if name != "" && !hiddenXattr(strings.TrimSuffix(name, "\x00")) {
			out = append(out, name...)
		}
	}
	return out
}

// adoptTempPrefix starts the temporary name under which adopt makes an entry whole before it
// gets its name.
const adoptTempPrefix = ".spillway-adopt-"

// adopt makes r.Dir/r.Name the entry another shard of a sharded namespace (max_mds) held
// under another name: a stub with the same layout (so the same stripe objects: the data does
// not move), a symbolic link, a FIFO or a socket, with the owner, mode and times given. It is
// built under a temporary name and renamed into place, so no client sees it unfinished;
// like RENAME, it returns the layout of a striped file it replaced.
func (v *volume) adopt(r *proto.AdoptReq) (proto.RemovedReply, syscall.Errno) {
	if v.readOnly {
		return proto.RemovedReply{}, syscall.EROFS
	}
	if errno := nameErrno(r.Name); errno != 0 {
		return proto.RemovedReply{}, errno
	}
	if r.Flags&^unix.RENAME_NOREPLACE != 0 {
		return proto.RemovedReply{}, syscall.EINVAL
	}
	dirfd, done, errno := v.dirAt(r.Dir)
	if errno != 0 {
		return proto.RemovedReply{}, errno
	}
	defer done()
	var b [8]byte
	rand.Read(b[:])
	tmp := adoptTempPrefix + hex.EncodeToString(b[:])
	mode := r.Mode & 0o7777
	switch r.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		l, err := stripe.Decode(r.Layout)
		if !v.striped || err != nil || l.ID == 0 {
			return proto.RemovedReply{}, syscall.EINVAL
		}
		fd, err := unix.Openat(dirfd, ".", unix.O_RDWR|unix.O_TMPFILE|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return proto.RemovedReply{}, errnoOf(err)
		}
		defer unix.Close(fd)
		if errno := writeLayout(fd, l); errno != 0 {
			return proto.RemovedReply{}, errno
		}
		if v.asRoot {
			if err := unix.Fchown(fd, int(r.UID), int(r.GID)); err != nil {
				return proto.RemovedReply{}, errnoOf(err)
			}
		}
		if err := unix.Fchmod(fd, mode); err != nil { // after chown, which drops set-id bits
			return proto.RemovedReply{}, errnoOf(err)
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(fd), adoptTimes(r), 0); err != nil {
			return proto.RemovedReply{}, errnoOf(err)
		}
		if err := unix.Linkat(fd, "", dirfd, tmp, unix.AT_EMPTY_PATH); err != nil {
			return proto.RemovedReply{}, errnoOf(err)
		}
	case syscall.S_IFLNK:
		if r.Target == "" {
			return proto.RemovedReply{}, syscall.EINVAL
		}
		if err := unix.Symlinkat(r.Target, dirfd, tmp); err != nil {
			return proto.RemovedReply{}, errnoOf(err)
		}
	case syscall.S_IFIFO, syscall.S_IFSOCK, syscall.S_IFBLK, syscall.S_IFCHR:
		// Device nodes as MKNOD makes them (the mount is nodev: they never open as devices).
		if err := unix.Mknodat(dirfd, tmp, r.Mode&syscall.S_IFMT|mode, int(r.Rdev)); err != nil {
			return proto.RemovedReply{}, errnoOf(err)
		}
	default:
		return proto.RemovedReply{}, syscall.EINVAL
	}
	fail := func(err error) (proto.RemovedReply, syscall.Errno) {
		unix.Unlinkat(dirfd, tmp, 0)
		return proto.RemovedReply{}, errnoOf(err)
	}
	if r.Mode&syscall.S_IFMT != syscall.S_IFREG {
		// Owner, mode and times through a descriptor of the entry made, never by its name: a
		// user of the directory may have put a link of theirs under the temporary name.
		fd, err := unix.Openat(dirfd, tmp, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(err)
		}
		defer unix.Close(fd)
		t := &target{fd: fd}
		if err := unix.Fstat(fd, &t.st); err != nil {
			return fail(err)
		}
		if t.st.Mode&syscall.S_IFMT != r.Mode&syscall.S_IFMT {
			return fail(syscall.EAGAIN) // not what was made: leave it alone
		}
		if v.asRoot {
			if err := unix.Fchownat(fd, "", int(r.UID), int(r.GID), unix.AT_EMPTY_PATH); err != nil {
				return fail(err)
			}
		}
		if !t.link() { // a link's mode and own times are of no use to anyone
			if err := v.chmod(t, mode); err != nil {
				return fail(err)
			}
			if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(fd), adoptTimes(r), 0); err != nil {
				return fail(err)
			}
		}
	}
	var rm removal
	replacing := false
	if r.Flags&unix.RENAME_NOREPLACE == 0 {
		rm, replacing = v.prepareRemoval(dirfd, r.Name)
	}
	var layout proto.RemovedReply
	if replacing && rm.regular {
		layout = v.removedLayout(dirfd, r.Name, rm.in)
	}
	err := unix.Renameat2(dirfd, tmp, dirfd, r.Name, uint(r.Flags))
	if replacing {
		v.finish(rm, err == nil)
	}
	if err != nil {
		return fail(err)
	}
	v.chargeEntry(dirfd, r.Name) // the shard it left gives its footprint back as it unlinks it
	return layout, 0
}

func adoptTimes(r *proto.AdoptReq) []unix.Timespec {
	return []unix.Timespec{{Sec: r.Atime.Sec, Nsec: int64(r.Atime.Nsec)}, {Sec: r.Mtime.Sec, Nsec: int64(r.Mtime.Nsec)}}
}
