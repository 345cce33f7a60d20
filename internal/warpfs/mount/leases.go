package mount

// Coherent caching: the kernel keeps the names (found or not) and attributes a leased reply
// gives for the lease (package server, leases.go; warpfs.lease), and the server tells the
// mount before anyone else changes them. The mount then drops them from the kernel with
// FUSE's notifications — an entry by its parent's inode and its name, attributes and cached
// data by the inode — before it answers, so a change made on another node is seen here at the
// next call, as strictly as when nothing was cached.
//
// Why the kernel's caches cannot keep a stale answer past a notification:
//   - a name: the kernel adds a dentry under its parent directory's lock, which a
//     notification of that name also takes (fuse_reverse_inval_entry), so a lookup whose
//     reply is on its way completes first and is dropped after; a dentry once dropped stays
//     so;
//   - attributes: a notification bumps the inode's attribute version, and the kernel ignores
//     the attributes of any reply to a request sent before (fuse_change_attributes); an inode
//     the kernel does not know yet (a reply making it is on its way) is retried until it does
//     (dropAttr).

import (
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// leaseState is a mount's side of its leases.
type leaseState struct {
	mu sync.Mutex
	// nodes are the nodes made for each inode number that the kernel may hold attributes
	// of: usually one; more while go-fuse settles which of two lookups' nodes it keeps.
	nodes map[uint64][]*node
	// given is when a leased reply last handed the kernel an inode (by number): an
	// invalidation that finds no inode in the kernel retries while one may be on its way.
	// givenOrder holds the same grants in the order they were made, so that those older
	// than inodeRetry leave from its front: a create's cost stays the same however many
	// files the last second made (a sweep of the whole map at each grant once it held 4,096
	// took 9 % of the client's CPU in mdtest-easy's create phase).
	given      map[uint64]time.Time
	givenOrder []grant
	givenHead  int

	// sizes are the striped files open for reading whose size the metadata server leased
	// with their OPEN (by inode number): a read past it asks nothing while the lease lasts
	// (fileHandle.size). An invalidation of the inode's attributes ends it; epoch counts
	// them, so that an OPEN's reply that one overtook leases nothing. Guarded by mu.
	sizes map[uint64]map[*stripedFile]struct{}
	epoch uint64

	// attrs are attributes the replies to this mount's own changes leased, which its kernel
	// dropped on its own and asks for again (by inode number), answered from here:
	//   - a directory's after a create or unlink of this mount in it (proto.DirAttrVersion):
	//     the kernel drops them at every change of a directory's entries and asks at the next
	//     permission check (default_permissions), a GETATTR per create and per unlink;
	//   - a striped file's after this mount's size report (at close, fsync, flush): its
	//     writes made the kernel drop them, and its metadata server's attributes change by
	//     requests to it alone (this node's later writes count in writtenExtent, as when it
	//     asks), so a stat after a close asks nothing.
	// An invalidation of the inode ends one (dropSizes), as does any change of it by this
	// mount (startChange, endChange: every request that changes an inode's attributes is
	// bracketed). changing counts those in flight, changeSeq their starts, so that a reply a
	// later change overtook, or one with another change in flight beside it, is not kept.
	// Guarded by mu.
	attrs     map[uint64]cachedAttr
	changing  map[uint64]int
	changeSeq map[uint64]uint64
	// layouts are the stripe layouts of the striped files this mount created or opened (by
	// inode number, from the replies): with the file's attributes in attrs, an open asks
	// nothing (node.openLazily). Guarded by mu.
	layouts      map[uint64][]byte
	layoutsSwept time.Time

	// rootIno is the namespace root's inode number on the server (0: not known yet), rootKey
	// the root node's own: the server's invalidations name the first (noteRoot). Guarded by
	// mu.
	rootIno, rootKey uint64

	// noCaps are files this mount created, leased, which have no security.capability
	// attribute: the kernel asks for it at each new file's first write (to drop file
	// capabilities), and is answered ENODATA from here until the lease runs out, the inode's
	// attributes change elsewhere (an invalidation), this mount sets an attribute of it or
	// the kernel forgets it (OnForget).
	// Guarded by mu.
	noCaps map[uint64]time.Time

	// kept are the regular files whose pages the kernel may keep across opens, and why
	// (keptdata.go), by inode number. Guarded by mu.
	kept      map[uint64]keptData
	keptSwept time.Time
}

// cachedAttr is attributes leased until.
type cachedAttr struct {
	attr  proto.Attr
	until time.Time
}

// maxCachedAttrs bounds attrs, layouts and noCaps: past it, the entries run out are swept.
// mdtest-easy's four ranks make 4,000 files within a lease.
const maxCachedAttrs = 1 << 14

// changeToken is a change of an inode by this mount, in flight.
type changeToken struct {
	ino, seq, epoch uint64
	root            bool // the namespace root's: its attributes carry the server's inode number
	// overlapped: another change of the inode was in flight when this one started; the
	// server may take that one after this one, so this reply's attributes may be older than
	// what it then holds (four writers' size reports at close: the smaller one last).
	overlapped bool
}

// startChange notes that a change of inode ino's attributes (a directory's entries too) by
// this mount starts: what attrs held of it is stale from now on.
func (ls *leaseState) startChange(ino uint64) changeToken {
	if ls == nil {
		return changeToken{}
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	delete(ls.attrs, ino)
	overlapped := ls.changing[ino] > 0
	ls.changing[ino]++
	ls.changeSeq[ino]++
	return changeToken{ino: ino, seq: ls.changeSeq[ino], epoch: ls.epoch, overlapped: overlapped}
}

// endChange ends the change t: a, the inode's attributes after it (nil: not given), are
// kept for lease when nothing could have changed them since the server took them — no
// invalidation came (epoch), and t was this mount's only change of the inode in flight all
// along: none started after t, none is still in flight, and none was when t started (one
// that started before t may have reached the server after it, even if its reply came first).
func (ls *leaseState) endChange(t changeToken, a *proto.Attr, lease time.Duration) {
	if ls == nil {
		return
	}
	now := time.Now()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	alone := !t.overlapped && ls.changing[t.ino] == 1 && ls.changeSeq[t.ino] == t.seq
	if ls.changing[t.ino]--; ls.changing[t.ino] <= 0 {
		delete(ls.changing, t.ino)
		delete(ls.changeSeq, t.ino)
	}
	if a == nil || lease <= 0 || (a.Ino != t.ino && !(t.root && a.Ino == ls.rootIno)) || !alone || ls.epoch != t.epoch {
		return
	}
	if len(ls.attrs) >= maxCachedAttrs {
		for ino, c := range ls.attrs {
			if !c.until.After(now) {
				delete(ls.attrs, ino)
			}
		}
	}
	if len(ls.attrs) < maxCachedAttrs {
		ls.attrs[t.ino] = cachedAttr{attr: *a, until: now.Add(lease)}
	}
	ls.leaseDataLocked(a, lease, now)
}

// cachedAttr is what attrs holds of inode ino, and for how much longer.
func (ls *leaseState) cachedAttr(ino uint64) (proto.Attr, time.Duration, bool) {
	if ls == nil {
		return proto.Attr{}, 0, false
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	c, ok := ls.attrs[ino]
	if !ok {
		return proto.Attr{}, 0, false
	}
	left := time.Until(c.until)
	if left <= 0 {
		delete(ls.attrs, ino)
		return proto.Attr{}, 0, false
	}
	return c.attr, left, true
}

// keepCreated keeps the attributes and layout of a striped file this mount just created
// (its CREATE's reply, leased for lease), unless an invalidation came since epoch or a change
// of the inode by this mount is in flight: the file's metadata server's attributes change by
// requests to it alone, which this mount brackets (startChange), so they answer a GETATTR
// and let an open ask nothing until then.
func (ls *leaseState) keepCreated(a *proto.Attr, layout []byte, epoch uint64, lease time.Duration) {
	if ls == nil || lease <= 0 || len(layout) == 0 {
		return
	}
	now := time.Now()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.epoch != epoch || ls.changing[a.Ino] > 0 || len(ls.attrs) >= maxCachedAttrs {
		return
	}
	ls.attrs[a.Ino] = cachedAttr{attr: *a, until: now.Add(lease)}
	ls.noteLayoutLocked(a.Ino, layout)
	ls.leaseDataLocked(a, lease, now)
}

// noteLayout notes the layout of the striped file ino, from a reply that gave it.
func (ls *leaseState) noteLayout(ino uint64, layout []byte) {
	if ls == nil || len(layout) == 0 {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.noteLayoutLocked(ino, layout)
}

func (ls *leaseState) noteLayoutLocked(ino uint64, layout []byte) {
	if now := time.Now(); len(ls.layouts) >= maxCachedAttrs && now.Sub(ls.layoutsSwept) > time.Second {
		// At most a sweep a second: a full table of live entries is not scanned per create.
		ls.layoutsSwept = now
		for i := range ls.layouts {
			if _, ok := ls.attrs[i]; !ok {
				delete(ls.layouts, i)
			}
		}
	}
	if len(ls.layouts) < maxCachedAttrs {
		ls.layouts[ino] = append([]byte(nil), layout...)
	}
}

// openable returns what an open of the striped file ino without asking needs: its
// attributes, leased for how much longer, and its layout; ok false when this mount does not
// hold both.
func (ls *leaseState) openable(ino uint64) (a proto.Attr, lease time.Duration, layout []byte, ok bool) {
	if ls == nil {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	c, ok1 := ls.attrs[ino]
	l, ok2 := ls.layouts[ino]
	if !ok1 || !ok2 || ls.changing[ino] > 0 {
		return
	}
	if lease = time.Until(c.until); lease <= 0 {
		return
	}
	return c.attr, lease, l, true
}

// createdFile notes a regular file this mount created, leased for lease: it has no
// security.capability attribute (noCaps).
func (ls *leaseState) createdFile(ino uint64, epoch uint64, lease time.Duration) {
	if ls == nil || lease <= 0 {
		return
	}
	now := time.Now()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.epoch != epoch {
		return // an invalidation overtook the reply
	}
	if len(ls.noCaps) >= maxCachedAttrs {
		for ino, until := range ls.noCaps {
			if !until.After(now) {
				delete(ls.noCaps, ino)
			}
		}
	}
	if len(ls.noCaps) < maxCachedAttrs {
		ls.noCaps[ino] = now.Add(lease)
	}
}

// hasNoCaps says whether inode ino is known to have no security.capability attribute.
func (ls *leaseState) hasNoCaps(ino uint64) bool {
	if ls == nil {
		return false
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	until, ok := ls.noCaps[ino]
	return ok && time.Now().Before(until)
}

// xattrChanging forgets what noCaps says of inode ino: this mount sets or removes one of its
// attributes.
func (ls *leaseState) xattrChanging(ino uint64) {
	if ls == nil {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.epoch++ // a create's reply on its way keeps nothing either
	delete(ls.noCaps, ino)
}

// sizeEpoch is where invalidations are before an OPEN that may be leased.
func (ls *leaseState) sizeEpoch() uint64 {
	if ls == nil {
		return 0
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.epoch
}

// leaseSize gives an open striped file the lease its OPEN's reply carried, unless an
// invalidation came since epoch (sizeEpoch before the OPEN).
func (ls *leaseState) leaseSize(sf *stripedFile, ino uint64, epoch uint64, lease time.Duration) {
	until := time.Now().Add(lease)
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.epoch != epoch || ino == 0 {
		return
	}
	set := ls.sizes[ino]
	if set == nil {
		set = map[*stripedFile]struct{}{}
		ls.sizes[ino] = set
	}
	set[sf] = struct{}{}
	sf.mu.Lock()
	sf.sizeUntil, sf.ino = until, ino
	sf.mu.Unlock()
}

// unleaseSize forgets an open striped file's size lease (its handle is released).
func (ls *leaseState) unleaseSize(sf *stripedFile) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	sf.mu.Lock()
	ino := sf.ino
	sf.sizeUntil, sf.ino = time.Time{}, 0
	sf.mu.Unlock()
	if set := ls.sizes[ino]; set != nil {
		delete(set, sf)
		if len(set) == 0 {
			delete(ls.sizes, ino)
		}
	}
}

// dropSizes ends the size leases of inode ino, and what attrs and noCaps hold of it: its
// attributes changed elsewhere.
func (ls *leaseState) dropSizes(ino uint64) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.epoch++
	delete(ls.attrs, ino)
	delete(ls.noCaps, ino)
	delete(ls.layouts, ino)
	ls.dataChangedLocked(ino)
	if ino == ls.rootIno {
		delete(ls.attrs, ls.rootKey)
	}
	for sf := range ls.sizes[ino] {
		sf.mu.Lock()
		sf.sizeUntil, sf.ino = time.Time{}, 0
		sf.durable = 0 // someone else changed it: the next fdatasync reports (syncMetadata)
		sf.mu.Unlock()
	}
	delete(ls.sizes, ino)
}

// inodeRetry bounds how long an invalidation waits for an inode a leased reply is giving the
// kernel (a reply the mount sent but the kernel has not taken yet).
const inodeRetry = time.Second

// maxNodesPerInode bounds the nodes kept per inode number.
const maxNodesPerInode = 4

func newLeaseState() *leaseState {
	return &leaseState{nodes: map[uint64][]*node{}, given: map[uint64]time.Time{}, sizes: map[uint64]map[*stripedFile]struct{}{},
		attrs: map[uint64]cachedAttr{}, changing: map[uint64]int{}, changeSeq: map[uint64]uint64{}, layouts: map[uint64][]byte{}, noCaps: map[uint64]time.Time{},
		kept: map[uint64]keptData{}}
}

// noteRoot notes the namespace root's inode number on the server (ino), from a reply that
// gave its attributes: the server's invalidations of it then reach the root, whose inode
// number in the kernel is FUSE's own.
func (be *backend) noteRoot(ino uint64) {
	ls := be.leases
	if ls == nil || ino == 0 || be.root == nil {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.rootIno == ino {
		return
	}
	if old := ls.rootIno; old != 0 {
		list := ls.nodes[old]
		for i, o := range list {
			if o == be.root {
				ls.nodes[old] = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(ls.nodes[old]) == 0 {
			delete(ls.nodes, old)
		}
	}
	ls.rootIno, ls.rootKey = ino, be.root.StableAttr().Ino
	ls.nodes[ino] = append(ls.nodes[ino], be.root)
}

// noteNode notes a node made for a reply: invalidations of its inode number reach it; leased says
// the reply was leased.
func (be *backend) noteNode(n *node, ino uint64, leased bool) {
	ls := be.leases
	if ls == nil {
		return
	}
	now := time.Now()
	ls.mu.Lock()
	defer ls.mu.Unlock()
	list := ls.nodes[ino]
	kept := list[:0]
	for _, o := range list {
		if !o.forgotten {
			kept = append(kept, o)
		}
	}
	if len(kept) >= maxNodesPerInode {
		kept = kept[1:]
	}
	ls.nodes[ino] = append(kept, n)
	if !leased {
		return
	}
	ls.given[ino] = now
	ls.givenOrder = append(ls.givenOrder, grant{ino, now})
	// Keep only the recent ones: the old leave from the front (givenHead), and the slice
	// moves down once most of it is gone, so that each grant costs O(1) on average.
	for ls.givenHead < len(ls.givenOrder) && now.Sub(ls.givenOrder[ls.givenHead].at) > inodeRetry {
		g := ls.givenOrder[ls.givenHead]
		if at, ok := ls.given[g.ino]; ok && !at.After(g.at) { // not granted again since
			delete(ls.given, g.ino)
		}
		ls.givenHead++
	}
	if ls.givenHead > 64 && ls.givenHead*2 > len(ls.givenOrder) {
		ls.givenOrder = append(ls.givenOrder[:0], ls.givenOrder[ls.givenHead:]...)
		ls.givenHead = 0
	}
}

// grant is a leased reply's handing of inode ino to the kernel at at (leaseState.given).
type grant struct {
	ino uint64
	at  time.Time
}

// OnForget: the kernel forgot the node; it holds no attributes of it any more.
func (n *node) OnForget() {
	ls := n.be.leases
	if ls == nil {
		return
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	n.forgotten = true
	ino := n.StableAttr().Ino
	delete(ls.attrs, ino)
	delete(ls.layouts, ino)
	list := ls.nodes[ino]
	for i, o := range list {
		if o == n {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(ls.nodes, ino)
		// The kernel asks no more of it; a file that takes its inode number later is not
		// this one (and mdtest's thousands of removed files would fill the table).
		delete(ls.noCaps, ino)
		delete(ls.kept, ino) // its pages went with it
	} else {
		ls.nodes[ino] = list
	}
}

var _ fs.NodeOnForgetter = (*node)(nil)

// drop is the invalidator: it drops what a change elsewhere made stale, and returns once the
// kernel did.
func (be *backend) drop(items []proto.Inval) {
	for _, it := range items {
		if it.What&proto.InvalEntry != 0 {
			be.dropEntry(it.Path)
		}
		if it.What&(proto.InvalAttr|proto.InvalData) != 0 {
			be.dropAttr(it.Ino, it.What&proto.InvalData != 0)
		}
		if it.What&proto.InvalListing != 0 {
			be.dropListing(it.Path)
		}
	}
}

// dropEntry drops the kernel's dentry at path (found or not), if it holds its parent.
func (be *backend) dropEntry(path string) {
	if be.root == nil {
		return // not mounted yet: the kernel holds nothing
	}
	dir, name := splitPath(path)
	parent := be.root.EmbeddedInode()
	for _, c := range splitComponents(dir) {
		if parent = parent.GetChild(c); parent == nil {
			return // the kernel holds no dentry of the parent, so none beneath it
		}
	}
	parent.NotifyEntry(name)
}

// dropAttr drops the kernel's attributes of inode ino, and its cached data with data.
func (be *backend) dropAttr(ino uint64, data bool) {
	off := int64(-1) // attributes only
	if data {
		off = 0
	}
	ls := be.leases
	ls.dropSizes(ino)
	deadline := time.Now().Add(inodeRetry)
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 20*time.Millisecond) {
		ls.mu.Lock()
		list := append([]*node(nil), ls.nodes[ino]...)
		given, recent := ls.given[ino]
		ls.mu.Unlock()
		hit := false
		for _, n := range list {
			// A node go-fuse did not keep was never given to the kernel: ENOENT.
			if n.EmbeddedInode().NotifyContent(off, 0) != syscall.ENOENT {
				hit = true
			}
		}
		// The kernel does not hold the inode: nothing to drop, unless a reply giving it is
		// on its way (leased recently).
		if hit || !recent || time.Since(given) > inodeRetry || time.Now().After(deadline) {
			return
		}
		time.Sleep(wait)
	}
}

func splitPath(p string) (string, string) {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[:i], p[i+1:]
		}
	}
	return "", p
}

func splitComponents(p string) []string {
	if p == "" {
		return nil
	}
	var out []string
	start := 0
	for i := 0; i <= len(p); i++ {
		if i == len(p) || p[i] == '/' {
			out = append(out, p[start:i])
			start = i + 1
		}
	}
	return out
}

// enableLeases turns coherent caching on when every server of the mount's names grants
// leases (a single namespace, local or remote, striped or not: not replicas or shards yet),
// and returns the lease (0: off).
func (be *backend) enableLeases() time.Duration {
	var lease time.Duration
	switch t := be.client.(type) {
	case *client.Client:
		lease = t.Lease()
		if lease > 0 {
			be.lease = lease
			be.leases = newLeaseState()
			t.SetInvalidator(be.drop)
			t.SetSettler(be.settleRecalled)
		}
	case localTransport:
		lease = t.local.Lease()
		if lease > 0 {
			be.leases = newLeaseState()
			t.local.SetInvalidator(be.drop)
		}
	}
	return lease
}

// entryLease sets how long the kernel may keep what a reply gave: the lease when it was
// leased; otherwise nothing (the mount's defaults, zero unless client_cache).
func (be *backend) entryLease(out *fuse.EntryOut, lease time.Duration) {
	if be.leases != nil && lease > 0 {
		out.SetEntryTimeout(lease)
		out.SetAttrTimeout(lease)
	}
}

func (be *backend) attrLease(out *fuse.AttrOut, lease time.Duration) {
	if be.leases != nil && lease > 0 {
		out.SetTimeout(lease)
	}
}

// setListing makes n, a directory this mount just made, know every name in it (none) for
// lease: lookups of other names are answered absent here, without asking the server, which
// tells the mount (InvalListing) before anyone else adds one. The server holds the listing
// for twice the lease: an absence answered here is kept by the kernel for a lease more.
func (n *node) setListing(lease time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.listingUntil = time.Now().Add(lease)
	n.names, n.absent = map[string]struct{}{}, map[string]struct{}{}
}

// answerAbsent says whether a lookup of name in n can be answered absent without asking:
// n knows every name in it, and name is none of them. The answer is noted, under the same
// lock as the check, so that an InvalListing finds it (dropListing).
func (n *node) answerAbsent(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.names == nil {
		return false
	}
	if !time.Now().Before(n.listingUntil) {
		n.names = nil // run out: asks the server from now on; the absences answered run out with the server's hold
		return false
	}
	if _, ok := n.names[name]; ok {
		return false
	}
	n.absent[name] = struct{}{}
	return true
}

// noteName records this mount's own change of name in n (made, or removed).
func (n *node) noteName(name string, exists bool) {
	if name == "" {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.names == nil {
		return
	}
	if exists {
		n.names[name] = struct{}{}
		delete(n.absent, name)
	} else {
		delete(n.names, name)
	}
}

// dropListing ends the listing of the directory at path (another mount looks up, lists or
// changes an entry of it) and drops every absence it answered alone from the kernel.
func (be *backend) dropListing(path string) {
	if n := be.dirNode(path); n != nil {
		n.forgetListing()
	}
}

// dirNode is the node of the directory at path, if the kernel holds it (nil otherwise).
func (be *backend) dirNode(path string) *node {
	if be.root == nil {
		return nil // not mounted yet: the kernel holds nothing
	}
	dir := be.root.EmbeddedInode()
	for _, c := range splitComponents(path) {
		if dir = dir.GetChild(c); dir == nil {
			return nil
		}
	}
	n, _ := dir.Operations().(*node)
	return n
}
