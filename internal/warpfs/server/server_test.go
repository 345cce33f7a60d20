package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/nodekey"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

const token = "server-test-token"

// fixture is a server over TCP serving one namespace directory, inside a parent directory
// holding files the namespace must never reach.
type fixture struct {
	t       testing.TB
	addr    string
	srv     *Server
	dir     string // the namespace
	outside string // a directory next to it
	tracker *usage.Tracker
	logs    *logBuffer
	// fragment, when set before the first dial, counts the sessions' creates (MFC).
	fragment *Fragment
	// objects, when set, is the directory sessions of stripe objects get (else dir, as the
	// namespace's).
	objects string
}

// logBuffer collects the server's log; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// eventually reports whether the log holds text within 5 s: the server may write a line
// just after the client saw what it logs (a refusal, a closed connection).
func (l *logBuffer) eventually(text string) bool {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if strings.Contains(l.String(), text) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newFixture(t *testing.T, lim Limits) *fixture {
	t.Helper()
	return newFixtureHolding(t, lim, token, "")
}

// newFixtureHolding is a fixture whose node holds held (a secret or a node credential) and is
// named node.
func newFixtureHolding(t testing.TB, lim Limits, held, node string) *fixture {
	t.Helper()
	base := t.TempDir()
	f := &fixture{t: t, dir: filepath.Join(base, "namespace"), outside: filepath.Join(base, "outside"),
		tracker: usage.New("instance 9", 1<<20), logs: &logBuffer{}}
	for _, d := range []string{f.dir, f.outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(f.outside, "secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = l.Addr().String()
	log := slog.New(slog.NewTextHandler(f.logs, nil))
	f.srv = New(Options{Token: held, Node: node, Log: log, Limits: lim, Resolve: func(fragment, namespace, instance int64, stripes bool) (Target, error) {
		if namespace != 1 && !stripes {
			return Target{}, errors.New("namespace 2 does not exist on this node")
		}
		if stripes && f.objects != "" {
			return Target{Dir: f.objects, Tracker: f.tracker, Fragment: f.fragment}, nil
		}
		return Target{Dir: f.dir, Tracker: f.tracker, Fragment: f.fragment}, nil
	}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.srv.Serve(ctx, l); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

func (f *fixture) dial(tok string, namespace int64) (*client.Client, error) {
	return client.Dial(context.Background(), client.Options{Address: f.addr, Token: tok, Client: "test",
		Namespace: namespace, Limits: client.Limits{RequestTimeout: 5 * time.Second}})
}

func (f *fixture) client() *client.Client {
	f.t.Helper()
	c, err := f.dial(token, 1)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(c.Close)
	return c
}

func do(c *client.Client, op proto.Op, req, reply proto.Message) syscall.Errno {
	return c.Do(context.Background(), &client.Call{Op: op, Req: req, Reply: reply})
}

func TestWrongTokenIsRefused(t *testing.T) {
	f := newFixture(t, Limits{})
	for _, tok := range []string{"wrong", ""} {
		_, err := f.dial(tok, 1)
		var refused *client.RefusedError
		if !errors.As(err, &refused) || refused.Errno != syscall.EACCES || !strings.Contains(err.Error(), "wrong token") {
			t.Errorf("token %q: %v, want a refusal naming the wrong token", tok, err)
		}
	}
	_, err := f.dial(token, 2)
	if err == nil || !strings.Contains(err.Error(), "namespace 2 does not exist") {
		t.Errorf("an unknown namespace: %v", err)
	}
	if !f.logs.eventually("wrong token") {
		t.Errorf("the server's log does not record the refusal:\n%s", f.logs)
	}
	// The server is fine afterwards.
	f.client()
}

// Every path stays inside the namespace: ".." is refused outright, a symbolic link that
// leads outside is refused where it would be followed, and the last component of a path is
// never followed.
func TestPathsCannotEscape(t *testing.T) {
	f := newFixture(t, Limits{})
	c := f.client()
	for name, target := range map[string]string{"abs": f.outside, "rel": "../outside", "up": "..",
		"file": filepath.Join(f.outside, "secret")} {
		if err := os.Symlink(target, filepath.Join(f.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(f.dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	var attr proto.AttrReply
	for _, p := range []string{"../outside/secret", "..", "sub/../../outside", "/etc/passwd", "sub//x", "./sub", "a\x00b"} {
		if errno := do(c, proto.OpLookup, &proto.PathReq{Path: p}, &attr); errno != syscall.EINVAL {
			t.Errorf("LOOKUP %q: %v, want EINVAL", p, errno)
		}
	}
	for _, p := range []string{"abs/secret", "rel/secret", "up/outside/secret"} {
		// No symbolic link is followed on the way to an entry (the client resolves links
		// itself; only a race or a hostile client sends such a path).
		if errno := do(c, proto.OpLookup, &proto.PathReq{Path: p}, &attr); errno != syscall.ELOOP {
			t.Errorf("LOOKUP %q through a link leading outside: %v, want ELOOP", p, errno)
		}
		if errno := do(c, proto.OpCreate, &proto.CreateReq{Dir: filepath.Dir(p), Name: "planted", Flags: syscall.O_WRONLY, Mode: 0o644}, &proto.OpenReply{}); errno != syscall.ELOOP {
			t.Errorf("CREATE in %q: %v, want ELOOP", filepath.Dir(p), errno)
		}
	}
	// The link itself is an entry of the namespace: it can be looked at, not gone through.
	if errno := do(c, proto.OpLookup, &proto.PathReq{Path: "file"}, &attr); errno != 0 || attr.Attr.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		t.Errorf("LOOKUP of a link: %v, mode %o", errno, attr.Attr.Mode)
	}
	if errno := do(c, proto.OpOpen, &proto.OpenReq{Path: "file", Flags: syscall.O_RDONLY}, &proto.OpenReply{}); errno != syscall.ELOOP {
		t.Errorf("OPEN of a link to a file outside: %v, want ELOOP", errno)
	}
	setattr := &proto.SetattrReq{Path: "file", Valid: proto.SetMode, Mode: 0o666}
	if errno := do(c, proto.OpSetattr, setattr, &attr); errno != syscall.EOPNOTSUPP {
		t.Errorf("chmod of a link: %v, want EOPNOTSUPP", errno)
	}
	setattr = &proto.SetattrReq{Path: "file", Valid: proto.SetSize, Size: 0}
	if errno := do(c, proto.OpSetattr, setattr, &attr); errno != syscall.EINVAL {
		t.Errorf("truncate of a link: %v, want EINVAL", errno)
	}
	if errno := do(c, proto.OpGetxattr, &proto.XattrReq{Path: "file", Name: "user.x", Size: 64}, &proto.XattrReply{}); errno != syscall.ENODATA {
		t.Errorf("getxattr of a link: %v, want ENODATA", errno)
	}
	if errno := do(c, proto.OpLink, &proto.LinkReq{Path: "file", Dir: "", Name: "hard"}, &attr); errno != 0 {
		t.Errorf("a hard link to the link itself: %v", errno)
	}
	if errno := do(c, proto.OpRename, &proto.RenameReq{Dir: "", Name: "sub", NewDir: "abs", NewName: "moved"}, nil); errno != syscall.ELOOP {
		t.Errorf("RENAME into a link leading outside: %v, want ELOOP", errno)
	}
	if errno := do(c, proto.OpUnlink, &proto.EntryReq{Dir: "abs", Name: "secret"}, nil); errno != syscall.ELOOP {
		t.Errorf("UNLINK through a link leading outside: %v, want ELOOP", errno)
	}
	st, err := os.Stat(filepath.Join(f.outside, "secret"))
	if err != nil || st.Mode().Perm() != 0o600 || st.Size() != 6 {
		t.Errorf("the file outside changed: %v %v", st, err)
	}
	if entries, _ := os.ReadDir(f.outside); len(entries) != 1 {
		t.Errorf("something was created outside the namespace: %v", entries)
	}
	if !f.srv.Active(0) {
		t.Error("the session does not count as active")
	}
}

// handshake performs the handshake by hand on a raw connection.
func handshake(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	br := bufio.NewReader(nc)
	hello := proto.Hello{Magic: proto.Magic, MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion}
	nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpHello, ID: 1}, &hello))
	var ch proto.Challenge
	readReply(t, br, &ch)
	auth := proto.Auth{Proof: proto.ClientProof([]byte(token), ch.Nonce, hello.Nonce), Namespace: 1}
	nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpAuth, ID: 2}, &auth))
	readReply(t, br, &proto.Welcome{})
	return nc, br
}

func readReply(t *testing.T, br *bufio.Reader, m proto.Message) proto.Header {
	t.Helper()
	h, body, err := readFrame(br, proto.MaxBody)
	if err != nil {
		t.Fatal(err)
	}
	if h.Errno != 0 {
		t.Fatalf("%s failed: %v", h.Op, syscall.Errno(h.Errno))
	}
	if m != nil {
		if err := proto.Decode(body, m); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// closed reports whether the server closed the connection (within a second).
func closed(nc net.Conn, br *bufio.Reader) bool {
	nc.SetReadDeadline(time.Now().Add(time.Second))
	_, err := io.Copy(io.Discard, br)
	return err == nil // EOF: closed by the peer; a timeout is an error
}

// A malformed frame closes its connection and nothing else: the server goes on serving.
func TestMalformedFramesCloseTheConnection(t *testing.T) {
	f := newFixture(t, Limits{})
	good := proto.AppendFrame(nil, proto.Header{Op: proto.OpPing, ID: 5}, &proto.Empty{})
	mutate := func(fn func(b []byte) []byte) []byte { return fn(append([]byte(nil), good...)) }
	cases := map[string][]byte{
		"reserved bytes set": mutate(func(b []byte) []byte { b[6] = 1; return b }),
		"a reply":            mutate(func(b []byte) []byte { b[5] = byte(proto.KindReply); return b }),
		"a huge length":      mutate(func(b []byte) []byte { b[0] = 0xff; return b }),
		"a short length":     mutate(func(b []byte) []byte { b[3] = 2; return b }),
		"a body that does not decode": proto.AppendFrame(nil, proto.Header{Op: proto.OpLookup, ID: 6},
			&proto.HandleReq{Handle: 1}), // 8 bytes where a string is expected
		"a second handshake": proto.AppendFrame(nil, proto.Header{Op: proto.OpHello, ID: 7}, &proto.Hello{}),
		"a write too short":  mutate(func(b []byte) []byte { b[4] = byte(proto.OpWrite); return b }),
	}
	for name, frame := range cases {
		nc, br := handshake(t, f.addr)
		nc.Write(good)
		readReply(t, br, nil)
		nc.Write(frame)
		if !closed(nc, br) {
			t.Errorf("%s: the connection stayed open", name)
		}
	}
	// Garbage before any handshake.
	for _, garbage := range [][]byte{[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), make([]byte, 64)} {
		nc, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		nc.Write(garbage)
		if !closed(nc, bufio.NewReader(nc)) {
			t.Errorf("garbage %q before the handshake: the connection stayed open", garbage[:8])
		}
		nc.Close()
	}
	// An unknown op is answered, not fatal: later versions may add some.
	nc, br := handshake(t, f.addr)
	nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.Op(200), ID: 9}, &proto.Empty{}))
	h, _, err := readFrame(br, proto.MaxBody)
	if err != nil || h.Errno != uint32(syscall.ENOSYS) || h.ID != 9 {
		t.Errorf("an unknown op: %+v, %v; want ENOSYS", h, err)
	}
	c := f.client()
	if errno := do(c, proto.OpStatfs, &proto.Empty{}, &proto.StatfsReply{}); errno != 0 {
		t.Errorf("the server after all this: %v", errno)
	}
	if !f.logs.eventually("broke the protocol") {
		t.Errorf("the server's log does not say why it closed connections:\n%s", f.logs)
	}
}

// A client that never finishes its handshake, or goes silent, is dropped.
func TestSilentClientsAreDropped(t *testing.T) {
	f := newFixture(t, Limits{HandshakeTimeout: 200 * time.Millisecond, IdleTimeout: 300 * time.Millisecond})
	nc, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if !closed(nc, bufio.NewReader(nc)) {
		t.Error("a client silent during the handshake was not dropped")
	}
	nc2, br := handshake(t, f.addr)
	if !closed(nc2, br) {
		t.Error("a silent client was not dropped after the idle timeout")
	}
	deadline := time.Now().Add(2 * time.Second)
	for f.srv.Connections() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := f.srv.Connections(); n != 0 {
		t.Errorf("%d connections still counted", n)
	}
}

func TestOpenFilesAreBounded(t *testing.T) {
	f := newFixture(t, Limits{MaxOpenFiles: 3})
	c := f.client()
	var errno syscall.Errno
	for i := 0; i < 4 && errno == 0; i++ {
		errno = do(c, proto.OpCreate, &proto.CreateReq{Name: "f" + string(rune('a'+i)), Flags: syscall.O_RDWR, Mode: 0o644}, &proto.OpenReply{})
	}
	if errno != syscall.EMFILE {
		t.Errorf("the fourth open with a limit of 3: %v, want EMFILE", errno)
	}
	if n := f.srv.inodes.len(); n != 3 {
		t.Errorf("%d inodes held, want the 3 open", n)
	}
	c.Close()
	deadline := time.Now().Add(2 * time.Second)
	for f.srv.inodes.len() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := f.srv.inodes.len(); n != 0 {
		t.Errorf("%d inodes still held after the client left", n)
	}
}

// Anyone who can reach the data port can open connections and send nothing. 1,100 of them,
// from one address and from several, must not keep a real mount out (the old server counted
// them against max_connections and refused the job's mount), nor hold more descriptors than
// the handshake limits allow, nor write a log line each.
func TestIdleConnectionsDoNotCrowdOutMounts(t *testing.T) {
	f := newFixture(t, Limits{}) // the defaults, as deployed
	lim := DefaultLimits()
	var idle []net.Conn
	defer func() {
		for _, nc := range idle {
			nc.Close()
		}
	}()
	for i := 0; i < 1100; i++ {
		// Most from 127.0.0.1, the rest spread over nine other addresses.
		d := net.Dialer{}
		if i%4 == 0 {
			d.LocalAddr = &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%9))}
		}
		nc, err := d.Dial("tcp", f.addr)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		idle = append(idle, nc)
	}
	c, err := f.dial(token, 1) // at once: the idle ones are all still open on their side
	if err != nil {
		t.Fatalf("a real mount after 1,100 idle connections: %v", err)
	}
	defer c.Close()
	if errno := do(c, proto.OpLookup, &proto.PathReq{Path: ""}, &proto.AttrReply{}); errno != 0 {
		t.Errorf("LOOKUP on the real mount: %v", errno)
	}
	// The idle connections hold at most MaxHandshakes descriptors (those closed to make room
	// are released as their goroutines finish), the mount one more.
	waitUntil(t, "the server to hold no more than max_handshakes idle connections", func() bool {
		return f.srv.Connections() <= lim.MaxHandshakes+1
	})
	if n := strings.Count(f.logs.String(), "\n"); n > 20 {
		t.Errorf("the server logged %d lines for 1,100 idle connections; want them throttled:\n%s", n, f.logs)
	}
}

