package mount

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/mounttable"
	"github.com/spillway-hpc/spillway/internal/testca"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
	"golang.org/x/sys/unix"
)

// testBackend is one way of serving a namespace. The POSIX behaviour tests run against each: the
// loopback over a local directory, and the remote backend reaching a warpfs server over TCP
// (here on the loopback interface; tests/e2e runs it across network namespaces).
type testBackend struct {
	name   string
	remote bool
	// striped serves the namespace as a striped instance's: file data in stripe objects on
	// testStripeServers servers, in directories beside the namespace's (src.s0, src.s1, ...).
	striped bool
	// shards spreads a striped namespace over this many namespace shards (max_mds=yes): the
	// namespace's directory is shard 0, the others beside it (src.m1, src.m2, ...).
	shards int
}

var backends = []testBackend{{name: "local"}, {name: "remote", remote: true},
	{name: "striped", striped: true}, {name: "striped-remote", remote: true, striped: true},
	{name: "striped-maxmds", striped: true, shards: testShards},
	{name: "striped-maxmds-remote", remote: true, striped: true, shards: testShards}}

// testShards is how many shards the max_mds backends spread a namespace over.
const testShards = 3

// shardDirs are the namespace shards' directories of a max_mds backend's namespace src,
// src itself first.
func shardDirs(src string, n int) []string {
	out := []string{src}
	for i := 1; i < n; i++ {
		out = append(out, fmt.Sprintf("%s.m%d", src, i))
	}
	return out
}

// The striped backends' layout: small stripes, so that small files span servers.
const (
	testStripeServers = 3
	testStripeSize    = 64 << 10
)

// writesBehind says whether the backend's files write behind the writer (Limits.WriteBehind):
// an error of a write comes with the next write, fsync or close, and the servers see the data
// then.
func (b testBackend) writesBehind() bool { return b.striped || b.remote }

// eachBackend runs a test once per backend, as subtests named after them.
func eachBackend(t *testing.T, test func(t *testing.T, b testBackend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			if b.striped && os.Geteuid() != 0 {
				t.Skip("a striped namespace's layout is a trusted extended attribute: root only")
			}
			test(t, b)
		})
	}
}

// stripeDirs are the stripe servers' directories of a striped backend's namespace src.
func stripeDirs(src string) []string {
	var out []string
	for i := 0; i < testStripeServers; i++ {
		out = append(out, fmt.Sprintf("%s.s%d", src, i))
	}
	return out
}

const testToken = "mount-test-token"

// resolveHolding is a test server's Resolve: sessions of stripe objects get stripes (as the
// first fragment's storage node serves its own stripes beside the namespace), every other
// session target; stripes nil: target for all, as most test servers.
func resolveHolding(target server.Target, stripes *server.Target) server.Resolver {
	return func(_, _, _ int64, objects bool) (server.Target, error) {
		if objects && stripes != nil {
			return *stripes, nil
		}
		return target, nil
	}
}

// testServer is a warpfs server in this process, serving one directory.
type testServer struct {
	addr   string
	srv    *server.Server
	cancel context.CancelFunc
	done   chan struct{}
}

// startServer serves dir with tracker t on 127.0.0.1 (on addr if given, else any port) until
// stop or the end of the test.
func startServer(t testing.TB, addr, dir string, tr *usage.Tracker, logTo *slog.Logger) *testServer {
	t.Helper()
	return startServerOn(t, addr, dir, tr, logTo, nil)
}

// startServerOn is startServer, over TLS when serverTLS is not nil.
func startServerOn(t testing.TB, addr, dir string, tr *usage.Tracker, logTo *slog.Logger, serverTLS *tls.Config) *testServer {
	t.Helper()
	return startServerFor(t, addr, server.Target{Dir: dir, Tracker: tr}, logTo, serverTLS)
}

// startServerFor is startServerOn, serving target.
func startServerFor(t testing.TB, addr string, target server.Target, logTo *slog.Logger, serverTLS *tls.Config) *testServer {
	t.Helper()
	return startServerWith(t, addr, target, logTo, serverTLS, nil)
}

