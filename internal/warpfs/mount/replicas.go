package mount

// The replicas of a loadbalance namespace: every server of the instance holds a copy, staged
// in by that server; a compute node reads the copy the controller picked for it (by its name,
// so that N servers give N× the read bandwidth) and, when that copy's server stops answering,
// the next one. The mount is read-only, so any copy is as good as another. A server that
// refuses connections fails a request at once (package client), so the failover is then
// immediate; one that stops answering costs a request timeout first.
//
// A load-balanced cache (access_mode=loadbalance, type=cache) is served the same way: every
// server's namespace is the PFS directory, read-only, serving the data of whole files from
// that server's own cache (server.CacheTarget.Loadbalance), so any server is a replica; a
// local one is served through its data engine (Server.Cache).

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"sync"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
)

// openReplicas connects to every replica: the mount starts with the first.
func openReplicas(spec Spec, l Limits, path string, logger *log.Logger) (*backend, error) {
	f := &failover{log: logger}
	timeout := client.DefaultLimits().RequestTimeout
	for i, r := range spec.Replicas {
		var t transport
		switch {
		case r.Remote != nil:
			c, err := client.Dial(context.Background(), client.Options{
				Address: r.Remote.Address, Token: r.Remote.Token, Client: r.Remote.Client, Capability: r.Remote.Capability,
				CapabilityKey: r.Remote.CapabilityKey, TLS: r.Remote.TLS, Fragment: r.Remote.FragmentID,
				Namespace: r.Remote.NamespaceID, Instance: r.Remote.InstanceID, ReadOnly: true, Limits: r.Remote.Limits, Log: logger,
			})
			if err != nil {
				// A copy whose server is down now may answer later; the mount needs one.
				logger.Printf("warpfs: replica %d of %d (%s) unreachable at mount: %v", i+1, len(spec.Replicas), r.Node, err)
				t = &unreachable{err: err}
			} else {
				t = c
				timeout = c.Limits().RequestTimeout
			}
		case r.Dir != "":
			local, err := server.OpenLocal(server.LocalOptions{Dir: r.Dir, Tracker: r.Tracker, ReadOnly: true,
				Name: path, Log: slog.New(slog.NewTextHandler(logger.Writer(), nil)),
				Fragment: r.Fragment, Namespace: r.NamespaceID, Client: spec.Client, Cache: r.Cache})
			if err != nil {
				return nil, fmt.Errorf("cannot serve replica directory %s: %w", r.Dir, err)
			}
			t = localTransport{local}
		default:
			return nil, fmt.Errorf("replica %d of %d names neither a directory nor a remote node", i+1, len(spec.Replicas))
		}
		f.replicas = append(f.replicas, t)
		f.nodes = append(f.nodes, r.Node)
	}
	f.current = f.firstReachable()
	if f.current < 0 {
		f.Close()
		return nil, fmt.Errorf("no replica of the namespace can be reached (%d tried)", len(spec.Replicas))
	}
	return &backend{
		client:    f,
		readOnly:  true,
		keepCache: spec.ClientCache,
		blockSize: uint32(l.PreferredIOSize),
		// One failover fits in an operation: the first copy's timeout, then the next copy.
		timeout: 2 * timeout,
	}, nil
}

// failover sends requests to the current replica and moves to the next when it fails to
// answer. Handles belong to one replica: a handle of a replica left behind gets ESTALE, and
// the file is opened again by its name on the current one (fileHandle.do, dirStream.fetch).
type failover struct {
	log *log.Logger

	mu       sync.Mutex
	replicas []transport
	nodes    []string
	current  int
	epoch    uint64 // moves so far: the top bits of every generation handed out
}

const epochShift = 48

func (f *failover) firstReachable() int {
	for i, t := range f.replicas {
		if _, down := t.(*unreachable); !down {
			return i
		}
	}
	return -1
}

func (f *failover) Do(ctx context.Context, call *client.Call) syscall.Errno {
	gen := call.Gen
	for tries := 0; tries < len(f.replicas); tries++ {
		f.mu.Lock()
		cur, epoch := f.current, f.epoch
		f.mu.Unlock()
		if gen != 0 {
			if gen>>epochShift != epoch {
				return syscall.ESTALE // opened on a replica this mount has left
			}
			call.Gen = gen & (1<<epochShift - 1)
		}
		errno := f.replicas[cur].Do(ctx, call)
		call.Gen = gen
		if call.UsedGen != 0 {
			call.UsedGen |= epoch << epochShift
		}
		if errno != syscall.ENOTCONN && errno != syscall.EIO || ctx.Err() != nil {
			return errno
		}
		f.move(cur)
		if gen != 0 {
			return syscall.ESTALE // reopened on the next replica by the caller
		}
	}
	return syscall.EIO
}

// move leaves replica from for the next one (unless another request moved already).
func (f *failover) move(from int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.current != from {
		return
	}
	f.current = (from + 1) % len(f.replicas)
	f.epoch++
	f.log.Printf("warpfs: replica on %s stopped answering; reading the copy on %s", f.nodes[from], f.nodes[f.current])
}

// ReplicasXattr names, for a file or directory of a loadbalance mount on several storage
// nodes, the nodes holding a copy of the namespace, in the order the mount tries them
// (space-separated); ReplicaXattr the one this node reads now (`spillway stripes`). The
// client answers them; they are not stored.
const (
	ReplicasXattr = "user.spillway.replicas"
	ReplicaXattr  = "user.spillway.replica"
)

// where is the replicas' nodes and the one read now.
func (f *failover) where() (nodes []string, current string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.nodes...), f.nodes[f.current]
}

func (f *failover) Close() {
	for _, t := range f.replicas {
		t.Close()
	}
}

// unreachable is a replica whose server could not be reached when the mount was made.
type unreachable struct{ err error }

func (u *unreachable) Do(context.Context, *client.Call) syscall.Errno { return syscall.EIO }
func (u *unreachable) Close()                                         {}
