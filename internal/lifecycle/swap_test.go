package lifecycle

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
)

func swapParams(h *harness) {
	h.p.Swap = SwapParams{MaxPerNode: 8 << 30, Priority: -1, DetachTimeout: 90 * time.Second}
}

// swapOf returns the session's swap instance and configuration.
func swapOf(t *testing.T, w *World, token string) (*model.Instance, *model.Configuration) {
	t.Helper()
	s := w.SessionByToken(token)
	if s == nil {
		t.Fatalf("no session %s", token)
	}
	for _, inst := range w.InstancesOf(s.ID) {
		for _, c := range w.ConfigurationsOf(inst.ID) {
			if c.Type == model.TypeSwap {
				return inst, c
			}
		}
	}
	t.Fatalf("session %s has no swap configuration", token)
	return nil, nil
}

// effectsOf steps once and returns the effects of one operation.
func effectsOf(h *harness, op string) []Effect {
	var out []Effect
	for _, e := range Step(h.w, h.p, h.now) {
		if e.Op == op {
			out = append(out, e)
		}
	}
	h.w.TakeChanges()
	return out
}

// TestSwapJobLifecycle (issue 22): a scratch+swap job. Setup reserves the swap instance at
// size per node (whole grains) × nodes, each fragment holding whole areas; its configuration
// is type swap, root's, 0700, and gives the job no variable. pre_run gives each compute node
// one area on one fragment (the node's own when it is a storage node), attached with its
// spec (a remote node through a mount grant of the namespace), and is done only once every
// area is attached; heartbeats list them. post_run detaches each with [swap] detach_timeout,
// polling until the node says done; teardown then removes everything.
func TestSwapJobLifecycle(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	swapParams(h)
	req := jobSetup("7", 1<<30, "striped")
	req.Swap = &SwapRequest{SizePerNode: 3 << 29, Nodes: 3, Pool: "wlm_pool", Line: 3} // 1.5GiB: 2 grains per node
	h.must(ApplySetup(h.w, req, h, h.p, h.now))
	inst, c := swapOf(t, h.w, "7")
	if inst.Capacity != 6<<30 || inst.Requested != 9<<29 || inst.Grains != 6 {
		t.Errorf("swap instance: capacity %d requested %d grains %d; want 6GiB (2 grains x 3 nodes), 4.5GiB, 6", inst.Capacity, inst.Requested, inst.Grains)
	}
	for _, f := range h.w.FragmentsOf(inst.ID) {
		if f.Grains%2 != 0 {
			t.Errorf("fragment %d on %s holds %d grains: not whole areas of 2", f.ID, f.Node, f.Grains)
		}
	}
	// Each area's namespace has room for its file and its own metadata: the agents count a
	// little more than the grains (an area of exactly whole grains must fit).
	for _, e := range Step(h.w, h.p, h.now) {
		if e.Op == OpCreateFragment && e.Fragment.InstanceID == inst.ID {
			f := h.w.Fragments[e.Fragment.ID]
			if e.Fragment.Capacity != f.Capacity+f.Grains/2*SwapAreaSlack || e.Fragment.InstanceCapacity != inst.Capacity+3*SwapAreaSlack {
				t.Errorf("swap fragment spec %+v", e.Fragment)
			}
		}
	}
	h.w.TakeChanges()
	if c.Owner != 0 || c.RootPermissions != 0o700 || c.SwapSize != 3<<29 || c.SwapNodes != 3 || c.AccessMode != "" {
		t.Errorf("swap configuration: %+v", c)
	}
	h.settle()
	if st := h.status("7", PhaseSetup); !st.Done || st.Failed {
		t.Fatalf("setup: %+v", st)
	}
	env, err := Paths(h.w, "7", h.p.MountRoot)
	if err != nil || len(env) != 1 || env[VarJobStriped] == "" {
		t.Errorf("the job sees its swap: paths %v %v", env, err)
	}

	h.must(ApplyPreRun(h.w, "7", []string{"ssd2", "cn1"}, h, h.p))
	// The areas' namespaces come first (root's, 0700), then the attaches.
	var nss []Effect
	for _, e := range Step(h.w, h.p, h.now) {
		if e.Op == OpCreateNamespace && e.Namespace.InstanceID == inst.ID {
			nss = append(nss, e)
		}
		if e.Op == OpAttachSwap {
			t.Errorf("attach before the area's namespace exists: %+v", e)
		}
	}
	h.w.TakeChanges()
	if len(nss) != 2 {
		t.Fatalf("namespaces of the swap areas: %+v", nss)
	}
	for _, e := range nss {
		if e.Namespace.Owner != 0 || e.Namespace.Mode != 0o700 {
			t.Errorf("swap namespace %+v: want root's, 0700", e.Namespace)
		}
		if e.Namespace.Servers != 0 { // an instance on two storage nodes: never striped
			t.Errorf("swap namespace %+v is striped: an area's file must be whole on its fragment", e.Namespace)
		}
		Complete(h.w, e, Result{}, h.p, h.now)
	}
	h.w.TakeChanges()
	if st := h.status("7", PhasePreRun); st.Done {
		t.Fatal("pre_run done before the swap areas are attached")
	}
	attaches := effectsOf(h, OpAttachSwap)
	if len(attaches) != 2 {
		t.Fatalf("attaches: %+v", attaches)
	}
	for _, e := range attaches {
		sp := e.Swap
		if sp.Node != e.Node || sp.Size != 3<<29 || sp.Priority != -1 || sp.InstanceID != inst.ID || sp.Job != "7" || sp.Owner != 1001 || sp.FileName != "swap-7-"+e.Node {
			t.Errorf("swap spec %+v", sp)
		}
		switch e.Node {
		case "ssd2": // co-located: its own fragment, the file system directly
			if sp.StorageNode != "ssd2" || sp.Mount != nil {
				t.Errorf("co-located node's area: storage %s mount %+v", sp.StorageNode, sp.Mount)
			}
		case "cn1": // remote: through a mount of the namespace
			if sp.StorageNode == "" || sp.StorageNode == "cn1" || sp.Mount == nil || sp.Mount.NamespaceID != sp.NamespaceID ||
				sp.Mount.FragmentID != sp.FragmentID || sp.Mount.StorageNode != sp.StorageNode || sp.Mount.MountPath != "" || len(sp.Mount.Stripes) != 0 {
				t.Errorf("remote node's area: %+v mount %+v", sp, sp.Mount)
			}
		}
	}
	if got := LiveSwaps(h.w, "cn1", h.p); len(got) != 1 || got[0].Node != "cn1" {
		t.Errorf("heartbeat swaps of cn1: %+v", got)
	}
	h.settle()
	if st := h.status("7", PhasePreRun); !st.Done || st.Failed {
		t.Fatalf("pre_run after the attaches: %+v", st)
	}
	for _, m := range LiveMounts(h.w, "cn1") {
		if m.InstanceID == inst.ID {
			t.Errorf("a swap area is listed as a mount: %+v", m)
		}
	}
	if got := LiveSwaps(h.w, "ssd1", h.p); len(got) != 0 {
		t.Errorf("ssd1 runs no job yet lists swaps: %+v", got)
	}

	// post_run: a detach in progress is polled again; done removes the area.
	polls := 0
	h.swapResult = func(e Effect) agentapi.SwapStatus {
		if e.SwapDetach.Timeout != 90_000 {
			t.Errorf("detach timeout %d ms, want [swap] detach_timeout 90000", e.SwapDetach.Timeout)
		}
		polls++
		return agentapi.SwapStatus{Attached: true, Done: polls > 3}
	}
	h.must(ApplyPostRun(h.w, "7"))
	if got := LiveSwaps(h.w, "cn1", h.p); len(got) != 0 {
		t.Errorf("heartbeats still list areas being detached: %+v", got)
	}
	h.settle()
	if st := h.status("7", PhasePostRun); !st.Done {
		t.Fatalf("post_run: %+v", st)
	}
	if polls < 4 {
		t.Errorf("detach polled %d times", polls)
	}
	h.must(ApplyTeardown(h.w, "7", false))
	h.settle()
	assertEmpty(t, h.w)
}

