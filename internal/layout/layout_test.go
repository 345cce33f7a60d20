package layout

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/views"
)

const gib = uint64(1) << 30

// world is a controller state with two pools, three storage nodes (one offline, one
// drained), a compute-only node, a job with two instances' worth of objects, a persistent
// instance and a session without capacity.
func world() views.All {
	return views.All{
		Pools: []views.Pool{
			{ID: "fast", Units: "bytes", Granularity: gib, Quantity: 12, Free: 7},
			{ID: "wlm_pool", Units: "bytes", Granularity: 4 * gib, Quantity: 4, Free: 4},
		},
		Nodes: []views.Node{
			{ID: "bb1", Pool: "fast", Online: true, Capacity: 4 * gib, Used: 3 * gib, Roles: []string{"storage"}, Address: "http://bb1:7070", LastSeen: 1700000000},
			{ID: "bb2", Pool: "fast", Online: true, Drain: true, Capacity: 4 * gib, Used: 1 * gib},
			{ID: "bb3", Pool: "fast", Online: false, Capacity: 4 * gib, Used: 1 * gib},
			{ID: "bb4", Pool: "wlm_pool", Online: true, Capacity: 16 * gib},
			{ID: "nid00100", Online: true, Roles: []string{"client"}}, // compute-only
		},
		Sessions: []views.Session{
			{ID: 1, Token: "4242", Owner: 1000, Creator: "SLURM", Links: views.SessionLinks{ClientNodes: []string{"nid00100", "nid00101"}}},
			{ID: 2, Token: "project", Owner: 1001, Persistent: true, Links: views.SessionLinks{ClientNodes: []string{}}},
			{ID: 3, Token: "4243", Owner: 1002}, // no capacity of its own, nil client nodes
		},
		Instances: []views.Instance{
			{ID: 10, Capacity: views.Capacity{Bytes: 3 * gib, Nodes: 3}, Links: views.InstanceLinks{Session: 1, Configurations: []int64{20}}, Pool: "fast", Label: "I10-0"},
			{ID: 11, Capacity: views.Capacity{Bytes: 2 * gib, Nodes: 2}, Links: views.InstanceLinks{Session: 2, Configurations: []int64{21}}, Pool: "fast", Label: "project"},
		},
		Configurations: []views.Configuration{
			{ID: 20, Type: "scratch", AccessType: "stripe", AccessMode: "striped", Links: views.ConfigurationLink{Instance: 10}},
			{ID: 21, Type: "scratch", AccessType: "private", AccessMode: "private", Links: views.ConfigurationLink{Instance: 11}},
		},
		Fragments: []views.Fragment{ // interleaved between instances, as ids are handed out
			{ID: 30, Instance: 10, Capacity: gib, Node: "bb1"},
			{ID: 31, Instance: 11, Capacity: gib, Node: "bb1"},
			{ID: 32, Instance: 10, Capacity: gib, Node: "bb2"},
			{ID: 33, Instance: 10, Capacity: gib, Node: "bb3"},
			{ID: 34, Instance: 11, Capacity: gib, Node: "bb2"},
		},
		Namespaces:  []views.Namespace{{ID: 40, Configuration: 20, Fragment: 30}},
		Activations: []views.Activation{{ID: 50, Session: 1, Configuration: 20, Node: "nid00100"}},
	}
}

