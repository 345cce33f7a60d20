package cachestore

import (
	"syscall"

	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
)

// Calling the core: one critical section per call, its decisions carried out after it.

// batch is what one critical section decided: held requests to answer, PFS I/O to start
// (punches go to the punch queue at once, with the log position they must wait for).
//
// The log is written by those who need it on disk, not here: a writer after its data is in
// the object (a record saying dirty never precedes the bytes it covers, so a crash never
// flushes a hole over the PFS's data), a punch before it punches (the record that made the
// extent clean first), a truncate before the PFS's truncate, an Fsync, Close.
type batch struct {
	logPos uint64
	wakes  []wake
	io     []ioJob
}

type wake struct {
	ch    chan syscall.Errno
	errno syscall.Errno
}

type ioJob struct {
	act cache.Action
	fs  *fileState
}

// locked runs fn under the lock (fn calls the core and take()s its actions), then carries the
// actions out: answers to held requests, new PFS I/O.
func (s *Store) locked(fn func(b *batch)) {
	var b batch
	s.mu.Lock()
	fn(&b)
	s.mu.Unlock()
	s.carryOut(&b)
}

// take collects the log records and actions of the core call just made (under the lock).
func (s *Store) take(b *batch, acts []cache.Action) {
	b.logPos = s.log.add(s.c.Log())
	if s.log.size() > s.opt.MaxLogBytes {
		b.logPos = s.log.replace(s.c.Snapshot())
	}
	var punches []cache.Action
	for _, a := range acts {
		switch a.Kind {
		case cache.ActWake, cache.ActFail:
			if ch := s.waiters[a.Waiter]; ch != nil {
				delete(s.waiters, a.Waiter)
				b.wakes = append(b.wakes, wake{ch, a.Errno})
			}
		case cache.ActEvict, cache.ActDrop:
			punches = append(punches, a)
		case cache.ActFetch, cache.ActFlush, cache.ActSyncPFS:
			if s.closed {
				continue // Close: no new PFS I/O (the dirty state stays in the log)
			}
			fs := s.files[a.File]
			if fs == nil { // dirty data of a file no one holds: a door is found at the flush
				fs = &fileState{key: a.File, path: a.Path, written: true}
				s.files[a.File] = fs
			}
			fs.inflight++
			s.io.Add(1)
			b.io = append(b.io, ioJob{a, fs})
		}
	}
	if len(punches) > 0 {
		s.punches.push(b.logPos, punches)
	}
}

// hold registers the channel a held request is answered on.
func (s *Store) hold(r cache.Result) chan syscall.Errno {
	if r.Status != cache.Wait {
		return nil
	}
	ch := make(chan syscall.Errno, 1)
	if s.closed { // nothing will answer it: the store starts no more I/O
		ch <- syscall.EIO
		return ch
	}
	s.waiters[r.Waiter] = ch
	return ch
}

func (s *Store) carryOut(b *batch) {
	for _, w := range b.wakes {
		w.ch <- w.errno
	}
	for _, j := range b.io {
		go s.runIO(j)
	}
}

// syncLog puts every record so far on disk (a write's, before it is acknowledged).
func (s *Store) syncLog() error {
	err := s.log.sync(s.log.position())
	if err != nil {
		s.opt.Log.Error("cache store: cannot write the log", "dir", s.opt.Dir, "err", err)
	}
	return err
}

// wait is a core call's answer: at once, or when the held request is woken or failed.
func wait(r cache.Result, ch chan syscall.Errno) syscall.Errno {
	switch r.Status {
	case cache.Ready:
		return 0
	case cache.Fail:
		return r.Errno
	}
	return <-ch
}
