// Package stripe is the map of a striped file: which server holds which bytes. It is pure
// arithmetic on a file's layout, so every compute node computes the same answer with no lock
// manager and no central map.
//
// A file's data is cut into stripes of Size bytes. Stripe i lives on server
// (Start + i mod Width) mod Servers, where Servers is the number of the instance's servers
// (its fragments, in fragment order) and Width ≤ Servers the number the file uses. Each server
// keeps the file's stripes it holds in one object, one after the other: stripe i is at
// offset (i / Width) × Size in its object. A file's layout travels with its metadata (the
// metadata server's stub); see docs/architecture.md.
package stripe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Limits of a layout.
const (
	Unit       = 4096    // stripe sizes are multiples of this
	MaxSize    = 1 << 30 // the largest stripe
	MaxServers = 1024
	// DefaultSize is a pool's stripe size unless its configuration says otherwise.
	DefaultSize = 8 << 20
)

// UserXattr is the extended attribute through which users (and the stage workers of a split
// stage) read a file's or a directory's striping as Text, and set it.
const UserXattr = "user.spillway.layout"

// Layout is how one file (or, as a default for new files, one directory) is striped.
type Layout struct {
	ID      uint64 // names the file's objects; unique within the instance (0 for a directory)
	Size    uint64 // bytes per stripe
	Width   uint32 // servers the file uses
	Servers uint32 // servers of the instance
	Start   uint32 // the server of stripe 0
	// Length is the file's logical size: the metadata server keeps it here, not in the stub.
	Length uint64
}

// Validate reports what is wrong with a layout, naming the field and the allowed values.
func (l Layout) Validate() error {
	switch {
	case l.Servers == 0 || l.Servers > MaxServers:
		return fmt.Errorf("servers %d: expected 1 to %d", l.Servers, MaxServers)
	case l.Size == 0 || l.Size%Unit != 0 || l.Size > MaxSize:
		return fmt.Errorf("stripe_size %d: expected a multiple of %d up to %d", l.Size, Unit, MaxSize)
	case l.Width == 0 || l.Width > l.Servers:
		return fmt.Errorf("stripe_width %d: expected 1 to %d (the instance's servers)", l.Width, l.Servers)
	case l.Start >= l.Servers:
		return fmt.Errorf("start %d: expected 0 to %d", l.Start, l.Servers-1)
	}
	return nil
}

// FixedStart is the ID of a directory's layout whose files all start at its Start; a
// directory's layout with ID 0 lets each file start where its id says.
const FixedStart = 1

// ForFile is the layout of a new file with id under a directory's default layout.
func (l Layout) ForFile(id uint64) Layout {
	start := uint32(id % uint64(l.Servers))
	if l.ID == FixedStart {
		start = l.Start
	}
	return Layout{ID: id, Size: l.Size, Width: l.Width, Servers: l.Servers, Start: start}
}

// Server is the index of the server holding the file's stripe i.
func (l Layout) Server(i uint64) int {
	return int((uint64(l.Start) + i%uint64(l.Width)) % uint64(l.Servers))
}

// Slot is the position of server among the file's servers, or -1 if the file has no stripes
// there.
func (l Layout) Slot(server int) int {
	j := (uint64(server) + uint64(l.Servers) - uint64(l.Start)) % uint64(l.Servers)
	if j >= uint64(l.Width) {
		return -1
	}
	return int(j)
}

// Piece is the part of a file range that one server holds, contiguous in its object.
type Piece struct {
	Server    int
	ObjOffset uint64 // where in the server's object
	BufOffset uint64 // where in the caller's range
	Length    uint64
}

// Pieces cuts the file range [off, off+length) into the pieces each server holds, in file
// order. A piece never crosses a stripe boundary.
func (l Layout) Pieces(off, length uint64) []Piece {
	var out []Piece
	for done := uint64(0); done < length; {
		pos := off + done
		i := pos / l.Size
		within := pos % l.Size
		n := min(l.Size-within, length-done)
		out = append(out, Piece{Server: l.Server(i), ObjOffset: (i/uint64(l.Width))*l.Size + within, BufOffset: done, Length: n})
		done += n
	}
	return out
}

