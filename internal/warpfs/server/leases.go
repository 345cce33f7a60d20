package server

// Leases: what the mounts of a namespace may cache, and telling them before it changes.
//
// A reply that gives a client a name (found or not) or attributes registers the client as a
// holder of them for the lease (warpfs.lease), and says so (proto.FlagLease): the client's
// kernel may then answer lookups and stats from its cache for that long. Before a request
// that changes a name or attributes is acknowledged, every other holder of what it changed is
// told (an OpInval notification) and its reply waited for; a holder that does not reply (its
// node is dead or cut off) is waited out until its lease runs out, so no client ever serves
// what another has already been told is changed. The table never holds a lock while it waits,
// and the server's own locks are released by then: a client busy with a request of its own
// that the change's directory lock delays can still answer.
//
// What is held:
//   - entries, by the path the client named them by (a parent path and a name), found or
//     not: a create, unlink or rename of that name drops them everywhere else;
//   - attributes (and the data the kernel caches with them), by inode number: a setattr, a
//     write, a change of a directory's entries or of a file's links drops them.
//
// A reply computed while a change to what it gives was being made is not leased: begin and
// end bracket a request, and end refuses the lease when a change by anyone else to one of its
// names or inodes was recorded in between (changedEntries, changedAttrs). A change recorded
// after end finds the holder registered and tells it.
//
// Renaming a directory moves the names beneath it: the other holders of names under either
// path are told, and the renaming client's own (its kernel moved them with the directory) are
// moved in the table too.
//
// A server process that starts while clients of a previous one may still cache names of a
// namespace that existed before it (an agent restarted under a running job) waits the lease
// out before its first change (graceUntil).

import (
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// DefaultLease is how long a client may cache a name or attributes (warpfs.lease).
const DefaultLease = 10 * time.Second

// leaseSlack is added to a lease on the server's side: the client's kernel starts counting
// a little after the server registered it (the reply's way back, the client's own delay).
// The client refuses to cache a reply that took longer than this (client.Call.Leased).
const leaseSlack = 2 * time.Second

// maxChangeLog bounds the changes remembered while requests are in flight; past it the log
// is cut and the replies of requests begun before are not leased.
const maxChangeLog = 1 << 16

// processStart is when this server process started: namespaces older than it may have
// clients that cached names granted by the previous process.
var processStart = time.Now()

// leaseHolder is a client that may hold leases: a connection of LeaseVersion, or an
// in-process mount that can drop its kernel's cache.
type leaseHolder interface {
	// invalidate tells the client to drop items. The channel is closed once it did; ok is
	// false when it cannot be told (its connection is gone).
	invalidate(items []proto.Inval) (done <-chan struct{}, ok bool)
}

// holder is a client of the table.
type holder struct {
	h    leaseHolder
	gone bool // its connection ended: its leases are waited out, never told
}

// interest is who holds one thing, and until when.
type interest map[*holder]time.Time

// leases is one namespace's table, shared by every session of it in this process.
type leases struct {
	dir        string
	lease      time.Duration
	graceUntil time.Time
	refs       int // guarded by registry.mu

	mu      sync.Mutex
	entries map[string]map[string]interest // parent path → name → holders
	attrs   map[uint64]interest            // inode → holders
	inos    map[string]uint64              // path → inode, from the grants: a directory's inode by its path
	// listings are the holders that know every name of a directory (by path): its maker,
	// until anyone else changes one of its entries (proto.FlagListing).
	listings map[string]interest
	// listed is len(listings), set under mu after any change that may add one: a request
	// looks at listings (recall) only when some directory has one.
	listed atomic.Int64

	// holders are the clients' mounts by incarnation (proto.Auth): a mount that reconnects
	// takes its holder back, with what its kernel still caches.
	holders map[string]*holder

	seq            uint64
	grants         uint64
	inflight       int
	changedEntries map[string]change // path → its last change, while requests are in flight
	// changedDirs is the last change of an entry of each directory (by path), while requests
	// are in flight: a directory's attributes changed with it, whether or not the table knew
	// its inode then (leaseDirLocked).
	changedDirs  map[string]change
	changedAttrs map[uint64]change
	floor        uint64 // requests begun before this change are not leased
}

// change is the last change of something: when (seq) and by whom (nil: several).
type change struct {
	seq uint64
	by  *holder
}

// registry holds the tables of this process's namespaces, by namespace root.
var registry = struct {
	mu sync.Mutex
	m  map[string]*leases
}{m: map[string]*leases{}}

// acquireLeases returns dir's table (lease 0: none, nil).
func acquireLeases(dir string, lease time.Duration) *leases {
	if lease <= 0 {
		return nil
	}
	dir = path.Clean(dir)
	registry.mu.Lock()
	defer registry.mu.Unlock()
	l := registry.m[dir]
	if l == nil {
		l = &leases{dir: dir, lease: lease, entries: map[string]map[string]interest{}, attrs: map[uint64]interest{},
			inos: map[string]uint64{}, holders: map[string]*holder{}, listings: map[string]interest{}, changedEntries: map[string]change{}, changedAttrs: map[uint64]change{}, changedDirs: map[string]change{}}
		// Files' times come from the kernel's coarse clock, a tick behind: a directory made
		// just after the process started may look a little older than it.
		if bornBefore(dir, processStart.Add(-time.Second)) {
			// A listing is held twice the lease (what its holder answered absent alone is
			// kept a lease more).
			l.graceUntil = processStart.Add(2*lease + leaseSlack)
		}
		registry.m[dir] = l
	}
	if lease > l.lease {
		l.lease = lease
	}
	l.refs++
	return l
}

// releaseLeases drops a session's reference; the table goes with the last one once nothing
// it holds can still be cached.
func releaseLeases(l *leases) {
	if l == nil {
		return
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	l.refs--
	if l.refs > 0 {
		return
	}
	l.mu.Lock()
	live := l.liveLocked(time.Now())
	l.mu.Unlock()
	if !live && registry.m[l.dir] == l {
		delete(registry.m, l.dir)
	}
}

// liveLocked says whether anything held may still be cached somewhere.
func (l *leases) liveLocked(now time.Time) bool {
	live := func(in interest) bool {
		for _, until := range in {
			if until.After(now) {
				return true
			}
		}
		return false
	}
	for _, names := range l.entries {
		for _, in := range names {
			if live(in) {
				return true
			}
		}
	}
	for _, in := range l.attrs {
		if live(in) {
			return true
		}
	}
	for _, in := range l.listings {
		if live(in) {
			return true
		}
	}
	return false
}

// bornBefore says whether the directory dir was made before t (or cannot tell).
func bornBefore(dir string, t time.Time) bool {
	var sx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BTIME|unix.STATX_CTIME, &sx); err != nil {
		return true
	}
	ts := sx.Ctime // no birth time: the last change is no earlier
	if sx.Mask&unix.STATX_BTIME != 0 {
		ts = sx.Btime
	}
	return time.Unix(ts.Sec, int64(ts.Nsec)).Before(t)
}

// join is the path of name in dir (either may be "": the root, or dir itself).
func join(dir, name string) string {
	switch {
	case dir == "":
		return name
	case name == "":
		return dir
	}
	return dir + "/" + name
}

// split is a path's parent and last component.
func split(p string) (string, string) {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i], p[i+1:]
	}
	return "", p
}

