package mount

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// requestCounter counts the requests one server gets, by operation.
type requestCounter struct {
	mu  sync.Mutex
	ops map[proto.Op]int
	// held, while not nil, holds the server's writes (WRITE, WRITE_NAME) until it is closed:
	// a test can have its writes queue up in the mount whatever the machine's timing.
	held chan struct{}
}

func (c *requestCounter) add(op proto.Op) {
	c.mu.Lock()
	c.ops[op]++
	held := c.held
	c.mu.Unlock()
	if held != nil && (op == proto.OpWrite || op == proto.OpWriteName) {
		<-held
	}
	if os.Getenv("SPILLWAY_TEST_TRACE") != "" {
		fmt.Fprintf(os.Stderr, "%s %p %s\n", time.Now().Format("05.000000"), c, op)
	}
}

// take returns the counts since the last take and starts again.
func (c *requestCounter) take() map[proto.Op]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.ops
	c.ops = map[proto.Op]int{}
	return out
}

func (c *requestCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.ops {
		n += v
	}
	return n
}

// countedInstance is a striped instance of countedServers stripe servers and a metadata
// server, each counting the requests it gets: server -1 is the metadata server.
type countedInstance struct {
	src      string
	mds      *requestCounter
	stripes  []*requestCounter
	mdsAddr  string
	addrs    []string
	fileSize uint64
	limits   Limits // its mounts'
}

const countedServers = 4

func newCountedInstance(t *testing.T) *countedInstance {
	t.Helper()
	return newCountedInstanceOf(t, 0)
}

// newCountedInstanceOf is newCountedInstance, its servers speaking protocol versions up to
// maxVersion (0: the newest).
func newCountedInstanceOf(t *testing.T, maxVersion uint16) *countedInstance {
	t.Helper()
	return newCountedInstanceWith(t, maxVersion, false)
}

// newCountedInstanceWith is newCountedInstanceOf; with holding, the metadata server is also
// the first stripe server (as the first fragment's storage node is), and counts its
// requests (stripe server 0 counts none).
func newCountedInstanceWith(t *testing.T, maxVersion uint16, holding bool) *countedInstance {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a striped namespace's layout is a trusted extended attribute: root only")
	}
	src, _ := dirs(t)
	l := stripe.Layout{Size: testStripeSize, Width: countedServers, Servers: countedServers}
	if err := unix.Setxattr(src, server.LayoutXattr, l.Encode(), 0); err != nil {
		t.Fatal(err)
	}
	in := &countedInstance{src: src, mds: &requestCounter{ops: map[proto.Op]int{}}}
	var held string // the stripes the metadata server holds
	if holding {
		held = src + ".c0"
	}
	in.mdsAddr = startCountingServer(t, src, held, in.mds, maxVersion)
	for i := 0; i < countedServers; i++ {
		dir := fmt.Sprintf("%s.c%d", src, i)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		c := &requestCounter{ops: map[proto.Op]int{}}
		in.stripes = append(in.stripes, c)
		if dir == held {
			in.addrs = append(in.addrs, in.mdsAddr)
			continue
		}
		in.addrs = append(in.addrs, startCountingServer(t, dir, "", c, maxVersion))
	}
	return in
}

// startCountingServer serves dir, and stripes (unless "") to sessions of stripe objects.
func startCountingServer(t *testing.T, dir, stripes string, c *requestCounter, maxVersion uint16) string {
	t.Helper()
	target := server.Target{Dir: dir, Tracker: usage.New("server "+filepath.Base(dir), 64*mib)}
	s := startServerWith(t, "", target, quietSlog(t), nil, func(o *server.Options) {
		o.OnRequest, o.MaxVersion = c.add, maxVersion
		if stripes != "" {
			o.Resolve = resolveHolding(target, &server.Target{Dir: stripes, Tracker: target.Tracker})
		}
	})
	return s.addr
}

// holdWrites has the stripe servers hold every write they get until the returned function
// is called.
func (in *countedInstance) holdWrites() (release func()) {
	held := make(chan struct{})
	for _, c := range in.stripes {
		c.mu.Lock()
		c.held = held
		c.mu.Unlock()
	}
	return func() {
		for _, c := range in.stripes {
			c.mu.Lock()
			c.held = nil
			c.mu.Unlock()
		}
		close(held)
	}
}

