// Package cachestore is the I/O layer of a cache instance on one storage server: it runs the
// pure cache core (package cache) over one fragment's directory on the SSD, the PFS door
// (package pfsio) and an operation log, carrying out the actions the core decides.
//
// A fragment's directory holds objects/, one sparse object file per cached PFS file (named
// by its FileKey, "%016x-%016x": dev, ino), in this server's object offsets (package stripe),
// and log, the core's operation log: a snapshot followed by the records since.
//
// Threads: the callers' own (the storage server's request goroutines), one goroutine per
// PFS fetch, flush or fsync in flight (the core bounds them: MaxFetchesInFlight,
// MaxFlushesInFlight), one that punches holes in objects in the core's order, and a ticker
// (Options.TickInterval) that lets the core retry failed flushes and start watermark ones.
// One mutex serialises calls into the core (it is not safe for concurrent use); it is never
// held across PFS or data I/O.
//
// docs/architecture.md ("The cache store (I/O layer)") says more.
package cachestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// FileRef names a PFS file a client opened through the instance's namespace server.
type FileRef struct {
	Path   string        // relative to the PFS directory (pfsio path rules)
	Key    cache.FileKey // (st_dev, st_ino) the namespace server saw; checked at open (ESTALE if the PFS file at Path is another)
	Layout stripe.Layout // the file's stripe layout
}

// Options configure a Store. Zero fields take the defaults below.
type Options struct {
	Dir    string       // this fragment's directory on the SSD (objects + log), created if absent
	Config cache.Config // Server index, Capacity, policy defaults...
	Log    *slog.Logger

	// MaxOpenPFSFiles bounds the PFS files kept open after their last close because they
	// still hold dirty data (a flush needs a write descriptor). A close that goes past it
	// first flushes the file closed longest ago, so that its descriptor can be let go.
	MaxOpenPFSFiles int
	// TickInterval is how often the core is given the time (retries of failed flushes,
	// watermark flushes) and closed files are checked for being clean.
	TickInterval time.Duration
	// MaxLogBytes: when the log file grows past it, it is compacted into a snapshot.
	MaxLogBytes int64
	// SyncLog makes every log append fdatasync'ed: dirty state then survives a node crash,
	// not only a restart of the agent (a plain write survives that).
	SyncLog bool
}

// Defaults of Options.
const (
	DefaultMaxOpenPFSFiles = 64
	DefaultTickInterval    = 200 * time.Millisecond
	DefaultMaxLogBytes     = 64 << 20
)

