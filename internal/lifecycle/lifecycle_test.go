package lifecycle

import (
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
)

// harness drives the pure core the way the executor does, with a simulated set of agents
// whose answers the test chooses.
type harness struct {
	t      *testing.T
	w      *World
	p      Params
	now    time.Time
	nextID map[string]ID
	// fail returns the error an effect meets (nil: success).
	fail func(e Effect) error
	// stageResult decides what a poll of a running stage answers.
	stageResult func(e Effect) agentapi.StageStatus
	// flushResult decides what a cache flush poll answers (default: Done).
	flushResult func(e Effect) agentapi.CacheFlushStatus
	// swapResult decides what a swap detach poll answers (nil: Done).
	swapResult func(e Effect) agentapi.SwapStatus
	log        []string
}

func (h *harness) NewID(kind string) (ID, error) {
	h.nextID[kind]++
	return h.nextID[kind], nil
}

func newHarness(t *testing.T, nodes ...string) *harness {
	w := NewWorld()
	w.Pools["wlm_pool"] = &model.Pool{Name: "wlm_pool", Granularity: 1 << 30}
	for _, n := range nodes {
		w.Nodes[n] = &model.Node{Name: n, Pool: "wlm_pool", Capacity: 10 << 30, Online: true}
	}
	w.Nodes["cn1"] = &model.Node{Name: "cn1", Online: true}
	w.Nodes["cn2"] = &model.Node{Name: "cn2", Online: true}
	w.TakeChanges()
	return &harness{
		t: t, w: w, now: time.Unix(1_700_000_000, 0), nextID: map[string]ID{},
		p: Params{MountRoot: "/mnt/bb", MaxSessions: 100, MaxAttempts: 3,
			RetryBackoff: time.Second, RetryBackoffMax: 4 * time.Second, StageMaxAttempts: 2, StageMaxRunning: 4},
		fail: func(Effect) error { return nil },
		stageResult: func(Effect) agentapi.StageStatus {
			return agentapi.StageStatus{Known: true, Status: model.StageComplete}
		},
		flushResult: func(Effect) agentapi.CacheFlushStatus { return agentapi.CacheFlushStatus{Done: true} },
	}
}

// settle runs steps until nothing is left to do (or a bound is reached), advancing time so
// that retries come due.
func (h *harness) settle() {
	for i := 0; i < 200; i++ {
		effects := Step(h.w, h.p, h.now)
		h.w.TakeChanges()
		if len(effects) == 0 {
			// Nothing runnable now; a retry may be due later.
			if !h.pendingRetry() {
				return
			}
		}
		for _, e := range effects {
			h.log = append(h.log, e.Op)
			r := Result{Err: h.fail(e)}
			var silent noAnswerError
			r.NoAnswer = errors.As(r.Err, &silent)
			if e.Op == OpPollStage && r.Err == nil {
				r.Stage = h.stageResult(e)
			}
			if e.Op == OpFlushCache && r.Err == nil {
				r.Flush = h.flushResult(e)
			}
			if e.Op == OpDetachSwap && r.Err == nil {
				r.Swap = agentapi.SwapStatus{Done: true}
				if h.swapResult != nil {
					r.Swap = h.swapResult(e)
				}
			}
			Complete(h.w, e, r, h.p, h.now)
			h.w.TakeChanges()
		}
		h.now = h.now.Add(time.Second)
	}
	h.t.Fatalf("the world did not settle in 200 steps; effects: %v", h.log[max(0, len(h.log)-10):])
}

func (h *harness) pendingRetry() bool {
	check := func(s model.State) bool { return s.Transitioning && !s.FuseBlown && s.RetryAt.After(h.now) }
	for _, f := range h.w.Fragments {
		if check(f.State) {
			return true
		}
	}
	for _, n := range h.w.Namespaces {
		if check(n.State) {
			return true
		}
	}
	for _, a := range h.w.Activations {
		if check(a.State) {
			return true
		}
	}
	for _, s := range h.w.Stages {
		if !s.Ended() && check(s.State) {
			return true
		}
	}
	return false
}

func (h *harness) must(err error) {
	h.t.Helper()
	if err != nil {
		h.t.Fatal(err)
	}
	h.w.TakeChanges()
}

func (h *harness) status(token, step string) StepStatus { return Status(h.w, token, step) }

func jobSetup(token string, capacity uint64, modes ...string) Setup {
	return Setup{Token: token, Creator: "SLURM", Owner: 1001, Group: 1001,
		Instance: &InstanceRequest{Capacity: capacity, Pool: "wlm_pool", Type: "scratch", AccessModes: modes}}
}

func TestJobLifecycle(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	h.must(ApplySetup(h.w, jobSetup("42", 3<<30+1, "striped"), h, h.p, h.now))
	if st := h.status("42", PhaseSetup); st.Done {
		t.Fatal("setup cannot be done before the fragments exist")
	}
	h.settle()
	if st := h.status("42", PhaseSetup); !st.Done || st.Failed {
		t.Fatalf("setup: %+v", st)
	}
	inst := h.w.InstanceOf(h.w.SessionByToken("42").ID)
	if inst.Grains != 4 || inst.Capacity != 4<<30 {
		t.Fatalf("3GiB+1 byte must round up to 4 grains: %+v", inst)
	}
	if got := len(h.w.FragmentsOf(inst.ID)); got != 2 {
		t.Fatalf("bandwidth strategy over 2 nodes: %d fragments", got)
	}

	h.must(ApplyStages(h.w, "42", model.StageIn, []StageRequest{
		{Type: "file", PFSPath: "/pfs/in.dat", DWVar: VarJobStriped, DWPath: "/in.dat", Line: 3},
		{Type: "directory", PFSPath: "/pfs/dir", DWVar: VarJobStriped, DWPath: "/dir", Line: 4},
	}, h, h.now))
	h.settle()
	if st := h.status("42", PhaseDataIn); !st.Done || st.Failed || len(st.Stages) != 2 {
		t.Fatalf("data_in: %+v", st)
	}

	env, err := Paths(h.w, "42", h.p.MountRoot)
	if err != nil || env[VarJobStriped] != "/mnt/bb/42_striped_scratch/" || len(env) != 1 {
		t.Fatalf("paths: %v %v", env, err)
	}

	h.must(ApplyPreRun(h.w, "42", []string{"cn1", "cn2"}, h, h.p))
	h.settle()
	if st := h.status("42", PhasePreRun); !st.Done {
		t.Fatalf("pre_run: %+v", st)
	}
	acts := h.w.ActivationsOf(h.w.SessionByToken("42").ID)
	if len(acts) != 2 || acts[0].NamespaceID != acts[1].NamespaceID {
		t.Fatalf("striped: one namespace shared by both compute nodes: %+v", acts)
	}

	h.must(ApplyPostRun(h.w, "42"))
	h.settle()
	if st := h.status("42", PhasePostRun); !st.Done {
		t.Fatalf("post_run: %+v", st)
	}
	h.must(ApplyStages(h.w, "42", model.StageOut, []StageRequest{{Type: "file", PFSPath: "/pfs/out.dat", DWVar: VarJobStriped, DWPath: "/out.dat"}}, h, h.now))
	h.settle()
	if st := h.status("42", PhaseDataOut); !st.Done || st.Failed {
		t.Fatalf("data_out: %+v", st)
	}
	h.must(ApplyTeardown(h.w, "42", false))
	h.settle()
	if st := h.status("42", PhaseTeardown); !st.Done {
		t.Fatalf("teardown: %+v", st)
	}
	assertEmpty(t, h.w)
	if errors.Is(ApplyTeardown(h.w, "42", false), ErrNoSession) == false {
		t.Fatal("a second teardown must say the token is not found")
	}
}

