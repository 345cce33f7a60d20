package mount

// The striped side of a mount. A striped instance's namespace lives on its metadata server
// (the backend's client, as for any mount), but the data of its regular files lives in
// stripe objects on every server of the instance (package warpfs/stripe): a file's layout comes
// with its open, and its reads and writes go straight to the servers holding the bytes, all
// of a request's pieces at once. The metadata server keeps the logical size, which a writer
// reports when it closes, flushes or syncs the file (stat is exact after close, as DataWarp
// promised; meanwhile this node sees its own writes).
//
// A cache instance's files are striped files too (server/cachens.go): their namespace is a
// PFS directory, and their open comes with a CacheRef naming the PFS file, which the requests
// for the file's objects carry (the opens and the removal), sent as the user who opened the
// file (the stripe servers open the PFS file with that user's credentials). Nothing else
// here knows a cache from a striped instance.

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/nodekey"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// openStripes connects the backend to the servers of a striped instance's data.
func (be *backend) openStripes(spec Spec, limits Limits, path string, logger *log.Logger) error {
	for i, st := range spec.Stripes {
		var t transport
		switch {
		case st.Remote != nil:
			r := st.Remote
			c, err := client.Dial(context.Background(), client.Options{
				Address: r.Address, Token: r.Token, Client: r.Client, Capability: r.Capability, CapabilityKey: r.CapabilityKey,
				TLS: r.TLS, Fragment: r.FragmentID, Instance: r.InstanceID, Stripes: true, Namespace: stripesNamespace(r),
				ReadOnly: spec.ReadOnly, MaxFileSize: spec.MaxFileSize, Limits: r.Limits, Log: logger,
			})
			if err != nil {
				return fmt.Errorf("cannot reach stripe server %d of %d (fragment %d on %s): %w", i+1, len(spec.Stripes), r.FragmentID, r.Address, err)
			}
			t = c
		case st.Dir != "":
			local, err := server.OpenLocal(server.LocalOptions{
				Dir: st.Dir, Tracker: st.Tracker, ReadOnly: spec.ReadOnly, MaxFileSize: spec.MaxFileSize,
				Name: path + " (stripes)", Log: slog.New(slog.NewTextHandler(logger.Writer(), nil)),
				Fragment: st.Fragment, Client: spec.Client, Stripes: true, Namespace: spec.NamespaceID, Cache: st.Cache,
			})
			if err != nil {
				return fmt.Errorf("cannot serve stripe directory %s: %w", st.Dir, err)
			}
			t = localTransport{local}
		default:
			return fmt.Errorf("stripe server %d of %d names neither a directory nor a remote node", i+1, len(spec.Stripes))
		}
		if st.Remote != nil && spec.Remote != nil && len(spec.MDS) <= 1 && st.Remote.FragmentID == spec.Remote.FragmentID &&
			st.Remote.Address == spec.Remote.Address {
			be.wholeOn = uint32(i) + 1 // the metadata server's own stripes: where files placed whole keep their data
		}
		be.stripes = append(be.stripes, t)
		be.stripeNodes = append(be.stripeNodes, st.Node)
	}
	be.maxFileSize = spec.MaxFileSize
	be.writeBehind = int64(max(limits.WriteBehind, 0))
	return nil
}

// stripesNamespace is the namespace a session of stripe objects counts its bytes to: the one
// its capability names (a controller of before names none), or without a capability the
// mount's own.
func stripesNamespace(r *Remote) int64 {
	if r.Capability == "" {
		return r.NamespaceID
	}
	c, err := nodekey.ParseCapability(r.Capability)
	if err != nil {
		return 0
	}
	return c.Namespace
}

// ServersXattr names, for a file or directory of a striped mount, the instance's servers in
// layout order (their node names, space-separated): with user.spillway.layout it says which
// node holds which stripes (`spillway stripes`). The client answers it; it is not stored.
const ServersXattr = "user.spillway.servers"

// close ends the backend's connections.
func (be *backend) close() {
	be.unlinking.Wait() // removals on their way: each bounded by the request timeout
	be.creating.Wait()  // creates and reservations too
	be.client.Close()
	for _, t := range be.stripes {
		t.Close()
	}
}

