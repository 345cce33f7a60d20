package cache

// Persistence: dirty data survives an agent restart. The data is in the stripe objects on the
// SSD; what must survive with it is which bytes of which file are dirty. The cache keeps an
// operation log as records appended to a buffer (Log): the I/O layer appends them to its log
// file before it acknowledges the write that produced them (a plain write survives the
// agent's restart; fdatasync as well for a node's crash). Snapshot compacts: it encodes the
// state now (the same records) for the I/O layer to write to a new file, rename over the old
// snapshot and start an empty log. Recover reads a snapshot followed by its log.
//
// Record: kind (1 byte), payload length (uvarint), payload, CRC-32C of kind and payload
// (4 bytes, little endian). A record cut short at the end of the bytes is a torn append
// (never acknowledged) and ends the log; so do trailing zero bytes. Anything else that does
// not decode is ErrCorrupt.
//
//	header   epoch, extent size
//	file     no, dev, ino, PFS size, mtime, ctime, layout (stripe.Layout.Encode or empty), path
//	dirty    no, extent, hull lo, hull hi, end, seq   (writes up to seq dirty the hull)
//	flushed  no, extent, seq                          (writes up to seq are on the PFS)
//	attrs    no, size, mtime, ctime                   (what the cache last saw of the PFS file)
//	truncate no, size
//	drop     no                                       (unlinked or discarded)
//
// The flush epoch is the seq: a flushed record clears an extent only of the writes it
// covers, so a write during the flush (logged with a later seq) stays dirty in any order.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"sort"

	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

const (
	recHeader byte = iota + 1
	recFile
	recDirty
	recFlushed
	recAttrs
	recTruncate
	recDrop
	recMax
)

// MaxPath bounds a path in the log.
const MaxPath = 4096

const maxPayload = 64 + MaxPath + 64

// ErrCorrupt is a log or snapshot that cannot be read.
var ErrCorrupt = errors.New("corrupt cache log")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func appendRecord(b []byte, kind byte, payload []byte) []byte {
	b = append(b, kind)
	b = binary.AppendUvarint(b, uint64(len(payload)))
	b = append(b, payload...)
	crc := crc32.Update(crc32.Checksum([]byte{kind}, castagnoli), castagnoli, payload)
	return binary.LittleEndian.AppendUint32(b, crc)
}

