// Package proto is warpfs's wire protocol: how a compute node's FUSE client asks a storage
// node's agent for file operations on a namespace. It is pure — frames and messages are
// encoded into and decoded from byte slices; reading and writing connections is the business
// of packages client and server.
//
// # Frames
//
// Every message travels in one frame:
//
//	offset size
//	0      4    length: the bytes that follow this field (20 + body), big-endian
//	4      1    op: what is asked (OpLookup, OpRead, ...); a reply carries its request's op
//	5      1    kind: 0 request, 1 reply, 2 notification (server to client, LeaseVersion on)
//	6      1    flags (from LeaseVersion on): a reply's FlagLease, a request's FlagOneWay; 0 otherwise
//	7      1    reserved, 0
//	8      8    id: chosen by the client, unique among its requests in flight; the reply
//	            carries it, so many requests share one connection and replies may come in
//	            any order
//	16     4    request: the caller's uid; reply: errno (0 = success, else a Linux errno)
//	20     4    request: the caller's gid; reply: reserved, 0
//	24     ...  body: the op's message (little-endian fields, see Enc), empty on a failed reply
//
// Bulk data is never encoded: a WRITE body is 16 bytes of handle and offset followed by the
// data, and a READ reply's body is the data itself, so both ends move it with one copy into or
// out of the socket. A frame's body is at most MaxBody bytes.
//
// # Handshake
//
// The client opens with HELLO (its version range and a nonce), the server answers with a
// Challenge (the version chosen and its own nonce), the client proves it holds the cluster's
// shared token with AUTH (an HMAC of both nonces, never the token itself) and names the
// namespace it wants, and the server answers with a Welcome (its own proof, the namespace
// root's attributes) or a failed reply whose body is a Refusal saying why. Only then are file operations accepted. Versions let
// a later client (striped over several servers) add operations without breaking this one.
//
// # Leases (LeaseVersion on)
//
// A server of this version may let the client cache what a reply says — the name it looked
// up (or its absence) and the attributes it returned — for the lease the Welcome grants, by
// setting FlagLease on the reply. Before a change made by any other client is acknowledged,
// the server sends every client that may hold something the change makes stale a
// notification (kind 2, OpInval, an InvalReq), and waits for its reply (a reply frame of op
// OpInval with the notification's id) or for the lease to run out. So names and attributes
// can be cached for long while a change on one node is seen by every other at its next call.
//
// # Cache instances
//
// A cache instance's namespace is a directory of the parallel file system (PFS), and its
// files' data is cached in stripe objects on the instance's servers, which move it to and
// from the PFS themselves. A server names such a file with a CacheRef (its path in the PFS
// directory and its (st_dev, st_ino) there) in an optional trailing field: OpenReply.Cache
// (the namespace server, on the open or create of a regular file), RemovedReply.Cache (the
// file an UNLINK or RENAME removed the last name of), and a client passes it on in the
// requests for the file's stripe objects: OpenReq.Cache, CreateReq.Cache (the object's
// open) and EntryReq.Cache (its UNLINK). The field is one version byte (1), the path (Str)
// and Dev and Ino (U64); it is absent (the body ends before it) when there is none, so every
// other message is byte for byte what earlier versions send, and no version number changed:
// only servers and clients of cache instances, all of this version, ever send it. A SETATTR
// of a cache file's object (through its handle) carries the file's new size, not the
// object's: the cache decides in file offsets.
package proto

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"
)

// Magic opens every HELLO: "SPWF".
const Magic uint32 = 0x53505746

// Versions this package speaks. A peer picks the highest both support.
const (
	MinVersion uint16 = 3
	MaxVersion uint16 = 11
)

// LeaseVersion is the first version whose servers grant leases and send invalidations
// (OpInval notifications), and whose replies carry flags.
const LeaseVersion uint16 = 5

// SyncVersion is the first version whose servers honour SetattrReq's SetSync.
const SyncVersion uint16 = 4

// ObjectsVersion is the first version whose servers keep which servers hold a striped file's
// objects: a RELEASE may carry the servers its handle made objects on (HandleReq.Objects),
// and the reply to UNLINK and RENAME says which servers the removed file's objects are on
// (RemovedReply.Objects), a READ may name an object instead of a handle (ReadReq.Path), and
// WRITE_NAME writes one by name.
const ObjectsVersion uint16 = 6

