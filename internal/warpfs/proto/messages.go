package proto

// The bodies of every operation. Paths are relative to the namespace root, "" being the root
// itself, components separated by "/" (the server refuses "", ".", ".." components and
// anything that would leave the namespace). Handles are the server's, valid on the connection
// that opened them.

import (
	"fmt"
	"time"
)

// Timespec is a time with nanoseconds.
type Timespec struct {
	Sec  int64
	Nsec uint32
}

func (t *Timespec) Encode(e *Enc) { e.I64(t.Sec); e.U32(t.Nsec) }
func (t *Timespec) Decode(d *Dec) { t.Sec = d.I64(); t.Nsec = d.U32() }

// Attr is a file's attributes, as stat(2) gives them on the storage node.
type Attr struct {
	Ino, Size, Blocks                    uint64
	Atime, Mtime, Ctime                  Timespec
	Mode, Nlink, UID, GID, Rdev, Blksize uint32
}

func (a *Attr) Encode(e *Enc) {
	e.U64(a.Ino)
	e.U64(a.Size)
	e.U64(a.Blocks)
	a.Atime.Encode(e)
	a.Mtime.Encode(e)
	a.Ctime.Encode(e)
	e.U32(a.Mode)
	e.U32(a.Nlink)
	e.U32(a.UID)
	e.U32(a.GID)
	e.U32(a.Rdev)
	e.U32(a.Blksize)
}

func (a *Attr) Decode(d *Dec) {
	a.Ino, a.Size, a.Blocks = d.U64(), d.U64(), d.U64()
	a.Atime.Decode(d)
	a.Mtime.Decode(d)
	a.Ctime.Decode(d)
	a.Mode, a.Nlink, a.UID, a.GID, a.Rdev, a.Blksize = d.U32(), d.U32(), d.U32(), d.U32(), d.U32(), d.U32()
}

// Empty is a body with nothing in it.
type Empty struct{}

func (*Empty) Encode(*Enc) {}
func (*Empty) Decode(*Dec) {}

// Hello opens a connection.
type Hello struct {
	Magic                  uint32
	MinVersion, MaxVersion uint16
	Nonce                  [ClientNonceSize]byte
}

func (m *Hello) Encode(e *Enc) {
	e.U32(m.Magic)
	e.U16(m.MinVersion)
	e.U16(m.MaxVersion)
	e.Raw(m.Nonce[:])
}
func (m *Hello) Decode(d *Dec) {
	m.Magic, m.MinVersion, m.MaxVersion = d.U32(), d.U16(), d.U16()
	copy(m.Nonce[:], d.Raw(ClientNonceSize))
}

// Challenge is the server's answer to HELLO.
type Challenge struct {
	Version uint16
	Nonce   [ServerNonceSize]byte
}

func (m *Challenge) Encode(e *Enc) { e.U16(m.Version); e.Raw(m.Nonce[:]) }
func (m *Challenge) Decode(d *Dec) { m.Version = d.U16(); copy(m.Nonce[:], d.Raw(ServerNonceSize)) }

// Auth proves the token and names the namespace: a fragment's namespace on the server's
// node, and the instance it belongs to (the server checks they agree).
type Auth struct {
	Proof       [32]byte
	Client      string // the client node's name, for the server's logs
	Fragment    int64
	Namespace   int64
	Instance    int64
	ReadOnly    bool   // every change fails with EROFS
	MaxFileSize uint64 // DataWarp's MFS; 0 = no limit
	// Capability is the controller's grant of this mount (package nodekey), whose session key
	// the proofs use; "" when the proofs use the cluster's shared secret.
	Capability string
	// Stripes asks for the fragment's stripe objects (the data of a striped instance's files)
	// instead of a namespace; Namespace is then 0.
	Stripes bool
	// Incarnation names the client's mount across its reconnections (LeaseVersion on; 0:
	// none): the server hands a reconnected mount the leases its kernel still holds, and
	// tells it of their changes, rather than waiting them out.
	Incarnation uint64
}

func (m *Auth) Encode(e *Enc) {
	e.Raw(m.Proof[:])
	e.Str(m.Client)
	e.I64(m.Fragment)
	e.I64(m.Namespace)
	e.I64(m.Instance)
	e.Bool(m.ReadOnly)
	e.U64(m.MaxFileSize)
	e.Str(m.Capability)
	e.Bool(m.Stripes)
	if m.Incarnation != 0 { // LeaseVersion on only: older servers take no more
		e.U64(m.Incarnation)
	}
}

func (m *Auth) Decode(d *Dec) {
	copy(m.Proof[:], d.Raw(32))
	m.Client = d.Str(MaxName)
	m.Fragment, m.Namespace, m.Instance = d.I64(), d.I64(), d.I64()
	m.ReadOnly = d.Bool()
	m.MaxFileSize = d.U64()
	m.Capability = d.Str(MaxCapability)
	m.Stripes = d.Bool()
	if d.err == nil && len(d.B) > 0 {
		m.Incarnation = d.U64()
	}
}

// MaxCapability bounds a capability's text.
const MaxCapability = 1024

// Welcome accepts AUTH. A refusal is a failed reply whose body is a Refusal.
type Welcome struct {
	Proof [32]byte
	MaxIO uint32 // the largest READ or WRITE the server takes
	Root  Attr   // the namespace root
	// LeaseMillis is how long the client may cache what a reply with FlagLease says,
	// counted from when it sent the request (LeaseVersion on; absent before: 0, no leases).
	LeaseMillis uint32
}

