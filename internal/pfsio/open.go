package pfsio

import (
	"encoding/binary"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// openFlags are the open(2) flags a caller may ask for. O_APPEND is not among them (writes
// are at offsets, and splice refuses an appending file); nor O_PATH, O_DIRECTORY, O_TMPFILE.
const openFlags = unix.O_ACCMODE | unix.O_CREAT | unix.O_EXCL | unix.O_TRUNC | unix.O_SYNC |
	unix.O_DSYNC | unix.O_DIRECT | unix.O_NOATIME | unix.O_LARGEFILE

// maxOpenRetries bounds the retries of an open whose entry was created or removed by someone
// else between the look and the open.
const maxOpenRetries = 8

// open opens a regular file only: it looks at the entry through an O_PATH|O_NOFOLLOW
// descriptor (which opens nothing: no FIFO blocks, no device's driver runs) and then opens
// that very inode again through /proc/self/fd/N with the flags asked (the kernel checks the
// user's permission to it then). A symbolic link is ELOOP, as O_NOFOLLOW answers; a directory
// EISDIR; a FIFO, socket or device ENXIO (not data a cache moves). A file that does not exist
// is made with O_CREAT|O_EXCL|O_NOFOLLOW, so a link planted meanwhile is never followed.
func (t *tree) open(req *request, r *reply) syscall.Errno {
	flags := int(req.Flags)
	if flags&^openFlags != 0 || flags&unix.O_ACCMODE == unix.O_ACCMODE {
		return unix.EINVAL
	}
	dirfd, name, done, errno := t.entry(req.Path)
	if errno != 0 {
		return errno
	}
	defer done()
	if name == "" {
		return unix.EISDIR
	}
	create, exclusive := flags&unix.O_CREAT != 0, flags&unix.O_EXCL != 0
	for range maxOpenRetries {
		if !create || !exclusive {
			pathFd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err == nil {
				fd, errno := reopenRegular(pathFd, flags&^(unix.O_CREAT|unix.O_EXCL))
				unix.Close(pathFd)
				if errno != 0 {
					return errno
				}
				return t.opened(fd, r)
			}
			if err != unix.ENOENT || !create {
				return errnoOf(err)
			}
		}
		fd, err := unix.Openat(dirfd, name, flags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NOCTTY, req.Mode&0o7777)
		if err == unix.EEXIST && !exclusive {
			continue // made by someone else meanwhile: open what is there
		}
		if err != nil {
			return errnoOf(err)
		}
		if cut := t.cutByUmask(dirfd, req.Mode); cut != 0 {
			restoreMode(fd, cut) // umask.go: the descriptor of the file just made
		}
		return t.opened(fd, r)
	}
	return unix.EAGAIN
}

// reopenRegular opens the inode of the O_PATH descriptor pathFd with flags, if it is a regular
// file.
func reopenRegular(pathFd, flags int) (int, syscall.Errno) {
	var st unix.Stat_t
	if err := unix.Fstat(pathFd, &st); err != nil {
		return -1, errnoOf(err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFLNK:
		return -1, unix.ELOOP
	case unix.S_IFDIR:
		return -1, unix.EISDIR
	default:
		return -1, unix.ENXIO
	}
	var fd int
	err := retry(func() (err error) {
		fd, err = unix.Open(procPath(pathFd), flags|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		return
	})
	if err != nil {
		return -1, errnoOf(err)
	}
	return fd, 0
}

// opened keeps fd as a handle and offers it to the caller (r.fd: the caller's copy is its own).
func (t *tree) opened(fd int, r *reply) syscall.Errno {
	if err := unix.Fstat(fd, &r.Stat); err != nil {
		unix.Close(fd)
		return errnoOf(err)
	}
	r.fd = fd
	if t.callerCopies {
		dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			unix.Close(fd)
			return errnoOf(err)
		}
		r.fd = dup
	}
	r.Handle = t.addHandle(&handle{fd: fd})
	return 0
}

// maxWrite bounds one write (a stripe of a cache is a few MiB).
const maxWrite = 64 << 20

// write is pwrite as the user: from the bytes themselves in-process, or from the pipe a root
// caller fills (splice moves the pipe's pages into the file without a copy through here).
func (t *tree) write(req *request, r *reply) syscall.Errno {
	if req.dataFd >= 0 {
		defer unix.Close(req.dataFd)
	}
	h := t.acquire(req.Handle)
	if h == nil {
		return unix.EBADF
	}
	defer t.release(h)
	if h.dir != nil {
		return unix.EBADF
	}
	if req.Size < 0 || req.Size > maxWrite || req.Off < 0 {
		return unix.EINVAL
	}
	if req.dataFd < 0 {
		for r.N < int64(len(req.data)) {
			n, err := unix.Pwrite(h.fd, req.data[r.N:], req.Off+r.N)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return errnoOf(err)
			}
			r.N += int64(n)
		}
		return 0
	}
	off := req.Off
	for r.N < req.Size {
		n, err := unix.Splice(req.dataFd, nil, h.fd, &off, int(min(req.Size-r.N, 1<<20)), unix.SPLICE_F_MOVE)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EINVAL && r.N == 0:
			return copyFromPipe(req, h.fd, r) // a file system (or O_DIRECT) that takes no splice
		case err != nil:
			return errnoOf(err)
		case n == 0:
			return unix.EPIPE // the caller sent fewer bytes than it said
		}
		r.N += n
	}
	return 0
}

