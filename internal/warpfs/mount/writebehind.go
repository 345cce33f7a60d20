package mount

// Write-behind: a handle's writes carried to their servers after write(2) returned, for the
// files of a striped instance (a queue per stripe server) and of a one-server instance
// reached over the network (one queue, the namespace's server). The same code for both: only
// where a piece goes differs (pieces, sendObjectPiece in striped.go, sendFilePiece here).

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// writeBehind carries a handle's writes to the servers after write(2) returned: a queue per
// server, sent in order one at a time (so that overlapping writes land in the order they were
// made), at most limit bytes in flight in all. The first error is kept, what was queued after
// it dropped, and the next write, flush or fsync returns it, once (as Linux reports a
// write-back error).
//
// A queue with less than gatherBytes waiting gives the writer up to gatherWait to add to it
// before it sends (unless someone waits for the writes: a flush, fsync, close, read or stat):
// a sequential writer's next write(2) is usually a few microseconds away — the page cache
// even sends an unaligned write as two requests, its first partial page alone — and joins the
// same request instead of following it in one of its own.
type writeBehind struct {
	limit int64

	mu       sync.Mutex
	cond     *sync.Cond
	inflight int64
	err      syscall.Errno
	queues   []serverQueue
	waiters  int // settle and wait calls waiting: nothing may linger
}

type serverQueue struct {
	pending []queuedPiece
	bytes   uint64 // in pending
	running bool
}

// reopenRetry is how often a write behind retries to open its file again on a storage node
// that does not accept connections (restarting).
const reopenRetry = 50 * time.Millisecond

// The gathering of small writes (see writeBehind).
const (
	gatherBytes = 256 << 10
	gatherWait  = 200 * time.Microsecond
)

type queuedPiece struct {
	piece    stripe.Piece
	data     []byte
	uid, gid uint32 // the writer (the server clears set-user-ID bits for others than root)
}

func newWriteBehind(limit int64, servers int) *writeBehind {
	wb := &writeBehind{limit: limit, queues: make([]serverQueue, servers)}
	wb.cond = sync.NewCond(&wb.mu)
	return wb
}

// writeBehind queues a write's pieces for their servers and returns at once, unless limit
// bytes are already in flight: then it waits for room.
func (h *fileHandle) writeBehind(ctx context.Context, wb *writeBehind, data []byte, start uint64) (uint32, syscall.Errno) {
	uid, gid := caller(ctx)
	n := int64(len(data))
	wb.mu.Lock()
	for wb.err == 0 && wb.inflight > 0 && wb.inflight+n > wb.limit {
		wb.cond.Wait()
	}
	if wb.err != 0 {
		errno := wb.takeErrLocked()
		wb.mu.Unlock()
		return 0, errno
	}
	buf := append([]byte(nil), data...) // the kernel reuses data once we return
	wb.inflight += n
	for _, p := range h.pieces(start, uint64(n)) {
		q := &wb.queues[p.Server]
		q.pending = append(q.pending, queuedPiece{piece: p, data: buf[p.BufOffset : p.BufOffset+p.Length], uid: uid, gid: gid})
		q.bytes += p.Length
		if !q.running {
			q.running = true
			go h.sendQueue(wb, p.Server)
		}
	}
	wb.cond.Broadcast() // a queue gathering writes may have enough now
	wb.mu.Unlock()
	if h.striped != nil {
		h.grew(start + uint64(n))
	}
	return uint32(n), 0
}

