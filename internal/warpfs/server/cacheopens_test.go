package server

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

func pfsMode(t *testing.T, path string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 0o7777
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// A file whose name is removed while the namespace has it open keeps a hidden name in its
// directory until its last release (so that the stripe servers still find it), which the
// namespace does not show; the remover's client is told to remove the file's objects only if
// every handle on it is its own, else this server's engine drops its copy at the last
// release. A rename over an open file does the same.
func TestCacheUnlinkOfAnOpenFile(t *testing.T) {
	f := newCacheFixture(t)
	ns, other := f.dial(t, false), f.dial(t, false)
	if err := os.Mkdir(filepath.Join(f.pfs, "d"), 0o777); err != nil {
		t.Fatal(err)
	}
	create := func(name string) proto.OpenReply {
		t.Helper()
		var open proto.OpenReply
		if errno := as(ns, 1000, 1000, proto.OpCreate, &proto.CreateReq{Dir: "d", Name: name, Flags: unix.O_RDWR | unix.O_CREAT, Mode: 0o644}, &open); errno != 0 {
			t.Fatal(errno)
		}
		return open
	}

	// Open in this session only: the remover is told.
	open := create("f")
	key := pfsKey(t, filepath.Join(f.pfs, "d/f"))
	hidden := filepath.Join(f.pfs, "d", cache.UnlinkedName(key.Ino))
	var rm proto.RemovedReply
	if errno := as(ns, 1000, 1000, proto.OpUnlink, &proto.EntryReq{Dir: "d", Name: "f"}, &rm); errno != 0 {
		t.Fatal(errno)
	}
	if len(rm.Layout) == 0 || rm.Cache == nil || rm.Cache.Ino != key.Ino {
		t.Errorf("unlink of a file open in the remover's session only: %+v, want its objects removed", rm)
	}
	if exists(filepath.Join(f.pfs, "d/f")) || !exists(hidden) {
		t.Fatalf("after unlink of an open file: d/f %v, its hidden name %v", exists(filepath.Join(f.pfs, "d/f")), exists(hidden))
	}
	if got := listing(t, ns, "d"); len(got) != 0 {
		t.Errorf("the directory lists %v", got)
	}
	var a proto.AttrReply
	if errno := as(ns, 1000, 1000, proto.OpLookup, &proto.PathReq{Path: "d/" + cache.UnlinkedName(key.Ino)}, &a); errno != syscall.ENOENT {
		t.Errorf("lookup of the hidden name: %v, want ENOENT", errno)
	}
	if errno := as(ns, 1000, 1000, proto.OpCreate, &proto.CreateReq{Dir: "d", Name: cache.UnlinkedName(1), Flags: unix.O_RDWR | unix.O_CREAT, Mode: 0o644}, &proto.OpenReply{}); errno != syscall.EPERM {
		t.Errorf("create of a hidden name: %v, want EPERM", errno)
	}
	// The handle still works: its attributes, a size report, a chmod.
	if errno := as(ns, 1000, 1000, proto.OpSetattr, &proto.SetattrReq{Handle: open.Handle, Valid: proto.SetSizeAtLeast | proto.SetMtimeNow, Size: 100}, &a); errno != 0 || a.Attr.Size != 100 {
		t.Errorf("size report through the handle: %v, size %d", errno, a.Attr.Size)
	}
	if errno := as(ns, 1000, 1000, proto.OpSetattr, &proto.SetattrReq{Handle: open.Handle, Valid: proto.SetMode, Mode: 0o600}, &a); errno != 0 || a.Attr.Mode&0o7777 != 0o600 {
		t.Errorf("chmod through the handle: %v, mode %o", errno, a.Attr.Mode)
	}
	if errno := as(ns, 1000, 1000, proto.OpGetattr, &proto.NodeReq{Handle: open.Handle}, &a); errno != 0 || a.Attr.Ino != key.Ino || a.Attr.Nlink != 0 {
		t.Errorf("fstat: %v, ino %d, nlink %d (want 0: the hidden name does not count)", errno, a.Attr.Ino, a.Attr.Nlink)
	}
	as(ns, 1000, 1000, proto.OpRelease, &proto.HandleReq{Handle: open.Handle}, nil)
	if exists(hidden) {
		t.Errorf("the hidden name stays after the last release")
	}
	if slices.Contains(f.data.unlinked, key) {
		t.Errorf("the engine dropped the file: the remover's client removes its objects")
	}

	// Open in another session too: the remover is not told; the last release drops the
	// engine's copy.
	open = create("g")
	key = pfsKey(t, filepath.Join(f.pfs, "d/g"))
	hidden = filepath.Join(f.pfs, "d", cache.UnlinkedName(key.Ino))
	var open2 proto.OpenReply
	if errno := as(other, 1000, 1000, proto.OpOpen, &proto.OpenReq{Path: "d/g", Flags: unix.O_RDONLY}, &open2); errno != 0 {
		t.Fatal(errno)
	}
	// A rename over it, here.
	create("h")
	rm = proto.RemovedReply{}
	if errno := as(ns, 1000, 1000, proto.OpRename, &proto.RenameReq{Dir: "d", Name: "h", NewDir: "d", NewName: "g"}, &rm); errno != 0 {
		t.Fatal(errno)
	}
	if len(rm.Layout) != 0 {
		t.Errorf("rename over a file open in another session: %+v, want nothing removed", rm)
	}
	if !exists(hidden) || pfsKey(t, filepath.Join(f.pfs, "d/g")) == key {
		t.Fatalf("after the rename over an open file: hidden %v", exists(hidden))
	}
	if got := listing(t, ns, "d"); !slices.Equal(got, []string{"g"}) {
		t.Errorf("the directory lists %v", got)
	}
	as(ns, 1000, 1000, proto.OpRelease, &proto.HandleReq{Handle: open.Handle}, nil)
	if !exists(hidden) {
		t.Errorf("the hidden name went while another session has the file open")
	}
	as(other, 1000, 1000, proto.OpRelease, &proto.HandleReq{Handle: open2.Handle}, nil)
	if exists(hidden) {
		t.Errorf("the hidden name stays after the last release")
	}
	if !slices.Contains(f.data.unlinked, key) {
		t.Errorf("the engine kept the file removed while open elsewhere")
	}
}

// A file created without read and write permission for its owner is made with them on the
// PFS until its creating handle is released (the stripe servers open it as the user), then
// gets the mode asked; the namespace shows the mode asked all along, and a chmod meanwhile
// changes what is set at the end.
func TestCacheCreateWithoutOwnerWrite(t *testing.T) {
	f := newCacheFixture(t)
	ns := f.dial(t, false)
	var open proto.OpenReply
	if errno := as(ns, 1000, 1000, proto.OpCreate, &proto.CreateReq{Name: "m", Flags: unix.O_RDWR | unix.O_CREAT | unix.O_EXCL, Mode: 0}, &open); errno != 0 {
		t.Fatal(errno)
	}
	path := filepath.Join(f.pfs, "m")
	if open.Attr.Mode&0o7777 != 0 {
		t.Errorf("the create's reply: mode %o, want 0", open.Attr.Mode&0o7777)
	}
	if m := pfsMode(t, path); m != 0o600 {
		t.Errorf("the PFS file while created: mode %o, want 0600", m)
	}
	var a proto.AttrReply
	if errno := as(ns, 1000, 1000, proto.OpLookup, &proto.PathReq{Path: "m"}, &a); errno != 0 || a.Attr.Mode&0o7777 != 0 {
		t.Errorf("stat while created: %v, mode %o, want 0", errno, a.Attr.Mode&0o7777)
	}
	if errno := as(ns, 1000, 1000, proto.OpSetattr, &proto.SetattrReq{Path: "m", Valid: proto.SetMode, Mode: 0o404}, &a); errno != 0 || a.Attr.Mode&0o7777 != 0o404 {
		t.Errorf("chmod while created: %v, mode %o", errno, a.Attr.Mode&0o7777)
	}
	if m := pfsMode(t, path); m != 0o604 {
		t.Errorf("the PFS file after a chmod while created: mode %o, want 0604", m)
	}
	as(ns, 1000, 1000, proto.OpRelease, &proto.HandleReq{Handle: open.Handle}, nil)
	if m := pfsMode(t, path); m != 0o404 {
		t.Errorf("the PFS file after the creator's release: mode %o, want 0404", m)
	}
	// A mode with the owner's read and write is the PFS's from the start.
	if errno := as(ns, 1000, 1000, proto.OpCreate, &proto.CreateReq{Name: "n", Flags: unix.O_RDWR | unix.O_CREAT, Mode: 0o640}, &open); errno != 0 {
		t.Fatal(errno)
	}
	if m := pfsMode(t, filepath.Join(f.pfs, "n")); m != 0o640 {
		t.Errorf("a file created 0640: mode %o", m)
	}
	as(ns, 1000, 1000, proto.OpRelease, &proto.HandleReq{Handle: open.Handle}, nil)
}
