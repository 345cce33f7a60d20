package sqlite

import (
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
)

// A session's stages read again come from store.Decoded when their bytes are unchanged: each
// reader gets its own deep copy (a decision changes what it read), a record written since is
// decoded afresh, and what is read always equals the record's bytes.
func TestDecodedStagesAreCopiesOfTheirBytes(t *testing.T) {
	_, st := openTestStore(t)
	ctx := context.Background()
	full := func(id int64) *model.Stage {
		return &model.Stage{ID: id, SessionID: 7, Direction: "in", Type: "file", PFSPath: "/pfs/f", DWPath: "/f", Status: model.StageRunning,
			Warnings: []string{"w"}, Parts: []model.StagePart{{Node: "n1", Status: "running"}}, Moved: map[string]uint64{"n1": 1},
			Started: time.Unix(1700000000, 0).UTC(), State: model.State{Goal: model.GoalCreate}, InJob: true}
	}
	if err := st.Update(ctx, func(tx *store.Tx) error {
		for id := int64(1); id <= 50; id++ {
			if err := store.Stages.Put(tx, full(id)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	read := func() []*model.Stage {
		var out []*model.Stage
		if err := st.View(ctx, func(tx *store.Tx) error {
			var err error
			out, err = store.Stages.ChildrenOf(tx, "session", 7)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if len(out) != 50 {
			t.Fatalf("read %d stages, want 50", len(out))
		}
		return out
	}
	d := store.Stages.Decoded()
	read()
	hits := d.Hits()
	first := read()
	if d.Hits()-hits != 50 {
		t.Fatalf("a second read of unchanged stages took %d of 50 from the cache", d.Hits()-hits)
	}
	if !reflect.DeepEqual(first[0], full(1)) {
		t.Fatalf("a cached stage differs from the one written:\n%+v\n%+v", first[0], full(1))
	}
	// The reader changes what it read, deep inside: the next reader must not see it.
	first[0].Status, first[0].Warnings[0], first[0].Parts[0].Status, first[0].Moved["n1"] = "complete", "changed", "changed", 99
	if again := read(); !reflect.DeepEqual(again[0], full(1)) {
		t.Fatalf("a change to a read stage reached the next read: %+v", again[0])
	}
	// A record written since is read as written.
	if err := st.Update(ctx, func(tx *store.Tx) error {
		s := full(2)
		s.Status, s.BytesDone = model.StageComplete, 4096
		return store.Stages.Put(tx, s)
	}); err != nil {
		t.Fatal(err)
	}
	if got := read()[1]; got.Status != model.StageComplete || got.BytesDone != 4096 {
		t.Fatalf("a rewritten stage read as %s, %d bytes; want complete, 4096", got.Status, got.BytesDone)
	}
}

// cloneStage (through the cache) must copy every field that refers to memory: a new slice,
// map or pointer field of model.Stage that the copy shared would let one decision's change
// reach another's. This lists them; add the new one to cloneStage, then here.
func TestStageReferenceFieldsAreKnown(t *testing.T) {
	known := map[string]bool{"Warnings": true, "Parts": true, "Moved": true}
	var check func(prefix string, typ reflect.Type)
	check = func(prefix string, typ reflect.Type) {
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			switch f.Type.Kind() {
			case reflect.Slice, reflect.Map, reflect.Pointer, reflect.Interface, reflect.Chan, reflect.Func:
				if !known[prefix+f.Name] && f.Type != reflect.TypeOf(time.Time{}) {
					t.Errorf("model.Stage.%s%s (%s) refers to memory: store.cloneStage must copy it", prefix, f.Name, f.Type)
				}
			case reflect.Struct:
				if f.Type != reflect.TypeOf(time.Time{}) {
					check(prefix+f.Name+".", f.Type)
				}
			}
		}
	}
	check("", reflect.TypeOf(model.Stage{}))
	var p model.StagePart
	if b, _ := json.Marshal(p); len(b) == 0 {
		t.Fatal("StagePart does not encode")
	}
	for i := 0; i < reflect.TypeOf(p).NumField(); i++ {
		switch reflect.TypeOf(p).Field(i).Type.Kind() {
		case reflect.Slice, reflect.Map, reflect.Pointer:
			t.Errorf("model.StagePart.%s refers to memory: store.cloneStage copies Parts element by element", reflect.TypeOf(p).Field(i).Name)
		}
	}
}

// A write transaction of the executor's (store.Background) lets the requests' waiting beside
// it go first, up to executor.yield_to_requests of them; requests keep their order.
func TestRequestsWriteBeforeTheExecutor(t *testing.T) {
	for _, tc := range []struct {
		yield int
		want  string
	}{{16, "held r1 r2 r3 bg"}, {2, "held r1 r2 bg r3"}, {0, "held bg r1 r2 r3"}} {
		e, err := Open(filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		e.YieldToRequests(tc.yield)
		var order []string
		held, release := make(chan struct{}), make(chan struct{})
		done := make(chan struct{}, 8)
		write := func(ctx context.Context, name string) {
			e.Update(ctx, func(store.KV) error {
				order = append(order, name) // one writer at a time: no lock needed
				if name == "held" {
					close(held)
					<-release
				}
				return nil
			})
			done <- struct{}{}
		}
		go write(context.Background(), "held")
		<-held
		// Queued in this order, each one surely waiting before the next (the turns are
		// taken under one lock; a short pause lets each goroutine reach its wait).
		go write(store.Background(context.Background()), "bg")
		time.Sleep(20 * time.Millisecond)
		for _, r := range []string{"r1", "r2", "r3"} {
			go write(context.Background(), r)
			time.Sleep(20 * time.Millisecond)
		}
		close(release)
		for i := 0; i < 5; i++ {
			<-done
		}
		e.Close()
		if got := join(order); got != tc.want {
			t.Errorf("yield_to_requests = %d: writes in the order %q, want %q", tc.yield, got, tc.want)
		}
	}
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}
