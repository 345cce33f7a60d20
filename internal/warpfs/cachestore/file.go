package cachestore

import (
	"errors"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// --- opening files -------------------------------------------------------------------------

// File is one open of a PFS file through the store.
type File struct {
	s     *Store
	fs    *fileState
	h     cache.Handle
	key   cache.FileKey
	slot  uint64 // this server's position among the file's servers
	lay   stripe.Layout
	write bool

	closeOnce sync.Once
}

// Key is the file's identity.
func (f *File) Key() cache.FileKey { return f.key }

func attrsOf(st unix.Stat_t) cache.Attrs {
	return cache.Attrs{Size: uint64(st.Size), Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}
}

// errnoOf is err's errno (EIO if it has none).
func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) && errno != 0 {
		return errno
	}
	return syscall.EIO
}

func errOf(errno syscall.Errno) error {
	if errno == 0 {
		return nil
	}
	return errno
}

// openPFS opens ref's PFS file through door and checks it is the file the namespace server
// saw (ESTALE if the path now names another). A path that is gone may be a file removed
// while open: the namespace server keeps it under a hidden name in the same directory until
// its last close (cache.UnlinkedPath), which is tried then.
func openPFS(door *pfsio.Door, path string, key cache.FileKey, flags int) (*pfsio.File, unix.Stat_t, error) {
	pf, err := door.OpenFile(path, flags, 0)
	if errnoOf(err) == syscall.ENOENT && !cache.IsUnlinkedName(path) {
		if hidden, herr := door.OpenFile(cache.UnlinkedPath(path, key.Ino), flags, 0); herr == nil {
			pf, err = hidden, nil
		}
	}
	if err != nil {
		return nil, unix.Stat_t{}, errnoOf(err)
	}
	st := pf.Stat // the user's process fstat'ed it at open
	// The inode number alone: the key's st_dev is the namespace server's, and a network file
	// system's st_dev differs from node to node.
	if st.Ino != key.Ino {
		pf.Close()
		return nil, st, syscall.ESTALE
	}
	return pf, st, nil
}

// OpenFile opens ref through door (for writing too if write): the PFS file is opened as the
// user, checked to be ref.Key (ESTALE), and its attributes compared with what the cache last
// saw (close-to-open: clean data of a file changed on the PFS is dropped).
func (s *Store) OpenFile(door *pfsio.Door, ref FileRef, write bool) (*File, error) {
	if ref.Layout != (stripe.Layout{}) && ref.Layout.Slot(s.cfg.Server) < 0 {
		return nil, syscall.EINVAL
	}
	flags := unix.O_RDONLY
	if write {
		flags = unix.O_RDWR // read-modify-write fetches read through it too
	}
	pf, st, err := openPFS(door, ref.Path, ref.Key, flags)
	if err != nil {
		return nil, err
	}
	f := &File{s: s, key: ref.Key, lay: ref.Layout, write: write}
	if ref.Layout != (stripe.Layout{}) {
		f.slot = uint64(ref.Layout.Slot(s.cfg.Server))
	}
	adopted := false
	var openErr error
	s.locked(func(b *batch) {
		if s.closed {
			openErr = syscall.EIO
			return
		}
		fs := s.files[ref.Key]
		if fs == nil {
			fs = &fileState{key: ref.Key}
			s.files[ref.Key] = fs
		}
		if _, err := s.objLocked(fs); err != nil {
			openErr = errnoOf(err)
			s.releaseLocked(fs)
			return
		}
		opened, acts, err := s.c.Open(ref.Key, ref.Path, ref.Layout, attrsOf(st), s.overrideLocked(ref))
		if err != nil {
			s.opt.Log.Warn("cache store: cannot open", "path", ref.Path, "err", err)
			openErr = syscall.EINVAL
			s.releaseLocked(fs)
			return
		}
		fs.path, fs.layout, fs.door = ref.Path, ref.Layout, door
		fs.opens++
		s.unlinger(fs)
		if write && fs.wr == nil {
			fs.wr, adopted = pf, true
		}
		if fs.rd == nil {
			fs.rd, adopted = pf, true
		}
		f.fs, f.h = fs, opened.Handle
		s.take(b, acts)
	})
	if !adopted {
		pf.Close()
	}
	if openErr != nil {
		return nil, openErr
	}
	return f, nil
}