func TestFromAllKeepsWhatBbsimNeeds(t *testing.T) {
	when := time.Date(2026, 11, 22, 11, 0, 0, 0, time.FixedZone("CET", 3600))
	snap, warnings, err := FromAll(world(), Options{Generated: when, Controller: "unix:/run/spillway/controller.sock"})
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 0 {
		t.Errorf("warnings: %v", warnings)
	}
	want := Snapshot{
		Format: "spillway-layout", Version: 1,
		Generated:  "2026-11-22T10:00:00Z", // UTC
		Controller: "unix:/run/spillway/controller.sock",
		Pools: []Pool{
			{ID: "fast", Granularity: gib, Quantity: 12, Free: 7},
			{ID: "wlm_pool", Granularity: 4 * gib, Quantity: 4, Free: 4},
		},
		Nodes: []Node{ // storage nodes only
			{ID: "bb1", Pool: "fast", Capacity: 4 * gib, Online: true},
			{ID: "bb2", Pool: "fast", Capacity: 4 * gib, Online: true, Drain: true},
			{ID: "bb3", Pool: "fast", Capacity: 4 * gib},
			{ID: "bb4", Pool: "wlm_pool", Capacity: 16 * gib, Online: true},
		},
		Instances: []Instance{
			{ID: 10, Capacity: 3 * gib, Session: "4242", Pool: "fast", Fragments: []Fragment{
				{ID: 30, Node: "bb1", Capacity: gib}, {ID: 32, Node: "bb2", Capacity: gib}, {ID: 33, Node: "bb3", Capacity: gib}}},
			{ID: 11, Capacity: 2 * gib, Session: "project", Pool: "fast", Fragments: []Fragment{
				{ID: 31, Node: "bb1", Capacity: gib}, {ID: 34, Node: "bb2", Capacity: gib}}},
		},
		Configurations: []Configuration{
			{ID: 20, Instance: 10, Type: "scratch", AccessMode: "striped"},
			{ID: 21, Instance: 11, Type: "scratch", AccessMode: "private"},
		},
		Sessions: []Session{
			{ID: 1, Token: "4242", Owner: 1000, ClientNodes: []string{"nid00100", "nid00101"}},
			{ID: 2, Token: "project", Owner: 1001, ClientNodes: []string{}},
			{ID: 3, Token: "4243", Owner: 1002, ClientNodes: []string{}},
		},
	}
	if !reflect.DeepEqual(snap, want) {
		got, _ := json.MarshalIndent(snap, "", " ")
		exp, _ := json.MarshalIndent(want, "", " ")
		t.Fatalf("snapshot\n%s\nwant\n%s", got, exp)
	}
	// Each instance's capacity is the sum of its fragments' (bbsim uses the fragments).
	for _, i := range snap.Instances {
		var sum uint64
		for _, f := range i.Fragments {
			sum += f.Capacity
		}
		if sum != i.Capacity {
			t.Errorf("instance %d: fragments hold %d bytes of %d", i.ID, sum, i.Capacity)
		}
	}
}

func TestFromAllDoesNotShareTheViewsSlices(t *testing.T) {
	all := world()
	snap, _, err := FromAll(all, Options{})
	if err != nil {
		t.Fatal(err)
	}
	snap.Sessions[0].ClientNodes[0] = "changed"
	if all.Sessions[0].Links.ClientNodes[0] != "nid00100" {
		t.Fatal("the snapshot aliases the views' client node list")
	}
}

func TestInstanceWithoutFragmentsIsLeftOutWithItsConfigurations(t *testing.T) {
	all := world()
	all.Instances = append(all.Instances, views.Instance{ID: 12, Capacity: views.Capacity{Bytes: gib}, Links: views.InstanceLinks{Session: 3}})
	all.Configurations = append(all.Configurations, views.Configuration{ID: 22, Type: "scratch", AccessMode: "striped", Links: views.ConfigurationLink{Instance: 12}})
	snap, warnings, err := FromAll(all, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "instance 12 (session 4243) has no fragments") {
		t.Errorf("warnings: %q", warnings)
	}
	for _, i := range snap.Instances {
		if i.ID == 12 {
			t.Error("instance 12 has no fragments but is listed")
		}
	}
	for _, c := range snap.Configurations {
		if c.Instance == 12 {
			t.Error("the configuration of a left-out instance is listed")
		}
	}
	if len(snap.Instances) != 2 || len(snap.Configurations) != 2 {
		t.Errorf("%d instances, %d configurations", len(snap.Instances), len(snap.Configurations))
	}
}