// bind returns the holder of a connection of the mount named incarnation ("": one of its
// own): the mount's holder from an earlier connection when it reconnected, now told through
// this one.
func (l *leases) bind(incarnation string, h leaseHolder) *holder {
	l.mu.Lock()
	defer l.mu.Unlock()
	if incarnation == "" {
		return &holder{h: h}
	}
	if old := l.holders[incarnation]; old != nil {
		old.h, old.gone = h, false
		return old
	}
	n := &holder{h: h}
	l.holders[incarnation] = n
	return n
}

// leaseToken brackets one request (begin ... end).
type leaseToken struct {
	seq uint64
	ok  bool // a request that can be leased or changes something
}

// begin notes where the change log stands before a request runs.
func (l *leases) begin() leaseToken {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inflight++
	return leaseToken{seq: l.seq, ok: true}
}

// finish ends the bracket; with no request in flight the change log is not needed.
func (l *leases) finishLocked() {
	l.inflight--
	if l.inflight == 0 && (len(l.changedEntries) > 0 || len(l.changedAttrs) > 0) {
		clear(l.changedDirs)
		clear(l.changedEntries)
		clear(l.changedAttrs)
	}
}

// changedSince says whether a change by someone other than h to entry p (when hasPath) or
// inode ino (when not 0) was recorded after t began.
func (l *leases) changedSinceLocked(t leaseToken, h *holder, p string, hasPath bool, ino uint64) bool {
	if t.seq < l.floor {
		return true
	}
	if hasPath {
		if c, ok := l.changedEntries[p]; ok && c.seq > t.seq && c.by != h {
			return true
		}
	}
	if ino != 0 {
		if c, ok := l.changedAttrs[ino]; ok && c.seq > t.seq && c.by != h {
			return true
		}
	}
	return false
}