// Authenticated connections past max_connections are refused with the reason.
func TestMountsPastMaxConnectionsAreRefused(t *testing.T) {
	f := newFixture(t, Limits{MaxConnections: 2})
	f.client()
	f.client()
	if _, err := f.dial(token, 1); err == nil || !strings.Contains(err.Error(), "warpfs.max_connections") {
		t.Fatalf("a third mount with max_connections 2: %v, want a refusal naming warpfs.max_connections", err)
	}
}

// waitUntil polls cond for up to 10s: it bounds a wait, it does not measure speed.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A storage node that holds only its own credential serves a namespace only to a client with
// the controller's capability for that namespace and that client, unexpired; the cluster's
// secret is worthless to it, and so is a capability made for another node.
func TestCapabilitiesGateTheNamespaces(t *testing.T) {
	const secret = "cluster-secret"
	f := newFixtureHolding(t, Limits{}, nodekey.Derive(secret, "ssd1"), "ssd1")
	grant := func(c nodekey.Capability, storage string) (string, string) {
		return c.String(), nodekey.SessionKey(nodekey.Derive(secret, storage), c.String())
	}
	dial := func(client string, namespace int64, capability, key string) error {
		c, err := dialGranted(f.addr, client, namespace, capability, key)
		if err == nil {
			c.Close()
		}
		return err
	}
	good := nodekey.Capability{Namespace: 1, Client: "cn1", Expires: time.Now().Add(time.Hour).Unix()}
	if err := dial("cn1", 1, "", ""); err == nil || !strings.Contains(err.Error(), "no capability") {
		t.Errorf("a client with no capability: %v", err)
	}
	capText, key := grant(good, "ssd1")
	if err := dial("cn1", 1, capText, key); err != nil {
		t.Fatalf("the granted mount: %v", err)
	}
	if err := dial("cn2", 1, capText, key); err == nil || !strings.Contains(err.Error(), "capability for namespace 1") {
		t.Errorf("another node using cn1's capability: %v", err)
	}
	other := good
	other.Namespace = 2
	capText2, key2 := grant(other, "ssd1")
	if err := dial("cn1", 1, capText2, key2); err == nil {
		t.Error("a capability for namespace 2 opened namespace 1")
	}
	capText3, key3 := grant(good, "ssd2")
	if err := dial("cn1", 1, capText3, key3); err == nil || !strings.Contains(err.Error(), "did not grant") {
		t.Errorf("a capability made for another storage node: %v", err)
	}
	expired := good
	expired.Expires = time.Now().Add(-time.Minute).Unix()
	capText4, key4 := grant(expired, "ssd1")
	if err := dial("cn1", 1, capText4, key4); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("an expired capability: %v", err)
	}
	if err := dial("cn1", 1, "", secret); err == nil {
		t.Error("the cluster's secret opened a namespace on a node that holds only its own credential")
	}
	// A stripes capability names the namespace whose objects the session counts to: a
	// client sending it, or 0 (a client of before), is served; another namespace is not.
	objects := nodekey.Capability{Namespace: 7, Client: "cn1", Stripes: true, Expires: time.Now().Add(time.Hour).Unix()}
	capText5, key5 := grant(objects, "ssd1")
	for _, ns := range []int64{7, 0} {
		c, err := client.Dial(context.Background(), client.Options{Address: f.addr, Client: "cn1", Namespace: ns, Stripes: true,
			Capability: capText5, CapabilityKey: key5, Limits: client.Limits{RequestTimeout: 5 * time.Second}})
		if err != nil {
			t.Errorf("stripe objects with the capability for namespace 7, asking %d: %v", ns, err)
			continue
		}
		c.Close()
	}
	c, err := client.Dial(context.Background(), client.Options{Address: f.addr, Client: "cn1", Namespace: 8, Stripes: true,
		Capability: capText5, CapabilityKey: key5, Limits: client.Limits{RequestTimeout: 5 * time.Second}})
	if err == nil {
		c.Close()
		t.Error("stripe objects counted to namespace 8 with a capability naming 7")
	}
}

