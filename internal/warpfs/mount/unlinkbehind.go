package mount

// Unlinks behind: a mount that knows every name of a directory (it made the directory, and
// nobody else has looked in it since: its listing, leases.go) removes a file there without
// waiting for the storage node, as CephFS's asynchronous unlink does under its directory
// capabilities. The UNLINK leaves at once and its answer is waited for aside; unlink(2)
// returns when the kernel has dropped the name. The removals of a directory are then many
// requests in flight instead of one round trip each (mdtest's remove phase was half idle,
// waiting on round trips).
//
// Why nobody sees a removed file again:
//   - another node: the storage node recalls the listing before it runs anyone else's
//     lookup, listing or change of a name of the directory (server/leases.go, recall), and
//     this mount answers the recall only once its removals there are done (dropListing);
//   - this node: the name is known absent at once (the listing), and every other request of
//     this mount that names the directory's entries waits for its removals first
//     (settleUnlinks): a create of the same name cannot overtake the removal.
//
// Only what cannot fail on the storage node where it did not fail in the kernel, and frees no
// space, goes behind: an empty regular file this mount made (its name is in the listing) with
// the one link its create gave it, neither written, resized, linked nor moved since (another
// name's link count would change; a file holding data frees space, which a write right after
// the unlink may need: "rm old; write new" in a full instance must not fail), with no handle
// open here (an open file keeps its objects until its last close), in a directory
// whose attributes the mount holds leased (the kernel asks for them at its next permission
// check: they are answered here, their times moved to now). A removal the storage node refuses anyway (a
// disk error) is logged, and the listing dropped so that the name is asked for again: the
// file shows again. A removal lost with its connection is sent once more (ENOENT then means
// the first one landed). The mount's unmount waits for the removals on their way.

