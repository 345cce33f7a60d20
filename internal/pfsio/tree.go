package pfsio

import (
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// tree answers requests on one PFS root with the credentials of the process it runs in (the
// worker, or a caller that already is the user). Nothing here is privileged: the rules below
// keep a Spillway process inside the root whatever the user does to names meanwhile.
//
//   - A path is cleaned and checked before any call: absolute paths, ".." and NUL are EINVAL.
//   - Its directories are opened beneath the root's descriptor with openat2(RESOLVE_BENEATH |
//     RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) as O_PATH (search permission only, as a
//     path walk needs): a symbolic link anywhere among them is ELOOP, an escape EXDEV, both
//     atomically in the kernel, whatever is renamed or exchanged meanwhile.
//   - The last component is never followed: fstatat, fchownat, utimensat with
//     AT_SYMLINK_NOFOLLOW, readlinkat, unlinkat, renameat2, linkat without AT_SYMLINK_FOLLOW;
//     open goes through an O_PATH|O_NOFOLLOW descriptor of the entry itself (open.go); chmod
//     and the extended attributes through /proc/self/fd/N of such a descriptor, which names
//     that very inode (a symbolic link there: chmod EOPNOTSUPP, as fchmodat2 answers, and the
//     kernel's own refusal of user.* attributes on links).
type tree struct {
	rootFd int // O_PATH|O_DIRECTORY, opened as the user

	mu      sync.Mutex
	next    uint64
	handles map[uint64]*handle
	// callerCopies: an opened file's reply carries a copy of its descriptor, the caller's
	// own (in-process); a worker sends the handle's descriptor itself (SCM_RIGHTS copies it).
	callerCopies bool
	active       int  // requests being served
	closed       bool // close was called: the descriptors go when the last request ends
}

// handle is a file or directory open in the tree. Its descriptor is closed once it is closed
// and no request uses it any more: a number closed under a running pwrite could be reused by
// another open meanwhile, and the write land there.
type handle struct {
	fd     int
	dir    *dirReader // a directory being listed
	users  int        // requests using fd (under tree.mu)
	closed bool
}

func openTree(root string) (*tree, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	// O_PATH needs no permission on the root itself: looking "." up from it checks that the
	// user may enter it (search permission), so a root they cannot enter is EACCES here.
	check, err := unix.Openat(fd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	unix.Close(check)
	return &tree{rootFd: fd, handles: map[uint64]*handle{}}, nil
}

// realRoot is where the root is, every link of the path it was opened by resolved.
func (t *tree) realRoot() string {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlink(procPath(t.rootFd), buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// close closes the tree's descriptors once no request uses them (a number closed under a
// running *at call could be reused by another open and resolve there).
func (t *tree) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.active == 0 {
		t.closeAll()
	}
}

func (t *tree) closeAll() {
	for id, h := range t.handles {
		unix.Close(h.fd)
		delete(t.handles, id)
	}
	unix.Close(t.rootFd)
	t.rootFd = -1
}

// procPath names a descriptor so that a path-based call reaches its inode without resolving
// any name of the tree.
func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// maxPath bounds a request's path (PATH_MAX).
const maxPath = unix.PathMax

// cleanPath checks p and returns it cleaned ("" for the root): relative, no "..", no NUL;
// "." and empty components are dropped.
func cleanPath(p string) (string, syscall.Errno) {
	if len(p) > maxPath {
		return "", unix.ENAMETOOLONG
	}
	if strings.HasPrefix(p, "/") || strings.IndexByte(p, 0) >= 0 {
		return "", unix.EINVAL
	}
	var parts []string
	for part := range strings.SplitSeq(p, "/") {
		switch {
		case part == "" || part == ".":
		case part == "..":
			return "", unix.EINVAL
		case len(part) > 255:
			return "", unix.ENAMETOOLONG
		default:
			parts = append(parts, part)
		}
	}
	return strings.Join(parts, "/"), 0
}

// beneath resolves a request's directories: inside the root, no symbolic link followed.
var beneath = unix.OpenHow{
	Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
	Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
}

// maxResolveRetries bounds the retries of one openat2 the kernel asked to repeat (EAGAIN: a
// rename somewhere on the system during a RESOLVE_BENEATH walk).
const maxResolveRetries = 16

// openBeneath opens the clean relative path p beneath the root with how.
func (t *tree) openBeneath(p string, how unix.OpenHow) (int, syscall.Errno) {
	for attempt := 0; ; attempt++ {
		h := how
		fd, err := unix.Openat2(t.rootFd, p, &h)
		if err == unix.EAGAIN && attempt < maxResolveRetries {
			continue
		}
		if err != nil {
			return -1, errnoOf(err)
		}
		return fd, 0
	}
}

// entry opens the parent directory of path and returns it with the last component; for the
// root itself name is "" and dirfd the root. done closes what was opened.
func (t *tree) entry(path string) (dirfd int, name string, done func(), errno syscall.Errno) {
	p, errno := cleanPath(path)
	if errno != 0 {
		return -1, "", nil, errno
	}
	if p == "" {
		return t.rootFd, "", func() {}, 0
	}
	dir, name := "", p
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		dir, name = p[:i], p[i+1:]
	}
	if dir == "" {
		return t.rootFd, name, func() {}, 0
	}
	fd, errno := t.openBeneath(dir, beneath)
	if errno != 0 {
		return -1, "", nil, errno
	}
	return fd, name, func() { unix.Close(fd) }, 0
}

// node opens the entry at path itself, never following it (O_PATH|O_NOFOLLOW: a symbolic
// link is opened as the link). done closes it.
func (t *tree) node(path string) (fd int, done func(), errno syscall.Errno) {
	dirfd, name, doneDir, errno := t.entry(path)
	if errno != 0 {
		return -1, nil, errno
	}
	defer doneDir()
	if name == "" {
		return t.rootFd, func() {}, 0
	}
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, errnoOf(err)
	}
	return fd, func() { unix.Close(fd) }, 0
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if errno, ok := err.(syscall.Errno); ok {
		return errno
	}
	return unix.EIO
}

// retry calls fn again while a signal interrupts it.
func retry(fn func() error) error {
	err := fn()
	for err == unix.EINTR {
		err = fn()
	}
	return err
}

// serve answers one request.
func (t *tree) serve(req *request) *reply {
	r := &reply{ID: req.ID, fd: -1}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		if req.dataFd >= 0 {
			unix.Close(req.dataFd)
		}
		r.Errno = int32(ErrClosed)
		return r
	}
	t.active++
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.active--
		if t.closed && t.active == 0 {
			t.closeAll()
		}
		t.mu.Unlock()
	}()
	r.Errno = int32(t.do(req, r))
	return r
}

