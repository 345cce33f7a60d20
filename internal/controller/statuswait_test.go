package controller

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// statusGuard is how long a test lets a status request take before calling it stuck: far above
// any bound under test, so only a wait that ignores its bound trips it.
const statusGuard = 30 * time.Second

// askStatus sends a status request with ?wait= in the background and returns its answer.
func (a *adminWorld) askStatus(token, wait string) <-chan lifecycle.StepStatus {
	got := make(chan lifecycle.StepStatus, 1)
	go func() {
		code, body := a.call(rootUID, "GET", "/dw/v1/sessions/"+token+"/status?step=setup&wait="+wait, "")
		var st lifecycle.StepStatus
		if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
			a.t.Errorf("status: %d %s", code, body)
		}
		got <- st
	}()
	return got
}

// A status request asking to wait an hour answers after controller.max_status_wait when the
// job does not change: a client can never hold a request past the server's bound.
func TestStatusWaitIsBoundedByMaxStatusWait(t *testing.T) {
	a := newAdminWorld(t, func(c *config.Config) {
		c.Controller.MaxStatusWait = config.Duration(50 * time.Millisecond)
		c.Controller.RequestTimeout = config.Duration(4 * time.Hour) // only max_status_wait bounds the wait
	})
	a.heartbeat("bb1", "wlm_pool")
	a.setup("11", userUID, 0) // no executor pass runs: the setup stays pending
	select {
	case st := <-a.askStatus("11", "1h"):
		if st.Done || st.Failed {
			t.Fatalf("setup ended without an executor pass: %+v", st)
		}
	case <-time.After(statusGuard):
		t.Fatal("a status wait of 1h was not cut to controller.max_status_wait (50ms)")
	}
}

// A long poll answers at the change of its job, not at the end of its wait: the setup fails
// (no agent answers) while the request waits, and the request returns the failure.
func TestStatusWaitAnswersAtTheJobsChange(t *testing.T) {
	a := newAdminWorld(t, func(c *config.Config) { c.Controller.MaxStatusWait = config.Duration(time.Hour) })
	a.heartbeat("bb1", "wlm_pool")
	a.setup("12", userUID, 0)
	got := a.askStatus("12", "1h")
	for waiting := false; !waiting; time.Sleep(time.Millisecond) { // the request waits before the change
		a.c.changeMu.Lock()
		waiting = len(a.c.sessionWaits) > 0
		a.c.changeMu.Unlock()
	}
	a.settle() // every effect fails: the setup fails
	select {
	case st := <-got:
		if !st.Failed {
			t.Fatalf("status after the setup failed: %+v", st)
		}
	case <-time.After(statusGuard):
		t.Fatal("the waiting status request did not answer when its setup failed")
	}
}
