package server

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// newStripedFixture is newFixture of a striped namespace (a layout of 4 servers on its
// root), which needs root: its layout is a trusted extended attribute, its stubs chowned.
func newStripedFixture(t *testing.T, lim Limits) *fixture {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a striped namespace's layout is a trusted extended attribute, and stubs are chowned: root only")
	}
	f := newFixture(t, lim)
	root := stripe.Layout{Size: 1 << 20, Width: 4, Servers: 4}
	if err := unix.Setxattr(f.dir, LayoutXattr, root.Encode(), 0); err != nil {
		t.Fatal(err)
	}
	return f
}

// Files made ahead (RESERVE) are nameless until a PLACE names one: as its reserver's create
// would have made it, with the inode number RESERVE gave; only once, only in the directory it
// was made in, only where the name is free, only for the mode it was made for. A session's
// stubs never placed go with it.
func TestReserveAndPlace(t *testing.T) {
	f := newStripedFixture(t, Limits{})
	dir := filepath.Join(f.dir, "d")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	const uid, gid = 4242, 4343
	as := func(c *client.Client, op proto.Op, req, reply proto.Message) syscall.Errno {
		return c.Do(context.Background(), &client.Call{Op: op, UID: uid, GID: gid, Req: req, Reply: reply})
	}
	c := f.client()
	var res proto.ReserveReply
	if errno := as(c, proto.OpReserve, &proto.ReserveReq{Dir: "d", Mode: 0o640, Count: 5}, &res); errno != 0 {
		t.Fatalf("RESERVE: %v", errno)
	}
	if len(res.Inos) != 5 || res.Attr.UID != uid || res.Attr.GID != gid || res.Attr.Mode != syscall.S_IFREG|0o640 {
		t.Fatalf("RESERVE gave %d files, attributes %+v; want 5, regular 0640, %d:%d", len(res.Inos), res.Attr, uid, gid)
	}
	if names, _ := os.ReadDir(dir); len(names) != 0 {
		t.Fatalf("reserved files have names: %v", names)
	}

	place := func(stub uint64, d, name string, mode uint32) (proto.OpenReply, syscall.Errno) {
		var rep proto.OpenReply
		req := &proto.PlaceReq{Stub: stub, CreateReq: proto.CreateReq{Dir: d, Name: name, Flags: syscall.O_WRONLY | syscall.O_CREAT | syscall.O_EXCL, Mode: mode}}
		return rep, as(c, proto.OpPlace, req, &rep)
	}
	time.Sleep(1100 * time.Millisecond)              // reserved well before it is placed
	before := time.Now().Add(-50 * time.Millisecond) // the kernel's clock for file times is coarse
	rep, errno := place(res.Inos[0], "d", "a", 0o640)
	if errno != 0 {
		t.Fatalf("PLACE: %v", errno)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "a"), &st); err != nil {
		t.Fatal(err)
	}
	if rep.Attr.Ino != res.Inos[0] || st.Ino != res.Inos[0] || st.Uid != uid || st.Gid != gid || st.Mode != syscall.S_IFREG|0o640 || st.Nlink != 1 {
		t.Errorf("placed: reply inode %d, on disk inode %d %o %d:%d nlink %d; want inode %d, 0640, %d:%d, one link",
			rep.Attr.Ino, st.Ino, st.Mode, st.Uid, st.Gid, st.Nlink, res.Inos[0], uid, gid)
	}
	if time.Unix(st.Mtim.Unix()).Before(before) {
		t.Errorf("placed file's mtime %v is older than its PLACE (%v)", time.Unix(st.Mtim.Unix()), before)
	}
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(filepath.Join(dir, "a"), LayoutXattr, buf)
	l, rec, ok := decodeStub(buf[:max(n, 0)], err)
	if !ok || l.ID == 0 || len(rep.Layout) == 0 {
		t.Errorf("placed file has no stripe layout (on disk %v %v, in the reply %d bytes)", err, ok, len(rep.Layout))
	}
	if objects, known := decodeObjects(rec); !known || len(objects) != 0 {
		t.Errorf("placed file's record of objects: known %v, %v; want known, none (nobody opened it to write)", known, objects)
	}
	if rep.Handle != 0 {
		t.Errorf("PLACE opened a handle (%d): it opens nothing", rep.Handle)
	}

	for _, tc := range []struct {
		what      string
		stub      uint64
		dir, name string
		mode      uint32
		want      syscall.Errno
	}{
		{"placed twice", res.Inos[0], "d", "b", 0o640, syscall.ESTALE},
		{"never reserved", 1 << 50, "d", "b", 0o640, syscall.ESTALE},
		{"a name taken", res.Inos[1], "d", "a", 0o640, syscall.EEXIST},
		{"in another directory", res.Inos[2], "", "b", 0o640, syscall.EXDEV},
		{"for another mode", res.Inos[3], "d", "b", 0o600, syscall.EINVAL},
		{"refused once: dropped", res.Inos[1], "d", "b", 0o640, syscall.ESTALE},
	} {
		if _, errno := place(tc.stub, tc.dir, tc.name, tc.mode); errno != tc.want {
			t.Errorf("PLACE %s: %v, want %v", tc.what, errno, tc.want)
		}
	}
	if names, _ := os.ReadDir(dir); len(names) != 1 {
		t.Errorf("names after the refused PLACEs: %v, want only a", names)
	}
	for _, tc := range []struct {
		what string
		req  proto.ReserveReq
		want syscall.Errno
	}{
		{"no such directory", proto.ReserveReq{Dir: "nowhere", Mode: 0o644, Count: 1}, syscall.ENOENT},
		{"a file", proto.ReserveReq{Dir: "d/a", Mode: 0o644, Count: 1}, syscall.ENOTDIR},
		{"outside", proto.ReserveReq{Dir: "../outside", Mode: 0o644, Count: 1}, syscall.EINVAL},
	} {
		if errno := as(c, proto.OpReserve, &tc.req, &proto.ReserveReply{}); errno != tc.want {
			t.Errorf("RESERVE in %s: %v, want %v", tc.what, errno, tc.want)
		}
	}

	// The stubs a session never placed close with it.
	c2 := f.client()
	if errno := as(c2, proto.OpReserve, &proto.ReserveReq{Dir: "d", Mode: 0o600, Count: 7}, &res); errno != 0 || len(res.Inos) != 7 {
		t.Fatalf("second session's RESERVE: %v, %d files", errno, len(res.Inos))
	}
	held := func() int {
		n := 0
		fds, _ := os.ReadDir("/proc/self/fd")
		for _, fd := range fds {
			if to, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(to, dir+"/#") {
				n++
			}
		}
		return n
	}
	if n := held(); n != 7+1 { // the first session's last stub, never placed
		t.Errorf("%d nameless files open, want 8", n)
	}
	c2.Close()
	deadline := time.Now().Add(10 * time.Second)
	for held() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := held(); n != 1 {
		t.Errorf("%d nameless files still open after their session closed, want 1 (the first session's)", n)
	}
}

