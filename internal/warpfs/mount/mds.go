package mount

// A striped namespace spread over every server of its instance (max_mds=yes): one namespace
// shard per server, together one file tree. The map is package stripe's Shard:
//
//   - A directory exists on every shard, with the same attributes. Shard 0's copy is
//     authoritative: its attributes are the directory's (its inode number too), and its inode
//     number is the directory's id, which never changes while the directory exists, renamed
//     or not, so that renaming a directory never moves its children. The root's id is
//     stripe.RootDirID.
//   - A non-directory entry NAME of directory D (a striped file's stub, a symbolic link, a
//     FIFO) lives on shard Shard(id of D, NAME) only. A LOOKUP goes there: one request for a
//     file; a directory found there is asked of shard 0 for its attributes (a second one).
//   - Changes to a directory (MKDIR, RMDIR, RENAME, SETATTR, SETXATTR, REMOVEXATTR) reach every
//     shard; READDIR lists shard 0 (every directory, and its share of the files), then the
//     other shards' files.
//   - A RENAME of a non-directory between names of different shards makes the entry on the new
//     shard (ADOPT: a stub with the same layout, so the stripe objects, keyed by the file's id,
//     stay where they are) and then removes the old name (its objects kept). Not atomic: a crash
//     in between leaves both names (docs/mounts.md).
//
// shards is a transport, like failover (replicas.go): the FUSE layer (node.go) is the same
// for every mount and tells it, with each request naming a path, the ids of the directories
// concerned (client.Call.Route, from the inode numbers this transport reported). Handles carry
// their shard in their top byte; directory listings are handles of this transport.

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// maxShards bounds the shards of a namespace: a handle's top byte names its shard, and a
// file's inode number is its shard's xor'ed with the shard in the top byte.
const maxShards = 127

const (
	shardShift = 56
	rawMask    = 1<<shardShift - 1
	dirHandle  = 1 << 63 // a listing of this transport, not a server's handle
)

// openShards connects to every shard of the namespace.
func openShards(spec Spec, l Limits, path string, logger *log.Logger) (*backend, error) {
	if len(spec.MDS) > maxShards {
		return nil, fmt.Errorf("a namespace of %d shards: at most %d", len(spec.MDS), maxShards)
	}
	sh := &shards{dirs: map[uint64]*shardDir{}}
	timeout := client.DefaultLimits().RequestTimeout
	for i, s := range spec.MDS {
		var t transport
		switch {
		case s.Remote != nil:
			r := s.Remote
			c, err := client.Dial(context.Background(), client.Options{
				Address: r.Address, Token: r.Token, Client: r.Client, Capability: r.Capability, CapabilityKey: r.CapabilityKey,
				TLS: r.TLS, Fragment: r.FragmentID, Namespace: r.NamespaceID, Instance: r.InstanceID,
				ReadOnly: spec.ReadOnly, MaxFileSize: spec.MaxFileSize, Limits: r.Limits, Log: logger,
			})
			if err != nil {
				sh.Close()
				return nil, fmt.Errorf("cannot reach namespace shard %d of %d (namespace %d on %s): %w", i+1, len(spec.MDS), r.NamespaceID, r.Address, err)
			}
			t = c
			timeout = max(timeout, c.Limits().RequestTimeout)
		case s.Dir != "":
			local, err := server.OpenLocal(server.LocalOptions{
				Dir: s.Dir, Tracker: s.Tracker, ReadOnly: spec.ReadOnly, MaxFileSize: spec.MaxFileSize,
				Name: fmt.Sprintf("%s (shard %d)", path, i), Log: slog.New(slog.NewTextHandler(logger.Writer(), nil)),
				Fragment: s.Fragment, Namespace: s.NamespaceID, Client: spec.Client, Lease: l.Lease,
			})
			if err != nil {
				sh.Close()
				return nil, fmt.Errorf("cannot serve namespace shard directory %s: %w", s.Dir, err)
			}
			t = localTransport{local}
		default:
			sh.Close()
			return nil, fmt.Errorf("namespace shard %d of %d names neither a directory nor a remote node", i+1, len(spec.MDS))
		}
		sh.servers = append(sh.servers, t)
	}
	return &backend{
		client:    sh,
		readOnly:  spec.ReadOnly,
		keepCache: spec.ClientCache,
		blockSize: uint32(l.PreferredIOSize),
		// A rename or rmdir takes a few requests to every shard.
		timeout: 2 * timeout,
	}, nil
}