func uv(b []byte, vs ...uint64) []byte {
	for _, v := range vs {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

// Log takes the records appended since the last call. After every call the I/O layer appends
// them to its log, in order, before it carries out the call's actions or acknowledges a write
// the call admitted or woke: a write is acknowledged only once its extent is recorded dirty,
// and an extent's object range is punched (ActEvict) only once the record that made it clean
// is in the log, so a recovery never takes a hole for dirty data.
func (c *Cache) Log() []byte {
	b := c.log
	c.log = nil
	return b
}

func (c *Cache) rec(kind byte, fields ...uint64) {
	var buf [80]byte
	c.log = appendRecord(c.log, kind, uv(buf[:0], fields...))
}

func (c *Cache) logFile(f *file) {
	if f.logNo != 0 {
		return
	}
	if len(c.log) == 0 && c.nextLogNo == 0 {
		c.rec(recHeader, c.epoch, c.cfg.ExtentSize)
	}
	c.nextLogNo++
	f.logNo = c.nextLogNo
	c.log = appendRecord(c.log, recFile, fileRecord(f))
}

func fileRecord(f *file) []byte {
	p := uv(nil, uint64(f.logNo), f.key.Dev, f.key.Ino, f.seen.Size, uint64(f.seen.Mtime), uint64(f.seen.Ctime))
	var l []byte
	if f.striped {
		l = f.layout.Encode()
	}
	p = binary.AppendUvarint(p, uint64(len(l)))
	p = append(p, l...)
	path := f.path
	if len(path) > MaxPath {
		path = path[:MaxPath]
	}
	return append(p, path...)
}

// logDirty records e's dirty hull if it grew past what the log says.
func (c *Cache) logDirty(e *extent) {
	if e.logHi != 0 && e.dlo >= e.logLo && e.dhi <= e.logHi && e.end <= e.logEnd {
		return
	}
	c.logFile(e.f)
	lo, hi := e.dlo, e.dhi
	if e.logHi != 0 {
		lo, hi = min(lo, e.logLo), max(hi, e.logHi)
	}
	e.logLo, e.logHi, e.logEnd = lo, hi, max(e.end, e.logEnd)
	c.rec(recDirty, uint64(e.f.logNo), e.idx, lo, hi, e.logEnd, e.newest)
}

func (c *Cache) logFlushed(e *extent) {
	if e.f.logNo != 0 {
		c.rec(recFlushed, uint64(e.f.logNo), e.idx, e.flushNewest)
	}
}

func (c *Cache) logAttrs(f *file) {
	if f.logNo != 0 {
		c.rec(recAttrs, uint64(f.logNo), f.seen.Size, uint64(f.seen.Mtime), uint64(f.seen.Ctime))
	}
}

func (c *Cache) logTruncate(f *file, size uint64) {
	if f.logNo != 0 {
		c.rec(recTruncate, uint64(f.logNo), size)
	}
}

func (c *Cache) logDrop(f *file) {
	if f.logNo != 0 {
		c.rec(recDrop, uint64(f.logNo))
		f.logNo = 0
	}
}

// Snapshot is the durable state now (its files with dirty data), to replace the snapshot and
// log so far; the records not yet taken by Log are in it and are dropped.
func (c *Cache) Snapshot() []byte {
	c.log = nil
	c.nextLogNo = 0
	keys := make([]FileKey, 0, len(c.files))
	for k := range c.files {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].Dev < keys[j].Dev || keys[i].Dev == keys[j].Dev && keys[i].Ino < keys[j].Ino
	})
	c.rec(recHeader, c.epoch, c.cfg.ExtentSize)
	for _, k := range keys {
		f := c.files[k]
		f.logNo = 0
		idxs := make([]uint64, 0, len(f.ext))
		for idx, e := range f.ext {
			e.logLo, e.logHi, e.logEnd = 0, 0, 0
			if e.state == Dirty || e.state == Flushing {
				idxs = append(idxs, idx)
			}
		}
		if len(idxs) == 0 {
			continue
		}
		sort.Slice(idxs, func(i, j int) bool { return idxs[i] < idxs[j] })
		c.logFile(f)
		for _, idx := range idxs {
			e := f.ext[idx]
			lo, hi, seq := e.dlo, e.dhi, e.newest
			if e.state == Flushing {
				lo, hi, seq = min(lo, e.flo), max(hi, e.fhi), max(seq, e.flushNewest)
			}
			e.logLo, e.logHi, e.logEnd = lo, hi, e.end
			c.rec(recDirty, uint64(f.logNo), idx, lo, hi, e.end, seq)
		}
	}
	return c.Log()
}

// Record is one decoded log record.
type Record struct {
	Kind                byte
	No                  uint32
	Epoch, ExtentSize   uint64 // header
	Key                 FileKey
	Attrs               Attrs // file, attrs; Attrs.Size is also truncate's size
	Layout              stripe.Layout
	Path                string
	Extent, Lo, Hi, End uint64 // dirty, flushed
	Seq                 uint64
}

// Decode reads a snapshot and log. It stops at a torn last record or trailing zeros.
func Decode(b []byte) ([]Record, error) {
	var out []Record
	for len(b) > 0 {
		if allZero(b) {
			break
		}
		kind := b[0]
		n, k := binary.Uvarint(b[1:])
		if k == 0 {
			break // torn
		}
		if k < 0 || kind == 0 || kind >= recMax || n > maxPayload {
			return out, fmt.Errorf("%w: bad record header", ErrCorrupt)
		}
		start := 1 + k
		if uint64(len(b)-start) < n+4 {
			break // torn
		}
		payload := b[start : start+int(n)]
		crc := binary.LittleEndian.Uint32(b[start+int(n):])
		if crc32.Update(crc32.Checksum([]byte{kind}, castagnoli), castagnoli, payload) != crc {
			return out, fmt.Errorf("%w: checksum of record %d", ErrCorrupt, len(out)+1)
		}
		r, err := decodeRecord(kind, payload)
		if err != nil {
			return out, fmt.Errorf("%w: record %d: %v", ErrCorrupt, len(out)+1, err)
		}
		out = append(out, r)
		b = b[start+int(n)+4:]
	}
	return out, nil
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) u() uint64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.err = errors.New("short field")
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *reader) no() uint32 {
	v := r.u()
	if v == 0 || v > math.MaxUint32 {
		r.err = errors.New("bad file number")
	}
	return uint32(v)
}

