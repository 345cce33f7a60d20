// Package mount is the compute-node client of a burst-buffer namespace: it exposes the
// namespace at a mount path (such as $DW_JOB_STRIPED) with FUSE, enforces the instance's
// capacity, and makes mounting and unmounting idempotent and robust against the leftovers of
// a crashed agent.
//
// Every operation is a warpfs request (node.go) served by the storage server's code (package
// warpfs/server), which resolves it beneath the namespace without following any link a user
// could swap, charges the instance and creates files as the caller. When the namespace lives
// on another host the request travels over the network (package warpfs/client); when it lives
// on this host the same server code runs in this process (transport.go), with no network hop,
// and read-only mounts hand reads to the kernel (FUSE passthrough), as do writable ones whose
// capacity the backing file system enforces (Spec.ProjectQuota, Spec.FragmentDevice), writes
// included. The mount
// lifecycle here only sees a go-fuse root node.
//
// What users see: `df` shows the instance's capacity and free space, not the host disk's; a
// write or truncate that would grow the instance past its capacity fails with ENOSPC; a
// read-only (loadbalance) mount fails every change with EROFS; files created by a user
// through a root agent's mount belong to that user. See docs/mounts.md.
package mount

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/mounttable"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// Spec says which namespace to expose where, and how.
type Spec struct {
	// MountPath is where users see the namespace, e.g.
	// /var/opt/spillway/mounts/batch/42_striped_scratch. Absolute. Its parent is created
	// (0755) if missing, and so is the directory itself.
	MountPath string
	// SourceDir is the namespace root: the directory holding the files. Absolute; it must
	// exist, and must not contain MountPath or lie under it. Empty for a remote namespace.
	SourceDir string
	// Tracker counts the instance's usage against its capacity; it is shared with everything
	// else writing into the instance on this node (the stage engine). Nil for a remote
	// namespace: its storage node counts.
	Tracker *usage.Tracker
	// Remote, instead of SourceDir and Tracker, names a namespace held by another host's
	// storage agent, reached over the network.
	Remote *Remote
	// Stripes are the servers of a striped instance's file data, in its layout's order (one
	// per fragment); empty for an instance on one fragment, whose files hold their data.
	Stripes []Server
	// Replicas are the copies of a read-only loadbalance namespace, one per server: the mount
	// reads the first and falls over to the next when its server stops answering. Instead of
	// SourceDir and Remote; empty for a namespace with one copy.
	Replicas []Server
	// MDS are the shards of a striped namespace spread over every server of its instance
	// (max_mds=yes), in shard order (mds.go); the first is the namespace SourceDir or Remote
	// names, which the mount then ignores. Empty for a namespace on one server.
	MDS []Server
	// ReadOnly mounts the namespace read-only (loadbalance after stage-in): every change
	// fails with EROFS.
	ReadOnly bool
	// AllowOther lets users other than the agent's reach the mount. Set it when the agent is
	// root so that the job's user can use the mount; the kernel then checks file modes
	// (default_permissions, always on) and files are created as the calling user.
	AllowOther bool
	// FsName is the first column of /proc/mounts and df ("Filesystem"), e.g. the instance
	// label "I42-0". Defaults to "spillway". The type column is always fuse.spillway.
	FsName string
	// ClientCache turns on close-to-open client caching (DataWarp's client_cache=yes): the
	// kernel keeps file data cached across opens while the file is unchanged, and names and
	// attributes for Limits.ClientCacheTimeout. Off by default: every open, lookup and stat
	// asks the server, which keeps nodes coherent.
	ClientCache bool
	// Limits are the tunables; the zero value means the defaults (DefaultLimits).
	Limits Limits
	// MaxFileSize is DataWarp's MFS suboption: no file may grow beyond it; writes past it are
	// cut short and then fail with EFBIG, truncates and fallocates past it fail with EFBIG.
	// 0 means no limit.
	MaxFileSize uint64
	// DisablePassthrough turns off FUSE passthrough. With it on (the default), a root agent
	// on a kernel that supports it (Linux 6.9+) lets the kernel read the namespace's files
	// directly on read-only mounts: reads at the speed of the backing file system. Writable
	// mounts use it only where the file system itself holds the instance to its capacity
	// (ProjectQuota).
	DisablePassthrough bool
	// ProjectQuota is the project id whose hard limit holds the namespace on its backing file
	// system (package usage, quota.go: the agent gives every fragment one when the SSD path is
	// XFS mounted with prjquota); 0: none. A writable local mount of an instance that is not
	// striped and has no MaxFileSize then hands reads and writes alike to the kernel (FUSE
	// passthrough): the file system enforces the capacity (ENOSPC) and statfs reads the
	// quota's usage. The mount checks that the namespace root is under it.
	ProjectQuota uint32
	// FragmentDevice is the device number of the fragment's own file system (the agent's
	// agent.fragment_filesystem = "xfs-loop": an XFS per fragment on a loop device), when the
	// namespace is on it and its size holds the instance; 0: none. It counts as ProjectQuota
	// does: the file system enforces the capacity, so writes may go to the kernel, and
	// statfs reports the lesser of its room and the tracker's. The mount checks that the
	// namespace root is on that device.
	FragmentDevice uint64
	// Fragment is the local namespace's fragment counters and write window (package server,
	// limits.go), shared by every mount and server session of the fragment on this node;
	// NamespaceID and Client say whose counters the mount's requests go to. Nil: nothing
	// counted, no write window. A fragment with a write window is written through the server
	// only (no FUSE write passthrough): it counts every byte.
	Fragment    *server.Fragment
	NamespaceID int64
	Client      string
	// Logger receives diagnostics (stale mounts cleaned, tuning that failed). Defaults to
	// log.Default().
	Logger *log.Logger
	// Debug logs every FUSE request and reply to Logger (very verbose; for diagnosis).
	Debug bool
	// Cache makes a local namespace (SourceDir: then the instance's directory on the SSD) a
	// cache instance's: its names are the PFS directory's (server.CacheTarget). Its stripe
	// servers on this host carry their own (Server.Cache). Nil for scratch.
	Cache *server.CacheTarget
}

