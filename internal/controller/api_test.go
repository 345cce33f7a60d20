package controller

import (
	"encoding/json"
	"io"
	"log/slog"
	"sort"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// TestOpenAPIDescribesEveryRoute keeps the OpenAPI document and the routes in step.
func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(OpenAPI(), &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	c := &Controller{cfg: config.Defaults()}
	srv := NewServer(c, "", nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	served := map[string]bool{}
	for _, r := range srv.Routes {
		served[r] = true
		if !documented[r] {
			t.Errorf("route %s is not in openapi.json", r)
		}
	}
	var extra []string
	for r := range documented {
		if !served[r] {
			extra = append(extra, r)
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		t.Errorf("openapi.json documents routes that do not exist: %v", extra)
	}
}

// An ordinary user may create only their own sessions, with one of their groups, under
// tokens that cannot take a job id from the workload manager.
func TestCheckUserSetup(t *testing.T) {
	job := func(token string, owner, group uint32) lifecycle.Setup {
		return lifecycle.Setup{Token: token, Creator: "RUN", Owner: owner, Group: group}
	}
	for _, tc := range []struct {
		req  lifecycle.Setup
		want string // "" = allowed
	}{
		{job("run12", 1000, 1000), ""},
		{job("run12", 1000, 50), ""}, // a supplementary group
		{lifecycle.Setup{Token: "proj", Creator: "CLI", Owner: 1000, Group: 1000, Persistent: true}, ""},
		{job("run12", 1001, 1000), "may not create a session for uid 1001"},
		{job("run12", 1000, 0), "not in group 0"},
		{job("5000", 1000, 1000), "reserved for the workload manager"},
		{job("run", 1000, 1000), "reserved for the workload manager"},
		{lifecycle.Setup{Token: "run3", Creator: "SLURM", Owner: 1000, Group: 1000}, "creator SLURM is reserved"},
	} {
		err := checkUserSetup(1000, []uint32{1000, 50}, tc.req)
		if (err == nil) != (tc.want == "") || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.req, err, tc.want)
		}
	}
}
