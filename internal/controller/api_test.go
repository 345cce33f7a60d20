package controller

import (
	"encoding/json"
	"io"
	"log/slog"
	"sort"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/config"
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