func assertEmpty(t *testing.T, w *World) {
	t.Helper()
	if n := len(w.Sessions) + len(w.Instances) + len(w.Fragments) + len(w.Configurations) + len(w.Namespaces) + len(w.Registrations) + len(w.Activations) + len(w.Stages); n != 0 {
		t.Fatalf("%d objects left behind: sessions %d instances %d fragments %d configurations %d namespaces %d registrations %d activations %d stages %d",
			n, len(w.Sessions), len(w.Instances), len(w.Fragments), len(w.Configurations), len(w.Namespaces), len(w.Registrations), len(w.Activations), len(w.Stages))
	}
}

func TestTeardownWaitsForStageOutUnlessHurried(t *testing.T) {
	for _, mode := range []string{"wait", "hurry", "no-wait"} {
		t.Run(mode, func(t *testing.T) {
			h := newHarness(t, "ssd1")
			h.must(ApplySetup(h.w, jobSetup("7", 1<<30), h, h.p, h.now))
			h.settle()
			h.stageResult = func(Effect) agentapi.StageStatus {
				return agentapi.StageStatus{Known: true, Status: "running", BytesDone: 5}
			}
			h.must(ApplyStages(h.w, "7", model.StageOut, []StageRequest{{Type: "file", PFSPath: "/pfs/o", DWVar: VarJobStriped, DWPath: "/o"}}, h, h.now))
			for i := 0; i < 3; i++ {
				Complete(h.w, Effect{}, Result{}, h.p, h.now)
				for _, e := range Step(h.w, h.p, h.now) {
					r := Result{}
					if e.Op == OpPollStage {
						r.Stage = h.stageResult(e)
					}
					Complete(h.w, e, r, h.p, h.now)
				}
				h.w.TakeChanges()
			}
			if mode == "no-wait" {
				for _, r := range h.w.RegistrationsOf(h.w.SessionByToken("7").ID) {
					h.must(ReleaseRegistration(h.w, r.ID))
				}
			}
			h.must(ApplyTeardown(h.w, "7", mode == "hurry"))
			for i := 0; i < 5; i++ {
				for _, e := range Step(h.w, h.p, h.now) {
					r := Result{}
					if e.Op == OpPollStage {
						r.Stage = h.stageResult(e)
					}
					Complete(h.w, e, r, h.p, h.now)
				}
				h.w.TakeChanges()
			}
			gone := h.w.SessionByToken("7") == nil
			if mode == "wait" && gone {
				t.Fatal("teardown must wait for a running stage-out")
			}
			if mode != "wait" && !gone {
				t.Fatalf("%s teardown must not wait", mode)
			}
			if mode == "wait" {
				// The stage-out finishes: the teardown completes.
				h.stageResult = func(Effect) agentapi.StageStatus {
					return agentapi.StageStatus{Known: true, Status: model.StageComplete}
				}
				h.settle()
				assertEmpty(t, h.w)
			}
		})
	}
}

func TestFailingAgentBlowsTheFuseAndTeardownStillCleans(t *testing.T) {
	h := newHarness(t, "ssd1")
	h.fail = func(e Effect) error {
		if e.Op == OpCreateFragment {
			return errors.New("disk on fire")
		}
		return nil
	}
	h.must(ApplySetup(h.w, jobSetup("9", 1<<30), h, h.p, h.now))
	h.settle()
	st := h.status("9", PhaseSetup)
	if !st.Failed || !strings.Contains(st.Message, "disk on fire") || st.Done {
		t.Fatalf("setup after %d failures: %+v", h.p.MaxAttempts, st)
	}
	if n := strings.Count(strings.Join(h.log, " "), OpCreateFragment); n != h.p.MaxAttempts {
		t.Fatalf("create-fragment tried %d times, limit %d", n, h.p.MaxAttempts)
	}
	h.fail = func(Effect) error { return nil }
	h.must(ApplyTeardown(h.w, "9", true))
	h.settle()
	assertEmpty(t, h.w)
}

func TestOfflineNodeDoesNotBlockTeardown(t *testing.T) {
	h := newHarness(t, "ssd1")
	h.must(ApplySetup(h.w, jobSetup("5", 1<<30), h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "5", []string{"cn1"}, h, h.p))
	h.settle()
	h.w.Nodes["ssd1"].Online = false
	h.w.Nodes["cn1"].Online = false
	h.fail = func(e Effect) error { return fmt.Errorf("%s unreachable", e.Node) }
	h.must(ApplyTeardown(h.w, "5", true))
	h.settle()
	assertEmpty(t, h.w)
}

func TestLostStageIsRestartedThenFails(t *testing.T) {
	h := newHarness(t, "ssd1")
	h.must(ApplySetup(h.w, jobSetup("3", 1<<30), h, h.p, h.now))
	h.settle()
	h.stageResult = func(Effect) agentapi.StageStatus { return agentapi.StageStatus{Known: false} }
	h.must(ApplyStages(h.w, "3", model.StageIn, []StageRequest{{Type: "file", PFSPath: "/pfs/a", DWVar: VarJobStriped, DWPath: "/a", Line: 2}}, h, h.now))
	h.settle()
	st := h.status("3", PhaseDataIn)
	if !st.Done || !st.Failed || !strings.Contains(st.Message, "stage.max_attempts") || !strings.Contains(st.Message, "line 2") {
		t.Fatalf("%+v", st)
	}
	if n := strings.Count(strings.Join(h.log, " "), OpStartStage); n != h.p.StageMaxAttempts {
		t.Fatalf("started %d times, limit %d", n, h.p.StageMaxAttempts)
	}
	// Asking for data_in again retries the failed stage.
	h.stageResult = func(Effect) agentapi.StageStatus {
		return agentapi.StageStatus{Known: true, Status: model.StageComplete}
	}
	h.must(ApplyStages(h.w, "3", model.StageIn, []StageRequest{{Type: "file", PFSPath: "/pfs/a", DWVar: VarJobStriped, DWPath: "/a", Line: 2}}, h, h.now))
	h.settle()
	if st := h.status("3", PhaseDataIn); !st.Done || st.Failed || len(st.Stages) != 1 {
		t.Fatalf("retry: %+v", st)
	}
}

