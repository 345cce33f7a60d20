package lifecycle

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

func cacheParams(h *harness) {
	h.p.Cache = CacheParams{AllowedPFS: []string{"/lustre", "/gpfs/proj"},
		Defaults: model.CacheSettings{ModifiedThreshold: 64 << 20, ReadAhead: 4 << 20, HighWatermark: 45, LowWatermark: 20}}
}

func cacheSetup(token, pfs string, modes ...string) Setup {
	return Setup{Token: token, Creator: "SLURM", Owner: 1001, Group: 1002,
		Instance: &InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: model.TypeCache, AccessModes: modes, Cache: &CacheRequest{PFS: pfs}}}
}

func u64(v uint64) *uint64 { return &v }
func yes() *bool           { b := true; return &b }

// TestCacheSetupRefusals: every check of a cache request, with its exact words; a refused
// request changes nothing.
func TestCacheSetupRefusals(t *testing.T) {
	h := newHarness(t, "ssd1")
	cacheParams(h)
	scratchWithPFS := jobSetup("1", 1<<30)
	scratchWithPFS.Instance.Cache = &CacheRequest{PFS: "/lustre/x"}
	cases := []struct {
		req  Setup
		want string
	}{
		{cacheSetup("1", ""), "type=cache needs pfs=<absolute PFS directory to cache>"},
		{cacheSetup("1", "lustre/me"), "pfs=lustre/me: the PFS directory must be absolute and in clean form (no .., no //, no trailing /); write pfs=/lustre/me"},
		{cacheSetup("1", "/lustre/me/../other"), "pfs=/lustre/me/../other: the PFS directory must be absolute and in clean form (no .., no //, no trailing /); write pfs=/lustre/other"},
		{cacheSetup("1", "/lustre/me", "striped", "private"), "access_mode=private is not available for type=cache (as in DataWarp): a cache's files are the PFS directory's, which every compute node sees; use access_mode=striped or access_mode=loadbalance"},
		{cacheSetup("1", "/home/me"), "pfs=/home/me is outside the directories this site allows for cache instances ([cache] allowed_pfs: /lustre, /gpfs/proj); choose a directory under one of them, or ask the administrator to add it"},
		{cacheSetup("1", "/lustre2/me"), "pfs=/lustre2/me is outside the directories this site allows for cache instances ([cache] allowed_pfs: /lustre, /gpfs/proj); choose a directory under one of them, or ask the administrator to add it"},
		{cacheSetup("1", "/gpfs"), "pfs=/gpfs is outside the directories this site allows for cache instances ([cache] allowed_pfs: /lustre, /gpfs/proj); choose a directory under one of them, or ask the administrator to add it"},
		{scratchWithPFS, "pfs= and the cache tunables are only for type=cache: a scratch instance starts empty; remove them, or use type=cache"},
	}
	for _, c := range cases {
		err := ApplySetup(h.w, c.req, h, h.p, h.now)
		var ue *UserError
		if !errors.As(err, &ue) || err.Error() != c.want {
			t.Errorf("%+v:\ngot  %v\nwant %s", c.req.Instance.Cache, err, c.want)
		}
		if !h.w.TakeChanges().Empty() {
			t.Errorf("a refused request must change nothing")
		}
	}
	// No site list: nothing is allowed.
	h.p.Cache.AllowedPFS = nil
	want := "pfs=/lustre/me: this site allows no PFS directory for cache instances yet ([cache] allowed_pfs is empty); ask the administrator to list the PFS directories users may cache"
	if err := ApplySetup(h.w, cacheSetup("1", "/lustre/me"), h, h.p, h.now); err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	// A one-machine home allows "/".
	if !AllowedPFS([]string{"/"}, "/any/where") || AllowedPFS([]string{"/a/b"}, "/a/bc") || !AllowedPFS([]string{"/a/b"}, "/a/b/c") {
		t.Error("AllowedPFS")
	}
}

