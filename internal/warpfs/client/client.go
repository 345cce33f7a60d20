// Package client is the compute side of warpfs's connection to one storage node: it
// authenticates, multiplexes many requests on one TCP connection (each with its id, replies
// in any order), bounds every request in time, notices a dead peer with pings, and reconnects.
// The FUSE file system over it is in package mount (remote.go); a striped client will hold
// one Client per server of an instance.
//
// Failure model. Every request ends within Limits.RequestTimeout, whatever the storage node
// does: a reply, or EIO — when it does not answer in that time, or when the connection cannot
// be (re)established in that time. A storage node that refuses connections (nothing listens
// on its port: the agent died; or its host is unreachable) fails the waiting request with EIO
// at once, without waiting for the timeout; the next request tries to connect again, so a
// storage node that comes back is reconnected to. Once a request has waited the whole timeout
// in vain, the next ones make a single connection attempt and fail at once until the storage
// node answers again. A request in flight when its connection breaks fails with EIO, except the
// ones that can safely be sent again (lookups, attributes, opens), which are retried on the
// new connection. Open handles belong to the connection that opened them: after a
// reconnection a request on an old handle — or one lost in flight with its connection —
// fails with ESTALE, and the caller reopens the file by its path and sends it again (package mount
// does, transparently, while the file still has a name; reads and writes at an offset are
// safe to repeat).
package client

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// Limits bound the client in time and memory. Zero fields mean the defaults.
type Limits struct {
	// ConnectTimeout bounds one connection attempt: TCP connect and handshake. Default 5s.
	ConnectTimeout time.Duration
	// RequestTimeout bounds one file operation, waiting for a connection included: the
	// longest a process waits before it gets an error from a dead storage node. Default 30s.
	RequestTimeout time.Duration
	// KeepaliveInterval: a connection that received nothing for this long is pinged, and one
	// whose ping is unanswered this long is closed. Default 5s.
	KeepaliveInterval time.Duration
	// ReconnectWait is the pause between connection attempts while a request waits for the
	// storage node. Default 200ms.
	ReconnectWait time.Duration
	// MaxInFlight is how many requests may wait for replies on the connection at once;
	// more wait for a slot (within their RequestTimeout). Default 64.
	MaxInFlight int
}

// DefaultLimits are the limits' defaults.
func DefaultLimits() Limits { return Limits{}.withDefaults() }

func (l Limits) withDefaults() Limits {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.ConnectTimeout, 5*time.Second)
	def(&l.RequestTimeout, 30*time.Second)
	def(&l.KeepaliveInterval, 5*time.Second)
	def(&l.ReconnectWait, 200*time.Millisecond)
	if l.MaxInFlight <= 0 {
		l.MaxInFlight = 64
	}
	return l
}

// Options say which namespace of which storage node to reach.
type Options struct {
	Address string // the storage node's data address, host:port
	Token   string // the cluster's shared secret, when there is no Capability
	// Capability and CapabilityKey are the controller's grant of this mount and its session
	// key (package nodekey): with them the handshake proves the key, not Token.
	Capability, CapabilityKey string
	// TLS is what a storage node at a "tls://host:port" Address must prove (nil: the
	// system's roots); see warpfs.tls.
	TLS         *tls.Config
	Client      string // this node's name, for the server's logs
	Fragment    int64
	Namespace   int64
	Instance    int64
	ReadOnly    bool
	MaxFileSize uint64
	// Stripes asks for the fragment's stripe objects (a striped instance's file data)
	// instead of namespace Namespace.
	Stripes bool
	Limits  Limits
	Log     *log.Logger
}

// RefusedError is the storage node refusing the handshake: wrong token, unknown namespace,
// incompatible version. Retrying does not help.
type RefusedError struct {
	Address string
	Errno   syscall.Errno
	Message string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("storage node %s refused the connection: %s", e.Address, e.Message)
}

func (e *RefusedError) Unwrap() error { return e.Errno }

