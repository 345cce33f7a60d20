// Package httpapi holds what the controller's and the agents' HTTP APIs share: JSON answers,
// the error shape, strict request decoding, and the peer credentials of Unix-socket callers.
package httpapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/netgroup"
)

// Error is the body of every error answer.
type Error struct {
	Error string `json:"error"`
	Kind  string `json:"kind"` // user, not_found, busy, forbidden, unauthorized, internal
}

// WriteJSON answers with a JSON body, its length said (Content-Length): an HTTP/1.0 client
// keeping its connection (libdatawarp) can only keep it after an answer whose length is known,
// and json.Encoder holds the whole text before writing it anyway.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":"encoding the answer: `+strings.ReplaceAll(err.Error(), `"`, `'`)+`","kind":"internal"}`)
	}
	body = append(body, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	w.Write(body)
}

// WriteError answers with an error body.
func WriteError(w http.ResponseWriter, status int, kind, msg string) {
	WriteJSON(w, status, Error{Error: msg, Kind: kind})
}

// Decode reads a JSON body strictly (unknown fields are errors); an empty body leaves into
// unchanged. On failure it has already answered.
func Decode(w http.ResponseWriter, r *http.Request, into any) bool {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		WriteError(w, http.StatusRequestEntityTooLarge, "user", "request body: "+err.Error())
		return false
	}
	if len(body) == 0 {
		return true
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		WriteError(w, http.StatusBadRequest, "user", "request body: "+err.Error())
		return false
	}
	return true
}

// Peer is who is on the other end of a connection.
type Peer struct {
	UID   uint32
	GID   uint32 // the peer's group when it connected
	Known bool   // read from a Unix socket's SO_PEERCRED
}

type peerKey struct{}

// ConnContext records the peer's uid for Unix-socket connections, and gives every
// connection its ConnIdentity.
func ConnContext(ctx context.Context, conn net.Conn) context.Context {
	ctx = context.WithValue(ctx, identityKey{}, &ConnIdentity{})
	if lc, ok := conn.(*limitedConn); ok {
		ctx = context.WithValue(ctx, connKey{}, lc)
		conn = lc.Conn
	}
	if p, ok := peerCred(conn); ok {
		return context.WithValue(ctx, peerKey{}, p)
	}
	return ctx
}

// ConnIdentity is the identity one connection proved with a MUNGE credential, kept for its
// later requests that claim it. One identity per connection: it is bound once, and never
// changes to another.
type ConnIdentity struct {
	mu       sync.Mutex
	bound    bool
	uid, gid uint32
	at       time.Time // when it was proved last
}

type identityKey struct{}

// IdentityOf is r's connection's ConnIdentity; nil for a request that came on no connection of
// NewServer's (a test's recorder).
func IdentityOf(r *http.Request) *ConnIdentity {
	id, _ := r.Context().Value(identityKey{}).(*ConnIdentity)
	return id
}

// Bind records uid and gid, proved at now, as the connection's identity: false when it is
// bound to another.
func (c *ConnIdentity) Bind(uid, gid uint32, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bound && (c.uid != uid || c.gid != gid) {
		return false
	}
	c.bound, c.uid, c.gid, c.at = true, uid, gid, now
	return true
}

// Bound reports the identity the connection is bound to, however old.
func (c *ConnIdentity) Bound() (uid, gid uint32, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.uid, c.gid, c.bound
}

// Claim is the connection's identity when it was proved less than lifetime before now, and
// how long it stays valid; ok false otherwise.
func (c *ConnIdentity) Claim(now time.Time, lifetime time.Duration) (uid, gid uint32, left time.Duration, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	left = c.at.Add(lifetime).Sub(now)
	if !c.bound || left <= 0 {
		return 0, 0, 0, false
	}
	return c.uid, c.gid, left, true
}

