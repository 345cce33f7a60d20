package cachestore

import (
	"os"
	"path/filepath"
	"sync"
)

// opLog is the cache's operation log file with group commit. Records are added in the order
// of the core's calls (under the store's lock: a memory append), and written by whichever
// caller next needs them on disk (outside the store's lock): every caller waits only for the
// bytes its own call produced, and one write carries everything added so far.
//
// A compaction replaces the pending bytes with a snapshot of the whole state; the writer then
// writes it to a new file and renames it over the log, so the file on disk is always a
// snapshot followed by the records since.
type opLog struct {
	path    string
	syncLog bool // fdatasync each append (survive a node crash, not only a restart)

	mu       sync.Mutex // guards the fields below; never held across I/O
	pending  []byte
	rotate   bool   // pending starts with a snapshot: write a new file
	added    uint64 // bytes added since the store opened (a position in the stream)
	fileSize int64  // bytes in the file on disk plus pending ones not in a rotation
	err      error  // a failed write: nothing more can be made durable

	wmu     sync.Mutex // one writer at a time, in order
	durable uint64     // the stream is on disk up to here (guarded by wmu)
	f       *os.File   // guarded by wmu
}

// add appends records and returns the stream position a caller must wait for.
func (l *opLog) add(b []byte) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(l.pending, b...)
	l.added += uint64(len(b))
	l.fileSize += int64(len(b))
	return l.added
}

// position is the end of the stream so far.
func (l *opLog) position() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.added
}

// size is how long the log file will be once the pending bytes are written.
func (l *opLog) size() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fileSize
}

// replace drops the pending records for snap, the whole state now: they are in it.
func (l *opLog) replace(snap []byte) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(l.pending[:0:0], snap...)
	l.rotate = true
	l.added += uint64(len(snap))
	l.fileSize = int64(len(snap))
	return l.added
}

// sync returns once the stream is on disk up to target.
func (l *opLog) sync(target uint64) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.durable >= target {
		return nil
	}
	l.mu.Lock()
	buf, rotate, end, err := l.pending, l.rotate, l.added, l.err
	l.pending, l.rotate = nil, false
	l.mu.Unlock()
	if err != nil {
		return err
	}
	if rotate {
		err = l.writeNew(buf)
	} else if len(buf) > 0 {
		if _, err = l.f.Write(buf); err == nil && l.syncLog {
			err = l.f.Sync()
		}
	}
	if err != nil {
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		return err
	}
	l.durable = end
	return nil
}

// writeNew writes b as a new log file and renames it over the old one.
func (l *opLog) writeNew(b []byte) error {
	tmp := l.path + ".new"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, l.path)
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	syncDir(filepath.Dir(l.path))
	if l.f != nil {
		l.f.Close()
	}
	l.f = f
	return nil
}

// close writes what is pending and closes the file.
func (l *opLog) close() error {
	l.mu.Lock()
	target := l.added
	l.mu.Unlock()
	err := l.sync(target)
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.f != nil {
		if cerr := l.f.Close(); err == nil {
			err = cerr
		}
		l.f = nil
	}
	l.mu.Lock()
	if l.err == nil {
		l.err = os.ErrClosed
	}
	l.mu.Unlock()
	return err
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// fsync makes everything added so far durable on the SSD, not only written (an fsync of a
// file without sync_to_pfs).
func (l *opLog) fsync() error {
	l.mu.Lock()
	target := l.added
	l.mu.Unlock()
	if err := l.sync(target); err != nil {
		return err
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.f == nil {
		return os.ErrClosed
	}
	return l.f.Sync()
}