// grantLocked registers h as a holder of entry p (when hasPath) and of inode ino's attributes
// (when not 0), the path naming ino when byPath.
func (l *leases) grantLocked(h *holder, until time.Time, p string, hasPath bool, ino uint64, byPath bool) {
	if l.grants++; l.grants%sweepGrants == 0 {
		l.sweepLocked(time.Now()) // a namespace only read (no changes to sweep after) stays bounded too
	}
	if hasPath {
		dir, name := split(p)
		names := l.entries[dir]
		if names == nil {
			names = map[string]interest{}
			l.entries[dir] = names
		}
		in := names[name]
		if in == nil {
			in = interest{}
			names[name] = in
		}
		in[h] = until
	}
	if ino != 0 {
		in := l.attrs[ino]
		if in == nil {
			in = interest{}
			l.attrs[ino] = in
		}
		in[h] = until
		if byPath {
			l.inos[p] = ino
		}
	}
}

// pending collects, per holder, what a change must tell it, and how long it may have to be
// waited for.
type pending struct {
	changed bool // something changed: a restarted server's grace period applies
	items   map[*holder][]proto.Inval
	until   map[*holder]time.Time
}

func (p *pending) add(h *holder, until time.Time, it proto.Inval) {
	if p.items == nil {
		p.items, p.until = map[*holder][]proto.Inval{}, map[*holder]time.Time{}
	}
	p.items[h] = append(p.items[h], it)
	if until.After(p.until[h]) {
		p.until[h] = until
	}
}

// recordLocked notes a change and takes the other holders' leases it ends.
func (l *leases) recordLocked(by *holder, now time.Time, out *pending, entries []string, inos []uint64, data bool) {
	l.seq++
	out.changed = true
	if l.seq%sweepEvery == 0 {
		l.sweepLocked(now)
	}
	// The changer's own request is in flight; another one's reply may be affected.
	track := l.inflight > 1
	if len(l.changedEntries)+len(l.changedAttrs) > maxChangeLog {
		clear(l.changedDirs)
		clear(l.changedEntries)
		clear(l.changedAttrs)
		l.floor = l.seq
	}
	for _, p := range entries {
		if track {
			l.note(l.changedEntries, p, by)
			d, _ := split(p)
			l.note(l.changedDirs, d, by)
		}
		dir, name := split(p)
		l.dropListingLocked(by, now, out, dir)
		if in := l.entries[dir][name]; in != nil {
			for h, until := range in {
				if h == by {
					continue
				}
				delete(in, h)
				if until.After(now) {
					out.add(h, until, proto.Inval{What: proto.InvalEntry, Path: p})
				}
			}
			if len(in) == 0 {
				delete(l.entries[dir], name)
				if len(l.entries[dir]) == 0 {
					delete(l.entries, dir)
				}
			}
		}
	}
	what := proto.InvalAttr
	if data {
		what |= proto.InvalData
	}
	for _, ino := range inos {
		if ino == 0 {
			continue
		}
		if track {
			l.noteIno(ino, by)
		}
		if in := l.attrs[ino]; in != nil {
			for h, until := range in {
				if h == by {
					continue
				}
				delete(in, h)
				if until.After(now) {
					out.add(h, until, proto.Inval{What: what, Ino: ino})
				}
			}
			if len(in) == 0 {
				delete(l.attrs, ino)
			}
		}
	}
}

// sweepEvery and sweepGrants are how many changes and grants pass between sweeps of the
// leases run out.
const (
	sweepEvery  = 4096
	sweepGrants = 1 << 16
)

// prune forgets the holders whose lease on this thing ran out, notes the others in live, and
// says whether none is left.
func (in interest) prune(now time.Time, live map[*holder]bool) bool {
	for h, until := range in {
		if !until.After(now) {
			delete(in, h)
		} else {
			live[h] = true
		}
	}
	return len(in) == 0
}

// sweepLocked forgets the leases that have run out, the paths of inodes nobody holds, and
// the holders of mounts gone for good.
func (l *leases) sweepLocked(now time.Time) {
	live := map[*holder]bool{}
	for dir, names := range l.entries {
		for name, in := range names {
			if in.prune(now, live) {
				delete(names, name)
			}
		}
		if len(names) == 0 {
			delete(l.entries, dir)
		}
	}
	for ino, in := range l.attrs {
		if in.prune(now, live) {
			delete(l.attrs, ino)
		}
	}
	for dir, in := range l.listings {
		if in.prune(now, live) {
			delete(l.listings, dir)
		}
	}
	for p, ino := range l.inos {
		if l.attrs[ino] == nil {
			delete(l.inos, p)
		}
	}
	for key, h := range l.holders {
		if h.gone && !live[h] {
			delete(l.holders, key)
		}
	}
}

func (l *leases) note(m map[string]change, p string, by *holder) {
	c, ok := m[p]
	if ok && c.by != by {
		by = nil
	}
	m[p] = change{seq: l.seq, by: by}
}

