package server

import (
	"github.com/spillway-hpc/spillway/internal/agentapi"

	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"
)

const sec = int64(time.Second)

// A 60-second window of 60 one-second buckets: writes count for 60 seconds (up to one more
// bucket), then stop counting.
func TestWindowRollsOver(t *testing.T) {
	w := newWindow(60 * sec)
	if w.width != sec {
		t.Fatalf("bucket width %d, want 1s", w.width)
	}
	t0 := 1_000_000 * sec
	if got := w.add(100, t0); got != 100 {
		t.Errorf("after 100 bytes: %d", got)
	}
	if got := w.add(50, t0+30*sec); got != 150 {
		t.Errorf("30 s later, 50 more: %d, want 150", got)
	}
	if got := w.sum(t0 + 59*sec); got != 150 {
		t.Errorf("59 s after the first write: %d, want 150 (both in the window)", got)
	}
	if got := w.sum(t0 + 60*sec); got != 50 {
		t.Errorf("60 s after the first write: %d, want 50 (the first left)", got)
	}
	if got := w.sum(t0 + 90*sec); got != 0 {
		t.Errorf("90 s after: %d, want 0", got)
	}
	if w.peak != 150 {
		t.Errorf("peak %d, want 150", w.peak)
	}
	// A bucket reused a whole window later starts from zero.
	if got := w.add(7, t0+120*sec); got != 7 {
		t.Errorf("a bucket reused: %d, want 7", got)
	}
}

// coolsAt says when the sum falls below the limit: when enough of the oldest buckets left.
func TestWindowCoolsAt(t *testing.T) {
	w := newWindow(60 * sec)
	t0 := 1_000_000 * sec
	w.add(60, t0)
	w.add(60, t0+10*sec)
	if at := w.coolsAt(100, t0+20*sec); at != t0+60*sec {
		t.Errorf("over the limit of 100 with 120: cools at +%ds, want +60s (when the first 60 leave)", (at-t0)/sec)
	}
	if at := w.coolsAt(50, t0+20*sec); at != t0+70*sec {
		t.Errorf("limit 50: cools at +%ds, want +70s (both must leave)", (at-t0)/sec)
	}
	if at := w.coolsAt(1000, t0+20*sec); at != t0+20*sec {
		t.Errorf("under the limit: cools at %d, want now", at)
	}
}

// Short windows have buckets of at least a millisecond; no window counts nothing.
func TestWindowGranularity(t *testing.T) {
	if w := newWindow(3 * sec); w.width != 50*int64(time.Millisecond) {
		t.Errorf("3 s window: buckets of %v, want 50ms", time.Duration(w.width))
	}
	if w := newWindow(10 * int64(time.Millisecond)); w.width != int64(time.Millisecond) {
		t.Errorf("10 ms window: buckets of %v, want 1ms", time.Duration(w.width))
	}
	var none window
	if none.add(100, sec) != 0 || none.sum(sec) != 0 {
		t.Error("a zero window counted")
	}
}