// startServerWith is startServerFor, with the server's options changed by tweak (if not nil).
func startServerWith(t testing.TB, addr string, target server.Target, logTo *slog.Logger, serverTLS *tls.Config, tweak func(*server.Options)) *testServer {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if serverTLS != nil {
		l = tls.NewListener(l, serverTLS)
	}
	if logTo == nil {
		logTo = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	opt := server.Options{Token: testToken, Log: logTo, Limits: server.Limits{Lease: testLease()},
		Resolve: func(fragment, namespace, instance int64, stripes bool) (server.Target, error) {
			return target, nil
		}}
	if tweak != nil {
		tweak(&opt)
	}
	srv := server.New(opt)
	ctx, cancel := context.WithCancel(context.Background())
	s := &testServer{addr: l.Addr().String(), srv: srv, cancel: cancel, done: make(chan struct{})}
	go func() { srv.Serve(ctx, l); close(s.done) }()
	t.Cleanup(s.stop)
	return s
}

// testLease is the lease of the test servers and local mounts: SPILLWAY_TEST_LEASE (a
// duration; 0 turns caching off, to compare) or the default.
func testLease() time.Duration {
	d, err := time.ParseDuration(os.Getenv("SPILLWAY_TEST_LEASE"))
	switch {
	case err != nil:
		return 0
	case d == 0:
		return -1
	}
	return d
}

func (s *testServer) stop() {
	s.cancel()
	<-s.done
}

// prepare turns a loopback spec into this backend's.
func (b testBackend) prepare(t testing.TB, spec Spec) Spec {
	t.Helper()
	var logTo *slog.Logger
	if spec.Logger != nil {
		logTo = slog.New(slog.NewTextHandler(spec.Logger.Writer(), nil))
	}
	var held *server.Target // the stripes the namespace's server holds
	if b.striped {
		l := stripe.Layout{Size: testStripeSize, Width: testStripeServers, Servers: testStripeServers}
		if err := unix.Setxattr(spec.SourceDir, server.LayoutXattr, l.Encode(), 0); err != nil {
			t.Fatal(err)
		}
		for i, dir := range stripeDirs(spec.SourceDir) {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			frag := serverFragment(spec.Fragment, i)
			st := Server{Dir: dir, Tracker: spec.Tracker, Fragment: frag}
			if b.remote && i == 0 && b.shards <= 1 {
				// The namespace's server holds the first stripes, as the first fragment's
				// storage node does (files created behind are placed whole there): set below.
				held = &server.Target{Dir: dir, Tracker: spec.Tracker, Fragment: frag}
				spec.Stripes = append(spec.Stripes, Server{})
				continue
			}
			if b.remote {
				s := startServerFor(t, "", server.Target{Dir: dir, Tracker: spec.Tracker, Fragment: frag}, logTo, nil)
				// As the agent's: the mount's namespace, which the objects' session counts to.
				st = Server{Remote: &Remote{Address: s.addr, Token: testToken, Client: "test-node", FragmentID: 1, NamespaceID: spec.NamespaceID, InstanceID: 3}}
			}
			spec.Stripes = append(spec.Stripes, st)
		}
	}
	if b.shards > 1 {
		var root unix.Stat_t
		if err := unix.Stat(spec.SourceDir, &root); err != nil {
			t.Fatal(err)
		}
		l := stripe.Layout{Size: testStripeSize, Width: testStripeServers, Servers: testStripeServers}
		for i, dir := range shardDirs(spec.SourceDir, b.shards) {
			if i > 0 { // shard 0 is the namespace's directory, made like the others
				if err := os.Mkdir(dir, os.FileMode(root.Mode&0o777)); err != nil && !errors.Is(err, os.ErrExist) {
					t.Fatal(err)
				}
				if err := errors.Join(os.Chown(dir, int(root.Uid), int(root.Gid)), os.Chmod(dir, os.FileMode(root.Mode&0o777)),
					unix.Setxattr(dir, server.LayoutXattr, l.Encode(), 0)); err != nil {
					t.Fatal(err)
				}
			}
			frag := serverFragment(spec.Fragment, i)
			if frag != nil {
				frag.Namespace(int64(20+i)).SetLimits(shardShare(spec.Fragment.Namespace(spec.NamespaceID).MaxFilesCreated(), b.shards), 0)
			}
			sh := Server{Dir: dir, Tracker: spec.Tracker, Fragment: frag, NamespaceID: int64(20 + i)}
			if b.remote {
				s := startServerFor(t, "", server.Target{Dir: dir, Tracker: spec.Tracker, Fragment: frag}, logTo, nil)
				sh = Server{Remote: &Remote{Address: s.addr, Token: testToken, Client: "test-node", FragmentID: int64(10 + i), NamespaceID: int64(20 + i), InstanceID: 3}}
			}
			spec.MDS = append(spec.MDS, sh)
		}
	}
	if !b.remote {
		return spec
	}
	target := server.Target{Dir: spec.SourceDir, Tracker: spec.Tracker, Fragment: spec.Fragment}
	s := startServerWith(t, "", target, logTo, nil, func(o *server.Options) {
		o.Resolve = resolveHolding(target, held)
	})
	spec.Remote = &Remote{Address: s.addr, Token: testToken, Client: "test-node", FragmentID: 1, NamespaceID: spec.NamespaceID, InstanceID: 3}
	if held != nil {
		spec.Stripes[0] = Server{Remote: &Remote{Address: s.addr, Token: testToken, Client: "test-node", FragmentID: 1, NamespaceID: spec.NamespaceID, InstanceID: 3}}
	}
	spec.SourceDir, spec.Tracker = "", nil
	return spec
}

// backingDirs are the directories holding namespace src on disk: src, or a max_mds backend's
// shards (made now if missing; mounting makes them like src).
func (b testBackend) backingDirs(t *testing.T, src string) []string {
	t.Helper()
	if b.shards < 2 {
		return []string{src}
	}
	dirs := shardDirs(src, b.shards)
	for _, d := range dirs[1:] {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return dirs
}

// mount mounts spec with this backend and unmounts it when the test ends.
func (b testBackend) mount(t *testing.T, spec Spec) *Mounted {
	t.Helper()
	return mount(t, b.prepare(t, spec))
}

// The storage node refuses clients without the token, and says why; the mount fails with its
// reason.
func TestRemoteMountRefusesAWrongToken(t *testing.T) {
	src, mp := dirs(t)
	s := startServer(t, "", src, usage.New("instance 30", mib), nil)
	_, err := Mount(Spec{MountPath: mp, Remote: &Remote{Address: s.addr, Token: "not-the-token", NamespaceID: 1}})
	if err == nil || !strings.Contains(err.Error(), "wrong token") || !strings.Contains(err.Error(), "agent.token_file") {
		t.Fatalf("mounting with a wrong token: %v", err)
	}
	if mounts, _ := mounttable.At(mp); len(mounts) != 0 {
		t.Errorf("a refused mount left %v", mounts)
	}
	_, err = Mount(Spec{MountPath: mp, SourceDir: src, Remote: &Remote{Address: s.addr}})
	if err == nil || !strings.Contains(err.Error(), "choose one") {
		t.Errorf("a spec with a directory and a remote namespace: %v", err)
	}
}

// A storage node that dies gives the job's processes an error within the request timeout,
// never a hang; the mount can still be removed.
func TestRemoteDeadServerFailsWithinTheTimeout(t *testing.T) {
	src, mp := dirs(t)
	tr := usage.New("instance 31", 4*mib)
	s := startServer(t, "", src, tr, nil)
	const timeout = 1500 * time.Millisecond
	m := mount(t, Spec{MountPath: mp, Logger: quietLogger(t), Remote: &Remote{Address: s.addr, Token: testToken,
		Limits: client.Limits{RequestTimeout: timeout, KeepaliveInterval: 300 * time.Millisecond, ReconnectWait: 50 * time.Millisecond}}})
	f, err := os.Create(filepath.Join(m.Path(), "open"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("before")); err != nil {
		t.Fatal(err)
	}
	s.stop()

	for what, op := range map[string]func() error{
		// The write goes behind the writer (Limits.WriteBehind): its error comes with the
		// fsync, once the request's deadline passed without the node accepting connections.
		"writing to an open file": func() error {
			_, err := f.Write([]byte("after"))
			if err == nil {
				err = f.Sync()
			}
			return err
		},
		"stat":            func() error { _, err := os.Stat(filepath.Join(m.Path(), "other")); return err },
		"creating a file": func() error { return os.WriteFile(filepath.Join(m.Path(), "new"), nil, 0o644) },
	} {
		start := time.Now()
		err := op()
		took := time.Since(start)
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("%s on a dead storage node: %v, want EIO", what, err)
		}
		// The first request waits the timeout; once the node is known down the next fail at once.
		if took > timeout+time.Second {
			t.Errorf("%s failed after %s; the request timeout is %s", what, took, timeout)
		}
		t.Logf("%s: %v after %s", what, err, took.Round(time.Millisecond))
	}
}

// A storage agent that dies (nothing listens on its port any more: connections are refused)
// fails every operation on its files with EIO at once — not ENOTCONN, and not after
// warpfs.request_timeout, which is long here: a regression hangs until the test's timeout.
func TestRemoteRefusingServerFailsWithEIOAtOnce(t *testing.T) {
	src, mp := dirs(t)
	tr := usage.New("instance 37", 4*mib)
	for _, name := range []string{"opened", "unseen"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte("on the storage node"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := startServer(t, "", src, tr, nil)
	m := mount(t, Spec{MountPath: mp, Logger: quietLogger(t), Remote: &Remote{Address: s.addr, Token: testToken,
		Limits: client.Limits{RequestTimeout: time.Minute, KeepaliveInterval: 300 * time.Millisecond, ReconnectWait: 50 * time.Millisecond}}})
	f, err := os.Open(filepath.Join(m.Path(), "opened")) // not read yet: nothing in the page cache
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s.stop() // listener and connections closed: the port refuses connections

	buf := make([]byte, 8)
	for _, c := range []struct {
		what string
		op   func() error
	}{
		{"reading an open file", func() error { _, err := f.ReadAt(buf, 0); return err }},
		{"stat", func() error { _, err := os.Stat(filepath.Join(m.Path(), "unseen")); return err }},
		{"cat", func() error { _, err := os.ReadFile(filepath.Join(m.Path(), "unseen")); return err }},
		{"listing the directory", func() error { _, err := os.ReadDir(m.Path()); return err }},
		{"creating a file", func() error { return os.WriteFile(filepath.Join(m.Path(), "new"), nil, 0o644) }},
		{"stat again", func() error { _, err := os.Stat(filepath.Join(m.Path(), "unseen2")); return err }},
	} {
		start := time.Now()
		err := c.op()
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("%s on a storage node refusing connections: %v, want EIO", c.what, err)
		}
		t.Logf("%s: %v after %s", c.what, err, time.Since(start).Round(time.Millisecond))
	}

	// It comes back: the next request reconnects.
	startServer(t, s.addr, src, tr, nil)
	if got, err := os.ReadFile(filepath.Join(m.Path(), "unseen")); err != nil || string(got) != "on the storage node" {
		t.Errorf("after the storage node came back: %q, %v", got, err)
	}
}

// A storage node that accepts connections but never answers (a hung agent, a host whose
// kernel still answers) fails requests with EIO, not ENOTCONN, within warpfs.request_timeout.
func TestRemoteSilentServerFailsWithEIO(t *testing.T) {
	src, mp := dirs(t)
	tr := usage.New("instance 38", 4*mib)
	s := startServer(t, "", src, tr, nil)
	m := mount(t, Spec{MountPath: mp, Logger: quietLogger(t), Remote: &Remote{Address: s.addr, Token: testToken,
		Limits: client.Limits{RequestTimeout: 1500 * time.Millisecond, ConnectTimeout: 300 * time.Millisecond,
			KeepaliveInterval: 300 * time.Millisecond, ReconnectWait: 50 * time.Millisecond}}})
	s.stop()
	l, err := net.Listen("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		var held []net.Conn // accepted, never answered
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	for _, name := range []string{"first", "second"} {
		if _, err := os.Stat(filepath.Join(m.Path(), name)); !errors.Is(err, syscall.EIO) {
			t.Errorf("stat on a storage node that never answers: %v, want EIO", err)
		}
	}
}

// A storage agent that restarts (same address) is reconnected to; a file open across the
// restart is opened again by its name and keeps working.
func TestRemoteServerRestart(t *testing.T) {
	src, mp := dirs(t)
	tr := usage.New("instance 32", 4*mib)
	s := startServer(t, "", src, tr, nil)
	m := mount(t, Spec{MountPath: mp, Logger: quietLogger(t), Remote: &Remote{Address: s.addr, Token: testToken,
		Limits: client.Limits{RequestTimeout: 10 * time.Second, KeepaliveInterval: 300 * time.Millisecond, ReconnectWait: 50 * time.Millisecond}}})
	p := filepath.Join(m.Path(), "kept")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("one ")); err != nil {
		t.Fatal(err)
	}
	s.stop()
	time.Sleep(100 * time.Millisecond)
	startServer(t, s.addr, src, tr, nil)
	if _, err := f.Write([]byte("two")); err != nil {
		t.Fatalf("writing to a file open across the restart: %v", err)
	}
	if got, err := os.ReadFile(p); err != nil || string(got) != "one two" {
		t.Errorf("after the restart: %q, %v", got, err)
	}
	checkAccounting(t, tr, src)
}

// A path that leaves the namespace never reaches the backing file system: the server refuses
// it even when the client is compromised (exercised in package server); through the mount the
// kernel resolves symbolic links on the client, so a link pointing outside leads outside the
// mount, on the compute node, and not into the storage node.
func TestRemoteSymlinkOutsideStaysOnTheClient(t *testing.T) {
	src, mp := dirs(t)
	tr := usage.New("instance 33", mib)
	m := backends[1].mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr})
	outside := filepath.Join(filepath.Dir(src), "outside")
	if err := os.WriteFile(outside, []byte("client side"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(m.Path(), "escape")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(m.Path(), "escape")); err != nil || string(got) != "client side" {
		t.Errorf("reading through an absolute link: %q, %v", got, err)
	}
}

// A process reading a file sees what another process of the node writes into it, whether the
// writer's descriptor goes through the page cache or (remote, write-only) around it.
func TestReaderSeesAWriterOfTheSameNode(t *testing.T) {
	eachBackend(t, testReaderSeesAWriterOfTheSameNode)
}

func testReaderSeesAWriterOfTheSameNode(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 34", mib)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr})
	p := filepath.Join(m.Path(), "shared")
	if err := os.WriteFile(p, []byte("version 1"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, 9)
	if _, err := r.ReadAt(buf, 0); err != nil || string(buf) != "version 1" {
		t.Fatalf("first read: %q %v", buf, err)
	}
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteAt([]byte("2"), 8); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if _, err := r.ReadAt(buf, 0); err != nil || string(buf) != "version 2" {
		t.Errorf("the reader's descriptor after the write: %q %v", buf, err)
	}
	checkAccounting(t, tr, src)
}

// A storage node serving warpfs over TLS (warpfs.tls): a client that trusts its CA mounts and
// works; one that does not is refused at the TLS handshake, with the fix.
func TestRemoteMountOverTLS(t *testing.T) {
	src, mp := dirs(t)
	ca, cert, key, err := testca.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, err := httpapi.ServerTLS(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	clientTLS, err := httpapi.ClientTLS(ca)
	if err != nil {
		t.Fatal(err)
	}
	tr := usage.New("instance 40", 4*mib)
	s := startServerOn(t, "", src, tr, nil, serverTLS)
	remote := &Remote{Address: client.TLSScheme + s.addr, Token: testToken, Client: "test-node", NamespaceID: 2, TLS: clientTLS}
	m := mount(t, Spec{MountPath: mp, Logger: quietLogger(t), Remote: remote})
	if err := os.WriteFile(filepath.Join(m.Path(), "f"), []byte("over TLS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(src, "f")); string(got) != "over TLS\n" {
		t.Errorf("the storage node holds %q", got)
	}
	untrusting := *remote
	untrusting.TLS = nil
	_, err = Mount(Spec{MountPath: mp + "-2", Logger: quietLogger(t), Remote: &untrusting})
	if err == nil || !strings.Contains(err.Error(), "tls.ca_file") {
		t.Errorf("a client that does not trust the storage node's CA: %v", err)
	}
}

// A file opened O_DIRECT: aligned reads and writes reach the server, and a shared mapping of
// the file works and stays coherent with them both ways (the kernel writes the mapping's
// pages back before direct I/O and drops them after a direct write), as on a local file
// system. The mapping is used by another process: a page fault this process's FUSE server
// must answer could wait for a garbage collection that waits for the faulting thread.
func TestDirectIOAndSharedMapping(t *testing.T) {
	eachBackend(t, func(t *testing.T, b testBackend) {
		src, mp := dirs(t)
		m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("direct", 1<<30), Logger: quietLogger(t)})
		p := filepath.Join(m.Path(), "direct")
		if err := os.WriteFile(p, bytes.Repeat([]byte{'a'}, directSize), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), directEnv+"="+p)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Fatalf("%v: %s", err, out)
		}
		got, err := os.ReadFile(p)
		if err != nil || len(got) != directSize || got[testStripeSize] != 'b' || got[2*testStripeSize] != 'c' || got[0] != 'a' {
			t.Errorf("read back: %d bytes, %v", len(got), err)
		}
	})
}

// directEnv makes the test binary run directCheck on the file it names.
const directEnv = "SPILLWAY_MOUNT_TEST_DIRECT"

const directSize = 3 * testStripeSize // every stripe server of the striped backends

// directCheck is TestDirectIOAndSharedMapping's other process.
func directCheck(p string) error {
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	if n, err := unix.Pread(fd, buf, testStripeSize-4096); err != nil || n != len(buf) || buf[0] != 'a' || buf[8191] != 'a' {
		return fmt.Errorf("direct read: %d %v %q", n, err, buf[:1])
	}
	mapped, err := unix.Mmap(fd, 0, directSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("a shared mapping of a file opened O_DIRECT: %w", err)
	}
	if mapped[directSize-1] != 'a' {
		return fmt.Errorf("the mapping reads %q", mapped[directSize-1])
	}
	// A direct write (across a stripe boundary) is seen through the mapping...
	copy(buf, bytes.Repeat([]byte{'b'}, len(buf)))
	if n, err := unix.Pwrite(fd, buf, testStripeSize-4096); err != nil || n != len(buf) {
		return fmt.Errorf("direct write: %d %v", n, err)
	}
	if got := string(mapped[testStripeSize-4096 : testStripeSize+4096]); got != strings.Repeat("b", 8192) {
		return fmt.Errorf("the mapping after a direct write reads %q...", got[:8])
	}
	// ...and a store into the mapping by a direct read.
	mapped[2*testStripeSize] = 'c'
	if n, err := unix.Pread(fd, buf[:4096], 2*testStripeSize); err != nil || n != 4096 || buf[0] != 'c' || buf[1] != 'a' {
		return fmt.Errorf("a direct read after a store into the mapping: %d %v %q", n, err, buf[:2])
	}
	return unix.Munmap(mapped)
}