// TestScratchAndCacheRequest: a job's second instance is checked like the first, two of one
// type are refused, and the user quota counts both.
func TestScratchAndCacheRequest(t *testing.T) {
	h := newHarness(t, "ssd1")
	cacheParams(h)
	cases := []struct {
		more InstanceRequest
		want string
	}{
		{*cacheSetup("1", "/home/me").Instance, "pfs=/home/me is outside the directories this site allows for cache instances ([cache] allowed_pfs: /lustre, /gpfs/proj); choose a directory under one of them, or ask the administrator to add it"},
		{*jobSetup("1", 1<<30).Instance, "type=scratch: a job may hold one instance of each type (a scratch and a cache); put all the capacity of one type into one #DW jobdw"},
	}
	for _, c := range cases {
		req := jobSetup("1", 1<<30, "striped")
		req.More = []InstanceRequest{c.more}
		if err := ApplySetup(h.w, req, h, h.p, h.now); err == nil || err.Error() != c.want {
			t.Errorf("got %v\nwant %s", err, c.want)
		}
	}
	req := jobSetup("1", 1<<30, "striped")
	req.More = []InstanceRequest{*cacheSetup("1", "/lustre/me").Instance}
	if err := CheckUserQuota(h.w, req, Quota{Capacity: 3 << 29}); err == nil || err.Error() != "uid 1001 holds 0B of instances; 2GiB more would pass its limit of 1.5GiB (controller.max_capacity_per_user)" {
		t.Errorf("quota: %v", err)
	}
	persistent := cacheSetup("p", "/lustre/me")
	persistent.Persistent = true
	persistent.More = []InstanceRequest{*jobSetup("p", 1<<30).Instance}
	if err := ApplySetup(h.w, persistent, h, h.p, h.now); err == nil || err.Error() != "create_persistent p: a persistent instance is one instance" {
		t.Errorf("persistent pair: %v", err)
	}
}

// TestScratchAndCacheJob (issue 20 item 10): a job holding a scratch and a cache instance
// has both placed, each with its own configurations, variables and mount; stages go to the
// scratch one; a second job's quota counts both; teardown removes both, and the session
// only when both are gone.
func TestScratchAndCacheJob(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	cacheParams(h)
	req := jobSetup("9", 2<<30, "striped")
	req.More = []InstanceRequest{*cacheSetup("9", "/lustre/me/run").Instance}
	h.must(ApplySetup(h.w, req, h, h.p, h.now))
	if st := h.status("9", PhaseSetup); st.Done {
		t.Fatal("setup done before the fragments exist")
	}
	h.settle()
	if st := h.status("9", PhaseSetup); !st.Done || st.Failed {
		t.Fatalf("setup: %+v", st)
	}
	s := h.w.SessionByToken("9")
	insts := h.w.InstancesOf(s.ID)
	if len(insts) != 2 || insts[0].Requested != 2<<30 || insts[1].Requested != 1<<30 {
		t.Fatalf("instances: %+v", insts)
	}
	for i, typ := range []string{model.TypeScratch, model.TypeCache} {
		confs := h.w.ConfigurationsOf(insts[i].ID)
		if len(confs) != 1 || confs[0].Type != typ || !insts[i].State.Actualized {
			t.Fatalf("instance %d: %+v %+v", i, insts[i], confs)
		}
	}
	if err := CheckUserQuota(h.w, jobSetup("10", 1<<30), Quota{Capacity: 3 << 30}); err == nil ||
		err.Error() != "uid 1001 holds 3GiB of instances; 1GiB more would pass its limit of 3GiB (controller.max_capacity_per_user)" {
		t.Errorf("quota: %v", err)
	}
	env, err := Paths(h.w, "9", h.p.MountRoot)
	if err != nil || len(env) != 2 || env["DW_JOB_STRIPED"] != "/mnt/bb/9_striped_scratch/" || env["DW_JOB_STRIPED_CACHE"] != "/mnt/bb/9_striped_cache/" {
		t.Fatalf("paths: %v %v", env, err)
	}
	h.must(ApplyStages(h.w, "9", model.StageIn, []StageRequest{{Type: "file", PFSPath: "/pfs/in", DWVar: VarJobStriped, DWPath: "/in"}}, h, h.now))
	for _, st := range h.w.StagesOf(s.ID) {
		if c := h.w.Configurations[st.ConfigurationID]; c == nil || c.Type != model.TypeScratch {
			t.Fatalf("stage-in into %+v", c)
		}
	}
	h.settle()
	if st := h.status("9", PhaseDataIn); !st.Done || st.Failed {
		t.Fatalf("data_in: %+v", st)
	}
	var mounts []agentapi.MountSpec
	h.fail = func(e Effect) error {
		if e.Op == OpMount {
			mounts = append(mounts, e.Mount)
		}
		return nil
	}
	h.must(ApplyPreRun(h.w, "9", []string{"cn1"}, h, h.p))
	h.settle()
	if len(mounts) != 2 {
		t.Fatalf("mounts: %+v", mounts)
	}
	byPath := map[string]agentapi.MountSpec{}
	for _, m := range mounts {
		byPath[m.MountPath] = m
	}
	if m := byPath["/mnt/bb/9_striped_scratch"]; m.Cache != nil || m.InstanceID != insts[0].ID {
		t.Errorf("scratch mount %+v", m)
	}
	if m := byPath["/mnt/bb/9_striped_cache"]; m.Cache == nil || m.Cache.PFS != "/lustre/me/run" || m.InstanceID != insts[1].ID {
		t.Errorf("cache mount %+v", m)
	}
	h.must(ApplyPostRun(h.w, "9"))
	h.settle()
	// One instance's storage node goes away: teardown still removes both, then the session.
	h.w.Nodes[h.w.FragmentsOf(insts[1].ID)[0].Node].Online = false
	h.must(ApplyTeardown(h.w, "9", false))
	h.settle()
	if st := h.status("9", PhaseTeardown); !st.Done {
		t.Fatalf("teardown: %+v", st)
	}
	assertEmpty(t, h.w)
}