// DirAttrVersion is the first version whose replies to CREATE, UNLINK, MKDIR, MKNOD, SYMLINK
// and LINK may carry the directory's attributes after the change, leased (OpenReply.Dir,
// RemovedReply.Dir, AttrReply.Dir): the client answers the kernel's GETATTR of the
// directory, which the change made it drop, itself.
const DirAttrVersion uint16 = 7

// WriteSyncVersion is the first version whose servers take WRITE_SYNC (OpWriteSync): a
// write and the fsync or fdatasync after it in one request, as a write behind followed by
// fsync(2) needs.
const WriteSyncVersion uint16 = 8

// StubVersion is the first version whose servers take RESERVE and PLACE (OpReserve,
// OpPlace): empty files made ahead in a directory, without a name, whose inode numbers a
// mount may answer creates with before the server acts (its creates behind), and the
// create that gives one its name.
const StubVersion uint16 = 9

// PlacedWriterVersion is the first version whose servers take a PLACE that opens the new
// file for its writer (PlaceReq.Writer) and a size report that releases its handle
// (SetattrReq.Release): a file created behind, written and closed at once costs no OPEN and
// no RELEASE on the metadata server.
const PlacedWriterVersion uint16 = 10

// InlinePlaceVersion is the first version whose servers take a PLACE carrying the whole
// file (PlaceReq.Data): a small file created behind, written and closed at once is one
// request, its data kept on the metadata server's own stripe server.
const InlinePlaceVersion uint16 = 11

// Sizes and limits of the protocol.
const (
	HeaderSize  = 24      // the fixed part of a frame, length field included
	MaxIO       = 1 << 20 // the largest READ or WRITE (the kernel's FUSE limit)
	MaxBody     = MaxIO + 128<<10
	MaxName     = 255  // a file name
	MaxPath     = 4096 // a path inside the namespace
	MaxXattr    = 64 << 10
	MaxDirReply = 64 << 10 // the most a READDIR reply holds
	// WritePrefix is the part of a WRITE body before its data: handle and offset.
	WritePrefix = 16
)

// Op is what a frame asks for.
type Op uint8

// The operations. Numbers are part of the protocol: never renumber, only add.
const (
	OpHello Op = 1 // Hello → Challenge
	OpAuth  Op = 3 // Auth → Welcome, or a failed reply whose body is a Refusal

	OpPing Op = 10

	OpLookup      Op = 16 // PathReq → AttrReply
	OpGetattr     Op = 17 // NodeReq → AttrReply
	OpSetattr     Op = 18 // SetattrReq → AttrReply
	OpOpen        Op = 19 // OpenReq → OpenReply
	OpCreate      Op = 20 // CreateReq → OpenReply
	OpTmpfile     Op = 21 // CreateReq (Name "") → OpenReply
	OpMkdir       Op = 22 // MkdirReq → AttrReply
	OpMknod       Op = 23 // MkdirReq → AttrReply
	OpSymlink     Op = 24 // SymlinkReq → AttrReply
	OpLink        Op = 25 // LinkReq → AttrReply
	OpUnlink      Op = 26 // EntryReq → RemovedReply
	OpRmdir       Op = 27 // EntryReq → Empty
	OpRename      Op = 28 // RenameReq → RemovedReply
	OpReadlink    Op = 29 // PathReq → DataReply
	OpOpendir     Op = 30 // PathReq → HandleReply
	OpReaddir     Op = 31 // ReaddirReq → ReaddirReply
	OpRelease     Op = 32 // HandleReq → Empty (files and directories)
	OpRead        Op = 33 // ReadReq → raw data
	OpWrite       Op = 34 // WriteReq → CountReply
	OpFsync       Op = 35 // FsyncReq → Empty
	OpFallocate   Op = 36 // FallocateReq → Empty
	OpLseek       Op = 37 // LseekReq → CountReply
	OpCopyRange   Op = 38 // CopyRangeReq → CountReply
	OpStatfs      Op = 39 // Empty → StatfsReply
	OpGetxattr    Op = 40 // XattrReq → XattrReply
	OpListxattr   Op = 41 // XattrReq → XattrReply
	OpSetxattr    Op = 42 // XattrReq → Empty
	OpRemovexattr Op = 43 // XattrReq → Empty
	OpAdopt       Op = 44 // AdoptReq → RemovedReply
	OpInval       Op = 45 // a notification: InvalReq → Empty (the client's reply)
	// OpBye, one-way (FlagOneWay), is a mount's last request: it is unmounted, its kernel
	// caches nothing, and the server need not wait out its leases (LeaseVersion on).
	OpBye Op = 46 // Empty
	// OpWriteName (ObjectsVersion on) writes to a file of the root directory by name,
	// creating it: a striped file's object written once, in one request where a CREATE, a
	// WRITE and a RELEASE were three.
	OpWriteName Op = 47 // WriteNameReq → CountReply
	// OpWriteSync (WriteSyncVersion on) writes, then fsyncs or fdatasyncs the file, and
	// answers once: the queued write an fsync(2) waits for and its sync in one round trip.
	OpWriteSync Op = 48 // WriteSyncReq → CountReply
	// OpReserve (StubVersion on) makes up to Count empty files without a name in a
	// directory, as a create there by the caller with Mode would make them, kept by the
	// connection's session for a later PLACE: their inode numbers.
	OpReserve Op = 49 // ReserveReq → ReserveReply
	// OpPlace (StubVersion on) is a CREATE (O_EXCL) that names one of the session's
	// reserved files instead of making one, and opens nothing: its reply's Handle is 0 (the
	// client opens the file by name when it needs a handle).
	OpPlace Op = 50 // PlaceReq → OpenReply
)

