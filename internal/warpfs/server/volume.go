package server

// The file operations on one namespace, confined to it, with the instance's capacity
// accounting. The server runs as root and the namespace belongs to users who may rename and
// replace its entries at any moment, so no path is ever resolved by name from outside: a
// request's directory is opened beneath the namespace root's descriptor with openat2
// (RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS: the kernel refuses "..", absolute paths and every
// symbolic link on the way, atomically), and its last component is handled with *at system
// calls relative to that directory, never following a symbolic link, or through a descriptor
// of the very entry (fchmod, ftruncate, /proc/self/fd of an O_PATH descriptor). A user who
// swaps a directory for a link between the kernel's lookup and the request gets ELOOP or
// ENOTDIR, never a file outside the namespace.
//
// Accounting: "used" is the sum of the footprints (usage.Footprint: the larger of apparent
// size and allocated bytes) of the namespace's regular files, directories and symbolic links.
// Every operation that can change what an entry takes on disk measures its footprint before
// and after (fstat) and settles the difference; growth is reserved before it is made (the
// worst case: for a write its end, for fallocate every block the range touches, KEEP_SIZE or
// not), a write that crosses the capacity writes what fits and the next fails with ENOSPC; a
// directory's growth is charged as entries are added, and a new entry is refused (ENOSPC)
// once the instance is full; a file unlinked while open keeps its space until its last
// handle closes. While a file has open handles the tracker's count of it is in.charged, so
// that what changed it behind the server's back (the kernel's own writes, XFS trimming the
// blocks it preallocated past the end at close) is settled too.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// volume is one session's view of a namespace.
type volume struct {
	rootFd      int // the namespace root, open for the session
	tracker     *usage.Tracker
	readOnly    bool
	maxFileSize int64 // DataWarp's MFS; 0 = no limit
	asRoot      bool  // the server runs as root: new entries are chowned to their creator
	inodes      *inodeTable
	noteFull    func(requested uint64)
	// striped: the namespace of a striped instance, whose regular files are stubs of stripe
	// objects (striped.go); rootLayout is the instance's default layout.
	striped    bool
	rootLayout stripe.Layout
	// objects: a directory of stripe objects (a session a mount opened for them), which
	// WRITE_NAME may write by name.
	objects bool
	// quota is the project whose hard limit, enforced by the backing file system, holds the
	// namespace (usage/quota.go); 0: none. statfs reports the lesser of its room and the
	// tracker's.
	quota uint32
	// fragmentFS is the device number of the fragment's own file system, whose size holds
	// the namespace to the fragment's capacity (the agent's "xfs-loop" fragments); 0: none.
	// statfs reports the lesser of its room and the tracker's.
	fragmentFS uint64
	// acct counts the session's requests and enforces the write window and MFC (limits.go).
	acct account
	// dirs are the directories the session used last, open (dircache.go).
	dirs dirCache
}

// useFragmentFS makes statfs report the room of the file system the namespace root is on,
// the fragment's own (device dev); it says why not when the root is on another.
func (v *volume) useFragmentFS(dev uint64) error {
	var st unix.Stat_t
	if err := unix.Fstat(v.rootFd, &st); err != nil {
		return err
	}
	if st.Dev != dev {
		return fmt.Errorf("the namespace root is on device %d:%d, not on the fragment's file system (%d:%d)",
			unix.Major(st.Dev), unix.Minor(st.Dev), unix.Major(dev), unix.Minor(dev))
	}
	v.fragmentFS = dev
	return nil
}

// useQuota makes statfs report project id's room too, when the namespace root is under that
// project's limit (usage.CheckProjectQuota); it says why not otherwise.
func (v *volume) useQuota(id uint32) error {
	if _, err := usage.CheckProjectQuota(v.rootFd, id); err != nil {
		return err
	}
	v.quota = id
	return nil
}

// openVolume opens the namespace root dir. dir itself is the agent's (the fragment's path under
// its storage root), so it is opened by name; nothing beneath it ever is.
func openVolume(dir string, t *usage.Tracker, inodes *inodeTable) (*volume, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	v := &volume{rootFd: fd, tracker: t, inodes: inodes,
		asRoot: os.Geteuid() == 0, noteFull: func(uint64) {}}
	v.rootLayout, v.striped = readLayout(fd)
	return v, nil
}

func (v *volume) close() {
	v.dirs.close()
	unix.Close(v.rootFd)
}

// errnoOf turns an error into the errno the client sees.
func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return syscall.EIO
}

// beneath is how every directory of a request is resolved: inside the namespace, with no
// symbolic link followed and no mount crossed.
var beneath = unix.OpenHow{
	Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
}

// nameErrno says whether name can be one component of a path: 0, ENAMETOOLONG for a name
// longer than a file system's (as the kernel answers), EINVAL for anything else that is not
// one clean component.
func nameErrno(name string) syscall.Errno {
	if len(name) > proto.MaxName {
		return syscall.ENAMETOOLONG
	}
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return syscall.EINVAL
	}
	return 0
}

// pathErrno says whether p is a clean relative path inside the namespace ("" = the root): 0,
// ENAMETOOLONG for a path or a component too long, EINVAL for anything else.
func pathErrno(p string) syscall.Errno {
	if p == "" {
		return 0
	}
	if len(p) > proto.MaxPath {
		return syscall.ENAMETOOLONG
	}
	for part := range strings.SplitSeq(p, "/") {
		if errno := nameErrno(part); errno != 0 {
			return errno
		}
	}
	return 0
}

// dirAt opens the directory at path, or takes it from the session's cache (dircache.go);
// done ends the caller's use of it.
func (v *volume) dirAt(path string) (fd int, done func(), errno syscall.Errno) {
	if path == "" {
		return v.rootFd, func() {}, 0
	}
	if d, done := v.dirs.get(path); d != nil {
		return d.fd, done, 0
	}
	if errno := pathErrno(path); errno != 0 {
		return -1, nil, errno
	}
	gen := dirGeneration.Load() // before the walk: a rename during it makes it stale
	fd, err := openBeneath(v.rootFd, path)
	if err != nil {
		return -1, nil, errnoOf(err)
	}
	return fd, v.dirs.put(path, fd, gen), 0
}

// openBeneath opens the directory path beneath dirfd (see beneath), retrying the kernel's
// EAGAIN (a concurrent rename anywhere on the system makes RESOLVE_BENEATH ask for a retry).
func openBeneath(dirfd int, path string) (int, error) {
	for attempt := 0; ; attempt++ {
		how := beneath
		fd, err := unix.Openat2(dirfd, path, &how)
		if err == unix.EAGAIN && attempt < maxResolveRetries {
			continue
		}
		if err == unix.EXDEV {
			err = unix.EACCES // ".." or an absolute path: pathErrno refuses these before
		}
		return fd, err
	}
}

// maxResolveRetries bounds the retries of one openat2 that the kernel asked to repeat.
const maxResolveRetries = 16

// entry opens the parent of path; name is its last component ("" for the root itself, whose
// "parent" is then the root's own descriptor).
func (v *volume) entry(path string) (dirfd int, name string, done func(), errno syscall.Errno) {
	if path == "" {
		return v.rootFd, "", func() {}, 0
	}
	if errno := pathErrno(path); errno != 0 {
		return -1, "", nil, errno
	}
	dir, name := "", path
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		dir, name = path[:i], path[i+1:]
	}
	dirfd, done, errno = v.dirAt(dir)
	return dirfd, name, done, errno
}

// target is a node opened for an operation on it: a real descriptor (an open handle, or the
// root), or an O_PATH descriptor of the entry itself.
type target struct {
	fd    int
	real  bool // fd may be read, written, fchmod'ed
	st    unix.Stat_t
	done  func()
	dirfd int // the parent, and the name in it, when opened by path ("" for the root/handles)
	name  string
}

func (t *target) link() bool    { return t.st.Mode&syscall.S_IFMT == syscall.S_IFLNK }
func (t *target) regular() bool { return t.st.Mode&syscall.S_IFMT == syscall.S_IFREG }

// procPath names a descriptor so that path-based calls (truncate, chmod, xattrs) reach its
// inode without resolving any name.
func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// open returns the node a request names: by handle when it has one, else by path.
func (v *volume) open(path string, h *handle) (*target, syscall.Errno) {
	t := &target{done: func() {}}
	if h != nil {
		t.fd, t.real = h.fd, true
	} else {
		dirfd, name, done, errno := v.entry(path)
		if errno != 0 {
			return nil, errno
		}
		if name == "" {
			t.fd, t.real, t.done = v.rootFd, true, done
		} else {
			fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				done()
				return nil, errnoOf(err)
			}
			t.fd, t.dirfd, t.name = fd, dirfd, name
			t.done = func() { unix.Close(fd); done() }
		}
	}
	if err := unix.Fstat(t.fd, &t.st); err != nil {
		t.done()
		return nil, errnoOf(err)
	}
	return t, 0
}

