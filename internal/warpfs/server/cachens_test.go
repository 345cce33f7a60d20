package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// writeThrough is a real data engine without the cache: every object read and write goes to
// the PFS file at once, through the file the user's door opened (server is this node's
// index among the instance's servers, which maps object offsets to the file's).
type writeThrough struct {
	server int

	mu        sync.Mutex
	truncates []uint64
	unlinked  []CacheFileKey
}

func (w *writeThrough) OpenFile(door *pfsio.Door, ref CacheFileRef, write bool) (CacheFile, error) {
	flags := unix.O_RDONLY
	if write {
		flags = unix.O_RDWR
	}
	f, err := door.OpenFile(ref.Path, flags, 0)
	if err != nil {
		return nil, err
	}
	if keyOfStat(&f.Stat) != ref.Key {
		f.Close()
		return nil, syscall.ESTALE
	}
	return &wtFile{f: f, l: ref.Layout, server: w.server}, nil
}

func (w *writeThrough) Truncate(door *pfsio.Door, ref CacheFileRef, size uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.truncates = append(w.truncates, size)
	return nil // the namespace server truncated the PFS file; nothing is cached here
}

func (w *writeThrough) Unlink(key CacheFileKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unlinked = append(w.unlinked, key)
}

type wtFile struct {
	f      *pfsio.File
	l      stripe.Layout
	server int
}

// chunks cuts the object range [objOff, objOff+n) at stripe boundaries, each with its offset
// in the file.
func (f *wtFile) chunks(objOff uint64, n int, fn func(bufOff int, fileOff uint64, length int) (int, error)) (int, error) {
	slot := uint64(f.l.Slot(f.server))
	done := 0
	for done < n {
		o := objOff + uint64(done)
		within := o % f.l.Size
		length := min(n-done, int(f.l.Size-within))
		fileOff := ((o/f.l.Size)*uint64(f.l.Width)+slot)*f.l.Size + within
		got, err := fn(done, fileOff, length)
		done += got
		if err != nil {
			return done, err
		}
		if got < length {
			return done, io.EOF
		}
	}
	return done, nil
}

func (f *wtFile) ReadAt(p []byte, objOff uint64) (int, error) {
	return f.chunks(objOff, len(p), func(b int, off uint64, n int) (int, error) {
		return f.f.ReadAt(p[b:b+n], int64(off))
	})
}

func (f *wtFile) WriteAt(p []byte, objOff uint64) (int, error) {
	return f.chunks(objOff, len(p), func(b int, off uint64, n int) (int, error) {
		return f.f.WriteAt(p[b:b+n], int64(off))
	})
}

func (f *wtFile) Fsync() error     { return f.f.Sync(false) }
func (f *wtFile) SyncToPFS() error { return f.f.Sync(false) }
func (f *wtFile) Closing() error   { return nil }
func (f *wtFile) Close() error     { return f.f.Close() }

// doors opens one in-process door per (uid, gid) to a PFS directory and records who asked.
type doors struct {
	root string

	mu    sync.Mutex
	open  map[[2]uint32]*pfsio.Door
	asked map[[2]uint32]int
}

func newDoors(t testing.TB, root string) *doors {
	d := &doors{root: root, open: map[[2]uint32]*pfsio.Door{}, asked: map[[2]uint32]int{}}
	t.Cleanup(func() {
		for _, door := range d.open {
			door.Close()
		}
	})
	return d
}

func (d *doors) For(uid, gid uint32) (*pfsio.Door, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := [2]uint32{uid, gid}
	d.asked[k]++
	if door := d.open[k]; door != nil {
		return door, nil
	}
	door, err := pfsio.Open(d.root, pfsio.Options{RequestTimeout: 10 * time.Second})
	if err != nil {
		return nil, err
	}
	d.open[k] = door
	return door, nil
}

func (d *doors) askedBy(uid, gid uint32) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.asked[[2]uint32{uid, gid}]
}

// cacheFixture is a server of a cache instance of one server over a PFS directory.
type cacheFixture struct {
	addr    string
	pfs     string // the PFS directory
	outside string // next to it
	ssd     string // the instance's SSD directory
	doors   *doors
	data    *writeThrough
	layout  stripe.Layout
}