func TestPersistentInstanceUsedByJobs(t *testing.T) {
	h := newHarness(t, "ssd1")
	create := Setup{Token: "foo", Creator: "CLI", Owner: 1001, Group: 1001, Persistent: true,
		Instance: &InstanceRequest{Capacity: 2 << 30, Pool: "wlm_pool", Type: "scratch"}}
	h.must(ApplySetup(h.w, create, h, h.p, h.now))
	h.settle()
	job := Setup{Token: "11", Creator: "SLURM", Owner: 1001, Group: 1001, Uses: []string{"foo"}}
	h.must(ApplySetup(h.w, job, h, h.p, h.now))
	h.settle()
	env, _ := Paths(h.w, "11", h.p.MountRoot)
	if env["DW_PERSISTENT_STRIPED_foo"] != "/mnt/bb/foo_11_striped_scratch/" || len(env) != 1 {
		t.Fatalf("paths: %v", env)
	}
	h.must(ApplyStages(h.w, "11", model.StageIn, []StageRequest{{Type: "file", PFSPath: "/pfs/a", DWVar: "DW_PERSISTENT_STRIPED_foo", DWPath: "/a"}}, h, h.now))
	h.must(ApplyPreRun(h.w, "11", []string{"cn1"}, h, h.p))
	h.settle()
	if err := ApplyTeardown(h.w, "foo", false); err == nil || !strings.Contains(err.Error(), "in use by job(s) 11") {
		t.Fatalf("destroying a persistent instance in use: %v", err)
	}
	h.must(ApplyPostRun(h.w, "11"))
	h.must(ApplyTeardown(h.w, "11", false))
	h.settle()
	if h.w.PersistentByName("foo") == nil {
		t.Fatal("the job's teardown must not touch the persistent instance")
	}
	h.must(ApplyTeardown(h.w, "foo", false))
	h.settle()
	assertEmpty(t, h.w)
}

func TestPrivateHasANamespacePerNodeAndStripedPrivateBoth(t *testing.T) {
	h := newHarness(t, "ssd1")
	h.must(ApplySetup(h.w, jobSetup("8", 1<<30, "striped", "private"), h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "8", []string{"cn1", "cn2"}, h, h.p))
	h.settle()
	env, _ := Paths(h.w, "8", h.p.MountRoot)
	if env[VarJobStriped] == "" || env[VarJobPrivate] != "/mnt/bb/8_private_scratch/" {
		t.Fatalf("paths: %v", env)
	}
	privNS := map[ID]bool{}
	stripedNS := map[ID]bool{}
	for _, a := range h.w.ActivationsOf(h.w.SessionByToken("8").ID) {
		if strings.Contains(a.MountPath, "private") {
			privNS[a.NamespaceID] = true
		} else {
			stripedNS[a.NamespaceID] = true
		}
	}
	if len(privNS) != 2 || len(stripedNS) != 1 {
		t.Fatalf("private: one namespace per node (%d), striped: one shared (%d)", len(privNS), len(stripedNS))
	}
	if err := ApplyStages(h.w, "8", model.StageIn, []StageRequest{{Type: "file", PFSPath: "/pfs/a", DWVar: VarJobPrivate, DWPath: "/a"}}, h, h.now); err == nil || !strings.Contains(err.Error(), "private") {
		t.Fatalf("staging into private: %v", err)
	}
	h.must(ApplyTeardown(h.w, "8", true))
	h.settle()
	assertEmpty(t, h.w)
}

func TestLoadbalanceMountsReadOnly(t *testing.T) {
	h := newHarness(t, "ssd1")
	h.must(ApplySetup(h.w, jobSetup("6", 1<<30, "loadbalance"), h, h.p, h.now))
	h.settle()
	h.must(ApplyStages(h.w, "6", model.StageIn, []StageRequest{{Type: "file", PFSPath: "/pfs/a", DWVar: VarJobLoadbalance, DWPath: "/a"}}, h, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "6", []string{"cn1"}, h, h.p))
	h.settle()
	a := h.w.ActivationsOf(h.w.SessionByToken("6").ID)[0]
	if !a.ReadOnly {
		t.Fatal("loadbalance is read-only once mounted")
	}
	if err := ApplyStages(h.w, "6", model.StageIn, []StageRequest{{Type: "file", PFSPath: "/pfs/b", DWVar: VarJobLoadbalance, DWPath: "/b"}}, h, h.now); err == nil {
		t.Fatal("stage-in into a mounted loadbalance instance must be refused")
	}
}

func TestRequestErrors(t *testing.T) {
	h := newHarness(t, "ssd1")
	cases := []struct {
		req  Setup
		want string
	}{
		{Setup{Token: "1", Owner: 1, Instance: &InstanceRequest{Capacity: 1, Pool: "nosuch"}}, `pool "nosuch" does not exist; pools: wlm_pool`},
		{Setup{Token: "1", Owner: 1, Instance: &InstanceRequest{Capacity: 11 << 30, Pool: "wlm_pool"}}, "cannot hold 11GiB"},
		{Setup{Token: "1", Owner: 1, Instance: &InstanceRequest{Capacity: 1, Pool: "wlm_pool", Type: "cache"}}, "type=cache needs pfs="},
		{Setup{Token: "1", Owner: 1, Uses: []string{"ghost"}}, "persistentdw name=ghost"},
		{Setup{Token: "9lives", Owner: 1, Persistent: true, Instance: &InstanceRequest{Capacity: 1, Pool: "wlm_pool"}}, "must not start with a digit"},
		{Setup{Token: "a-b", Owner: 1, Persistent: true, Instance: &InstanceRequest{Capacity: 1, Pool: "wlm_pool"}}, "letters, digits and _"},
		// DataWarp's Table I: no private persistent instance (spillway persistent create, the API).
		{Setup{Token: "p", Owner: 1, Persistent: true, Instance: &InstanceRequest{Capacity: 1, Pool: "wlm_pool", AccessModes: []string{"private"}}}, "access_mode=private is not available for a persistent instance"},
		{Setup{Token: "p", Owner: 1, Persistent: true, Instance: &InstanceRequest{Capacity: 1, Pool: "wlm_pool", AccessModes: []string{"striped", "private"}}}, "use access_mode=striped"},
	}
	for _, c := range cases {
		err := ApplySetup(h.w, c.req, h, h.p, h.now)
		var ue *UserError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want a user error containing %q", c.req, err, c.want)
		}
		if !h.w.TakeChanges().Empty() && err == nil {
			t.Errorf("a refused request must change nothing")
		}
	}
	if err := ApplyStages(h.w, "404", model.StageIn, nil, h, h.now); !errors.Is(err, ErrNoSession) {
		t.Fatalf("data_in of an unknown token: %v", err)
	}
}

func TestSetupIsIdempotentAndBusyDuringTeardown(t *testing.T) {
	h := newHarness(t, "ssd1")
	h.must(ApplySetup(h.w, jobSetup("4", 1<<30), h, h.p, h.now))
	h.must(ApplySetup(h.w, jobSetup("4", 1<<30), h, h.p, h.now))
	if len(h.w.Sessions) != 1 || len(h.w.Instances) != 1 {
		t.Fatal("a repeated setup must not allocate twice")
	}
	other := jobSetup("4", 1<<30)
	other.Owner = 2
	if err := ApplySetup(h.w, other, h, h.p, h.now); err == nil {
		t.Fatal("another user's setup of the same token must be refused")
	}
	h.must(ApplyTeardown(h.w, "4", false))
	if err := ApplySetup(h.w, jobSetup("4", 1<<30), h, h.p, h.now); !errors.Is(err, ErrBusy) {
		t.Fatalf("setup during teardown: %v", err)
	}
}

