package usage

// Project quotas: the backing file system enforcing a fragment's capacity itself.
//
// A co-located mount hands writes to the kernel (FUSE passthrough), so they never pass the
// Tracker. When the SSD path's file system has project quotas on (XFS mounted with prjquota;
// ext4 with the project feature and prjquota), the agent gives each fragment directory a
// project id of its own, inherited by everything created below it (FS_XFLAG_PROJINHERIT), and
// a hard block limit of the fragment's capacity. Every byte written into the fragment — by the
// server, by the kernel on the server's behalf, by staging — is then counted and limited by
// the file system.
//
// Everything works on descriptors (ioctl and quotactl_fd(2), Linux 5.14+): no path a user
// could swap is ever resolved. The quota commands are the generic ones (Q_GETQUOTA,
// Q_SETQUOTA), which XFS implements too.

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	prjQuota     = 2          // PRJQUOTA
	qGetQuota    = 0x800007   // Q_GETQUOTA
	qSetQuota    = 0x800008   // Q_SETQUOTA
	qifBLimits   = 1          // QIF_BLIMITS
	qifSpace     = 4          // QIF_SPACE
	qifBlockSize = 1024       // QIF_DQBLKSIZE: the unit of dqb_bhardlimit
	fsIocGetX    = 0x801c581f // FS_IOC_FSGETXATTR
	fsIocSetX    = 0x401c5820 // FS_IOC_FSSETXATTR
	xflagInherit = 0x200      // FS_XFLAG_PROJINHERIT
)

// fsxattr is struct fsxattr of <linux/fs.h>.
type fsxattr struct {
	Xflags     uint32
	Extsize    uint32
	Nextents   uint32
	Projid     uint32
	Cowextsize uint32
	Pad        [8]byte
}

// dqblk is struct if_dqblk of <linux/quota.h>.
type dqblk struct {
	Bhardlimit uint64
	Bsoftlimit uint64
	Curspace   uint64
	Ihardlimit uint64
	Isoftlimit uint64
	Curinodes  uint64
	Btime      uint64
	Itime      uint64
	Valid      uint32
	_          uint32
}

// ProjectID is the project id of a fragment: the fragment id in the upper half of the 32-bit
// space, clear of the small ids administrators give their own projects.
func ProjectID(fragment int64) uint32 {
	return 1<<31 | uint32(fragment&0x7fffffff)
}

func quotactlFd(fd int, cmd int, id uint32, addr unsafe.Pointer) error {
	_, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, uintptr(fd), uintptr(cmd<<8|prjQuota), uintptr(id), uintptr(addr), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getFsxattr(fd int) (fsxattr, error) {
	var x fsxattr
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocGetX, uintptr(unsafe.Pointer(&x))); e != 0 {
		return x, e
	}
	return x, nil
}

// SetProjectQuota puts the directory open as dirfd (root's own: a fragment directory, never a
// user's) under project id with a hard limit of limit bytes (rounded up to KiB): it and
// everything created below it from now on count against the limit. It fails, changing
// nothing, when the file system has no project quotas on (ENOTTY, EOPNOTSUPP, ESRCH, ...).
func SetProjectQuota(dirfd int, id uint32, limit uint64) error {
	if id == 0 || limit == 0 {
		return fmt.Errorf("project quota: id %d, limit %d: both must be positive", id, limit)
	}
	// The limit first: a file system without project quotas refuses it, and the directory
	// keeps its attributes.
	q := dqblk{Bhardlimit: (limit + qifBlockSize - 1) / qifBlockSize, Valid: qifBLimits}
	if err := quotactlFd(dirfd, qSetQuota, id, unsafe.Pointer(&q)); err != nil {
		hint := ""
		switch {
		case errors.Is(err, unix.ESRCH):
			hint = ": project quotas are not on in this file system (mount XFS with -o prjquota)"
		case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY):
			hint = ": this kernel or file system has no project quotas"
		}
		return fmt.Errorf("setting the project quota limit (quotactl Q_SETQUOTA, project %d): %w%s", id, err, hint)
	}
	if err := SetProjectOf(dirfd, id); err != nil {
		ClearProjectQuota(dirfd, id)
		return err
	}
	return nil
}

// SetProjectOf gives the directory open as dirfd project id id, inherited by what is created
// in it.
func SetProjectOf(dirfd int, id uint32) error {
	x, err := getFsxattr(dirfd)
	if err != nil {
		return fmt.Errorf("reading the directory's project (FS_IOC_FSGETXATTR): %w", err)
	}
	x.Projid = id
	x.Xflags |= xflagInherit
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(dirfd), fsIocSetX, uintptr(unsafe.Pointer(&x))); e != 0 {
		return fmt.Errorf("setting the directory's project %d (FS_IOC_FSSETXATTR): %w", id, e)
	}
	return nil
}

// ClearProjectQuota removes project id's limit on the file system of fd (any descriptor on
// it): what a removed fragment leaves.
func ClearProjectQuota(fd int, id uint32) error {
	q := dqblk{Valid: qifBLimits}
	if err := quotactlFd(fd, qSetQuota, id, unsafe.Pointer(&q)); err != nil {
		return fmt.Errorf("clearing the limit of project %d: %w", id, err)
	}
	return nil
}

// ErrNoQuota says a directory is not under the project quota asked for.
var ErrNoQuota = errors.New("no project quota")

// ProjectUsage is what project id uses on the file system of fd and its hard limit, in bytes
// (limit 0: none).
func ProjectUsage(fd int, id uint32) (used, limit uint64, err error) {
	var q dqblk
	err = quotactlFd(fd, qGetQuota, id, unsafe.Pointer(&q))
	if errors.Is(err, unix.ENOENT) {
		return 0, 0, nil // XFS: a project that uses nothing and has no limit does not exist
	}
	if err != nil {
		return 0, 0, fmt.Errorf("reading the usage of project %d (quotactl Q_GETQUOTA): %w", id, err)
	}
	if q.Valid&qifBLimits != 0 {
		limit = q.Bhardlimit * qifBlockSize
	}
	if q.Valid&qifSpace != 0 {
		used = q.Curspace
	}
	return used, limit, nil
}

// xfsMagic is XFS_SUPER_MAGIC.
const xfsMagic = 0x58465342

// CheckProjectQuota reports whether the directory open as dirfd is under project id, passes
// it on to what is created in it, the project has a hard limit, and the file system enforces
// it on root's writes too: only XFS does (ext4, like every file system on the generic quota
// code, lets CAP_SYS_RESOURCE exceed hard limits, and the kernel writes a passthrough file
// with the agent's credentials). The error wraps ErrNoQuota when it is not.
func CheckProjectQuota(dirfd int, id uint32) (limit uint64, err error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(dirfd, &st); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrNoQuota, err)
	}
	if st.Type != xfsMagic {
		return 0, fmt.Errorf("%w: the file system (type %#x) is not XFS, the one that holds root to a project quota", ErrNoQuota, st.Type)
	}
	x, err := getFsxattr(dirfd)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrNoQuota, err)
	}
	if x.Projid != id || x.Xflags&xflagInherit == 0 {
		return 0, fmt.Errorf("%w: the directory is in project %d (inherit %v), not %d", ErrNoQuota, x.Projid, x.Xflags&xflagInherit != 0, id)
	}
	_, limit, err = ProjectUsage(dirfd, id)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrNoQuota, err)
	}
	if limit == 0 {
		return 0, fmt.Errorf("%w: project %d has no hard limit", ErrNoQuota, id)
	}
	return limit, nil
}
