package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

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
	kv     KV
	serial uint64 // unique in the process (Rows tells its transactions apart by it)
}

var txSerial atomic.Uint64

func newTx(kv KV) *Tx { return &Tx{kv: kv, serial: txSerial.Add(1)} }

// Update runs fn in a read-write transaction.
func (s *Store) Update(ctx context.Context, fn func(*Tx) error) error {
	return s.engine.Update(ctx, func(kv KV) error { return fn(newTx(kv)) })
}

// View runs fn in a read-only transaction.
func (s *Store) View(ctx context.Context, fn func(*Tx) error) error {
	return s.engine.View(ctx, func(kv KV) error { return fn(newTx(kv)) })
}

// Engine is the engine under the store (backup and restore work on its keys).
func (s *Store) Engine() Engine { return s.engine }

// Close closes the engine.
func (s *Store) Close() error { return s.engine.Close() }

// Table is the typed access to one kind of object.
type Table[T any] struct {
	kind string
	key  func(*T) string
	// parent, when set, names the object's parent (its kind and id; never changing): Put and
	// Delete keep the object's entry in the child index, which ChildrenOf reads.
	parents []func(*T) parentRef
	// count, when set, keeps the totals (Totals) of the kind: Put and Delete call it with
	// the object stored before (nil: none) and after (nil: deleted).
	count func(tx *Tx, old, new *T) error
	// decoded, when set, keeps decoded records by their bytes (Decoded: the stages).
	decoded *Decoded[T]
	// children, when set, keeps each parent's children as committed (Children: the stages).
	children *Children[T]
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
	return t.decode(key, raw)
}

// decode turns a record of the kind into its object.
func (t Table[T]) decode(key string, raw []byte) (*T, error) {
	if t.decoded != nil {
		if obj, ok := t.decoded.get(key, raw); ok {
			return obj, nil
		}
	}
	obj := new(T)
	if err := json.Unmarshal(raw, obj); err != nil {
		return nil, fmt.Errorf("%s %s: corrupt record: %v", t.kind, key, err)
	}
	if t.decoded != nil {
		t.decoded.put(key, raw, obj)
	}
	return obj, nil
}

// Decoded is the table's cache of decoded records, nil when it keeps none.
func (t Table[T]) Decoded() *Decoded[T] { return t.decoded }