func (m *Welcome) Encode(e *Enc) {
	e.Raw(m.Proof[:])
	e.U32(m.MaxIO)
	m.Root.Encode(e)
	if m.LeaseMillis > 0 { // only on connections of LeaseVersion on: older clients take no more
		e.U32(m.LeaseMillis)
	}
}

func (m *Welcome) Decode(d *Dec) {
	copy(m.Proof[:], d.Raw(32))
	m.MaxIO = d.U32()
	m.Root.Decode(d)
	if d.err == nil && len(d.B) > 0 {
		m.LeaseMillis = d.U32()
	}
}

// Inval is one thing a client may have cached that a change made stale.
type Inval struct {
	What uint8  // InvalEntry, InvalAttr, InvalData (bits)
	Ino  uint64 // InvalAttr, InvalData: the inode
	Path string // InvalEntry: the entry's path in the namespace, as the client named it
}

// What an Inval drops.
const (
	InvalEntry uint8 = 1 << iota // the name at Path (found or not)
	InvalAttr                    // Ino's attributes
	InvalData                    // Ino's cached data
	// InvalListing: the directory at Path may have names the client did not make (it held
	// them all, FlagListing).
	InvalListing
)

// MaxInvals bounds the items of one notification.
const MaxInvals = 1024

// MaxNotifyWait bounds how long a notification waits for the kernel to drop a name before
// it is answered. Dropping a name takes its directory's lock, which this node may hold for
// a change of its own in that directory, whose reply may wait on the server for another
// node's answer to a notification of the same kind: two nodes changing one directory at once
// would wait for each other until their leases ran out. Past the bound the answer goes, and
// the name is dropped as soon as this node's own change ends: in that window a process of
// this node that finds the name in its kernel's cache may see it as it was (docs/mounts.md).
// It is the clients' rule (package client, and an in-process mount); it lives here, beside
// the notification, so that both share it.
const MaxNotifyWait = 100 * time.Millisecond

