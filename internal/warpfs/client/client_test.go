package client

import (
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

const token = "client-test-token"

// relay forwards TCP connections to a real server and can freeze: bytes stop moving both
// ways, as when the storage host vanishes from the network without closing anything.
type relay struct {
	l        net.Listener
	upstream string

	mu     sync.Mutex
	frozen bool
	thaw   *sync.Cond
	conns  []net.Conn
}

func newRelay(t *testing.T, upstream string) *relay {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{l: l, upstream: upstream}
	r.thaw = sync.NewCond(&r.mu)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go r.serve(c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		r.setFrozen(false)
		r.mu.Lock()
		for _, c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
	})
	return r
}

func (r *relay) setFrozen(f bool) {
	r.mu.Lock()
	r.frozen = f
	r.mu.Unlock()
	r.thaw.Broadcast()
}

// kill closes the relay's listener and connections: connecting to it is refused, as to a
// storage node whose agent died.
func (r *relay) kill() {
	r.l.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
}

func (r *relay) wait() {
	r.mu.Lock()
	for r.frozen {
		r.thaw.Wait()
	}
	r.mu.Unlock()
}

func (r *relay) serve(down net.Conn) {
	r.wait()
	up, err := net.Dial("tcp", r.upstream)
	if err != nil {
		down.Close()
		return
	}
	r.mu.Lock()
	r.conns = append(r.conns, down, up)
	r.mu.Unlock()
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			r.wait()
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		dst.Close()
		src.Close()
	}
	go pipe(up, down)
	go pipe(down, up)
}

func startServer(t *testing.T) string {
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Options{Token: token, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Resolve: func(f, n, i int64, stripes bool) (server.Target, error) {
			return server.Target{Dir: dir, Tracker: usage.New("instance 1", 1<<20)}, nil
		}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, l); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l.Addr().String()
}

func statfs(c *Client) syscall.Errno {
	return c.Do(context.Background(), &Call{Op: proto.OpStatfs, Req: &proto.Empty{}, Reply: &proto.StatfsReply{}})
}

// A storage host that goes silent (no reset, no answer): a request fails with EIO within the
// request timeout, the quiet connection is closed by the keepalive, and once the host answers
// again the client reconnects by itself.
func TestSilentStorageNode(t *testing.T) {
	r := newRelay(t, startServer(t))
	var logs strings.Builder
	var logMu sync.Mutex
	lim := Limits{RequestTimeout: 600 * time.Millisecond, KeepaliveInterval: 200 * time.Millisecond,
		ConnectTimeout: 300 * time.Millisecond, ReconnectWait: 50 * time.Millisecond}
	c, err := Dial(context.Background(), Options{Address: r.l.Addr().String(), Token: token, Client: "test", Limits: lim,
		Log: log.New(writerFunc(func(p []byte) (int, error) {
			logMu.Lock()
			defer logMu.Unlock()
			return logs.Write(p)
		}), "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if errno := statfs(c); errno != 0 {
		t.Fatalf("statfs through the relay: %v", errno)
	}

	r.setFrozen(true)
	start := time.Now()
	errno := statfs(c)
	if errno != syscall.EIO {
		t.Errorf("a request to a silent node: %v, want EIO", errno)
	}
	if took := time.Since(start); took > lim.RequestTimeout+300*time.Millisecond {
		t.Errorf("the request failed after %s; the timeout is %s", took, lim.RequestTimeout)
	}
	// The keepalive notices and closes the connection.
	deadline := time.Now().Add(3 * time.Second)
	for {
		c.mu.Lock()
		dead := c.cur.dead()
		c.mu.Unlock()
		if dead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the keepalive did not close the silent connection")
		}
		time.Sleep(20 * time.Millisecond)
	}

	r.setFrozen(false)
	if errno := statfs(c); errno != 0 {
		t.Errorf("after the node answers again: %v", errno)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logs.String(), "did not answer a ping") || !strings.Contains(logs.String(), "reconnected") {
		t.Errorf("the client's log:\n%s", logs.String())
	}
}

// A storage node that refuses connections (its agent died) fails requests with EIO at once,
// not after the request timeout (a minute here): the request's own context is the bound.
func TestRefusingStorageNodeFailsAtOnce(t *testing.T) {
	r := newRelay(t, startServer(t))
	lim := Limits{RequestTimeout: time.Minute, KeepaliveInterval: 200 * time.Millisecond, ReconnectWait: 50 * time.Millisecond}
	c, err := Dial(context.Background(), Options{Address: r.l.Addr().String(), Token: token, Client: "test", Limits: lim,
		Log: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if errno := statfs(c); errno != 0 {
		t.Fatalf("statfs through the relay: %v", errno)
	}
	r.kill()
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		errno := c.Do(ctx, &Call{Op: proto.OpStatfs, Req: &proto.Empty{}, Reply: &proto.StatfsReply{}})
		if ctx.Err() != nil {
			t.Errorf("request %d to a node refusing connections waited 10s", i+1)
		}
		cancel()
		if errno != syscall.EIO {
			t.Errorf("request %d to a node refusing connections: %v, want EIO", i+1, errno)
		}
	}
}

// Requests beyond the in-flight limit wait for a slot, within their timeout.
func TestInFlightLimit(t *testing.T) {
	addr := startServer(t)
	c, err := Dial(context.Background(), Options{Address: addr, Token: token, Limits: Limits{MaxInFlight: 2},
		Log: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	errs := make(chan syscall.Errno, 50)
	for range 50 {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- statfs(c) }()
	}
	wg.Wait()
	close(errs)
	for errno := range errs {
		if errno != 0 {
			t.Errorf("a request under the in-flight limit: %v", errno)
		}
	}
	if len(c.sem) != 0 {
		t.Errorf("%d slots still taken", len(c.sem))
	}
}

func TestDialRefusals(t *testing.T) {
	addr := startServer(t)
	_, err := Dial(context.Background(), Options{Address: addr, Token: "wrong", Log: log.New(io.Discard, "", 0)})
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Errno != syscall.EACCES {
		t.Errorf("a wrong token: %v", err)
	}
	// Nothing listens there (a port just released).
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	free := l.Addr().String()
	l.Close()
	start := time.Now()
	if _, err := Dial(context.Background(), Options{Address: free, Token: token, Limits: Limits{ConnectTimeout: time.Second}}); err == nil {
		t.Error("dialing nothing worked")
	}
	if time.Since(start) > 2*time.Second {
		t.Error("a refused connection took longer than the connect timeout")
	}
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
