// Package store keeps Spillway's state: DataWarp's objects behind one transactional interface.
//
// Two layers, as in JuiceFS's metadata engines: an Engine is a small transactional key-value
// store (SQLite today, etcd later) that every engine implements the same way — the
// conformance suite in package storetest proves it — and the typed layer here (Tables and the
// session-token index) turns bytes into model objects once, for every engine.
package store

import (
	"context"
	"errors"
)

// ErrNotFound is returned by Get when the key does not exist.
var ErrNotFound = errors.New("not found")

// ErrReadOnly is returned when a View transaction tries to write.
var ErrReadOnly = errors.New("write in a read-only transaction")

// ErrFenced is wrapped by an Update's error when the engine is fenced (a highly available
// controller's: see package ha) and this process no longer holds the leadership its writes
// are guarded by: nothing was written, and nothing this process writes will commit until it
// is elected again.
var ErrFenced = errors.New("this controller is not the leader: its writes are fenced")

// Engine is a transactional key-value store. Every Update is atomic and serializable: either all
// of its writes are durable when Update returns nil, or none are. Update and View may be
// called from many goroutines. An engine may run fn again when its transaction lost a race
// with another writer (etcd does, SQLite never): fn must not depend on effects of an earlier
// run of itself outside the KV.
type Engine interface {
	Update(ctx context.Context, fn func(KV) error) error
	View(ctx context.Context, fn func(KV) error) error
	Close() error
}

// KV is one transaction's view of the store. Keys are grouped by kind; Scan visits one kind in
// ascending key order. A transaction reads its own writes.
type KV interface {
	Get(kind, key string) ([]byte, error)
	Put(kind, key string, value []byte) error
	Delete(kind, key string) error // deleting a missing key is not an error
	Scan(kind string, fn func(key string, value []byte) error) error
	// ScanPrefix visits the keys of one kind that begin with prefix, in ascending key order
	// (a range read: its cost is that of the keys it visits, not of the kind). Scan is
	// ScanPrefix with an empty prefix.
	ScanPrefix(kind, prefix string, fn func(key string, value []byte) error) error
	// NextSeq returns the next number of the named sequence, starting at 1. Numbers handed
	// out by committed transactions are never handed out again.
	NextSeq(name string) (int64, error)
	// Kinds lists every kind that holds at least one key, in ascending order (backup).
	Kinds() ([]string, error)
	// Sequences returns every sequence's last number handed out (backup).
	Sequences() (map[string]int64, error)
	// SetSequence sets a sequence's last number handed out (restore): the next NextSeq returns
	// value+1. 0 forgets the sequence.
	SetSequence(name string, value int64) error
}

// IndexJoiner is a KV that can read the records a child index lists together with the index,
// in one query (SQLite joins them): a session's objects cost a query per table, not a Get per
// object. Engines without it (etcd) are read entry by entry; the result is the same.
type IndexJoiner interface {
	// ScanJoined visits, in index key order, the index keys of indexKind beginning with prefix
	// and, for each, the record of kind whose key is the rest of the index key. A record an
	// entry lists that does not exist is an error wrapping ErrNotFound.
	ScanJoined(indexKind, prefix, kind string, fn func(key string, value []byte) error) error
}

type backgroundKey struct{}

// Background marks ctx's write transactions as background work (the executor's): an engine
// that serializes its writers (SQLite) lets the requests' transactions waiting beside them
// go first, up to executor.yield_to_requests of them.
func Background(ctx context.Context) context.Context {
	return context.WithValue(ctx, backgroundKey{}, true)
}

// IsBackground reports whether ctx was marked by Background.
func IsBackground(ctx context.Context) bool {
	b, _ := ctx.Value(backgroundKey{}).(bool)
	return b
}