func (t *tree) do(req *request, r *reply) syscall.Errno {
	switch req.Op {
	case opLstat:
		dirfd, name, done, errno := t.entry(req.Path)
		if errno != 0 {
			return errno
		}
		defer done()
		if name == "" {
			return errnoOf(unix.Fstat(dirfd, &r.Stat))
		}
		return errnoOf(unix.Fstatat(dirfd, name, &r.Stat, unix.AT_SYMLINK_NOFOLLOW))
	case opReadlink:
		dirfd, name, done, errno := t.entry(req.Path)
		if errno != 0 {
			return errno
		}
		defer done()
		if name == "" {
			return unix.EINVAL
		}
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return errnoOf(err)
		}
		r.Text = string(buf[:n])
		return 0
	case opOpenDir:
		return t.openDir(req, r)
	case opReadDir:
		return t.readDir(req, r)
	case opOpen:
		return t.open(req, r)
	case opWrite:
		return t.write(req, r)
	case opSync, opTruncate, opAllocate, opClose:
		return t.onHandle(req, r)
	case opMkdir:
		return t.atParent(req.Path, func(dirfd int, name string) error { return t.mkdirAt(dirfd, name, req.Mode&0o7777) })
	case opRmdir:
		return t.atParent(req.Path, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR) })
	case opUnlink:
		return t.atParent(req.Path, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, 0) })
	case opSymlink:
		if strings.IndexByte(req.Name, 0) >= 0 {
			return unix.EINVAL
		}
		return t.atParent(req.Path, func(dirfd int, name string) error { return unix.Symlinkat(req.Name, dirfd, name) })
	case opRename, opLink:
		return t.twoEntries(req)
	case opChmod:
		if req.Mode&^0o7777 != 0 {
			return unix.EINVAL
		}
		fd, done, errno := t.node(req.Path)
		if errno != 0 {
			return errno
		}
		defer done()
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return errnoOf(err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return unix.EOPNOTSUPP // a link's mode means nothing; fchmodat2 answers so
		}
		return errnoOf(retry(func() error { return unix.Chmod(procPath(fd), req.Mode) }))
	case opChown:
		dirfd, name, done, errno := t.entry(req.Path)
		if errno != 0 {
			return errno
		}
		defer done()
		if name == "" {
			return errnoOf(unix.Fchownat(dirfd, "", int(req.UID), int(req.GID), unix.AT_EMPTY_PATH))
		}
		return errnoOf(unix.Fchownat(dirfd, name, int(req.UID), int(req.GID), unix.AT_SYMLINK_NOFOLLOW))
	case opUtimens:
		dirfd, name, done, errno := t.entry(req.Path)
		if errno != 0 {
			return errno
		}
		defer done()
		ts := []unix.Timespec{req.Times[0], req.Times[1]}
		if name == "" {
			return errnoOf(unix.UtimesNanoAt(unix.AT_FDCWD, procPath(dirfd), ts, 0))
		}
		return errnoOf(unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW))
	case opStatfs:
		return errnoOf(retry(func() error { return unix.Fstatfs(t.rootFd, &r.Statfs) }))
	case opGetxattr, opSetxattr, opListxattr, opRemovexattr:
		return t.xattr(req, r)
	}
	return unix.ENOSYS
}

// atParent runs fn on the parent directory of path and its last component (never the root).
func (t *tree) atParent(path string, fn func(dirfd int, name string) error) syscall.Errno {
	dirfd, name, done, errno := t.entry(path)
	if errno != 0 {
		return errno
	}
	defer done()
	if name == "" {
		return unix.EBUSY // the root itself is not removed, renamed or made
	}
	return errnoOf(fn(dirfd, name))
}