// Client is a connection to one storage node's namespace, re-established when it breaks.
type Client struct {
	opt Options
	lim Limits
	log *log.Logger

	root proto.Attr
	sem  chan struct{} // in-flight slots

	dialing chan struct{} // a 1-slot lock: one goroutine reconnects, the others wait

	mu      sync.Mutex
	cur     *conn
	gen     uint64
	closed  bool
	closeCh chan struct{}
	downLog time.Time // when the last "cannot reconnect" was logged
	// down is set when a request waited its whole timeout for a connection in vain: until a
	// connection succeeds again, requests make one attempt and fail at once, so that a
	// process's every system call does not wait the full timeout again.
	down bool

	invalidator atomic.Pointer[func(items []proto.Inval)]
	settler     atomic.Pointer[func(items []proto.Inval)]
	// incarnation names this client's mount to servers across reconnections (proto.Auth).
	incarnation uint64
}

// Dial connects and authenticates. It fails at once (with the reason) rather than retrying:
// the caller is mounting, and the controller retries a failed mount.
func Dial(ctx context.Context, opt Options) (*Client, error) {
	c := &Client{opt: opt, lim: opt.Limits.withDefaults(), log: opt.Log, dialing: make(chan struct{}, 1), closeCh: make(chan struct{})}
	var nonce [8]byte
	rand.Read(nonce[:])
	c.incarnation = binary.LittleEndian.Uint64(nonce[:]) | 1
	if c.log == nil {
		c.log = log.Default()
	}
	c.sem = make(chan struct{}, c.lim.MaxInFlight)
	cn, root, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	c.root = root
	c.gen = 1
	cn.gen = 1
	c.cur = cn
	cn.start()
	return c, nil
}

// Root is the namespace root's attributes at connection time.
func (c *Client) Root() proto.Attr { return c.root }

// Lease is how long the server lets the client cache what a leased reply gives, on the
// current connection (0: none; an older server).
func (c *Client) Lease() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil {
		return 0
	}
	return c.cur.lease
}

// Gen is the current connection's generation: it grows at every reconnection (a handle
// opened on an older one is gone with it).
func (c *Client) Gen() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// Address is the storage node's data address.
func (c *Client) Address() string { return c.opt.Address }

// Limits are the limits in force.
func (c *Client) Limits() Limits { return c.lim }

// Close ends the connection; requests in flight fail.
func (c *Client) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	close(c.closeCh)
	cn := c.cur
	c.mu.Unlock()
	if cn != nil {
		if !cn.dead() && cn.version >= proto.LeaseVersion {
			// The mount is closed once its kernel unmounted it: the server need not wait out
			// what it leased this client.
			cn.write(proto.AppendFrame(nil, proto.Header{Op: proto.OpBye, Kind: proto.KindRequest, Flags: proto.FlagOneWay}, &proto.Empty{}), nil)
		}
		cn.fail(errClosed)
	}
}

// Call is one request.
type Call struct {
	Op       proto.Op
	UID, GID uint32
	Req      proto.Message
	Data     []byte        // WRITE: the data, sent after Req (a WriteReq without Data)
	Reply    proto.Message // decoded from a successful reply; nil to ignore it
	Dest     []byte        // READ: the reply's data is read into Dest
	N        int           // READ: bytes read into Dest
	// Gen, when not 0, is the connection generation the request's handle belongs to: if the
	// connection was re-established since, the call fails with ESTALE without being sent.
	Gen uint64
	// NoReconnect fails the call with ENOTCONN at once if the connection is down (RELEASE:
	// its handle is gone anyway).
	NoReconnect bool
	// UsedGen is the generation the call was sent on (a handle an OPEN returns belongs to it).
	UsedGen uint64
	// MinVersion, when not 0, is the protocol version the request needs (it uses something
	// older servers ignore): on a connection of an older version the call fails with
	// EPROTONOSUPPORT without being sent, and the caller does without.
	MinVersion uint16
	// Route is what a mount whose namespace is sharded over several servers (max_mds=yes)
	// needs to send a request that names entries by path to the right one (package mount,
	// mds.go). The client itself ignores it.
	Route Route
	// OneWay sends the request without waiting for its reply, on connections of
	// proto.LeaseVersion on (the server then sends none); on older ones it waits as usual.
	// RELEASE: nothing the caller does depends on its answer.
	OneWay bool
	// Lease, set by Do, is how much longer the caller may cache the names and attributes the
	// reply gives (0: not at all): the server leased them (proto.FlagLease) and will tell the
	// client's invalidator (SetInvalidator) before anyone else changes them.
	Lease time.Duration
	// Listing, set by Do with Lease, says the caller knows every name of the directory the
	// reply (MKDIR) made while the lease lasts: the server tells it (proto.InvalListing)
	// before anyone else adds one.
	Listing bool
}

