package mount

import (
	"context"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
)

// transport carries a mount's requests to the server of its namespace: a network connection
// (*client.Client) or the server in this process (localTransport).
type transport interface {
	Do(ctx context.Context, call *client.Call) syscall.Errno
	Close()
}

// localTransport runs a mount's requests on the in-process server of a namespace on this host.
// There is no connection to lose, so a handle's generation never changes.
type localTransport struct{ local *server.Local }

func (t localTransport) Do(ctx context.Context, call *client.Call) syscall.Errno {
	req := call.Req
	switch w := req.(type) {
	case *proto.WriteReq:
		if call.Data != nil {
			with := *w // the network client sends the data after the request; here it rides along
			with.Data = call.Data
			req = &with
		}
	case *proto.WriteSyncReq:
		if call.Data != nil {
			with := *w
			with.Data = call.Data
			req = &with
		}
	}
	rep, n, errno, flags := t.local.ExecLeased(call.Op, call.UID, call.GID, req, call.Dest)
	call.UsedGen, call.N, call.Lease, call.Listing = localGeneration, n, 0, false
	if flags&proto.FlagLease != 0 {
		call.Lease = t.local.Lease()
		call.Listing = flags&proto.FlagListing != 0
	}
	if errno == 0 && call.Reply != nil && rep != nil {
		copyReply(call.Reply, rep)
	}
	return errno
}

func (t localTransport) Close() { t.local.Close() }

// localGeneration is the connection generation of every handle of a local mount.
const localGeneration = 1

// copyReply fills the caller's reply from the server's. The frequent small replies are
// assigned; the rest go through their encoding, as over the network.
func copyReply(dst, src proto.Message) {
	switch d := dst.(type) {
	case *proto.CountReply:
		if s, ok := src.(*proto.CountReply); ok {
			*d = *s
			return
		}
	case *proto.AttrReply:
		if s, ok := src.(*proto.AttrReply); ok {
			*d = *s
			return
		}
	case *proto.OpenReply:
		if s, ok := src.(*proto.OpenReply); ok {
			*d = *s
			return
		}
	}
	var e proto.Enc
	src.Encode(&e)
	proto.Decode(e.B, dst)
}
