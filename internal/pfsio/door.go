package pfsio

import (
	"errors"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Options bound a door.
type Options struct {
	// MaxInFlight (pfs.max_in_flight) is how many requests may be in flight at once, to the
	// worker and in it: a request past it waits for a slot (within its timeout). A request
	// that timed out holds its slot until the PFS answers it, so a hung PFS takes at most
	// MaxInFlight threads of the worker, and the door stays bounded.
	MaxInFlight int
	// RequestTimeout (pfs.request_timeout) bounds one request, waiting for a slot included:
	// past it the caller gets ETIMEDOUT, whatever the PFS does.
	RequestTimeout time.Duration
}

// Defaults of Options (and of the configuration keys pfs.max_in_flight, pfs.request_timeout).
const (
	DefaultMaxInFlight    = 16
	DefaultRequestTimeout = 2 * time.Minute
)

func (o Options) withDefaults() Options {
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = DefaultMaxInFlight
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	return o
}

// ErrClosed is the errno of a request to a door that was closed or whose worker is gone.
const ErrClosed = unix.ENOTCONN

// Door is the way to one PFS directory (its root) with one user's credentials. Paths are
// relative to the root ("" or "." is the root), cleaned; absolute paths and ".." are EINVAL.
// Every error is an *fs.PathError holding the real errno (errors.Is(err, unix.EACCES)), or
// ETIMEDOUT (RequestTimeout passed) or ENOTCONN (ErrClosed: the door was closed, its worker
// died). Methods are safe for concurrent use.
type Door struct {
	opts     Options
	root     string // the root as it was named
	realRoot string // every link of it resolved, as the user's process found it
	slots    chan struct{}
	backend  backend

	closeOnce sync.Once
	closed    chan struct{}
}

// backend carries a request to the tree and back: in this process (local) or to a worker.
type backend interface {
	roundTrip(req *request) *reply
	close() error
	pid() int
	gone() <-chan struct{} // closed when it can serve no more (a worker that died)
}

// Open opens the door in this process, for a caller that already runs with the user's
// credentials (a one-machine home runs as the user): no worker, the same rules.
func Open(root string, opts Options) (*Door, error) {
	t, err := openTree(root)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: root, Err: err}
	}
	t.callerCopies = true
	return newDoor(root, t.realRoot(), opts, &local{tree: t}), nil
}

func newDoor(root, realRoot string, opts Options, b backend) *Door {
	opts = opts.withDefaults()
	return &Door{opts: opts, root: root, realRoot: realRoot, slots: make(chan struct{}, opts.MaxInFlight), backend: b, closed: make(chan struct{})}
}

// Root is the root's path with every symbolic link resolved, as the user's process found it
// when the door opened: what a check of the site's allowed PFS directories must look at.
func (d *Door) Root() string { return d.realRoot }

// Gone is closed once the door can serve nothing more: it was closed, or its worker died
// (requests then end with ENOTCONN; a new door must be started).
func (d *Door) Gone() <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		select {
		case <-d.closed:
		case <-d.backend.gone():
		}
		close(gone)
	}()
	return gone
}

// Alive says, without waiting, whether the door can still serve (not closed, its worker
// not dead).
func (d *Door) Alive() bool {
	select {
	case <-d.closed:
		return false
	case <-d.backend.gone():
		return false
	default:
		return true
	}
}

// Pid is the worker's process id (0 in-process).
func (d *Door) Pid() int { return d.backend.pid() }

// Close closes the door: the worker (if any) exits, and requests still in flight end with
// ENOTCONN. Files opened through it stay usable for reading; their writes end with ENOTCONN.
func (d *Door) Close() error {
	var err error
	d.closeOnce.Do(func() {
		close(d.closed)
		err = d.backend.close()
	})
	return err
}