// Server is one server of a mount's data: a directory on this host (the namespace of a
// replica, or a fragment's stripe objects), or the same on another host (Remote; for stripe
// objects its NamespaceID is unused).
type Server struct {
	Node    string // the storage node's name, shown by `spillway stripes`
	Dir     string
	Tracker *usage.Tracker
	Remote  *Remote
	// Fragment and NamespaceID are a local Dir's counters and write window (Spec.Fragment).
	Fragment    *server.Fragment
	NamespaceID int64
	// Cache: a local Dir of a cache instance's stripe objects is served through its data
	// engine (Spec.Cache); a local replica of a load-balanced cache (Spec.Replicas) is that
	// server's namespace, serving whole files through its engine (CacheTarget.Loadbalance).
	Cache *server.CacheTarget
}

// Remote is a namespace on another host: its storage agent's data address, and which
// namespace. The storage agent enforces the capacity, the read-only mode and the maximum file
// size.
type Remote struct {
	Address string // host:port of the storage agent's data server (agent.data_listen)
	Token   string // the cluster's shared secret, when there is no Capability
	Client  string // this node's name, for the storage agent's logs
	// Capability and CapabilityKey are the controller's grant of this mount (package nodekey).
	Capability, CapabilityKey string
	FragmentID                int64
	NamespaceID               int64
	InstanceID                int64
	// Limits bound the network client (timeouts, retries, requests in flight); zero fields
	// mean the defaults of package warpfs/client.
	Limits client.Limits
	// Readahead is how far ahead the kernel reads a file read sequentially, in bytes, instead
	// of Limits.MaxReadahead: several requests in flight hide the network's round trip.
	// Default 4 MiB (a root agent sets it; see raiseReadahead).
	Readahead int
	// TLS is what a storage node whose Address is "tls://host:port" must prove (nil: the
	// system's roots).
	TLS *tls.Config
}

// defaultReadahead is how far ahead a root agent has the kernel read sequential files of any
// mount (Remote.Readahead overrides it for a remote one): several requests in flight hide
// the round trip to the server, and the backing disk reads ahead as far.
const defaultReadahead = 4 << 20

// Limits are the tunables of a mount, each a named field so the agent's configuration can
// set it. A zero field means its default (for the three cache timeouts the default is zero).
type Limits struct {
	// EntryTimeout, AttrTimeout and NegativeTimeout are how long the kernel may cache a name,
	// a file's attributes, and a name's absence. Default 0: ask the server every time
	// (coherent across nodes — DataWarp's default).
	EntryTimeout    time.Duration
	AttrTimeout     time.Duration
	NegativeTimeout time.Duration
	// Lease is how long an in-process (co-located) mount may cache the names and attributes
	// its server leases it (package server, leases.go): 0 means server.DefaultLease, negative
	// none. A remote mount takes its storage node's.
	Lease time.Duration
	// ClientCacheTimeout replaces a zero EntryTimeout and AttrTimeout when Spec.ClientCache
	// is on. Default 1s.
	ClientCacheTimeout time.Duration

	// MaxWrite is the largest FUSE read or write request, in bytes. Default and maximum 1 MiB
	// (the kernel's limit, 256 pages); each request costs a round trip, so big is fast.
	MaxWrite int
	// MaxReadahead is the readahead the mount asks for at its start (FUSE's max_readahead),
	// in bytes. Default 1 MiB. The kernel starts FUSE mounts at 128 KiB; a root agent then
	// raises the device's readahead to 4 MiB (/sys/class/bdi/<dev>/read_ahead_kb; for a
	// remote mount Remote.Readahead), a non-root agent cannot.
	MaxReadahead int
	// MaxBackground is how many asynchronous requests (readahead, direct I/O) the kernel keeps
	// in flight to the server. Default 64: as many as a connection's requests in flight
	// (warpfs.max_in_flight), so that an application's queue of direct I/O (fio's iodepth 32,
	// a database) is not cut at the kernel's congestion threshold, three quarters of it.
	MaxBackground int
	// PreferredIOSize is the st_blksize reported for regular files, which stdio and many tools
	// use as their buffer size. Default 1 MiB.
	PreferredIOSize int
	// WriteBehind is how many bytes of writes one open file may have on their way to the
	// servers after write(2) returned: a striped file's writes to different servers overlap,
	// and a writer never waits for a server while another is idle; a file of a one-server
	// instance on another node has its small sequential writes gathered into requests of up
	// to 1 MiB. An error of a write in flight is returned by the next write, fsync or close.
	// Default 16 MiB; negative turns it off (every write waits for its servers). Files
	// opened O_SYNC, O_DSYNC or O_DIRECT never write behind, nor O_APPEND on a one-server
	// instance, nor files of a namespace on this host (no network to wait for).
	WriteBehind int
	// UnlinksBehind is how many removals of files may be on their way to a remote namespace's
	// server after unlink(2) returned (unlinkbehind.go): only in a directory this mount made
	// and nobody else has looked in since. Default 32 (half of a connection's requests in
	// flight, warpfs.max_in_flight: the mount's other requests always find room); negative
	// turns it off (every unlink waits for the server).
	UnlinksBehind int
	// CreatesBehind is how many creates of files may be on their way to a remote striped
	// namespace's server after open(2) returned (createbehind.go): only in a directory this
	// mount made and nobody else has looked in since. Default 32; negative turns it off
	// (every create waits for the server).
	CreatesBehind int
	// CreateWriteWait is how long a create behind waits for the new file's first write
	// before its PLACE is sent, so that the PLACE opens the file for it (createbehind.go,
	// placement). Default 2ms; negative sends it at once.
	CreateWriteWait time.Duration
	// CreateWholeMax is the most a create behind's creator may write before the file's
	// PLACE leaves for the PLACE to carry it (createbehind.go, placement.held): a small file
	// created, written and closed at once is one request. Default 64 KiB, at most 1 MiB;
	// negative turns it off.
	CreateWholeMax int

	// ProbeTimeout bounds the stat of a mount path before mounting or unmounting: a mount
	// whose server does not answer within it is treated as hung and aborted. Default 5s.
	ProbeTimeout time.Duration
	// UnmountBusyTimeout is how long Unmount retries while processes still use the mount
	// before it detaches the mount lazily. Default 10s.
	UnmountBusyTimeout time.Duration
	// UnmountRetryInterval is the pause between unmount attempts while busy. Default 100ms.
	UnmountRetryInterval time.Duration
	// ServerExitTimeout bounds the wait for the server to stop after a clean unmount; past it
	// the connection is aborted. Default 5s.
	ServerExitTimeout time.Duration
	// DetachedServeTimeout is how long a lazily detached mount keeps serving the files still
	// open in it before its connection is aborted (their next access fails). Default 5m.
	DetachedServeTimeout time.Duration
}

