package dwstat

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/views"
)

func sample() views.All {
	return views.All{
		Pools: []views.Pool{{ID: "wlm_pool", Units: "bytes", Granularity: 1 << 30, Quantity: 7454, Free: 7453}},
		Sessions: []views.Session{{ID: 3, Token: "1234", Creator: "SLURM", Owner: 1001, Created: 1700000000,
			State: views.State{Goal: "create", Actualized: true}, Links: views.SessionLinks{ClientNodes: []string{"nid1", "nid2"}}}},
		Instances: []views.Instance{{ID: 4, Capacity: views.Capacity{Bytes: 1 << 30, Nodes: 1}, Created: 1700000000, Intact: true, Label: "I4-0",
			Links: views.InstanceLinks{Configurations: []int64{5}, Session: 3}, State: views.State{Goal: "create", Actualized: true}}},
		Configurations: []views.Configuration{{ID: 5, Type: "scratch", AccessType: "stripe", Links: views.ConfigurationLink{Instance: 4}, State: views.State{Goal: "destroy", Transitioning: true}}},
	}
}

func TestHeadersMatchWhatSlurmAndScriptsParse(t *testing.T) {
	a := sample()
	o := Options{Location: time.UTC}
	// The regexes of Slurm's test35.5.
	checks := map[string]string{
		"pools":          `pool *units *quantity *free *gran`,
		"configurations": `conf *state *inst *type *activs`,
		"sessions":       `sess *state *token *creator *owner *created *expiration *nodes`,
	}
	for tbl, re := range checks {
		out := Render(a, []string{tbl}, false, o)
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("%s: %q does not match %s", tbl, out, re)
		}
	}
	out := Render(a, []string{"pools"}, false, o)
	if !strings.Contains(out, "    pool units quantity    free gran\nwlm_pool bytes  7.28TiB 7.28TiB 1GiB\n") {
		t.Errorf("pools row: %q", out)
	}
	if out := Render(a, []string{"pools"}, false, Options{Bytes: true}); !strings.Contains(out, "1073741824") {
		t.Errorf("-b prints bytes: %q", out)
	}
	out = Render(a, []string{"sessions"}, false, o)
	if !strings.Contains(out, "   3 CA---  1234   SLURM  1001 2023-11-14T22:13:20      never     2") {
		t.Errorf("sessions row: %q", out)
	}
	if out := Render(a, []string{"configurations"}, false, o); !strings.Contains(out, "D--T-") {
		t.Errorf("configurations state flags: %q", out)
	}
}

// Every table's header, word for word as DataWarp's dwstat prints it (the interface spec's
// §3.1), over one row of each.
func TestEveryHeader(t *testing.T) {
	a := sample()
	a.Nodes = []views.Node{{ID: "bb1", Pool: "wlm_pool", Online: true, Granularity: 1 << 30, Capacity: 4 << 40}}
	a.Registrations = []views.Registration{{ID: 6, Session: 3, Configuration: 5, Wait: true}}
	a.Activations = []views.Activation{{ID: 7, Session: 3, Configuration: 5, Namespace: 9, Node: "nid1", Mount: "/mnt/x"}}
	a.Fragments = []views.Fragment{{ID: 8, Instance: 4, Capacity: 1 << 30, Node: "bb1"}}
	a.Namespaces = []views.Namespace{{ID: 9, Configuration: 5, Fragment: 8, Span: 1}}
	for tbl, header := range map[string]string{
		"pools":          "pool units quantity free gran",
		"nodes":          "node pool online drain gran capacity insts activs",
		"sessions":       "sess state token creator owner created expiration nodes",
		"instances":      "inst state sess bytes nodes created expiration intact label public confs",
		"configurations": "conf state inst type activs",
		"registrations":  "reg state sess conf wait",
		"activations":    "activ state sess conf nodes",
		"fragments":      "frag state inst capacity node",
		"namespaces":     "nss state conf frag span",
	} {
		out := Render(a, []string{tbl}, false, Options{Location: time.UTC})
		first := strings.Join(strings.Fields(strings.SplitN(out, "\n", 2)[0]), " ")
		if !strings.HasPrefix(first, header) {
			t.Errorf("%s header %q, want %q", tbl, first, header)
		}
	}
}

func TestEmptyMessages(t *testing.T) {
	var a views.All
	if out := Render(a, []string{"sessions"}, false, Options{}); out != "no sessions\n" {
		t.Errorf("%q", out)
	}
	if out := Render(a, []string{"configurations"}, false, Options{}); out != "no scratch, cache, swap configurations\n" {
		t.Errorf("%q", out)
	}
	a = sample()
	out := Render(a, Most, true, Options{})
	if !strings.HasSuffix(out, "did not find any cache configurations, swap configurations, registrations, activations\n") {
		t.Errorf("most summary: %q", out)
	}
}