// KeepAliveRoom reports whether r's connection may stay open for a next request without
// crowding others out: its peer holds at most half of MaxConnectionsPerPeer and the server at
// most half of MaxConnections. A client that keeps idle connections (libdatawarp, one per
// process) is told to close them past that, so that they cannot keep out its peer's or
// anyone's next connection.
func KeepAliveRoom(r *http.Request) bool {
	c, _ := r.Context().Value(connKey{}).(*limitedConn)
	if c == nil {
		return true // not limited (root on the Unix socket)
	}
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return 2*c.l.perPeer[c.peer] <= c.l.lim.MaxConnectionsPerPeer && 2*c.l.total <= c.l.lim.MaxConnections
}

// peerCred reads a Unix-socket peer's credentials.
func peerCred(conn net.Conn) (Peer, bool) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return Peer{}, false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Peer{}, false
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil || cred == nil {
		return Peer{}, false
	}
	return Peer{UID: cred.Uid, GID: cred.Gid, Known: true}, true
}

// LimitListener admits connections within lim's MaxConnections and MaxConnectionsPerPeer;
// others are closed as soon as they are accepted. A TCP connection is unproven until one of its
// requests authenticates (the handler calls Authenticated; a Unix-socket caller, known by its
// uid, is proven at once). Unproven connections hold at most MaxConnections −
// ReservedConnections slots, and MaxConnectionsPerNetwork of them come from one network (a /24,
// a /64). Past either, a new connection is admitted on probation into the reserve: its first
// request must authenticate, or the connection is closed after its answer; and when every slot
// is taken, a new connection closes a probation connection that has sent no request yet (of
// the network holding the most, its oldest). So idle connections from any number of addresses
// cannot keep out the callers that prove a token, a node key or MUNGE.
func LimitListener(l net.Listener, lim Limits) net.Listener {
	lim = lim.withDefaults()
	return &limitListener{Listener: l, lim: lim, perPeer: map[string]int{}, perNet: map[string]int{},
		lastLog: time.Now().Add(-time.Hour)}
}

type limitListener struct {
	net.Listener
	lim Limits

	mu         sync.Mutex
	total      int
	perPeer    map[string]int
	unproven   int            // regular (not probation) unproven connections
	perNet     map[string]int // of those, per network
	probation  []*limitedConn // unproven connections in the reserve, oldest first
	lastLog    time.Time
	suppressed int
}

// peerOf is the key MaxConnectionsPerPeer counts by; exempt is root on the Unix socket;
// proven is any Unix-socket caller (its uid is known).
func peerOf(conn net.Conn) (key string, exempt, proven bool) {
	if p, ok := peerCred(conn); ok {
		return "uid " + strconv.FormatUint(uint64(p.UID), 10), p.UID == 0, true
	}
	addr := conn.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host, false, false
	}
	return addr, false, false
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key, exempt, proven := peerOf(conn)
		if exempt {
			return conn, nil
		}
		c := &limitedConn{Conn: conn, l: l, peer: key, network: netgroup.Of(key), proven: proven}
		l.mu.Lock()
		why := ""
		switch {
		case l.perPeer[key] >= l.lim.MaxConnectionsPerPeer:
			why = "the caller's connection limit (controller.max_connections_per_peer)"
		case l.total >= l.lim.MaxConnections && !l.evictProbation():
			why = "the connection limit (controller.max_connections)"
		}
		if why == "" {
			l.total++
			l.perPeer[key]++
			switch {
			case proven:
			case l.unproven < l.lim.MaxConnections-l.lim.ReservedConnections && l.perNet[c.network] < l.lim.MaxConnectionsPerNetwork:
				l.unproven++
				l.perNet[c.network]++
			default:
				c.probation = true
				l.probation = append(l.probation, c)
			}
			l.mu.Unlock()
			return c, nil
		}
		logNow, suppressed := l.logRefusal()
		l.mu.Unlock()
		conn.Close()
		if logNow {
			l.lim.Log.Warn("refusing a connection: "+why, "peer", key, "not_logged_since_last", suppressed)
		}
	}
}

// logRefusal says whether to log a refusal now (at most once a minute), and how many were not
// logged since the last. The caller holds l.mu.
func (l *limitListener) logRefusal() (bool, int) {
	suppressed := l.suppressed
	if time.Since(l.lastLog) >= time.Minute {
		l.lastLog, l.suppressed = time.Now(), 0
		return true, suppressed
	}
	l.suppressed++
	return false, suppressed
}