// DefaultLimits returns the defaults of every limit.
func DefaultLimits() Limits {
	return Limits{}.withDefaults()
}

// kernelMaxRequest is the largest FUSE request the kernel accepts (max_pages 256).
const kernelMaxRequest = 1 << 20

func (l Limits) withDefaults() Limits {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.ClientCacheTimeout, time.Second)
	defInt(&l.MaxWrite, kernelMaxRequest)
	defInt(&l.MaxReadahead, kernelMaxRequest)
	defInt(&l.MaxBackground, 64)
	if l.WriteBehind == 0 {
		l.WriteBehind = 16 << 20
	}
	if l.UnlinksBehind == 0 {
		l.UnlinksBehind = 32
	}
	if l.CreatesBehind == 0 {
		l.CreatesBehind = 32
	}
	if l.CreateWriteWait == 0 {
		l.CreateWriteWait = 2 * time.Millisecond
	}
	if l.CreateWholeMax == 0 {
		l.CreateWholeMax = 64 << 10
	}
	l.CreateWholeMax = min(l.CreateWholeMax, kernelMaxRequest) // one PLACE's body
	defInt(&l.PreferredIOSize, kernelMaxRequest)
	def(&l.ProbeTimeout, 5*time.Second)
	def(&l.UnmountBusyTimeout, 10*time.Second)
	def(&l.UnmountRetryInterval, 100*time.Millisecond)
	def(&l.ServerExitTimeout, 5*time.Second)
	def(&l.DetachedServeTimeout, 5*time.Minute)
	l.MaxWrite = min(max(l.MaxWrite, 4096), kernelMaxRequest)
	l.MaxReadahead = min(l.MaxReadahead, kernelMaxRequest)
	l.MaxBackground = min(l.MaxBackground, 65535)
	return l
}

// ErrAlreadyMounted is wrapped by Mount's error when another mount holds the mount path.
var ErrAlreadyMounted = errors.New("mount path already in use")

// ErrDetached is wrapped by an unmount that found the mount busy past UnmountBusyTimeout and
// detached it lazily. The mount path is free afterwards; treat it as a warning.
var ErrDetached = errors.New("busy mount detached lazily")

// DetachedError is the unmount of a busy mount that was detached lazily.
type DetachedError struct {
	Path       string
	Waited     time.Duration // how long the unmount retried
	Holders    []string      // "pid (command) path" of processes using the mount, at most 10
	ServeLimit time.Duration // open files are served at most this long (0: not bounded, see docs)
}

func (e *DetachedError) Error() string {
	who := "no process found using it (a process in another mount namespace, or a mount below it?)"
	if len(e.Holders) > 0 {
		who = "used by " + strings.Join(e.Holders, ", ")
	}
	served := "until they are closed"
	if e.ServeLimit > 0 {
		served = fmt.Sprintf("until they are closed, at most %s", e.ServeLimit)
	}
	return fmt.Sprintf("%s was still busy after %s (%s); detached it lazily: the path is free, "+
		"and files still open in it are served %s", e.Path, e.Waited, who, served)
}

// Is makes errors.Is(err, ErrDetached) true.
func (e *DetachedError) Is(target error) bool { return target == ErrDetached }

// Mounted is a namespace mounted by this process.
type Mounted struct {
	path         string // canonical mount path
	spec         Spec
	limits       Limits
	logger       *log.Logger
	server       *fuse.Server
	conn         uint32        // the FUSE connection (fusectl id), for aborting
	served       chan struct{} // closed when the server has stopped
	createdDir   bool          // Mount created the mount path directory; Unmount removes it
	cleanedStale bool
	backend      *backend

	unmounted bool // guarded by the path lock
}

// Path is the canonical mount path (symbolic links in its parent resolved).
func (m *Mounted) Path() string { return m.path }

