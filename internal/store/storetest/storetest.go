// Package storetest is the conformance suite every store engine must pass.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
)

// Factory opens the engine under test. Calling it again with the same dir after Close must
// reopen the same data (the persistence test relies on it).
type Factory func(t *testing.T, dir string) store.Engine

// Run runs the whole suite.
func Run(t *testing.T, open Factory) {
	t.Run("GetMissing", func(t *testing.T) { testGetMissing(t, open) })
	t.Run("PutGetScanDelete", func(t *testing.T) { testPutGetScanDelete(t, open) })
	t.Run("ScanPrefix", func(t *testing.T) { testScanPrefix(t, open) })
	t.Run("ReadYourWrites", func(t *testing.T) { testReadYourWrites(t, open) })
	t.Run("ChildIndex", func(t *testing.T) { testChildIndex(t, open) })
	t.Run("ChildIndexKeys", func(t *testing.T) { testChildIndexKeys(t, open) })
	t.Run("Totals", func(t *testing.T) { testTotals(t, open) })
	t.Run("DueIndex", func(t *testing.T) { testDueIndex(t, open) })
	t.Run("RollbackOnError", func(t *testing.T) { testRollback(t, open) })
	t.Run("ViewIsReadOnly", func(t *testing.T) { testViewReadOnly(t, open) })
	t.Run("Sequences", func(t *testing.T) { testSequences(t, open) })
	t.Run("SerializableUpdates", func(t *testing.T) { testSerializable(t, open) })
	t.Run("Persistence", func(t *testing.T) { testPersistence(t, open) })
	t.Run("TypedTables", func(t *testing.T) { testTyped(t, open) })
	t.Run("SessionTokenIndex", func(t *testing.T) { testTokenIndex(t, open) })
	t.Run("KindsAndSequences", func(t *testing.T) { testKindsAndSequences(t, open) })
	t.Run("ScanValues", func(t *testing.T) { testScanValues(t, open) })
	t.Run("SharedListings", func(t *testing.T) { testSharedListings(t, open) })
}

var ctx = context.Background()

func engine(t *testing.T, open Factory) store.Engine {
	e := open(t, t.TempDir())
	t.Cleanup(func() { e.Close() })
	return e
}

func testGetMissing(t *testing.T, open Factory) {
	e := engine(t, open)
	err := e.View(ctx, func(kv store.KV) error {
		_, err := kv.Get("k", "missing")
		return err
	})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of a missing key: got %v, want ErrNotFound", err)
	}
}

func testPutGetScanDelete(t *testing.T, open Factory) {
	e := engine(t, open)
	must(t, e.Update(ctx, func(kv store.KV) error {
		for _, k := range []string{"b", "a", "c"} {
			if err := kv.Put("letters", k, []byte("v"+k)); err != nil {
				return err
			}
		}
		return kv.Put("other", "a", []byte("x"))
	}))
	must(t, e.Update(ctx, func(kv store.KV) error { return kv.Put("letters", "b", []byte("vb2")) }))
	var keys, values []string
	must(t, e.View(ctx, func(kv store.KV) error {
		return kv.Scan("letters", func(k string, v []byte) error {
			keys = append(keys, k)
			values = append(values, string(v))
			return nil
		})
	}))
	if fmt.Sprint(keys) != "[a b c]" || fmt.Sprint(values) != "[va vb2 vc]" {
		t.Fatalf("scan = %v %v, want keys in order and the overwritten value", keys, values)
	}
	must(t, e.Update(ctx, func(kv store.KV) error {
		if err := kv.Delete("letters", "b"); err != nil {
			return err
		}
		return kv.Delete("letters", "never-there")
	}))
	must(t, e.View(ctx, func(kv store.KV) error {
		if _, err := kv.Get("letters", "b"); !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("deleted key still readable: %v", err)
		}
		v, err := kv.Get("other", "a")
		if err != nil || string(v) != "x" {
			return fmt.Errorf("kinds are not separate: %q %v", v, err)
		}
		return nil
	}))
}

