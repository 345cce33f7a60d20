package server

// Files made ahead (proto.StubVersion): a mount that answers creates before the storage node
// acts (package mount, createbehind.go) must give the kernel each new file's inode number at
// once, so it asks for empty files made ahead in the directory (RESERVE), and later names one
// (PLACE, a CREATE that makes nothing).
//
// A reserved file ("stub") is made as a create by its caller would make it: without a name
// (O_TMPFILE) in the very directory, so that it inherits what the directory gives (a default
// ACL, a set-group-ID directory's group), owned by the caller, with the mode asked; it is
// admitted against the namespace's MFC and write window at once, so that its PLACE is not
// refused for them later, when its creator has had its answer (at most half of what the MFC
// has left is made ahead, and a create the MFC refuses while its session holds files ahead
// takes the admission of one of them: createPastMFC). The session keeps it open
// (counted with its open files, warpfs.max_open_files: an open past that limit drops the
// oldest instead of failing), at most proto.MaxStubs of them: a RESERVE past that drops the
// oldest. A PLACE gives it its layout and its
// name (linkat: only where the name is free) and its times (now), and answers as a CREATE.
//
// Nameless, a stub needs no cleanup: one the session never placed goes with the session's
// descriptors — its close, the agent's exit or crash — and its admission is given back. Only
// placed files were ever visible.

import (
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// reservedStub is a file made ahead for the session, not named yet.
type reservedStub struct {
	fd             int
	dir            inodeKey // the directory it was made in
	uid, gid, mode uint32   // its creator and the mode it was asked for
}

// reserve makes up to r.Count stubs in r.Dir for uid:gid (RESERVE).
func (s *session) reserve(v *volume, r *proto.ReserveReq, uid, gid uint32) (*proto.ReserveReply, syscall.Errno) {
	if v.readOnly {
		return nil, syscall.EROFS
	}
	if !v.striped {
		return nil, syscall.EOPNOTSUPP // a file holding its own data is made by CREATE
	}
	want := min(int(min(r.Count, proto.MaxReserve)), v.acct.reservable())
	s.mu.Lock()
	want = min(want, s.maxOpenFiles-len(s.handles)-len(s.stubs))
	s.mu.Unlock()
	if want <= 0 {
		return nil, syscall.EMFILE
	}
	dirfd, done, errno := v.dirAt(r.Dir)
	if errno != 0 {
		return nil, errno
	}
	defer done()
	var parent unix.Stat_t
	if err := unix.Fstat(dirfd, &parent); err != nil {
		return nil, errnoOf(err)
	}
	if parent.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil, syscall.ENOTDIR
	}
	if errno := v.roomForEntry(); errno != 0 {
		return nil, errno
	}
	rep := &proto.ReserveReply{}
	for len(rep.Inos) < want {
		if errno = v.acct.startCreate(); errno != 0 {
			break
		}
		fd, err := unix.Openat(dirfd, ".", unix.O_RDWR|unix.O_TMPFILE|unix.O_CLOEXEC, r.Mode&0o7777)
		if err != nil {
			v.acct.createDone(false)
			errno = errnoOf(err)
			break
		}
		t := &target{fd: fd, real: true, st: unix.Stat_t{Mode: syscall.S_IFREG}} // own stats it
		v.own(t, &parent, uid, gid, r.Mode)
		if len(rep.Inos) == 0 {
			rep.Attr = toAttr(&t.st)
		}
		s.mu.Lock()
		if s.stubs == nil {
			s.stubs = map[uint64]reservedStub{}
		}
		s.stubs[t.st.Ino] = reservedStub{fd: fd, dir: keyOf(&parent), uid: uid, gid: gid, mode: r.Mode}
		s.stubOrder = append(s.stubOrder, t.st.Ino)
		old := s.oldStubsLocked()
		s.mu.Unlock()
		for _, st := range old {
			v.dropStub(st)
		}
		rep.Inos = append(rep.Inos, t.st.Ino)
	}
	if len(rep.Inos) == 0 {
		return nil, errno
	}
	return rep, 0
}

