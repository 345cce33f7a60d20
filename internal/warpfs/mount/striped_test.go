package mount

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// stripedInstance is a striped namespace served over TCP by a metadata server and
// testStripeServers stripe servers, each with its own tracker, as the instance's storage nodes
// would; mountAt mounts it as another compute node would.
type stripedInstance struct {
	src      string
	mds      string
	stripes  []string // addresses
	trackers []*usage.Tracker
}

func newStripedInstance(t *testing.T, perServer uint64) *stripedInstance {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a striped namespace's layout is a trusted extended attribute: root only")
	}
	src, _ := dirs(t)
	l := stripe.Layout{Size: testStripeSize, Width: testStripeServers, Servers: testStripeServers}
	if err := unix.Setxattr(src, "trusted.spillway.layout", l.Encode(), 0); err != nil {
		t.Fatal(err)
	}
	in := &stripedInstance{src: src}
	mdsTracker := usage.New("metadata", perServer)
	in.mds = startServer(t, "", src, mdsTracker, nil).addr
	for _, dir := range stripeDirs(src) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		tr := usage.New("server "+filepath.Base(dir), perServer)
		in.trackers = append(in.trackers, tr)
		in.stripes = append(in.stripes, startServer(t, "", dir, tr, quietSlog(t)).addr)
	}
	return in
}

func (in *stripedInstance) spec(mp, node string) Spec {
	spec := Spec{MountPath: mp, Logger: nil,
		Remote: &Remote{Address: in.mds, Token: testToken, Client: node, FragmentID: 1, NamespaceID: 2, InstanceID: 3}}
	for _, addr := range in.stripes {
		spec.Stripes = append(spec.Stripes, Server{Remote: &Remote{Address: addr, Token: testToken, Client: node, FragmentID: 1, InstanceID: 3}})
	}
	return spec
}

func (in *stripedInstance) mountAt(t *testing.T, node string) *Mounted {
	t.Helper()
	mp := filepath.Join(t.TempDir(), "mnt-"+node)
	return mount(t, in.spec(mp, node))
}

