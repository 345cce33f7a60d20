// Package server is the storage side of warpfs: it serves the namespaces of this node's
// fragments to the FUSE clients of compute nodes (package client, mounted by package
// mount), over the protocol of package proto.
//
// A connection is one mount: after the handshake (the shared token proven without being sent,
// the namespace named), every request is confined to that namespace (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS for directories,
// *at calls that never follow a symbolic link for the last component), charged to the
// instance's usage tracker (the one the stage engine and local mounts of the instance share,
// so writes past the capacity fail with ENOSPC exactly as on a local mount), and files are
// created as the calling user. Up to Limits.MaxInFlight requests of a connection run at
// once; the server reads no further request until one finishes, so a client that floods it
// is slowed by TCP, not by memory.
package server

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/netgroup"
	"github.com/spillway-hpc/spillway/internal/nodekey"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// Target is a namespace this node serves: its directory and its instance's tracker.
type Target struct {
	Dir     string
	Tracker *usage.Tracker
	// ProjectQuota is the project whose file-system limit holds the namespace (0: none):
	// statfs then reports its room too, which covers what co-located mounts wrote through
	// the kernel directly.
	ProjectQuota uint32
	// FragmentDevice is the device number of the fragment's own file system (the agent's
	// agent.fragment_filesystem = "xfs-loop") when the namespace is on it and it holds the
	// instance to its capacity; 0: none. statfs then reports its room too.
	FragmentDevice uint64
	// Fragment is the fragment's counters and write window (limits.go), shared by every
	// session of the fragment; nil: nothing counted or limited.
	Fragment *Fragment
	// Cache makes the target a cache instance's (cachens.go): its namespace is a PFS
	// directory and its stripe objects are a data engine's; Dir is then the instance's
	// directory on this node's SSD, which holds the sizes table. nil: an ordinary target.
	Cache *CacheTarget
}

// Resolver finds the namespace a client names in its handshake, or says why it cannot be
// served (the message goes back to the client).
// stripes asks for the fragment's stripe objects rather than a namespace.
type Resolver func(fragment, namespace, instance int64, stripes bool) (Target, error)

// Limits bound what the server spends on clients. Zero fields mean the defaults.
type Limits struct {
	// HandshakeTimeout bounds a connection's handshake; a client silent longer is dropped.
	// Default 5s.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection that sent nothing for this long (clients ping every
	// keepalive interval, so only dead clients reach it), and bounds the write of a reply.
	// Default 1m.
	IdleTimeout time.Duration
	// MaxInFlight is how many requests of one connection run at once. Default 64.
	MaxInFlight int
	// MaxConnections bounds the authenticated connections (mounts) served at once; more are
	// refused with the reason. Default 1024.
	MaxConnections int
	// MaxHandshakes bounds the connections not yet authenticated, from all peers together.
	// Past it a new connection closes one still in its handshake, chosen so that idle
	// connections from anyone who can reach the port, from as many addresses as they like,
	// cannot crowd out the mounts of real jobs (see evictHandshake). Default 64.
	MaxHandshakes int
	// MaxHandshakesPerPeer bounds the unauthenticated connections of one peer address (a new
	// one closes that peer's oldest that sent nothing, or else its oldest), so one host
	// cannot take every handshake slot. Default 8.
	MaxHandshakesPerPeer int
	// RefusalLogInterval: a refused connection is logged at most once per interval and
	// reason, with the count of those not logged. Default 1m.
	RefusalLogInterval time.Duration
	// MaxOpenFiles bounds the files and directories one connection keeps open; past it
	// opens fail with EMFILE. Default 16384.
	MaxOpenFiles int
	// Lease is how long a client may cache the names and attributes a reply gives it
	// (leases.go, warpfs.lease); negative: never (every lookup and stat asks the server).
	// Default DefaultLease.
	Lease time.Duration
}

// DefaultLimits are the limits' defaults.
func DefaultLimits() Limits { return Limits{}.withDefaults() }

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
	def(&l.HandshakeTimeout, 5*time.Second)
	def(&l.IdleTimeout, time.Minute)
	defInt(&l.MaxInFlight, 64)
	defInt(&l.MaxConnections, 1024)
	defInt(&l.MaxHandshakes, 64)
	defInt(&l.MaxHandshakesPerPeer, 8)
	def(&l.RefusalLogInterval, time.Minute)
	defInt(&l.MaxOpenFiles, 16384)
	if l.Lease == 0 {
		l.Lease = DefaultLease
	}
	return l
}

// Options configure a server.
type Options struct {
	// Token is what this node holds (agent.token_file): its own node credential (package
	// nodekey), and then a mount needs a capability from the controller; or the cluster's
	// shared secret, and then a client proving the secret may also mount anything. With none,
	// every client is refused.
	Token string
	// Node is this node's name: its credential is derived from the secret when Token is it.
	Node    string
	Resolve Resolver
	Limits  Limits
	Log     *slog.Logger
	// OnRequest, when set, is called with the operation of every file operation a remote
	// mount sends, as the server starts it (tests count the requests each server gets).
	OnRequest func(op proto.Op)
	// MaxVersion, when not 0, is the newest protocol version the server speaks, below
	// proto.MaxVersion (tests of newer clients against older servers).
	MaxVersion uint16
}

// Server serves namespaces to remote mounts.
type Server struct {
	opt    Options
	lim    Limits
	log    *slog.Logger
	inodes *inodeTable

	refusals *throttledLog

	mu       sync.Mutex
	conns    map[net.Conn]struct{} // every connection, to close them all at shutdown
	pending  []*pendingConn        // connections in their handshake, oldest first
	sessions int                   // authenticated connections
	active   map[int64]int         // instance → sessions
	wg       sync.WaitGroup
}

// pendingConn is a connection in its handshake.
type pendingConn struct {
	nc      net.Conn
	peer    string // its address without the port
	network string // its peer's network (netgroup.Of): the unit evictHandshake spreads over
	hello   bool   // it sent a valid HELLO: its AUTH is a round trip away
}

