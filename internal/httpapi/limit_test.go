package httpapi

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// The limit listener's accounting: unproven connections past max_connections −
// reserved_connections, or past max_connections_per_network from one /24, go on probation;
// when every slot is taken a new connection closes a probation connection that sent nothing,
// of the network holding the most; an authenticated request proves its connection; and every
// slot comes back when the connections close.
func TestLimitListenerReservesSlotsForAuthenticatedCallers(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := Limits{MaxConnections: 8, MaxConnectionsPerNetwork: 3, ReservedConnections: 2, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ll := LimitListener(raw, lim).(*limitListener)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "yes" {
			Authenticated(w, r)
			return
		}
		WriteError(w, http.StatusUnauthorized, "unauthorized", "no")
	})
	srv := NewServer(h, lim)
	done := make(chan struct{})
	go func() { srv.Serve(ll); close(done) }()
	t.Cleanup(func() { srv.Shutdown(context.Background()); <-done })
	addr := raw.Addr().String()
	state := func() (total, unproven, probation int) {
		ll.mu.Lock()
		defer ll.mu.Unlock()
		return ll.total, ll.unproven, len(ll.probation)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				total, unproven, probation := state()
				t.Fatalf("timed out waiting for %s: total %d, unproven %d, probation %d", what, total, unproven, probation)
			}
		}
	}
	dial := func(ip net.IP) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 5 * time.Second}
		nc, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return nc
	}
	var idle []net.Conn
	for i := 0; i < 8; i++ { // one network: 3 unproven, 5 on probation
		idle = append(idle, dial(net.IPv4(127, 0, 0, byte(2+i))))
	}
	waitFor("8 idle connections admitted", func() bool { t, u, p := state(); return t == 8 && u == 3 && p == 5 })
	// Another network: it closes one of the first network's probation connections, and
	// is not on probation itself (its network has none unproven, and 3 < 8 − 2).
	other := dial(net.IPv4(127, 0, 1, 1))
	waitFor("a connection from another network admitted", func() bool { t, u, p := state(); return t == 8 && u == 4 && p == 4 })
	// An authenticated request proves its connection, which stays open.
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 99)}}).DialContext(ctx, "tcp", addr)
	}}}
	defer client.CloseIdleConnections()
	req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
	req.Header.Set("Authorization", "yes")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Errorf("an authenticated request on probation: %d, close %v; want 200 and the connection kept", resp.StatusCode, resp.Close)
	}
	waitFor("the proven connection to leave the unproven ones", func() bool { t, u, p := state(); return t == 8 && u == 4 && p == 3 })
	// Everything closed: every slot back.
	for _, nc := range idle {
		nc.Close()
	}
	other.Close()
	client.CloseIdleConnections()
	waitFor("every slot back", func() bool { t, u, p := state(); return t == 0 && u == 0 && p == 0 })
	ll.mu.Lock()
	if len(ll.perPeer) != 0 || len(ll.perNet) != 0 {
		t.Errorf("after every connection closed: per peer %v, per network %v", ll.perPeer, ll.perNet)
	}
	ll.mu.Unlock()
}
