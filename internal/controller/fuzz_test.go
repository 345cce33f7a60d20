package controller

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/sqlite"
)

// FuzzAPI sends arbitrary requests — any route, any path, any body, as root, as an ordinary
// user or with a wrong token — to a real controller with a real state database. Whatever
// arrives, the controller answers with JSON and a 2xx or 4xx status (or the mux's redirect of
// a path missing its final slash): never a panic, never a 5xx (which would mean a request
// reached a state the code did not expect).
func FuzzAPI(f *testing.F) {
	cfg := config.Defaults()
	cfg.Controller.StateDir = f.TempDir()
	cfg.Pools = []config.Pool{{Name: "wlm_pool", Granularity: config.Size(1 << 30)}}
	// A status request may wait up to half of this for its step: keep every execution short,
	// or the fuzzer takes a long wait for a hang.
	cfg.Controller.RequestTimeout = config.Duration(200 * time.Millisecond)
	eng, err := sqlite.Open(filepath.Join(cfg.Controller.StateDir, "state.db"))
	if err != nil {
		f.Fatal(err)
	}
	defer eng.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(cfg, store.New(eng), func(n *model.Node) (agentapi.Agent, error) { return nil, errNoAgents }, log)
	if err != nil {
		f.Fatal(err)
	}
	srv := NewServer(c, "fuzz-token", nil, log)
	methods := []string{"GET", "POST", "PATCH", "DELETE", "PUT"}
	instance := `"instance":{"capacity":1073741824,"pool":"wlm_pool","type":"scratch","access_modes":["striped"]}`
	f.Add(uint8(1), "/dw/v1/sessions", `{"token":"7","creator":"SLURM","owner":1000,"group":1000,`+instance+`}`, uint8(0))
	f.Add(uint8(1), "/dw/v1/sessions", `{"token":"run1","creator":"RUN","owner":1000,"group":1000,`+instance+`}`, uint8(1))
	f.Add(uint8(1), "/dw/v1/sessions/7/data_in", `{"stages":[{"type":"file","pfs_path":"/p/a","dw_var":"DW_JOB_STRIPED","dw_path":"/a"}]}`, uint8(0))
	f.Add(uint8(1), "/dw/v1/sessions/7/pre_run", `{"nodes":["cn1"]}`, uint8(0))
	f.Add(uint8(1), "/dw/v1/sessions/7/teardown", `{"hurry":true}`, uint8(1))
	f.Add(uint8(0), "/dw/v1/sessions/7/status?step=setup&wait=1ms", ``, uint8(1))
	f.Add(uint8(0), "/dw/v1/all", ``, uint8(1))
	f.Add(uint8(2), "/dw/v1/nodes/ssd1", `{"drain":true,"reason":"x"}`, uint8(2))
	f.Add(uint8(1), "/dw/v1/pools", `{"name":"p2","granularity":1}`, uint8(0))
	f.Add(uint8(1), "/dw/v1/nodes/ssd1/heartbeat", `{"name":"ssd1","pool":"wlm_pool","capacity":4294967296}`, uint8(0))
	f.Add(uint8(1), "/dw/v1/run_ids", ``, uint8(1))
	f.Add(uint8(1), "/dw/v1/sessions/run1/lease", `{"release":true}`, uint8(1))
	f.Fuzz(func(t *testing.T, method uint8, path, body string, who uint8) {
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		req, err := http.NewRequest(methods[int(method)%len(methods)], "http://spillway"+path, strings.NewReader(body))
		if err != nil {
			return // not a request a client could send
		}
		switch who % 3 {
		case 0: // root on the socket
			req = req.WithContext(httpapi.WithPeer(req.Context(), httpapi.Peer{UID: 0, GID: 0, Known: true}))
		case 1: // an ordinary user on the socket
			req = req.WithContext(httpapi.WithPeer(req.Context(), httpapi.Peer{UID: 1000, GID: 1000, Known: true}))
		case 2: // TCP with a wrong token
			req.Header.Set("Authorization", "Bearer not-the-token")
		}
		ctx, cancel := context.WithCancel(req.Context())
		defer cancel()
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req.WithContext(ctx))
		if rec.Code >= 500 {
			t.Fatalf("%s %s %q as %d: %d %s", req.Method, path, body, who%3, rec.Code, rec.Body)
		}
		redirect := rec.Code >= 300 && rec.Code < 400 // "/dw" to "/dw/": the mux's own answer
		if rec.Body.Len() > 0 && !redirect && path != "/dw/v1/openapi.json" && !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("%s %s: the answer is not JSON: %q", req.Method, path, rec.Body)
		}
	})
}

var errNoAgents = &lifecycleNoAgent{}

type lifecycleNoAgent struct{}

func (*lifecycleNoAgent) Error() string { return "no agents in this test" }