// call runs req within the door's bounds: a slot (at most MaxInFlight in flight), and
// RequestTimeout for the whole. On a timeout the request goes on without its caller and
// keeps its slot until it ends; dispose then cleans up what its reply holds.
func (d *Door) call(req *request) *reply {
	timer := time.NewTimer(d.opts.RequestTimeout)
	defer timer.Stop()
	select {
	case d.slots <- struct{}{}:
	case <-timer.C:
		return &reply{Errno: int32(unix.ETIMEDOUT), fd: -1}
	case <-d.closed:
		return &reply{Errno: int32(ErrClosed), fd: -1}
	}
	var mu sync.Mutex
	gaveUp := false
	done := make(chan *reply, 1)
	go func() {
		r := d.backend.roundTrip(req)
		<-d.slots
		mu.Lock()
		defer mu.Unlock()
		if gaveUp {
			d.dispose(req, r)
			return
		}
		done <- r
	}()
	select {
	case r := <-done:
		return r
	case <-timer.C:
	case <-d.closed:
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-done: // it came as the time ran out
		return r
	default:
	}
	gaveUp = true
	select {
	case <-d.closed:
		return &reply{Errno: int32(ErrClosed), fd: -1}
	default:
		return &reply{Errno: int32(unix.ETIMEDOUT), fd: -1}
	}
}

// dispose releases what a reply nobody waits for holds: an open file's descriptor and handle,
// a directory's handle.
func (d *Door) dispose(req *request, r *reply) {
	if r.fd >= 0 {
		unix.Close(r.fd)
	}
	if r.Errno == 0 && (req.Op == opOpen || req.Op == opOpenDir) {
		go d.backend.roundTrip(&request{Op: opClose, Handle: r.Handle, dataFd: -1})
	}
}

// do runs req and turns its errno into an error naming the operation and path.
func (d *Door) do(req *request) (*reply, error) {
	req.dataFd = -1
	if errno := tooLarge(req); errno != 0 {
		return &reply{fd: -1}, &fs.PathError{Op: req.Op.String(), Path: req.Path, Err: errno}
	}
	r := d.call(req)
	if r.fd >= 0 && req.Op != opOpen { // nothing else carries a descriptor
		unix.Close(r.fd)
		r.fd = -1
	}
	if r.Errno != 0 {
		return r, &fs.PathError{Op: req.Op.String(), Path: req.Path, Err: syscall.Errno(r.Errno)}
	}
	return r, nil
}

// tooLarge refuses what no request may carry, so that every message fits (maxMessage).
func tooLarge(req *request) syscall.Errno {
	switch {
	case len(req.Path) > maxPath || len(req.Path2) > maxPath || len(req.Name) > maxPath:
		return unix.ENAMETOOLONG
	case len(req.Value) > xattrSizeMax:
		return unix.E2BIG
	}
	return 0
}

// Lstat returns the attributes of the entry at path; a symbolic link is described, not
// followed.
func (d *Door) Lstat(path string) (unix.Stat_t, error) {
	r, err := d.do(&request{Op: opLstat, Path: path})
	return r.Stat, err
}

// Readlink returns the target of the symbolic link at path (EINVAL: not a link).
func (d *Door) Readlink(path string) (string, error) {
	r, err := d.do(&request{Op: opReadlink, Path: path})
	return r.Text, err
}

// ReadDir lists the directory at path, calling fn with each batch of entries (at most 128,
// names with their lstat attributes, "." and ".." left out) until the end or fn's error,
// which it returns. Each batch is one request (its own timeout).
func (d *Door) ReadDir(path string, fn func([]Entry) error) error {
	r, err := d.do(&request{Op: opOpenDir, Path: path})
	if err != nil {
		return err
	}
	handle := r.Handle
	defer d.do(&request{Op: opClose, Handle: handle, Path: path})
	for {
		r, err := d.do(&request{Op: opReadDir, Handle: handle, Path: path})
		if err != nil {
			return err
		}
		if len(r.Entries) > 0 {
			if err := fn(r.Entries); err != nil {
				return err
			}
		}
		if r.EOF {
			return nil
		}
	}
}