// stripedFile is what an open handle of a striped file knows.
type stripedFile struct {
	layout stripe.Layout

	mu      sync.Mutex
	objects []object // per server
	known   uint64   // the logical size as last heard from the metadata server
	extent  uint64   // one past the last byte written or allocated through this handle
	report  bool     // the size and mtime need reporting to the metadata server
	// durable is how far the size this handle reported and synced on the metadata server
	// reaches: an fdatasync of writes below it needs no size report (syncMetadata), while
	// the handle holds its size lease (ino not 0): another node's change of the file's
	// attributes (a truncate) ends the lease first.
	durable uint64
	dirty   bool // data written since the last fsync
	// sizeUntil is when the lease on known (the OPEN's, leases.go: leaseSize) ends; ino
	// is the file's inode number while it lasts.
	sizeUntil time.Time
	ino       uint64

	// cache names the PFS file of a cache instance's file (OpenReply.Cache), whose objects
	// are opened as its opener, uid:gid; nil for a striped instance's.
	cache    *proto.CacheRef
	uid, gid uint32
	// policy replaces cache.Policy in the opens of objects when policySet: the file's policy
	// as set through this node after the open (cacheops.go).
	policy    proto.CachePolicy
	policySet bool
}

// removal is what a striped file's objects are removed by: its layout, and a cache
// instance's file's CacheRef.
type removal struct {
	layout stripe.Layout
	cache  *proto.CacheRef
}

// object is a handle's open stripe object on one server.
type object struct {
	id, gen uint64
	open    bool
	dirty   bool // written through the handle (a cache file's close syncs it to the PFS)
	// writes counts the writes through the handle that reached the object, synced how many
	// of them an fsync of the object covered: an fsync asks only the servers written since
	// the last one (a 4 KiB write + fdatasync asks one data server, not every one the
	// handle ever wrote to).
	writes, synced uint64
	made           bool // this handle created it (or may have): its RELEASE tells the metadata server
	read           bool // read once by name (readByName)
	written        bool // written once by name (writeByName)
}

// objectCaller is the uid of requests for stripe objects: the agent's own. The metadata
// server checked the caller's rights when the file was opened; the objects sit in a
// directory only root can reach.
const objectCaller = 0

// parallel runs fn for every piece at once and returns the pieces' errors.
func parallel(pieces []stripe.Piece, fn func(p stripe.Piece) syscall.Errno) []syscall.Errno {
	errs := make([]syscall.Errno, len(pieces))
	if len(pieces) == 1 {
		errs[0] = fn(pieces[0])
		return errs
	}
	var wg sync.WaitGroup
	for i, p := range pieces {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(p)
		}()
	}
	wg.Wait()
	return errs
}

// serverPieces is one piece per server holding some of the file, for requests that reach
// every server (truncate, remove, fsync).
func serverPieces(l stripe.Layout) []stripe.Piece {
	var out []stripe.Piece
	for s := 0; s < int(l.Servers); s++ {
		if l.Slot(s) >= 0 {
			out = append(out, stripe.Piece{Server: s})
		}
	}
	return out
}

// objectFlags is how a handle opened with flags opens its objects.
func objectFlags(flags uint32) uint32 {
	keep := flags & (syscall.O_DIRECT | syscall.O_SYNC | syscall.O_DSYNC)
	if flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		return syscall.O_RDONLY | keep
	}
	return syscall.O_RDWR | keep
}

// objectHandle opens (creating it, for a writable handle) the file's object on server s.
// found is false when a read-only handle finds no object: the stripes there are holes.
func (h *fileHandle) objectHandle(ctx context.Context, s int, stale uint64) (id, gen uint64, found bool, errno syscall.Errno) {
	sf := h.striped
	sf.mu.Lock()
	defer sf.mu.Unlock()
	o := &sf.objects[s]
	if o.open && o.gen != stale {
		return o.id, o.gen, true, 0
	}
	t := h.node.be.stripes[s]
	name := stripe.ObjectName(sf.layout.ID)
	var rep proto.OpenReply
	var call *client.Call
	flags := objectFlags(h.flags)
	uid, gid := uint32(objectCaller), uint32(0)
	ref := sf.cache
	if ref != nil {
		uid, gid = sf.uid, sf.gid
		if sf.policySet {
			r := *ref
			r.Policy = sf.policy
			ref = &r
		}
	}
	if flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		call = &client.Call{Op: proto.OpOpen, UID: uid, GID: gid, Req: &proto.OpenReq{Path: name, Flags: flags, Cache: ref}, Reply: &rep}
	} else {
		call = &client.Call{Op: proto.OpCreate, UID: uid, GID: gid, Reply: &rep,
			Req: &proto.CreateReq{Name: name, Flags: flags, Mode: 0o600, Cache: ref}}
	}
	creating := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	if creating {
		o.made = true // before: a create whose reply is lost may have made it
	}
	errno = t.Do(ctx, call)
	if errno == syscall.ENOENT && !creating {
		return 0, 0, false, 0
	}
	if errno != 0 {
		return 0, 0, false, errno
	}
	*o = object{id: rep.Handle, gen: call.UsedGen, open: true, dirty: o.dirty, writes: o.writes, synced: o.synced, made: o.made, read: o.read, written: o.written}
	return o.id, o.gen, true, 0
}

