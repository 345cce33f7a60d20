package server

// The stripe objects of a cache fragment (cachens.go): a client opens a cache file's object
// on every server by its name (stripe.ObjectName of the file's layout ID) with the file's
// CacheRef (the namespace server's OpenReply.Cache), and the server opens it in its data
// engine (CacheData) with the door of the request's caller, who is the user that opened the
// file (the client sends object opens of a cache file as its opener). Reads, writes, fsync
// and release then go through the engine's file; truncation and removal of objects are the
// engine's Truncate and Unlink. Nothing of a cache fragment is a file of Target.Dir.

import (
	"errors"
	"io"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// cacheObjects is a stripe session's cache fragment.
type cacheObjects struct {
	t *CacheTarget
	v *volume // the session's volume on Target.Dir: read-only, counters
}

// ref is the engine's name of the file whose object name and CacheRef a request gives: the
// layout is computed here as the namespace server did, and the name must be its.
func (c *cacheObjects) ref(name string, r *proto.CacheRef) (CacheFileRef, syscall.Errno) {
	if r == nil {
		return CacheFileRef{}, syscall.EINVAL // a cache fragment has no objects of its own
	}
	if errno := pathErrno(r.Path); errno != 0 || r.Path == "" {
		return CacheFileRef{}, syscall.EINVAL
	}
	key := CacheFileKey{Dev: r.Dev, Ino: r.Ino}
	l := c.t.fileLayout(key)
	if name != stripe.ObjectName(l.ID) {
		return CacheFileRef{}, syscall.EINVAL
	}
	return CacheFileRef{Path: r.Path, Key: key, Layout: l, Override: overrideOf(r.Policy), OverrideGen: r.Policy.Gen}, 0
}

// exec serves one request of a cache fragment's stripe session.
func (c *cacheObjects) exec(s *session, op proto.Op, uid, gid uint32, m proto.Message, dest []byte) (proto.Message, int, syscall.Errno) {
	if c.v.readOnly && modifying(op) {
		return nil, 0, syscall.EROFS
	}
	withHandle := func(id uint64, fn func(*cacheHandle) syscall.Errno) syscall.Errno {
		hd := s.get(id)
		if hd == nil {
			return syscall.EBADF
		}
		defer s.put(hd)
		if hd.cache == nil || hd.cache.data == nil {
			return syscall.EBADF
		}
		return fn(hd.cache)
	}
	open := func(name string, r *proto.CacheRef, write bool) (proto.Message, int, syscall.Errno) {
		ref, errno := c.ref(name, r)
		if errno != 0 {
			return nil, 0, errno
		}
		if write {
			if c.v.readOnly {
				return nil, 0, syscall.EROFS
			}
			if errno := c.v.acct.writable(); errno != 0 {
				return nil, 0, errno
			}
		}
		door, errno := c.t.door(uid, gid)
		if errno != 0 {
			return nil, 0, errno
		}
		f, err := c.t.Data.OpenFile(door, ref, write)
		if err != nil {
			return nil, 0, doorErrno(err)
		}
		id, errno := s.add(&handle{cache: &cacheHandle{path: ref.Path, key: ref.Key, door: door, data: f, ref: ref}})
		return &proto.OpenReply{Handle: id, Attr: proto.Attr{Mode: syscall.S_IFREG | 0o600, Nlink: 1}}, 0, errno
	}
	switch r := m.(type) {
	case *proto.OpenReq:
		return open(r.Path, r.Cache, r.Flags&unix.O_ACCMODE != unix.O_RDONLY)
	case *proto.CreateReq:
		if op == proto.OpTmpfile || r.Dir != "" {
			return nil, 0, syscall.EINVAL
		}
		return open(r.Name, r.Cache, true)
	case *proto.HandleReq:
		return &proto.Empty{}, 0, s.release(r.Handle)
	case *proto.ReadReq:
		if r.Offset > 1<<62 {
			return nil, 0, syscall.EINVAL
		}
		var n int
		errno := withHandle(r.Handle, func(h *cacheHandle) syscall.Errno {
			var err error
			n, err = h.data.ReadAt(dest[:min(int(r.Size), len(dest))], r.Offset)
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return doorErrno(err)
		})
		if errno == 0 {
			c.v.acct.read(n, r.Offset+uint64(n))
		}
		return nil, n, errno
	case *proto.WriteReq:
		if r.Offset > 1<<62 {
			return nil, 0, syscall.EFBIG
		}
		var n int
		errno := withHandle(r.Handle, func(h *cacheHandle) syscall.Errno {
			var err error
			n, err = h.data.WriteAt(r.Data, r.Offset)
			return doorErrno(err)
		})
		if n > 0 || errno == 0 {
			c.v.acct.wrote(n, r.Offset+uint64(n))
		}
		return &proto.CountReply{N: uint64(n)}, 0, errno
	case *proto.FsyncReq:
		return &proto.Empty{}, 0, withHandle(r.Handle, func(h *cacheHandle) syscall.Errno {
			if r.Flags&proto.FsyncToPFS != 0 {
				return doorErrno(h.data.SyncToPFS())
			}
			if r.Flags&proto.FsyncClosing != 0 {
				return doorErrno(h.data.Closing())
			}
			return doorErrno(h.data.Fsync())
		})
	case *proto.SetattrReq:
		if r.Valid&^(proto.SetSize|proto.SetSizeAtLeast) != 0 || r.Valid&proto.SetSize == 0 || r.Handle == 0 {
			return nil, 0, syscall.EINVAL // objects are truncated through a handle, nothing else
		}
		errno := withHandle(r.Handle, func(h *cacheHandle) syscall.Errno {
			return doorErrno(c.t.Data.Truncate(h.door, h.ref, r.Size))
		})
		return &proto.AttrReply{Attr: proto.Attr{Mode: syscall.S_IFREG | 0o600, Nlink: 1, Size: r.Size}}, 0, errno
	case *proto.EntryReq:
		if op != proto.OpUnlink || r.Dir != "" {
			return nil, 0, syscall.EINVAL
		}
		ref, errno := c.ref(r.Name, r.Cache)
		if errno != 0 {
			return nil, 0, errno
		}
		c.t.Data.Unlink(ref.Key)
		return &proto.RemovedReply{}, 0, 0
	case *proto.Empty: // STATFS: the PFS's, this server's share of it
		door, errno := c.t.door(uid, gid)
		if errno != 0 {
			return nil, 0, errno
		}
		rep, errno := pfsStatfs(door, uint64(c.t.Layout.Servers))
		return &rep, 0, errno
	}
	return nil, 0, syscall.EOPNOTSUPP
}