// objLocked is fs's object file, opened (created) if it is not. Under the lock, so that it
// never races with the removal of a dropped file's object.
func (s *Store) objLocked(fs *fileState) (*os.File, error) {
	if fs.obj == nil {
		o, err := os.OpenFile(s.objectPath(fs.key), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		fs.obj = o
	}
	return fs.obj, nil
}

func (s *Store) linger(fs *fileState) {
	if !fs.lingering {
		fs.lingering, fs.lingerSince = true, time.Now()
		s.lingering[fs] = struct{}{}
	}
}

func (s *Store) unlinger(fs *fileState) {
	fs.lingering = false
	delete(s.lingering, fs)
}

// releaseLocked lets go of what fs holds once nobody uses it: everything if it cannot be
// dirty, all but the write descriptor (and door) if it may be (until the ticker finds it
// clean). The descriptors are closed in the background: closing a PFS file is a request.
func (s *Store) releaseLocked(fs *fileState) {
	if fs.opens > 0 || fs.inflight > 0 {
		return
	}
	var toClose []io.Closer
	if fs.rd != nil && fs.rd != fs.wr {
		toClose = append(toClose, fs.rd)
	}
	fs.rd = nil
	if fs.written {
		s.linger(fs)
	} else {
		s.unlinger(fs)
		if fs.wr != nil {
			toClose = append(toClose, fs.wr)
		}
		if fs.obj != nil {
			toClose = append(toClose, fs.obj)
		}
		fs.wr, fs.obj, fs.door = nil, nil, nil
		if s.files[fs.key] == fs {
			delete(s.files, fs.key)
		}
	}
	if len(toClose) > 0 {
		go func() {
			for _, c := range toClose {
				c.Close()
			}
		}()
	}
}

// --- reads and writes ----------------------------------------------------------------------

// fileOff is the file offset of object offset o (the core works in file offsets).
func (f *File) fileOff(o uint64) uint64 {
	if f.lay == (stripe.Layout{}) {
		return o
	}
	size := f.lay.Size
	return ((o/size)*uint64(f.lay.Width)+f.slot)*size + o%size
}

// ReadAt reads p at object offset objOff, one extent at a time (the core admits requests
// within one extent). Holes (past the file's end) read as zeros: the caller bounds reads by
// the file's size.
func (f *File) ReadAt(p []byte, objOff uint64) (int, error) {
	s, E := f.s, f.s.cfg.ExtentSize
	done := 0
	for done < len(p) {
		o := objOff + uint64(done)
		n := min(uint64(len(p)-done), E-o%E)
		off := f.fileOff(o)
		var r cache.Result
		var ch chan syscall.Errno
		s.locked(func(b *batch) {
			var acts []cache.Action
			r, acts = s.c.Read(f.h, off, n)
			ch = s.hold(r)
			s.take(b, acts)
		})
		if errno := wait(r, ch); errno != 0 {
			return done, errno
		}
		s.punches.waitQueued()
		err := readFull(f.fs.obj, p[done:done+int(n)], int64(o))
		s.locked(func(b *batch) { s.take(b, s.c.ReadDone(f.h, off, n)) })
		if err != nil {
			return done, syscall.EIO
		}
		done += int(n)
	}
	return done, nil
}

// readFull preads p at off; bytes past the object's end are zeros (sparse).
func readFull(obj *os.File, p []byte, off int64) error {
	n, err := obj.ReadAt(p, off)
	if err == io.EOF {
		clear(p[n:])
		err = nil
	}
	return err
}

// WriteAt writes p at object offset objOff, one extent at a time. It returns once the data is
// in the object and the log says it is dirty (write-behind): the PFS sees it later.
func (f *File) WriteAt(p []byte, objOff uint64) (int, error) {
	if !f.write {
		return 0, syscall.EBADF
	}
	s, E := f.s, f.s.cfg.ExtentSize
	done := 0
	for done < len(p) {
		o := objOff + uint64(done)
		n := min(uint64(len(p)-done), E-o%E)
		off := f.fileOff(o)
		var r cache.Result
		var ch chan syscall.Errno
		s.locked(func(b *batch) {
			var acts []cache.Action
			r, acts = s.c.Write(f.h, off, n)
			ch = s.hold(r)
			if r.Status != cache.Fail {
				f.fs.written = true
			}
			s.take(b, acts)
		})
		if errno := wait(r, ch); errno != 0 {
			return done, errno
		}
		s.punches.waitQueued()
		_, err := f.fs.obj.WriteAt(p[done:done+int(n)], int64(o))
		errno := syscall.Errno(0)
		if err != nil {
			errno = errnoOf(err)
		} else if s.syncLog() != nil {
			// The data first, then the record saying it is dirty (made when the write was
			// admitted, by this call or the one that woke it); without it, no ack.
			errno = syscall.EIO
		}
		s.locked(func(b *batch) { s.take(b, s.c.WriteDone(f.h, off, n)) })
		if errno != 0 {
			return done, errno
		}
		done += int(n)
	}
	return done, nil
}

// Fsync: with sync_to_pfs, returns once the file's writes so far are on the PFS and the PFS
// file is synced (or a flush's error); else once they are safe on the SSD (object and log
// synced).
func (f *File) Fsync() error {
	s := f.s
	var r cache.Result
	var ch chan syscall.Errno
	s.locked(func(b *batch) {
		var acts []cache.Action
		r, acts = s.c.Fsync(f.h)
		ch = s.hold(r)
		s.take(b, acts)
	})
	if r.Status == cache.Ready {
		if err := f.fs.obj.Sync(); err != nil {
			return errnoOf(err)
		}
		if err := s.log.fsync(); err != nil {
			return syscall.EIO
		}
		return nil
	}
	return errOf(wait(r, ch))
}

// SyncToPFS returns once the file's writes so far (through any open, on this server) are on
// the PFS and the PFS file is synced, or a flush's error: an fsync with sync_to_pfs, whatever
// the file's policy (libdatawarp's dw_wait_sync_complete).
func (f *File) SyncToPFS() error {
	s := f.s
	var r cache.Result
	var ch chan syscall.Errno
	s.locked(func(b *batch) {
		var acts []cache.Action
		r, acts = s.c.SyncToPFS(f.h)
		ch = s.hold(r)
		s.take(b, acts)
	})
	return errOf(wait(r, ch))
}

// Closing is a close's sync, before the close itself (the mount's FLUSH): with
// sync_on_close, SyncToPFS; else nothing.
func (f *File) Closing() error {
	f.s.mu.Lock()
	soc := f.s.c.Policy(f.key).SyncOnClose
	f.s.mu.Unlock()
	if !soc {
		return nil
	}
	return f.SyncToPFS()
}

// Close closes the file; with sync_on_close it returns once its data is on the PFS and
// synced (or a flush's error). A file left dirty keeps a PFS write descriptor until it is
// flushed; past MaxOpenPFSFiles such files, the oldest is flushed now.
func (f *File) Close() error {
	errno := syscall.EBADF
	f.closeOnce.Do(func() {
		s := f.s
		var r cache.Result
		var ch chan syscall.Errno
		s.locked(func(b *batch) {
			var acts []cache.Action
			r, acts = s.c.Close(f.h)
			ch = s.hold(r)
			s.take(b, acts)
		})
		errno = wait(r, ch)
		var oldest *fileState
		s.mu.Lock()
		f.fs.opens--
		s.releaseLocked(f.fs)
		if n := s.openLingering(); n > s.opt.MaxOpenPFSFiles {
			oldest = s.oldestLingering()
		}
		s.mu.Unlock()
		if oldest != nil {
			if err := s.flushFile(oldest); err != nil {
				s.opt.Log.Warn("cache store: flushing a closed file to free its PFS descriptor", "path", oldest.path, "err", err)
			}
		}
	})
	return errOf(errno)
}

// openLingering counts the closed files holding a PFS descriptor for their dirty data.
func (s *Store) openLingering() int {
	n := 0
	for fs := range s.lingering {
		if fs.wr != nil {
			n++
		}
	}
	return n
}

func (s *Store) oldestLingering() *fileState {
	var oldest *fileState
	for fs := range s.lingering {
		if fs.wr != nil && fs.inflight == 0 && (oldest == nil || fs.lingerSince.Before(oldest.lingerSince)) {
			oldest = fs
		}
	}
	return oldest
}

// flushFile flushes and syncs a closed file's dirty data now (as a sync_on_close open and
// close would), then lets go of its descriptors if it is clean.
func (s *Store) flushFile(fs *fileState) error {
	s.mu.Lock()
	if fs.wr == nil || fs.opens > 0 {
		s.mu.Unlock()
		return nil
	}
	fs.inflight++ // keeps wr open
	wr := fs.wr
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		fs.inflight--
		s.sweepLocked(fs)
		s.mu.Unlock()
	}()
	st, err := wr.Fstat()
	if err != nil {
		return err
	}
	yes := true
	var r cache.Result
	var ch chan syscall.Errno
	s.locked(func(b *batch) {
		opened, acts, err := s.c.Open(fs.key, fs.path, fs.layout, attrsOf(st), cache.Override{SyncOnClose: &yes})
		if err != nil {
			r = cache.Result{Status: cache.Fail, Errno: syscall.EINVAL}
			return
		}
		s.take(b, acts)
		r, acts = s.c.Close(opened.Handle)
		ch = s.hold(r)
		s.take(b, acts)
	})
	return errOf(wait(r, ch))
}

// sweepLocked lets go of lingering files that the core says are clean now (fs: just that one;
// nil: all of them).
func (s *Store) sweepLocked(only *fileState) {
	if len(s.lingering) == 0 {
		return
	}
	dirty := s.c.DirtyFiles()
	check := func(fs *fileState) {
		if fs.lingering && fs.opens == 0 && fs.inflight == 0 && dirty[fs.path] == 0 {
			fs.written = false
			s.releaseLocked(fs)
		}
	}
	if only != nil {
		check(only)
		return
	}
	for fs := range s.lingering {
		check(fs)
	}
}

// SetOverride sets the file's cache policy overrides (libdatawarp's per-file settings); they
// last until the file's next open.
func (f *File) SetOverride(o cache.Override) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	f.s.c.SetOverride(f.key, o)
}

// NoteAttrs tells the cache the PFS file's attributes after a change the instance made itself
// (another server's flush, a utimens through the namespace server), so that the next open
// does not take it for someone else's change and drop the clean data.
func (s *Store) NoteAttrs(key cache.FileKey, attrs cache.Attrs) {
	s.locked(func(b *batch) {
		s.c.NoteAttrs(key, attrs)
		s.take(b, nil)
	})
}