// TestRandomHistories drives random requests against agents that fail at random, then tears
// everything down with healthy agents: nothing may be over-committed at any point and nothing
// may be left at the end. Each history runs on a world with the parent index (World.Index,
// as the controller's whole-state worlds) and on one without.
func TestRandomHistories(t *testing.T) {
	for run := int64(0); run < 80; run++ {
		seed := 1 + run/2
		rng := rand.New(rand.NewSource(seed))
		h := newHarness(t, "a", "b", "c")
		if run%2 == 1 {
			h.w.Index()
		}
		h.fail = func(Effect) error {
			if rng.Intn(4) == 0 {
				return errors.New("flaky")
			}
			return nil
		}
		h.stageResult = func(Effect) agentapi.StageStatus {
			switch rng.Intn(5) {
			case 0:
				return agentapi.StageStatus{Known: false}
			case 1:
				return agentapi.StageStatus{Known: true, Status: model.StageFailed, Error: "eperm"}
			case 2:
				return agentapi.StageStatus{Known: true, Status: "running"}
			}
			return agentapi.StageStatus{Known: true, Status: model.StageComplete}
		}
		tokens := []string{"1", "2", "3", "4", "5"}
		for i := 0; i < 60; i++ {
			tok := tokens[rng.Intn(len(tokens))]
			switch rng.Intn(7) {
			case 0:
				ApplySetup(h.w, jobSetup(tok, uint64(1+rng.Intn(12))<<30, []string{"striped", "private", "loadbalance"}[rng.Intn(3)]), h, h.p, h.now)
			case 1:
				ApplyStages(h.w, tok, model.StageIn, []StageRequest{{Type: "file", PFSPath: "/p", DWVar: VarJobStriped, DWPath: "/x"}}, h, h.now)
			case 2:
				ApplyPreRun(h.w, tok, []string{"cn1", "cn2"}[:1+rng.Intn(2)], h, h.p)
			case 3:
				ApplyPostRun(h.w, tok)
			case 4:
				ApplyStages(h.w, tok, model.StageOut, []StageRequest{{Type: "file", PFSPath: "/p", DWVar: VarJobStriped, DWPath: "/x"}}, h, h.now)
			case 5:
				ApplyTeardown(h.w, tok, rng.Intn(2) == 0)
			case 6:
				settled := map[ID]bool{}
				for _, s := range h.w.Sessions {
					if ok, _ := Settled(h.w, s, h.now); ok {
						settled[s.ID] = true
					}
				}
				effects := Step(h.w, h.p, h.now)
				// The due index's promise: Step does nothing to a settled session.
				for _, e := range effects {
					if settled[SessionOf(h.w, e.Ref)] {
						t.Fatalf("seed %d: Step wants %s on %v of a settled session", seed, e.Op, e.Ref)
					}
				}
				for _, obj := range h.w.changes.Put {
					if settled[SessionOf(h.w, refOf(obj))] {
						t.Fatalf("seed %d: Step changed %T of a settled session", seed, obj)
					}
				}
				for id := range settled {
					if h.w.Sessions[id] == nil {
						t.Fatalf("seed %d: Step removed settled session %d", seed, id)
					}
				}
				for _, e := range effects {
					r := Result{Err: h.fail(e)}
					if e.Op == OpPollStage && r.Err == nil {
						r.Stage = h.stageResult(e)
					}
					Complete(h.w, e, r, h.p, h.now)
				}
				h.now = h.now.Add(3 * time.Second)
			}
			h.w.TakeChanges()
			for name := range h.w.Nodes {
				if u := h.w.UsageOfNode(name); u.Used > u.Grains {
					t.Fatalf("seed %d: node %s over-committed: %d of %d grains", seed, name, u.Used, u.Grains)
				}
			}
		}
		h.fail = func(Effect) error { return nil }
		h.stageResult = func(Effect) agentapi.StageStatus {
			return agentapi.StageStatus{Known: true, Status: model.StageComplete}
		}
		for _, s := range h.w.SortedSessions() {
			if err := ApplyTeardown(h.w, s.Token, true); err != nil {
				t.Fatalf("seed %d: teardown %s: %v", seed, s.Token, err)
			}
		}
		// Fuses blown by the flaky phase need an operator; here the test plays one.
		clearFuses(h.w)
		h.settle()
		assertEmpty(t, h.w)
	}
}

func clearFuses(w *World) {
	for _, f := range w.Fragments {
		f.State.FuseBlown, f.State.Attempts = false, 0
	}
	for _, n := range w.Namespaces {
		n.State.FuseBlown, n.State.Attempts = false, 0
	}
	for _, a := range w.Activations {
		a.State.FuseBlown, a.State.Attempts = false, 0
	}
	for _, s := range w.Stages {
		s.State.FuseBlown, s.State.Attempts = false, 0
	}
}

// Creating an existing persistent instance again is a no-op with the same parameters (Slurm
// re-sends create_persistent) and an error naming the difference with others.
func TestPersistentCreateAgain(t *testing.T) {
	h := newHarness(t, "ssd1")
	create := func(capacity uint64, modes ...string) Setup {
		return Setup{Token: "dup", Creator: "CLI", Owner: 1001, Group: 1001, Persistent: true,
			Instance: &InstanceRequest{Capacity: capacity, Pool: "wlm_pool", Type: "scratch", AccessModes: modes}}
	}
	h.must(ApplySetup(h.w, create(2<<30, "striped"), h, h.p, h.now))
	h.settle()
	h.must(ApplySetup(h.w, create(2<<30-5, "striped"), h, h.p, h.now)) // same grains
	for _, tc := range []struct {
		req  Setup
		want string
	}{
		{create(5<<30, "striped"), "capacity 2GiB, not 5GiB"},
		{create(2<<30, "private"), "access mode striped, not private"},
	} {
		err := ApplySetup(h.w, tc.req, h, h.p, h.now)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "destroy it first") {
			t.Errorf("create again with other parameters: %v, want %q", err, tc.want)
		}
	}
	if inst := h.w.InstanceOf(h.w.PersistentByName("dup").ID); inst.Capacity != 2<<30 {
		t.Errorf("capacity changed to %d", inst.Capacity)
	}
}

// A token becomes part of mount paths: even a privileged caller (the workload manager) cannot
// set one up that would leave the mount root or confuse the tables; and access modes given
// twice would make two configurations with one mount path.
func TestSetupRefusesBadTokensAndDuplicateModes(t *testing.T) {
	h := newHarness(t, "ssd1")
	for _, tc := range []struct {
		setup Setup
		want  string
	}{
		{jobSetup("../../x", 1<<30, "striped"), `'.' is not allowed`},
		{jobSetup("a/b", 1<<30, "striped"), `'/' is not allowed`},
		{jobSetup("run 1", 1<<30, "striped"), `' ' is not allowed`},
		{jobSetup("", 1<<30, "striped"), "empty token"},
		{jobSetup(strings.Repeat("x", 200), 1<<30, "striped"), "longer than 128 bytes"},
		{jobSetup("43", 1<<30, "striped", "striped"), "access_mode striped is given twice"},
		{jobSetup("44", 1<<30, "private", "striped", "private"), "access_mode private is given twice"},
	} {
		err := ApplySetup(h.w, tc.setup, h, h.p, h.now)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("setup of %q %v: %v, want an error containing %q", tc.setup.Token, tc.setup.Instance.AccessModes, err, tc.want)
		}
		h.w.TakeChanges()
	}
	if n := len(h.w.Sessions); n != 0 {
		t.Errorf("refused setups left %d sessions", n)
	}
	h.must(ApplySetup(h.w, jobSetup("run_7_a", 1<<30, "striped", "private"), h, h.p, h.now))
}

