package mount

// Write-behind: a handle's writes carried to their servers after write(2) returned, for the
// files of a striped instance (a queue per stripe server) and of a one-server instance
// reached over the network (one queue, the namespace's server). The same code for both: only
// where a piece goes differs (pieces, sendObjectPiece in striped.go, sendFilePiece here).

import (
	"cmp"
	"context"
	"slices"
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
// A striped file's writers on one node share one (node.shareBehind): the pieces of several
// processes writing one file side by side (ior-hard's ranks, each a descriptor of its own)
// join in one request where they continue each other in a server's object. The queued pieces
// of a server are sent in the order of their offsets when none of them overlap (writes that
// do not overlap land the same in any order), in the order they were made otherwise. Each
// writer keeps its own bytes in flight and its own error (writers): a settle waits for its
// own writes, and an error is its writers' whose bytes the failed request carried.
//
// A queue with less than gatherBytes waiting gives the writer up to gatherWait to add to it
// before it sends (unless someone waits for the writes: a flush, fsync, close, read or stat):
// a sequential writer's next write(2) is usually a few microseconds away — the page cache
// even sends an unaligned write as two requests, its first partial page alone — and joins the
// same request instead of following it in one of its own.
//
// An fsync marks its writer's pieces still queued (askSync): the request that carries the
// last marked piece of a server asks that server to sync the file (a striped file's object)
// after writing (proto.OpWriteSync), and the fsync needs no request of its own there — a
// write and the fdatasync after it cost one round trip, not two.
type writeBehind struct {
	limit int64

	mu       sync.Mutex
	cond     *sync.Cond
	inflight int64
	queues   []serverQueue
	waiters  int // settle and wait calls waiting: nothing may linger
	writers  map[*fileHandle]*writerState
	refs     int // the handles sharing it (node.shareBehind), guarded by the node's mu
}

// writerState is one handle's part of a write-behind: its bytes in flight and its error.
type writerState struct {
	inflight int64
	err      syscall.Errno
	// A one-server instance's file: the requests that carried the handle's writes, synced
	// how many of them a WRITE_SYNC covered (the fsync then needs no FSYNC). A striped
	// file counts by server (object.writes).
	writes, synced uint64
}

// writer is h's part of wb, wb.mu held.
func (wb *writeBehind) writer(h *fileHandle) *writerState {
	st := wb.writers[h]
	if st == nil {
		st = &writerState{}
		wb.writers[h] = st
	}
	return st
}

type serverQueue struct {
	pending []queuedPiece
	bytes   uint64 // in pending
	running bool
	// syncFull says an fsync (not an fdatasync) marked pieces pending: the sync that
	// carries them is a full one.
	syncFull bool
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
	uid, gid uint32      // the writer (the server clears set-user-ID bits for others than root)
	h        *fileHandle // the handle it was written through
	sync     bool        // an fsync waits for it: the request carrying it syncs, if last (askSync)
}

func newWriteBehind(limit int64, servers int) *writeBehind {
	wb := &writeBehind{limit: limit, queues: make([]serverQueue, servers), writers: map[*fileHandle]*writerState{}}
	wb.cond = sync.NewCond(&wb.mu)
	return wb
}

// writeBehind queues a write's pieces for their servers and returns at once, unless limit
// bytes are already in flight: then it waits for room.
func (h *fileHandle) writeBehind(ctx context.Context, wb *writeBehind, data []byte, start uint64) (uint32, syscall.Errno) {
	uid, gid := caller(ctx)
	n := int64(len(data))
	wb.mu.Lock()
	st := wb.writer(h)
	for st.err == 0 && wb.inflight > 0 && wb.inflight+n > wb.limit {
		wb.cond.Wait()
	}
	if st.err != 0 {
		errno := st.takeErr()
		wb.mu.Unlock()
		return 0, errno
	}
	buf := append([]byte(nil), data...) // the kernel reuses data once we return
	wb.inflight += n
	st.inflight += n
	for _, p := range h.pieces(start, uint64(n)) {
		q := &wb.queues[p.Server]
		q.pending = append(q.pending, queuedPiece{piece: p, data: buf[p.BufOffset : p.BufOffset+p.Length], uid: uid, gid: gid, h: h})
		q.bytes += p.Length
		if !q.running {
			q.running = true
			go wb.sendQueue(p.Server)
		}
	}
	wb.cond.Broadcast() // a queue gathering writes may have enough now
	wb.mu.Unlock()
	if h.striped != nil {
		h.grew(start + uint64(n))
	}
	return uint32(n), 0
}

// sendQueue sends one server's queued pieces until the queue is empty. Pieces that
// continue each other in the object (a sequential writer's small writes, or several writers'
// side by side, which pile up while the previous request is on its way) go as one request of
// up to proto.MaxIO bytes, through the handle of the first: the same bytes, in fewer round
// trips.
func (wb *writeBehind) sendQueue(s int) {
	for {
		wb.mu.Lock()
		q := &wb.queues[s]
		if len(q.pending) == 0 {
			q.running = false
			wb.mu.Unlock()
			return
		}
		if q.bytes < gatherBytes && wb.waiters == 0 {
			wb.gather(q) // only this goroutine takes from q: it still holds what it held
		}
		q.sortByOffset()
		qp := q.pending[0]
		run := 1
		if wb.writers[qp.h].err == 0 {
			for end := qp.piece.ObjOffset + qp.piece.Length; run < len(q.pending); run++ {
				next := q.pending[run]
				if next.piece.ObjOffset != end || end+next.piece.Length-qp.piece.ObjOffset > proto.MaxIO ||
					next.uid != qp.uid || next.gid != qp.gid || wb.writers[next.h].err != 0 {
					break
				}
				end += next.piece.Length
			}
		}
		// Who wrote what the request carries: their bytes in flight end with it.
		carried := make([]queuedPiece, run)
		copy(carried, q.pending[:run])
		sync := q.syncing(run)
		var merged *[]byte
		if run > 1 {
			merged = mergeBuffers.Get().(*[]byte)
			data := (*merged)[:0]
			for _, p := range q.pending[:run] {
				data = append(data, p.data...)
			}
			qp = queuedPiece{piece: stripe.Piece{Server: s, ObjOffset: qp.piece.ObjOffset, Length: uint64(len(data))}, data: data, uid: qp.uid, gid: qp.gid, h: qp.h}
		}
		clear(q.pending[:run]) // the pieces' buffers can go
		q.pending = q.pending[run:]
		q.bytes -= qp.piece.Length
		failed := wb.writers[qp.h].err != 0
		var writers []*fileHandle
		var fileWrites map[*writerState]uint64 // a one-server file's, that a sync covers
		if sync.on && !failed {
			if qp.h.striped != nil {
				for h := range wb.writers {
					writers = append(writers, h)
				}
			} else {
				fileWrites = map[*writerState]uint64{}
				for _, st := range wb.writers {
					fileWrites[st] = st.writes
				}
			}
		}
		wb.mu.Unlock()
		covered := writesBefore(writers, s)
		var errno syscall.Errno
		synced := false
		if !failed { // after an error the writer's rest is dropped: it learns of the error
			if qp.h.striped != nil {
				errno, synced = qp.h.sendObjectPiece(qp, sync)
				if synced {
					// The server synced the object: every write there before is durable.
					for _, c := range covered {
						c.done()
					}
				}
			} else {
				errno, synced = qp.h.sendFilePiece(qp, sync)
			}
		}
		if merged != nil {
			mergeBuffers.Put(merged)
		}
		if errno == 0 && !failed && !synced && qp.h.striped != nil {
			for _, p := range carried[1:] {
				if p.h != qp.h {
					p.h.markDirty(s) // its fsync syncs this server too
				}
			}
		}
		wb.mu.Lock()
		wb.inflight -= int64(qp.piece.Length)
		for _, p := range carried {
			st := wb.writer(p.h)
			st.inflight -= int64(p.piece.Length)
			if errno != 0 && st.err == 0 {
				st.err = errno
			}
			if errno == 0 && !failed && !synced {
				st.writes++
			}
		}
		for st, n := range fileWrites {
			if synced && n > st.synced {
				st.synced = n // synced with this request: every write before too
			}
		}
		wb.cond.Broadcast()
		wb.mu.Unlock()
	}
}

// syncAfter asks the server to sync the object after a write (fsync, or with flags 1
// fdatasync).
type syncAfter struct {
	on    bool
	flags uint32
}

// syncing says whether the request carrying the first run pieces of q syncs: it carries a
// piece an fsync marked, and none stays queued. wb.mu held.
func (q *serverQueue) syncing(run int) syncAfter {
	marked := false
	for _, p := range q.pending[:run] {
		marked = marked || p.sync
	}
	if !marked {
		return syncAfter{}
	}
	for _, p := range q.pending[run:] {
		if p.sync {
			return syncAfter{}
		}
	}
	sa := syncAfter{on: true, flags: 1}
	if q.syncFull {
		sa.flags = 0
	}
	q.syncFull = false
	return sa
}

// askSync marks h's queued pieces: the request carrying the last of them on each server
// syncs the file (a striped file's object) there too (fsync with flags 0, fdatasync with 1),
// in the same round trip. marked says whether there were any.
func (h *fileHandle) askSync(flags uint32) (marked bool) {
	wb := h.behind
	if wb == nil || h.striped != nil && h.striped.cache != nil {
		// (a cache file's sync is its server's FSYNC, which may put it on the PFS: sync_to_pfs)
		return false
	}
	wb.mu.Lock()
	defer wb.mu.Unlock()
	for s := range wb.queues {
		q := &wb.queues[s]
		for i := range q.pending {
			if q.pending[i].h == h {
				q.pending[i].sync, marked = true, true
				if flags&1 == 0 {
					q.syncFull = true
				}
			}
		}
	}
	return marked
}

// writesSynced says whether every request that carried h's writes of a one-server file was
// synced by a WRITE_SYNC (writerState.synced).
func (h *fileHandle) writesSynced() bool {
	wb := h.behind
	if wb == nil {
		return false
	}
	wb.mu.Lock()
	defer wb.mu.Unlock()
	st := wb.writers[h]
	return st != nil && st.writes == st.synced
}

// syncedWrites is a handle's count of writes that reached an object, taken before a request
// that syncs the object: once it did, they are durable.
type syncedWrites struct {
	sf     *stripedFile
	s      int
	writes uint64
}

func (c syncedWrites) done() {
	c.sf.mu.Lock()
	if o := &c.sf.objects[c.s]; c.writes > o.synced {
		o.synced = c.writes
	}
	c.sf.mu.Unlock()
}

// writesBefore is the writes of handles hs that reached server s so far: a sync of the
// object there covers them. (Not under wb.mu: an object's open holds sf.mu for a round trip.)
func writesBefore(hs []*fileHandle, s int) []syncedWrites {
	var out []syncedWrites
	for _, h := range hs {
		if sf := h.striped; sf != nil {
			sf.mu.Lock()
			out = append(out, syncedWrites{sf: sf, s: s, writes: sf.objects[s].writes})
			sf.mu.Unlock()
		}
	}
	return out
}

// sortByOffset puts the queued pieces in the order of their offsets in the object, unless
// two of them overlap: then the order they were written in decides what the object holds,
// and it is kept.
func (q *serverQueue) sortByOffset() {
	if len(q.pending) < 2 || len(q.pending) > maxSorted || slices.IsSortedFunc(q.pending, byOffset) {
		return
	}
	sorted := slices.Clone(q.pending)
	slices.SortStableFunc(sorted, byOffset)
	for i := 1; i < len(sorted); i++ {
		if sorted[i-1].piece.ObjOffset+sorted[i-1].piece.Length > sorted[i].piece.ObjOffset {
			return
		}
	}
	copy(q.pending, sorted)
}

// maxSorted bounds the queue sortByOffset sorts, a sort per request: a longer one is sent in
// the order it was written.
const maxSorted = 256

func byOffset(a, b queuedPiece) int { return cmp.Compare(a.piece.ObjOffset, b.piece.ObjOffset) }

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
	st := wb.writer(h)
	if st.inflight > 0 {
		wb.waiters++
		wb.cond.Broadcast()
		for st.inflight > 0 {
			wb.cond.Wait()
		}
		wb.waiters--
	}
	return st.takeErr()
}