// New returns a server; Serve runs it.
func New(opt Options) *Server {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	lim := opt.Limits.withDefaults()
	return &Server{opt: opt, lim: lim, log: opt.Log, inodes: hostInodes,
		refusals: newThrottledLog(opt.Log, lim.RefusalLogInterval),
		conns:    map[net.Conn]struct{}{}, active: map[int64]int{}}
}

// Serve accepts connections on l until ctx ends, then closes every connection and returns
// once they are all finished.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	stop := context.AfterFunc(ctx, func() {
		l.Close()
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	})
	defer stop()
	defer s.wg.Wait()
	for {
		nc, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return err
		}
		pc := &pendingConn{nc: nc, peer: peerHost(nc)}
		pc.network = netgroup.Of(pc.peer)
		s.mu.Lock()
		if ctx.Err() != nil {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		s.makeRoomForHandshake(pc.peer)
		s.pending = append(s.pending, pc)
		s.conns[nc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(pc)
	}
}

// Active reports whether a client has the instance mounted through this server.
func (s *Server) Active(instance int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active[instance] > 0
}

// Connections is the number of connections open (for tests and status).
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// peerHost is the address a connection comes from, without its port: the unit of
// MaxHandshakesPerPeer.
func peerHost(nc net.Conn) string {
	addr := nc.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// makeRoomForHandshake closes a connection still in its handshake when a new one from peer
// would pass MaxHandshakesPerPeer (one of that peer's) or MaxHandshakes (one of anyone's,
// evictHandshake). The caller holds s.mu.
func (s *Server) makeRoomForHandshake(peer string) {
	var ofPeer []int
	for i, pc := range s.pending {
		if pc.peer == peer {
			ofPeer = append(ofPeer, i)
		}
	}
	var victim int
	why := "warpfs.max_handshakes_per_peer"
	switch {
	case len(ofPeer) >= s.lim.MaxHandshakesPerPeer:
		victim = pickVictim(s.pending, ofPeer)
	case len(s.pending) >= s.lim.MaxHandshakes:
		victim, why = s.evictHandshake(), "warpfs.max_handshakes"
	default:
		return
	}
	pc := s.pending[victim]
	s.pending = append(s.pending[:victim], s.pending[victim+1:]...)
	pc.nc.Close() // its handshake fails; serveConn finds it no longer pending
	s.refusals.warn("warpfs: closing a connection still in its handshake to admit a new one ("+why+")",
		"remote", pc.peer, "sent_hello", pc.hello)
}

// evictHandshake chooses the connection to close when MaxHandshakes are pending: one of the
// network (netgroup.Of: a /24, a /64) holding the most pending connections, ties going to the
// network with the oldest one; within it pickVictim's. Connections that sent nothing go
// before those that sent a HELLO, whoever holds them. So whoever opens idle connections, from
// one address or a whole network of them, closes their own first, and a real client, which
// sends its HELLO at once and its AUTH a round trip later, is closed only by more
// connections from its own network sending HELLOs in that round trip. The caller holds s.mu.
func (s *Server) evictHandshake() int {
	silent := false
	for _, pc := range s.pending {
		if !pc.hello {
			silent = true
			break
		}
	}
	count := map[string]int{}
	first := map[string]int{} // the oldest candidate of each network
	for i, pc := range s.pending {
		count[pc.network]++
		if _, ok := first[pc.network]; !ok && (!silent || !pc.hello) {
			first[pc.network] = i
		}
	}
	best := ""
	for network, i := range first {
		if best == "" || count[network] > count[best] || count[network] == count[best] && i < first[best] {
			best = network
		}
	}
	var of []int
	for i, pc := range s.pending {
		if pc.network == best {
			of = append(of, i)
		}
	}
	return pickVictim(s.pending, of)
}

// pickVictim is, of the pending connections at indexes of (oldest first), the oldest that sent
// nothing, or else the oldest.
func pickVictim(pending []*pendingConn, of []int) int {
	for _, i := range of {
		if !pending[i].hello {
			return i
		}
	}
	return of[0]
}

// helloed records that pc sent a valid HELLO.
func (s *Server) helloed(pc *pendingConn) {
	s.mu.Lock()
	pc.hello = true
	s.mu.Unlock()
}

// handshakeDone takes pc off the pending list, if makeRoomForHandshake has not.
func (s *Server) handshakeDone(pc *pendingConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, p := range s.pending {
		if p == pc {
			s.pending = append(s.pending[:i], s.pending[i+1:]...)
			return
		}
	}
}

func (s *Server) serveConn(pc *pendingConn) {
	nc, peer := pc.nc, pc.peer
	defer s.wg.Done()
	defer func() {
		nc.Close()
		s.mu.Lock()
		delete(s.conns, nc)
		s.mu.Unlock()
	}()
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	br := bufio.NewReaderSize(nc, 64<<10)
	nc.SetDeadline(time.Now().Add(s.lim.HandshakeTimeout))
	sess, err := s.handshake(pc, br)
	s.handshakeDone(pc)
	if err != nil {
		s.refusals.warn("warpfs: connection refused", "remote", peer, "err", err.Error())
		return
	}
	defer func() {
		s.mu.Lock()
		s.sessions--
		s.mu.Unlock()
	}()
	nc.SetDeadline(time.Time{})
	s.log.Info("warpfs: client connected", "client", sess.client, "remote", nc.RemoteAddr().String(),
		"instance", sess.instance, "read_only", sess.v.readOnly)
	c := &srvConn{s: s, nc: nc, br: br, sess: sess, sem: make(chan struct{}, s.lim.MaxInFlight),
		work: make(chan request), version: sess.version, notified: map[uint64]chan struct{}{}}
	if sess.leasing {
		sess.lease.h, sess.lease.own = sess.lease.l.bind(sess.incarnation, c), c
	}
	if sc, ok := nc.(syscall.Conn); ok && sess.cache == nil {
		if raw, err := sc.SyscallConn(); err == nil {
			c.raw, sess.spans = raw, true
		}
	}
	err = c.loop()
	c.nmu.Lock()
	c.closed = true
	c.nmu.Unlock()
	c.wg.Wait()
	close(c.work) // the idle workers end
	sess.lease.leave()
	sess.closeAll()
	sess.closeStubs()
	sess.closeObjects()
	sess.closeCache()
	sess.v.close()
	s.mu.Lock()
	s.active[sess.instance]--
	if s.active[sess.instance] <= 0 {
		delete(s.active, sess.instance)
	}
	s.mu.Unlock()
	switch {
	case errors.Is(err, proto.ErrMalformed):
		s.log.Warn("warpfs: closing a connection that broke the protocol", "client", sess.client, "err", err)
	case err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed):
		s.log.Info("warpfs: client disconnected", "client", sess.client, "err", err)
	default:
		s.log.Info("warpfs: client disconnected", "client", sess.client)
	}
}