func (in *countedInstance) mountAt(t *testing.T, node string) *Mounted {
	t.Helper()
	mp := filepath.Join(t.TempDir(), "mnt-"+node)
	spec := Spec{MountPath: mp, Limits: in.limits,
		Remote: &Remote{Address: in.mdsAddr, Token: testToken, Client: node, FragmentID: 1, NamespaceID: 2, InstanceID: 3}}
	for _, addr := range in.addrs {
		spec.Stripes = append(spec.Stripes, Server{Remote: &Remote{Address: addr, Token: testToken, Client: node, FragmentID: 1, InstanceID: 3}})
	}
	return mount(t, spec)
}

// settle waits until no server has counted a request for a while (one-way RELEASEs), and
// returns what each counted since the last call: index 0 is the metadata server, then the
// stripe servers in layout order.
func (in *countedInstance) settle() []map[proto.Op]int {
	all := append([]*requestCounter{in.mds}, in.stripes...)
	sum := func() (n int) {
		for _, c := range all {
			n += c.total()
		}
		return n
	}
	last, stable := sum(), 0
	for stable < 5 {
		time.Sleep(20 * time.Millisecond)
		if n := sum(); n != last {
			last, stable = n, 0
		} else {
			stable++
		}
	}
	var out []map[proto.Op]int
	for _, c := range all {
		out = append(out, c.take())
	}
	return out
}

// phaseCounts is what one phase cost: requests per server (metadata server first).
type phaseCounts []map[proto.Op]int

func (p phaseCounts) total() (n int) {
	for _, m := range p {
		for _, v := range m {
			n += v
		}
	}
	return n
}

// servers is how many stripe servers got any request.
func (p phaseCounts) servers() (n int) {
	for _, m := range p[1:] {
		if len(m) > 0 {
			n++
		}
	}
	return n
}

func (p phaseCounts) String() string {
	var b strings.Builder
	for i, m := range p {
		if i == 0 {
			b.WriteString("mds:")
		} else {
			fmt.Fprintf(&b, " s%d:", i-1)
		}
		var ops []string
		for op, n := range m {
			ops = append(ops, fmt.Sprintf("%s=%d", op, n))
		}
		slices.Sort(ops)
		b.WriteString(strings.Join(ops, ","))
	}
	fmt.Fprintf(&b, " (total %d)", p.total())
	return b.String()
}

// smallFileRequests runs mdtest-easy's life of one small file on a four-server striped
// instance (create and write, close, stat, read, remove) and returns the requests each phase
// sent to each server.
func smallFileRequests(t *testing.T, size int) map[string]phaseCounts {
	return smallFileRequestsReading(t, size, os.O_RDONLY)
}

// smallFileRequestsReading is smallFileRequests, reading the file back through a
// descriptor opened with flags.
func smallFileRequestsReading(t *testing.T, size int, flags int) map[string]phaseCounts {
	in := newCountedInstance(t)
	m := in.mountAt(t, "cn1")
	dir := filepath.Join(m.Path(), "rank0")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	in.settle()
	out := map[string]phaseCounts{}
	p := filepath.Join(dir, "file.0")
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i)
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	out["create"] = in.settle()
	if st, err := os.Stat(p); err != nil || st.Size() != int64(size) {
		t.Fatalf("stat: %v %v", st, err)
	}
	out["stat"] = in.settle()
	r, err := os.OpenFile(p, flags, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(got) != string(data) {
		t.Fatalf("read back %d bytes (%v), want %d", len(got), err, size)
	}
	out["read"] = in.settle()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	out["remove"] = in.settle()
	for _, phase := range []string{"create", "stat", "read", "remove"} {
		t.Logf("%d bytes, %s: %v", size, phase, out[phase])
	}
	return out
}

