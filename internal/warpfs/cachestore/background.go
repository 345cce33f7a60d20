package cachestore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
)

// The background: the ticker, PFS fetches, flushes and fsyncs, punches.

func (s *Store) ticker() {
	defer close(s.tickDone)
	t := time.NewTicker(s.opt.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.locked(func(b *batch) {
				s.take(b, s.c.Tick(now))
				s.sweepLocked(nil)
			})
		}
	}
}

// runIO carries out one fetch, flush or PFS fsync and reports its outcome to the core.
func (s *Store) runIO(j ioJob) {
	defer s.io.Done()
	a := j.act
	var err error
	switch a.Kind {
	case cache.ActFetch:
		err = s.fetch(j)
		if err != nil && err != errDropped {
			s.opt.Log.Warn("cache store: fetch failed", "path", a.Path, "off", a.Range.Off, "len", a.Range.Len, "err", err)
		}
		s.done(j, func() []cache.Action { return s.c.FetchDone(a.ID, err) })
	case cache.ActFlush:
		var attrs cache.Attrs
		attrs, err = s.flush(j)
		if err != nil && err != errDropped {
			s.opt.Log.Warn("cache store: flush failed", "path", a.Path, "off", a.Range.Off, "len", a.Range.Len, "err", err)
		}
		s.done(j, func() []cache.Action {
			s.forgetClosedDoor(j.fs, err)
			if err != nil && s.drainFail != nil {
				if fe := unrecoverable(a.Path, err); fe != nil {
					select {
					case s.drainFail <- fe:
					default:
					}
				}
			}
			return s.c.FlushDone(time.Now(), a.ID, j.fs.newestAttrs(attrs), err)
		})
	case cache.ActSyncPFS:
		err = s.syncPFS(j)
		s.done(j, func() []cache.Action {
			s.forgetClosedDoor(j.fs, err)
			return s.c.SyncDone(a.ID, err)
		})
	}
}

// forgetClosedDoor: a write that failed ENOTCONN went through a door that was closed (or
// whose worker died): its write descriptor is useless, so the next try finds a door anew
// (an OpenFile's, SetDoor's) or Drain says there is none.
func (s *Store) forgetClosedDoor(fs *fileState, err error) {
	if !errors.Is(err, pfsio.ErrClosed) || fs.wr == nil {
		return
	}
	wr := fs.wr
	fs.wr, fs.door = nil, nil
	if fs.rd != wr { // reads through a closed door still work: keep it for them
		go wr.Close()
	}
}

// unrecoverable is the error Drain reports for a flush's failure, nil if retrying may help.
func unrecoverable(path string, err error) *FileError {
	switch {
	case errors.Is(err, errNoDoor), errors.Is(err, pfsio.ErrClosed):
		return &FileError{Path: path, Err: syscall.ENOTCONN, Why: errNoDoor.Error()}
	case errors.Is(err, syscall.ESTALE):
		return &FileError{Path: path, Err: syscall.ESTALE, Why: "the PFS file at the path is another file now"}
	case errors.Is(err, syscall.ENOENT):
		// Not at its path, nor anywhere in the directory (ioFiles looked): removed on the
		// PFS, or moved out of the cache's directory, with no descriptor left to it.
		return &FileError{Path: path, Err: syscall.ENOENT, Why: "the PFS file is gone: removed or moved out of the cache's directory"}
	}
	if errno := cache.Errno(err); errno != syscall.EIO {
		return &FileError{Path: path, Err: errno, Why: "flushing to the PFS"}
	}
	return nil
}

// newestAttrs is attrs unless a flush reported later ones already (two flushes of a file in
// flight may fstat in one order and report in the other; the core must keep the later, or
// the next open takes the file for changed): then none (the core keeps what it has).
func (fs *fileState) newestAttrs(attrs cache.Attrs) cache.Attrs {
	n := fs.flushAttrs
	if attrs == (cache.Attrs{}) || attrs.Ctime < n.Ctime || attrs.Ctime == n.Ctime && attrs.Size < n.Size {
		return cache.Attrs{}
	}
	fs.flushAttrs = attrs
	return attrs
}

func (s *Store) done(j ioJob, report func() []cache.Action) {
	s.locked(func(b *batch) {
		acts := report()
		j.fs.inflight--
		s.take(b, acts)
		s.releaseLocked(j.fs)
	})
}

// ioFiles are the object and a PFS descriptor for j (write: one that can write), opening the
// PFS file through the file's door (or SetDoor's) if none is held.
func (s *Store) ioFiles(j ioJob, write bool) (*pfsio.File, *os.File, error) {
	fs := j.fs
	s.mu.Lock()
	obj, err := s.objLocked(fs)
	pf := fs.wr
	if !write {
		pf = fs.rd // a write descriptor may be write-only (opened for a flush)
	}
	door, resolve, path := fs.door, s.resolve, fs.path
	s.mu.Unlock()
	if err != nil || pf != nil {
		return pf, obj, err
	}
	if door == nil && resolve != nil {
		if door, err = resolve(path); err != nil {
			return nil, nil, fmt.Errorf("%w (%v)", errNoDoor, err)
		}
	}
	if door == nil {
		return nil, nil, errNoDoor
	}
	flags := unix.O_RDONLY
	if write {
		flags = unix.O_WRONLY
	}
	pf, _, err = openPFS(door, path, fs.key, flags)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ESTALE) {
		// The file was renamed (or its directory) since the store last had it open, and the
		// store has since lost its descriptor (a restart, a dead worker): find it by its
		// inode in the PFS directory.
		if moved := findIno(door, "", fs.key.Ino); moved != "" {
			if pf, _, err = openPFS(door, moved, fs.key, flags); err == nil {
				s.opt.Log.Info("cache store: a dirty file found under its new name", "was", path, "now", moved)
				s.mu.Lock()
				if fs.path == path {
					fs.path = moved
				}
				s.mu.Unlock()
			}
		}
	}
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	held := &fs.rd
	if write {
		held = &fs.wr
	}
	if *held != nil { // another job opened one meanwhile
		go pf.Close()
		return *held, obj, nil
	}
	*held, fs.door = pf, door
	return pf, obj, nil
}

