package lifecycle

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
)

func healthHarness(t *testing.T, nodes ...string) *harness {
	h := newHarness(t, nodes...)
	h.p.Health = Health{EnduranceThreshold: 10, AutoDrainFailures: 3, AutoDrainWindow: 10 * time.Minute}
	return h
}

// report is a storage node's heartbeat with its SSD's wear (percentage used).
func report(used int) agentapi.NodeReport {
	return agentapi.NodeReport{Endurance: &agentapi.Endurance{Known: true, PercentUsed: used, Source: "file /x"}}
}

func TestWornNodeTakesNoNewFragments(t *testing.T) {
	h := healthHarness(t, "ssd1", "ssd2")
	NodeReported(h.w.Nodes["ssd1"], report(95), h.p.Health, h.now) // 5% left: below 10%
	NodeReported(h.w.Nodes["ssd2"], report(40), h.p.Health, h.now)
	if !h.w.Nodes["ssd1"].Worn || h.w.Nodes["ssd2"].Worn {
		t.Fatalf("worn: ssd1 %v (5%% left), ssd2 %v (60%% left)", h.w.Nodes["ssd1"].Worn, h.w.Nodes["ssd2"].Worn)
	}
	h.must(ApplySetup(h.w, jobSetup("1", 4<<30, "striped"), h, h.p, h.now))
	for _, f := range h.w.Fragments {
		if f.Node != "ssd2" {
			t.Fatalf("a fragment went to the worn node %s", f.Node)
		}
	}
	if u := h.w.UsageOfPool("wlm_pool"); u.Free != 10-4 {
		t.Fatalf("the pool's free grains must leave out the worn node: %d", u.Free)
	}
	// Only the worn node left: the request fails and says why.
	NodeReported(h.w.Nodes["ssd2"], report(91), h.p.Health, h.now)
	err := ApplySetup(h.w, jobSetup("2", 1<<30, "striped"), h, h.p, h.now)
	if err == nil || !strings.Contains(err.Error(), "ssd1 SSD worn") || !strings.Contains(err.Error(), "controller.endurance_threshold") {
		t.Fatalf("want a refusal naming the worn nodes and the key: %v", err)
	}
	// Existing instances keep working: the first job's session completes its setup.
	h.settle()
	if st := h.status("1", PhaseSetup); !st.Done || st.Failed {
		t.Fatalf("the instance on a node that became worn must still come up: %+v", st)
	}
}

func TestEnduranceUnknownOrOffNeverExcludes(t *testing.T) {
	n := &model.Node{Name: "ssd1"}
	NodeReported(n, agentapi.NodeReport{Endurance: &agentapi.Endurance{Error: "no smartctl or nvme"}}, Health{EnduranceThreshold: 10}, time.Now())
	if n.Worn || n.Endurance == nil || n.Endurance.Error == "" {
		t.Fatalf("an unknown wear is kept for dwstat and never excludes the node: %+v", n)
	}
	NodeReported(n, report(100), Health{EnduranceThreshold: 0}, time.Now())
	if n.Worn {
		t.Fatal("endurance_threshold 0 turns the exclusion off")
	}
	NodeReported(n, report(90), Health{EnduranceThreshold: 10}, time.Now())
	if n.Worn {
		t.Fatal("10% remaining is not below a threshold of 10%")
	}
	NodeReported(n, report(130), Health{EnduranceThreshold: 10}, time.Now())
	if !n.Worn || n.Endurance.Remaining() != 0 {
		t.Fatalf("past its rated life (NVMe percentage_used 130): worn, 0%% remaining: %+v", n.Endurance)
	}
}

func TestRepeatedFragmentFailuresDrainTheNode(t *testing.T) {
	h := healthHarness(t, "ssd1", "ssd2")
	h.fail = func(e Effect) error {
		if e.Node == "ssd1" && e.Op == OpCreateFragment {
			return errors.New("mkdir /ssd/fragment/1: input/output error")
		}
		return nil
	}
	h.must(ApplySetup(h.w, jobSetup("1", 2<<30, "striped"), h, h.p, h.now))
	h.settle() // 3 attempts: the fuse blows, and the third failure drains the node
	n := h.w.Nodes["ssd1"]
	if !n.Drain || !n.AutoDrained {
		t.Fatalf("3 failures within the window must drain ssd1: %+v", n)
	}
	if want := "auto-drained: 3 failures in 10m: create-fragment: "; !strings.HasPrefix(n.Reason, want) || !strings.Contains(n.Reason, "input/output error") {
		t.Fatalf("reason %q: want %q and the last error", n.Reason, want)
	}
	if h.w.Nodes["ssd2"].Drain {
		t.Fatal("the healthy node must not be drained")
	}
	// New instances avoid it.
	h.fail = func(Effect) error { return nil }
	h.must(ApplySetup(h.w, jobSetup("2", 2<<30, "striped"), h, h.p, h.now))
	for _, f := range h.w.FragmentsOf(h.w.InstanceOf(h.w.SessionByToken("2").ID).ID) {
		if f.Node != "ssd2" {
			t.Fatalf("a new fragment went to the auto-drained node %s", f.Node)
		}
	}
	// An administrator clears it (dwcli update node --fill): back in service, failures forgotten.
	h.must(SetNodeDrain(h.w, "ssd1", false, ""))
	if n.Drain || n.AutoDrained || n.Reason != "" || len(n.Failures) != 0 {
		t.Fatalf("fill must clear the auto-drain and its failures: %+v", n)
	}
}

