package pfsio

import (
	"bytes"
	"encoding/gob"
	"fmt"

	"golang.org/x/sys/unix"
)

// The door's requests and replies. In-process they are passed as they are; to a worker each is
// one SOCK_SEQPACKET message, gob-encoded (names on a PFS are any bytes: gob keeps them, JSON
// would not), with the descriptors it carries (Open's file, WriteAt's pipe) attached by
// SCM_RIGHTS.

type op uint8

const (
	opLstat op = iota + 1
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
	opLstat: "lstat", opReadlink: "readlink", opOpenDir: "opendir", opReadDir: "readdir", opOpen: "open",
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

func encode(v any) ([]byte, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(v); err != nil {
		return nil, err
	}
	if b.Len() > maxMessage {
		return nil, unix.EMSGSIZE
	}
	return b.Bytes(), nil
}

func decode(b []byte, v any) error { return gob.NewDecoder(bytes.NewReader(b)).Decode(v) }
