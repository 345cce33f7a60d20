package store

import (
	"bytes"
	"sync"
	"sync/atomic"

	"github.com/spillway-hpc/spillway/internal/model"
)

// Decoded keeps, for a table whose records are many per session (the stages: a job that
// stages a checkpoint file by file holds hundreds, up to stage.max_job_stages), each record's
// bytes and the object decoded from them, so that reading a record again whose bytes have
// not changed costs a comparison and a copy instead of a JSON decode. Every decision on a
// session reads all its stages in the controller's write transaction, which every other write
// waits for: decoding them was most of a libdatawarp call's cost (docs/libdatawarp.md).
//
// It holds no authority: every read still reads the record's bytes in its own transaction,
// and a cached object is used only when those bytes are the very bytes it was decoded from
// (decoding is a pure function of them), so any engine, another controller's writes and a
// restore are all seen. Callers get their own deep copy (clone): decisions change what they
// read. It holds at most limit records (SetDecodedLimit, controller.decoded_cache); a full
// cache forgets half of them, chosen at random.
type Decoded[T any] struct {
	mu    sync.Mutex
	recs  map[string]decodedRecord[T]
	clone func(*T) *T
	hits  atomic.Int64
	miss  atomic.Int64
}

type decodedRecord[T any] struct {
	raw []byte // a copy: the engine's buffer is not ours to keep
	obj *T     // never handed out: callers get clones
}

// decodedLimit bounds every Decoded's records (controller.decoded_cache; 0 turns caching off).
var decodedLimit atomic.Int64

func init() { decodedLimit.Store(DefaultDecodedLimit) }

// DefaultDecodedLimit is controller.decoded_cache's default.
const DefaultDecodedLimit = 50_000

// SetDecodedLimit sets how many records each decoded cache may hold (0: none is kept).
func SetDecodedLimit(n int) { decodedLimit.Store(int64(max(n, 0))) }

func newDecoded[T any](clone func(*T) *T) *Decoded[T] {
	return &Decoded[T]{recs: map[string]decodedRecord[T]{}, clone: clone}
}

// get returns a copy of the object raw decodes to, if the cache holds it under key.
func (d *Decoded[T]) get(key string, raw []byte) (*T, bool) {
	d.mu.Lock()
	r, ok := d.recs[key]
	d.mu.Unlock()
	if !ok || !bytes.Equal(r.raw, raw) {
		d.miss.Add(1)
		return nil, false
	}
	d.hits.Add(1)
	return d.clone(r.obj), true
}

// put keeps obj, freshly decoded from raw, under key (a copy of both: the caller keeps obj).
func (d *Decoded[T]) put(key string, raw []byte, obj *T) {
	limit := int(decodedLimit.Load())
	if limit == 0 {
		return
	}
	rec := decodedRecord[T]{raw: bytes.Clone(raw), obj: d.clone(obj)}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.recs) >= limit {
		n := len(d.recs) / 2
		for k := range d.recs { // map order is random enough
			if n == 0 {
				break
			}
			delete(d.recs, k)
			n--
		}
	}
	d.recs[key] = rec
}

// Len is how many records the cache holds; Hits and Misses count the reads it answered and
// those it did not (tests and the benchmarks look at them).
func (d *Decoded[T]) Len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.recs)
}

// Hits counts the reads answered from the cache.
func (d *Decoded[T]) Hits() int64 { return d.hits.Load() }

// Misses counts the reads decoded.
func (d *Decoded[T]) Misses() int64 { return d.miss.Load() }

// cloneStage is a deep copy of a stage: its slices and map are its own.
func cloneStage(s *model.Stage) *model.Stage {
	c := new(model.Stage)
	copyStage(c, s)
	return c
}

// copyStage makes c a deep copy of s.
func copyStage(c, s *model.Stage) {
	*c = *s
	c.Warnings = cloneSlice(s.Warnings)
	c.Parts = cloneSlice(s.Parts)
	if s.Moved != nil {
		c.Moved = make(map[string]uint64, len(s.Moved))
		for k, v := range s.Moved {
			c.Moved[k] = v
		}
	}
}

// cloneSlice copies a slice, keeping nil nil and empty empty (as decoding made them).
func cloneSlice[E any](s []E) []E {
	if s == nil {
		return nil
	}
	return append(make([]E, 0, len(s)), s...)
}

func decodedBy[T any](t IDTable[T], clone func(*T) *T) IDTable[T] {
	t.decoded = newDecoded(clone)
	return t
}