func TestResolve(t *testing.T) {
	got, summary, err := Resolve([]string{"instances", "frag"})
	if err != nil || strings.Join(got, ",") != "instances,fragments" || summary {
		t.Fatalf("%v %v %v", got, summary, err)
	}
	if got, _, _ := Resolve(nil); len(got) != 1 || got[0] != "pools" {
		t.Fatalf("no words: %v", got)
	}
	if _, _, err := Resolve([]string{"bogus"}); err == nil || !strings.Contains(err.Error(), "most, all") {
		t.Fatalf("unknown table: %v", err)
	}
	got, summary, _ = Resolve([]string{"all"})
	if len(got) != len(Tables) || !summary {
		t.Fatalf("all: %v", got)
	}
}

// The accounting table: a row per fragment (its storage node, window use and limit) and the
// instance's totals with its stage bytes; not part of all; --json gives the records.
func TestAccountingTable(t *testing.T) {
	a := sample()
	a.Accounting = []views.Accounting{{Realm: views.Realm{RealmID: 4, Token: "1234", BytesWritten: 3 << 30, BytesRead: 1 << 30,
		WriteOps: 30, ReadOps: 10, FilesCreated: 7, CapacityUsed: 2 << 30, CapacityMax: 3 << 30, StageBytesIn: 1 << 20, StageBytesOut: 2 << 20,
		Fragments: []views.RealmFragment{
			{ServerHostname: "bb1", BytesWritten: 2 << 30, WriteOps: 20, FilesCreated: 7, WindowWritten: 2 << 30, WriteLimit: 10 << 30, ReadOnly: false},
			{ServerHostname: "bb2", BytesWritten: 1 << 30, WriteOps: 10, WindowWritten: 1 << 30}}}}}
	out := Render(a, []string{"accounting"}, false, Options{})
	for _, want := range []string{
		"inst token node written read wops rops files used peak window limit    ro stage_in stage_out",
		"   4  1234  bb1    2GiB   0B   20    0     7   0B   0B   2GiB 10GiB false        -         -",
		"   4  1234  bb2    1GiB   0B   10    0     0   0B   0B   1GiB     - false        -         -",
		"   4  1234    *    3GiB 1GiB   30   10     7 2GiB 3GiB      -     -     -     1MiB      2MiB",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("accounting table lacks %q:\n%s", want, out)
		}
	}
	if out := Render(views.All{}, []string{"accounting"}, false, Options{}); out != "no accounting\n" {
		t.Errorf("empty: %q", out)
	}
	if tables, _, err := Resolve([]string{"acct"}); err != nil || len(tables) != 1 || tables[0] != "accounting" {
		t.Errorf("acct: %v %v", tables, err)
	}
	if tables, _, _ := Resolve([]string{"all"}); strings.Contains(strings.Join(tables, " "), "accounting") {
		t.Errorf("all includes accounting: %v", tables)
	}
	if recs, ok := Select(a, []string{"accounting"})["accounting"].([]views.Accounting); !ok || len(recs) != 1 {
		t.Errorf("--json accounting: %v", Select(a, []string{"accounting"}))
	}
}