// Another user's job must not keep a persistent instance from its owner for ever: a hurried
// destroy unmounts it from the job (which goes on, without it), then destroys it.
func TestHurriedDestroyTakesAPersistentInstanceFromItsUsers(t *testing.T) {
	h := newHarness(t, "ssd1")
	create := Setup{Token: "shared", Creator: "CLI", Owner: 1001, Group: 1001, Persistent: true,
		Instance: &InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch"}}
	h.must(ApplySetup(h.w, create, h, h.p, h.now))
	h.settle()
	job := Setup{Token: "12", Creator: "SLURM", Owner: 2002, Group: 2002, Uses: []string{"shared"},
		Instance: &InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch"}}
	h.must(ApplySetup(h.w, job, h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "12", []string{"cn1"}, h, h.p))
	h.settle()
	jobID := h.w.SessionByToken("12").ID
	if n := len(h.w.ActivationsOf(jobID)); n != 2 {
		t.Fatalf("the job has %d mounts, want 2 (its own instance and the persistent one)", n)
	}
	if err := ApplyTeardown(h.w, "shared", false); err == nil || !strings.Contains(err.Error(), "--hurry") {
		t.Fatalf("a destroy without hurry of an instance in use: %v, want the way to force it", err)
	}
	h.w.TakeChanges()
	h.must(ApplyTeardown(h.w, "shared", true))
	h.settle()
	if h.w.PersistentByName("shared") != nil {
		t.Fatal("the persistent instance survived a hurried destroy")
	}
	job12 := h.w.SessionByToken("12")
	if job12 == nil || job12.State.Goal == model.GoalDestroy {
		t.Fatal("the job that used the persistent instance must go on")
	}
	if acts := h.w.ActivationsOf(jobID); len(acts) != 1 {
		t.Errorf("the job keeps %d mounts, want only its own instance's", len(acts))
	}
	if env, _ := Paths(h.w, "12", h.p.MountRoot); env["DW_PERSISTENT_STRIPED_shared"] != "" {
		t.Errorf("the job's paths still name the destroyed instance: %v", env)
	}
	h.must(ApplyPostRun(h.w, "12"))
	h.must(ApplyTeardown(h.w, "12", false))
	h.settle()
	assertEmpty(t, h.w)
}

// The per-user quota counts one user's live sessions, persistent instances and capacity; other
// users and sessions being destroyed do not count, and a re-sent setup always passes.
func TestUserQuota(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	q := Quota{Sessions: 2, Persistent: 1, Capacity: 3 << 30}
	mine := func(token string, capacity uint64, persistent bool) Setup {
		s := jobSetup(token, capacity, "striped")
		s.Persistent = persistent
		return s
	}
	h.must(ApplySetup(h.w, mine("run1", 1<<30, false), h, h.p, h.now))
	other := jobSetup("run2", 5<<30, "striped")
	other.Owner = 2002
	h.must(ApplySetup(h.w, other, h, h.p, h.now))
	for _, tc := range []struct {
		req  Setup
		want string
	}{
		{mine("run3", 3<<30, false), "max_capacity_per_user"},
		{mine("run13", 1<<30, true), "is reserved"},
	} {
		if err := CheckUserQuota(h.w, tc.req, q); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.req.Token, err, tc.want)
		}
	}
	h.must(CheckUserQuota(h.w, mine("p", 1<<30, true), q))
	h.must(ApplySetup(h.w, mine("p", 1<<30, true), h, h.p, h.now))
	if err := CheckUserQuota(h.w, mine("q", 1<<30, true), q); err == nil || !strings.Contains(err.Error(), "max_sessions_per_user") {
		t.Errorf("a third session with Sessions 2: %v", err)
	}
	h.must(CheckUserQuota(h.w, mine("p", 1<<30, true), q)) // re-sent: not new
	h.must(ApplyTeardown(h.w, "run1", false))
	h.settle() // run1's instance is released: it no longer counts
	if err := CheckUserQuota(h.w, mine("q", 1<<30, true), q); err == nil || !strings.Contains(err.Error(), "max_persistent_per_user") {
		t.Errorf("a second persistent instance with Persistent 1: %v", err)
	}
	h.must(CheckUserQuota(h.w, mine("run4", 2<<30, false), q)) // run1 is gone: its capacity no longer counts
}

// Security issue 19, item 7: sessions being torn down whose stage-outs never end (their
// destination is the user's own stalled FUSE server) still hold their instances: they count
// against every quota until the instances are released. The job's teardown waits for its
// stage-out; the persistent instance's teardown cannot delete its namespace yet.
func TestQuotaCountsTeardownsThatHoldInstances(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	h.stageResult = func(Effect) agentapi.StageStatus { // the stage-outs hang
		return agentapi.StageStatus{Known: true, Status: model.StageRunning}
	}
	h.fail = func(e Effect) error {
		if e.Op == OpDeleteNamespace {
			return errors.New("the namespace is busy")
		}
		return nil
	}
	out := []StageRequest{{Type: "file", PFSPath: "/home/u/result", DWVar: VarJobStriped, DWPath: "/result"}}
	for _, token := range []string{"j1", "p1"} {
		s := jobSetup(token, 1<<30, "striped")
		s.Persistent = token == "p1"
		h.must(ApplySetup(h.w, s, h, h.p, h.now))
	}
	h.settle()
	h.must(ApplyStages(h.w, "j1", model.StageOut, out, h, h.now))
	for _, token := range []string{"j1", "p1"} {
		h.must(ApplyTeardown(h.w, token, false)) // dwcli rm session, not hurried
		for i := 0; i < 20; i++ {
			h.stepOnce() // the stage-out runs, and runs
		}
		if s := h.w.SessionByToken(token); s == nil || h.w.InstanceOf(s.ID) == nil {
			t.Fatalf("session %s: its stage-out hangs, yet its instance is gone", token)
		}
	}
	mine := func(token string, persistent bool) Setup {
		s := jobSetup(token, 1<<30, "striped")
		s.Persistent = persistent
		return s
	}
	for _, tc := range []struct {
		q    Quota
		req  Setup
		want string
	}{
		{Quota{Sessions: 2}, mine("j3", false), "max_sessions_per_user"},
		{Quota{Persistent: 1}, mine("p3", true), "max_persistent_per_user"},
		{Quota{Capacity: 2 << 30}, mine("j3", false), "max_capacity_per_user"},
	} {
		if err := CheckUserQuota(h.w, tc.req, tc.q); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v with two teardowns holding their instances: %v, want %s", tc.q, err, tc.want)
		}
	}
	// The stage-out ends, the namespace can be deleted: the instances are released and the
	// quota is free again.
	h.stageResult = func(Effect) agentapi.StageStatus {
		return agentapi.StageStatus{Known: true, Status: model.StageComplete}
	}
	h.fail = func(Effect) error { return nil }
	for id, ns := range h.w.Namespaces {
		if ns.State.FuseBlown {
			h.must(ReplaceFuse(h.w, KindNamespace, id))
		}
	}
	h.now = h.now.Add(time.Minute)
	h.settle()
	for _, token := range []string{"j1", "p1"} {
		if h.w.SessionByToken(token) != nil {
			t.Fatalf("session %s is still there after its stage-out ended and its namespace could be deleted", token)
		}
	}
	h.must(CheckUserQuota(h.w, mine("p3", true), Quota{Sessions: 2, Persistent: 1, Capacity: 2 << 30}))
}

