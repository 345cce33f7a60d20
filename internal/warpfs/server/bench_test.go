package server

import (
	"strconv"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"golang.org/x/sys/unix"
)

// Round trips of single requests to a server over TCP on the loopback interface, in a
// striped namespace: what each costs the storage node and the network, without FUSE.
//
//	go test -run '^$' -bench . -cpuprofile cpu.out ./internal/warpfs/server
func BenchmarkRequests(b *testing.B) {
	if unix.Geteuid() != 0 {
		b.Skip("a striped namespace's layout is a trusted extended attribute: root only")
	}
	f := newFixtureHolding(b, Limits{}, token, "")
	root := stripe.Layout{Size: 1 << 20, Width: 2, Servers: 2}
	if err := unix.Setxattr(f.dir, LayoutXattr, root.Encode(), 0); err != nil {
		b.Fatal(err)
	}
	c := f.client()
	b.Run("ping", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			do(c, proto.OpPing, &proto.Empty{}, nil)
		}
	})
	b.Run("create+release", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var rep proto.OpenReply
			if errno := do(c, proto.OpCreate, &proto.CreateReq{Name: "c" + strconv.Itoa(i), Flags: syscall.O_WRONLY | syscall.O_CREAT, Mode: 0o644}, &rep); errno != 0 {
				b.Fatal(errno)
			}
			do(c, proto.OpRelease, &proto.HandleReq{Handle: rep.Handle}, nil)
		}
	})
	b.Run("lookup", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var rep proto.AttrReply
			if errno := do(c, proto.OpLookup, &proto.PathReq{Path: "c0"}, &rep); errno != 0 {
				b.Fatal(errno)
			}
		}
	})
	b.Run("getattr", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var rep proto.AttrReply
			if errno := do(c, proto.OpGetattr, &proto.NodeReq{Path: "c0"}, &rep); errno != 0 {
				b.Fatal(errno)
			}
		}
	})
}
