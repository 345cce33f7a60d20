// Package metrics is what the controller and the agents share for their Prometheus metrics
// (docs/admin.md, "Metrics"): a registry per daemon with the Go runtime's and the process's
// own metrics, the /metrics handler, its listener (controller.metrics_listen,
// agent.metrics_listen), and the buckets of the latency histograms.
//
// Each daemon registers its own collectors in its registry; nothing goes to Prometheus'
// global default registry, so a controller and an agent in one process (spillway run's home,
// the tests) keep their metrics apart.
package metrics

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spillway-hpc/spillway/internal/httpapi"
)

// Namespace prefixes every Spillway metric.
const Namespace = "spillway"

// NewRegistry is a daemon's registry, holding the Go runtime's (go_...) and the process's
// (process_...) metrics.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// RequestBuckets are the buckets of the data path's latency histograms, in seconds: 10 µs
// (a lookup answered from the page cache) to about 40 s (past warpfs.request_timeout).
var RequestBuckets = prometheus.ExponentialBuckets(10e-6, 4, 12)

// EffectBuckets are the buckets of the executor's effect durations and the stages'
// durations, in seconds: 1 ms to about 9 h.
var EffectBuckets = prometheus.ExponentialBuckets(1e-3, 4, 13)

// Handler serves the registry's metrics in Prometheus' text format (or OpenMetrics, when
// the scraper asks for it). Concurrent scrapes are bounded by the listener's connection
// limits (Serve).
func Handler(r *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	return mux
}

// Listen opens a daemon's metrics address (metrics_listen): host:port, over TLS when the
// host has a certificate ([tls]), as its API.
func Listen(address string, serverTLS *tls.Config) (net.Listener, error) {
	return httpapi.Listen(address, serverTLS)
}

// Serve serves the registry's /metrics on l until ctx ends, within the API's connection
// limits. Nothing else is served there, and it asks for no credential: Prometheus scrapes
// without one (docs/security.md).
func Serve(ctx context.Context, l net.Listener, r *prometheus.Registry, lim httpapi.Limits) error {
	err := httpapi.Serve(ctx, l, Handler(r), lim)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