// A job's stage-outs are registered at setup (deferred), so the instance is never released
// with them undone: a teardown without hurry is refused while one was never run or failed,
// and a stage-out that fails while the teardown waits for it undoes the teardown. Hurry
// discards them; data_out runs them.
func TestInstanceWithUnfinishedStageOutsIsNeverReleased(t *testing.T) {
	h := newHarness(t, "ssd1")
	out := []StageRequest{{Type: "file", PFSPath: "/pfs/result", DWVar: VarJobStriped, DWPath: "/result", Line: 3}}
	setup := jobSetup("21", 1<<30, "striped")
	setup.StageOut = out
	h.must(ApplySetup(h.w, setup, h, h.p, h.now))
	h.settle()
	id := h.w.SessionByToken("21").ID
	stages := h.w.StagesOf(id)
	if len(stages) != 1 || stages[0].Status != model.StageDeferred {
		t.Fatalf("stage-outs after setup: %+v, want one deferred", stages)
	}
	h.log = nil
	h.settle()
	for _, op := range h.log {
		if op == OpStartStage {
			t.Fatal("a deferred stage-out started before data_out")
		}
	}
	// post_run failed, say: no data_out. The teardown is refused.
	if err := ApplyTeardown(h.w, "21", false); err == nil || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "never run") {
		t.Fatalf("teardown with a stage-out never run: %v", err)
	}
	h.w.TakeChanges()
	// data_out runs it, and it fails; a teardown is refused again, naming the failure.
	h.stageResult = func(Effect) agentapi.StageStatus {
		return agentapi.StageStatus{Known: true, Status: model.StageFailed, Error: "stage_out: permission denied"}
	}
	h.must(ApplyStages(h.w, "21", model.StageOut, out, h, h.now))
	h.settle()
	if err := ApplyTeardown(h.w, "21", false); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("teardown with a failed stage-out: %v", err)
	}
	h.w.TakeChanges()
	// Retried, it is still to run when the teardown comes (the teardown waits for it); it
	// fails: the teardown is undone.
	h.stageResult = func(Effect) agentapi.StageStatus {
		return agentapi.StageStatus{Known: true, Status: model.StageFailed, Error: "stage_out: disk full"}
	}
	h.must(ApplyStages(h.w, "21", model.StageOut, out, h, h.now))
	h.must(ApplyTeardown(h.w, "21", false))
	h.settle()
	s := h.w.SessionByToken("21")
	if s == nil || s.State.Goal != model.GoalCreate || h.w.InstanceOf(s.ID) == nil {
		t.Fatalf("the session after its stage-out failed under a teardown: %+v", s)
	}
	if st := h.status("21", PhaseTeardown); !st.Failed || !strings.Contains(st.Message, "disk full") {
		t.Errorf("teardown status: %+v, want failed with the stage-out's error", st)
	}
	// Retried once more, it completes: now the teardown releases everything.
	h.stageResult = func(Effect) agentapi.StageStatus {
		return agentapi.StageStatus{Known: true, Status: model.StageComplete}
	}
	h.must(ApplyStages(h.w, "21", model.StageOut, out, h, h.now))
	h.settle()
	h.must(ApplyTeardown(h.w, "21", false))
	h.settle()
	assertEmpty(t, h.w)

	// Hurry discards stage-outs never run.
	h.must(ApplySetup(h.w, setup, h, h.p, h.now))
	h.settle()
	h.must(ApplyTeardown(h.w, "21", true))
	h.settle()
	assertEmpty(t, h.w)
}

// A gone run's session is finished as its run would have: unmounted, its stage-outs run, then
// released; kept (with the reason) when a stage-out fails; released at once when its job never
// started.
func TestAdvanceAbandonedFinishesLikeTheRun(t *testing.T) {
	h := newHarness(t, "ssd1")
	out := []StageRequest{{Type: "file", PFSPath: "/pfs/r", DWVar: VarJobStriped, DWPath: "/r", Line: 2}}
	setup := jobSetup("run5", 1<<30, "striped")
	setup.Creator, setup.StageOut = "RUN", out
	advance := func() bool {
		t.Helper()
		done, err := AdvanceAbandoned(h.w, "run5")
		if err != nil {
			t.Fatal(err)
		}
		h.w.TakeChanges()
		h.settle()
		return done
	}
	// Gone during its job.
	h.must(ApplySetup(h.w, setup, h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "run5", []string{"cn1"}, h, h.p))
	h.settle()
	for i := 0; i < 10 && !advance(); i++ {
	}
	assertEmpty(t, h.w)
	var started bool
	for _, op := range h.log {
		started = started || op == OpStartStage
	}
	if !started {
		t.Error("the gone run's stage-out was never run")
	}
	// Gone during its job, and the stage-out fails: kept.
	h.stageResult = func(Effect) agentapi.StageStatus {
		return agentapi.StageStatus{Known: true, Status: model.StageFailed, Error: "stage_out: no space"}
	}
	h.must(ApplySetup(h.w, setup, h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "run5", []string{"cn1"}, h, h.p))
	h.settle()
	done := false
	for i := 0; i < 10 && !done; i++ {
		done = advance()
	}
	s := h.w.SessionByToken("run5")
	if !done || s == nil || s.State.Goal != model.GoalCreate || !strings.Contains(s.Failure, "no space") {
		t.Fatalf("a gone run whose stage-out failed: done %v session %+v, want it kept with the reason", done, s)
	}
	h.must(ApplyTeardown(h.w, "run5", true))
	h.settle()
	assertEmpty(t, h.w)
	// Gone before its job: released at once, no stage-out.
	h.must(ApplySetup(h.w, setup, h, h.p, h.now))
	h.settle()
	if !advance() {
		t.Error("a gone run whose job never started is not finished in one step")
	}
	assertEmpty(t, h.w)
}

// An instance on several nodes is striped: its namespace is made with the instance's servers
// and the pool's stripe size, every mount order lists the fragments in id order, and private
// namespaces get their metadata servers spread over the fragments by compute node.
func TestStripedInstanceSpecs(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2", "ssd3")
	h.w.Pools["wlm_pool"].StripeSize = 1 << 20
	h.must(ApplySetup(h.w, jobSetup("43", 3<<30, "striped", "private"), h, h.p, h.now))
	var namespaces []agentapi.NamespaceSpec
	for i := 0; i < 20; i++ {
		for _, e := range Step(h.w, h.p, h.now) {
			if e.Op == OpCreateNamespace {
				namespaces = append(namespaces, e.Namespace)
			}
			Complete(h.w, e, Result{}, h.p, h.now)
		}
		h.w.TakeChanges()
	}
	inst := h.w.InstanceOf(h.w.SessionByToken("43").ID)
	frags := h.w.FragmentsOf(inst.ID)
	if len(frags) != 3 || len(namespaces) != 1 || namespaces[0].Servers != 3 || namespaces[0].StripeSize != 1<<20 {
		t.Fatalf("fragments %d, striped namespace specs %+v", len(frags), namespaces)
	}
	h.must(ApplyPreRun(h.w, "43", []string{"cn1", "cn2"}, h, h.p))
	h.settle()
	mds := map[int64]bool{}
	for _, node := range []string{"cn1", "cn2"} {
		mounts := LiveMounts(h.w, node)
		if len(mounts) != 2 {
			t.Fatalf("%s mounts %d configurations, want striped and private", node, len(mounts))
		}
		for _, m := range mounts {
			if len(m.Stripes) != 3 {
				t.Fatalf("%s: mount %s lists %d stripe servers", node, m.MountPath, len(m.Stripes))
			}
			for i, s := range m.Stripes {
				if s.FragmentID != frags[i].ID || s.Node != frags[i].Node {
					t.Errorf("%s: stripe server %d is %+v, want fragment %d on %s", node, i, s, frags[i].ID, frags[i].Node)
				}
			}
			if strings.Contains(m.MountPath, "private") {
				mds[m.FragmentID] = true
				if m.FragmentID != frags[spreadIndex(node, 3)].ID {
					t.Errorf("%s: private namespace on fragment %d, want the one its name picks", node, m.FragmentID)
				}
			}
		}
	}
	// A one-fragment instance is not striped.
	h.must(ApplySetup(h.w, jobSetup("44", 1<<30, "striped"), h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "44", []string{"cn1"}, h, h.p))
	h.settle()
	for _, m := range LiveMounts(h.w, "cn1") {
		if strings.Contains(m.MountPath, "44_") && m.Stripes != nil {
			t.Errorf("a one-fragment instance's mount lists stripe servers: %+v", m.Stripes)
		}
	}
}