// evictProbation closes a probation connection that has sent no request yet, to admit a new
// one: of the network holding the most such connections (ties: the one holding the oldest),
// its oldest. It reports whether it found one. The caller holds l.mu.
func (l *limitListener) evictProbation() bool {
	count, first := map[string]int{}, map[string]int{}
	for i, c := range l.probation {
		if c.requests > 0 {
			continue
		}
		if count[c.network]++; count[c.network] == 1 {
			first[c.network] = i
		}
	}
	best := ""
	for network, n := range count {
		if best == "" || n > count[best] || n == count[best] && first[network] < first[best] {
			best = network
		}
	}
	if best == "" {
		return false
	}
	victim := l.probation[first[best]]
	l.releaseLocked(victim)
	victim.Conn.Close()
	if logNow, suppressed := l.logRefusal(); logNow {
		l.lim.Log.Warn("closing an unauthenticated connection to admit a new one: every connection slot is taken (controller.max_connections, controller.reserved_connections)",
			"peer", victim.peer, "not_logged_since_last", suppressed)
	}
	return true
}

// releaseLocked gives c's slot back, once. The caller holds l.mu.
func (l *limitListener) releaseLocked(c *limitedConn) {
	if c.released {
		return
	}
	c.released = true
	l.total--
	if l.perPeer[c.peer]--; l.perPeer[c.peer] <= 0 {
		delete(l.perPeer, c.peer)
	}
	l.proveLocked(c)
}

// proveLocked takes c out of the unproven connections. The caller holds l.mu.
func (l *limitListener) proveLocked(c *limitedConn) {
	if c.proven {
		return
	}
	c.proven = true
	if !c.probation {
		l.unproven--
		if l.perNet[c.network]--; l.perNet[c.network] <= 0 {
			delete(l.perNet, c.network)
		}
		return
	}
	for i, p := range l.probation {
		if p == c {
			l.probation = append(l.probation[:i], l.probation[i+1:]...)
			break
		}
	}
}

// limitedConn gives its slot back when closed.
type limitedConn struct {
	net.Conn
	l                *limitListener
	peer, network    string
	probation        bool // admitted into the reserve: its first request must authenticate
	proven, released bool // under l.mu
	requests         int  // requests that reached the handler, under l.mu
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.releaseLocked(c)
	c.l.mu.Unlock()
	return err
}

type connKey struct{}

// Authenticated records that r's caller proved who they are (a token, a node key, MUNGE):
// its connection no longer counts as unproven, and may stay open past a probation request.
func Authenticated(w http.ResponseWriter, r *http.Request) {
	c, _ := r.Context().Value(connKey{}).(*limitedConn)
	if c == nil {
		return
	}
	c.l.mu.Lock()
	wasProbation := c.probation && !c.proven
	c.l.proveLocked(c)
	c.l.mu.Unlock()
	if wasProbation {
		w.Header().Del("Connection")
	}
}

// limitHandler tells the listener of each request, and answers a probation connection's
// unauthenticated request with Connection: close (Authenticated takes it back).
func limitHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, _ := r.Context().Value(connKey{}).(*limitedConn); c != nil {
			c.l.mu.Lock()
			c.requests++
			closeAfter := c.probation && !c.proven
			c.l.mu.Unlock()
			if closeAfter {
				w.Header().Set("Connection", "close")
			}
		}
		h.ServeHTTP(w, r)
	})
}

// PeerOf returns the request's peer.
func PeerOf(r *http.Request) Peer {
	p, _ := r.Context().Value(peerKey{}).(Peer)
	return p
}