import (
	"context"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// unlinkBehindMargin is how much of a lease must be left for a removal to go behind: its
// request reaches the storage node well before the lease ends.
const unlinkBehindMargin = time.Second

// pendingUnlinks are a directory's removals on their way (guarded by its node's mu).
// They count its creates behind too (createbehind.go); removals are the unlinks alone: no
// create of a name goes behind while a removal there is on its way (the same name's would
// race it).
type pendingUnlinks struct {
	n        int
	removals int
	done     chan struct{} // closed when n falls to 0; nil while none is pending
	// hurry is closed to send at once the PLACEs of creates behind that wait for their
	// creator's first write (placement); nil while none waits.
	hurry chan struct{}
}

// unlinkBehind removes name from n without waiting for the storage node, and says whether it
// did; false: the caller removes it as usual.
func (n *node) unlinkBehind(ctx context.Context, name string) bool {
	be := n.be
	if be.unlinkSlots == nil || be.leases == nil || be.local != nil || n == be.root {
		return false
	}
	// Empty, with its one name, as this mount's create made it (madeHere): a file with other
	// links keeps an inode whose link count and ctime the removal changes, which a stat by
	// another name would then read from the server before the removal lands; a file with
	// data frees space. Not open here: an open file keeps its objects until its last close.
	child := n.childNode(name)
	if child == nil || child.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG || !child.madeHere.Load() {
		return false
	}
	child.mu.Lock()
	open := len(child.handles) > 0 || child.removeOnRelease != nil
	child.mu.Unlock()
	if open {
		return false
	}
	dirIno := n.StableAttr().Ino
	if _, left, ok := be.leases.cachedAttr(dirIno); !ok || left < unlinkBehindMargin {
		return false
	}
	select {
	case be.unlinkSlots <- struct{}{}:
	case <-ctx.Done(): // interrupted while as many as the mount allows were on their way
		return false
	}
	// The listing and the name are checked, and the removal counted, under the lock a recall
	// takes (settleRecalled): a recall either comes first (then this goes the usual way) or
	// finds the removal counted and waits for it.
	n.mu.Lock()
	_, made := n.names[name]
	if n.names == nil || !made || time.Until(n.listingUntil) < unlinkBehindMargin {
		n.mu.Unlock()
		<-be.unlinkSlots
		return false
	}
	delete(n.names, name)
	if n.unlinks.n == 0 {
		n.unlinks.done = make(chan struct{})
	}
	n.unlinks.n++
	n.unlinks.removals++
	n.mu.Unlock()

	be.unlinksBehind.Add(1)
	be.leases.touchDir(dirIno, time.Now())
	childTok := be.leases.startChange(child.StableAttr().Ino) // its link count: asked for again
	uid, gid := caller(ctx)
	req := &proto.EntryReq{Dir: n.path(), Name: name}
	route := n.in()
	be.unlinking.Add(1)
	go func() {
		defer be.unlinking.Done()
		defer func() { <-be.unlinkSlots }()
		var rep proto.RemovedReply
		call := &client.Call{Op: proto.OpUnlink, UID: uid, GID: gid, Req: req, Reply: &rep, Route: route}
		send := func() syscall.Errno {
			ctx, cancel := be.opCtx(context.Background())
			defer cancel()
			return be.client.Do(ctx, call)
		}
		errno := send()
		if errno == syscall.EIO {
			// Lost with its connection (or its answer was), perhaps after it landed: once
			// more, on the next one, with a time of its own; ENOENT then says it had landed.
			rep = proto.RemovedReply{}
			if errno = send(); errno == syscall.ENOENT {
				errno = 0
			}
		}
		be.leases.endChange(childTok, nil, 0)
		ctx, cancel := be.opCtx(context.Background())
		defer cancel()
		if errno == 0 {
			n.removed(ctx, name, &rep)
			if call.Listing {
				n.renewListing(call.Lease)
			}
		} else {
			be.logf("warpfs: the removal of %s (returned to its caller already) failed on the storage node: %v; the name shows again", req.Dir+"/"+name, errno)
			be.unlinksFailed.Add(1)
			n.forgetListing()
			n.NotifyEntry(name)
		}
		n.mu.Lock()
		n.unlinks.removals--
		if n.unlinks.n--; n.unlinks.n == 0 {
			close(n.unlinks.done)
			n.unlinks.done = nil
		}
		n.mu.Unlock()
	}()
	return true
}

// settleUnlinks waits until n's removals on their way are done: a request of this mount
// that names n's entries goes after them.
func (n *node) settleUnlinks() {
	n.mu.Lock()
	done := n.unlinks.done
	if n.unlinks.hurry != nil {
		close(n.unlinks.hurry) // creates behind waiting for a first write leave now
		n.unlinks.hurry = nil
	}
	n.mu.Unlock()
	if done != nil {
		<-done // each is bounded by the request timeout
	}
}

// notMadeHere ends n's removals behind: it is written, resized, linked or moved (madeHere).
func (n *node) notMadeHere() {
	if n.madeHere.Load() { // a write's check: no store (and no cache line taken) once clear
		n.madeHere.Store(false)
	}
}

// settleRecalled is the client's settler (client.SetSettler): for each listing the server
// recalls, it ends the listing (no removal goes behind there any more) and waits for the
// removals on their way there, before the server is answered and lets another node look in
// the directory. Unlike dropping names from the kernel (be.drop, bounded by
// proto.MaxNotifyWait), this waits for nothing the other node could be holding: only for
// this mount's requests, each bounded by the request timeout.
func (be *backend) settleRecalled(items []proto.Inval) {
	for _, it := range items {
		if it.What&proto.InvalListing == 0 {
			continue
		}
		if n := be.dirNode(it.Path); n != nil {
			n.mu.Lock()
			// Ended at once, its absences kept aside for the notification's drop (bounded:
			// dropListing), not left for names this mount makes meanwhile to be dropped.
			for name := range n.absent {
				if n.recalled == nil {
					n.recalled = map[string]struct{}{}
				}
				n.recalled[name] = struct{}{}
			}
			n.names, n.absent = nil, nil
			n.mu.Unlock()
			n.settleUnlinks()
		}
	}
}

// settleChildUnlinks is settleTree of n's child name, if this mount knows it.
func (n *node) settleChildUnlinks(name string) {
	if c := n.childNode(name); c != nil {
		c.settleTree()
	}
}

// renewListing extends the listing n still holds by lease (a CREATE's or UNLINK's reply
// said the server renewed it: proto.FlagListing).
func (n *node) renewListing(lease time.Duration) {
	if lease <= 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if until := time.Now().Add(lease); n.names != nil && until.After(n.listingUntil) {
		n.listingUntil = until
	}
}

// forgetListing ends n's listing: the names are asked for again, and the absences it
// answered alone are dropped from the kernel.
func (n *node) forgetListing() {
	n.mu.Lock()
	absent := n.absent
	if absent == nil {
		absent = n.recalled
	} else {
		for name := range n.recalled {
			absent[name] = struct{}{}
		}
	}
	n.names, n.absent, n.recalled = nil, nil, nil
	n.mu.Unlock()
	for name := range absent {
		n.NotifyEntry(name)
	}
}

// touchDir moves the times of directory ino's leased attributes to now: a removal of this
// mount's in it, on its way (unlinkBehind).
func (ls *leaseState) touchDir(ino uint64, now time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	c, ok := ls.attrs[ino]
	if !ok {
		return
	}
	t := proto.Timespec{Sec: now.Unix(), Nsec: uint32(now.Nanosecond())}
	c.attr.Mtime, c.attr.Ctime = t, t
	ls.attrs[ino] = c
}