func toAttr(st *unix.Stat_t) proto.Attr {
	return proto.Attr{
		Ino: st.Ino, Size: uint64(st.Size), Blocks: uint64(st.Blocks),
		Atime: proto.Timespec{Sec: st.Atim.Sec, Nsec: uint32(st.Atim.Nsec)},
		Mtime: proto.Timespec{Sec: st.Mtim.Sec, Nsec: uint32(st.Mtim.Nsec)},
		Ctime: proto.Timespec{Sec: st.Ctim.Sec, Nsec: uint32(st.Ctim.Nsec)},
		Mode:  st.Mode, Nlink: uint32(st.Nlink), UID: st.Uid, GID: st.Gid, Rdev: uint32(st.Rdev),
		Blksize: uint32(st.Blksize),
	}
}

func keyOf(st *unix.Stat_t) inodeKey { return inodeKey{dev: st.Dev, ino: st.Ino} }

// lookup stats the entry at path without following a symbolic link.
func (v *volume) lookup(path string) (proto.Attr, syscall.Errno) {
	dirfd, name, done, errno := v.entry(path)
	if errno != 0 {
		return proto.Attr{}, errno
	}
	defer done()
	var st unix.Stat_t
	var err error
	if name == "" {
		err = unix.Fstat(dirfd, &st)
	} else {
		err = unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return proto.Attr{}, errnoOf(err)
	}
	if name == "" {
		return toAttr(&st), 0
	}
	return v.attrAt(dirfd, name, &st), 0
}

// dirAttr is the attributes of the directory at path, as a create or unlink in it just left
// them (nil when it cannot be stat'ed: the client then asks, as before).
func (v *volume) dirAttr(path string) *proto.Attr {
	dirfd, done, errno := v.dirAt(path)
	if errno != 0 {
		return nil
	}
	defer done()
	var st unix.Stat_t
	if unix.Fstat(dirfd, &st) != nil {
		return nil
	}
	a := toAttr(&st)
	return &a
}

func (v *volume) getattr(path string, h *handle) (proto.Attr, syscall.Errno) {
	if h == nil {
		return v.lookup(path)
	}
	var st unix.Stat_t
	if err := unix.Fstat(h.fd, &st); err != nil {
		return proto.Attr{}, errnoOf(err)
	}
	return v.stubAttr(h.fd, &st), 0
}

func (v *volume) chmod(t *target, mode uint32) error {
	if t.real {
		return unix.Fchmod(t.fd, mode)
	}
	return unix.Chmod(procPath(t.fd), mode)
}

// dropSetID clears the set-user-ID bit (and set-group-ID with group execute) of a file being
// changed by a caller other than root, as a local file system does; the kernel leaves it to
// the server (FUSE_HANDLE_KILLPRIV_V2), and the backing file system would not, since the
// server writes as root.
func (v *volume) dropSetID(t *target, mode, caller uint32, always bool) {
	if !v.asRoot {
		return
	}
	kill := mode & syscall.S_ISUID
	if mode&(syscall.S_ISGID|syscall.S_IXGRP) == syscall.S_ISGID|syscall.S_IXGRP {
		kill |= syscall.S_ISGID
	}
	if kill == 0 || (!always && caller == 0) {
		return
	}
	v.chmod(t, mode&0o7777&^kill)
}

// settle corrects the tracker once a change is done: reserved bytes were counted beforehand,
// the entry's footprint went from before to after.
func (v *volume) settle(reserved uint64, before, after uint64) {
	if after >= before {
		grew := after - before
		switch {
		case grew < reserved:
			v.tracker.Release(reserved - grew)
		case grew > reserved:
			v.tracker.Charge(grew - reserved)
		}
		return
	}
	v.tracker.Release(reserved + before - after)
}

// kernelWrites marks h as written by the kernel itself (FUSE passthrough: the writes never
// reach the server). The file's growth is charged whenever the server next changes or
// inspects it under in.sizeMu (catchUp), and at the handle's close.
func (v *volume) kernelWrites(h *handle) {
	if h.dir || h.kernelWrites {
		return
	}
	in := h.in
	in.sizeMu.Lock()
	defer in.sizeMu.Unlock()
	in.kernelWriters++
	h.kernelWrites = true
}

// catchUp charges (or gives back) what changed the file's footprint behind the server's back
// since the tracker last counted it — the kernel's own writes (FUSE passthrough), blocks the
// backing file system allocated or trimmed by itself — st being its state now; in.sizeMu is
// held exclusively. It does nothing for a file without open handles, whose count is settled
// by each operation alone.
func (v *volume) catchUp(in *inode, st *unix.Stat_t) {
	if !in.tracked {
		return
	}
	now := usage.Footprint(st)
	if now > in.charged {
		v.tracker.Charge(now - in.charged)
		if in.kernelWriters > 0 {
			v.acct.kernelWrote(now-in.charged, uint64(max(st.Size, 0)))
		}
	} else {
		v.tracker.Release(in.charged - now)
	}
	in.charged = now
}

// counted records that the tracker counts the file at footprint (after the server changed
// it); in.sizeMu is held exclusively.
func counted(in *inode, footprint uint64) {
	if in.tracked {
		in.charged = footprint
	}
}

func sizeOf(fd int) (int64, error) {
	var st unix.Stat_t
	err := unix.Fstat(fd, &st)
	return st.Size, err
}

// footprintOf is the footprint (usage.Footprint) of the file open as fd, and its state.
func footprintOf(fd int) (uint64, unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, st, err
	}
	return usage.Footprint(&st), st, nil
}

// truncate sets a regular file's size, reserving growth first.
func (v *volume) truncate(t *target, size uint64) syscall.Errno {
	if v.maxFileSize > 0 && size > uint64(v.maxFileSize) {
		return syscall.EFBIG
	}
	if size > 1<<62 {
		return syscall.EFBIG
	}
	in := v.inodes.get(keyOf(&t.st))
	defer v.inodes.put(in)
	in.sizeMu.Lock()
	defer in.sizeMu.Unlock()
	return v.measuredChange(in, t.fd, func(before uint64) uint64 {
		if size > before { // a longer file: its new length (its blocks stay)
			return size - before
		}
		return 0
	}, func() error { return unix.Truncate(procPath(t.fd), int64(size)) })
}

// measuredChange runs op on the file open as fd (inode in, whose sizeMu the caller holds
// exclusively) with the tracker charged for what op does to its footprint: worst(before)
// bytes are reserved first (ENOSPC when they do not fit), and the difference settled from
// fstat after; if that fails, what was reserved counts (never under-count).
func (v *volume) measuredChange(in *inode, fd int, worst func(before uint64) uint64, op func() error) syscall.Errno {
	before, st, err := footprintOf(fd)
	if err != nil {
		return errnoOf(err)
	}
	v.catchUp(in, &st)
	reserved := worst(before)
	if err := v.tracker.Reserve(reserved); err != nil {
		v.noteFull(reserved)
		return syscall.ENOSPC
	}
	err = op()
	after, _, serr := footprintOf(fd)
	if serr != nil {
		after = before + reserved
	}
	v.settle(reserved, before, after)
	counted(in, after)
	return errnoOf(err)
}

