package jobspec

import (
	"errors"
	"testing"

	"github.com/spillway-hpc/spillway/internal/directive"
)

// TestSetupErrorNamesTheDirective: a refused setup reads like the parser's errors, with the
// line and the directive (and its field when the refusal is about one).
func TestSetupErrorNamesTheDirective(t *testing.T) {
	s, err := directive.Parse([]byte("#!/bin/bash\n#DW jobdw type=scratch capacity=6GiB pool=nosuch\n#DW persistentdw name=ghost\necho hi\n"))
	if err != nil {
		t.Fatal(err)
	}
	original := errors.New(`pool "nosuch" does not exist; pools: wlm_pool`)
	cases := []struct{ in, want string }{
		{`pool "nosuch" does not exist; pools: wlm_pool`, `line 2: #DW jobdw pool=nosuch: pool "nosuch" does not exist; pools: wlm_pool`},
		{`pool nosuch cannot hold 6GiB (6 grains of 1GiB): 4 free; 4GiB free in the pool`, `line 2: #DW jobdw pool=nosuch capacity=6GiB: pool nosuch cannot hold 6GiB (6 grains of 1GiB): 4 free; 4GiB free in the pool`},
		{`access_mode=x: expected striped, private or loadbalance`, `line 2: #DW jobdw: access_mode=x: expected striped, private or loadbalance`},
		{`persistentdw name=ghost: no persistent instance of that name exists; create it first with #BB create_persistent name=ghost`, `line 3: #DW persistentdw name=ghost: no persistent instance of that name exists; create it first with #BB create_persistent name=ghost`},
		{`too many sessions (5, the limit controller.max_sessions); wait for some to end`, `too many sessions (5, the limit controller.max_sessions); wait for some to end`},
	}
	for _, c := range cases {
		got := SetupError(s, errors.New(c.in))
		if got.Error() != c.want {
			t.Errorf("SetupError(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
	if got := SetupError(s, original); !errors.Is(got, original) {
		t.Errorf("the controller's error must stay reachable: %v", got)
	}
	if SetupError(s, nil) != nil {
		t.Error("no error must stay no error")
	}
	// The directive is quoted as the user wrote it, not rewritten (issue 23 item 12).
	s, err = directive.Parse([]byte("#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=3.5TB\necho hi\n"))
	if err != nil {
		t.Fatal(err)
	}
	in := "pool wlm_pool cannot hold 3.18TiB (3260 grains of 1GiB): 4 free; 4GiB free in the pool"
	if got, want := SetupError(s, errors.New(in)).Error(), "line 2: #DW jobdw capacity=3.5TB: "+in; got != want {
		t.Errorf("SetupError(%q)\n got %q\nwant %q", in, got, want)
	}
	if got := CreateError(4, "create_persistent", "p", errors.New("pool x does not exist")).Error(); got != "line 4: #BB create_persistent name=p: pool x does not exist" {
		t.Errorf("CreateError: %q", got)
	}
}
