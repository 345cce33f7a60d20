package server

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// recorder is a holder that answers at once and keeps what it was told.
type recorder struct {
	mu   sync.Mutex
	told []proto.Inval
}

func (r *recorder) invalidate(items []proto.Inval) (<-chan struct{}, bool) {
	r.mu.Lock()
	r.told = append(r.told, items...)
	r.mu.Unlock()
	done := make(chan struct{})
	close(done)
	return done, true
}

func (r *recorder) take() []proto.Inval {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := r.told
	r.told = nil
	return t
}

func newTestLeases(t *testing.T) *leases {
	t.Helper()
	l := acquireLeases(t.TempDir(), time.Minute)
	l.graceUntil = time.Time{}
	t.Cleanup(func() { releaseLeases(l) })
	return l
}

// lookup runs a LOOKUP of p through use, found (ino) or not (ino 0), as a session would.
func lookup(use *leaseUse, p string, ino uint64) bool {
	tok := use.before(proto.OpLookup)
	var rep proto.Message = &proto.AttrReply{Attr: proto.Attr{Ino: ino}}
	errno := uint32(0)
	if ino == 0 {
		rep, errno = nil, 2 // ENOENT
	}
	return use.after(tok, proto.OpLookup, &proto.PathReq{Path: p}, rep, errno, 0)&proto.FlagLease != 0
}

// A renamed directory's names move with it in the renamer's kernel: the table moves the
// renamer's, and tells everyone else theirs (under both paths).
func TestRenamedDirectoryMovesTheRenamersNames(t *testing.T) {
	l := newTestLeases(t)
	ra, rb := &recorder{}, &recorder{}
	a := &leaseUse{l: l, h: l.bind("a/1", ra), own: ra}
	b := &leaseUse{l: l, h: l.bind("b/1", rb), own: rb}
	if !lookup(a, "d/x", 0) || !lookup(b, "d/y", 0) || !lookup(b, "e/z", 0) {
		t.Fatal("a lookup with nothing changing was not leased")
	}
	tok := a.before(proto.OpRename)
	a.after(tok, proto.OpRename, &proto.RenameReq{Dir: "", Name: "d", NewDir: "", NewName: "e"}, &proto.RemovedReply{}, 0, 0)
	told := map[string]bool{}
	for _, it := range rb.take() {
		told[it.Path] = true
	}
	if !told["d/y"] || !told["e/z"] {
		t.Errorf("b was told %v; want d/y and e/z (its names beneath both paths)", told)
	}
	if got := ra.take(); len(got) != 0 {
		t.Errorf("the renamer was told %v", got)
	}
	// a's absence of x moved to e/x: b making e/x tells a.
	tok = b.before(proto.OpCreate)
	b.after(tok, proto.OpCreate, &proto.CreateReq{Dir: "e", Name: "x"}, &proto.OpenReply{Attr: proto.Attr{Ino: 77}}, 0, 0)
	if got := ra.take(); len(got) != 1 || got[0].Path != "e/x" || got[0].What != proto.InvalEntry {
		t.Errorf("after b made e/x, a was told %v; want e/x", got)
	}
}

// The maker of a directory knows its names until someone else adds one: then it is told.
func TestListingOfAMadeDirectory(t *testing.T) {
	l := newTestLeases(t)
	ra, rb := &recorder{}, &recorder{}
	a := &leaseUse{l: l, h: l.bind("a/1", ra), own: ra}
	b := &leaseUse{l: l, h: l.bind("b/1", rb), own: rb}
	tok := a.before(proto.OpMkdir)
	if f := a.after(tok, proto.OpMkdir, &proto.MkdirReq{Name: "d"}, &proto.AttrReply{Attr: proto.Attr{Ino: 3}}, 0, 0); f&proto.FlagListing == 0 {
		t.Fatalf("a's MKDIR reply has flags %#x, want a listing", f)
	}
	tok = a.before(proto.OpCreate) // a's own: it knows
	a.after(tok, proto.OpCreate, &proto.CreateReq{Dir: "d", Name: "mine"}, &proto.OpenReply{Attr: proto.Attr{Ino: 4}}, 0, 0)
	if got := ra.take(); len(got) != 0 {
		t.Errorf("a was told %v of its own create", got)
	}
	tok = b.before(proto.OpCreate)
	b.after(tok, proto.OpCreate, &proto.CreateReq{Dir: "d", Name: "theirs"}, &proto.OpenReply{Attr: proto.Attr{Ino: 5}}, 0, 0)
	got := ra.take()
	listing := false
	for _, it := range got {
		listing = listing || it.What == proto.InvalListing && it.Path == "d"
	}
	if !listing {
		t.Errorf("after b's create in d, a was told %v; want d's listing among it", got)
	}
}