// MaxReserve is the most files one RESERVE makes; MaxStubs the most a connection's session
// keeps made ahead (a RESERVE past it drops its oldest).
const (
	MaxReserve = 64
	MaxStubs   = 256
)

var opNames = map[Op]string{
	OpHello: "HELLO", OpAuth: "AUTH", OpPing: "PING",
	OpLookup: "LOOKUP", OpGetattr: "GETATTR", OpSetattr: "SETATTR", OpOpen: "OPEN", OpCreate: "CREATE",
	OpTmpfile: "TMPFILE", OpMkdir: "MKDIR", OpMknod: "MKNOD", OpSymlink: "SYMLINK", OpLink: "LINK",
	OpUnlink: "UNLINK", OpRmdir: "RMDIR", OpRename: "RENAME", OpReadlink: "READLINK", OpOpendir: "OPENDIR",
	OpReaddir: "READDIR", OpRelease: "RELEASE", OpRead: "READ", OpWrite: "WRITE", OpFsync: "FSYNC",
	OpFallocate: "FALLOCATE", OpLseek: "LSEEK", OpCopyRange: "COPY_RANGE", OpStatfs: "STATFS",
	OpGetxattr: "GETXATTR", OpListxattr: "LISTXATTR", OpSetxattr: "SETXATTR", OpRemovexattr: "REMOVEXATTR",
	OpAdopt: "ADOPT", OpInval: "INVAL", OpBye: "BYE", OpWriteName: "WRITE_NAME", OpWriteSync: "WRITE_SYNC",
	OpReserve: "RESERVE", OpPlace: "PLACE",
}

func (o Op) String() string {
	if s, ok := opNames[o]; ok {
		return s
	}
	return fmt.Sprintf("op%d", uint8(o))
}

// Known reports whether o is an operation of this protocol version.
func (o Op) Known() bool { _, ok := opNames[o]; return ok }

// Kind tells requests from replies.
type Kind uint8

const (
	KindRequest Kind = 0
	KindReply   Kind = 1
	// KindNotify is a request from the server to the client (OpInval), answered by a reply.
	KindNotify Kind = 2
)

// Reply flags.
const (
	// FlagLease: the client may cache the name and attributes this reply gives until the
	// lease runs out; the server tells it first when another client changes them.
	FlagLease uint8 = 1
	// FlagOneWay, on a request (RELEASE): the client waits for no reply and the server sends
	// none.
	FlagOneWay uint8 = 2
	// FlagListing, on a leased MKDIR reply: the client knows every name of the new directory
	// (none) and may answer lookups of others as absent while the lease lasts; the server
	// tells it (InvalListing) before anyone else adds a name — or, since the mount may then
	// remove names without waiting for the server (its unlinks behind), looks one up or lists
	// them. On a CREATE or UNLINK reply: the client's listing of the request's directory is
	// renewed for another lease.
	FlagListing uint8 = 4
)

// Header is the fixed part of a frame.
type Header struct {
	BodyLen uint32 // bytes of body after the header
	Op      Op
	Kind    Kind
	ID      uint64
	UID     uint32 // request: the caller
	GID     uint32
	Errno   uint32 // reply: 0 or a Linux errno
	Flags   uint8  // reply: FlagLease; request: FlagOneWay
}

// ErrMalformed is wrapped by every error about a frame or message that breaks the protocol.
// A peer that sends one is disconnected.
var ErrMalformed = errors.New("malformed warpfs frame")

