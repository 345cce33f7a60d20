package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agent"
	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/agentclient"
	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/sqlite"
	"github.com/spillway-hpc/spillway/internal/views"
)

// lockedBuffer is a log written by the executor's goroutines and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// remoteRig is a real controller that calls storage node ssd1's real agent over HTTP, as
// `spillway controller` does (agentclient), at the address ssd1 advertises: address(url)
// makes it from the URL where the agent really serves. The controller presents
// controllerToken; the agent expects "node-secret".
type remoteRig struct {
	acctRig
	log *lockedBuffer
}

func newRemoteRig(t *testing.T, controllerToken string, address func(url string) string) *remoteRig {
	t.Helper()
	cfg := config.Defaults()
	cfg.Controller.StateDir = t.TempDir()
	cfg.Pools = []config.Pool{{Name: "wlm_pool", Granularity: config.Size(1 << 20)}}
	cfg.Controller.AutoDrainFailures = 3
	cfg.Executor.MaxAttempts = 20
	cfg.Executor.RetryBackoff = config.Duration(time.Millisecond)
	cfg.Executor.RetryBackoffMax = config.Duration(time.Millisecond)
	cfg.Executor.AgentTimeout = config.Duration(5 * time.Second)
	eng, err := sqlite.Open(filepath.Join(cfg.Controller.StateDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(eng)
	t.Cleanup(func() { st.Close() })
	buf := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(buf, nil))
	dial := func(n *model.Node) (agentapi.Agent, error) {
		return agentclient.New(n.Name, n.Address, apiclient.Options{Token: controllerToken, ConnectRetries: 1, RequestTimeout: cfg.Executor.AgentTimeout.D()})
	}
	c, err := New(cfg, st, dial, log)
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ag, err := agent.New(agent.Options{Name: "ssd1", Pool: "wlm_pool", SSDPath: t.TempDir(), Capacity: 1 << 30, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ag.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		agent.Serve(ctx, l, ag, "node-secret", httpapi.Limits{RequestTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxConnections: 64, MaxConnectionsPerPeer: 64, MaxConnectionsPerNetwork: 64, ReservedConnections: 8, Log: quiet})
	}()
	t.Cleanup(func() { cancel(); <-done })
	r := &remoteRig{acctRig: acctRig{t: t, cfg: cfg, c: c, st: st, agent: ag}, log: buf}
	rep, err := ag.Report(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rep.Address = address("http://" + l.Addr().String())
	if _, err := c.Heartbeat(context.Background(), rep); err != nil {
		t.Fatal(err)
	}
	return r
}

// failUntil runs the executor until the job's fragment creation failed at least n times
// (counted in the controller's log) or the node was drained.
func (r *remoteRig) failUntil(n int) *model.Node {
	r.t.Helper()
	for range 500 {
		r.c.RunOnce(context.Background())
		node := r.node()
		if node.Drain || strings.Count(r.log.String(), "op=create-fragment") >= n {
			return node
		}
		time.Sleep(2 * time.Millisecond)
	}
	r.t.Fatalf("the fragment's creation did not fail %d times; log:\n%s", n, r.log.String())
	return nil
}

// issue 23 item 4: an agent that advertised its bare listen address (127.0.0.1:17711) was
// dialled as a Unix socket; the error blamed "the Spillway controller", and the failures
// auto-drained the node. A configuration problem is not the node's fault.
func TestMisaddressedAgentIsNotAutoDrained(t *testing.T) {
	for name, address := range map[string]func(string) string{
		"bare host:port":       func(u string) string { return strings.TrimPrefix(u, "http://") },
		"missing Unix socket":  func(string) string { return "unix:" + filepath.Join(t.TempDir(), "agent.sock") },
		"refused credentials":  func(u string) string { return u },
		"https to a plain one": func(u string) string { return strings.Replace(u, "http://", "https://", 1) },
	} {
		t.Run(name, func(t *testing.T) {
			token := "node-secret"
			if name == "refused credentials" {
				token = "another-cluster's"
			}
			r := newRemoteRig(t, token, address)
			r.job("4242")
			n := r.failUntil(6) // twice auto_drain_failures
			if n.Drain || n.AutoDrained || len(n.Failures) != 0 {
				t.Fatalf("a configuration problem counted against ssd1: drain %v, auto-drained %v, %q, failures %+v", n.Drain, n.AutoDrained, n.Reason, n.Failures)
			}
			log := r.log.String()
			if strings.Contains(log, "Spillway controller") {
				t.Fatalf("an agent's error blames the controller:\n%s", log)
			}
			if !strings.Contains(log, "not counted against the node") {
				t.Fatalf("the log does not say the failure was not counted:\n%s", log)
			}
			if !strings.Contains(log, "node ssd1") {
				t.Fatalf("the error does not name the agent's node:\n%s", log)
			}
		})
	}
}

// The node's own faults still count: its agent does not answer at a correct address.
func TestUnansweringAgentIsAutoDrained(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	r := newRemoteRig(t, "node-secret", func(string) string { return closed })
	r.job("4242")
	n := r.failUntil(20)
	if !n.Drain || !n.AutoDrained || !strings.HasPrefix(n.Reason, "auto-drained: 3 failures in 10m: create-fragment: cannot reach the Spillway agent of node ssd1 at "+closed) {
		t.Fatalf("an agent refusing connections at its address is not auto-drained: drain %v, auto-drained %v, %q", n.Drain, n.AutoDrained, n.Reason)
	}
}

// And a correctly addressed agent works.
func TestRemoteAgentCreatesTheFragment(t *testing.T) {
	r := newRemoteRig(t, "node-secret", func(u string) string { return u })
	r.job("4242")
	r.settle("4242", "setup")
	if n := r.node(); n.Drain || len(n.Failures) != 0 {
		t.Fatalf("node %+v", n)
	}
}

// issue 23 item 5: a compute-only agent with agent.data_listen starts without it and says so
// in its heartbeats: dwstat nodes shows it as the node's reason, the controller logs it.
func TestAgentConfigurationWarningShowsInNodes(t *testing.T) {
	r := newAcctRig(t)
	buf := &lockedBuffer{}
	r.c.log = slog.New(slog.NewTextHandler(buf, nil))
	warning := `agent.data_listen "0.0.0.0:7702" is set on a compute-only node (agent.pool is empty): it has no namespaces to serve, so it serves none; remove agent.data_listen from this node's configuration`
	cn, err := agent.New(agent.Options{Name: "cn1", SSDPath: t.TempDir(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Warnings: []string{warning}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cn.Close() })
	rep, err := cn.Report(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.c.Heartbeat(context.Background(), rep); err != nil {
		t.Fatal(err)
	}
	code, body := r.get("/dw/v1/all", 0)
	var all views.All
	if err := json.Unmarshal(body, &all); code != 200 || err != nil {
		t.Fatalf("%d %s %v", code, body, err)
	}
	var seen bool
	for _, n := range all.Nodes {
		if n.ID == "cn1" {
			seen = true
			if n.Reason != "agent configuration: "+warning || len(n.Warnings) != 1 || !n.Online {
				t.Fatalf("cn1: online %v, reason %q, warnings %q", n.Online, n.Reason, n.Warnings)
			}
		}
	}
	if !seen {
		t.Fatalf("cn1 is not listed: %s", body)
	}
	if log := buf.String(); !strings.Contains(log, "node reports a configuration problem") || !strings.Contains(log, "node=cn1") {
		t.Fatalf("the controller's log does not say it:\n%s", log)
	}
}