// shards routes a mount's requests to the shards of its namespace.
type shards struct {
	servers []transport

	mu      sync.Mutex
	dirs    map[uint64]*shardDir
	nextDir uint64
}

// shardDir is a directory listing: every shard's, one after the other (shard 0 whole, the
// others without their directories). Its offsets count the entries listed.
type shardDir struct {
	mu      sync.Mutex
	handles []uint64 // per shard; 0: the shard lacks the directory (a half-made one)
	gens    []uint64
	shard   int    // the shard being listed
	off     uint64 // where its next batch starts
	pos     uint64 // entries listed so far
}

func (sh *shards) n() int { return len(sh.servers) }

func (sh *shards) Close() {
	for _, t := range sh.servers {
		t.Close()
	}
}

// split is a path's directory and last component.
func split(path string) (dir, name string) {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[:i], path[i+1:]
	}
	return "", path
}

// dirID is the id of directory path, hint if the FUSE layer knew it, else shard 0's answer.
func (sh *shards) dirID(ctx context.Context, path string, hint uint64, uid, gid uint32) (uint64, syscall.Errno) {
	if path == "" {
		return stripe.RootDirID, 0
	}
	if hint != 0 {
		return hint, 0
	}
	var rep proto.AttrReply
	if errno := sh.servers[0].Do(ctx, &client.Call{Op: proto.OpLookup, UID: uid, GID: gid, Req: &proto.PathReq{Path: path}, Reply: &rep}); errno != 0 {
		return 0, errno
	}
	if rep.Attr.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return 0, syscall.ENOTDIR
	}
	return rep.Attr.Ino, 0
}

// shardOf is the shard of entry name in directory dir (whose id the hint may give).
func (sh *shards) shardOf(ctx context.Context, dir, name string, hint uint64, uid, gid uint32) (int, syscall.Errno) {
	id, errno := sh.dirID(ctx, dir, hint, uid, gid)
	if errno != 0 {
		return 0, errno
	}
	return stripe.Shard(id, name, sh.n()), 0
}

// pathShard is the shard of the node at path.
func (sh *shards) pathShard(ctx context.Context, path string, hint uint64, uid, gid uint32) (int, syscall.Errno) {
	if path == "" {
		return 0, 0
	}
	dir, name := split(path)
	return sh.shardOf(ctx, dir, name, hint, uid, gid)
}

// on sends call to shard s as it is, and makes its reply this transport's: handles and inode
// numbers carry the shard.
func (sh *shards) on(ctx context.Context, s int, call *client.Call) syscall.Errno {
	errno := sh.servers[s].Do(ctx, call)
	if errno == 0 {
		fixReply(call.Reply, s)
	}
	return errno
}

// ino is a non-directory's inode number on shard s as the mount reports it: distinct from
// every other shard's (inode numbers of a file system stay far below 2^56).
func ino(raw uint64, s int) uint64 { return raw ^ uint64(s)<<shardShift }

func fixReply(reply proto.Message, s int) {
	switch r := reply.(type) {
	case *proto.AttrReply:
		if r.Attr.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			r.Attr.Ino = ino(r.Attr.Ino, s)
		}
	case *proto.OpenReply:
		r.Handle |= uint64(s) << shardShift
		r.Attr.Ino = ino(r.Attr.Ino, s)
	}
}

// byHandle sends a request naming a server handle to that handle's shard.
func (sh *shards) byHandle(ctx context.Context, call *client.Call, h uint64, set func(raw uint64)) syscall.Errno {
	s := int(h >> shardShift)
	if h&dirHandle != 0 || s >= sh.n() {
		return syscall.EBADF
	}
	set(h & rawMask)
	defer set(h)
	return sh.on(ctx, s, call)
}

