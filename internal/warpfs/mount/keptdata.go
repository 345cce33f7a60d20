package mount

// Data kept across opens. The kernel drops a file's cached pages at every open unless the
// open's reply says FOPEN_KEEP_CACHE. An open for reading says it when nobody can have
// changed the file since its pages were read:
//   - this mount held a lease on the file's attributes all along (the server tells a holder
//     of any change by another node before acknowledging it: the invalidation drops the
//     pages and ends the lease), or — once the lease ran out — the attributes the next
//     leased reply gives still have the change time and size they had when the pages were
//     read: every change of a file's data moves its change time on its metadata server (a
//     striped file's at its writer's size report, which sets its modification time), and a
//     change made after the lease ran out is at least a lease later than the time this mount
//     was last told;
//   - on the same connection to the server: a server restarted after a change but before it
//     told this mount would leave a lease that looks unbroken;
//   - and no process of this node had it open for writing since (its own writes are in the
//     pages on this kernel, but a file opened only for writing bypasses them).
//
// Otherwise the kernel drops them at the open, as it always did, and — where the mount holds
// the lease — what is read from then on is kept (marked so at the handle's first request,
// once the kernel is done with the open). What stays as before: two nodes writing one file
// at once see each other's bytes at their next open after the other's close, fsync or size
// report (close-to-open), as they see its size.