// oldStubsLocked takes away the session's oldest stubs past proto.MaxStubs, for the caller
// to drop: a client that went on to other directories leaves its earlier ones unused.
func (s *session) oldStubsLocked() []reservedStub {
	var old []reservedStub
	for len(s.stubs) > proto.MaxStubs {
		st, ok := s.oldestStubLocked()
		if !ok {
			break
		}
		old = append(old, st)
	}
	if len(s.stubOrder) > 2*proto.MaxStubs { // mostly placed ones: keep those still here
		kept := make([]uint64, 0, len(s.stubs))
		for _, ino := range s.stubOrder {
			if _, ok := s.stubs[ino]; ok {
				kept = append(kept, ino)
			}
		}
		s.stubOrder = kept
	}
	return old
}

// linkIn gives the nameless file open as fd the name name in directory dirfd (parent its
// state), under the directory's lock, and returns the directory's attributes after it.
func (v *volume) linkIn(fd, dirfd int, parent *unix.Stat_t, name string) (*proto.Attr, error) {
	l := v.lockDirOf(dirfd, parent)
	err := unix.Linkat(fd, "", dirfd, name, unix.AT_EMPTY_PATH)
	return l.unlock(), err
}

// createPastMFC runs a CREATE and, if the namespace's MFC refused it
// while this session holds files made ahead, drops the oldest (giving back its admission)
// and runs it once more: the session's own files ahead never refuse its creates.
func (s *session) createPastMFC(create func() syscall.Errno) {
	if create() != syscall.EMFILE {
		return
	}
	s.mu.Lock()
	old, ok := s.oldestStubLocked()
	s.mu.Unlock()
	if !ok {
		return
	}
	s.v.dropStub(old)
	create()
}

// oldestStubLocked takes the session's oldest file made ahead away from it, for the caller
// to drop (false: it holds none).
func (s *session) oldestStubLocked() (reservedStub, bool) {
	for len(s.stubOrder) > 0 {
		ino := s.stubOrder[0]
		s.stubOrder = s.stubOrder[1:]
		if st, ok := s.stubs[ino]; ok {
			delete(s.stubs, ino)
			return st, true
		}
	}
	return reservedStub{}, false
}

// takeStub takes the session's stub ino away from its reserve (false: it has none).
func (s *session) takeStub(ino uint64) (reservedStub, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.stubs[ino]
	if ok {
		delete(s.stubs, ino)
	}
	return st, ok
}

// dropStub closes a stub never placed and gives its admission back.
func (v *volume) dropStub(st reservedStub) {
	unix.Close(st.fd)
	v.acct.createDone(false)
}

// closeStubs drops the stubs the session never placed (its end).
func (s *session) closeStubs() {
	s.mu.Lock()
	stubs := s.stubs
	s.stubs, s.stubOrder = nil, nil
	s.mu.Unlock()
	for _, st := range stubs {
		s.v.dropStub(st)
	}
}