// all sends a change of directory path to every shard: shard 0 first (an error there changes
// nothing), then the others. The reply is shard 0's.
func (sh *shards) all(ctx context.Context, call *client.Call) syscall.Errno {
	if errno := sh.on(ctx, 0, call); errno != 0 {
		return errno
	}
	reply := call.Reply
	var first syscall.Errno
	for s := 1; s < sh.n(); s++ {
		c := *call
		c.Reply = proto.NewReply(call.Op)
		if errno := sh.servers[s].Do(ctx, &c); errno != 0 && errno != syscall.ENOENT && first == 0 {
			first = errno
		}
	}
	call.Reply = reply
	return first
}

func (sh *shards) Do(ctx context.Context, call *client.Call) syscall.Errno {
	uid, gid, route := call.UID, call.GID, call.Route
	switch r := call.Req.(type) {
	case *proto.PathReq:
		switch call.Op {
		case proto.OpOpendir:
			return sh.opendir(ctx, call, r.Path)
		case proto.OpLookup:
			s, errno := sh.pathShard(ctx, r.Path, route.Parent, uid, gid)
			if errno != 0 {
				return errno
			}
			if errno := sh.on(ctx, s, call); errno != 0 || s == 0 {
				return errno
			}
			if rep, ok := call.Reply.(*proto.AttrReply); ok && rep.Attr.Mode&syscall.S_IFMT == syscall.S_IFDIR {
				return sh.on(ctx, 0, call) // a directory's attributes are shard 0's
			}
			return 0
		default: // READLINK
			s, errno := sh.pathShard(ctx, r.Path, route.Parent, uid, gid)
			if errno != 0 {
				return errno
			}
			return sh.on(ctx, s, call)
		}
	case *proto.NodeReq:
		if r.Handle != 0 {
			return sh.byHandle(ctx, call, r.Handle, func(h uint64) { r.Handle = h })
		}
		return sh.node(ctx, call, r.Path, route, false)
	case *proto.SetattrReq:
		if r.Handle != 0 {
			return sh.byHandle(ctx, call, r.Handle, func(h uint64) { r.Handle = h })
		}
		return sh.node(ctx, call, r.Path, route, true)
	case *proto.XattrReq:
		if r.Handle != 0 {
			return sh.byHandle(ctx, call, r.Handle, func(h uint64) { r.Handle = h })
		}
		if strings.HasPrefix(r.Name, adoptReserved) {
			return syscall.EPERM
		}
		return sh.node(ctx, call, r.Path, route, call.Op == proto.OpSetxattr || call.Op == proto.OpRemovexattr)
	case *proto.OpenReq:
		if route.Dir {
			return sh.on(ctx, 0, call)
		}
		s, errno := sh.pathShard(ctx, r.Path, route.Parent, uid, gid)
		if errno != 0 {
			return errno
		}
		return sh.on(ctx, s, call)
	case *proto.CreateReq:
		s, errno := sh.shardOf(ctx, r.Dir, r.Name, route.Parent, uid, gid)
		if errno != 0 {
			return errno
		}
		return sh.touchingParent(ctx, s, call, uid, gid, r.Dir)
	case *proto.MkdirReq:
		s, errno := sh.shardOf(ctx, r.Dir, r.Name, route.Parent, uid, gid)
		if errno != 0 {
			return errno
		}
		if call.Op == proto.OpMknod {
			return sh.touchingParent(ctx, s, call, uid, gid, r.Dir)
		}
		return sh.mkdir(ctx, call, r, s)
	case *proto.SymlinkReq:
		s, errno := sh.shardOf(ctx, r.Dir, r.Name, route.Parent, uid, gid)
		if errno != 0 {
			return errno
		}
		return sh.touchingParent(ctx, s, call, uid, gid, r.Dir)
	case *proto.LinkReq:
		s, errno := sh.shardOf(ctx, r.Dir, r.Name, route.Parent, uid, gid)
		if errno != 0 {
			return errno
		}
		from, errno := sh.pathShard(ctx, r.Path, route.NewParent, uid, gid)
		if errno != 0 {
			return errno
		}
		if from != s {
			var a proto.AttrReply
			if errno := sh.servers[from].Do(ctx, &client.Call{Op: proto.OpLookup, UID: uid, GID: gid, Req: &proto.PathReq{Path: r.Path}, Reply: &a}); errno != 0 {
				return errno
			}
			if a.Attr.Mode&syscall.S_IFMT == syscall.S_IFREG {
				return syscall.EPERM // a striped file has one name (as on one shard)
			}
			return syscall.EXDEV // a hard link between shards
		}
		return sh.touchingParent(ctx, s, call, uid, gid, r.Dir)
	case *proto.EntryReq:
		s, errno := sh.shardOf(ctx, r.Dir, r.Name, route.Parent, uid, gid)
		if errno != 0 {
			return errno
		}
		if call.Op == proto.OpUnlink {
			return sh.touchingParent(ctx, s, call, uid, gid, r.Dir)
		}
		return sh.rmdir(ctx, call, r, s)
	case *proto.RenameReq:
		return sh.rename(ctx, call, r)
	case *proto.ReaddirReq:
		return sh.readdir(ctx, call, r)
	case *proto.HandleReq: // RELEASE
		if r.Handle&dirHandle != 0 {
			return sh.closedir(ctx, r.Handle)
		}
		return sh.byHandle(ctx, call, r.Handle, func(h uint64) { r.Handle = h })
	case *proto.ReadReq:
		return sh.byHandle(ctx, call, r.Handle, func(h uint64) { r.Handle = h })
	case *proto.WriteReq:
		return sh.byHandle(ctx, call, r.Handle, func(h uint64) { r.Handle = h })
	case *proto.WriteSyncReq:
		return sh.byHandle(ctx, call, r.Handle, func(h uint64) { r.Handle = h })
	case *proto.FsyncReq:
		return sh.byHandle(ctx, call, r.Handle, func(h uint64) { r.Handle = h })
	case *proto.FallocateReq:
		return sh.byHandle(ctx, call, r.Handle, func(h uint64) { r.Handle = h })
	case *proto.LseekReq:
		return sh.byHandle(ctx, call, r.Handle, func(h uint64) { r.Handle = h })
	case *proto.CopyRangeReq:
		if r.In>>shardShift != r.Out>>shardShift {
			return syscall.EXDEV
		}
		in, out := r.In, r.Out
		r.Out &= rawMask
		defer func() { r.In, r.Out = in, out }()
		return sh.byHandle(ctx, call, in, func(h uint64) { r.In = h })
	}
	// STATFS, PING: the instance's numbers are the same on every shard.
	return sh.on(ctx, 0, call)
}