// Done is closed when the file system has stopped being served (after Unmount, or when
// someone unmounted it behind the agent's back).
func (m *Mounted) Done() <-chan struct{} { return m.served }

// KernelWrites reports whether the kernel writes this mount's files itself (FUSE passthrough
// of writable opens), and ServerWrites how many WRITE requests the mount's server has served
// (what passthrough spares it): for the agent's tests and diagnostics.
func (m *Mounted) KernelWrites() bool { return m.backend.kernelWrites }

// ServerWrites is the number of WRITE requests the mount has sent to its server.
func (m *Mounted) ServerWrites() int64 { return m.backend.writes.Load() }

// CleanedStaleMount reports whether Mount found a dead or hung mount at the path (left by a
// crashed agent) and removed it first.
func (m *Mounted) CleanedStaleMount() bool { return m.cleanedStale }

// registry is this process's mounts, and a lock per mount path so that mounting and
// unmounting one path never interleave while other paths proceed.
var registry = struct {
	sync.Mutex
	mounts map[string]*Mounted
	locks  map[string]*pathLock
}{mounts: map[string]*Mounted{}, locks: map[string]*pathLock{}}

type pathLock struct {
	mu    sync.Mutex
	users int
}

func lockPath(path string) (unlock func()) {
	registry.Lock()
	l := registry.locks[path]
	if l == nil {
		l = &pathLock{}
		registry.locks[path] = l
	}
	l.users++
	registry.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		registry.Lock()
		l.users--
		if l.users == 0 {
			delete(registry.locks, path)
		}
		registry.Unlock()
	}
}

func activeMount(path string) *Mounted {
	registry.Lock()
	defer registry.Unlock()
	return registry.mounts[path]
}

func setActive(path string, m *Mounted) {
	registry.Lock()
	defer registry.Unlock()
	if m == nil {
		delete(registry.mounts, path)
	} else {
		registry.mounts[path] = m
	}
}

// maxStackedMounts bounds how many of our mounts stacked on one path are cleaned up.
const maxStackedMounts = 8

// Mount exposes spec.SourceDir at spec.MountPath and serves it until Unmount.
//
// It is idempotent: if this process already serves the same namespace there, it returns that
// mount. A dead or hung Spillway mount at the path (a crashed agent's) is aborted and detached
// first. A live mount by another process, or a mount of another kind, is an error wrapping
// ErrAlreadyMounted.
func Mount(spec Spec) (*Mounted, error) {
	if err := spec.validate(); err != nil {
		return nil, err
	}
	limits := spec.Limits.withDefaults()
	logger := spec.Logger
	if logger == nil {
		logger = log.Default()
	}
	if err := currentFUSEEnv().check(spec.AllowOther); err != nil {
		return nil, err
	}
	path, err := canonicalMountPath(spec.MountPath, true)
	if err != nil {
		return nil, err
	}
	unlock := lockPath(path)
	defer unlock()

	if m := activeMount(path); m != nil {
		select {
		case <-m.served: // its server stopped: the leftover is cleaned below
			setActive(path, nil)
		default:
			same := m.spec.SourceDir == spec.SourceDir && m.spec.Tracker == spec.Tracker && m.spec.Remote == nil && spec.Remote == nil
			if spec.Remote != nil {
				same = remoteEqual(m.spec.Remote, spec.Remote)
			}
			if same && m.spec.ReadOnly == spec.ReadOnly {
				return m, nil
			}
			return nil, fmt.Errorf("cannot mount %s at %s: this agent already serves %s there "+
				"(read-only %v); unmount it first: %w", spec.source(), path, m.spec.source(), m.spec.ReadOnly, ErrAlreadyMounted)
		}
	}
	created, cleaned, err := preparePath(path, limits, logger)
	if err != nil {
		return nil, err
	}
	removeCreated := func() {
		if created {
			os.Remove(path)
		}
	}

	asRoot := os.Geteuid() == 0
	var be *backend
	if len(spec.Replicas) > 0 {
		be, err = openReplicas(spec, limits, path, logger)
	} else if len(spec.MDS) > 1 {
		be, err = openShards(spec, limits, path, logger)
	} else if spec.Remote != nil {
		be, err = dialRemote(spec, limits, logger)
	} else {
		be, err = openLocal(spec, limits, path, asRoot, logger)
	}
	if err == nil && len(spec.Stripes) > 0 {
		if err = be.openStripes(spec, limits, path, logger); err != nil {
			be.close()
		}
	}
	if err != nil {
		removeCreated()
		return nil, err
	}
	lease := be.enableLeases()
	root := newRoot(be)
	opts := mountOptions(spec, limits, asRoot, lease, logger)
	server, err := fuse.NewServer(gofs.NewNodeFS(root, opts), path, &opts.MountOptions)
	if err != nil {
		be.close()
		// go-fuse leaves the mount in place when the handshake after mount(2) fails.
		if mounts, _ := mounttable.At(path); len(mounts) > 0 && mounts[len(mounts)-1].FSType == fsType {
			unmountOnce(path, true)
		}
		removeCreated()
		return nil, fmt.Errorf("cannot mount FUSE at %s: %w", path, explainMountError(err, asRoot))
	}
	m := &Mounted{
		path:         path,
		spec:         spec,
		limits:       limits,
		logger:       logger,
		server:       server,
		served:       make(chan struct{}),
		createdDir:   created,
		cleanedStale: cleaned,
		backend:      be,
	}
	go func() {
		server.Serve()
		be.close()
		close(m.served)
	}()
	if err := server.WaitMount(); err != nil {
		unmountOnce(path, true)
		removeCreated()
		return nil, fmt.Errorf("FUSE mount at %s did not come up: %w", path, err)
	}
	be.directMmap.Store(server.KernelSettings().Flags64()&fuse.CAP_DIRECT_IO_ALLOW_MMAP != 0)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		m.conn = unix.Minor(st.Dev)
		if asRoot {
			ra := defaultReadahead
			if spec.Remote != nil && spec.Remote.Readahead > 0 {
				ra = spec.Remote.Readahead
			}
			raiseReadahead(st.Dev, ra, logger)
		}
	}
	setActive(path, m)
	return m, nil
}

