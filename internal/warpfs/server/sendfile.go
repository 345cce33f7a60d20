package server

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// A READ's data goes from the file to the socket with sendfile(2) where the connection is a
// plain socket (TCP or Unix, not TLS): the kernel hands the page cache's pages to the socket,
// where a pread into a buffer and a write from it copied every byte twice in the server — a
// fifth of a storage node's CPU in ior-hard's read phase (perf, bench/metadata_bench.py).

// minSpan is the smallest READ sent from its file: below it the copies cost less than
// sendfile's extra system calls (the descriptor's duplicate, its size, its close).
const minSpan = 64 << 10

// fileSpan is a READ's answer still in its file: n bytes at off of fd, a duplicate of the
// handle's descriptor that the reply closes (the handle may be released meanwhile). It is
// exec's reply to a READ of at least minSpan bytes on a session whose connection sends spans
// (session.spans).
type fileSpan struct {
	fd  int
	off int64
	n   int
}

// Encode and Decode make a fileSpan a proto.Message for exec's signature; it never goes on
// the wire as one (srvConn.sendSpan sends its bytes).
func (*fileSpan) Encode(*proto.Enc) {}
func (*fileSpan) Decode(*proto.Dec) {}

// span is the READ of size bytes at off of fd as a fileSpan: at most what the file holds
// there now (a pread would return as much).
func span(fd int, off uint64, size int) (*fileSpan, syscall.Errno) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, errnoOf(err)
	}
	n := 0
	if uint64(st.Size) > off {
		n = int(min(uint64(size), uint64(st.Size)-off))
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, errnoOf(err)
	}
	return &fileSpan{fd: dup, off: int64(off), n: n}, 0
}

// sendSpan replies to READ h with sp's bytes, sent from its file by the kernel, and closes it.
// A file that shrank since its size was taken (a truncate meanwhile) ends the data early:
// zeros make up the count the header promised, as the client makes up a short read.
func (c *srvConn) sendSpan(h proto.Header, sp *fileSpan) {
	defer unix.Close(sp.fd)
	var hdr [proto.HeaderSize]byte
	proto.PutHeader(hdr[:], proto.Header{Op: h.Op, Kind: proto.KindReply, ID: h.ID, BodyLen: uint32(sp.n)})
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(c.s.lim.IdleTimeout))
	head, off, left := hdr[:], sp.off, sp.n
	var failed error
	err := c.raw.Write(func(sock uintptr) bool {
		for len(head) > 0 {
			// MSG_MORE: the header leaves with the data's first bytes, not in a packet of its own.
			n, err := unix.SendmsgN(int(sock), head, nil, nil, unix.MSG_MORE|unix.MSG_NOSIGNAL)
			switch {
			case err == unix.EAGAIN:
				return false // the poller waits until the socket takes more (or the deadline)
			case err == unix.EINTR:
				continue
			case err != nil:
				failed = err
				return true
			}
			head = head[n:]
		}
		for left > 0 {
			n, err := unix.Sendfile(int(sock), sp.fd, &off, min(left, 1<<30))
			switch {
			case err == unix.EAGAIN:
				return false
			case err == unix.EINTR:
				continue
			case err != nil:
				failed = err
				return true
			case n == 0:
				return true // the file ended before off: zeros below
			}
			left -= n
		}
		return true
	})
	if err == nil && failed == nil && left > 0 {
		_, err = c.nc.Write(make([]byte, left))
	}
	if err != nil || failed != nil {
		c.nc.Close() // the reader ends the connection
	}
}