// sendQueue sends one server's queued pieces in order until the queue is empty. Pieces
// queued one after the other that continue each other in the object (a sequential writer's
// small writes, which pile up while the previous request is on its way) go as one request of
// up to proto.MaxIO bytes: the same bytes in the same order, in fewer round trips.
func (h *fileHandle) sendQueue(wb *writeBehind, s int) {
	for {
		wb.mu.Lock()
		q := &wb.queues[s]
		if len(q.pending) == 0 {
			q.running = false
			wb.mu.Unlock()
			return
		}
		if q.bytes < gatherBytes && wb.waiters == 0 && wb.err == 0 {
			wb.gather(q) // only this goroutine takes from q: it still holds what it held
		}
		qp := q.pending[0]
		run := 1
		for end := qp.piece.ObjOffset + qp.piece.Length; run < len(q.pending); run++ {
			next := q.pending[run].piece
			if next.ObjOffset != end || end+next.Length-qp.piece.ObjOffset > proto.MaxIO ||
				q.pending[run].uid != qp.uid || q.pending[run].gid != qp.gid {
				break
			}
			end += next.Length
		}
		var merged *[]byte
		if run > 1 {
			merged = mergeBuffers.Get().(*[]byte)
			data := (*merged)[:0]
			for _, p := range q.pending[:run] {
				data = append(data, p.data...)
			}
			qp = queuedPiece{piece: stripe.Piece{Server: s, ObjOffset: qp.piece.ObjOffset, Length: uint64(len(data))}, data: data, uid: qp.uid, gid: qp.gid}
		}
		clear(q.pending[:run]) // the pieces' buffers can go
		q.pending = q.pending[run:]
		q.bytes -= qp.piece.Length
		failed := wb.err != 0
		wb.mu.Unlock()
		var errno syscall.Errno
		if !failed { // after an error the rest is dropped: the writer learns of the error
			if h.striped != nil {
				errno = h.sendObjectPiece(qp)
			} else {
				errno = h.sendFilePiece(qp)
			}
		}
		if merged != nil {
			mergeBuffers.Put(merged)
		}
		wb.mu.Lock()
		wb.inflight -= int64(qp.piece.Length)
		if errno != 0 && wb.err == 0 {
			wb.err = errno
		}
		wb.cond.Broadcast()
		wb.mu.Unlock()
	}
}

// mergeBuffers hold the runs of pieces sendQueue sends as one request.
var mergeBuffers = sync.Pool{New: func() any {
	b := make([]byte, 0, proto.MaxIO)
	return &b
}}

// settle waits until the handle's writes reached their servers, and returns the first error
// any of them met.
func (h *fileHandle) settle() syscall.Errno {
	wb := h.behind
	if wb == nil {
		return 0
	}
	wb.mu.Lock()
	defer wb.mu.Unlock()
	wb.waitLocked()
	return wb.takeErrLocked()
}

// takeErrLocked is the error a write behind met, for the writer to learn. An error that
// freeing space can cure (ENOSPC, EDQUOT, EFBIG) is told once; any other (EIO: the storage
// node lost) stays with the handle, and every later write, flush and fsync of it fails:
// bytes it was told were written are lost, and a close by another process sharing the open
// file (a child's inherited descriptor) must not take the only report of it (as NFS keeps a
// fatal write error with its open context).
func (wb *writeBehind) takeErrLocked() syscall.Errno {
	errno := wb.err
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
		wb.err = 0
	}
	return errno
}

// gather waits, wb.mu held, until queue q holds gatherBytes, someone waits for the writes,
// or gatherWait passed.
func (wb *writeBehind) gather(q *serverQueue) {
	deadline := time.Now().Add(gatherWait)
	t := time.AfterFunc(gatherWait, func() {
		wb.mu.Lock()
		wb.cond.Broadcast()
		wb.mu.Unlock()
	})
	defer t.Stop()
	for q.bytes < gatherBytes && wb.waiters == 0 && wb.err == 0 && time.Now().Before(deadline) {
		wb.cond.Wait()
	}
}

// waitLocked waits, wb.mu held, until nothing is in flight, hurrying the queues gathering.
func (wb *writeBehind) waitLocked() {
	if wb.inflight == 0 {
		return
	}
	wb.waiters++
	wb.cond.Broadcast()
	for wb.inflight > 0 {
		wb.cond.Wait()
	}
	wb.waiters--
}

