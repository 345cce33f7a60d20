package mount

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// TestSmallIORequests counts what small I/O costs per operation on a four-server striped
// instance: a 4 KiB write + fdatasync (fio's latency job) is one request, a WRITE_SYNC to the
// server holding the bytes, when the write lands inside the size already made durable
// (before: 3, the write, the FSYNC of its server after its answer and the size report with
// the stub's sync), and two at once when it grows the file, the WRITE_SYNC and the size
// report with the stub's sync (fio's own job: its file grows at every write); and logs
// ior-hard's 47008-byte transfers by four writers of one shared file, then their reads.
func TestSmallIORequests(t *testing.T) {
	in := newCountedInstance(t)
	m := in.mountAt(t, "cn1")
	p := filepath.Join(m.Path(), "sync")
	if err := os.WriteFile(p, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	f.WriteAt(buf, 0)
	unix.Fdatasync(int(f.Fd()))
	in.settle()
	const n = 20
	for i := 1; i <= n; i++ {
		if _, err := f.WriteAt(buf, int64(i*37%256)*4096); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
	}
	c := phaseCounts(in.settle())
	t.Logf("4 KiB write + fdatasync inside the file, %d times: %v", n, c)
	checkWriteSyncs(t, "a 4 KiB write inside the file", n, 0, c)
	f.Close()
	in.settle()

	// fio's job: a new file, 4 KiB appended and fdatasync'd at a time. Its size grows at
	// every write: the write goes first, unsynced, then the data server's FSYNC and the
	// metadata server's synced size report at the same time (never the size before the bytes
	// reached their server, and two disk syncs side by side rather than one after the other).
	g, err := os.OpenFile(filepath.Join(m.Path(), "grow"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < countedServers; i++ { // the first object opened (fio's job starts so too)
		g.Write(buf)
		unix.Fdatasync(int(g.Fd()))
	}
	in.settle()
	for i := 0; i < n; i++ {
		if _, err := g.Write(buf); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fdatasync(int(g.Fd())); err != nil {
			t.Fatal(err)
		}
	}
	c = phaseCounts(in.settle())
	t.Logf("4 KiB append + fdatasync, %d times: %v", n, c)
	checkAppendSyncs(t, n, c)
	if st, err := os.Stat(g.Name()); err != nil || st.Size() != int64((n+countedServers)*len(buf)) {
		t.Errorf("the appended file's size: %v %v, want %d", st, err, (n+countedServers)*len(buf))
	}
	g.Close()
	in.settle()

	const ranks, segs, xfer = 4, 20, 47008
	shared := filepath.Join(m.Path(), "ior-hard")
	if err := os.WriteFile(shared, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	in.settle()
	run := func(write bool) {
		var wg sync.WaitGroup
		for r := 0; r < ranks; r++ {
			wg.Add(1)
			go func(r int) {
				defer wg.Done()
				f, err := os.OpenFile(shared, os.O_RDWR, 0)
				if err != nil {
					t.Error(err)
					return
				}
				defer f.Close()
				b := make([]byte, xfer)
				for s := 0; s < segs; s++ {
					off := int64((s*ranks + r) * xfer)
					if write {
						_, err = f.WriteAt(b, off)
					} else {
						_, err = f.ReadAt(b, off)
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			}(r)
		}
		wg.Wait()
	}
	run(true)
	c = phaseCounts(in.settle())
	t.Logf("ior-hard write, %d transfers: %v", ranks*segs, c)
	run(false)
	c = phaseCounts(in.settle())
	t.Logf("ior-hard read, %d transfers: %v", ranks*segs, c)
}

// checkWriteSyncs checks the requests of n writes each followed by an fdatasync, reports
// of them to the metadata server (SETATTR with the stub's sync): each write goes with its
// sync to its one server, a WRITE_SYNC. Where the machine was slow enough that the write left
// (its gathering, gatherWait, ran out) before the fdatasync came, that write is followed by
// an FSYNC, as before; most of them must not be. A server's first write through the handle
// after one by name opens the object there (a CREATE), once.
func checkWriteSyncs(t *testing.T, what string, n, reports int, c phaseCounts) {
	t.Helper()
	data := c[1:]
	syncs, fsyncs := data.ops(proto.OpWriteSync), data.ops(proto.OpFsync)
	plain := data.ops(proto.OpWrite) + data.ops(proto.OpWriteName)
	creates := data.ops(proto.OpCreate)
	if syncs+fsyncs != n || plain != fsyncs || syncs < n*3/4 || creates > countedServers ||
		c[0][proto.OpSetattr] != reports || c.total() != n+fsyncs+creates+reports {
		t.Errorf("%d fdatasyncs after %s took %d requests (%d WRITE_SYNC, %d FSYNC), want %d WRITE_SYNC (at least %d of them, the rest a write and an FSYNC) and %d size reports: %v",
			n, what, c.total(), syncs, fsyncs, n, n*3/4, reports, c)
	}
}

// checkAppendSyncs checks the requests of n appends, each followed by fdatasync: a write and
// an FSYNC on a data server and a synced size report on the metadata server each.
func checkAppendSyncs(t *testing.T, n int, c phaseCounts) {
	t.Helper()
	data := c[1:]
	plain := data.ops(proto.OpWrite) + data.ops(proto.OpWriteName)
	creates := data.ops(proto.OpCreate)
	if data.ops(proto.OpWriteSync) != 0 || plain != n || data.ops(proto.OpFsync) != n || creates > countedServers ||
		c[0][proto.OpSetattr] != n || c.total() != 3*n+creates {
		t.Errorf("%d fdatasyncs after a 4 KiB append took %d requests, want a write, an FSYNC and a size report each: %v",
			n, c.total(), c)
	}
}

// Four processes writing one striped file side by side (ior-hard: 47008-byte transfers, each
// rank's next one three transfers on) share the node's write-behind: transfers that continue
// each other in a server's object go in one request (before, each descriptor's queue sent
// its own, one request per transfer). Every byte lands where it was written. The stripe
// servers hold the writes until all are made, so that they queue up in the mount however the
// machine schedules the writers (a busy machine otherwise runs them one after the other, and
// each transfer leaves before its neighbour is written).
func TestSharedFileWritersJoinRequests(t *testing.T) {
	in := newCountedInstance(t)
	m := in.mountAt(t, "cn1")
	p := filepath.Join(m.Path(), "ior-hard")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	in.settle()
	const ranks, segs, xfer = 4, 40, 47008
	fill := func(r, s int) []byte { return bytes.Repeat([]byte{byte(1 + r + ranks*s)}, xfer) }
	release := in.holdWrites()
	var written, wg sync.WaitGroup
	for r := 0; r < ranks; r++ {
		written.Add(1)
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				written.Done()
				t.Error(err)
				return
			}
			for s := 0; s < segs; s++ {
				if _, err := f.WriteAt(fill(r, s), int64((s*ranks+r)*xfer)); err != nil {
					t.Error(err)
					break
				}
			}
			written.Done()
			if err := f.Close(); err != nil { // waits for the held writes
				t.Error(err)
			}
		}(r)
	}
	written.Wait()
	release()
	wg.Wait()
	c := phaseCounts(in.settle())
	data := c[1:].ops(proto.OpWrite) + c[1:].ops(proto.OpWriteName)
	t.Logf("%d transfers by %d writers: %d data requests: %v", ranks*segs, ranks, data, c)
	// Each descriptor's own queue sends about 1.2 requests a transfer (some cross a stripe:
	// 192 to 201 here); a rank's transfers never continue each other. Joined in the shared
	// queue, 13 to 15 (a request of up to a stripe each).
	if limit := ranks * segs / 4; data >= limit {
		t.Errorf("%d transfers side by side took %d data requests, want them joined (fewer than %d)", ranks*segs, data, limit)
	}
	got, err := os.ReadFile(p)
	if err != nil || len(got) != ranks*segs*xfer {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, ranks*segs*xfer)
	}
	for s := 0; s < segs; s++ {
		for r := 0; r < ranks; r++ {
			off := (s*ranks + r) * xfer
			if !bytes.Equal(got[off:off+xfer], fill(r, s)) {
				t.Fatalf("transfer %d of rank %d holds other bytes", s, r)
			}
		}
	}
}
