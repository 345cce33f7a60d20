package store

import (
	"errors"
	"sync"
)

// WriteVersioned is a KV of a write transaction whose engine numbers its commits
// (Versioned): the version of the state the transaction started from.
type WriteVersioned interface {
	WriteVersion() (src any, version uint64, ok bool)
	ChangedSince(kind string, since uint64) (keys []string, ok bool)
	// Wrote reports whether this transaction wrote the key (put or deleted).
	Wrote(kind, key string) bool
}

// Rows keeps records of one table read by id in write transactions, on an engine that says
// which keys its commits wrote (WriteVersioned: SQLite): a record no commit wrote since it
// was read is not read again. What a heartbeat reads of a node's thousands of fragments'
// counters (each compared with the report, and written only when it changed) costs the
// records that changed, not the node's. On other engines every Get reads the store.
//
// It holds the records as read, the state before the transaction's own writes: a record the
// transaction then writes is dropped at the next transaction's start (its commit lists it),
// and one whose transaction rolls back is still the committed one. The zero value is empty,
// ready to use.
type Rows[T any] struct {
	mu      sync.Mutex
	tx      uint64 // the transaction the rows are valid in (its serial)
	src     any    // the engine of version
	version uint64 // the rows are the state of this version
	rows    map[string]*T
}

// sync makes the rows valid in tx: those written by commits since version are dropped (all
// of them when that cannot be told). ok false: tx cannot use them.
func (r *Rows[T]) sync(tx *Tx, kind string) bool {
	if r.tx == tx.serial {
		return true
	}
	wv, ok := tx.kv.(WriteVersioned)
	if !ok {
		return false
	}
	src, v, ok := wv.WriteVersion()
	if !ok {
		return false
	}
	keys, known := wv.ChangedSince(kind, r.version)
	if r.src != src || !known || r.version > v {
		r.rows = nil
	}
	for _, k := range keys {
		delete(r.rows, k)
	}
	if r.rows == nil {
		r.rows = map[string]*T{}
	}
	r.tx, r.src, r.version = tx.serial, src, v
	return true
}

// GetCached is Get through the rows r of a write transaction: a copy of the record (its
// slices shared with the rows': replace them, never change their elements).
func (t IDTable[T]) GetCached(tx *Tx, r *Rows[T], id int64) (*T, error) {
	if r == nil {
		return t.Get(tx, id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.sync(tx, t.kind) {
		return t.Get(tx, id)
	}
	key := idKey(id)
	if tx.kv.(WriteVersioned).Wrote(t.kind, key) {
		return t.Get(tx, id) // its own write, not yet in the rows
	}
	if o, ok := r.rows[key]; ok {
		if o == nil {
			return nil, ErrNotFound
		}
		c := *o
		return &c, nil
	}
	o, err := t.Get(tx, id)
	switch {
	case errors.Is(err, ErrNotFound):
		r.rows[key] = nil
	case err != nil:
		return nil, err
	default:
		c := *o
		r.rows[key] = &c
	}
	return o, err
}
