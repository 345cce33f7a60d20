package mount

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// remoteWriteRequests counts the WRITE requests servers of this process answered for remote
// mounts so far.
func remoteWriteRequests(t testing.TB) float64 {
	t.Helper()
	return remoteRequests(t, "write")
}

// remoteRequests counts the requests of op (the metric's label: "write", "fsync") servers of
// this process answered for remote mounts so far.
func remoteRequests(t testing.TB, op string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(server.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "spillway_warpfs_requests_total" {
			continue
		}
		for _, m := range mf.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["op"] == op && labels["transport"] == "remote" {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// A one-server instance on another node writes behind as a striped one does: small
// sequential writes (IOR-hard's 47,008 bytes, which the page cache sends as two requests
// each, and 4 KiB) are gathered into few requests, and what is read back, on this node at
// once and after close, is exactly what was written, rewrites included.
func TestOneServerSmallWritesBehind(t *testing.T) {
	src, mp := dirs(t)
	m := testBackend{name: "remote", remote: true}.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("instance 21", 64*mib)})
	for _, c := range []struct {
		name  string
		flags int
		block int
	}{{"ior-hard", os.O_RDWR, 47008}, {"4k", os.O_WRONLY, 4096}} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(m.Path(), c.name)
			f, err := os.OpenFile(p, c.flags|os.O_CREATE, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			const writes = 200
			want := make([]byte, writes*c.block)
			before := remoteWriteRequests(t)
			for i := range writes {
				b := bytes.Repeat([]byte{byte('a' + i%26)}, c.block)
				if _, err := f.WriteAt(b, int64(i*c.block)); err != nil {
					t.Fatal(err)
				}
				copy(want[i*c.block:], b)
				if i%9 == 8 { // a rewrite of what the last writes queued
					off := i*c.block - c.block/2
					if _, err := f.WriteAt(bytes.Repeat([]byte{'#'}, c.block), int64(off)); err != nil {
						t.Fatal(err)
					}
					copy(want[off:], bytes.Repeat([]byte{'#'}, c.block))
				}
			}
			if st, err := os.Stat(p); err != nil || st.Size() != int64(len(want)) {
				t.Errorf("stat on the writer's node before close: %v, %v; want size %d", st, err, len(want))
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			requests := remoteWriteRequests(t) - before
			// Each rewrite, going back, starts two requests more; the kernel's writeback of the
			// O_RDWR file's pages, on a loaded machine, cuts a few more runs (74 seen against
			// ~55 idle). Not gathered, it would be one request a write or more (222).
			if requests > writes/2 {
				t.Errorf("%.0f WRITE requests for %d writes of %d bytes: not gathered", requests, writes+writes/9, c.block)
			} else {
				t.Logf("%.0f WRITE requests for %d writes of %d bytes", requests, writes+writes/9, c.block)
			}
			got, err := os.ReadFile(filepath.Join(src, c.name)) // the server's copy
			if err != nil || !bytes.Equal(got, want) {
				i := 0
				for i < min(len(got), len(want)) && got[i] == want[i] {
					i++
				}
				t.Fatalf("the server holds %d bytes, want %d (%v); first difference at %d", len(got), len(want), err, i)
			}
		})
	}
}

