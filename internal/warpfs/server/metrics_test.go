package server

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

func openTestLocal(t testing.TB) *Local {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "namespace")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := OpenLocal(LocalOptions{Dir: dir, Tracker: usage.New("metrics", 1<<30)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// Measuring a request allocates nothing: a request through the measured path allocates what
// exec itself does, no more (the counters and histograms are resolved beforehand).
func TestMeasuringARequestAllocatesNothing(t *testing.T) {
	l := openTestLocal(t)
	req := &proto.NodeReq{Path: ""}
	if _, _, errno := l.Exec(proto.OpGetattr, 0, 0, req, nil); errno != 0 {
		t.Fatal(errno)
	}
	plain := testing.AllocsPerRun(200, func() { l.sess.exec(proto.OpGetattr, 0, 0, req, nil) })
	measured := testing.AllocsPerRun(200, func() { l.Exec(proto.OpGetattr, 0, 0, req, nil) })
	if measured > plain {
		t.Errorf("a measured GETATTR allocates %.1f times, exec alone %.1f", measured, plain)
	}
}

// The measuring costs two clock reads and a few atomic additions per request: compare
//
//	go test -run '^$' -bench Measuring -benchmem ./internal/warpfs/server
func BenchmarkMeasuring(b *testing.B) {
	l := openTestLocal(b)
	req := &proto.NodeReq{Path: ""}
	b.Run("exec", func(b *testing.B) {
		for b.Loop() {
			if _, _, errno := l.sess.exec(proto.OpGetattr, 0, 0, req, nil); errno != 0 {
				b.Fatal(errno)
			}
		}
	})
	b.Run("measured", func(b *testing.B) {
		for b.Loop() {
			if _, _, errno := l.Exec(proto.OpGetattr, 0, 0, req, nil); errno != 0 {
				b.Fatal(errno)
			}
		}
	})
	b.Run("measuring-only", func(b *testing.B) {
		rep := &proto.CountReply{N: 1 << 20}
		for b.Loop() {
			dataPath.inFlight.Inc()
			dataPath.record(transportRemote, proto.OpWrite, time.Now(), rep, 0, 0)
		}
	})
	b.Run("measured-error", func(b *testing.B) {
		missing := &proto.PathReq{Path: "missing"}
		for b.Loop() {
			if _, _, errno := l.Exec(proto.OpLookup, 0, 0, missing, nil); errno != syscall.ENOENT {
				b.Fatal(errno)
			}
		}
	})
}