func (v *volume) setattr(r *proto.SetattrReq, h *handle, caller uint32) (proto.Attr, syscall.Errno) {
	if v.readOnly {
		return proto.Attr{}, syscall.EROFS
	}
	if r.Valid&proto.SetSync != 0 && h == nil {
		return proto.Attr{}, syscall.EINVAL // a path's descriptor (O_PATH) cannot be synced
	}
	t, errno := v.open(r.Path, h)
	if errno != 0 {
		return proto.Attr{}, errno
	}
	defer t.done()
	if r.Valid&proto.SetSize != 0 {
		if errno := v.acct.writable(); errno != 0 { // a size report (SetSizeAtLeast) records writes done
			return proto.Attr{}, errno
		}
	}
	length := int64(-1) // a stub's logical size as this request left it (-1: not changed)
	if r.Valid&(proto.SetSize|proto.SetSizeAtLeast) != 0 {
		switch {
		case t.st.Mode&syscall.S_IFMT == syscall.S_IFDIR:
			return proto.Attr{}, syscall.EISDIR
		case !t.regular():
			return proto.Attr{}, syscall.EINVAL
		}
		if _, stub := v.stubOf(t); stub {
			n, errno := v.setLength(t, r.Size, r.Valid&proto.SetSize == 0)
			if errno != 0 {
				return proto.Attr{}, errno
			}
			length = int64(n)
			if r.Valid&proto.SetSize != 0 && r.Valid&(proto.SetMtime|proto.SetMtimeNow) == 0 {
				r.Valid |= proto.SetMtimeNow // what truncate(2) does to a file's times
			}
		} else if r.Valid&proto.SetSize == 0 {
			return proto.Attr{}, syscall.EINVAL
		} else if errno := v.truncate(t, r.Size); errno != 0 {
			return proto.Attr{}, errno
		}
	}
	if r.Valid&proto.SetMode != 0 {
		if t.link() {
			return proto.Attr{}, syscall.EOPNOTSUPP
		}
		if err := v.chmod(t, r.Mode&0o7777); err != nil {
			return proto.Attr{}, errnoOf(err)
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
		if err := unix.Fchownat(t.fd, "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
			return proto.Attr{}, errnoOf(err)
		}
	}
	// A time "now" alone says to set it too: a striped file's size report asks for its mtime
	// so (SetSizeAtLeast|SetMtimeNow), the kernel's utimensat(UTIME_NOW) with both bits.
	if r.Valid&(proto.SetAtime|proto.SetMtime|proto.SetAtimeNow|proto.SetMtimeNow) != 0 {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		set := func(i int, valid, now uint32, t proto.Timespec) {
			switch {
			case r.Valid&now != 0:
				ts[i] = unix.Timespec{Nsec: unix.UTIME_NOW}
			case r.Valid&valid != 0:
				ts[i] = unix.Timespec{Sec: t.Sec, Nsec: int64(t.Nsec)}
			}
		}
		set(0, proto.SetAtime, proto.SetAtimeNow, r.Atime)
		set(1, proto.SetMtime, proto.SetMtimeNow, r.Mtime)
		var err error
		if t.link() {
			err = unix.UtimesNanoAt(t.dirfd, t.name, ts, unix.AT_SYMLINK_NOFOLLOW)
		} else if err = futimens(t.fd, ts); err == unix.EBADF { // an O_PATH descriptor
			err = unix.UtimesNanoAt(unix.AT_FDCWD, procPath(t.fd), ts, 0)
		}
		if err != nil {
			return proto.Attr{}, errnoOf(err)
		}
	}
	if r.Valid&proto.SetKillSUIDGID != 0 && r.Valid&proto.SetMode == 0 && t.regular() {
		var st unix.Stat_t
		if unix.Fstat(t.fd, &st) == nil {
			v.dropSetID(t, st.Mode, caller, true)
		}
	}
	if r.Valid&proto.SetSync != 0 {
		if err := unix.Fsync(t.fd); err != nil {
			return proto.Attr{}, errnoOf(err)
		}
	}
	var st unix.Stat_t
	if err := unix.Fstat(t.fd, &st); err != nil {
		return proto.Attr{}, errnoOf(err)
	}
	if length >= 0 { // stubAttr, from the size just set (a size report: no read of it again)
		a := toAttr(&st)
		a.Size, a.Blocks = uint64(length), (uint64(length)+511)/512
		return a, 0
	}
	return v.stubAttr(t.fd, &st), 0
}

// openFlags keeps the open(2) flags that mean something for a file the server opens on a
// client's behalf. O_APPEND is dropped (the kernel gives appends their offset), and so is
// everything about creation and name resolution, which the server decides.
func openFlags(flags uint32) int {
	const keep = unix.O_ACCMODE | unix.O_DIRECT | unix.O_SYNC | unix.O_DSYNC | unix.O_NOATIME | unix.O_LARGEFILE
	return int(flags)&keep | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY
}

func writes(flags uint32) bool { return flags&unix.O_ACCMODE != unix.O_RDONLY }

// newFile makes a handle of a regular file just opened, st its state just taken (fstat).
// While it is open the tracker's count of the file is kept in in.charged: from its footprint
// now, which the tracker counts already (a new file's was charged by its creator).
func (v *volume) newFile(fd int, flags uint32, st *unix.Stat_t, orphan bool) *handle {
	in := v.inodes.get(keyOf(st))
	in.sizeMu.Lock()
	if !in.tracked {
		// Its state now, under the lock: st may be older than another handle's last write
		// and close, which the tracker counted. Not an orphan's (a file made with no name,
		// O_TMPFILE): nobody else can open it, st is its state.
		if !orphan {
			var now unix.Stat_t
			if unix.Fstat(fd, &now) == nil {
				st = &now
			}
		}
		in.charged = usage.Footprint(st)
		in.tracked = true
	}
	in.mu.Lock()
	in.open++
	if orphan {
		in.orphan = true
	}
	in.mu.Unlock()
	in.sizeMu.Unlock()
	return &handle{fd: fd, flags: flags, in: in}
}

func (v *volume) openFile(path string, flags uint32) (*handle, proto.Attr, syscall.Errno) {
	if flags&unix.O_ACCMODE == unix.O_ACCMODE {
		return nil, proto.Attr{}, syscall.EINVAL
	}
	if writes(flags) || flags&unix.O_TRUNC != 0 {
		if v.readOnly {
			return nil, proto.Attr{}, syscall.EROFS
		}
		if errno := v.acct.writable(); errno != 0 {
			return nil, proto.Attr{}, errno
		}
	}
	dirfd, name, done, errno := v.entry(path)
	if errno != 0 {
		return nil, proto.Attr{}, errno
	}
	defer done()
	if name == "" {
		return nil, proto.Attr{}, syscall.EISDIR
	}
	fd, err := unix.Openat(dirfd, name, openFlags(flags), 0)
	if err != nil {
		return nil, proto.Attr{}, errnoOf(err)
	}
	return v.finishOpen(fd, flags, false, nil, 0, 0, 0, nil)
}

// finishOpen checks that fd is a regular file, takes ownership of a new one, applies O_TRUNC
// and returns the handle. layout is a striped file's layout when the caller has just written
// it (a stub it created), nil to read it.
func (v *volume) finishOpen(fd int, flags uint32, created bool, parent *unix.Stat_t, uid, gid, mode uint32, layout *stripe.Layout) (*handle, proto.Attr, syscall.Errno) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, proto.Attr{}, errnoOf(err)
	}
	return v.finishOpenStat(fd, &st, flags, created, parent, uid, gid, mode, layout)
}

// finishOpenStat is finishOpen of a descriptor the caller has just stat'ed as st.
func (v *volume) finishOpenStat(fd int, stp *unix.Stat_t, flags uint32, created bool, parent *unix.Stat_t, uid, gid, mode uint32, layout *stripe.Layout) (*handle, proto.Attr, syscall.Errno) {
	st := *stp
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
	case syscall.S_IFDIR:
		unix.Close(fd)
		return nil, proto.Attr{}, syscall.EISDIR
	default:
		unix.Close(fd)
		return nil, proto.Attr{}, syscall.ENXIO
	}
	t := &target{fd: fd, real: true, st: st, done: func() {}}
	if created {
		v.own(t, parent, uid, gid, mode)         // t.st is the file's state after it
		v.tracker.Charge(usage.Footprint(&t.st)) // what it takes already (attributes it inherited)
	}
	h := v.newFile(fd, flags, &t.st, false)
	var l stripe.Layout
	stub := layout != nil
	if stub {
		l = *layout
	} else {
		l, stub = v.stubOf(t)
	}
	changed := false
	if stub {
		// A writer first (its truncate is its own: the record of the objects stays).
		if writes(flags) || flags&unix.O_TRUNC != 0 {
			if errno := v.writerOpened(h, created || layout != nil); errno != 0 {
				v.closeFile(h)
				return nil, proto.Attr{}, errno
			}
		}
		// The client truncates the objects of a striped file opened with O_TRUNC.
		if !created && flags&unix.O_TRUNC != 0 && l.Length > 0 {
			if _, errno := v.setLength(t, 0, false); errno != 0 {
				v.closeFile(h)
				return nil, proto.Attr{}, errno
			}
			l.Length = 0
			h.truncated, changed = true, true
		}
		h.layout = l.Encode()
	} else if !created && flags&unix.O_TRUNC != 0 && t.st.Size > 0 {
		if errno := v.truncate(t, 0); errno != 0 {
			v.closeFile(h)
			return nil, proto.Attr{}, errno
		}
		changed = true
	}
	if changed {
		if err := unix.Fstat(fd, &t.st); err != nil {
			v.closeFile(h)
			return nil, proto.Attr{}, errnoOf(err)
		}
	}
	a := toAttr(&t.st)
	if stub { // stubAttr, from the layout at hand
		a.Size, a.Blocks = l.Length, (l.Length+511)/512
	}
	return h, a, 0
}

