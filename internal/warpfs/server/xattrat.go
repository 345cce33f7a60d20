package server

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reading an attribute of an entry named in a directory held open (dirfd, name) without
// following name if it is a symbolic link: getxattrat(2) (Linux 6.13) does it in one call;
// before it, lgetxattr of /proc/self/fd/N/name did, whose walk through /proc costs more than
// the read itself (a LOOKUP and an UNLINK of a striped file each read its layout so).

// noXattrat is set once the kernel said it has no getxattrat: the /proc name is used from
// then on.
var noXattrat atomic.Bool

// xattrArgs is the kernel's struct xattr_args.
type xattrArgs struct {
	value uint64
	size  uint32
	flags uint32
}

// lgetxattrAt reads attribute attr of dirfd/name into dest, not following name. name is one
// component (a name of the directory): one with a slash is refused, as any walk would follow
// the links on its way.
func lgetxattrAt(dirfd int, name, attr string, dest []byte) (int, error) {
	if name == "" || strings.IndexByte(name, '/') >= 0 {
		return 0, unix.EINVAL
	}
	if !noXattrat.Load() && len(dest) <= maxStub {
		n, err := getxattrat(dirfd, name, attr, dest)
		if err != unix.ENOSYS {
			return n, err
		}
		noXattrat.Store(true)
	}
	return unix.Lgetxattr(procPath(dirfd)+"/"+name, attr, dest)
}

// xattrBufs are what getxattrat reads into: memory of the heap, which never moves, since the
// kernel gets its address inside a structure (a buffer on a goroutine's stack could move
// with it before the call).
var xattrBufs = sync.Pool{New: func() any { return new([maxStub]byte) }}

func getxattrat(dirfd int, name, attr string, dest []byte) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return 0, err
	}
	buf := xattrBufs.Get().(*[maxStub]byte)
	defer xattrBufs.Put(buf)
	args := xattrArgs{value: uint64(uintptr(unsafe.Pointer(buf))), size: uint32(len(dest))}
	n, _, errno := unix.Syscall6(unix.SYS_GETXATTRAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), unix.AT_SYMLINK_NOFOLLOW,
		uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args))
	runtime.KeepAlive(buf)
	if errno != 0 {
		return 0, errno
	}
	return copy(dest, buf[:min(int(n), len(dest))]), nil
}
