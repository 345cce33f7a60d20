package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/views"
)

// wholeWorldListing is what GET /dw/v1/<table> answered when every listing rendered the whole
// state (views.Build) and encoding/json wrote it: the reference the narrow listings must
// match byte for byte.
func (a *adminWorld) wholeWorldListing(table string, uid uint32) string {
	a.t.Helper()
	all := a.wholeWorldAll(uid)
	rows := map[string]any{"pools": all.Pools, "nodes": all.Nodes, "sessions": all.Sessions, "instances": all.Instances,
		"configurations": all.Configurations, "registrations": all.Registrations, "activations": all.Activations,
		"fragments": all.Fragments, "namespaces": all.Namespaces, "stages": all.Stages, "stage_history": all.StageHistory}[table]
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(map[string]any{table: rows}); err != nil {
		a.t.Fatal(err)
	}
	return b.String()
}

// wholeWorldAll is GET /dw/v1/all rendered from the whole state read afresh (view), as uid
// may see it.
func (a *adminWorld) wholeWorldAll(uid uint32) views.All {
	a.t.Helper()
	ctx := context.Background()
	world, err := a.c.view(ctx)
	if err != nil {
		a.t.Fatal(err)
	}
	history, err := a.c.StageHistory(ctx)
	if err != nil {
		a.t.Fatal(err)
	}
	all := views.Build(world)
	all.StageHistory = views.History(history)
	if uid != rootUID && a.c.cfg.Controller.PrivateData {
		all = all.VisibleTo(uid)
	}
	return all
}

// checkListings: every table, as an administrator, as the owner of some sessions, as another
// user and as one with nothing of their own, is what the whole world rendered gives.
func (a *adminWorld) checkListings(when string) {
	a.t.Helper()
	for _, table := range Tables {
		for _, uid := range []uint32{rootUID, userUID, userUID + 1, userUID + 2} {
			if got, want := a.must(uid, "GET", "/dw/v1/"+table, "", 200), a.wholeWorldListing(table, uid); got != want {
				a.t.Errorf("%s: GET /dw/v1/%s as uid %d:\n%s\nthe whole world's:\n%s", when, table, uid, got, want)
			}
		}
	}
	// GET /dw/v1/all, from the listings' cache (viewShared), is the whole state read afresh.
	for _, uid := range []uint32{rootUID, userUID, userUID + 1, userUID + 2} {
		var b bytes.Buffer
		if err := json.NewEncoder(&b).Encode(a.wholeWorldAll(uid)); err != nil {
			a.t.Fatal(err)
		}
		if got, want := a.must(uid, "GET", "/dw/v1/all", "", 200), b.String(); got != want {
			a.t.Errorf("%s: GET /dw/v1/all as uid %d:\n%s\nthe whole world's:\n%s", when, uid, got, want)
		}
	}
}

// rows decodes a listing's rows.
func rows(t *testing.T, body, table string) []map[string]any {
	t.Helper()
	var doc map[string][]map[string]any
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return doc[table]
}

// Each listing reads only the tables its rows are made of and decodes only what changed, yet
// answers exactly what rendering the whole state answered — for every table and caller, as
// objects appear, change and go.
func TestListingsAreTheWholeWorldsTables(t *testing.T) {
	a := newAdminWorld(t, nil)
	a.heartbeat("n1", "wlm_pool")
	a.heartbeat("n2", "wlm_pool")
	ctx := context.Background()
	persistent := lifecycle.Setup{Token: "proj", Creator: "CLI", Owner: rootUID, Group: rootUID, Persistent: true,
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}, Strategy: "bandwidth"}}
	if err := a.c.Setup(ctx, persistent, false); err != nil {
		t.Fatal(err)
	}
	a.checkListings("one persistent instance")
	a.setup("1", userUID, 2)
	a.setup("2", userUID, 1)
	a.setup("4", userUID+1, 1)
	job := lifecycle.Setup{Token: "3", Creator: "SLURM", Owner: userUID, Group: userUID, Uses: []string{"proj"},
		StageOut: []lifecycle.StageRequest{{Type: "file", PFSPath: `/pfs/it's <a&b> "3"`, DWVar: lifecycle.VarPersistentPre + "proj", DWPath: "/out"}}}
	if err := a.c.Setup(ctx, job, false); err != nil {
		t.Fatal(err)
	}
	a.checkListings("jobs set up")
	a.settle() // no agents: effects fail, fuses blow, errors are kept
	a.checkListings("effects failed")
	if err := a.c.Teardown(ctx, "2", true); err != nil {
		t.Fatal(err)
	}
	a.must(rootUID, "PATCH", "/dw/v1/nodes/n1", `{"offline":true}`, 200)
	a.must(rootUID, "PATCH", "/dw/v1/nodes/n2", `{"offline":true}`, 200)
	a.settle()
	a.checkListings("job 2 torn down")
	for _, token := range []string{"2"} {
		for _, s := range rows(t, a.must(rootUID, "GET", "/dw/v1/sessions", "", 200), "sessions") {
			if s["token"] == token {
				t.Errorf("session %s is listed after its teardown: %v", token, s)
			}
		}
	}
}