// Put stores obj under its key (and its entry in the child index).
func (t Table[T]) Put(tx *Tx, obj *T) error {
	raw, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	if len(t.parents) > 0 || t.count != nil {
		// The object as it was: only what changed is written to the indexes and totals (a
		// change of state writes the object alone).
		old, err := t.get(tx, t.key(obj))
		if err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
		for _, parent := range t.parents {
			key := childKey(parent(obj), t.kind, t.key(obj))
			if old != nil {
				if was := childKey(parent(old), t.kind, t.key(obj)); was == key {
					continue
				} else if err := tx.kv.Delete(childIndex, was); err != nil {
					return err
				}
			}
			if err := tx.kv.Put(childIndex, key, emptyDoc); err != nil {
				return err
			}
		}
		if t.count != nil {
			if err := t.count(tx, old, obj); err != nil {
				return err
			}
		}
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
		obj, err := t.decode(key, raw)
		if err != nil {
			return err
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

// IDs returns the ids of every object of the table in order, decoding none.
func (t IDTable[T]) IDs(tx *Tx) ([]int64, error) {
	var out []int64
	err := tx.kv.Scan(t.kind, func(key string, _ []byte) error {
		id, err := strconv.ParseInt(key, 10, 64)
		if err != nil {
			return fmt.Errorf("%s %s: not an id key: %v", t.kind, key, err)
		}
		out = append(out, id)
		return nil
	})
	return out, err
}

// Delete removes the object with the given id (and its entry in the child index).
func (t IDTable[T]) Delete(tx *Tx, id int64) error {
	if len(t.parents) > 0 || t.count != nil {
		obj, err := t.Get(tx, id)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, parent := range t.parents {
			if err := tx.kv.Delete(childIndex, childKey(parent(obj), t.kind, idKey(id))); err != nil {
				return err
			}
		}
		if t.count != nil {
			if err := t.count(tx, obj, nil); err != nil {
				return err
			}
		}
	}
	return tx.kv.Delete(t.kind, idKey(id))
}

// ChildrenOf returns the objects of this table whose parent is the object (kind, id), in id
// order, through the child index: the cost is that of the children, not of the table.
func (t IDTable[T]) ChildrenOf(tx *Tx, parentKind string, parentID int64) ([]*T, error) {
	return t.ChildrenOfKey(tx, parentKind, idKey(parentID))
}

// ChildrenOfKey is ChildrenOf for a parent named by its key (a node's name).
func (t IDTable[T]) ChildrenOfKey(tx *Tx, parentKind, parentKey string) ([]*T, error) {
	return t.childrenWhere(tx, parentKind, parentKey, nil)
}

// ChildrenWhere is ChildrenOf of the children keep keeps. keep reads what it is given and
// keeps nothing of it: a table that keeps its children (Children) gives it its own records,
// and copies only those kept.
func (t IDTable[T]) ChildrenWhere(tx *Tx, parentKind string, parentID int64, keep func(*T) bool) ([]*T, error) {
	return t.childrenWhere(tx, parentKind, idKey(parentID), keep)
}

func (t IDTable[T]) childrenWhere(tx *Tx, parentKind, parentKey string, keep func(*T) bool) ([]*T, error) {
	if len(t.parents) == 0 {
		return nil, fmt.Errorf("%s has no parent: no child index", t.kind)
	}
	prefix := childKey(parentRef{parentKind, parentKey}, t.kind, "")
	if t.children != nil {
		if out, ok, err := t.childrenCached(tx, prefix, keep); ok {
			return out, err
		}
	}
	out, err := t.childrenRead(tx, prefix)
	return filter(out, keep), err
}

// childrenRead reads the children listed under prefix in the child index from the store.
func (t IDTable[T]) childrenRead(tx *Tx, prefix string) ([]*T, error) {
	if j, ok := tx.kv.(IndexJoiner); ok {
		var out []*T
		err := j.ScanJoined(childIndex, prefix, t.kind, func(key string, raw []byte) error {
			obj, err := t.decode(key, raw)
			out = append(out, obj)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("child index %s: %w", prefix, err)
		}
		return out, nil
	}
	var keys []string
	err := tx.kv.ScanPrefix(childIndex, prefix, func(key string, _ []byte) error {
		keys = append(keys, strings.TrimPrefix(key, prefix))
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]*T, 0, len(keys))
	for _, k := range keys {
		obj, err := t.get(tx, k)
		if err != nil {
			return nil, fmt.Errorf("child index %s%s: %w", prefix, k, err)
		}
		out = append(out, obj)
	}
	return out, nil
}

// index writes the child index entry of every object of the table, and counts it in the
// totals (migration to version 3).
func (t IDTable[T]) index(tx *Tx) error {
	all, err := t.List(tx)
	if err != nil {
		return err
	}
	for _, obj := range all {
		for _, parent := range t.parents {
			if err := tx.kv.Put(childIndex, childKey(parent(obj), t.kind, t.key(obj)), emptyDoc); err != nil {
				return err
			}
		}
		if t.count != nil {
			if err := t.count(tx, nil, obj); err != nil {
				return err
			}
		}
	}
	return nil
}

// childIndex holds one key per object of a table and parent:
// <parent kind>/<parent key>/<kind>/<id key>, value {} (schema version 3).
const childIndex = "child"

var emptyDoc = []byte("{}")

// parentRef names a parent: its kind and key (an id key, or a node's name).
type parentRef struct{ kind, key string }

func childKey(p parentRef, kind, key string) string {
	return p.kind + "/" + p.key + "/" + kind + "/" + key
}

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

// childOf is byID for a kind whose objects belong to a parent object (indexed by it).
func childOf[T any](kind string, id func(*T) int64, parentKind string, parent func(*T) int64) IDTable[T] {
	t := byID(kind, id)
	t.parents = []func(*T) parentRef{func(o *T) parentRef { return parentRef{parentKind, idKey(parent(o))} }}
	return t
}

// onNode indexes a table's objects by their node's name as well (ChildrenOfKey "node").
func onNode[T any](t IDTable[T], node func(*T) string) IDTable[T] {
	t.parents = append(t.parents, func(o *T) parentRef { return parentRef{"node", node(o)} })
	return t
}

// alsoUnder indexes a table's objects under a second parent, by id.
func alsoUnder[T any](t IDTable[T], parentKind string, parent func(*T) int64) IDTable[T] {
	t.parents = append(t.parents, func(o *T) parentRef { return parentRef{parentKind, idKey(parent(o))} })
	return t
}

// The tables of DataWarp's objects.
var (
	Pools = NameTable[model.Pool]{Table[model.Pool]{kind: "pool", key: func(p *model.Pool) string { return p.Name }}}
	Nodes = NameTable[model.Node]{Table[model.Node]{kind: "node", key: func(n *model.Node) string { return n.Name }}}
	// The session's objects are indexed by their parent (ChildrenOf): instances,
	// registrations, activations and stages by session; fragments and configurations by
	// instance; namespaces by configuration; and what a heartbeat answers: fragments and
	// activations by node (ChildrenOfKey), namespaces by fragment.
	Instances      = childOf("instance", func(o *model.Instance) int64 { return o.ID }, "session", func(o *model.Instance) int64 { return o.SessionID })
	Fragments      = counted(onNode(childOf("fragment", func(o *model.Fragment) int64 { return o.ID }, "instance", func(o *model.Fragment) int64 { return o.InstanceID }), func(o *model.Fragment) string { return o.Node }), countFragments)
	Configurations = childOf("configuration", func(o *model.Configuration) int64 { return o.ID }, "instance", func(o *model.Configuration) int64 { return o.InstanceID })
	Namespaces     = alsoUnder(childOf("namespace", func(o *model.Namespace) int64 { return o.ID }, "configuration", func(o *model.Namespace) int64 { return o.ConfigurationID }), "fragment", func(o *model.Namespace) int64 { return o.FragmentID })
	Registrations  = childOf("registration", func(o *model.Registration) int64 { return o.ID }, "session", func(o *model.Registration) int64 { return o.SessionID })
	Activations    = onNode(childOf("activation", func(o *model.Activation) int64 { return o.ID }, "session", func(o *model.Activation) int64 { return o.SessionID }), func(o *model.Activation) string { return o.Node })
	// Stages are counted while running (Totals.RunningStages: stage.max_running holds over
	// every session, whatever world a decision loads).
	// Their decoded records are kept (Decoded): every decision on a session reads them all.
	// And each session's, as committed (Children): a write transaction reads again only
	// those written since.
	Stages = childrenKept(decodedBy(counted(childOf("stage", func(o *model.Stage) int64 { return o.ID }, "session", func(o *model.Stage) int64 { return o.SessionID }), countRunningStages), cloneStage), copyStage)
	// StageHistory keeps finished stages after their sessions went (stage.history of them).
	StageHistory = byID("stage_history", func(o *model.FinishedStage) int64 { return o.ID })
	// Usage is the data path's counters per fragment (accounting), by fragment id.
	// Indexed by instance (ChildrenOf): the rows outlive their fragments.
	Usage = childOf("fragment_usage", func(o *model.FragmentUsage) int64 { return o.Fragment }, "instance", func(o *model.FragmentUsage) int64 { return o.Instance })
	// StageBytes are the bytes of an instance's stages that are gone, by instance id.
	StageBytes = byID("stage_bytes", func(o *model.StageBytes) int64 { return o.Instance })
	// AccountingRecords are the accounting records of torn-down instances not yet appended
	// to controller.accounting_log, by instance id.
	AccountingRecords = byID("accounting_record", func(o *AccountingRecord) int64 { return o.Instance })
	// Sessions is indexed by token as well; use PutSession/DeleteSession to keep the index.
	Sessions = counted(byID("session", func(o *model.Session) int64 { return o.ID }), countSessions)
)

func counted[T any](t IDTable[T], count func(tx *Tx, old, new *T) error) IDTable[T] {
	t.count = count
	return t
}

// totalsKind holds the totals a request needs without reading every object (schema version
// 3): how many sessions there are (controller.max_sessions) and, for each node, the grains
// and the fragments on it (the allocator's inputs). Keys "sessions" and "node/<name>".
const totalsKind = "totals"

// Totals are the state's totals, kept by the typed tables in every transaction that changes
// them.
type Totals struct {
	Sessions int                   `json:"sessions"`
	Nodes    map[string]NodeTotals `json:"nodes,omitempty"`
	// RunningStages counts the stages whose status is running (key "running_stages").
	RunningStages int `json:"running_stages"`
}

// NodeTotals is what a node's fragments add up to.
type NodeTotals struct {
	Grains    uint64 `json:"grains"`
	Fragments int    `json:"fragments"`
}

type sessionTotal struct {
	Count int `json:"count"`
}

func countSessions(tx *Tx, old, new *model.Session) error {
	if (old == nil) == (new == nil) {
		return nil
	}
	var t sessionTotal
	if err := getJSON(tx, totalsKind, "sessions", &t); err != nil {
		return err
	}
	if new != nil {
		t.Count++
	} else {
		t.Count--
	}
	return putJSON(tx, totalsKind, "sessions", t)
}

// runningStagesKey is the totals' count of running stages.
const runningStagesKey = "running_stages"

func countRunningStages(tx *Tx, old, new *model.Stage) error {
	was := old != nil && old.Status == model.StageRunning
	is := new != nil && new.Status == model.StageRunning
	if was == is {
		return nil
	}
	var t sessionTotal
	if err := getJSON(tx, totalsKind, runningStagesKey, &t); err != nil {
		return err
	}
	if is {
		t.Count++
	} else {
		t.Count = max(0, t.Count-1)
	}
	return putJSON(tx, totalsKind, runningStagesKey, t)
}

// SetRunningStages sets the count of running stages: the executor's first pass after a start
// counts them in the whole state (a state written before the count was kept has none).
func SetRunningStages(tx *Tx, n int) error {
	return putJSON(tx, totalsKind, runningStagesKey, sessionTotal{Count: n})
}

func countFragments(tx *Tx, old, new *model.Fragment) error {
	add := func(f *model.Fragment, sign int) error {
		var t NodeTotals
		key := "node/" + f.Node
		if err := getJSON(tx, totalsKind, key, &t); err != nil {
			return err
		}
		if sign > 0 {
			t.Grains += f.Grains
			t.Fragments++
		} else {
			t.Grains -= min(t.Grains, f.Grains)
			t.Fragments = max(0, t.Fragments-1)
		}
		if t.Fragments == 0 {
			return tx.kv.Delete(totalsKind, key)
		}
		return putJSON(tx, totalsKind, key, t)
	}
	if old != nil && new != nil && old.Node == new.Node && old.Grains == new.Grains {
		return nil
	}
	if old != nil {
		if err := add(old, -1); err != nil {
			return err
		}
	}
	if new != nil {
		return add(new, +1)
	}
	return nil
}

// ReadTotals returns the state's totals.
func ReadTotals(tx *Tx) (Totals, error) {
	var s sessionTotal
	if err := getJSON(tx, totalsKind, "sessions", &s); err != nil {
		return Totals{}, err
	}
	var running sessionTotal
	if err := getJSON(tx, totalsKind, runningStagesKey, &running); err != nil {
		return Totals{}, err
	}
	t := Totals{Sessions: s.Count, Nodes: map[string]NodeTotals{}, RunningStages: running.Count}
	err := tx.kv.ScanPrefix(totalsKind, "node/", func(key string, raw []byte) error {
		var n NodeTotals
		if err := json.Unmarshal(raw, &n); err != nil {
			return fmt.Errorf("%s %s: corrupt record: %v", totalsKind, key, err)
		}
		t.Nodes[strings.TrimPrefix(key, "node/")] = n
		return nil
	})
	return t, err
}

// getJSON reads a JSON value; a missing key leaves v as it is.
func getJSON(tx *Tx, kind, key string, v any) error {
	raw, err := tx.kv.Get(kind, key)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s %s: corrupt record: %v", kind, key, err)
	}
	return nil
}

func putJSON(tx *Tx, kind, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.kv.Put(kind, key, raw)
}

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

// dueIndex lists the sessions the executor must look at (the due index): those not settled
// (an object of theirs not at its goal, a stage not ended) and those with a time to be looked
// at (a persistent instance's expiration). Key: the session's id key; value {"at": time}, the
// zero time meaning now. A decision that changes a session's objects marks it due in its own
// transaction; the executor takes it out when it finds the session settled.
const dueIndex = "due"

type dueEntry struct {
	At time.Time `json:"at,omitzero"`
}

// MarkDue puts a session in the due index, to be looked at from at (zero: now).
func MarkDue(tx *Tx, session int64, at time.Time) error {
	raw, _ := json.Marshal(dueEntry{At: at.UTC()})
	return tx.kv.Put(dueIndex, idKey(session), raw)
}

// NotDue takes a session out of the due index.
func NotDue(tx *Tx, session int64) error { return tx.kv.Delete(dueIndex, idKey(session)) }

// DueSessions returns the due index: each session's id and the time it is due from.
func DueSessions(tx *Tx) (map[int64]time.Time, error) {
	out := map[int64]time.Time{}
	err := tx.kv.Scan(dueIndex, func(key string, raw []byte) error {
		id, err := strconv.ParseInt(key, 10, 64)
		if err != nil {
			return fmt.Errorf("%s %s: corrupt key", dueIndex, key)
		}
		var e dueEntry
		if err := json.Unmarshal(raw, &e); err != nil {
			return fmt.Errorf("%s %s: corrupt record: %v", dueIndex, key, err)
		}
		out[id] = e.At
		return nil
	})
	return out, err
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

// PutObject stores one of the lifecycle's objects in its table (a session with its token
// index): what a decision changed, however it was made.
func PutObject(tx *Tx, obj any) error {
	switch o := obj.(type) {
	case *model.Session:
		return PutSession(tx, o)
	case *model.Instance:
		return Instances.Put(tx, o)
	case *model.Fragment:
		return Fragments.Put(tx, o)
	case *model.Configuration:
		return Configurations.Put(tx, o)
	case *model.Namespace:
		return Namespaces.Put(tx, o)
	case *model.Registration:
		return Registrations.Put(tx, o)
	case *model.Activation:
		return Activations.Put(tx, o)
	case *model.Stage:
		return Stages.Put(tx, o)
	case *model.Node:
		return Nodes.Put(tx, o)
	case *model.Pool:
		return Pools.Put(tx, o)
	}
	return fmt.Errorf("store: no table for %T", obj)
}