// own gives a new entry to its creator: the caller's uid, and the caller's gid or the
// directory's in a set-group-ID directory (whose new subdirectories inherit the bit); and the
// permission bits the caller asked for (the server's own umask must not apply). For anything
// but a symbolic link, t.st is the entry's state after it.
func (v *volume) own(t *target, parent *unix.Stat_t, uid, gid uint32, mode uint32) {
	if v.asRoot {
		g := gid
		if parent != nil && parent.Mode&syscall.S_ISGID != 0 {
			g = parent.Gid
		}
		unix.Fchownat(t.fd, "", int(uid), int(g), unix.AT_EMPTY_PATH)
	}
	if t.link() {
		return
	}
	want := mode & 0o7777
	if t.st.Mode&syscall.S_IFMT == syscall.S_IFDIR && parent != nil && parent.Mode&syscall.S_ISGID != 0 {
		want |= syscall.S_ISGID
	}
	if unix.Fstat(t.fd, &t.st) == nil && t.st.Mode&0o7777 != want {
		if v.chmod(t, want) == nil {
			unix.Fstat(t.fd, &t.st)
		}
	}
}

func (v *volume) create(r *proto.CreateReq, uid, gid uint32) (*handle, proto.Attr, syscall.Errno) {
	if v.readOnly {
		return nil, proto.Attr{}, syscall.EROFS
	}
	if errno := nameErrno(r.Name); errno != 0 {
		return nil, proto.Attr{}, errno
	}
	if r.Flags&unix.O_ACCMODE == unix.O_ACCMODE {
		return nil, proto.Attr{}, syscall.EINVAL
	}
	dirfd, done, errno := v.dirAt(r.Dir)
	if errno != 0 {
		return nil, proto.Attr{}, errno
	}
	defer done()
	var parent unix.Stat_t
	if err := unix.Fstat(dirfd, &parent); err != nil {
		return nil, proto.Attr{}, errnoOf(err)
	}
	base := openFlags(r.Flags)
	if errno := v.roomForEntry(); errno != 0 {
		// A full instance still opens an existing file, as O_CREAT allows.
		if r.Flags&unix.O_EXCL == 0 {
			if fd, err := unix.Openat(dirfd, r.Name, base, 0); err == nil {
				return v.finishOpen(fd, r.Flags, false, nil, 0, 0, 0, nil)
			}
		}
		return nil, proto.Attr{}, errno
	}
	if errno := v.acct.startCreate(); errno != 0 {
		// Past MFC (or the write window) an existing file still opens, as O_CREAT allows.
		if r.Flags&unix.O_EXCL == 0 && errno == syscall.EMFILE {
			if fd, err := unix.Openat(dirfd, r.Name, base, 0); err == nil {
				return v.finishOpen(fd, r.Flags, false, nil, 0, 0, 0, nil)
			}
		}
		return nil, proto.Attr{}, errno
	}
	if v.striped {
		h, a, created, errno := v.createStub(dirfd, &parent, r, uid, gid)
		v.acct.createDone(created)
		return h, a, errno
	}
	if v.objects {
		if h, a, created, errno, ok := v.createObject(dirfd, &parent, r, uid, gid); ok {
			v.acct.createDone(created)
			return h, a, errno
		}
	}
	created := true
	l := v.lockDirOf(dirfd, &parent)
	fd, err := unix.Openat(dirfd, r.Name, base|unix.O_CREAT|unix.O_EXCL, r.Mode&0o7777)
	dir := l.unlock()
	if errors.Is(err, syscall.EEXIST) && r.Flags&unix.O_EXCL == 0 {
		// Another client created it meanwhile: open it, and leave its owner alone.
		created = false
		fd, err = unix.Openat(dirfd, r.Name, base, 0)
	}
	v.acct.createDone(created && err == nil)
	if err != nil {
		return nil, proto.Attr{}, errnoOf(err)
	}
	if created {
		inheritKept(fd, dirfd) // its directory's kept stripe configuration (one server)
	}
	h, a, errno := v.finishOpen(fd, r.Flags, created, &parent, uid, gid, r.Mode, nil)
	if h != nil {
		h.dirAttr = dir
	}
	return h, a, errno
}

// tmpfile creates a file with no name (O_TMPFILE): its space is released when it is closed.
// createObject creates (or opens) a stripe object. A new one is made with no name
// (O_TMPFILE), tracked and charged, and only then linked in: the object's other writers (other
// nodes writing the same file, whose first writes create it too) cannot open and write it
// between its creation and its first charge, which would count their bytes twice. ok is false
// where the file system makes no such files: the caller creates it by name.
func (v *volume) createObject(dirfd int, parent *unix.Stat_t, r *proto.CreateReq, uid, gid uint32) (h *handle, a proto.Attr, created bool, errno syscall.Errno, ok bool) {
	base := openFlags(r.Flags)
	if r.Flags&unix.O_EXCL == 0 {
		if fd, err := unix.Openat(dirfd, r.Name, base, 0); err == nil { // most often, it is there
			h, a, errno = v.finishOpen(fd, r.Flags, false, nil, 0, 0, 0, nil)
			return h, a, false, errno, true
		}
	}
	if !writes(r.Flags) {
		return nil, proto.Attr{}, false, 0, false // O_TMPFILE needs a writable open
	}
	fd, err := unix.Openat(dirfd, ".", base&^(unix.O_NOFOLLOW|unix.O_CREAT|unix.O_EXCL|unix.O_TRUNC)|unix.O_TMPFILE, r.Mode&0o7777)
	if err != nil {
		return nil, proto.Attr{}, false, 0, false
	}
	t := &target{fd: fd, real: true, st: unix.Stat_t{Mode: syscall.S_IFREG}} // own stats it
	v.own(t, parent, uid, gid, r.Mode)
	v.tracker.Charge(usage.Footprint(&t.st)) // given back at its close if it is never linked (orphan)
	h = v.newFile(fd, r.Flags, &t.st, true)
	_, err = v.linkIn(fd, dirfd, parent, r.Name)
	if err == nil {
		h.in.mu.Lock()
		h.in.orphan = false
		h.in.mu.Unlock()
		return h, toAttr(&t.st), true, 0, true
	}
	v.closeFile(h)
	if !errors.Is(err, syscall.EEXIST) || r.Flags&unix.O_EXCL != 0 {
		return nil, proto.Attr{}, false, errnoOf(err), true
	}
	fd, err = unix.Openat(dirfd, r.Name, base, 0) // another writer made it meanwhile
	if err != nil {
		return nil, proto.Attr{}, false, errnoOf(err), true
	}
	h, a, errno = v.finishOpen(fd, r.Flags, false, nil, 0, 0, 0, nil)
	return h, a, false, errno, true
}

func (v *volume) tmpfile(r *proto.CreateReq, uid, gid uint32) (*handle, proto.Attr, syscall.Errno) {
	if v.readOnly {
		return nil, proto.Attr{}, syscall.EROFS
	}
	if !writes(r.Flags) || r.Flags&unix.O_ACCMODE == unix.O_ACCMODE {
		return nil, proto.Attr{}, syscall.EINVAL
	}
	dirfd, done, errno := v.dirAt(r.Dir)
	if errno != 0 {
		return nil, proto.Attr{}, errno
	}
	defer done()
	var parent unix.Stat_t
	if err := unix.Fstat(dirfd, &parent); err != nil {
		return nil, proto.Attr{}, errnoOf(err)
	}
	if errno := v.roomForEntry(); errno != 0 {
		return nil, proto.Attr{}, errno
	}
	if errno := v.acct.startCreate(); errno != 0 {
		return nil, proto.Attr{}, errno
	}
	fd, err := unix.Openat(dirfd, ".", openFlags(r.Flags)&^unix.O_NOFOLLOW|unix.O_TMPFILE, r.Mode&0o7777)
	v.acct.createDone(err == nil)
	if err != nil {
		return nil, proto.Attr{}, errnoOf(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, proto.Attr{}, errnoOf(err)
	}
	v.own(&target{fd: fd, real: true, st: st}, &parent, uid, gid, r.Mode)
	l, striped, errno := v.layoutFor(fd, dirfd, nil)
	if errno != 0 {
		unix.Close(fd)
		return nil, proto.Attr{}, errno
	}
	unix.Fstat(fd, &st)
	v.tracker.Charge(usage.Footprint(&st)) // given back at its close (newFile: orphan)
	h := v.newFile(fd, r.Flags, &st, true)
	if striped {
		h.layout = l.Encode()
	}
	return h, v.stubAttr(fd, &st), 0
}

// made finishes an entry mkdir, mknod or symlink created: owner, mode, attributes.
func (v *volume) made(dirfd int, name string, parent *unix.Stat_t, flags int, uid, gid, mode uint32) (proto.Attr, syscall.Errno) {
	fd, err := unix.Openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return proto.Attr{}, errnoOf(err)
	}
	defer unix.Close(fd)
	t := &target{fd: fd, real: flags&unix.O_PATH == 0}
	if err := unix.Fstat(fd, &t.st); err != nil {
		return proto.Attr{}, errnoOf(err)
	}
	v.own(t, parent, uid, gid, mode)
	if err := unix.Fstat(fd, &t.st); err != nil {
		return proto.Attr{}, errnoOf(err)
	}
	return toAttr(&t.st), 0
}

