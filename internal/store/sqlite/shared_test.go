package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"path/filepath"
	"sync"
	"testing"

	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
)

// A listing through store.Shared reads again only the keys written since the listing it
// starts from (the engine's change log), and answers as a whole scan does: with a writer
// putting and deleting records all the while, every listing equals List in its own
// transaction.
func TestSharedListingReadsWhatChanged(t *testing.T) {
	e, st := openTestStore(t)
	ctx := context.Background()
	put := func(tx *store.Tx, id int64, label string) error {
		return store.Instances.Put(tx, &model.Instance{ID: id, SessionID: id % 7, Label: label, Pool: "wlm_pool"})
	}
	if err := st.Update(ctx, func(tx *store.Tx) error {
		for id := int64(1); id <= 300; id++ {
			if err := put(tx, id, "first"); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var shared store.Shared
	compare := func(tx *store.Tx) error {
		got, err := store.Instances.ListShared(tx, &shared)
		if err != nil {
			return err
		}
		want, err := store.Instances.List(tx)
		if err != nil {
			return err
		}
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if string(g) != string(w) {
			return fmt.Errorf("the shared listing (%d records) differs from the table's (%d)", len(got), len(want))
		}
		return nil
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := st.View(ctx, compare); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	rng := rand.New(rand.NewSource(1))
	for i := 0; i < 400; i++ {
		err := st.Update(ctx, func(tx *store.Tx) error {
			for j := rng.Intn(4); j >= 0; j-- {
				id := int64(1 + rng.Intn(400))
				if rng.Intn(3) == 0 {
					if err := store.Instances.Delete(tx, id); err != nil {
						return err
					}
				} else if err := put(tx, id, fmt.Sprint("v", i)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := st.View(ctx, compare); err != nil {
		t.Fatal(err)
	}
	// The listing from the last one reads the changed keys alone: a record changed behind the
	// log's back (no process but this one writes the database) is not read again...
	if err := st.Update(ctx, func(tx *store.Tx) error { return put(tx, 5, "before") }); err != nil {
		t.Fatal(err)
	}
	if err := st.View(ctx, compare); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(`UPDATE kv SET value = ? WHERE kind = 'instance' AND key = ?`,
		`{"id":5,"session":5,"label":"behind"}`, string(mustKey(t, st, 5))); err != nil {
		t.Fatal(err)
	}
	var listed []*model.Instance
	st.View(ctx, func(tx *store.Tx) (err error) { listed, err = store.Instances.ListShared(tx, &shared); return })
	for _, inst := range listed {
		if inst.ID == 5 && inst.Label == "behind" {
			t.Fatal("a listing with nothing committed since the last one read the table again")
		}
	}
	// ... while a key a commit wrote is.
	if err := st.Update(ctx, func(tx *store.Tx) error { return put(tx, 5, "committed") }); err != nil {
		t.Fatal(err)
	}
	if err := st.View(ctx, compare); err != nil {
		t.Fatal(err)
	}
}

// mustKey is instance id's key in the kv table.
func mustKey(t *testing.T, st *store.Store, id int64) string {
	t.Helper()
	var key string
	st.Engine().View(context.Background(), func(kv store.KV) error {
		return kv.Scan("instance", func(k string, v []byte) error {
			var o model.Instance
			if json.Unmarshal(v, &o) == nil && o.ID == id {
				key = k
			}
			return nil
		})
	})
	if key == "" {
		t.Fatalf("no instance %d", id)
	}
	return key
}

// The change log forgets its oldest changes past maxChanges, whole commits at a time: a
// listing from before them reads the table again.
func TestChangeLogForgetsWholeCommits(t *testing.T) {
	var l changeLog
	commit := func(n int) {
		keys := make([]change, n)
		for i := range keys {
			keys[i] = change{kind: "k", key: fmt.Sprint(i)}
		}
		l.begin()
		l.end(keys)
	}
	commit(1)
	commit(maxChanges / 2)
	commit(maxChanges / 2) // one change too many: commits 1 and 2 are forgotten
	for since := uint64(0); since < 2; since++ {
		if keys, ok := l.changedSince("k", since, 3); ok {
			t.Fatalf("changes since %d are forgotten, yet %d keys were given", since, len(keys))
		}
	}
	if keys, ok := l.changedSince("k", 2, 3); !ok || len(keys) != maxChanges/2 {
		t.Fatalf("changes since 2: %d keys, %v; want commit 3's %d", len(keys), ok, maxChanges/2)
	}
	if keys, ok := l.changedSince("other", 2, 3); !ok || len(keys) != 0 {
		t.Fatalf("another kind's changes: %v %v", keys, ok)
	}
	commit(maxChanges) // cut in two by the bound: forgotten whole
	if _, ok := l.changedSince("k", 3, 4); ok {
		t.Fatal("commit 4 was cut: changes since 3 cannot be complete")
	}
	if keys, ok := l.changedSince("k", 4, 4); !ok || len(keys) != 0 {
		t.Fatalf("changes since 4: %d keys, %v", len(keys), ok)
	}
	// A snapshot older than the cache's version cannot be brought forward from it.
	if _, ok := l.changedSince("k", 4, 3); ok {
		t.Fatal("changes since 4 up to 3 cannot be told")
	}
}

// Records read through store.Rows in write transactions are read again only when a commit
// wrote them since: one changed behind the log's back is not, one committed is; a write that
// rolls back leaves the committed record; a record missing, then created, is found.
func TestRowsReadAgainWhatCommitsWrote(t *testing.T) {
	e, st := openTestStore(t)
	ctx := context.Background()
	var rows store.Rows[model.FragmentUsage]
	put := func(id int64, node string) {
		t.Helper()
		if err := st.Update(ctx, func(tx *store.Tx) error {
			return store.Usage.Put(tx, &model.FragmentUsage{Fragment: id, Instance: 1, Node: node})
		}); err != nil {
			t.Fatal(err)
		}
	}
	get := func(id int64) string {
		t.Helper()
		node := ""
		if err := st.Update(ctx, func(tx *store.Tx) error {
			row, err := store.Usage.GetCached(tx, &rows, id)
			if store.IsNotFound(err) {
				node = "(none)"
				return nil
			}
			if err != nil {
				return err
			}
			node = row.Node
			row.Node = "changed by the caller" // a copy: the rows keep theirs
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return node
	}
	put(1, "a")
	put(2, "a")
	if got := get(1) + get(2) + get(3); got != "aa(none)" {
		t.Fatalf("first reads: %q", got)
	}
	if _, err := e.db.Exec(`UPDATE kv SET value = ? WHERE kind = 'fragment_usage' AND key = ?`,
		`{"fragment":1,"instance":1,"node":"behind","counters":{}}`, fmt.Sprintf("%019d", 1)); err != nil {
		t.Fatal(err)
	}
	put(2, "b")
	put(3, "c")
	if got := get(1) + get(2) + get(3); got != "abc" {
		t.Fatalf("after commits wrote 2 and 3 (and 1 was changed behind the log): %q, want abc", got)
	}
	// A transaction that reads, writes and rolls back.
	st.Update(ctx, func(tx *store.Tx) error {
		row, err := store.Usage.GetCached(tx, &rows, 2)
		if err != nil {
			return err
		}
		row.Node = "rolled back"
		if err := store.Usage.Put(tx, row); err != nil {
			return err
		}
		return fmt.Errorf("roll back")
	})
	if got := get(2); got != "b" {
		t.Fatalf("after a rolled-back write: %q, want b", got)
	}
	// A transaction reads its own writes.
	if err := st.Update(ctx, func(tx *store.Tx) error {
		if err := store.Usage.Put(tx, &model.FragmentUsage{Fragment: 2, Instance: 1, Node: "own"}); err != nil {
			return err
		}
		row, err := store.Usage.GetCached(tx, &rows, 2)
		if err != nil {
			return err
		}
		if row.Node != "own" {
			return fmt.Errorf("a transaction read %q after writing own", row.Node)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := get(2); got != "own" {
		t.Fatalf("after a committed write: %q, want own", got)
	}
	// A read transaction reads the store (the rows are for write transactions).
	if err := st.View(ctx, func(tx *store.Tx) error {
		_, err := store.Usage.GetCached(tx, &rows, 1)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// openTestStore opens an engine on a new database in the test's directory (closed at its end)
// and the store over it.
func openTestStore(t *testing.T) (*Engine, *store.Store) {
	t.Helper()
	e, err := Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, store.New(e)
}