// A loadbalance configuration on several nodes has a replica on each: every replica is
// staged in by its own node, and each compute node mounts the replica its name picks, with
// the others to fall over to.
func TestLoadbalanceReplicas(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2", "ssd3")
	h.must(ApplySetup(h.w, jobSetup("45", 3<<30, "loadbalance"), h, h.p, h.now))
	var created []agentapi.NamespaceSpec
	var stageNodes []string
	step := func() {
		for i := 0; i < 30; i++ {
			for _, e := range Step(h.w, h.p, h.now) {
				switch e.Op {
				case OpCreateNamespace:
					created = append(created, e.Namespace)
				case OpStartStage:
					stageNodes = append(stageNodes, e.Node)
				}
				r := Result{}
				if e.Op == OpPollStage {
					r.Stage = agentapi.StageStatus{Known: true, Status: model.StageComplete}
				}
				Complete(h.w, e, r, h.p, h.now)
			}
			h.w.TakeChanges()
			h.now = h.now.Add(time.Second)
		}
	}
	step()
	if len(created) != 3 {
		t.Fatalf("%d namespaces created, want a replica on each of 3 nodes", len(created))
	}
	for _, ns := range created {
		if ns.Servers != 0 {
			t.Errorf("a replica is striped: %+v", ns)
		}
	}
	h.must(ApplyStages(h.w, "45", model.StageIn, []StageRequest{
		{Type: "file", PFSPath: "/pfs/in.dat", DWVar: VarJobLoadbalance, DWPath: "/in.dat", Line: 3},
	}, h, h.now))
	step()
	sort.Strings(stageNodes)
	if strings.Join(stageNodes, ",") != "ssd1,ssd2,ssd3" {
		t.Errorf("stage-in ran on %v, want once on every server", stageNodes)
	}
	h.must(ApplyPreRun(h.w, "45", []string{"cn1", "cn2"}, h, h.p))
	h.settle()
	for _, node := range []string{"cn1", "cn2"} {
		mounts := LiveMounts(h.w, node)
		if len(mounts) != 1 || len(mounts[0].Replicas) != 3 || mounts[0].Stripes != nil {
			t.Fatalf("%s: %+v", node, mounts)
		}
		m := mounts[0]
		if m.Replicas[0].NamespaceID != m.NamespaceID || m.Replicas[0].Node != m.StorageNode {
			t.Errorf("%s: its own replica is not first: %+v", node, m.Replicas)
		}
	}
}

// A stage of a striped namespace on several servers is split: prepare on the metadata server,
// then copy on every other server at once, then finish on the metadata server; progress is
// summed over the servers. A copy that fails stops the others, the abort step removes what
// prepare created, and the stage fails with the copy's error.
func TestSplitStageRunsOnEveryServer(t *testing.T) {
	for _, failCopy := range []bool{false, true} {
		t.Run(fmt.Sprintf("copy-fails=%v", failCopy), func(t *testing.T) {
			h := newHarness(t, "ssd1", "ssd2", "ssd3")
			h.must(ApplySetup(h.w, jobSetup("46", 3<<30, "striped"), h, h.p, h.now))
			h.settle()
			h.must(ApplyStages(h.w, "46", model.StageIn, []StageRequest{
				{Type: "file", PFSPath: "/pfs/in.dat", DWVar: VarJobStriped, DWPath: "/in.dat", Line: 3},
			}, h, h.now))
			inst := h.w.InstanceOf(h.w.SessionByToken("46").ID)
			mdsNode := h.w.Fragments[h.w.NamespacesOf(h.w.ConfigurationByMode(inst.ID, model.AccessStriped).ID)[0].FragmentID].Node
			var runs []string // step@node, in the order started
			inCopy := map[string]bool{}
			concurrentCopies := 0
			h.stageResult = func(e Effect) agentapi.StageStatus {
				st := agentapi.StageStatus{Known: true, Status: model.StageComplete, FilesTotal: 1, FilesDone: 1, BytesTotal: 3 << 20, BytesDone: 1 << 20}
				if e.Stage.Part != nil && e.Stage.Part.Step == agentapi.StepCopy {
					concurrentCopies = max(concurrentCopies, len(inCopy))
					if failCopy && e.Node == map[bool]string{true: "ssd2", false: "ssd3"}[mdsNode == "ssd3"] {
						st.Status, st.Error = model.StageFailed, "cannot write: No space left on device"
					}
					delete(inCopy, e.Node)
				}
				return st
			}
			h.fail = func(e Effect) error {
				if e.Op == OpStartStage {
					if e.Stage.Part == nil {
						t.Fatalf("a stage of a 3-server striped namespace ran unsplit on %s", e.Node)
					}
					runs = append(runs, e.Stage.Part.Step+"@"+e.Node)
					if e.Stage.Part.Servers != 3 || e.Stage.Striped[VarJobStriped].Stripes == nil {
						t.Errorf("run %s: servers %d, mount %+v", runs[len(runs)-1], e.Stage.Part.Servers, e.Stage.Striped)
					}
					if e.Stage.Part.Step == agentapi.StepCopy {
						inCopy[e.Node] = true
					}
				}
				return nil
			}
			h.settle()
			st := h.w.StagesOf(h.w.SessionByToken("46").ID)[0]
			if len(runs) != 4 || runs[0] != "prepare@"+mdsNode || runs[3] != map[bool]string{false: "finish", true: "abort"}[failCopy]+"@"+mdsNode {
				t.Fatalf("runs %v; want prepare on %s, copy on the two others, then finish (or abort) on %s", runs, mdsNode, mdsNode)
			}
			copies := map[string]bool{}
			for _, r := range runs[1:3] {
				node, _ := strings.CutPrefix(r, "copy@")
				copies[node] = node != r && node != mdsNode
			}
			if len(copies) != 2 || !copies[runs[1][5:]] || !copies[runs[2][5:]] {
				t.Errorf("copies %v: want one on each server but the metadata server", runs[1:3])
			}
			if concurrentCopies != 2 {
				t.Errorf("at most %d copies ran at once, want 2", concurrentCopies)
			}
			if failCopy {
				if st.Status != model.StageFailed || !strings.Contains(st.Error, "No space left") || !strings.Contains(st.Error, "copying the stripes held by") {
					t.Fatalf("stage %s: %q", st.Status, st.Error)
				}
				return
			}
			if st.Status != model.StageComplete || st.BytesDone != 3<<20 || st.FilesDone != 1 {
				t.Fatalf("stage %s, %d bytes, %d files; want complete, 3 MiB summed over the servers, 1 file", st.Status, st.BytesDone, st.FilesDone)
			}
		})
	}
}