// DropWithin runs drop(items) and returns when it has, or after MaxNotifyWait, leaving it to
// finish on its own.
func DropWithin(drop func([]Inval), items []Inval) {
	done := make(chan struct{})
	go func() {
		drop(items)
		close(done)
	}()
	t := time.NewTimer(MaxNotifyWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// InvalReq is an OpInval notification: what the client must drop before it replies.
type InvalReq struct{ Items []Inval }

func (m *InvalReq) Encode(e *Enc) {
	e.U32(uint32(len(m.Items)))
	for _, it := range m.Items {
		e.U8(it.What)
		e.U64(it.Ino)
		e.Str(it.Path)
	}
}

func (m *InvalReq) Decode(d *Dec) {
	n := d.U32()
	if n > MaxInvals {
		d.fail(fmt.Sprintf("%d invalidations, the limit is %d", n, MaxInvals))
		return
	}
	m.Items = make([]Inval, 0, n)
	for i := uint32(0); i < n && d.err == nil; i++ {
		m.Items = append(m.Items, Inval{What: d.U8(), Ino: d.U64(), Path: d.Str(MaxPath)})
	}
}

// Refusal says why the handshake failed.
type Refusal struct{ Message string }

func (m *Refusal) Encode(e *Enc) { e.Str(m.Message) }
func (m *Refusal) Decode(d *Dec) { m.Message = d.Str(4096) }

// PathReq names a node by path (LOOKUP, READLINK, OPENDIR).
type PathReq struct{ Path string }

func (m *PathReq) Encode(e *Enc) { e.Str(m.Path) }
func (m *PathReq) Decode(d *Dec) { m.Path = d.Str(MaxPath) }

// NodeReq names a node by an open handle, or by path when Handle is 0 (GETATTR).
type NodeReq struct {
	Path   string
	Handle uint64
}

func (m *NodeReq) Encode(e *Enc) { e.Str(m.Path); e.U64(m.Handle) }
func (m *NodeReq) Decode(d *Dec) { m.Path = d.Str(MaxPath); m.Handle = d.U64() }

// Setattr validity bits (the FUSE ones).
const (
	SetMode        = 1 << 0
	SetUID         = 1 << 1
	SetGID         = 1 << 2
	SetSize        = 1 << 3
	SetAtime       = 1 << 4
	SetMtime       = 1 << 5
	SetAtimeNow    = 1 << 7
	SetMtimeNow    = 1 << 8
	SetKillSUIDGID = 1 << 11
	// SetSizeAtLeast grows a striped file's logical size to Size, never shrinking it: what a
	// writer reports after writing, so that two writers' reports cannot undo each other.
	SetSizeAtLeast = 1 << 30
	// SetSync, on a request naming a node by its handle, makes the server sync the node
	// (fsync) once the change is made: a striped file's size report and the metadata
	// server's part of fsync(2) in one round trip. Servers honour it from SyncVersion on;
	// a client sends it on connections of that version only (client.Call.MinVersion).
	SetSync = 1 << 29
)

// SetattrReq changes what Valid says of a node (by handle, or path when Handle is 0).
type SetattrReq struct {
	Path         string
	Handle       uint64
	Valid        uint32
	Mode         uint32
	UID, GID     uint32
	Size         uint64
	Atime, Mtime Timespec
	// Release (PlacedWriterVersion on), on a request naming a handle, releases the handle
	// once the change is made, as a RELEASE with Objects would (HandleReq): a striped file's
	// writer's size report at close and the release after it in one request. The handle
	// stays open if the change fails.
	Release bool
	Objects []byte
}

func (m *SetattrReq) Encode(e *Enc) {
	e.Str(m.Path)
	e.U64(m.Handle)
	e.U32(m.Valid)
	e.U32(m.Mode)
	e.U32(m.UID)
	e.U32(m.GID)
	e.U64(m.Size)
	m.Atime.Encode(e)
	m.Mtime.Encode(e)
	if m.Release { // a trailing field: sent only to servers of PlacedWriterVersion on
		e.Bytes(m.Objects)
	}
}

func (m *SetattrReq) Decode(d *Dec) {
	m.Path = d.Str(MaxPath)
	m.Handle, m.Valid, m.Mode, m.UID, m.GID, m.Size = d.U64(), d.U32(), d.U32(), d.U32(), d.U32(), d.U64()
	m.Atime.Decode(d)
	m.Mtime.Decode(d)
	if len(d.B) > 0 {
		m.Release = true
		m.Objects = d.Bytes(MaxObjects)
	}
}

// AttrReply carries a node's attributes.
type AttrReply struct {
	Attr Attr
	// Dir, in the reply to MKDIR, MKNOD, SYMLINK or LINK (DirAttrVersion on), is the
	// directory's attributes after the change, leased with the reply's FlagLease (as
	// OpenReply.Dir); nil otherwise, and then not sent.
	Dir *Attr
}

func (m *AttrReply) Encode(e *Enc) { m.Attr.Encode(e); encodeDirAttr(e, m.Dir) }
func (m *AttrReply) Decode(d *Dec) { m.Attr.Decode(d); m.Dir = decodeDirAttr(d) }

// OpenReq opens an existing file with open(2) flags.
type OpenReq struct {
	Path  string
	Flags uint32
	// Cache, on the open of a stripe object of a cache instance's file, is the PFS file the
	// object caches (the namespace server's OpenReply.Cache); nil otherwise, and then not
	// sent.
	Cache *CacheRef
}

func (m *OpenReq) Encode(e *Enc) { e.Str(m.Path); e.U32(m.Flags); m.Cache.encode(e) }
func (m *OpenReq) Decode(d *Dec) {
	m.Path = d.Str(MaxPath)
	m.Flags = d.U32()
	m.Cache = decodeCacheRef(d)
}

// OpenReply is an open file: its handle and attributes.
type OpenReply struct {
	Handle uint64
	Attr   Attr
	// Layout is the file's stripe layout (package stripe's encoding) when its data lives in
	// stripe objects on the instance's servers; empty when the data is in the file itself.
	Layout []byte
	// Truncated says the open (O_TRUNC) emptied an existing striped file: its objects must be
	// truncated too. For a cache instance's file (Cache set) the server has not truncated
	// the PFS file yet: the client truncates the objects, then the file (a SETATTR of size 0
	// through the handle), so that no stripe server writes the old data back after.
	Truncated bool
	// Cache, for a regular file of a cache instance's namespace, is the PFS file it is: the
	// client passes it on in the opens of the file's stripe objects. nil otherwise, and then
	// not sent.
	Cache *CacheRef
	// Dir, in a CREATE's reply (DirAttrVersion on), is the directory's attributes after the
	// create, leased to the client with the reply's FlagLease; nil when not leased, and then
	// not sent.
	Dir *Attr
}

func (m *OpenReply) Encode(e *Enc) {
	e.U64(m.Handle)
	m.Attr.Encode(e)
	e.Bytes(m.Layout)
	e.Bool(m.Truncated)
	m.Cache.encode(e)
	encodeDirAttr(e, m.Dir)
}
func (m *OpenReply) Decode(d *Dec) {
	m.Handle = d.U64()
	m.Attr.Decode(d)
	m.Layout = d.Bytes(MaxLayout)
	m.Truncated = d.Bool()
	if !atDirAttr(d) {
		m.Cache = decodeCacheRef(d)
	}
	m.Dir = decodeDirAttr(d)
}

// dirAttrTag opens the trailing directory attributes of OpenReply and RemovedReply, telling
// them from a CacheRef (version 1 or 2) and RemovedReply's objectsTag.
const dirAttrTag = 0x81

func encodeDirAttr(e *Enc, a *Attr) {
	if a != nil {
		e.U8(dirAttrTag)
		a.Encode(e)
	}
}

func atDirAttr(d *Dec) bool { return d.err == nil && len(d.B) > 0 && d.B[0] == dirAttrTag }

func decodeDirAttr(d *Dec) *Attr {
	if !atDirAttr(d) {
		return nil
	}
	d.U8()
	a := &Attr{}
	a.Decode(d)
	return a
}

// CacheRef names a regular file of a cache instance's PFS directory: its path in that
// directory (the namespace's path) and its identity there, (st_dev, st_ino) as the namespace
// server's lstat found it. A stripe server opens the PFS file by Path and refuses it
// (ESTALE) when it is no longer that file.
//
// Policy is the file's cache policy overrides as the namespace server keeps them (set through
// libdatawarp): the stripe servers apply them at every open of the file's objects.
type CacheRef struct {
	Path     string
	Dev, Ino uint64
	Policy   CachePolicy
}

// CachePolicy is a cache file's policy overrides (cache.Override): Set says which fields
// are set; the others are the instance's defaults. Gen orders the settings of a file (the
// namespace server's clock when it was set; 0: never set): a stripe server keeps the newest
// it heard of, so that an open carrying an older one (made before a setting) does not undo it.
type CachePolicy struct {
	Set                          uint8
	ModifiedThreshold, ReadAhead uint64
	SyncOnClose, SyncToPFS       bool
	Gen                          uint64
}

// CachePolicy.Set's bits.
const (
	PolicyModifiedThreshold = 1 << iota
	PolicyReadAhead
	PolicySyncOnClose
	PolicySyncToPFS
)

// encode appends the optional trailing CacheRef field: nothing when r is nil, so a message
// without one is byte for byte what peers of before send and take; version 1 without a
// policy, version 2 with one.
func (r *CacheRef) encode(e *Enc) {
	if r == nil {
		return
	}
	if r.Policy.Gen == 0 {
		e.U8(1) // the field's version
	} else {
		e.U8(2)
	}
	e.Str(r.Path)
	e.U64(r.Dev)
	e.U64(r.Ino)
	if p := r.Policy; p.Gen != 0 {
		e.U8(p.Set)
		e.U64(p.ModifiedThreshold)
		e.U64(p.ReadAhead)
		e.Bool(p.SyncOnClose)
		e.Bool(p.SyncToPFS)
		e.U64(p.Gen)
	}
}

// decodeCacheRef reads the optional trailing CacheRef field, if the body has more.
func decodeCacheRef(d *Dec) *CacheRef {
	if d.err != nil || len(d.B) == 0 {
		return nil
	}
	v := d.U8()
	if v != 1 && v != 2 {
		d.fail(fmt.Sprintf("cache reference of version %d", v))
		return nil
	}
	r := &CacheRef{Path: d.Str(MaxPath)}
	r.Dev, r.Ino = d.U64(), d.U64()
	if v == 2 {
		p := &r.Policy
		p.Set = d.U8()
		p.ModifiedThreshold, p.ReadAhead = d.U64(), d.U64()
		p.SyncOnClose, p.SyncToPFS = d.Bool(), d.Bool()
		p.Gen = d.U64()
	}
	return r
}

// MaxLayout bounds an encoded stripe layout.
const MaxLayout = 256

// RemovedReply answers UNLINK and RENAME: the stripe layout of the file whose last name the
// request removed (the unlinked file, or the file a rename replaced), so that the client can
// remove its stripe objects; empty if no striped file lost its last name.
type RemovedReply struct {
	Layout []byte
	// Cache, when the file is a cache instance's, is the PFS file that went (optional, as
	// OpenReply's): the client passes it on in the UNLINKs of the file's objects.
	Cache *CacheRef
	// ObjectsKnown says Objects is known (ObjectsVersion on): the servers that may hold the
	// removed file's objects, a bit per server in layout order (bit s of byte s/8), none if
	// it never had data. Unknown (a writer has it open, or one never said), the client
	// removes the objects on every server of the layout.
	ObjectsKnown bool
	Objects      []byte
	// Dir, in an UNLINK's reply (DirAttrVersion on), is the directory's attributes after the
	// unlink, leased to the client when the reply has FlagLease; nil otherwise, and then not
	// sent.
	Dir *Attr
}

// MaxObjects bounds a set of servers (a bit per server, stripe.MaxServers of them).
const MaxObjects = 128

// objectsTag opens RemovedReply's trailing Objects field, telling it from a CacheRef (whose
// first byte is its version, 1 or 2): a striped scratch file has one, a cache file the other.
const objectsTag = 0x80

func (m *RemovedReply) Encode(e *Enc) {
	e.Bytes(m.Layout)
	switch { // trailing fields: older clients never get either (ObjectsVersion, cache peers)
	case m.ObjectsKnown:
		e.U8(objectsTag)
		e.Bytes(m.Objects)
	case m.Cache != nil:
		m.Cache.encode(e)
	}
	encodeDirAttr(e, m.Dir)
}

func (m *RemovedReply) Decode(d *Dec) {
	m.Layout = d.Bytes(MaxLayout)
	if d.err != nil || len(d.B) == 0 {
		return
	}
	switch d.B[0] {
	case objectsTag:
		d.U8()
		m.ObjectsKnown = true
		m.Objects = d.Bytes(MaxObjects)
	case dirAttrTag:
	default:
		m.Cache = decodeCacheRef(d)
	}
	m.Dir = decodeDirAttr(d)
}

// CreateReq creates and opens a file Name in directory Dir (CREATE), or an unnamed file in
// Dir (TMPFILE, Name ""), owned by the caller.
type CreateReq struct {
	Dir, Name   string
	Flags, Mode uint32
	// Cache, on the writable open of a stripe object of a cache instance's file, is the PFS
	// file (as OpenReq's).
	Cache *CacheRef
}

func (m *CreateReq) Encode(e *Enc) {
	e.Str(m.Dir)
	e.Str(m.Name)
	e.U32(m.Flags)
	e.U32(m.Mode)
	m.Cache.encode(e)
}
func (m *CreateReq) Decode(d *Dec) {
	m.Dir, m.Name = d.Str(MaxPath), d.Str(MaxName)
	m.Flags, m.Mode = d.U32(), d.U32()
	m.Cache = decodeCacheRef(d)
}

// ReserveReq asks for Count (at most MaxReserve) empty files made ahead in directory Dir
// (RESERVE), as the caller's create there with Mode would make them.
type ReserveReq struct {
	Dir         string
	Mode, Count uint32
}

func (m *ReserveReq) Encode(e *Enc) { e.Str(m.Dir); e.U32(m.Mode); e.U32(m.Count) }
func (m *ReserveReq) Decode(d *Dec) {
	m.Dir = d.Str(MaxPath)
	m.Mode, m.Count = d.U32(), d.U32()
}

// ReserveReply lists the inode numbers of the files a RESERVE made (perhaps fewer than
// asked, never none), all alike: Attr is the first one's (its mode, owner and group).
type ReserveReply struct {
	Attr Attr
	Inos []uint64
}

func (m *ReserveReply) Encode(e *Enc) {
	m.Attr.Encode(e)
	e.U32(uint32(len(m.Inos)))
	for _, ino := range m.Inos {
		e.U64(ino)
	}
}
func (m *ReserveReply) Decode(d *Dec) {
	m.Attr.Decode(d)
	n := d.U32()
	if n > MaxReserve {
		d.fail("reserved files")
		return
	}
	m.Inos = make([]uint64, 0, n)
	for i := uint32(0); i < n && d.Err() == nil; i++ {
		m.Inos = append(m.Inos, d.U64())
	}
}

// PlaceReq creates file Name in Dir (PLACE) from the reserved file Stub (its inode number):
// as a CREATE with O_EXCL, Flags the open's, Mode the one the RESERVE was asked.
//
// Writer (PlacedWriterVersion on) opens the file for its creator's writes, as a CREATE
// does (OpenReply.Handle): a mount whose create went behind and whose first write came
// before its PLACE left then needs no OPEN. A PLACE carries no CacheRef (cache namespaces
// take none).
//
// Data (InlinePlaceVersion on), when not empty, is the whole file, written and closed by its
// creator before the PLACE left: the server keeps it in the file's object on its own stripe
// server, DataServer (its index among the instance's servers, which the file's layout then
// starts at), and places the file closed, its size len(Data) — a small file is one request.
// A server that cannot (the directory fixes its files' start, its stripe is smaller than
// Data, it holds no stripes of the instance) answers EOPNOTSUPP having done nothing: the stub
// is still the session's, for a PLACE without Data. Data is the rest of the body.
type PlaceReq struct {
	Stub uint64
	CreateReq
	Writer     bool
	DataServer uint32
	Data       []byte
}

func (m *PlaceReq) Encode(e *Enc) {
	e.U64(m.Stub)
	e.Str(m.Dir)
	e.Str(m.Name)
	e.U32(m.Flags)
	e.U32(m.Mode)
	if m.Writer || len(m.Data) > 0 { // trailing fields: sent only to servers of PlacedWriterVersion on
		e.Bool(m.Writer)
	}
	if len(m.Data) > 0 { // and these to servers of InlinePlaceVersion on
		e.U32(m.DataServer)
		e.Raw(m.Data)
	}
}
func (m *PlaceReq) Decode(d *Dec) {
	m.Stub = d.U64()
	m.Dir, m.Name = d.Str(MaxPath), d.Str(MaxName)
	m.Flags, m.Mode = d.U32(), d.U32()
	if len(d.B) > 0 {
		m.Writer = d.U8() == 1
	}
	if len(d.B) > 0 {
		m.DataServer = d.U32()
		m.Data = d.Rest()
	}
}

// MkdirReq creates a directory (MKDIR) or a special file (MKNOD, with Rdev).
type MkdirReq struct {
	Dir, Name  string
	Mode, Rdev uint32
}

func (m *MkdirReq) Encode(e *Enc) { e.Str(m.Dir); e.Str(m.Name); e.U32(m.Mode); e.U32(m.Rdev) }
func (m *MkdirReq) Decode(d *Dec) {
	m.Dir, m.Name = d.Str(MaxPath), d.Str(MaxName)
	m.Mode, m.Rdev = d.U32(), d.U32()
}

// SymlinkReq creates a symbolic link Name in Dir pointing to Target.
type SymlinkReq struct{ Dir, Name, Target string }

func (m *SymlinkReq) Encode(e *Enc) { e.Str(m.Dir); e.Str(m.Name); e.Str(m.Target) }
func (m *SymlinkReq) Decode(d *Dec) {
	m.Dir, m.Name, m.Target = d.Str(MaxPath), d.Str(MaxName), d.Str(MaxPath)
}

// LinkReq makes Dir/Name a hard link to the file at Path.
type LinkReq struct{ Path, Dir, Name string }

func (m *LinkReq) Encode(e *Enc) { e.Str(m.Path); e.Str(m.Dir); e.Str(m.Name) }
func (m *LinkReq) Decode(d *Dec) {
	m.Path, m.Dir, m.Name = d.Str(MaxPath), d.Str(MaxPath), d.Str(MaxName)
}

// EntryReq names a directory entry (UNLINK, RMDIR).
type EntryReq struct {
	Dir, Name string
	// Cache, on the UNLINK of a stripe object of a cache instance's file, is the PFS file
	// that went (RemovedReply.Cache).
	Cache *CacheRef
	// Local (InlinePlaceVersion on; never with Cache), on the UNLINK of a striped file that
	// is not open on the client, is 1 + the metadata server's own index among the instance's
	// stripe servers: the server removes the file's object it holds there itself, and
	// leaves it out of RemovedReply.Objects (a file placed whole has no other). 0: none.
	Local uint32
}

func (m *EntryReq) Encode(e *Enc) {
	e.Str(m.Dir)
	e.Str(m.Name)
	if m.Local > 0 { // a trailing field: a tag, as RemovedReply's Objects, told from a CacheRef
		e.U8(objectsTag)
		e.U32(m.Local)
		return
	}
	m.Cache.encode(e)
}
func (m *EntryReq) Decode(d *Dec) {
	m.Dir, m.Name = d.Str(MaxPath), d.Str(MaxName)
	if len(d.B) > 0 && d.B[0] == objectsTag {
		d.U8()
		m.Local = d.U32()
		return
	}
	m.Cache = decodeCacheRef(d)
}

// RenameReq renames Dir/Name to NewDir/NewName with renameat2(2) flags.
type RenameReq struct {
	Dir, Name, NewDir, NewName string
	Flags                      uint32
}

func (m *RenameReq) Encode(e *Enc) {
	e.Str(m.Dir)
	e.Str(m.Name)
	e.Str(m.NewDir)
	e.Str(m.NewName)
	e.U32(m.Flags)
}

func (m *RenameReq) Decode(d *Dec) {
	m.Dir, m.Name, m.NewDir, m.NewName = d.Str(MaxPath), d.Str(MaxName), d.Str(MaxPath), d.Str(MaxName)
	m.Flags = d.U32()
}

// AdoptReq gives an entry of another shard of a sharded namespace (max_mds) the name
// Dir/Name on this one: the second half of a rename between shards (the client removes the
// old name after). The entry is made whole under a temporary name — a striped file's stub with
// Layout (the same objects: the data does not move), a symbolic link to Target, or a FIFO or
// socket — given Mode, owner and times, then renamed to Name with renameat2 Flags
// (RENAME_NOREPLACE only), replacing what was there as RENAME does.
type AdoptReq struct {
	Dir, Name, Target string
	Layout            []byte
	Mode, UID, GID    uint32
	Flags             uint32
	Atime, Mtime      Timespec
	Rdev              uint32 // a device node's
}

func (m *AdoptReq) Encode(e *Enc) {
	e.Str(m.Dir)
	e.Str(m.Name)
	e.Str(m.Target)
	e.Bytes(m.Layout)
	e.U32(m.Mode)
	e.U32(m.UID)
	e.U32(m.GID)
	e.U32(m.Flags)
	m.Atime.Encode(e)
	m.Mtime.Encode(e)
	e.U32(m.Rdev)
}

func (m *AdoptReq) Decode(d *Dec) {
	m.Dir, m.Name, m.Target = d.Str(MaxPath), d.Str(MaxName), d.Str(MaxPath)
	m.Layout = d.Bytes(MaxLayout)
	m.Mode, m.UID, m.GID, m.Flags = d.U32(), d.U32(), d.U32(), d.U32()
	m.Atime.Decode(d)
	m.Mtime.Decode(d)
	m.Rdev = d.U32()
}

// HandleReq names an open handle (RELEASE).
type HandleReq struct {
	Handle uint64
	// Reported, on the RELEASE of a striped file's handle opened for writing (ObjectsVersion
	// on), says Objects are every server the handle made (or may have made) objects on, a
	// bit per server as in RemovedReply. A writer's RELEASE without it leaves where the
	// file's objects are unknown.
	Reported bool
	Objects  []byte
}

func (m *HandleReq) Encode(e *Enc) {
	e.U64(m.Handle)
	if m.Reported { // a trailing field: sent only to servers of ObjectsVersion on
		e.Bytes(m.Objects)
	}
}
func (m *HandleReq) Decode(d *Dec) {
	m.Handle = d.U64()
	if len(d.B) > 0 {
		m.Reported = true
		m.Objects = d.Bytes(MaxObjects)
	}
}

// HandleReply is a new handle (OPENDIR).
type HandleReply struct{ Handle uint64 }

func (m *HandleReply) Encode(e *Enc) { e.U64(m.Handle) }
func (m *HandleReply) Decode(d *Dec) { m.Handle = d.U64() }

// DataReply is a byte string (READLINK).
type DataReply struct{ Data []byte }

func (m *DataReply) Encode(e *Enc) { e.Bytes(m.Data) }
func (m *DataReply) Decode(d *Dec) { m.Data = d.Bytes(MaxBody) }

// ReaddirReq reads a directory handle from Offset (0 = the start, else an entry's Off).
type ReaddirReq struct {
	Handle, Offset uint64
}

func (m *ReaddirReq) Encode(e *Enc) { e.U64(m.Handle); e.U64(m.Offset) }
func (m *ReaddirReq) Decode(d *Dec) { m.Handle, m.Offset = d.U64(), d.U64() }

// Dirent is one directory entry: Off is where the entry after it starts; Type holds only
// the S_IFMT bits.
type Dirent struct {
	Ino, Off uint64
	Type     uint32
	Name     string
}

// ReaddirReply is a batch of entries; EOF when the directory has no more.
type ReaddirReply struct {
	Entries []Dirent
	EOF     bool
}

func (m *ReaddirReply) Encode(e *Enc) {
	e.U32(uint32(len(m.Entries)))
	for i := range m.Entries {
		de := &m.Entries[i]
		e.U64(de.Ino)
		e.U64(de.Off)
		e.U32(de.Type)
		e.Str(de.Name)
	}
	e.Bool(m.EOF)
}

// direntMin is the smallest encoded entry: it bounds the count a body can claim.
const direntMin = 8 + 8 + 4 + 2

func (m *ReaddirReply) Decode(d *Dec) {
	n := d.U32()
	if d.err == nil && int64(n)*direntMin > int64(len(d.B)) {
		d.fail("more directory entries than the body holds")
		return
	}
	m.Entries = make([]Dirent, 0, n)
	for i := uint32(0); i < n && d.err == nil; i++ {
		m.Entries = append(m.Entries, Dirent{Ino: d.U64(), Off: d.U64(), Type: d.U32(), Name: d.Str(MaxName)})
	}
	m.EOF = d.Bool()
}

// ReadReq reads up to Size bytes at Offset. The reply's body is the data.
type ReadReq struct {
	Handle, Offset uint64
	Size           uint32
	// Path, when set (ObjectsVersion on), names the file to read instead of Handle: the
	// server opens it read-only, reads and closes it, one request where an OPEN, the READ and
	// a RELEASE were three (a striped file's object read once).
	Path string
}

func (m *ReadReq) Encode(e *Enc) {
	e.U64(m.Handle)
	e.U64(m.Offset)
	e.U32(m.Size)
	if m.Path != "" { // a trailing field: sent only to servers of ObjectsVersion on
		e.Str(m.Path)
	}
}
func (m *ReadReq) Decode(d *Dec) {
	m.Handle, m.Offset, m.Size = d.U64(), d.U64(), d.U32()
	if len(d.B) > 0 {
		m.Path = d.Str(MaxPath)
	}
}

// WriteReq writes Data at Offset. Data is the rest of the body (not length-prefixed).
type WriteReq struct {
	Handle, Offset uint64
	Data           []byte
}

func (m *WriteReq) Encode(e *Enc) { e.U64(m.Handle); e.U64(m.Offset); e.Raw(m.Data) }
func (m *WriteReq) Decode(d *Dec) { m.Handle, m.Offset = d.U64(), d.U64(); m.Data = d.Rest() }

// WriteNameReq writes Data at Offset of the regular file Name of the root directory (a
// stripe object), creating it (mode 0600) if it is missing, and closes it (OpWriteName).
type WriteNameReq struct {
	Name   string
	Offset uint64
	Data   []byte
}

func (m *WriteNameReq) Encode(e *Enc) { e.Str(m.Name); e.U64(m.Offset); e.Raw(m.Data) }
func (m *WriteNameReq) Decode(d *Dec) {
	m.Name = d.Str(MaxName)
	m.Offset = d.U64()
	m.Data = d.Rest()
}

// WriteSyncReq writes Data at Offset of a handle's file (Handle), or of the regular file Name
// of the root directory (a stripe object, created if missing and closed after, as
// WRITE_NAME) when Handle is 0, then syncs the file as FsyncReq.Flags say (bit 0: data only,
// fdatasync), and answers once (OpWriteSync). The reply counts the bytes written; a short
// write is not synced. Data is the rest of the body (not length-prefixed).
type WriteSyncReq struct {
	Handle, Offset uint64
	Flags          uint32
	Name           string
	Data           []byte
}

func (m *WriteSyncReq) Encode(e *Enc) {
	e.U64(m.Handle)
	e.U64(m.Offset)
	e.U32(m.Flags)
	e.Str(m.Name)
	e.Raw(m.Data)
}

func (m *WriteSyncReq) Decode(d *Dec) {
	m.Handle, m.Offset, m.Flags = d.U64(), d.U64(), d.U32()
	m.Name = d.Str(MaxName)
	m.Data = d.Rest()
}

// CountReply is a number: bytes written or copied, a new offset.
type CountReply struct{ N uint64 }

func (m *CountReply) Encode(e *Enc) { e.U64(m.N) }
func (m *CountReply) Decode(d *Dec) { m.N = d.U64() }

// FsyncReq flushes a handle; Flags bit 0 = data only (fdatasync).
type FsyncReq struct {
	Handle uint64
	Flags  uint32
}

// FsyncToPFS in FsyncReq.Flags asks a cache instance's stripe server to return once the
// file's data it holds is on the PFS and the PFS file synced, whatever the file's policy
// (libdatawarp's dw_wait_sync_complete). Other servers ignore it (fsync's own flags are
// FUSE's, bit 0 only).
const FsyncToPFS = 1 << 16

// FsyncClosing in FsyncReq.Flags is a close's request to a cache instance's stripe server:
// if the file's policy syncs on close, return once its data there is on the PFS, else at
// once. A file's close (FUSE's FLUSH) sends it, since the release of its objects comes after
// close(2) has returned.
const FsyncClosing = 1 << 17

func (m *FsyncReq) Encode(e *Enc) { e.U64(m.Handle); e.U32(m.Flags) }
func (m *FsyncReq) Decode(d *Dec) { m.Handle, m.Flags = d.U64(), d.U32() }

// FallocateReq is fallocate(2) on a handle.
type FallocateReq struct {
	Handle, Offset, Length uint64
	Mode                   uint32
}

func (m *FallocateReq) Encode(e *Enc) {
	e.U64(m.Handle)
	e.U64(m.Offset)
	e.U64(m.Length)
	e.U32(m.Mode)
}
func (m *FallocateReq) Decode(d *Dec) {
	m.Handle, m.Offset, m.Length, m.Mode = d.U64(), d.U64(), d.U64(), d.U32()
}

// LseekReq is lseek(2) on a handle (SEEK_DATA and SEEK_HOLE are what the kernel forwards).
type LseekReq struct {
	Handle, Offset uint64
	Whence         uint32
}

func (m *LseekReq) Encode(e *Enc) { e.U64(m.Handle); e.U64(m.Offset); e.U32(m.Whence) }
func (m *LseekReq) Decode(d *Dec) { m.Handle, m.Offset, m.Whence = d.U64(), d.U64(), d.U32() }

// CopyRangeReq is copy_file_range(2) between two handles of the connection.
type CopyRangeReq struct {
	In, OffIn, Out, OffOut, Length, Flags uint64
}

func (m *CopyRangeReq) Encode(e *Enc) {
	e.U64(m.In)
	e.U64(m.OffIn)
	e.U64(m.Out)
	e.U64(m.OffOut)
	e.U64(m.Length)
	e.U64(m.Flags)
}

func (m *CopyRangeReq) Decode(d *Dec) {
	m.In, m.OffIn, m.Out, m.OffOut, m.Length, m.Flags = d.U64(), d.U64(), d.U64(), d.U64(), d.U64(), d.U64()
}

// StatfsReply is the instance seen as a file system: blocks of Bsize bytes.
type StatfsReply struct {
	Blocks, Bfree, Bavail, Files, Ffree uint64
	Bsize, Frsize, NameLen              uint32
}

func (m *StatfsReply) Encode(e *Enc) {
	e.U64(m.Blocks)
	e.U64(m.Bfree)
	e.U64(m.Bavail)
	e.U64(m.Files)
	e.U64(m.Ffree)
	e.U32(m.Bsize)
	e.U32(m.Frsize)
	e.U32(m.NameLen)
}

func (m *StatfsReply) Decode(d *Dec) {
	m.Blocks, m.Bfree, m.Bavail, m.Files, m.Ffree = d.U64(), d.U64(), d.U64(), d.U64(), d.U64()
	m.Bsize, m.Frsize, m.NameLen = d.U32(), d.U32(), d.U32()
}

// XattrReq is an extended attribute operation on a node (by handle, or path when Handle is
// 0). GETXATTR uses Name and Size; LISTXATTR Size; SETXATTR Name, Value and Flags;
// REMOVEXATTR Name. Size 0 asks for the size only.
type XattrReq struct {
	Path   string
	Handle uint64
	Name   string
	Size   uint32
	Value  []byte
	Flags  uint32
}

func (m *XattrReq) Encode(e *Enc) {
	e.Str(m.Path)
	e.U64(m.Handle)
	e.Str(m.Name)
	e.U32(m.Size)
	e.Bytes(m.Value)
	e.U32(m.Flags)
}

func (m *XattrReq) Decode(d *Dec) {
	m.Path = d.Str(MaxPath)
	m.Handle = d.U64()
	m.Name = d.Str(MaxName)
	m.Size = d.U32()
	m.Value = d.Bytes(MaxXattr)
	m.Flags = d.U32()
}

// XattrReply is an attribute's value or the list of names; Size is the full size, Data
// empty when the request asked for the size only.
type XattrReply struct {
	Size uint32
	Data []byte
}

func (m *XattrReply) Encode(e *Enc) { e.U32(m.Size); e.Bytes(m.Data) }
func (m *XattrReply) Decode(d *Dec) { m.Size = d.U32(); m.Data = d.Bytes(MaxXattr) }

// NewRequest returns an empty request body for op (nil for an unknown op, and for READ
// replies, which have no message).
func NewRequest(op Op) Message {
	switch op {
	case OpHello:
		return &Hello{}
	case OpAuth:
		return &Auth{}
	case OpPing, OpStatfs:
		return &Empty{}
	case OpLookup, OpReadlink, OpOpendir:
		return &PathReq{}
	case OpGetattr:
		return &NodeReq{}
	case OpSetattr:
		return &SetattrReq{}
	case OpOpen:
		return &OpenReq{}
	case OpCreate, OpTmpfile:
		return &CreateReq{}
	case OpReserve:
		return &ReserveReq{}
	case OpPlace:
		return &PlaceReq{}
	case OpMkdir, OpMknod:
		return &MkdirReq{}
	case OpSymlink:
		return &SymlinkReq{}
	case OpLink:
		return &LinkReq{}
	case OpUnlink, OpRmdir:
		return &EntryReq{}
	case OpRename:
		return &RenameReq{}
	case OpAdopt:
		return &AdoptReq{}
	case OpReaddir:
		return &ReaddirReq{}
	case OpRelease:
		return &HandleReq{}
	case OpRead:
		return &ReadReq{}
	case OpWrite:
		return &WriteReq{}
	case OpWriteName:
		return &WriteNameReq{}
	case OpWriteSync:
		return &WriteSyncReq{}
	case OpFsync:
		return &FsyncReq{}
	case OpFallocate:
		return &FallocateReq{}
	case OpLseek:
		return &LseekReq{}
	case OpCopyRange:
		return &CopyRangeReq{}
	case OpGetxattr, OpListxattr, OpSetxattr, OpRemovexattr:
		return &XattrReq{}
	}
	return nil
}

// NewReply returns an empty reply body for a successful op (nil for READ, whose body is raw
// data, and for unknown ops).
func NewReply(op Op) Message {
	switch op {
	case OpHello:
		return &Challenge{}
	case OpAuth:
		return &Welcome{}
	case OpLookup, OpGetattr, OpSetattr, OpMkdir, OpMknod, OpSymlink, OpLink:
		return &AttrReply{}
	case OpOpen, OpCreate, OpTmpfile, OpPlace:
		return &OpenReply{}
	case OpReserve:
		return &ReserveReply{}
	case OpOpendir:
		return &HandleReply{}
	case OpReadlink:
		return &DataReply{}
	case OpReaddir:
		return &ReaddirReply{}
	case OpWrite, OpLseek, OpCopyRange, OpWriteName, OpWriteSync:
		return &CountReply{}
	case OpStatfs:
		return &StatfsReply{}
	case OpGetxattr, OpListxattr:
		return &XattrReply{}
	case OpUnlink, OpRename, OpAdopt:
		return &RemovedReply{}
	case OpPing, OpRmdir, OpRelease, OpFsync, OpFallocate, OpSetxattr, OpRemovexattr:
		return &Empty{}
	}
	return nil
}
