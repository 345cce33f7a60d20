package embedded

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/config"
)

// TestHomeServesMetrics: a home's server (spillway run's embedded default) serves GET
// /metrics on its socket, with the names the daemons use on their metrics_listen addresses:
// the controller's, the agent's and the data path's, and the process's once. Issue 23 item 20.
func TestHomeServesMetrics(t *testing.T) {
	base, err := os.MkdirTemp("", "home-metrics-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	dir := filepath.Join(base, "h")
	h, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	h.Config.Home.IdleTimeout = config.Duration(time.Minute)
	h.Config.Home.ReapInterval = config.Duration(100 * time.Millisecond)
	served := make(chan error, 1)
	go func() { served <- h.Serve(slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil) }()
	t.Cleanup(func() {
		// A home whose directory is gone stops its server (homeGone).
		os.Rename(dir, dir+".gone")
		select {
		case <-served:
		case <-time.After(30 * time.Second):
			t.Error("the home's server did not stop")
		}
	})

	socket := h.Config.Controller.Socket
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get("http://home/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("GET /metrics on the home's socket: %s\n%s", resp.Status, b)
			}
			body = string(b)
			break
		}
		select {
		case err := <-served:
			t.Fatalf("the home's server ended: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer on %s: %v", socket, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, name := range []string{
		"spillway_executor_passes_total",     // the controller's
		"spillway_agent_capacity_bytes",      // the agent's
		"spillway_warpfs_requests_in_flight", // the data path's
		"go_goroutines", "process_cpu_seconds_total",
	} {
		if !strings.Contains(body, "\n"+name+" ") && !strings.Contains(body, "\n"+name+"{") {
			t.Errorf("no %s in the home's /metrics", name)
		}
	}
	if n := strings.Count(body, "# TYPE go_goroutines "); n != 1 {
		t.Errorf("go_goroutines is described %d times, want once (one process)", n)
	}
	// The API is still served beside it.
	resp, err := client.Get("http://home/dw/v1/pools")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		t.Errorf("the home's API is no longer served: GET /dw/v1/pools: %s", resp.Status)
	}
}