func (l *leases) noteIno(ino uint64, by *holder) {
	c, ok := l.changedAttrs[ino]
	if ok && c.by != by {
		by = nil
	}
	l.changedAttrs[ino] = change{seq: l.seq, by: by}
}

// dropListingLocked ends the others' listings of dir: one of its entries changed.
func (l *leases) dropListingLocked(by *holder, now time.Time, out *pending, dir string) {
	in := l.listings[dir]
	for h, until := range in {
		if h == by {
			continue // its own change: its mount knows of it
		}
		delete(in, h)
		if until.After(now) {
			out.add(h, until, proto.Inval{What: proto.InvalListing, Path: dir})
		}
	}
	if len(in) == 0 {
		delete(l.listings, dir)
	}
}

// moveListingsLocked handles the listings of directory p and those beneath it when p moves
// to to: mover's move with it (its kernel moved the directory), everyone else's end, told.
// With to "" (p removed, or replaced by a rename), mover's end untold: its kernel knows the
// directory is gone, and it is busy removing it. An empty p is the root: every listing.
func (l *leases) moveListingsLocked(mover *holder, now time.Time, out *pending, p, to string) {
	type moved struct {
		path  string
		until time.Time
	}
	var keep []moved
	for dir, in := range l.listings {
		if p != "" && dir != p && !strings.HasPrefix(dir, p+"/") {
			continue
		}
		for h, until := range in {
			if !until.After(now) {
				continue
			}
			if h == mover && mover != nil {
				if to != "" {
					keep = append(keep, moved{to + dir[len(p):], until})
				}
				continue
			}
			out.add(h, until, proto.Inval{What: proto.InvalListing, Path: dir})
		}
		delete(l.listings, dir)
	}
	for _, m := range keep {
		if l.listings[m.path] == nil {
			l.listings[m.path] = interest{}
		}
		l.listings[m.path][mover] = m.until
	}
}

// moveLocked handles a rename of old to new (a directory's names move with it; exchange:
// both ways): the other holders of names beneath either are told, the renamer's own move
// (its kernel moved them), and so do the paths of inodes.
func (l *leases) moveLocked(by *holder, now time.Time, out *pending, old, new string, exchange bool) {
	mine := map[string]map[string]time.Time{} // the renamer's names beneath old (relative)
	theirs := map[string]map[string]time.Time{}
	l.takeBeneath(by, now, out, old, mine)
	l.takeBeneath(by, now, out, new, theirs)
	put := func(base string, held map[string]map[string]time.Time) {
		for rel, names := range held {
			for name, until := range names {
				l.grantLocked(by, until, join(join(base, rel), name), true, 0, false)
			}
		}
	}
	put(new, mine)
	if exchange {
		put(old, theirs)
		// The two swap in the renamer's kernel, and in its listings (through a path no
		// request can name).
		const aside = "\x00exchanging"
		l.moveListingsLocked(by, now, out, old, aside)
		l.moveListingsLocked(by, now, out, new, old)
		l.moveListingsLocked(by, now, out, aside, new)
	} else {
		// The target (an empty directory, if one) is gone; the renamer's own kernel dropped
		// what it knew of it, and must not be told while it renames.
		l.moveListingsLocked(by, now, out, new, "")
		l.moveListingsLocked(by, now, out, old, new)
	}
	// The inodes' paths.
	moved := map[string]uint64{}
	for p, ino := range l.inos {
		switch {
		case p == old || strings.HasPrefix(p, old+"/"):
			moved[new+p[len(old):]] = ino
			delete(l.inos, p)
		case p == new || strings.HasPrefix(p, new+"/"):
			if exchange {
				moved[old+p[len(new):]] = ino
			}
			delete(l.inos, p)
		}
	}
	for p, ino := range moved {
		l.inos[p] = ino
	}
}

// takeBeneath removes every holder's names beneath directory p: the others' are told, h's
// are returned in held (by path relative to p).
func (l *leases) takeBeneath(h *holder, now time.Time, out *pending, p string, held map[string]map[string]time.Time) {
	var walk func(dir, rel string)
	walk = func(dir, rel string) {
		names := l.entries[dir]
		if names == nil {
			return
		}
		delete(l.entries, dir)
		for name, in := range names {
			child := join(dir, name)
			for who, until := range in {
				if !until.After(now) {
					continue
				}
				if who == h {
					if held[rel] == nil {
						held[rel] = map[string]time.Time{}
					}
					held[rel][name] = until
				} else {
					out.add(who, until, proto.Inval{What: proto.InvalEntry, Path: child})
				}
			}
			walk(child, join(rel, name))
		}
	}
	walk(p, "")
}