// newEntry opens the directory that gets a new entry, and stats it.
func (v *volume) newEntry(dir, name string) (dirfd int, parent *unix.Stat_t, done func(), errno syscall.Errno) {
	if v.readOnly {
		return -1, nil, nil, syscall.EROFS
	}
	if errno := v.acct.writable(); errno != 0 {
		return -1, nil, nil, errno
	}
	if errno := nameErrno(name); errno != 0 {
		return -1, nil, nil, errno
	}
	if errno := v.roomForEntry(); errno != 0 {
		return -1, nil, nil, errno
	}
	dirfd, done, errno = v.dirAt(dir)
	if errno != 0 {
		return -1, nil, nil, errno
	}
	parent = &unix.Stat_t{}
	if err := unix.Fstat(dirfd, parent); err != nil {
		done()
		return -1, nil, nil, errnoOf(err)
	}
	return dirfd, parent, done, 0
}

func (v *volume) mkdir(r *proto.MkdirReq, uid, gid uint32) (proto.Attr, syscall.Errno) {
	dirfd, parent, done, errno := v.newEntry(r.Dir, r.Name)
	if errno != 0 {
		return proto.Attr{}, errno
	}
	defer done()
	l := v.lockDir(dirfd)
	if err := unix.Mkdirat(dirfd, r.Name, r.Mode&0o7777); err != nil {
		l.unlock()
		return proto.Attr{}, errnoOf(err)
	}
	v.inheritLayout(dirfd, dirfd, r.Name)
	v.chargeEntry(dirfd, r.Name) // its first blocks, given back when it is removed
	l.unlock()
	return v.made(dirfd, r.Name, parent, unix.O_RDONLY|unix.O_DIRECTORY, uid, gid, r.Mode)
}

func (v *volume) mknod(r *proto.MkdirReq, uid, gid uint32) (proto.Attr, syscall.Errno) {
	dirfd, parent, done, errno := v.newEntry(r.Dir, r.Name)
	if errno != 0 {
		return proto.Attr{}, errno
	}
	defer done()
	switch r.Mode & syscall.S_IFMT {
	case syscall.S_IFREG, syscall.S_IFIFO, syscall.S_IFSOCK:
	case syscall.S_IFCHR, syscall.S_IFBLK:
		// The server creates as root: a device node needs CAP_MKNOD, which only root has
		// here, as on a local file system (else a user would own a node of the storage
		// node's disk, to be opened there by anything acting as them).
		if uid != 0 {
			return proto.Attr{}, syscall.EPERM
		}
	default:
		return proto.Attr{}, syscall.EINVAL
	}
	if errno := v.acct.admitFile(); errno != 0 {
		return proto.Attr{}, errno
	}
	l := v.lockDir(dirfd)
	err := unix.Mknodat(dirfd, r.Name, r.Mode, int(r.Rdev))
	l.unlock()
	v.acct.createDone(err == nil)
	if err != nil {
		return proto.Attr{}, errnoOf(err)
	}
	if r.Mode&syscall.S_IFMT == syscall.S_IFREG && v.striped {
		fd, err := unix.Openat(dirfd, r.Name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return proto.Attr{}, errnoOf(err)
		}
		_, _, errno := v.layoutFor(fd, dirfd, recordFor(0))
		unix.Close(fd)
		if errno != 0 {
			unix.Unlinkat(dirfd, r.Name, 0)
			return proto.Attr{}, errno
		}
	}
	v.chargeEntry(dirfd, r.Name)
	return v.made(dirfd, r.Name, parent, unix.O_PATH, uid, gid, r.Mode)
}

func (v *volume) symlink(r *proto.SymlinkReq, uid, gid uint32) (proto.Attr, syscall.Errno) {
	dirfd, parent, done, errno := v.newEntry(r.Dir, r.Name)
	if errno != 0 {
		return proto.Attr{}, errno
	}
	defer done()
	if r.Target == "" || strings.IndexByte(r.Target, 0) >= 0 {
		return proto.Attr{}, syscall.EINVAL
	}
	if errno := v.acct.admitFile(); errno != 0 {
		return proto.Attr{}, errno
	}
	l := v.lockDir(dirfd)
	err := unix.Symlinkat(r.Target, dirfd, r.Name)
	if err == nil {
		v.chargeEntry(dirfd, r.Name) // its target, or the block holding a long one
	}
	l.unlock()
	v.acct.createDone(err == nil)
	if err != nil {
		return proto.Attr{}, errnoOf(err)
	}
	return v.made(dirfd, r.Name, parent, unix.O_PATH, uid, gid, 0o777)
}

func (v *volume) link(r *proto.LinkReq) (proto.Attr, syscall.Errno) {
	dirfd, _, done, errno := v.newEntry(r.Dir, r.Name)
	if errno != 0 {
		return proto.Attr{}, errno
	}
	defer done()
	srcDir, srcName, srcDone, errno := v.entry(r.Path)
	if errno != 0 {
		return proto.Attr{}, errno
	}
	defer srcDone()
	if srcName == "" {
		return proto.Attr{}, syscall.EPERM // the root directory
	}
	if l, ok := readLayoutAt(srcDir, srcName); v.striped && ok && l.ID != 0 {
		// A striped file has one name: its objects go when that name does (docs/mounts.md).
		return proto.Attr{}, syscall.EPERM
	}
	l := v.lockDir(dirfd)
	err := unix.Linkat(srcDir, srcName, dirfd, r.Name, 0)
	l.unlock()
	if err != nil {
		return proto.Attr{}, errnoOf(err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, r.Name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return proto.Attr{}, errnoOf(err)
	}
	return v.attrAt(dirfd, r.Name, &st), 0
}

// removal is what dropping one name of a regular file or symbolic link gives back.
type removal struct {
	in      *inode
	size    uint64 // its footprint
	last    bool   // the name was the file's last link
	regular bool   // a regular file (else a symbolic link): it may have a striped layout
}

// prepareRemoval inspects the regular file or symbolic link about to lose dirfd/name and
// locks its inode against size changes; finish must follow when ok.
func (v *volume) prepareRemoval(dirfd int, name string) (removal, bool) {
	var st unix.Stat_t
	if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil ||
		st.Mode&syscall.S_IFMT != syscall.S_IFREG && st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		return removal{}, false
	}
	in := v.inodes.get(keyOf(&st))
	in.sizeMu.Lock()
	// Its size, now that nobody can change it.
	if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || keyOf(&st) != in.key {
		in.sizeMu.Unlock()
		v.inodes.put(in)
		return removal{}, false
	}
	v.catchUp(in, &st)
	return removal{in: in, size: usage.Footprint(&st), last: st.Nlink == 1, regular: st.Mode&syscall.S_IFMT == syscall.S_IFREG}, true
}

// finish releases the file's size if the name removed was its last link, or defers that to
// the last close while the file is still open.
func (v *volume) finish(r removal, removed bool) {
	defer v.inodes.put(r.in)
	defer r.in.sizeMu.Unlock()
	if !removed || !r.last {
		return
	}
	r.in.mu.Lock()
	open := r.in.open > 0
	if open {
		r.in.orphan = true
	}
	r.in.mu.Unlock()
	if !open {
		v.tracker.Release(r.size)
	}
}

// dirLock holds a directory against other changes of its entries through the server while
// one is made, and settles what the change did to the directory's footprint (its blocks grow
// as entries are added; some file systems shrink them as entries go).
type dirLock struct {
	v      *volume
	fd     int
	in     *inode
	before uint64
}

// lockDir locks the directory open as fd (nil if it cannot be stat'ed: the change then goes
// uncounted, as it would fail anyway).
func (v *volume) lockDir(fd int) *dirLock {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return nil
	}
	return v.lockDirOf(fd, &st)
}

// lockDirOf is lockDir of a directory the caller stat'ed already as st (only its identity
// is used: its footprint is taken again once it is locked).
func (v *volume) lockDirOf(fd int, st *unix.Stat_t) *dirLock {
	l := &dirLock{v: v, fd: fd, in: v.inodes.get(keyOf(st))}
	l.in.sizeMu.Lock()
	var now unix.Stat_t
	if unix.Fstat(fd, &now) == nil {
		l.before = usage.Footprint(&now)
	}
	return l
}