// Limits bound what a server spends on its callers, so that no caller can make it unusable
// for the others by opening connections and keeping them.
type Limits struct {
	// RequestTimeout bounds reading one request (a silent new connection is closed after it)
	// and writing its answer. Default 30s.
	RequestTimeout time.Duration
	// IdleTimeout closes a kept-alive connection that sends no next request. Default 1m.
	IdleTimeout time.Duration
	// MaxConnections bounds the connections of all callers but root together; past it new
	// ones are closed at once. Default 1024.
	MaxConnections int
	// MaxConnectionsPerPeer bounds the connections of one caller: one uid on a Unix socket,
	// one address on TCP. Root on the Unix socket is never limited. Default 64.
	MaxConnectionsPerPeer int
	// MaxConnectionsPerNetwork bounds the unproven TCP connections (see LimitListener) of one
	// network, a /24 or a /64; more go on probation. Default 256.
	MaxConnectionsPerNetwork int
	// ReservedConnections of MaxConnections are for callers that prove who they are: unproven
	// connections past MaxConnections − ReservedConnections go on probation. 0: none; at most
	// MaxConnections − 1.
	ReservedConnections int
	// Log receives the refusals, at most one line a minute.
	Log *slog.Logger
}

func (l Limits) withDefaults() Limits {
	if l.RequestTimeout <= 0 {
		l.RequestTimeout = 30 * time.Second
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = time.Minute
	}
	if l.MaxConnections <= 0 {
		l.MaxConnections = 1024
	}
	if l.MaxConnectionsPerPeer <= 0 {
		l.MaxConnectionsPerPeer = 64
	}
	if l.MaxConnectionsPerNetwork <= 0 {
		l.MaxConnectionsPerNetwork = 256
	}
	l.ReservedConnections = max(0, min(l.ReservedConnections, l.MaxConnections-1))
	if l.Log == nil {
		l.Log = slog.Default()
	}
	return l
}

// NewServer is an http.Server for h with the limits' timeouts; serve it on LimitListener.
func NewServer(h http.Handler, lim Limits) *http.Server {
	lim = lim.withDefaults()
	return &http.Server{Handler: limitHandler(h), ConnContext: ConnContext, ReadHeaderTimeout: lim.RequestTimeout,
		ReadTimeout: lim.RequestTimeout, WriteTimeout: lim.RequestTimeout, IdleTimeout: lim.IdleTimeout}
}

// Serve serves h on l until ctx ends, within lim.
func Serve(ctx context.Context, l net.Listener, h http.Handler, lim Limits) error {
	srv := NewServer(h, lim)
	l = LimitListener(l, lim)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	err := srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Listen opens "unix:/path" (replacing a stale socket, refusing a live one) or "host:port".
// Unix sockets are made mode 0666: authorization is per request, from the peer's uid.
//
// A TCP listener speaks TLS when serverTLS is not nil (see ServerTLS).
func Listen(address string, serverTLS *tls.Config) (net.Listener, error) {
	if !strings.HasPrefix(address, "unix:") && !strings.HasPrefix(address, "/") {
		l, err := net.Listen("tcp", strings.TrimPrefix(address, "tcp:"))
		if err != nil || serverTLS == nil {
			return l, err
		}
		return tls.NewListener(l, serverTLS), nil
	}
	path := strings.TrimPrefix(address, "unix:")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
		conn.Close()
		return nil, fmt.Errorf("another process is already listening on %s", path)
	}
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	os.Chmod(path, 0o666)
	return l, nil
}

// WithPeer records p as the caller of requests made with ctx: what ConnContext does for a
// Unix-socket connection (the API's tests and fuzzing act as given users with it).
func WithPeer(ctx context.Context, p Peer) context.Context {
	return context.WithValue(ctx, peerKey{}, p)
}

// ServerTLS loads a host's certificate and key for its TCP listeners; nil when neither is
// configured.
func ServerTLS(certFile, keyFile string) (*tls.Config, error) {
	if certFile == "" && keyFile == "" {
		return nil, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls.cert_file and tls.key_file go together: set both, or neither")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls.cert_file %s / tls.key_file %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// ClientTLS is what clients trust for https:// addresses: the CA in caFile, or the system's
// roots when it is empty (nil config).
func ClientTLS(caFile string) (*tls.Config, error) {
	if caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tls.ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls.ca_file %s holds no PEM certificate", caFile)
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
