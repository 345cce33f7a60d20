package mount

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// A 4 KiB write followed by fdatasync on a striped file is durable on the servers when
// fdatasync returns: the servers' own files (the stripe objects, the size in the metadata
// server's stub) hold every byte and the size, read right after it returned, with the file
// still open — what a compute node that died then would leave. Appends (the size grows at
// each) and rewrites inside the file.
func TestFdatasyncLeavesTheDataOnTheServers(t *testing.T) {
	in := newStripedInstance(t, 64*mib)
	m := in.mountAt(t, "cn1")
	const name = "synced"
	f, err := os.OpenFile(filepath.Join(m.Path(), name), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []byte
	check := func(what string) {
		t.Helper()
		if got := readBacking(t, in.src, name); !bytes.Equal(got, want) {
			t.Fatalf("after %s's fdatasync returned the servers hold %d bytes (the size on the metadata server), not the %d written",
				what, len(got), len(want))
		}
	}
	for i := 0; i < 40; i++ { // 160 KiB: across stripes and servers
		b := bytes.Repeat([]byte{byte('a' + i%26)}, 4096)
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
		want = append(want, b...)
		check("an append")
	}
	for i := 0; i < 10; i++ {
		off := (i * 37 % 40) * 4096
		b := bytes.Repeat([]byte{byte('A' + i)}, 4096)
		if _, err := f.WriteAt(b, int64(off)); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil { // fsync(2) too
			t.Fatal(err)
		}
		copy(want[off:], b)
		check("a rewrite")
	}
}

// The error of a write that an fdatasync carries to its server with the sync (a server
// full: ENOSPC) is the fdatasync's: each write(2) returned at once (written behind), and the
// fdatasync after the one that did not fit fails. What was synced before stays.
func TestFdatasyncReturnsTheSyncedWritesError(t *testing.T) {
	in := newStripedInstance(t, 1*mib)
	m := in.mountAt(t, "cn1")
	const name = "full"
	f, err := os.OpenFile(filepath.Join(m.Path(), name), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte("x"), testStripeSize)
	var synced int
	var syncErr error
	for i := 0; i < 4*testStripeServers*(1<<20)/testStripeSize; i++ {
		if _, err := f.Write(chunk); err != nil {
			t.Fatalf("write %d: %v (before its fdatasync, which should have reported it)", i, err)
		}
		if syncErr = unix.Fdatasync(int(f.Fd())); syncErr != nil {
			break
		}
		synced += len(chunk)
	}
	if !errors.Is(syncErr, syscall.ENOSPC) {
		t.Fatalf("writing past 4 MiB of servers, an fdatasync after each 64 KiB: the fdatasyncs said %v, want ENOSPC", syncErr)
	}
	if got := readBacking(t, in.src, name); len(got) < synced || !bytes.Equal(got[:synced], bytes.Repeat([]byte("x"), synced)) {
		t.Errorf("the servers hold %d bytes, want the %d synced before the error", len(got), synced)
	}
}

// A storage node of protocol version 7 knows no WRITE_SYNC: an fdatasync after a write
// behind waits for the write and sends an FSYNC, as before, and the data is there.
func TestFdatasyncOnOlderServers(t *testing.T) {
	in := newCountedInstanceOf(t, proto.DirAttrVersion)
	m := in.mountAt(t, "cn1")
	p := filepath.Join(m.Path(), "old")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := bytes.Repeat([]byte("o"), 4096)
	for i := 0; i < countedServers; i++ { // the first object opened (sequential writes stay in its stripe)
		f.Write(buf)
		unix.Fdatasync(int(f.Fd()))
	}
	in.settle()
	const n = 10
	for i := 0; i < n; i++ {
		if _, err := f.WriteAt(buf, int64(i*4096)); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
	}
	c := phaseCounts(in.settle())
	t.Logf("4 KiB write + fdatasync on version 7 servers, %d times: %v", n, c)
	if got := c[1:].ops(proto.OpFsync); got != n || c[1:].ops(proto.OpWriteSync) != 0 {
		t.Errorf("%d fdatasyncs after a write on version 7 servers sent %d FSYNCs, want %d (and no WRITE_SYNC): %v", n, got, n, c)
	}
	got := make([]byte, countedServers*4096)
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, bytes.Repeat([]byte("o"), len(got))) {
		t.Errorf("read back: %v", err)
	}
}

// fio's fdatasync latency job, as bench/ runs it: the file allocated to its size by one
// handle (fallocate), then written 4 KiB at a time from its start through another, each
// write followed by fdatasync. The size the writes stay inside is the metadata server's
// already: once its stub is synced (the first fdatasync), an fdatasync is the data's alone —
// no request to the metadata server, one round trip's worth to the server holding the bytes.
func TestFdatasyncInsideTheAllocatedSizeAsksOnlyTheDataServer(t *testing.T) {
	in := newCountedInstance(t)
	m := in.mountAt(t, "cn1")
	p := filepath.Join(m.Path(), "sync.0.0")
	const size = 1 << 20
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	f, err = os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := bytes.Repeat([]byte("s"), 4096)
	write := func(i int) {
		t.Helper()
		if _, err := f.WriteAt(buf, int64(i*4096)); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
	}
	write(0)
	in.settle()
	const writes = 40
	for i := 1; i <= writes; i++ {
		write(i)
	}
	got := phaseCounts(in.settle())
	t.Logf("%d fdatasyncs: %s", writes, got)
	if n := len(got[0]); n != 0 {
		t.Errorf("%d fdatasyncs inside the allocated size asked the metadata server: %s", writes, got)
	}
	// Each write and its sync: a WRITE then an FSYNC, or one WRITE_SYNC.
	if n := got.total(); n > 2*writes {
		t.Errorf("%d fdatasyncs of 4 KiB took %d requests (more than 2 each): %s", writes, n, got)
	}
	// And the size the metadata server holds is the allocated one, synced.
	if l, _ := backingLayout(t, in.src, "sync.0.0"); l.Length != size {
		t.Errorf("the metadata server holds a size of %d bytes, not the %d allocated", l.Length, size)
	}
}
