package store

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/spillway-hpc/spillway/internal/model"
)

// Children keeps, for a table whose objects are many per parent (the stages: a job that
// stages a checkpoint file by file holds hundreds, up to stage.max_job_stages), each parent's
// children as write transactions read them (ChildrenOf), on an engine that says which keys
// its commits wrote (WriteVersioned: SQLite, whose commits are all this process's): a child
// no commit wrote since it was read, under a parent whose index no commit changed since, is
// not read again. Every decision on a session (a libdatawarp call, each executor pass and
// effect outcome) reads all its stages in the write transaction the other writes wait for:
// reading them from the store was most of a call's cost, and grew with the session.
//
// As Rows, it holds the children as committed: a transaction that has written anything reads
// the store (its own writes are not in the cache), and so do read transactions and engines
// that do not number their commits (etcd). Callers get their own deep copies: decisions
// change what they read. It holds at most controller.decoded_cache records
// (SetDecodedLimit); past it, it forgets every parent.
type Children[T any] struct {
	mu      sync.Mutex
	copy    func(dst, src *T) // a deep copy
	src     any               // the engine of version
	version uint64            // the children are the state of this version
	tx      uint64            // the transaction synced last (its serial)
	parents map[string]*childSet[T]
	owner   map[string]string // a child's key → its parent's prefix (one parent a table: Stages)
	records int               // held, over every parent
	hits    atomic.Int64
	reads   atomic.Int64
}

// childSet is one parent's children: by key, in key order, and the keys a commit wrote since
// they were read (their record, or their index entry under this parent).
type childSet[T any] struct {
	rows  map[string]*T // never handed out: callers get clones
	order []string      // rows' keys in order; nil: to sort again
	dirty map[string]bool
}

func newChildren[T any](copy func(dst, src *T)) *Children[T] {
	return &Children[T]{copy: copy, parents: map[string]*childSet[T]{}, owner: map[string]string{}}
}

// clone is a deep copy of o.
func (c *Children[T]) clone(o *T) *T {
	d := new(T)
	c.copy(d, o)
	return d
}

// Hits counts the listings answered from the cache (wholly or with the few children written
// since); Reads those read whole from the store.
func (c *Children[T]) Hits() int64 { return c.hits.Load() }

// Reads counts the listings of a parent read whole from the store.
func (c *Children[T]) Reads() int64 { return c.reads.Load() }

// sync makes the cache valid in tx, which has written nothing: the children and index
// entries written by commits since version are marked to be read again (every parent is
// forgotten when that cannot be told). ok false: tx cannot use the cache.
func (c *Children[T]) sync(tx *Tx, kind string) bool {
	vs, ok := tx.kv.(Versioned)
	if !ok {
		return false
	}
	if _, _, ok := vs.Version(); !ok {
		return false // a read transaction, or one that has written: its own writes are not here
	}
	wv, ok := tx.kv.(WriteVersioned)
	if !ok {
		return false
	}
	if c.tx == tx.serial {
		return true
	}
	src, v, ok := wv.WriteVersion()
	if !ok {
		return false
	}
	records, known := wv.ChangedSince(kind, c.version)
	entries, known2 := wv.ChangedSince(childIndex, c.version)
	if c.src != src || !known || !known2 || c.version > v {
		c.forget()
	} else if len(c.parents) > 0 {
		for _, k := range records {
			if p, held := c.owner[k]; held {
				c.parents[p].mark(k)
			}
		}
		for _, e := range entries {
			// <parent kind>/<parent key>/<kind>/<key>: the parent's prefix and the child's key
			i := strings.LastIndexByte(e, '/')
			if set := c.parents[e[:i+1]]; set != nil {
				set.mark(e[i+1:])
			}
		}
	}
	c.tx, c.src, c.version = tx.serial, src, v
	return true
}

func (c *Children[T]) forget() {
	c.parents = map[string]*childSet[T]{}
	c.owner = map[string]string{}
	c.records = 0
}

// drop forgets one parent.
func (c *Children[T]) drop(prefix string) {
	for k := range c.parents[prefix].rows {
		delete(c.owner, k)
	}
	c.records -= len(c.parents[prefix].rows)
	delete(c.parents, prefix)
}

func (s *childSet[T]) mark(key string) {
	if s.dirty == nil {
		s.dirty = map[string]bool{}
	}
	s.dirty[key] = true
}

// childrenCached is ChildrenOfKey through the cache, of the children keep keeps (nil: all):
// ok false when tx cannot use it (the caller reads the store).
func (t IDTable[T]) childrenCached(tx *Tx, prefix string, keep func(*T) bool) ([]*T, bool, error) {
	c := t.children
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.sync(tx, t.kind) {
		return nil, false, nil
	}
	set := c.parents[prefix]
	if set == nil {
		limit := int(decodedLimit.Load())
		if limit == 0 {
			return nil, false, nil
		}
		objs, err := t.childrenRead(tx, prefix)
		if err != nil {
			return nil, true, err
		}
		c.reads.Add(1)
		if c.records+len(objs) > limit {
			c.forget()
		}
		set = &childSet[T]{rows: make(map[string]*T, len(objs)), order: make([]string, 0, len(objs))}
		for _, o := range objs {
			k := t.key(o)
			set.rows[k] = c.clone(o)
			set.order = append(set.order, k)
			c.owner[k] = prefix
		}
		c.parents[prefix] = set
		c.records += len(objs)
		return filter(objs, keep), true, nil
	}
	c.hits.Add(1)
	for k := range set.dirty {
		// A child is the parent's while its index entry is there (a record the entry lists
		// must exist, as ScanJoined says).
		_, err := tx.kv.Get(childIndex, prefix+k)
		if errors.Is(err, ErrNotFound) {
			if _, held := set.rows[k]; held {
				delete(set.rows, k)
				delete(c.owner, k)
				c.records--
				set.order = nil
			}
			continue
		}
		if err != nil {
			return nil, true, err
		}
		o, err := t.get(tx, k)
		if err != nil {
			c.drop(prefix) // read whole next time
			return nil, true, err
		}
		if _, held := set.rows[k]; !held {
			c.records++
			set.order = nil
			c.owner[k] = prefix
		}
		set.rows[k] = c.clone(o)
	}
	set.dirty = nil
	if set.order == nil {
		set.order = make([]string, 0, len(set.rows))
		for k := range set.rows {
			set.order = append(set.order, k)
		}
		slices.Sort(set.order)
	}
	kept := make([]*T, 0, len(set.order))
	for _, k := range set.order {
		if o := set.rows[k]; keep == nil || keep(o) {
			kept = append(kept, o)
		}
	}
	// The copies in one allocation: a session's hundreds of stages are copied at every
	// decision on it.
	copies := make([]T, len(kept))
	out := make([]*T, len(kept))
	for i, o := range kept {
		c.copy(&copies[i], o)
		out[i] = &copies[i]
	}
	return out, true, nil
}

// filter is the objects keep keeps (all when keep is nil), in place.
func filter[T any](objs []*T, keep func(*T) bool) []*T {
	if keep == nil {
		return objs
	}
	out := objs[:0]
	for _, o := range objs {
		if keep(o) {
			out = append(out, o)
		}
	}
	return out
}

// childrenKept keeps t's children by parent (Children); t has one parent.
func childrenKept[T any](t IDTable[T], copy func(dst, src *T)) IDTable[T] {
	if len(t.parents) != 1 {
		panic("store: Children keeps the children of a table with one parent")
	}
	t.children = newChildren(copy)
	return t
}

// StageChildren is the stages' Children (tests and benchmarks look at its counts).
func StageChildren() *Children[model.Stage] { return Stages.children }
