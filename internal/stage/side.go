package stage

import (
	"errors"
	"os"
	"path"
	"path/filepath"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// side is one end of a copy: the PFS (plain absolute paths) or one burst-buffer namespace
// (paths relative to an os.Root). Paths to directories are resolved by the side — following
// symbolic links, but on the burst-buffer side only those that stay inside the instance — and
// the last component of every path is then handled with *at system calls relative to the
// opened parent directory, where the stage decides whether a link is followed.
type side struct {
	dw       bool
	variable string   // burst-buffer side: the variable naming it, without "$"
	rootDir  string   // burst-buffer side: the namespace directory on this node
	root     *os.Root // burst-buffer side
}

func pfsSide() *side { return &side{} }

func openDWSide(variable, rootDir string) (*side, error) {
	root, err := os.OpenRoot(rootDir)
	if err != nil {
		return nil, err
	}
	return &side{dw: true, variable: variable, rootDir: rootDir, root: root}, nil
}

func (s *side) close() {
	if s.root != nil {
		s.root.Close()
	}
}

// display is how a path is shown to users: the burst-buffer side as the variable they wrote,
// since the namespace directory on the storage node means nothing to them.
func (s *side) display(name string) string {
	if !s.dw {
		return name
	}
	if name == "." {
		return "$" + s.variable + "/"
	}
	return "$" + s.variable + "/" + name
}

func (s *side) join(base, rel string) string {
	if rel == "" {
		return base
	}
	if s.dw {
		return path.Join(base, rel)
	}
	return filepath.Join(base, rel)
}

// split returns the directory holding name and name's last component.
func (s *side) split(name string) (dir, base string) {
	if s.dw {
		dir, base = path.Split(name)
		if dir == "" {
			return ".", base
		}
		return path.Clean(dir), base
	}
	return filepath.Dir(name), filepath.Base(name)
}

// isTop reports whether name is the top of the side (no parent to open).
func (s *side) isTop(name string) bool {
	return (s.dw && name == ".") || (!s.dw && name == "/")
}

// openDir opens a directory, following links (inside the instance, on the burst-buffer side).
func (s *side) openDir(name string) (*os.File, error) {
	if s.dw {
		return s.root.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	}
	return os.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY, 0)
}

// stat follows links, lstat does not.
func (s *side) stat(name string) (os.FileInfo, error) {
	if s.dw {
		return s.root.Stat(name)
	}
	return os.Stat(name)
}

func (s *side) lstat(name string) (os.FileInfo, error) {
	if s.dw {
		return s.root.Lstat(name)
	}
	return os.Lstat(name)
}

// createdDirMode is the mode of directories a stage creates that have no source directory
// (the parents of a destination): what mkdir -p gives with the common umask 022.
const createdDirMode = 0o755

func (s *side) mkdirAll(name string) error {
	if s.dw {
		return s.root.MkdirAll(name, createdDirMode)
	}
	return os.MkdirAll(name, createdDirMode)
}

// dirHandle is an open directory; file keeps a descriptor opened through os.Root alive.
type dirHandle struct {
	fd   int
	file *os.File
}

func (d *dirHandle) close() {
	if d.file != nil {
		d.file.Close()
	} else {
		unix.Close(d.fd)
	}
}

// openDirHandle opens a directory, following links as openDir does.
func (s *side) openDirHandle(name string) (*dirHandle, error) {
	if s.dw {
		f, err := s.root.OpenFile(name, os.O_RDONLY|syscall.O_DIRECTORY, 0)
		if err != nil {
			return nil, err
		}
		return &dirHandle{fd: int(f.Fd()), file: f}, nil
	}
	for {
		fd, err := unix.Open(name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: name, Err: err}
		}
		return &dirHandle{fd: fd}, nil
	}
}

// dirCache keeps the last directory opened on each side, so that the files of one directory
// (copied one after another) share one open of their parent. Not safe for concurrent use:
// each copying goroutine has its own.
type dirCache struct {
	open map[*side]cachedDir
}

type cachedDir struct {
	name   string
	handle *dirHandle
}

