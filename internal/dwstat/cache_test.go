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