// maxLeaseDelay is the longest a leased reply may take to come back and still be cached:
// the server waits out a silent client's lease plus a slack longer than this (package
// server, leaseSlack), counted from when it registered it, which is after the request left.
const maxLeaseDelay = time.Second

// SetInvalidator makes the client a holder of leases: drop is called with what another
// client changed, and must return once everything it names is dropped from the caches. Until
// it is set, no reply is cached.
func (c *Client) SetInvalidator(drop func(items []proto.Inval)) { c.invalidator.Store(&drop) }

// SetSettler makes settle run before the invalidator, without the bound the invalidator has
// (proto.MaxNotifyWait): it returns once the client's own requests that the notification's
// sender must find done have their answers (a listing recalled: the mount's removals behind
// in that directory, each bounded by the request timeout).
func (c *Client) SetSettler(settle func(items []proto.Inval)) { c.settler.Store(&settle) }

// Route tells a sharded mount where the entries a request names by path live.
type Route struct {
	// Parent is the id of the directory holding the entry the request names (the Path of
	// LOOKUP, GETATTR, OPEN...; Dir/Name of CREATE, MKDIR, UNLINK, RENAME...), and NewParent
	// that of RENAME's NewDir or of LINK's Path; 0 when unknown (the mount asks).
	Parent, NewParent uint64
	// Dir says the node named by path is a directory (GETATTR, SETATTR, the xattr ops).
	Dir bool
}

// retriable reports whether an op may be sent again on a new connection after the first was
// lost in flight: it changes nothing on the storage node.
func retriable(op proto.Op) bool {
	switch op {
	case proto.OpLookup, proto.OpGetattr, proto.OpSetattr, proto.OpReadlink, proto.OpStatfs,
		proto.OpGetxattr, proto.OpListxattr, proto.OpOpen, proto.OpOpendir:
		// OPEN and OPENDIR too: a handle opened on a lost connection was closed with it.
		return true
	}
	return false
}

var (
	errClosed    = errors.New("the mount is closing")
	errLost      = errors.New("connection lost")
	errKeepalive = errors.New("the storage node did not answer a ping")
	errTimeout   = errors.New("request timed out")
)

// Do runs a call and returns 0 or the errno the caller should see.
func (c *Client) Do(ctx context.Context, call *Call) syscall.Errno {
	deadline := time.Now().Add(c.lim.RequestTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case c.sem <- struct{}{}:
	case <-timer.C:
		c.log.Printf("warpfs: %s: %s waited %s for one of %d request slots; failing it with EIO",
			c.opt.Address, call.Op, c.lim.RequestTimeout, c.lim.MaxInFlight)
		return syscall.EIO
	case <-ctx.Done():
		if expired(ctx) {
			return syscall.EIO
		}
		return syscall.EINTR
	}
	defer func() { <-c.sem }()
	for {
		cn, errno := c.conn(ctx, timer, deadline, call)
		if errno != 0 {
			return errno
		}
		if call.MinVersion > cn.version {
			return syscall.EPROTONOSUPPORT
		}
		call.UsedGen = cn.gen
		call.Lease, call.Listing = 0, false
		if call.OneWay && cn.version >= proto.LeaseVersion {
			h := proto.Header{Op: call.Op, Kind: proto.KindRequest, UID: call.UID, GID: call.GID, Flags: proto.FlagOneWay}
			if err := cn.write(proto.AppendFrame(make([]byte, 0, 64), h, call.Req), nil); err != nil {
				cn.fail(err)
				return syscall.EIO
			}
			return 0
		}
		sent := time.Now()
		errno, flags, err := cn.roundTrip(ctx, timer, call)
		switch {
		case err == nil:
			if elapsed := time.Since(sent); flags&proto.FlagLease != 0 && cn.lease > 0 && elapsed < maxLeaseDelay &&
				c.invalidator.Load() != nil {
				call.Lease = cn.lease - elapsed
				call.Listing = flags&proto.FlagListing != 0
			}
			return errno
		case errors.Is(err, errTimeout):
			c.log.Printf("warpfs: %s: %s got no answer within %s; failing it with EIO", c.opt.Address, call.Op, c.lim.RequestTimeout)
			return syscall.EIO
		case errors.Is(err, context.Canceled):
			return syscall.EINTR
		case call.Gen != 0:
			return syscall.ESTALE // the handle went with the connection: the caller reopens
		case retriable(call.Op) && time.Now().Before(deadline):
			continue // sent again on the next connection
		default:
			return syscall.EIO
		}
	}
}