// OpenFile opens the regular file at path as the user (flags: O_RDONLY, O_WRONLY or O_RDWR,
// with O_CREAT, O_EXCL, O_TRUNC, O_SYNC, O_DSYNC, O_DIRECT, O_NOATIME; mode for a new file,
// as given, whatever the umask: a worker's is 0, and an in-process door sets back the bits
// its process's umask cut, umask.go; a directory's default ACL applies as always). The last
// component is never followed: a symbolic link is ELOOP, a directory EISDIR, a FIFO, socket or
// device ENXIO.
func (d *Door) OpenFile(path string, flags int, mode uint32) (*File, error) {
	r, err := d.do(&request{Op: opOpen, Path: path, Flags: int64(flags), Mode: mode})
	if err != nil {
		return nil, err
	}
	return &File{door: d, path: path, handle: r.Handle, fd: os.NewFile(uintptr(r.fd), path), Stat: r.Stat}, nil
}

// Mkdir makes the directory path with mode (as given: see OpenFile on the umask).
func (d *Door) Mkdir(path string, mode uint32) error {
	_, err := d.do(&request{Op: opMkdir, Path: path, Mode: mode})
	return err
}

// Rmdir removes the empty directory path.
func (d *Door) Rmdir(path string) error {
	_, err := d.do(&request{Op: opRmdir, Path: path})
	return err
}

// Unlink removes the name path (not a directory).
func (d *Door) Unlink(path string) error {
	_, err := d.do(&request{Op: opUnlink, Path: path})
	return err
}

// Rename renames from to to with renameat2's flags (0, unix.RENAME_NOREPLACE,
// unix.RENAME_EXCHANGE, unix.RENAME_WHITEOUT).
func (d *Door) Rename(from, to string, flags uint) error {
	_, err := d.do(&request{Op: opRename, Path: from, Path2: to, Flags: int64(flags)})
	return err
}

// Symlink makes path a symbolic link to target (which is the user's text, never followed
// here).
func (d *Door) Symlink(target, path string) error {
	_, err := d.do(&request{Op: opSymlink, Path: path, Name: target})
	return err
}

// Link makes to a new name of from (a symbolic link is linked itself, not its target).
func (d *Door) Link(from, to string) error {
	_, err := d.do(&request{Op: opLink, Path: from, Path2: to})
	return err
}

// Chmod sets the permission bits of path (not following it: a symbolic link is EOPNOTSUPP).
func (d *Door) Chmod(path string, mode uint32) error {
	_, err := d.do(&request{Op: opChmod, Path: path, Mode: mode})
	return err
}

// Chown sets the owner and group of path (-1 leaves one), not following it, as the PFS lets
// the user.
func (d *Door) Chown(path string, uid, gid int) error {
	_, err := d.do(&request{Op: opChown, Path: path, UID: int64(uid), GID: int64(gid)})
	return err
}

// Utimens sets the access and modification times of path, not following it (a Timespec with
// Nsec unix.UTIME_OMIT leaves one, unix.UTIME_NOW takes the time now).
func (d *Door) Utimens(path string, atime, mtime unix.Timespec) error {
	_, err := d.do(&request{Op: opUtimens, Path: path, Times: [2]unix.Timespec{atime, mtime}})
	return err
}

// Statfs describes the file system of the root.
func (d *Door) Statfs() (unix.Statfs_t, error) {
	r, err := d.do(&request{Op: opStatfs})
	return r.Statfs, err
}

// Getxattr returns the value of the extended attribute name (user.* only: others are
// EOPNOTSUPP) of path itself.
func (d *Door) Getxattr(path, name string) ([]byte, error) {
	r, err := d.do(&request{Op: opGetxattr, Path: path, Name: name})
	return r.Value, err
}

