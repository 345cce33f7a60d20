package pfsio

import (
	"bytes"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// The door's requests and replies. In-process they are passed as they are; to a worker each is
// one SOCK_SEQPACKET message of a gob stream (one stream each way) (names on a PFS are any bytes: gob keeps them, JSON
// would not), with the descriptors it carries (Open's file, WriteAt's pipe) attached by
// SCM_RIGHTS.

type op uint8

const (
	// opHello is the agent's first message, once it has checked the worker (asuser.Accept):
	// only then does the worker open the root, and it answers whether it could.
	opHello op = iota + 1
	opLstat
	opReadlink
	opOpenDir
	opReadDir
	opOpen
	opWrite
	opSync
	opTruncate
	opAllocate
	opClose
	opMkdir
	opRmdir
	opUnlink
	opRename
	opSymlink
	opLink
	opChmod
	opChown
	opUtimens
	opStatfs
	opGetxattr
	opSetxattr
	opListxattr
	opRemovexattr
)

var opNames = map[op]string{
	opHello: "hello", opLstat: "lstat", opReadlink: "readlink", opOpenDir: "opendir", opReadDir: "readdir", opOpen: "open",
	opWrite: "pwrite", opSync: "fsync", opTruncate: "ftruncate", opAllocate: "fallocate", opClose: "close",
	opMkdir: "mkdir", opRmdir: "rmdir", opUnlink: "unlink", opRename: "rename", opSymlink: "symlink",
	opLink: "link", opChmod: "chmod", opChown: "chown", opUtimens: "utimens", opStatfs: "statfs",
	opGetxattr: "getxattr", opSetxattr: "setxattr", opListxattr: "listxattr", opRemovexattr: "removexattr",
}

func (o op) String() string {
	if n, ok := opNames[o]; ok {
		return n
	}
	return fmt.Sprintf("op%d", uint8(o))
}

// request is one operation. Path and Path2 are relative to the PFS root.
type request struct {
	ID          uint64
	Op          op
	Path, Path2 string
	Handle      uint64
	Flags       int64
	Mode        uint32
	UID, GID    int64
	Off, Size   int64
	Times       [2]unix.Timespec
	Name        string // an extended attribute's name; a symbolic link's target
	Value       []byte

	data   []byte // opWrite in-process: the bytes themselves
	dataFd int    // opWrite to a worker: the read end of a pipe carrying Size bytes
}

// Entry is one name of a directory, with its attributes as lstat gives them (Errno set, Stat
// zero, when the entry could not be looked at: it went away, or cannot be searched).
type Entry struct {
	Name  string
	Type  uint32 // the S_IFMT bits, as the directory gives them
	Stat  unix.Stat_t
	Errno int32
}

// reply answers a request; Errno 0 is success.
type reply struct {
	ID      uint64
	Errno   int32
	Stat    unix.Stat_t
	Statfs  unix.Statfs_t
	Entries []Entry
	EOF     bool
	Text    string // readlink's target
	Value   []byte // getxattr's value
	Names   []string
	Handle  uint64
	N       int64

	fd int // opOpen: the file's descriptor, passed to the caller (-1: none)
}

// maxMessage bounds one message each way: under the AF_UNIX datagram limit of a default
// socket buffer (wmem_default, 208 KiB), and far above any reply the worker builds (a batch
// of maxBatch entries with 255-byte names, a 64 KiB attribute value).
const maxMessage = 160 << 10

// maxBatch is the most entries one readdir reply carries.
const maxBatch = 128

// errTooLarge: a message that would not fit (the sizes a request may carry are checked before,
// and a reply is bounded by construction, so it means a defect; the stream is then given up).
var errTooLarge = errors.New("a message larger than the door's limit")

// encoder writes one gob stream as messages: the types are described once, in the first
// message, not in every one (a fresh encoder per message cost a round trip ~100 µs).
type encoder struct {
	mu  sync.Mutex
	buf bytes.Buffer
	enc *gob.Encoder
}

func newEncoder() *encoder {
	e := &encoder{}
	e.enc = gob.NewEncoder(&e.buf)
	return e
}

// send encodes v and passes the message to send, under one lock: messages leave in the
// order they were encoded, as the peer's decoder needs.
func (e *encoder) send(v any, send func(msg []byte) error) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.buf.Reset()
	if err := e.enc.Encode(v); err != nil {
		return err
	}
	if e.buf.Len() > maxMessage {
		return errTooLarge
	}
	return send(e.buf.Bytes())
}

// decoder reads the peer's gob stream one message at a time (from one goroutine).
type decoder struct {
	msg messageReader
	dec *gob.Decoder
}

func newDecoder() *decoder {
	d := &decoder{}
	d.dec = gob.NewDecoder(&d.msg) // an io.ByteReader: gob reads no further than it needs
	return d
}

// decode reads v from msg, which must hold it exactly.
func (d *decoder) decode(msg []byte, v any) error {
	d.msg.b = msg
	if err := d.dec.Decode(v); err != nil {
		return err
	}
	if len(d.msg.b) != 0 {
		return errors.New("a message with bytes past its value")
	}
	return nil
}

type messageReader struct{ b []byte }

func (r *messageReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

func (r *messageReader) ReadByte() (byte, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c, nil
}
