package lifecycle

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/spillway-hpc/spillway/internal/model"
)

// The parent index answers every lookup as the walk of the maps does, through random
// additions, in-place changes and removals made the lifecycle's way (put, remove).
func TestParentIndexAnswersAsTheWalk(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	indexed, walked := NewWorld(), NewWorld()
	indexed.Index()
	nextID := ID(1)
	const parents = 12 // parent ids are drawn from 1..parents: groups of several, and empty ones
	parent := func() ID { return ID(1 + rng.Intn(parents)) }
	newObject := func() any {
		id := nextID
		nextID++
		switch rng.Intn(8) {
		case 0:
			return &model.Session{ID: id, Token: fmt.Sprint("t", id)}
		case 1:
			return &model.Instance{ID: id, SessionID: parent()}
		case 2:
			return &model.Fragment{ID: id, InstanceID: parent()}
		case 3:
			return &model.Configuration{ID: id, InstanceID: parent()}
		case 4:
			return &model.Namespace{ID: id, ConfigurationID: parent()}
		case 5:
			return &model.Registration{ID: id, SessionID: parent()}
		case 6:
			return &model.Activation{ID: id, SessionID: parent()}
		}
		return &model.Stage{ID: id, SessionID: parent()}
	}
	var live []any
	for step := 0; step < 600; step++ {
		switch r := rng.Intn(10); {
		case r < 6 || len(live) == 0: // a new object
			o := newObject()
			indexed.put(o)
			walked.put(o)
			live = append(live, o)
		case r < 8: // a state change in place, put again
			o := live[rng.Intn(len(live))]
			indexed.put(o)
			walked.put(o)
		default: // a removal
			i := rng.Intn(len(live))
			ref := refOf(live[i])
			indexed.remove(ref.Kind, ref.ID)
			walked.remove(ref.Kind, ref.ID)
			live = append(live[:i], live[i+1:]...)
		}
		for p := ID(0); p <= parents+1; p++ {
			got, want := lookups(indexed, p), lookups(walked, p)
			if got != want {
				t.Fatalf("step %d, parent %d:\nindexed %s\nwalked  %s", step, p, got, want)
			}
		}
		for _, o := range live {
			if s, ok := o.(*model.Session); ok && indexed.SessionByToken(s.Token) != walked.SessionByToken(s.Token) {
				t.Fatalf("step %d: session by token %s differs", step, s.Token)
			}
		}
	}
}

// lookups renders every lookup by parent p as ids.
func lookups(w *World, p ID) string {
	ids := func(n int, id func(int) ID) []ID {
		out := make([]ID, n)
		for i := range out {
			out[i] = id(i)
		}
		return out
	}
	inst := ID(0)
	if i := w.InstanceOf(p); i != nil {
		inst = i.ID
	}
	f, c, n := w.FragmentsOf(p), w.ConfigurationsOf(p), w.NamespacesOf(p)
	r, a, s := w.RegistrationsOf(p), w.ActivationsOf(p), w.StagesOf(p)
	return fmt.Sprint(inst,
		ids(len(f), func(i int) ID { return f[i].ID }), ids(len(c), func(i int) ID { return c[i].ID }),
		ids(len(n), func(i int) ID { return n[i].ID }), ids(len(r), func(i int) ID { return r[i].ID }),
		ids(len(a), func(i int) ID { return a[i].ID }), ids(len(s), func(i int) ID { return s[i].ID }))
}