// readByName reads a piece of the handle's object on server s without opening it
// (proto.ReadReq.Path: one request, no handle to release) the first time the handle reads
// there; handled is false when it did not (the object is open, read so once already, the
// handle asks for direct I/O, or the server is too old), and the caller opens the object.
// Most small files are read in one request per server this way, through a writable handle
// too (mdtest reads through one): a read creates no object.
func (h *fileHandle) readByName(ctx context.Context, s int, call *client.Call, p stripe.Piece) (found, handled bool, errno syscall.Errno) {
	sf := h.striped
	if h.flags&syscall.O_DIRECT != 0 || sf.cache != nil {
		// (direct I/O: its objects are opened O_DIRECT; a cache's objects are opened with
		// their PFS file's CacheRef, as their opener)
		return false, false, 0
	}
	sf.mu.Lock()
	o := &sf.objects[s]
	first := !o.open && !o.read
	o.read = true
	sf.mu.Unlock()
	if !first {
		return false, false, 0
	}
	call.Req = &proto.ReadReq{Path: stripe.ObjectName(sf.layout.ID), Offset: p.ObjOffset, Size: uint32(p.Length)}
	call.MinVersion = proto.ObjectsVersion
	errno = h.node.be.stripes[s].Do(ctx, call)
	switch errno {
	case syscall.EPROTONOSUPPORT:
		return false, false, 0
	case syscall.ENOENT:
		return false, true, 0 // no object: holes
	}
	return errno == 0, true, errno
}

// writeByName writes data at off of the handle's object on server s without opening it
// (proto.OpWriteName: created if missing, written and closed in one request, where a
// CREATE, the WRITE and a RELEASE were three) the first time the handle writes there;
// handled is false when it did not (the object is open or was written so already, the
// handle asks for synchronous or direct I/O, or the server is too old), and the caller
// writes through the object's handle. A small file is written in one request this way.
func (h *fileHandle) writeByName(ctx context.Context, s int, off uint64, data []byte) (n uint64, handled bool, errno syscall.Errno) {
	sf := h.striped
	if h.flags&(syscall.O_DIRECT|syscall.O_SYNC|syscall.O_DSYNC) != 0 || sf.cache != nil {
		return 0, false, 0 // (a cache's objects are opened with their CacheRef, as their opener)
	}
	sf.mu.Lock()
	o := &sf.objects[s]
	first := !o.open && !o.written
	if first {
		o.written, o.made = true, true // made before: a write whose reply is lost may have made it
	}
	sf.mu.Unlock()
	if !first {
		return 0, false, 0
	}
	var rep proto.CountReply
	call := &client.Call{Op: proto.OpWriteName, UID: objectCaller, Reply: &rep, MinVersion: proto.ObjectsVersion,
		Req: &proto.WriteNameReq{Name: stripe.ObjectName(sf.layout.ID), Offset: off, Data: data}}
	errno = h.node.be.stripes[s].Do(ctx, call)
	if errno == syscall.EPROTONOSUPPORT {
		return 0, false, 0
	}
	if errno == 0 && rep.N < uint64(len(data)) {
		errno = syscall.ENOSPC // a server writes short only when its share is full
	}
	if errno == 0 {
		h.markDirty(s)
	}
	return rep.N, true, errno
}

// madeObjects is the set of servers this handle made objects on (proto.HandleReq.Objects).
func (h *fileHandle) madeObjects() []byte {
	sf := h.striped
	sf.mu.Lock()
	defer sf.mu.Unlock()
	set := make([]byte, (len(sf.objects)+7)/8)
	for s, o := range sf.objects {
		if o.made {
			set[s/8] |= 1 << (s % 8)
		}
	}
	return set
}

// onObject runs a request on the file's object on server s, reopening it once if its
// server's connection was re-established since.
func (h *fileHandle) onObject(ctx context.Context, s int, call *client.Call, setID func(uint64)) (found bool, errno syscall.Errno) {
	var stale uint64
	for attempt := 0; ; attempt++ {
		id, gen, found, errno := h.objectHandle(ctx, s, stale)
		if errno != 0 || !found {
			return found, errno
		}
		setID(id)
		call.Gen = gen
		errno = h.node.be.stripes[s].Do(ctx, call)
		if errno != syscall.ESTALE || attempt > 0 {
			return true, errno
		}
		stale = gen
	}
}

