package mount

// libdatawarp's cache calls on a cache instance's files (server/cachepolicy.go):
//
//   - setxattr user.spillway.cache.sync (any value) returns once the file's data, on every
//     server holding some of it, is on the PFS and the PFS file synced (dw_wait_sync_complete):
//     the mount opens the file, sends an FSYNC with proto.FsyncToPFS to each of its servers at
//     once, and closes it. What this node's handles still hold behind is sent first.
//   - setxattr or removexattr of user.spillway.cache.policy goes to the namespace server,
//     which keeps the file's (or directory's) policy; for a regular file the mount then opens
//     it on every server, whose open applies the policy to the file for all its opens there.
//   - getxattr of user.spillway.cache.policy is the namespace server's answer.
//
// On a scratch instance they are EOPNOTSUPP (its servers refuse the names too).

import (
	"context"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// cacheSetxattr serves the setxattr and removexattr (value nil) of the cache's attributes;
// handled is false for any other attribute.
func (n *node) cacheSetxattr(ctx context.Context, attr string, value []byte, flags uint32) (errno syscall.Errno, handled bool) {
	switch attr {
	case cache.SyncXattr:
		if value == nil {
			return syscall.ENODATA, true // nothing is stored to remove
		}
		return n.withCacheFile(ctx, n.syncToPFS), true
	case cache.PolicyXattr:
		if value == nil {
			errno = n.xattr(ctx, proto.OpRemovexattr, proto.XattrReq{Name: attr}, nil)
		} else {
			errno = n.xattr(ctx, proto.OpSetxattr, proto.XattrReq{Name: attr, Value: value, Flags: flags}, nil)
		}
		if errno != 0 || n.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG {
			return errno, true
		}
		return n.withCacheFile(ctx, n.applyPolicy), true
	}
	return 0, false
}

// withCacheFile opens the node's regular file of a cache instance for the mount's own
// requests, runs fn on the handle and closes it (EOPNOTSUPP: not a cache's file).
func (n *node) withCacheFile(ctx context.Context, fn func(context.Context, *fileHandle) syscall.Errno) syscall.Errno {
	if n.be.stripes == nil {
		return syscall.EOPNOTSUPP
	}
	if n.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG {
		return syscall.EINVAL
	}
	h, errno := n.open(ctx, syscall.O_RDONLY)
	if errno != 0 {
		return errno
	}
	defer h.Release(ctx)
	if h.striped == nil || h.striped.cache == nil {
		return syscall.EOPNOTSUPP
	}
	ctx, cancel := n.be.opCtx(ctx)
	defer cancel()
	return fn(ctx, h)
}

// syncToPFS asks every server of h's file to put the file's data on the PFS, at once.
func (n *node) syncToPFS(ctx context.Context, h *fileHandle) syscall.Errno {
	n.settleAll()
	for _, e := range parallel(serverPieces(h.striped.layout), func(p stripe.Piece) syscall.Errno {
		call := &client.Call{Op: proto.OpFsync, UID: objectCaller}
		_, errno := h.onObject(ctx, p.Server, call, func(id uint64) {
			call.Req = &proto.FsyncReq{Handle: id, Flags: proto.FsyncToPFS}
		})
		return errno
	}) {
		if e != 0 {
			return e
		}
	}
	return 0
}

// applyPolicy opens h's file's object on every server: the open carries the file's policy
// (proto.CacheRef.Policy), which each server applies to the file. The node's other handles
// take it too, for the objects they open later.
func (n *node) applyPolicy(ctx context.Context, h *fileHandle) syscall.Errno {
	policy := h.striped.cache.Policy
	n.mu.Lock()
	for o := range n.handles {
		if sf := o.striped; sf != nil && o != h {
			sf.mu.Lock()
			sf.policy, sf.policySet = policy, true
			sf.mu.Unlock()
		}
	}
	n.mu.Unlock()
	for _, e := range parallel(serverPieces(h.striped.layout), func(p stripe.Piece) syscall.Errno {
		_, _, _, errno := h.objectHandle(ctx, p.Server, 0)
		return errno
	}) {
		if e != 0 {
			return e
		}
	}
	return 0
}

// closingSync is a cache file's close (FLUSH): the servers holding data written through h put
// it on the PFS before close(2) returns if the file's policy says sync_on_close (they know
// it; the release of the objects, which would do it too, comes after close(2) has returned).
func (h *fileHandle) closingSync(ctx context.Context) syscall.Errno {
	sf := h.striped
	var pieces []stripe.Piece
	sf.mu.Lock()
	for s, o := range sf.objects {
		if o.dirty && o.open {
			pieces = append(pieces, stripe.Piece{Server: s})
		}
	}
	sf.mu.Unlock()
	for _, e := range parallel(pieces, func(p stripe.Piece) syscall.Errno {
		call := &client.Call{Op: proto.OpFsync, UID: objectCaller}
		_, errno := h.onObject(ctx, p.Server, call, func(id uint64) {
			call.Req = &proto.FsyncReq{Handle: id, Flags: proto.FsyncClosing}
		})
		return errno
	}) {
		if e != 0 {
			return e
		}
	}
	return 0
}
