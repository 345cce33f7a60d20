package lifecycle

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
)

// cacheJob sets up a cache job over two storage nodes (one fragment each) and mounts it on a
// compute node: a teardown unmounts it, flushes it and destroys it.
func cacheJob(t *testing.T, token string) (*harness, *model.Instance) {
	t.Helper()
	h := newHarness(t, "ssd1", "ssd2")
	cacheParams(h)
	req := cacheSetup(token, "/lustre/me/run", "striped")
	req.Instance.Capacity = 2 << 30
	h.must(ApplySetup(h.w, req, h, h.p, h.now))
	h.settle()
	h.must(ApplyPreRun(h.w, token, []string{"cn1"}, h, h.p))
	h.settle()
	inst := h.w.InstanceOf(h.w.SessionByToken(token).ID)
	if n := len(h.w.FragmentsOf(inst.ID)); n != 2 {
		t.Fatalf("%d fragments, want one on each node", n)
	}
	h.log = nil
	return h, inst
}

// fragmentOn is the instance's fragment on node.
func fragmentOn(w *World, inst *model.Instance, node string) *model.Fragment {
	for _, f := range w.FragmentsOf(inst.ID) {
		if f.Node == node {
			return f
		}
	}
	return nil
}

// TestCacheTeardownWaitsForFlush: a cache job's teardown flushes every fragment after its
// mounts are gone and before anything is deleted, polling each until its node says Done
// (recording the progress on the fragment), then destroys the instance.
func TestCacheTeardownWaitsForFlush(t *testing.T) {
	h, inst := cacheJob(t, "7")
	polls := map[ID]int{}
	h.flushResult = func(e Effect) agentapi.CacheFlushStatus {
		if e.Flush.Discard || e.Flush.InstanceID != inst.ID || e.Node != h.w.Fragments[e.Flush.FragmentID].Node {
			t.Errorf("flush order %+v to %s", e.Flush, e.Node)
		}
		f := h.w.Fragments[e.Flush.FragmentID]
		if polls[f.ID] > 0 && f.CacheDirty != 300-100*uint64(polls[f.ID]) {
			t.Errorf("poll %d of fragment %d: the last progress recorded is %d", polls[f.ID]+1, f.ID, f.CacheDirty)
		}
		if len(h.w.Activations) > 0 {
			t.Errorf("a flush while the instance is mounted")
		}
		for _, ns := range h.w.Namespaces {
			if ns.State.Goal != model.GoalCreate {
				t.Errorf("namespace %d is being destroyed during the flush", ns.ID)
			}
		}
		if st := h.status("7", PhaseTeardown); polls[f.ID] > 0 && !strings.HasPrefix(st.Message, "flushing the cache to /lustre/me/run: ") {
			t.Errorf("teardown status while flushing: %+v", st)
		}
		polls[f.ID]++
		dirty := 300 - 100*uint64(polls[f.ID])
		return agentapi.CacheFlushStatus{Done: dirty == 0, DirtyBytes: dirty, FlushedBytes: 300 - dirty}
	}
	h.must(ApplyTeardown(h.w, "7", false))
	h.settle()
	assertEmpty(t, h.w)
	if len(polls) != 2 {
		t.Fatalf("polls by fragment: %v", polls)
	}
	for id, n := range polls {
		if n != 3 {
			t.Errorf("fragment %d: %d polls, want 3 (two not done, then done)", id, n)
		}
	}
	firstFlush, lastFlush := slices.Index(h.log, OpFlushCache), -1
	for i, op := range h.log {
		if op == OpFlushCache {
			lastFlush = i
		}
	}
	if i := slices.Index(h.log, OpUnmount); i < 0 || i > firstFlush {
		t.Errorf("the flush must come after the unmount: %v", h.log)
	}
	for _, op := range []string{OpDeleteNamespace, OpDeleteFragment} {
		if i := slices.Index(h.log, op); i < lastFlush {
			t.Errorf("%s before the last flush poll: %v", op, h.log)
		}
	}
}

