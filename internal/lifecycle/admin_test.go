package lifecycle

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/model"
)

// A fragment whose creation failed until its fuse blew is tried again once the fuse is
// replaced, and the session's step then succeeds; the session forgets the failure.
func TestReplacedFuseRetriesTheEffect(t *testing.T) {
	h := newHarness(t, "ssd1")
	h.fail = func(e Effect) error {
		if e.Op == OpCreateFragment {
			return errors.New("disk on fire")
		}
		return nil
	}
	h.must(ApplySetup(h.w, jobSetup("9", 1<<30), h, h.p, h.now))
	h.settle()
	if st := h.status("9", PhaseSetup); !st.Failed {
		t.Fatalf("setup: %+v", st)
	}
	var frag *model.Fragment
	for _, f := range h.w.Fragments {
		frag = f
	}
	if err := ReplaceFuse(h.w, KindNamespace, 1); err == nil || !strings.Contains(err.Error(), "is not blown") {
		t.Errorf("replace an unblown fuse: %v", err)
	}
	h.fail = func(Effect) error { return nil }
	h.must(ReplaceFuse(h.w, KindFragment, frag.ID))
	if frag.State.FuseBlown || frag.State.Attempts != 0 || h.w.SessionByToken("9").Failure != "" {
		t.Errorf("after replacing: %+v, session failure %q", frag.State, h.w.SessionByToken("9").Failure)
	}
	h.settle()
	if st := h.status("9", PhaseSetup); !st.Done || st.Failed {
		t.Fatalf("setup after the fuse was replaced: %+v", st)
	}
	for _, tc := range []struct {
		kind string
		id   ID
		want string
	}{
		{KindFragment, 99, "fragment 99 does not exist"},
		{KindStage, 1, "a stage has no fuse"},
		{KindSession, 1, "sessions have no fuse to replace; fuses are on fragments, namespaces, activations"},
	} {
		if err := ReplaceFuse(h.w, tc.kind, tc.id); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReplaceFuse(%s %d): %v, want %q", tc.kind, tc.id, err, tc.want)
		}
	}
}

// When a session goes, its finished stages go to the history with its token and owner.
func TestTeardownArchivesFinishedStages(t *testing.T) {
	h := newHarness(t, "ssd1")
	h.must(ApplySetup(h.w, jobSetup("7", 1<<30), h, h.p, h.now))
	h.settle()
	h.must(ApplyStages(h.w, "7", model.StageOut, []StageRequest{{Type: "file", PFSPath: "/pfs/o", DWVar: VarJobStriped, DWPath: "/o"}}, h, h.now))
	h.settle()
	h.must(ApplyTeardown(h.w, "7", false))
	var archived []*model.FinishedStage
	for i := 0; i < 10; i++ {
		for _, e := range Step(h.w, h.p, h.now) {
			Complete(h.w, e, Result{}, h.p, h.now)
		}
		archived = append(archived, h.w.TakeChanges().Archive...)
	}
	assertEmpty(t, h.w)
	if len(archived) != 1 || archived[0].Token != "7" || archived[0].Owner != 1001 || archived[0].Status != model.StageComplete || archived[0].PFSPath != "/pfs/o" {
		t.Fatalf("archived: %+v", archived)
	}
}

// Node changes: drain, hold offline, move between pools (refused while the node holds
// fragments); removal refused while it holds fragments or its agent is alive.
func TestNodeChangesAndRemoval(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	h.w.Pools["sm_pool"] = &model.Pool{Name: "sm_pool", Granularity: 1 << 20}
	h.must(ApplySetup(h.w, Setup{Token: "5", Creator: "SLURM", Owner: 1001, Group: 1001,
		Instance: &InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}, Strategy: "interference"}}, h, h.p, h.now))
	h.settle()
	var busy, idle string
	for _, f := range h.w.Fragments {
		busy = f.Node
	}
	idle = map[string]string{"ssd1": "ssd2", "ssd2": "ssd1"}[busy]
	yes, no, sm := true, false, "sm_pool"
	if err := UpdateNode(h.w, busy, NodeChange{Pool: &sm}); err == nil || !strings.Contains(err.Error(), "holds fragment 1 of session 1 (token 5)") {
		t.Errorf("move a node with a fragment: %v", err)
	}
	h.must(UpdateNode(h.w, idle, NodeChange{Pool: &sm, Drain: &yes, Reason: "moving"}))
	if n := h.w.Nodes[idle]; n.Pool != "sm_pool" || !n.PoolAssigned || !n.Drain || n.Reason != "moving" {
		t.Errorf("moved and drained: %+v", n)
	}
	h.must(UpdateNode(h.w, idle, NodeChange{Drain: &no}))
	if n := h.w.Nodes[idle]; n.Drain || n.Reason != "" {
		t.Errorf("filled: %+v", n)
	}
	if err := UpdateNode(h.w, idle, NodeChange{}); err == nil {
		t.Error("an empty change was accepted")
	}
	if err := UpdateNode(h.w, "nosuch", NodeChange{Drain: &yes}); err == nil || !strings.Contains(err.Error(), `node "nosuch" does not exist`) {
		t.Errorf("unknown node: %v", err)
	}
	nope := "nope"
	if err := UpdateNode(h.w, idle, NodeChange{Pool: &nope}); err == nil || !strings.Contains(err.Error(), `pool "nope" does not exist`) {
		t.Errorf("unknown pool: %v", err)
	}
	h.must(UpdateNode(h.w, busy, NodeChange{Offline: &yes}))
	if n := h.w.Nodes[busy]; n.Online || !n.HeldOffline {
		t.Errorf("held offline: %+v", n)
	}

	now := time.Unix(1_700_000_000, 0)
	h.w.Nodes[idle].LastSeen = now.Add(-time.Second)
	h.w.Nodes[busy].LastSeen = now.Add(-time.Hour)
	if err := CheckRemoveNode(h.w, busy, now, time.Minute); err == nil || !strings.Contains(err.Error(), "removing it would lose their data") {
		t.Errorf("remove a node with a fragment: %v", err)
	}
	if err := CheckRemoveNode(h.w, idle, now, time.Minute); err == nil || !strings.Contains(err.Error(), "stop its agent first") {
		t.Errorf("remove a node whose agent is alive: %v", err)
	}
	if err := CheckRemoveNode(h.w, idle, now.Add(time.Hour), time.Minute); err != nil {
		t.Errorf("remove a silent, empty node: %v", err)
	}
	if err := CheckRemovePool(h.w, "sm_pool"); err == nil || !strings.Contains(err.Error(), "has node(s) "+idle) {
		t.Errorf("remove a pool with a node: %v", err)
	}
	if err := CheckRemovePool(h.w, "wlm_pool"); err == nil || !strings.Contains(err.Error(), "has instance(s) 1") {
		t.Errorf("remove a pool with an instance: %v", err)
	}
}