// max_mds=yes on a striped configuration over several nodes: a namespace shard on every
// fragment, each made striped; every mount (and the storage nodes' staging mounts) names all
// the shards in fragment order, the first being the namespace the mount is of.
func TestMaxMDSShards(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2", "ssd3")
	setup := jobSetup("46", 3<<30, "striped", "private")
	setup.Instance.MaxMDS = true
	h.must(ApplySetup(h.w, setup, h, h.p, h.now))
	var created []agentapi.NamespaceSpec
	var stages []agentapi.StageSpec
	var stageNodes []string
	step := func() {
		for i := 0; i < 30; i++ {
			for _, e := range Step(h.w, h.p, h.now) {
				switch e.Op {
				case OpCreateNamespace:
					created = append(created, e.Namespace)
				case OpStartStage:
					stages, stageNodes = append(stages, e.Stage), append(stageNodes, e.Node)
				}
				r := Result{}
				if e.Op == OpPollStage {
					r.Stage = agentapi.StageStatus{Known: true, Status: model.StageComplete}
				}
				Complete(h.w, e, r, h.p, h.now)
			}
			h.w.TakeChanges()
			h.now = h.now.Add(time.Second)
		}
	}
	step()
	inst := h.w.InstanceOf(h.w.SessionByToken("46").ID)
	frags := h.w.FragmentsOf(inst.ID)
	if len(frags) != 3 || len(created) != 3 {
		t.Fatalf("%d fragments, %d namespaces created; want a shard on each of 3", len(frags), len(created))
	}
	for i, ns := range created {
		if ns.Servers != 3 || ns.FragmentID != frags[i].ID {
			t.Errorf("shard %d: %+v, want striped over 3 on fragment %d", i, ns, frags[i].ID)
		}
	}
	if c := h.w.ConfigurationByMode(inst.ID, model.AccessPrivate); c.MaxMDS {
		t.Error("the private configuration is sharded too")
	}
	h.must(ApplyStages(h.w, "46", model.StageIn, []StageRequest{
		{Type: "file", PFSPath: "/pfs/in.dat", DWVar: VarJobStriped, DWPath: "/in.dat", Line: 3},
	}, h, h.now))
	step()
	// The stage is split like any striped one's: prepare and finish on the first shard's
	// node, a copy on each other; every run's staging mount names all the shards.
	if len(stages) != 4 || stageNodes[0] != frags[0].Node || stageNodes[3] != frags[0].Node {
		t.Fatalf("stage runs on %v, want prepare and finish on the first shard's node %s and a copy on each other", stageNodes, frags[0].Node)
	}
	for _, st := range stages {
		if sm := st.Striped[VarJobStriped]; len(sm.MDS) != 3 || sm.MDS[0].NamespaceID != sm.NamespaceID {
			t.Errorf("the staging mount does not name the shards: %+v", sm)
		}
	}
	h.must(ApplyPreRun(h.w, "46", []string{"cn1", "cn2"}, h, h.p))
	h.settle()
	for _, node := range []string{"cn1", "cn2"} {
		for _, m := range LiveMounts(h.w, node) {
			if strings.Contains(m.MountPath, "private") {
				if m.MDS != nil {
					t.Errorf("%s: the private mount has shards: %+v", node, m.MDS)
				}
				continue
			}
			if len(m.MDS) != 3 || len(m.Stripes) != 3 {
				t.Fatalf("%s: striped mount with %d shards and %d stripe servers, want 3 and 3", node, len(m.MDS), len(m.Stripes))
			}
			for i, s := range m.MDS {
				if s.FragmentID != frags[i].ID || s.Node != frags[i].Node {
					t.Errorf("%s: shard %d is %+v, want fragment %d on %s", node, i, s, frags[i].ID, frags[i].Node)
				}
			}
			if m.MDS[0].NamespaceID != m.NamespaceID || m.FragmentID != frags[0].ID {
				t.Errorf("%s: the mount's namespace is not the first shard: %+v", node, m)
			}
		}
	}
	// Teardown removes every shard.
	h.must(ApplyTeardown(h.w, "46", false))
	h.settle()
	for _, ns := range h.w.Namespaces {
		if h.w.Configurations[ns.ConfigurationID] != nil && h.w.Configurations[ns.ConfigurationID].InstanceID == inst.ID {
			t.Errorf("namespace %d survived the teardown", ns.ID)
		}
	}

	// One fragment: max_mds changes nothing. Without striped it is refused.
	one := jobSetup("47", 1<<30, "striped")
	one.Instance.MaxMDS = true
	h.must(ApplySetup(h.w, one, h, h.p, h.now))
	h.settle()
	inst = h.w.InstanceOf(h.w.SessionByToken("47").ID)
	if c := h.w.ConfigurationByMode(inst.ID, model.AccessStriped); c.MaxMDS || len(h.w.NamespacesOf(c.ID)) != 1 {
		t.Errorf("a one-fragment instance is sharded")
	}
	bad := jobSetup("48", 3<<30, "private")
	bad.Instance.MaxMDS = true
	if err := ApplySetup(h.w, bad, h, h.p, h.now); err == nil || !strings.Contains(err.Error(), "needs access_mode striped") {
		t.Errorf("max_mds without striped: %v", err)
	}
}

// A mount the world wants and has not recorded as made is expected on its node
// (agentapi.Assignment.Expected), so that an agent keeps it while a controller — perhaps a new
// leader whose predecessor asked for it and crashed before persisting the outcome — asks
// again; once made it is live, no longer expected.
func TestExpectedMountsUntilMade(t *testing.T) {
	h := newHarness(t, "ssd1")
	h.must(ApplySetup(h.w, jobSetup("46", 1<<30, "striped"), h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, "46", []string{"cn1"}, h, h.p))
	h.w.TakeChanges()
	var mountOps []Effect
	for _, e := range Step(h.w, h.p, h.now) {
		if e.Op == OpMount {
			mountOps = append(mountOps, e)
		}
	}
	if len(mountOps) != 1 {
		t.Fatalf("pre_run asked for %d mounts, want 1", len(mountOps))
	}
	expected := ExpectedMounts(h.w, "cn1")
	if len(expected) != 1 || expected[0] != mountOps[0].Mount.MountPath || len(LiveMounts(h.w, "cn1")) != 0 {
		t.Fatalf("while the mount is asked for: expected %v, live %v; want %s expected only", expected, LiveMounts(h.w, "cn1"), mountOps[0].Mount.MountPath)
	}
	if other := ExpectedMounts(h.w, "cn2"); len(other) != 0 {
		t.Errorf("another node is expected to have %v", other)
	}
	Complete(h.w, mountOps[0], Result{}, h.p, h.now)
	h.w.TakeChanges()
	if expected, live := ExpectedMounts(h.w, "cn1"), LiveMounts(h.w, "cn1"); len(expected) != 0 || len(live) != 1 {
		t.Fatalf("once made: expected %v, live %d mounts; want none expected and it live", expected, len(live))
	}
}