func TestInconsistentStateIsAnErrorNamingTheObject(t *testing.T) {
	cases := []struct {
		name   string
		change func(*views.All)
		want   string
	}{
		{"fragment on a compute-only node", func(a *views.All) { a.Fragments[0].Node = "nid00100" }, `fragment 30 of instance 10 is on node "nid00100"`},
		{"fragment on an unknown node", func(a *views.All) { a.Fragments[1].Node = "ghost" }, `fragment 31 of instance 11 is on node "ghost"`},
		{"instance of an unknown session", func(a *views.All) { a.Instances[1].Links.Session = 99 }, "instance 11 belongs to session 99"},
		{"node in an unlisted pool", func(a *views.All) { a.Nodes[3].Pool = "gone" }, "node bb4 belongs to pool gone"},
		{"pool without granularity", func(a *views.All) { a.Pools[1].Granularity = 0 }, "pool wlm_pool has granularity 0"},
		{"unknown access mode", func(a *views.All) { a.Configurations[0].AccessMode = "stripe" }, `configuration 20 has access mode "stripe"`},
		{"unknown type", func(a *views.All) { a.Configurations[1].Type = "tmpfs" }, `configuration 21 has type "tmpfs"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			all := world()
			c.change(&all)
			_, _, err := FromAll(all, Options{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

func TestEmptyStateIsAValidSnapshot(t *testing.T) {
	snap, warnings, err := FromAll(views.All{}, Options{})
	if err != nil || warnings != nil {
		t.Fatal(err, warnings)
	}
	raw, _ := json.Marshal(snap)
	want := `{"format":"spillway-layout","version":1,"pools":[],"nodes":[],"instances":[],"configurations":[],"sessions":[]}`
	if string(raw) != want {
		t.Fatalf("got %s\nwant %s", raw, want)
	}
}

// cacheWorld is world() with instance 11's configuration a cache with its settings.
func cacheWorld() views.All {
	all := world()
	all.Configurations[1].Type, all.Configurations[1].AccessMode = "cache", "striped"
	all.Configurations[1].BackingPath = "/lus/me/run"
	all.Configurations[1].Cache = &model.CacheSettings{PFS: "/lus/me/run", ModifiedThreshold: 64 << 20, ReadAhead: 4 << 20,
		SyncOnClose: true, HighWatermark: 45, LowWatermark: 20}
	return all
}

func TestCacheSettingsMakeAVersion2Snapshot(t *testing.T) {
	snap, _, err := FromAll(cacheWorld(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := &Cache{PFS: "/lus/me/run", HighWatermark: 45, LowWatermark: 20, ModifiedThreshold: 64 << 20, ReadAhead: 4 << 20}
	if snap.Version != 2 || !reflect.DeepEqual(snap.Configurations[1].Cache, want) || snap.Configurations[0].Cache != nil {
		t.Fatalf("version %d, configurations %+v, cache %+v", snap.Version, snap.Configurations, snap.Configurations[1].Cache)
	}
	raw, _ := json.Marshal(snap.Configurations[1])
	if w := `{"id":21,"instance":11,"type":"cache","access_mode":"striped","cache":{"pfs":"/lus/me/run","high_watermark":45,"low_watermark":20,"modified_threshold":67108864,"read_ahead":4194304}}`; string(raw) != w {
		t.Errorf("got %s\nwant %s", raw, w)
	}
	// Unset watermarks are the cache's defaults: left out, as bbsim takes the same ones.
	all := cacheWorld()
	all.Configurations[1].Cache.HighWatermark, all.Configurations[1].Cache.LowWatermark = 0, 0
	snap, _, _ = FromAll(all, Options{})
	if c := snap.Configurations[1].Cache; c.HighWatermark != 0 || c.LowWatermark != 0 || snap.Version != 2 {
		t.Errorf("unset watermarks: %+v", c)
	}
	// A cache configuration without settings, or settings on a scratch one, stay version 1.
	all = cacheWorld()
	all.Configurations[1].Cache = nil
	if snap, _, _ = FromAll(all, Options{}); snap.Version != 1 {
		t.Errorf("a cache type alone: version %d", snap.Version)
	}
	all = cacheWorld()
	all.Configurations[1].Type = "scratch"
	if snap, _, _ = FromAll(all, Options{}); snap.Version != 1 || snap.Configurations[1].Cache != nil {
		t.Errorf("settings on a scratch configuration: version %d", snap.Version)
	}
}

// TestFieldsFollowTheSchema reads the JSON Schemas bbsim validates snapshots against
// (sim/bbsim/schemas/spillway-layout-v1.json, -v2.json) and checks every object of a
// converted snapshot, without and with a cache configuration: each field is one the schema of
// the snapshot's version defines, and each required field is present.
func TestFieldsFollowTheSchema(t *testing.T) {
	for _, c := range []struct {
		name string
		all  views.All
		want int
	}{{"scratch only", world(), 1}, {"with a cache", cacheWorld(), 2}} {
		t.Run(c.name, func(t *testing.T) { checkSchema(t, c.all, c.want) })
	}
}

func checkSchema(t *testing.T, all views.All, version int) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "sim", "bbsim", "schemas", fmt.Sprintf("spillway-layout-v%d.json", version)))
	if err != nil {
		t.Skipf("the bbsim schema is not beside this checkout: %v", err)
	}
	var schema struct {
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
		Defs       map[string]struct {
			Required   []string                   `json:"required"`
			Properties map[string]json.RawMessage `json:"properties"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	snap, _, err := FromAll(all, Options{Generated: time.Now(), Controller: "unix:/x"})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(snap)
	var doc map[string]any
	json.Unmarshal(out, &doc)

	check := func(where string, obj map[string]any, props map[string]json.RawMessage, required []string) {
		t.Helper()
		if len(props) == 0 {
			t.Fatalf("%s: the schema defines no properties", where)
		}
		var keys []string
		for k := range obj {
			keys = append(keys, k)
			if _, ok := props[k]; !ok {
				t.Errorf("%s: field %q is not in the schema", where, k)
			}
		}
		for _, r := range required {
			if _, ok := obj[r]; !ok {
				sort.Strings(keys)
				t.Errorf("%s: required field %q missing (has %v)", where, r, keys)
			}
		}
	}
	check("snapshot", doc, schema.Properties, schema.Required)
	for list, def := range map[string]string{"pools": "pool", "nodes": "node", "instances": "instance", "configurations": "configuration", "sessions": "session"} {
		items := doc[list].([]any)
		if len(items) == 0 {
			t.Fatalf("the test world has no %s", list)
		}
		d := schema.Defs[def]
		for i, item := range items {
			obj := item.(map[string]any)
			check(fmt.Sprintf("%s[%d]", list, i), obj, d.Properties, d.Required)
			if k, ok := obj["cache"]; ok && def == "configuration" {
				check(list+" cache", k.(map[string]any), schema.Defs["cache"].Properties, schema.Defs["cache"].Required)
			}
			if def == "instance" {
				f := schema.Defs["fragment"]
				for _, frag := range obj["fragments"].([]any) {
					check(list+" fragment", frag.(map[string]any), f.Properties, f.Required)
				}
			}
		}
	}
	if doc["format"] != Format || doc["version"].(float64) != float64(version) {
		t.Errorf("format %v version %v", doc["format"], doc["version"])
	}
}

// TestCacheSnapshotFeedsBbsim feeds a version 2 snapshot (a cache instance's settings) to the
// real `bbsim predict`, when SPILLWAY_TEST_BBSIM names it (scripts/test-all sets it): bbsim
// reads what this package writes, and models the instance as a cache.
func TestCacheSnapshotFeedsBbsim(t *testing.T) {
	bbsim := os.Getenv("SPILLWAY_TEST_BBSIM")
	if bbsim == "" {
		t.Skip("SPILLWAY_TEST_BBSIM is unset: set it to a bbsim executable (pip install ./sim); scripts/test-all does")
	}
	snap, _, err := FromAll(cacheWorld(), Options{Generated: time.Now(), Controller: "unix:/x"})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(snap)
	path := filepath.Join(t.TempDir(), "snap.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bbsim, "predict", path, "--machine", "trinity", "--mapping", "ordered", "--session", "project",
		"--nodes", "4", "--op", "write", "--block", "1GiB", "--set", "pfs.bandwidth.write=10", "--set", "pfs.bandwidth.read=12", "--json").Output()
	if err != nil {
		t.Fatalf("bbsim predict: %v\n%s", err, out)
	}
	var got struct {
		GBps  float64 `json:"gbps"`
		Cache *struct {
			Capacity      float64 `json:"capacity"`
			HighWatermark int     `json:"high_watermark"`
			PFS           string  `json:"pfs_directory"`
			BytesWritten  float64 `json:"bytes_written"`
			DrainGBps     float64 `json:"drain_gbps"`
			DrainSeconds  float64 `json:"drain_seconds_after_job"`
		} `json:"cache"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	c := got.Cache
	if c == nil || c.Capacity != float64(2*gib) || c.HighWatermark != 45 || c.PFS != "/lus/me/run" ||
		c.BytesWritten != float64(4*32*gib) || c.DrainGBps <= 0 || c.DrainSeconds <= 0 || got.GBps <= 0 {
		t.Fatalf("bbsim's prediction of the cache instance: %s", out)
	}
}