// A fragment over its window refuses changes with EROFS, logs it once, and takes writes
// again once the window cooled down; its state survives a save and restore.
func TestFragmentWindowTripsAndCools(t *testing.T) {
	var logged bytes.Buffer
	now := time.Unix(1_000_000, 0)
	f := NewFragment(7, 3, FragmentLimits{WriteLimit: 1000, WindowLength: 10 * time.Second},
		slog.New(slog.NewTextHandler(&logged, nil)))
	f.now = func() time.Time { return now }
	f.Job = "4242"
	a := newAccount(f, 5, "cn1", false)
	if errno := a.writable(); errno != 0 {
		t.Fatalf("a fresh fragment: %v", errno)
	}
	a.wrote(600, 600)
	if errno := a.writable(); errno != 0 {
		t.Fatalf("600 of 1000: %v", errno)
	}
	a.wrote(600, 1200) // crosses the limit: done, and the fragment is read-only from now
	for what, errno := range map[string]syscall.Errno{"write": a.writable(), "create": a.startCreate()} {
		if errno != syscall.EROFS {
			t.Errorf("%s over the window: %v, want EROFS", what, errno)
		}
	}
	if n := strings.Count(logged.String(), "write limit reached"); n != 1 {
		t.Errorf("the trip was logged %d times, want once:\n%s", n, logged.String())
	}
	for _, want := range []string{"job=4242", "instance=3", "fragment=7", "write_limit="} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("the log line lacks %q:\n%s", want, logged.String())
		}
	}
	u := f.Usage(0)
	if !u.ReadOnly || u.WindowWritten != 1200 || u.WriteLimit != 1000 || u.WindowLength != 10 || u.MaxWindowWrite != 1200 ||
		u.BytesWritten != 1200 || u.WriteOps != 2 || !strings.Contains(u.ReadOnlyReason, "write window") {
		t.Errorf("usage while read-only: %+v", u)
	}

	saved := f.State()
	g := RestoreFragment(7, 3, f.Limits(), &saved, slog.New(slog.NewTextHandler(&logged, nil)))
	g.now = f.now
	ga := newAccount(g, 5, "cn1", false)
	if errno := ga.writable(); errno != syscall.EROFS {
		t.Errorf("restored fragment: %v, want EROFS still", errno)
	}
	if gu := g.Usage(0); gu.BytesWritten != 1200 || gu.Restored || len(gu.Clients) != 1 || gu.Clients[0].BytesWritten != 1200 {
		t.Errorf("restored usage: %+v", gu)
	}

	now = now.Add(11 * time.Second)
	if errno := a.writable(); errno != 0 {
		t.Errorf("after the window: %v, want writable", errno)
	}
	if !strings.Contains(logged.String(), "cooled down") {
		t.Errorf("no line for the cooling:\n%s", logged.String())
	}
	if u := f.Usage(0); u.ReadOnly || u.WindowWritten != 0 || u.MaxWindowWrite != 1200 {
		t.Errorf("usage after cooling: %+v", u)
	}
}

// MFC: a namespace creates at most its limit of files; refused and failed creates do not
// count; stripe objects are no files of a namespace.
func TestMaxFilesCreatedCount(t *testing.T) {
	f := NewFragment(1, 2, FragmentLimits{}, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	f.Namespace(9).SetLimits(2, 0)
	a := newAccount(f, 9, "cn1", false)
	if errno := a.startCreate(); errno != 0 {
		t.Fatal(errno)
	}
	a.createDone(false) // the create failed: it gives its admission back
	for i := 0; i < 2; i++ {
		if errno := a.startCreate(); errno != 0 {
			t.Fatalf("file %d of 2: %v", i+1, errno)
		}
		a.createDone(true)
	}
	if errno := a.startCreate(); errno != syscall.EMFILE {
		t.Errorf("a third file with MFC=2: %v, want EMFILE", errno)
	}
	objects := newAccount(f, 0, "cn1", true)
	if errno := objects.startCreate(); errno != 0 {
		t.Errorf("a stripe object past the namespace's MFC: %v, want no limit", errno)
	}
	objects.createDone(true)
	u := f.Usage(0)
	if u.FilesCreated != 2 || len(u.Namespaces) != 1 || u.Namespaces[0].FilesCreated != 2 || u.Namespaces[0].FilesCreateLimit != 2 {
		t.Errorf("usage: %+v", u)
	}
}

// What counting costs a request on the hot path, without and with a write window (run in
// parallel, as a server's requests are):
//
//	go test -run '^$' -bench Count -benchmem ./internal/warpfs/server
func BenchmarkCountWrite(b *testing.B) {
	for _, lim := range []FragmentLimits{{}, {WriteLimit: 1 << 62, WindowLength: time.Hour}} {
		b.Run(fmt.Sprintf("window=%v", lim.WindowLength), func(b *testing.B) {
			f := NewFragment(1, 1, lim, nil)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				a := newAccount(f, 1, "cn1", false)
				for pb.Next() {
					if a.writable() != 0 {
						b.Fatal("read-only")
					}
					a.wrote(1<<20, 1<<20)
				}
			})
		})
	}
	b.Run("read", func(b *testing.B) {
		f := NewFragment(1, 1, FragmentLimits{}, nil)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			a := newAccount(f, 1, "cn1", false)
			for pb.Next() {
				a.read(1<<20, 1<<20)
			}
		})
	})
}