// TestSwapOnlyJobAndPlacement: a job with only #DW swap gets only a swap instance; without a
// node count its setup reserves for the client nodes it names; areas go to the compute
// node's own fragment when it has room, else to the fragment with the most room.
func TestSwapOnlyJobAndPlacement(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	swapParams(h)
	req := Setup{Token: "8", Owner: 1001, Group: 1001, ClientNodes: []string{"ssd1", "cn1", "cn2"},
		Swap: &SwapRequest{SizePerNode: 1 << 30, Pool: "wlm_pool"}}
	h.must(ApplySetup(h.w, req, h, h.p, h.now))
	s := h.w.SessionByToken("8")
	if insts := h.w.InstancesOf(s.ID); len(insts) != 1 || insts[0].Capacity != 3<<30 {
		t.Fatalf("instances of a swap-only job: %+v", insts)
	}
	h.settle()
	h.must(ApplyPreRun(h.w, "8", nil, h, h.p)) // the setup's client nodes
	byNode := map[string]string{}
	for _, a := range h.w.ActivationsOf(s.ID) {
		ns := h.w.Namespaces[a.NamespaceID]
		byNode[a.Node] = h.w.Fragments[ns.FragmentID].Node
		if a.MountPath != "" {
			t.Errorf("a swap area has a mount path: %+v", a)
		}
	}
	if len(byNode) != 3 {
		t.Fatalf("areas: %v", byNode)
	}
	if frags := h.w.FragmentsOf(h.w.InstancesOf(s.ID)[0].ID); len(frags) == 2 && byNode["ssd1"] != "ssd1" {
		t.Errorf("ssd1's area is on %s, not its own fragment", byNode["ssd1"])
	}
	h.settle()
	if st := h.status("8", PhasePreRun); !st.Done {
		t.Fatalf("pre_run: %+v", st)
	}
	h.must(ApplyTeardown(h.w, "8", false)) // teardown detaches, as post_run would
	h.settle()
	assertEmpty(t, h.w)
}

