package server

import (
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// Local serves one namespace of this host to a mount in the same process: the co-located
// path. Its requests run through the very code a network connection's do (the session and
// its volume: confined beneath the namespace, charged to the instance, created as the
// caller), as direct calls: no encoding of data, no socket, no copy.
type Local struct {
	sess      *session
	cacheRoot proto.Attr // a cache namespace's root, as the PFS gave it at open
}

// LocalOptions say which namespace to serve and how.
type LocalOptions struct {
	Dir         string         // the namespace root
	Tracker     *usage.Tracker // the instance's usage, shared with the stage engine and other mounts
	ReadOnly    bool           // every change fails with EROFS (loadbalance after stage-in)
	MaxFileSize uint64         // DataWarp's MFS; 0 = no limit
	Name        string         // for the log: the mount path
	Log         *slog.Logger
	// MaxOpenFiles bounds the files and directories open at once; 0 means the server's
	// default (Limits.MaxOpenFiles).
	MaxOpenFiles int
	// ProjectQuota is the project whose hard limit (set by the agent on the fragment) holds
	// the namespace; 0: none. OpenLocal checks that the namespace root is under it and the
	// file system enforces it (Local.QuotaEnforced).
	ProjectQuota uint32
	// FragmentDevice is the device number of the fragment's own file system, which holds the
	// namespace to the fragment's capacity (the agent's "xfs-loop" fragments); 0: none.
	// OpenLocal checks that the namespace root is on it (Local.QuotaEnforced).
	FragmentDevice uint64
	// Fragment is the fragment's counters and write window (limits.go), shared with every
	// other session of the fragment; nil: nothing counted or limited. Namespace and Client
	// say whose counters the mount's requests go to; Stripes says the directory is the
	// fragment's stripe objects (their creates are no files of a namespace's).
	Fragment  *Fragment
	Namespace int64
	Client    string
	Stripes   bool
	// Lease is how long the mount may cache the names and attributes a reply gives it, once
	// it can drop them when told (SetInvalidator); negative: never. 0 means DefaultLease.
	// Every session of the namespace in this process shares its table (leases.go): changes
	// made through this one are told to the others first.
	Lease time.Duration
	// Cache makes the namespace (or, with Stripes, the stripe objects) a cache instance's
	// (Target.Cache): its names are the PFS directory's, its data the engine's. Dir is then
	// the instance's directory on the SSD (the sizes table), not the names.
	Cache *CacheTarget
}

// OpenLocal opens the namespace for an in-process mount.
func OpenLocal(opt LocalOptions) (*Local, error) {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.MaxOpenFiles <= 0 {
		opt.MaxOpenFiles = DefaultLimits().MaxOpenFiles
	}
	v, err := openVolume(opt.Dir, opt.Tracker, hostInodes)
	if err != nil {
		return nil, err
	}
	v.readOnly = opt.ReadOnly
	v.maxFileSize = int64(min(opt.MaxFileSize, 1<<62))
	v.acct = newAccount(opt.Fragment, opt.Namespace, opt.Client, opt.Stripes)
	v.objects = opt.Stripes
	var quotaErr error
	if opt.ProjectQuota != 0 {
		if quotaErr = v.useQuota(opt.ProjectQuota); quotaErr != nil {
			opt.Log.Warn("the namespace is not under its fragment's project quota: writes go through the server",
				"dir", opt.Dir, "project", opt.ProjectQuota, "err", quotaErr)
		}
	}
	if opt.FragmentDevice != 0 {
		if err := v.useFragmentFS(opt.FragmentDevice); err != nil {
			opt.Log.Warn("the namespace is not on its fragment's file system: writes go through the server",
				"dir", opt.Dir, "err", err)
		}
	}
	cache, root, errno := openCache(Target{Dir: opt.Dir, Cache: opt.Cache}, v, opt.Stripes)
	if errno != 0 {
		v.close()
		return nil, fmt.Errorf("namespace %s: %w", opt.Dir, errno)
	}
	sess := &session{log: opt.Log, maxOpenFiles: opt.MaxOpenFiles, v: v, client: opt.Name, handles: map[uint64]*handle{}, cache: cache}
	v.noteFull = sess.noteFull
	if opt.Lease == 0 {
		opt.Lease = DefaultLease
	}
	if cache != nil {
		// A cache namespace is the PFS's, which others change unseen: no leases.
		return &Local{sess: sess, cacheRoot: root}, nil
	}
	if !opt.Stripes {
		if l := acquireLeases(opt.Dir, opt.Lease); l != nil {
			sess.lease = &leaseUse{l: l}
		}
	}
	return &Local{sess: sess}, nil
}

// Lease is how long the mount may cache what a leased reply gives (0: leases are off).
func (l *Local) Lease() time.Duration {
	if l.sess.lease == nil {
		return 0
	}
	return l.sess.lease.l.lease
}

// SetInvalidator makes the mount a holder of leases: drop is called, on a goroutine of the
// changer's, with what another session changed, and must return once the kernel dropped it.
// Call it before the first request.
func (l *Local) SetInvalidator(drop func(items []proto.Inval)) {
	if l.sess.lease == nil {
		return
	}
	own := &localHolder{drop: drop}
	l.sess.lease.h, l.sess.lease.own = &holder{h: own}, own
	l.sess.leasing = true
}

// localHolder tells an in-process mount.
type localHolder struct{ drop func(items []proto.Inval) }

func (f *localHolder) invalidate(items []proto.Inval) (<-chan struct{}, bool) {
	done := make(chan struct{})
	go func() {
		proto.DropWithin(f.drop, items) // as a remote mount answers (proto.MaxNotifyWait)
		close(done)
	}()
	return done, true
}

// Root is the namespace root's attributes.
func (l *Local) Root() (proto.Attr, error) {
	if l.sess.cache != nil {
		return l.cacheRoot, nil
	}
	a, errno := l.sess.v.lookup("")
	if errno != 0 {
		return proto.Attr{}, fmt.Errorf("namespace root: %w", errno)
	}
	return a, nil
}

// Exec runs one request as the caller uid:gid, as a connection would (see session.exec): the
// reply message, or for READ the bytes read into dest.
func (l *Local) Exec(op proto.Op, uid, gid uint32, req proto.Message, dest []byte) (proto.Message, int, syscall.Errno) {
	rep, n, errno, _ := l.sess.measured(transportLocal, op, uid, gid, req, dest)
	return rep, n, errno
}

// ExecLeased is Exec that also gives the reply's lease flags (proto.FlagLease: the mount may
// cache what it gives; proto.FlagListing; SetInvalidator).
func (l *Local) ExecLeased(op proto.Op, uid, gid uint32, req proto.Message, dest []byte) (proto.Message, int, syscall.Errno, uint8) {
	rep, n, errno, flags := l.sess.measured(transportLocal, op, uid, gid, req, dest)
	if !l.sess.leasing {
		flags = 0
	}
	return rep, n, errno, flags
}

// Fd is the descriptor of an open handle, for FUSE passthrough (the kernel then reads the
// file itself). It stays valid until the handle is released.
func (l *Local) Fd(handle uint64) (int, bool) {
	h := l.sess.get(handle)
	if h == nil {
		return -1, false
	}
	defer l.sess.put(h)
	if h.cache != nil {
		return -1, false // a cache's file has no descriptor of this namespace's
	}
	return h.fd, true
}

// ReadFd is the descriptor of an open handle for a read of n bytes at off that the mount
// serves from it itself (go-fuse reads or splices it): the read is counted as the server
// counts its own.
//
// A load-balanced cache's file has no descriptor (its data is the cache engine's): ReadFd
// then answers -1 and true, and the mount sends the read through Exec.
func (l *Local) ReadFd(handle uint64, off int64, n int) (int, bool) {
	h := l.sess.get(handle)
	if h == nil {
		return -1, false
	}
	defer l.sess.put(h)
	if h.cache != nil {
		return -1, true
	}
	if a := &l.sess.v.acct; a.frag != nil && off >= 0 {
		if size, err := sizeOf(h.fd); err == nil {
			got := max(min(int64(n), size-off), 0)
			a.read(int(got), uint64(off+got))
		}
	}
	return h.fd, true
}

// QuotaEnforced says whether the backing file system holds the namespace to the instance's
// capacity itself (a project quota, LocalOptions.ProjectQuota, or the fragment's own file
// system, LocalOptions.FragmentDevice): then the kernel may write its files directly (FUSE
// passthrough) without the tracker's say.
func (l *Local) QuotaEnforced() bool { return l.sess.v.quota != 0 || l.sess.v.fragmentFS != 0 }

// WindowLimited says whether the namespace's fragment has a write window (limits.go): its
// writes must then reach the server, which counts them, so the kernel may not write its
// files itself (FUSE passthrough) — docs/decisions.md.
func (l *Local) WindowLimited() bool { return l.sess.v.acct.frag.WindowLimited() }

// KernelWrites tells the server that the kernel writes the open handle's file itself (FUSE
// passthrough): the tracker is charged what it wrote when the server next handles the file's
// size, and at the handle's release.
func (l *Local) KernelWrites(handle uint64) {
	h := l.sess.get(handle)
	if h == nil {
		return
	}
	defer l.sess.put(h)
	l.sess.v.kernelWrites(h)
}

// Close releases every handle still open and the namespace root.
func (l *Local) Close() {
	l.sess.closeAll()
	l.sess.lease.forget() // the mount is closed after its kernel unmounted it: nothing is cached
	l.sess.lease.leave()
	l.sess.closeCache()
	l.sess.v.close()
}
