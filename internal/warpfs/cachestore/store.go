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
	// Override is the file's policy (the namespace server's, set through libdatawarp) as set
	// at OverrideGen (0: never): every open sets the newest the store heard of for the file,
	// its other opens on this server included (an open carrying an older one, made before a
	// setting, does not undo it).
	Override    cache.Override
	OverrideGen uint64
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
	// flushAttrs: the latest attributes a flush reported (newestAttrs)
	flushAttrs cache.Attrs
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
	closed     bool
	// policies: the newest policy heard of for each file that had one set, until unlinked
	policies map[cache.FileKey]FileRef

	// objMu: punches (write) against fetches' and flushes' object I/O (read), which check
	// under it that their extents are still theirs: a Discard or an unlink at the last close
	// may drop a file while its fetch or flush is in flight, and its fetch must not write
	// into the emptied object, nor its flush write the emptied object's zeros to the PFS.
	objMu sync.RWMutex

	// moved finds files renamed on the PFS since the store learned their paths (rename.go).
	moved movedFiles

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
		stop:       make(chan struct{}), tickDone: make(chan struct{}), punchDone: make(chan struct{})}
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
	// The truncate's record first: a recovery must not flush dirty bytes past the new size
	// back over a truncated PFS file.
	if err := s.syncLog(); err != nil {
		s.locked(func(b *batch) { s.take(b, s.c.TruncateDone(ref.Key, cache.Attrs{}, err)) })
		return syscall.EIO
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
//
// A removal comes from the compute node that removed the file's last name, after the PFS
// did: meanwhile the PFS may have given the inode number to a new file, which another
// compute node created and this store opened (same key). So if the path the store last
// opened the key by names a regular file with that inode now, the removal is of an earlier
// file and is ignored (the removed file itself has no name left).
func (s *Store) Unlink(key cache.FileKey) {
	s.mu.Lock()
	fs := s.files[key]
	var path string
	var door *pfsio.Door
	if fs != nil {
		path, door = fs.path, fs.door
	}
	resolve := s.resolve
	s.mu.Unlock()
	if fs != nil {
		if door == nil && resolve != nil {
			door, _ = resolve(path)
		}
		// A late removal (the PFS removed the name first) of an earlier file whose inode
		// number a new file at the same path already has: the new file's data stays.
		if door != nil {
			if st, err := door.Lstat(path); err == nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG && st.Ino == key.Ino {
				s.opt.Log.Info("cache store: a removal of an earlier file with this inode number ignored", "path", path, "ino", key.Ino)
				return
			}
		}
	}
	s.locked(func(b *batch) {
		delete(s.policies, key)
		s.take(b, s.c.Unlink(key))
	})
}

// overrideLocked is the policy to open ref with: the newest of ref's and the one kept.
func (s *Store) overrideLocked(ref FileRef) cache.Override {
	kept, ok := s.policies[ref.Key]
	if ok && kept.OverrideGen >= ref.OverrideGen {
		return kept.Override
	}
	if ref.OverrideGen > 0 {
		if s.policies == nil {
			s.policies = map[cache.FileKey]FileRef{}
		}
		s.policies[ref.Key] = FileRef{Override: ref.Override, OverrideGen: ref.OverrideGen}
	}
	return ref.Override
}

// Drain is teardown's flush: it returns once every dirty byte is on the PFS, or with the
// first unrecoverable error (a *FileError: the PFS's ENOSPC, EDQUOT, EFBIG, EROFS, EACCES,
// EPERM; ESTALE; ENOENT, the file gone from the PFS; no door for a file — see SetDoor), or
// ctx's. The data stays dirty on error: Drain again later, or Discard. A flush that failed for another reason (EIO,
// ETIMEDOUT) is retried with the core's backoff until ctx ends.
func (s *Store) Drain(ctx context.Context) error {
	var r cache.Result
	var ch chan syscall.Errno
	var missing error
	fail := make(chan error, 1)
	s.locked(func(b *batch) {
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

// Defaults is the instance's cache policy on this server (Config.Defaults): what a file's
// overrides apply to.
func (s *Store) Defaults() cache.Policy { return s.cfg.Defaults }