// A reply computed while someone else changed what it gives is not leased.
func TestReplyRacingAChangeIsNotLeased(t *testing.T) {
	l := newTestLeases(t)
	ra, rb := &recorder{}, &recorder{}
	a := &leaseUse{l: l, h: l.bind("a/1", ra), own: ra}
	b := &leaseUse{l: l, h: l.bind("b/1", rb), own: rb}
	tok := a.before(proto.OpLookup) // a's lookup reads the state ...
	tb := b.before(proto.OpUnlink)  // ... while b removes the name
	b.after(tb, proto.OpUnlink, &proto.EntryReq{Dir: "", Name: "f"}, &proto.RemovedReply{}, 0, 0)
	if a.after(tok, proto.OpLookup, &proto.PathReq{Path: "f"}, &proto.AttrReply{Attr: proto.Attr{Ino: 5}}, 0, 0) != 0 {
		t.Error("a lookup that raced an unlink of its name was leased")
	}
	if lookup(a, "f", 0) != true {
		t.Error("the next lookup, with nothing changing, was not leased")
	}
}

// What runs out is forgotten: the table holds nothing of a mount gone for good.
func TestSweepForgetsWhatRanOut(t *testing.T) {
	l := newTestLeases(t)
	r := &recorder{}
	a := &leaseUse{l: l, h: l.bind("a/1", r), own: r}
	lookup(a, "d/f", 9)
	a.leave()
	l.mu.Lock()
	l.sweepLocked(time.Now().Add(2 * time.Minute))
	entries, attrs, inos, holders := len(l.entries), len(l.attrs), len(l.inos), len(l.holders)
	l.mu.Unlock()
	if entries+attrs+inos+holders != 0 {
		t.Errorf("after its lease ran out the table holds %d directories, %d inodes, %d paths, %d holders", entries, attrs, inos, holders)
	}
}