// TestCacheInstanceRecordsAndMountOrder follows a cache instance past the switch: its
// configuration is type cache with the backing path and the tunables (the site's defaults
// filled in), the job's variable is DW_JOB_STRIPED_CACHE, the mount order carries the cache,
// and all of it survives the state's and the API's JSON.
func TestCacheInstanceRecordsAndMountOrder(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	cacheParams(h)
	req := cacheSetup("7", "/lustre/me/run", "striped")
	req.Instance.Cache.ReadAhead = u64(0)
	req.Instance.Cache.SyncOnClose = yes()
	var fragments []agentapi.FragmentSpec
	var namespaces []agentapi.NamespaceSpec
	h.fail = func(e Effect) error {
		switch e.Op {
		case OpCreateFragment:
			fragments = append(fragments, e.Fragment)
		case OpCreateNamespace:
			namespaces = append(namespaces, e.Namespace)
		}
		return nil
	}
	h.must(ApplySetup(h.w, req, h, h.p, h.now))
	h.settle()
	// Every storage node of the instance learns what it caches: the stripe servers (every
	// fragment) and the namespace server.
	wantSpec := agentapi.CacheSpec{PFS: "/lustre/me/run", ModifiedThreshold: 64 << 20, SyncOnClose: true, HighWatermark: 45, LowWatermark: 20, UID: 1001, GID: 1002,
		Servers: 1, StripeSize: stripe.DefaultSize}
	if len(fragments) != 1 || len(namespaces) != 1 {
		t.Fatalf("creates: %+v %+v", fragments, namespaces)
	}
	// Even on one node a cache's data is in stripe objects (one data path): a layout of one.
	if namespaces[0].Servers != 1 || namespaces[0].StripeSize == 0 {
		t.Errorf("namespace order: servers %d stripe size %d, want a layout over the one fragment", namespaces[0].Servers, namespaces[0].StripeSize)
	}
	for _, f := range fragments {
		if f.Cache == nil || *f.Cache != wantSpec {
			t.Errorf("fragment %d's order: cache %+v", f.ID, f.Cache)
		}
	}
	if namespaces[0].Cache == nil || *namespaces[0].Cache != wantSpec {
		t.Errorf("namespace order: cache %+v", namespaces[0].Cache)
	}
	inst := h.w.InstanceOf(h.w.SessionByToken("7").ID)
	confs := h.w.ConfigurationsOf(inst.ID)
	if len(confs) != 1 {
		t.Fatalf("configurations: %+v", confs)
	}
	c := confs[0]
	want := model.CacheSettings{PFS: "/lustre/me/run", ModifiedThreshold: 64 << 20, ReadAhead: 0, SyncOnClose: true, HighWatermark: 45, LowWatermark: 20}
	if c.Type != model.TypeCache || c.BackingPath != "/lustre/me/run" || c.Cache == nil || *c.Cache != want {
		t.Fatalf("configuration: %+v cache %+v", c, c.Cache)
	}
	raw, _ := json.Marshal(c)
	var back model.Configuration
	if err := json.Unmarshal(raw, &back); err != nil || !reflect.DeepEqual(&back, c) {
		t.Fatalf("state round trip: %s -> %+v", raw, back)
	}

	env, err := Paths(h.w, "7", h.p.MountRoot)
	if err != nil || len(env) != 1 || env["DW_JOB_STRIPED_CACHE"] != "/mnt/bb/7_striped_cache/" {
		t.Fatalf("paths: %v %v", env, err)
	}
	if err := ApplyStages(h.w, "7", model.StageIn, []StageRequest{{Type: "file", PFSPath: "/lustre/x", DWVar: VarJobStriped, DWPath: "/x"}}, h, h.now); err == nil ||
		err.Error() != "data_in line 0: $DW_JOB_STRIPED: the instance is type=cache, which is not staged: it reads and writes its pfs= directory itself; stage into a scratch instance" {
		t.Errorf("stage into a cache: %v", err)
	}
	// libdatawarp's and dwcli's stages of a cache path are refused the same way (EINVAL).
	for _, r := range []InJobStage{
		{Direction: model.StageOut, Type: model.StageFile, DWVar: "DW_JOB_STRIPED_CACHE", DWPath: "/x", PFSPath: "/lustre/x"},
		{Direction: model.StageIn, Type: model.StageDir, DWVar: "DW_JOB_STRIPED_CACHE", DWPath: "/", PFSPath: "/lustre/d"},
	} {
		err := ApplyInJobStages(h.w, "7", []InJobStage{r}, h, h.now)
		var ue *UserError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "a cache instance is not staged") {
			t.Errorf("in-job stage %s of a cache path: %v, want a user error", r.Direction, err)
		}
	}
	h.w.TakeChanges()

	var mounts []agentapi.MountSpec
	h.fail = func(e Effect) error {
		if e.Op == OpMount {
			mounts = append(mounts, e.Mount)
		}
		return nil
	}
	h.must(ApplyPreRun(h.w, "7", []string{"cn1"}, h, h.p))
	h.settle()
	if len(mounts) != 1 || mounts[0].Cache == nil || len(mounts[0].Stripes) != 1 {
		t.Fatalf("mounts: %+v", mounts)
	}
	if *mounts[0].Cache != wantSpec || mounts[0].Owner != 1001 {
		t.Fatalf("mount order cache: %+v", *mounts[0].Cache)
	}
	raw, _ = json.Marshal(mounts[0])
	var spec agentapi.MountSpec
	if err := json.Unmarshal(raw, &spec); err != nil || spec.Cache == nil || *spec.Cache != wantSpec {
		t.Fatalf("API round trip: %s", raw)
	}
	h.must(ApplyTeardown(h.w, "7", false))
	h.settle()
	assertEmpty(t, h.w)
}

