package controller

import (
	"context"
	"reflect"
	"slices"
	"sort"
	"testing"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/store"
)

// TestSessionWorldIsTheSessionsSlice: the world a request about one session reads through the
// indexes holds exactly that session's objects and those of the persistent instances it uses
// (the same as in the whole world), nothing of other sessions; Status and Paths answer the
// same from it as from the whole world, for a job, a persistent instance, a session being
// torn down and an unknown token.
func TestSessionWorldIsTheSessionsSlice(t *testing.T) {
	a := newAdminWorld(t, nil)
	a.heartbeat("n1", "wlm_pool")
	a.heartbeat("n2", "wlm_pool")
	ctx := context.Background()
	persistent := lifecycle.Setup{Token: "proj", Creator: "CLI", Owner: rootUID, Group: rootUID, Persistent: true,
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}, Strategy: "bandwidth"}}
	if err := a.c.Setup(ctx, persistent, false); err != nil {
		t.Fatal(err)
	}
	a.setup("1", userUID, 2)
	a.setup("2", userUID, 1)
	job := lifecycle.Setup{Token: "3", Creator: "SLURM", Owner: userUID, Group: userUID, Uses: []string{"proj"},
		StageOut: []lifecycle.StageRequest{{Type: "file", PFSPath: "/pfs/3", DWVar: lifecycle.VarPersistentPre + "proj", DWPath: "/out"}}}
	if err := a.c.Setup(ctx, job, false); err != nil {
		t.Fatal(err)
	}
	if err := a.c.Teardown(ctx, "2", true); err != nil {
		t.Fatal(err)
	}
	a.c.RunOnce(ctx)

	whole, err := a.c.view(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"1", "2", "3", "proj", "unknown"} {
		var part *lifecycle.World // a decision's world
		if err := a.c.store.View(ctx, func(tx *store.Tx) error {
			var err error
			part, err = loadSessionWorld(tx, token, a.c.now(), a.c.cfg.Controller.NodeTimeout.D())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		read, err := a.c.viewSession(ctx, token) // an answer's world: the same sessions' objects
		if err != nil {
			t.Fatal(err)
		}
		if len(read.Sessions) != len(part.Sessions) || len(read.Fragments) != len(part.Fragments) || len(read.Stages) != len(part.Stages) ||
			len(read.Registrations) != len(part.Registrations) || len(read.Namespaces) != len(part.Namespaces) {
			t.Errorf("the answers' world of %s holds other objects than the decisions': %+v, %+v", token, read, part)
		}
		want := lifecycle.NewWorld()
		want.Pools, want.Nodes = whole.Pools, whole.Nodes
		tokens := []string{token}
		if s := whole.SessionByToken(token); s != nil {
			tokens = append(tokens, s.Uses...)
		}
		for _, tk := range tokens {
			s := whole.SessionByToken(tk)
			if s == nil {
				continue
			}
			want.Sessions[s.ID] = s
			for _, o := range whole.Registrations {
				if o.SessionID == s.ID {
					want.Registrations[o.ID] = o
				}
			}
			for _, o := range whole.Activations {
				if o.SessionID == s.ID {
					want.Activations[o.ID] = o
				}
			}
			for _, o := range whole.Stages {
				if o.SessionID == s.ID {
					want.Stages[o.ID] = o
				}
			}
			for _, inst := range whole.Instances {
				if inst.SessionID != s.ID {
					continue
				}
				want.Instances[inst.ID] = inst
				for _, f := range whole.Fragments {
					if f.InstanceID == inst.ID {
						want.Fragments[f.ID] = f
					}
				}
				for _, c := range whole.Configurations {
					if c.InstanceID != inst.ID {
						continue
					}
					want.Configurations[c.ID] = c
					for _, ns := range whole.Namespaces {
						if ns.ConfigurationID == c.ID {
							want.Namespaces[ns.ID] = ns
						}
					}
				}
			}
		}
		want.Elsewhere = lifecycle.Elsewhere{Sessions: len(whole.Sessions) - len(want.Sessions), Nodes: map[string]lifecycle.NodeShare{}}
		for _, f := range whole.Fragments {
			if want.Fragments[f.ID] == nil {
				share := want.Elsewhere.Nodes[f.Node]
				share.Grains += f.Grains
				share.Fragments++
				want.Elsewhere.Nodes[f.Node] = share
			}
		}
		if !reflect.DeepEqual(part, want) {
			t.Errorf("session world of %s:\n%+v\nwant the session's slice of the whole world:\n%+v", token, part, want)
		}
		for node := range whole.Nodes {
			if got, want := part.UsageOfNode(node), whole.UsageOfNode(node); got.Used != want.Used || got.Instances != want.Instances {
				t.Errorf("usage of node %s in the session world of %s: %+v, want %+v (the allocator's inputs)", node, token, got, want)
			}
		}
		if part.SessionCount() != len(whole.Sessions) {
			t.Errorf("session count in the session world of %s: %d, want %d", token, part.SessionCount(), len(whole.Sessions))
		}
		if len(part.Fragments) == 0 && token != "unknown" && token != "3" {
			t.Errorf("session world of %s has no fragments: the slice is empty, the test proves nothing", token)
		}
		for _, step := range []string{lifecycle.PhaseSetup, lifecycle.PhaseDataIn, lifecycle.PhasePreRun, lifecycle.PhasePostRun, lifecycle.PhaseDataOut, lifecycle.PhaseTeardown} {
			if got, want := lifecycle.Status(read, token, step), lifecycle.Status(whole, token, step); !reflect.DeepEqual(got, want) {
				t.Errorf("status of %s at %s: %+v from the session world, %+v from the whole world", token, step, got, want)
			}
		}
		gotPaths, gotErr := lifecycle.Paths(read, token, "/mnt")
		wantPaths, wantErr := lifecycle.Paths(whole, token, "/mnt")
		if !reflect.DeepEqual(gotPaths, wantPaths) || (gotErr == nil) != (wantErr == nil) {
			t.Errorf("paths of %s: %v %v from the session world, %v %v from the whole world", token, gotPaths, gotErr, wantPaths, wantErr)
		}
	}
	// A heartbeat's answer from the node's objects is the one from the whole world, read by
	// index or picked from the listings' cache (nodeWorld, on SQLite), twice: the second
	// listing starts from the first.
	for _, how := range []string{"index", "listings", "listings again"} {
		for _, node := range []string{"n1", "n2", "nowhere"} {
			var part *lifecycle.World
			if err := a.c.store.View(ctx, func(tx *store.Tx) error {
				var err error
				if how == "index" {
					part, err = loadNodeWorld(tx, node, a.c.now(), a.c.cfg.Controller.NodeTimeout.D())
					return err
				}
				if !tx.Versioned() {
					t.Fatal("a read transaction of SQLite with no commit under way does not know its version")
				}
				part, err = a.c.nodeWorld(tx, node)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			checkLiveOn(t, how, node, part, whole)
		}
	}
	if p, _ := a.c.Paths(ctx, "3"); p[lifecycle.VarPersistentPre+"proj"] == "" {
		t.Errorf("paths of job 3 = %v, want its persistent instance proj's variable", p)
	}
}

// checkLiveOn compares what lives on node according to a partial world with the whole's.
func checkLiveOn(t *testing.T, how, node string, part, whole *lifecycle.World) {
	t.Helper()
	got, want := liveOn(part, node), liveOn(whole, node)
	sort.Slice(got.Namespaces, func(i, j int) bool { return got.Namespaces[i].ID < got.Namespaces[j].ID })
	sort.Slice(want.Namespaces, func(i, j int) bool { return want.Namespaces[i].ID < want.Namespaces[j].ID })
	slices.Sort(got.Fragments)
	slices.Sort(want.Fragments)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("what lives on %s from its objects (%s): %+v, from the whole world: %+v", node, how, got, want)
	}
	if node != "nowhere" && len(want.Fragments) == 0 {
		t.Errorf("no fragment on %s: the comparison proves nothing", node)
	}
}