// source names what the mount serves, for messages.
func (s Spec) source() string {
	if len(s.Replicas) > 0 {
		return fmt.Sprintf("%d replicas of a namespace", len(s.Replicas))
	}
	if s.Remote != nil {
		return fmt.Sprintf("namespace %d on %s", s.Remote.NamespaceID, s.Remote.Address)
	}
	return s.SourceDir
}

func (s Spec) validate() error {
	if s.MountPath == "" || !filepath.IsAbs(s.MountPath) {
		return fmt.Errorf("mount path %q is not an absolute path; pass the activation's mount path, "+
			"e.g. /var/opt/spillway/mounts/batch/42_striped_scratch", s.MountPath)
	}
	if len(s.Replicas) > 0 {
		if s.Remote != nil || s.SourceDir != "" || !s.ReadOnly {
			return fmt.Errorf("mount at %s: replicas are read-only and name their own servers; "+
				"pass them alone, with ReadOnly", s.MountPath)
		}
		return nil
	}
	if s.Remote != nil {
		if s.SourceDir != "" || s.Tracker != nil {
			return fmt.Errorf("mount at %s names both a remote namespace and a directory; choose one", s.MountPath)
		}
		if s.Remote.Address == "" {
			return fmt.Errorf("mount at %s: the remote namespace has no address; the storage node "+
				"must set agent.data_listen", s.MountPath)
		}
		return nil
	}
	if s.SourceDir == "" || !filepath.IsAbs(s.SourceDir) {
		return fmt.Errorf("namespace directory %q is not an absolute path", s.SourceDir)
	}
	info, err := os.Stat(s.SourceDir)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("namespace directory %s does not exist; the storage node must create "+
			"the namespace (CreateNamespace) before it is mounted", s.SourceDir)
	}
	if err != nil {
		return fmt.Errorf("cannot use namespace directory %s: %w", s.SourceDir, err)
	}
	if !info.IsDir() {
		return fmt.Errorf("namespace directory %s is not a directory", s.SourceDir)
	}
	if s.Tracker == nil {
		return fmt.Errorf("no usage tracker for the mount at %s; every mount needs its instance's "+
			"tracker (usage.Registry.Get) so that capacity is enforced", s.MountPath)
	}
	mount, source := filepath.Clean(s.MountPath), filepath.Clean(s.SourceDir)
	if within(mount, source) || within(source, mount) {
		return fmt.Errorf("mount path %s and namespace directory %s contain one another; "+
			"the server would read its own mount — mount elsewhere", mount, source)
	}
	return nil
}

// within reports whether p is dir or lies under it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// canonicalMountPath cleans path and resolves symbolic links in its parent (the kernel's
// mount table holds resolved paths). With create, a missing parent is created 0711: users
// reach their own mount by its path, but cannot list the others' (their names hold the
// tokens of other users' jobs).
func canonicalMountPath(path string, create bool) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("mount path %q is not an absolute path", path)
	}
	path = filepath.Clean(path)
	if path == "/" {
		return "", fmt.Errorf("refusing to use / as a mount path")
	}
	parent := filepath.Dir(path)
	if create {
		if err := os.MkdirAll(parent, 0o711); err != nil {
			return "", fmt.Errorf("cannot create the parent directory of mount path %s: %w; "+
				"check that the agent may write there", path, err)
		}
	}
	realParent, err := filepath.EvalSymlinks(parent)
	if err != nil {
		return "", err
	}
	return filepath.Join(realParent, filepath.Base(path)), nil
}

// preparePath makes path ready to mount on: a directory with no mount of ours. It removes a
// dead or hung Spillway mount there and refuses anything else.
func preparePath(path string, limits Limits, logger *log.Logger) (created, cleaned bool, err error) {
	for range maxStackedMounts {
		mounts, err := mounttable.At(path)
		if err != nil {
			return false, cleaned, err
		}
		state, err := probe(path, limits.ProbeTimeout)
		if err != nil {
			return false, cleaned, err
		}
		if len(mounts) == 0 {
			switch state {
			case pathDirectory:
				return false, cleaned, nil
			case pathAbsent:
				if err := os.Mkdir(path, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
					return false, cleaned, fmt.Errorf("cannot create mount path %s: %w", path, err)
				}
				return true, cleaned, nil
			case pathNotDirectory:
				return false, cleaned, fmt.Errorf("mount path %s exists and is not a directory; "+
					"remove it or choose another mount path", path)
			case pathForbidden:
				return false, cleaned, fmt.Errorf("cannot access mount path %s: permission denied; "+
					"the agent must be able to reach it", path)
			default:
				return false, cleaned, fmt.Errorf("mount path %s is unusable (%s) though nothing is "+
					"mounted on it: a mount above it is broken; check `findmnt -T %s`", path, state, path)
			}
		}
		top := mounts[len(mounts)-1]
		if top.FSType != fsType {
			return false, cleaned, fmt.Errorf("mount path %s is already a mount point of a %s file system "+
				"(source %s); refusing to mount over it — unmount it or choose another path: %w",
				path, top.FSType, top.Source, ErrAlreadyMounted)
		}
		switch state {
		case pathStale, pathHung:
			if err := removeDeadMount(path, top, state); err != nil {
				return false, cleaned, err
			}
			logger.Printf("mount: removed a %s at %s (FUSE connection %d), left by an agent that crashed or hung",
				state, path, top.Minor)
			cleaned = true
		default:
			return false, cleaned, fmt.Errorf("mount path %s is already served by another process "+
				"(a Spillway mount of %s, not this agent's); stop that agent, or unmount it with "+
				"`fusermount3 -u %s`: %w", path, top.Source, path, ErrAlreadyMounted)
		}
	}
	return false, cleaned, fmt.Errorf("mount path %s still has a Spillway mount after removing %d; "+
		"unmount them by hand (`umount -l %s`)", path, maxStackedMounts, path)
}