// adoptReserved is the server's attribute namespace: never a user's to set.
const adoptReserved = "trusted.spillway."

// node sends a request naming a node by path: a directory's to shard 0 (a change to every
// shard), any other's to its shard.
func (sh *shards) node(ctx context.Context, call *client.Call, path string, route client.Route, change bool) syscall.Errno {
	if path == "" || route.Dir {
		if change {
			return sh.all(ctx, call)
		}
		return sh.on(ctx, 0, call)
	}
	s, errno := sh.pathShard(ctx, path, route.Parent, call.UID, call.GID)
	if errno != 0 {
		return errno
	}
	return sh.on(ctx, s, call)
}

// order is every shard with home last: lookups find a directory on its home shard, so one
// being made is seen only once it is whole.
func (sh *shards) order(home int) []int {
	out := make([]int, 0, sh.n())
	for s := 0; s < sh.n(); s++ {
		if s != home {
			out = append(out, s)
		}
	}
	return append(out, home)
}

// mkdir makes a directory on every shard, its home (where lookups find it) last. Another
// node making the same name fails on the first shard, before it made anything; a copy found
// on a later shard is the leftover of an interrupted mkdir, and is taken.
func (sh *shards) mkdir(ctx context.Context, call *client.Call, r *proto.MkdirReq, home int) syscall.Errno {
	var made []int
	var attr proto.Attr
	for i, s := range sh.order(home) {
		var rep proto.AttrReply
		c := &client.Call{Op: proto.OpMkdir, UID: call.UID, GID: call.GID, Req: r, Reply: &rep}
		errno := sh.servers[s].Do(ctx, c)
		if errno == syscall.EEXIST && i > 0 {
			errno = sh.servers[s].Do(ctx, &client.Call{Op: proto.OpLookup, UID: call.UID, GID: call.GID,
				Req: &proto.PathReq{Path: join(r.Dir, r.Name)}, Reply: &rep})
			if errno == 0 && rep.Attr.Mode&syscall.S_IFMT != syscall.S_IFDIR {
				errno = syscall.EEXIST
			}
		}
		if errno != 0 {
			for _, m := range made { // undo, so that the name stays free
				sh.servers[m].Do(ctx, &client.Call{Op: proto.OpRmdir, Req: &proto.EntryReq{Dir: r.Dir, Name: r.Name}})
			}
			return errno
		}
		made = append(made, s)
		if s == 0 {
			attr = rep.Attr
		}
	}
	if rep, ok := call.Reply.(*proto.AttrReply); ok {
		rep.Attr = attr
	}
	return 0
}

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// listed reports what shard s holds of directory path: whether the directory is there,
// and whether it holds any entry.
func (sh *shards) listed(ctx context.Context, s int, path string) (exists, empty bool, errno syscall.Errno) {
	var h proto.HandleReply
	c := &client.Call{Op: proto.OpOpendir, Req: &proto.PathReq{Path: path}, Reply: &h}
	if errno := sh.servers[s].Do(ctx, c); errno != 0 {
		if errno == syscall.ENOENT {
			return false, true, 0
		}
		return false, false, errno
	}
	defer sh.servers[s].Do(ctx, &client.Call{Op: proto.OpRelease, Gen: c.UsedGen, NoReconnect: true, Req: &proto.HandleReq{Handle: h.Handle}})
	var off uint64
	for {
		var rep proto.ReaddirReply
		if errno := sh.servers[s].Do(ctx, &client.Call{Op: proto.OpReaddir, Gen: c.UsedGen, Reply: &rep,
			Req: &proto.ReaddirReq{Handle: h.Handle, Offset: off}}); errno != 0 {
			return true, false, errno
		}
		for _, e := range rep.Entries {
			if e.Name != "." && e.Name != ".." {
				return true, false, 0
			}
		}
		if rep.EOF || len(rep.Entries) == 0 {
			return true, true, 0
		}
		off = rep.Entries[len(rep.Entries)-1].Off
	}
}