// handshakeMaxBody bounds the frames of the handshake.
const handshakeMaxBody = 4096

// refused is a handshake failure the client is told about.
type refused struct {
	errno syscall.Errno
	msg   string
}

func (r *refused) Error() string { return r.msg }

func (s *Server) handshake(pc *pendingConn, br *bufio.Reader) (*session, error) {
	nc := pc.nc
	h, body, err := readFrame(br, handshakeMaxBody)
	if err != nil {
		return nil, err
	}
	var hello proto.Hello
	if h.Op != proto.OpHello || h.Kind != proto.KindRequest {
		return nil, fmt.Errorf("%w: expected HELLO, got %s", proto.ErrMalformed, h.Op)
	}
	if err := proto.Decode(body, &hello); err != nil {
		return nil, err
	}
	if hello.Magic != proto.Magic {
		return nil, fmt.Errorf("%w: not a warpfs client (magic %#x)", proto.ErrMalformed, hello.Magic)
	}
	version := min(hello.MaxVersion, proto.MaxVersion)
	if s.opt.MaxVersion != 0 {
		version = min(version, s.opt.MaxVersion)
	}
	if version < max(hello.MinVersion, proto.MinVersion) {
		return nil, s.refuse(nc, h, &refused{syscall.EPROTONOSUPPORT, fmt.Sprintf(
			"the client speaks warpfs versions %d-%d, this storage node %d-%d; upgrade the older side",
			hello.MinVersion, hello.MaxVersion, proto.MinVersion, proto.MaxVersion)})
	}
	s.helloed(pc)
	var ch proto.Challenge
	ch.Version = version
	rand.Read(ch.Nonce[:])
	if err := writeFrame(nc, proto.AppendFrame(nil, proto.Header{Op: proto.OpHello, Kind: proto.KindReply, ID: h.ID}, &ch)); err != nil {
		return nil, err
	}

	h, body, err = readFrame(br, handshakeMaxBody)
	if err != nil {
		return nil, err
	}
	var auth proto.Auth
	if h.Op != proto.OpAuth || h.Kind != proto.KindRequest {
		return nil, fmt.Errorf("%w: expected AUTH, got %s", proto.ErrMalformed, h.Op)
	}
	if err := proto.Decode(body, &auth); err != nil {
		return nil, err
	}
	if s.opt.Token == "" {
		return nil, s.refuse(nc, h, &refused{syscall.EACCES,
			"this storage node has no shared token (agent.token_file) and accepts no remote mounts"})
	}
	key, r := s.proofKey(&auth)
	if r != nil {
		return nil, s.refuse(nc, h, r)
	}
	if !proto.ProofEqual(auth.Proof, proto.ClientProof(key, ch.Nonce, hello.Nonce)) {
		if auth.Capability != "" {
			return nil, s.refuse(nc, h, &refused{syscall.EACCES, fmt.Sprintf(
				"client %q presented a capability this node did not grant (issued for another node, or forged)", auth.Client)})
		}
		return nil, s.refuse(nc, h, &refused{syscall.EACCES, fmt.Sprintf(
			"client %q presented a wrong token; agent.token_file must hold the same secret on every node", auth.Client)})
	}
	s.handshakeDone(pc) // proven: no longer an anonymous connection any new one may close
	if s.opt.Resolve == nil {
		return nil, s.refuse(nc, h, &refused{syscall.ENOENT, "this node serves no namespaces"})
	}
	t, err := s.opt.Resolve(auth.Fragment, auth.Namespace, auth.Instance, auth.Stripes)
	if err != nil {
		return nil, s.refuse(nc, h, &refused{syscall.ENOENT, err.Error()})
	}
	v, err := openVolume(t.Dir, t.Tracker, s.inodes)
	if err != nil {
		return nil, s.refuse(nc, h, &refused{errnoOf(err), fmt.Sprintf("namespace %d: %v", auth.Namespace, err)})
	}
	v.readOnly = auth.ReadOnly
	v.maxFileSize = int64(min(auth.MaxFileSize, 1<<62))
	v.acct = newAccount(t.Fragment, auth.Namespace, auth.Client, auth.Stripes)
	v.objects = auth.Stripes
	if t.ProjectQuota != 0 {
		v.useQuota(t.ProjectQuota) // without it statfs counts the tracker alone, as before
	}
	if t.FragmentDevice != 0 {
		v.useFragmentFS(t.FragmentDevice)
	}
	cache, root, errno := openCache(t, v, auth.Stripes)
	if errno != 0 {
		v.close()
		return nil, s.refuse(nc, h, &refused{errno, fmt.Sprintf("namespace %d: %v", auth.Namespace, errno)})
	}
	s.mu.Lock()
	if s.sessions >= s.lim.MaxConnections {
		n := s.sessions
		s.mu.Unlock()
		if cache != nil {
			cache.close()
		}
		v.close()
		return nil, s.refuse(nc, h, &refused{syscall.EAGAIN, fmt.Sprintf(
			"storage node serves %d mounts already, its limit (warpfs.max_connections); raise it or spread jobs over more nodes", n)})
	}
	s.sessions++ // released by serveConn, or below if the welcome cannot be sent
	s.mu.Unlock()
	sess := &session{log: s.log, maxOpenFiles: s.lim.MaxOpenFiles, v: v, client: auth.Client, instance: auth.Instance,
		handles: map[uint64]*handle{}, version: version, cache: cache}
	v.noteFull = sess.noteFull
	if !auth.Stripes && t.Cache == nil && v.striped {
		sess.openObjects = func() (*volume, error) {
			ot, err := s.opt.Resolve(auth.Fragment, auth.Namespace, auth.Instance, true)
			if err != nil {
				return nil, err
			}
			ov, err := openVolume(ot.Dir, ot.Tracker, s.inodes)
			if err != nil {
				return nil, err
			}
			ov.readOnly, ov.maxFileSize, ov.objects = v.readOnly, v.maxFileSize, true
			ov.acct = newAccount(ot.Fragment, auth.Namespace, auth.Client, true)
			if ot.ProjectQuota != 0 {
				ov.useQuota(ot.ProjectQuota)
			}
			if ot.FragmentDevice != 0 {
				ov.useFragmentFS(ot.FragmentDevice)
			}
			ov.noteFull = sess.noteFull
			return ov, nil
		}
	}
	w := proto.Welcome{Proof: proto.ServerProof(key, ch.Nonce, hello.Nonce), MaxIO: proto.MaxIO, Root: root}
	var l *leases
	if t.Cache == nil { // a cache namespace is the PFS's, which others change unseen: no leases
		l = acquireLeases(t.Dir, s.lim.Lease)
	}
	if l != nil && !auth.Stripes {
		// Every session of the namespace takes part: its changes are told to the others;
		// a client of LeaseVersion is also told of theirs, and may cache.
		sess.lease = &leaseUse{l: l}
		if version >= proto.LeaseVersion {
			sess.leasing = true
			if auth.Incarnation != 0 {
				sess.incarnation = fmt.Sprintf("%s/%x", auth.Client, auth.Incarnation)
			}
			w.LeaseMillis = uint32(s.lim.Lease / time.Millisecond)
		}
	} else {
		releaseLeases(l)
	}
	if err := writeFrame(nc, proto.AppendFrame(nil, proto.Header{Op: proto.OpAuth, Kind: proto.KindReply, ID: h.ID}, &w)); err != nil {
		sess.lease.leave()
		sess.closeCache()
		v.close()
		s.mu.Lock()
		s.sessions--
		s.mu.Unlock()
		return nil, err
	}
	s.mu.Lock()
	s.active[sess.instance]++
	s.mu.Unlock()
	return sess, nil
}