// TestPersistentCache: a persistent cache instance, used by a job, is named
// DW_PERSISTENT_CACHE_STRIPED_<name>; created again with another pfs= it is refused.
func TestPersistentCache(t *testing.T) {
	h := newHarness(t, "ssd1")
	cacheParams(h)
	create := cacheSetup("proj", "/gpfs/proj/a", "striped")
	create.Persistent = true
	h.must(ApplySetup(h.w, create, h, h.p, h.now))
	h.settle()
	again := cacheSetup("proj", "/gpfs/proj/b", "striped")
	again.Persistent = true
	if err := ApplySetup(h.w, again, h, h.p, h.now); err == nil || err.Error() != `persistent instance "proj" already exists with pfs /gpfs/proj/a, not /gpfs/proj/b; destroy it first, or create it with the same parameters` {
		t.Errorf("create again: %v", err)
	}
	h.must(ApplySetup(h.w, Setup{Token: "8", Owner: 1001, Uses: []string{"proj"}}, h, h.p, h.now))
	h.settle()
	env, err := Paths(h.w, "8", h.p.MountRoot)
	if err != nil || len(env) != 1 || env["DW_PERSISTENT_CACHE_STRIPED_proj"] != "/mnt/bb/proj_8_striped_cache/" {
		t.Fatalf("paths: %v %v", env, err)
	}
}