// unlock settles the directory's footprint and unlocks it. It returns the directory's
// attributes as the change left them (nil: not known), which a CREATE's or UNLINK's reply
// carries (the stat it takes anyway: no second one for the reply).
func (l *dirLock) unlock() *proto.Attr {
	if l == nil {
		return nil
	}
	var st unix.Stat_t
	var a *proto.Attr
	if unix.Fstat(l.fd, &st) == nil {
		l.v.settle(0, l.before, usage.Footprint(&st))
		at := toAttr(&st)
		a = &at
	}
	l.in.sizeMu.Unlock()
	l.v.inodes.put(l.in)
	return a
}

// lockDirs locks two directories (once if they are the same) in a fixed order; unlock in
// reverse.
func (v *volume) lockDirs(a, b int) (unlock func()) {
	var sa, sb unix.Stat_t
	if unix.Fstat(a, &sa) != nil || unix.Fstat(b, &sb) != nil || keyOf(&sa) == keyOf(&sb) {
		l := v.lockDir(a)
		return func() { l.unlock() }
	}
	ka, kb := keyOf(&sa), keyOf(&sb)
	if kb.dev < ka.dev || kb.dev == ka.dev && kb.ino < ka.ino {
		a, b = b, a
	}
	first := v.lockDir(a)
	second := v.lockDir(b)
	return func() { second.unlock(); first.unlock() }
}

// chargeEntry charges the footprint of the entry dirfd/name just created (a directory's
// first blocks, a long symbolic link's target, attributes inherited).
func (v *volume) chargeEntry(dirfd int, name string) {
	var st unix.Stat_t
	if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
		v.tracker.Charge(usage.Footprint(&st))
	}
}

// roomForEntry refuses a new entry once the instance is full (ENOSPC): it may take a block of
// its directory, and a full disk refuses it as well.
func (v *volume) roomForEntry() syscall.Errno {
	if v.tracker.Free() == 0 {
		v.noteFull(1)
		return syscall.ENOSPC
	}
	return 0
}

// removeDir removes the directory dirfd/name, releasing its footprint as it was when removed.
func (v *volume) removeDir(dirfd int, name string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	l := v.lockDir(dirfd)
	defer l.unlock()
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil {
		return err
	}
	namespaceChanged() // no cached descriptor may stand for its path any longer
	var st unix.Stat_t
	if unix.Fstat(fd, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		v.tracker.Release(usage.Footprint(&st))
	}
	return nil
}

// unlink removes a name; for a striped file it returns the layout, whose objects the client
// removes.
func (v *volume) unlink(r *proto.EntryReq, dir bool) (proto.RemovedReply, syscall.Errno) {
	if v.readOnly {
		return proto.RemovedReply{}, syscall.EROFS
	}
	if errno := nameErrno(r.Name); errno != 0 {
		return proto.RemovedReply{}, errno
	}
	dirfd, done, errno := v.dirAt(r.Dir)
	if errno != 0 {
		return proto.RemovedReply{}, errno
	}
	defer done()
	if dir {
		return proto.RemovedReply{}, errnoOf(v.removeDir(dirfd, r.Name))
	}
	rm, isFile := v.prepareRemoval(dirfd, r.Name)
	var layout proto.RemovedReply
	if isFile && rm.regular {
		layout = v.removedLayout(dirfd, r.Name, rm.in)
	}
	l := v.lockDir(dirfd)
	err := unix.Unlinkat(dirfd, r.Name, 0)
	layout.Dir = l.unlock()
	if isFile {
		v.finish(rm, err == nil)
	}
	if err != nil {
		return proto.RemovedReply{}, errnoOf(err)
	}
	return layout, 0
}

// rename moves a name; when it replaces a striped file, it returns that file's layout.
func (v *volume) rename(r *proto.RenameReq) (proto.RemovedReply, syscall.Errno) {
	if v.readOnly {
		return proto.RemovedReply{}, syscall.EROFS
	}
	if errno := nameErrno(r.Name); errno != 0 {
		return proto.RemovedReply{}, errno
	}
	if errno := nameErrno(r.NewName); errno != 0 {
		return proto.RemovedReply{}, errno
	}
	if r.Flags&^(unix.RENAME_EXCHANGE|unix.RENAME_NOREPLACE|unix.RENAME_WHITEOUT) != 0 {
		return proto.RemovedReply{}, syscall.EINVAL
	}
	olddir, doneOld, errno := v.dirAt(r.Dir)
	if errno != 0 {
		return proto.RemovedReply{}, errno
	}
	defer doneOld()
	newdir, doneNew, errno := v.dirAt(r.NewDir)
	if errno != 0 {
		return proto.RemovedReply{}, errno
	}
	defer doneNew()
	// A rename that replaces a regular file removes the replaced file's name.
	var rm removal
	replacing := false
	replacedDir := -1 // an O_PATH descriptor of an empty directory the rename may replace
	if r.Flags&(unix.RENAME_EXCHANGE|unix.RENAME_NOREPLACE) == 0 {
		var src unix.Stat_t
		srcErr := unix.Fstatat(olddir, r.Name, &src, unix.AT_SYMLINK_NOFOLLOW)
		var dst unix.Stat_t
		if unix.Fstatat(newdir, r.NewName, &dst, unix.AT_SYMLINK_NOFOLLOW) == nil &&
			(srcErr != nil || keyOf(&src) != keyOf(&dst)) {
			if dst.Mode&syscall.S_IFMT == syscall.S_IFDIR {
				if fd, err := unix.Openat(newdir, r.NewName, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
					replacedDir = fd
					defer unix.Close(fd)
				}
			} else {
				rm, replacing = v.prepareRemoval(newdir, r.NewName)
			}
		}
	}
	var layout proto.RemovedReply
	if replacing && rm.regular {
		layout = v.removedLayout(newdir, r.NewName, rm.in)
	}
	unlockDirs := v.lockDirs(olddir, newdir)
	err := unix.Renameat2(olddir, r.Name, newdir, r.NewName, uint(r.Flags))
	if err == nil {
		namespaceChanged() // a directory renamed (or replaced) is no longer under its path
	}
	if err == nil && replacedDir >= 0 {
		// The directory replaced is gone if it is no longer under its name.
		var gone, now unix.Stat_t
		if unix.Fstat(replacedDir, &gone) == nil &&
			(unix.Fstatat(newdir, r.NewName, &now, unix.AT_SYMLINK_NOFOLLOW) != nil || keyOf(&now) != keyOf(&gone)) && gone.Nlink == 0 {
			v.tracker.Release(usage.Footprint(&gone))
		}
	}
	unlockDirs()
	if replacing {
		v.finish(rm, err == nil)
	}
	if err != nil {
		return proto.RemovedReply{}, errnoOf(err)
	}
	return layout, 0
}

func (v *volume) readlink(path string) ([]byte, syscall.Errno) {
	dirfd, name, done, errno := v.entry(path)
	if errno != 0 {
		return nil, errno
	}
	defer done()
	if name == "" {
		return nil, syscall.EINVAL
	}
	buf := make([]byte, proto.MaxPath+1)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return nil, errnoOf(err)
	}
	if n > proto.MaxPath {
		return nil, syscall.ENAMETOOLONG
	}
	return buf[:n], 0
}

func (v *volume) opendir(path string) (*handle, syscall.Errno) {
	dirfd, name, done, errno := v.entry(path)
	if errno != 0 {
		return nil, errno
	}
	defer done()
	if name == "" {
		name = "."
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errnoOf(err)
	}
	return &handle{fd: fd, dir: true}, 0
}

// direntBufSize is how much of a directory one READDIR reads: its encoding stays under
// proto.MaxDirReply.
const direntBufSize = 32 << 10