// size is the file's logical size for a read of [off, end): what this handle knows, asked
// again of the metadata server when the read goes past it (another node may have written).
func (h *fileHandle) size(ctx context.Context, end uint64) uint64 {
	sf := h.striped
	sf.mu.Lock()
	size := max(sf.known, sf.extent)
	leased := time.Now().Before(sf.sizeUntil)
	sf.mu.Unlock()
	if end <= size || leased {
		return size // nobody else changed it since this node heard it (leases.go)
	}
	var rep proto.AttrReply
	if h.handleCall(ctx, proto.OpGetattr, func(id uint64) proto.Message { return &proto.NodeReq{Handle: id} }, &rep) == 0 {
		sf.mu.Lock()
		sf.known = rep.Attr.Size
		size = max(sf.known, sf.extent)
		sf.mu.Unlock()
	}
	return size
}

func (h *fileHandle) readStriped(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.node.settleAll()
	ctx, cancel := h.node.be.opCtx(ctx)
	defer cancel()
	start := uint64(off)
	size := h.size(ctx, start+uint64(len(dest)))
	if start >= size {
		return fuse.ReadResultData(nil), 0
	}
	n := min(uint64(len(dest)), size-start)
	errs := parallel(h.striped.layout.Pieces(start, n), func(p stripe.Piece) syscall.Errno {
		buf := dest[p.BufOffset : p.BufOffset+p.Length]
		call := &client.Call{Op: proto.OpRead, UID: objectCaller, Dest: buf}
		found, handled, errno := h.readByName(ctx, p.Server, call, p)
		if !handled {
			call.MinVersion = 0
			found, errno = h.onObject(ctx, p.Server, call, func(id uint64) {
				call.Req = &proto.ReadReq{Handle: id, Offset: p.ObjOffset, Size: uint32(p.Length)}
			})
		}
		got := call.N
		if !found || errno != 0 {
			got = 0
		}
		clear(buf[got:]) // a hole, or past the object's end: zeros, as in any sparse file
		return errno
	})
	for _, e := range errs {
		if e != 0 {
			return nil, e
		}
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *fileHandle) writeStriped(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	be := h.node.be
	// A writer is registered on the metadata server before its first object changes (its
	// stub's record of the servers holding objects turns unknown).
	h.writing.RLock()
	defer h.writing.RUnlock()
	if errno := h.materialize(ctx); errno != 0 {
		return 0, errno
	}
	start := uint64(off)
	length := uint64(len(data))
	if be.maxFileSize > 0 && start+length > be.maxFileSize {
		if start >= be.maxFileSize {
			return 0, syscall.EFBIG
		}
		length = be.maxFileSize - start
	}
	if wb := h.behind; wb != nil {
		return h.writeBehind(ctx, wb, data[:length], start)
	}
	ctx, cancel := be.opCtx(ctx)
	defer cancel()
	pieces := h.striped.layout.Pieces(start, length)
	errs := parallel(pieces, func(p stripe.Piece) syscall.Errno {
		if _, handled, errno := h.writeByName(ctx, p.Server, p.ObjOffset, data[p.BufOffset:p.BufOffset+p.Length]); handled {
			return errno
		}
		var rep proto.CountReply
		call := &client.Call{Op: proto.OpWrite, UID: objectCaller, Data: data[p.BufOffset : p.BufOffset+p.Length], Reply: &rep}
		_, errno := h.onObject(ctx, p.Server, call, func(id uint64) {
			call.Req = &proto.WriteReq{Handle: id, Offset: p.ObjOffset}
		})
		if errno == 0 {
			h.markDirty(p.Server)
		}
		return errno
	})
	// What was written is the run of pieces from the start that all succeeded.
	var n uint64
	for i, p := range pieces {
		if errs[i] != 0 {
			if n == 0 {
				return 0, errs[i]
			}
			break
		}
		n = p.BufOffset + p.Length
	}
	h.grew(start + n)
	return uint32(n), 0 // short when cut at the maximum file size: the next write gets EFBIG
}

// sendObjectPiece writes one piece of a striped file's write-behind to its server's object,
// syncing the object after when sync.on and the server can (synced says it did).
func (h *fileHandle) sendObjectPiece(qp queuedPiece, sync syncAfter) (errno syscall.Errno, synced bool) {
	ctx, cancel := h.node.be.opCtx(context.Background())
	defer cancel()
	if sync.on {
		if errno, handled := h.writeSync(ctx, qp, sync.flags); handled {
			return errno, errno == 0
		}
		// A server too old for WRITE_SYNC: written as before, the fsync sends an FSYNC.
	}
	if _, handled, errno := h.writeByName(ctx, qp.piece.Server, qp.piece.ObjOffset, qp.data); handled {
		return errno, false
	}
	var rep proto.CountReply
	call := &client.Call{Op: proto.OpWrite, UID: objectCaller, Data: qp.data, Reply: &rep}
	_, errno = h.onObject(ctx, qp.piece.Server, call, func(id uint64) {
		call.Req = &proto.WriteReq{Handle: id, Offset: qp.piece.ObjOffset}
	})
	if errno == 0 && rep.N < uint64(len(qp.data)) {
		errno = syscall.ENOSPC // a server writes short only when its share is full
	}
	if errno == 0 {
		h.markDirty(qp.piece.Server)
	}
	return errno, false
}

// writeSync writes a piece of the write-behind and syncs its object (fsync, or fdatasync
// with flags 1) in one request, proto.OpWriteSync: by name the first time the handle writes
// there (as writeByName), else through the object's handle. handled is false when the
// server is too old for it (nothing was sent).
func (h *fileHandle) writeSync(ctx context.Context, qp queuedPiece, flags uint32) (errno syscall.Errno, handled bool) {
	sf := h.striped
	s := qp.piece.Server
	var rep proto.CountReply
	call := &client.Call{Op: proto.OpWriteSync, UID: objectCaller, Data: qp.data, Reply: &rep, MinVersion: proto.WriteSyncVersion}
	sf.mu.Lock()
	o := &sf.objects[s]
	byName := !o.open && !o.written && h.flags&(syscall.O_DIRECT|syscall.O_SYNC|syscall.O_DSYNC) == 0
	made := o.made
	if byName {
		o.written, o.made = true, true // made before: a write whose reply is lost may have made it
	}
	sf.mu.Unlock()
	if byName {
		call.Req = &proto.WriteSyncReq{Name: stripe.ObjectName(sf.layout.ID), Offset: qp.piece.ObjOffset, Flags: flags}
		errno = h.node.be.stripes[s].Do(ctx, call)
	} else {
		_, errno = h.onObject(ctx, s, call, func(id uint64) {
			call.Req = &proto.WriteSyncReq{Handle: id, Offset: qp.piece.ObjOffset, Flags: flags}
		})
	}
	if errno == syscall.EPROTONOSUPPORT {
		if byName {
			sf.mu.Lock()
			o.written, o.made = false, made
			sf.mu.Unlock()
		}
		return 0, false
	}
	if errno == 0 && rep.N < uint64(len(qp.data)) {
		errno = syscall.ENOSPC // a server writes short only when its share is full
	}
	if errno == 0 {
		// Written and synced: dirty for a cache file's close, no FSYNC owed.
		sf.mu.Lock()
		sf.objects[s].dirty = true
		sf.dirty = true
		sf.mu.Unlock()
	}
	return errno, true
}

func (h *fileHandle) markDirty(s int) {
	sf := h.striped
	sf.mu.Lock()
	sf.objects[s].dirty = true
	sf.objects[s].writes++
	sf.dirty = true
	sf.mu.Unlock()
}

// grew notes that the file now reaches end through this handle.
func (h *fileHandle) grew(end uint64) {
	sf := h.striped
	sf.mu.Lock()
	sf.extent = max(sf.extent, end)
	sf.report = true
	sf.mu.Unlock()
}

// reportSize tells the metadata server how far this handle's writes reached, and that the
// file changed.
func (h *fileHandle) reportSize(ctx context.Context) syscall.Errno {
	_, errno := h.sendReport(ctx, false)
	return errno
}

// sendReport sends the size report if one is due. With sync the metadata server also syncs
// the file's stub in the same request (proto.SetSync), and synced says it did; a server too
// old for that gets nothing (synced false, no error), and the caller reports and syncs in two
// requests.
func (h *fileHandle) sendReport(ctx context.Context, sync bool) (synced bool, errno syscall.Errno) {
	sf := h.striped
	// The handle a PLACE opened releases itself with its report at close (not an fsync's),
	// saying where it made objects: no write goes on meanwhile (writing), and those queued
	// before have landed.
	closing := false
	if !sync {
		h.writing.Lock()
		if closing = h.closeByReport; closing {
			defer h.writing.Unlock()
			h.closeByReport = false
			h.settle() // a piece that failed was its write's or the close's to report
		} else {
			h.writing.Unlock()
		}
	}
	sf.mu.Lock()
	report, extent := sf.report, sf.extent
	sf.report = false
	sf.mu.Unlock()
	if !report {
		return false, 0 // a handle not released here is released by Release
	}
	valid := uint32(proto.SetSizeAtLeast | proto.SetMtimeNow)
	var minVersion uint16
	if sync {
		valid |= proto.SetSync
		minVersion = proto.SyncVersion
	}
	ctx, cancel := h.node.be.opCtx(ctx)
	defer cancel()
	uid, gid := caller(ctx)
	var rep proto.AttrReply
	call := &client.Call{Op: proto.OpSetattr, UID: uid, GID: gid, Reply: &rep, MinVersion: minVersion}
	ls := h.node.be.leases
	tok := ls.startChange(h.node.StableAttr().Ino)
	if closing {
		objects := h.madeObjects()
		call.MinVersion = proto.PlacedWriterVersion
		errno = h.do(ctx, call, func(id uint64) {
			call.Req = &proto.SetattrReq{Handle: id, Valid: valid, Size: extent, Release: true, Objects: objects}
		})
		if errno == 0 {
			// Released there: the next request that needs the metadata server's handle
			// opens the file again (materialize), as after a lazy open.
			h.mu.Lock()
			h.id, h.lazy = 0, true
			h.mu.Unlock()
		} else if errno == syscall.EPROTONOSUPPORT { // a storage node of the version before, restarted
			call = &client.Call{Op: proto.OpSetattr, UID: uid, GID: gid, Reply: &rep}
			closing = false
		}
	}
	if !closing {
		errno = h.do(ctx, call, func(id uint64) {
			call.Req = &proto.SetattrReq{Handle: id, Valid: valid, Size: extent}
		})
	}
	// The kernel dropped the file's attributes at its writes and asks for them at the next
	// stat: this reply's, leased, answer it (leases.go, attrs).
	var lease time.Duration
	if errno == 0 && ls != nil {
		lease = call.Lease
	}
	ls.endChange(tok, &rep.Attr, lease)
	sf.mu.Lock()
	if errno != 0 {
		sf.report = true
	} else {
		sf.known = rep.Attr.Size
		if sync {
			// The stub synced holds this size: writes below it need no report to be found.
			sf.durable = max(sf.durable, rep.Attr.Size)
		}
	}
	sf.mu.Unlock()
	if errno == 0 {
		// This node's other handles hear of it too: the server tells the other nodes, not
		// the one that changed it (their size may be leased).
		h.node.sizeReported(h, rep.Attr.Size)
	}
	if errno == syscall.EPROTONOSUPPORT {
		return false, 0
	}
	return errno == 0, errno
}

// releaseAtLastClose makes a handle its PLACE opened an ordinary one (closeByReport), before
// a change of its objects outside a write (fallocate, truncate): such a change does not hold
// writing, so the RELEASE at the last close, when nothing can change them any more, says
// where they are.
func (h *fileHandle) releaseAtLastClose() {
	h.writing.Lock()
	h.closeByReport = false
	h.writing.Unlock()
}

// sizeReported tells this node's other handles of the file that it is now at least size
// bytes long (a handle's size report).
func (n *node) sizeReported(from *fileHandle, size uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for h := range n.handles {
		if sf := h.striped; sf != nil && h != from {
			sf.mu.Lock()
			sf.known = max(sf.known, size)
			sf.mu.Unlock()
		}
	}
}

// syncMetadata is the metadata server's part of fsync(2): the size report, and the stub
// synced (the size is in its extended attribute). An fdatasync of writes inside the size
// this handle already made durable needs neither (the mtime is no data: it is reported at
// close or at the next fsync) — while nobody else changed the file's size since: the
// handle's size lease (leases.go) holds. Without leases it reports every time.
func (h *fileHandle) syncMetadata(ctx context.Context, flags uint32) syscall.Errno {
	sf := h.striped
	sf.mu.Lock()
	extent := sf.extent
	sf.mu.Unlock()
	if !h.metadataSyncNeeded(flags) {
		return 0
	}
	synced, errno := h.sendReport(ctx, true)
	if errno != 0 || synced {
		return errno
	}
	if errno := h.reportSize(ctx); errno != 0 {
		return errno
	}
	errno = h.handleCall(ctx, proto.OpFsync, func(id uint64) proto.Message { return &proto.FsyncReq{Handle: id, Flags: flags} }, nil)
	if errno == 0 {
		sf.mu.Lock()
		sf.durable = max(sf.durable, extent)
		sf.mu.Unlock()
	}
	return errno
}

// metadataSyncNeeded says whether an fsync with flags (1: fdatasync) needs the metadata
// server (syncMetadata): not for an fdatasync of writes inside the size already durable there
// while the size lease holds.
func (h *fileHandle) metadataSyncNeeded(flags uint32) bool {
	sf := h.striped
	sf.mu.Lock()
	defer sf.mu.Unlock()
	return flags&1 == 0 || sf.extent > sf.durable || sf.ino == 0
}

// fsyncStriped makes every server holding data written through this handle sync it, and
// the metadata server the size: all at once, since they are different servers (the size
// report and the stub's sync, on the same one, in that order). A server this handle's
// writes are still queued for syncs with the request that carries the last of them
// (askSync, proto.OpWriteSync): a write and the fdatasync after it cost one round trip, to
// the server holding the bytes — when the metadata server has nothing to sync (a rewrite
// inside the durable size). Only a server whose writes were sent before (or that is too old
// for WRITE_SYNC) gets an FSYNC of its own, once they are answered (settle). The size goes to
// the metadata server after the data reached its servers, never beside it: another node that
// sees the new size reads the bytes, not zeros in their place. So where the size must be
// synced too (an append), queued writes go unsynced and the two syncs run side by side once
// they are answered, where a WRITE_SYNC would put one disk sync after the other (an append's
// 4 KiB write + fdatasync on XFS over 4 servers, BenchmarkStripedRemoteWriteFdatasync with
// TMPDIR on XFS: p50 950-994 µs -> 810-857 µs).
func (h *fileHandle) fsyncStriped(ctx context.Context, flags uint32) syscall.Errno {
	ctx, cancel := h.node.be.opCtx(ctx)
	defer cancel()
	if !h.metadataSyncNeeded(flags) {
		h.askSync(flags)
	}
	if errno := h.settle(); errno != 0 {
		return errno
	}
	meta := make(chan syscall.Errno, 1)
	go func() { meta <- h.syncMetadata(ctx, flags) }()
	errno := h.syncObjects(ctx, flags)
	if e := <-meta; errno == 0 {
		errno = e
	}
	return errno
}

// syncObjects sends an FSYNC to every server written through h since its last sync.
func (h *fileHandle) syncObjects(ctx context.Context, flags uint32) syscall.Errno {
	sf := h.striped
	var pieces []stripe.Piece
	writes := make([]uint64, len(sf.objects)) // what each server's fsync covers
	sf.mu.Lock()
	for s, o := range sf.objects {
		if o.writes != o.synced {
			pieces = append(pieces, stripe.Piece{Server: s})
			writes[s] = o.writes
		}
	}
	sf.mu.Unlock()
	for _, e := range parallel(pieces, func(p stripe.Piece) syscall.Errno {
		call := &client.Call{Op: proto.OpFsync, UID: objectCaller}
		_, errno := h.onObject(ctx, p.Server, call, func(id uint64) { call.Req = &proto.FsyncReq{Handle: id, Flags: flags} })
		if errno == 0 {
			sf.mu.Lock()
			if o := &sf.objects[p.Server]; writes[p.Server] > o.synced {
				o.synced = writes[p.Server]
			}
			sf.mu.Unlock()
		}
		return errno
	}) {
		if e != 0 {
			return e
		}
	}
	return 0
}

// releaseObjects closes the handle's objects.
func (h *fileHandle) releaseObjects(ctx context.Context) {
	sf := h.striped
	sf.mu.Lock()
	objects := append([]object(nil), sf.objects...)
	sf.mu.Unlock()
	var pieces []stripe.Piece
	for s, o := range objects {
		if o.open {
			pieces = append(pieces, stripe.Piece{Server: s})
		}
	}
	parallel(pieces, func(p stripe.Piece) syscall.Errno {
		o := objects[p.Server]
		return h.node.be.stripes[p.Server].Do(ctx, &client.Call{Op: proto.OpRelease, Gen: o.gen, NoReconnect: true, OneWay: true, Req: &proto.HandleReq{Handle: o.id}})
	})
}

// allocateStriped forwards a fallocate to the part of every object in the range.
func (h *fileHandle) allocateStriped(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	if mode&(unix.FALLOC_FL_COLLAPSE_RANGE|unix.FALLOC_FL_INSERT_RANGE) != 0 {
		return syscall.EOPNOTSUPP // they would move data across servers
	}
	h.releaseAtLastClose()
	if errno := h.materialize(ctx); errno != 0 {
		return errno
	}
	h.node.settleAll()
	ctx, cancel := h.node.be.opCtx(ctx)
	defer cancel()
	l := h.striped.layout
	var pieces []stripe.Piece
	for _, p := range serverPieces(l) {
		if o, n := l.ObjectRange(off, size, p.Server); n > 0 {
			pieces = append(pieces, stripe.Piece{Server: p.Server, ObjOffset: o, Length: n})
		}
	}
	for _, e := range parallel(pieces, func(p stripe.Piece) syscall.Errno {
		call := &client.Call{Op: proto.OpFallocate, UID: objectCaller}
		_, errno := h.onObject(ctx, p.Server, call, func(id uint64) {
			call.Req = &proto.FallocateReq{Handle: id, Offset: p.ObjOffset, Length: p.Length, Mode: mode}
		})
		if errno == 0 {
			h.markDirty(p.Server)
		}
		return errno
	}) {
		if e != 0 {
			if mode&unix.FALLOC_FL_KEEP_SIZE == 0 {
				// The servers that did allocate grew their objects: back to the file's size.
				h.truncateObjects(ctx, h.size(ctx, 0))
			}
			return e
		}
	}
	// The file changed: its metadata says so now, as a local file system's fallocate does to
	// its ctime (and the size, unless FALLOC_FL_KEEP_SIZE), not at the next flush. The file's
	// mtime moves with it: the protocol sets ctime by setting a time.
	end := uint64(0)
	if mode&unix.FALLOC_FL_KEEP_SIZE == 0 {
		end = off + size
	}
	h.grew(end)
	return h.reportSize(ctx)
}

// truncateObjects sets every object of the file to what a file of size bytes holds. Growing
// creates the objects (through a writable handle), so that each server charges its share.
func (h *fileHandle) truncateObjects(ctx context.Context, size uint64) syscall.Errno {
	ctx, cancel := h.node.be.opCtx(ctx)
	defer cancel()
	l := h.striped.layout
	for _, e := range parallel(serverPieces(l), func(p stripe.Piece) syscall.Errno {
		objSize := l.ObjectSize(size, p.Server)
		if objSize == 0 && h.striped.cache == nil {
			// Emptying needs no object: by name, and a missing one is as good as empty.
			errno := h.node.be.stripes[p.Server].Do(ctx, &client.Call{Op: proto.OpSetattr, UID: objectCaller,
				Req: &proto.SetattrReq{Path: stripe.ObjectName(l.ID), Valid: proto.SetSize}, Reply: &proto.AttrReply{}})
			if errno == syscall.ENOENT {
				return 0
			}
			return errno
		}
		call := &client.Call{Op: proto.OpSetattr, UID: objectCaller, Reply: &proto.AttrReply{}}
		if h.striped.cache != nil {
			objSize = size // a cache object is cut by the file's size (server.CacheData.Truncate)
		}
		_, errno := h.onObject(ctx, p.Server, call, func(id uint64) {
			call.Req = &proto.SetattrReq{Handle: id, Valid: proto.SetSize, Size: objSize}
		})
		return errno
	}) {
		if e != 0 {
			return e
		}
	}
	return 0
}

// removeObjects removes a file's objects: its last name is gone and no handle of this node
// has it open. on is the servers that may hold them, a bit per server (the metadata server's
// record, proto.RemovedReply.Objects); nil: unknown, every server of the layout.
func (be *backend) removeObjects(ctx context.Context, r removal, on []byte) {
	ctx, cancel := be.opCtx(ctx)
	defer cancel()
	name := stripe.ObjectName(r.layout.ID)
	pieces := serverPieces(r.layout)
	if on != nil {
		pieces = slices.DeleteFunc(pieces, func(p stripe.Piece) bool {
			return p.Server/8 >= len(on) || on[p.Server/8]&(1<<(p.Server%8)) == 0
		})
	}
	parallel(pieces, func(p stripe.Piece) syscall.Errno {
		return be.stripes[p.Server].Do(ctx, &client.Call{Op: proto.OpUnlink, UID: objectCaller, Req: &proto.EntryReq{Name: name, Cache: r.cache}})
	})
}

// statfsStriped is the instance's space as DataWarp shows it: the size of all its servers,
// and as free what striping can still use: the servers times the least free among them.
func (be *backend) statfsStriped(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	reps := make([]proto.StatfsReply, len(be.stripes))
	all := make([]stripe.Piece, len(be.stripes))
	for i := range all {
		all[i].Server = i
	}
	uid, gid := caller(ctx) // a cache instance's servers answer the PFS's, as the caller
	ctx, cancel := be.opCtx(ctx)
	defer cancel()
	for _, e := range parallel(all, func(p stripe.Piece) syscall.Errno {
		return be.stripes[p.Server].Do(ctx, &client.Call{Op: proto.OpStatfs, UID: uid, GID: gid, Req: &proto.Empty{}, Reply: &reps[p.Server]})
	}) {
		if e != 0 {
			return e
		}
	}
	var blocks uint64
	minFree, minAvail := reps[0].Bfree, reps[0].Bavail
	for _, r := range reps {
		blocks += r.Blocks
		minFree, minAvail = min(minFree, r.Bfree), min(minAvail, r.Bavail)
	}
	n := uint64(len(reps))
	out.Blocks, out.Bfree, out.Bavail = blocks, min(blocks, n*minFree), min(blocks, n*minAvail)
	out.Bsize, out.Frsize = reps[0].Bsize, reps[0].Frsize
	return 0
}