// wait tells every holder in out and waits for each to confirm, or for its leases to run
// out; and, for a server restarted under running clients, for the grace period.
func (l *leases) wait(out *pending, grace time.Time) {
	if d := time.Until(grace); out.changed && !grace.IsZero() && d > 0 {
		time.Sleep(d)
	}
	if len(out.items) == 0 {
		return
	}
	type told struct {
		done  <-chan struct{}
		until time.Time
	}
	var all []told
	for h, items := range out.items {
		until := out.until[h].Add(leaseSlack)
		var done <-chan struct{}
		ok := false
		if !h.gone {
			for len(items) > 0 {
				n := min(len(items), proto.MaxInvals)
				done, ok = h.h.invalidate(items[:n])
				items = items[n:]
				if !ok {
					break
				}
				if len(items) > 0 { // several notifications: wait for each but the last here
					waitFor(done, until)
				}
			}
		}
		if !ok {
			done = nil
		}
		all = append(all, told{done, until})
	}
	for _, t := range all {
		waitFor(t.done, t.until)
	}
}

// waitFor waits for done (nil: never) or until.
func waitFor(done <-chan struct{}, until time.Time) {
	d := time.Until(until)
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	}
}

// recall ends the other holders' listings of the directories whose entries a request (op,
// m) looks up, lists or changes, and waits for each to answer, before the request runs. A
// mount that holds a directory's listing may have removals of its names on their way, sent
// before its unlink returned (the mount's unlinks behind, mount/unlinkbehind.go): it answers
// once they are done, so this request finds them done — as it would have had the mount
// waited for each. A holder that does not answer is waited out, as for a change.
//
// Listings are dropped at a change of their directory's entries anyway (dropListingLocked);
// recall drops them before a lookup or a listing by someone else too, and before the change
// rather than after it.
func (u *leaseUse) recall(op proto.Op, m proto.Message) {
	if u == nil || u.l.listed.Load() == 0 {
		return
	}
	var dirs [4]string
	n := entryDirs(op, m, &dirs)
	if n == 0 {
		return
	}
	l := u.l
	now := time.Now()
	var out pending
	l.mu.Lock()
	for _, d := range dirs[:n] {
		if len(l.listings[d]) > 0 {
			l.dropListingLocked(u.h, now, &out, d) // u.h nil: a session that holds nothing; everyone's
		}
	}
	if r, ok := m.(*proto.RenameReq); ok && op == proto.OpRename {
		// The directories beneath a moved one too: their holders' requests on their way
		// (creates and unlinks behind) name them by their old paths.
		for _, moved := range []string{join(r.Dir, r.Name), join(r.NewDir, r.NewName)} {
			for d := range l.listings {
				if strings.HasPrefix(d, moved+"/") && len(l.listings[d]) > 0 {
					l.dropListingLocked(u.h, now, &out, d)
				}
			}
		}
	}
	l.listed.Store(int64(len(l.listings)))
	l.mu.Unlock()
	l.wait(&out, time.Time{})
}

// entryDirs puts in dirs the directories whose entries request m (op) looks up, lists or
// changes, and returns how many.
func entryDirs(op proto.Op, m proto.Message, dirs *[4]string) int {
	n := 0
	add := func(d string) { dirs[n] = d; n++ }
	parent := func(p string) { d, _ := split(p); add(d) }
	switch r := m.(type) {
	case *proto.PathReq:
		if op == proto.OpOpendir {
			add(r.Path)
		} else if r.Path != "" {
			parent(r.Path)
		}
	case *proto.NodeReq:
		if r.Handle == 0 && r.Path != "" {
			parent(r.Path)
		}
	case *proto.OpenReq:
		if r.Path != "" {
			parent(r.Path)
		}
	case *proto.SetattrReq:
		if r.Handle == 0 && r.Path != "" {
			parent(r.Path)
		}
	case *proto.XattrReq:
		if r.Handle == 0 && r.Path != "" {
			parent(r.Path)
		}
	case *proto.CreateReq:
		if r.Name != "" {
			add(r.Dir)
		}
	case *proto.MkdirReq:
		add(r.Dir)
	case *proto.SymlinkReq:
		add(r.Dir)
	case *proto.LinkReq:
		add(r.Dir)
		parent(r.Path)
	case *proto.EntryReq:
		add(r.Dir)
		if op == proto.OpRmdir {
			add(join(r.Dir, r.Name)) // its names must be gone first
		}
	case *proto.RenameReq:
		add(r.Dir)
		add(r.NewDir)
		add(join(r.Dir, r.Name))
		add(join(r.NewDir, r.NewName))
	}
	return n
}

