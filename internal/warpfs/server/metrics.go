package server

import (
	"fmt"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/metrics"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// The data path's metrics count every request the server answers, on a connection from
// another host (transport "remote") and from a mount in this process (transport "local"):
// requests and their latency by operation, bytes read and written, errors by errno. They are
// the process's: an agent registers them in its registry (Collectors), and one process
// holding several servers (the tests) counts them together.
//
// Everything a request touches is resolved when the process starts (one counter and one
// histogram per operation and transport), so measuring a request costs two clock reads and
// a few atomic additions, and allocates nothing. An error resolves its (operation, errno)
// counter the first time it happens, then keeps it at hand.
//
// Writes the kernel makes itself (FUSE passthrough of co-located mounts on a fragment with
// a quota or a file system of its own) never reach the server and are not counted here; the
// instance's usage still sees them.

type transport int

const (
	transportLocal transport = iota
	transportRemote
	transports
)

var transportNames = [transports]string{"local", "remote"}

type opMetrics struct {
	requests [transports]prometheus.Counter
	seconds  prometheus.Observer
	name     string
	errs     [maxErrno]atomic.Pointer[errCounter] // resolved at the operation's first such error
}

// maxErrno bounds the errnos whose counters an operation keeps at hand (Linux's are below
// 134); others are looked up each time.
const maxErrno = 134

type errCounter struct{ prometheus.Counter }

type dataPathMetrics struct {
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	read     *prometheus.CounterVec
	written  *prometheus.CounterVec
	inFlight prometheus.Gauge
	panics   prometheus.Counter

	ops          [256]*opMetrics // by proto.Op; ops the protocol does not know share "other"
	readBytes    [transports]prometheus.Counter
	writtenBytes [transports]prometheus.Counter
}

var dataPath = newDataPathMetrics()

func newDataPathMetrics() *dataPathMetrics {
	ns := metrics.Namespace
	m := &dataPathMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "warpfs",
			Name: "requests_total", Help: "File operations the data path answered, by operation and transport (local: a mount on this host; remote: a mount on another host, over warpfs)."},
			[]string{"op", "transport"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: "warpfs",
			Name: "request_duration_seconds", Help: "Time the server took to answer one file operation (from the decoded request to the reply), by operation.",
			Buckets: metrics.RequestBuckets}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "warpfs",
			Name: "errors_total", Help: "File operations answered with an error, by operation and errno (ENOENT of a lookup is a normal answer)."},
			[]string{"op", "errno"}),
		read: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "warpfs",
			Name: "read_bytes_total", Help: "Bytes of file data the data path read for mounts (READ), by transport."},
			[]string{"transport"}),
		written: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: "warpfs",
			Name: "written_bytes_total", Help: "Bytes of file data the data path wrote for mounts (WRITE and COPY_RANGE), by transport."},
			[]string{"transport"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: "warpfs",
			Name: "requests_in_flight", Help: "File operations being answered now."}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: "warpfs",
			Name: "handler_panics_total", Help: "File operations whose handler panicked (a defect: each is logged with its stack; the operation failed with EIO and a remote client's connection was closed)."}),
	}
	other := m.op("other")
	for i := range m.ops {
		m.ops[i] = other
	}
	for i := range m.ops {
		if op := proto.Op(i); op >= proto.OpLookup && op.Known() {
			m.ops[op] = m.op(strings.ToLower(op.String()))
		}
	}
	for t := range transports {
		m.readBytes[t] = m.read.WithLabelValues(transportNames[t])
		m.writtenBytes[t] = m.written.WithLabelValues(transportNames[t])
	}
	return m
}

func (m *dataPathMetrics) op(name string) *opMetrics {
	om := &opMetrics{name: name, seconds: m.seconds.WithLabelValues(name)}
	for t := range transports {
		om.requests[t] = m.requests.WithLabelValues(name, transportNames[t])
	}
	return om
}

// Collectors are the data path's metrics, for an agent's registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{dataPath.requests, dataPath.seconds, dataPath.errors, dataPath.read, dataPath.written, dataPath.inFlight, dataPath.panics}
}

// measured runs one request through exec and counts it.
//
// Its last result is the reply's lease flags (proto.FlagLease, proto.FlagListing; leases.go):
// the other clients that held what the request changed have been told by then.
func (s *session) measured(t transport, op proto.Op, uid, gid uint32, m proto.Message, dest []byte) (proto.Message, int, syscall.Errno, uint8) {
	dataPath.inFlight.Inc()
	start := time.Now()
	lm := m // what the leases see: a PLACE is a CREATE to them
	if p, ok := m.(*proto.PlaceReq); ok {
		lm = &p.CreateReq
	}
	s.lease.recall(op, lm) // before it runs: a listing's holder's removals on their way land first
	tok := s.lease.before(op)
	var ino uint64
	if tok.ok {
		ino = s.handleIno(m) // before: a RELEASE takes the handle away
	}
	rep, n, errno, panicked := s.contained(op, uid, gid, m, dest)
	var flags uint8
	if tok.ok {
		flags = s.lease.after(tok, op, lm, rep, uint32(errno), ino)
	}
	dataPath.record(t, op, start, rep, n, errno)
	if p, ok := m.(*proto.PlaceReq); ok && errno == 0 && len(p.Data) > 0 {
		dataPath.writtenBytes[t].Add(float64(len(p.Data))) // a file placed whole: its data
	}
	if panicked {
		return nil, 0, errno, 0 // a defect of the server, not of the medium
	}
	if (errno == syscall.EIO || errno == syscall.EUCLEAN) && s.cache == nil { // a cache's are the PFS's
		if f := s.v.acct.frag; f != nil && f.OnMediaError != nil {
			f.OnMediaError(dataPath.ops[op].name, errno)
		}
	}
	return rep, n, errno, flags
}