// TestCacheFlushFailureUndoesTeardown: a flush that fails keeps everything, as a failed
// stage-out does: the session back to created in data_out, its failure naming the node, the
// PFS directory, the error and the ways out. Torn down again (the PFS fixed) it goes.
func TestCacheFlushFailureUndoesTeardown(t *testing.T) {
	for _, out := range []string{"fixed", "hurry"} {
		t.Run(out, func(t *testing.T) {
			h, inst := cacheJob(t, "7")
			bad := fragmentOn(h.w, inst, "ssd2")
			h.fail = func(e Effect) error {
				if e.Op == OpFlushCache && e.Node == "ssd1" {
					return errors.New("connection reset") // pending its retry at the undo
				}
				return nil
			}
			h.flushResult = func(e Effect) agentapi.CacheFlushStatus {
				if e.Node == "ssd2" {
					return agentapi.CacheFlushStatus{DirtyBytes: 5 << 20, FlushedBytes: 1 << 20, Error: "pfs: no space left on device (ENOSPC) on /lustre/me/run/out.dat"}
				}
				return agentapi.CacheFlushStatus{Done: true, FlushedBytes: 1 << 20}
			}
			h.must(ApplyTeardown(h.w, "7", false))
			h.settle()
			s := h.w.SessionByToken("7")
			want := fmt.Sprintf("teardown undone, the instance is kept: the cache on storage node ssd2 (fragment %d) could not flush to /lustre/me/run: "+
				"pfs: no space left on device (ENOSPC) on /lustre/me/run/out.dat; 5242880 bytes (5MiB) not yet on the PFS are kept. "+
				"Fix the PFS (space, quota, permissions, reachability) and tear down again, or tear down with --hurry to discard 5242880 bytes (5MiB)", bad.ID)
			if s == nil || s.State != model.Created() || s.Phase != PhaseDataOut || s.Failure != want {
				t.Fatalf("session %+v\nwant failure %s", s, want)
			}
			if st := h.status("7", PhaseTeardown); !st.Failed || st.Message != want {
				t.Errorf("teardown status %+v", st)
			}
			if inst.State != model.Created() || len(h.w.FragmentsOf(inst.ID)) != 2 || len(h.w.Namespaces) != 1 {
				t.Fatalf("the instance must be whole: %+v, %d fragments, %d namespaces", inst.State, len(h.w.FragmentsOf(inst.ID)), len(h.w.Namespaces))
			}
			for _, ns := range h.w.Namespaces {
				if ns.State != model.Created() {
					t.Fatalf("namespace %+v", ns.State)
				}
			}
			if bad.CacheFlushError == "" || bad.CacheFlushed || bad.CacheDirty != 5<<20 {
				t.Fatalf("the failed fragment: %+v", bad)
			}
			for _, f := range h.w.FragmentsOf(inst.ID) {
				if f.State != model.Created() {
					t.Fatalf("fragment on %s after the undo: %+v", f.Node, f.State)
				}
			}
			h.fail = func(Effect) error { return nil }
			for _, op := range []string{OpDeleteNamespace, OpDeleteFragment} {
				if slices.Contains(h.log, op) {
					t.Fatalf("%s during a teardown that was undone: %v", op, h.log)
				}
			}
			if Step(h.w, h.p, h.now); h.w.SessionByToken("7").State != model.Created() {
				t.Fatal("an undone teardown must stay undone")
			}
			h.w.TakeChanges()
			var discards []agentapi.CacheFlushSpec
			h.flushResult = func(e Effect) agentapi.CacheFlushStatus {
				if out == "hurry" {
					discards = append(discards, e.Flush)
					if e.Node == "ssd2" {
						return agentapi.CacheFlushStatus{Done: true, DiscardedBytes: 5 << 20}
					}
				}
				return agentapi.CacheFlushStatus{Done: true}
			}
			var report string
			h.fail = func(e Effect) error {
				if e.Op == OpDeleteNamespace {
					report = h.w.SessionByToken("7").Failure
				}
				return nil
			}
			h.must(ApplyTeardown(h.w, "7", out == "hurry"))
			if f := h.w.Fragments[bad.ID]; f.CacheFlushError != "" || h.w.SessionByToken("7").Failure != "" {
				t.Fatalf("a new teardown starts the flush afresh: %+v", f)
			}
			h.settle()
			assertEmpty(t, h.w)
			switch out {
			case "fixed":
				if report != "" {
					t.Errorf("report %q", report)
				}
			case "hurry":
				if len(discards) != 2 || !discards[0].Discard || !discards[1].Discard {
					t.Errorf("flushes with hurry %+v", discards)
				}
				if report != "teardown with hurry: 5242880 bytes (5MiB) of cache data not yet on the PFS (/lustre/me/run) discarded" {
					t.Errorf("report %q", report)
				}
			}
		})
	}
}

