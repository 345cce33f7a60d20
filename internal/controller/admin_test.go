package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/nodekey"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/sqlite"
	"github.com/spillway-hpc/spillway/internal/views"
)

// adminWorld is a real controller over a real state database, with no agents: every effect
// fails as an unreachable agent's would.
type adminWorld struct {
	t   testing.TB
	c   *Controller
	srv *Server
}

func newAdminWorld(t testing.TB, edit func(*config.Config)) *adminWorld {
	cfg := config.Defaults()
	cfg.Controller.StateDir = t.TempDir()
	cfg.Pools = []config.Pool{{Name: "wlm_pool", Granularity: config.Size(1 << 30)}}
	cfg.Executor.MaxAttempts = 2
	cfg.Executor.RetryBackoff = config.Duration(time.Millisecond)
	cfg.Executor.RetryBackoffMax = config.Duration(time.Millisecond)
	if edit != nil {
		edit(&cfg)
	}
	eng, err := sqlite.Open(filepath.Join(cfg.Controller.StateDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(cfg, store.New(eng), func(n *model.Node) (agentapi.Agent, error) { return nil, errNoAgents }, log)
	if err != nil {
		t.Fatal(err)
	}
	return &adminWorld{t: t, c: c, srv: NewServer(c, "", nil, log)}
}

const rootUID, userUID = 0, 1000

// call sends a request as uid on the Unix socket; it returns the status and the body.
func (a *adminWorld) call(uid uint32, method, path, body string) (int, string) {
	req := httptest.NewRequest(method, "http://spillway"+path, strings.NewReader(body))
	req = req.WithContext(httpapi.WithPeer(req.Context(), httpapi.Peer{UID: uid, GID: uid, Known: true}))
	rec := httptest.NewRecorder()
	a.srv.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func (a *adminWorld) must(uid uint32, method, path, body string, want int) string {
	a.t.Helper()
	code, out := a.call(uid, method, path, body)
	if code != want {
		a.t.Fatalf("%s %s %s: %d %s, want %d", method, path, body, code, out, want)
	}
	return out
}

func (a *adminWorld) heartbeat(name, pool string) {
	a.t.Helper()
	if _, err := a.c.Heartbeat(context.Background(), agentapi.NodeReport{Name: name, Pool: pool, Capacity: 4 << 30, Roles: []string{"storage", "client"}}); err != nil {
		a.t.Fatal(err)
	}
}

func (a *adminWorld) all() views.All {
	a.t.Helper()
	var all views.All
	if err := json.Unmarshal([]byte(a.must(rootUID, "GET", "/dw/v1/all", "", 200)), &all); err != nil {
		a.t.Fatal(err)
	}
	return all
}

func (a *adminWorld) node(name string) views.Node {
	for _, n := range a.all().Nodes {
		if n.ID == name {
			return n
		}
	}
	a.t.Fatalf("no node %s", name)
	return views.Node{}
}

func (a *adminWorld) setup(token string, owner uint32, stageOuts int) {
	a.t.Helper()
	req := lifecycle.Setup{Token: token, Creator: "SLURM", Owner: owner, Group: owner,
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}, Strategy: "bandwidth"}}
	for i := 0; i < stageOuts; i++ {
		req.StageOut = append(req.StageOut, lifecycle.StageRequest{Type: "file", PFSPath: "/pfs/" + token, DWVar: lifecycle.VarJobStriped, DWPath: "/r" + string(rune('a'+i))})
	}
	if err := a.c.Setup(context.Background(), req, false); err != nil {
		a.t.Fatal(err)
	}
}

// settle runs the executor until nothing changes.
func (a *adminWorld) settle() {
	for i := 0; i < 20; i++ {
		a.c.RunOnce(context.Background())
		time.Sleep(2 * time.Millisecond)
	}
}

// An ordinary user is refused every administrative change, with a message that says so, and
// may not tear down another user's session; the state is unchanged.
func TestAdminChangesNeedAnAdministrator(t *testing.T) {
	a := newAdminWorld(t, nil)
	a.heartbeat("ssd1", "wlm_pool")
	a.setup("77", 2000, 0)
	var actID int64 = 1
	for _, r := range []struct{ method, path, body string }{
		{"PATCH", "/dw/v1/nodes/ssd1", `{"drain":true}`},
		{"PATCH", "/dw/v1/nodes/ssd1", `{"offline":true}`},
		{"PATCH", "/dw/v1/nodes/ssd1", `{"pool":"wlm_pool"}`},
		{"DELETE", "/dw/v1/nodes/ssd1", ``},
		{"POST", "/dw/v1/pools", `{"id":"p2","granularity":1024}`},
		{"DELETE", "/dw/v1/pools/wlm_pool", ``},
		{"DELETE", "/dw/v1/activations/" + itoa(actID), ``},
		{"POST", "/dw/v1/fragments/1/replace_fuse", ``},
		{"PATCH", "/dw/v1/registrations/1", `{"wait":false}`},
		// DataWarp's manual walk-through (dwcli create session|instance|configuration|activation).
		{"POST", "/dw/v1/sessions", `{"token":"mine","owner":` + itoa(userUID) + `,"group":` + itoa(userUID) + `,"persistent":true,"manual":true}`},
		{"POST", "/dw/v1/sessions/77/instances", `{"capacity":1073741824,"pool":"wlm_pool"}`},
		{"POST", "/dw/v1/sessions/77/configurations", `{"instance":1,"access_mode":"stripe","root_permissions":511}`},
		{"POST", "/dw/v1/sessions/77/activations", `{"configuration":1,"mount":"x"}`},
	} {
		code, out := a.call(userUID, r.method, r.path, r.body)
		if code != http.StatusForbidden || !strings.Contains(out, "this operation is for administrators") {
			t.Errorf("uid %d %s %s: %d %s, want 403 for administrators", userUID, r.method, r.path, code, out)
		}
	}
	// Another user's job: answered as a token that does not exist (private_data).
	code, out := a.call(userUID, "POST", "/dw/v1/sessions/77/teardown", `{"hurry":true}`)
	if code != http.StatusNotFound || strings.Contains(out, "2000") {
		t.Errorf("another user's teardown: %d %s", code, out)
	}
	all := a.all()
	if n := a.node("ssd1"); n.Drain || len(all.Sessions) != 1 || len(all.Pools) != 1 {
		t.Errorf("an ordinary user changed the state: %+v", all)
	}
}

// Nodes: drain and fill, hold offline and online (whatever the heartbeats say), move between
// pools (refused while the node holds fragments, then kept against the agent's own pool),
// removal refused with the reason while it holds fragments or its agent is alive; pools:
// removal refused while nodes are in them or the configuration names them.
func TestAdminNodesAndPools(t *testing.T) {
	a := newAdminWorld(t, nil)
	a.heartbeat("ssd1", "wlm_pool")
	a.must(rootUID, "POST", "/dw/v1/pools", `{"id":"sm_pool","granularity":16777216}`, 201)
	a.setup("77", 1000, 0)

	a.must(rootUID, "PATCH", "/dw/v1/nodes/ssd1", `{"drain":true,"reason":"SSD errors"}`, 200)
	if n := a.node("ssd1"); !n.Drain || n.Reason != "SSD errors" || !n.Online {
		t.Errorf("drained: %+v", n)
	}
	a.must(rootUID, "PATCH", "/dw/v1/nodes/ssd1", `{"drain":false}`, 200)
	if n := a.node("ssd1"); n.Drain || n.Reason != "" {
		t.Errorf("filled: %+v", n)
	}
	out := a.must(rootUID, "PATCH", "/dw/v1/nodes/ssd1", `{"pool":"sm_pool"}`, 400)
	for _, want := range []string{"node ssd1 holds fragment", "session 1 (token 77)", "drain it"} {
		if !strings.Contains(out, want) {
			t.Errorf("move with fragments: %s lacks %q", out, want)
		}
	}
	out = a.must(rootUID, "DELETE", "/dw/v1/nodes/ssd1", ``, 400)
	if !strings.Contains(out, "removing it would lose their data") {
		t.Errorf("remove with fragments: %s", out)
	}
	a.must(rootUID, "PATCH", "/dw/v1/nodes/ssd1", `{}`, 400)
	a.must(rootUID, "PATCH", "/dw/v1/nodes/nosuch", `{"drain":true}`, 400)

	// Offline: the heartbeats no longer bring it online; a teardown completes without it.
	a.must(rootUID, "PATCH", "/dw/v1/nodes/ssd1", `{"offline":true,"reason":"maintenance"}`, 200)
	a.heartbeat("ssd1", "wlm_pool")
	if n := a.node("ssd1"); n.Online || !n.HeldOffline {
		t.Errorf("held offline, after a heartbeat: %+v", n)
	}
	if p := a.all().Pools[1]; p.ID != "wlm_pool" || p.Free != 0 {
		t.Errorf("an offline node's capacity counts as free: %+v", p)
	}
	a.must(rootUID, "POST", "/dw/v1/sessions/77/teardown", `{"hurry":true}`, 202)
	a.settle()
	if all := a.all(); len(all.Sessions)+len(all.Fragments) != 0 {
		t.Fatalf("teardown with the node offline left %+v", all)
	}
	a.must(rootUID, "PATCH", "/dw/v1/nodes/ssd1", `{"offline":false}`, 200)
	if n := a.node("ssd1"); !n.Online || n.Reason != "" {
		t.Errorf("back online: %+v", n)
	}

	// Move it; its agent's agent.pool no longer moves it back.
	a.must(rootUID, "PATCH", "/dw/v1/nodes/ssd1", `{"pool":"sm_pool"}`, 200)
	a.heartbeat("ssd1", "wlm_pool")
	if n := a.node("ssd1"); n.Pool != "sm_pool" {
		t.Errorf("after a heartbeat naming wlm_pool, the node is in %q", n.Pool)
	}
	out = a.must(rootUID, "DELETE", "/dw/v1/pools/sm_pool", ``, 400)
	if !strings.Contains(out, "pool sm_pool has node(s) ssd1") {
		t.Errorf("remove a pool with a node: %s", out)
	}
	out = a.must(rootUID, "DELETE", "/dw/v1/pools/wlm_pool", ``, 400)
	if !strings.Contains(out, "controller's configuration") {
		t.Errorf("remove a configured pool: %s", out)
	}

	// Its agent is alive: refused; once it has been silent for controller.node_timeout, gone.
	out = a.must(rootUID, "DELETE", "/dw/v1/nodes/ssd1", ``, 400)
	if !strings.Contains(out, "stop its agent first") {
		t.Errorf("remove a live node: %s", out)
	}
	a.c.now = func() time.Time { return time.Now().Add(time.Hour) }
	a.must(rootUID, "DELETE", "/dw/v1/nodes/ssd1", ``, 200)
	a.must(rootUID, "DELETE", "/dw/v1/pools/sm_pool", ``, 200)
	if all := a.all(); len(all.Nodes) != 0 || len(all.Pools) != 1 {
		t.Errorf("after removing: nodes %+v pools %+v", all.Nodes, all.Pools)
	}
}

// A fragment whose creation fails executor.max_attempts times blows its fuse and is left
// alone; replacing the fuse makes the executor try again. An unblown fuse, an unknown
// object and a kind without fuses are refused with the reason.
func TestReplaceFuse(t *testing.T) {
	a := newAdminWorld(t, nil)
	a.heartbeat("ssd1", "wlm_pool")
	a.setup("77", 1000, 0)
	a.settle()
	all := a.all()
	if len(all.Fragments) != 1 || !all.Fragments[0].State.FuseBlown {
		t.Fatalf("the fragment's fuse did not blow: %+v", all.Fragments)
	}
	id := itoa(all.Fragments[0].ID)
	a.must(rootUID, "POST", "/dw/v1/fragments/"+id+"/replace_fuse", ``, 202)
	var st model.State
	a.c.store.View(context.Background(), func(tx *store.Tx) error {
		f, err := store.Fragments.Get(tx, all.Fragments[0].ID)
		if err == nil {
			st = f.State
		}
		return err
	})
	if st.FuseBlown || st.Attempts != 0 || st.Actualized {
		t.Errorf("after replacing the fuse: %+v", st)
	}
	a.c.RunOnce(context.Background()) // tried again: fails once more
	a.c.store.View(context.Background(), func(tx *store.Tx) error {
		f, _ := store.Fragments.Get(tx, all.Fragments[0].ID)
		st = f.State
		return nil
	})
	if st.Attempts != 1 {
		t.Errorf("the executor did not try the fragment again: %+v", st)
	}
	a.c.RunOnce(context.Background())
	time.Sleep(5 * time.Millisecond)
	a.c.RunOnce(context.Background())
	for _, r := range []struct{ path, want string }{
		{"/dw/v1/fragments/999/replace_fuse", "fragment 999 does not exist"},
		{"/dw/v1/sessions/1/replace_fuse", "sessions have no fuse to replace"},
		{"/dw/v1/stages/1/replace_fuse", "a stage has no fuse"},
		{"/dw/v1/pools/1/replace_fuse", `with fuses; tables: fragments, namespaces, activations`},
	} {
		if _, out := a.call(rootUID, "POST", r.path, ""); !strings.Contains(out, r.want) {
			t.Errorf("%s: %s, want %q", r.path, out, r.want)
		}
	}
	a.must(rootUID, "PATCH", "/dw/v1/nodes/ssd1", `{"offline":true}`, 200)
	a.must(rootUID, "POST", "/dw/v1/sessions/77/teardown", `{"hurry":true}`, 202)
	a.settle()
	if out := a.must(rootUID, "POST", "/dw/v1/fragments/"+id+"/replace_fuse", ``, 400); !strings.Contains(out, "does not exist") {
		t.Errorf("%s", out)
	}
}

// Finished stages outlive their sessions in the stage history, the newest stage.history of
// them, each with its session's token and owner; an ordinary user sees only their own.
func TestStageHistoryIsBounded(t *testing.T) {
	a := newAdminWorld(t, func(c *config.Config) { c.Stage.History = 3 })
	a.heartbeat("ssd1", "wlm_pool")
	for i, token := range []string{"71", "72", "73"} {
		a.setup(token, uint32(1000+i), 2) // two deferred stage-outs each
		// Offline, the node's fragments go with the session without an agent.
		a.must(rootUID, "PATCH", "/dw/v1/nodes/ssd1", `{"offline":true}`, 200)
		a.must(rootUID, "POST", "/dw/v1/sessions/"+token+"/teardown", `{"hurry":true}`, 202)
		a.settle()
		a.must(rootUID, "PATCH", "/dw/v1/nodes/ssd1", `{"offline":false}`, 200)
	}
	all := a.all()
	if len(all.Sessions) != 0 || len(all.Stages) != 0 {
		t.Fatalf("live objects left: %+v %+v", all.Sessions, all.Stages)
	}
	if len(all.StageHistory) != 3 {
		t.Fatalf("stage history: %d stages, want 3 (stage.history): %+v", len(all.StageHistory), all.StageHistory)
	}
	for i, st := range all.StageHistory {
		want := []string{"72", "73", "73"}[i]
		if st.Token != want || st.Status != model.StageCanceled || st.Error != "canceled by teardown" || st.Finished == 0 {
			t.Errorf("history[%d] = %+v, want token %s, canceled by teardown", i, st, want)
		}
	}
	var mine struct {
		History []views.Stage `json:"stage_history"`
	}
	json.Unmarshal([]byte(a.must(1002, "GET", "/dw/v1/stage_history", "", 200)), &mine)
	if len(mine.History) != 2 || mine.History[0].Owner != 1002 {
		t.Errorf("uid 1002 sees %+v, want its own two stages", mine.History)
	}
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }

// Security issue 19, item 4: a host given only its own node key declares itself a storage
// node (agent.pool, capacity, data_listen) and is the emptiest node of the pool. The
// controller records the claim, shows it to the administrator with the command that admits
// it, and places no instance on it; once an administrator admits it, it takes instances.
func TestNodeKeyCannotMakeItselfAStorageNode(t *testing.T) {
	const secret = "cluster-secret"
	a := newAdminWorld(t, nil)
	srv := NewServer(a.c, secret, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	evil := func() {
		t.Helper()
		body, _ := json.Marshal(agentapi.NodeReport{Name: "cnevil", Pool: "wlm_pool", Capacity: 64 << 30,
			DataAddress: "10.0.0.66:7702", Address: "http://10.0.0.66:7701", Roles: []string{"storage", "client"}})
		req := httptest.NewRequest("POST", "http://spillway/dw/v1/nodes/cnevil/heartbeat", strings.NewReader(string(body)))
		req.Header.Set("Authorization", "Bearer "+nodekey.Derive(secret, "cnevil"))
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Fatalf("cnevil's heartbeat: %d %s", rec.Code, rec.Body)
		}
	}
	a.heartbeat("ssd1", "wlm_pool") // 4 GiB, an administrator's agent
	evil()
	evil()
	for _, token := range []string{"71", "72", "73"} {
		a.setup(token, 1000+uint32(len(token)), 0)
	}
	for _, f := range a.all().Fragments {
		if f.Node != "ssd1" {
			t.Errorf("fragment %d of instance %d placed on %s, which only claimed storage with its node key", f.ID, f.Instance, f.Node)
		}
	}
	n := a.node("cnevil")
	if n.Pool != "" || n.Capacity != 0 || !strings.Contains(n.StorageClaim, "pool wlm_pool") ||
		!strings.Contains(n.Reason, "not admitted for storage") || !strings.Contains(n.Reason, "dwcli update node --name cnevil --storage") {
		t.Errorf("the unadmitted node as the administrator sees it: %+v", n)
	}
	for _, p := range a.all().Pools {
		if p.ID == "wlm_pool" && p.Quantity > 4 {
			t.Errorf("the unadmitted node's capacity counts in its pool: %+v", p)
		}
	}

	// The administrator admits it; from its next heartbeat it is a storage node.
	a.must(rootUID, "PATCH", "/dw/v1/nodes/cnevil", `{"storage":true}`, 200)
	evil()
	if n := a.node("cnevil"); n.Pool != "wlm_pool" || n.Capacity != 64<<30 || n.StorageClaim != "" {
		t.Errorf("admitted: %+v", n)
	}
	a.setup("74", 1000, 0)
	on := map[string]bool{}
	for _, f := range a.all().Fragments {
		on[f.Node] = true
	}
	if !on["cnevil"] {
		t.Errorf("after the administrator admitted it, the emptiest node takes no instance: fragments on %v", on)
	}
}

// An ordinary user cannot tell another user's job from a token that does not exist, nor
// learn its owner, on any route that acts on a session; nor see another user's instance's
// accounting or how many records the site has pending. With private_data off, where every
// session is visible anyway, the answer names the owner.
func TestOtherUsersSessionsCannotBeEnumerated(t *testing.T) {
	a := newAdminWorld(t, nil)
	a.heartbeat("ssd1", "wlm_pool")
	a.setup("77", 2000, 0)
	a.settle()
	routes := []struct{ method, path, body string }{
		{"POST", "/dw/v1/sessions/%s/teardown", `{"hurry":true}`},
		{"GET", "/dw/v1/sessions/%s/paths", ``},
		{"POST", "/dw/v1/sessions/%s/job_stages", `{"stages":[{"direction":"in","type":"file","pfs_path":"/etc/hostname","dw_path":"/proc/self/x"}]}`},
		{"GET", "/dw/v1/sessions/%s/job_stages", ``},
		{"GET", "/dw/v1/sessions/%s/status?step=setup", ``},
		{"GET", "/dw/v1/sessions/%s/status?step=teardown", ``},
	}
	for _, r := range routes {
		known, knownOut := a.call(userUID, r.method, fmt.Sprintf(r.path, "77"), r.body)
		unknown, unknownOut := a.call(userUID, r.method, fmt.Sprintf(r.path, "78"), r.body)
		if known != unknown || strings.ReplaceAll(knownOut, "77", "78") != unknownOut || strings.Contains(knownOut, "2000") {
			t.Errorf("%s %s: another user's session answers %d %s; an unknown token %d %s", r.method, r.path, known, knownOut, unknown, unknownOut)
		}
	}
	code, out := a.call(userUID, "GET", "/dw/v1/instances/1/accounting", "")
	if code != http.StatusNotFound || strings.Contains(out, "2000") {
		t.Errorf("another user's instance's accounting: %d %s", code, out)
	}
	if code, out := a.call(userUID, "GET", "/dw/v1/accounting", ""); code != 200 || strings.Contains(out, "pending_records") {
		t.Errorf("an ordinary user's accounting list: %d %s, want no pending_records", code, out)
	}
	if code, out := a.call(0, "GET", "/dw/v1/accounting", ""); code != 200 || !strings.Contains(out, `"pending_records":0`) {
		t.Errorf("root's accounting list: %d %s, want pending_records", code, out)
	}

	open := newAdminWorld(t, func(c *config.Config) { c.Controller.PrivateData = false })
	open.heartbeat("ssd1", "wlm_pool")
	open.setup("77", 2000, 0)
	if code, out := open.call(userUID, "POST", "/dw/v1/sessions/77/teardown", `{"hurry":true}`); code != http.StatusForbidden || !strings.Contains(out, "belongs to uid 2000") {
		t.Errorf("another user's teardown with private_data off: %d %s", code, out)
	}
}

// GET /dw/v1/all?token= answers one session's objects (and its persistent instances'), not
// the state's: what `spillway run` and the home's cleanup ask about their own jobs.
func TestAllOfOneSession(t *testing.T) {
	a := newAdminWorld(t, nil)
	a.heartbeat("n1", "wlm_pool")
	a.setup("40", userUID, 1)
	a.setup("41", userUID, 0)
	a.setup("42", userUID+1, 0)
	whole := a.all()
	var one views.All
	if err := json.Unmarshal([]byte(a.must(userUID, "GET", "/dw/v1/all?token=41", "", 200)), &one); err != nil {
		t.Fatal(err)
	}
	if len(one.Sessions) != 1 || one.Sessions[0].Token != "41" {
		t.Fatalf("sessions %+v, want 41 alone", one.Sessions)
	}
	id := one.Sessions[0].ID
	want := 0
	for _, i := range whole.Instances {
		if i.Links.Session == id {
			want++
		}
	}
	if len(one.Instances) != want || want == 0 {
		t.Fatalf("%d instances, want the session's %d", len(one.Instances), want)
	}
	for _, i := range one.Instances {
		if i.Links.Session != id {
			t.Fatalf("instance %d of session %d in session %d's answer", i.ID, i.Links.Session, id)
		}
	}
	for _, st := range one.Stages {
		if st.Session != id {
			t.Fatalf("stage %d of session %d in session %d's answer", st.ID, st.Session, id)
		}
	}
	if len(one.Pools) != 0 || len(one.Nodes) != 0 {
		t.Fatalf("pools %v nodes %v: only the session's objects are read", one.Pools, one.Nodes)
	}
	// Another user's session is not theirs to see (private_data); an unknown token has none.
	for _, q := range []string{"42", "nosuch"} {
		var none views.All
		if err := json.Unmarshal([]byte(a.must(userUID, "GET", "/dw/v1/all?token="+q, "", 200)), &none); err != nil {
			t.Fatal(err)
		}
		if len(none.Sessions) != 0 || len(none.Instances) != 0 {
			t.Fatalf("token %s: %+v, want nothing", q, none)
		}
	}
}

// An ordinary user's setup decides on the session's world and counts the user's sessions
// among every session and instance, read through the listings' cache in the setup's own
// transaction: the quota holds as it did on the whole world.
func TestUserQuotaCountsEverySession(t *testing.T) {
	a := newAdminWorld(t, func(c *config.Config) { c.Controller.MaxSessionsPerUser = 2; c.Controller.MaxPersistentPerUser = 5 })
	a.heartbeat("n1", "wlm_pool")
	ctx := context.Background()
	setup := func(token string, owner uint32) error {
		return a.c.Setup(ctx, lifecycle.Setup{Token: token, Creator: "CLI", Owner: owner, Group: owner, Persistent: true,
			Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}, Strategy: "bandwidth"}}, true)
	}
	a.all() // the listings' cache holds the state before the setups: they read what changed
	for _, token := range []string{"pa", "pb"} {
		if err := setup(token, userUID); err != nil {
			t.Fatal(err)
		}
		a.all()
	}
	if err := setup("pc", userUID); err == nil || !strings.Contains(err.Error(), "max_sessions_per_user") {
		t.Fatalf("a third session of uid %d: %v, want its quota's refusal", userUID, err)
	}
	if err := setup("pa", userUID); err != nil {
		t.Fatalf("a setup sent again: %v", err)
	}
	if err := setup("qa", userUID+1); err != nil {
		t.Fatalf("another user's session: %v", err)
	}
	if err := setup("qb", userUID+1); err != nil {
		t.Fatalf("another user's second session: %v", err)
	}
	if err := setup("qc", userUID+1); err == nil || !strings.Contains(err.Error(), "max_sessions_per_user") {
		t.Fatalf("a third session of uid %d: %v, want its quota's refusal", userUID+1, err)
	}
	if n := len(a.all().Sessions); n != 4 {
		t.Fatalf("%d sessions, want 4", n)
	}
}
