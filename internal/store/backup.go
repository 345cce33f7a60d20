package store

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"
)

// BackupFormat names the document `spillway admin backup` writes; BackupFormatVersion is the
// version of the document's own shape (the state inside has its own SchemaVersion).
const (
	BackupFormat        = "spillway-state-backup"
	BackupFormatVersion = 1
)

// Backup is the whole state, every kind and every sequence, as one JSON document.
type Backup struct {
	Format          string             `json:"format"`
	FormatVersion   int                `json:"format_version"`
	SchemaVersion   int                `json:"schema_version"`
	ClusterID       string             `json:"cluster_id"`
	Created         time.Time          `json:"created"`
	SpillwayVersion string             `json:"spillway_version,omitempty"`
	Engine          string             `json:"engine,omitempty"` // where it was taken
	Sequences       map[string]int64   `json:"sequences"`
	Kinds           map[string][]Entry `json:"kinds"`
}

// Entry is one key and its value: JSON as is ("value"), other text ("text") or bytes
// ("base64"), so that a restore writes back exactly the bytes it read.
type Entry struct {
	Key    string          `json:"key"`
	Value  json.RawMessage `json:"value,omitempty"`
	Text   *string         `json:"text,omitempty"`
	Base64 string          `json:"base64,omitempty"`
}

func entryOf(key string, raw []byte) Entry {
	if json.Valid(raw) {
		var c bytes.Buffer
		if json.Compact(&c, raw) == nil && bytes.Equal(c.Bytes(), raw) {
			return Entry{Key: key, Value: append(json.RawMessage(nil), raw...)}
		}
	}
	if utf8.Valid(raw) {
		s := string(raw)
		return Entry{Key: key, Text: &s}
	}
	return Entry{Key: key, Base64: base64.StdEncoding.EncodeToString(raw)}
}

func (e Entry) bytes() ([]byte, error) {
	switch {
	case e.Value != nil:
		// Written compact, perhaps indented in the document since.
		var c bytes.Buffer
		if err := json.Compact(&c, e.Value); err != nil {
			return nil, fmt.Errorf("key %s: %v", e.Key, err)
		}
		return c.Bytes(), nil
	case e.Text != nil:
		return []byte(*e.Text), nil
	default:
		b, err := base64.StdEncoding.DecodeString(e.Base64)
		if err != nil {
			return nil, fmt.Errorf("key %s: corrupt base64: %v", e.Key, err)
		}
		return b, nil
	}
}