// findIno is the path of a regular file with inode ino under dir of door's tree, "" if none.
func findIno(door *pfsio.Door, dir string, ino uint64) string {
	var found string
	var subdirs []string
	door.ReadDir(dir, func(entries []pfsio.Entry) error {
		for _, e := range entries {
			p := e.Name
			if dir != "" {
				p = dir + "/" + e.Name
			}
			mode := e.Stat.Mode & syscall.S_IFMT
			if e.Errno != 0 {
				mode = e.Type
			}
			switch mode {
			case syscall.S_IFREG:
				if e.Errno == 0 && e.Stat.Ino == ino {
					found = p
					return io.EOF
				}
			case syscall.S_IFDIR:
				subdirs = append(subdirs, p)
			}
		}
		return nil
	})
	for _, sub := range subdirs {
		if found == "" {
			found = findIno(door, sub, ino)
		}
	}
	return found
}

func (s *Store) buf(n uint64) (*[]byte, []byte) {
	bp := s.bufs.Get().(*[]byte)
	if uint64(len(*bp)) < n {
		b := make([]byte, n)
		bp = &b
	}
	return bp, (*bp)[:n]
}

// fetch reads the range from the PFS into the object; past the PFS file's end it stays a hole.
func (s *Store) fetch(j ioJob) error {
	pf, obj, err := s.ioFiles(j, false)
	if err != nil {
		return err
	}
	r := j.act.Range
	bp, b := s.buf(r.Len)
	defer s.bufs.Put(bp)
	n, err := pf.ReadAt(b, int64(r.Off))
	if err != nil && err != io.EOF {
		return err
	}
	s.punches.waitQueued()
	s.objMu.RLock()
	defer s.objMu.RUnlock()
	if !s.stillIn(j.act, cache.Fetching) {
		return errDropped
	}
	_, err = obj.WriteAt(b[:n], int64(r.ObjOff))
	return err
}

// errDropped: the file's extents were dropped while their fetch or flush was in flight.
var errDropped = errors.New("the file's cached data was dropped meanwhile")

// stillIn reports whether every extent of a's range is still in state (not dropped).
func (s *Store) stillIn(a cache.Action, state cache.State) bool {
	E := s.cfg.ExtentSize
	s.mu.Lock()
	defer s.mu.Unlock()
	for idx := a.Range.Off / E; idx <= (a.Range.End()-1)/E; idx++ {
		if s.c.ExtentState(a.File, idx) != state {
			return false
		}
	}
	return true
}

// flush writes the range from the object to the PFS and returns the PFS file's attributes
// after it.
func (s *Store) flush(j ioJob) (cache.Attrs, error) {
	pf, obj, err := s.ioFiles(j, true)
	if err != nil {
		return cache.Attrs{}, err
	}
	r := j.act.Range
	bp, b := s.buf(r.Len)
	defer s.bufs.Put(bp)
	s.punches.waitQueued()
	s.objMu.RLock()
	if !s.stillIn(j.act, cache.Flushing) {
		s.objMu.RUnlock()
		return cache.Attrs{}, errDropped
	}
	err = readFull(obj, b, int64(r.ObjOff))
	s.objMu.RUnlock()
	if err != nil {
		return cache.Attrs{}, err
	}
	if _, err := pf.WriteAt(b, int64(r.Off)); err != nil {
		return cache.Attrs{}, err
	}
	st, err := pf.Fstat()
	if err != nil {
		return cache.Attrs{}, nil // the write landed; the attributes are only a hint
	}
	return attrsOf(st), nil
}

func (s *Store) syncPFS(j ioJob) error {
	pf, _, err := s.ioFiles(j, true)
	if err != nil {
		return err
	}
	return pf.Sync(false)
}

// punch carries out evictions and drops, once the log records that allowed them are on disk
// (a recovery must never find a hole where the log says dirty).
func (s *Store) punch(j punchJob) {
	if err := s.log.sync(j.logPos); err != nil {
		return // the log is broken: keep the data, the store fails its writes from now on
	}
	s.objMu.Lock()
	defer s.objMu.Unlock()
	for _, a := range j.actions {
		path := s.objectPath(a.File)
		switch a.Kind {
		case cache.ActEvict:
			if err := punchObject(path, a.Range); err != nil && !errors.Is(err, os.ErrNotExist) {
				s.opt.Log.Warn("cache store: punching an object", "path", a.Path, "err", err)
			}
		case cache.ActDrop:
			// Removed if no open file uses the object (under the lock, as objLocked opens
			// it); else emptied, so that the descriptors in use stay on the one object.
			s.mu.Lock()
			if s.files[a.File] == nil {
				os.Remove(path)
			} else if err := os.Truncate(path, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				s.opt.Log.Warn("cache store: emptying an object", "path", a.Path, "err", err)
			}
			s.mu.Unlock()
		}
	}
}

// punchObject punches a hole over r in the object at path (r.Len 0: shortens it to r.ObjOff).
func punchObject(path string, r cache.Range) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if r.Len == 0 {
		st, err := f.Stat()
		if err != nil || uint64(st.Size()) <= r.ObjOff {
			return err
		}
		return f.Truncate(int64(r.ObjOff))
	}
	return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(r.ObjOff), int64(r.Len))
}
