package dwstat

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/views"
)

// TestCacheConfigurations: a cache configuration (issue 20) shows type cache, and with --cd
// its amode and the PFS directory as backing_path, DataWarp's columns; the listing's JSON
// (dwstat --json, dw_wlm_cli show_configurations, the REST API) carries backing_path.
func TestCacheConfigurations(t *testing.T) {
	w := lifecycle.NewWorld()
	w.Configurations[5] = &model.Configuration{ID: 5, InstanceID: 4, Type: model.TypeScratch, AccessMode: model.AccessStriped, State: model.Created()}
	w.Configurations[6] = &model.Configuration{ID: 6, InstanceID: 4, Type: model.TypeCache, AccessMode: model.AccessLoadbalance, BackingPath: "/lus/global",
		Cache: &model.CacheSettings{PFS: "/lus/global"}, State: model.Created()}
	a := views.BuildTables(w, "configurations")
	got := Render(a, []string{"configurations"}, false, Options{Location: time.UTC, ConfigDetails: true})
	lines := strings.Split(strings.TrimRight(got, "\n"), "\n")
	want := [][]string{
		{"conf", "state", "inst", "type", "amode", "activs", "backing_path"},
		{"5", "CA---", "4", "scratch", "stripe", "0", "-"},
		{"6", "CA---", "4", "cache", "ldbal", "0", "/lus/global"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%s", got)
	}
	for i, l := range lines {
		if strings.Join(strings.Fields(l), " ") != strings.Join(want[i], " ") {
			t.Errorf("line %d: %q, want %v", i, l, want[i])
		}
	}
	if got := Render(a, []string{"configurations"}, false, Options{Location: time.UTC}); !strings.Contains(got, "cache") || strings.Contains(got, "/lus/global") {
		t.Errorf("without --cd: %s", got)
	}
	if got := Render(a, Most, true, Options{Location: time.UTC}); strings.Contains(got, "cache configurations") || !strings.Contains(got, "swap configurations") {
		t.Errorf("most: %s", got)
	}
	raw, _ := json.Marshal(a)
	if !strings.Contains(string(raw), `"type":"cache","access_type":"ldbal"`) && !strings.Contains(string(raw), `"backing_path":"/lus/global"`) {
		t.Errorf("json: %s", raw)
	}
	if !strings.Contains(string(raw), `"backing_path":"/lus/global"`) {
		t.Errorf("json without backing_path: %s", raw)
	}
	appended, ok := views.AppendTable(nil, "configurations", a)
	if !ok || !strings.Contains(string(appended), `"backing_path":"/lus/global"`) || !strings.Contains(string(appended), `"type":"cache"`) {
		t.Errorf("appended: %s", appended)
	}
}

// TestCacheFlushInTables: a cache fragment's teardown flush shows in dwstat's text tables, not
// only in --json: the bytes not yet on the PFS, the failure that undid the teardown (also the
// session's failure column), and what was lost with an offline node.
func TestCacheFlushInTables(t *testing.T) {
	var a views.All
	a.Sessions = []views.Session{{ID: 3, Token: "42", Failure: "teardown undone, the instance is kept: the cache on storage node bb02 could not flush"}, {ID: 4, Token: "43"}}
	a.Fragments = []views.Fragment{
		{ID: 8, Instance: 4, Capacity: 1 << 30, Node: "bb1", CacheDirty: 5 << 20},
		{ID: 9, Instance: 4, Capacity: 1 << 30, Node: "bb02", CacheFlushError: "pfs: no space left on device (ENOSPC) on /lus/me"},
		{ID: 10, Instance: 4, Capacity: 1 << 30, Node: "bb3", CacheLost: "3MiB not flushed: storage node bb3 offline"},
		{ID: 11, Instance: 5, Capacity: 1 << 30, Node: "bb3"},
	}
	frags := Render(a, []string{"fragments"}, false, Options{Location: time.UTC})
	for _, want := range []string{"5MiB not yet on the PFS", "flush failed: pfs: no space left on device (ENOSPC) on /lus/me", "lost: 3MiB not flushed: storage node bb3 offline"} {
		if !strings.Contains(frags, want) {
			t.Errorf("fragments table lacks %q:\n%s", want, frags)
		}
	}
	lines := strings.Split(strings.TrimRight(frags, "\n"), "\n")
	if f := strings.Fields(lines[len(lines)-1]); f[len(f)-1] != "-" {
		t.Errorf("a fragment with no flush: %q", lines[len(lines)-1])
	}
	// The free text is not padded: the short rows end with their own text.
	if strings.HasSuffix(lines[1], " ") {
		t.Errorf("padded free text: %q", lines[1])
	}
	sess := Render(a, []string{"sessions"}, false, Options{Location: time.UTC})
	if !strings.Contains(sess, "teardown undone, the instance is kept: the cache on storage node bb02 could not flush") {
		t.Errorf("sessions table lacks the failure:\n%s", sess)
	}
}
