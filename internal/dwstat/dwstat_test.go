package dwstat

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/views"
)

func sample() views.All {
	return views.All{
		Pools: []views.Pool{{ID: "wlm_pool", Units: "bytes", Granularity: 1 << 30, Quantity: 7454, Free: 7453}},
		Sessions: []views.Session{{ID: 3, Token: "1234", Creator: "SLURM", Owner: 1001, Created: 1700000000,
			State: views.State{Goal: "create", Actualized: true}, Links: views.SessionLinks{ClientNodes: []string{"nid1", "nid2"}}}},
		Instances: []views.Instance{{ID: 4, Capacity: views.Capacity{Bytes: 1 << 30, Nodes: 1}, Created: 1700000000, Intact: true, Label: "I4-0",
			Links: views.InstanceLinks{Configurations: []int64{5}, Session: 3}, State: views.State{Goal: "create", Actualized: true}}},
		Configurations: []views.Configuration{{ID: 5, Type: "scratch", AccessType: "stripe", Links: views.ConfigurationLink{Instance: 4}, State: views.State{Goal: "destroy", Transitioning: true}}},
	}
}

func TestHeadersMatchWhatSlurmAndScriptsParse(t *testing.T) {
	a := sample()
	o := Options{Location: time.UTC}
	// The regexes of Slurm's test35.5.
	checks := map[string]string{
		"pools":          `pool *units *quantity *free *gran`,
		"configurations": `conf *state *inst *type *activs`,
		"sessions":       `sess *state *token *creator *owner *created *expiration *nodes`,
	}
	for tbl, re := range checks {
		out := Render(a, []string{tbl}, false, o)
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("%s: %q does not match %s", tbl, out, re)
		}
	}
	out := Render(a, []string{"pools"}, false, o)
	if !strings.Contains(out, "    pool units quantity    free gran\nwlm_pool bytes  7.28TiB 7.28TiB 1GiB\n") {
		t.Errorf("pools row: %q", out)
	}
	if out := Render(a, []string{"pools"}, false, Options{Bytes: true}); !strings.Contains(out, "1073741824") {
		t.Errorf("-b prints bytes: %q", out)
	}
	out = Render(a, []string{"sessions"}, false, o)
	if !strings.Contains(out, "   3 CA---  1234   SLURM  1001 2023-11-14T22:13:20      never     2") {
		t.Errorf("sessions row: %q", out)
	}
	if out := Render(a, []string{"configurations"}, false, o); !strings.Contains(out, "D--T-") {
		t.Errorf("configurations state flags: %q", out)
	}
}

func TestEmptyMessages(t *testing.T) {
	var a views.All
	if out := Render(a, []string{"sessions"}, false, Options{}); out != "no sessions\n" {
		t.Errorf("%q", out)
	}
	if out := Render(a, []string{"configurations"}, false, Options{}); out != "no scratch, cache, swap configurations\n" {
		t.Errorf("%q", out)
	}
	a = sample()
	out := Render(a, Most, true, Options{})
	if !strings.HasSuffix(out, "did not find any cache configurations, swap configurations, registrations, activations\n") {
		t.Errorf("most summary: %q", out)
	}
}

func TestResolve(t *testing.T) {
	got, summary, err := Resolve([]string{"instances", "frag"})
	if err != nil || strings.Join(got, ",") != "instances,fragments" || summary {
		t.Fatalf("%v %v %v", got, summary, err)
	}
	if got, _, _ := Resolve(nil); len(got) != 1 || got[0] != "pools" {
		t.Fatalf("no words: %v", got)
	}
	if _, _, err := Resolve([]string{"bogus"}); err == nil || !strings.Contains(err.Error(), "most, all") {
		t.Fatalf("unknown table: %v", err)
	}
	got, summary, _ = Resolve([]string{"all"})
	if len(got) != len(Tables) || !summary {
		t.Fatalf("all: %v", got)
	}
}
