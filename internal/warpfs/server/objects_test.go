package server

import (
	"bufio"
	"bytes"
	"net"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// A stub records which servers hold its objects: what its writers' RELEASEs said, once the
// last one closed. It is unknown while a writer has it open, after a writer whose RELEASE said
// nothing (an older client) or whose connection ended, and for a stub made for writing whose
// writer has not closed yet; a stub never opened for writing has none. UNLINK and RENAME's
// replies say so, to clients of ObjectsVersion on only.
func TestStubRecordsItsObjects(t *testing.T) {
	f := newStripedFixture(t, Limits{})
	c := f.client()
	create := func(name string, flags uint32) uint64 {
		t.Helper()
		var opened proto.OpenReply
		if errno := do(c, proto.OpCreate, &proto.CreateReq{Name: name, Flags: flags, Mode: 0o644}, &opened); errno != 0 {
			t.Fatal(errno)
		}
		return opened.Handle
	}
	open := func(name string, flags uint32) uint64 {
		t.Helper()
		var opened proto.OpenReply
		if errno := do(c, proto.OpOpen, &proto.OpenReq{Path: name, Flags: flags}, &opened); errno != 0 {
			t.Fatal(errno)
		}
		return opened.Handle
	}
	release := func(h uint64, objects []byte) {
		t.Helper()
		req := &proto.HandleReq{Handle: h, Reported: objects != nil, Objects: objects}
		if errno := do(c, proto.OpRelease, req, nil); errno != 0 {
			t.Fatal(errno)
		}
	}
	unlink := func(name string) proto.RemovedReply {
		t.Helper()
		var rep proto.RemovedReply
		if errno := do(c, proto.OpUnlink, &proto.EntryReq{Name: name}, &rep); errno != 0 {
			t.Fatal(errno)
		}
		if len(rep.Layout) == 0 {
			t.Fatalf("%s: no layout in the reply", name)
		}
		return rep
	}
	want := func(name string, rep proto.RemovedReply, known bool, objects []byte) {
		t.Helper()
		if rep.ObjectsKnown != known || known && !bytes.Equal(rep.Objects, objects) {
			t.Errorf("%s: objects known %v %08b, want %v %08b", name, rep.ObjectsKnown, rep.Objects, known, objects)
		}
	}

	h := create("open", syscall.O_WRONLY)
	want("removed while open for writing", unlink("open"), false, nil)
	release(h, []byte{0b0010})

	release(create("written", syscall.O_WRONLY), []byte{0b0010})
	want("written", unlink("written"), true, []byte{0b0010})

	release(create("empty", syscall.O_WRONLY), []byte{0})
	want("empty", unlink("empty"), true, []byte{0})

	release(create("read-only", syscall.O_RDONLY), nil)
	want("created read-only", unlink("read-only"), true, []byte{})

	// Two writers: the union, once both closed; one that says nothing leaves it unknown.
	release(create("two", syscall.O_WRONLY), []byte{0b0001})
	h1, h2 := open("two", syscall.O_RDWR), open("two", syscall.O_WRONLY|syscall.O_TRUNC)
	release(h1, []byte{0b0100})
	release(h2, []byte{0b1000})
	h3 := open("two", syscall.O_RDONLY) // a reader changes nothing
	release(h3, nil)
	want("two writers", unlink("two"), true, []byte{0b1101})

	release(create("silent", syscall.O_WRONLY), []byte{0b0001})
	release(open("silent", syscall.O_WRONLY), nil)
	release(open("silent", syscall.O_WRONLY), []byte{0b0001})
	want("a writer that said nothing", unlink("silent"), false, nil)

	// A writer whose connection ended.
	release(create("lost", syscall.O_WRONLY), []byte{0b0001})
	lost, err := f.dial(token, 1)
	if err != nil {
		t.Fatal(err)
	}
	var opened proto.OpenReply
	if errno := do(lost, proto.OpOpen, &proto.OpenReq{Path: "lost", Flags: syscall.O_WRONLY}, &opened); errno != 0 {
		t.Fatal(errno)
	}
	lost.Close()
	release(open("lost", syscall.O_WRONLY), []byte{0b0001})
	want("a lost writer", unlink("lost"), false, nil)

	// A truncate by name (no writer's handle) leaves it unknown.
	release(create("truncated", syscall.O_WRONLY), []byte{0b0001})
	var attr proto.AttrReply
	if errno := do(c, proto.OpSetattr, &proto.SetattrReq{Path: "truncated", Valid: proto.SetSize, Size: 5 << 20}, &attr); errno != 0 {
		t.Fatal(errno)
	}
	want("truncated by name", unlink("truncated"), false, nil)

	// Renaming over a file says where the replaced one's objects are.
	release(create("old", syscall.O_WRONLY), []byte{0b0100})
	release(create("new", syscall.O_WRONLY), []byte{0b0001})
	var renamed proto.RemovedReply
	if errno := do(c, proto.OpRename, &proto.RenameReq{Name: "new", NewName: "old"}, &renamed); errno != 0 {
		t.Fatal(errno)
	}
	want("renamed over", renamed, true, []byte{0b0100})

	// A client of version 5 gets the reply it knows.
	release(create("v5", syscall.O_WRONLY), []byte{0b0001})
	nc, br := handshakeVersion(t, f.addr, proto.LeaseVersion)
	nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpUnlink, ID: 3}, &proto.EntryReq{Name: "v5"}))
	var old proto.RemovedReply
	readReply(t, br, &old)
	if len(old.Layout) == 0 || old.ObjectsKnown {
		t.Errorf("a version 5 client's UNLINK reply: layout %d bytes, objects known %v; want a layout alone", len(old.Layout), old.ObjectsKnown)
	}
}

// handshakeVersion is handshake, offering protocol versions up to max.
func handshakeVersion(t *testing.T, addr string, max uint16) (net.Conn, *bufio.Reader) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	br := bufio.NewReader(nc)
	hello := proto.Hello{Magic: proto.Magic, MinVersion: proto.MinVersion, MaxVersion: max}
	nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpHello, ID: 1}, &hello))
	var ch proto.Challenge
	readReply(t, br, &ch)
	auth := proto.Auth{Proof: proto.ClientProof([]byte(token), ch.Nonce, hello.Nonce), Namespace: 1}
	nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpAuth, ID: 2}, &auth))
	readReply(t, br, &proto.Welcome{})
	return nc, br
}