// objectsLeft is how many stripe objects the counted instance's servers hold.
func (in *countedInstance) objectsLeft(t *testing.T) (n int) {
	t.Helper()
	for i := range in.stripes {
		objs, err := os.ReadDir(fmt.Sprintf("%s.c%d", in.src, i))
		if err != nil {
			t.Fatal(err)
		}
		n += len(objs)
	}
	return n
}

// Creating, writing and closing a small file asks its one stripe server once (WRITE_NAME:
// the object created, written and closed in one request; before, CREATE, WRITE and
// RELEASE), and the metadata server three times (CREATE, the size report, RELEASE; the
// kernel's GETATTR of the directory, which the test's mkdir and the create made it drop, is
// answered from the MKDIR's and CREATE's replies, protocol version 7): 4 requests, 7 before.
func TestStripedSmallFileCreateRequests(t *testing.T) {
	c := smallFileRequests(t, 3901)["create"]
	if n := c[1:].total(); n != 1 || c.servers() != 1 {
		t.Errorf("create+write+close of 3901 bytes: %d requests to %d stripe servers, want 1 to 1: %v", n, c.servers(), c)
	}
	if c.total() > 4 || c.ops(proto.OpGetattr) != 0 {
		t.Errorf("create+write+close: %d requests, want at most 4 and no GETATTR: %v", c.total(), c)
	}
}

// Reading a small file back asks the one stripe server holding it once (a READ by name, no
// OPEN or RELEASE of its object), and the metadata server nothing: the file's creator holds
// its attributes, leased, and its layout, and opens it lazily (node.openLazily): 1 request, 3
// before (OPEN, READ, RELEASE), 6 before that. So does reading it through a descriptor opened
// for reading and writing, as mdtest does.
func TestStripedSmallFileReadRequests(t *testing.T) {
	for _, flags := range []int{os.O_RDONLY, os.O_RDWR} {
		c := smallFileRequestsReading(t, 3901, flags)["read"]
		if n := c[1:].total(); n != 1 || c.servers() != 1 || c[1:].ops(proto.OpRead) != 1 {
			t.Errorf("read of 3901 bytes (flags %#o): %d requests to %d stripe servers, want one READ: %v", flags, n, c.servers(), c)
		}
		if len(c[0]) != 0 {
			t.Errorf("read (flags %#o): the metadata server was asked: %v", flags, c)
		}
	}
}