// TestScratchAndCacheTeardownWaitsForBoth: the session stays until both its instances are
// gone; one whose fragment cannot be deleted keeps it (for an operator), the other goes.
func TestScratchAndCacheTeardownWaitsForBoth(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	cacheParams(h)
	req := jobSetup("9", 1<<30, "striped")
	req.Instance.Strategy = "bandwidth"
	req.More = []InstanceRequest{*cacheSetup("9", "/lustre/me/run").Instance}
	h.must(ApplySetup(h.w, req, h, h.p, h.now))
	h.settle()
	s := h.w.SessionByToken("9")
	insts := h.w.InstancesOf(s.ID)
	cacheID := insts[1].ID
	h.fail = func(e Effect) error {
		if e.Op == OpDeleteFragment && e.Fragment.InstanceID == cacheID {
			return errors.New("disk busy")
		}
		return nil
	}
	h.must(ApplyTeardown(h.w, "9", false))
	h.settle()
	left := h.w.InstancesOf(s.ID)
	if h.w.SessionByToken("9") == nil || len(left) != 1 || left[0].ID != cacheID {
		t.Fatalf("session %v, instances left %+v", h.w.SessionByToken("9"), left)
	}
	h.fail = func(Effect) error { return nil }
	clearFuses(h.w)
	h.settle()
	assertEmpty(t, h.w)
}

// TestScratchAndCacheSetupFailsForEither: setup fails when the fragment of either instance
// cannot be made (its fuse blows); a stage list goes to the scratch instance.
func TestScratchAndCacheSetupFailsForEither(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	cacheParams(h)
	req := jobSetup("9", 1<<30, "striped")
	req.More = []InstanceRequest{*cacheSetup("9", "/lustre/me/run").Instance}
	h.must(ApplySetup(h.w, req, h, h.p, h.now))
	s := h.w.SessionByToken("9")
	cacheID := h.w.InstancesOf(s.ID)[1].ID
	h.fail = func(e Effect) error {
		if e.Op == OpCreateFragment && e.Fragment.InstanceID == cacheID {
			return errors.New("no space on the SSD")
		}
		return nil
	}
	h.settle()
	if st := h.status("9", PhaseSetup); !st.Failed || st.Done {
		t.Fatalf("setup with the cache's fragment failing: %+v", st)
	}
	h.must(ApplyStages(h.w, "9", model.StageIn, []StageRequest{{Type: "list", PFSPath: "/pfs/list"}}, h, h.now))
	for _, st := range h.w.StagesOf(s.ID) {
		if c := h.w.Configurations[st.ConfigurationID]; c == nil || c.Type != model.TypeScratch {
			t.Fatalf("the list went to %+v", c)
		}
	}
}