func newCacheFixture(t *testing.T) *cacheFixture {
	t.Helper()
	base := t.TempDir()
	f := &cacheFixture{pfs: filepath.Join(base, "pfs"), outside: filepath.Join(base, "outside"), ssd: filepath.Join(base, "ssd"),
		data: &writeThrough{}, layout: stripe.Layout{Size: 4096, Width: 1, Servers: 1}}
	for _, d := range []string{f.pfs, f.outside, f.ssd} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(f.outside, "f"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.doors = newDoors(t, f.pfs)
	target := Target{Dir: f.ssd, Tracker: usage.New("cache", 1<<30), Cache: &CacheTarget{
		PFSRoot: f.pfs, Door: f.doors.For, Data: f.data, Layout: f.layout, UID: 4321, GID: 4322}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = l.Addr().String()
	srv := New(Options{Token: token, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Limits: Limits{Lease: time.Minute},
		Resolve: func(fragment, namespace, instance int64, stripes bool) (Target, error) { return target, nil }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, l); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

func (f *cacheFixture) dial(t *testing.T, stripes bool) *client.Client {
	t.Helper()
	c, err := client.Dial(context.Background(), client.Options{Address: f.addr, Token: token, Client: "cn1",
		Namespace: 1, Stripes: stripes, Limits: client.Limits{RequestTimeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// as runs a request as uid:gid.
func as(c *client.Client, uid, gid uint32, op proto.Op, req, reply proto.Message) syscall.Errno {
	return c.Do(context.Background(), &client.Call{Op: op, UID: uid, GID: gid, Req: req, Reply: reply})
}

func pfsKey(t *testing.T, path string) CacheFileKey {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return keyOfStat(&st)
}

// listing is the names of the directory handle's entries, "." and ".." left out, sorted.
func listing(t *testing.T, c *client.Client, path string) []string {
	t.Helper()
	var h proto.HandleReply
	if errno := as(c, 1000, 1000, proto.OpOpendir, &proto.PathReq{Path: path}, &h); errno != 0 {
		t.Fatalf("opendir %q: %v", path, errno)
	}
	defer as(c, 1000, 1000, proto.OpRelease, &proto.HandleReq{Handle: h.Handle}, nil)
	var names []string
	for off := uint64(0); ; {
		var rep proto.ReaddirReply
		if errno := as(c, 1000, 1000, proto.OpReaddir, &proto.ReaddirReq{Handle: h.Handle, Offset: off}, &rep); errno != 0 {
			t.Fatalf("readdir %q: %v", path, errno)
		}
		for _, e := range rep.Entries {
			if e.Name != "." && e.Name != ".." {
				names = append(names, e.Name)
			}
			off = e.Off
		}
		if rep.EOF || len(rep.Entries) == 0 {
			break
		}
	}
	sort.Strings(names)
	return names
}

// The namespace of a cache instance is the PFS directory: what a client does through the
// server is done there (as the caller: the door of the request's uid:gid), what is done
// there is seen, regular files have the instance's layout with an ID derived from the PFS
// file's identity, and their data goes through the stripe objects into the PFS file.
func TestCacheNamespaceIsThePFSDirectory(t *testing.T) {
	f := newCacheFixture(t)
	ns := f.dial(t, false)
	if ns.Lease() != 0 {
		t.Errorf("a cache namespace granted a lease of %v: others change the PFS unseen", ns.Lease())
	}
	if f.doors.askedBy(4321, 4322) == 0 {
		t.Errorf("the handshake looked the root up through no door of the instance's owner")
	}
	var pfsRoot unix.Stat_t
	unix.Stat(f.pfs, &pfsRoot)
	if ns.Root().Ino != pfsRoot.Ino {
		t.Errorf("root inode %d, the PFS directory's is %d", ns.Root().Ino, pfsRoot.Ino)
	}

	// Create: a file of the PFS, with the layout and reference its objects need.
	var open proto.OpenReply
	if errno := as(ns, 1000, 1001, proto.OpCreate, &proto.CreateReq{Name: "a", Flags: unix.O_RDWR | unix.O_CREAT, Mode: 0o640}, &open); errno != 0 {
		t.Fatalf("create: %v", errno)
	}
	if f.doors.askedBy(1000, 1001) == 0 {
		t.Fatal("the create went through no door of its caller")
	}
	st, err := os.Stat(filepath.Join(f.pfs, "a"))
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("the PFS file: %v %v", st, err)
	}
	key := pfsKey(t, filepath.Join(f.pfs, "a"))
	if open.Cache == nil || *open.Cache != (proto.CacheRef{Path: "a", Dev: key.Dev, Ino: key.Ino}) || open.Attr.Ino != key.Ino {
		t.Fatalf("open reply %+v %+v, the PFS file is %+v", open.Cache, open.Attr, key)
	}
	l, err := stripe.Decode(open.Layout)
	if err != nil || l.ID != cacheFileID(key) || l.ID < 2 || l.Size != f.layout.Size || l.Servers != 1 {
		t.Fatalf("layout %+v %v", l, err)
	}

	// Data: through the stripe objects, into the PFS file.
	obj := f.dial(t, true)
	name := stripe.ObjectName(l.ID)
	if errno := as(obj, 1000, 1001, proto.OpCreate, &proto.CreateReq{Name: name, Flags: unix.O_RDWR, Mode: 0o600}, &proto.OpenReply{}); errno != syscall.EINVAL {
		t.Errorf("an object open without a cache reference: %v, want EINVAL", errno)
	}
	wrong := *open.Cache
	wrong.Ino++
	if errno := as(obj, 1000, 1001, proto.OpCreate, &proto.CreateReq{Name: name, Flags: unix.O_RDWR, Cache: &wrong}, &proto.OpenReply{}); errno != syscall.EINVAL {
		t.Errorf("an object open whose name is not its reference's: %v, want EINVAL", errno)
	}
	var o proto.OpenReply
	if errno := as(obj, 1000, 1001, proto.OpCreate, &proto.CreateReq{Name: name, Flags: unix.O_RDWR, Mode: 0o600, Cache: open.Cache}, &o); errno != 0 {
		t.Fatalf("object open: %v", errno)
	}
	data := bytes.Repeat([]byte("0123456789"), 1000)
	var n proto.CountReply
	if errno := as(obj, 0, 0, proto.OpWrite, &proto.WriteReq{Handle: o.Handle, Offset: 0, Data: data}, &n); errno != 0 || n.N != uint64(len(data)) {
		t.Fatalf("write: %v %d", errno, n.N)
	}
	if got, _ := os.ReadFile(filepath.Join(f.pfs, "a")); !bytes.Equal(got, data) {
		t.Fatalf("the PFS file holds %d bytes, not what was written", len(got))
	}
	buf := make([]byte, 8192)
	call := &client.Call{Op: proto.OpRead, Req: &proto.ReadReq{Handle: o.Handle, Offset: 5000, Size: 8192}, Dest: buf}
	if errno := obj.Do(context.Background(), call); errno != 0 || !bytes.Equal(buf[:call.N], data[5000:]) {
		t.Fatalf("read back: %v, %d bytes", errno, call.N)
	}
	if errno := as(obj, 0, 0, proto.OpFsync, &proto.FsyncReq{Handle: o.Handle}, nil); errno != 0 {
		t.Fatalf("fsync: %v", errno)
	}
	if errno := as(obj, 0, 0, proto.OpSetattr, &proto.SetattrReq{Handle: o.Handle, Valid: proto.SetSize, Size: 77}, &proto.AttrReply{}); errno != 0 {
		t.Fatalf("object truncate: %v", errno)
	}
	if len(f.data.truncates) != 1 || f.data.truncates[0] != 77 {
		t.Errorf("the engine was told of truncations %v, want [77]", f.data.truncates)
	}
	as(obj, 0, 0, proto.OpRelease, &proto.HandleReq{Handle: o.Handle}, nil)

	// Sizes: max(PFS size, reported size), the report kept until the PFS reaches it.
	var a proto.AttrReply
	if errno := as(ns, 1000, 1001, proto.OpSetattr, &proto.SetattrReq{Handle: open.Handle, Valid: proto.SetSizeAtLeast | proto.SetMtimeNow, Size: 50000}, &a); errno != 0 {
		t.Fatalf("size report: %v", errno)
	}
	if a.Attr.Size != 50000 {
		t.Errorf("after a report of 50000 bytes the size is %d", a.Attr.Size)
	}
	if errno := as(ns, 1000, 1001, proto.OpLookup, &proto.PathReq{Path: "a"}, &a); errno != 0 || a.Attr.Size != 50000 {
		t.Errorf("lookup: %v, size %d, want 50000", errno, a.Attr.Size)
	}
	if table, err := os.ReadFile(filepath.Join(f.ssd, cacheSizesFile)); err != nil || !strings.Contains(string(table), " 50000") {
		t.Errorf("the sizes table on the SSD: %q %v", table, err)
	}
	if st, _ := os.Stat(filepath.Join(f.pfs, "a")); st.Size() != int64(len(data)) {
		t.Errorf("a report changed the PFS file's size: %d", st.Size())
	}
	if err := os.WriteFile(filepath.Join(f.pfs, "a"), make([]byte, 60000), 0o640); err != nil {
		t.Fatal(err)
	}
	if errno := as(ns, 1000, 1001, proto.OpLookup, &proto.PathReq{Path: "a"}, &a); errno != 0 || a.Attr.Size != 60000 {
		t.Errorf("once the PFS file is larger: %v, size %d, want 60000", errno, a.Attr.Size)
	}
	if table, _ := os.ReadFile(filepath.Join(f.ssd, cacheSizesFile)); len(table) != 0 {
		t.Errorf("the report stayed in the table once the PFS reached it: %q", table)
	}
	// A report beyond, then a truncation through the server: the PFS file and the table.
	as(ns, 1000, 1001, proto.OpSetattr, &proto.SetattrReq{Handle: open.Handle, Valid: proto.SetSizeAtLeast, Size: 90000}, &a)
	if errno := as(ns, 1000, 1001, proto.OpSetattr, &proto.SetattrReq{Path: "a", Valid: proto.SetSize, Size: 3}, &a); errno != 0 || a.Attr.Size != 3 {
		t.Fatalf("truncate: %v, size %d", errno, a.Attr.Size)
	}
	if st, _ := os.Stat(filepath.Join(f.pfs, "a")); st.Size() != 3 {
		t.Errorf("truncate left the PFS file %d bytes", st.Size())
	}
	as(ns, 1000, 1001, proto.OpRelease, &proto.HandleReq{Handle: open.Handle}, nil)

	// chmod, times.
	if errno := as(ns, 1000, 1001, proto.OpSetattr, &proto.SetattrReq{Path: "a", Valid: proto.SetMode | proto.SetMtime, Mode: 0o600,
		Mtime: proto.Timespec{Sec: 1234567890}}, &a); errno != 0 {
		t.Fatalf("chmod: %v", errno)
	}
	if st, _ := os.Stat(filepath.Join(f.pfs, "a")); st.Mode().Perm() != 0o600 || st.ModTime().Unix() != 1234567890 {
		t.Errorf("after chmod and utimes: %v %v", st.Mode(), st.ModTime())
	}

	// mkdir, symlink, rename, readdir; a file made on the PFS directly is seen.
	if errno := as(ns, 1000, 1001, proto.OpMkdir, &proto.MkdirReq{Name: "d", Mode: 0o750}, &a); errno != 0 {
		t.Fatalf("mkdir: %v", errno)
	}
	if st, err := os.Stat(filepath.Join(f.pfs, "d")); err != nil || !st.IsDir() || st.Mode().Perm() != 0o750 || a.Attr.Ino != pfsKey(t, filepath.Join(f.pfs, "d")).Ino {
		t.Errorf("mkdir made %v %v", st, err)
	}
	if errno := as(ns, 1000, 1001, proto.OpSymlink, &proto.SymlinkReq{Name: "l", Target: "../anywhere"}, &a); errno != 0 {
		t.Fatalf("symlink: %v", errno)
	}
	if target, err := os.Readlink(filepath.Join(f.pfs, "l")); err != nil || target != "../anywhere" {
		t.Errorf("the PFS link: %q %v", target, err)
	}
	var dr proto.DataReply
	if errno := as(ns, 1000, 1001, proto.OpReadlink, &proto.PathReq{Path: "l"}, &dr); errno != 0 || string(dr.Data) != "../anywhere" {
		t.Errorf("readlink: %v %q", errno, dr.Data)
	}
	var rm proto.RemovedReply
	if errno := as(ns, 1000, 1001, proto.OpRename, &proto.RenameReq{Name: "a", NewDir: "d", NewName: "b"}, &rm); errno != 0 || len(rm.Layout) != 0 {
		t.Fatalf("rename: %v %v", errno, rm.Layout)
	}
	if _, err := os.Stat(filepath.Join(f.pfs, "d", "b")); err != nil {
		t.Errorf("rename: %v", err)
	}
	if err := os.WriteFile(filepath.Join(f.pfs, "direct"), []byte("made on the PFS"), 0o644); err != nil {
		t.Fatal(err)
	}
	if errno := as(ns, 1000, 1001, proto.OpLookup, &proto.PathReq{Path: "direct"}, &a); errno != 0 || a.Attr.Size != 15 {
		t.Errorf("a file made on the PFS: %v, size %d", errno, a.Attr.Size)
	}
	if got := listing(t, ns, ""); strings.Join(got, " ") != "d direct l" {
		t.Errorf("readdir of the root: %v", got)
	}
	if got := listing(t, ns, "d"); strings.Join(got, " ") != "b" {
		t.Errorf("readdir of d: %v", got)
	}

	// xattrs: the PFS's user.* ones; the layout read-only.
	if errno := as(ns, 1000, 1001, proto.OpSetxattr, &proto.XattrReq{Path: "direct", Name: "user.k", Value: []byte("v")}, nil); errno != 0 {
		t.Fatalf("setxattr: %v", errno)
	}
	if v := make([]byte, 8); true {
		n, err := unix.Getxattr(filepath.Join(f.pfs, "direct"), "user.k", v)
		if err != nil || string(v[:n]) != "v" {
			t.Errorf("the PFS file's attribute: %q %v", v[:n], err)
		}
	}
	var xr proto.XattrReply
	if errno := as(ns, 1000, 1001, proto.OpGetxattr, &proto.XattrReq{Path: "direct", Name: UserLayoutXattr, Size: 256}, &xr); errno != 0 ||
		string(xr.Data) != f.layout.ForFile(cacheFileID(pfsKey(t, filepath.Join(f.pfs, "direct")))).Text() {
		t.Errorf("the layout attribute: %v %q", errno, xr.Data)
	}
	if errno := as(ns, 1000, 1001, proto.OpSetxattr, &proto.XattrReq{Path: "direct", Name: UserLayoutXattr, Value: []byte("stripe_width=1")}, nil); errno != syscall.EPERM {
		t.Errorf("setting the layout: %v, want EPERM", errno)
	}

	// Unlink: the PFS name goes; the last name of a regular file tells the client its objects.
	bKey := pfsKey(t, filepath.Join(f.pfs, "d", "b"))
	if errno := as(ns, 1000, 1001, proto.OpUnlink, &proto.EntryReq{Dir: "d", Name: "b"}, &rm); errno != 0 {
		t.Fatalf("unlink: %v", errno)
	}
	if _, err := os.Lstat(filepath.Join(f.pfs, "d", "b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("unlink left the PFS file: %v", err)
	}
	if rm.Cache == nil || rm.Cache.Ino != bKey.Ino || len(rm.Layout) == 0 {
		t.Errorf("unlink reply %+v", rm)
	}
	if errno := as(obj, 0, 0, proto.OpUnlink, &proto.EntryReq{Name: stripe.ObjectName(cacheFileID(bKey)), Cache: rm.Cache}, &proto.RemovedReply{}); errno != 0 {
		t.Errorf("object unlink: %v", errno)
	}
	if len(f.data.unlinked) != 1 || f.data.unlinked[0] != bKey {
		t.Errorf("the engine was told of unlinks %v, want %v", f.data.unlinked, bKey)
	}
	if errno := as(ns, 1000, 1001, proto.OpRmdir, &proto.EntryReq{Name: "d"}, nil); errno != 0 {
		t.Errorf("rmdir: %v", errno)
	}
	if _, err := os.Lstat(filepath.Join(f.pfs, "d")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("rmdir left the PFS directory: %v", err)
	}
	if errno := as(ns, 1000, 1001, proto.OpMknod, &proto.MkdirReq{Name: "fifo", Mode: syscall.S_IFIFO | 0o644}, &a); errno != syscall.EPERM {
		t.Errorf("mknod of a FIFO: %v, want EPERM", errno)
	}

	// statfs is the PFS's.
	var sf proto.StatfsReply
	var want unix.Statfs_t
	unix.Statfs(f.pfs, &want)
	if errno := as(ns, 1000, 1001, proto.OpStatfs, &proto.Empty{}, &sf); errno != 0 || sf.Blocks != want.Blocks {
		t.Errorf("statfs: %v, %d blocks, the PFS has %d", errno, sf.Blocks, want.Blocks)
	}
}

// A user who swaps a directory of the PFS for a symbolic link to elsewhere leads the server
// nowhere: a path through it is ELOOP, for lookups, opens and creations alike.
func TestCacheNamespaceFollowsNoLink(t *testing.T) {
	f := newCacheFixture(t)
	ns := f.dial(t, false)
	if err := os.Mkdir(filepath.Join(f.pfs, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.pfs, "dir", "f"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	var a proto.AttrReply
	if errno := as(ns, 1000, 1000, proto.OpLookup, &proto.PathReq{Path: "dir/f"}, &a); errno != 0 {
		t.Fatalf("lookup before the swap: %v", errno)
	}
	// The swap, behind the server's back.
	if err := os.Rename(filepath.Join(f.pfs, "dir"), filepath.Join(f.pfs, "dir.old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(f.outside, filepath.Join(f.pfs, "dir")); err != nil {
		t.Fatal(err)
	}
	if errno := as(ns, 1000, 1000, proto.OpLookup, &proto.PathReq{Path: "dir/f"}, &a); errno != syscall.ELOOP {
		t.Errorf("lookup through the link: %v (size %d), want ELOOP", errno, a.Attr.Size)
	}
	if errno := as(ns, 1000, 1000, proto.OpOpen, &proto.OpenReq{Path: "dir/f", Flags: unix.O_RDWR}, &proto.OpenReply{}); errno != syscall.ELOOP {
		t.Errorf("open through the link: %v, want ELOOP", errno)
	}
	if errno := as(ns, 1000, 1000, proto.OpCreate, &proto.CreateReq{Dir: "dir", Name: "new", Flags: unix.O_WRONLY | unix.O_CREAT, Mode: 0o644}, &proto.OpenReply{}); errno != syscall.ELOOP {
		t.Errorf("create through the link: %v, want ELOOP", errno)
	}
	if errno := as(ns, 1000, 1000, proto.OpSetattr, &proto.SetattrReq{Path: "dir/f", Valid: proto.SetMode, Mode: 0o666}, &a); errno != syscall.ELOOP {
		t.Errorf("chmod through the link: %v, want ELOOP", errno)
	}
	if errno := as(ns, 1000, 1000, proto.OpOpen, &proto.OpenReq{Path: "dir", Flags: unix.O_RDONLY}, &proto.OpenReply{}); errno != syscall.ELOOP {
		t.Errorf("open of the link itself: %v, want ELOOP", errno)
	}
	var h proto.HandleReply
	if errno := as(ns, 1000, 1000, proto.OpOpendir, &proto.PathReq{Path: "dir"}, &h); errno != syscall.ENOTDIR {
		t.Errorf("opendir of the link: %v, want ENOTDIR", errno)
	}
	if got, _ := os.ReadFile(filepath.Join(f.outside, "f")); string(got) != "secret" {
		t.Errorf("the file outside changed: %q", got)
	}
	if st, _ := os.Stat(filepath.Join(f.outside, "f")); st.Mode().Perm() != 0o600 {
		t.Errorf("the file outside changed mode: %v", st.Mode())
	}
	if _, err := os.Lstat(filepath.Join(f.outside, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file was created outside: %v", err)
	}
	if errno := as(ns, 1000, 1000, proto.OpLookup, &proto.PathReq{Path: "../outside/f"}, &a); errno == 0 {
		t.Errorf("a path with .. was looked up")
	}
}

// The sizes table outlives the server's sessions: a report made before is answered after a
// new session loads it from the SSD directory.
func TestCacheSizesPersist(t *testing.T) {
	dir := t.TempDir()
	tab, err := acquireSizes(dir)
	if err != nil {
		t.Fatal(err)
	}
	k := CacheFileKey{Dev: 1, Ino: 2}
	tab.report(k, 100, 10)
	tab.report(k, 50, 10) // never shrinks
	releaseSizes(tab)
	tab, err = acquireSizes(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseSizes(tab)
	if got := tab.size(k, 10); got != 100 {
		t.Fatalf("after reloading: %d, want 100", got)
	}
	tab.forget(k)
	if got := tab.size(k, 10); got != 10 || tab.len() != 0 {
		t.Fatalf("after forgetting: %d (%d entries)", got, tab.len())
	}
}

// What the door changes by name through a handle reaches the handle's file or nothing: once
// the name is another file's, a chmod through the handle is ESTALE (the other file keeps its
// mode), and a size report still counts, without touching the other file's times.
func TestCacheHandleRenamedOver(t *testing.T) {
	f := newCacheFixture(t)
	ns := f.dial(t, false)
	var open proto.OpenReply
	if errno := as(ns, 1000, 1000, proto.OpCreate, &proto.CreateReq{Name: "x", Flags: unix.O_WRONLY | unix.O_CREAT, Mode: 0o644}, &open); errno != 0 {
		t.Fatal(errno)
	}
	if err := os.Rename(filepath.Join(f.pfs, "x"), filepath.Join(f.pfs, "y")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.pfs, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Unix(1000000000, 0)
	os.Chtimes(filepath.Join(f.pfs, "x"), old, old)
	var a proto.AttrReply
	if errno := as(ns, 1000, 1000, proto.OpSetattr, &proto.SetattrReq{Handle: open.Handle, Valid: proto.SetMode, Mode: 0o666}, &a); errno != syscall.ESTALE {
		t.Errorf("chmod through a handle renamed over: %v, want ESTALE", errno)
	}
	if errno := as(ns, 1000, 1000, proto.OpSetattr, &proto.SetattrReq{Handle: open.Handle, Valid: proto.SetSizeAtLeast | proto.SetMtimeNow, Size: 10}, &a); errno != 0 || a.Attr.Size != 10 {
		t.Errorf("a size report through it: %v, size %d", errno, a.Attr.Size)
	}
	st, _ := os.Stat(filepath.Join(f.pfs, "x"))
	if st.Mode().Perm() != 0o600 || !st.ModTime().Equal(old) {
		t.Errorf("the file now named x changed: %v %v", st.Mode(), st.ModTime())
	}
	if errno := as(ns, 1000, 1000, proto.OpLookup, &proto.PathReq{Path: "y"}, &a); errno != 0 || a.Attr.Size != 10 {
		t.Errorf("the file reported on, now y: %v, size %d", errno, a.Attr.Size)
	}
}

// A read-only mount of a cache namespace changes nothing on the PFS.
func TestCacheNamespaceReadOnly(t *testing.T) {
	f := newCacheFixture(t)
	if err := os.WriteFile(filepath.Join(f.pfs, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(context.Background(), client.Options{Address: f.addr, Token: token, Client: "cn1",
		Namespace: 1, ReadOnly: true, Limits: client.Limits{RequestTimeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		op  proto.Op
		req proto.Message
		rep proto.Message
	}{
		{proto.OpCreate, &proto.CreateReq{Name: "new", Flags: unix.O_WRONLY | unix.O_CREAT, Mode: 0o644}, &proto.OpenReply{}},
		{proto.OpOpen, &proto.OpenReq{Path: "f", Flags: unix.O_WRONLY | unix.O_TRUNC}, &proto.OpenReply{}},
		{proto.OpMkdir, &proto.MkdirReq{Name: "d", Mode: 0o755}, &proto.AttrReply{}},
		{proto.OpUnlink, &proto.EntryReq{Name: "f"}, &proto.RemovedReply{}},
		{proto.OpSetattr, &proto.SetattrReq{Path: "f", Valid: proto.SetSize}, &proto.AttrReply{}},
	} {
		if errno := as(c, 1000, 1000, tc.op, tc.req, tc.rep); errno != syscall.EROFS {
			t.Errorf("%s on a read-only mount: %v, want EROFS", tc.op, errno)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(f.pfs, "f")); string(got) != "data" {
		t.Errorf("the PFS file changed: %q", got)
	}
	if names, _ := os.ReadDir(f.pfs); len(names) != 1 {
		t.Errorf("the PFS directory holds %d entries", len(names))
	}
}

// An open with O_TRUNC leaves the PFS file whole for the client to truncate the file's
// objects first (the data engines drop what they hold) and the file after, through the
// handle; a user who may not write the file is refused at the open, before anything drops.
func TestCacheOpenTruncLetsTheObjectsGoFirst(t *testing.T) {
	f := newCacheFixture(t)
	ns := f.dial(t, false)
	pfsFile := filepath.Join(f.pfs, "f")
	if err := os.WriteFile(pfsFile, []byte("old data"), 0o644); err != nil {
		t.Fatal(err)
	}
	var open proto.OpenReply
	if errno := as(ns, 1000, 1000, proto.OpOpen, &proto.OpenReq{Path: "f", Flags: unix.O_WRONLY | unix.O_TRUNC}, &open); errno != 0 {
		t.Fatal(errno)
	}
	if !open.Truncated || open.Attr.Size != 0 {
		t.Errorf("open O_TRUNC: truncated %v, size %d", open.Truncated, open.Attr.Size)
	}
	if got, _ := os.ReadFile(pfsFile); string(got) != "old data" {
		t.Errorf("the PFS file was truncated before its objects: %q", got)
	}
	var a proto.AttrReply
	if errno := as(ns, 1000, 1000, proto.OpSetattr, &proto.SetattrReq{Handle: open.Handle, Valid: proto.SetSize}, &a); errno != 0 || a.Attr.Size != 0 {
		t.Fatalf("truncate through the handle: %v, size %d", errno, a.Attr.Size)
	}
	if st, _ := os.Stat(pfsFile); st.Size() != 0 {
		t.Errorf("the PFS file holds %d bytes", st.Size())
	}
	// A new file made with O_TRUNC has nothing to truncate.
	if errno := as(ns, 1000, 1000, proto.OpCreate, &proto.CreateReq{Name: "new", Flags: unix.O_WRONLY | unix.O_CREAT | unix.O_TRUNC, Mode: 0o600}, &open); errno != 0 || open.Truncated {
		t.Errorf("create O_TRUNC of a new file: %v, truncated %v", errno, open.Truncated)
	}
	// An O_RDONLY|O_TRUNC open needs the right to write, as open(2) does.
	if err := os.WriteFile(pfsFile, []byte("old data"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(pfsFile, 0o444); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		return // the test's door is this process's: root may write anything
	}
	if errno := as(ns, 1000, 1000, proto.OpOpen, &proto.OpenReq{Path: "f", Flags: unix.O_RDONLY | unix.O_TRUNC}, &open); errno != syscall.EACCES {
		t.Errorf("O_RDONLY|O_TRUNC of a file the user may not write: %v, want EACCES", errno)
	}
}