// refuse tells the client why, and returns the reason as the error.
func (s *Server) refuse(nc net.Conn, h proto.Header, r *refused) error {
	writeFrame(nc, proto.AppendFrame(nil, proto.Header{Op: h.Op, Kind: proto.KindReply, ID: h.ID, Errno: uint32(r.errno)},
		&proto.Refusal{Message: r.msg}))
	return r
}

// readFrame reads one whole frame of at most maxBody bytes of body.
func readFrame(r io.Reader, maxBody int) (proto.Header, []byte, error) {
	var hdr [proto.HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return proto.Header{}, nil, err
	}
	h, err := proto.ParseHeader(hdr[:], maxBody)
	if err != nil {
		return h, nil, err
	}
	body := make([]byte, h.BodyLen)
	if _, err := io.ReadFull(r, body); err != nil {
		return h, nil, err
	}
	return h, body, nil
}

func writeFrame(w io.Writer, frame []byte) error {
	_, err := w.Write(frame)
	return err
}

// session is one client's mount of one namespace.
type session struct {
	log          *slog.Logger
	maxOpenFiles int
	v            *volume
	client       string
	instance     int64
	fullLogged   atomic.Bool
	panicked     atomic.Bool // a request's handler panicked (contained)
	version      uint16      // the protocol version of its connection (0: in-process)
	// spans: a READ of at least minSpan bytes is answered with a fileSpan (sendfile.go) that
	// its connection sends, not with bytes read into dest.
	spans bool

	// lease is the session's part in its namespace's leases (leases.go); nil: none. leasing
	// says its client may hold them (it is told of other sessions' changes).
	lease       *leaseUse
	leasing     bool
	incarnation string // the client's mount across reconnections ("": none)

	// cache serves the session when its target is a cache instance's (cachens.go,
	// cachestripes.go); nil otherwise.
	cache cacheBackend

	mu      sync.Mutex
	handles map[uint64]*handle
	next    uint64
	// stubs are the files made ahead for the session's client, by inode number (stubs.go);
	// each is an open file, counted with handles against maxOpenFiles.
	stubs     map[uint64]reservedStub
	stubOrder []uint64 // the stubs' inode numbers, oldest first (and some placed since)

	// openObjects opens this node's stripes of the session's instance, where a PLACE with
	// the file's data keeps it (stubs.go, writeWhole); nil: the session cannot (a session of
	// stripes, a cache namespace, an in-process one). objects is what it opened. Guarded by
	// mu.
	openObjects func() (*volume, error)
	objects     *volume
}

// noteFull logs, once per session, that the instance refused to grow: the user only sees
// "No space left on device", the administrator gets the numbers.
func (s *session) noteFull(requested uint64) {
	if s.fullLogged.Swap(true) {
		return
	}
	t := s.v.tracker
	full := &usage.FullError{Name: t.Name(), Requested: requested, Used: t.Used(), Capacity: t.Capacity()}
	s.log.Warn("warpfs: a mount hit the capacity (logged once per mount)", "client", s.client, "err", full.Error())
}

// add registers a new handle, or closes it and fails with EMFILE past the limit.
func (s *session) add(h *handle) (uint64, syscall.Errno) {
	s.mu.Lock()
	if len(s.handles)+len(s.stubs) >= s.maxOpenFiles {
		if old, ok := s.oldestStubLocked(); ok { // files made ahead give way to opens
			s.mu.Unlock()
			s.v.dropStub(old)
			return s.add(h)
		}
		s.mu.Unlock()
		s.closeFile(h)
		return 0, syscall.EMFILE
	}
	s.next++
	h.id = s.next
	h.refs = 1
	s.handles[h.id] = h
	s.mu.Unlock()
	return h.id, 0
}

func (s *session) get(id uint64) *handle {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.handles[id]
	if h != nil {
		h.refs++
	}
	return h
}

func (s *session) put(h *handle) {
	if h == nil {
		return
	}
	s.mu.Lock()
	h.refs--
	last := h.refs == 0 && h.removed
	s.mu.Unlock()
	if last {
		s.closeFile(h)
	}
}

// closeFile closes a handle whose last use ended.
func (s *session) closeFile(h *handle) {
	if h.cache != nil {
		h.cache.close()
		return
	}
	s.v.closeFile(h)
}