// emptyEverywhere checks that directory path holds no entry on any shard: ENOTEMPTY if one
// does, ENOENT if no shard has it, ENOTDIR if it names something else. held lists the shards
// holding the directory.
func (sh *shards) emptyEverywhere(ctx context.Context, path string) (held []bool, errno syscall.Errno) {
	held = make([]bool, sh.n())
	errs := make([]syscall.Errno, sh.n())
	empties := make([]bool, sh.n())
	var wg sync.WaitGroup
	for s := range sh.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			held[s], empties[s], errs[s] = sh.listed(ctx, s, path)
		}()
	}
	wg.Wait()
	anywhere := false
	for s := range sh.servers {
		if errs[s] != 0 {
			return nil, errs[s]
		}
		if !empties[s] {
			return nil, syscall.ENOTEMPTY
		}
		anywhere = anywhere || held[s]
	}
	if !anywhere {
		return nil, syscall.ENOENT
	}
	return held, 0
}

// rmdir removes a directory empty on every shard: from the other shards first, its home
// (where lookups find it) last. Should a shard refuse (an entry made meanwhile), the copies
// already removed are made again.
func (sh *shards) rmdir(ctx context.Context, call *client.Call, r *proto.EntryReq, home int) syscall.Errno {
	path := join(r.Dir, r.Name)
	held, errno := sh.emptyEverywhere(ctx, path)
	if errno != 0 {
		return errno
	}
	var before proto.AttrReply
	if errno := sh.servers[0].Do(ctx, &client.Call{Op: proto.OpLookup, Req: &proto.PathReq{Path: path}, Reply: &before}); errno != 0 && held[0] {
		return errno
	}
	var removed []int
	for _, s := range sh.order(home) {
		if !held[s] {
			continue
		}
		if errno := sh.servers[s].Do(ctx, &client.Call{Op: proto.OpRmdir, UID: call.UID, GID: call.GID, Req: r}); errno != 0 && errno != syscall.ENOENT {
			for _, m := range removed {
				sh.remake(ctx, m, r.Dir, r.Name, &before.Attr)
			}
			return errno
		}
		removed = append(removed, s)
	}
	return 0
}