// dwstat nodes shows the SSD's remaining endurance and why a node takes no new fragments.
func TestNodesShowEnduranceAndWhy(t *testing.T) {
	a := views.All{Nodes: []views.Node{
		{ID: "bb1", Pool: "wlm_pool", Online: true, Granularity: 1 << 30, Capacity: 4 << 40,
			Endurance: &views.NodeEndurance{Known: true, PercentUsed: 3, PercentRemaining: 97}},
		{ID: "bb2", Pool: "wlm_pool", Online: true, Granularity: 1 << 30, Capacity: 4 << 40, Worn: true,
			Endurance: &views.NodeEndurance{Known: true, PercentUsed: 96, PercentRemaining: 4},
			Reason:    "SSD endurance 4% remaining, below controller.endurance_threshold"},
		{ID: "bb3", Pool: "wlm_pool", Online: true, Drain: true, AutoDrained: true, Granularity: 1 << 30, Capacity: 4 << 40,
			Endurance: &views.NodeEndurance{Error: "neither smartctl nor nvme is installed"},
			Reason:    "auto-drained: 5 failures in 10m: create-fragment: mkdir: input/output error"},
		{ID: "cn1", Online: true, Activations: 2, ComputeOnly: true},
		{ID: "cn2", Reason: "agent configuration: data_listen is only for storage nodes", ComputeOnly: true},
		{ID: "cnevil", Online: true, StorageClaim: "pool wlm_pool, 64GiB",
			Reason: "not admitted for storage (claims pool wlm_pool, 64GiB): dwcli update node --name cnevil --storage"},
	}}
	lines := strings.Split(strings.TrimSpace(Render(a, []string{"nodes"}, false, Options{Location: time.UTC})), "\n")
	fields := func(i int) string {
		if i >= len(lines) {
			return "(no line)"
		}
		return strings.Join(strings.Fields(lines[i]), " ")
	}
	for i, want := range []string{
		"node pool online drain gran capacity insts activs endurance reason",
		"bb1 wlm_pool online fill 1GiB 4TiB 0 0 97% -",
		"bb2 wlm_pool online worn 1GiB 4TiB 0 0 4% SSD endurance 4% remaining, below controller.endurance_threshold",
		"bb3 wlm_pool online drain 1GiB 4TiB 0 0 - auto-drained: 5 failures in 10m: create-fragment: mkdir: input/output error",
		"cnevil - online unadmitted 0B 0B 0 0 - not admitted for storage (claims pool wlm_pool, 64GiB): dwcli update node --name cnevil --storage",
		// A compute-only agent is not a storage node: it is listed apart (issue 23 item 12).
		"",
		"node role online activs reason",
		"cn1 compute online 2 -",
		"cn2 compute offline 0 agent configuration: data_listen is only for storage nodes",
	} {
		if got := fields(i); got != want {
			t.Errorf("line %d:\n got %q\nwant %q", i, got, want)
		}
	}
	js, _ := json.Marshal(Select(a, []string{"nodes"}))
	for _, want := range []string{`"percent_remaining":4`, `"worn":true`, `"auto_drained":true`, `"error":"neither smartctl nor nvme is installed"`, `"storage_claim":"pool wlm_pool, 64GiB"`, `"compute_only":true`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("--json nodes lacks %s: %s", want, js)
		}
	}
	if got := Render(views.All{Nodes: []views.Node{{ID: "cn1", Online: true, ComputeOnly: true}}}, []string{"nodes"}, false, Options{}); got != "no storage nodes\n\nnode    role online activs reason\n cn1 compute online      0      -\n" {
		t.Errorf("compute nodes only:\n%s", got)
	}
	if got := Render(views.All{Nodes: []views.Node{{ID: "cn1", Online: true, ComputeOnly: true}}}, []string{"nodes", "pools"}, true, Options{}); got != "node    role online activs reason\n cn1 compute online      0      -\n\ndid not find any storage nodes, pools\n" {
		t.Errorf("compute nodes only, summarised:\n%q", got)
	}
}

// Finished stages kept after their session went follow the live ones in dwstat stages, and
// come apart as stage_history in --json.
func TestStagesShowTheHistory(t *testing.T) {
	a := sample()
	a.Stages = []views.Stage{{ID: 43, Session: 3, Token: "1234", Direction: "in", Type: "directory", PFSPath: "/lus/in", DWPath: "/in",
		Status: "running", FilesDone: 2, FilesTotal: 8, BytesDone: 1 << 20, BytesTotal: 4 << 20}}
	a.StageHistory = []views.Stage{
		{ID: 41, Session: 2, Token: "4242", Direction: "in", Type: "file", PFSPath: "/lus/in/data.h5", DWPath: "/data.h5",
			Status: "complete", FilesDone: 1, FilesTotal: 1, BytesDone: 1 << 30, BytesTotal: 1 << 30},
		{ID: 42, Session: 2, Token: "4242", Direction: "out", Type: "file", PFSPath: "/lus/out/out.h5", DWPath: "/out.h5",
			Status: "failed", Error: "no space left on device", FilesTotal: 1, BytesTotal: 1 << 30},
	}
	want := `stage sess token dir      type   status files     bytes          source     destination error
   43    3  1234  in directory  running   2/8 1MiB/4MiB         /lus/in             /in -
   41    2  4242  in      file complete   1/1 1GiB/1GiB /lus/in/data.h5        /data.h5 -
   42    2  4242 out      file   failed   0/1   0B/1GiB         /out.h5 /lus/out/out.h5 no space left on device
`
	if out := Render(a, []string{"stages"}, false, Options{}); out != want {
		t.Errorf("dwstat stages:\n%s\nwant\n%s", out, want)
	}
	sel := Select(a, []string{"stages"})
	if h, ok := sel["stage_history"].([]views.Stage); !ok || len(h) != 2 || len(sel["stages"].([]views.Stage)) != 1 {
		t.Errorf("--json stages: %+v", sel)
	}
	if h := Select(sample(), []string{"stages"})["stage_history"].([]views.Stage); h == nil || len(h) != 0 {
		t.Errorf("no history: %#v, want an empty list", h)
	}
	if out := Render(sample(), []string{"stages"}, false, Options{}); out != "no stages\n" {
		t.Errorf("no stages: %q", out)
	}
}