// leaseUse is a session's side of its namespace's table.
type leaseUse struct {
	l   *leases
	h   *holder     // nil: the session's client holds no leases (it only changes)
	own leaseHolder // the session's own way to its client (h.h, unless h moved to a newer connection)
}

// before brackets a request (see after).
func (u *leaseUse) before(op proto.Op) leaseToken {
	if u == nil || !leaseRelevant(op) {
		return leaseToken{}
	}
	return u.l.begin()
}

// leaseRelevant says whether op can be leased or change what is.
func leaseRelevant(op proto.Op) bool {
	switch op {
	case proto.OpRead, proto.OpReaddir, proto.OpStatfs, proto.OpGetxattr,
		proto.OpListxattr, proto.OpLseek, proto.OpOpendir, proto.OpReadlink, proto.OpPing, proto.OpReserve:
		return false
	}
	return true
}

// after registers what the reply gives and tells the other holders what the request
// changed, waiting for them; it says whether the reply may be cached. hd is the request's
// handle's inode (writes), 0 when it names none.
func (u *leaseUse) after(t leaseToken, op proto.Op, m, rep proto.Message, errno uint32, handleIno uint64) uint8 {
	if u == nil || !t.ok {
		return 0
	}
	l, h := u.l, u.h
	now := time.Now()
	until := now.Add(l.lease)
	var out pending
	leased, listing := false, false
	l.mu.Lock()
	switch r := m.(type) {
	case *proto.PathReq:
		if op == proto.OpLookup && h != nil {
			if errno == 0 {
				ino := rep.(*proto.AttrReply).Attr.Ino
				if leased = !l.changedSinceLocked(t, h, r.Path, true, ino); leased {
					l.grantLocked(h, until, r.Path, true, ino, true)
				}
			} else if errno == uint32(unix.ENOENT) {
				if leased = !l.changedSinceLocked(t, h, r.Path, true, 0); leased {
					l.grantLocked(h, until, r.Path, true, 0, false)
				}
			}
		}
	case *proto.NodeReq: // GETATTR
		if errno == 0 && h != nil {
			ino := rep.(*proto.AttrReply).Attr.Ino
			if leased = !l.changedSinceLocked(t, h, "", false, ino); leased {
				l.grantLocked(h, until, r.Path, false, ino, r.Handle == 0)
			}
		}
	case *proto.SetattrReq:
		if errno == 0 {
			ino := rep.(*proto.AttrReply).Attr.Ino
			// A new size (a truncate, a striped writer's report) or mtime: the data changed.
			data := r.Valid&(proto.SetSize|proto.SetSizeAtLeast|proto.SetMtime|proto.SetMtimeNow) != 0
			l.recordLocked(h, now, &out, nil, []uint64{ino}, data)
			if h != nil {
				if leased = !l.changedSinceLocked(t, h, "", false, ino); leased {
					l.grantLocked(h, until, r.Path, false, ino, r.Handle == 0 && r.Path != "")
				}
			}
		}
	case *proto.OpenReq:
		if errno == 0 && rep.(*proto.OpenReply).Truncated || errno == 0 && r.Flags&unix.O_TRUNC != 0 {
			l.recordLocked(h, now, &out, nil, []uint64{rep.(*proto.OpenReply).Attr.Ino}, true)
		} else if errno == 0 && h != nil {
			// An open leases the file's attributes: a striped file's reader then knows its
			// size is current (its reads past it ask nothing) until told.
			ino := rep.(*proto.OpenReply).Attr.Ino
			if leased = !l.changedSinceLocked(t, h, "", false, ino); leased {
				l.grantLocked(h, until, "", false, ino, false)
			}
		}
	case *proto.CreateReq:
		if errno == 0 && r.Name != "" {
			o := rep.(*proto.OpenReply)
			leased = l.made(h, t, now, until, &out, r.Dir, r.Name, o.Attr.Ino, 0)
			if !leased || !l.leaseDirLocked(h, t, until, r.Dir, o.Dir) {
				o.Dir = nil
			}
			listing = l.renewListingLocked(h, now, r.Dir)
		}
	case *proto.MkdirReq:
		if errno == 0 {
			leased = l.made(h, t, now, until, &out, r.Dir, r.Name, rep.(*proto.AttrReply).Attr.Ino, 0)
			l.dirOfMadeLocked(h, t, until, r.Dir, rep, leased)
			if leased && op == proto.OpMkdir {
				// Its maker knows every name of the new directory: none. Its kernel may keep
				// an absence it answered alone for a lease after it stops answering so: the
				// listing is held twice as long.
				p := join(r.Dir, r.Name)
				if l.listings[p] == nil {
					l.listings[p] = interest{}
				}
				l.listings[p][h] = now.Add(2 * l.lease)
				listing = true
			}
		}
	case *proto.SymlinkReq:
		if errno == 0 {
			leased = l.made(h, t, now, until, &out, r.Dir, r.Name, rep.(*proto.AttrReply).Attr.Ino, 0)
			l.dirOfMadeLocked(h, t, until, r.Dir, rep, leased)
		}
	case *proto.LinkReq:
		if errno == 0 {
			ino := rep.(*proto.AttrReply).Attr.Ino
			leased = l.made(h, t, now, until, &out, r.Dir, r.Name, ino, ino) // its link count changed
			l.dirOfMadeLocked(h, t, until, r.Dir, rep, leased)
		}
	case *proto.AdoptReq:
		if errno == 0 {
			p := join(r.Dir, r.Name)
			l.recordLocked(h, now, &out, []string{p}, []uint64{l.inos[r.Dir], l.inos[p]}, false)
		}
	case *proto.EntryReq: // UNLINK, RMDIR
		if errno == 0 {
			p := join(r.Dir, r.Name)
			l.recordLocked(h, now, &out, []string{p}, []uint64{l.inos[r.Dir], l.inos[p]}, false)
			// The names beneath a directory removed: the others' are told; the remover's own
			// kernel drops its own (and is busy removing: it could not take a notification).
			l.takeBeneath(h, now, &out, p, map[string]map[string]time.Time{})
			l.moveListingsLocked(h, now, &out, p, "")
			delete(l.inos, p)
			if rr, ok := rep.(*proto.RemovedReply); ok && rr.Dir != nil {
				if leased = l.leaseDirLocked(h, t, until, r.Dir, rr.Dir); !leased {
					rr.Dir = nil
				}
			}
			if op == proto.OpUnlink {
				listing = l.renewListingLocked(h, now, r.Dir)
			}
		}
	case *proto.RenameReq:
		if errno == 0 {
			old, new := join(r.Dir, r.Name), join(r.NewDir, r.NewName)
			l.recordLocked(h, now, &out, []string{old, new}, []uint64{l.inos[r.Dir], l.inos[r.NewDir], l.inos[old], l.inos[new]}, false)
			l.moveLocked(h, now, &out, old, new, r.Flags&unix.RENAME_EXCHANGE != 0)
		}
	case *proto.XattrReq:
		if errno == 0 && (op == proto.OpSetxattr || op == proto.OpRemovexattr) {
			ino := handleIno
			if ino == 0 {
				ino = l.inos[r.Path]
			}
			l.recordLocked(h, now, &out, nil, []uint64{ino}, false)
		}
	case *proto.HandleReq, *proto.FsyncReq: // the kernel wrote the file itself (passthrough)
		if handleIno != 0 {
			l.recordLocked(h, now, &out, nil, []uint64{handleIno}, true)
		}
	case *proto.WriteReq, *proto.WriteSyncReq, *proto.FallocateReq, *proto.CopyRangeReq:
		if handleIno != 0 && (len(l.attrs[handleIno]) > 0 || l.inflight > 1) {
			l.recordLocked(h, now, &out, nil, []uint64{handleIno}, true)
		}
	}
	l.finishLocked()
	l.listed.Store(int64(len(l.listings)))
	grace := l.graceLocked(now)
	l.mu.Unlock()
	l.wait(&out, grace)
	var flags uint8
	if leased {
		flags |= proto.FlagLease
	}
	if listing {
		flags |= proto.FlagListing
	}
	return flags
}

