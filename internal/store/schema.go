package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// SchemaVersion is the version of the state's layout (its kinds, keys and values) this
// Spillway reads and writes. It is kept in the state (Meta "schema_version"); a state without
// it was written before versions were kept, and is version 1.
//
//	1  the first layout
//	2  every value is a JSON document: a session token's index entry is {"session": id}
//	   (was the session's key as bare text)
//	3  the child index (kind "child"): one key per instance, fragment, configuration,
//	   namespace, registration, activation, stage and fragment usage row under its
//	   parent's key; the totals
//	   (kind "totals": sessions, each node's grains and fragments); the due index (kind
//	   "due", which the controller's first executor pass fills)
const SchemaVersion = 3

// migrations[n-1] turns a state of version n into version n+1. Each is a pure function over
// the KV: it reads and writes keys, nothing else, so that it runs the same in any engine and
// on a backup being restored.
var migrations = []func(KV) error{
	migrateTokenIndexToJSON, // 1 → 2
	migrateChildIndex,       // 2 → 3
}

const (
	schemaVersionKey = "schema_version"
	// restoreMarkKey is in Meta while a restore is under way: the state is incomplete.
	restoreMarkKey = "restore_incomplete"
	// ClusterIDKey is the Meta key of the state's identity (the controller creates it).
	ClusterIDKey = "cluster_id"
)

// ErrRestoreIncomplete is wrapped by Upgrade's and Backup's errors when a restore stopped
// part way: the state is incomplete until a restore runs to its end.
var ErrRestoreIncomplete = errors.New("a restore into this state did not finish")

// metaString reads a Meta value straight from the KV.
func metaString(kv KV, key string) (string, bool, error) {
	raw, err := kv.Get(Meta.kind, key)
	if errors.Is(err, ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	var m MetaValue
	if err := json.Unmarshal(raw, &m); err != nil {
		return "", false, fmt.Errorf("meta %s: corrupt record: %v", key, err)
	}
	return m.Value, true, nil
}

func putMeta(kv KV, key, value string) error {
	raw, _ := json.Marshal(MetaValue{Key: key, Value: value})
	return kv.Put(Meta.kind, key, raw)
}

// isEmpty reports whether the state holds nothing at all.
func isEmpty(kv KV) (bool, error) {
	kinds, err := kv.Kinds()
	if err != nil {
		return false, err
	}
	seqs, err := kv.Sequences()
	if err != nil {
		return false, err
	}
	return len(kinds) == 0 && len(seqs) == 0, nil
}

// stateVersion is the schema version of the state in kv: 0 for an empty state.
func stateVersion(kv KV) (int, error) {
	text, ok, err := metaString(kv, schemaVersionKey)
	if err != nil {
		return 0, err
	}
	if !ok {
		empty, err := isEmpty(kv)
		if err != nil || empty {
			return 0, err
		}
		return 1, nil
	}
	v, err := strconv.Atoi(text)
	if err != nil || v < 1 {
		return 0, fmt.Errorf("meta %s: corrupt version %q", schemaVersionKey, text)
	}
	return v, nil
}

// migrate brings the state in kv from version from to SchemaVersion.
func migrate(kv KV, from int) error {
	if from > SchemaVersion {
		return fmt.Errorf("the state has schema version %d, newer than this Spillway understands (%d): "+
			"it was written by a newer Spillway; run that version (or newer) of Spillway", from, SchemaVersion)
	}
	for v := from; v < SchemaVersion; v++ {
		if err := migrations[v-1](kv); err != nil {
			return fmt.Errorf("upgrading the state from schema version %d to %d: %w", v, v+1, err)
		}
	}
	return putMeta(kv, schemaVersionKey, strconv.Itoa(SchemaVersion))
}

// Upgrade brings the state to SchemaVersion in one transaction (the controller calls it at
// start): it returns the version found (0 for an empty state, which is stamped with the
// current version). A state newer than SchemaVersion, or one a restore left incomplete, is
// refused.
func Upgrade(ctx context.Context, s *Store) (int, error) {
	var from int
	err := s.engine.Update(ctx, func(kv KV) error {
		if _, ok, err := metaString(kv, restoreMarkKey); err != nil {
			return err
		} else if ok {
			return fmt.Errorf("%w: run `spillway admin restore` again to its end (with --force, as the state is not empty)", ErrRestoreIncomplete)
		}
		var err error
		if from, err = stateVersion(kv); err != nil {
			return err
		}
		if from == SchemaVersion {
			return nil
		}
		if from == 0 {
			return putMeta(kv, schemaVersionKey, strconv.Itoa(SchemaVersion))
		}
		return migrate(kv, from)
	})
	return from, err
}

// migrateTokenIndexToJSON: version 2 keeps a session token's owner as {"session": id}.
func migrateTokenIndexToJSON(kv KV) error {
	type entry struct{ token, idKey string }
	var entries []entry
	err := kv.Scan(sessionTokenIndex, func(token string, raw []byte) error {
		entries = append(entries, entry{token, string(raw)})
		return nil
	})
	if err != nil {
		return err
	}
	for _, e := range entries {
		id, err := strconv.ParseInt(e.idKey, 10, 64)
		if err != nil {
			return fmt.Errorf("%s %s: not a version 1 entry: %q", sessionTokenIndex, e.token, e.idKey)
		}
		raw, _ := json.Marshal(tokenEntry{Session: id})
		if err := kv.Put(sessionTokenIndex, e.token, raw); err != nil {
			return err
		}
	}
	return nil
}

// migrateChildIndex: version 3 indexes a session's objects by their parent and keeps totals.
func migrateChildIndex(kv KV) error {
	tx := newTx(kv)
	for _, index := range []func(*Tx) error{Instances.index, Fragments.index, Configurations.index,
		Namespaces.index, Registrations.index, Activations.index, Stages.index, Sessions.index, Usage.index} {
		if err := index(tx); err != nil {
			return err
		}
	}
	return nil
}