// conn returns the live connection, re-establishing it if it broke, until the deadline.
func (c *Client) conn(ctx context.Context, timer *time.Timer, deadline time.Time, call *Call) (*conn, syscall.Errno) {
	for {
		c.mu.Lock()
		cn, closed := c.cur, c.closed
		c.mu.Unlock()
		if closed {
			return nil, syscall.ENOTCONN
		}
		if cn != nil && !cn.dead() {
			if call.Gen != 0 && call.Gen != cn.gen {
				return nil, syscall.ESTALE
			}
			return cn, 0
		}
		if call.Gen != 0 { // the handle's connection is gone
			return nil, syscall.ESTALE
		}
		if call.NoReconnect {
			return nil, syscall.ENOTCONN
		}
		select {
		case c.dialing <- struct{}{}:
		case <-timer.C:
			c.setDown()
			return nil, syscall.EIO
		case <-ctx.Done():
			return nil, c.interrupted(ctx)
		}
		c.mu.Lock()
		cur, down := c.cur, c.down
		c.mu.Unlock()
		if cur != cn { // someone else reconnected meanwhile
			<-c.dialing
			continue
		}
		dctx, cancel := context.WithDeadline(ctx, deadline)
		fresh, _, err := c.connect(dctx)
		cancel()
		if err == nil {
			c.mu.Lock()
			if c.closed {
				c.mu.Unlock()
				<-c.dialing
				fresh.fail(errClosed)
				return nil, syscall.ENOTCONN
			}
			c.gen++
			fresh.gen = c.gen
			c.cur = fresh
			c.downLog = time.Time{}
			c.down = false
			c.mu.Unlock()
			fresh.start()
			<-c.dialing
			c.log.Printf("warpfs: reconnected to storage node %s (namespace %d)", c.opt.Address, c.opt.Namespace)
			continue
		}
		<-c.dialing
		c.mu.Lock()
		logIt := time.Since(c.downLog) > 10*time.Second
		if logIt {
			c.downLog = time.Now()
		}
		c.mu.Unlock()
		unreachable := connectionRefused(err)
		if logIt {
			if unreachable {
				c.log.Printf("warpfs: cannot reach storage node %s: %v; requests fail with EIO at once until it accepts connections again",
					c.opt.Address, err)
			} else {
				c.log.Printf("warpfs: cannot reach storage node %s: %v; requests fail with EIO after warpfs.request_timeout (%s)",
					c.opt.Address, err, c.lim.RequestTimeout)
			}
		}
		var refused *RefusedError
		if errors.As(err, &refused) || unreachable || down {
			return nil, syscall.EIO
		}
		wait := time.NewTimer(c.lim.ReconnectWait)
		select {
		case <-wait.C:
		case <-timer.C:
			wait.Stop()
			c.setDown()
			return nil, syscall.EIO
		case <-ctx.Done():
			wait.Stop()
			return nil, c.interrupted(ctx)
		}
	}
}

// expired reports whether ctx ended by its deadline (the caller's time budget), not by an
// interruption.
func expired(ctx context.Context) bool { return errors.Is(ctx.Err(), context.DeadlineExceeded) }

// interrupted is the errno of a wait for a connection that ctx ended.
func (c *Client) interrupted(ctx context.Context) syscall.Errno {
	if expired(ctx) {
		c.setDown()
		return syscall.EIO
	}
	return syscall.EINTR
}

// connectionRefused reports whether a connection attempt failed because the storage node is
// certainly not there now — nothing listens on its port (its agent died) or its host or
// network is unreachable — rather than slow: waiting for it would only delay the error.
func connectionRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH)
}

func (c *Client) setDown() {
	c.mu.Lock()
	c.down = true
	c.mu.Unlock()
}

// handshakeMaxBody bounds the frames of the handshake.
const handshakeMaxBody = 4096

