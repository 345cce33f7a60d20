package mount

// Creates behind: a mount that knows every name of a directory (it made the directory, and
// nobody else has looked in it since: its listing, leases.go) answers the create of a new
// file there at once, as CephFS's asynchronous create does under its directory capabilities,
// and sends the request aside. mdtest's create phase was a round trip per file, the ranks
// asleep in between; now the creates of a directory are many requests in flight.
//
// The kernel needs the new file's inode number in the answer, and every node must see the
// same one: the storage node makes empty files ahead, without a name, in the directory
// (RESERVE, server/stubs.go), and the create answered here names one of them (PLACE). Its
// attributes are those the storage node gave the files it made ahead (mode, owner, group),
// its times now; the directory's leased attributes have their times moved to now.
//
// Why nobody sees the file missing:
//   - another node: the storage node recalls the listing before it runs anyone else's lookup,
//     listing or change of a name of the directory (server/leases.go, recall), and this
//     mount answers the recall only once its creates there have landed (settleRecalled);
//   - this node: the name is in the listing at once, the kernel holds the entry, and every
//     other request of this mount that names the directory's entries waits for its creates
//     first (settleUnlinks), as does every request about the new file itself (placed), and
//     a rename of a directory above it (settleTree).
//
// Only what cannot fail on the storage node where it did not fail here goes behind: a new
// regular file in a directory whose listing says the name is free, made ahead for the same
// caller and mode (the RESERVE admitted it against the instance's limits, MFC and write
// window, already), opened without O_APPEND, O_DIRECT, O_SYNC or O_DSYNC. Its first write
// past what its PLACE may carry (placement.held), fsync, setattr or new open waits for the
// PLACE; close does when it sends the held writes (it reports what they met), else not. The
// PLACE opens nothing on the metadata server: the handle is opened there by name when it
// needs to be (materialize, as a lazy open's), so a file closed unwritten costs no RELEASE;
// a file written at once is opened by its PLACE, held back for that (placement). A PLACE that fails anyway (a disk error) is logged, the name
// dropped from the kernel and the listing, and the open handle's next operation returns the
// error. A PLACE lost with its connection is made again as a plain CREATE (which finds the
// file if the PLACE had landed); should that give another inode number, the kernel is told
// to look the name up again. The mount's unmount waits for the creates on their way.

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// placement is a create behind on its way: done is closed when the storage node answered,
// errno then its answer (0: the file has its name there).
//
// Its PLACE waits, at most Limits.CreateWriteWait (2 ms: an application that creates a file
// writes it at once), for the first of: its creator's first write (then the PLACE opens the
// file for the creator's handle, PlaceReq.Writer, so its writes need no OPEN on the
// metadata server, and its size report at close releases it, so no RELEASE either: an
// mdtest-hard file is three requests, not five), the file's close, any other request about
// the file, and a request of this mount's or another node's that must find the directory's
// creates landed (settleUnlinks, through pendingUnlinks.hurry). Each of those calls hurry.
//
// The creator's writes from offset 0 are held for the PLACE (hold), up to Limits.CreateWholeMax:
// closed with them (closeHeld), the file is placed whole — the PLACE carries its data, kept on
// the metadata server's own stripe server, and the file is closed there: a small file created,
// written and closed at once (mdtest-hard's, a job's log or marker files) is one request, not
// three (the PLACE opening it, the data, the size report releasing it). Sent for any other
// reason, the PLACE opens the file for the creator and the held bytes follow as its first
// write, before anything else may use the file.
type placement struct {
	done  chan struct{}
	errno syscall.Errno

	creator *fileHandle
	mu      sync.Mutex
	go_     chan struct{} // closed (once: sent) to send the PLACE now
	sent    bool          // go_ is closed
	writer  bool          // the PLACE opens the file for creator (its first write came first)
	held    []byte        // the creator's writes from offset 0, not sent yet
	whole   bool          // the creator closed the file with held: the PLACE carries them
}

