package mount

import (
	"bytes"
	"context"
	"crypto/rand"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/metrics"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// serveMetrics serves the data path's metrics on a loopback port for the test, as an
// agent's metrics_listen does, and returns a function that scrapes them.
func serveMetrics(t *testing.T) func() metrics.Scrape {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(server.Collectors()...)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { metrics.Serve(ctx, l, reg, httpapi.Limits{}); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	url := "http://" + l.Addr().String() + "/metrics"
	return func() metrics.Scrape {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		s, err := metrics.Parse(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
}

// The data path's byte counters match what a process wrote and read through a mount, within
// 1%, on the co-located path (transport local), across the network (remote) and striped over
// three remote servers; each WRITE request is timed.
func TestDataPathMetricsCountWhatAMountMoved(t *testing.T) {
	scrape := serveMetrics(t)
	for _, b := range backends {
		if b.name != "local" && b.name != "remote" && b.name != "striped-remote" {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			if b.striped && os.Geteuid() != 0 {
				t.Skip("a striped namespace's layout is a trusted extended attribute: root only")
			}
			src, mp := dirs(t)
			b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("metrics", 1<<30), Logger: quietLogger(t)})
			transport := `transport="local"`
			if b.remote {
				transport = `transport="remote"`
			}
			value := func(s metrics.Scrape, sample string) float64 {
				v, ok := s.Samples[sample]
				if !ok {
					t.Fatalf("no sample %s", sample)
				}
				return v
			}
			before := scrape()
			const n = 24<<20 + 777
			data := make([]byte, n)
			rand.Read(data)
			path := filepath.Join(mp, "f")
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes, %v", len(got), err)
			}
			after := scrape()
			delta := func(sample string) float64 { return value(after, sample) - value(before, sample) }
			for _, metric := range []string{"spillway_warpfs_written_bytes_total", "spillway_warpfs_read_bytes_total"} {
				d := delta(metric + "{" + transport + "}")
				if math.Abs(d-n) > n/100 {
					t.Errorf("%s{%s} grew by %.0f for %d bytes moved", metric, transport, d, n)
				} else {
					t.Logf("%s{%s} grew by %.0f for %d bytes moved", metric, transport, d, n)
				}
			}
			// A striped file's first write to each object is a WRITE_NAME (it creates it).
			writes := delta(`spillway_warpfs_requests_total{op="write",`+transport+`}`) +
				delta(`spillway_warpfs_requests_total{op="write_name",`+transport+`}`)
			timed := delta(`spillway_warpfs_request_duration_seconds_count{op="write"}`) +
				delta(`spillway_warpfs_request_duration_seconds_count{op="write_name"}`)
			if writes < n/(1<<20) || timed != writes {
				t.Errorf("%.0f WRITE requests counted, %.0f timed, for %d bytes", writes, timed, n)
			}
			if v := value(after, `spillway_warpfs_requests_in_flight`); v != 0 {
				t.Errorf("%v requests in flight after the I/O ended", v)
			}
		})
	}
}