// A reader whose size is leased (its OPEN's) still sees what is appended after it read, by
// another node once that node closed the file, and by another descriptor of its own node.
func TestStripedLeasedSizeSeesLaterWrites(t *testing.T) {
	in := newCountedInstance(t)
	m1, m2 := in.mountAt(t, "cn1"), in.mountAt(t, "cn2")
	p1, p2 := filepath.Join(m1.Path(), "grows"), filepath.Join(m2.Path(), "grows")
	if err := os.WriteFile(p1, []byte("first "), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(p2)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	readAll := func(want string) {
		t.Helper()
		buf := make([]byte, 100)
		n, _ := r.ReadAt(buf, 0)
		if string(buf[:n]) != want {
			t.Errorf("read %q, want %q", buf[:n], want)
		}
	}
	readAll("first ")
	appendTo := func(p, s string) {
		t.Helper()
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	appendTo(p1, "second ")
	readAll("first second ")
	appendTo(p2, "third")
	readAll("first second third")
}

func (p phaseCounts) ops(op proto.Op) (n int) {
	for _, m := range p {
		n += m[op]
	}
	return n
}

// Removing a striped file asks only the stripe servers that hold its objects, as its
// stub's record says: one for a small file, none for an empty one, three for a file of
// 2.5 stripes (grown by truncate, which counts as a write); every server when the record is
// unknown (a writer on another node still has it open). A file made by mknod, never opened
// for writing, has none; one whose writer's node was lost is unknown for good. Every object
// goes either way.
func TestStripedRemoveAsksOnlyObjectHolders(t *testing.T) {
	in := newCountedInstance(t)
	m := in.mountAt(t, "cn1")
	other := in.mountAt(t, "cn2")
	remove := func(name string, want int, prepare func(p string)) {
		t.Helper()
		p := filepath.Join(m.Path(), name)
		prepare(p)
		in.settle()
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		c := phaseCounts(in.settle())
		if got := c[1:].ops(proto.OpUnlink); got != want || c[1:].total() != want {
			t.Errorf("%s: removing it sent %d UNLINKs to stripe servers, want %d: %v", name, got, want, c)
		}
		if n := in.objectsLeft(t); n != 0 {
			t.Errorf("%s: %d objects left after removing it", name, n)
		}
	}
	remove("small", 1, func(p string) {
		if err := os.WriteFile(p, make([]byte, 3901), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	remove("empty", 0, func(p string) {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	remove("mknod", 0, func(p string) { // never opened for writing
		if err := unix.Mknod(p, unix.S_IFREG|0o644, 0); err != nil {
			t.Fatal(err)
		}
	})
	remove("truncated", 3, func(p string) {
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 5*testStripeSize/2); err != nil {
			t.Fatal(err)
		}
	})
	remove("rewritten", 2, func(p string) { // shrunk, its objects stay where they were
		if err := os.WriteFile(p, make([]byte, testStripeSize+1), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 10); err != nil {
			t.Fatal(err)
		}
	})
	remove("overwritten", 3, func(p string) { // O_TRUNC: the objects stay, emptied
		if err := os.WriteFile(p, make([]byte, 5*testStripeSize/2), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, 100), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	remove("writer-lost", countedServers, func(p string) {
		if err := os.WriteFile(p, make([]byte, 100), 0o644); err != nil {
			t.Fatal(err)
		}
		// A writer whose node is lost: its connection ends without a RELEASE. Its objects
		// could be anywhere, and stay unknown after later writers close.
		c, err := client.Dial(context.Background(), client.Options{Address: in.mdsAddr, Token: testToken, Client: "cn3",
			Fragment: 1, Namespace: 2, Instance: 3, Log: log.New(io.Discard, "", 0)})
		if err != nil {
			t.Fatal(err)
		}
		var rep proto.OpenReply
		if errno := c.Do(context.Background(), &client.Call{Op: proto.OpOpen, Req: &proto.OpenReq{Path: "writer-lost", Flags: unix.O_WRONLY}, Reply: &rep}); errno != 0 {
			t.Fatal(errno)
		}
		c.Close()
		in.settle()
		if err := os.WriteFile(p, make([]byte, 200), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	var f *os.File
	remove("open-elsewhere", countedServers, func(p string) {
		if err := os.WriteFile(p, make([]byte, 100), 0o644); err != nil {
			t.Fatal(err)
		}
		var err error
		f, err = os.OpenFile(filepath.Join(other.Path(), "open-elsewhere"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(make([]byte, 3*testStripeSize), 0); err != nil {
			t.Fatal(err)
		}
	})
	f.Close()

	// Renaming over a file removes the replaced one's objects from its servers alone.
	src, dst := filepath.Join(m.Path(), "new"), filepath.Join(m.Path(), "old")
	os.WriteFile(dst, make([]byte, 3901), 0o644)
	os.WriteFile(src, nil, 0o644)
	in.settle()
	if err := os.Rename(src, dst); err != nil {
		t.Fatal(err)
	}
	if c := phaseCounts(in.settle()); c[1:].total() != 1 {
		t.Errorf("renaming over a small file: %d requests to stripe servers, want 1: %v", c[1:].total(), c)
	}
	if n := in.objectsLeft(t); n != 0 {
		t.Errorf("%d objects left after renaming an empty file over a small one", n)
	}
}

// TestStripedSmallFileRequests logs what one small file's life costs on a four-server
// instance, per phase and server.
func TestStripedSmallFileRequests(t *testing.T) {
	smallFileRequests(t, 3901)
}

// Against servers of protocol version 5 (before ObjectsVersion) a mount does as it did: it
// opens objects to read and write them, and removes a file's objects from every server.
func TestStripedSmallFileOnOlderServers(t *testing.T) {
	in := newCountedInstanceOf(t, proto.LeaseVersion)
	m := in.mountAt(t, "cn1")
	p := filepath.Join(m.Path(), "f")
	data := bytes.Repeat([]byte("0123456789"), 400)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	c := phaseCounts(in.settle())
	if c.ops(proto.OpWriteName) != 0 || c[1:].ops(proto.OpCreate) != 1 || c[1:].ops(proto.OpWrite) != 1 {
		t.Errorf("writing: %v, want a CREATE and a WRITE of the object", c)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes: %v", len(got), err)
	}
	c = phaseCounts(in.settle())
	if c[1:].ops(proto.OpOpen) != 1 || c[1:].ops(proto.OpRead) != 1 {
		t.Errorf("reading: %v, want an OPEN and a READ of the object", c)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	c = phaseCounts(in.settle())
	if c[1:].ops(proto.OpUnlink) != countedServers {
		t.Errorf("removing: %v, want an UNLINK on every server", c)
	}
	if n := in.objectsLeft(t); n != 0 {
		t.Errorf("%d objects left", n)
	}
}

// mdtestRequests runs mdtest's phases over files files of size bytes in one directory of a
// four-server striped instance, as one rank does (every file created and written, then every
// file stat'ed, then read through a read-write descriptor, then removed), and returns each
// phase's requests per file, the first file left out (it pays for the directory's first
// lookups): what the steady state costs.
func mdtestRequests(t *testing.T, size, files int) map[string]map[proto.Op]float64 {
	return mdtestRequestsOf(t, 0, size, files)
}

// mdtestRequestsOf is mdtestRequests against servers of protocol versions up to maxVersion
// (0: the newest).
func mdtestRequestsOf(t *testing.T, maxVersion uint16, size, files int) map[string]map[proto.Op]float64 {
	return mdtestRanksRequests(t, maxVersion, size, files, 1)
}

// mdtestRanksRequests is mdtestRequestsOf with ranks processes of one node working in the
// one directory at once (as mdtest-hard's ranks do), each on files files of its own: the
// requests are per file still.
func mdtestRanksRequests(t *testing.T, maxVersion uint16, size, files, ranks int) map[string]map[proto.Op]float64 {
	return mdtestOn(t, newCountedInstanceOf(t, maxVersion), size, files, ranks)
}

// mdtestOn is mdtestRanksRequests on instance in.
func mdtestOn(t *testing.T, in *countedInstance, size, files, ranks int) map[string]map[proto.Op]float64 {
	// A create behind waits for its file's first write however busy the machine (the
	// longest wait allowed): its count does not depend on how soon the write came.
	in.limits.CreateWriteWait = time.Second
	m := in.mountAt(t, "cn1")
	dir := filepath.Join(m.Path(), "mdtest")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{7}, size)
	name := func(rank, i int) string { return filepath.Join(dir, fmt.Sprintf("file.mdtest.%d.%d", rank, i)) }
	phases := []struct {
		name string
		do   func(p string) error
	}{
		{"create", func(p string) error {
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644) // as IOR's POSIX backend
			if err != nil {
				return err
			}
			if size > 0 {
				if _, err := f.Write(data); err != nil {
					return err
				}
			}
			return f.Close()
		}},
		{"stat", func(p string) error {
			st, err := os.Stat(p)
			if err == nil && st.Size() != int64(size) {
				err = fmt.Errorf("size %d, want %d", st.Size(), size)
			}
			return err
		}},
		{"read", func(p string) error {
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				return err
			}
			if size > 0 {
				got := make([]byte, size)
				if _, err := io.ReadFull(f, got); err != nil {
					return err
				}
				if !bytes.Equal(got, data) {
					return fmt.Errorf("read other bytes than were written")
				}
			}
			return f.Close()
		}},
		{"remove", os.Remove},
	}
	out := map[string]map[proto.Op]float64{}
	for _, ph := range phases {
		for r := 0; r < ranks; r++ {
			if err := ph.do(name(r, 0)); err != nil {
				t.Fatalf("%s of rank %d's first file: %v", ph.name, r, err)
			}
		}
		in.settle()
		errs := make(chan error, ranks)
		for r := 0; r < ranks; r++ {
			go func() {
				for i := 1; i < files; i++ {
					if err := ph.do(name(r, i)); err != nil {
						errs <- fmt.Errorf("%s of rank %d's file %d: %v", ph.name, r, i, err)
						return
					}
				}
				errs <- nil
			}()
		}
		for r := 0; r < ranks; r++ {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		per := map[proto.Op]float64{}
		for _, c := range in.settle() {
			for op, n := range c {
				per[op] += float64(n) / float64(ranks*(files-1))
			}
		}
		out[ph.name] = per
	}
	var total float64
	for _, ph := range phases {
		var sum float64
		var ops []string
		for op, n := range out[ph.name] {
			sum += n
			ops = append(ops, fmt.Sprintf("%s=%.2f", op, n))
		}
		slices.Sort(ops)
		total += sum
		t.Logf("%d bytes, %d ranks, %s: %.2f requests per file: %s", size, ranks, ph.name, sum, strings.Join(ops, " "))
	}
	t.Logf("%d bytes: %.2f requests per file", size, total)
	return out
}

func perFile(m map[proto.Op]float64) (n float64) {
	for _, v := range m {
		n += v
	}
	return n
}

// mdtest-easy's steady state (empty files, a directory of their own): a create costs the
// CREATE and the RELEASE, a remove the UNLINK alone — the kernel's GETATTR of the directory
// after each (it drops the directory's attributes at every change of its entries, and asks
// for them at the next permission check) is answered by the mount from the attributes the
// CREATE's or UNLINK's reply leased (proto.DirAttrVersion); the read phase's open and close
// ask nothing (node.openLazily): 3 requests per file, 5 before, 7 before that. The creates
// go behind (createbehind.go), each a PLACE of a file the storage node made ahead, asked for
// in batches that grow (RESERVE: 8, 16, then 32 files at a time).
func TestMdtestEasyRequests(t *testing.T) {
	r := mdtestRequests(t, 0, 20)
	want := map[string]float64{"create": 2, "stat": 0, "read": 0, "remove": 1}
	reserves := r["create"][proto.OpReserve]
	delete(r["create"], proto.OpReserve)
	for phase, w := range want {
		if got := perFile(r[phase]); got > w+0.01 {
			t.Errorf("%s: %.2f requests per file, want %v: %v", phase, got, w, r[phase])
		}
	}
	// How many went behind depends on when the first RESERVE's answer came (before it, the
	// creates wait for the server): createbehind_test.go tests that they do.
	if reserves > 0.25 {
		t.Errorf("create: %.2f RESERVEs per file, want at most 0.25 (batches of 8 and more): %v", reserves, r["create"])
	}
	if n := r["create"][proto.OpGetattr] + r["remove"][proto.OpGetattr]; n > 0 {
		t.Errorf("the directory's attributes were asked for %.2f times per file", n)
	}
}

// mdtest-hard's steady state (3901-byte files): besides the directory's GETATTR, the
// kernel's GETXATTR of security.capability at each new file's first write is answered by
// the mount (a file it created, leased, has none), and so is the stat after the close; the
// read phase's open and close ask nothing. A create goes behind, and its PLACE, sent at the
// file's first write, opens the file for it (no OPEN), and the size report at close releases
// that handle (no RELEASE): the PLACE, the data's WRITE_NAME and the SETATTR, 3 requests a
// file (5 before); the remove asks the one server holding its object, the size report said
// which: 6 requests per file, 9 before, 13 before that.
func TestMdtestHardRequests(t *testing.T) {
	r := mdtestRequests(t, 3901, 20)
	create := r["create"]
	if create[proto.OpOpen] > 0 || create[proto.OpRelease] > create[proto.OpCreate] || create[proto.OpSetattr] > 1 {
		t.Errorf("create: %.2f OPENs, %.2f RELEASEs (of %.2f plain CREATEs), %.2f SETATTRs per file; want none, only the plain creates', one: %v",
			create[proto.OpOpen], create[proto.OpRelease], create[proto.OpCreate], create[proto.OpSetattr], create)
	}
	if n := create[proto.OpPlace] + create[proto.OpCreate]; n < 0.99 || n > 1.01 {
		t.Errorf("create: %.2f PLACEs and CREATEs per file, want 1: %v", n, create)
	}
	if n := r["remove"][proto.OpUnlink]; n > 2.01 {
		t.Errorf("remove: %.2f UNLINKs per file, want 2 (the metadata server's and the one object's): %v", n, r["remove"])
	}
	if n := r["create"][proto.OpGetxattr]; n > 0 {
		t.Errorf("create: %.2f GETXATTRs per file, want none: %v", n, r["create"])
	}
	if n := r["create"][proto.OpGetattr] + r["remove"][proto.OpGetattr]; n > 0 {
		t.Errorf("the directory's attributes were asked for %.2f times per file: %v %v", n, r["create"], r["remove"])
	}
	// The stat after the file was written and closed is answered from the attributes the
	// close's size report leased.
	if n := perFile(r["stat"]); n > 0 {
		t.Errorf("stat: %.2f requests per file, want none: %v", n, r["stat"])
	}
	// The read opens lazily: the stripe server's READ alone.
	if n := perFile(r["read"]); n > 1.01 || r["read"][proto.OpRead] < 0.99 {
		t.Errorf("read: %.2f requests per file, want the READ alone: %v", n, r["read"])
	}
}

// Where the metadata server holds stripes of its instance too (the first fragment's storage
// node does), an mdtest-hard file is placed whole: its 3901 bytes ride in the PLACE, kept in
// the file's object on that server, and the file is closed there — one request a file, not
// three (no WRITE_NAME, no size report); it reads back from there (the read phase checks
// the bytes) and its removal asks that one server.
func TestMdtestHardRequestsPlacedWhole(t *testing.T) {
	in := newCountedInstanceWith(t, 0, true)
	r := mdtestOn(t, in, 3901, 20, 1)
	create := r["create"]
	if n := create[proto.OpPlace] + create[proto.OpCreate]; n < 0.99 || n > 1.01 {
		t.Errorf("create: %.2f PLACEs and CREATEs per file, want 1: %v", n, create)
	}
	if n := create[proto.OpPlace]; n < 0.8 {
		t.Errorf("create: %.2f PLACEs per file, want most files created behind: %v", n, create)
	}
	if plain := create[proto.OpCreate] + 0.01; create[proto.OpWriteName]+create[proto.OpWrite] > plain || create[proto.OpSetattr] > plain || create[proto.OpOpen] > 0 {
		t.Errorf("create: writes, size reports or opens beyond the plain creates' (%.2f per file): %v", create[proto.OpCreate], create)
	}
	if n := r["read"][proto.OpRead]; n < 0.99 || perFile(r["read"]) > 1.01 {
		t.Errorf("read: %v, want the READ alone", r["read"])
	}
	if n := perFile(r["stat"]); n > 0 {
		t.Errorf("stat: %.2f requests per file, want none: %v", n, r["stat"])
	}
	// The metadata server removes the object it holds with the name; the files made by a
	// plain CREATE (before the first files made ahead came) have theirs anywhere.
	if n := r["remove"][proto.OpUnlink]; n > 1+create[proto.OpCreate]+0.01 {
		t.Errorf("remove: %.2f UNLINKs per file, want 1 (the name, its object with it): %v", n, r["remove"])
	}
	if n := in.objectsLeft(t); n != 0 {
		t.Errorf("%d objects left after every file was removed", n)
	}
}

// A metadata server of the version before takes no PLACE with the file's data: the mount
// sends the held bytes as the file's first write, as before (3 requests a file), and
// stops trying.
func TestPlacedWholeOnOlderServers(t *testing.T) {
	in := newCountedInstanceWith(t, proto.PlacedWriterVersion, true)
	r := mdtestOn(t, in, 3901, 10, 1)
	create := r["create"]
	if create[proto.OpWriteName] < 0.99 || create[proto.OpSetattr] > 1.01 || create[proto.OpPlace] > 1.01 {
		t.Errorf("create: %v, want a PLACE, a WRITE_NAME and a size report per file", create)
	}
	if n := in.objectsLeft(t); n != 0 {
		t.Errorf("%d objects left after every file was removed", n)
	}
}

// Servers of protocol version 6 send no directory attributes with CREATE and UNLINK: the
// mount asks for them, as before, and sees every change.
func TestMdtestOnOlderServers(t *testing.T) {
	r := mdtestRequestsOf(t, proto.ObjectsVersion, 0, 10)
	if n := r["create"][proto.OpGetattr]; n != 1 {
		t.Errorf("create: %.2f GETATTRs per file, want 1 (the directory's): %v", n, r["create"])
	}
	if n := r["remove"][proto.OpGetattr]; n != 1 {
		t.Errorf("remove: %.2f GETATTRs per file, want 1 (the directory's): %v", n, r["remove"])
	}
}

// mdtest-hard's four ranks in their one directory at once: the GETXATTR of security.capability
// at each new file's first write is answered by the mount as with one rank, though other
// ranks' creates, writes and size reports of other files are in flight beside it.
func TestMdtestHardRanksRequests(t *testing.T) {
	r := mdtestRanksRequests(t, 0, 3901, 20, 4)
	if n := r["create"][proto.OpGetxattr]; n > 0 {
		t.Errorf("create: %.2f GETXATTRs per file, want none: %v", n, r["create"])
	}
	if n := perFile(r["stat"]); n > 0 {
		t.Errorf("stat: %.2f requests per file, want none: %v", n, r["stat"])
	}
}

// The files a mount created are remembered as having no security.capability (leases.go,
// noCaps) only while the kernel holds them: mdtest-easy's thousands of files, created and
// removed, leave no entry behind to fill the table, so that mdtest-hard's files, created
// right after, are answered by the mount too (0.5 GETXATTRs per file before, on the
// benchmark's run of both within the lease).
func TestRemovedFilesLeaveNoCapsRoom(t *testing.T) {
	in := newCountedInstance(t)
	m := in.mountAt(t, "cn1")
	dir := filepath.Join(m.Path(), "easy")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	name := func(i int) string { return filepath.Join(dir, fmt.Sprint("file.", i)) }
	for i := 0; i < maxCachedAttrs; i++ {
		if err := os.WriteFile(name(i), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Their stubs stay on the metadata server's disk under another name, so that the new
	// files get inode numbers of their own (a number a removed file had may be answered
	// from what was noted of that file).
	kept := filepath.Join(filepath.Dir(in.src), "kept")
	if err := os.Mkdir(kept, 0o700); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < maxCachedAttrs; i++ {
		if err := os.Link(filepath.Join(in.src, "easy", fmt.Sprint("file.", i)), filepath.Join(kept, fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(name(i)); err != nil {
			t.Fatal(err)
		}
	}
	in.settle()
	hard := filepath.Join(m.Path(), "hard")
	if err := os.Mkdir(hard, 0o755); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{7}, 3901)
	const files = 20
	for i := 0; i < files; i++ {
		f, err := os.OpenFile(filepath.Join(hard, fmt.Sprint("file.", i)), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644) // as IOR's POSIX backend
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var asked int
	for _, c := range in.settle() {
		asked += c[proto.OpGetxattr]
	}
	if asked > 0 {
		t.Errorf("%d GETXATTRs for %d new files written, want none", asked, files)
	}
}

// A striped file's writes reach its metadata server as their size report at the close, with
// the time of the change: another node sees the file's mtime move with its writes (the size
// report asked for it, and the server took only the size).
func TestStripedWritesMoveMtimeElsewhere(t *testing.T) {
	in := newCountedInstance(t)
	a := in.mountAt(t, "cn1")
	b := in.mountAt(t, "cn2")
	pa, pb := filepath.Join(a.Path(), "f"), filepath.Join(b.Path(), "f")
	if err := os.WriteFile(pa, []byte("first"), 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(pb)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	f, err := os.OpenFile(pa, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("and more"), 5); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(pb)
	if err != nil {
		t.Fatal(err)
	}
	if after.Size() != 13 {
		t.Errorf("size on the other node: %d, want 13", after.Size())
	}
	if !after.ModTime().After(before.ModTime()) {
		t.Errorf("mtime on the other node after the writes and close: %v, was %v before them: want later", after.ModTime(), before.ModTime())
	}
}