// twoEntries is rename and link: both parents beneath the root, neither last component
// followed (linkat without AT_SYMLINK_FOLLOW links a symbolic link itself).
func (t *tree) twoEntries(req *request) syscall.Errno {
	fromDir, fromName, doneFrom, errno := t.entry(req.Path)
	if errno != 0 {
		return errno
	}
	defer doneFrom()
	toDir, toName, doneTo, errno := t.entry(req.Path2)
	if errno != 0 {
		return errno
	}
	defer doneTo()
	if fromName == "" || toName == "" {
		return unix.EBUSY
	}
	if req.Op == opLink {
		return errnoOf(unix.Linkat(fromDir, fromName, toDir, toName, 0))
	}
	const known = unix.RENAME_NOREPLACE | unix.RENAME_EXCHANGE | unix.RENAME_WHITEOUT
	if req.Flags&^known != 0 {
		return unix.EINVAL
	}
	return errnoOf(unix.Renameat2(fromDir, fromName, toDir, toName, uint(req.Flags)))
}

// xattr reads and changes extended attributes of the user.* namespace only (the others are
// the system's: trusted.*, security.*, system.* ACLs are set with chmod-like tools the cache
// does not offer), on the entry itself through its O_PATH descriptor.
func (t *tree) xattr(req *request, r *reply) syscall.Errno {
	if req.Op != opListxattr && (!strings.HasPrefix(req.Name, "user.") || len(req.Name) > xattrNameMax || strings.IndexByte(req.Name, 0) >= 0) {
		return unix.EOPNOTSUPP
	}
	if len(req.Value) > xattrSizeMax {
		return unix.E2BIG
	}
	fd, done, errno := t.node(req.Path)
	if errno != 0 {
		return errno
	}
	defer done()
	path := procPath(fd) // the magic link names the inode itself, a link included
	switch req.Op {
	case opGetxattr:
		buf := make([]byte, xattrSizeMax)
		var n int
		err := retry(func() (err error) { n, err = unix.Getxattr(path, req.Name, buf); return })
		if err != nil {
			return errnoOf(err)
		}
		r.Value = buf[:n]
	case opSetxattr:
		if req.Flags&^(unix.XATTR_CREATE|unix.XATTR_REPLACE) != 0 {
			return unix.EINVAL
		}
		return errnoOf(retry(func() error { return unix.Setxattr(path, req.Name, req.Value, int(req.Flags)) }))
	case opRemovexattr:
		return errnoOf(retry(func() error { return unix.Removexattr(path, req.Name) }))
	case opListxattr:
		buf := make([]byte, xattrListMax)
		var n int
		err := retry(func() (err error) { n, err = unix.Listxattr(path, buf); return })
		if err != nil {
			return errnoOf(err)
		}
		for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
			if strings.HasPrefix(name, "user.") {
				r.Names = append(r.Names, name)
			}
		}
	}
	return 0
}

// addHandle keeps fd open under a new handle id.
func (t *tree) addHandle(h *handle) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	t.handles[t.next] = h
	return t.next
}

// acquire returns the open handle id for one request, which must release it.
func (t *tree) acquire(id uint64) *handle {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.handles[id]
	if h != nil {
		h.users++
	}
	return h
}

func (t *tree) release(h *handle) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h.users--
	if h.closed && h.users == 0 {
		unix.Close(h.fd)
	}
}

// closeHandle forgets the handle id; its descriptor goes when no request uses it.
func (t *tree) closeHandle(id uint64) syscall.Errno {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.handles[id]
	if h == nil {
		return unix.EBADF
	}
	delete(t.handles, id)
	h.closed = true
	if h.users == 0 {
		return errnoOf(unix.Close(h.fd))
	}
	return 0
}

// onHandle is fsync, ftruncate, fallocate and close of an open file: as the user, so that
// what they allocate is charged to the user's quota with the user's limits.
func (t *tree) onHandle(req *request, r *reply) syscall.Errno {
	if req.Op == opClose {
		return t.closeHandle(req.Handle)
	}
	h := t.acquire(req.Handle)
	if h == nil {
		return unix.EBADF
	}
	defer t.release(h)
	if h.dir != nil {
		return unix.EBADF
	}
	switch req.Op {
	case opSync:
		if req.Flags != 0 {
			return errnoOf(retry(func() error { return unix.Fdatasync(h.fd) }))
		}
		return errnoOf(retry(func() error { return unix.Fsync(h.fd) }))
	case opTruncate:
		return errnoOf(retry(func() error { return unix.Ftruncate(h.fd, req.Size) }))
	case opAllocate:
		return errnoOf(retry(func() error { return unix.Fallocate(h.fd, uint32(req.Mode), req.Off, req.Size) }))
	}
	return unix.ENOSYS
}

// The kernel's limits on extended attributes (linux/limits.h).
const (
	xattrNameMax = 255
	xattrSizeMax = 64 << 10
	xattrListMax = 64 << 10
)
