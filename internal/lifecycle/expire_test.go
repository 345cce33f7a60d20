package lifecycle

import (
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/model"
)

func persistentSetup(name string, expiration int64) Setup {
	return Setup{Token: name, Creator: "CLI", Owner: 1001, Group: 1001, Persistent: true, Expiration: expiration,
		Instance: &InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}
}

func TestExpiredPersistentInstanceIsDestroyed(t *testing.T) {
	h := newHarness(t, "ssd1")
	at := h.now.Add(time.Hour).Unix()
	h.must(ApplySetup(h.w, persistentSetup("pers", at), h, h.p, h.now))
	h.settle()
	s := h.w.SessionByToken("pers")
	if s.Expiration != at || s.Expired || s.State.Goal != model.GoalCreate {
		t.Fatalf("before its expiration: %+v", s)
	}
	h.now = time.Unix(at, 0)
	h.settle()
	if s := h.w.SessionByToken("pers"); s != nil {
		t.Fatalf("an expired persistent instance must be destroyed: %+v", s)
	}
	if len(h.w.Fragments) != 0 || len(h.w.Instances) != 0 {
		t.Fatalf("its fragments must be freed: %d fragments, %d instances", len(h.w.Fragments), len(h.w.Instances))
	}
	var deletes int
	for _, op := range h.log {
		if op == OpDeleteFragment {
			deletes++
		}
	}
	if deletes == 0 {
		t.Fatal("the executor must have deleted the fragment on its node")
	}
}

func TestExpiredPersistentWaitsForItsJobsAndRefusesNewOnes(t *testing.T) {
	h := newHarness(t, "ssd1")
	at := h.now.Add(time.Hour).Unix()
	h.must(ApplySetup(h.w, persistentSetup("pers", at), h, h.p, h.now))
	h.settle()
	job := jobSetup("42", 0)
	job.Instance, job.Uses = nil, []string{"pers"}
	h.must(ApplySetup(h.w, job, h, h.p, h.now))
	h.settle()

	h.now = time.Unix(at+1, 0)
	h.settle()
	s := h.w.SessionByToken("pers")
	if s == nil || !s.Expired || s.State.Goal != model.GoalCreate {
		t.Fatalf("a persistent instance in use by a running job is kept, marked expired: %+v", s)
	}
	job2 := jobSetup("43", 0)
	job2.Instance, job2.Uses = nil, []string{"pers"}
	err := ApplySetup(h.w, job2, h, h.p, h.now)
	if err == nil || !strings.Contains(err.Error(), "persistentdw name=pers: the persistent instance expired at") {
		t.Fatalf("a new job using an expired instance must be refused, saying why: %v", err)
	}
	if err := ApplySetup(h.w, persistentSetup("pers", 0), h, h.p, h.now); err == nil || !strings.Contains(err.Error(), "expired at") {
		t.Fatalf("creating an expired instance again must not pass for done: %v", err)
	}
	h.must(ApplyTeardown(h.w, "42", false))
	h.settle()
	h.settle() // the executor steps every executor.tick: the next step sees the job gone
	if s := h.w.SessionByToken("pers"); s != nil {
		t.Fatalf("once its last job is gone the expired instance is destroyed: %+v", s)
	}
}

func TestJobSessionsNeverExpire(t *testing.T) {
	h := newHarness(t, "ssd1")
	job := jobSetup("42", 1<<30)
	job.Expiration = h.now.Add(time.Hour).Unix()
	err := ApplySetup(h.w, job, h, h.p, h.now)
	if err == nil || !strings.Contains(err.Error(), "only persistent instances expire") {
		t.Fatalf("a job with an expiration must be refused: %v", err)
	}
	h.p.PersistentExpiration = time.Minute // the site default concerns persistent instances only
	h.must(ApplySetup(h.w, jobSetup("42", 1<<30), h, h.p, h.now))
	h.settle()
	h.now = h.now.Add(24 * time.Hour)
	h.settle()
	if s := h.w.SessionByToken("42"); s == nil || s.Expiration != 0 || s.State.Goal != model.GoalCreate {
		t.Fatalf("a job session lives as long as its job: %+v", s)
	}
}

func TestPersistentExpirationDefaultsAndMaximum(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	p := Params{}
	cases := []struct {
		name          string
		def, max      time.Duration
		asked         int64
		want          int64
		wantErrSubstr string
	}{
		{"no default: never", 0, 0, 0, 0, ""},
		{"asked never", time.Hour, 0, ExpirationNever, 0, ""},
		{"site default", time.Hour, 0, 0, now.Add(time.Hour).Unix(), ""},
		{"maximum as default", 0, 2 * time.Hour, 0, now.Add(2 * time.Hour).Unix(), ""},
		{"asked within the maximum", time.Hour, 2 * time.Hour, now.Unix() + 90*60, now.Unix() + 90*60, ""},
		{"asked past the maximum", 0, 2 * time.Hour, now.Unix() + 3*3600, 0, "controller.max_persistent_expiration"},
		{"never past a maximum", 0, 2 * time.Hour, ExpirationNever, 0, "controller.max_persistent_expiration"},
		{"in the past", 0, 0, now.Unix() - 1, 0, "is not in the future"},
		{"negative", 0, 0, -5, 0, "seconds since the epoch"},
	}
	for _, c := range cases {
		p.PersistentExpiration, p.MaxPersistentExpiration = c.def, c.max
		got, err := expirationFor(persistentSetup("p", c.asked), p, now)
		if c.wantErrSubstr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErrSubstr) {
				t.Errorf("%s: want an error with %q, got %v (%d)", c.name, c.wantErrSubstr, err, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %d, %v; want %d", c.name, got, err, c.want)
		}
	}
}
