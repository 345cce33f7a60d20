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
// instance: a 4 KiB write + fdatasync (fio's latency job: 3 requests, the write, the FSYNC of
// its server and the size report with the stub's sync; before, an FSYNC to every server the
// descriptor had written to), and logs ior-hard's 47008-byte transfers by four writers of one
// shared file, then their reads.
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
	t.Logf("4 KiB write + fdatasync, %d times: %v", n, c)
	// Each fdatasync asks the one data server written since the last (and the metadata
	// server its size report and sync), not every server the descriptor ever wrote to.
	if got := c.ops(proto.OpFsync); got != n {
		t.Errorf("%d fdatasyncs after a 4 KiB write each sent %d FSYNCs to data servers, want %d: %v", n, got, n, c)
	}
	f.Close()
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

// Four processes writing one striped file side by side (ior-hard: 47008-byte transfers, each
// rank's next one three transfers on) share the node's write-behind: transfers that continue
// each other in a server's object go in one request (before, each descriptor's queue sent
// its own, one request per transfer). Every byte lands where it was written.
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
	var wg sync.WaitGroup
	for r := 0; r < ranks; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Error(err)
				return
			}
			for s := 0; s < segs; s++ {
				if _, err := f.WriteAt(fill(r, s), int64((s*ranks+r)*xfer)); err != nil {
					t.Error(err)
					break
				}
			}
			if err := f.Close(); err != nil {
				t.Error(err)
			}
		}(r)
	}
	wg.Wait()
	c := phaseCounts(in.settle())
	data := c[1:].ops(proto.OpWrite) + c[1:].ops(proto.OpWriteName)
	t.Logf("%d transfers by %d writers: %d data requests: %v", ranks*segs, ranks, data, c)
	// Each descriptor's own queue sent about 1.2 requests a transfer (some cross a stripe):
	// 192 to 201 here. Joined, 37 to 146, as the writers' timing goes.
	if limit := ranks * segs * 9 / 8; data >= limit {
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