// copyFromPipe is write's way for files splice cannot write.
func copyFromPipe(req *request, fd int, r *reply) syscall.Errno {
	buf := make([]byte, min(req.Size, 1<<20))
	for r.N < req.Size {
		want := min(int64(len(buf)), req.Size-r.N)
		n, err := unix.Read(req.dataFd, buf[:want])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return errnoOf(err)
		}
		if n == 0 {
			return unix.EPIPE
		}
		for done := 0; done < n; {
			m, err := unix.Pwrite(fd, buf[done:n], req.Off+r.N)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return errnoOf(err)
			}
			done += m
			r.N += int64(m)
		}
	}
	return 0
}

// dirReader is a directory being listed: getdents' buffer and where it is read.
type dirReader struct {
	mu       sync.Mutex
	buf      []byte
	pos, end int
}

// openDir opens the directory at path for listing (read permission, as ls needs); a symbolic
// link there is ELOOP.
func (t *tree) openDir(req *request, r *reply) syscall.Errno {
	p, errno := cleanPath(req.Path)
	if errno != 0 {
		return errno
	}
	if p == "" {
		p = "."
	}
	how := beneath
	how.Flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC
	fd, errno := t.openBeneath(p, how)
	if errno != 0 {
		return errno
	}
	r.Handle = t.addHandle(&handle{fd: fd, dir: &dirReader{buf: make([]byte, 32<<10)}})
	return 0
}

// readDir returns the next entries (at most maxBatch), each with its lstat attributes; EOF
// once there are no more.
func (t *tree) readDir(req *request, r *reply) syscall.Errno {
	h := t.acquire(req.Handle)
	if h == nil {
		return unix.EBADF
	}
	defer t.release(h)
	if h.dir == nil {
		return unix.EBADF
	}
	d := h.dir
	d.mu.Lock() // one listing at a time reads a directory's buffer
	defer d.mu.Unlock()
	for len(r.Entries) < maxBatch {
		if d.pos >= d.end {
			n, err := unix.Getdents(h.fd, d.buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return errnoOf(err)
			}
			if n == 0 {
				r.EOF = true
				return 0
			}
			d.pos, d.end = 0, n
		}
		// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name NUL-terminated.
		rec := d.buf[d.pos:d.end]
		reclen := int(binary.NativeEndian.Uint16(rec[16:18]))
		typ := rec[18]
		nameBytes := rec[19:reclen]
		for i, c := range nameBytes {
			if c == 0 {
				nameBytes = nameBytes[:i]
				break
			}
		}
		d.pos += reclen
		name := string(nameBytes)
		if name == "." || name == ".." {
			continue
		}
		e := Entry{Name: name, Type: uint32(typ) << 12}
		if err := unix.Fstatat(h.fd, name, &e.Stat, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			e.Errno = int32(errnoOf(err))
		} else {
			e.Type = e.Stat.Mode & unix.S_IFMT
		}
		r.Entries = append(r.Entries, e)
	}
	return 0
}
