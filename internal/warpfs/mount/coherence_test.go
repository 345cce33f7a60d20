package mount

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
	"golang.org/x/sys/unix"
)

// A pair of mounts of one namespace, as two compute nodes have it: what one changes, the
// other sees at its next call, with caching on (the default).
type coherencePair struct {
	name    string
	striped bool
	localA  bool // A is the co-located mount (the server in its process)
}

var coherencePairs = []coherencePair{
	{name: "remote+remote"},
	{name: "local+remote", localA: true},
	{name: "striped-remote+remote", striped: true},
}

// startLeaseServer serves target with a lease of lease (0: the default).
func startLeaseServer(t *testing.T, target server.Target, lease time.Duration) string {
	t.Helper()
	addr, _ := startLeaseServerOn(t, "127.0.0.1:0", target, lease)
	return addr
}

// startLeaseServerOn is startLeaseServer on addr; stop stops it (before the test's end).
func startLeaseServerOn(t *testing.T, addr string, target server.Target, lease time.Duration) (string, func()) {
	return startServerHolding(t, addr, target, nil, lease)
}

// startServerHolding is startLeaseServerOn for a server that also holds stripes of the
// instance, as the first fragment's storage node does: sessions of stripes get stripes
// (nil: target, as every test server's).
func startServerHolding(t *testing.T, addr string, target server.Target, stripes *server.Target, lease time.Duration) (string, func()) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Options{Token: testToken, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil)),
		Limits:  server.Limits{Lease: lease},
		Resolve: resolveHolding(target, stripes)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, l); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return l.Addr().String(), stop
}

// mountPair mounts one namespace twice and returns both mount paths.
func mountPair(t *testing.T, p coherencePair, lease time.Duration) (string, string, string) {
	t.Helper()
	src, a, b, _ := mountPairB(t, p, lease)
	return src, a, b
}

// mountPairB is mountPair that also returns mount b.
func mountPairB(t *testing.T, p coherencePair, lease time.Duration) (string, string, string, *Mounted) {
	t.Helper()
	src, mp := dirs(t)
	tr := usage.New("coherence", 1<<30)
	var stripes []Server
	if p.striped {
		l := stripe.Layout{Size: testStripeSize, Width: testStripeServers, Servers: testStripeServers}
		if err := unix.Setxattr(src, server.LayoutXattr, l.Encode(), 0); err != nil {
			t.Fatal(err)
		}
		for _, dir := range stripeDirs(src) {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			addr := startLeaseServer(t, server.Target{Dir: dir, Tracker: tr}, lease)
			stripes = append(stripes, Server{Remote: &Remote{Address: addr, Token: testToken, Client: "n", FragmentID: 1, InstanceID: 3}})
		}
	}
	addr := startLeaseServer(t, server.Target{Dir: src, Tracker: tr}, lease)
	remote := func(client string) *Remote {
		return &Remote{Address: addr, Token: testToken, Client: client, FragmentID: 1, NamespaceID: 1, InstanceID: 3}
	}
	mpA, mpB := mp+"-a", mp+"-b"
	a := Spec{MountPath: mpA, Remote: remote("node-a"), Stripes: stripes, AllowOther: true, Logger: quietLogger(t)}
	if p.localA {
		a = Spec{MountPath: mpA, SourceDir: src, Tracker: tr, AllowOther: true, Logger: quietLogger(t)}
	}
	mount(t, a)
	mb := mount(t, Spec{MountPath: mpB, Remote: remote("node-b"), Stripes: stripes, AllowOther: true, Logger: quietLogger(t)})
	return src, mpA, mpB, mb
}

func TestCoherentCachingAcrossNodes(t *testing.T) {
	for _, p := range coherencePairs {
		t.Run(p.name, func(t *testing.T) {
			_, a, b := mountPair(t, p, 0)
			checkCoherent(t, a, b)
		})
	}
}

