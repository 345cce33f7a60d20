package mount

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage/xfstest"
	"golang.org/x/sys/unix"
)

// serverFragment is the fragment of server i of a test backend whose namespace's fragment is
// f (nil: none): server 0 holds the namespace, as an instance's first fragment holds its
// metadata and its first stripes; the others are fragments of their own with the same write
// window, made once per f.
func serverFragment(f *server.Fragment, i int) *server.Fragment {
	if f == nil || i == 0 {
		return f
	}
	derivedMu.Lock()
	defer derivedMu.Unlock()
	key := derivedKey{f, i}
	if d := derived[key]; d != nil {
		return d
	}
	d := server.NewFragment(f.ID*100+int64(i), f.Instance, f.Limits(), nil)
	derived[key] = d
	return d
}

type derivedKey struct {
	f *server.Fragment
	i int
}

var (
	derivedMu sync.Mutex
	derived   = map[derivedKey]*server.Fragment{}
)

// shardShare is the MFC each shard of a max_mds namespace enforces (as the controller
// gives it, stripe.ShardLimit).
func shardShare(total uint64, shards int) uint64 { return stripe.ShardLimit(total, shards) }

// The write window (DataWarp's write protection): past write_limit bytes within the window
// every change to the fragment fails with EROFS (writes, creates, truncates, opens for
// writing), reads go on, and once the window cooled down the fragment takes writes again.
func TestWriteWindow(t *testing.T) { eachBackend(t, testWriteWindow) }