func (s *session) release(id uint64) syscall.Errno {
	s.mu.Lock()
	h := s.handles[id]
	if h != nil {
		delete(s.handles, id)
		h.removed = true
	}
	s.mu.Unlock()
	if h == nil {
		return syscall.EBADF
	}
	s.put(h)
	return 0
}

func (s *session) closeAll() {
	s.mu.Lock()
	ids := make([]uint64, 0, len(s.handles))
	for id := range s.handles {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.release(id)
	}
}

// srvConn is a connection past its handshake.
type srvConn struct {
	s    *Server
	nc   net.Conn
	br   *bufio.Reader
	sess *session
	sem  chan struct{}
	wg   sync.WaitGroup
	wmu  sync.Mutex

	// work hands a request to a worker waiting idle (dispatch). Workers outlive their
	// request: a new goroutine per request paid for its creation and, above all, for
	// growing its stack to the handlers' depth at every request (a tenth of a create's CPU).
	// There are at most MaxInFlight of them (each holds sem while it works, and one starts
	// only when none is idle); they end with the connection.
	work chan request

	version uint16 // the protocol version the handshake chose

	// raw is the socket under nc when it is a plain one (not TLS): READs' data go from their
	// files to it with sendfile (sendfile.go). nil: they are copied through a buffer.
	raw syscall.RawConn

	// The notifications sent (leases.go) and not yet answered.
	nmu        sync.Mutex
	notified   map[uint64]chan struct{}
	nextNotify uint64
	closed     bool
}

// loop reads requests until the connection ends or breaks the protocol.
func (c *srvConn) loop() error {
	var hdr [proto.HeaderSize]byte
	for {
		c.nc.SetReadDeadline(time.Now().Add(c.s.lim.IdleTimeout))
		if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
			return err
		}
		h, err := proto.ParseHeader(hdr[:], proto.MaxBody)
		if err != nil {
			return err
		}
		if h.Kind == proto.KindReply && h.Op == proto.OpInval && c.version >= proto.LeaseVersion {
			if _, err := io.CopyN(io.Discard, c.br, int64(h.BodyLen)); err != nil {
				return err
			}
			c.acked(h.ID)
			continue
		}
		if h.Kind != proto.KindRequest {
			return fmt.Errorf("%w: a %s frame of kind %d sent to the server", proto.ErrMalformed, h.Op, h.Kind)
		}
		var m proto.Message
		var buf *ioBuf
		if h.Op == proto.OpWrite {
			m, buf, err = c.readWrite(h)
			if err != nil {
				return err
			}
		} else {
			body := make([]byte, h.BodyLen)
			if _, err := io.ReadFull(c.br, body); err != nil {
				return err
			}
			switch {
			case h.Op == proto.OpPing:
				c.reply(h, 0, nil)
				continue
			case h.Op == proto.OpBye:
				c.sess.lease.forget() // unmounted: nothing of it is cached any more
				continue
			case h.Op == proto.OpHello || h.Op == proto.OpAuth:
				return fmt.Errorf("%w: %s after the handshake", proto.ErrMalformed, h.Op)
			}
			m = proto.NewRequest(h.Op)
			if m == nil {
				c.reply(h, syscall.ENOSYS, nil)
				continue
			}
			if err := proto.Decode(body, m); err != nil {
				return fmt.Errorf("%s: %w", h.Op, err)
			}
		}
		c.sem <- struct{}{}
		c.wg.Add(1)
		c.dispatch(request{h: h, m: m, buf: buf})
	}
}

// request is a request read, for a worker.
type request struct {
	h   proto.Header
	m   proto.Message
	buf *ioBuf
}

// dispatch hands r to an idle worker, or starts one.
func (c *srvConn) dispatch(r request) {
	select {
	case c.work <- r:
	default:
		go c.worker(r)
	}
}

// worker handles r, then whatever dispatch hands it, until the connection ends.
func (c *srvConn) worker(r request) {
	for ok := true; ok; r, ok = <-c.work {
		c.handle(r.h, r.m, r.buf)
	}
}

// readWrite reads a WRITE's body: its data lands in an aligned buffer (O_DIRECT files need
// one).
func (c *srvConn) readWrite(h proto.Header) (proto.Message, *ioBuf, error) {
	if h.BodyLen < proto.WritePrefix || h.BodyLen-proto.WritePrefix > proto.MaxIO {
		return nil, nil, fmt.Errorf("%w: WRITE of %d bytes", proto.ErrMalformed, h.BodyLen)
	}
	var prefix [proto.WritePrefix]byte
	if _, err := io.ReadFull(c.br, prefix[:]); err != nil {
		return nil, nil, err
	}
	w := &proto.WriteReq{}
	if err := proto.Decode(prefix[:], w); err != nil {
		return nil, nil, err
	}
	buf := getBuf()
	n := int(h.BodyLen - proto.WritePrefix)
	if _, err := io.ReadFull(c.br, buf.b[:n]); err != nil {
		putBuf(buf)
		return nil, nil, err
	}
	w.Data = buf.b[:n]
	return w, buf, nil
}

// reply sends a reply with message m (nil: no body).
func (c *srvConn) reply(h proto.Header, errno syscall.Errno, m proto.Message) {
	c.replyFlags(h, errno, m, 0)
}

// replyFlags sends a reply with flags (proto.FlagLease).
func (c *srvConn) replyFlags(h proto.Header, errno syscall.Errno, m proto.Message, flags uint8) {
	if errno != 0 {
		m = nil
	}
	if c.version < proto.LeaseVersion {
		flags = 0
	}
	frame := proto.AppendFrame(make([]byte, 0, 256), proto.Header{Op: h.Op, Kind: proto.KindReply, ID: h.ID, Errno: uint32(errno), Flags: flags}, m)
	c.send(frame, nil)
}

