package runjob

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// fakeController answers teardown with an error `failures` times, then accepts it; the
// session is then gone.
func fakeController(t *testing.T, failures int32) (*apiclient.Client, *atomic.Int32) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("POST /dw/v1/sessions/{token}/teardown", func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= failures {
			w.WriteHeader(500)
			json.NewEncoder(w).Encode(map[string]string{"error": "the state database is busy", "kind": "internal"})
			return
		}
		w.WriteHeader(202)
		json.NewEncoder(w).Encode(map[string]string{"token": r.PathValue("token")})
	})
	mux.HandleFunc("GET /dw/v1/sessions/{token}/status", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(lifecycle.StepStatus{Token: r.PathValue("token"), Step: "teardown", Done: true})
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	c, err := apiclient.New("unix:"+sock, apiclient.Options{ConnectRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	return c, &calls
}

// TestTeardownIsAskedTeardownAttemptsTimes: a refused teardown is asked again, up to
// client.teardown_attempts times with client.teardown_retry_wait between, and the failure
// names the limit.
func TestTeardownIsAskedTeardownAttemptsTimes(t *testing.T) {
	for _, c := range []struct {
		attempts, failures int32
		released           bool
	}{{3, 2, true}, {2, 2, false}, {1, 0, true}, {5, 4, true}} {
		client, calls := fakeController(t, c.failures)
		var out bytes.Buffer
		r := newRunner(context.Background(), Options{Client: client, Out: &out, Poll: time.Millisecond,
			TeardownAttempts: int(c.attempts), TeardownRetryWait: time.Millisecond})
		r.token = "run1"
		released := r.teardown(false)
		r.in.stop()
		if released != c.released {
			t.Errorf("attempts %d, failures %d: released %v, want %v\n%s", c.attempts, c.failures, released, c.released, out.String())
		}
		if want := min(c.attempts, c.failures+1); calls.Load() != want {
			t.Errorf("attempts %d, failures %d: %d teardown requests, want %d", c.attempts, c.failures, calls.Load(), want)
		}
		if !c.released && !strings.Contains(out.String(), "asked 2 times, client.teardown_attempts") {
			t.Errorf("the failure must name the limit:\n%s", out.String())
		}
	}
}

// TestProcStartTellsAReusedPid: a run's owner is its pid and start time; another start time
// is another process.
func TestProcStartTellsAReusedPid(t *testing.T) {
	start, err := ProcStart(os.Getpid())
	if err != nil || start == 0 {
		t.Fatalf("ProcStart: %d %v", start, err)
	}
	if !Alive(os.Getpid(), start) {
		t.Error("this process must be alive")
	}
	if Alive(os.Getpid(), start+1) {
		t.Error("another start time must be another process")
	}
	if Alive(1<<30, start) {
		t.Error("a pid that does not exist must not be alive")
	}
}

// TestCommandsAreQuoted: printed commands survive a copy into a shell.
func TestCommandsAreQuoted(t *testing.T) {
	retry, discard := Commands([]string{"/opt/my tools/spillway"}, []string{"--home", "/home/a b"}, "run7", 12)
	if retry != `'/opt/my tools/spillway' run --home '/home/a b' --retry-stage-out run7` {
		t.Errorf("retry: %s", retry)
	}
	if discard != `'/opt/my tools/spillway' dwcli rm session -i 12 --hurry --home '/home/a b'` {
		t.Errorf("discard: %s", discard)
	}
}

// TestDataOutCountsOnlyWhatItRan: the data_out summary counts the stages data_out itself ran
// or waited for, not the job's own stage-outs (libdatawarp, dwcli stage) that had ended
// before it: here one stage-out the job finished itself (3 files) and one deferred to the
// job's end that data_out runs (2 files, 100 bytes). Issue 23 item 18.
func TestDataOutCountsOnlyWhatItRan(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	own := lifecycle.StageProgress{ID: 1, Direction: "out", Type: "file", Status: "complete", FilesTotal: 3, FilesDone: 3, BytesTotal: 1 << 20, BytesDone: 1 << 20}
	deferred := lifecycle.StageProgress{ID: 2, Direction: "out", Type: "file", Status: "deferred", FilesTotal: 2}
	var asked atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("POST /dw/v1/sessions/{token}/data_out", func(w http.ResponseWriter, r *http.Request) {
		asked.Store(true)
		w.WriteHeader(202)
		json.NewEncoder(w).Encode(map[string]string{"token": r.PathValue("token")})
	})
	mux.HandleFunc("GET /dw/v1/sessions/{token}/status", func(w http.ResponseWriter, r *http.Request) {
		st := lifecycle.StepStatus{Token: r.PathValue("token"), Step: "data_out", Exists: true, Stages: []lifecycle.StageProgress{own, deferred}}
		if asked.Load() {
			ran := deferred
			ran.Status, ran.FilesDone, ran.BytesTotal, ran.BytesDone = "complete", 2, 100, 100
			st.Stages, st.Done = []lifecycle.StageProgress{own, ran}, true
		}
		json.NewEncoder(w).Encode(st)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	client, err := apiclient.New("unix:"+sock, apiclient.Options{ConnectRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r := newRunner(context.Background(), Options{Client: client, Out: &out, Poll: time.Millisecond})
	r.token = "run1"
	_, ok := r.stage(context.Background(), "out", nil)
	r.in.stop()
	if !ok {
		t.Fatalf("data_out failed:\n%s", out.String())
	}
	if !strings.Contains(out.String(), " 1 stage(s), 2 file(s), 100B") || !strings.Contains(out.String(), "1 stage(s) the job ran itself had ended before") {
		t.Fatalf("the data_out line must count the one stage it ran, and say the job's own apart:\n%s", out.String())
	}
}