// A create's or unlink's reply leases the directory's attributes it carries to its client
// (which is then told of another's change to them), unless someone else changed the
// directory while it ran: then they are not sent.
func TestDirectoryAttributesOfAChangeAreLeased(t *testing.T) {
	l := newTestLeases(t)
	ra, rb := &recorder{}, &recorder{}
	a := &leaseUse{l: l, h: l.bind("a/1", ra), own: ra}
	b := &leaseUse{l: l, h: l.bind("b/1", rb), own: rb}
	const dirIno = 40
	create := func(u *leaseUse, name string, ino uint64) (*proto.OpenReply, uint8) {
		tok := u.before(proto.OpCreate)
		rep := &proto.OpenReply{Attr: proto.Attr{Ino: ino}, Dir: &proto.Attr{Ino: dirIno}}
		return rep, u.after(tok, proto.OpCreate, &proto.CreateReq{Dir: "d", Name: name}, rep, 0, 0)
	}
	// Racing another's create in d before the table knows d's inode: not leased.
	tok := a.before(proto.OpCreate)
	create(b, "first", 39)
	raced := &proto.OpenReply{Attr: proto.Attr{Ino: 38}, Dir: &proto.Attr{Ino: dirIno}}
	if a.after(tok, proto.OpCreate, &proto.CreateReq{Dir: "d", Name: "second"}, raced, 0, 0); raced.Dir != nil {
		t.Error("a create that raced another's create in d, whose inode the table did not know yet, gave d's attributes")
	}
	ra.take()

	rep, flags := create(a, "f", 41)
	if flags&proto.FlagLease == 0 || rep.Dir == nil {
		t.Fatalf("a's create: flags %#x, directory attributes %v; want them leased", flags, rep.Dir)
	}
	// b's create changes d: a, a holder of d's attributes now, is told.
	create(b, "g", 42)
	told := false
	for _, it := range ra.take() {
		if it.What&proto.InvalAttr != 0 && it.Ino == dirIno {
			told = true
		}
	}
	if !told {
		t.Error("b's create in d did not tell a, which holds d's attributes from its own create")
	}

	// An unlink racing another's create in the directory: its reply gives no attributes.
	tok = a.before(proto.OpUnlink)
	create(b, "h", 43)
	unlinked := &proto.RemovedReply{Dir: &proto.Attr{Ino: dirIno}}
	if flags := a.after(tok, proto.OpUnlink, &proto.EntryReq{Dir: "d", Name: "f"}, unlinked, 0, 0); unlinked.Dir != nil || flags&proto.FlagLease != 0 {
		t.Errorf("an unlink that raced b's create in d gave d's attributes (flags %#x, %v)", flags, unlinked.Dir)
	}
	unlinked = &proto.RemovedReply{Dir: &proto.Attr{Ino: dirIno}}
	tok = a.before(proto.OpUnlink)
	if flags := a.after(tok, proto.OpUnlink, &proto.EntryReq{Dir: "d", Name: "g"}, unlinked, 0, 0); unlinked.Dir == nil || flags&proto.FlagLease == 0 {
		t.Errorf("an unlink with nothing else changing d did not lease its attributes (flags %#x)", flags)
	}
}