// Another controller sharing the state (high availability, or a restore) writes: the next
// listing shows what it wrote and no longer shows what it deleted, though this controller
// decoded the earlier records; the cache keeps only what the state holds.
func TestListingsReadWhatAnotherControllerWrote(t *testing.T) {
	a := newAdminWorld(t, nil)
	a.heartbeat("n1", "wlm_pool")
	other, err := New(a.c.cfg, a.c.store, func(n *model.Node) (agentapi.Agent, error) { return nil, errNoAgents }, a.c.log)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a.setup("1", userUID, 1)
	a.setup("2", userUID, 0)
	a.checkListings("two jobs")
	tokens := func() []any {
		var out []any
		for _, s := range rows(t, a.must(rootUID, "GET", "/dw/v1/sessions", "", 200), "sessions") {
			out = append(out, s["token"])
		}
		return out
	}
	if got := tokens(); len(got) != 2 {
		t.Fatalf("sessions %v, want 1 and 2", got)
	}
	// The other controller tears job 1 down, sets job 5 up and blows a fragment's fuse.
	if err := other.Teardown(ctx, "1", true); err != nil {
		t.Fatal(err)
	}
	a.must(rootUID, "PATCH", "/dw/v1/nodes/n1", `{"offline":true}`, 200)
	for i := 0; i < 20; i++ {
		other.RunOnce(ctx)
	}
	if err := other.Setup(ctx, lifecycle.Setup{Token: "5", Creator: "SLURM", Owner: userUID + 1, Group: userUID + 1}, false); err != nil {
		t.Fatal(err)
	}
	if err := other.store.Update(ctx, func(tx *store.Tx) error {
		s, err := store.SessionByToken(tx, "2")
		if err != nil {
			return err
		}
		s.Failure = "set by the other controller"
		return store.PutSession(tx, s)
	}); err != nil {
		t.Fatal(err)
	}
	a.checkListings("after the other controller's changes")
	got := rows(t, a.must(rootUID, "GET", "/dw/v1/sessions", "", 200), "sessions")
	if len(got) != 2 || got[0]["token"] != "2" || got[0]["failure"] != "set by the other controller" || got[1]["token"] != "5" {
		t.Errorf("sessions after the other controller tore 1 down, set 5 up and changed 2: %v", got)
	}
	var records int
	a.c.store.View(ctx, func(tx *store.Tx) error {
		for _, n := range []func(*store.Tx) (int, error){count(store.Sessions), count(store.Instances), count(store.Configurations),
			count(store.Fragments), count(store.Namespaces), count(store.Registrations), count(store.Activations), count(store.Stages)} {
			k, err := n(tx)
			if err != nil {
				t.Fatal(err)
			}
			records += k
		}
		return nil
	})
	if a.c.listed.Records() != records {
		t.Errorf("the listings' cache holds %d records, the state %d: it must hold what the state holds, no more", a.c.listed.Records(), records)
	}
}

func count[T any](table store.IDTable[T]) func(*store.Tx) (int, error) {
	return func(tx *store.Tx) (int, error) {
		all, err := table.List(tx)
		return len(all), err
	}
}

// An ordinary user who owns nothing, with no persistent instance about, is answered empty
// lists, never null (Slurm and dwstat read a list), while private_data hides the others'.
func TestListingsOfNothingAreEmptyLists(t *testing.T) {
	a := newAdminWorld(t, nil)
	a.heartbeat("n1", "wlm_pool")
	a.setup("1", userUID, 1)
	a.settle()
	for _, table := range []string{"sessions", "instances", "configurations", "fragments", "namespaces", "registrations", "activations", "stages", "stage_history"} {
		if got, want := a.must(userUID+2, "GET", "/dw/v1/"+table, "", 200), `{"`+table+`":[]}`+"\n"; got != want {
			t.Errorf("GET /dw/v1/%s as a user with nothing: %q, want %q", table, got, want)
		}
	}
	if got := rows(t, a.must(userUID, "GET", "/dw/v1/sessions", "", 200), "sessions"); len(got) != 1 {
		t.Errorf("the owner of job 1 sees sessions %v, want job 1's", got)
	}
}

// Listings at once share the cache: each answers the whole table.
func TestConcurrentListingsAnswerTheWholeTable(t *testing.T) {
	a := newAdminWorld(t, nil)
	a.heartbeat("n1", "wlm_pool")
	for _, token := range []string{"1", "2", "3"} {
		a.setup(token, userUID, 1)
	}
	want := map[string]string{}
	for _, table := range []string{"sessions", "instances", "configurations"} {
		want[table] = a.wholeWorldListing(table, rootUID)
	}
	errs := make(chan string, 24)
	for i := 0; i < 24; i++ {
		table := []string{"sessions", "instances", "configurations"}[i%3]
		go func() {
			if code, got := a.call(rootUID, "GET", "/dw/v1/"+table, ""); code != 200 || got != want[table] {
				errs <- table + ": " + got
				return
			}
			errs <- ""
		}()
	}
	for i := 0; i < 24; i++ {
		if e := <-errs; e != "" {
			t.Errorf("a listing among others: %s", e)
		}
	}
}