func newDirCache() *dirCache { return &dirCache{open: map[*side]cachedDir{}} }

// parent returns the open directory holding name, and name's last component.
func (c *dirCache) parent(s *side, name string) (parentDir, error) {
	dir, base := s.split(name)
	if cached, ok := c.open[s]; ok {
		if cached.name == dir {
			return parentDir{fd: cached.handle.fd, base: base}, nil
		}
		cached.handle.close()
		delete(c.open, s)
	}
	h, err := s.openDirHandle(dir)
	if err != nil {
		return parentDir{}, err
	}
	c.open[s] = cachedDir{name: dir, handle: h}
	return parentDir{fd: h.fd, base: base}, nil
}

func (c *dirCache) close() {
	for s, cached := range c.open {
		cached.handle.close()
		delete(c.open, s)
	}
}

// parentDir is an open directory (owned by a dirCache) and the last component of a path in it.
type parentDir struct {
	fd   int
	base string
}

// open opens the last component without following a link there. O_NONBLOCK only guards the
// open itself (a fifo would block it); it is cleared at once, so I/O stays blocking.
func (p parentDir) open(flags int, perm uint32) (int, error) {
	return openNoBlock(p.fd, p.base, flags|unix.O_NOFOLLOW, perm)
}

// openNoBlock opens with O_NONBLOCK, then clears every F_SETFL flag (O_NONBLOCK is the only
// one the stage sets): two system calls, where os.File would spend five.
func openNoBlock(dirfd int, name string, flags int, perm uint32) (int, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Openat(dirfd, name, flags|unix.O_NONBLOCK|unix.O_CLOEXEC, perm)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return -1, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, 0); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func (p parentDir) lstat() (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(p.fd, p.base, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

func (p parentDir) unlink() error { return unix.Unlinkat(p.fd, p.base, 0) }

func (p parentDir) mkdir(mode uint32) error { return unix.Mkdirat(p.fd, p.base, mode) }

func (p parentDir) symlink(target string) error { return unix.Symlinkat(target, p.fd, p.base) }

func (p parentDir) readlink() (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(p.fd, p.base, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
		if size > 1<<20 {
			return "", unix.ENAMETOOLONG
		}
	}
}

// lchtimes sets the times of the last component itself, even if it is a link.
func (p parentDir) lchtimes(atime, mtime unix.Timespec) error {
	return unix.UtimesNanoAt(p.fd, p.base, []unix.Timespec{atime, mtime}, unix.AT_SYMLINK_NOFOLLOW)
}

// futimens sets the times of an open file: utimensat(fd, NULL, ...), the race-free form that
// x/sys does not wrap.
func futimens(fd int, atime, mtime unix.Timespec) error {
	times := [2]unix.Timespec{atime, mtime}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&times[0])), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func fstat(fd int) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstat(fd, &st)
	for err == unix.EINTR { // a remote mount answers an interrupted request with EINTR
		err = unix.Fstat(fd, &st)
	}
	return st, err
}

// fchmod sets a descriptor's mode, again when a signal interrupted it (the Go runtime's
// signals interrupt requests to a remote mount, which answers EINTR).
func fchmod(fd int, mode uint32) error {
	err := unix.Fchmod(fd, mode)
	for err == unix.EINTR {
		err = unix.Fchmod(fd, mode)
	}
	return err
}

// closeFD closes a descriptor; an error on close can report a failed write (NFS, Lustre).
func closeFD(fd int) error {
	err := unix.Close(fd)
	if err == unix.EINTR {
		return nil // Linux has closed the descriptor anyway
	}
	return err
}

// statOf extracts the raw stat of a FileInfo from os.
func statOf(fi os.FileInfo) *syscall.Stat_t {
	st, _ := fi.Sys().(*syscall.Stat_t)
	return st
}

// errEscapes reports whether err is os.Root refusing a path that leaves the root. os does not
// export the error, so its text is matched; a test pins it.
func errEscapes(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "path escapes from parent" {
			return true
		}
	}
	return false
}