// TestLoadbalanceCache (issue 20 item 8): a load-balanced cache on two servers gets a
// namespace on each fragment (each a replica: the PFS directory, read-only, whole files
// served from that server's own cache), every fragment and namespace order carries the cache
// with a one-server layout (each fragment is server 0 of it), and each compute node's mount
// order is read-only, names no stripe servers and lists every replica, the one its name picks
// first.
func TestLoadbalanceCache(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	cacheParams(h)
	req := cacheSetup("5", "/lustre/me/run", model.AccessLoadbalance)
	req.Instance.Capacity, req.Instance.Strategy = 2<<30, "bandwidth"
	var fragments []agentapi.FragmentSpec
	var namespaces []agentapi.NamespaceSpec
	h.fail = func(e Effect) error {
		switch e.Op {
		case OpCreateFragment:
			fragments = append(fragments, e.Fragment)
		case OpCreateNamespace:
			namespaces = append(namespaces, e.Namespace)
		}
		return nil
	}
	h.must(ApplySetup(h.w, req, h, h.p, h.now))
	h.settle()
	if st := h.status("5", PhaseSetup); !st.Done || st.Failed {
		t.Fatalf("setup: %+v", st)
	}
	inst := h.w.InstanceOf(h.w.SessionByToken("5").ID)
	frags := h.w.FragmentsOf(inst.ID)
	if len(frags) != 2 || frags[0].Node == frags[1].Node {
		t.Fatalf("fragments: %+v", frags)
	}
	c := h.w.ConfigurationsOf(inst.ID)[0]
	if c.Type != model.TypeCache || c.AccessMode != model.AccessLoadbalance || striped(h.w, c) {
		t.Fatalf("configuration %+v (striped %v)", c, striped(h.w, c))
	}
	wantSpec := agentapi.CacheSpec{PFS: "/lustre/me/run", ModifiedThreshold: 64 << 20, ReadAhead: 4 << 20, HighWatermark: 45, LowWatermark: 20,
		UID: 1001, GID: 1002, Servers: 1, StripeSize: h.w.StripeSize(inst), Loadbalance: true}
	if len(fragments) != 2 || len(namespaces) != 2 {
		t.Fatalf("creates: %d fragments %d namespaces", len(fragments), len(namespaces))
	}
	for _, f := range fragments {
		if f.Cache == nil || *f.Cache != wantSpec || f.StripeIndex != 0 {
			t.Errorf("fragment %d's order: cache %+v, stripe index %d", f.ID, f.Cache, f.StripeIndex)
		}
	}
	nsFrag := map[int64]bool{}
	for _, ns := range namespaces {
		if ns.Cache == nil || *ns.Cache != wantSpec || ns.Servers != 0 {
			t.Errorf("namespace %d's order: cache %+v, servers %d", ns.ID, ns.Cache, ns.Servers)
		}
		nsFrag[ns.FragmentID] = true
	}
	if len(nsFrag) != 2 {
		t.Errorf("the namespaces are on fragments %v, want one on each", nsFrag)
	}
	env, err := Paths(h.w, "5", h.p.MountRoot)
	if err != nil || len(env) != 1 || env["DW_JOB_LDBAL_CACHE"] == "" {
		t.Fatalf("paths: %v %v", env, err)
	}

	var mounts []agentapi.MountSpec
	h.fail = func(e Effect) error {
		if e.Op == OpMount {
			mounts = append(mounts, e.Mount)
		}
		return nil
	}
	nodes := []string{"cn1", "cn2", "cn3", "cn4", "cn5", "cn6"}
	for _, n := range nodes {
		h.w.Nodes[n] = &model.Node{Name: n, Online: true}
	}
	h.must(ApplyPreRun(h.w, "5", nodes, h, h.p))
	h.settle()
	if len(mounts) != len(nodes) {
		t.Fatalf("%d mounts for %d nodes", len(mounts), len(nodes))
	}
	nss := h.w.NamespacesOf(c.ID)
	firsts := map[int64]bool{}
	for _, m := range mounts {
		node := ""
		for _, a := range h.w.Activations {
			if a.ID == m.ActivationID {
				node = a.Node
			}
		}
		if m.Cache == nil || *m.Cache != wantSpec || !m.ReadOnly || len(m.Stripes) != 0 || len(m.MDS) != 0 {
			t.Errorf("%s's mount order: cache %+v read-only %v stripes %d", node, m.Cache, m.ReadOnly, len(m.Stripes))
		}
		want := h.w.NamespaceFor(c, node)
		if len(m.Replicas) != 2 || m.Replicas[0].NamespaceID != want.ID || m.NamespaceID != want.ID ||
			m.Replicas[0].NamespaceID == m.Replicas[1].NamespaceID {
			t.Errorf("%s's replicas %+v, want both namespaces, %d first", node, m.Replicas, want.ID)
			continue
		}
		for _, r := range m.Replicas {
			ns := h.w.Namespaces[r.NamespaceID]
			if ns == nil || ns.ConfigurationID != c.ID || ns.FragmentID != r.FragmentID || h.w.Fragments[r.FragmentID].Node != r.Node {
				t.Errorf("%s's replica %+v names no namespace of the cache", node, r)
			}
		}
		firsts[m.Replicas[0].NamespaceID] = true
	}
	if len(firsts) != len(nss) {
		t.Errorf("the compute nodes read %d of the %d servers first: not spread", len(firsts), len(nss))
	}
	h.must(ApplyPostRun(h.w, "5"))
	h.settle()
	h.must(ApplyTeardown(h.w, "5", false))
	h.settle()
	assertEmpty(t, h.w)
}