// dialGranted mounts namespace as client with a capability and its session key, or with key
// as the token when there is no capability.
func dialGranted(addr, clientName string, namespace int64, capability, key string) (*client.Client, error) {
	opt := client.Options{Address: addr, Client: clientName, Namespace: namespace,
		Capability: capability, CapabilityKey: key, Limits: client.Limits{RequestTimeout: 5 * time.Second}}
	if capability == "" {
		opt.Token, opt.CapabilityKey = key, ""
	}
	return client.Dial(context.Background(), opt)
}

// ADOPT, the second half of a rename between shards of a max_mds namespace: only in a
// striped namespace, only with a valid layout; the entry gets the owner, mode, times and
// layout given, and replacing a striped file returns that file's layout.
func TestAdopt(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a striped namespace's layout is a trusted extended attribute: root only")
	}
	f := newFixture(t, Limits{})
	c := f.client()
	var st0 unix.Stat_t
	l := stripe.Layout{ID: 77, Size: 1 << 20, Width: 2, Servers: 2, Length: 12345}
	adopt := func(name string, mode uint32, layout []byte, flags uint32) ([]byte, syscall.Errno) {
		var rep proto.RemovedReply
		errno := do(c, proto.OpAdopt, &proto.AdoptReq{Name: name, Mode: mode, UID: 65534, GID: 65533, Layout: layout, Flags: flags,
			Target: "somewhere", Mtime: proto.Timespec{Sec: 1000000000, Nsec: 5}, Atime: proto.Timespec{Sec: 1000000001}, Rdev: 0x0103}, &rep)
		return rep.Layout, errno
	}
	if _, errno := adopt("f", syscall.S_IFREG|0o640, l.Encode(), 0); errno != syscall.EINVAL {
		t.Fatalf("ADOPT of a stub in an unstriped namespace: %v, want EINVAL", errno)
	}
	root := stripe.Layout{Size: 1 << 20, Width: 2, Servers: 2}
	if err := unix.Setxattr(f.dir, LayoutXattr, root.Encode(), 0); err != nil {
		t.Fatal(err)
	}
	c = f.client() // a new session sees the namespace striped
	if _, errno := adopt("f", syscall.S_IFREG|0o640, []byte("junk"), 0); errno != syscall.EINVAL {
		t.Errorf("ADOPT with a malformed layout: %v, want EINVAL", errno)
	}
	if _, errno := adopt("../escape", syscall.S_IFREG|0o640, l.Encode(), 0); errno != syscall.EINVAL {
		t.Errorf("ADOPT of a name with a slash: %v, want EINVAL", errno)
	}
	if _, errno := adopt("sub", syscall.S_IFDIR|0o700, nil, 0); errno != syscall.EINVAL {
		t.Errorf("ADOPT of a directory: %v, want EINVAL (directories are on every shard)", errno)
	}
	if _, errno := adopt("dev", syscall.S_IFCHR|0o600, nil, 0); errno != 0 {
		t.Errorf("ADOPT of a device node: %v", errno)
	} else if err := unix.Lstat(filepath.Join(f.dir, "dev"), &st0); err != nil || st0.Mode&syscall.S_IFMT != syscall.S_IFCHR || st0.Rdev != 0x0103 {
		t.Errorf("the adopted device node: mode %o rdev %#x (%v), want a character device 0x0103", st0.Mode, st0.Rdev, err)
	}
	if replaced, errno := adopt("f", syscall.S_IFREG|0o640, l.Encode(), 0); errno != 0 || len(replaced) != 0 {
		t.Fatalf("ADOPT of a stub: %v (replaced %v)", errno, replaced)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(f.dir, "f"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 65534 || st.Gid != 65533 || st.Mode != syscall.S_IFREG|0o640 || st.Mtim.Sec != 1000000000 || st.Mtim.Nsec != 5 || st.Size != 0 {
		t.Errorf("the adopted stub: uid %d gid %d mode %o mtime %d.%d size %d", st.Uid, st.Gid, st.Mode, st.Mtim.Sec, st.Mtim.Nsec, st.Size)
	}
	var attr proto.AttrReply
	if errno := do(c, proto.OpLookup, &proto.PathReq{Path: "f"}, &attr); errno != 0 || attr.Attr.Size != 12345 {
		t.Errorf("LOOKUP of the adopted stub: %v, size %d, want its layout's 12345", errno, attr.Attr.Size)
	}
	next := l
	next.ID = 78
	if _, errno := adopt("f", syscall.S_IFREG|0o600, next.Encode(), unix.RENAME_NOREPLACE); errno != syscall.EEXIST {
		t.Errorf("ADOPT with RENAME_NOREPLACE over a file: %v, want EEXIST", errno)
	}
	replaced, errno := adopt("f", syscall.S_IFREG|0o600, next.Encode(), 0)
	if got, err := stripe.Decode(replaced); errno != 0 || err != nil || got.ID != 77 {
		t.Errorf("ADOPT over a striped file: %v, replaced layout %+v (%v), want the old one's (id 77)", errno, got, err)
	}
	if _, errno := adopt("l", syscall.S_IFLNK|0o777, nil, 0); errno != 0 {
		t.Fatal(errno)
	}
	if target, err := os.Readlink(filepath.Join(f.dir, "l")); err != nil || target != "somewhere" {
		t.Errorf("the adopted link points to %q (%v)", target, err)
	}
	if err := os.Mkdir(filepath.Join(f.dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, errno := adopt("d", syscall.S_IFIFO|0o600, nil, 0); errno != syscall.EISDIR {
		t.Errorf("ADOPT over a directory: %v, want EISDIR", errno)
	}
	entries, _ := os.ReadDir(f.dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "d,dev,f,l" {
		t.Errorf("the namespace holds %v, want d, dev, f, l and no temporary name", names)
	}
}

// A size report with SetSync (a striped file's fsync on the metadata server) changes the size
// like one without; it needs an open handle, and by path fails with EINVAL, changing nothing.
// A call needing a newer protocol than the connection's fails without being sent.
func TestSizeReportWithSync(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a striped namespace's layout is a trusted extended attribute: root only")
	}
	f := newFixture(t, Limits{})
	root := stripe.Layout{Size: 1 << 20, Width: 2, Servers: 2}
	if err := unix.Setxattr(f.dir, LayoutXattr, root.Encode(), 0); err != nil {
		t.Fatal(err)
	}
	c := f.client()
	var opened proto.OpenReply
	if errno := do(c, proto.OpCreate, &proto.CreateReq{Name: "f", Flags: syscall.O_RDWR, Mode: 0o644}, &opened); errno != 0 {
		t.Fatal(errno)
	}
	size := func() uint64 {
		var attr proto.AttrReply
		if errno := do(c, proto.OpLookup, &proto.PathReq{Path: "f"}, &attr); errno != 0 {
			t.Fatal(errno)
		}
		return attr.Attr.Size
	}
	report := func(r proto.SetattrReq, minVersion uint16) (proto.AttrReply, syscall.Errno) {
		var rep proto.AttrReply
		errno := c.Do(context.Background(), &client.Call{Op: proto.OpSetattr, Req: &r, Reply: &rep, MinVersion: minVersion})
		return rep, errno
	}
	sync := uint32(proto.SetSizeAtLeast | proto.SetMtimeNow | proto.SetSync)
	rep, errno := report(proto.SetattrReq{Handle: opened.Handle, Valid: sync, Size: 4096}, proto.SyncVersion)
	if errno != 0 || rep.Attr.Size != 4096 || size() != 4096 {
		t.Fatalf("a size report with sync: %v, reply's size %d, the file's %d; want 4096", errno, rep.Attr.Size, size())
	}
	if _, errno := report(proto.SetattrReq{Path: "f", Valid: sync, Size: 8192}, proto.SyncVersion); errno != syscall.EINVAL || size() != 4096 {
		t.Errorf("a size report with sync by path: %v, size %d; want EINVAL and 4096", errno, size())
	}
	if _, errno := report(proto.SetattrReq{Handle: opened.Handle, Valid: sync, Size: 8192}, proto.MaxVersion+1); errno != syscall.EPROTONOSUPPORT || size() != 4096 {
		t.Errorf("a call needing a newer protocol: %v, size %d; want EPROTONOSUPPORT and 4096 (not sent)", errno, size())
	}
}

// Security issue 19, item 5: past max_handshakes the old server closed the oldest connection
// still in its handshake, whoever held it, and the per-peer limit stops one address only.
// Anonymous connections from 40 addresses (any local user can bind 127.0.0.x; on a cluster, a
// multi-node allocation) closed real mounts' handshakes between their HELLO and their AUTH,
// and jobs failed pre_run. Now connections that sent nothing go first, then those of the
// network holding the most handshakes: a real client that sent its HELLO survives any number
// of silent connections, and HELLOs from another network.
func TestHandshakesFromManyAddressesDoNotEvictMounts(t *testing.T) {
	const maxHandshakes = 16
	// attacker is one anonymous connection from 127.0.0.(2+i%40); with hello it sends a valid
	// HELLO and waits for the challenge (so the server has accepted it, and every connection
	// dialled before it), then sends nothing more.
	attacker := func(f *fixture, i int, hello bool) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%40))}, Timeout: 5 * time.Second}
		nc, err := d.Dial("tcp", f.addr)
		if err != nil {
			t.Fatalf("anonymous connection %d: %v", i, err)
		}
		t.Cleanup(func() { nc.Close() })
		if hello {
			nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpHello, ID: 1},
				&proto.Hello{Magic: proto.Magic, MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion}))
			nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, _, err := readFrame(bufio.NewReader(nc), proto.MaxBody); err != nil {
				t.Fatalf("anonymous connection %d: no challenge: %v", i, err)
			}
		}
		return nc
	}
	for _, tc := range []struct {
		name   string
		from   net.IP // the real client's address
		hellos bool   // the anonymous connections send a HELLO
	}{
		{"silent connections from 40 addresses of the client's own network", net.IPv4(127, 0, 0, 1), false},
		{"HELLOs from 40 addresses of another network", net.IPv4(127, 0, 1, 1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Limits{MaxHandshakes: maxHandshakes})
			n := 0
			for ; n < maxHandshakes; n++ { // every handshake slot held
				attacker(f, n, tc.hellos)
			}
			// The real client: its HELLO, the challenge...
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: tc.from}, Timeout: 5 * time.Second}
			nc, err := d.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			br := bufio.NewReader(nc)
			hello := proto.Hello{Magic: proto.Magic, MinVersion: proto.MinVersion, MaxVersion: proto.MaxVersion}
			nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpHello, ID: 1}, &hello))
			nc.SetReadDeadline(time.Now().Add(10 * time.Second))
			var ch proto.Challenge
			readReply(t, br, &ch)
			// ... and before its AUTH (a round trip on a loaded network), twice as many
			// anonymous connections as there are slots. The last sends a HELLO: once it has
			// its challenge the server has accepted them all.
			for end := n + 2*maxHandshakes; n < end; n++ {
				attacker(f, n, tc.hellos || n == end-1)
			}
			auth := proto.Auth{Proof: proto.ClientProof([]byte(token), ch.Nonce, hello.Nonce), Namespace: 1}
			nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpAuth, ID: 2}, &auth))
			h, _, err := readFrame(br, proto.MaxBody)
			if err != nil || h.Errno != 0 {
				t.Fatalf("the real client's AUTH after %d anonymous connections: %+v, %v; want WELCOME", n, h, err)
			}
			// And mounts through the real client work, from the same address.
			c, err := client.Dial(context.Background(), client.Options{Address: f.addr, Token: token, Client: "test",
				Namespace: 1, Limits: client.Limits{RequestTimeout: 5 * time.Second}})
			if err != nil {
				t.Fatalf("a mount among the anonymous connections: %v", err)
			}
			c.Close()
		})
	}
}