// renewListingLocked extends h's listing of dir, if it still holds it, after a create or an
// unlink of h's in it: the mount goes on knowing every name of a directory it keeps changing
// alone (proto.FlagListing on the reply of a CREATE or UNLINK).
func (l *leases) renewListingLocked(h *holder, now time.Time, dir string) bool {
	if h == nil {
		return false
	}
	until, ok := l.listings[dir][h]
	if !ok || !until.After(now) {
		return false
	}
	l.listings[dir][h] = now.Add(2 * l.lease)
	return true
}

// leaseDirLocked leases to h the attributes a create or unlink of its left directory dir
// with (a, the reply's), unless someone else changed them while the request ran; it says
// whether it did. h's kernel dropped its own copy at the change and asks for them next: its
// mount answers that from a (proto.DirAttrVersion).
func (l *leases) leaseDirLocked(h *holder, t leaseToken, until time.Time, dir string, a *proto.Attr) bool {
	if h == nil || a == nil || l.changedSinceLocked(t, h, "", false, a.Ino) {
		return false
	}
	if c, ok := l.changedDirs[dir]; ok && c.seq > t.seq && c.by != h {
		return false // an entry of it changed meanwhile, before the table knew its inode
	}
	l.grantLocked(h, until, dir, false, a.Ino, true)
	return true
}