// removeDeadMount detaches a stale or hung mount; a hung one is aborted first so that the
// processes blocked in it wake up.
func removeDeadMount(path string, top mounttable.Entry, state pathState) error {
	if state == pathHung && os.Geteuid() == 0 {
		if err := abortConnection(top.Minor); err != nil {
			return fmt.Errorf("mount at %s does not answer: %w", path, err)
		}
	}
	if err := unmountOnce(path, true); err != nil && !errors.Is(err, errNotMounted) {
		return fmt.Errorf("cannot remove the %s at %s: %w", state, path, err)
	}
	return nil
}

// mountOptions are go-fuse's options for a mount; lease is how long the kernel may cache
// a leased reply (0: the namespace's servers grant no leases).
func mountOptions(spec Spec, l Limits, asRoot bool, lease time.Duration, logger *log.Logger) *gofs.Options {
	entry, attr := l.EntryTimeout, l.AttrTimeout
	if spec.ClientCache && lease == 0 {
		if entry == 0 {
			entry = l.ClientCacheTimeout
		}
		if attr == 0 {
			attr = l.ClientCacheTimeout
		}
	}
	negative := l.NegativeTimeout
	if lease > 0 {
		// What is leased says so reply by reply (leases.go); anything else is not cached. A
		// leased absence is kept for the lease (go-fuse's negative timeout; an unleased one
		// sets its own).
		entry, attr, negative = 0, 0, lease
	}
	fsName := spec.FsName
	if fsName == "" {
		fsName = fsSubtype
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	// default_permissions: the kernel checks modes, as the server (root) would not.
	options := []string{"default_permissions"}
	if spec.ReadOnly {
		flags |= unix.MS_RDONLY
		if !asRoot {
			options = append(options, "ro") // fusermount3 takes it as an option
		}
	}
	return &gofs.Options{
		MountOptions: fuse.MountOptions{
			AllowOther:    spec.AllowOther,
			Options:       options,
			MaxWrite:      l.MaxWrite,
			MaxReadAhead:  l.MaxReadahead,
			MaxBackground: l.MaxBackground,
			FsName:        fsName,
			Name:          fsSubtype,
			// Root mounts with mount(2) itself and needs no setuid helper.
			DirectMountStrict: asRoot,
			DirectMountFlags:  flags,
			Logger:            logger,
			Debug:             spec.Debug,
			// The server clears set-user-ID bits on writes (see node.write). Without this the
			// kernel asks for security.capability before every write: a round trip per write.
			// ASYNC_DIO lets the kernel keep several O_DIRECT requests of one process in flight
			// (libaio, io_uring, and large direct writes cut into 1 MiB requests): without it
			// an iodepth of 32 is served one request at a time.
			// DIRECT_IO_ALLOW_MMAP keeps shared mappings of files opened O_DIRECT working
			// (openFlags gives them FOPEN_DIRECT_IO).
			ExtraCapabilities: fuse.CAP_HANDLE_KILLPRIV_V2 | fuse.CAP_ASYNC_DIO | fuse.CAP_DIRECT_IO_ALLOW_MMAP,
			// go-fuse splices reads only through a pipe larger than one request; with the
			// default 1 MiB pipe-max-size every 1 MiB read would try, fail and log.
			DisableSplice: !spliceFits(l.MaxWrite),
			// A listing with attributes costs a request per entry, which nothing uses when
			// attributes are not cached.
			DisableReadDirPlus: entry == 0 && attr == 0 && lease == 0,
		},
		EntryTimeout:    &entry,
		AttrTimeout:     &attr,
		NegativeTimeout: &negative,
		Logger:          logger,
	}
}

// explainMountError adds the likely fix to a failed mount.
func explainMountError(err error, asRoot bool) error {
	switch {
	case errors.Is(err, unix.EPERM) && asRoot:
		return fmt.Errorf("%w (mount(2) refused: is the agent in a container or user namespace without CAP_SYS_ADMIN?)", err)
	case errors.Is(err, unix.ENODEV):
		return fmt.Errorf("%w (the kernel has no FUSE support: modprobe fuse)", err)
	case !asRoot && strings.Contains(err.Error(), "fusermount"):
		return fmt.Errorf("%w (fusermount3 failed; its message is in the agent's stderr)", err)
	}
	return err
}

// raiseReadahead lifts the readahead of the new mount's backing device from the kernel's
// 128 KiB to the configured size: sequential reads then travel in 1 MiB requests.
func raiseReadahead(dev uint64, bytes int, logger *log.Logger) {
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(dev), unix.Minor(dev))
	if err := os.WriteFile(p, []byte(strconv.Itoa(bytes/1024)), 0o644); err != nil {
		logger.Printf("mount: cannot raise readahead (%s): %v", p, err)
	}
}