// PutHeader writes h into b[:HeaderSize].
// WriteFrame writes a frame and the raw data after it (none: nil) to nc, in one system call
// where it can (writev).
func WriteFrame(nc net.Conn, frame, data []byte) error {
	if len(data) == 0 {
		_, err := nc.Write(frame)
		return err
	}
	bufs := net.Buffers{frame, data}
	_, err := bufs.WriteTo(nc)
	return err
}

func PutHeader(b []byte, h Header) {
	_ = b[HeaderSize-1]
	binary.BigEndian.PutUint32(b[0:], h.BodyLen+HeaderSize-4)
	b[4] = byte(h.Op)
	b[5] = byte(h.Kind)
	b[6], b[7] = 0, 0
	if h.Kind == KindReply || h.Kind == KindRequest {
		b[6] = h.Flags
	}
	binary.BigEndian.PutUint64(b[8:], h.ID)
	if h.Kind == KindReply {
		binary.BigEndian.PutUint32(b[16:], h.Errno)
		binary.BigEndian.PutUint32(b[20:], 0)
	} else {
		binary.BigEndian.PutUint32(b[16:], h.UID)
		binary.BigEndian.PutUint32(b[20:], h.GID)
	}
}

// ParseHeader reads the fixed part of a frame and checks it: a known kind, zero reserved
// bytes, and a body of at most maxBody bytes. The op is not checked (a server answers an
// unknown op with ENOSYS).
func ParseHeader(b []byte, maxBody int) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d bytes, a header has %d", ErrMalformed, len(b), HeaderSize)
	}
	length := binary.BigEndian.Uint32(b[0:])
	if length < HeaderSize-4 {
		return Header{}, fmt.Errorf("%w: length %d is shorter than a header", ErrMalformed, length)
	}
	h := Header{BodyLen: length - (HeaderSize - 4), Op: Op(b[4]), Kind: Kind(b[5]), ID: binary.BigEndian.Uint64(b[8:])}
	if maxBody < 0 || int64(h.BodyLen) > int64(maxBody) {
		return Header{}, fmt.Errorf("%w: body of %d bytes, the limit is %d", ErrMalformed, h.BodyLen, maxBody)
	}
	if b[7] != 0 || b[6] != 0 && !(Kind(b[5]) == KindReply && b[6]&^(FlagLease|FlagListing) == 0 ||
		Kind(b[5]) == KindRequest && b[6]&^FlagOneWay == 0) {
		return Header{}, fmt.Errorf("%w: reserved bytes are not zero", ErrMalformed)
	}
	switch h.Kind {
	case KindRequest, KindNotify:
		h.UID = binary.BigEndian.Uint32(b[16:])
		h.GID = binary.BigEndian.Uint32(b[20:])
		h.Flags = b[6]
	case KindReply:
		h.Errno = binary.BigEndian.Uint32(b[16:])
		h.Flags = b[6]
		if binary.BigEndian.Uint32(b[20:]) != 0 {
			return Header{}, fmt.Errorf("%w: reserved word of a reply is not zero", ErrMalformed)
		}
	default:
		return Header{}, fmt.Errorf("%w: kind %d", ErrMalformed, h.Kind)
	}
	return h, nil
}

// AppendFrame appends a whole frame (header and the message's body) to b.
func AppendFrame(b []byte, h Header, m Message) []byte {
	start := len(b)
	b = append(b, make([]byte, HeaderSize)...)
	if m != nil {
		e := Enc{B: b}
		m.Encode(&e)
		b = e.B
	}
	h.BodyLen = uint32(len(b) - start - HeaderSize)
	PutHeader(b[start:], h)
	return b
}

// Enc appends little-endian fields to B.
type Enc struct{ B []byte }

func (e *Enc) U8(v uint8)   { e.B = append(e.B, v) }
func (e *Enc) U16(v uint16) { e.B = binary.LittleEndian.AppendUint16(e.B, v) }
func (e *Enc) U32(v uint32) { e.B = binary.LittleEndian.AppendUint32(e.B, v) }
func (e *Enc) U64(v uint64) { e.B = binary.LittleEndian.AppendUint64(e.B, v) }
func (e *Enc) I64(v int64)  { e.U64(uint64(v)) }
func (e *Enc) Bool(v bool) {
	if v {
		e.U8(1)
	} else {
		e.U8(0)
	}
}

