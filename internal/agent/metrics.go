package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-hpc/spillway/internal/metrics"
	"github.com/spillway-hpc/spillway/internal/stage"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
)

// Metrics is the agent's metrics registry (served on agent.metrics_listen, docs/admin.md):
// the node's storage (capacity, what fragments hold, what their files use, the SSD path's
// file system), its mounts and stage workers, computed when scraped, and the data path's
// counters (package server). A scrape costs one read of the fragment directory and of each
// fragment's record, and one statfs: bounded by the fragments on the node.
func (a *Agent) Metrics() *prometheus.Registry {
	r := metrics.NewRegistry()
	r.MustRegister(server.Collectors()...)
	r.MustRegister(newAgentCollector(a))
	return r
}

type agentCollector struct {
	a *Agent

	capacity, allocated, used, fragments, ssdSize, ssdFree, mounts, stageWorkers, stageRuns, connections *prometheus.Desc
	workerProcesses, workersStuck, workersIdle                                                           *prometheus.Desc
	// Cache fragments' stores (issue 20), by fragment and instance.
	cachePFSRead, cachePFSWritten, cacheHits, cacheMisses, cacheEvictions, cacheFlushErrors, cacheDirty, cacheUsed *prometheus.Desc
}

func newAgentCollector(a *Agent) *agentCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(metrics.Namespace, "agent", name), help, labels, nil)
	}
	return &agentCollector{a: a,
		capacity:        d("capacity_bytes", "Bytes this storage node offers to its pool (agent.capacity)."),
		allocated:       d("allocated_bytes", "Capacity of the fragments on this node."),
		used:            d("used_bytes", "Bytes the files of the instances on this node use, as the agent counts them against their capacity (instances mounted or staged since the agent started)."),
		fragments:       d("fragments", "Fragments on this node."),
		ssdSize:         d("ssd_size_bytes", "Size of the file system holding agent.ssd_path."),
		ssdFree:         d("ssd_free_bytes", "Free bytes of the file system holding agent.ssd_path."),
		mounts:          d("mounts", "Mounts this agent serves, by kind: local (the namespace is on this node), remote (on another node, over warpfs), staging (the agent's own mount of a striped namespace for its stage workers).", "kind"),
		stageWorkers:    d("stage_workers", "Stage runs whose worker is still running on this node."),
		stageRuns:       d("stage_runs", "Stage runs this agent keeps (running or finished, until the controller has their outcome)."),
		workerProcesses: d("stage_worker_processes", "Stage worker processes alive on this node (started and not yet exited), whatever their stage's state: a canceled or stalled stage's worker counts until it is gone."),
		workersStuck:    d("stage_workers_stuck", "Stage worker processes still alive stage.cancel_grace after SIGKILL: blocked in the kernel, typically on a FUSE file system whose server does not answer (a user's own, stopped); their stages have ended without them, and they exit when the server answers or the FUSE connection is aborted."),
		workersIdle:     d("stage_workers_idle", "Stage worker processes waiting for the next stage of their user (stage.worker_idle_timeout); they hold no directory, and are counted in spillway_agent_stage_worker_processes too."),
		connections:     d("warpfs_connections", "Connections to this node's data server (agent.data_listen), handshakes included; 0 without one."),

		cachePFSRead:     d("cache_pfs_read_bytes_total", "Bytes a cache fragment's store read from the PFS (misses and read-ahead), since the agent opened the store.", "fragment", "instance"),
		cachePFSWritten:  d("cache_pfs_written_bytes_total", "Bytes a cache fragment's store wrote to the PFS (write-behind, syncs, teardown's flush), since the agent opened the store.", "fragment", "instance"),
		cacheHits:        d("cache_hits_total", "Extents of reads a cache fragment served from its SSD.", "fragment", "instance"),
		cacheMisses:      d("cache_misses_total", "Extents of reads a cache fragment fetched from the PFS first.", "fragment", "instance"),
		cacheEvictions:   d("cache_evictions_total", "Clean extents a cache fragment dropped to make room.", "fragment", "instance"),
		cacheFlushErrors: d("cache_flush_errors_total", "Failed writes of a cache fragment to the PFS (the data is kept and the flush retried).", "fragment", "instance"),
		cacheDirty:       d("cache_dirty_bytes", "A cache fragment's flush backlog: bytes written by jobs and not yet on the PFS.", "fragment", "instance"),
		cacheUsed:        d("cache_used_bytes", "Bytes a cache fragment's store holds on the SSD.", "fragment", "instance"),
	}
}