// place names the session's stub r.Stub r.Name in r.Dir (PLACE): a CREATE with O_EXCL that
// opens nothing — the reply's handle is 0, and its client opens the file when it first needs
// a handle of the metadata server (a write, fsync, truncate), by name, as after an open it
// made without asking (package mount, openLazily). A file created and closed unwritten (most
// of mdtest's, marker files) then costs no open and no RELEASE here. With r.Writer (its
// creator wrote before the PLACE left) it opens the file for writing, as a CREATE does: a
// handle past the session's open files leaves the reply's 0. ESTALE: the session has no
// such stub (it was reserved on an earlier connection); the caller creates the file anew.
func (s *session) place(v *volume, r *proto.PlaceReq, uid, gid uint32) (*proto.OpenReply, *proto.Attr, syscall.Errno) {
	if v.readOnly {
		return nil, nil, syscall.EROFS
	}
	if errno := nameErrno(r.Name); errno != 0 {
		return nil, nil, errno
	}
	if r.Flags&unix.O_ACCMODE == unix.O_ACCMODE {
		return nil, nil, syscall.EINVAL
	}
	dirfd, done, errno := v.dirAt(r.Dir)
	if errno != 0 {
		return nil, nil, errno
	}
	defer done()
	// A file whose data came with it: its layout and its data first, so that a refusal (no
	// room) leaves the stub to the session, for a PLACE without the data.
	var whole stripe.Layout
	if len(r.Data) > 0 {
		if whole, errno = s.wholeLayout(v, dirfd, r); errno != 0 {
			return nil, nil, errno
		}
		if errno := s.writeWhole(whole, r.Data); errno != 0 {
			return nil, nil, errno
		}
	}
	st, ok := s.takeStub(r.Stub)
	if !ok {
		s.dropWhole(whole)
		return nil, nil, syscall.ESTALE
	}
	kept := false // the stub's descriptor became a handle's
	defer func() {
		if !kept {
			unix.Close(st.fd)
		}
	}()
	placed := false
	defer func() {
		if !placed {
			v.acct.createDone(false)
			s.dropWhole(whole)
		}
	}()
	if st.uid != uid || st.gid != gid || st.mode != r.Mode {
		return nil, nil, syscall.EINVAL // another's, or made for another mode
	}
	var parent unix.Stat_t
	if err := unix.Fstat(dirfd, &parent); err != nil {
		return nil, nil, errnoOf(err)
	}
	if keyOf(&parent) != st.dir {
		return nil, nil, syscall.EXDEV // made in another directory: its inheritance is that one's
	}
	// Opened for its creator's write (its first write came before the PLACE), as a CREATE
	// does: the record of its objects unknown until that writer closes. Otherwise not open
	// for writing here: its record says it has no objects, until a writer opens it. A whole
	// file's record names the one object its data went to, written before the file has a
	// name: an agent stopped between the two leaves an object no file names, never a file
	// without its data.
	writer := r.Writer && writes(r.Flags) && len(r.Data) == 0
	var layout stripe.Layout
	if len(r.Data) > 0 {
		layout = whole
		on := make([]byte, r.DataServer/8+1)
		on[r.DataServer/8] = 1 << (r.DataServer % 8)
		errno = writeStub(st.fd, layout, objectsRecord(on, true))
		v.acct.sizeReported(layout.Length)
	} else {
		rec := recordFor(0)
		if writer {
			rec = nil
		}
		layout, _, errno = v.layoutFor(st.fd, dirfd, rec)
	}
	if errno != 0 {
		return nil, nil, errno
	}
	// Its times are its creation's, as the caller was told (now), not its reservation's.
	futimensNow(st.fd)
	dir, err := v.linkIn(st.fd, dirfd, &parent, r.Name)
	if err != nil {
		return nil, nil, errnoOf(err) // EEXIST: the name is taken
	}
	placed = true
	v.acct.createDone(true)
	var fst unix.Stat_t
	if err := unix.Fstat(st.fd, &fst); err != nil {
		return nil, nil, errnoOf(err)
	}
	v.tracker.Charge(usage.Footprint(&fst)) // its layout's attribute, if it takes a block
	a := toAttr(&fst)
	a.Size, a.Blocks = layout.Length, (layout.Length+511)/512 // stubAttr's, without reading it back
	rep := &proto.OpenReply{Attr: a, Layout: layout.Encode()}
	if writer {
		kept = true
		hd, a, errno := v.finishOpenStat(st.fd, &fst, r.Flags, false, nil, 0, 0, 0, &layout)
		if errno != 0 {
			return rep, dir, 0 // placed: its first write opens it
		}
		if id, errno := s.add(hd); errno == 0 {
			rep.Handle, rep.Attr = id, a
		}
	}
	return rep, dir, 0
}