func (o Options) withDefaults() Options {
	if o.MaxOpenPFSFiles <= 0 {
		o.MaxOpenPFSFiles = DefaultMaxOpenPFSFiles
	}
	if o.TickInterval <= 0 {
		o.TickInterval = DefaultTickInterval
	}
	if o.MaxLogBytes <= 0 {
		o.MaxLogBytes = DefaultMaxLogBytes
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// FileError is an error about one PFS file's cached data (Drain's): errors.Is(err,
// syscall.ENOSPC) and the like see its Err.
type FileError struct {
	Path  string
	Dirty uint64 // dirty bytes of the file on this server, when known
	Err   syscall.Errno
	Why   string
}

func (e *FileError) Error() string {
	return fmt.Sprintf("cache store: %q: %s: %v", e.Path, e.Why, e.Err)
}

func (e *FileError) Unwrap() error { return e.Err }

// maxPFSWrite is the longest pfsio File.WriteAt.
const maxPFSWrite = 64 << 20

// errNoDoor: a flush or fetch of a file for which no PFS door is known (recovered after a
// restart, not opened since, and no SetDoor).
var errNoDoor = errors.New("no PFS door for the file: open it through the store or call SetDoor")

// fileState is the I/O side of one PFS file the store has something of: its object, the PFS
// descriptors, who uses them. Guarded by Store.mu; the descriptors themselves are used
// outside it, kept open while opens or inflight say someone uses them.
type fileState struct {
	key    cache.FileKey
	path   string
	layout stripe.Layout
	door   *pfsio.Door // the last door it was opened through (nil after a restart)
	rd, wr *pfsio.File // for fetches; for flushes and fsyncs (may be the same file)
	obj    *os.File

	opens    int  // Files open
	inflight int  // fetches, flushes, syncs using its descriptors
	written  bool // it may hold dirty data: a write was admitted (or it was recovered)
	// lingering: no File is open but it may be dirty; since when (the oldest is flushed
	// first when MaxOpenPFSFiles is passed)
	lingering   bool
	lingerSince time.Time
}

// Store is one cache instance's fragment on one storage server.
type Store struct {
	opt     Options
	cfg     cache.Config // with the core's defaults
	objDir  string
	log     *opLog
	punches *punchQueue

	mu        sync.Mutex
	c         *cache.Cache
	files     map[cache.FileKey]*fileState
	lingering map[*fileState]struct{}
	waiters   map[cache.WaiterID]chan syscall.Errno
	resolve   func(path string) (*pfsio.Door, error)
	drainFail chan error // a Drain in progress hears of unrecoverable flush errors here
	// truncating: a file's truncate in progress, closed when it ends (the core takes one
	// truncate of a file at a time: the next waits here)
	truncating map[cache.FileKey]chan struct{}
	closed    bool

	// objMu: punches (write) against fetches' and flushes' object I/O (read), which check
	// under it that their extents are still theirs: a Discard or an unlink at the last close
	// may drop a file while its fetch or flush is in flight, and its fetch must not write
	// into the emptied object, nor its flush write the emptied object's zeros to the PFS.
	objMu sync.RWMutex

	io        sync.WaitGroup // fetch, flush and sync goroutines
	stop      chan struct{}
	tickDone  chan struct{}
	punchDone chan struct{}
	bufs      sync.Pool
}

// Open opens the fragment in opt.Dir, recovering the dirty state its log records: dirty
// extents stay dirty (their data is in the objects), everything else is dropped. Recovered
// files have no PFS door until OpenFile (or SetDoor) gives one.
func Open(opt Options) (*Store, error) {
	opt = opt.withDefaults()
	if opt.Config.MaxIOBytes > maxPFSWrite {
		opt.Config.MaxIOBytes = maxPFSWrite // a flush is one door write
	}
	objDir := filepath.Join(opt.Dir, "objects")
	if err := os.MkdirAll(objDir, 0o700); err != nil {
		return nil, err
	}
	logPath := filepath.Join(opt.Dir, "log")
	data, err := os.ReadFile(logPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var c *cache.Cache
	var recovered []cache.Action
	if len(data) > 0 {
		c, recovered, err = cache.Recover(opt.Config, data)
	} else {
		c, err = cache.New(opt.Config)
	}
	if err != nil {
		return nil, fmt.Errorf("cache store %s: %w", opt.Dir, err)
	}
	s := &Store{opt: opt, cfg: c.Config(), objDir: objDir, c: c,
		log:   &opLog{path: logPath, syncLog: opt.SyncLog},
		files: map[cache.FileKey]*fileState{}, lingering: map[*fileState]struct{}{},
		waiters: map[cache.WaiterID]chan syscall.Errno{}, punches: newPunchQueue(),
		truncating: map[cache.FileKey]chan struct{}{},
		stop: make(chan struct{}), tickDone: make(chan struct{}), punchDone: make(chan struct{})}
	s.bufs.New = func() any { b := make([]byte, s.cfg.MaxIOBytes); return &b }
	if err := s.recover(data, recovered); err != nil {
		return nil, err
	}
	// The recovered state, compacted, starts the new log.
	if err := s.log.sync(s.log.replace(c.Snapshot())); err != nil {
		return nil, fmt.Errorf("cache store %s: writing the log: %w", opt.Dir, err)
	}
	go func() { s.punches.run(s.punch); close(s.punchDone) }()
	go s.ticker()
	return s, nil
}

// recover punches what the core says is not dirty in the recovered files' objects, removes
// every other object, and makes the recovered files known (without a door).
func (s *Store) recover(data []byte, actions []cache.Action) error {
	layouts := map[cache.FileKey]stripe.Layout{}
	recs, _ := cache.Decode(data) // Recover read them: an error here cannot be
	for _, r := range recs {
		if r.Key != (cache.FileKey{}) { // a file record
			layouts[r.Key] = r.Layout
		}
	}
	keep := map[string]bool{}
	for _, a := range actions {
		if a.Kind != cache.ActEvict {
			continue
		}
		keep[objectName(a.File)] = true
		if s.files[a.File] == nil {
			fs := &fileState{key: a.File, path: a.Path, layout: layouts[a.File], written: true}
			s.files[a.File] = fs
			s.linger(fs)
		}
		if err := punchObject(s.objectPath(a.File), a.Range); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cache store: recovering %s: %w", a.Path, err)
		}
	}
	ents, err := os.ReadDir(s.objDir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !keep[e.Name()] {
			os.Remove(filepath.Join(s.objDir, e.Name()))
		}
	}
	return nil
}

func objectName(k cache.FileKey) string { return fmt.Sprintf("%016x-%016x", k.Dev, k.Ino) }

func (s *Store) objectPath(k cache.FileKey) string {
	return filepath.Join(s.objDir, objectName(k))
}

// SetDoor gives the store a way to reach the PFS for dirty files it has no door for (after a
// restart, before any OpenFile of them): resolve is called with the file's PFS path. Without
// it, Drain fails naming such files.
func (s *Store) SetDoor(resolve func(path string) (*pfsio.Door, error)) {
	s.mu.Lock()
	s.resolve = resolve
	s.mu.Unlock()
}

// --- calling the core ----------------------------------------------------------------------

// batch is what one critical section decided: the log position that must be on disk first,
// held requests to answer, PFS I/O to start (punches go to the punch queue at once).
type batch struct {
	logPos uint64
	// mustSync: the log must be on disk up to logPos before anything is carried out or
	// answered: the batch made records, or answers held requests (a woken write may rely on
	// records an earlier batch made), or acknowledges a write. A read alone does not wait
	// for other callers' log writes.
	mustSync bool
	wakes    []wake
	io       []ioJob
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
// actions out: the log first, then answers to held requests, then new PFS I/O.
func (s *Store) locked(fn func(b *batch)) error {
	var b batch
	s.mu.Lock()
	fn(&b)
	s.mu.Unlock()
	return s.carryOut(&b)
}

// take collects the log records and actions of the core call just made (under the lock).
func (s *Store) take(b *batch, acts []cache.Action) {
	if recs := s.c.Log(); len(recs) > 0 {
		b.mustSync = true
		b.logPos = s.log.add(recs)
		if s.log.size() > s.opt.MaxLogBytes {
			b.logPos = s.log.replace(s.c.Snapshot())
		}
	} else {
		b.logPos = max(b.logPos, s.log.add(nil))
	}
	var punches []cache.Action
	for _, a := range acts {
		switch a.Kind {
		case cache.ActWake, cache.ActFail:
			if ch := s.waiters[a.Waiter]; ch != nil {
				delete(s.waiters, a.Waiter)
				b.wakes = append(b.wakes, wake{ch, a.Errno})
				b.mustSync = true
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

func (s *Store) carryOut(b *batch) error {
	var err error
	if b.mustSync {
		err = s.log.sync(b.logPos)
	}
	if err != nil {
		s.opt.Log.Error("cache store: cannot write the log", "dir", s.opt.Dir, "err", err)
	}
	for _, w := range b.wakes {
		w.ch <- w.errno
	}
	for _, j := range b.io {
		go s.runIO(j)
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

func keyOf(st unix.Stat_t) cache.FileKey { return cache.FileKey{Dev: uint64(st.Dev), Ino: st.Ino} }

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
// saw (ESTALE if the path now names another).
func openPFS(door *pfsio.Door, path string, key cache.FileKey, flags int) (*pfsio.File, unix.Stat_t, error) {
	pf, err := door.OpenFile(path, flags, 0)
	if err != nil {
		return nil, unix.Stat_t{}, errnoOf(err)
	}
	st := pf.Stat // the user's process fstat'ed it at open
	if keyOf(st) != key {
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
	err = s.locked(func(b *batch) {
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
		opened, acts, err := s.c.Open(ref.Key, ref.Path, ref.Layout, attrsOf(st), cache.Override{})
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
	if err != nil {
		f.Close()
		return nil, syscall.EIO
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
		logErr := s.locked(func(b *batch) {
			var acts []cache.Action
			r, acts = s.c.Write(f.h, off, n)
			ch = s.hold(r)
			b.mustSync = true // its extent may have been recorded dirty by an earlier call
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
		logErr2 := s.locked(func(b *batch) { s.take(b, s.c.WriteDone(f.h, off, n)) })
		if err != nil {
			return done, errnoOf(err)
		}
		if logErr != nil || logErr2 != nil || s.log.failed() {
			return done, syscall.EIO // not recorded dirty: never acknowledge it
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

// --- truncate, unlink, teardown ------------------------------------------------------------

// Truncate sets the PFS file's size to size, and drops the cached bytes past it (this
// server's part). Every server of the file may call it: the PFS truncate is idempotent.
func (s *Store) Truncate(door *pfsio.Door, ref FileRef, size uint64) error {
	pf, _, err := openPFS(door, ref.Path, ref.Key, unix.O_WRONLY)
	if err != nil {
		return err
	}
	defer pf.Close()
	for {
		s.mu.Lock()
		busy := s.truncating[ref.Key]
		if busy == nil {
			mine := make(chan struct{})
			s.truncating[ref.Key] = mine
			defer func() {
				s.mu.Lock()
				delete(s.truncating, ref.Key)
				s.mu.Unlock()
				close(mine)
			}()
		}
		s.mu.Unlock()
		if busy == nil {
			break
		}
		<-busy
	}
	var r cache.Result
	var ch chan syscall.Errno
	s.locked(func(b *batch) {
		var acts []cache.Action
		r, acts = s.c.Truncate(ref.Key, size)
		ch = s.hold(r)
		s.take(b, acts)
	})
	if errno := wait(r, ch); errno != 0 {
		return errno
	}
	s.punches.waitQueued() // the cut extents are punched before the object is shortened
	objSize := size
	if ref.Layout != (stripe.Layout{}) {
		objSize = ref.Layout.ObjectSize(size, s.cfg.Server)
	}
	if st, err := os.Stat(s.objectPath(ref.Key)); err == nil && uint64(st.Size()) > objSize {
		os.Truncate(s.objectPath(ref.Key), int64(objSize))
	}
	err = pf.Truncate(int64(size))
	var attrs cache.Attrs
	if err == nil {
		var st unix.Stat_t
		if st, err = pf.Fstat(); err == nil {
			attrs = attrsOf(st)
		}
	}
	s.locked(func(b *batch) { s.take(b, s.c.TruncateDone(ref.Key, attrs, err)) })
	if err != nil {
		return errnoOf(err)
	}
	return nil
}

// Unlink: the PFS file was removed. Its cached data is dropped at its last close (now if it
// is not open), dirty data included.
func (s *Store) Unlink(key cache.FileKey) {
	s.locked(func(b *batch) { s.take(b, s.c.Unlink(key)) })
}

// Drain is teardown's flush: it returns once every dirty byte is on the PFS, or with the
// first unrecoverable error (a *FileError: the PFS's ENOSPC, EDQUOT, EFBIG, EROFS, EACCES,
// EPERM; ESTALE; no door for a file — see SetDoor), or ctx's. The data stays dirty on
// error: Drain again later, or Discard. A flush that failed for another reason (EIO,
// ETIMEDOUT) is retried with the core's backoff until ctx ends.
func (s *Store) Drain(ctx context.Context) error {
	var r cache.Result
	var ch chan syscall.Errno
	var missing error
	fail := make(chan error, 1)
	err := s.locked(func(b *batch) {
		if s.closed {
			missing = syscall.EIO
			return
		}
		if missing = s.doorlessLocked(); missing != nil {
			return
		}
		s.drainFail = fail
		var acts []cache.Action
		r, acts = s.c.Drain()
		ch = s.hold(r)
		s.take(b, acts)
	})
	if missing != nil {
		return missing
	}
	defer func() {
		s.mu.Lock()
		if s.drainFail == fail {
			s.drainFail = nil
		}
		s.mu.Unlock()
	}()
	if err != nil {
		return err
	}
	if r.Status != cache.Wait {
		return errOf(r.Errno)
	}
	select {
	case errno := <-ch:
		return errOf(errno)
	case err := <-fail:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// doorlessLocked names a dirty file that no flush could reach: no door known for it.
func (s *Store) doorlessLocked() error {
	if s.resolve != nil {
		return nil
	}
	reachable := map[string]bool{}
	for _, fs := range s.files {
		if fs.door != nil || fs.wr != nil {
			reachable[fs.path] = true
		}
	}
	var names []string
	var first *FileError
	for path, n := range s.c.DirtyFiles() {
		if n > 0 && !reachable[path] {
			names = append(names, fmt.Sprintf("%q", path))
			if first == nil || path < first.Path {
				first = &FileError{Path: path, Dirty: n, Err: syscall.ENOTCONN}
			}
		}
	}
	if first == nil {
		return nil
	}
	first.Why = fmt.Sprintf("dirty data of %d file(s) (%s) has no PFS door: open them through the store or call SetDoor", len(names), strings.Join(names, ", "))
	return first
}

// Discard drops every cached byte, dirty ones included (teardown --hurry), fails every held
// request EIO, and returns the dirty bytes dropped.
func (s *Store) Discard() uint64 {
	var lost uint64
	s.locked(func(b *batch) {
		var acts []cache.Action
		lost, acts = s.c.Discard()
		s.take(b, acts)
	})
	return lost
}

// Stats are the core's counters now.
func (s *Store) Stats() cache.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.c.Stats()
}

// DirtyFiles lists the PFS paths with dirty data here and how many bytes (teardown's report).
func (s *Store) DirtyFiles() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.c.DirtyFiles()
}

// Close stops the store without flushing anything (a restart or a crash finds the dirty
// state in the log): held requests fail EIO, the PFS I/O in flight ends (bounded by the
// door's request timeout), the log is written, descriptors are closed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for id, ch := range s.waiters {
		ch <- syscall.EIO
		delete(s.waiters, id)
	}
	s.mu.Unlock()
	close(s.stop)
	<-s.tickDone
	s.io.Wait()
	s.punches.close()
	<-s.punchDone
	err := s.log.close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, fs := range s.files {
		if fs.rd != nil && fs.rd != fs.wr {
			fs.rd.Close()
		}
		if fs.wr != nil {
			fs.wr.Close()
		}
		if fs.obj != nil {
			fs.obj.Close()
		}
		fs.rd, fs.wr, fs.obj = nil, nil, nil
	}
	s.files = map[cache.FileKey]*fileState{}
	return err
}

// --- the background --------------------------------------------------------------------------

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
			return s.c.FlushDone(time.Now(), a.ID, attrs, err)
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
	}
	if errno := cache.Errno(err); errno != syscall.EIO {
		return &FileError{Path: path, Err: errno, Why: "flushing to the PFS"}
	}
	return nil
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
	if !write && fs.rd != nil {
		pf = fs.rd
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
