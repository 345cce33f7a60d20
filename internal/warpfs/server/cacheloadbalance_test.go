package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/cachestore"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// A load-balanced cache's namespace serves the PFS directory read-only and the data of its
// files itself, through its own data engine (a real cache store): the open names no layout,
// READ on the handle reads the store (the PFS file fetched once, a re-read a hit), and every
// change is EROFS, even from a client that did not ask for a read-only session.
func TestCacheLoadbalanceNamespaceServesData(t *testing.T) {
	base := t.TempDir()
	pfs, ssd := filepath.Join(base, "pfs"), filepath.Join(base, "ssd")
	for _, d := range []string{pfs, ssd, filepath.Join(pfs, "d")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	data := make([]byte, 2<<20+12345)
	rand.New(rand.NewSource(3)).Read(data)
	if err := os.WriteFile(filepath.Join(pfs, "d", "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	store, err := cachestore.Open(cachestore.Options{Dir: filepath.Join(base, "store"), Config: cache.Config{Server: 0, Capacity: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	doors := newDoors(t, pfs)
	target := Target{Dir: ssd, Tracker: usage.New("cache", 1<<30), Cache: &CacheTarget{PFSRoot: pfs, Door: doors.For,
		Data: StoreData(store), Layout: stripe.Layout{Size: 1 << 20, Width: 1, Servers: 1}, UID: 4321, GID: 4322, Loadbalance: true}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(Options{Token: token, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Resolve: func(fragment, namespace, instance int64, stripes bool) (Target, error) { return target, nil }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, l); close(done) }()
	defer func() { cancel(); <-done }()
	dial := func(stripes bool) (*client.Client, error) {
		return client.Dial(context.Background(), client.Options{Address: l.Addr().String(), Token: token, Client: "cn1",
			Namespace: 1, Stripes: stripes, Limits: client.Limits{RequestTimeout: 10 * time.Second}})
	}
	ns, err := dial(false)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if c, err := dial(true); err == nil {
		c.Close()
		t.Errorf("a stripe session of a load-balanced cache was served: it has no stripe objects")
	}

	// readAll opens the file and reads it through the handle, as a mount reads a plain file.
	readAll := func() []byte {
		t.Helper()
		var open proto.OpenReply
		if errno := as(ns, 1000, 1000, proto.OpOpen, &proto.OpenReq{Path: "d/f", Flags: unix.O_RDONLY}, &open); errno != 0 {
			t.Fatalf("open: %v", errno)
		}
		defer as(ns, 1000, 1000, proto.OpRelease, &proto.HandleReq{Handle: open.Handle}, nil)
		if len(open.Layout) != 0 || open.Cache != nil {
			t.Errorf("the open names a layout (%d bytes) or cache reference (%+v): the mount would look for stripe servers", len(open.Layout), open.Cache)
		}
		if open.Attr.Size != uint64(len(data)) {
			t.Errorf("open: size %d, want %d", open.Attr.Size, len(data))
		}
		var got []byte
		buf := make([]byte, 128<<10)
		for {
			call := &client.Call{Op: proto.OpRead, UID: 1000, GID: 1000, Req: &proto.ReadReq{Handle: open.Handle, Offset: uint64(len(got)), Size: uint32(len(buf))}, Dest: buf}
			if errno := ns.Do(context.Background(), call); errno != 0 {
				t.Fatalf("read at %d: %v", len(got), errno)
			}
			if call.N == 0 {
				break
			}
			got = append(got, buf[:call.N]...)
		}
		var seek proto.CountReply
		if errno := as(ns, 1000, 1000, proto.OpLseek, &proto.LseekReq{Handle: open.Handle, Offset: 5, Whence: unix.SEEK_HOLE}, &seek); errno != 0 || seek.N != uint64(len(data)) {
			t.Errorf("SEEK_HOLE: %d %v, want the size %d", seek.N, errno, len(data))
		}
		// Changes through the handle are refused too.
		if errno := as(ns, 1000, 1000, proto.OpWrite, &proto.WriteReq{Handle: open.Handle, Data: []byte("x")}, &proto.CountReply{}); errno != syscall.EROFS {
			t.Errorf("write on a read handle: %v, want EROFS", errno)
		}
		return got
	}
	if got := readAll(); !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, want the PFS file's %d (equal: %v)", len(got), len(data), bytes.Equal(got, data))
	}
	first := store.Stats()
	if first.FetchedBytes != uint64(len(data)) {
		t.Errorf("the store fetched %d bytes from the PFS, want the file's %d", first.FetchedBytes, len(data))
	}
	if got := readAll(); !bytes.Equal(got, data) {
		t.Fatalf("re-read %d bytes, want %d", len(got), len(data))
	}
	again := store.Stats()
	if again.FetchedBytes != first.FetchedBytes || again.Hits <= first.Hits {
		t.Errorf("a re-read fetched %d more bytes from the PFS with %d more hits: want none and some",
			again.FetchedBytes-first.FetchedBytes, again.Hits-first.Hits)
	}

	// Every change is refused.
	for _, tc := range []struct {
		op  proto.Op
		req proto.Message
		rep proto.Message
	}{
		{proto.OpCreate, &proto.CreateReq{Dir: "d", Name: "new", Flags: unix.O_WRONLY | unix.O_CREAT, Mode: 0o644}, &proto.OpenReply{}},
		{proto.OpOpen, &proto.OpenReq{Path: "d/f", Flags: unix.O_WRONLY}, &proto.OpenReply{}},
		{proto.OpOpen, &proto.OpenReq{Path: "d/f", Flags: unix.O_RDWR}, &proto.OpenReply{}},
		{proto.OpOpen, &proto.OpenReq{Path: "d/f", Flags: unix.O_RDONLY | unix.O_TRUNC}, &proto.OpenReply{}},
		{proto.OpMknod, &proto.MkdirReq{Dir: "d", Name: "n", Mode: syscall.S_IFREG | 0o644}, &proto.AttrReply{}},
		{proto.OpMkdir, &proto.MkdirReq{Name: "e", Mode: 0o755}, &proto.AttrReply{}},
		{proto.OpSymlink, &proto.SymlinkReq{Name: "l", Target: "d/f"}, &proto.AttrReply{}},
		{proto.OpLink, &proto.LinkReq{Path: "d/f", Name: "h"}, &proto.AttrReply{}},
		{proto.OpUnlink, &proto.EntryReq{Dir: "d", Name: "f"}, &proto.RemovedReply{}},
		{proto.OpRmdir, &proto.EntryReq{Name: "d"}, &proto.Empty{}},
		{proto.OpRename, &proto.RenameReq{Dir: "d", Name: "f", NewName: "g"}, &proto.RemovedReply{}},
		{proto.OpSetattr, &proto.SetattrReq{Path: "d/f", Valid: proto.SetSize}, &proto.AttrReply{}},
		{proto.OpSetattr, &proto.SetattrReq{Path: "d/f", Valid: proto.SetMode, Mode: 0o600}, &proto.AttrReply{}},
		{proto.OpSetxattr, &proto.XattrReq{Path: "d/f", Name: "user.x", Value: []byte("1")}, &proto.Empty{}},
	} {
		if errno := as(ns, 1000, 1000, tc.op, tc.req, tc.rep); errno != syscall.EROFS {
			t.Errorf("%s of a load-balanced cache: %v, want EROFS", tc.op, errno)
		}
	}
	if got, err := os.ReadFile(filepath.Join(pfs, "d", "f")); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the PFS file changed: %d bytes, %v", len(got), err)
	}
	if st, _ := os.Stat(filepath.Join(pfs, "d", "f")); st == nil || st.Mode().Perm() != 0o644 {
		t.Errorf("the PFS file's mode changed: %v", st)
	}
	for _, dir := range []string{pfs, filepath.Join(pfs, "d")} {
		if names, _ := os.ReadDir(dir); len(names) != 1 {
			t.Errorf("%s holds %d entries, want 1", dir, len(names))
		}
	}
	// Names and attributes are still the PFS's.
	if names := listing(t, ns, "d"); len(names) != 1 || names[0] != "f" {
		t.Errorf("listing of d: %v", names)
	}
}