// remake makes a directory copy again, as it was.
func (sh *shards) remake(ctx context.Context, s int, dir, name string, a *proto.Attr) {
	sh.servers[s].Do(ctx, &client.Call{Op: proto.OpMkdir, UID: a.UID, GID: a.GID,
		Req: &proto.MkdirReq{Dir: dir, Name: name, Mode: a.Mode & 0o7777}, Reply: &proto.AttrReply{}})
}

// rename renames an entry: a directory on every shard, a non-directory on its shard or, when
// its new name belongs to another shard, by making it there and removing the old name.
func (sh *shards) rename(ctx context.Context, call *client.Call, r *proto.RenameReq) syscall.Errno {
	uid, gid := call.UID, call.GID
	from, errno := sh.shardOf(ctx, r.Dir, r.Name, call.Route.Parent, uid, gid)
	if errno != 0 {
		return errno
	}
	to, errno := sh.shardOf(ctx, r.NewDir, r.NewName, call.Route.NewParent, uid, gid)
	if errno != 0 {
		return errno
	}
	var src proto.AttrReply
	if errno := sh.servers[from].Do(ctx, &client.Call{Op: proto.OpLookup, UID: uid, GID: gid,
		Req: &proto.PathReq{Path: join(r.Dir, r.Name)}, Reply: &src}); errno != 0 {
		return errno
	}
	var dst proto.AttrReply
	dstErr := sh.servers[to].Do(ctx, &client.Call{Op: proto.OpLookup, UID: uid, GID: gid,
		Req: &proto.PathReq{Path: join(r.NewDir, r.NewName)}, Reply: &dst})
	if dstErr != 0 && dstErr != syscall.ENOENT {
		return dstErr
	}
	exists := dstErr == 0
	srcDir := src.Attr.Mode&syscall.S_IFMT == syscall.S_IFDIR
	dstDir := exists && dst.Attr.Mode&syscall.S_IFMT == syscall.S_IFDIR
	if srcDir || dstDir {
		switch {
		case r.Flags&unix.RENAME_EXCHANGE != 0 && (!exists || srcDir != dstDir):
			if !exists {
				return syscall.ENOENT
			}
			return syscall.EXDEV // exchanging a directory with a file of one shard
		case exists && r.Flags&unix.RENAME_NOREPLACE != 0:
			return syscall.EEXIST
		case srcDir && exists && !dstDir:
			return syscall.ENOTDIR
		case !srcDir && dstDir:
			return syscall.EISDIR
		}
		if exists && r.Flags&unix.RENAME_EXCHANGE == 0 && !(r.Dir == r.NewDir && r.Name == r.NewName) {
			if _, errno := sh.emptyEverywhere(ctx, join(r.NewDir, r.NewName)); errno != 0 {
				return errno
			}
		}
		return sh.renameAll(ctx, call, r)
	}
	if from == to {
		if errno := sh.on(ctx, from, call); errno != 0 || from == 0 {
			return errno
		}
		sh.touchDirs(ctx, uid, gid, r.Dir, r.NewDir)
		return 0
	}
	if r.Flags&unix.RENAME_EXCHANGE != 0 {
		return syscall.EXDEV // two files of different shards
	}
	if exists && r.Flags&unix.RENAME_NOREPLACE != 0 {
		return syscall.EEXIST
	}
	if errno := sh.move(ctx, call, r, from, to, &src.Attr); errno != 0 {
		return errno
	}
	sh.touchDirs(ctx, uid, gid, r.Dir, r.NewDir)
	return 0
}

// touchingParent runs a call that adds or removes a non-directory entry of dir on shard s;
// when s is not shard 0, whose copy of a directory holds its attributes, dir's modification
// and change times are moved there too, as a local file system moves them.
func (sh *shards) touchingParent(ctx context.Context, s int, call *client.Call, uid, gid uint32, dir string) syscall.Errno {
	if errno := sh.on(ctx, s, call); errno != 0 || s == 0 {
		return errno
	}
	sh.touchDirs(ctx, uid, gid, dir)
	return 0
}