// Setxattr sets the extended attribute name (user.* only) of path itself; flags 0,
// unix.XATTR_CREATE or unix.XATTR_REPLACE.
func (d *Door) Setxattr(path, name string, value []byte, flags int) error {
	_, err := d.do(&request{Op: opSetxattr, Path: path, Name: name, Value: value, Flags: int64(flags)})
	return err
}

// Listxattr lists the user.* extended attributes of path itself.
func (d *Door) Listxattr(path string) ([]string, error) {
	r, err := d.do(&request{Op: opListxattr, Path: path})
	return r.Names, err
}

// Removexattr removes the extended attribute name (user.* only) of path itself.
func (d *Door) Removexattr(path, name string) error {
	_, err := d.do(&request{Op: opRemovexattr, Path: path, Name: name})
	return err
}

// File is a regular file of the PFS opened by the user's process. Reads are the caller's own,
// on the descriptor that process opened (a capability for that one file, in the mode it was
// opened: the kernel checked the user's permission then). Everything that writes or allocates
// — WriteAt, Truncate, Allocate — and Sync are done by the user's process, so that quotas,
// reserved blocks, RLIMIT_FSIZE and the clearing of set-id bits apply to the user exactly as on
// the PFS (a root writer would pass them all: CAP_SYS_RESOURCE, CAP_FSETID).
type File struct {
	door   *Door
	path   string
	handle uint64
	fd     *os.File // never written through: see above
	// Stat is the file's attributes when it was opened.
	Stat unix.Stat_t

	closeOnce sync.Once
}

// ReadAt reads at off (pread on the user's descriptor; EBADF if it was opened write-only).
func (f *File) ReadAt(p []byte, off int64) (int, error) { return f.fd.ReadAt(p, off) }

// Fstat returns the file's attributes now.
func (f *File) Fstat() (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstat(int(f.fd.Fd()), &st)
	if err != nil {
		return st, &fs.PathError{Op: "fstat", Path: f.path, Err: err}
	}
	return st, nil
}

// WriteAt writes p at off as the user (up to 64 MiB at once); it returns how many bytes were
// written and the errno that stopped it (ENOSPC, EDQUOT, EFBIG...).
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	if len(p) > maxWrite {
		return 0, &fs.PathError{Op: "pwrite", Path: f.path, Err: unix.EINVAL}
	}
	r, err := f.door.do(&request{Op: opWrite, Path: f.path, Handle: f.handle, Off: off, Size: int64(len(p)), data: p})
	return int(r.N), err
}

// Sync is fsync as the user (dataOnly: fdatasync).
func (f *File) Sync(dataOnly bool) error {
	flags := int64(0)
	if dataOnly {
		flags = 1
	}
	_, err := f.door.do(&request{Op: opSync, Path: f.path, Handle: f.handle, Flags: flags})
	return err
}

// Truncate is ftruncate as the user.
func (f *File) Truncate(size int64) error {
	_, err := f.door.do(&request{Op: opTruncate, Path: f.path, Handle: f.handle, Size: size})
	return err
}

// Allocate is fallocate as the user (mode: 0 or unix.FALLOC_FL_* flags).
func (f *File) Allocate(mode uint32, off, length int64) error {
	_, err := f.door.do(&request{Op: opAllocate, Path: f.path, Handle: f.handle, Mode: mode, Off: off, Size: length})
	return err
}

// Close closes the file: the caller's descriptor and the user's process's.
func (f *File) Close() error {
	err := errors.New("already closed")
	f.closeOnce.Do(func() {
		f.fd.Close()
		_, err = f.door.do(&request{Op: opClose, Path: f.path, Handle: f.handle})
	})
	return err
}

// local is the in-process backend: the caller is the user.
type local struct{ tree *tree }

func (l *local) roundTrip(req *request) *reply { return l.tree.serve(req) }

func (l *local) close() error { l.tree.close(); return nil }
func (l *local) pid() int     { return 0 }

func (l *local) gone() <-chan struct{} { return nil } // only closing ends it