// Files made ahead take at most half of what the namespace's MFC has left, and never refuse
// their own session's creates: a CREATE past MFC while the session holds some takes the
// admission of one (which is then gone).
func TestReservedFilesYieldToCreatesAtMFC(t *testing.T) {
	f := newStripedFixture(t, Limits{})
	const mfc = 10
	f.fragment = NewFragment(1, 1, FragmentLimits{}, nil)
	f.fragment.Namespace(1).SetLimits(mfc, 0)
	c := f.client()
	var res proto.ReserveReply
	if errno := do(c, proto.OpReserve, &proto.ReserveReq{Mode: 0o644, Count: 8}, &res); errno != 0 || len(res.Inos) != mfc/2 {
		t.Fatalf("RESERVE of 8 with MFC %d: %v, %d files; want %d", mfc, errno, len(res.Inos), mfc/2)
	}
	created := 0
	for ; created < 2*mfc; created++ {
		var rep proto.OpenReply
		req := &proto.CreateReq{Name: fmt.Sprintf("f%d", created), Flags: syscall.O_WRONLY | syscall.O_CREAT | syscall.O_EXCL, Mode: 0o644}
		if errno := do(c, proto.OpCreate, req, &rep); errno != 0 {
			if errno != syscall.EMFILE {
				t.Fatalf("create %d: %v, want EMFILE at most", created, errno)
			}
			break
		}
		do(c, proto.OpRelease, &proto.HandleReq{Handle: rep.Handle}, nil)
	}
	if created != mfc {
		t.Errorf("%d creates before EMFILE, want %d: the session's files ahead gave their admissions", created, mfc)
	}
	req := &proto.PlaceReq{Stub: res.Inos[0], CreateReq: proto.CreateReq{Name: "placed", Flags: syscall.O_WRONLY | syscall.O_CREAT | syscall.O_EXCL, Mode: 0o644}}
	if errno := do(c, proto.OpPlace, req, &proto.OpenReply{}); errno != syscall.ESTALE {
		t.Errorf("PLACE of a file ahead whose admission a create took: %v, want ESTALE", errno)
	}
}