// checkCoherent changes the namespace through mount a and checks, after each change, that
// mount b sees it at once — having asked (and so cached) what the change makes stale first.
func checkCoherent(t *testing.T, a, b string) {
	t.Helper()
	missing := func(p string) {
		t.Helper()
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s: %v, want it missing", p, err)
		}
	}
	stat := func(p string) *syscall.Stat_t {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		return &st
	}
	content := func(p, want string) {
		t.Helper()
		got, err := os.ReadFile(p)
		if err != nil || string(got) != want {
			t.Fatalf("%s holds %q (%v), want %q", p, got, err, want)
		}
	}
	write := func(p, data string, flag int) {
		t.Helper()
		f, err := os.OpenFile(p, flag|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(data); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	at := func(root, rel string) string { return filepath.Join(root, rel) }

	// A name b looked up and did not find, made on a.
	missing(at(b, "f"))
	missing(at(b, "f"))
	write(at(a, "f"), "hello", os.O_CREATE|os.O_EXCL)
	if st := stat(at(b, "f")); st.Size != 5 {
		t.Fatalf("b sees f of %d bytes, want 5", st.Size)
	}
	content(at(b, "f"), "hello")

	// Attributes b holds, changed on a.
	stat(at(b, "f"))
	if err := os.Chmod(at(a, "f"), 0o600); err != nil {
		t.Fatal(err)
	}
	if st := stat(at(b, "f")); st.Mode&0o777 != 0o600 {
		t.Fatalf("b sees f with mode %o after a's chmod 600", st.Mode&0o777)
	}
	write(at(a, "f"), " world", os.O_APPEND)
	if st := stat(at(b, "f")); st.Size != 11 {
		t.Fatalf("b sees f of %d bytes after a's append, want 11", st.Size)
	}
	content(at(b, "f"), "hello world")
	write(at(a, "f"), "HELLO", 0) // the same size, other bytes
	content(at(b, "f"), "HELLO world")
	if err := os.Truncate(at(a, "f"), 2); err != nil {
		t.Fatal(err)
	}
	if st := stat(at(b, "f")); st.Size != 2 {
		t.Fatalf("b sees f of %d bytes after a's truncate to 2", st.Size)
	}
	content(at(b, "f"), "HE")

	// Names b holds, renamed and removed on a.
	missing(at(b, "g"))
	if err := os.Rename(at(a, "f"), at(a, "g")); err != nil {
		t.Fatal(err)
	}
	missing(at(b, "f"))
	content(at(b, "g"), "HE")
	if err := os.Remove(at(a, "g")); err != nil {
		t.Fatal(err)
	}
	missing(at(b, "g"))

	// A directory: its entries, its attributes, its renaming.
	if err := os.Mkdir(at(a, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	missing(at(b, "d/x"))
	missing(at(b, "d/y"))
	nlink := stat(at(b, "d")).Nlink
	write(at(a, "d/x"), "x", os.O_CREATE)
	content(at(b, "d/x"), "x")
	if err := os.Mkdir(at(a, "d/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := stat(at(b, "d")).Nlink; got != nlink+1 {
		t.Fatalf("b sees d with %d links after a's mkdir in it, want %d", got, nlink+1)
	}
	names := func(dir string) string {
		t.Helper()
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return fmt.Sprint(out)
	}
	if got := names(at(b, "d")); got != "[sub x]" {
		t.Fatalf("b lists d as %s", got)
	}
	stat(at(b, "d/x"))
	if err := os.Rename(at(a, "d"), at(a, "e")); err != nil {
		t.Fatal(err)
	}
	write(at(a, "e/y"), "y", os.O_CREATE)
	missing(at(b, "d"))
	missing(at(b, "d/x"))
	content(at(b, "e/y"), "y")
	content(at(b, "e/x"), "x")

	// A directory b made: b knows every name in it and answers absent names itself, until a
	// adds one.
	if err := os.Mkdir(at(b, "made"), 0o755); err != nil {
		t.Fatal(err)
	}
	missing(at(b, "made/n"))
	write(at(b, "made/mine"), "m", os.O_CREATE|os.O_EXCL)
	content(at(b, "made/mine"), "m")
	write(at(a, "made/n"), "n", os.O_CREATE|os.O_EXCL)
	content(at(b, "made/n"), "n")
	missing(at(b, "made/other"))
	if err := os.Remove(at(b, "made/mine")); err != nil {
		t.Fatal(err)
	}
	missing(at(b, "made/mine"))
	if err := os.Rename(at(b, "made"), at(b, "moved")); err != nil {
		t.Fatal(err)
	}
	missing(at(b, "moved/late"))
	write(at(a, "moved/late"), "l", os.O_CREATE|os.O_EXCL)
	content(at(b, "moved/late"), "l")

	// And back the other way: what b changes, a sees.
	stat(at(a, "e/y"))
	if err := os.Remove(at(b, "e/y")); err != nil {
		t.Fatal(err)
	}
	missing(at(a, "e/y"))
}

// With caching on, b's repeated stats of names it holds ask the server nothing; a change on
// a still reaches it (checkCoherent). So the caching is real, and coherent.
func TestCachedStatsAskNothing(t *testing.T) {
	scrape := serveMetrics(t)
	for _, p := range coherencePairs {
		t.Run(p.name, func(t *testing.T) {
			_, a, b := mountPair(t, p, 0)
			if err := os.MkdirAll(filepath.Join(a, "x/y"), 0o755); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(b, "x/y/f")
			if err := os.WriteFile(path, []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
			os.Lstat(filepath.Join(b, "x/y/none"))
			asked := func() float64 {
				s := scrape()
				return s.Samples[`spillway_warpfs_requests_total{op="lookup",transport="remote"}`] +
					s.Samples[`spillway_warpfs_requests_total{op="getattr",transport="remote"}`]
			}
			before := asked()
			for i := 0; i < 200; i++ {
				if _, err := os.Lstat(path); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Lstat(filepath.Join(b, "x/y/none")); !errors.Is(err, fs.ErrNotExist) {
					t.Fatal(err)
				}
			}
			if n := asked() - before; n > 20 {
				t.Errorf("400 stats of cached names (found and not) sent %.0f LOOKUP and GETATTR requests", n)
			}
			// In a directory b made, names nobody made are absent without asking.
			if err := os.Mkdir(filepath.Join(b, "fresh"), 0o755); err != nil {
				t.Fatal(err)
			}
			before = asked()
			for i := 0; i < 200; i++ {
				if _, err := os.Lstat(filepath.Join(b, "fresh", fmt.Sprint("n", i))); !errors.Is(err, fs.ErrNotExist) {
					t.Fatal(err)
				}
			}
			if n := asked() - before; n > 20 {
				t.Errorf("200 lookups of different absent names in a directory this mount made sent %.0f requests", n)
			}
		})
	}
}

// A node that holds leases and stops answering (its link cut) holds a change made elsewhere
// back until its leases have run out, never less; then the change goes on.
func TestCutNodeIsWaitedOut(t *testing.T) {
	const lease = 2 * time.Second
	src, mp := dirs(t)
	tr := usage.New("coherence", 1<<30)
	addr := startLeaseServer(t, server.Target{Dir: src, Tracker: tr}, lease)
	proxy := newCutProxy(t, addr)
	mpA, mpB := mp+"-a", mp+"-b"
	mount(t, Spec{MountPath: mpA, Remote: &Remote{Address: addr, Token: testToken, Client: "a", NamespaceID: 1, InstanceID: 3}, Logger: quietLogger(t)})
	mount(t, Spec{MountPath: mpB, Remote: &Remote{Address: proxy.addr, Token: testToken, Client: "b", NamespaceID: 1, InstanceID: 3,
		Limits: client.Limits{KeepaliveInterval: time.Second, RequestTimeout: 3 * time.Second, ConnectTimeout: time.Second}},
		Logger: quietLogger(t)})
	if err := os.WriteFile(filepath.Join(mpA, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(mpB, "f")); err != nil { // b caches f
		t.Fatal(err)
	}
	leased := time.Now()
	proxy.cut()
	if err := os.Chmod(filepath.Join(mpA, "f"), 0o600); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(leased); waited < lease {
		t.Fatalf("a's chmod returned %v after b's lease began; b's kernel may still cache f for %v", waited, lease)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(src, "f"), &st); err != nil || st.Mode&0o777 != 0o600 {
		t.Fatalf("the change did not go on: mode %o, %v", st.Mode&0o777, err)
	}
}

// cutProxy forwards TCP connections to a server until cut, then forwards nothing more in
// either direction and keeps the connections open: a link that stopped carrying packets.
type cutProxy struct {
	addr string
	mu   sync.Mutex
	dead bool
	// delay holds what the client sends back this long before it goes on: a slow link
	// from the client (its requests), not to it.
	delay time.Duration
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{addr: l.Addr().String()}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			go p.pipe(c, s, true)
			go p.pipe(s, c, false)
		}
	}()
	return p
}

func (p *cutProxy) pipe(from, to net.Conn, up bool) {
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if err != nil {
			return
		}
		p.mu.Lock()
		dead, delay := p.dead, p.delay
		p.mu.Unlock()
		if up && delay > 0 {
			time.Sleep(delay)
		}
		if dead {
			continue // dropped on the floor
		}
		if _, err := to.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (p *cutProxy) slow(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	p.dead = true
	p.mu.Unlock()
}

// A storage server restarted under two mounts: what a mount cached before the restart is
// dropped or waited out, never shown stale after another mount's change.
func TestServerRestartKeepsMountsCoherent(t *testing.T) {
	rs := newRestartableServer(t, "coherence")
	mp, addr, limits := rs.mp, rs.addr, rs.limits
	mpA, mpB := mp+"-a", mp+"-b"
	mount(t, Spec{MountPath: mpA, Remote: &Remote{Address: addr, Token: testToken, Client: "a", NamespaceID: 1, InstanceID: 3, Limits: limits}, Logger: quietLogger(t)})
	mount(t, Spec{MountPath: mpB, Remote: &Remote{Address: addr, Token: testToken, Client: "b", NamespaceID: 1, InstanceID: 3, Limits: limits}, Logger: quietLogger(t)})
	a, b := filepath.Join(mpA, "f"), filepath.Join(mpB, "f")
	if err := os.WriteFile(a, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{b, filepath.Join(mpB, "g")} {
		os.Lstat(p) // b caches f, and that g does not exist
	}
	rs.stop()
	rs.start()
	if err := os.Chmod(a, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mpA, "g"), []byte("g"), 0o644); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(b, &st); err != nil || st.Mode&0o777 != 0o600 {
		t.Errorf("after the restart b sees f with mode %o (%v), want 600", st.Mode&0o777, err)
	}
	if _, err := os.Lstat(filepath.Join(mpB, "g")); err != nil {
		t.Errorf("after the restart b does not see g, made by a: %v", err)
	}
}

// Two nodes creating the same names at once, each caching that the other's name is absent:
// each create's reply waits until the other node dropped its cached absence, and that node
// may be inside its own create in the same directory, holding the directory's lock, which
// dropping a name takes. A node answers a notification it cannot carry out at once after a
// short wait (proto.MaxNotifyWait), so neither waits for the other's lease.
func TestCrosswiseCreatesDoNotWaitForLeases(t *testing.T) {
	const lease = time.Minute // a create that waited a lease out would fail (request timeout)
	src, mp := dirs(t)
	addr := startLeaseServer(t, server.Target{Dir: src, Tracker: usage.New("crosswise", 1<<30)}, lease)
	limits := client.Limits{RequestTimeout: 20 * time.Second}
	mpA, mpB := mp+"-a", mp+"-b"
	mount(t, Spec{MountPath: mpA, Remote: &Remote{Address: addr, Token: testToken, Client: "a", NamespaceID: 1, InstanceID: 3, Limits: limits}, Logger: quietLogger(t)})
	mount(t, Spec{MountPath: mpB, Remote: &Remote{Address: addr, Token: testToken, Client: "b", NamespaceID: 1, InstanceID: 3, Limits: limits}, Logger: quietLogger(t)})
	if err := os.Mkdir(filepath.Join(mpA, "shared"), 0o777); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 30; i++ {
		name := fmt.Sprint("shared/n", i)
		for _, m := range []string{mpA, mpB} {
			os.Lstat(filepath.Join(m, name)) // both cache the absence
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for j, m := range []string{mpA, mpB} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f, err := os.OpenFile(filepath.Join(m, name), os.O_CREATE|os.O_WRONLY, 0o644)
				if err == nil {
					err = f.Close()
				}
				errs[j] = err
			}()
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("creating %s from both nodes at once: %v, %v", name, errs[0], errs[1])
		}
	}
}

// A mount that is unmounted caches nothing: another mount's change to what it held does not
// wait for its leases (proto.OpBye). Slurm's post_run unmounts the compute nodes before
// data_out, whose stages change the namespace.
func TestUnmountedMountIsNotWaitedFor(t *testing.T) {
	const lease = time.Minute // a change that waited it out would fail (request timeout)
	for _, p := range []coherencePair{{name: "remote+remote"}, {name: "local+remote", localA: true}} {
		t.Run(p.name, func(t *testing.T) {
			src, mp := dirs(t)
			tr := usage.New("bye", 1<<30)
			addr := startLeaseServer(t, server.Target{Dir: src, Tracker: tr}, lease)
			limits := client.Limits{RequestTimeout: 20 * time.Second}
			a := Spec{MountPath: mp + "-a", Remote: &Remote{Address: addr, Token: testToken, Client: "a", NamespaceID: 1, InstanceID: 3, Limits: limits}, Logger: quietLogger(t)}
			if p.localA {
				a = Spec{MountPath: mp + "-a", SourceDir: src, Tracker: tr, Logger: quietLogger(t), Limits: Limits{Lease: lease}}
			}
			ma, err := Mount(a)
			if err != nil {
				t.Fatal(err)
			}
			mount(t, Spec{MountPath: mp + "-b", Remote: &Remote{Address: addr, Token: testToken, Client: "b", NamespaceID: 1, InstanceID: 3, Limits: limits}, Logger: quietLogger(t)})
			if err := os.WriteFile(filepath.Join(mp+"-a", "f"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			os.Lstat(filepath.Join(mp+"-a", "f"))
			os.Lstat(filepath.Join(mp+"-a", "g"))
			if err := ma.Unmount(); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Join(mp+"-b", "f"), 0o600); err != nil {
				t.Fatalf("a change after the other mount was unmounted: %v", err)
			}
			if err := os.WriteFile(filepath.Join(mp+"-b", "g"), []byte("g"), 0o644); err != nil {
				t.Fatalf("a create after the other mount was unmounted: %v", err)
			}
		})
	}
}

// A directory's attributes that a mount keeps from its own create's or unlink's reply (the
// kernel asks for them after every change of the directory's entries), and the absence of
// security.capability it knows of a file it created, give way to another node's change at
// once: a mkdir, rmdir or chmod of the directory, a capability set on the file.
func TestCachedDirectoryAttributesStayCoherent(t *testing.T) {
	// The co-located mount keeps what its own changes give too (its server in-process):
	// "remote+local" has it keep, and the remote one change.
	pairs := append(coherencePairs[:len(coherencePairs):len(coherencePairs)], coherencePair{name: "remote+local", localA: true})
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			_, a, b := mountPair(t, p, 0)
			if p.name == "remote+local" {
				a, b = b, a
			}
			dirStat := func(mp string) *syscall.Stat_t {
				t.Helper()
				var st syscall.Stat_t
				if err := syscall.Stat(filepath.Join(mp, "d"), &st); err != nil {
					t.Fatal(err)
				}
				return &st
			}
			create := func(mp, name string) {
				t.Helper()
				if err := os.WriteFile(filepath.Join(mp, "d", name), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Mkdir(filepath.Join(b, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
			create(b, "f1") // b keeps d's attributes from its reply
			before := dirStat(b)
			if err := os.Mkdir(filepath.Join(a, "d", "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			if st := dirStat(b); st.Nlink != before.Nlink+1 {
				t.Errorf("after a mkdir on the other node, d has %d links here, want %d", st.Nlink, before.Nlink+1)
			}
			create(b, "f2")
			if err := os.Chmod(filepath.Join(a, "d"), 0o700); err != nil {
				t.Fatal(err)
			}
			if st := dirStat(b); st.Mode&0o777 != 0o700 {
				t.Errorf("after a chmod on the other node, d has mode %o here, want 700", st.Mode&0o777)
			}
			if err := os.Remove(filepath.Join(b, "d", "f2")); err != nil { // kept from the unlink's reply
				t.Fatal(err)
			}
			links := dirStat(b).Nlink
			if err := os.Remove(filepath.Join(a, "d", "sub")); err != nil {
				t.Fatal(err)
			}
			if st := dirStat(b); st.Nlink != links-1 {
				t.Errorf("after an rmdir on the other node, d has %d links here, want %d", st.Nlink, links-1)
			}
			// b's own changes that carry no attributes: its mkdir after its create.
			create(b, "f3")
			links = dirStat(b).Nlink
			if err := os.Mkdir(filepath.Join(b, "d", "sub2"), 0o755); err != nil {
				t.Fatal(err)
			}
			if st := dirStat(b); st.Nlink != links+1 {
				t.Errorf("after its own mkdir, d has %d links here, want %d", st.Nlink, links+1)
			}

			// A file b created has no capability, until the other node sets one.
			capData := []byte{0, 0, 0, 2, 0, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} // v2: CAP_NET_BIND_SERVICE
			capOf := func(mp, name string) ([]byte, error) {
				buf := make([]byte, 64)
				n, err := unix.Getxattr(filepath.Join(mp, "d", name), "security.capability", buf)
				if err != nil {
					return nil, err
				}
				return buf[:n], nil
			}
			for _, setter := range []string{a, b} {
				name := "cap-" + filepath.Base(setter)
				create(b, name)
				f, err := os.OpenFile(filepath.Join(b, "d", name), os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteString("x"); err != nil { // the kernel's first write asks
					t.Fatal(err)
				}
				f.Close()
				if _, err := capOf(b, name); !errors.Is(err, unix.ENODATA) {
					t.Fatalf("%s: security.capability: %v, want ENODATA", name, err)
				}
				if err := unix.Setxattr(filepath.Join(setter, "d", name), "security.capability", capData, 0); err != nil {
					if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPERM) {
						t.Skipf("security.capability cannot be set here: %v", err)
					}
					t.Fatal(err)
				}
				if got, err := capOf(b, name); err != nil || len(got) == 0 {
					t.Errorf("%s: after a capability was set (by %s), security.capability here: %v %v", name, filepath.Base(setter), got, err)
				}
			}
		})
	}
}

// A striped file's attributes that a mount keeps from its own size report (at close) give
// way to every later change: another node's chmod, write and truncate, and this node's own
// truncate, chmod, link and unlink.
func TestReportedAttributesStayCoherent(t *testing.T) {
	for _, p := range coherencePairs {
		t.Run(p.name, func(t *testing.T) {
			_, a, b := mountPair(t, p, 0)
			pb := filepath.Join(b, "f")
			st := func() *syscall.Stat_t {
				t.Helper()
				var st syscall.Stat_t
				if err := syscall.Stat(pb, &st); err != nil {
					t.Fatal(err)
				}
				return &st
			}
			write := func(p string, size int) {
				t.Helper()
				f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt(make([]byte, size), 0); err != nil {
					t.Fatal(err)
				}
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
			}
			check := func(what string, size int64, mode uint32, nlink uint64) {
				t.Helper()
				s := st()
				if s.Size != size || s.Mode&0o777 != mode || uint64(s.Nlink) != nlink {
					t.Errorf("after %s: size %d mode %o links %d here, want %d %o %d", what, s.Size, s.Mode&0o777, s.Nlink, size, mode, nlink)
				}
			}
			write(pb, 100) // b keeps f's attributes from its size report
			check("its own write", 100, 0o644, 1)
			if err := os.Chmod(filepath.Join(a, "f"), 0o600); err != nil {
				t.Fatal(err)
			}
			check("a chmod on the other node", 100, 0o600, 1)
			write(pb, 200)
			write(filepath.Join(a, "f"), 300)
			check("a write on the other node", 300, 0o600, 1)
			write(pb, 400)
			if err := os.Truncate(filepath.Join(a, "f"), 50); err != nil {
				t.Fatal(err)
			}
			check("a truncate on the other node", 50, 0o600, 1)
			write(pb, 500)
			if err := os.Truncate(pb, 10); err != nil {
				t.Fatal(err)
			}
			check("its own truncate", 10, 0o600, 1)
			write(pb, 600)
			if err := os.Chmod(pb, 0o640); err != nil {
				t.Fatal(err)
			}
			check("its own chmod", 600, 0o640, 1)
			// The kernel took the chmod's reply; a write drops it again, and the next stat
			// asks the mount, which must not answer from the report before the chmod.
			if err := os.Chmod(pb, 0o660); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(pb, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte{1}, 0); err != nil {
				t.Fatal(err)
			}
			check("its own chmod and a write", 600, 0o660, 1)
			f.Close()
			if err := os.Chmod(pb, 0o640); err != nil {
				t.Fatal(err)
			}
			write(pb, 700)
			if err := os.Link(pb, filepath.Join(b, "g")); errors.Is(err, unix.EPERM) && p.striped {
				return // a striped file has one name
			} else if err != nil {
				t.Fatal(err)
			}
			check("its own link", 700, 0o640, 2)
			write(pb, 800)
			if err := os.Remove(filepath.Join(b, "g")); err != nil {
				t.Fatal(err)
			}
			check("its own unlink of the other name", 800, 0o640, 1)
		})
	}
}

// The namespace root's attributes, cached on one node (its own mkdir there gave them, or a
// stat), give way to another node's mkdir in the root at once, as any directory's.
func TestRootAttributesStayCoherent(t *testing.T) {
	for _, p := range coherencePairs {
		t.Run(p.name, func(t *testing.T) {
			_, a, b := mountPair(t, p, 0)
			links := func() uint64 {
				t.Helper()
				var st syscall.Stat_t
				if err := syscall.Stat(b, &st); err != nil {
					t.Fatal(err)
				}
				return uint64(st.Nlink)
			}
			for i, maker := range []string{"", b} {
				if maker != "" {
					if err := os.Mkdir(filepath.Join(maker, fmt.Sprintf("own%d", i)), 0o755); err != nil {
						t.Fatal(err)
					}
				}
				before := links()
				if err := os.Mkdir(filepath.Join(a, fmt.Sprintf("other%d", i)), 0o755); err != nil {
					t.Fatal(err)
				}
				if got := links(); got != before+1 {
					t.Errorf("after a mkdir in the root on the other node, the root has %d links here, want %d", got, before+1)
				}
			}
		})
	}
}

// restartableServer is a leasing storage server (a 2 s lease) on a source directory of its
// own, which a test stops and starts again at the same address, and the client limits under
// which a mount notices the restart quickly.
type restartableServer struct {
	t             *testing.T
	src, mp, addr string
	target        server.Target
	stripes       *server.Target // the first stripe server's, when it holds one (newRestartableServerHolding)
	limits        client.Limits
	stop          func()
}

func newRestartableServer(t *testing.T, name string) *restartableServer {
	t.Helper()
	src, mp := dirs(t)
	rs := &restartableServer{t: t, src: src, mp: mp, target: server.Target{Dir: src, Tracker: usage.New(name, 1<<30)},
		limits: client.Limits{KeepaliveInterval: 300 * time.Millisecond, ReconnectWait: 50 * time.Millisecond, RequestTimeout: 20 * time.Second}}
	rs.addr, rs.stop = startLeaseServerOn(t, "127.0.0.1:0", rs.target, restartLease)
	return rs
}

// newRestartableServerHolding is newRestartableServer for a metadata server that is also the
// instance's first stripe server (createPair mounts it so), as the first fragment's storage
// node is: files created behind and closed at once are placed whole there.
func newRestartableServerHolding(t *testing.T, name string) *restartableServer {
	t.Helper()
	rs := newRestartableServer(t, name)
	rs.stop()
	rs.stripes = &server.Target{Dir: stripeDirs(rs.src)[0], Tracker: rs.target.Tracker}
	if err := os.MkdirAll(rs.stripes.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rs.start()
	return rs
}

// restartLease is a restartable server's lease.
const restartLease = 2 * time.Second

// start starts the server again at its address (after stop).
func (rs *restartableServer) start() {
	_, rs.stop = startServerHolding(rs.t, rs.addr, rs.target, rs.stripes, restartLease)
}