// hurry sends the PLACE now, opening the file for its creator's handle if writer, unless
// it is sent already.
func (p *placement) hurry(writer bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.sent {
		p.writer = p.writer || writer
		p.sent = true
		close(p.go_)
	}
}

// placed waits until n, if it was created behind, has landed on the storage node, and
// returns the errno of a create that did not. Every request about n waits for it.
func (n *node) placed() syscall.Errno {
	p := n.placing.Load()
	if p == nil {
		return 0
	}
	p.hurry(false)
	<-p.done // bounded by the request timeout
	return p.errno
}

// placedAsWriter is placed for a write through h: if h is the handle the create behind
// answered with and its PLACE has not left yet, the PLACE opens the file for h.
func (n *node) placedAsWriter(h *fileHandle) syscall.Errno {
	if p := n.placing.Load(); p != nil && p.creator == h {
		p.hurry(true)
	}
	return n.placed()
}

// hold keeps a write through h for the PLACE of the file h created behind, and says whether
// it did: only while the PLACE has not left, for writes that continue the held bytes from
// offset 0 within Limits.CreateWholeMax (and the file's maximum size) on a handle that
// writes behind (an error of the held bytes' write, should they go the usual way, is then
// its close's or fsync's to report, as any write behind's).
func (n *node) hold(h *fileHandle, data []byte, off int64) bool {
	p := n.placing.Load()
	be := n.be
	if p == nil || p.creator != h || be.wholeOn == 0 || be.noWholePlaces.Load() || !be.writesBehind(h.flags, true) {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	end := len(p.held) + len(data)
	if p.sent || off != int64(len(p.held)) || end > be.wholeMax || be.maxFileSize > 0 && uint64(end) > be.maxFileSize {
		return false
	}
	p.held = append(p.held, data...) // a copy: go-fuse reuses data's buffer
	return true
}

// closeHeld is the close of h, the creator of n, while its writes are held: the PLACE leaves
// with them, whole, and the close waits for it, so that it reports what the data met. held
// false: no writes held, nothing done.
func (n *node) closeHeld(h *fileHandle) (errno syscall.Errno, held bool) {
	p := n.placing.Load()
	if p == nil || p.creator != h {
		return 0, false
	}
	p.mu.Lock()
	held = len(p.held) > 0
	if held && !p.sent {
		p.whole = true
	}
	p.mu.Unlock()
	if !held {
		return 0, false
	}
	p.hurry(false)
	<-p.done // bounded by the request timeout
	return p.errno, true
}

// heldExtent is how far the creator's held writes reach (0: none held).
func (n *node) heldExtent() uint64 {
	p := n.placing.Load()
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return uint64(len(p.held))
}

// placedYet says whether n's create behind, if any, has been answered, and how; its PLACE
// leaves now if it had not.
func (n *node) placedYet() (bool, syscall.Errno) {
	p := n.placing.Load()
	if p == nil {
		return true, 0
	}
	p.hurry(false)
	select {
	case <-p.done:
		return true, p.errno
	default:
		return false, 0
	}
}

// stubKey says which files made ahead a create may use: made in directory dir (its inode
// number) for uid:gid with mode.
type stubKey struct {
	dir            uint64
	uid, gid, mode uint32
}

// stubBatch are files made ahead for one key, on one connection (gen).
type stubBatch struct {
	gen  uint64
	attr proto.Attr // their mode, owner and group
	inos []uint64
}

// stubPool are the files the storage node made ahead for this mount, by key. A key's batch
// grows as its directory keeps taking them (8, 16, ... up to the creates behind allowed), so
// that a directory with one new file costs few (firstReserve). The pool holds at most proto.MaxStubs, the
// server's bound per connection, and files for at most maxStubKeys keys: past either the
// oldest key's go (past proto.MaxStubs the server drops its oldest too; a PLACE of one it
// dropped gets ESTALE and becomes a plain CREATE).
type stubPool struct {
	mu        sync.Mutex
	batches   map[stubKey]*stubBatch
	order     []stubKey // keys, oldest first
	held      int       // files in batches
	next      map[stubKey]int
	reserving map[stubKey]bool
	// refused are keys whose RESERVE the server refused (MFC, a full instance, the write
	// window), not asked again until then.
	refused map[stubKey]time.Time
	off     bool // the server takes no RESERVE: no create goes behind
}

// take takes a file made ahead for key, and says whether the key runs low (ask for more).
func (p *stubPool) take(key stubKey) (ino, gen uint64, attr proto.Attr, ok, low bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.batches[key]
	if p.off || b == nil || len(b.inos) == 0 {
		return 0, 0, proto.Attr{}, false, !p.off && !p.reserving[key] && time.Now().After(p.refused[key])
	}
	ino, b.inos = b.inos[0], b.inos[1:]
	p.held--
	return ino, b.gen, b.attr, true, len(b.inos) < p.next[key] && !p.reserving[key]
}

// giveBack returns a file made ahead that take gave and the caller did not use.
func (p *stubPool) giveBack(key stubKey, ino, gen uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b := p.batches[key]; b != nil && b.gen == gen {
		b.inos = append([]uint64{ino}, b.inos...)
		p.held++
	}
}

// notLazyFlags are the open flags whose creates do not go behind: their handle could not be
// opened lazily (openLazily's lazyOpenFlags, less those a new file makes no-ops).
const notLazyFlags = lazyOpenFlags &^ (syscall.O_CREAT | syscall.O_TRUNC)

// maxStubKeys bounds the keys (directories, callers, modes) the pool keeps files made ahead
// for: past it the oldest key's go, as past proto.MaxStubs files.
const maxStubKeys = 64

// reserveRetry is how long a key whose RESERVE was refused waits before asking again.
const reserveRetry = time.Second

// firstReserve is how many files a directory's first RESERVE asks for (at its second
// create); the next ask twice as many, up to the creates behind allowed. A key asks again
// once fewer than a batch are left.
const firstReserve = 8

// addLocked adds files made ahead for key on connection generation gen (a RESERVE's answer),
// replacing those of an earlier connection, and drops the oldest keys' past the pool's
// bounds.
func (p *stubPool) addLocked(key stubKey, gen uint64, attr proto.Attr, inos []uint64) {
	if p.batches == nil {
		p.batches, p.next = map[stubKey]*stubBatch{}, map[stubKey]int{}
	}
	b := p.batches[key]
	if b == nil || b.gen != gen {
		if b != nil {
			p.held -= len(b.inos)
		} else {
			p.order = append(p.order, key)
		}
		b = &stubBatch{gen: gen}
		p.batches[key] = b
	}
	b.attr = attr
	b.inos = append(b.inos, inos...)
	p.held += len(inos)
	for (p.held > proto.MaxStubs || len(p.order) > maxStubKeys) && len(p.order) > 1 {
		old := p.order[0]
		p.order = p.order[1:]
		if ob := p.batches[old]; ob != nil {
			p.held -= len(ob.inos)
		}
		delete(p.batches, old)
		delete(p.next, old)
	}
}

// reserveAhead asks the storage node, aside, for files made ahead for key in directory n.
func (n *node) reserveAhead(key stubKey) {
	be := n.be
	p := &be.stubs
	p.mu.Lock()
	if p.off || p.reserving[key] {
		p.mu.Unlock()
		return
	}
	if p.reserving == nil {
		p.reserving, p.next, p.batches = map[stubKey]bool{}, map[stubKey]int{}, map[stubKey]*stubBatch{}
	}
	count := p.next[key]
	if count == 0 {
		count = firstReserve
	}
	p.next[key] = min(2*count, cap(be.createSlots), proto.MaxReserve)
	p.reserving[key] = true
	p.mu.Unlock()

	req := &proto.ReserveReq{Dir: n.path(), Mode: key.mode, Count: uint32(count)}
	route := n.in()
	be.creating.Add(1)
	go func() {
		defer be.creating.Done()
		var rep proto.ReserveReply
		call := &client.Call{Op: proto.OpReserve, UID: key.uid, GID: key.gid, Req: req, Reply: &rep, Route: route, MinVersion: proto.StubVersion}
		ctx, cancel := be.opCtx(context.Background())
		errno := be.client.Do(ctx, call)
		cancel()
		p.mu.Lock()
		defer p.mu.Unlock()
		delete(p.reserving, key)
		switch {
		case errno == syscall.EPROTONOSUPPORT || errno == syscall.EOPNOTSUPP:
			p.off = true // an older server, or a namespace whose files hold their data
		case errno != 0 || len(rep.Inos) == 0:
			p.next[key] = count // asked again by a create that finds none, a second later
			if p.refused == nil {
				p.refused = map[stubKey]time.Time{}
			}
			if len(p.refused) >= maxStubKeys {
				clear(p.refused)
			}
			p.refused[key] = time.Now().Add(reserveRetry)
		default:
			p.addLocked(key, call.UsedGen, rep.Attr, rep.Inos)
		}
	}()
}

// createBehind answers the create of name in n at once with a file made ahead, and sends its
// PLACE aside (see above). ok false: the caller creates it as usual.
func (n *node) createBehind(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, bool) {
	be := n.be
	if be.createSlots == nil || be.leases == nil || be.local != nil || be.stripes == nil || n == be.root ||
		flags&syscall.O_ACCMODE == syscall.O_ACCMODE || flags&notLazyFlags != 0 {
		return nil, nil, 0, false
	}
	dirIno := n.StableAttr().Ino
	n.mu.Lock()
	_, taken := n.names[name]
	listing := n.names != nil && !taken && n.unlinks.removals == 0 && time.Until(n.listingUntil) >= unlinkBehindMargin
	if listing {
		n.creates++
	}
	again := n.creates > 1
	n.mu.Unlock()
	if !listing {
		return nil, nil, 0, false
	}
	uid, gid := caller(ctx)
	key := stubKey{dir: dirIno, uid: uid, gid: gid, mode: mode}
	ino, gen, attr, ok, low := be.stubs.take(key)
	if low && again {
		// The second create of a directory asks for files ahead, and goes on: a directory
		// that gets one new file costs no more than before.
		n.reserveAhead(key)
	}
	if !ok {
		return nil, nil, 0, false
	}
	if _, left, leased := be.leases.cachedAttr(dirIno); !leased || left < unlinkBehindMargin {
		be.stubs.giveBack(key, ino, gen)
		return nil, nil, 0, false
	}
	select {
	case be.createSlots <- struct{}{}:
	case <-ctx.Done(): // interrupted while as many as the mount allows were on their way
		be.stubs.giveBack(key, ino, gen)
		return nil, nil, 0, false
	}
	// The listing and the name are checked again, and the create counted, under the lock a
	// recall takes (settleRecalled): a recall either comes first (then this goes the usual
	// way) or finds the create counted and waits for it.
	n.mu.Lock()
	_, taken = n.names[name]
	if n.names == nil || taken || n.unlinks.removals > 0 || time.Until(n.listingUntil) < unlinkBehindMargin {
		n.mu.Unlock()
		<-be.createSlots
		be.stubs.giveBack(key, ino, gen)
		return nil, nil, 0, false
	}
	n.names[name] = struct{}{}
	delete(n.absent, name)
	if n.unlinks.n == 0 {
		n.unlinks.done = make(chan struct{})
	}
	if n.unlinks.hurry == nil {
		n.unlinks.hurry = make(chan struct{})
	}
	hurry := n.unlinks.hurry
	n.unlinks.n++
	n.mu.Unlock()

	be.createsBehind.Add(1)
	now := time.Now()
	be.leases.touchDir(dirIno, now)
	ts := proto.Timespec{Sec: now.Unix(), Nsec: uint32(now.Nanosecond())}
	a := proto.Attr{Ino: ino, Mode: syscall.S_IFREG | attr.Mode&0o7777, Nlink: 1, UID: attr.UID, GID: attr.GID,
		Atime: ts, Mtime: ts, Ctime: ts, Blksize: attr.Blksize}
	// The kernel keeps them no longer than the lease the PLACE's reply starts later: the
	// storage node tells this mount of any change by another from then on, and nobody else
	// can reach the file before.
	lease := be.lease
	ls := be.leases
	ls.createdFile(ino, ls.sizeEpoch(), lease)
	ls.keepMadeAhead(&a, lease)
	ch := n.child(ctx, &a, out, lease)
	child, isNode := ch.Operations().(*node)
	if !isNode { // never: n.child makes nodes
		<-be.createSlots
		return nil, nil, 0, false
	}
	child.madeHere.Store(true)
	// Its handle is opened on the metadata server only when it needs one (a write, fsync,
	// truncate: materialize), as a lazy open's: the PLACE opens nothing — unless the first
	// write comes before the PLACE leaves: the PLACE opens it then (placement).
	h := child.addHandle(0, 0, flags&^(syscall.O_CREAT|syscall.O_EXCL|syscall.O_TRUNC))
	h.mu.Lock()
	h.lazy, h.uid, h.gid = true, uid, gid
	h.mu.Unlock()
	p := &placement{done: make(chan struct{}), go_: make(chan struct{}), creator: h}
	child.placing.Store(p)

	req := &proto.PlaceReq{Stub: ino, CreateReq: proto.CreateReq{Dir: n.path(), Name: name, Flags: flags | syscall.O_EXCL, Mode: mode}}
	route := n.in()
	be.creating.Add(1)
	go func() {
		defer be.creating.Done()
		defer func() { <-be.createSlots }()
		wait := time.NewTimer(be.placeDelay)
		select {
		case <-p.go_:
		case <-hurry:
		case <-wait.C:
		}
		wait.Stop()
		p.hurry(false) // it leaves now: a first write from here on opens the file itself
		p.mu.Lock()
		held, whole := p.held, p.whole
		req.Writer = (p.writer || len(held) > 0) && !be.noPlacedWriters.Load()
		p.mu.Unlock()
		if whole {
			req.Writer, req.DataServer, req.Data = false, be.wholeOn-1, held
		}
		epoch := ls.sizeEpoch()
		var rep proto.OpenReply
		var call *client.Call
		// place sends req as it is now, into a fresh reply.
		place := func(ctx context.Context) syscall.Errno {
			rep = proto.OpenReply{}
			call = &client.Call{Op: proto.OpPlace, UID: uid, GID: gid, Req: req, Reply: &rep, Route: route, Gen: gen, MinVersion: placeVersion(req)}
			return be.client.Do(ctx, call)
		}
		ctx, cancel := be.opCtx(context.Background())
		defer cancel()
		errno := place(ctx)
		if whole && errno != 0 {
			// Not placed whole: the held bytes go as the creator's first write. A storage
			// node of a version before, or one that could not keep the data (its directory
			// fixes where files start, its stripe is smaller, no room) left the file made
			// ahead unused: it is placed open for the creator, where an error of the held
			// bytes meets their write and the close reports it. One that lost it (ESTALE, a
			// connection lost: EIO) has it made by a plain CREATE below.
			whole, req.Data = false, nil
			if errno == syscall.EPROTONOSUPPORT {
				be.noWholePlaces.Store(true)
			}
			if errno != syscall.ESTALE && errno != syscall.EIO && errno != syscall.EINTR {
				req.Writer = !be.noPlacedWriters.Load()
				errno = place(ctx)
			}
		}
		if errno == syscall.EPROTONOSUPPORT && req.Writer {
			// A storage node of the version before: placed as before, its first write opens it.
			be.noPlacedWriters.Store(true)
			req.Writer = false
			errno = place(ctx)
		}
		if errno == syscall.ESTALE || errno == syscall.EIO || errno == syscall.EPROTONOSUPPORT {
			// The file made ahead went with its connection (or the PLACE was lost with it,
			// perhaps after it landed): the file is made, or found, by a plain CREATE.
			rep = proto.OpenReply{}
			call = &client.Call{Op: proto.OpCreate, UID: uid, GID: gid, Req: &req.CreateReq, Reply: &rep, Route: route}
			req.CreateReq.Flags &^= syscall.O_EXCL
			if errno = be.client.Do(ctx, call); errno == 0 && rep.Attr.Ino != ino {
				be.logf("warpfs: %s, created behind, was made again after its connection was lost: inode %d, not %d", req.Dir+"/"+name, rep.Attr.Ino, ino)
				ls.forgetAttr(ino)
				defer n.NotifyEntry(name) // the kernel looks it up again: its inode number
			}
		}
		if errno == 0 {
			if call.Listing && call.Lease > 0 {
				n.renewListing(call.Lease)
			}
			if call.Lease > 0 && rep.Attr.Ino == ino {
				ls.keepCreated(&rep.Attr, rep.Layout, epoch, call.Lease)
			}
			errno = h.fillOpened(&rep, call.UsedGen, uid, gid)
			h.mu.Lock()
			h.lazy = rep.Handle == 0 // a plain CREATE's reply opened it
			h.mu.Unlock()
			if errno == 0 && rep.Handle != 0 && call.Op == proto.OpPlace {
				h.writing.Lock()
				h.closeByReport = true
				h.writing.Unlock()
			}
			if errno == 0 && whole {
				be.placedWhole.Add(1)
			}
			if errno == 0 && len(held) > 0 && !whole {
				// The held bytes are the creator's first write, queued before anything
				// else may use the file (every request about it waits for done).
				if _, werr := h.writeStriped(ctx, held, 0); werr != 0 {
					h.failBehind(werr)
				}
			}
		}
		if errno != 0 {
			be.logf("warpfs: the create of %s (returned to its caller already) failed on the storage node: %v; the name is dropped", req.Dir+"/"+name, errno)
			be.createsFailed.Add(1)
			ls.forgetAttr(ino)
			n.forgetListing()
			n.NotifyEntry(name)
			p.errno = errno
		}
		close(p.done)
		if errno == 0 {
			child.placing.CompareAndSwap(p, nil)
		}
		n.mu.Lock()
		if n.unlinks.n--; n.unlinks.n == 0 {
			close(n.unlinks.done)
			n.unlinks.done = nil
		}
		n.mu.Unlock()
	}()
	return ch, h, n.openFlags(flags, nil), true
}

// placeVersion is the protocol version a PLACE needs: one carrying the file's data, or one
// opening the file for its writer, a newer one than a plain PLACE.
func placeVersion(r *proto.PlaceReq) uint16 {
	switch {
	case len(r.Data) > 0:
		return proto.InlinePlaceVersion
	case r.Writer:
		return proto.PlacedWriterVersion
	}
	return proto.StubVersion
}

// settleTree waits for the removals and creates on their way in n and every directory below
// it the kernel holds: a directory moved, their requests name it by its old path.
func (n *node) settleTree() {
	n.settleUnlinks()
	for _, c := range n.Children() {
		if cn, ok := c.Operations().(*node); ok && c.IsDir() {
			cn.settleTree()
		}
	}
}

// keepMadeAhead keeps the attributes this mount gave a file it created behind, until lease.
func (ls *leaseState) keepMadeAhead(a *proto.Attr, lease time.Duration) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if len(ls.attrs) < maxCachedAttrs {
		ls.attrs[a.Ino] = cachedAttr{attr: *a, until: time.Now().Add(lease)}
	}
}

// forgetAttr drops what this mount keeps of inode ino's attributes.
func (ls *leaseState) forgetAttr(ino uint64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	delete(ls.attrs, ino)
	delete(ls.noCaps, ino)
}
