package controller

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/nodekey"
)

// Security issue 19, item 6: 20 addresses × 64 idle connections held every one of the
// controller's max_connections (each reopened as the server closed it): 10 of 10 requests
// with the admin token were refused, and MUNGE users and libdatawarp on the compute nodes were
// shut out. Now connections that have not authenticated hold at most max_connections −
// reserved_connections slots (max_connections_per_network of them from one /24); past that a
// new connection is admitted on probation and closes a probation connection that has sent
// nothing, and the callers that prove a token or a node key get in.
func TestIdleConnectionsFromManyAddressesCannotShutOutAuthenticatedCallers(t *testing.T) {
	const secret = "conn-test-secret"
	w := newAdminWorld(t, nil)
	srv := NewServer(w.c, secret, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	addr := serveTCP(t, srv, httpapi.Limits{MaxConnections: 64, MaxConnectionsPerPeer: 64,
		MaxConnectionsPerNetwork: 64, ReservedConnections: 16, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})

	// 20 addresses × 4 idle connections: 80, more than max_connections. They stay open on
	// their side (the server closes some; reading them would tell which, and is not needed).
	var idle []net.Conn
	t.Cleanup(func() {
		for _, nc := range idle {
			nc.Close()
		}
	})
	for i := 0; i < 80; i++ {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%20))}, Timeout: 5 * time.Second}
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		idle = append(idle, nc)
	}

	// The server accepts in order: these come after every idle connection.
	// A new connection for each request: each must be admitted.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	call := func(method, path, auth, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", auth)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for i := 0; i < 10; i++ {
		if code, body := call("GET", "/dw/v1/pools", "Bearer "+secret, ""); code != 200 {
			t.Fatalf("request %d with the admin token among 80 idle connections: %d %s", i, code, body)
		}
	}
	if code, body := call("POST", "/dw/v1/nodes/ssd1/heartbeat", "Bearer "+nodekey.Derive(secret, "ssd1"),
		`{"name":"ssd1","pool":"wlm_pool","capacity":4294967296}`); code != 200 {
		t.Fatalf("a heartbeat with the node's key among 80 idle connections: %d %s", code, body)
	}

	// A connection admitted on probation that does not authenticate is answered, then closed.
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write([]byte("GET /dw/v1/pools HTTP/1.1\r\nHost: x\r\n\r\n"))
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(nc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("an unauthenticated request: %d, want 401", resp.StatusCode)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("an unauthenticated request on a probation connection: the connection stayed open (%v)", err)
	}
}

// serveTCP serves srv on a TCP port of 127.0.0.1 with lim until the test ends: its address.
func serveTCP(t *testing.T, srv *Server, lim httpapi.Limits) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ctx, l, lim)
	}()
	t.Cleanup(func() { cancel(); <-served })
	return l.Addr().String()
}