// touchDirs sets the modification time (and so the change time) of directories on shard 0 to
// now, as the caller (who could change their entries, so may). Best effort: the entry itself
// changed; a directory that went meanwhile keeps nothing to update.
func (sh *shards) touchDirs(ctx context.Context, uid, gid uint32, dirs ...string) {
	for i, dir := range dirs {
		if i > 0 && dir == dirs[0] {
			continue
		}
		sh.servers[0].Do(ctx, &client.Call{Op: proto.OpSetattr, UID: uid, GID: gid,
			Req: &proto.SetattrReq{Path: dir, Valid: proto.SetMtime | proto.SetMtimeNow}, Reply: &proto.AttrReply{}})
	}
}

// renameAll renames a directory on every shard: shard 0 first (it refuses what the kernel
// left to the file system, such as a directory moved under itself, with nothing changed).
func (sh *shards) renameAll(ctx context.Context, call *client.Call, r *proto.RenameReq) syscall.Errno {
	if errno := sh.servers[0].Do(ctx, call); errno != 0 {
		return errno
	}
	var first syscall.Errno
	for s := 1; s < sh.n(); s++ {
		c := *call
		c.Reply = &proto.RemovedReply{}
		if errno := sh.servers[s].Do(ctx, &c); errno != 0 && first == 0 {
			first = errno
		}
	}
	if rep, ok := call.Reply.(*proto.RemovedReply); ok {
		rep.Layout = nil // directories have no objects
	}
	return first
}

// move renames a non-directory to a name of another shard: the entry is made there whole
// (ADOPT; a striped file's stub keeps its layout, so its objects and data stay put), then the
// old name is removed, its objects kept. A crash in between leaves both names.
func (sh *shards) move(ctx context.Context, call *client.Call, r *proto.RenameReq, from, to int, a *proto.Attr) syscall.Errno {
	uid, gid := call.UID, call.GID
	path := join(r.Dir, r.Name)
	req := &proto.AdoptReq{Dir: r.NewDir, Name: r.NewName, Mode: a.Mode, UID: a.UID, GID: a.GID,
		Flags: r.Flags & unix.RENAME_NOREPLACE, Atime: a.Atime, Mtime: a.Mtime}
	switch a.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		// Its layout, as the open of a striped file gives it (as root: the kernel checked the
		// caller's right to rename, not to read).
		var o proto.OpenReply
		c := &client.Call{Op: proto.OpOpen, Req: &proto.OpenReq{Path: path, Flags: syscall.O_RDONLY | syscall.O_NOFOLLOW}, Reply: &o}
		if errno := sh.servers[from].Do(ctx, c); errno != 0 {
			return errno
		}
		sh.servers[from].Do(ctx, &client.Call{Op: proto.OpRelease, Gen: c.UsedGen, NoReconnect: true, Req: &proto.HandleReq{Handle: o.Handle}})
		if len(o.Layout) == 0 {
			return syscall.EXDEV // a file holding its own data: it would have to be copied
		}
		req.Layout = o.Layout
	case syscall.S_IFLNK:
		var t proto.DataReply
		if errno := sh.servers[from].Do(ctx, &client.Call{Op: proto.OpReadlink, UID: uid, GID: gid, Req: &proto.PathReq{Path: path}, Reply: &t}); errno != 0 {
			return errno
		}
		req.Target = string(t.Data)
	case syscall.S_IFIFO, syscall.S_IFSOCK:
	case syscall.S_IFBLK, syscall.S_IFCHR:
		req.Rdev = a.Rdev
	default:
		return syscall.EXDEV
	}
	var replaced proto.RemovedReply
	if errno := sh.servers[to].Do(ctx, &client.Call{Op: proto.OpAdopt, UID: uid, GID: gid, Req: req, Reply: &replaced}); errno != 0 {
		return errno
	}
	// The old name goes, its objects stay: they are the new name's.
	if errno := sh.servers[from].Do(ctx, &client.Call{Op: proto.OpUnlink, UID: uid, GID: gid,
		Req: &proto.EntryReq{Dir: r.Dir, Name: r.Name}, Reply: &proto.RemovedReply{}}); errno != 0 {
		return errno
	}
	if rep, ok := call.Reply.(*proto.RemovedReply); ok {
		*rep = replaced // its layout, and where its objects are
	}
	return 0
}

