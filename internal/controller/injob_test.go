package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
)

// jobStagesBody is an in-job stage request of n stage-outs of files under dir.
func jobStagesBody(t testing.TB, dir string, n int) string {
	req := controllerapi.JobStagesRequest{}
	for i := 0; i < n; i++ {
		req.Stages = append(req.Stages, lifecycle.InJobStage{Direction: model.StageOut, Type: model.StageFile,
			DWVar: lifecycle.VarJobStriped, DWPath: fmt.Sprintf("/%s/%d", dir, i), PFSPath: fmt.Sprintf("/pfs/%s/%d", dir, i)})
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// inJobStages counts the session's in-job stages in the state.
func (a *adminWorld) inJobStages(token string) int {
	a.t.Helper()
	w, err := a.c.viewSession(context.Background(), token)
	if err != nil {
		a.t.Fatal(err)
	}
	n := 0
	for _, st := range w.StagesOf(w.SessionByToken(token).ID) {
		if st.InJob {
			n++
		}
	}
	return n
}

// Security issue 19, item 2: one in-job stage request naming 25,000 paths held the
// controller's write transaction for 22 s (every other user's write and the heartbeats
// waited). An ordinary user's request over stage.max_paths_per_request is refused at once,
// with a 413 (kind too_large) naming the limit and the way out, and changes nothing; one at the limit is
// applied whole, on a session already holding stages; the session's records are bounded by
// stage.max_job_stages.
func TestInJobStageRequestsAreBounded(t *testing.T) {
	const limit = 2000
	a := newAdminWorld(t, func(c *config.Config) { c.Stage.MaxPathsPerRequest, c.Stage.MaxJobStages = limit, 2*limit+100 })
	a.heartbeat("ssd1", "wlm_pool")
	a.setup("77", userUID, 0)
	path := "/dw/v1/sessions/77/job_stages"

	code, out := a.call(userUID, "POST", path, jobStagesBody(t, "over", limit+1))
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(out, "stage.max_paths_per_request (2000)") || !strings.Contains(out, "at most 2000 paths") {
		t.Fatalf("%d paths: %d %s; want 413 naming stage.max_paths_per_request", limit+1, code, out)
	}
	if n := a.inJobStages("77"); n != 0 {
		t.Fatalf("a refused request recorded %d stages", n)
	}
	a.must(userUID, "POST", path, jobStagesBody(t, "first", limit), http.StatusAccepted)
	a.must(userUID, "POST", path, jobStagesBody(t, "second", limit), http.StatusAccepted)
	if n := a.inJobStages("77"); n != 2*limit {
		t.Fatalf("two requests at the limit recorded %d stages, want %d", n, 2*limit)
	}
	// The session's own bound on its records.
	if code, out := a.call(userUID, "POST", path, jobStagesBody(t, "third", 101)); code != http.StatusRequestEntityTooLarge || !strings.Contains(out, "stage.max_job_stages (4100)") {
		t.Fatalf("past stage.max_job_stages: %d %s", code, out)
	}
	// A request naming a path twice, or a bad path, is refused the same way.
	body := jobStagesBody(t, "third", 2)
	body = strings.Replace(body, "/third/1", "/third/0", 1)
	if code, out := a.call(userUID, "POST", path, body); code != http.StatusBadRequest || !strings.Contains(out, "named twice") {
		t.Fatalf("a path twice: %d %s", code, out)
	}
}

// The default bound holds on a request the size of the report's (25,000 paths, 3.8 MB,
// under controller.max_request_bytes); a request at the default bound is applied whole.
func TestInJobStageRequestOfTheReportIsRefused(t *testing.T) {
	a := newAdminWorld(t, nil)
	a.heartbeat("ssd1", "wlm_pool")
	a.setup("77", userUID, 0)
	body := jobStagesBody(t, "checkpoints/step", 25000)
	if len(body) > 4<<20 || len(body) < 3<<20 {
		t.Fatalf("the body is %d bytes", len(body))
	}
	code, out := a.call(userUID, "POST", "/dw/v1/sessions/77/job_stages", body)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(out, "stage.max_paths_per_request (10000)") {
		t.Fatalf("25,000 paths: %d %.300s", code, out)
	}
	a.must(userUID, "POST", "/dw/v1/sessions/77/job_stages", jobStagesBody(t, "checkpoints/step", 10000), http.StatusAccepted)
	if n := a.inJobStages("77"); n != 10000 {
		t.Fatalf("a request at the default limit recorded %d stages", n)
	}
}

// BenchmarkJobStagesRequest is one ordinary user's in-job stage request of n paths against a
// real controller over SQLite, on a session already holding n in-job stages (and those of the
// iterations before).
func BenchmarkJobStagesRequest(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			t := &testing.T{}
			a := newAdminWorld(t, nil)
			a.heartbeat("ssd1", "wlm_pool")
			a.setup("77", userUID, 0)
			if code, out := a.call(userUID, "POST", "/dw/v1/sessions/77/job_stages", jobStagesBody(b, "held", n)); code != http.StatusAccepted {
				b.Fatal(code, out)
			}
			bodies := make([]string, b.N)
			for i := range bodies {
				bodies[i] = jobStagesBody(b, fmt.Sprint("r", i), n)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if code, out := a.call(userUID, "POST", "/dw/v1/sessions/77/job_stages", bodies[i]); code != http.StatusAccepted {
					b.Fatal(code, out)
				}
			}
		})
	}
}