// A clock stepped back loses no bytes (they count in the latest bucket); a window restored
// from its slots goes on where it was, and drops what left it meanwhile.
func TestWindowClockBackAndRestore(t *testing.T) {
	w := newWindow(60 * sec)
	t0 := 1_000_000 * sec
	w.add(10, t0+10*sec)
	if got := w.add(5, t0); got != 15 {
		t.Errorf("a write 10 s in the past: %d, want 15", got)
	}
	if got := w.sum(t0 + 69*sec); got != 15 {
		t.Errorf("69 s after: %d, want 15 (both counted at +10 s)", got)
	}
	if got := w.sum(t0 + 70*sec); got != 0 {
		t.Errorf("70 s after: %d, want 0", got)
	}
	var saved []windowSlot
	x := newWindow(60 * sec)
	x.add(100, t0)
	x.add(50, t0+30*sec)
	for _, s := range x.slot {
		if s.Bytes > 0 {
			saved = append(saved, s)
		}
	}
	y := newWindow(60 * sec)
	if total := y.restore(saved); total != 150 {
		t.Errorf("restored total %d, want 150", total)
	}
	if got := y.sum(t0 + 45*sec); got != 150 {
		t.Errorf("restored, 45 s after: %d, want 150", got)
	}
	if got := y.sum(t0 + 60*sec); got != 50 {
		t.Errorf("restored, 60 s after: %d, want 50", got)
	}
	if got := y.add(1, t0+200*sec); got != 1 {
		t.Errorf("restored, long after: %d, want 1", got)
	}
}

// The namespace's bytes (issue 23 item 9): a session of stripe objects counts the bytes of
// the namespace its capability names (not its offsets, an object's, nor files: MFC stays the
// namespace's); a stage worker's session (agentapi.StageClient) counts in the fragment and
// under its own client, not in the namespace's bytes, which are the file system's I/O.
func TestNamespaceBytesOfObjectsAndStages(t *testing.T) {
	f := NewFragment(1, 2, FragmentLimits{}, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	f.Namespace(9).SetLimits(1, 0)
	objects := newAccount(f, 9, "cn1", true)
	objects.wrote(1000, 1<<40)
	objects.read(300, 1<<40)
	if errno := objects.startCreate(); errno != 0 {
		t.Fatal(errno)
	}
	objects.createDone(true)
	files := newAccount(f, 9, "cn1", false)
	if errno := files.startCreate(); errno != 0 {
		t.Errorf("the namespace's one file (MFC 1) after an object: %v", errno)
	}
	files.createDone(true)
	files.wrote(10, 10)
	stage := newAccount(f, 9, agentapi.StageClient("sn1"), false)
	stage.wrote(5000, 5000)
	u := f.Usage(0)
	if len(u.Namespaces) != 1 {
		t.Fatalf("namespaces: %+v", u.Namespaces)
	}
	n := u.Namespaces[0]
	if n.BytesWritten != 1010 || n.BytesRead != 300 || n.MaxOffsetWritten != 10 || n.MaxOffsetRead != 0 || n.FilesCreated != 1 {
		t.Errorf("namespace 9: %+v, want 1010 written (objects and files, no stage), 300 read, offsets the files' only, 1 file", n)
	}
	if u.BytesWritten != 6010 {
		t.Errorf("fragment bytes written %d, want 6010 (every session's)", u.BytesWritten)
	}
	var stageSeen bool
	for _, c := range u.Clients {
		stageSeen = stageSeen || c.Node == "stage@sn1" && c.BytesWritten == 5000
	}
	if !stageSeen {
		t.Errorf("clients %+v: the stage's traffic under stage@sn1", u.Clients)
	}
}
