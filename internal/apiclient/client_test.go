package apiclient

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/httpapi"
)

// controllers is a set of fake controllers on 127.0.0.1 that lead or follow, and what each
// was asked.
type controllers struct {
	mu     sync.Mutex
	leader string
	asked  map[string][]string // base URL -> "METHOD path" in order
	auth   map[string][]string // base URL -> Authorization headers seen
}

func (cs *controllers) start(t *testing.T) string {
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cs.mu.Lock()
		me, leader := srv.URL, cs.leader
		cs.asked[me] = append(cs.asked[me], r.Method+" "+r.URL.Path)
		cs.auth[me] = append(cs.auth[me], r.Header.Get("Authorization"))
		cs.mu.Unlock()
		if r.Method != http.MethodGet && me != leader {
			w.Header().Set(controllerapi.LeaderHeader, leader)
			httpapi.WriteError(w, http.StatusServiceUnavailable, "not_leader", "not the leader")
			return
		}
		httpapi.WriteJSON(w, 200, map[string]string{"from": me})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// deadAddress is a TCP address nothing listens on.
func deadAddress(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

// TestSeveralControllersFindTheLeader: given a follower, a dead controller and the leader, a
// write reaches the leader the follower names, and the client keeps to it; reads are answered
// by whichever answers first; after a failover the next write finds the new leader. Every
// request carries the client's own credential, to listed controllers only.
func TestSeveralControllersFindTheLeader(t *testing.T) {
	cs := &controllers{asked: map[string][]string{}, auth: map[string][]string{}}
	follower, leader := cs.start(t), cs.start(t)
	dead := deadAddress(t)
	cs.leader = leader
	c, err := New(strings.Join([]string{follower, dead, leader}, " , "), Options{Token: "tok", ConnectRetries: 3, RetryWait: 10 * time.Millisecond, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var got map[string]string
	if err := c.Do(ctx, "GET", "/dw/v1/all", nil, &got); err != nil || got["from"] != follower {
		t.Fatalf("a read: %v from %s, want the first listed (%s)", err, got["from"], follower)
	}
	if err := c.Do(ctx, "POST", "/dw/v1/sessions", map[string]string{}, &got); err != nil || got["from"] != leader {
		t.Fatalf("a write: %v from %s, want the leader (%s)", err, got["from"], leader)
	}
	if c.Current() != leader {
		t.Fatalf("the client keeps to %s, want the leader", c.Current())
	}
	if err := c.Do(ctx, "GET", "/dw/v1/all", nil, &got); err != nil || got["from"] != leader {
		t.Fatalf("a read after the write: %v from %s, want the leader", err, got["from"])
	}
	// The leader named by the follower was tried straight after it: the dead one was not.
	cs.mu.Lock()
	if n := len(cs.asked[follower]); n != 2 {
		t.Errorf("the follower was asked %d times, want 2: %v", n, cs.asked[follower])
	}
	cs.leader = follower // failover
	cs.mu.Unlock()
	if err := c.Do(ctx, "POST", "/dw/v1/sessions", map[string]string{}, &got); err != nil || got["from"] != follower {
		t.Fatalf("a write after the failover: %v from %s, want the new leader (%s)", err, got["from"], follower)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for base, auths := range cs.auth {
		for _, a := range auths {
			if a != "Bearer tok" {
				t.Errorf("%s was sent Authorization %q", base, a)
			}
		}
	}
}

// TestNoLeaderSaysSo: when every controller follows (an election under way) the client tries
// again client.connect_retries times, then returns their answer.
func TestNoLeaderSaysSo(t *testing.T) {
	cs := &controllers{asked: map[string][]string{}, auth: map[string][]string{}}
	a, b := cs.start(t), cs.start(t)
	cs.leader = ""
	c, err := New(a+","+b, Options{ConnectRetries: 2, RetryWait: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Do(context.Background(), "POST", "/dw/v1/sessions", map[string]string{}, nil)
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Kind != "not_leader" {
		t.Fatalf("err = %v, want the controllers' not_leader", err)
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(cs.asked[a]) != 2 || len(cs.asked[b]) != 2 {
		t.Fatalf("asked %v, want each controller twice", cs.asked)
	}
}