func testScanPrefix(t *testing.T, open Factory) {
	e := engine(t, open)
	scan := func(kv store.KV, prefix string) string {
		var got []string
		if err := kv.ScanPrefix("p", prefix, func(k string, v []byte) error {
			got = append(got, k+"="+string(v))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(got)
	}
	must(t, e.Update(ctx, func(kv store.KV) error {
		for _, k := range []string{"a/2", "a/1", "a", "ab/1", "b/1", "a/\xff"} {
			if err := kv.Put("p", k, []byte("v")); err != nil {
				return err
			}
		}
		if err := kv.Put("q", "a/3", []byte("other kind")); err != nil {
			return err
		}
		// Inside the transaction: its own writes and deletions are in the range.
		if err := kv.Delete("p", "a/2"); err != nil {
			return err
		}
		if got := scan(kv, "a/"); got != "[a/1=v a/\xff=v]" {
			return fmt.Errorf("prefix a/ inside the writing transaction = %s", got)
		}
		return nil
	}))
	must(t, e.View(ctx, func(kv store.KV) error {
		for prefix, want := range map[string]string{
			"a/":     "[a/1=v a/\xff=v]",
			"a":      "[a=v a/1=v a/\xff=v ab/1=v]",
			"b/1":    "[b/1=v]",
			"c":      "[]",
			"":       "[a=v a/1=v a/\xff=v ab/1=v b/1=v]",
			"a/\xff": "[a/\xff=v]",
		} {
			if got := scan(kv, prefix); got != want {
				return fmt.Errorf("ScanPrefix(%q) = %s, want %s (in key order, that kind only)", prefix, got, want)
			}
		}
		return nil
	}))
}

// testChildIndex: the typed tables keep the child index through puts and deletes, inside a
// transaction and after it.
func testChildIndex(t *testing.T, open Factory) {
	s := store.New(engine(t, open))
	ids := func(frags []*model.Fragment) string {
		var out []int64
		for _, f := range frags {
			out = append(out, f.ID)
		}
		return fmt.Sprint(out)
	}
	must(t, s.Update(ctx, func(tx *store.Tx) error {
		for id := int64(1); id <= 12; id++ { // ids past 9: id order, not text order
			if err := store.Fragments.Put(tx, &model.Fragment{ID: id, InstanceID: 1 + id%2, Node: "n"}); err != nil {
				return err
			}
		}
		if err := store.Fragments.Put(tx, &model.Fragment{ID: 4, InstanceID: 1, Node: "m"}); err != nil { // a change
			return err
		}
		if err := store.Fragments.Delete(tx, 6); err != nil {
			return err
		}
		got, err := store.Fragments.ChildrenOf(tx, "instance", 1)
		if err != nil || ids(got) != "[2 4 8 10 12]" {
			return fmt.Errorf("children of instance 1 inside the transaction = %s %v, want [2 4 8 10 12]", ids(got), err)
		}
		return nil
	}))
	must(t, s.Update(ctx, func(tx *store.Tx) error {
		if err := store.Fragments.Delete(tx, 99); err != nil { // missing: not an error
			return err
		}
		return store.Fragments.Delete(tx, 12)
	}))
	must(t, s.View(ctx, func(tx *store.Tx) error {
		one, err := store.Fragments.ChildrenOf(tx, "instance", 1)
		if err != nil || ids(one) != "[2 4 8 10]" || one[1].Node != "m" {
			return fmt.Errorf("children of instance 1 = %s %v, want [2 4 8 10], fragment 4 on m", ids(one), err)
		}
		two, err := store.Fragments.ChildrenOf(tx, "instance", 2)
		if err != nil || ids(two) != "[1 3 5 7 9 11]" {
			return fmt.Errorf("children of instance 2 = %s %v", ids(two), err)
		}
		none, err := store.Fragments.ChildrenOf(tx, "instance", 3)
		if err != nil || len(none) != 0 {
			return fmt.Errorf("children of instance 3 = %s %v, want none", ids(none), err)
		}
		onM, err := store.Fragments.ChildrenOfKey(tx, "node", "m")
		if err != nil || ids(onM) != "[4]" {
			return fmt.Errorf("fragments on node m = %s %v, want [4] (moved there)", ids(onM), err)
		}
		onN, err := store.Fragments.ChildrenOfKey(tx, "node", "n")
		if err != nil || ids(onN) != "[1 2 3 5 7 8 9 10 11]" {
			return fmt.Errorf("fragments on node n = %s %v, want every other but 4, 6 and 12", ids(onN), err)
		}
		return nil
	}))
}

// testChildIndexKeys: the child index finds children under parent keys of several bytes per
// character and under keys that are not UTF-8 (node names are what admins typed; SQLite
// joins the index in bytes), and an entry whose record is gone is an error, not a silent gap.
func testChildIndexKeys(t *testing.T, open Factory) {
	e := engine(t, open)
	s := store.New(e)
	nodes := []string{"nœud-ü", "bb\xff\xfe01"}
	must(t, s.Update(ctx, func(tx *store.Tx) error {
		for i, n := range nodes {
			for id := int64(1); id <= 3; id++ {
				if err := store.Fragments.Put(tx, &model.Fragment{ID: int64(10*i) + id, InstanceID: 1, Node: n}); err != nil {
					return err
				}
			}
		}
		return nil
	}))
	must(t, s.View(ctx, func(tx *store.Tx) error {
		for i, n := range nodes {
			got, err := store.Fragments.ChildrenOfKey(tx, "node", n)
			if err != nil || len(got) != 3 || got[0].ID != int64(10*i)+1 || got[2].ID != int64(10*i)+3 {
				return fmt.Errorf("fragments on node %q = %v %v, want 3 from id %d", n, got, err, 10*i+1)
			}
		}
		return nil
	}))
	// Fragment 2's record goes behind the typed layer's back: its index entries stay.
	must(t, e.Update(ctx, func(kv store.KV) error { return kv.Delete("fragment", fmt.Sprintf("%019d", 2)) }))
	err := s.View(ctx, func(tx *store.Tx) error {
		_, err := store.Fragments.ChildrenOf(tx, "instance", 1)
		return err
	})
	if !store.IsNotFound(err) || !strings.Contains(err.Error(), "0000000000000000002") {
		t.Fatalf("children through an index entry whose record is gone: %v, want a not-found error naming it", err)
	}
}

// testTotals: the session count and each node's grains and fragments follow puts, changes
// and deletes, inside a transaction and after it.
func testTotals(t *testing.T, open Factory) {
	s := store.New(engine(t, open))
	want := func(tx *store.Tx, text string) error {
		got, err := store.ReadTotals(tx)
		if err != nil {
			return err
		}
		if fmt.Sprint(got.Sessions, got.Nodes) != text {
			return fmt.Errorf("totals = %v %v, want %s", got.Sessions, got.Nodes, text)
		}
		return nil
	}
	must(t, s.Update(ctx, func(tx *store.Tx) error {
		for id := int64(1); id <= 3; id++ {
			if err := store.PutSession(tx, &model.Session{ID: id, Token: fmt.Sprint(id)}); err != nil {
				return err
			}
			if err := store.PutSession(tx, &model.Session{ID: id, Token: fmt.Sprint(id), Phase: "setup"}); err != nil { // a change
				return err
			}
			if err := store.Fragments.Put(tx, &model.Fragment{ID: id, InstanceID: id, Node: "a", Grains: uint64(id)}); err != nil {
				return err
			}
		}
		if err := store.Fragments.Put(tx, &model.Fragment{ID: 4, InstanceID: 4, Node: "b", Grains: 5}); err != nil {
			return err
		}
		return want(tx, "3 map[a:{6 3} b:{5 1}]")
	}))
	must(t, s.Update(ctx, func(tx *store.Tx) error {
		if err := store.Fragments.Put(tx, &model.Fragment{ID: 3, InstanceID: 3, Node: "b", Grains: 3}); err != nil { // moved
			return err
		}
		if err := store.Fragments.Delete(tx, 4); err != nil {
			return err
		}
		sess, err := store.Sessions.Get(tx, 2)
		if err != nil {
			return err
		}
		return store.DeleteSession(tx, sess)
	}))
	must(t, s.View(ctx, func(tx *store.Tx) error { return want(tx, "2 map[a:{3 2} b:{3 1}]") }))
}

// testDueIndex: sessions marked due are listed with their times until taken out.
func testDueIndex(t *testing.T, open Factory) {
	s := store.New(engine(t, open))
	later := time.Unix(1_800_000_000, 0).UTC()
	must(t, s.Update(ctx, func(tx *store.Tx) error {
		for _, id := range []int64{3, 12, 7} {
			if err := store.MarkDue(tx, id, time.Time{}); err != nil {
				return err
			}
		}
		if err := store.MarkDue(tx, 7, later); err != nil {
			return err
		}
		return store.NotDue(tx, 3)
	}))
	must(t, s.View(ctx, func(tx *store.Tx) error {
		due, err := store.DueSessions(tx)
		if err != nil {
			return err
		}
		if len(due) != 2 || !due[12].IsZero() || !due[7].Equal(later) {
			return fmt.Errorf("due = %v, want 12 now and 7 at %v", due, later)
		}
		return nil
	}))
}

func testReadYourWrites(t *testing.T, open Factory) {
	e := engine(t, open)
	must(t, e.Update(ctx, func(kv store.KV) error {
		if err := kv.Put("k", "x", []byte("1")); err != nil {
			return err
		}
		v, err := kv.Get("k", "x")
		if err != nil || string(v) != "1" {
			return fmt.Errorf("a transaction must read its own write: %q %v", v, err)
		}
		n := 0
		kv.Scan("k", func(string, []byte) error { n++; return nil })
		if n != 1 {
			return fmt.Errorf("scan inside the transaction saw %d keys, want 1", n)
		}
		return nil
	}))
}

func testRollback(t *testing.T, open Factory) {
	e := engine(t, open)
	boom := errors.New("boom")
	err := e.Update(ctx, func(kv store.KV) error {
		kv.Put("k", "x", []byte("1"))
		kv.NextSeq("s")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update must return fn's error, got %v", err)
	}
	must(t, e.View(ctx, func(kv store.KV) error {
		if _, err := kv.Get("k", "x"); !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("write of a failed transaction is visible: %v", err)
		}
		return nil
	}))
}

func testViewReadOnly(t *testing.T, open Factory) {
	e := engine(t, open)
	err := e.View(ctx, func(kv store.KV) error { return kv.Put("k", "x", []byte("1")) })
	if !errors.Is(err, store.ErrReadOnly) {
		t.Fatalf("Put in View: got %v, want ErrReadOnly", err)
	}
}

func testSequences(t *testing.T, open Factory) {
	e := engine(t, open)
	var got []int64
	for i := 0; i < 3; i++ {
		must(t, e.Update(ctx, func(kv store.KV) error {
			a, err := kv.NextSeq("job")
			if err != nil {
				return err
			}
			got = append(got, a)
			return nil
		}))
	}
	must(t, e.Update(ctx, func(kv store.KV) error {
		b, err := kv.NextSeq("other")
		if b != 1 {
			return fmt.Errorf("a new sequence starts at 1, got %d", b)
		}
		return err
	}))
	if fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("sequence = %v, want [1 2 3]", got)
	}
}

func testSerializable(t *testing.T, open Factory) {
	e := engine(t, open)
	const workers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				err := e.Update(ctx, func(kv store.KV) error {
					n := 0
					if v, err := kv.Get("c", "n"); err == nil {
						fmt.Sscan(string(v), &n)
					} else if !errors.Is(err, store.ErrNotFound) {
						return err
					}
					return kv.Put("c", "n", []byte(fmt.Sprint(n+1)))
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	// Readers alongside the writers must see whole numbers, never fail.
	stop := make(chan struct{})
	var readErr error
	var rwg sync.WaitGroup
	rwg.Add(1)
	go func() {
		defer rwg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := e.View(ctx, func(kv store.KV) error { _, err := kv.Get("c", "n"); return err }); err != nil && !errors.Is(err, store.ErrNotFound) {
				readErr = err
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	wg.Wait()
	close(stop)
	rwg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if readErr != nil {
		t.Fatalf("reader failed beside writers: %v", readErr)
	}
	must(t, e.View(ctx, func(kv store.KV) error {
		v, err := kv.Get("c", "n")
		if err != nil || string(v) != fmt.Sprint(workers*each) {
			return fmt.Errorf("counter = %q (%v), want %d: lost updates", v, err, workers*each)
		}
		return nil
	}))
}

func testPersistence(t *testing.T, open Factory) {
	dir := t.TempDir()
	e := open(t, dir)
	must(t, e.Update(ctx, func(kv store.KV) error {
		kv.NextSeq("s")
		return kv.Put("k", "x", []byte("kept"))
	}))
	must(t, e.Close())
	e = open(t, dir)
	defer e.Close()
	must(t, e.Update(ctx, func(kv store.KV) error {
		v, err := kv.Get("k", "x")
		if err != nil || string(v) != "kept" {
			return fmt.Errorf("after reopen: %q %v", v, err)
		}
		n, err := kv.NextSeq("s")
		if n != 2 {
			return fmt.Errorf("sequence after reopen = %d, want 2 (never reuse)", n)
		}
		return err
	}))
}

func testTyped(t *testing.T, open Factory) {
	s := store.New(engine(t, open))
	must(t, s.Update(ctx, func(tx *store.Tx) error {
		if err := store.Pools.Put(tx, &model.Pool{Name: "wlm_pool", Granularity: 1 << 30}); err != nil {
			return err
		}
		for i := 0; i < 12; i++ { // more than 9: ids must sort numerically
			id, err := store.Fragments.NewID(tx)
			if err != nil {
				return err
			}
			if err := store.Fragments.Put(tx, &model.Fragment{ID: id, InstanceID: int64(i % 2), Node: "n"}); err != nil {
				return err
			}
		}
		return nil
	}))
	must(t, s.View(ctx, func(tx *store.Tx) error {
		p, err := store.Pools.Get(tx, "wlm_pool")
		if err != nil || p.Granularity != 1<<30 {
			return fmt.Errorf("pool: %+v %v", p, err)
		}
		all, err := store.Fragments.List(tx)
		if err != nil || len(all) != 12 {
			return fmt.Errorf("fragments: %d %v", len(all), err)
		}
		for i, f := range all {
			if f.ID != int64(i+1) {
				return fmt.Errorf("fragment %d has id %d: list must be in id order", i, f.ID)
			}
		}
		odd, _ := store.Fragments.Filter(tx, func(f *model.Fragment) bool { return f.InstanceID == 1 })
		if len(odd) != 6 {
			return fmt.Errorf("filter found %d, want 6", len(odd))
		}
		if _, err := store.Fragments.Get(tx, 99); !store.IsNotFound(err) {
			return fmt.Errorf("missing fragment: %v", err)
		}
		return nil
	}))
}

func testTokenIndex(t *testing.T, open Factory) {
	s := store.New(engine(t, open))
	must(t, s.Update(ctx, func(tx *store.Tx) error {
		return store.PutSession(tx, &model.Session{ID: 7, Token: "1234", Owner: 1001})
	}))
	err := s.Update(ctx, func(tx *store.Tx) error {
		return store.PutSession(tx, &model.Session{ID: 8, Token: "1234"})
	})
	if err == nil {
		t.Fatal("a second session with the same token must be refused")
	}
	must(t, s.Update(ctx, func(tx *store.Tx) error {
		got, err := store.SessionByToken(tx, "1234")
		if err != nil || got.ID != 7 || got.Owner != 1001 {
			return fmt.Errorf("by token: %+v %v", got, err)
		}
		return store.DeleteSession(tx, got)
	}))
	must(t, s.View(ctx, func(tx *store.Tx) error {
		if _, err := store.SessionByToken(tx, "1234"); !store.IsNotFound(err) {
			return fmt.Errorf("deleted session still found by token: %v", err)
		}
		return nil
	}))
}

func testKindsAndSequences(t *testing.T, open Factory) {
	e := engine(t, open)
	must(t, e.Update(ctx, func(kv store.KV) error {
		for _, kind := range []string{"b", "a", "c"} {
			if err := kv.Put(kind, "x", []byte("1")); err != nil {
				return err
			}
		}
		if err := kv.Delete("c", "x"); err != nil {
			return err
		}
		kinds, err := kv.Kinds()
		if err != nil || fmt.Sprint(kinds) != "[a b]" {
			return fmt.Errorf("kinds inside the transaction = %v %v, want [a b] (its own writes, no emptied kind)", kinds, err)
		}
		kv.NextSeq("job")
		kv.NextSeq("job")
		return kv.SetSequence("restored", 41)
	}))
	must(t, e.View(ctx, func(kv store.KV) error {
		kinds, err := kv.Kinds()
		if err != nil || fmt.Sprint(kinds) != "[a b]" {
			return fmt.Errorf("kinds = %v %v, want [a b]", kinds, err)
		}
		seqs, err := kv.Sequences()
		if err != nil || fmt.Sprint(seqs) != "map[job:2 restored:41]" {
			return fmt.Errorf("sequences = %v %v, want job:2 restored:41", seqs, err)
		}
		if err := kv.SetSequence("job", 9); !errors.Is(err, store.ErrReadOnly) {
			return fmt.Errorf("SetSequence in View: %v, want ErrReadOnly", err)
		}
		return nil
	}))
	must(t, e.Update(ctx, func(kv store.KV) error {
		n, err := kv.NextSeq("restored")
		if err != nil || n != 42 {
			return fmt.Errorf("NextSeq after SetSequence(41) = %d %v, want 42", n, err)
		}
		if err := kv.SetSequence("job", 0); err != nil {
			return err
		}
		seqs, err := kv.Sequences()
		if err != nil || fmt.Sprint(seqs) != "map[restored:42]" {
			return fmt.Errorf("sequences after forgetting job = %v %v", seqs, err)
		}
		return nil
	}))
	must(t, e.Update(ctx, func(kv store.KV) error {
		n, err := kv.NextSeq("job")
		if err != nil || n != 1 {
			return fmt.Errorf("a forgotten sequence starts again at 1, got %d %v", n, err)
		}
		return nil
	}))
}

// testScanValues: an engine that reads values without their keys (store.ValueScanner) reads
// those Scan reads, in the same order, of that kind only.
func testScanValues(t *testing.T, open Factory) {
	e := engine(t, open)
	must(t, e.Update(ctx, func(kv store.KV) error {
		for _, k := range []string{"b", "a", "c", "a/1", "\xff"} {
			if err := kv.Put("k", k, []byte("v"+k)); err != nil {
				return err
			}
		}
		return kv.Put("l", "a", []byte("other kind"))
	}))
	must(t, e.View(ctx, func(kv store.KV) error {
		vs, ok := kv.(store.ValueScanner)
		if !ok {
			t.Skip("this engine has no ScanValues: listings read with Scan")
		}
		var scanned, values []string
		if err := kv.Scan("k", func(_ string, v []byte) error { scanned = append(scanned, string(v)); return nil }); err != nil {
			return err
		}
		if err := vs.ScanValues("k", func(v []byte) error { values = append(values, string(v)); return nil }); err != nil {
			return err
		}
		if fmt.Sprint(values) != fmt.Sprint(scanned) || len(values) != 5 {
			return fmt.Errorf("ScanValues read %q, Scan %q", values, scanned)
		}
		return nil
	}))
}

// testSharedListings: a listing through store.Shared is the table as the transaction reads
// it, whatever was written since the last listing and by whom; it decodes again only the
// records whose bytes changed; the cache holds the records the table holds, however many came
// and went.
func testSharedListings(t *testing.T, open Factory) {
	s := store.New(engine(t, open))
	var cache store.Shared
	put := func(fragments ...*model.Fragment) {
		t.Helper()
		must(t, s.Update(ctx, func(tx *store.Tx) error {
			for _, f := range fragments {
				if err := store.Fragments.Put(tx, f); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	del := func(ids ...int64) {
		t.Helper()
		must(t, s.Update(ctx, func(tx *store.Tx) error {
			for _, id := range ids {
				if err := store.Fragments.Delete(tx, id); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	// list lists through the cache, and checks the listing is what List reads.
	list := func(when string) []*model.Fragment {
		t.Helper()
		var shared, direct []*model.Fragment
		must(t, s.View(ctx, func(tx *store.Tx) error {
			var err error
			if shared, err = store.Fragments.ListShared(tx, &cache); err != nil {
				return err
			}
			direct, err = store.Fragments.List(tx)
			return err
		}))
		if len(shared) != len(direct) {
			t.Fatalf("%s: the listing through the cache has %d fragments, the table %d", when, len(shared), len(direct))
		}
		for i := range direct {
			if fmt.Sprintf("%+v", *shared[i]) != fmt.Sprintf("%+v", *direct[i]) {
				t.Errorf("%s: fragment %d through the cache %+v, in the table %+v", when, i, *shared[i], *direct[i])
			}
		}
		if cache.Records() != len(direct) {
			t.Errorf("%s: the cache holds %d records, the table %d", when, cache.Records(), len(direct))
		}
		return shared
	}
	put(&model.Fragment{ID: 1, InstanceID: 1, Node: "a"}, &model.Fragment{ID: 2, InstanceID: 1, Node: "b"}, &model.Fragment{ID: 3, InstanceID: 2, Node: "c"})
	first := list("three fragments")
	again := list("nothing changed")
	for i := range first {
		if again[i] != first[i] {
			t.Errorf("fragment %d was decoded again though its record did not change", first[i].ID)
		}
	}
	changed := *first[1]
	changed.State.FuseBlown, changed.State.Error = true, "blown"
	put(&changed, &model.Fragment{ID: 4, InstanceID: 3, Node: "d"})
	del(3)
	after := list("one changed, one deleted, one added")
	if len(after) != 3 || after[0] != first[0] || after[1] == first[1] || !after[1].State.FuseBlown || after[2].ID != 4 {
		t.Errorf("after the changes: %+v %+v %+v; want fragment 1 as it was decoded, 2 decoded again with its fuse blown, 4 new", *after[0], *after[1], *after[2])
	}
	put(&model.Fragment{ID: 3, InstanceID: 2, Node: "c2"}) // back between 2 and 4
	between := list("one added between two")
	if len(between) != 4 || between[0] != after[0] || between[1] != after[1] || between[2].Node != "c2" || between[3] != after[2] {
		t.Errorf("after adding fragment 3 between 2 and 4: %+v; want 1, 2 and 4 as they were decoded", between)
	}
	del(2)
	if got := list("the second deleted"); len(got) != 3 || got[0] != after[0] || got[1] != between[2] || got[2] != after[2] {
		t.Errorf("after deleting fragment 2: %+v; want 1, 3 and 4 as they were decoded", got)
	}
	del(3)
	for round := int64(0); round < 20; round++ { // churn: the cache follows the table
		put(&model.Fragment{ID: 100 + round, InstanceID: 9, Node: "e"})
		list("a fragment came")
		del(100 + round)
	}
	list("the churn is over")
	del(1, 4)
	if got := list("the table emptied"); len(got) != 0 {
		t.Errorf("listing of an empty table: %+v", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