// connect dials and authenticates.
func (c *Client) connect(ctx context.Context) (*conn, proto.Attr, error) {
	ctx, cancel := context.WithTimeout(ctx, c.lim.ConnectTimeout)
	defer cancel()
	d := net.Dialer{KeepAlive: 15 * time.Second}
	addr, overTLS := strings.CutPrefix(c.opt.Address, TLSScheme)
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, proto.Attr{}, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if overTLS {
		conf := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.opt.TLS != nil {
			conf = c.opt.TLS.Clone()
		}
		if host, _, err := net.SplitHostPort(addr); err == nil && conf.ServerName == "" {
			conf.ServerName = host
		}
		tc := tls.Client(nc, conf)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, proto.Attr{}, fmt.Errorf("TLS with %s: %w (tls.ca_file must hold the CA of the storage nodes' certificates)", addr, err)
		}
		nc = tc
	}
	deadline, _ := ctx.Deadline()
	nc.SetDeadline(deadline)
	br := bufio.NewReaderSize(nc, 64<<10)
	fail := func(err error) (*conn, proto.Attr, error) {
		nc.Close()
		if ctx.Err() != nil && !errors.As(err, new(*RefusedError)) {
			return nil, proto.Attr{}, fmt.Errorf("handshake with %s did not finish within %s", c.opt.Address, c.lim.ConnectTimeout)
		}
		return nil, proto.Attr{}, err
	}
	hello := proto.Hello{Magic: proto.Magic, MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion}
	rand.Read(hello.Nonce[:])
	if _, err := nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpHello, ID: 1}, &hello)); err != nil {
		return fail(err)
	}
	var ch proto.Challenge
	if err := c.handshakeReply(br, proto.OpHello, &ch); err != nil {
		return fail(err)
	}
	if ch.Version < proto.MinVersion || ch.Version > proto.MaxVersion {
		return fail(fmt.Errorf("%w: the server chose version %d", proto.ErrMalformed, ch.Version))
	}
	key := []byte(c.opt.Token)
	if c.opt.CapabilityKey != "" {
		key = []byte(c.opt.CapabilityKey)
	}
	auth := proto.Auth{Proof: proto.ClientProof(key, ch.Nonce, hello.Nonce), Client: c.opt.Client,
		Fragment: c.opt.Fragment, Namespace: c.opt.Namespace, Instance: c.opt.Instance,
		ReadOnly: c.opt.ReadOnly, MaxFileSize: c.opt.MaxFileSize, Capability: c.opt.Capability, Stripes: c.opt.Stripes}
	if ch.Version >= proto.LeaseVersion {
		auth.Incarnation = c.incarnation
	}
	if _, err := nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpAuth, ID: 2}, &auth)); err != nil {
		return fail(err)
	}
	var w proto.Welcome
	if err := c.handshakeReply(br, proto.OpAuth, &w); err != nil {
		return fail(err)
	}
	if !proto.ProofEqual(w.Proof, proto.ServerProof(key, ch.Nonce, hello.Nonce)) {
		return fail(&RefusedError{Address: c.opt.Address, Errno: syscall.EACCES,
			Message: "it could not prove it holds the cluster's token; is another service listening on that address?"})
	}
	if w.MaxIO < proto.MaxIO {
		return fail(fmt.Errorf("%w: the server takes requests of only %d bytes", proto.ErrMalformed, w.MaxIO))
	}
	nc.SetDeadline(time.Time{})
	cn := &conn{c: c, nc: nc, br: br, version: ch.Version, pending: map[uint64]*waiter{}, done: make(chan struct{}),
		lease: time.Duration(w.LeaseMillis) * time.Millisecond}
	now := time.Now().UnixNano()
	cn.lastRecv.Store(now)
	cn.lastSend.Store(now)
	return cn, w.Root, nil
}

func (c *Client) handshakeReply(br *bufio.Reader, op proto.Op, m proto.Message) error {
	var hdr [proto.HeaderSize]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return fmt.Errorf("handshake with %s: %w", c.opt.Address, err)
	}
	h, err := proto.ParseHeader(hdr[:], handshakeMaxBody)
	if err != nil {
		return err
	}
	body := make([]byte, h.BodyLen)
	if _, err := io.ReadFull(br, body); err != nil {
		return fmt.Errorf("handshake with %s: %w", c.opt.Address, err)
	}
	if h.Kind != proto.KindReply || h.Op != op {
		return fmt.Errorf("%w: expected the reply to %s", proto.ErrMalformed, op)
	}
	if h.Errno != 0 {
		var r proto.Refusal
		proto.Decode(body, &r)
		return &RefusedError{Address: c.opt.Address, Errno: syscall.Errno(h.Errno), Message: r.Message}
	}
	return proto.Decode(body, m)
}