func testWriteWindow(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 50", 64*mib)
	const limit = mib
	const window = 2 * time.Second
	frag := server.NewFragment(50, 50, server.FragmentLimits{WriteLimit: limit, WindowLength: window}, nil)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, Fragment: frag, Client: "test-node", Logger: quietLogger(t)})
	p := filepath.Join(m.Path(), "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A striped file's data is spread over the servers, each counting what it holds: write
	// until every server is past its limit. Errors of a striped file's writes may come at
	// the next write or at fsync (write-behind).
	chunk := make([]byte, 128*kib)
	var written int
	var werr error
	for written < 16*mib && werr == nil {
		var n int
		n, werr = f.Write(chunk)
		written += n
		if werr == nil && b.striped {
			werr = f.Sync()
		}
	}
	if !errors.Is(werr, syscall.EROFS) {
		t.Fatalf("writing %d bytes with a write limit of %d per fragment: %v, want EROFS", written, limit, werr)
	}
	t.Logf("EROFS after %d bytes", written)
	if _, err := os.ReadFile(p); err != nil {
		t.Errorf("reading while the fragment is read-only: %v", err)
	}
	if !b.striped {
		// The namespace's own fragment is the one read-only: every change of its files.
		if err := os.WriteFile(filepath.Join(m.Path(), "new"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
			t.Errorf("creating a file while read-only: %v, want EROFS", err)
		}
		if err := os.Truncate(p, 4*mib); !errors.Is(err, syscall.EROFS) {
			t.Errorf("truncating while read-only: %v, want EROFS", err)
		}
		if _, err := os.OpenFile(p, os.O_WRONLY, 0); !errors.Is(err, syscall.EROFS) {
			t.Errorf("opening for writing while read-only: %v, want EROFS", err)
		}
	}
	u := frag.Usage(0)
	if !b.striped && (!u.ReadOnly || u.WindowWritten < limit) {
		t.Errorf("the fragment's usage while read-only: %+v", u)
	}

	// The window cools down: writes succeed again (polled; the wait is bounded, not measured).
	deadline := time.Now().Add(10 * window)
	for {
		g, err := os.OpenFile(filepath.Join(m.Path(), "after"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err == nil {
			_, err = g.Write(chunk)
			if err == nil {
				err = g.Sync()
			}
			if cerr := g.Close(); err == nil {
				err = cerr
			}
		}
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EROFS) {
			t.Fatalf("writing after the window: %v, want success (or EROFS until it cooled down)", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("still EROFS %s after the limit tripped, with a window of %s", 10*window, window)
		}
		time.Sleep(window / 10)
	}
	// A striped file's writes queued behind (write-behind) may still reach this fragment
	// after the write above went to another server's: then it trips again a little later and
	// cools as well. Only an unstriped namespace's fragment must be writable right away.
	u = frag.Usage(0)
	for b.striped && u.ReadOnly && time.Now().Before(deadline) {
		time.Sleep(window / 10)
		u = frag.Usage(0)
	}
	if u.ReadOnly || u.MaxWindowWrite < limit {
		t.Errorf("the fragment's usage after cooling: %+v", u)
	}
}

// MFC: a namespace creates at most max_files_created files (regular files, symbolic links,
// device and FIFO nodes; not directories); the next create fails with EMFILE, an existing
// file still opens with O_CREAT, and removing files gives no creates back.
func TestMaxFilesCreated(t *testing.T) { eachBackend(t, testMaxFilesCreated) }

func testMaxFilesCreated(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 51", 4*mib)
	const mfc = 5
	frag := server.NewFragment(51, 51, server.FragmentLimits{}, nil)
	frag.Namespace(2).SetLimits(mfc, 0)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, Fragment: frag, NamespaceID: 2, Client: "test-node"})
	if err := os.Mkdir(filepath.Join(m.Path(), "d"), 0o755); err != nil {
		t.Fatalf("mkdir (directories are not counted): %v", err)
	}
	created := 0
	var err error
	for created < 4*mfc {
		if err = os.WriteFile(filepath.Join(m.Path(), "d", fmt.Sprintf("f%d", created)), []byte("x"), 0o644); err != nil {
			break
		}
		created++
	}
	if !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("creating files with MFC=%d: %d created, then %v; want EMFILE", mfc, created, err)
	}
	// One namespace server counts exactly; a max_mds namespace's shards each take their share.
	want := mfc
	if b.shards > 1 {
		if created < int(shardShare(mfc, b.shards)) || created > b.shards*int(shardShare(mfc, b.shards)) {
			t.Errorf("a namespace over %d shards created %d files with MFC=%d", b.shards, created, mfc)
		}
		want = created
	}
	if created != want {
		t.Errorf("created %d files with MFC=%d", created, mfc)
	}
	if b.shards > 1 {
		return // which shard refuses the next name depends on the name
	}
	if err := os.Symlink("f0", filepath.Join(m.Path(), "link")); !errors.Is(err, syscall.EMFILE) {
		t.Errorf("a symbolic link past MFC: %v, want EMFILE", err)
	}
	f, err := os.OpenFile(filepath.Join(m.Path(), "d", "f0"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("opening an existing file with O_CREAT past MFC: %v", err)
	} else {
		f.Close()
	}
	if err := os.Remove(filepath.Join(m.Path(), "d", "f1")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.Path(), "d", "again"), nil, 0o644); !errors.Is(err, syscall.EMFILE) {
		t.Errorf("a create after a removal: %v, want EMFILE (MFC counts files created)", err)
	}
	u := frag.Usage(0)
	if u.FilesCreated != mfc || len(u.Namespaces) != 1 || u.Namespaces[0].FilesCreated != mfc || u.Namespaces[0].FilesCreateLimit != mfc {
		t.Errorf("usage: %+v", u)
	}
}

// The counters match what went through the mount: bytes and operations written and read,
// per fragment, namespace and client.
func TestUsageCounters(t *testing.T) { eachBackend(t, testUsageCounters) }