// dirOfMadeLocked leases the directory's attributes a MKDIR's, MKNOD's, SYMLINK's or LINK's
// reply carries with what it made (leased), or takes them out of it.
func (l *leases) dirOfMadeLocked(h *holder, t leaseToken, until time.Time, dir string, rep proto.Message, leased bool) {
	r, ok := rep.(*proto.AttrReply)
	if !ok || r.Dir == nil {
		return
	}
	if !leased || !l.leaseDirLocked(h, t, until, dir, r.Dir) {
		r.Dir = nil
	}
}

// made records a new entry dir/name (inode ino; also a changed inode, for LINK) and leases it
// to its maker.
func (l *leases) made(h *holder, t leaseToken, now, until time.Time, out *pending, dir, name string, ino, also uint64) bool {
	p := join(dir, name)
	l.recordLocked(h, now, out, []string{p}, []uint64{l.inos[dir], also}, false)
	if h == nil || l.changedSinceLocked(t, h, p, true, ino) {
		return false
	}
	l.grantLocked(h, until, p, true, ino, true)
	return true
}

// leave ends a session's use of the table: what its client holds is waited out, not told.
func (u *leaseUse) leave() {
	if u == nil {
		return
	}
	if u.h != nil {
		u.l.mu.Lock()
		if u.h.h == u.own { // not already taken back by the mount's next connection
			u.h.gone = true
		}
		u.l.mu.Unlock()
	}
	releaseLeases(u.l)
}

// forget ends the session's client's leases at once: it is unmounted (proto.OpBye, or an
// in-process mount's close), so its kernel holds nothing any more.
func (u *leaseUse) forget() {
	if u == nil || u.h == nil {
		return
	}
	l, h := u.l, u.h
	l.mu.Lock()
	defer l.mu.Unlock()
	for dir, names := range l.entries {
		for name, in := range names {
			delete(in, h)
			if len(in) == 0 {
				delete(names, name)
			}
		}
		if len(names) == 0 {
			delete(l.entries, dir)
		}
	}
	for ino, in := range l.attrs {
		delete(in, h)
		if len(in) == 0 {
			delete(l.attrs, ino)
		}
	}
	for dir, in := range l.listings {
		delete(in, h)
		if len(in) == 0 {
			delete(l.listings, dir)
		}
	}
	if h.h == u.own {
		h.gone = true
	}
}

// invalidateAll tells every holder of the namespace to drop everything it holds, and waits:
// for changes made beside the server (a stage writing into the namespace's directory).
func (l *leases) invalidateAll() {
	now := time.Now()
	var out pending
	l.mu.Lock()
	l.seq++
	l.floor = l.seq
	out.changed = true
	l.takeBeneath(nil, now, &out, "", nil)
	for ino, in := range l.attrs {
		for h, until := range in {
			if until.After(now) {
				out.add(h, until, proto.Inval{What: proto.InvalAttr | proto.InvalData, Ino: ino})
			}
		}
	}
	clear(l.attrs)
	l.moveListingsLocked(nil, now, &out, "", "")
	grace := l.graceLocked(now)
	l.mu.Unlock()
	l.wait(&out, grace)
}

// graceLocked is when a change may be acknowledged at the earliest (zero: at once).
func (l *leases) graceLocked(now time.Time) time.Time {
	if !l.graceUntil.IsZero() && !l.graceUntil.After(now) {
		l.graceUntil = time.Time{}
	}
	return l.graceUntil
}

// RecallListings makes every mount that holds a listing of a directory of the namespace at
// dir give it up, and waits for each to answer (its removals behind there landed: the mount's
// unlinks behind), or for its listing to run out: before a stage-out's worker reads the
// namespace's directory itself, it finds every file the job removed gone.
func RecallListings(dir string) {
	registry.mu.Lock()
	l := registry.m[path.Clean(dir)]
	registry.mu.Unlock()
	if l == nil {
		return
	}
	now := time.Now()
	var out pending
	l.mu.Lock()
	for d := range l.listings {
		l.dropListingLocked(nil, now, &out, d)
	}
	l.listed.Store(int64(len(l.listings)))
	l.mu.Unlock()
	l.wait(&out, time.Time{})
}

// InvalidateNamespace makes every client that caches names or attributes of the namespace at
// dir drop them, and returns once they did (or their leases ran out): for what changed the
// namespace beside its server.
func InvalidateNamespace(dir string) {
	registry.mu.Lock()
	l := registry.m[path.Clean(dir)]
	registry.mu.Unlock()
	if l != nil {
		l.invalidateAll()
	}
}