// conn is one TCP connection, past its handshake.
type conn struct {
	c       *Client
	nc      net.Conn
	br      *bufio.Reader
	gen     uint64
	version uint16        // the protocol version the server chose
	lease   time.Duration // how long a leased reply may be cached (0: none)

	wmu sync.Mutex

	mu      sync.Mutex
	pending map[uint64]*waiter
	nextID  uint64
	done    chan struct{}
	err     error

	lastRecv, lastSend atomic.Int64 // unix nanoseconds
}

// waiter is a request waiting for its reply.
type waiter struct {
	ch    chan struct{}
	op    proto.Op
	dest  []byte
	reply proto.Message
	errno uint32
	flags uint8
	n     int
	err   error
	taken bool // the reader is delivering the reply (guarded by conn.mu)
}

func (cn *conn) start() {
	go cn.readLoop()
	go cn.keepalive()
}

func (cn *conn) dead() bool {
	select {
	case <-cn.done:
		return true
	default:
		return false
	}
}

// fail ends the connection: every request waiting on it fails.
func (cn *conn) fail(err error) {
	cn.mu.Lock()
	if cn.err != nil {
		cn.mu.Unlock()
		return
	}
	cn.err = err
	close(cn.done)
	waiting := cn.pending
	cn.pending = map[uint64]*waiter{}
	cn.mu.Unlock()
	cn.nc.Close()
	for _, w := range waiting {
		w.err = errLost
		w.ch <- struct{}{}
	}
	if !errors.Is(err, errClosed) {
		cn.c.log.Printf("warpfs: connection to storage node %s lost: %v", cn.c.opt.Address, err)
	}
}

// roundTrip sends a call and waits for its reply until the timer fires. It returns the
// reply's errno and flags, or an error when there was no reply.
func (cn *conn) roundTrip(ctx context.Context, timer *time.Timer, call *Call) (syscall.Errno, uint8, error) {
	w := &waiter{ch: make(chan struct{}, 1), op: call.Op, dest: call.Dest, reply: call.Reply}
	cn.mu.Lock()
	if cn.err != nil {
		cn.mu.Unlock()
		return 0, 0, errLost
	}
	cn.nextID++
	id := cn.nextID
	cn.pending[id] = w
	cn.mu.Unlock()

	h := proto.Header{Op: call.Op, Kind: proto.KindRequest, ID: id, UID: call.UID, GID: call.GID}
	frame := proto.AppendFrame(make([]byte, 0, 256), h, call.Req)
	if len(call.Data) > 0 {
		h.BodyLen = uint32(len(frame) - proto.HeaderSize + len(call.Data))
		proto.PutHeader(frame, h)
	}
	if err := cn.write(frame, call.Data); err != nil {
		cn.fail(err)
	}
	select {
	case <-w.ch:
		if w.err != nil {
			return 0, 0, w.err
		}
		call.N = w.n
		return syscall.Errno(w.errno), w.flags, nil
	case <-timer.C:
		return 0, 0, cn.abandon(id, w, errTimeout)
	case <-ctx.Done():
		if expired(ctx) {
			return 0, 0, cn.abandon(id, w, errTimeout)
		}
		return 0, 0, cn.abandon(id, w, context.Canceled)
	}
}

// abandon gives up on a request. If the reader is already delivering its reply into the
// caller's buffer, the connection is cut (a frame stalled half way means it is broken
// anyway) and the delivery waited for, so that no buffer is written after the caller has it
// back.
func (cn *conn) abandon(id uint64, w *waiter, why error) error {
	cn.mu.Lock()
	if !w.taken {
		delete(cn.pending, id)
		cn.mu.Unlock()
		return why
	}
	cn.mu.Unlock()
	select {
	case <-w.ch: // delivered meanwhile
		return why
	default:
	}
	cn.fail(why)
	<-w.ch
	return why
}

func (cn *conn) write(frame, data []byte) error {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	cn.nc.SetWriteDeadline(time.Now().Add(cn.c.lim.RequestTimeout))
	err := proto.WriteFrame(cn.nc, frame, data)
	cn.lastSend.Store(time.Now().UnixNano())
	return err
}