// Files made ahead count with the session's open files, and give way to opens: past
// warpfs.max_open_files an open drops the oldest rather than failing.
func TestReservedFilesYieldToOpens(t *testing.T) {
	f := newStripedFixture(t, Limits{MaxOpenFiles: 3})
	c := f.client()
	var res proto.ReserveReply
	if errno := do(c, proto.OpReserve, &proto.ReserveReq{Mode: 0o644, Count: 8}, &res); errno != 0 || len(res.Inos) != 3 {
		t.Fatalf("RESERVE of 8 with 3 open files allowed: %v, %d files; want 3", errno, len(res.Inos))
	}
	opened := 0
	for ; opened < 5; opened++ {
		req := &proto.CreateReq{Name: fmt.Sprintf("f%d", opened), Flags: syscall.O_RDWR | syscall.O_CREAT, Mode: 0o644}
		if errno := do(c, proto.OpCreate, req, &proto.OpenReply{}); errno != 0 {
			if errno != syscall.EMFILE {
				t.Fatalf("open %d: %v", opened, errno)
			}
			break
		}
	}
	if opened != 3 {
		t.Errorf("%d files opened before EMFILE with a limit of 3 and 3 files made ahead, want 3", opened)
	}
}

// A PLACE whose creator wrote before it left opens the file for writing (PlaceReq.Writer),
// as a CREATE does; the writer's size report at close may release that handle in the same
// request (SetattrReq.Release), saying where its objects are, as a RELEASE would: the record
// is then known. A report that fails keeps the handle.
func TestPlaceOpensForItsWriter(t *testing.T) {
	f := newStripedFixture(t, Limits{})
	c := f.client()
	var res proto.ReserveReply
	if errno := do(c, proto.OpReserve, &proto.ReserveReq{Mode: 0o644, Count: 2}, &res); errno != 0 || len(res.Inos) != 2 {
		t.Fatalf("RESERVE: %v, %d files", errno, len(res.Inos))
	}
	place := func(stub uint64, name string, flags uint32) proto.OpenReply {
		t.Helper()
		var rep proto.OpenReply
		req := &proto.PlaceReq{Stub: stub, Writer: true, CreateReq: proto.CreateReq{Name: name, Flags: flags | syscall.O_CREAT | syscall.O_EXCL, Mode: 0o644}}
		if errno := do(c, proto.OpPlace, req, &rep); errno != 0 {
			t.Fatalf("PLACE of %s for its writer: %v", name, errno)
		}
		return rep
	}
	record := func(name string) (stripe.Layout, []byte, bool) {
		t.Helper()
		buf := make([]byte, 256)
		n, err := unix.Lgetxattr(filepath.Join(f.dir, name), LayoutXattr, buf)
		l, rec, ok := decodeStub(buf[:max(n, 0)], err)
		if !ok {
			t.Fatalf("%s has no stub: %v", name, err)
		}
		objects, known := decodeObjects(rec)
		return l, objects, known
	}
	report := func(handle, size uint64, release bool) (proto.Attr, syscall.Errno) {
		var rep proto.AttrReply
		req := &proto.SetattrReq{Handle: handle, Valid: proto.SetSizeAtLeast | proto.SetMtimeNow, Size: size, Release: release, Objects: []byte{0b0100}}
		errno := do(c, proto.OpSetattr, req, &rep)
		return rep.Attr, errno
	}

	w := place(res.Inos[0], "w", syscall.O_WRONLY)
	if w.Handle == 0 {
		t.Fatal("PLACE for its writer opened nothing")
	}
	if _, objects, known := record("w"); known {
		t.Errorf("a file open for writing has its objects recorded as known (%v): want unknown until its writer closes", objects)
	}
	if _, errno := report(0, 1, true); errno != syscall.EINVAL {
		t.Errorf("a report releasing no handle: %v, want EINVAL", errno)
	}
	if _, errno := report(w.Handle, 1<<63, true); errno != syscall.EFBIG {
		t.Errorf("a report past the largest size: %v, want EFBIG", errno)
	}
	before := time.Now().Add(-50 * time.Millisecond)
	a, errno := report(w.Handle, 3901, true) // the failed one kept the handle
	if errno != 0 || a.Size != 3901 {
		t.Fatalf("the writer's report at close: %v, size %d; want 3901", errno, a.Size)
	}
	if l, objects, known := record("w"); l.Length != 3901 || !known || len(objects) != 1 || objects[0] != 0b0100 {
		t.Errorf("after the report that released the handle: length %d, objects %v known %v; want 3901, [0b0100] known", l.Length, objects, known)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(f.dir, "w"), &st); err != nil || time.Unix(st.Mtim.Unix()).Before(before) {
		t.Errorf("mtime after the report %v (%v), want after %v", time.Unix(st.Mtim.Unix()), err, before)
	}
	if errno := do(c, proto.OpRelease, &proto.HandleReq{Handle: w.Handle}, nil); errno != syscall.EBADF {
		t.Errorf("RELEASE of the handle the report released: %v, want EBADF", errno)
	}

	// Not opened for writing: nothing to open.
	if r := place(res.Inos[1], "r", syscall.O_RDONLY); r.Handle != 0 {
		t.Errorf("PLACE for its writer of a read-only open opened handle %d", r.Handle)
	}
	if _, objects, known := record("r"); !known || len(objects) != 0 {
		t.Errorf("record of a file placed for a reader: %v known %v, want none, known", objects, known)
	}
}

