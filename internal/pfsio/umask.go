package pfsio

import (
	"bytes"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// An in-process door (Open) makes files and directories in the caller's process, whose umask
// (usually 022) the kernel applies to the modes asked; a worker runs with umask 0 (worker.go),
// so that the modes are the caller's, as given (the cache passes what its own caller asked,
// its umask applied by the kernel of the compute node). An in-process tree therefore sets
// back the permission bits the umask cut from a new node, through a descriptor of that very
// node (never following a name): exactly those bits, so that what the kernel did for other
// reasons stays (a set-group-ID bit inherited from the directory, or dropped for a user
// outside the group). A directory with a default ACL is left alone: there the ACL, not the
// umask, gives the new node's mode.

// processUmask is the process's umask (from /proc/self/status: reading it with umask(2)
// would change it for the other threads meanwhile); 0 when unknown.
func processUmask() uint32 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("Umask:")); ok {
			m, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 8, 32)
			if err != nil {
				return 0
			}
			return uint32(m)
		}
	}
	return 0
}

// cutByUmask is the bits of mode the umask may have cut from a node made in dirfd (0: none,
// or the tree is not in-process, or dirfd has a default ACL).
func (t *tree) cutByUmask(dirfd int, mode uint32) uint32 {
	if !t.callerCopies {
		return 0 // a worker: umask 0
	}
	cut := mode & 0o777 & processUmask()
	if cut == 0 {
		return 0
	}
	// dirfd may be O_PATH (no getxattr through it): its /proc/self/fd name is that directory.
	if _, err := unix.Getxattr(procPath(dirfd), "system.posix_acl_default", nil); err == nil || err == unix.ERANGE {
		return 0
	}
	return cut
}

// restoreMode adds to the node open at fd (an O_PATH descriptor or an open file) the bits
// cut its mode lacks. The node is the one just made: fd names it, whatever its name is now.
func restoreMode(fd int, cut uint32) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFDIR:
	default:
		return
	}
	if st.Mode&cut == cut {
		return
	}
	mode := st.Mode&0o7777 | cut
	retry(func() error { return unix.Chmod(procPath(fd), mode) })
}

// mkdirAt makes the directory name in dirfd with mode, exactly (see above).
func (t *tree) mkdirAt(dirfd int, name string, mode uint32) error {
	if err := unix.Mkdirat(dirfd, name, mode); err != nil {
		return err
	}
	if cut := t.cutByUmask(dirfd, mode); cut != 0 {
		fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil // renamed or replaced meanwhile: not ours to change
		}
		restoreMode(fd, cut)
		unix.Close(fd)
	}
	return nil
}