// A one-server instance on another node: a 4 KiB write + fdatasync is one request, a
// WRITE_SYNC (before: the write, then an FSYNC after its answer), and the server's copy
// holds the bytes when fdatasync returns. Where the machine was slow enough that the write
// left before the fdatasync came, an FSYNC follows it, as before; most must not.
func TestOneServerWriteFdatasync(t *testing.T) {
	src, mp := dirs(t)
	m := testBackend{name: "remote", remote: true}.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("instance 21", 64*mib)})
	f, err := os.OpenFile(filepath.Join(m.Path(), "log"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const n = 20
	count := func() (syncs, fsyncs, writes float64) {
		return remoteRequests(t, "write_sync"), remoteRequests(t, "fsync"), remoteRequests(t, "write")
	}
	s0, f0, w0 := count()
	var want []byte
	for i := range n {
		b := bytes.Repeat([]byte{byte('a' + i)}, 4096)
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		sync := f.Sync // fsync(2) and fdatasync(2) in turns
		if i%2 == 1 {
			sync = func() error { return syscall.Fdatasync(int(f.Fd())) }
		}
		if err := sync(); err != nil {
			t.Fatal(err)
		}
		want = append(want, b...)
		if got, err := os.ReadFile(filepath.Join(src, "log")); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("after sync %d the server holds %d bytes (%v), want %d", i, len(got), err, len(want))
		}
	}
	s1, f1, w1 := count()
	syncs, fsyncs, writes := s1-s0, f1-f0, w1-w0
	t.Logf("%d writes + syncs: %.0f WRITE_SYNC, %.0f FSYNC, %.0f WRITE", n, syncs, fsyncs, writes)
	if syncs+writes != n || fsyncs != writes || syncs < n*3/4 {
		t.Errorf("%d writes each followed by a sync: %.0f WRITE_SYNC, %.0f FSYNC, %.0f WRITE; want a WRITE_SYNC each (at least %d)",
			n, syncs, fsyncs, writes, n*3/4)
	}
}

// An error of a write behind (the instance full) is not lost: the next write, or else the
// close, returns it, as for a striped file; nothing reports success for bytes that are not
// on the server.
func TestOneServerWriteBehindErrors(t *testing.T) {
	src, mp := dirs(t)
	tr := usage.New("instance 22", mib)
	m := testBackend{name: "remote", remote: true}.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, Logger: quietLogger(t)})
	f, err := os.OpenFile(filepath.Join(m.Path(), "full"), os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	var werr error
	written := 0
	for i := 0; i < 64 && werr == nil; i++ { // 4 MiB into 1 MiB
		var n int
		n, werr = f.WriteAt(buf, int64(i*len(buf)))
		written += n
	}
	cerr := f.Close()
	if !errors.Is(werr, syscall.ENOSPC) && !errors.Is(cerr, syscall.ENOSPC) {
		t.Fatalf("4 MiB written into a 1 MiB instance: the writes said %v, the close %v; want ENOSPC from one", werr, cerr)
	}
	st, err := os.Stat(filepath.Join(src, "full"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > int64(mib) {
		t.Errorf("the server holds %d bytes of a 1 MiB instance", st.Size())
	}
	t.Logf("writes: %v after %d bytes; close: %v; on the server: %d bytes", werr, written, cerr, st.Size())
}

// A storage node lost under a writer whose small writes go behind: once a write behind has
// failed, the writer's later writes fail too, even when another descriptor of the same open
// file (a child's inherited one, closed at its exit) took the first report of the error at
// its close. (The e2e "storage node killed" writer, `while echo line >&3; do sleep 0.1; done`,
// ran on forever: each sleep's exit flushed the inherited descriptor and took the error.)
func TestWriteBehindLossIsToldToTheWriter(t *testing.T) {
	src, mp := dirs(t)
	s := startServer(t, "", src, usage.New("writebehind", 1<<30), nil)
	m := mount(t, Spec{MountPath: mp, Logger: quietLogger(t), Remote: &Remote{Address: s.addr, Token: testToken,
		Limits: client.Limits{RequestTimeout: time.Second, KeepaliveInterval: 300 * time.Millisecond}}})
	f, err := os.OpenFile(filepath.Join(m.Path(), "log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("line\n")); err != nil {
		t.Fatal(err)
	}
	s.stop()
	f.Write([]byte("lost\n")) // accepted, or already failing
	// Another descriptor of the open file closes: its flush waits for the writes behind and
	// reports their error.
	dup, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(dup)
	if _, err := f.Write([]byte("more\n")); err == nil {
		t.Fatal("a write after a write behind was lost (the storage node gone) succeeded")
	}
	if err := f.Sync(); err == nil {
		t.Fatal("fsync after a write behind was lost succeeded")
	}
}
