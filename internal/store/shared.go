package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// Shared keeps, for the tables listed through it (ListShared), each record's bytes and the
// object decoded from them, so that a listing of a large table decodes only the records whose
// bytes changed since an earlier listing. It holds no authority: every listing still reads
// every record of the table in its own transaction (another controller of a highly available
// cluster may have written, or a restore), compares its bytes, and returns what it read;
// records gone from the table are gone from the listing and from the cache — unless the
// engine says which keys were written since the listing it starts from (Versioned: SQLite,
// whose commits are all this process's): then those keys alone are read again. What it keeps
// is what the last listing of each table read: its memory follows the state, not the churn.
//
// The objects it returns are shared by every listing that read the same bytes: callers must
// not change them (the controller's listings only render them; decisions read their own).
// The zero value is an empty cache, ready to use.
type Shared struct {
	mu     sync.Mutex
	tables map[string]sharedTable // kind → its records, replaced whole by each listing
}

// sharedTable is what a listing read of one kind: its records in key order and, when the
// engine numbers its commits (Versioned), the version of the state they are (src the
// engine's, ok false when unknown).
type sharedTable struct {
	records []sharedRecord
	src     any
	version uint64
	ok      bool
}

// sharedRecord is one record as a listing read it: its key, its bytes and the object they
// decode to (a *T of the table's type). Never changed once made: listings share it.
type sharedRecord struct {
	key string
	raw []byte
	obj any
}

// Records is how many records the cache holds, over every table (what its memory follows).
func (s *Shared) Records() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, t := range s.tables {
		n += len(t.records)
	}
	return n
}

func (s *Shared) last(kind string) sharedTable {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tables[kind]
}

// keep publishes what a listing read as the kind's records. Two listings at once each build
// their own list from what they read, and the later publication wins: either is the whole
// table as of some transaction, and the next listing compares bytes anyway.
func (s *Shared) keep(kind string, t sharedTable) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tables == nil {
		s.tables = map[string]sharedTable{}
	}
	s.tables[kind] = t
}

// Versioned is a KV of a read transaction whose engine numbers its commits and remembers
// which keys the latest ones wrote (SQLite, whose one process writes the state: its commits
// are all this process's). A listing through Shared then reads again only the keys written
// since the listing it starts from, not the whole table: its cost follows what changed, not
// the state.
type Versioned interface {
	// Version is the version of the state this transaction reads (the commits it sees) and
	// the engine it is of; ok false when it cannot be told (a commit was under way when the
	// transaction took its snapshot, or it has written).
	Version() (src any, version uint64, ok bool)
	// ChangedSince lists the keys of kind that commits after version since, up to this
	// transaction's version, wrote (put or deleted), in any order, repeats possible; ok false
	// when the engine no longer remembers all of them.
	ChangedSince(kind string, since uint64) (keys []string, ok bool)
}

// Versioned reports whether the transaction knows the version of the state it reads
// (Versioned): listings through Shared then cost what changed since the previous one.
func (tx *Tx) Versioned() bool {
	vs, ok := tx.kv.(Versioned)
	if !ok {
		return false
	}
	_, _, ok = vs.Version()
	return ok
}

// sharedLookahead is how many records of the last listing a record's bytes are compared
// with before it is decoded: deleted records in between cost no decoding, up to this many
// in a row.
const sharedLookahead = 4

// ValueScanner is a KV that can read one kind's values without their keys, in ascending key
// order (SQLite: a column fewer per row). Listings through Shared need no more; engines
// without it (etcd) are read with Scan.
type ValueScanner interface {
	ScanValues(kind string, fn func(value []byte) error) error
}

// scanValues visits the values of kind in key order, through ValueScanner when the engine
// has it.
func (tx *Tx) scanValues(kind string, fn func(value []byte) error) error {
	if vs, ok := tx.kv.(ValueScanner); ok {
		return vs.ScanValues(kind, fn)
	}
	return tx.kv.Scan(kind, func(_ string, value []byte) error { return fn(value) })
}