func TestFailuresOutsideTheWindowAreForgotten(t *testing.T) {
	h := Health{AutoDrainFailures: 3, AutoDrainWindow: 10 * time.Minute}
	n := &model.Node{Name: "ssd1", Pool: "wlm_pool", Online: true}
	t0 := time.Unix(1_700_000_000, 0)
	for i := 0; i < 10; i++ { // one failure every 6 minutes: never 3 within 10 minutes
		if recordFailure(n, "boom", h, t0.Add(time.Duration(i)*6*time.Minute)) {
			t.Fatalf("failure %d drained the node: failures %d minutes apart never make 3 in 10m", i, 6)
		}
	}
	if n.Drain || len(n.Failures) != 2 {
		t.Fatalf("want 2 failures kept (the window's), no drain: %+v", n)
	}
	if !recordFailure(n, "boom", h, t0.Add(54*time.Minute+time.Second)) {
		t.Fatal("a third failure within 10 minutes must drain")
	}
	if (Health{}).AutoDrainFailures != 0 || recordFailure(&model.Node{}, "x", Health{}, t0) {
		t.Fatal("auto_drain_failures 0 turns auto-drain off")
	}
}

func TestAdminDrainIsKeptByAutoDrain(t *testing.T) {
	h := Health{AutoDrainFailures: 1, AutoDrainWindow: time.Minute}
	n := &model.Node{Name: "ssd1", Drain: true, Reason: "SSD swap"}
	if recordFailure(n, "boom", h, time.Now()) || n.Reason != "SSD swap" || n.AutoDrained {
		t.Fatalf("an administrator's drain keeps its reason: %+v", n)
	}
}

func TestOfflineNodeFailuresAreNotCounted(t *testing.T) {
	h := healthHarness(t, "ssd1")
	h.w.Nodes["ssd1"].Online = false
	for i := 0; i < 5; i++ {
		Complete(h.w, Effect{Op: OpDeleteFragment, Node: "ssd1", Ref: Ref{KindFragment, 9}}, Result{Err: errors.New("connection refused")}, h.p, h.now)
	}
	if n := h.w.Nodes["ssd1"]; n.Drain || len(n.Failures) != 0 {
		t.Fatalf("an offline node's failures are explained by its being offline: %+v", n)
	}
	// Mounts are the compute node's doing, polls are retried: neither counts.
	h.w.Nodes["ssd1"].Online = true
	Complete(h.w, Effect{Op: OpMount, Node: "ssd1", Ref: Ref{KindActivation, 9}}, Result{Err: errors.New("x")}, h.p, h.now)
	Complete(h.w, Effect{Op: OpPollStage, Node: "ssd1", Ref: Ref{KindStage, 9}}, Result{Err: errors.New("x")}, h.p, h.now)
	if n := h.w.Nodes["ssd1"]; len(n.Failures) != 0 {
		t.Fatalf("mount and poll failures must not count: %+v", n.Failures)
	}
}

// issue 23 item 4: a failure that is not the node's (the controller's own, a configuration
// problem) never counts toward auto-drain; the same error as the node's does.
func TestFailuresNotTheNodesAreNotCounted(t *testing.T) {
	h := healthHarness(t, "ssd1")
	e := Effect{Op: OpCreateFragment, Node: "ssd1", Ref: Ref{KindFragment, 9}}
	for i := 0; i < 5; i++ {
		Complete(h.w, e, Result{Err: errors.New("node ssd1 advertises the agent address \"127.0.0.1:17711\""), NotTheNode: true}, h.p, h.now)
	}
	if n := h.w.Nodes["ssd1"]; n.Drain || len(n.Failures) != 0 {
		t.Fatalf("a configuration problem counted against the node: %+v", n)
	}
	Complete(h.w, e, Result{Err: errors.New("connection refused")}, h.p, h.now)
	if n := h.w.Nodes["ssd1"]; len(n.Failures) != 1 {
		t.Fatalf("the node's own failure must count: %+v", n.Failures)
	}
}

func TestDataPathErrorsReportedByTheAgentDrain(t *testing.T) {
	h := Health{AutoDrainFailures: 5, AutoDrainWindow: 10 * time.Minute}
	n := &model.Node{Name: "ssd1", Pool: "wlm_pool", Online: true}
	now := time.Unix(1_700_000_000, 0)
	if r := NodeReported(n, agentapi.NodeReport{DataErrors: 2, LastDataError: "statfs /ssd: input/output error"}, h, now); r != "" {
		t.Fatalf("2 errors must not drain: %s", r)
	}
	if NodeReported(n, agentapi.NodeReport{DataErrors: 2}, h, now.Add(time.Second)); len(n.Failures) != 2 {
		t.Fatalf("the same count again adds nothing: %d failures", len(n.Failures))
	}
	r := NodeReported(n, agentapi.NodeReport{DataErrors: 5, LastDataError: "stage 7: read /ssd/x: input/output error"}, h, now.Add(2*time.Second))
	if !n.Drain || !strings.HasPrefix(r, "auto-drained: 5 failures in 10m: data path: stage 7") {
		t.Fatalf("5 data-path errors in 10m must drain with the last error: %q %+v", r, n)
	}
	// An agent that restarted counts from zero: its new count is all new.
	m := &model.Node{Name: "ssd2", DataErrorsSeen: 40}
	NodeReported(m, agentapi.NodeReport{DataErrors: 1}, h, now)
	if len(m.Failures) != 1 || m.DataErrorsSeen != 1 {
		t.Fatalf("restarted agent: %+v", m)
	}
}
