package proto

import (
	"io"
	"net"
	"sync"
)

// BatchWriter writes the frames of concurrent senders to one connection, several in one
// system call: a sender that finds no write in progress writes every frame queued until then
// with one writev, while the others wait for theirs to be written. Where one request is in
// flight at a time nothing changes (one writev a frame); where many are (fio's 32 reads in
// flight, four MPI ranks, a server's replies to them) the frames, and the TCP segments and
// the receiver's wake-ups they cost, are fewer.
//
// Send returns once its buffers were written (or the connection failed): the caller may
// reuse them then.
type BatchWriter struct {
	w io.Writer
	// before runs before each write (a write deadline).
	before func()

	mu      sync.Mutex
	cond    sync.Cond
	queue   net.Buffers
	spare   net.Buffers
	writing bool
	seq     uint64 // the last frame queued
	flushed uint64 // every frame up to this one is written
	writes  uint64 // the writes (writev calls) made
	err     error
}

// Counts returns the frames sent and the writes that sent them.
func (b *BatchWriter) Counts() (frames, writes uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seq, b.writes
}

// NewBatchWriter returns a BatchWriter on w; before, if not nil, runs before each write.
func NewBatchWriter(w io.Writer, before func()) *BatchWriter {
	b := &BatchWriter{w: w, before: before}
	b.cond.L = &b.mu
	return b
}

// Send writes one frame, the concatenation of bufs (empty ones are skipped), and returns once
// it is written: nil, or the connection's error.
func (b *BatchWriter) Send(bufs ...[]byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return b.err
	}
	for _, p := range bufs {
		if len(p) > 0 {
			b.queue = append(b.queue, p)
		}
	}
	b.seq++
	ticket := b.seq
	for {
		if b.flushed >= ticket {
			return nil
		}
		if b.err != nil {
			return b.err
		}
		if !b.writing {
			b.writeQueued()
			continue
		}
		b.cond.Wait()
	}
}

// writeQueued writes every frame queued, with b.mu held on entry and on return (released
// during the write), and wakes the senders waiting.
func (b *BatchWriter) writeQueued() {
	b.writing = true
	b.writes++
	batch, upto := b.queue, b.seq
	b.queue, b.spare = b.spare[:0], nil
	b.mu.Unlock()
	if b.before != nil {
		b.before()
	}
	all := batch // WriteTo consumes batch
	_, err := batch.WriteTo(b.w)
	clear(all) // keep no caller's buffer
	b.mu.Lock()
	b.spare = all[:0]
	if err != nil && b.err == nil {
		b.err = err
	}
	if err == nil {
		b.flushed = upto
	}
	b.writing = false
	b.cond.Broadcast()
}