// spliceFits reports whether the system's pipes can hold a whole read reply of maxRequest
// bytes (header and one spare page included), which go-fuse needs to splice reads.
func spliceFits(maxRequest int) bool {
	data, err := os.ReadFile("/proc/sys/fs/pipe-max-size")
	if err != nil {
		return false
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(data)))
	return err == nil && limit >= maxRequest+2*os.Getpagesize()
}

// Unmount stops serving the mount and removes it. It is idempotent. When processes still use
// the mount after Limits.UnmountBusyTimeout, the mount is detached lazily and the error wraps
// ErrDetached (the path is free; open files are served at most Limits.DetachedServeTimeout).
func (m *Mounted) Unmount() error {
	unlock := lockPath(m.path)
	defer unlock()
	return m.unmountLocked()
}

func (m *Mounted) unmountLocked() error {
	if m.unmounted {
		return nil
	}
	err := unmountLive(m.path, m.limits, m.served, m.conn, m.logger)
	if err != nil && !errors.Is(err, ErrDetached) {
		return err
	}
	m.unmounted = true
	if activeMount(m.path) == m {
		setActive(m.path, nil)
	}
	if m.createdDir {
		os.Remove(m.path) // only if empty: never anything the user left there
	}
	return err
}

// unmountLive unmounts a mount whose server answers, retrying while busy and detaching it
// lazily past the limit. served and conn are those of our own server (nil, 0 otherwise).
func unmountLive(path string, l Limits, served <-chan struct{}, conn uint32, logger *log.Logger) error {
	start := time.Now()
	for {
		err := unmountOnce(path, false)
		if err == nil || errors.Is(err, errNotMounted) {
			break
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("cannot unmount %s: %w", path, err)
		}
		if time.Since(start) < l.UnmountBusyTimeout {
			time.Sleep(l.UnmountRetryInterval)
			continue
		}
		var holders []string
		for _, h := range holdersOf(path) {
			holders = append(holders, h.String())
		}
		if err := unmountOnce(path, true); err != nil && !errors.Is(err, errNotMounted) {
			return fmt.Errorf("%s is busy and cannot be detached: %w", path, err)
		}
		detached := &DetachedError{Path: path, Waited: time.Since(start).Round(time.Millisecond), Holders: holders}
		if served != nil && os.Geteuid() == 0 {
			detached.ServeLimit = l.DetachedServeTimeout
			go abortWhenOverdue(served, conn, l.DetachedServeTimeout, logger)
		}
		return detached
	}
	if served == nil {
		return nil
	}
	timer := time.NewTimer(l.ServerExitTimeout)
	defer timer.Stop()
	// The kernel ends the FUSE connection, and so the server, when the file system's last
	// mount goes. A copy of the mount in another mount namespace (one made while it was
	// mounted: unshare -m, a service with a private /tmp, a container — root's) keeps the
	// connection, and the server, alive after our unmount: waiting for the server would sit
	// out ServerExitTimeout every time (root's post_run took 5.0 s). When the connection
	// outlives the unmount, cut it at once; otherwise give the server the time to finish the
	// requests it is answering.
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for checks := 0; ; checks++ {
		select {
		case <-served:
			return nil
		case <-timer.C:
			// Unmounted, but the server still reads the device: cut the connection.
			if err := abortConnection(conn); err != nil {
				logger.Printf("mount: server of %s did not stop after unmount: %v", path, err)
			}
			return nil
		case <-poll.C:
		}
		if checks < 10 { // the first 100 ms: a connection the unmount ended is gone by then
			continue
		}
		if connectionOutlives(conn) {
			if err := abortConnection(conn); err != nil {
				logger.Printf("mount: %s is unmounted here but still mounted elsewhere (another mount namespace), and its FUSE connection could not be cut: %v", path, err)
				<-timer.C // as before: the server stops when the other mounts go, or not at all
				return nil
			}
			logger.Printf("mount: %s was still mounted in another mount namespace after its unmount: its FUSE connection %d was cut", path, conn)
			select {
			case <-served:
			case <-timer.C:
			}
			return nil
		}
		poll.Stop() // the connection is gone: the server ends when its requests are answered
	}
}

// abortWhenOverdue aborts the connection of a detached mount that is still served after limit.
func abortWhenOverdue(served <-chan struct{}, conn uint32, limit time.Duration, logger *log.Logger) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-served:
	case <-timer.C:
		if err := abortConnection(conn); err != nil {
			logger.Printf("mount: detached mount still served after %s: %v", limit, err)
		} else {
			logger.Printf("mount: aborted FUSE connection %d: files stayed open %s after a lazy unmount", conn, limit)
		}
	}
}