// Files larger and smaller than a stripe land on the servers the stripe map names, whole; the
// layout is readable and settable as an extended attribute; a striped file has one name.
func TestStripedLayoutOnTheServers(t *testing.T) {
	in := newStripedInstance(t, 64*mib)
	m := in.mountAt(t, "cn1")
	root := m.Path()
	rng := rand.New(rand.NewSource(7))
	for _, size := range []int{0, 100, testStripeSize - 1, testStripeSize, 5*testStripeSize + 123, 3 << 20} {
		data := make([]byte, size)
		rng.Read(data)
		name := "f" + strings.Repeat("x", size%7)
		if err := os.WriteFile(filepath.Join(root, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if got := readBacking(t, in.src, name); !bytes.Equal(got, data) {
			t.Fatalf("%d bytes: the servers hold %d bytes, not what was written", size, len(got))
		}
		l, _ := backingLayout(t, in.src, name)
		for s, dir := range stripeDirs(in.src) {
			st, err := os.Stat(filepath.Join(dir, stripe.ObjectName(l.ID)))
			want := l.ObjectSize(uint64(size), s)
			if want == 0 && err == nil && st.Size() != 0 || want > 0 && (err != nil || uint64(st.Size()) != want) {
				t.Errorf("%d bytes: server %d object: %v, want %d bytes", size, s, err, want)
			}
		}
		if st, err := os.Stat(filepath.Join(root, name)); err != nil || st.Size() != int64(size) {
			t.Errorf("stat of %d bytes: %v %v", size, st, err)
		}
		if got, err := os.ReadFile(filepath.Join(root, name)); err != nil || !bytes.Equal(got, data) {
			t.Errorf("reading %d bytes back: %v", size, err)
		}
	}

	// Stripe control: a directory's layout is inherited by new files; a file's can be set
	// while it is empty.
	dir := filepath.Join(root, "narrow")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(dir, "user.spillway.layout", []byte("stripe_size=8192 stripe_width=2"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "g"), make([]byte, 40000), 0o644); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	n, err := unix.Getxattr(filepath.Join(dir, "g"), "user.spillway.layout", buf)
	if err != nil || !strings.HasPrefix(string(buf[:n]), "stripe_size=8192 stripe_width=2 start=") {
		t.Errorf("an inherited layout reads %q, %v", buf[:n], err)
	}
	pinned := filepath.Join(root, "pinned")
	os.Mkdir(pinned, 0o755)
	if err := unix.Setxattr(pinned, "user.spillway.layout", []byte("stripe_width=1 start=1"), 0); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		os.WriteFile(filepath.Join(pinned, name), []byte(name), 0o644)
		if l, _ := backingLayout(t, in.src, "pinned/"+name); l.Start != 1 || l.Width != 1 {
			t.Errorf("a file in a directory pinned to server 1: %+v", l)
		}
	}
	if err := unix.Setxattr(filepath.Join(dir, "g"), "user.spillway.layout", []byte("stripe_width=3"), 0); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("changing the layout of a file with data: %v, want EEXIST", err)
	}
	for _, bad := range []string{"stripe_size=1000", "stripe_width=4", "colour=red"} {
		if err := unix.Setxattr(dir, "user.spillway.layout", []byte(bad), 0); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("layout %q: %v, want EINVAL", bad, err)
		}
	}
	f, err := os.Create(filepath.Join(root, "wide"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsetxattr(int(f.Fd()), "user.spillway.layout", []byte("stripe_size=4096 stripe_width=1 start=2"), 0); err != nil {
		t.Fatal(err)
	}
	f.Write(make([]byte, 20000))
	f.Close()
	if l, _ := backingLayout(t, in.src, "wide"); l.Width != 1 || l.Start != 2 || l.Size != 4096 || l.Length != 20000 {
		t.Errorf("a layout set on an empty file: %+v", l)
	}
	// The server's own attributes are never shown.
	n, _ = unix.Listxattr(filepath.Join(root, "wide"), buf)
	if strings.Contains(string(buf[:n]), "trusted.spillway") {
		t.Errorf("listxattr shows %q", buf[:n])
	}
	if err := os.Link(filepath.Join(root, "wide"), filepath.Join(root, "second-name")); !errors.Is(err, syscall.EPERM) {
		t.Errorf("a hard link of a striped file: %v, want EPERM", err)
	}
}

// Two compute nodes write one file, in disjoint and in overlapping ranges; after both close,
// every node and a fresh mount read the same bytes, and stat the same size.
func TestStripedTwoWritersOneFile(t *testing.T) {
	in := newStripedInstance(t, 64*mib)
	a, b := in.mountAt(t, "cn1"), in.mountAt(t, "cn2")
	const chunk = 100 * kib // not a multiple of the stripe: writes cross servers
	want := make([]byte, 8*chunk)
	fa, err := os.OpenFile(filepath.Join(a.Path(), "shared"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := os.OpenFile(filepath.Join(b.Path(), "shared"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(3))
	var wg sync.WaitGroup
	for i, f := range []*os.File{fa, fb} {
		// Disjoint: node i writes chunks i, i+2, ... of the first half.
		for c := i; c < 4; c += 2 {
			data := make([]byte, chunk)
			rng.Read(data)
			copy(want[c*chunk:], data)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := f.WriteAt(data, int64(c*chunk)); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	wg.Wait()
	// Overlapping: both write the second half, one after the other; the later wins.
	first := bytes.Repeat([]byte{0xaa}, 4*chunk)
	second := bytes.Repeat([]byte{0x55}, 3*chunk)
	if _, err := fa.WriteAt(first, 4*chunk); err != nil {
		t.Fatal(err)
	}
	// Across nodes, what comes first is what was synced (or closed) first: writes go on
	// behind the writer until then.
	if err := fa.Sync(); err != nil {
		t.Fatal(err)
	}
	if _, err := fb.WriteAt(second, 4*chunk+chunk/2); err != nil {
		t.Fatal(err)
	}
	copy(want[4*chunk:], first)
	copy(want[4*chunk+chunk/2:], second)
	fa.Close()
	fb.Close()
	sum := sha256.Sum256(want)
	c := in.mountAt(t, "cn3")
	for _, m := range []*Mounted{a, b, c} {
		got, err := os.ReadFile(filepath.Join(m.Path(), "shared"))
		if err != nil || sha256.Sum256(got) != sum {
			t.Errorf("%s reads %d bytes that differ (%v)", m.Path(), len(got), err)
		}
	}
	if got := readBacking(t, in.src, "shared"); sha256.Sum256(got) != sum {
		t.Errorf("the servers hold %d bytes that differ", len(got))
	}
	var used uint64
	for _, tr := range in.trackers {
		used += tr.Used()
	}
	if used != uint64(len(want)) {
		t.Errorf("the servers charge %d bytes for a %d-byte file", used, len(want))
	}
}

// objectsFootprint is the footprint of the stripe objects of namespace src (usage.Charged of
// its stripe directories, less the directories themselves as they were made).
func objectsFootprint(t *testing.T, src string) uint64 {
	t.Helper()
	dirs := stripeDirs(src)
	total, err := usage.Charged(dirs...)
	if err != nil {
		t.Fatal(err)
	}
	return total - min(total, uint64(len(dirs))*emptyDirFootprint(t, filepath.Dir(src)))
}

// A file removed while open on this node keeps its data until closed; then its objects go.
// A removed or replaced file's objects go at once.
func TestStripedRemovalFreesEveryServer(t *testing.T) {
	in := newStripedInstance(t, 64*mib)
	m := in.mountAt(t, "cn1")
	p := filepath.Join(m.Path(), "open")
	data := bytes.Repeat([]byte("0123456789abcdef"), 40000)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Errorf("reading a removed open file: %v", err)
	}
	used := func() (sum uint64) {
		for _, tr := range in.trackers {
			sum += tr.Used()
		}
		return sum
	}
	if want := objectsFootprint(t, in.src); used() != want || want < uint64(len(data)) {
		t.Errorf("while open, the servers charge %d bytes, want %d (the objects' %d bytes in whole blocks)", used(), want, len(data))
	}
	f.Close()
	waitFor(t, func() bool { return used() == 0 }, "the objects of a removed file to go at its last close")

	os.WriteFile(filepath.Join(m.Path(), "old"), data, 0o644)
	os.WriteFile(filepath.Join(m.Path(), "new"), data[:1000], 0o644)
	if err := os.Rename(filepath.Join(m.Path(), "new"), filepath.Join(m.Path(), "old")); err != nil {
		t.Fatal(err)
	}
	// The replaced file's objects go at its release, which the kernel may send after the
	// rename (os.WriteFile's close() returns before it): wait for them.
	oneObjectEach := func() bool {
		for _, dir := range stripeDirs(in.src) {
			if objs, _ := os.ReadDir(dir); len(objs) > 1 {
				return false
			}
		}
		return true
	}
	waitFor(t, oneObjectEach, "the objects of the file renamed over to go at its release")
	if want := objectsFootprint(t, in.src); used() != want || want < 1000 {
		t.Errorf("after renaming over a file the servers charge %d bytes, want %d (1000 bytes in whole blocks)", used(), want)
	}
}

// statfs: the instance's size is its servers' sum, and free is what striping can still use,
// the servers times the least free one.
func TestStripedStatfs(t *testing.T) {
	in := newStripedInstance(t, 10*mib)
	m := in.mountAt(t, "cn1")
	if err := in.trackers[1].Reserve(4 * mib); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(m.Path(), &st); err != nil {
		t.Fatal(err)
	}
	if size := st.Blocks * uint64(st.Frsize); size != 30*mib {
		t.Errorf("size %d, want 30 MiB", size)
	}
	if free := st.Bavail * uint64(st.Frsize); free != 18*mib {
		t.Errorf("available %d, want 3 × 6 MiB", free)
	}
}

// quietSlog drops a test server's connection chatter.
func quietSlog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// A loadbalance mount reads one replica, and when that replica's server dies, the next: a
// file open across the failover goes on reading, new opens work, nothing may be written.
func TestReplicasFailOver(t *testing.T) {
	testReplicasFailOver(t, client.Limits{RequestTimeout: 1500 * time.Millisecond, KeepaliveInterval: 300 * time.Millisecond, ReconnectWait: 50 * time.Millisecond})
}

// A replica whose server refuses connections (its agent died) is left at the first refusal,
// not after warpfs.request_timeout: with a timeout of a minute the reads still end at once.
func TestReplicasFailOverAtTheFirstRefusal(t *testing.T) {
	testReplicasFailOver(t, client.Limits{RequestTimeout: time.Minute, KeepaliveInterval: 300 * time.Millisecond, ReconnectWait: 50 * time.Millisecond})
}

func testReplicasFailOver(t *testing.T, lim client.Limits) {
	_, mp := dirs(t)
	var servers []*testServer
	var replicas []Server
	data := bytes.Repeat([]byte("replica "), 100000)
	for i := 0; i < 2; i++ {
		dir := t.TempDir()
		for _, name := range []string{"a", "b"} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		s := startServer(t, "", dir, usage.New("replica", 64*mib), quietSlog(t))
		servers = append(servers, s)
		replicas = append(replicas, Server{Node: fmt.Sprintf("ssd%d", i+1),
			Remote: &Remote{Address: s.addr, Token: testToken, Client: "cn1", NamespaceID: int64(i + 1), Limits: lim}})
	}
	m := mount(t, Spec{MountPath: mp, ReadOnly: true, Replicas: replicas, Logger: quietLogger(t)})
	f, err := os.Open(filepath.Join(m.Path(), "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	// Which replicas exist and which one this node reads (`spillway stripes`).
	xattr := func(name string) string {
		t.Helper()
		n, err := unix.Getxattr(filepath.Join(m.Path(), "a"), name, buf)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return ""
		}
		return string(buf[:n])
	}
	if got, cur := xattr(ReplicasXattr), xattr(ReplicaXattr); got != "ssd1 ssd2" || cur != "ssd1" {
		t.Errorf("replicas %q, read now %q; want ssd1 ssd2, ssd1", got, cur)
	}
	servers[0].stop()
	start := time.Now()
	// The replica's server refuses connections: the failover must not wait the request
	// timeout. The bound is generous (a loaded machine) but far below a minute's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), min(2*lim.RequestTimeout+time.Second, 20*time.Second))
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		got := make([]byte, len(data))
		if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
			t.Errorf("reading an open file after its replica died: %v", err)
		}
		if b, err := os.ReadFile(filepath.Join(m.Path(), "b")); err != nil || !bytes.Equal(b, data) {
			t.Errorf("opening another file after the failover: %v", err)
		}
	}()
	select {
	case <-done:
		t.Logf("failed over in %s", time.Since(start).Round(time.Millisecond))
	case <-ctx.Done():
		t.Errorf("the failover took more than %s (request timeout %s)", time.Since(start).Round(time.Millisecond), lim.RequestTimeout)
		<-done // the reads end with the request timeout; the mount is unmounted after
	}
	if err := os.WriteFile(filepath.Join(m.Path(), "c"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("writing to a loadbalance mount: %v, want EROFS", err)
	}
	if cur := xattr(ReplicaXattr); cur != "ssd2" {
		t.Errorf("the replica read after the failover: %q, want ssd2", cur)
	}
}

// Small writes that queue behind a writer, sequential ones and rewrites of bytes written just
// before, across stripes and servers, land in the order they were made (sendQueue sends runs
// of them as one request).
func TestStripedSmallWritesBehind(t *testing.T) {
	in := newStripedInstance(t, 64*mib)
	m := in.mountAt(t, "cn1")
	p := filepath.Join(m.Path(), "log")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	const size = 5*testStripeSize + 1000
	want := make([]byte, size)
	write := func(off int, b []byte) {
		t.Helper()
		if _, err := f.WriteAt(b, int64(off)); err != nil {
			t.Fatal(err)
		}
		copy(want[off:], b)
	}
	for off, i := 0, 0; off < size; off, i = off+3000, i+1 {
		b := bytes.Repeat([]byte{byte('a' + i%26)}, min(3000, size-off))
		write(off, b)
		if i%7 == 6 { // a rewrite of what the last writes queued
			write(off-5000, bytes.Repeat([]byte{'#'}, 6000))
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Fatalf("read back %d bytes, want %d; first difference at %d", len(got), len(want), i)
	}
}

// Two processes writing one striped file share the node's write-behind: an error is the
// writer's whose bytes the failed request carried. One filling its servers past their
// capacity learns ENOSPC at its close; the other, whose writes fit, closes without error,
// and its bytes are there.
func TestSharedWriteBehindErrorsStayWithTheirWriter(t *testing.T) {
	in := newStripedInstance(t, 4*mib)
	m := in.mountAt(t, "cn1")
	p := filepath.Join(m.Path(), "shared")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	small, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	big, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("s"), 1000)
	if _, err := small.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if err := small.Sync(); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	var bigErr error
	for off := int64(1 << 20); off < 64<<20 && bigErr == nil; off += 1 << 20 {
		_, bigErr = big.WriteAt(chunk, off)
	}
	if err := big.Close(); bigErr == nil {
		bigErr = err
	}
	if !errors.Is(bigErr, syscall.ENOSPC) {
		t.Errorf("writing 63 MiB into 16 MiB of servers: %v, want ENOSPC", bigErr)
	}
	if err := small.Close(); err != nil {
		t.Errorf("the other writer's close: %v, want none (its writes fit)", err)
	}
	got := make([]byte, len(want))
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Errorf("the other writer's bytes: %q... (%v)", got[:10], err)
	}
}