// Str writes a string of at most 65535 bytes (longer ones are cut: every string of the
// protocol has a far smaller limit, which the decoder enforces).
func (e *Enc) Str(s string) {
	if len(s) > 0xffff {
		s = s[:0xffff]
	}
	e.U16(uint16(len(s)))
	e.B = append(e.B, s...)
}

// Bytes writes a byte string with a 32-bit length.
func (e *Enc) Bytes(b []byte) {
	e.U32(uint32(len(b)))
	e.B = append(e.B, b...)
}

// Raw writes bytes with no length (fixed-size fields, or the trailing data of a frame).
func (e *Enc) Raw(b []byte) { e.B = append(e.B, b...) }

// Dec reads little-endian fields from B. The first error sticks: later reads return zero
// values, and Err reports it.
type Dec struct {
	B   []byte
	err error
}

// NewDec decodes b.
func NewDec(b []byte) *Dec { return &Dec{B: b} }

func (d *Dec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, what)
	}
}

func (d *Dec) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.B) < n {
		d.fail("truncated " + what)
		return nil
	}
	v := d.B[:n:n]
	d.B = d.B[n:]
	return v
}

func (d *Dec) U8() uint8 {
	if b := d.take(1, "u8"); b != nil {
		return b[0]
	}
	return 0
}

func (d *Dec) U16() uint16 {
	if b := d.take(2, "u16"); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (d *Dec) U32() uint32 {
	if b := d.take(4, "u32"); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *Dec) U64() uint64 {
	if b := d.take(8, "u64"); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *Dec) I64() int64 { return int64(d.U64()) }

func (d *Dec) Bool() bool {
	switch d.U8() {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail("bool is neither 0 nor 1")
	return false
}

// Str reads a string of at most max bytes.
func (d *Dec) Str(max int) string {
	n := int(d.U16())
	if d.err == nil && n > max {
		d.fail(fmt.Sprintf("string of %d bytes, the limit is %d", n, max))
		return ""
	}
	return string(d.take(n, "string"))
}

// Bytes reads a byte string of at most max bytes. The result aliases the decoded buffer.
func (d *Dec) Bytes(max int) []byte {
	n := d.U32()
	if d.err == nil && int64(n) > int64(max) {
		d.fail(fmt.Sprintf("byte string of %d bytes, the limit is %d", n, max))
		return nil
	}
	return d.take(int(n), "bytes")
}

// Raw reads n bytes. The result aliases the decoded buffer.
func (d *Dec) Raw(n int) []byte { return d.take(n, "bytes") }

// Rest returns what is left. The result aliases the decoded buffer.
func (d *Dec) Rest() []byte {
	if d.err != nil {
		return nil
	}
	v := d.B
	d.B = nil
	return v
}

// Err is the first decoding error.
func (d *Dec) Err() error { return d.err }

// Done is the first error, or an error if bytes are left over.
func (d *Dec) Done() error {
	if d.err == nil && len(d.B) > 0 {
		d.fail(fmt.Sprintf("%d bytes left over", len(d.B)))
	}
	return d.err
}

// Message is a frame's body.
type Message interface {
	Encode(e *Enc)
	Decode(d *Dec)
}

// Decode decodes body into m and checks that nothing is left over.
func Decode(body []byte, m Message) error {
	d := NewDec(body)
	m.Decode(d)
	return d.Done()
}

// Errno turns a reply's errno into an error (nil for 0).
func Errno(e uint32) error {
	if e == 0 {
		return nil
	}
	return syscall.Errno(e)
}

// Auth proofs. Both sides prove they hold the shared token without sending it: the client
// with clientMAC, the server with serverMAC, each over both nonces.
const (
	ClientNonceSize = 16
	ServerNonceSize = 32
)

// ClientProof is what the client sends in AUTH.
func ClientProof(token []byte, server [ServerNonceSize]byte, client [ClientNonceSize]byte) [32]byte {
	return proof(token, "warpfs client v1", server, client)
}

// ServerProof is what the server sends in WELCOME.
func ServerProof(token []byte, server [ServerNonceSize]byte, client [ClientNonceSize]byte) [32]byte {
	return proof(token, "warpfs server v1", server, client)
}

func proof(token []byte, role string, server [ServerNonceSize]byte, client [ClientNonceSize]byte) [32]byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte(role))
	m.Write(server[:])
	m.Write(client[:])
	var out [32]byte
	copy(out[:], m.Sum(nil))
	return out
}

// ProofEqual compares proofs in constant time.
func ProofEqual(a, b [32]byte) bool { return hmac.Equal(a[:], b[:]) }