// TestSwapRefusals: a zero size, one above [swap] max_per_node, a persistent swap, type=swap
// on #DW jobdw, and a pre_run on more nodes than the swap was reserved for, each with the
// field and the fix; a refused setup changes nothing.
func TestSwapRefusals(t *testing.T) {
	h := newHarness(t, "ssd1")
	swapParams(h)
	setup := func(size uint64) Setup {
		return Setup{Token: "5", Owner: 1001, Group: 1001, Swap: &SwapRequest{SizePerNode: size, Pool: "wlm_pool", Line: 4}}
	}
	persistent := setup(1 << 30)
	persistent.Persistent, persistent.Token = true, "p5"
	persistent.Instance = jobSetup("p5", 1<<30).Instance
	jobdwSwap := jobSetup("5", 1<<30)
	jobdwSwap.Instance.Type = model.TypeSwap
	cases := []struct {
		req  Setup
		want string
	}{
		{setup(0), "line 4: #DW swap: size: the swap size must be greater than zero; write the swap per compute node, e.g. #DW swap 4GiB"},
		{setup(9 << 30), "line 4: #DW swap: size 9GiB is above this site's bound of 8GiB per compute node ([swap] max_per_node); ask for at most #DW swap 8GiB, or ask the administrator"},
		{persistent, "create_persistent p5: swap belongs to a job's compute nodes (#DW swap); a persistent instance cannot be of type swap"},
		{jobdwSwap, "type=swap is not a #DW jobdw type: swap is its own directive, #DW swap <size per compute node>, e.g. #DW swap 4GiB"},
	}
	for _, c := range cases {
		err := ApplySetup(h.w, c.req, h, h.p, h.now)
		var ue *UserError
		if !errors.As(err, &ue) || err.Error() != c.want {
			t.Errorf("got  %v\nwant %s", err, c.want)
		}
		if !h.w.TakeChanges().Empty() {
			t.Errorf("a refused request must change nothing")
		}
	}
	req := setup(1 << 30)
	req.Swap.Nodes = 1
	h.must(ApplySetup(h.w, req, h, h.p, h.now))
	h.settle()
	err := ApplyPreRun(h.w, "5", []string{"cn1", "cn2"}, h, h.p)
	if want := "pre_run 5: the job runs on 2 compute nodes but its #DW swap was reserved for 1 at setup"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("pre_run on too many nodes: %v", err)
	}
}