// ObjectSize is how long a server's object is when the file is length bytes long (0 if the
// server holds none of the file).
func (l Layout) ObjectSize(length uint64, server int) uint64 {
	j := l.Slot(server)
	if j < 0 {
		return 0
	}
	row := l.Size * uint64(l.Width)
	size := (length / row) * l.Size
	rest := length % row
	if lo := uint64(j) * l.Size; rest > lo {
		size += min(rest-lo, l.Size)
	}
	return size
}

// ObjectRange is the part of a server's object that holds bytes of the file range
// [off, off+length): contiguous, since a server's stripes follow each other in its object.
func (l Layout) ObjectRange(off, length uint64, server int) (objOff, objLen uint64) {
	if length == 0 || l.Slot(server) < 0 {
		return 0, 0
	}
	start := l.ObjectSize(off, server)
	end := l.ObjectSize(off+length, server)
	return start, end - start
}

// ObjectName is the name of the file's object on every server.
func ObjectName(id uint64) string { return fmt.Sprintf("%016x", id) }

// encodedSize is the size of Encode's bytes.
const encodedSize = 1 + 8 + 8 + 4 + 4 + 4 + 8

// EncodedSize is the size of Encode's bytes: what a metadata server stores after them in the
// same attribute is its own (package server's record of where the objects are).
const EncodedSize = encodedSize

const encodingVersion = 1

// Encode is the layout as the metadata server stores it (an extended attribute of the stub).
func (l Layout) Encode() []byte {
	b := make([]byte, 0, encodedSize)
	b = append(b, encodingVersion)
	b = binary.LittleEndian.AppendUint64(b, l.ID)
	b = binary.LittleEndian.AppendUint64(b, l.Size)
	b = binary.LittleEndian.AppendUint32(b, l.Width)
	b = binary.LittleEndian.AppendUint32(b, l.Servers)
	b = binary.LittleEndian.AppendUint32(b, l.Start)
	b = binary.LittleEndian.AppendUint64(b, l.Length)
	return b
}

// ErrCorrupt is a stored layout that cannot be read.
var ErrCorrupt = errors.New("corrupt stripe layout")

// Decode reads Encode's bytes and validates them.
func Decode(b []byte) (Layout, error) {
	if len(b) != encodedSize || b[0] != encodingVersion {
		return Layout{}, ErrCorrupt
	}
	l := Layout{
		ID:      binary.LittleEndian.Uint64(b[1:]),
		Size:    binary.LittleEndian.Uint64(b[9:]),
		Width:   binary.LittleEndian.Uint32(b[17:]),
		Servers: binary.LittleEndian.Uint32(b[21:]),
		Start:   binary.LittleEndian.Uint32(b[25:]),
		Length:  binary.LittleEndian.Uint64(b[29:]),
	}
	if err := l.Validate(); err != nil {
		return Layout{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return l, nil
}

// Text is the layout as users read it (the user.spillway.layout extended attribute, and
// libdatawarp's dw_get_stripe_configuration): "stripe_size=8388608 stripe_width=4 start=2".
func (l Layout) Text() string {
	return fmt.Sprintf("stripe_size=%d stripe_width=%d start=%d", l.Size, l.Width, l.Start)
}

// ParseText applies a user's "stripe_size=N stripe_width=N [start=N]" to base; fields left
// out keep base's values.
func ParseText(text string, base Layout) (Layout, error) {
	l := base
	fields := strings.Fields(strings.TrimRight(text, "\x00"))
	if len(fields) == 0 {
		return Layout{}, errors.New("empty layout; expected stripe_size=BYTES and/or stripe_width=SERVERS")
	}
	for _, f := range fields {
		key, val, ok := strings.Cut(f, "=")
		n, err := strconv.ParseUint(val, 10, 64)
		if !ok || err != nil {
			return Layout{}, fmt.Errorf("%q: expected key=number (stripe_size, stripe_width, start)", f)
		}
		switch key {
		case "stripe_size":
			l.Size = n
		case "stripe_width":
			l.Width = uint32(min(n, MaxServers+1))
		case "start":
			l.Start = uint32(min(n, MaxServers+1))
		default:
			return Layout{}, fmt.Errorf("unknown field %q; expected stripe_size, stripe_width or start", key)
		}
	}
	return l, l.Validate()
}