func testUsageCounters(t *testing.T, b testBackend) {
	src, mp := dirs(t)
	tr := usage.New("instance 52", 64*mib)
	frag := server.NewFragment(52, 52, server.FragmentLimits{}, nil)
	m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, Fragment: frag, NamespaceID: 2, Client: "test-node",
		DisablePassthrough: true})
	const size = 8 * mib
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(filepath.Join(m.Path(), "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	// Read it back from the server, not from the page cache the writes filled.
	r, err := os.Open(filepath.Join(m.Path(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	unix.Fadvise(int(r.Fd()), 0, 0, unix.FADV_DONTNEED)
	_, err = io.Copy(io.Discard, r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	var written, read, created uint64
	frags := []*server.Fragment{frag}
	for i := 1; i < max(testStripeServers, b.shards); i++ {
		if b.striped {
			frags = append(frags, serverFragment(frag, i))
		}
	}
	for _, f := range frags {
		u := f.Usage(0)
		written += u.BytesWritten
		read += u.BytesRead
		created += u.FilesCreated
		for _, c := range u.Clients {
			if c.Node != "test-node" {
				t.Errorf("fragment %d counts a client %q", f.ID, c.Node)
			}
		}
	}
	if written < size || written > size+size/100 {
		t.Errorf("bytes written counted: %d, wrote %d", written, size)
	}
	// The kernel may read ahead, and a file may be read from its cache: at most the size
	// plus readahead, at least something.
	if read == 0 || read > 2*size {
		t.Errorf("bytes read counted: %d, read %d", read, size)
	}
	if created != 1 {
		t.Errorf("files created counted: %d, want 1", created)
	}
	if !b.striped {
		u := frag.Usage(0)
		if len(u.Namespaces) != 1 || u.Namespaces[0].BytesWritten != u.BytesWritten || u.Namespaces[0].MaxOffsetWritten != size {
			t.Errorf("namespace usage: %+v", u.Namespaces)
		}
	}
	// The namespace's bytes, over every server (a striped file's data is on its stripe
	// servers): what the file system wrote and read, issue 23 item 9. The furthest offset
	// written is the file's, not an object's.
	var nsWritten, nsRead, maxOff uint64
	for _, f := range frags {
		for _, n := range f.Usage(0).Namespaces {
			if n.Namespace != 2 && b.shards < 2 { // max_mds: each shard is a namespace of its own
				t.Errorf("fragment %d counts namespace %d, want 2 only", f.ID, n.Namespace)
			}
			nsWritten += n.BytesWritten
			nsRead += n.BytesRead
			maxOff = max(maxOff, n.MaxOffsetWritten)
		}
	}
	if nsWritten != written || nsRead != read || maxOff != size {
		t.Errorf("namespace 2 over the servers: written %d read %d max offset %d, want %d, %d, %d (the fragments' totals)", nsWritten, nsRead, maxOff, written, read, size)
	}
}

// The co-located path is no hole in the write window: where the kernel would write a local
// mount's files itself (FUSE passthrough), a fragment with a window keeps the writes on the
// server, which counts every byte and refuses past the limit; without a window the kernel
// writes, as before.
func TestWriteWindowKeepsWritesOnTheServer(t *testing.T) {
	xfstest.NeedPassthrough(t)
	withKernelWritesWithoutQuota(t)
	for _, limited := range []bool{false, true} {
		t.Run(fmt.Sprintf("window=%v", limited), func(t *testing.T) {
			src, mp := dirs(t)
			tr := usage.New("instance 53", 64*mib)
			var lim server.FragmentLimits
			if limited {
				lim = server.FragmentLimits{WriteLimit: 4 * mib, WindowLength: time.Hour}
			}
			frag := server.NewFragment(53, 53, lim, nil)
			m := mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, Fragment: frag, NamespaceID: 2, Client: "test-node"})
			if m.KernelWrites() == limited {
				t.Fatalf("kernel writes %v with a window %v", m.KernelWrites(), limited)
			}
			err := os.WriteFile(filepath.Join(m.Path(), "f"), make([]byte, 6*mib), 0o644)
			u := frag.Usage(0)
			if !limited {
				if err != nil {
					t.Fatal(err)
				}
				if m.backend.writes.Load() != 0 {
					t.Error("without a window the server still served the writes")
				}
				return
			}
			if !errors.Is(err, syscall.EROFS) {
				t.Errorf("6 MiB through a co-located mount with a 4 MiB window: %v, want EROFS", err)
			}
			if u.BytesWritten < 4*mib || u.BytesWritten >= 6*mib || !u.ReadOnly {
				t.Errorf("the server counted %+v", u)
			}
		})
	}
}