// handleIno is the inode of the file a request changes through a handle (0: none, or a
// directory's). A RELEASE or FSYNC changes it when the kernel wrote the file itself (FUSE
// passthrough): what it wrote is told to the others then.
func (s *session) handleIno(m proto.Message) uint64 {
	var id uint64
	passthrough := false
	switch r := m.(type) {
	case *proto.HandleReq:
		id, passthrough = r.Handle, true
	case *proto.FsyncReq:
		id, passthrough = r.Handle, true
	case *proto.WriteReq:
		id = r.Handle
	case *proto.WriteSyncReq:
		id = r.Handle
	case *proto.FallocateReq:
		id = r.Handle
	case *proto.CopyRangeReq:
		id = r.Out
	case *proto.XattrReq: // SETXATTR, REMOVEXATTR (no other is bracketed)
		if r.Handle == 0 && s.cache == nil && s.v != nil {
			// By path: its inode, whichever name the table knows it by (a mount may keep that
			// the file has no security.capability, which the kernel asks before a write to
			// drop it: it must hear of one set through another name).
			if a, errno := s.v.lookup(r.Path); errno == 0 {
				return a.Ino
			}
			return 0
		}
		id = r.Handle
	default:
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.handles[id]; h != nil && h.in != nil && (!passthrough || h.kernelWrites) {
		return h.in.key.ino
	}
	return 0
}

// contained runs exec, turning a panic of its handler (a defect) into EIO for this request
// alone: it is logged with its stack and counted, and a remote connection that caused it is
// closed (handle), but the server and every other mount of the node go on.
func (s *session) contained(op proto.Op, uid, gid uint32, m proto.Message, dest []byte) (rep proto.Message, n int, errno syscall.Errno, panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			dataPath.panics.Inc()
			s.panicked.Store(true)
			s.log.Error("warpfs: a request's handler panicked; the request fails with EIO",
				"op", op.String(), "client", s.client, "instance", s.instance, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			rep, n, errno, panicked = nil, 0, syscall.EIO, true
		}
	}()
	if handlerFault != nil {
		handlerFault(op, uid)
	}
	rep, n, errno = s.exec(op, uid, gid, m, dest)
	return rep, n, errno, false
}

// handlerFault, when set (by tests only), is called before each request's handler: a test
// makes it panic to see the panic contained.
var handlerFault func(op proto.Op, uid uint32)

// record counts a request that started at start and ended now with exec's results.
func (dp *dataPathMetrics) record(t transport, op proto.Op, start time.Time, rep proto.Message, n int, errno syscall.Errno) {
	elapsed := time.Since(start)
	dp.inFlight.Dec()
	om := dp.ops[op]
	om.requests[t].Inc()
	om.seconds.Observe(elapsed.Seconds())
	if errno != 0 {
		dp.countError(om, errno)
		return
	}
	switch op {
	case proto.OpRead:
		dp.readBytes[t].Add(float64(n))
	case proto.OpWrite, proto.OpCopyRange, proto.OpWriteName, proto.OpWriteSync:
		if c, ok := rep.(*proto.CountReply); ok {
			dp.writtenBytes[t].Add(float64(c.N))
		}
	}
}

// countError counts an operation's error.
func (dp *dataPathMetrics) countError(om *opMetrics, errno syscall.Errno) {
	if errno >= maxErrno {
		dp.errors.WithLabelValues(om.name, errnoName(errno)).Inc()
		return
	}
	c := om.errs[errno].Load()
	if c == nil {
		c = &errCounter{dp.errors.WithLabelValues(om.name, errnoName(errno))}
		om.errs[errno].Store(c)
	}
	c.Inc()
}

// errnoName is the errno's symbol (ENOENT), or its number for one Linux does not name.
func errnoName(e syscall.Errno) string {
	if name := unix.ErrnoName(e); name != "" {
		return name
	}
	return "errno_" + strings.TrimSpace(e.Error())
}

// CountSplicedRead counts a READ of a local mount that the FUSE layer answers from the
// file's descriptor itself (go-fuse splices it, the server never sees it): one request and
// the bytes it gets, the file's size past off bounding size. Its latency is not measured.
func (l *Local) CountSplicedRead(fd int, off int64, size int) {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return
	}
	dp := dataPath
	dp.ops[proto.OpRead].requests[transportLocal].Inc()
	dp.readBytes[transportLocal].Add(float64(max(0, min(int64(size), st.Size-off))))
}