// UnmountPath unmounts the Spillway mount at path when the Mounted handle is gone (after an
// agent restart). It is idempotent: a path that is not mounted is fine. A dead or hung mount
// is aborted and detached; a live one is unmounted like Mounted.Unmount (including the lazy
// detach when busy). It refuses to touch a mount that is not Spillway's. A zero limits means
// the defaults.
func UnmountPath(path string, limits Limits) error {
	limits = limits.withDefaults()
	canonical, err := canonicalMountPath(path, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no parent, so nothing mounted
	}
	if err != nil {
		return err
	}
	unlock := lockPath(canonical)
	defer unlock()
	if m := activeMount(canonical); m != nil {
		return m.unmountLocked()
	}
	var detached error
	for range maxStackedMounts {
		mounts, err := mounttable.At(canonical)
		if err != nil {
			return err
		}
		if len(mounts) == 0 {
			return detached
		}
		top := mounts[len(mounts)-1]
		if top.FSType != fsType {
			if detached != nil {
				return detached
			}
			return fmt.Errorf("refusing to unmount %s: it is a %s mount (source %s), not a Spillway mount",
				canonical, top.FSType, top.Source)
		}
		state, err := probe(canonical, limits.ProbeTimeout)
		if err != nil {
			return err
		}
		switch state {
		case pathStale, pathHung:
			if err := removeDeadMount(canonical, top, state); err != nil {
				return err
			}
		default:
			err := unmountLive(canonical, limits, nil, top.Minor, log.Default())
			if errors.Is(err, ErrDetached) {
				detached = err
			} else if err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("%s still has a Spillway mount after removing %d; unmount it by hand (`umount -l %s`)",
		canonical, maxStackedMounts, canonical)
}

// dialRemote connects to the storage agent holding a remote namespace.
func dialRemote(spec Spec, l Limits, logger *log.Logger) (*backend, error) {
	r := spec.Remote
	c, err := client.Dial(context.Background(), client.Options{
		Address: r.Address, Token: r.Token, Client: r.Client, Capability: r.Capability, CapabilityKey: r.CapabilityKey, TLS: r.TLS,
		Fragment: r.FragmentID, Namespace: r.NamespaceID, Instance: r.InstanceID,
		ReadOnly: spec.ReadOnly, MaxFileSize: spec.MaxFileSize, Limits: r.Limits, Log: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("cannot reach namespace %d on storage node %s: %w", r.NamespaceID, r.Address, err)
	}
	return &backend{
		client:      c,
		readOnly:    spec.ReadOnly,
		keepCache:   spec.ClientCache,
		blockSize:   uint32(l.PreferredIOSize),
		timeout:     c.Limits().RequestTimeout,
		writeBehind: int64(max(l.WriteBehind, 0)),
		maxFileSize: spec.MaxFileSize,
		unlinkSlots: unlinkSlots(l),
		createSlots: createSlots(l),
		placeDelay:  max(l.CreateWriteWait, 0),
		wholeMax:    max(l.CreateWholeMax, 0),
		log:         logger,
	}, nil
}

// unlinkSlots is the bound of a remote mount's removals on their way (nil: none go behind).
func unlinkSlots(l Limits) chan struct{} {
	if l.UnlinksBehind <= 0 {
		return nil
	}
	return make(chan struct{}, min(l.UnlinksBehind, 1<<16))
}

// createSlots is the bound of a remote mount's creates on their way (nil: none go behind).
func createSlots(l Limits) chan struct{} {
	if l.CreatesBehind <= 0 {
		return nil
	}
	return make(chan struct{}, min(l.CreatesBehind, 1<<10))
}

// openLocal serves a namespace of this host from this process.
func openLocal(spec Spec, l Limits, path string, asRoot bool, logger *log.Logger) (*backend, error) {
	local, err := server.OpenLocal(server.LocalOptions{
		Dir: spec.SourceDir, Tracker: spec.Tracker, ReadOnly: spec.ReadOnly, MaxFileSize: spec.MaxFileSize,
		Name: path, Log: slog.New(slog.NewTextHandler(logger.Writer(), nil)), ProjectQuota: spec.ProjectQuota,
		FragmentDevice: spec.FragmentDevice, Fragment: spec.Fragment, Namespace: spec.NamespaceID, Client: spec.Client,
		Lease: l.Lease, Cache: spec.Cache,
	})
	if err != nil {
		return nil, fmt.Errorf("cannot serve namespace directory %s: %w", spec.SourceDir, err)
	}
	return &backend{
		client:    localTransport{local},
		local:     local,
		readOnly:  spec.ReadOnly,
		keepCache: spec.ClientCache,
		blockSize: uint32(l.PreferredIOSize),
		// No network: an operation takes what the disk takes; the bound only catches a hang.
		timeout: client.DefaultLimits().RequestTimeout,
		// Passthrough where nothing can write, or where the file system counts what is
		// written (a project quota) and nothing else must be enforced: MFS is the server's,
		// and a striped file's data is on other servers. Every open of such a mount is handed
		// over: mixing passthrough and cached opens of one file makes the kernel fail the
		// later open with EIO.
		// Never for a cache: its files are the PFS's, their data the cache engine's.
		passthrough: !spec.DisablePassthrough && asRoot && spec.Cache == nil &&
			(spec.ReadOnly || kernelWritesAllowed(spec, local)),
		kernelWrites: !spec.DisablePassthrough && asRoot && !spec.ReadOnly && kernelWritesAllowed(spec, local),
	}, nil
}

// kernelWritesAllowed says whether the kernel may write a writable local mount's files itself
// (FUSE passthrough): only when nothing the server enforces would be bypassed. The capacity
// is then the file system's to enforce (a project quota on the fragment, or the fragment's own
// file system); MFS and the write window are the
// server's alone; a striped instance's files hold no data here. testKernelWritesWithoutQuota
// lets the tests and benchmarks measure the path on kernels without XFS quotas.
func kernelWritesAllowed(spec Spec, local *server.Local) bool {
	return spec.MaxFileSize == 0 && len(spec.Stripes) == 0 && len(spec.MDS) <= 1 && !local.WindowLimited() &&
		(local.QuotaEnforced() || testKernelWritesWithoutQuota)
}

// testKernelWritesWithoutQuota is set by tests only (see kernelWritesAllowed).
var testKernelWritesWithoutQuota bool