// TestCacheTeardownHurryDiscards: a teardown with hurry asks every fragment to discard its
// data and reports the bytes on the session (for the rest of the teardown) and on the
// instance (its accounting record).
func TestCacheTeardownHurryDiscards(t *testing.T) {
	h, inst := cacheJob(t, "7")
	h.flushResult = func(e Effect) agentapi.CacheFlushStatus {
		if !e.Flush.Discard {
			t.Errorf("flush without discard in a hurried teardown: %+v", e.Flush)
		}
		if e.Node == "ssd1" {
			return agentapi.CacheFlushStatus{Done: true, DiscardedBytes: 3 << 20}
		}
		return agentapi.CacheFlushStatus{Done: true, DiscardedBytes: 1000}
	}
	var report string
	var recorded uint64
	h.fail = func(e Effect) error {
		if e.Op == OpDeleteNamespace {
			report, recorded = h.w.SessionByToken("7").Failure, h.w.Instances[inst.ID].CacheDiscarded
		}
		return nil
	}
	h.must(ApplyTeardown(h.w, "7", true))
	h.settle()
	assertEmpty(t, h.w)
	if want := "teardown with hurry: 3146728 bytes (3MiB) of cache data not yet on the PFS (/lustre/me/run) discarded"; report != want {
		t.Errorf("report %q\nwant   %q", report, want)
	}
	if recorded != 3<<20+1000 {
		t.Errorf("the instance records %d bytes discarded", recorded)
	}
	if n := strings.Count(strings.Join(h.log, " "), OpFlushCache); n != 2 {
		t.Errorf("%d flush calls: %v", n, h.log)
	}
}

// TestCacheFlushOfflineNode: a fragment whose node is offline is not waited for: its data
// is reported lost (with what the node last reported), the others are flushed, and the
// instance goes.
func TestCacheFlushOfflineNode(t *testing.T) {
	h, inst := cacheJob(t, "7")
	lost := fragmentOn(h.w, inst, "ssd2")
	h.flushResult = func(e Effect) agentapi.CacheFlushStatus {
		if e.Node == "ssd2" {
			return agentapi.CacheFlushStatus{DirtyBytes: 7 << 20}
		}
		return agentapi.CacheFlushStatus{Done: true}
	}
	h.must(ApplyTeardown(h.w, "7", false))
	for range 3 { // the unmount, then polls
		h.stepOnce()
	}
	if f := h.w.Fragments[lost.ID]; f == nil || f.CacheDirty != 7<<20 || f.CacheFlushed {
		t.Fatalf("ssd2's fragment while it flushes: %+v", f)
	}
	if st := h.status("7", PhaseTeardown); st.Done || st.Failed || st.Message != "flushing the cache to /lustre/me/run: 7MiB not yet on the PFS (1 of its storage nodes to finish)" {
		t.Fatalf("teardown status %+v", st)
	}
	h.w.Nodes["ssd2"].Online = false
	var report string
	var recorded []string
	h.fail = func(e Effect) error {
		if e.Op == OpFlushCache && e.Node == "ssd2" {
			t.Errorf("a flush sent to an offline node")
		}
		if e.Op == OpDeleteNamespace || e.Op == OpDeleteFragment && report == "" {
			report, recorded = h.w.SessionByToken("7").Failure, h.w.Instances[inst.ID].CacheLost
		}
		return nil
	}
	h.settle()
	assertEmpty(t, h.w)
	want := fmt.Sprintf("fragment %d: storage node ssd2 offline: its unflushed data (last reported 7340032 bytes, 7MiB) is lost", lost.ID)
	if report != want || len(recorded) != 1 || recorded[0] != want {
		t.Errorf("report %q, recorded %q\nwant %q", report, recorded, want)
	}
}