// invalidate sends an OpInval notification (leases.go): done closes when the client replied.
func (c *srvConn) invalidate(items []proto.Inval) (<-chan struct{}, bool) {
	done := make(chan struct{})
	c.nmu.Lock()
	if c.closed {
		c.nmu.Unlock()
		return nil, false
	}
	c.nextNotify++
	id := c.nextNotify
	c.notified[id] = done
	c.nmu.Unlock()
	frame := proto.AppendFrame(make([]byte, 0, 64+32*len(items)), proto.Header{Op: proto.OpInval, Kind: proto.KindNotify, ID: id},
		&proto.InvalReq{Items: items})
	c.send(frame, nil)
	return done, true
}

// acked is the client's reply to notification id.
func (c *srvConn) acked(id uint64) {
	c.nmu.Lock()
	done := c.notified[id]
	delete(c.notified, id)
	c.nmu.Unlock()
	if done != nil {
		close(done)
	}
}

// replyData sends a successful reply whose body is data (READ).
func (c *srvConn) replyData(h proto.Header, data []byte) {
	var hdr [proto.HeaderSize]byte
	proto.PutHeader(hdr[:], proto.Header{Op: h.Op, Kind: proto.KindReply, ID: h.ID, BodyLen: uint32(len(data))})
	c.send(hdr[:], data)
}

func (c *srvConn) send(frame, data []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.SetWriteDeadline(time.Now().Add(c.s.lim.IdleTimeout))
	if err := proto.WriteFrame(c.nc, frame, data); err != nil {
		c.nc.Close() // the reader ends the connection
	}
}

// handle runs one request and replies.
func (c *srvConn) handle(h proto.Header, m proto.Message, buf *ioBuf) {
	defer func() {
		if buf != nil {
			putBuf(buf)
		}
		<-c.sem
		c.wg.Done()
	}()
	defer func() {
		// A request whose handler panicked may have left its connection's state half done:
		// the client reconnects and reopens, as after any lost connection.
		if c.sess.panicked.Swap(false) {
			c.nc.Close()
		}
	}()
	if f := c.s.opt.OnRequest; f != nil {
		f(h.Op)
	}
	if h.Op == proto.OpRead {
		out := getBuf()
		defer putBuf(out)
		rep, n, errno, _ := c.sess.measured(transportRemote, h.Op, h.UID, h.GID, m, out.b)
		if errno != 0 {
			c.reply(h, errno, nil)
			return
		}
		if sp, ok := rep.(*fileSpan); ok {
			c.sendSpan(h, sp) // its bytes go from the file (sendfile.go)
			return
		}
		c.replyData(h, out.b[:n])
		return
	}
	rep, _, errno, flags := c.sess.measured(transportRemote, h.Op, h.UID, h.GID, m, nil)
	if h.Flags&proto.FlagOneWay != 0 {
		return // the client waits for no reply
	}
	c.replyFlags(h, errno, rep, flags)
}

// removedReply is an UNLINK's or RENAME's reply as the session's client reads it: where the
// objects are, from ObjectsVersion on.
func (s *session) removedReply(rep proto.RemovedReply) *proto.RemovedReply {
	if s.version != 0 && s.version < proto.ObjectsVersion {
		rep.ObjectsKnown, rep.Objects = false, nil
	}
	return &rep
}

// dirAttrs says whether the session's client takes a directory's attributes in the replies
// to CREATE and UNLINK (DirAttrVersion on), which are only given leased (leases.go).
func (s *session) dirAttrs() bool {
	return s.lease != nil && s.lease.h != nil && (s.version == 0 || s.version >= proto.DirAttrVersion)
}

// withDir adds the attributes of directory dir, which a successful MKDIR, MKNOD, SYMLINK or
// LINK just changed, to its reply when the client takes them (dirAttrs).
func (s *session) withDir(v *volume, dir string) func(proto.Message, int, syscall.Errno) (proto.Message, int, syscall.Errno) {
	return func(m proto.Message, n int, errno syscall.Errno) (proto.Message, int, syscall.Errno) {
		if r, ok := m.(*proto.AttrReply); ok && errno == 0 && s.dirAttrs() {
			r.Dir = v.dirAttr(dir)
		}
		return m, n, errno
	}
}