import (
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// keptData is what a mount knows of a regular file's pages in its kernel (leaseState.kept).
type keptData struct {
	until time.Time      // this mount's lease on the file's attributes runs until then (zero: none)
	ctime proto.Timespec // the file's change time and size, as last leased
	size  uint64
	// fresh: the kernel's pages of the file were read since the mount last dropped them,
	// with the file as ctime and size say, on connection generation gen.
	fresh bool
	gen   uint64
	// breaks counts what ended freshness (an invalidation, a writer here, other attributes):
	// a drop that one overtook marks nothing fresh.
	breaks uint64
}

// endFresh ends what makes d's pages fresh; a drop under way (keptPages' tok) marks nothing.
func (d *keptData) endFresh() {
	d.fresh = false
	d.breaks++
}

// leaseData notes a leased reply's attributes a of a regular file, leased for lease; epoch
// is where invalidations were before its request left (sizeEpoch): one that came since may
// have ended the lease the reply gave, so the reply counts for nothing.
func (ls *leaseState) leaseData(a *proto.Attr, lease time.Duration, epoch uint64) {
	if ls == nil || lease <= 0 || a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.epoch != epoch {
		return
	}
	ls.leaseDataLocked(a, lease, time.Now())
}

// leaseDataLocked is leaseData once the reply is known to count (ls.mu held): also for the
// attributes the replies to this mount's own changes lease (endChange, keepCreated).
func (ls *leaseState) leaseDataLocked(a *proto.Attr, lease time.Duration, now time.Time) {
	if lease <= 0 || a.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	d, ok := ls.kept[a.Ino]
	if !ok && len(ls.kept) >= maxCachedAttrs {
		if now.Sub(ls.keptSwept) < time.Second {
			return // at most a sweep a second: a full table of live entries is not scanned per reply
		}
		ls.keptSwept = now
		for ino, o := range ls.kept {
			if !o.until.After(now) {
				delete(ls.kept, ino) // a fresh one's pages are dropped at its next open
			}
		}
		if len(ls.kept) >= maxCachedAttrs {
			return
		}
	}
	if d.fresh && (d.ctime != a.Ctime || d.size != a.Size) {
		d.endFresh()
	}
	until := now.Add(lease)
	if now.Before(d.until) && d.until.After(until) {
		until = d.until
	}
	d.until, d.ctime, d.size = until, a.Ctime, a.Size
	ls.kept[a.Ino] = d
}

// dataChangedLocked ends what the mount holds of inode ino's pages: another node changed the
// file (an invalidation, which also ended the lease on its attributes). ls.mu is held.
func (ls *leaseState) dataChangedLocked(ino uint64) {
	if d, ok := ls.kept[ino]; ok {
		d.until = time.Time{}
		d.endFresh()
		ls.kept[ino] = d
	}
}

// dataWriting notes that a process of this node opens (or closes, or resizes) inode ino for
// writing: the next open for reading drops the pages.
func (ls *leaseState) dataWriting(ino uint64) {
	if ls == nil {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if d, ok := ls.kept[ino]; ok {
		d.endFresh()
		ls.kept[ino] = d
	}
}

// keptPages says whether the kernel's pages of inode ino are fresh for an open on connection
// generation gen (keep), and else whether the mount holds a lease on its attributes (held),
// under which pages dropped now would be (dataDropped, with tok).
func (ls *leaseState) keptPages(ino, gen uint64) (keep, held bool, tok uint64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	d, ok := ls.kept[ino]
	if !ok || !time.Now().Before(d.until) {
		return false, false, 0
	}
	return d.fresh && d.gen == gen, true, d.breaks
}

// dataDropped notes that the kernel's pages of inode ino were dropped (after keptPages gave
// tok): what is read from now on is fresh, unless something ended that meanwhile.
func (ls *leaseState) dataDropped(ino, gen, tok uint64) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	d, ok := ls.kept[ino]
	if !ok || d.breaks != tok || !time.Now().Before(d.until) {
		return false
	}
	d.fresh, d.gen = true, gen
	ls.kept[ino] = d
	return true
}

// connGen is the generation of the mount's connection to its namespace's server (0 for an
// in-process one, which has no connection to lose).
func (be *backend) connGen() uint64 {
	if c, ok := be.client.(*client.Client); ok {
		return c.Gen()
	}
	return 0
}

// keepsData says whether an open for reading of n, by handle h, may keep the pages the kernel
// holds (FOPEN_KEEP_CACHE): see the top of this file. Where they may not but the mount holds
// a lease on the file's attributes, the kernel drops them at this open, and h's first request
// marks what is read from then on fresh (openDone).
func (n *node) keepsData(h *fileHandle) bool {
	ls := n.be.leases
	if ls == nil || n.be.passthrough || n.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG || n.openForWriting() {
		return false
	}
	gen := n.be.connGen()
	keep, held, tok := ls.keptPages(n.StableAttr().Ino, gen)
	if !keep && held && h != nil {
		h.keepTok, h.keepGen = tok, gen
		h.keepAfter.Store(true)
	}
	return keep
}

// openDone runs at a handle's every request: the first after an open that dropped the
// file's pages marks them fresh. The kernel sends a handle's requests only once it is done
// with the open's reply, whose FOPEN_KEEP_CACHE-less handling dropped the pages; marking
// them fresh at the open itself would let an open beside it keep pages this one's reply was
// still to drop.
func (h *fileHandle) openDone() {
	if h.keepAfter.Load() && h.keepAfter.Swap(false) {
		h.node.be.leases.dataDropped(h.node.StableAttr().Ino, h.keepGen, h.keepTok)
	}
}

// openForWriting says whether a handle of n open on this node may write.
func (n *node) openForWriting() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for h := range n.handles {
		if h.flags&syscall.O_ACCMODE != syscall.O_RDONLY {
			return true
		}
	}
	return false
}

// keepCacheFlag is FOPEN_KEEP_CACHE when an open with flags, by handle h, keeps the kernel's
// pages of n, and notes a writer's open (dataWriting).
func (n *node) keepCacheFlag(flags uint32, h *fileHandle) uint32 {
	ls := n.be.leases
	if ls == nil {
		return 0
	}
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0 {
		ls.dataWriting(n.StableAttr().Ino)
		return 0
	}
	if flags&syscall.O_DIRECT == 0 && n.keepsData(h) {
		n.be.kept.Add(1)
		return fuse.FOPEN_KEEP_CACHE
	}
	return 0
}