func (v *volume) readdir(h *handle, offset uint64) (proto.ReaddirReply, syscall.Errno) {
	if !h.dir {
		return proto.ReaddirReply{}, syscall.ENOTDIR
	}
	h.dirMu.Lock()
	defer h.dirMu.Unlock()
	if offset != h.dirPos {
		if _, err := unix.Seek(h.fd, int64(offset), 0); err != nil {
			return proto.ReaddirReply{}, errnoOf(err)
		}
		h.dirPos = offset
	}
	buf := make([]byte, direntBufSize)
	n, err := unix.Getdents(h.fd, buf)
	if err != nil {
		return proto.ReaddirReply{}, errnoOf(err)
	}
	if n == 0 {
		return proto.ReaddirReply{EOF: true}, 0
	}
	var out proto.ReaddirReply
	for b := buf[:n]; len(b) >= 19; {
		// struct linux_dirent64 { u64 ino; s64 off; u16 reclen; u8 type; char name[]; }
		reclen := int(binary.NativeEndian.Uint16(b[16:]))
		if reclen < 19 || reclen > len(b) {
			break
		}
		name := b[19:reclen]
		if i := indexZero(name); i >= 0 {
			name = name[:i]
		}
		out.Entries = append(out.Entries, proto.Dirent{
			Ino: binary.NativeEndian.Uint64(b[0:]), Off: binary.NativeEndian.Uint64(b[8:]),
			Type: uint32(b[18]) << 12, Name: string(name),
		})
		b = b[reclen:]
	}
	if len(out.Entries) > 0 {
		h.dirPos = out.Entries[len(out.Entries)-1].Off
	}
	return out, 0
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

// write performs a write-like operation of length bytes at off through h, reserving growth
// first. A write that would cross the capacity is shortened to what fits (as a full disk
// does) and fails with ENOSPC when nothing fits.
func (v *volume) write(h *handle, length, off int64, caller uint32, do func(length int64) (int, error)) (int, syscall.Errno) {
	if v.readOnly {
		return 0, syscall.EROFS
	}
	if errno := v.acct.writable(); errno != 0 {
		return 0, errno
	}
	if h.dir || !writes(h.flags) {
		return 0, syscall.EBADF
	}
	if off < 0 {
		return 0, syscall.EINVAL
	}
	if length <= 0 {
		w, err := do(0)
		return max(w, 0), errnoOf(err)
	}
	if limit := v.maxFileSize; limit > 0 && off+length > limit {
		// Past the maximum file size: write what fits, then EFBIG (as RLIMIT_FSIZE does).
		if off >= limit {
			return 0, syscall.EFBIG
		}
		length = limit - off
	}
	end := off + length
	in := h.in
	t := &target{fd: h.fd, real: true}

	// Fast path: the write stays inside the file's footprint, which it then changes by a block
	// at most (its last one, filling a hole). Its size cannot change meanwhile.
	if h.grows {
		return v.grow(h, t, off, length, caller, do)
	}
	in.sizeMu.RLock()
	if err := unix.Fstat(h.fd, &t.st); err != nil {
		in.sizeMu.RUnlock()
		return 0, errnoOf(err)
	}
	if end <= t.st.Size {
		v.dropSetID(t, t.st.Mode, caller, false)
		w, err := do(length)
		var st unix.Stat_t
		moved := unix.Fstat(h.fd, &st) == nil && usage.Footprint(&st) != in.charged
		in.sizeMu.RUnlock()
		if moved {
			// A hole filled past what was counted (the tail of a sparse file): settle it,
			// and the kernel's own writes with it.
			in.sizeMu.Lock()
			if unix.Fstat(h.fd, &st) == nil {
				v.catchUp(in, &st)
			}
			in.sizeMu.Unlock()
		}
		return max(w, 0), errnoOf(err)
	}
	in.sizeMu.RUnlock()
	return v.grow(h, t, off, length, caller, do)
}

// grow is write's path for a write that may grow the file: under the exclusive lock, what it
// adds reserved first.
func (v *volume) grow(h *handle, t *target, off, length int64, caller uint32, do func(length int64) (int, error)) (int, syscall.Errno) {
	in := h.in
	end := off + length
	in.sizeMu.Lock()
	defer in.sizeMu.Unlock()
	if err := unix.Fstat(h.fd, &t.st); err != nil {
		return 0, errnoOf(err)
	}
	v.dropSetID(t, t.st.Mode, caller, false)
	v.catchUp(in, &t.st)
	before := usage.Footprint(&t.st) // at least the size; more with blocks past the end
	base := before                   // where the growth to reserve starts
	var growth uint64
	switch {
	case uint64(end) > before:
		growth = uint64(end) - before
	case v.tracker.Over():
		// Blocks past the end were charged after the fact (XFS's speculative preallocation)
		// and took the instance past its capacity: they hold no data, and filling them would
		// keep the instance past it. Its size grows only as a reservation allows.
		growth = uint64(end - t.st.Size)
		base = uint64(t.st.Size)
	}
	granted := v.tracker.ReserveUpTo(growth)
	if granted < growth {
		v.noteFull(growth)
		allowedEnd := int64(base + granted)
		if h.flags&unix.O_DIRECT != 0 {
			allowedEnd &^= directIOAlign - 1 // O_DIRECT needs aligned lengths
		}
		if allowedEnd <= off {
			v.tracker.Release(granted)
			return 0, syscall.ENOSPC
		}
		length = allowedEnd - off
	}
	w, err := do(length)
	after, _, serr := footprintOf(h.fd)
	if serr != nil {
		after = before + granted // count what we reserved: never under-count
	}
	v.settle(granted, before, after)
	counted(in, after)
	return max(w, 0), errnoOf(err)
}

// directIOAlign is the alignment O_DIRECT needs on the backing file system.
const directIOAlign = 4096

func (v *volume) fallocate(h *handle, off, size uint64, mode uint32, caller uint32) syscall.Errno {
	if v.readOnly {
		return syscall.EROFS
	}
	if errno := v.acct.writable(); errno != 0 {
		return errno
	}
	if h.dir || !writes(h.flags) {
		return syscall.EBADF
	}
	if off > 1<<62 || size > 1<<62 {
		return syscall.EFBIG
	}
	in := h.in
	in.sizeMu.Lock()
	defer in.sizeMu.Unlock()
	t := &target{fd: h.fd, real: true}
	if err := unix.Fstat(h.fd, &t.st); err != nil {
		return errnoOf(err)
	}
	v.catchUp(in, &t.st)
	v.dropSetID(t, t.st.Mode, caller, false)
	before := usage.Footprint(&t.st)
	// The worst case: every block the range touches allocated, past the end too
	// (FALLOC_FL_KEEP_SIZE allocates without growing the size; it counts all the same).
	worstAfter, allocEnd := usage.FallocateWorst(mode, off, size, t.st.Size, uint64(max(t.st.Blocks, 0))*512, uint64(max(t.st.Blksize, 0)))
	if limit := v.maxFileSize; limit > 0 && allocEnd > uint64(limit) {
		return syscall.EFBIG // MFS bounds what a file may allocate, past its end too
	}
	worst := worstAfter - before
	if err := v.tracker.Reserve(worst); err != nil {
		v.noteFull(worst)
		return syscall.ENOSPC
	}
	err := unix.Fallocate(h.fd, mode, int64(off), int64(size))
	after, _, serr := footprintOf(h.fd)
	if serr != nil {
		after = worstAfter
	}
	v.settle(worst, before, after)
	counted(in, after)
	return errnoOf(err)
}

// maxCopyChunk bounds one copy_file_range request (the kernel loops over short copies).
const maxCopyChunk = 1 << 30

func (v *volume) copyRange(in, out *handle, r *proto.CopyRangeReq, caller uint32) (int, syscall.Errno) {
	if in.dir || out.dir {
		return 0, syscall.EISDIR
	}
	if r.OffIn > 1<<62 || r.OffOut > 1<<62 {
		return 0, syscall.EINVAL
	}
	srcSize, err := sizeOf(in.fd)
	if err != nil {
		return 0, errnoOf(err)
	}
	if int64(r.OffIn) >= srcSize {
		return 0, 0
	}
	length := min(r.Length, uint64(srcSize)-r.OffIn, maxCopyChunk)
	return v.write(out, int64(length), int64(r.OffOut), caller, func(l int64) (int, error) {
		inOff, outOff := int64(r.OffIn), int64(r.OffOut)
		return unix.CopyFileRange(in.fd, &inOff, out.fd, &outOff, int(l), int(r.Flags))
	})
}

func (v *volume) statfs() (proto.StatfsReply, syscall.Errno) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(v.rootFd, &st); err != nil {
		return proto.StatfsReply{}, errnoOf(err)
	}
	const unit = statfsBlockSize
	free := v.tracker.Free()
	if v.quota != 0 {
		// The file system's count: it includes what the kernel wrote by itself, and it is
		// what refuses the next block.
		if used, limit, err := usage.ProjectUsage(v.rootFd, v.quota); err == nil && limit > 0 {
			free = min(free, limit-min(used, limit))
		}
	}
	if v.fragmentFS != 0 {
		// The fragment's own file system: what it offers is what the next block may take.
		free = min(free, st.Bavail*uint64(st.Bsize))
	}
	free /= unit
	return proto.StatfsReply{
		Blocks: v.tracker.Capacity() / unit, Bfree: free, Bavail: free,
		Files: st.Files, Ffree: st.Ffree, Bsize: unit, Frsize: unit, NameLen: uint32(st.Namelen),
	}, 0
}