// TestCacheFlushCallRetried: a flush whose agent call fails is tried again after the backoff;
// a node that keeps failing it undoes the teardown (without hurry) or, with hurry, its data
// goes with its fragment, said so.
func TestCacheFlushCallRetried(t *testing.T) {
	h, inst := cacheJob(t, "7")
	calls := 0
	h.fail = func(e Effect) error {
		if e.Op != OpFlushCache || e.Node != "ssd2" {
			return nil
		}
		calls++
		if calls <= 2 {
			if f := h.w.Fragments[e.Flush.FragmentID]; calls == 2 && (f.State.Attempts != 1 || !strings.Contains(f.State.Error, "connection refused")) {
				t.Errorf("the first failure is not recorded: %+v", f.State)
			}
			return errors.New("connection refused")
		}
		return nil
	}
	h.must(ApplyTeardown(h.w, "7", false))
	h.settle()
	assertEmpty(t, h.w)
	if calls != 3 {
		t.Fatalf("%d flush calls to ssd2, want 2 failed and 1 done", calls)
	}

	for _, hurry := range []bool{false, true} {
		h, inst = cacheJob(t, "8")
		bad := fragmentOn(h.w, inst, "ssd2")
		h.fail = func(e Effect) error {
			if e.Op == OpFlushCache && e.Node == "ssd2" {
				return errors.New("agent: internal error")
			}
			return nil
		}
		var report string
		if hurry {
			h.fail = func(e Effect) error {
				if e.Op == OpDeleteNamespace {
					report = h.w.SessionByToken("8").Failure
				}
				if e.Op == OpFlushCache && e.Node == "ssd2" {
					return errors.New("agent: internal error")
				}
				return nil
			}
		}
		h.must(ApplyTeardown(h.w, "8", hurry))
		h.settle()
		if !hurry {
			s := h.w.SessionByToken("8")
			if s == nil || s.State != model.Created() || !strings.Contains(s.Failure, "could not flush to /lustre/me/run: the storage node did not answer the flush 3 times: agent: internal error") {
				t.Fatalf("a node that keeps failing the flush: %+v", s)
			}
			if f := h.w.Fragments[bad.ID]; f.State != model.Created() {
				t.Fatalf("the fragment's fuse must not stay blown: the next teardown tries again: %+v", f.State)
			}
			continue
		}
		assertEmpty(t, h.w)
		want := fmt.Sprintf("fragment %d: storage node ssd2 could not discard its unflushed data (never reported): it is deleted with the fragment; "+
			"the storage node did not answer the flush 3 times: agent: internal error", bad.ID)
		if report != want {
			t.Errorf("report %q\nwant   %q", report, want)
		}
	}
}

// noAnswerError is a node that does not answer (Result.NoAnswer, as the executor marks a
// remote agent's connection refused or timeout).
type noAnswerError string

func (e noAnswerError) Error() string { return string(e) }