// failBehind keeps errno as an error of h's writes behind, for its next flush or fsync to
// report (a write made for h, not by its caller: the bytes a create behind held).
func (h *fileHandle) failBehind(errno syscall.Errno) {
	wb := h.behind
	if wb == nil {
		return
	}
	wb.mu.Lock()
	defer wb.mu.Unlock()
	if st := wb.writer(h); st.err == 0 {
		st.err = errno
	}
}

// takeErr is the error a write behind met, for the writer to learn. An error that
// freeing space can cure (ENOSPC, EDQUOT, EFBIG) is told once; any other (EIO: the storage
// node lost) stays with the handle, and every later write, flush and fsync of it fails:
// bytes it was told were written are lost, and a close by another process sharing the open
// file (a child's inherited descriptor) must not take the only report of it (as NFS keeps a
// fatal write error with its open context).
func (st *writerState) takeErr() syscall.Errno {
	errno := st.err
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
		st.err = 0
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
	for q.bytes < gatherBytes && wb.waiters == 0 && time.Now().Before(deadline) {
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
// again within the request's deadline. With sync.on the file is synced after the write in
// the same request (WRITE_SYNC), where the server can: synced says it was.
func (h *fileHandle) sendFilePiece(qp queuedPiece, sync syncAfter) (errno syscall.Errno, synced bool) {
	ctx, cancel := h.node.be.opCtx(context.Background())
	defer cancel()
	data, off := qp.data, qp.piece.ObjOffset
	for len(data) > 0 {
		var rep proto.CountReply
		id, gen := h.current()
		call := &client.Call{Op: proto.OpWrite, UID: qp.uid, GID: qp.gid, Data: data, Reply: &rep, Gen: gen,
			Req: &proto.WriteReq{Handle: id, Offset: off}}
		if sync.on {
			call.Op, call.MinVersion = proto.OpWriteSync, proto.WriteSyncVersion
			call.Req = &proto.WriteSyncReq{Handle: id, Offset: off, Flags: sync.flags}
		}
		errno := h.node.be.client.Do(ctx, call)
		if errno == syscall.EPROTONOSUPPORT && sync.on {
			sync.on = false // a server too old: written as before, the fsync sends an FSYNC
			continue
		}
		if errno == syscall.ESTALE {
			for h.reopen(ctx, gen) != 0 {
				select {
				case <-ctx.Done():
					return syscall.EIO, false
				case <-time.After(reopenRetry):
				}
			}
			continue
		}
		if errno != 0 {
			return errno, false
		}
		if rep.N == 0 {
			return syscall.ENOSPC, false
		}
		n := min(rep.N, uint64(len(data)))
		data, off = data[n:], off+n
		synced = sync.on && len(data) == 0 // a short write was not synced: the rest's request syncs
	}
	return 0, synced
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

// shareBehind is the write-behind of a striped file's writer handle h on this node: one for
// all of them (see writeBehind), made by the first.
func (n *node) shareBehind(h *fileHandle, servers int) *writeBehind {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.behind == nil || len(n.behind.queues) != servers {
		n.behind = newWriteBehind(n.be.writeBehind, servers)
	}
	n.behind.refs++
	return n.behind
}

// leaveBehind ends h's part in its write-behind, its writes settled: the node's shared one
// goes with its last writer.
func (h *fileHandle) leaveBehind() {
	wb := h.behind
	if wb == nil {
		return
	}
	wb.mu.Lock()
	delete(wb.writers, h)
	wb.mu.Unlock()
	n := h.node
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.behind == wb {
		if wb.refs--; wb.refs <= 0 {
			n.behind = nil
		}
	}
}