// settleAll waits for the writes of every handle of this node's file: what a read, stat,
// truncate or fallocate must see. An error of a write stays with its handle, for its writer
// to learn at its next write, fsync or close.
func (n *node) settleAll() {
	n.mu.Lock()
	var hs []*fileHandle
	for h := range n.handles {
		if h.behind != nil {
			hs = append(hs, h)
		}
	}
	n.mu.Unlock()
	for _, h := range hs {
		h.behind.wait()
	}
}

// wait waits until nothing is in flight.
func (wb *writeBehind) wait() {
	wb.mu.Lock()
	defer wb.mu.Unlock()
	wb.waitLocked()
}

// writesBehind says whether a handle opened with flags writes behind. Not O_SYNC, O_DSYNC or
// O_DIRECT, which ask for the opposite; not O_APPEND on a one-server instance, whose
// appends the kernel places at the end the server last reported.
func (be *backend) writesBehind(flags uint32, striped bool) bool {
	if be.writeBehind <= 0 || flags&syscall.O_ACCMODE == syscall.O_RDONLY ||
		flags&(syscall.O_SYNC|syscall.O_DSYNC|syscall.O_DIRECT) != 0 {
		return false
	}
	return striped || flags&syscall.O_APPEND == 0
}

// pieces is where a write of n bytes at start goes: a striped file's pieces by server, or
// the one piece of a file on its namespace's server (queue 0).
func (h *fileHandle) pieces(start, n uint64) []stripe.Piece {
	if h.striped != nil {
		return h.striped.layout.Pieces(start, n)
	}
	return []stripe.Piece{{ObjOffset: start, Length: n}}
}

// sendFilePiece writes one piece of a file of a one-server instance. A short write (the
// instance full, or the maximum file size reached) is sent on, so that the server says why
// the rest cannot be written. The writer was told its write was done: a connection lost
// meanwhile (the storage agent restarting) does not fail it while the file can be opened
// again within the request's deadline.
func (h *fileHandle) sendFilePiece(qp queuedPiece) syscall.Errno {
	ctx, cancel := h.node.be.opCtx(context.Background())
	defer cancel()
	data, off := qp.data, qp.piece.ObjOffset
	for len(data) > 0 {
		var rep proto.CountReply
		id, gen := h.current()
		call := &client.Call{Op: proto.OpWrite, UID: qp.uid, GID: qp.gid, Data: data, Reply: &rep, Gen: gen,
			Req: &proto.WriteReq{Handle: id, Offset: off}}
		errno := h.node.be.client.Do(ctx, call)
		if errno == syscall.ESTALE {
			for h.reopen(ctx, gen) != 0 {
				select {
				case <-ctx.Done():
					return syscall.EIO
				case <-time.After(reopenRetry):
				}
			}
			continue
		}
		if errno != 0 {
			return errno
		}
		if rep.N == 0 {
			return syscall.ENOSPC
		}
		n := min(rep.N, uint64(len(data)))
		data, off = data[n:], off+n
	}
	return 0
}

// writeOrBehind is a write(2) of a file of a one-server instance, through the write-behind
// when the handle has one; plain says to send it and wait instead.
func (h *fileHandle) writeOrBehind(ctx context.Context, data []byte, off int64) (n uint32, errno syscall.Errno, plain bool) {
	wb := h.behind
	if wb == nil {
		return 0, 0, true
	}
	start, length := uint64(off), uint64(len(data))
	if mfs := h.node.be.maxFileSize; mfs > 0 && start+length > mfs {
		// Past the maximum file size: what fits, then EFBIG, at once as without write-behind.
		if start >= mfs {
			return 0, syscall.EFBIG, false
		}
		length = mfs - start
	}
	n, errno = h.writeBehind(ctx, wb, data[:length], start)
	return n, errno, false
}