// TestCacheFlushNodeNotAnswering: a node whose agent does not answer the flush at all (down
// or restarting, not yet offline) does not fail the teardown, whatever the attempts: its
// flush is asked again until the node answers (an agent restarted drains on), or is found
// offline, when its data is reported lost and the teardown goes on.
func TestCacheFlushNodeNotAnswering(t *testing.T) {
	for _, back := range []bool{true, false} {
		h, inst := cacheJob(t, "7")
		silent := fragmentOn(h.w, inst, "ssd2")
		calls := 0
		var report string
		h.fail = func(e Effect) error {
			if e.Op == OpDeleteNamespace && report == "" {
				report = h.w.SessionByToken("7").Failure
			}
			if e.Op != OpFlushCache || e.Node != "ssd2" {
				return nil
			}
			calls++
			if calls == 3*h.p.MaxAttempts {
				if back {
					return nil // the agent restarted: it answers
				}
				h.w.Nodes["ssd2"].Online = false
			}
			return noAnswerError("dial tcp: connection refused")
		}
		h.must(ApplyTeardown(h.w, "7", false))
		h.settle()
		if s := h.w.SessionByToken("7"); s != nil {
			t.Fatalf("back=%v: the teardown must not be undone by a node that does not answer: %+v", back, s)
		}
		assertEmpty(t, h.w)
		if calls < 3*h.p.MaxAttempts {
			t.Errorf("back=%v: %d flush calls to ssd2, want it asked on past max_attempts (%d)", back, calls, h.p.MaxAttempts)
		}
		want := fmt.Sprintf("fragment %d: storage node ssd2 offline: its unflushed data (never reported) is lost", silent.ID)
		if back && report != "" || !back && report != want {
			t.Errorf("back=%v: report %q", back, report)
		}
	}
	// A hurry ends the wait: the node's data goes with its fragment, said so.
	h, inst := cacheJob(t, "7")
	silent := fragmentOn(h.w, inst, "ssd2")
	calls := 0
	var report string
	h.fail = func(e Effect) error {
		if e.Op == OpDeleteNamespace && report == "" {
			report = h.w.SessionByToken("7").Failure
		}
		if e.Op != OpFlushCache || e.Node != "ssd2" {
			return nil
		}
		if calls++; calls == 3*h.p.MaxAttempts {
			h.must(ApplyTeardown(h.w, "7", true))
		}
		return noAnswerError("dial tcp: connection refused")
	}
	h.must(ApplyTeardown(h.w, "7", false))
	h.settle()
	assertEmpty(t, h.w)
	if want := fmt.Sprintf("fragment %d: storage node ssd2 could not discard its unflushed data (never reported)", silent.ID); !strings.HasPrefix(report, want) {
		t.Errorf("hurry: report %q, want %q...", report, want)
	}
}

// TestPersistentCacheDestroyFlushes: destroying a persistent cache instance flushes it too.
func TestPersistentCacheDestroyFlushes(t *testing.T) {
	h := newHarness(t, "ssd1")
	cacheParams(h)
	create := cacheSetup("proj", "/gpfs/proj/a", "striped")
	create.Persistent = true
	h.must(ApplySetup(h.w, create, h, h.p, h.now))
	h.settle()
	polls := 0
	h.flushResult = func(e Effect) agentapi.CacheFlushStatus {
		polls++
		return agentapi.CacheFlushStatus{Done: polls == 2, DirtyBytes: uint64(2-polls) * 100}
	}
	h.must(ApplyTeardown(h.w, "proj", false))
	h.settle()
	assertEmpty(t, h.w)
	if polls != 2 {
		t.Fatalf("%d flush polls", polls)
	}
	i := slices.Index(h.log, OpFlushCache)
	if j := slices.Index(h.log, OpDeleteNamespace); i < 0 || j < i {
		t.Fatalf("effects %v", h.log)
	}
}

// TestScratchTeardownFlushesNothing: a scratch instance has nothing to flush.
func TestScratchTeardownFlushesNothing(t *testing.T) {
	h := newHarness(t, "ssd1")
	h.must(ApplySetup(h.w, jobSetup("1", 1<<30), h, h.p, h.now))
	h.settle()
	h.must(ApplyTeardown(h.w, "1", false))
	h.settle()
	assertEmpty(t, h.w)
	if slices.Contains(h.log, OpFlushCache) {
		t.Fatalf("a scratch teardown flushed: %v", h.log)
	}
}