// wholeLayout is the layout of a file placed with its data (PlaceReq.Data): the directory's,
// starting at the server that keeps the data, r.DataServer, this one. EOPNOTSUPP where it
// cannot be: the directory fixes where its files start, the data does not fit in one stripe
// (or the session has no stripes here: writeWhole).
func (s *session) wholeLayout(v *volume, dirfd int, r *proto.PlaceReq) (stripe.Layout, syscall.Errno) {
	if !v.striped {
		return stripe.Layout{}, syscall.EOPNOTSUPP
	}
	dir, ok := readLayout(dirfd)
	if !ok {
		dir = v.rootLayout
	}
	if dir.ID == stripe.FixedStart || uint64(len(r.Data)) > dir.Size || r.DataServer >= dir.Servers {
		return stripe.Layout{}, syscall.EOPNOTSUPP
	}
	l := dir.ForFile(newFileID())
	l.Start, l.Length = r.DataServer, uint64(len(r.Data))
	return l, 0
}

// writeWhole writes a whole file's data into its new object on this node's stripes, as a
// WRITE_NAME from the client would (volume.writeObject).
func (s *session) writeWhole(l stripe.Layout, data []byte) syscall.Errno {
	ov, errno := s.localObjects()
	if errno != 0 {
		return errno
	}
	n, errno := ov.writeObject(stripe.ObjectName(l.ID), 0, data, 0, 0, unix.O_EXCL)
	if errno == 0 && n < len(data) {
		errno = syscall.ENOSPC // written short only when the share is full
	}
	if errno != 0 {
		s.dropWhole(l)
	}
	return errno
}

// dropWhole removes the object writeWhole made for a file that was not placed after all.
func (s *session) dropWhole(l stripe.Layout) {
	if l.ID != 0 {
		s.unlinkLocalObject(l.ID)
	}
}

// removeLocalObject removes the object of a file just unlinked (rep) that this node holds
// as stripe server local, if the record says it is there, and leaves it out of the record
// the client gets: a file placed whole is then removed in one request. An object this node
// did not remove (none there) stays in the record, for the client to.
func (s *session) removeLocalObject(rep *proto.RemovedReply, local uint32) {
	if !rep.ObjectsKnown || s.openObjects == nil || int(local/8) >= len(rep.Objects) || rep.Objects[local/8]&(1<<(local%8)) == 0 {
		return
	}
	l, err := stripe.Decode(rep.Layout)
	if err != nil || local >= l.Servers {
		return
	}
	if s.unlinkLocalObject(l.ID) != 0 {
		return // not here after all (ENOENT: the client named another server's): the client's to remove
	}
	objects := slices.Clone(rep.Objects)
	objects[local/8] &^= 1 << (local % 8)
	rep.Objects = objects
}

// unlinkLocalObject removes the object of file id from this node's stripes.
func (s *session) unlinkLocalObject(id uint64) syscall.Errno {
	ov, errno := s.localObjects()
	if errno != 0 {
		return errno
	}
	_, errno = ov.unlink(&proto.EntryReq{Name: stripe.ObjectName(id)}, false)
	return errno
}

// localObjects is this node's stripes of the session's instance, opened at its first whole
// PLACE and kept until the session ends (closeObjects). EOPNOTSUPP: the session has none.
func (s *session) localObjects() (*volume, syscall.Errno) {
	if s.openObjects == nil {
		return nil, syscall.EOPNOTSUPP
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.objects == nil {
		ov, err := s.openObjects()
		if err != nil {
			s.log.Warn("warpfs: this node's stripes cannot be opened for files placed whole", "client", s.client, "err", err)
			return nil, syscall.EOPNOTSUPP
		}
		s.objects = ov
	}
	return s.objects, 0
}

// closeObjects closes what localObjects opened.
func (s *session) closeObjects() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.objects != nil {
		s.objects.close()
		s.objects = nil
	}
}

// futimensNow sets the times of the file open as fd to now: futimens(2), which x/sys/unix
// has no call for (its Futimes goes through /proc/self/fd: a path walk, as dear as the link).
func futimensNow(fd int) {
	unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, 0, 0, 0, 0) // no path, no times: now
}