// A PLACE carrying the whole file (PlaceReq.Data) keeps the data in the file's object on this
// node's stripes — the layout starts there, the record names it — and places the file closed,
// its size the data's; where the data cannot go whole (past a stripe, a directory that fixes
// its files' start, a server the layout has not) it is refused with EOPNOTSUPP and the stub
// stays, for a PLACE without it. An UNLINK naming this node's stripes (EntryReq.Local)
// removes the object with the name.
func TestPlaceWhole(t *testing.T) {
	f := newStripedFixture(t, Limits{})
	f.objects = filepath.Join(filepath.Dir(f.dir), "stripes")
	fixed := filepath.Join(f.dir, "fixed")
	for _, d := range []string{f.objects, fixed} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fixedLayout := stripe.Layout{ID: stripe.FixedStart, Size: 1 << 20, Width: 1, Servers: 4, Start: 3}
	if err := unix.Setxattr(fixed, LayoutXattr, fixedLayout.Encode(), 0); err != nil {
		t.Fatal(err)
	}
	c := f.client()
	reserve := func(dir string) uint64 {
		t.Helper()
		var res proto.ReserveReply
		if errno := do(c, proto.OpReserve, &proto.ReserveReq{Dir: dir, Mode: 0o644, Count: 1}, &res); errno != 0 || len(res.Inos) != 1 {
			t.Fatalf("RESERVE in %q: %v", dir, errno)
		}
		return res.Inos[0]
	}
	place := func(stub uint64, dir, name string, server uint32, data []byte) (proto.OpenReply, syscall.Errno) {
		var rep proto.OpenReply
		req := &proto.PlaceReq{Stub: stub, DataServer: server, Data: data,
			CreateReq: proto.CreateReq{Dir: dir, Name: name, Flags: syscall.O_WRONLY | syscall.O_CREAT | syscall.O_EXCL, Mode: 0o644}}
		return rep, do(c, proto.OpPlace, req, &rep)
	}
	data := bytes.Repeat([]byte("whole"), 800)

	counted := func() float64 {
		var m dto.Metric
		dataPath.writtenBytes[transportRemote].Write(&m)
		return m.GetCounter().GetValue()
	}
	written := counted()
	rep, errno := place(reserve(""), "", "w", 2, data)
	if errno != 0 || rep.Handle != 0 || rep.Attr.Size != uint64(len(data)) {
		t.Fatalf("PLACE with the data: %v, handle %d, size %d; want no handle, size %d", errno, rep.Handle, rep.Attr.Size, len(data))
	}
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(filepath.Join(f.dir, "w"), LayoutXattr, buf)
	l, rec, ok := decodeStub(buf[:max(n, 0)], err)
	objects, known := decodeObjects(rec)
	if !ok || l.Start != 2 || l.Length != uint64(len(data)) || !known || !bytes.Equal(objects, []byte{0b0100}) {
		t.Fatalf("placed whole: layout %+v, objects %v known %v; want start 2, length %d, [0b0100] known", l, objects, known, len(data))
	}
	if got := counted() - written; got < float64(len(data)) {
		t.Errorf("bytes written counted %.0f for a PLACE of %d", got, len(data))
	}
	object := filepath.Join(f.objects, stripe.ObjectName(l.ID))
	if got, err := os.ReadFile(object); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("its object holds %d bytes (%v), want the %d placed", len(got), err, len(data))
	}

	stub := reserve("")
	for _, refused := range []struct {
		why    string
		server uint32
		data   []byte
	}{
		{"past a stripe", 0, make([]byte, 1<<20+1)},
		{"a server the layout has not", 4, data},
	} {
		if _, errno := place(stub, "", "r", refused.server, refused.data); errno != syscall.EOPNOTSUPP {
			t.Errorf("PLACE with data %s: %v, want EOPNOTSUPP", refused.why, errno)
		}
	}
	if _, errno := place(stub, "", "r", 0, nil); errno != 0 {
		t.Errorf("PLACE without the data after refusals: %v, want the stub still there", errno)
	}
	// No room (the fixture's instance is 1 MiB): refused, the stub kept, no object left.
	stub = reserve("")
	if _, errno := place(stub, "", "full", 1, make([]byte, 1<<20)); errno != syscall.ENOSPC {
		t.Errorf("PLACE with more data than the instance has room for: %v, want ENOSPC", errno)
	}
	if _, errno := place(stub, "", "full", 1, nil); errno != 0 {
		t.Errorf("PLACE without the data after ENOSPC: %v, want the stub still there", errno)
	}
	if _, errno := place(reserve("fixed"), "fixed", "f", 0, data); errno != syscall.EOPNOTSUPP {
		t.Errorf("PLACE with data in a directory that fixes its files' start: %v, want EOPNOTSUPP", errno)
	}
	if entries, _ := os.ReadDir(f.objects); len(entries) != 1 {
		t.Errorf("the refused PLACEs left objects: %v", entries)
	}

	var removed proto.RemovedReply
	if errno := do(c, proto.OpUnlink, &proto.EntryReq{Name: "w", Local: 3}, &removed); errno != 0 {
		t.Fatalf("UNLINK: %v", errno)
	}
	if !removed.ObjectsKnown || slices.ContainsFunc(removed.Objects, func(b byte) bool { return b != 0 }) {
		t.Errorf("UNLINK naming this node's stripes: objects %v known %v, want none left for the client", removed.Objects, removed.ObjectsKnown)
	}
	if _, err := os.Stat(object); !os.IsNotExist(err) {
		t.Errorf("the object after the UNLINK naming this node's stripes: %v, want removed", err)
	}
}