func decodeRecord(kind byte, p []byte) (Record, error) {
	r := &reader{b: p}
	rec := Record{Kind: kind}
	switch kind {
	case recHeader:
		rec.Epoch, rec.ExtentSize = r.u(), r.u()
	case recFile:
		rec.No = r.no()
		rec.Key = FileKey{r.u(), r.u()}
		rec.Attrs = Attrs{Size: r.u(), Mtime: int64(r.u()), Ctime: int64(r.u())}
		n := r.u()
		if r.err == nil && n > uint64(len(r.b)) {
			r.err = errors.New("short layout")
		}
		if r.err == nil && n > 0 {
			l, err := stripe.Decode(r.b[:n])
			if err != nil {
				r.err = err
			}
			rec.Layout = l
		}
		if r.err == nil {
			r.b = r.b[n:]
			if len(r.b) > MaxPath {
				r.err = errors.New("path too long")
			}
			rec.Path = string(r.b)
			r.b = nil
		}
	case recDirty:
		rec.No, rec.Extent, rec.Lo, rec.Hi, rec.End, rec.Seq = r.no(), r.u(), r.u(), r.u(), r.u(), r.u()
	case recFlushed:
		rec.No, rec.Extent, rec.Seq = r.no(), r.u(), r.u()
	case recAttrs:
		rec.No = r.no()
		rec.Attrs = Attrs{Size: r.u(), Mtime: int64(r.u()), Ctime: int64(r.u())}
	case recTruncate:
		rec.No = r.no()
		rec.Attrs.Size = r.u()
	case recDrop:
		rec.No = r.no()
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = errors.New("trailing bytes")
	}
	return rec, r.err
}