// ListShared is List through the cache s: every object of the table in key order, as of tx,
// decoding only the records whose bytes differ from those the previous listing of the table
// read. The objects are shared (see Shared): read them, never change them.
func (t Table[T]) ListShared(tx *Tx, s *Shared) ([]*T, error) {
	// The last listing and this scan are both in key order: one walk of each matches a
	// record to the one at its place last time. A record whose bytes are not there (changed,
	// new, or after more deletions than the look-ahead) is decoded, and its key, from the
	// object, finds its place in the last listing. No key is read: the values are enough
	// (ValueScanner).
	last := s.last(t.kind)
	var src any
	var version uint64
	versioned := false
	vs, _ := tx.kv.(Versioned)
	if vs != nil {
		src, version, versioned = vs.Version()
	}
	if versioned && last.ok && last.src == src && last.version <= version {
		if keys, ok := vs.ChangedSince(t.kind, last.version); ok {
			return t.listChanged(tx, s, last.records, keys, sharedTable{src: src, version: version, ok: true})
		}
	}
	before, next := last.records, 0
	now := make([]sharedRecord, 0, len(before))
	out := make([]*T, 0, len(before))
	err := tx.scanValues(t.kind, func(raw []byte) error {
		// At its place, or a few places on (the records between were deleted).
		for ahead := next; ahead < min(next+sharedLookahead, len(before)); ahead++ {
			if bytes.Equal(before[ahead].raw, raw) {
				now = append(now, before[ahead])
				out = append(out, before[ahead].obj.(*T))
				next = ahead + 1
				return nil
			}
		}
		obj := new(T)
		if err := json.Unmarshal(raw, obj); err != nil {
			return fmt.Errorf("%s: corrupt record: %v (%.80q)", t.kind, err, raw)
		}
		key := t.key(obj)
		for next < len(before) && before[next].key <= key {
			next++ // gone since, or this record as it was
		}
		// A copy: the engine's buffer is not ours to keep past the scan.
		now = append(now, sharedRecord{key: key, raw: bytes.Clone(raw), obj: obj})
		out = append(out, obj)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.keep(t.kind, sharedTable{records: now, src: src, version: version, ok: versioned})
	return out, nil
}

// listChanged is ListShared from the records of an earlier listing (before, in key order)
// and the keys written since (Versioned.ChangedSince): those are read again, one by one, and
// decoded when their bytes changed; the others are as they were. mark is the version the
// result is kept as.
func (t Table[T]) listChanged(tx *Tx, s *Shared, before []sharedRecord, changed []string, mark sharedTable) ([]*T, error) {
	slices.Sort(changed)
	changed = slices.Compact(changed)
	now := make([]sharedRecord, 0, len(before)+len(changed))
	i := 0
	for _, key := range changed {
		for i < len(before) && before[i].key < key {
			now = append(now, before[i])
			i++
		}
		var old *sharedRecord
		if i < len(before) && before[i].key == key {
			old = &before[i]
			i++
		}
		raw, err := tx.kv.Get(t.kind, key)
		if errors.Is(err, ErrNotFound) {
			continue // deleted
		}
		if err != nil {
			return nil, err
		}
		if old != nil && bytes.Equal(old.raw, raw) {
			now = append(now, *old)
			continue
		}
		obj := new(T)
		if err := json.Unmarshal(raw, obj); err != nil {
			return nil, fmt.Errorf("%s: corrupt record: %v (%.80q)", t.kind, err, raw)
		}
		now = append(now, sharedRecord{key: key, raw: bytes.Clone(raw), obj: obj})
	}
	now = append(now, before[i:]...)
	out := make([]*T, len(now))
	for j := range now {
		out[j] = now[j].obj.(*T)
	}
	mark.records = now
	s.keep(t.kind, mark)
	return out, nil
}
