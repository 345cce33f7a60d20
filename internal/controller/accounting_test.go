package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agent"
	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/sqlite"
	"github.com/spillway-hpc/spillway/internal/views"
)

// acctRig is a real controller on a real state database with a real storage agent
// (in-process, fragments in a temporary directory) on node ssd1.
type acctRig struct {
	t     *testing.T
	cfg   config.Config
	c     *Controller
	st    *store.Store
	agent *agent.Agent
}

func newAcctRig(t *testing.T) *acctRig {
	t.Helper()
	cfg := config.Defaults()
	cfg.Controller.StateDir = t.TempDir()
	cfg.Pools = []config.Pool{{Name: "wlm_pool", Granularity: config.Size(1 << 20)}}
	eng, err := sqlite.Open(filepath.Join(cfg.Controller.StateDir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(eng)
	t.Cleanup(func() { st.Close() })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(cfg, st, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	ag, err := agent.New(agent.Options{Name: "ssd1", Pool: "wlm_pool", SSDPath: t.TempDir(), Capacity: 1 << 30, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	c.AddLocalAgent("ssd1", ag)
	r := &acctRig{t: t, cfg: cfg, c: c, st: st, agent: ag}
	r.heartbeat(nil)
	return r
}

// heartbeat sends the agent's own report, with usage as its data path's counters when given.
func (r *acctRig) heartbeat(usage []agentapi.FragmentUsage) {
	r.t.Helper()
	rep, err := r.agent.Report(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	if usage != nil {
		rep.Usage = agentapi.NodeUsage{Fragments: usage}
	}
	if _, err := r.c.Heartbeat(context.Background(), rep); err != nil {
		r.t.Fatal(err)
	}
}

// settle runs the executor until the session's step is done.
func (r *acctRig) settle(token, step string) {
	r.t.Helper()
	for range 200 {
		r.c.RunOnce(context.Background())
		st, err := r.c.Status(context.Background(), token, step)
		if err != nil {
			r.t.Fatal(err)
		}
		if st.Failed {
			r.t.Fatalf("%s of %s failed: %+v", step, token, st)
		}
		if st.Done {
			return
		}
	}
	r.t.Fatalf("%s of %s never finished", step, token)
}

func (r *acctRig) node() *model.Node {
	r.t.Helper()
	var n *model.Node
	err := r.st.View(context.Background(), func(tx *store.Tx) error {
		var err error
		n, err = store.Nodes.Get(tx, "ssd1")
		return err
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

func (r *acctRig) usageRows() []*model.FragmentUsage {
	var rows []*model.FragmentUsage
	r.st.View(context.Background(), func(tx *store.Tx) error {
		var err error
		rows, err = store.Usage.List(tx)
		return err
	})
	return rows
}

func (r *acctRig) logLines() []views.Accounting {
	r.t.Helper()
	b, err := os.ReadFile(r.cfg.Controller.AccountingLogPath())
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		r.t.Fatal(err)
	}
	var out []views.Accounting
	for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if line == "" {
			continue
		}
		var a views.Accounting
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			r.t.Fatalf("accounting log line %q: %v", line, err)
		}
		out = append(out, a)
	}
	return out
}

// get asks the API as uid.
func (r *acctRig) get(path string, uid uint32) (int, []byte) {
	srv := NewServer(r.c, "", nil, r.c.log)
	req := httptest.NewRequest("GET", "http://spillway"+path, nil)
	req = req.WithContext(httpapi.WithPeer(req.Context(), httpapi.Peer{UID: uid, GID: uid, Known: true}))
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// TestAccountingFromHeartbeats: the data path's counters in heartbeats are kept per fragment
// (only newer ones), summed per instance, storage node and compute node in the API, grow the
// node's endurance figure, and become one line of the accounting log at teardown, written once.
func TestAccountingFromHeartbeats(t *testing.T) {
	r := newAcctRig(t)
	ctx := context.Background()
	setup := lifecycle.Setup{Token: "42", Creator: "TEST", Owner: 1000, Group: 1000,
		Instance: &lifecycle.InstanceRequest{Capacity: 8 << 20, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}
	if err := r.c.Setup(ctx, setup, false); err != nil {
		t.Fatal(err)
	}
	r.settle("42", lifecycle.PhaseSetup)
	w, _ := r.c.World(ctx)
	sess := w.SessionByToken("42")
	inst := w.InstanceOf(sess.ID)
	frags := w.FragmentsOf(inst.ID)
	if len(frags) != 1 {
		t.Fatalf("fragments: %d, want 1", len(frags))
	}
	frag := frags[0]
	var nsID int64
	for _, c := range w.ConfigurationsOf(inst.ID) {
		for _, ns := range w.NamespacesOf(c.ID) {
			nsID = ns.ID
		}
	}
	counters := func(written, read uint64) agentapi.FragmentUsage {
		return agentapi.FragmentUsage{Fragment: frag.ID, Instance: inst.ID, BytesWritten: written, BytesRead: read,
			WriteOps: written / 4096, ReadOps: read / 4096, FilesCreated: 3, CapacityUsed: written, CapacityMax: written,
			WriteLimit: 80 << 20, WindowLength: 100, WindowWritten: written, MaxWindowWrite: written,
			Namespaces: []agentapi.NamespaceUsage{{Namespace: nsID, BytesWritten: written, BytesRead: read, FilesCreated: 3, MaxOffsetWritten: written}},
			Clients: []agentapi.ClientUsage{
				{Node: "cn1", BytesWritten: written / 2, BytesRead: read, FilesCreated: 2},
				{Node: "cn2", BytesWritten: written - written/2, FilesCreated: 1}}}
	}
	r.heartbeat([]agentapi.FragmentUsage{counters(1<<20, 0)})
	r.heartbeat([]agentapi.FragmentUsage{counters(5<<20, 1<<20), {Fragment: 999999, BytesWritten: 1 << 40}}) // an unknown fragment is ignored
	r.heartbeat([]agentapi.FragmentUsage{counters(2<<20, 0)})                                                // older than the kept one: ignored
	if n := r.node(); n.Written != 5<<20 {
		t.Errorf("node bytes_written %d, want %d (the data path's growth)", n.Written, 5<<20)
	}
	rows := r.usageRows()
	if len(rows) != 1 || rows[0].Counters.BytesWritten != 5<<20 || rows[0].Final {
		t.Fatalf("usage rows: %+v", rows)
	}
	updated := rows[0].Updated
	r.heartbeat([]agentapi.FragmentUsage{counters(5<<20, 1<<20)}) // unchanged: not rewritten
	if rows := r.usageRows(); !rows[0].Updated.Equal(updated) {
		t.Errorf("an unchanged report rewrote the row (updated %v, was %v)", rows[0].Updated, updated)
	}

	// The API: the session's and the instance's record, the same; another user may not see it.
	code, body := r.get("/dw/v1/sessions/42/accounting", 1000)
	if code != 200 {
		t.Fatalf("GET session accounting: %d %s", code, body)
	}
	var live views.Accounting
	json.Unmarshal(body, &live)
	checkRealm(t, "live", live.Realm, inst.ID, nsID, 5<<20, 1<<20)
	if code, body2 := r.get("/dw/v1/instances/"+jsonInt(inst.ID)+"/accounting", 0); code != 200 || !bytes.Equal(body, body2) {
		t.Errorf("instance accounting %d %s, want the session's %s", code, body2, body)
	}
	// Another user's job's accounting: answered as for an unknown token (private_data).
	mine, mineBody := r.get("/dw/v1/sessions/42/accounting", 1001)
	none, noneBody := r.get("/dw/v1/sessions/4242/accounting", 1001)
	if mine != 404 || mine != none || !bytes.Equal(mineBody, noneBody) {
		t.Errorf("another user's GET: %d %s; an unknown token's: %d %s", mine, mineBody, none, noneBody)
	}
	if code, body := r.get("/dw/v1/instances/x/accounting", 0); code != 400 || !strings.Contains(string(body), "instance id") {
		t.Errorf("a bad id: %d %s, want 400 naming the instance id", code, body)
	}
	code, body = r.get("/dw/v1/accounting", 0)
	var list controllerapi.AccountingList
	if json.Unmarshal(body, &list); code != 200 || len(list.Accounting) != 1 {
		t.Errorf("GET /accounting: %d %s", code, body)
	}

	// Teardown: the executor asks the agent for its counters before deleting the fragment
	// and the log gets one record with them. An agent whose data path reports no counters
	// (before branch limits) leaves the heartbeats' figures; one that does has the last word
	// (here the real data path counted nothing: the heartbeats above were made up).
	want := counters(5<<20, 1<<20)
	if rep, _ := r.agent.Report(ctx); len(rep.Usage.Fragments) > 0 {
		for _, fu := range rep.Usage.Fragments {
			if fu.Fragment == frag.ID {
				want = fu // a data path that counts: its final figures are the record's
			}
		}
	}
	if err := r.c.Teardown(ctx, "42", false); err != nil {
		t.Fatal(err)
	}
	r.settle("42", lifecycle.PhaseTeardown)
	r.c.RunOnce(ctx)
	lines := r.logLines()
	if len(lines) != 1 {
		t.Fatalf("accounting log: %d records, want 1", len(lines))
	}
	rec := lines[0].Realm
	if !rec.Final || rec.Ended == 0 || rec.RecordID == "" || rec.Token != "42" || rec.Owner != 1000 {
		t.Errorf("record: final %v ended %d id %q token %q owner %d", rec.Final, rec.Ended, rec.RecordID, rec.Token, rec.Owner)
	}
	if rec.BytesWritten != want.BytesWritten || rec.BytesRead != want.BytesRead {
		t.Errorf("record bytes written/read %d/%d, want %d/%d", rec.BytesWritten, rec.BytesRead, want.BytesWritten, want.BytesRead)
	}
	if len(rec.Namespaces) != 1 || rec.Namespaces[0].NamespaceID != nsID || rec.Namespaces[0].Configuration == 0 {
		t.Errorf("record namespaces: %+v (the deleted namespace's metadata is kept)", rec.Namespaces)
	}
	if rows := r.usageRows(); len(rows) != 0 {
		t.Errorf("usage rows left after the record: %+v", rows)
	}
	r.c.RunOnce(ctx)
	if lines := r.logLines(); len(lines) != 1 {
		t.Errorf("the record was written %d times", len(lines))
	}
}

func jsonInt(id int64) string { b, _ := json.Marshal(id); return string(b) }

func checkRealm(t *testing.T, what string, r views.Realm, inst, ns int64, written, read uint64) {
	t.Helper()
	if r.RealmID != inst || r.ServerCount != 1 || r.NamespaceCount != 1 || r.Token != "42" {
		t.Errorf("%s: realm %d servers %d namespaces %d token %q", what, r.RealmID, r.ServerCount, r.NamespaceCount, r.Token)
	}
	if r.BytesWritten != written || r.BytesRead != read || r.FilesCreated != 3 || r.CapacityUsed != written {
		t.Errorf("%s: totals written %d read %d files %d used %d", what, r.BytesWritten, r.BytesRead, r.FilesCreated, r.CapacityUsed)
	}
	f := r.Fragments[0]
	if f.ServerHostname != "ssd1" || f.BytesWritten != written || f.WriteLimit != 80<<20 || f.WriteHighWater != written || f.WriteMovingAvg != written/100 || f.MaxWindowWrite != written {
		t.Errorf("%s: fragment %+v", what, f)
	}
	n := r.Namespaces[0]
	if n.NamespaceID != ns || n.BytesWritten != written || n.StripeWidth != 1 || n.StripeSize == 0 || n.MaxOffsetWritten != written {
		t.Errorf("%s: namespace %+v", what, n)
	}
	if len(r.Clients) != 2 || r.Clients[0].Node != "cn1" || r.Clients[0].BytesWritten+r.Clients[1].BytesWritten != written {
		t.Errorf("%s: clients %+v", what, r.Clients)
	}
}

// TestAccountingRecordWrittenOnce: a controller killed while appending a record finds, on
// restart, the record pending with the offset it was writing at. A whole line there with
// the record's id was written: it is not written again. A torn line is replaced.
func TestAccountingRecordWrittenOnce(t *testing.T) {
	r := newAcctRig(t)
	ctx := context.Background()
	path := r.cfg.Controller.AccountingLogPath()
	os.WriteFile(path, []byte(`{"realm":{"realm_id":1,"record_id":"c-1"}}`+"\n"), 0o640)
	st, _ := os.Stat(path)
	line := []byte(`{"realm":{"realm_id":2,"record_id":"c-2"}}`)
	pend := func(torn bool) {
		f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		fi, _ := f.Stat()
		rec := &store.AccountingRecord{Instance: 2, ID: "c-2", Line: line, Appending: true, Offset: fi.Size(), Inode: inodeOf(fi)}
		if torn {
			f.Write(line[:10])
		} else {
			f.Write(append(line, '\n'))
		}
		f.Close()
		r.st.Update(ctx, func(tx *store.Tx) error { return store.AccountingRecords.Put(tx, rec) })
	}
	pend(false) // the crash came after the write, before the record left the state
	r.c.RunOnce(ctx)
	if lines := r.logLines(); len(lines) != 2 || lines[1].Realm.RecordID != "c-2" {
		t.Fatalf("after a crash past the write: %+v", lines)
	}
	os.Truncate(path, st.Size())
	pend(true) // the crash came in the middle of the write
	r.c.RunOnce(ctx)
	if lines := r.logLines(); len(lines) != 2 || lines[1].Realm.RecordID != "c-2" {
		b, _ := os.ReadFile(path)
		t.Fatalf("after a torn write: %q", b)
	}
	var left []*store.AccountingRecord
	r.st.View(ctx, func(tx *store.Tx) error { left, _ = store.AccountingRecords.List(tx); return nil })
	if len(left) != 0 {
		t.Errorf("pending records left: %+v", left)
	}
}

// TestAccountingNotFound: an instance that does not exist (torn down: its record is in the
// log) is a 404 naming the log; a session without an instance of its own says so.
func TestAccountingNotFound(t *testing.T) {
	r := newAcctRig(t)
	if code, body := r.get("/dw/v1/instances/77/accounting", 0); code != 404 || !strings.Contains(string(body), "accounting_log") {
		t.Errorf("GET a gone instance: %d %s", code, body)
	}
	if code, _ := r.get("/dw/v1/sessions/nope/accounting", 0); code != http.StatusNotFound {
		t.Errorf("GET an unknown session: %d", code)
	}
}

func inodeOf(fi os.FileInfo) uint64 { return fi.Sys().(*syscall.Stat_t).Ino }

// TestAccountingAgentStartedAgain: an agent that lost its counters (Restored) starts again
// from zero: the fragment's counters are its new ones, and the node's endurance figure grows
// by what it counted since, not by the drop.
func TestAccountingAgentStartedAgain(t *testing.T) {
	r := newAcctRig(t)
	ctx := context.Background()
	setup := lifecycle.Setup{Token: "43", Creator: "TEST", Instance: &lifecycle.InstanceRequest{Capacity: 1 << 20, Pool: "wlm_pool", Type: "scratch"}}
	if err := r.c.Setup(ctx, setup, false); err != nil {
		t.Fatal(err)
	}
	r.settle("43", lifecycle.PhaseSetup)
	w, _ := r.c.World(ctx)
	frag := w.FragmentsOf(w.InstanceOf(w.SessionByToken("43").ID).ID)[0]
	r.heartbeat([]agentapi.FragmentUsage{{Fragment: frag.ID, BytesWritten: 3000, BytesRead: 10}})
	r.heartbeat([]agentapi.FragmentUsage{{Fragment: frag.ID, BytesWritten: 500, Restored: true}})
	if n := r.node(); n.Written != 3500 {
		t.Errorf("node bytes_written %d, want 3500 (3000, then 500 after the restart)", n.Written)
	}
	if rows := r.usageRows(); len(rows) != 1 || rows[0].Counters.BytesWritten != 500 || !rows[0].Counters.Restored {
		t.Errorf("usage rows: %+v", rows)
	}
	r.heartbeat([]agentapi.FragmentUsage{{Fragment: frag.ID, BytesWritten: 700, Restored: true}})
	if n := r.node(); n.Written != 3700 {
		t.Errorf("node bytes_written %d, want 3700", n.Written)
	}
}

// TestAccountingLogUnwritable: while controller.accounting_log cannot be written the record
// waits in the state (GET /accounting counts it in pending_records) and the teardown is not
// held up; once the log can be written the next pass writes it, once.
func TestAccountingLogUnwritable(t *testing.T) {
	r := newAcctRig(t)
	ctx := context.Background()
	blocker := filepath.Join(t.TempDir(), "logs")
	os.WriteFile(blocker, nil, 0o644) // a file where the log's directory should be
	r.c.cfg.Controller.AccountingLog = filepath.Join(blocker, "accounting.log")
	r.cfg = r.c.cfg
	setup := lifecycle.Setup{Token: "44", Creator: "TEST", Instance: &lifecycle.InstanceRequest{Capacity: 1 << 20, Pool: "wlm_pool", Type: "scratch"}}
	if err := r.c.Setup(ctx, setup, false); err != nil {
		t.Fatal(err)
	}
	r.settle("44", lifecycle.PhaseSetup)
	if err := r.c.Teardown(ctx, "44", false); err != nil {
		t.Fatal(err)
	}
	r.settle("44", lifecycle.PhaseTeardown)
	r.c.RunOnce(ctx)
	pending := func() int {
		code, body := r.get("/dw/v1/accounting", 0)
		var list controllerapi.AccountingList
		if err := json.Unmarshal(body, &list); code != 200 || err != nil {
			t.Fatalf("GET /accounting: %d %s", code, body)
		}
		if list.PendingRecords == nil {
			t.Fatalf("GET /accounting as root shows no pending_records: %s", body)
		}
		return *list.PendingRecords
	}
	if n := pending(); n != 1 {
		t.Fatalf("pending records while the log cannot be written: %d, want 1", n)
	}
	os.Remove(blocker)
	r.c.RunOnce(ctx)
	r.c.RunOnce(ctx)
	if n := pending(); n != 0 {
		t.Errorf("pending records once the log can be written: %d", n)
	}
	if lines := r.logLines(); len(lines) != 1 || lines[0].Realm.Token != "44" {
		t.Errorf("log: %+v, want the record of 44 once", lines)
	}
}

// TestAccountingBatch: a heartbeat writes at most controller.accounting_batch fragments'
// counters, the stalest first; the others come with the next heartbeat, and the node's
// bytes_written counts each byte once.
func TestAccountingBatch(t *testing.T) {
	r := newAcctRig(t)
	r.c.cfg.Controller.AccountingBatch = 2
	ctx := context.Background()
	var frags []int64
	for _, token := range []string{"51", "52", "53"} {
		setup := lifecycle.Setup{Token: token, Creator: "TEST", Instance: &lifecycle.InstanceRequest{Capacity: 1 << 20, Pool: "wlm_pool", Type: "scratch"}}
		if err := r.c.Setup(ctx, setup, false); err != nil {
			t.Fatal(err)
		}
		r.settle(token, lifecycle.PhaseSetup)
		w, _ := r.c.World(ctx)
		frags = append(frags, w.FragmentsOf(w.InstanceOf(w.SessionByToken(token).ID).ID)[0].ID)
	}
	report := func(written uint64) []agentapi.FragmentUsage {
		var out []agentapi.FragmentUsage
		for _, f := range frags {
			out = append(out, agentapi.FragmentUsage{Fragment: f, BytesWritten: written})
		}
		return out
	}
	counted := func() (n int) {
		for _, row := range r.usageRows() {
			if row.Counters.BytesWritten == 100 {
				n++
			}
		}
		return n
	}
	r.heartbeat(report(100))
	if n, w := counted(), r.node().Written; n != 2 || w != 200 {
		t.Fatalf("after one heartbeat: %d fragments' counters kept, node bytes_written %d; want 2 and 200", n, w)
	}
	r.heartbeat(report(100))
	if n, w := counted(), r.node().Written; n != 3 || w != 300 {
		t.Fatalf("after two heartbeats: %d fragments' counters kept, node bytes_written %d; want 3 and 300", n, w)
	}
}

// liveAgent is the rig's agent whose data path has counted more than its last heartbeat
// said: FragmentUsage answers usage (after delay).
type liveAgent struct {
	agentapi.Agent
	usage agentapi.FragmentUsage
	delay time.Duration
	calls int
	mu    sync.Mutex
}

func (a *liveAgent) FragmentUsage(ctx context.Context, id int64) (agentapi.FragmentUsage, bool, error) {
	a.mu.Lock()
	a.calls++
	a.mu.Unlock()
	select {
	case <-time.After(a.delay):
	case <-ctx.Done():
		return agentapi.FragmentUsage{}, false, ctx.Err()
	}
	u := a.usage
	u.Fragment = id
	return u, true, nil
}

// TestAccountingCurrentInsideTheJob: a job that wrote N bytes and reads its accounting at
// once (before any heartbeat) reads N written; a write window that tripped reads ro at once
// (issue 23 item 9). A node that does not answer within controller.accounting_refresh_timeout
// leaves its last heartbeat's figures, and the answer names it.
func TestAccountingCurrentInsideTheJob(t *testing.T) {
	r := newAcctRig(t)
	ctx := context.Background()
	setup := lifecycle.Setup{Token: "42", Creator: "TEST", Owner: 1000, Group: 1000,
		Instance: &lifecycle.InstanceRequest{Capacity: 8 << 20, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}
	if err := r.c.Setup(ctx, setup, false); err != nil {
		t.Fatal(err)
	}
	r.settle("42", lifecycle.PhaseSetup)
	r.heartbeat(nil)
	const n = 3<<20 + 17
	live := &liveAgent{Agent: r.agent, usage: agentapi.FragmentUsage{BytesWritten: n, WriteOps: 4, FilesCreated: 1,
		WriteLimit: 2 << 20, WindowWritten: n, ReadOnly: true, ReadOnlyReason: "write window"}}
	r.c.AddLocalAgent("ssd1", live)

	code, body := r.get("/dw/v1/sessions/42/accounting", 1000)
	if code != 200 {
		t.Fatalf("GET session accounting: %d %s", code, body)
	}
	var a views.Accounting
	json.Unmarshal(body, &a)
	if a.Realm.BytesWritten != n || len(a.Realm.Fragments) != 1 || !a.Realm.Fragments[0].ReadOnly || a.Realm.Fragments[0].BytesWritten != n {
		t.Errorf("inside the job: written %d (want %d), fragments %+v: the figures are the last heartbeat's, not the data path's now", a.Realm.BytesWritten, n, a.Realm.Fragments)
	}
	if !a.Realm.Current || len(a.Realm.StaleNodes) != 0 {
		t.Errorf("current %v stale %v, want current", a.Realm.Current, a.Realm.StaleNodes)
	}
	if n := r.node(); n.Written != 3<<20+17 {
		t.Errorf("node bytes_written %d: the query's counters count for the node's endurance as a heartbeat's", n.Written)
	}
	// dwstat accounting (GET /accounting) is current too.
	code, body = r.get("/dw/v1/accounting", 0)
	var list controllerapi.AccountingList
	if json.Unmarshal(body, &list); code != 200 || len(list.Accounting) != 1 || !list.Accounting[0].Realm.Fragments[0].ReadOnly || !list.Accounting[0].Realm.Current {
		t.Errorf("GET /accounting: %d %s", code, body)
	}

	// A node that does not answer in time: the last figures, named stale, within the timeout.
	r.c.cfg.Controller.AccountingRefreshTimeout = config.Duration(200 * time.Millisecond)
	slow := &liveAgent{Agent: r.agent, usage: agentapi.FragmentUsage{BytesWritten: 2 * n}, delay: time.Minute}
	r.c.AddLocalAgent("ssd1", slow)
	start := time.Now()
	code, body = r.get("/dw/v1/sessions/42/accounting", 1000)
	a = views.Accounting{}
	json.Unmarshal(body, &a)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a silent node held the query %v", took)
	}
	if code != 200 || a.Realm.BytesWritten != n || a.Realm.Current || len(a.Realm.StaleNodes) != 1 || a.Realm.StaleNodes[0] != "ssd1" {
		t.Errorf("silent node: %d written %d current %v stale %v, want the last figures (%d) and ssd1 named stale", code, a.Realm.BytesWritten, a.Realm.Current, a.Realm.StaleNodes, n)
	}

	// accounting_refresh_limit = 0: the heartbeats' figures only, the node not asked.
	r.c.cfg.Controller.AccountingRefreshLimit = 0
	calls := slow.calls
	r.get("/dw/v1/sessions/42/accounting", 1000)
	if slow.calls != calls {
		t.Errorf("accounting_refresh_limit 0 asked the node")
	}
}
