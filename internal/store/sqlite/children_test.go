package sqlite

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
)

// A session's stages read in write transactions come from store.Children once read: a
// second read reads no stage again, and after commits that change, add and delete stages
// (of this session and of another) what the cache gives is exactly what the store holds. A
// transaction that has written reads its own writes; one that rolls back leaves the cache
// with the committed stages; each reader gets its own copies.
func TestStageChildrenAreTheCommittedStages(t *testing.T) {
	_, st := openTestStore(t)
	ctx := context.Background()
	stage := func(id, session int64, status string) *model.Stage {
		return &model.Stage{ID: id, SessionID: session, Direction: "in", Type: "file", PFSPath: fmt.Sprintf("/pfs/%d", id),
			DWPath: fmt.Sprintf("$DW_JOB_STRIPED/%d", id), Status: status, InJob: true, Warnings: []string{"w"}}
	}
	put := func(stages ...*model.Stage) {
		t.Helper()
		if err := st.Update(ctx, func(tx *store.Tx) error {
			for _, s := range stages {
				if err := store.Stages.Put(tx, s); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for id := int64(1); id <= 40; id++ {
		put(stage(id, 7, model.StagePending))
	}
	put(stage(100, 8, model.StagePending))
	// cached: read in a write transaction before it writes; fresh: a read transaction's
	cached := func(session int64) []*model.Stage {
		t.Helper()
		var out []*model.Stage
		if err := st.Update(ctx, func(tx *store.Tx) error {
			var err error
			out, err = store.Stages.ChildrenOf(tx, "session", session)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	fresh := func(session int64) []*model.Stage {
		t.Helper()
		var out []*model.Stage
		if err := st.View(ctx, func(tx *store.Tx) error {
			var err error
			out, err = store.Stages.ChildrenOf(tx, "session", session)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	same := func(what string) {
		t.Helper()
		for _, s := range []int64{7, 8} {
			if got, want := cached(s), fresh(s); !reflect.DeepEqual(got, want) {
				t.Fatalf("%s: session %d: the cache gives %d stages, the store holds %d:\n%v\n%v", what, s, len(got), len(want), got, want)
			}
		}
	}
	c := store.StageChildren()
	same("first read")
	reads, hits := c.Reads(), c.Hits()
	first := cached(7)
	if c.Reads() != reads || c.Hits() != hits+1 {
		t.Fatalf("a second read of unchanged stages: %d read whole, %d from the cache; want 0 and 1", c.Reads()-reads, c.Hits()-hits)
	}
	first[0].Status, first[0].Warnings[0] = model.StageFailed, "changed by a decision"
	same("after a reader changed its copy")

	// changed, added, deleted (here and in another session)
	put(stage(3, 7, model.StageComplete), stage(41, 7, model.StagePending), stage(101, 8, model.StageRunning))
	if err := st.Update(ctx, func(tx *store.Tx) error {
		if err := store.Stages.Delete(tx, 5); err != nil {
			return err
		}
		return store.Stages.Delete(tx, 100)
	}); err != nil {
		t.Fatal(err)
	}
	reads = c.Reads()
	same("after changes")
	if c.Reads() != reads {
		t.Fatalf("after a few changes the sessions were read whole %d times; want only what changed read", c.Reads()-reads)
	}
	got := cached(7)
	if len(got) != 40 || got[2].Status != model.StageComplete || got[len(got)-1].ID != 41 {
		t.Fatalf("session 7 after the changes: %d stages, the third %s, the last %d", len(got), got[2].Status, got[len(got)-1].ID)
	}

	// a transaction's own writes are seen by its later reads; rolled back, they are not kept
	boom := fmt.Errorf("roll back")
	if err := st.Update(ctx, func(tx *store.Tx) error {
		if _, err := store.Stages.ChildrenOf(tx, "session", 7); err != nil {
			return err
		}
		if err := store.Stages.Put(tx, stage(42, 7, model.StagePending)); err != nil {
			return err
		}
		if err := store.Stages.Delete(tx, 1); err != nil {
			return err
		}
		in, err := store.Stages.ChildrenOf(tx, "session", 7)
		if err != nil {
			return err
		}
		if len(in) != 40 || in[0].ID != 2 || in[len(in)-1].ID != 42 {
			return fmt.Errorf("own writes: %d stages, first %d, last %d; want 40, 2, 42", len(in), in[0].ID, in[len(in)-1].ID)
		}
		return boom
	}); err != boom {
		t.Fatal(err)
	}
	same("after a rollback")
	if got := cached(7); len(got) != 40 || got[0].ID != 1 {
		t.Fatalf("after a rollback: %d stages, the first %d; want 40, 1", len(got), got[0].ID)
	}
}