// statfsBlockSize is the unit of the statfs block counts; 4 KiB keeps df exact for any
// capacity that is a multiple of 4 KiB (every pool granularity is).
const statfsBlockSize = 4096

// xattrTarget opens the node of an extended-attribute request. Symbolic links have none that
// users may touch.
func (v *volume) xattrTarget(path string, h *handle) (*target, string, syscall.Errno) {
	t, errno := v.open(path, h)
	if errno != 0 {
		return nil, "", errno
	}
	if t.link() {
		t.done()
		return nil, "", syscall.ENOTSUP
	}
	return t, procPath(t.fd), 0
}

func (v *volume) xattr(op proto.Op, r *proto.XattrReq, h *handle) (proto.XattrReply, syscall.Errno) {
	if (op == proto.OpSetxattr || op == proto.OpRemovexattr) && v.readOnly {
		return proto.XattrReply{}, syscall.EROFS
	}
	if op != proto.OpListxattr && (r.Name == "" || strings.IndexByte(r.Name, 0) >= 0) {
		return proto.XattrReply{}, syscall.EINVAL
	}
	t, p, errno := v.xattrTarget(r.Path, h)
	if errno != 0 {
		if errno == syscall.ENOTSUP && op == proto.OpListxattr {
			return proto.XattrReply{}, 0
		}
		if errno == syscall.ENOTSUP && op == proto.OpGetxattr {
			return proto.XattrReply{}, syscall.ENODATA
		}
		return proto.XattrReply{}, errno
	}
	defer t.done()
	if rep, errno, handled := v.layoutXattr(op, r, t); handled {
		return rep, errno
	}
	var buf []byte
	if r.Size > 0 {
		buf = make([]byte, min(r.Size, proto.MaxXattr))
	}
	var n int
	var err error
	switch op {
	case proto.OpGetxattr:
		n, err = unix.Getxattr(p, r.Name, buf)
	case proto.OpListxattr:
		n, err = unix.Listxattr(p, buf)
	case proto.OpSetxattr:
		// At worst the value, its name and a block more of the inode's attribute space.
		worst := uint64(len(r.Name)+len(r.Value)) + uint64(max(t.st.Blksize, 4096))
		return proto.XattrReply{}, v.changeXattr(t, worst, func() error { return unix.Setxattr(p, r.Name, r.Value, int(r.Flags)) })
	case proto.OpRemovexattr:
		return proto.XattrReply{}, v.changeXattr(t, 0, func() error { return unix.Removexattr(p, r.Name) })
	}
	if err != nil {
		return proto.XattrReply{}, errnoOf(err)
	}
	if r.Size == 0 {
		return proto.XattrReply{Size: uint32(n)}, 0
	}
	if op == proto.OpListxattr {
		buf = hideXattrs(buf[:n])
		n = len(buf)
	}
	return proto.XattrReply{Size: uint32(n), Data: buf[:n]}, 0
}

// changeXattr sets or removes an extended attribute of t by op, reserving worst bytes first
// and settling what the inode's footprint did: attributes that do not fit in the inode take
// blocks of their own, counted in its st_blocks.
func (v *volume) changeXattr(t *target, worst uint64, op func() error) syscall.Errno {
	in := v.inodes.get(keyOf(&t.st))
	defer v.inodes.put(in)
	in.sizeMu.Lock()
	defer in.sizeMu.Unlock()
	return v.measuredChange(in, t.fd, func(uint64) uint64 { return worst }, op)
}

// closeFile closes a file handle; the last close of a file whose names are all gone gives
// its space back.
func (v *volume) closeFile(h *handle) {
	if h.dir {
		unix.Close(h.fd)
		return
	}
	in := h.in
	in.sizeMu.Lock()
	if h.stubWriter {
		v.writerClosed(h)
	}
	var st unix.Stat_t
	if unix.Fstat(h.fd, &st) == nil {
		v.catchUp(in, &st)
	}
	if h.kernelWrites {
		in.kernelWriters--
	}
	in.mu.Lock()
	in.open--
	last := in.open == 0
	releaseSize := last && in.orphan
	if releaseSize {
		in.orphan = false
	}
	in.mu.Unlock()
	if releaseSize {
		v.tracker.Release(in.charged)
		in.charged = 0
		unix.Close(h.fd)
	} else if !h.kernelWrites && uint64(st.Blocks)*512 <= roundUp(uint64(max(st.Size, 0)), uint64(max(st.Blksize, 512))) {
		// No block past its end, which is all a close could trim (an empty file, a stub, a
		// small object written once).
		unix.Close(h.fd)
	} else {
		// The close itself may give blocks back: XFS trims what it preallocated past the end
		// of a file being extended when the file is closed. Settle them through a descriptor
		// that does not keep the file open for writing.
		p, perr := unix.Open(procPath(h.fd), unix.O_PATH|unix.O_CLOEXEC, 0)
		unix.Close(h.fd)
		if perr == nil {
			if unix.Fstat(p, &st) == nil {
				v.catchUp(in, &st)
			}
			unix.Close(p)
		}
	}
	if last {
		in.tracked = false
	}
	in.sizeMu.Unlock()
	v.inodes.put(in)
}

func roundUp(n, to uint64) uint64 { return (n + to - 1) / to * to }

// futimens sets the times of the file open as fd (utimensat with no path): through the
// descriptor, without a walk of /proc/self/fd. An O_PATH descriptor gets EBADF.
func futimens(fd int, ts []unix.Timespec) error {
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// inodeKey identifies a file on the storage node.
type inodeKey struct{ dev, ino uint64 }

// inode is what the server keeps about a file while anything uses it: the lock that orders
// its size changes, and its open handles (of every connection).
type inode struct {
	key  inodeKey
	refs int // guarded by the table's lock

	// sizeMu orders size changes of this file against writes: a write that stays inside the
	// current size holds it shared; anything that can change the size holds it exclusively.
	sizeMu sync.RWMutex

	// kernelWriters counts the handles the kernel writes through itself (FUSE passthrough).
	// While the file has open handles (tracked), charged is the footprint the tracker counts
	// it at. All three are guarded by sizeMu held exclusively (charged may be read shared).
	kernelWriters int
	tracked       bool
	charged       uint64

	mu     sync.Mutex // guards open and orphan; changes of open also hold sizeMu
	open   int        // handles open on it
	orphan bool       // the last link is gone while handles are open: release at last close

	// A striped file's stub: its handles open for writing, and what those closed so far
	// said of the servers they made objects on (striped.go, writerOpened). Guarded by sizeMu
	// held exclusively.
	stubWriters int
	stubUnknown bool   // a writer closed without saying, or the record was unknown already
	stubObjects []byte // a bit per server
}

// hostInodes is the inode table of this process: every server and in-process mount shares it,
// since they all serve files of the one host (an instance may have a local mount, remote
// mounts and the stage engine at once).
var hostInodes = newInodeTable()

// inodeTable holds the inodes in use, shared by all sessions of a process.
type inodeTable struct {
	mu sync.Mutex
	m  map[inodeKey]*inode
}

func newInodeTable() *inodeTable { return &inodeTable{m: map[inodeKey]*inode{}} }

func (t *inodeTable) get(k inodeKey) *inode {
	t.mu.Lock()
	defer t.mu.Unlock()
	in := t.m[k]
	if in == nil {
		in = &inode{key: k}
		t.m[k] = in
	}
	in.refs++
	return in
}

func (t *inodeTable) put(in *inode) {
	t.mu.Lock()
	defer t.mu.Unlock()
	in.refs--
	if in.refs == 0 {
		delete(t.m, in.key)
	}
}

func (t *inodeTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// handle is an open file or directory of a session.
type handle struct {
	id    uint64
	fd    int
	flags uint32
	in    *inode // files
	dir   bool

	dirMu  sync.Mutex
	dirPos uint64

	refs    int // guarded by the session's handle lock
	removed bool

	layout    []byte // a striped file's layout, for the open's reply
	truncated bool   // the open emptied the striped file (O_TRUNC)
	// dirAttr is the directory's attributes as the create that made the file left them,
	// for the CREATE's reply (nil: asked then).
	dirAttr *proto.Attr
	// grows: the handle's one write most likely grows the file (a stripe object a WRITE_NAME
	// creates, most often): it takes the path that may grow it at once, without the fast
	// path's look at the size first (which that path takes again). Only the request that
	// made the handle uses it.
	grows bool

	kernelWrites bool // the kernel writes through it itself (see volume.kernelWrites)

	cache *cacheHandle // a handle of a cache session (cachens.go): nothing else above is set but dir

	// A striped file's handle open for writing (stubWriter): its RELEASE said (reported)
	// which servers it made objects on (objects). Guarded by the inode's sizeMu.
	stubWriter bool
	reported   bool
	objects    []byte
}
