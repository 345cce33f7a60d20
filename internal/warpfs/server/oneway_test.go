package server

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// A RELEASE sent one-way (proto.FlagOneWay) is carried out and answered with nothing: the
// next frame the client reads is the reply to its next request. Two replies a file less is
// what a create or an open and its close cost (issue 21).
func TestOneWayReleaseHasNoReply(t *testing.T) {
	f := newFixture(t, Limits{})
	if err := os.WriteFile(filepath.Join(f.dir, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	nc, br := handshake(t, f.addr)
	nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpOpen, ID: 10}, &proto.OpenReq{Path: "f"}))
	var open proto.OpenReply
	readReply(t, br, &open)
	for id := uint64(11); id <= 12; id++ { // the second finds no handle: still no reply
		nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpRelease, ID: id, Flags: proto.FlagOneWay},
			&proto.HandleReq{Handle: open.Handle}))
	}
	nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpPing, ID: 13}, &proto.Empty{}))
	if h := readReply(t, br, nil); h.Op != proto.OpPing || h.ID != 13 {
		t.Fatalf("after two one-way RELEASEs the server sent a reply to %s (id %d)", h.Op, h.ID)
	}
	// The handle is gone: a READ on it fails.
	nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpRead, ID: 14}, &proto.ReadReq{Handle: open.Handle, Size: 4}))
	h, _, err := readFrame(br, proto.MaxBody)
	if err != nil || h.ID != 14 || h.Errno == 0 {
		t.Fatalf("a READ on the released handle: %+v, %v", h, err)
	}
}
