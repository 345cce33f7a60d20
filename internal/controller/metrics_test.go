package controller

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/metrics"
	"github.com/spillway-hpc/spillway/internal/model"
)

// world is a state of n job sessions on 8 storage nodes, each with an instance of one
// fragment, a mount and two stages.
func world(n int) *lifecycle.World {
	w := lifecycle.NewWorld()
	w.Pools["wlm_pool"] = &model.Pool{Name: "wlm_pool", Granularity: 1 << 30}
	for i := range 8 {
		name := fmt.Sprintf("nid%05d", i)
		w.Nodes[name] = &model.Node{Name: name, Pool: "wlm_pool", Capacity: 1 << 40, Online: true}
	}
	phases := []string{lifecycle.PhaseSetup, lifecycle.PhaseDataIn, lifecycle.PhasePreRun, lifecycle.PhasePostRun}
	for i := range int64(n) {
		w.Sessions[i] = &model.Session{ID: i, Token: fmt.Sprint(i), Phase: phases[i%4]}
		w.Instances[i] = &model.Instance{ID: i, SessionID: i, Pool: "wlm_pool", Capacity: 1 << 30}
		w.Fragments[i] = &model.Fragment{ID: i, InstanceID: i, Node: fmt.Sprintf("nid%05d", i%8), Capacity: 1 << 30}
		w.Activations[i] = &model.Activation{ID: i, SessionID: i, State: model.State{Goal: model.GoalCreate}}
		w.Stages[2*i] = &model.Stage{ID: 2 * i, SessionID: i, Direction: model.StageIn, Status: model.StageComplete}
		w.Stages[2*i+1] = &model.Stage{ID: 2*i + 1, SessionID: i, Direction: model.StageOut, Status: model.StagePending}
	}
	return w
}

func scrapeController(t testing.TB, m *controllerMetrics) metrics.Scrape {
	t.Helper()
	rec := httptest.NewRecorder()
	metrics.Handler(m.reg).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	s, err := metrics.Parse(bytes.NewReader(rec.Body.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A stage is counted once, when a pass first sees it ended; stages that had ended before the
// controller started were counted by the one before it (counters restart at zero).
func TestStagesAreCountedOnceWhenTheyEnd(t *testing.T) {
	m := newControllerMetrics(&Controller{inflight: map[lifecycle.EffectKey]bool{}})
	w := world(4) // 4 stage-ins complete already
	m.pass(w, 0)
	s := scrapeController(t, m)
	if v := s.Samples[`spillway_stage_ended_total{direction="in",status="complete"}`]; v != 0 {
		t.Errorf("stages that ended before the first pass were counted: %v", v)
	}
	start := time.Unix(1000, 0)
	st := w.Stages[1] // a stage-out ends
	st.Status, st.BytesDone, st.Started, st.Finished = model.StageComplete, 12345, start, start.Add(3*time.Second)
	m.pass(w, 0)
	m.pass(w, 0)
	s = scrapeController(t, m)
	for sample, want := range map[string]float64{
		`spillway_stage_ended_total{direction="out",status="complete"}`: 1,
		`spillway_stage_bytes_total{direction="out"}`:                   12345,
		`spillway_stage_duration_seconds_sum{direction="out"}`:          3,
		`spillway_stages{direction="out",status="pending"}`:             3,
		`spillway_sessions{kind="job",phase="setup"}`:                   1,
		`spillway_pool_allocated_bytes{pool="wlm_pool"}`:                4 << 30,
		`spillway_executor_passes_total`:                                3,
	} {
		if v, ok := s.Samples[sample]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", sample, v, ok, want)
		}
	}
}

// What one scrape of the controller costs with n sessions in the state:
//
//	go test -run '^$' -bench Scrape -benchmem ./internal/controller
func BenchmarkScrape(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprint(n, "-sessions"), func(b *testing.B) {
			m := newControllerMetrics(&Controller{inflight: map[lifecycle.EffectKey]bool{}})
			m.pass(world(n), 0)
			for b.Loop() {
				scrapeController(b, m)
			}
		})
	}
}

// Each effect is counted by operation and outcome; one on an object whose earlier attempt
// failed is a retry.
func TestEffectsCountOutcomesAndRetries(t *testing.T) {
	m := newControllerMetrics(&Controller{inflight: map[lifecycle.EffectKey]bool{}})
	w := world(2)
	create := lifecycle.Effect{Op: lifecycle.OpCreateFragment, Ref: lifecycle.Ref{Kind: lifecycle.KindFragment, ID: 0}}
	m.effect(w, create, 2*time.Second, fmt.Errorf("disk refused"))
	w.Fragments[0].State.Attempts = 1
	m.effect(w, create, time.Second, nil)
	m.effect(w, lifecycle.Effect{Op: lifecycle.OpMount, Ref: lifecycle.Ref{Kind: lifecycle.KindActivation, ID: 1}}, time.Second, nil)
	s := scrapeController(t, m)
	for sample, want := range map[string]float64{
		`spillway_executor_effects_total{op="create-fragment",outcome="failed"}`: 1,
		`spillway_executor_effects_total{op="create-fragment",outcome="ok"}`:     1,
		`spillway_executor_retries_total{op="create-fragment"}`:                  1,
		`spillway_executor_effects_total{op="mount",outcome="ok"}`:               1,
		`spillway_executor_retries_total{op="mount"}`:                            0,
		`spillway_executor_effect_duration_seconds_count{op="create-fragment"}`:  2,
		`spillway_executor_effect_duration_seconds_sum{op="create-fragment"}`:    3,
		`spillway_executor_in_flight`:                                            0,
	} {
		if v, ok := s.Samples[sample]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", sample, v, ok, want)
		}
	}
}
