package lifecycle

import (
	"errors"
	"strings"
	"testing"
)

// The site's write-protection defaults reach the fragments and namespaces the agents are asked
// to make: the write limit of each fragment is the multiplier times its capacity, the window
// length the instance's, and a max_mds namespace's MFC is shared among its shards.
func TestWriteLimitsReachTheAgents(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2", "ssd3")
	h.p.Limits = WriteLimits{WindowLength: 3600, Multiplier: 4, FilesCreated: 100}
	req := jobSetup("42", 3<<30, "striped")
	req.Instance.MaxMDS = true
	h.must(ApplySetup(h.w, req, h, h.p, h.now))
	effects := Step(h.w, h.p, h.now)
	frags := 0
	for _, e := range effects {
		if e.Op == OpCreateFragment {
			frags++
			if f := e.Fragment; f.WriteLimit != 4*f.Capacity || f.WriteWindowLength != 3600 || f.Job != "42" {
				t.Errorf("fragment spec %+v: want write limit 4 × capacity within 3600 s", f)
			}
		}
	}
	if frags != 3 {
		t.Fatalf("%d fragments, want 3", frags)
	}
	h.settle()
	found := 0
	for _, c := range h.w.Configurations {
		if c.MaxFilesCreated != 100 {
			t.Errorf("configuration MFC %d, want the site's default 100", c.MaxFilesCreated)
		}
	}
	// The namespaces were asked for with each shard's share: ceil(100/3) = 34.
	h2 := newHarness(t, "ssd1", "ssd2", "ssd3")
	h2.p = h.p
	h2.must(ApplySetup(h2.w, req, h2, h2.p, h2.now))
	for i := 0; i < 20 && found == 0; i++ {
		for _, e := range Step(h2.w, h2.p, h2.now) {
			if e.Op == OpCreateNamespace {
				found++
				if e.Namespace.MaxFilesCreated != 34 {
					t.Errorf("shard namespace spec MFC %d, want 34 (100 over 3 shards)", e.Namespace.MaxFilesCreated)
				}
			}
			Complete(h2.w, e, Result{}, h2.p, h2.now)
			h2.w.TakeChanges()
		}
	}
	if found != 3 {
		t.Errorf("%d namespace shards asked for, want 3", found)
	}
}

// A job asking past the site's bounds is refused with the directive's field, the bound and
// the fix; within them it gets what it asked.
func TestWriteLimitsBounds(t *testing.T) {
	lim := WriteLimits{WindowLengthMin: 600, Multiplier: 10, MultiplierMax: 20, FilesCreated: 1000, FilesCreatedMax: 5000}
	for _, c := range []struct {
		req  InstanceRequest
		want []string
	}{
		{InstanceRequest{WriteWindowLength: 60}, []string{"write_window_length=60", "600", "write_window_length_minimum"}},
		{InstanceRequest{WriteWindowMultiplier: 50}, []string{"write_window_multiplier=50", "maximum of 20", "write_window_multiplier=20 or less"}},
		{InstanceRequest{MaxFilesCreated: 10000}, []string{"MFC=10000", "maximum of 5000", "files_created_maximum", "MFC=5000 or less"}},
	} {
		err := lim.Check(c.req)
		var ue *UserError
		if !errors.As(err, &ue) {
			t.Errorf("%+v: %v, want a user error", c.req, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %q lacks %q", c.req, err, w)
			}
		}
	}
	if err := lim.Check(InstanceRequest{WriteWindowLength: 600, WriteWindowMultiplier: 20, MaxFilesCreated: 5000}); err != nil {
		t.Errorf("a request at the bounds: %v", err)
	}
	h := newHarness(t, "ssd1")
	h.p.Limits = lim
	req := jobSetup("43", 1<<30, "striped")
	req.Instance.WriteWindowMultiplier = 21
	if err := ApplySetup(h.w, req, h, h.p, h.now); err == nil || !strings.Contains(err.Error(), "write_window_multiplier=21") {
		t.Errorf("setup past the maximum: %v", err)
	}
	if WriteLimit(0, 1<<30) != 0 || WriteLimit(3, 1<<30) != 3<<30 || WriteLimit(1<<40, 1<<40) != ^uint64(0) {
		t.Error("WriteLimit arithmetic")
	}
}
