package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
)

// Shared keeps, for the tables listed through it (ListShared), each record's bytes and the
// object decoded from them, so that a listing of a large table decodes only the records whose
// bytes changed since an earlier listing. It holds no authority: every listing still reads
// every record of the table in its own transaction (another controller of a highly available
// cluster may have written, or a restore), compares its bytes, and returns what it read;
// records gone from the table are gone from the listing and from the cache. What it keeps is
// what the last listing of each table read: its memory follows the state, not the churn.
//
// The objects it returns are shared by every listing that read the same bytes: callers must
// not change them (the controller's listings only render them; decisions read their own).
// The zero value is an empty cache, ready to use.
type Shared struct {
	mu     sync.Mutex
	tables map[string][]sharedRecord // kind → its records in key order, replaced whole by each listing
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
	for _, records := range s.tables {
		n += len(records)
	}
	return n
}

func (s *Shared) last(kind string) []sharedRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tables[kind]
}

// keep publishes what a listing read as the kind's records. Two listings at once each build
// their own map from what they read, and the later publication wins: either is the whole
// table as of some transaction, and the next listing compares bytes anyway.
func (s *Shared) keep(kind string, records []sharedRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tables == nil {
		s.tables = map[string][]sharedRecord{}
	}
	s.tables[kind] = records
}

// ListShared is List through the cache s: every object of the table in key order, as of tx,
// decoding only the records whose bytes differ from those the previous listing of the table
// read. The objects are shared (see Shared): read them, never change them.
func (t Table[T]) ListShared(tx *Tx, s *Shared) ([]*T, error) {
	// Both the last listing and this scan are in key order: one walk of each matches a key
	// to its record of last time, without hashing.
	before, next := s.last(t.kind), 0
	now := make([]sharedRecord, 0, len(before))
	out := make([]*T, 0, len(before))
	err := tx.kv.Scan(t.kind, func(key string, raw []byte) error {
		for next < len(before) && before[next].key < key {
			next++ // gone since, or a key this scan did not come to in order
		}
		if next < len(before) && before[next].key == key && bytes.Equal(before[next].raw, raw) {
			now = append(now, before[next])
			out = append(out, before[next].obj.(*T))
			return nil
		}
		obj := new(T)
		if err := json.Unmarshal(raw, obj); err != nil {
			return fmt.Errorf("%s %s: corrupt record: %v", t.kind, key, err)
		}
		// A copy: the engine's buffer is not ours to keep past the scan.
		now = append(now, sharedRecord{key: key, raw: bytes.Clone(raw), obj: obj})
		out = append(out, obj)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.keep(t.kind, now)
	return out, nil
}
