// Package fuseuring is a prototype of a FUSE server speaking to the kernel over io_uring
// (FUSE over io_uring, Linux 6.14+: docs.kernel.org/filesystems/fuse-io-uring.html) instead
// of read and writev on /dev/fuse, written to measure what it would buy a Go FUSE server
// (issue 21, item 4; bench/fuse_uring_bench.py measures libfuse's implementation). It
// serves a fixed tree, a root directory of empty-ish files, and answers LOOKUP and GETATTR
// only: enough for a stat loop, not a file system. Mode Dev serves the same tree over
// /dev/fuse with the same handler, so that the two transports compare alone.
package fuseuring

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// io_uring's ABI (include/uapi/linux/io_uring.h): what this package uses of it.
const (
	sysIoUringSetup = 425
	sysIoUringEnter = 426

	setupSQE128       = 1 << 10 // 128-byte SQEs: the FUSE command lives in the upper 80 bytes
	setupSingleIssuer = 1 << 12 // one thread submits: the kernel skips the ring's locking
	featSingleMmap    = 1 << 0
	enterGetEvents    = 1 << 0
	offSQRing         = 0
	offCQRing         = 0x8000000
	offSQEs           = 0x10000000
	opURingCmd        = 46
	opPollAdd         = 6
	sqeSize           = 128
	cqeSize           = 16
	sqeCmdOffset      = 48 // where a URING_CMD's command area begins in the SQE
	paramsSize        = 120
)

// params is struct io_uring_params.
type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqHead, sqTail, sqRingMask, sqRingEntries, sqFlags, sqDropped, sqArray uint32
	sqResv1                                                                uint32
	sqUserAddr                                                             uint64
	cqHead, cqTail, cqRingMask, cqRingEntries, cqOverflow, cqCqes, cqFlags uint32
	cqResv1                                                                uint32
	cqUserAddr                                                             uint64
}

// ring is one io_uring, used by one locked OS thread (setupSingleIssuer): SQEs are written
// and submitted, and completions reaped, by that thread alone.
type ring struct {
	fd                     int
	sqMem, cqMem, sqesMem  []byte
	sqHead, sqTail, sqMask *uint32
	sqArray                []uint32
	cqHead, cqTail, cqMask *uint32
	cqes                   []byte
	pending                uint32 // SQEs written since the last enter
}

func newRing(entries uint32) (*ring, error) {
	var p params
	if unsafe.Sizeof(p) != paramsSize {
		return nil, fmt.Errorf("io_uring_params is %d bytes, not %d", unsafe.Sizeof(p), paramsSize)
	}
	p.flags = setupSQE128 | setupSingleIssuer
	fd, _, errno := unix.Syscall(sysIoUringSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &ring{fd: int(fd)}
	if p.features&featSingleMmap == 0 {
		r.close()
		return nil, fmt.Errorf("io_uring without IORING_FEAT_SINGLE_MMAP (kernel before 5.4)")
	}
	size := max(p.sqArray+p.sqEntries*4, p.cqCqes+p.cqEntries*cqeSize)
	mem, err := unix.Mmap(r.fd, offSQRing, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("mmap of the io_uring: %w", err)
	}
	r.sqMem, r.cqMem = mem, mem
	r.sqesMem, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries*sqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("mmap of the SQEs: %w", err)
	}
	u32 := func(off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	r.sqHead, r.sqTail, r.sqMask = u32(p.sqHead), u32(p.sqTail), u32(p.sqRingMask)
	r.sqArray = unsafe.Slice(u32(p.sqArray), p.sqEntries)
	r.cqHead, r.cqTail, r.cqMask = u32(p.cqHead), u32(p.cqTail), u32(p.cqRingMask)
	r.cqes = mem[p.cqCqes : p.cqCqes+p.cqEntries*cqeSize]
	return r, nil
}

// sqe returns the next free submission entry, zeroed, or nil when the queue is full.
func (r *ring) sqe() []byte {
	tail := *r.sqTail + r.pending
	if tail-atomic.LoadUint32(r.sqHead) > uint32(len(r.sqArray)) {
		return nil
	}
	i := tail & *r.sqMask
	r.sqArray[i] = i
	r.pending++
	s := r.sqesMem[i*sqeSize : (i+1)*sqeSize]
	clear(s)
	return s
}

// enter publishes the SQEs written and waits for at least wait completions, in one system call.
func (r *ring) enter(wait uint32) error {
	n := r.pending
	atomic.StoreUint32(r.sqTail, *r.sqTail+n)
	r.pending = 0
	flags := uintptr(0)
	if wait > 0 {
		flags = enterGetEvents
	}
	for {
		_, _, errno := unix.Syscall6(sysIoUringEnter, uintptr(r.fd), uintptr(n), uintptr(wait), flags, 0, 0)
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			n = 0 // submitted already; wait again
			continue
		default:
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
	}
}

// completions calls f for each completion ready (user data, result) and consumes them.
func (r *ring) completions(f func(userData uint64, res int32)) int {
	head, tail := *r.cqHead, atomic.LoadUint32(r.cqTail)
	n := 0
	for ; head != tail; head++ {
		c := r.cqes[(head&*r.cqMask)*cqeSize:]
		f(*(*uint64)(unsafe.Pointer(&c[0])), *(*int32)(unsafe.Pointer(&c[8])))
		n++
	}
	atomic.StoreUint32(r.cqHead, head)
	return n
}

func (r *ring) close() {
	if r.sqesMem != nil {
		unix.Munmap(r.sqesMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	unix.Close(r.fd)
}