// A namespace on one server keeps the stripe configuration a user sets (libdatawarp's
// dw_set_stripe_configuration, user.spillway.layout) and answers it back: on an empty file,
// or on a directory for the files created in it afterwards; a width above 1 is EINVAL (the
// instance has one server), a file holding data EEXIST; nothing set, ENODATA (the default).
// Issue 23 item 10.
func TestOneServerKeepsStripeConfiguration(t *testing.T) {
	f := newFixture(t, Limits{})
	c := f.client()
	get := func(p string) (string, syscall.Errno) {
		var rep proto.XattrReply
		errno := do(c, proto.OpGetxattr, &proto.XattrReq{Path: p, Name: UserLayoutXattr, Size: 256}, &rep)
		return string(rep.Data), errno
	}
	set := func(p, v string) syscall.Errno {
		return do(c, proto.OpSetxattr, &proto.XattrReq{Path: p, Name: UserLayoutXattr, Value: []byte(v)}, nil)
	}
	if errno := do(c, proto.OpCreate, &proto.CreateReq{Name: "f", Flags: syscall.O_RDWR, Mode: 0o644}, &proto.OpenReply{}); errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := get("f"); errno != syscall.ENODATA {
		t.Errorf("nothing set: %v, want ENODATA", errno)
	}
	if errno := set("f", "stripe_size=1048576 stripe_width=1"); errno != 0 {
		t.Fatalf("set: %v", errno)
	}
	if text, errno := get("f"); errno != 0 || text != "stripe_size=1048576 stripe_width=1 start=0" {
		t.Errorf("kept: %q %v", text, errno)
	}
	if errno := set("f", "stripe_size=1048576 stripe_width=2"); errno != syscall.EINVAL {
		t.Errorf("width 2 on one server: %v, want EINVAL", errno)
	}
	if errno := set("f", "stripe_size=1000"); errno != syscall.EINVAL {
		t.Errorf("a size not a multiple of 4 KiB: %v, want EINVAL", errno)
	}
	if errno := do(c, proto.OpMkdir, &proto.MkdirReq{Name: "d", Mode: 0o755}, &proto.AttrReply{}); errno != 0 {
		t.Fatal(errno)
	}
	if errno := set("d", "stripe_size=2097152"); errno != 0 {
		t.Fatalf("set on a directory: %v", errno)
	}
	if errno := do(c, proto.OpCreate, &proto.CreateReq{Dir: "d", Name: "g", Flags: syscall.O_RDWR, Mode: 0o644}, &proto.OpenReply{}); errno != 0 {
		t.Fatal(errno)
	}
	if text, errno := get("d/g"); errno != 0 || text != "stripe_size=2097152 stripe_width=1 start=0" {
		t.Errorf("a new file in the directory: %q %v, want the directory's", text, errno)
	}
	os.WriteFile(filepath.Join(f.dir, "d", "g"), []byte("data"), 0o644)
	if errno := set("d/g", "stripe_size=1048576"); errno != syscall.EEXIST {
		t.Errorf("a file holding data: %v, want EEXIST", errno)
	}
	// The server's own attribute stays hidden.
	var list proto.XattrReply
	if errno := do(c, proto.OpListxattr, &proto.XattrReq{Path: "f", Size: 1024}, &list); errno != 0 || strings.Contains(string(list.Data), "spillway") {
		t.Errorf("listxattr: %q %v", list.Data, errno)
	}
	if errno := do(c, proto.OpSetxattr, &proto.XattrReq{Path: "f", Name: KeptXattr, Value: []byte("stripe_size=4096")}, nil); errno != syscall.EPERM {
		t.Errorf("a client setting the server's own attribute: %v, want EPERM", errno)
	}
	if errno := do(c, proto.OpGetxattr, &proto.XattrReq{Path: "f", Name: KeptXattr, Size: 64}, &proto.XattrReply{}); errno != syscall.ENODATA {
		t.Errorf("a client reading the server's own attribute: %v, want ENODATA", errno)
	}
}