// TakeBackup reads the whole state in one read transaction: a consistent snapshot, taken
// while the controller runs.
func TakeBackup(ctx context.Context, e Engine) (*Backup, error) {
	b := &Backup{Format: BackupFormat, FormatVersion: BackupFormatVersion, Created: time.Now().UTC(),
		Sequences: map[string]int64{}, Kinds: map[string][]Entry{}}
	err := e.View(ctx, func(kv KV) error {
		if _, ok, err := metaString(kv, restoreMarkKey); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("%w: there is nothing whole to back up", ErrRestoreIncomplete)
		}
		var err error
		if b.SchemaVersion, err = stateVersion(kv); err != nil {
			return err
		}
		if b.ClusterID, _, err = metaString(kv, ClusterIDKey); err != nil {
			return err
		}
		all, err := kv.Kinds()
		if err != nil {
			return err
		}
		if b.Sequences, err = kv.Sequences(); err != nil {
			return err
		}
		for _, kind := range all {
			entries := []Entry{}
			if err := kv.Scan(kind, func(key string, raw []byte) error {
				entries = append(entries, entryOf(key, raw))
				return nil
			}); err != nil {
				return err
			}
			if len(entries) > 0 {
				b.Kinds[kind] = entries
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// ReadBackup decodes and checks a backup document.
func ReadBackup(raw []byte) (*Backup, error) {
	var b Backup
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return nil, fmt.Errorf("not a Spillway backup: %v", err)
	}
	if b.Format != BackupFormat {
		return nil, fmt.Errorf("not a Spillway backup: format %q, want %q", b.Format, BackupFormat)
	}
	if b.FormatVersion > BackupFormatVersion {
		return nil, fmt.Errorf("backup format version %d is newer than this Spillway reads (%d); restore with a newer Spillway", b.FormatVersion, BackupFormatVersion)
	}
	if b.SchemaVersion > SchemaVersion {
		return nil, fmt.Errorf("the backup's state has schema version %d, newer than this Spillway understands (%d); restore with a newer Spillway", b.SchemaVersion, SchemaVersion)
	}
	return &b, nil
}

// RestoreOptions tune Restore.
type RestoreOptions struct {
	// Force replaces a state that is not empty (everything in it is deleted first).
	Force bool
	// Batch is how many keys one transaction writes (store.restore_batch); MaxBatchBytes how
	// many bytes at most (below the engine's request limit).
	Batch         int
	MaxBatchBytes int
}

// ErrNotEmpty is wrapped by Restore's error when the target holds a state and Force is off.
var ErrNotEmpty = errors.New("the store is not empty")

// Restore writes a backup into e, upgraded to SchemaVersion on the way (the migrations run on
// the backup before anything is written). A state that is not empty is refused unless
// opts.Force. The writes go in transactions of opts.Batch keys: until the last one commits,
// a mark in the state says it is incomplete, and a controller refuses to start on it.
func Restore(ctx context.Context, e Engine, b *Backup, opts RestoreOptions) error {
	mem := newMemKV()
	for kind, entries := range b.Kinds {
		for _, en := range entries {
			raw, err := en.bytes()
			if err != nil {
				return fmt.Errorf("backup: %s: %w", kind, err)
			}
			mem.Put(kind, en.Key, raw)
		}
	}
	for name, v := range b.Sequences {
		mem.SetSequence(name, v)
	}
	if b.SchemaVersion > 0 {
		if err := migrate(mem, b.SchemaVersion); err != nil {
			return err
		}
	}
	// Look at the target, and mark it incomplete.
	err := e.Update(ctx, func(kv KV) error {
		empty, err := isEmpty(kv)
		if err != nil {
			return err
		}
		if !empty && !opts.Force {
			kinds, _ := kv.Kinds()
			id, _, _ := metaString(kv, ClusterIDKey)
			return fmt.Errorf("%w (kinds %s; cluster id %q): restore only into an empty store, "+
				"or pass --force to delete that state and replace it (stop the controller first)", ErrNotEmpty, strings.Join(kinds, ", "), id)
		}
		return putMeta(kv, restoreMarkKey, time.Now().UTC().Format(time.RFC3339))
	})
	if err != nil {
		return err
	}
	// Delete what is there (but the mark), batch by batch.
	for {
		deleted := 0
		err := e.Update(ctx, func(kv KV) error {
			deleted = 0
			kinds, err := kv.Kinds()
			if err != nil {
				return err
			}
			for _, kind := range kinds {
				var keys []string
				if err := kv.Scan(kind, func(key string, _ []byte) error {
					if !(kind == Meta.kind && key == restoreMarkKey) && deleted+len(keys) < opts.Batch {
						keys = append(keys, key)
					}
					return nil
				}); err != nil {
					return err
				}
				for _, key := range keys {
					if err := kv.Delete(kind, key); err != nil {
						return err
					}
				}
				deleted += len(keys)
			}
			seqs, err := kv.Sequences()
			if err != nil {
				return err
			}
			for name := range seqs {
				if deleted >= opts.Batch {
					break
				}
				if err := kv.SetSequence(name, 0); err != nil {
					return err
				}
				deleted++
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("restore: emptying the store: %w", err)
		}
		if deleted == 0 {
			break
		}
	}
	// Write the backup, batch by batch; the last transaction removes the mark.
	type item struct {
		kind, key string
		value     []byte
		seq       int64
	}
	var items []item
	for _, kind := range mem.kindsSorted() {
		for _, key := range mem.keysSorted(kind) {
			items = append(items, item{kind: kind, key: key, value: mem.kv[kind][key]})
		}
	}
	for _, name := range sortedKeys(mem.seqs) {
		items = append(items, item{key: name, seq: mem.seqs[name]})
	}
	for start := 0; ; {
		end, size := start, 0
		for end < len(items) && end-start < opts.Batch && (end == start || size+len(items[end].key)+len(items[end].value)+64 <= opts.MaxBatchBytes) {
			size += len(items[end].key) + len(items[end].value) + 64
			end++
		}
		last := end == len(items)
		err := e.Update(ctx, func(kv KV) error {
			for _, it := range items[start:end] {
				var err error
				if it.kind == "" {
					err = kv.SetSequence(it.key, it.seq)
				} else {
					err = kv.Put(it.kind, it.key, it.value)
				}
				if err != nil {
					return err
				}
			}
			if last {
				return kv.Delete(Meta.kind, restoreMarkKey)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("restore: writing keys %d to %d of %d: %w", start+1, end, len(items), err)
		}
		if last {
			return nil
		}
		start = end
	}
}

// Count is the number of keys in the backup.
func (b *Backup) Count() int {
	n := 0
	for _, entries := range b.Kinds {
		n += len(entries)
	}
	return n
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// memKV is a KV in memory: a backup being upgraded before it is restored.
type memKV struct {
	kv   map[string]map[string][]byte
	seqs map[string]int64
}

func newMemKV() *memKV {
	return &memKV{kv: map[string]map[string][]byte{}, seqs: map[string]int64{}}
}

func (m *memKV) kindsSorted() []string           { return sortedKeys(m.kv) }
func (m *memKV) keysSorted(kind string) []string { return sortedKeys(m.kv[kind]) }

func (m *memKV) Get(kind, key string) ([]byte, error) {
	v, ok := m.kv[kind][key]
	if !ok {
		return nil, ErrNotFound
	}
	return v, nil
}

func (m *memKV) Put(kind, key string, value []byte) error {
	if m.kv[kind] == nil {
		m.kv[kind] = map[string][]byte{}
	}
	m.kv[kind][key] = append([]byte(nil), value...)
	return nil
}

func (m *memKV) Delete(kind, key string) error {
	delete(m.kv[kind], key)
	if len(m.kv[kind]) == 0 {
		delete(m.kv, kind)
	}
	return nil
}

func (m *memKV) Scan(kind string, fn func(key string, value []byte) error) error {
	for _, k := range m.keysSorted(kind) {
		if err := fn(k, m.kv[kind][k]); err != nil {
			return err
		}
	}
	return nil
}

func (m *memKV) NextSeq(name string) (int64, error) {
	m.seqs[name]++
	return m.seqs[name], nil
}

func (m *memKV) Kinds() ([]string, error) { return m.kindsSorted(), nil }

func (m *memKV) Sequences() (map[string]int64, error) {
	out := make(map[string]int64, len(m.seqs))
	for k, v := range m.seqs {
		out[k] = v
	}
	return out, nil
}

func (m *memKV) SetSequence(name string, value int64) error {
	if value == 0 {
		delete(m.seqs, name)
	} else {
		m.seqs[name] = value
	}
	return nil
}