// TestSwapDetachFailure: a swapoff that cannot finish (its timeout passed) is reported on the
// session naming the node and the area, and retried within the executor's bounds; once it
// succeeds the teardown completes. One that never does blows the fuse: teardown reports it.
func TestSwapDetachFailure(t *testing.T) {
	h := newHarness(t, "ssd1")
	swapParams(h)
	h.must(ApplySetup(h.w, Setup{Token: "6", Owner: 1001, Group: 1001, Swap: &SwapRequest{SizePerNode: 1 << 30, Pool: "wlm_pool", Nodes: 1}}, h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "6", []string{"cn1"}, h, h.p))
	h.settle()
	a := h.w.ActivationsOf(h.w.SessionByToken("6").ID)[0]
	failures := 1
	h.swapResult = func(e Effect) agentapi.SwapStatus {
		if failures > 0 {
			failures--
			return agentapi.SwapStatus{Attached: true, Error: "swapoff /dev/loop7: cannot allocate memory"}
		}
		return agentapi.SwapStatus{Done: true}
	}
	h.must(ApplyTeardown(h.w, "6", false))
	for _, e := range effectsOf(h, OpDetachSwap) {
		Complete(h.w, e, Result{Swap: h.swapResult(e)}, h.p, h.now)
	}
	h.w.TakeChanges()
	want := "detach swap area " + itoa(a.ID) + " on compute node cn1: swapoff /dev/loop7: cannot allocate memory"
	if s := h.w.SessionByToken("6"); s.Failure != want {
		t.Errorf("session failure %q, want %q", s.Failure, want)
	}
	if got := h.w.Activations[a.ID]; got == nil || got.State.Attempts != 1 {
		t.Fatalf("the failed detach: %+v", got)
	}
	if st := h.status("6", PhaseTeardown); st.Done || st.Failed || st.Message != want {
		t.Errorf("teardown status while the detach is retried: %+v", st)
	}
	h.settle()
	assertEmpty(t, h.w)

	// Never: the fuse blows after max_attempts and the teardown says why.
	h.must(ApplySetup(h.w, Setup{Token: "4", Owner: 1001, Group: 1001, Swap: &SwapRequest{SizePerNode: 1 << 30, Pool: "wlm_pool"}}, h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "4", []string{"cn2"}, h, h.p))
	h.settle()
	h.swapResult = func(Effect) agentapi.SwapStatus {
		return agentapi.SwapStatus{Attached: true, Error: "swapoff timed out after 1m30s"}
	}
	h.must(ApplyTeardown(h.w, "4", false))
	h.settle()
	st := h.status("4", PhaseTeardown)
	if !st.Failed || !strings.Contains(st.Message, "on compute node cn2: swapoff timed out after 1m30s") {
		t.Errorf("teardown status: %+v", st)
	}
	if !nodeOnline(h.w, "cn2") || h.w.Nodes["cn2"].Drain {
		t.Errorf("the compute node must stay usable: %+v", h.w.Nodes["cn2"])
	}
}

// TestSwapLostStorageNode: the storage node of an attached area goes offline: the session
// reports the area lost with the reason; a compute node that goes away takes its areas.
func TestSwapLostStorageNode(t *testing.T) {
	h := newHarness(t, "ssd1")
	swapParams(h)
	h.must(ApplySetup(h.w, Setup{Token: "3", Owner: 1001, Group: 1001, Swap: &SwapRequest{SizePerNode: 1 << 30, Pool: "wlm_pool", Nodes: 2}}, h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "3", []string{"cn1", "cn2"}, h, h.p))
	h.settle()
	h.w.Nodes["ssd1"].Online = false
	s := h.w.SessionByToken("3")
	// Said at once where the session is read (a settled session is not stepped), then
	// recorded by the next step.
	if lost := LostSwaps(h.w, s); len(lost) != 2 || !strings.Contains(lost[0], "lost: its storage node ssd1 is offline") {
		t.Errorf("lost swaps: %q", lost)
	}
	if st := h.status("3", PhasePreRun); !st.Failed || !strings.Contains(st.Message, "lost: its storage node ssd1 is offline") {
		t.Errorf("pre_run status with a lost area: %+v", st)
	}
	Step(h.w, h.p, h.now)
	if !strings.Contains(s.Failure, "compute node cn") || !strings.Contains(s.Failure, "lost: its storage node ssd1 is offline") {
		t.Errorf("session failure: %q", s.Failure)
	}
	h.w.Nodes["cn2"].Online = false
	h.must(ApplyPostRun(h.w, "3"))
	h.settle()
	for _, a := range h.w.ActivationsOf(s.ID) {
		t.Errorf("area left after post_run: %+v", a)
	}
}

func itoa(id ID) string { return fmt.Sprint(id) }

// TestSwapConfigurationIsNotMountedByHand: dwcli create activation refuses a swap
// configuration (it would be mounted as a file tree, or attached outside pre_run).
func TestSwapConfigurationIsNotMountedByHand(t *testing.T) {
	h := newHarness(t, "ssd1")
	swapParams(h)
	h.must(ApplySetup(h.w, Setup{Token: "2", Owner: 1001, Group: 1001, ClientNodes: []string{"cn1"}, Swap: &SwapRequest{SizePerNode: 1 << 30, Pool: "wlm_pool"}}, h, h.p, h.now))
	_, c := swapOf(t, h.w, "2")
	_, err := ApplyCreateActivation(h.w, "2", ManualActivation{Configuration: c.ID, Mount: "/mnt/x"}, h, h.p)
	if err == nil || !strings.Contains(err.Error(), "is a job's swap") {
		t.Errorf("create activation of a swap configuration: %v", err)
	}
}