// readLoop delivers replies to their waiters until the connection ends.
func (cn *conn) readLoop() {
	var hdr [proto.HeaderSize]byte
	for {
		if _, err := io.ReadFull(cn.br, hdr[:]); err != nil {
			cn.fail(err)
			return
		}
		cn.lastRecv.Store(time.Now().UnixNano())
		h, err := proto.ParseHeader(hdr[:], proto.MaxBody)
		if err == nil && h.Kind == proto.KindNotify && h.Op == proto.OpInval && cn.version >= proto.LeaseVersion {
			err = cn.notified(h)
			if err == nil {
				continue
			}
		}
		if err == nil && h.Kind != proto.KindReply {
			err = fmt.Errorf("%w: a %s frame of kind %d sent to the client", proto.ErrMalformed, h.Op, h.Kind)
		}
		if err != nil {
			cn.fail(err)
			return
		}
		cn.mu.Lock()
		w := cn.pending[h.ID]
		if w != nil {
			delete(cn.pending, h.ID)
			w.taken = true
		}
		cn.mu.Unlock()
		if w == nil { // abandoned after a timeout
			if _, err := io.CopyN(io.Discard, cn.br, int64(h.BodyLen)); err != nil {
				cn.fail(err)
				return
			}
			continue
		}
		if err := cn.deliver(h, w); err != nil {
			w.err = errLost
			w.ch <- struct{}{}
			cn.fail(err)
			return
		}
		w.ch <- struct{}{}
	}
}

// notified takes an OpInval notification: the invalidator drops what it names, on a
// goroutine of its own (the reader goes on delivering replies meanwhile), and then the server
// is answered.
func (cn *conn) notified(h proto.Header) error {
	body := make([]byte, h.BodyLen)
	if _, err := io.ReadFull(cn.br, body); err != nil {
		return err
	}
	var req proto.InvalReq
	if err := proto.Decode(body, &req); err != nil {
		return fmt.Errorf("notification: %w", err)
	}
	go func() {
		if settle := cn.c.settler.Load(); settle != nil {
			(*settle)(req.Items)
		}
		if drop := cn.c.invalidator.Load(); drop != nil {
			proto.DropWithin(*drop, req.Items)
		}
		frame := proto.AppendFrame(make([]byte, 0, proto.HeaderSize), proto.Header{Op: proto.OpInval, Kind: proto.KindReply, ID: h.ID}, nil)
		if err := cn.write(frame, nil); err != nil {
			cn.fail(err)
		}
	}()
	return nil
}

func (cn *conn) deliver(h proto.Header, w *waiter) error {
	if h.Op != w.op {
		return fmt.Errorf("%w: reply to %s carries op %s", proto.ErrMalformed, w.op, h.Op)
	}
	w.errno = h.Errno
	w.flags = h.Flags
	if h.Errno != 0 || (w.op == proto.OpRead && h.BodyLen == 0) {
		_, err := io.CopyN(io.Discard, cn.br, int64(h.BodyLen))
		return err
	}
	if w.op == proto.OpRead {
		if int(h.BodyLen) > len(w.dest) {
			return fmt.Errorf("%w: READ reply of %d bytes for %d asked", proto.ErrMalformed, h.BodyLen, len(w.dest))
		}
		n, err := io.ReadFull(cn.br, w.dest[:h.BodyLen])
		w.n = n
		return err
	}
	body := make([]byte, h.BodyLen)
	if _, err := io.ReadFull(cn.br, body); err != nil {
		return err
	}
	if w.reply == nil {
		return nil
	}
	if err := proto.Decode(body, w.reply); err != nil {
		return fmt.Errorf("reply to %s: %w", w.op, err)
	}
	return nil
}

// keepalive pings a connection that has been quiet for KeepaliveInterval, and closes it if
// the ping is not answered within another KeepaliveInterval.
func (cn *conn) keepalive() {
	interval := cn.c.lim.KeepaliveInterval
	tick := time.NewTicker(interval / 2)
	defer tick.Stop()
	for {
		select {
		case <-cn.done:
			return
		case <-tick.C:
		}
		now := time.Now().UnixNano()
		if now-cn.lastRecv.Load() < int64(interval) && now-cn.lastSend.Load() < int64(interval) {
			continue
		}
		timer := time.NewTimer(interval)
		_, _, err := cn.roundTrip(context.Background(), timer, &Call{Op: proto.OpPing})
		timer.Stop()
		if errors.Is(err, errTimeout) {
			cn.fail(errKeepalive)
			return
		}
	}
}

// TLSScheme starts the data address of a storage node that serves warpfs over TLS
// (warpfs.tls): "tls://host:port".
const TLSScheme = "tls://"