// exec runs one request of the session as the caller uid:gid and returns its reply message
// (nil when it has none), or the errno. A READ reads into dest and returns the byte count.
// Both transports run every request through here: a connection (handle) and an in-process
// mount (Local).
func (s *session) exec(op proto.Op, uid, gid uint32, m proto.Message, dest []byte) (proto.Message, int, syscall.Errno) {
	if s.cache != nil {
		return s.cache.exec(s, op, uid, gid, m, dest)
	}
	v := s.v
	withHandle := func(id uint64, fn func(*handle) syscall.Errno) syscall.Errno {
		hd := s.get(id)
		if hd == nil {
			return syscall.EBADF
		}
		defer s.put(hd)
		return fn(hd)
	}
	// optional is a handle when the request names one (0 = by path).
	optional := func(id uint64) (*handle, syscall.Errno) {
		if id == 0 {
			return nil, 0
		}
		hd := s.get(id)
		if hd == nil {
			return nil, syscall.EBADF
		}
		return hd, 0
	}
	opened := func(hd *handle, attr proto.Attr, errno syscall.Errno) (proto.Message, int, syscall.Errno) {
		if errno != 0 {
			return nil, 0, errno
		}
		id, errno := s.add(hd)
		return &proto.OpenReply{Handle: id, Attr: attr, Layout: hd.layout, Truncated: hd.truncated}, 0, errno
	}
	attrReply := func(a proto.Attr, errno syscall.Errno) (proto.Message, int, syscall.Errno) {
		return &proto.AttrReply{Attr: a}, 0, errno
	}
	empty := func(errno syscall.Errno) (proto.Message, int, syscall.Errno) { return &proto.Empty{}, 0, errno }
	count := func(n int64, errno syscall.Errno) (proto.Message, int, syscall.Errno) {
		return &proto.CountReply{N: uint64(n)}, 0, errno
	}

	switch r := m.(type) {
	case *proto.PathReq:
		switch op {
		case proto.OpLookup:
			return attrReply(v.lookup(r.Path))
		case proto.OpReadlink:
			data, errno := v.readlink(r.Path)
			return &proto.DataReply{Data: data}, 0, errno
		case proto.OpOpendir:
			hd, errno := v.opendir(r.Path)
			if errno != 0 {
				return nil, 0, errno
			}
			id, errno := s.add(hd)
			return &proto.HandleReply{Handle: id}, 0, errno
		}
	case *proto.NodeReq:
		hd, errno := optional(r.Handle)
		if errno != 0 {
			return nil, 0, errno
		}
		defer s.put(hd)
		return attrReply(v.getattr(r.Path, hd))
	case *proto.SetattrReq:
		if r.Release && r.Handle == 0 {
			return nil, 0, syscall.EINVAL // only a handle is released
		}
		hd, errno := optional(r.Handle)
		if errno != 0 {
			return nil, 0, errno
		}
		defer s.put(hd)
		a, errno := v.setattr(r, hd, uid)
		if errno == 0 && r.Release {
			// A writer's size report at close and its RELEASE in one (proto.SetattrReq).
			hd.noteReported(r.Objects)
			s.release(r.Handle)
		}
		return attrReply(a, errno)
	case *proto.OpenReq:
		return opened(v.openFile(r.Path, r.Flags))
	case *proto.CreateReq:
		if op == proto.OpTmpfile {
			return opened(v.tmpfile(r, uid, gid))
		}
		var hd *handle
		var attr proto.Attr
		var errno syscall.Errno
		s.createPastMFC(func() syscall.Errno {
			hd, attr, errno = v.create(r, uid, gid)
			return errno
		})
		var dir *proto.Attr
		if hd != nil {
			dir, hd.dirAttr = hd.dirAttr, nil
		}
		m, n, errno := opened(hd, attr, errno)
		if errno == 0 && s.dirAttrs() {
			if dir == nil { // as the create left it, else asked now
				dir = v.dirAttr(r.Dir)
			}
			m.(*proto.OpenReply).Dir = dir
		}
		return m, n, errno
	case *proto.ReserveReq:
		rep, errno := s.reserve(v, r, uid, gid)
		if errno != 0 {
			return nil, 0, errno
		}
		return rep, 0, 0
	case *proto.PlaceReq:
		rep, dir, errno := s.place(v, r, uid, gid)
		if errno != 0 {
			return nil, 0, errno
		}
		if s.dirAttrs() {
			if dir == nil {
				dir = v.dirAttr(r.Dir)
			}
			rep.Dir = dir
		}
		return rep, 0, 0
	case *proto.MkdirReq:
		if op == proto.OpMknod {
			return s.withDir(v, r.Dir)(attrReply(v.mknod(r, uid, gid)))
		}
		return s.withDir(v, r.Dir)(attrReply(v.mkdir(r, uid, gid)))
	case *proto.SymlinkReq:
		return s.withDir(v, r.Dir)(attrReply(v.symlink(r, uid, gid)))
	case *proto.LinkReq:
		return s.withDir(v, r.Dir)(attrReply(v.link(r)))
	case *proto.EntryReq:
		rep, errno := v.unlink(r, op == proto.OpRmdir)
		if op == proto.OpRmdir {
			return empty(errno)
		}
		if errno != 0 || !s.dirAttrs() {
			rep.Dir = nil
		} else if rep.Dir == nil { // as the unlink left it, else asked now
			rep.Dir = v.dirAttr(r.Dir)
		}
		if errno == 0 && r.Local > 0 {
			s.removeLocalObject(&rep, r.Local-1)
		}
		return s.removedReply(rep), 0, errno
	case *proto.RenameReq:
		rep, errno := v.rename(r)
		return s.removedReply(rep), 0, errno
	case *proto.AdoptReq:
		rep, errno := v.adopt(r)
		return s.removedReply(rep), 0, errno
	case *proto.ReaddirReq:
		var rep proto.ReaddirReply
		errno := withHandle(r.Handle, func(hd *handle) (e syscall.Errno) {
			rep, e = v.readdir(hd, r.Offset)
			return e
		})
		return &rep, 0, errno
	case *proto.HandleReq:
		if r.Reported {
			if hd := s.get(r.Handle); hd != nil {
				hd.noteReported(r.Objects)
				s.put(hd)
			}
		}
		return empty(s.release(r.Handle))
	case *proto.ReadReq:
		if r.Offset > 1<<62 {
			return nil, 0, syscall.EINVAL
		}
		var n int
		var sp *fileSpan
		pread := func(hd *handle) syscall.Errno {
			if s.spans && r.Size >= minSpan {
				var errno syscall.Errno
				if sp, errno = span(hd.fd, r.Offset, min(int(r.Size), proto.MaxIO)); errno == 0 {
					n = sp.n
				}
				return errno
			}
			var err error
			n, err = unix.Pread(hd.fd, dest[:min(int(r.Size), len(dest))], int64(r.Offset))
			return errnoOf(err)
		}
		var errno syscall.Errno
		if r.Path != "" {
			// By name: opened, read and closed at once, as OPEN, READ and RELEASE would.
			var hd *handle
			if hd, _, errno = v.openFile(r.Path, unix.O_RDONLY); errno == 0 {
				errno = pread(hd)
				v.closeFile(hd)
			}
		} else {
			errno = withHandle(r.Handle, pread)
		}
		if errno == 0 {
			v.acct.read(n, r.Offset+uint64(n))
		}
		if sp != nil {
			return sp, n, errno
		}
		return nil, n, errno
	case *proto.WriteReq:
		var n int
		errno := withHandle(r.Handle, func(hd *handle) (e syscall.Errno) {
			n, e = v.write(hd, int64(len(r.Data)), int64(min(r.Offset, 1<<62)), uid, func(l int64) (int, error) {
				return unix.Pwrite(hd.fd, r.Data[:l], int64(r.Offset))
			})
			return e
		})
		if n > 0 || errno == 0 {
			v.acct.wrote(n, r.Offset+uint64(n))
		}
		return count(int64(n), errno)
	case *proto.WriteNameReq:
		// A stripe object written once: created if missing, written and closed, as CREATE,
		// WRITE and RELEASE would.
		if !v.objects {
			return nil, 0, syscall.EPERM // only stripe objects: a namespace's files are the metadata server's
		}
		n, errno := v.writeObject(r.Name, r.Offset, r.Data, uid, gid, 0)
		return count(int64(n), errno)
	case *proto.WriteSyncReq:
		// A write and the fsync after it, answered once: the file is synced only when all of
		// the data was written (a short write says why with the next request, as WRITE's).
		writeSync := func(hd *handle) (n int, errno syscall.Errno) {
			n, errno = v.write(hd, int64(len(r.Data)), int64(min(r.Offset, 1<<62)), uid, func(l int64) (int, error) {
				return unix.Pwrite(hd.fd, r.Data[:l], int64(r.Offset))
			})
			if n > 0 || errno == 0 {
				v.acct.wrote(n, r.Offset+uint64(n))
			}
			if errno == 0 && n == len(r.Data) {
				errno = syncFile(hd.fd, r.Flags)
			}
			return n, errno
		}
		var n int
		var errno syscall.Errno
		if r.Handle != 0 {
			errno = withHandle(r.Handle, func(hd *handle) (e syscall.Errno) {
				n, e = writeSync(hd)
				return e
			})
		} else {
			if !v.objects {
				return nil, 0, syscall.EPERM // by name only stripe objects, as WRITE_NAME
			}
			hd, _, e := v.create(&proto.CreateReq{Name: r.Name, Flags: unix.O_WRONLY | unix.O_CREAT, Mode: 0o600}, uid, gid)
			if e != 0 {
				return nil, 0, e
			}
			hd.grows = true // a new object, most often (volume.write)
			n, errno = writeSync(hd)
			v.closeFile(hd)
		}
		return count(int64(n), errno)
	case *proto.FsyncReq:
		return empty(withHandle(r.Handle, func(hd *handle) syscall.Errno {
			return syncFile(hd.fd, r.Flags)
		}))
	case *proto.FallocateReq:
		return empty(withHandle(r.Handle, func(hd *handle) syscall.Errno {
			return v.fallocate(hd, r.Offset, r.Length, r.Mode, uid)
		}))
	case *proto.LseekReq:
		var off int64
		errno := withHandle(r.Handle, func(hd *handle) syscall.Errno {
			var err error
			off, err = unix.Seek(hd.fd, int64(min(r.Offset, 1<<62)), int(r.Whence))
			return errnoOf(err)
		})
		return count(off, errno)
	case *proto.CopyRangeReq:
		var n int
		errno := withHandle(r.In, func(in *handle) syscall.Errno {
			return withHandle(r.Out, func(out *handle) (e syscall.Errno) {
				n, e = v.copyRange(in, out, r, uid)
				return e
			})
		})
		if n > 0 {
			v.acct.wrote(n, r.OffOut+uint64(n))
		}
		return count(int64(n), errno)
	case *proto.Empty: // STATFS
		rep, errno := v.statfs()
		return &rep, 0, errno
	case *proto.XattrReq:
		hd, errno := optional(r.Handle)
		if errno != 0 {
			return nil, 0, errno
		}
		defer s.put(hd)
		rep, errno := v.xattr(op, r, hd)
		if op == proto.OpSetxattr || op == proto.OpRemovexattr {
			return empty(errno)
		}
		return &rep, 0, errno
	}
	return nil, 0, syscall.ENOSYS
}