// Recover rebuilds a cache from a snapshot and its log (Decode's input): dirty extents stay
// dirty, those that were flushing are dirty again, fetching and clean ones are absent. The
// actions punch every part of the recovered files' objects that is not dirty data; the I/O
// layer removes the objects of every other file. Then it must write Snapshot() as the new
// snapshot and start an empty log.
func Recover(cfg Config, b []byte) (*Cache, []Action, error) {
	c, err := New(cfg)
	if err != nil {
		return nil, nil, err
	}
	recs, err := Decode(b)
	if err != nil {
		return nil, nil, err
	}
	E := c.cfg.ExtentSize
	maxIdx := (uint64(1) << 62) / E
	byNo := map[uint32]*file{}
	// Each extent's dirty records, each cleared by a flushed record covering its seq, so that
	// the replay's hull is exactly the live cache's (an extent the cache made clean, and may
	// have evicted, must not come back dirty).
	type rrec struct{ lo, hi, end, seq uint64 }
	recsOf := map[*file]map[uint64][]rrec{}
	var epoch uint64
	for i, r := range recs {
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: record %d: %s", ErrCorrupt, i+1, fmt.Sprintf(format, args...))
		}
		var f *file
		if r.Kind != recHeader {
			if f = byNo[r.No]; f == nil && r.Kind != recFile {
				return nil, nil, bad("file %d not declared", r.No)
			}
		}
		switch r.Kind {
		case recHeader:
			if r.ExtentSize != E {
				return nil, nil, bad("extent size %d, the cache's is %d", r.ExtentSize, E)
			}
			epoch = max(epoch, r.Epoch)
			byNo = map[uint32]*file{} // a snapshot starts afresh
		case recFile:
			if f != nil {
				return nil, nil, bad("file %d declared twice", r.No)
			}
			f = c.files[r.Key]
			if f == nil {
				f = &file{key: r.Key, ext: map[uint64]*extent{}, policy: c.cfg.Defaults}
				if err := c.setLayout(f, r.Layout); err != nil {
					return nil, nil, bad("%v", err)
				}
				c.files[r.Key] = f
			}
			f.path, f.seen, f.pfsEnd = r.Path, r.Attrs, r.Attrs.Size
			byNo[r.No] = f
		case recDirty:
			if r.Extent >= maxIdx || r.Lo >= r.Hi || r.Hi > r.End || r.End > E || !c.held(f, r.Extent) {
				return nil, nil, bad("dirty extent %d [%d, %d) end %d", r.Extent, r.Lo, r.Hi, r.End)
			}
			if recsOf[f] == nil {
				recsOf[f] = map[uint64][]rrec{}
			}
			recsOf[f][r.Extent] = append(recsOf[f][r.Extent], rrec{r.Lo, r.Hi, r.End, r.Seq})
			f.seq = max(f.seq, r.Seq)
		case recFlushed:
			keep := recsOf[f][r.Extent][:0]
			for _, x := range recsOf[f][r.Extent] {
				if x.seq > r.Seq {
					keep = append(keep, x)
				}
			}
			recsOf[f][r.Extent] = keep
		case recAttrs:
			f.seen, f.pfsEnd = r.Attrs, r.Attrs.Size
		case recTruncate:
			for idx, xs := range recsOf[f] {
				start := idx * E
				keep := xs[:0]
				for _, x := range xs {
					if start+x.end > r.Attrs.Size {
						x.end = r.Attrs.Size - min(start, r.Attrs.Size)
						x.hi = min(x.hi, x.end)
					}
					if x.lo < x.hi {
						keep = append(keep, x)
					}
				}
				recsOf[f][idx] = keep
			}
			f.pfsEnd = min(f.pfsEnd, r.Attrs.Size)
		case recDrop:
			delete(recsOf, f)
			delete(byNo, r.No)
			if c.files[f.key] == f {
				delete(c.files, f.key)
			}
		}
	}
	c.epoch = epoch + 1
	for f, m := range recsOf {
		for idx, xs := range m {
			if len(xs) == 0 {
				continue
			}
			e := c.newExtent(f, idx)
			for _, x := range xs {
				e.dlo, e.dhi, e.end = min(e.dlo, x.lo), max(e.dhi, x.hi), max(e.end, x.end)
				e.newest = max(e.newest, x.seq)
			}
		}
	}
	c.begin()
	keys := make([]FileKey, 0, len(c.files))
	for k := range c.files {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].Dev < keys[j].Dev || keys[i].Dev == keys[j].Dev && keys[i].Ino < keys[j].Ino
	})
	for _, k := range keys {
		f := c.files[k]
		if len(f.ext) == 0 {
			delete(c.files, k)
			continue
		}
		idxs := make([]uint64, 0, len(f.ext))
		for idx := range f.ext {
			idxs = append(idxs, idx)
		}
		sort.Slice(idxs, func(i, j int) bool { return idxs[i] < idxs[j] })
		var obj uint64 // the object up to here is accounted for
		for _, idx := range idxs {
			e := f.ext[idx]
			e.state = Absent
			e.oldest = e.newest
			c.setState(e, Dirty)
			c.setCharge(e, roundUp(e.end, Block))
			o := c.objOff(f, idx*E)
			if o > obj {
				c.emit(Action{Kind: ActEvict, File: f.key, Path: f.path, Range: Range{Off: c.fileOff(f, obj), Len: o - obj, ObjOff: obj}})
			}
			obj = o + E
		}
		c.emit(Action{Kind: ActEvict, File: f.key, Path: f.path, Range: Range{Off: c.fileOff(f, obj), ObjOff: obj}})
	}
	return c, append([]Action(nil), c.out...), nil
}