// opendir opens a directory on every shard holding it (shard 0 must).
func (sh *shards) opendir(ctx context.Context, call *client.Call, path string) syscall.Errno {
	d := &shardDir{handles: make([]uint64, sh.n()), gens: make([]uint64, sh.n())}
	errs := make([]syscall.Errno, sh.n())
	var wg sync.WaitGroup
	for s := range sh.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rep proto.HandleReply
			c := &client.Call{Op: proto.OpOpendir, UID: call.UID, GID: call.GID, Req: &proto.PathReq{Path: path}, Reply: &rep}
			errs[s] = sh.servers[s].Do(ctx, c)
			d.handles[s], d.gens[s] = rep.Handle, c.UsedGen
		}()
	}
	wg.Wait()
	for s, errno := range errs {
		if errno != 0 && (s == 0 || errno != syscall.ENOENT) {
			sh.release(ctx, d)
			return errno
		}
		if errno != 0 {
			d.handles[s] = 0
		}
	}
	sh.mu.Lock()
	sh.nextDir++
	id := dirHandle | sh.nextDir
	sh.dirs[id] = d
	sh.mu.Unlock()
	if rep, ok := call.Reply.(*proto.HandleReply); ok {
		rep.Handle = id
	}
	call.UsedGen = localGeneration // the shards' handles' generations are checked here
	return 0
}

func (sh *shards) release(ctx context.Context, d *shardDir) {
	for s, h := range d.handles {
		if h != 0 {
			sh.servers[s].Do(ctx, &client.Call{Op: proto.OpRelease, Gen: d.gens[s], NoReconnect: true, Req: &proto.HandleReq{Handle: h}})
		}
	}
}

func (sh *shards) closedir(ctx context.Context, id uint64) syscall.Errno {
	sh.mu.Lock()
	d := sh.dirs[id]
	delete(sh.dirs, id)
	sh.mu.Unlock()
	if d == nil {
		return syscall.EBADF
	}
	sh.release(ctx, d)
	return 0
}

// readdir lists the next entries from offset (the count of entries listed before; an offset
// other than where the listing is starts it again and skips).
func (sh *shards) readdir(ctx context.Context, call *client.Call, r *proto.ReaddirReq) syscall.Errno {
	sh.mu.Lock()
	d := sh.dirs[r.Handle]
	sh.mu.Unlock()
	if d == nil {
		return syscall.EBADF
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if r.Offset != d.pos {
		d.shard, d.off, d.pos = 0, 0, 0
	}
	out, _ := call.Reply.(*proto.ReaddirReply)
	if out == nil {
		out = &proto.ReaddirReply{}
	}
	*out = proto.ReaddirReply{}
	for d.shard < sh.n() {
		s := d.shard
		if d.handles[s] == 0 {
			d.shard, d.off = s+1, 0
			continue
		}
		var rep proto.ReaddirReply
		errno := sh.servers[s].Do(ctx, &client.Call{Op: proto.OpReaddir, Gen: d.gens[s], Reply: &rep,
			Req: &proto.ReaddirReq{Handle: d.handles[s], Offset: d.off}})
		if errno != 0 {
			if errno == syscall.ESTALE { // a shard's connection was made again: the caller reopens
				sh.closedir(ctx, r.Handle)
			}
			return errno
		}
		for _, e := range rep.Entries {
			if s > 0 && (e.Type == syscall.S_IFDIR || e.Name == "." || e.Name == "..") {
				continue // directories are listed once, from shard 0
			}
			d.pos++
			if d.pos <= r.Offset {
				continue // skipping to where the caller asked
			}
			if e.Type != syscall.S_IFDIR {
				e.Ino = ino(e.Ino, s)
			}
			e.Off = d.pos
			out.Entries = append(out.Entries, e)
		}
		if n := len(rep.Entries); n > 0 {
			d.off = rep.Entries[n-1].Off
		}
		if rep.EOF || len(rep.Entries) == 0 {
			d.shard, d.off = s+1, 0
		}
		if len(out.Entries) > 0 {
			break
		}
	}
	out.EOF = d.shard >= sh.n()
	return 0
}
