package server

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// WRITE_SYNC writes and syncs in one request: through a handle of a namespace's file, and by
// name for a stripe object (created if missing and closed, as WRITE_NAME), which a
// namespace refuses (its files are the metadata server's). A write that does not fit is
// short (the instance full): the next says ENOSPC.
func TestWriteSync(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "namespace")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := OpenLocal(LocalOptions{Dir: dir, Tracker: usage.New("writesync", 1<<20)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rep, _, errno := l.Exec(proto.OpCreate, 0, 0, &proto.CreateReq{Name: "f", Flags: unix.O_RDWR | unix.O_CREAT, Mode: 0o644}, nil)
	if errno != 0 {
		t.Fatal(errno)
	}
	h := rep.(*proto.OpenReply).Handle
	data := bytes.Repeat([]byte("w"), 4096)
	for _, flags := range []uint32{1, 0} { // fdatasync, fsync
		rep, _, errno = l.Exec(proto.OpWriteSync, 0, 0, &proto.WriteSyncReq{Handle: h, Offset: 4096 * uint64(flags), Flags: flags, Data: data}, nil)
		if errno != 0 || rep.(*proto.CountReply).N != 4096 {
			t.Fatalf("WRITE_SYNC (flags %d) through a handle: %v %v", flags, rep, errno)
		}
	}
	if got, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || !bytes.Equal(got, bytes.Repeat(data, 2)) {
		t.Errorf("the file holds %d bytes (%v), want 8192", len(got), err)
	}
	if _, _, errno := l.Exec(proto.OpWriteSync, 0, 0, &proto.WriteSyncReq{Name: "g", Data: data}, nil); errno != syscall.EPERM {
		t.Errorf("WRITE_SYNC by name in a namespace: %v, want EPERM", errno)
	}
	// Past the capacity: short, then ENOSPC.
	big := make([]byte, 2<<20)
	rep, _, errno = l.Exec(proto.OpWriteSync, 0, 0, &proto.WriteSyncReq{Handle: h, Offset: 8192, Flags: 1, Data: big}, nil)
	if errno == 0 && rep.(*proto.CountReply).N < uint64(len(big)) {
		_, _, errno = l.Exec(proto.OpWriteSync, 0, 0, &proto.WriteSyncReq{Handle: h, Offset: 8192 + rep.(*proto.CountReply).N, Flags: 1, Data: big}, nil)
	}
	if errno != syscall.ENOSPC {
		t.Errorf("WRITE_SYNC past a 1 MiB capacity: %v, want short and then ENOSPC", errno)
	}

	objects := filepath.Join(t.TempDir(), "objects")
	if err := os.Mkdir(objects, 0o700); err != nil {
		t.Fatal(err)
	}
	o, err := OpenLocal(LocalOptions{Dir: objects, Tracker: usage.New("objects", 1<<20), Stripes: true})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	const name = "0123456789abcdef"
	if rep, _, errno := o.Exec(proto.OpWriteSync, 0, 0, &proto.WriteSyncReq{Name: name, Offset: 100, Flags: 1, Data: data}, nil); errno != 0 || rep.(*proto.CountReply).N != 4096 {
		t.Fatalf("WRITE_SYNC of an object by name: %v %v", rep, errno)
	}
	if got, err := os.ReadFile(filepath.Join(objects, name)); err != nil || len(got) != 4196 || !bytes.Equal(got[100:], data) {
		t.Errorf("the object holds %d bytes (%v), want 4196", len(got), err)
	}
}
