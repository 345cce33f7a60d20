package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spillway-hpc/spillway/internal/model"
)

// Store is the typed face of an Engine.
type Store struct {
	engine Engine
}

// New wraps an engine.
func New(e Engine) *Store { return &Store{engine: e} }

// Tx is one transaction over model objects.
type Tx struct {
	kv KV
}

// Update runs fn in a read-write transaction.
func (s *Store) Update(ctx context.Context, fn func(*Tx) error) error {
	return s.engine.Update(ctx, func(kv KV) error { return fn(&Tx{kv: kv}) })
}

// View runs fn in a read-only transaction.
func (s *Store) View(ctx context.Context, fn func(*Tx) error) error {
	return s.engine.View(ctx, func(kv KV) error { return fn(&Tx{kv: kv}) })
}

// Engine is the engine under the store (backup and restore work on its keys).
func (s *Store) Engine() Engine { return s.engine }

// Close closes the engine.
func (s *Store) Close() error { return s.engine.Close() }

// Table is the typed access to one kind of object.
type Table[T any] struct {
	kind string
	key  func(*T) string
}

// idKey renders numeric ids so that key order is numeric order.
func idKey(id int64) string { return fmt.Sprintf("%019d", id) }

// Get returns the object with the given key, or ErrNotFound.
func (t Table[T]) get(tx *Tx, key string) (*T, error) {
	raw, err := tx.kv.Get(t.kind, key)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("%s %s: %w", t.kind, key, ErrNotFound)
		}
		return nil, err
	}
	obj := new(T)
	if err := json.Unmarshal(raw, obj); err != nil {
		return nil, fmt.Errorf("%s %s: corrupt record: %v", t.kind, key, err)
	}
	return obj, nil
}

// Put stores obj under its key.
func (t Table[T]) Put(tx *Tx, obj *T) error {
	raw, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	return tx.kv.Put(t.kind, t.key(obj), raw)
}

// List returns every object of the kind in key order.
func (t Table[T]) List(tx *Tx) ([]*T, error) {
	return t.Filter(tx, nil)
}

// Filter returns the objects for which keep returns true (all when keep is nil), in key order.
func (t Table[T]) Filter(tx *Tx, keep func(*T) bool) ([]*T, error) {
	var out []*T
	err := tx.kv.Scan(t.kind, func(key string, raw []byte) error {
		obj := new(T)
		if err := json.Unmarshal(raw, obj); err != nil {
			return fmt.Errorf("%s %s: corrupt record: %v", t.kind, key, err)
		}
		if keep == nil || keep(obj) {
			out = append(out, obj)
		}
		return nil
	})
	return out, err
}

// IDTable is a table of objects keyed by a numeric id drawn from the table's own sequence.
type IDTable[T any] struct {
	Table[T]
}

// Get returns the object with the given id.
func (t IDTable[T]) Get(tx *Tx, id int64) (*T, error) { return t.get(tx, idKey(id)) }

// Delete removes the object with the given id.
func (t IDTable[T]) Delete(tx *Tx, id int64) error { return tx.kv.Delete(t.kind, idKey(id)) }

// NewID draws the next id of this kind.
func (t IDTable[T]) NewID(tx *Tx) (int64, error) { return tx.kv.NextSeq(t.kind) }

// NameTable is a table of objects keyed by name.
type NameTable[T any] struct {
	Table[T]
}

// Get returns the object with the given name.
func (t NameTable[T]) Get(tx *Tx, name string) (*T, error) { return t.get(tx, name) }

// Delete removes the object with the given name.
func (t NameTable[T]) Delete(tx *Tx, name string) error { return tx.kv.Delete(t.kind, name) }

func byID[T any](kind string, id func(*T) int64) IDTable[T] {
	return IDTable[T]{Table[T]{kind: kind, key: func(o *T) string { return idKey(id(o)) }}}
}

// The tables of DataWarp's objects.
var (
	Pools          = NameTable[model.Pool]{Table[model.Pool]{kind: "pool", key: func(p *model.Pool) string { return p.Name }}}
	Nodes          = NameTable[model.Node]{Table[model.Node]{kind: "node", key: func(n *model.Node) string { return n.Name }}}
	Instances      = byID("instance", func(o *model.Instance) int64 { return o.ID })
	Fragments      = byID("fragment", func(o *model.Fragment) int64 { return o.ID })
	Configurations = byID("configuration", func(o *model.Configuration) int64 { return o.ID })
	Namespaces     = byID("namespace", func(o *model.Namespace) int64 { return o.ID })
	Registrations  = byID("registration", func(o *model.Registration) int64 { return o.ID })
	Activations    = byID("activation", func(o *model.Activation) int64 { return o.ID })
	Stages         = byID("stage", func(o *model.Stage) int64 { return o.ID })
	// StageHistory keeps finished stages after their sessions went (stage.history of them).
	StageHistory = byID("stage_history", func(o *model.FinishedStage) int64 { return o.ID })
	// Usage is the data path's counters per fragment (accounting), by fragment id.
	Usage = byID("fragment_usage", func(o *model.FragmentUsage) int64 { return o.Fragment })
	// StageBytes are the bytes of an instance's stages that are gone, by instance id.
	StageBytes = byID("stage_bytes", func(o *model.StageBytes) int64 { return o.Instance })
	// AccountingRecords are the accounting records of torn-down instances not yet appended
	// to controller.accounting_log, by instance id.
	AccountingRecords = byID("accounting_record", func(o *AccountingRecord) int64 { return o.Instance })
	// Sessions is indexed by token as well; use PutSession/DeleteSession to keep the index.
	Sessions = byID("session", func(o *model.Session) int64 { return o.ID })
)