// An extended attribute set by a name the table never leased (a hard link made beside the
// server) still tells the holders of the file's attributes: a mount that keeps a file it
// created has no security.capability must hear of one.
func TestXattrByAnotherNameTellsHolders(t *testing.T) {
	dir := t.TempDir()
	open := func() *Local {
		l, err := OpenLocal(LocalOptions{Dir: dir, Tracker: usage.New("xattr", 1<<30), Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Close)
		return l
	}
	a, b := open(), open()
	var mu sync.Mutex
	var told []proto.Inval
	a.SetInvalidator(func(items []proto.Inval) {
		mu.Lock()
		told = append(told, items...)
		mu.Unlock()
	})
	b.SetInvalidator(func([]proto.Inval) {})
	rep, _, errno, flags := a.ExecLeased(proto.OpCreate, 0, 0, &proto.CreateReq{Name: "f", Flags: unix.O_RDWR, Mode: 0o644}, nil)
	if errno != 0 || flags&proto.FlagLease == 0 {
		t.Fatalf("create: %v, flags %#x", errno, flags)
	}
	o := rep.(*proto.OpenReply)
	a.ExecLeased(proto.OpRelease, 0, 0, &proto.HandleReq{Handle: o.Handle}, nil)
	if err := os.Link(filepath.Join(dir, "f"), filepath.Join(dir, "g")); err != nil {
		t.Fatal(err)
	}
	if _, _, errno, _ := b.ExecLeased(proto.OpSetxattr, 0, 0, &proto.XattrReq{Path: "g", Name: "user.x", Value: []byte("1")}, nil); errno != 0 {
		t.Fatalf("setxattr: %v", errno)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, it := range told {
		if it.Ino == o.Attr.Ino && it.What&proto.InvalAttr != 0 {
			return
		}
	}
	t.Errorf("a setxattr through another name told the file's holder %v, want its attributes dropped (inode %d)", told, o.Attr.Ino)
}

// gate is a holder that answers only when released.
type gate struct {
	recorder
	release chan struct{}
}

func (g *gate) invalidate(items []proto.Inval) (<-chan struct{}, bool) {
	g.recorder.invalidate(items)
	return g.release, true
}

// A listing's holder may have removals of the directory's names on their way (the mount's
// unlinks behind): anyone else's lookup, listing or change of a name there recalls the
// listing and waits for the holder's answer before it runs; the holder's own do not, and its
// creates and unlinks there renew it.
func TestListingRecalledBeforeOthersLookIn(t *testing.T) {
	l := newTestLeases(t)
	ga := &gate{release: make(chan struct{})}
	rb := &recorder{}
	a := &leaseUse{l: l, h: l.bind("a/1", ga), own: ga}
	b := &leaseUse{l: l, h: l.bind("b/1", rb), own: rb}
	tok := a.before(proto.OpMkdir)
	a.after(tok, proto.OpMkdir, &proto.MkdirReq{Name: "d"}, &proto.AttrReply{Attr: proto.Attr{Ino: 3}}, 0, 0)
	a.recall(proto.OpLookup, &proto.PathReq{Path: "d/x"}) // its own: nothing to wait for
	tok = a.before(proto.OpUnlink)
	if f := a.after(tok, proto.OpUnlink, &proto.EntryReq{Dir: "d", Name: "x"}, &proto.RemovedReply{}, 0, 0); f&proto.FlagListing == 0 {
		t.Errorf("a's UNLINK in its listed directory has flags %#x, want the listing renewed", f)
	}
	if got := ga.take(); len(got) != 0 {
		t.Fatalf("a was told %v of its own requests", got)
	}
	for _, c := range []struct {
		op proto.Op
		m  proto.Message
	}{
		{proto.OpOpendir, &proto.PathReq{Path: "d"}},
		{proto.OpLookup, &proto.PathReq{Path: "d/x"}},
		{proto.OpCreate, &proto.CreateReq{Dir: "d", Name: "y"}},
		{proto.OpRmdir, &proto.EntryReq{Dir: "", Name: "d"}},
		{proto.OpRename, &proto.RenameReq{Dir: "", Name: "d", NewDir: "", NewName: "e"}},
	} {
		// The listing again, as a fresh MKDIR gives it.
		l.mu.Lock()
		l.listings["d"] = interest{a.h: time.Now().Add(time.Minute)}
		l.listed.Store(1)
		l.mu.Unlock()
		done := make(chan struct{})
		go func() { b.recall(c.op, c.m); close(done) }()
		select {
		case <-done:
			t.Fatalf("b's %s ran before a answered the recall", c.op)
		case <-time.After(50 * time.Millisecond):
		}
		ga.release <- struct{}{} // unblocked: a answered (a send, so each recall takes one)
		<-done
		got := ga.take()
		if len(got) != 1 || got[0].What != proto.InvalListing || got[0].Path != "d" {
			t.Errorf("b's %s: a was told %v, want d's listing", c.op, got)
		}
	}
	// Nobody holds a listing: nothing is recalled, nothing waited for.
	b.recall(proto.OpLookup, &proto.PathReq{Path: "d/x"})
	if got := ga.take(); len(got) != 0 {
		t.Errorf("with no listing held, a was told %v", got)
	}
}

// Before a stage-out reads a namespace's directory itself, every listing of it is recalled
// and its holder's answer waited for (its removals behind landed).
func TestRecallListingsWaitsForTheHolders(t *testing.T) {
	l := newTestLeases(t)
	ga := &gate{release: make(chan struct{})}
	a := &leaseUse{l: l, h: l.bind("a/1", ga), own: ga}
	tok := a.before(proto.OpMkdir)
	a.after(tok, proto.OpMkdir, &proto.MkdirReq{Dir: "out", Name: "d"}, &proto.AttrReply{Attr: proto.Attr{Ino: 3}}, 0, 0)
	done := make(chan struct{})
	go func() { RecallListings(l.dir); close(done) }()
	select {
	case <-done:
		t.Fatal("RecallListings returned before the holder answered")
	case <-time.After(50 * time.Millisecond):
	}
	ga.release <- struct{}{}
	<-done
	if got := ga.take(); len(got) != 1 || got[0].What != proto.InvalListing || got[0].Path != "out/d" {
		t.Errorf("the holder was told %v, want out/d's listing", got)
	}
}