// BenchmarkOtherWriteDuringJobStages times another user's one-row write (POST
// /dw/v1/run_ids) sent while one in-job stage request of stage.max_paths_per_request paths is
// being applied (the report's 25,000 paths took it 26.9 s): wait_ms is the run_ids request's
// own time, stages_ms the stage request's.
func BenchmarkOtherWriteDuringJobStages(b *testing.B) {
	t := &testing.T{}
	a := newAdminWorld(t, nil)
	a.heartbeat("ssd1", "wlm_pool")
	a.setup("77", userUID, 0)
	n := a.c.cfg.Stage.MaxPathsPerRequest
	var waited, staged time.Duration
	for i := 0; i < b.N; i++ {
		body := jobStagesBody(b, fmt.Sprint("r", i), n)
		done := make(chan time.Duration)
		go func() {
			start := time.Now()
			code, out := a.call(userUID, "POST", "/dw/v1/sessions/77/job_stages", body)
			if code != http.StatusAccepted {
				panic(fmt.Sprint(code, out))
			}
			done <- time.Since(start)
		}()
		time.Sleep(50 * time.Millisecond)
		start := time.Now()
		if code, out := a.call(userUID+1, "POST", "/dw/v1/run_ids", ""); code != http.StatusOK {
			b.Fatal(code, out)
		}
		waited += time.Since(start)
		staged += <-done
	}
	b.ReportMetric(float64(waited.Milliseconds())/float64(b.N), "wait_ms")
	b.ReportMetric(float64(staged.Milliseconds())/float64(b.N), "stages_ms")
}

// The other lists a request carries are bounded before the write transaction too, each
// refusal naming its limit: data_in's and data_out's stages, pre_run's nodes (a name
// repeated counts and is kept once), a setup's persistent instances.
func TestRequestListsAreBounded(t *testing.T) {
	a := newAdminWorld(t, func(c *config.Config) {
		c.Stage.MaxPathsPerRequest = 10
		c.Controller.MaxNodesPerRequest = 3
		c.Controller.MaxUsesPerJob = 2
	})
	a.heartbeat("ssd1", "wlm_pool")
	a.setup("77", userUID, 0)
	req := controllerapi.StagesRequest{}
	for i := 0; i < 11; i++ {
		req.Stages = append(req.Stages, lifecycle.StageRequest{Type: model.StageFile, PFSPath: fmt.Sprint("/pfs/", i), DWVar: lifecycle.VarJobStriped, DWPath: fmt.Sprint("/", i)})
	}
	body, _ := json.Marshal(req)
	for _, step := range []string{"data_in", "data_out"} {
		code, out := a.call(userUID, "POST", "/dw/v1/sessions/77/"+step, string(body))
		if code != http.StatusRequestEntityTooLarge || !strings.Contains(out, "stage.max_paths_per_request (10)") {
			t.Errorf("%s of 11 stages: %d %s", step, code, out)
		}
	}
	body, _ = json.Marshal(controllerapi.StagesRequest{Stages: req.Stages[:10]})
	a.must(userUID, "POST", "/dw/v1/sessions/77/data_in", string(body), http.StatusAccepted)

	nodes := `{"nodes":["ssd1"` + strings.Repeat(`,"ssd1"`, 10000) + `]}`
	a.must(userUID, "POST", "/dw/v1/sessions/77/pre_run", nodes, http.StatusAccepted)
	w, err := a.c.viewSession(context.Background(), "77")
	if err != nil {
		t.Fatal(err)
	}
	if got := w.SessionByToken("77").ClientNodes; len(got) != 1 {
		t.Errorf("pre_run naming ssd1 10,001 times kept %d nodes", len(got))
	}
	code, out := a.call(userUID, "POST", "/dw/v1/sessions/77/pre_run", `{"nodes":["a","b","c","d","a"]}`)
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(out, "controller.max_nodes_per_request (3)") {
		t.Errorf("pre_run of 4 nodes: %d %s", code, out)
	}
	err = a.c.Setup(context.Background(), lifecycle.Setup{Token: "78", Creator: "SLURM", Owner: userUID, Group: userUID, Uses: []string{"p1", "p2", "p3", "p1"}}, false)
	if err == nil || ErrorKind(err) != "too_large" || !strings.Contains(err.Error(), "controller.max_uses_per_job (2)") {
		t.Errorf("a setup using 3 persistent instances: %v", err)
	}
}