// syncFile is an fsync (flags bit 0: fdatasync) of fd.
func syncFile(fd int, flags uint32) syscall.Errno {
	if flags&1 != 0 {
		return errnoOf(unix.Fdatasync(fd))
	}
	return errnoOf(unix.Fsync(fd))
}

// ioBuf is a buffer for one READ or WRITE's data, aligned for O_DIRECT.
type ioBuf struct{ b []byte }

var bufPool = sync.Pool{New: func() any {
	raw := make([]byte, proto.MaxIO+directIOAlign)
	off := 0
	if rem := int(uintptrOf(raw) % directIOAlign); rem != 0 {
		off = directIOAlign - rem
	}
	return &ioBuf{b: raw[off : off+proto.MaxIO : off+proto.MaxIO]}
}}

func getBuf() *ioBuf  { return bufPool.Get().(*ioBuf) }
func putBuf(b *ioBuf) { bufPool.Put(b) }

// proofKey is the key the client must prove: the session key of its capability, checked
// against what it asks for (and narrowing it: read-only, maximum file size); or the shared
// secret, when this node holds it and the client presents no capability.
func (s *Server) proofKey(auth *proto.Auth) ([]byte, *refused) {
	if auth.Capability == "" {
		if _, isNode := nodekey.Node(s.opt.Token); isNode {
			return nil, &refused{syscall.EACCES, fmt.Sprintf("client %q presented no capability: this storage node "+
				"serves a namespace only to a node the controller granted its mount (the compute node's agent and the controller must be this version)", auth.Client)}
		}
		return []byte(s.opt.Token), nil
	}
	c, err := nodekey.ParseCapability(auth.Capability)
	if err != nil {
		return nil, &refused{syscall.EACCES, "malformed capability: " + err.Error()}
	}
	if c.Stripes && auth.Stripes && auth.Namespace == 0 {
		// A stripes capability names the namespace whose files' objects the session serves
		// (what it counts to); a client of before sends 0.
		auth.Namespace = c.Namespace
	}
	if c.Fragment != auth.Fragment || c.Namespace != auth.Namespace || c.Instance != auth.Instance || c.Client != auth.Client || c.Stripes != auth.Stripes {
		return nil, &refused{syscall.EACCES, fmt.Sprintf("client %q asked for namespace %d of fragment %d with a capability for namespace %d of fragment %d on node %q",
			auth.Client, auth.Namespace, auth.Fragment, c.Namespace, c.Fragment, c.Client)}
	}
	if time.Now().Unix() > c.Expires {
		return nil, &refused{syscall.EACCES, fmt.Sprintf("client %q presented a capability that expired at %s (controller.mount_capability_lifetime); remount to get a fresh one",
			auth.Client, time.Unix(c.Expires, 0).UTC().Format(time.RFC3339))}
	}
	auth.ReadOnly = auth.ReadOnly || c.ReadOnly
	if c.MaxFileSize > 0 && (auth.MaxFileSize == 0 || auth.MaxFileSize > c.MaxFileSize) {
		auth.MaxFileSize = c.MaxFileSize
	}
	return []byte(nodekey.SessionKey(nodekey.For(s.opt.Token, s.opt.Node), auth.Capability)), nil
}