func (c *agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.capacity, c.allocated, c.used, c.fragments, c.ssdSize, c.ssdFree,
		c.mounts, c.stageWorkers, c.stageRuns, c.connections, c.workerProcesses, c.workersStuck, c.workersIdle,
		c.cachePFSRead, c.cachePFSWritten, c.cacheHits, c.cacheMisses, c.cacheEvictions, c.cacheFlushErrors, c.cacheDirty, c.cacheUsed} {
		ch <- d
	}
}

func (c *agentCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	a.mu.Lock()
	mounts := map[string]int{"local": 0, "remote": 0, "staging": 0}
	for _, m := range a.mounts {
		switch {
		case m.staging:
			mounts["staging"]++
		case m.remote:
			mounts["remote"]++
		default:
			mounts["local"]++
		}
	}
	runs, running := len(a.stages), 0
	for _, r := range a.stages {
		select {
		case <-r.Done():
		default:
			running++
		}
	}
	a.mu.Unlock()
	for k, n := range mounts {
		gauge(c.mounts, float64(n), k)
	}
	gauge(c.stageWorkers, float64(running))
	gauge(c.stageRuns, float64(runs))
	alive, stuck := stage.WorkerProcesses()
	gauge(c.workerProcesses, float64(alive))
	gauge(c.workersStuck, float64(stuck))
	gauge(c.workersIdle, float64(stage.IdleWorkers()))
	a.dataMu.Lock()
	data := a.data
	a.dataMu.Unlock()
	connections := 0
	if data != nil {
		connections = data.Connections()
	}
	gauge(c.connections, float64(connections))
	if a.opt.Pool == "" {
		return // a compute-only node has no storage
	}
	gauge(c.capacity, float64(a.capacity))
	var fragments, allocated float64
	entries, _ := os.ReadDir(filepath.Join(a.ssd, "fragment"))
	for _, e := range entries {
		id, err := strconv.ParseInt(e.Name(), 10, 64)
		if err != nil {
			continue
		}
		fragments++
		meta, err := a.readFragment(id)
		if err != nil {
			continue
		}
		allocated += float64(meta.Capacity)
		if s := a.openCacheStore(id); s != nil {
			st := s.Stats()
			labels := []string{strconv.FormatInt(id, 10), strconv.FormatInt(meta.InstanceID, 10)}
			counter := func(d *prometheus.Desc, v uint64) {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
			}
			counter(c.cachePFSRead, st.FetchedBytes)
			counter(c.cachePFSWritten, st.FlushedBytes)
			counter(c.cacheHits, st.Hits)
			counter(c.cacheMisses, st.Misses)
			counter(c.cacheEvictions, st.Evictions)
			counter(c.cacheFlushErrors, st.FlushErrors)
			gauge(c.cacheDirty, float64(st.Dirty), labels...)
			gauge(c.cacheUsed, float64(st.Used), labels...)
		}
	}
	gauge(c.fragments, fragments)
	gauge(c.allocated, allocated)
	var used float64
	for _, id := range a.trackers.IDs() {
		if t, ok := a.trackers.Lookup(id); ok {
			used += float64(t.Used())
		}
	}
	gauge(c.used, used)
	var st syscall.Statfs_t
	if err := syscall.Statfs(a.ssd, &st); err == nil {
		gauge(c.ssdSize, float64(st.Blocks)*float64(st.Bsize))
		gauge(c.ssdFree, float64(st.Bavail)*float64(st.Bsize))
	}
}