const sessionTokenIndex = "session_token"

// PutSession stores a session and its token index. Tokens are unique: storing a session whose
// token belongs to another session is an error.
func PutSession(tx *Tx, s *model.Session) error {
	if s.Token == "" {
		return fmt.Errorf("session %d has no token", s.ID)
	}
	owner, err := tokenOwner(tx, s.Token)
	switch {
	case err == nil:
		if owner != s.ID {
			return fmt.Errorf("token %q already belongs to another session", s.Token)
		}
	case errors.Is(err, ErrNotFound):
		raw, _ := json.Marshal(tokenEntry{Session: s.ID})
		if err := tx.kv.Put(sessionTokenIndex, s.Token, raw); err != nil {
			return err
		}
	default:
		return err
	}
	return Sessions.Put(tx, s)
}

// DeleteSession removes a session and its token index.
func DeleteSession(tx *Tx, s *model.Session) error {
	if err := tx.kv.Delete(sessionTokenIndex, s.Token); err != nil {
		return err
	}
	return Sessions.Delete(tx, s.ID)
}

// SessionByToken finds a session by its token (job id or persistent name).
func SessionByToken(tx *Tx, token string) (*model.Session, error) {
	id, err := tokenOwner(tx, token)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("session with token %q: %w", token, ErrNotFound)
		}
		return nil, err
	}
	return Sessions.Get(tx, id)
}

// tokenEntry is the value of a session token's index entry (schema version 2; version 1
// held the session's id key as bare text).
type tokenEntry struct {
	Session int64 `json:"session"`
}

func tokenOwner(tx *Tx, token string) (int64, error) {
	raw, err := tx.kv.Get(sessionTokenIndex, token)
	if err != nil {
		return 0, err
	}
	var e tokenEntry
	if err := json.Unmarshal(raw, &e); err != nil {
		return 0, fmt.Errorf("%s %s: corrupt record: %v", sessionTokenIndex, token, err)
	}
	return e.Session, nil
}

// NextSeq draws a number from a named sequence (job ids of `spillway run`, for example).
func (tx *Tx) NextSeq(name string) (int64, error) { return tx.kv.NextSeq(name) }

// IsNotFound reports whether err says an object does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// MetaValue is one setting the controller keeps about itself (its cluster id, for one).
type MetaValue struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Meta holds the controller's own settings.
var Meta = NameTable[MetaValue]{Table[MetaValue]{kind: "meta", key: func(m *MetaValue) string { return m.Key }}}

// runDrawKind records who drew each recent run id, so that only they may set up run<N>.
const runDrawKind = "run_draw"

// RunDrawsKept is how many of the latest run ids keep their drawer: an id is set up right
// after it is drawn, and the record of the one drawn RunDrawsKept earlier is dropped then, so
// the records never grow past it.
const RunDrawsKept = 10000

// DrawRunID draws the next run id for uid and records the drawer.
func (tx *Tx) DrawRunID(uid uint32) (int64, error) {
	id, err := tx.kv.NextSeq("run_job")
	if err != nil {
		return 0, err
	}
	if err := tx.kv.Put(runDrawKind, idKey(id), []byte(fmt.Sprint(uid))); err != nil {
		return 0, err
	}
	if old := id - RunDrawsKept; old > 0 {
		if err := tx.kv.Delete(runDrawKind, idKey(old)); err != nil {
			return 0, err
		}
	}
	return id, nil
}

// RunIDDrawer is the uid that drew run id id, if it is among the latest RunDrawsKept.
func (tx *Tx) RunIDDrawer(id int64) (uint32, bool, error) {
	raw, err := tx.kv.Get(runDrawKind, idKey(id))
	if errors.Is(err, ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	var uid uint32
	if _, err := fmt.Sscan(string(raw), &uid); err != nil {
		return 0, false, fmt.Errorf("run id %d: corrupt drawer %q", id, raw)
	}
	return uid, true, nil
}

// AccountingRecord is one instance's accounting record (a line of controller.accounting_log)
// waiting to be appended. Offset and Inode are where the controller was about to append it,
// persisted before it does: after a crash the line found there is this record's (same id),
// or it was never written.
type AccountingRecord struct {
	Instance  int64           `json:"instance"`
	ID        string          `json:"record_id"`
	Line      json.RawMessage `json:"line"`
	Offset    int64           `json:"offset"`
	Inode     uint64          `json:"inode,omitempty"`
	Appending bool            `json:"appending,omitempty"` // Offset and Inode are set
}
