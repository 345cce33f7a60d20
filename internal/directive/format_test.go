package directive

import (
	"reflect"
	"testing"
)

// corpus is a set of accepted scripts covering every directive and option; it seeds the fuzz
// target too.
var corpus = []string{
	"#!/bin/bash\n#SBATCH -N 2\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n#DW stage_in type=file source=/pfs/in destination=$DW_JOB_STRIPED/in\n#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination=/pfs/out.%j\nsrun a\n\x00",
	"#!/bin/bash\n#DW jobdw capacity=3.5TB access_mode=private,striped(MFS=16GiB,MFC=1000,client_cache) pool=wlm_pool max_mds=yes optimization_strategy=interference write_window_length=3600 write_window_multiplier=3",
	"#DW jobdw type=cache access_mode=ldbal pfs=/lustre/proj capacity=100TiB modified_threshold=256MiB read_ahead=8MiB sync_on_close=yes sync_to_pfs=no\r\n",
	"#DW jobdw capacity=1GiB access_mode=striped(client_cache=no) max_mds=no\n#DW swap 1.5KB pool=wlm_pool\n",
	"#DW jobdw capacity=10 access_mode=loadbalance\n#DW stage_in type=directory source=/ref destination=${DW_JOB_LDBAL}/ref/\n",
	"#DW persistentdw name=alpha\n#DW persistentdw name=_b2\n#DW stage_in type=list source=/pfs/list destination=$DW_PERSISTENT_STRIPED_alpha\n#DW stage_out type=list source=/pfs/out.list destination=/pfs/results\n#DW stage_out type=file source=${DW_PERSISTENT_STRIPED__b2}/x/../y destination=%d/y\n",
	"#BB create_persistent name=alpha capacity=32GB access=striped type=scratch\n#BB create_persistent name=beta capacity=1.5TB access_mode=loadbalance pool=p optimization_strategy=interference\n#BB destroy_persistent name=gamma hurry\n#BB destroy_persistent name=delta\n",
	"#!/bin/sh\n#DW jobdw type=scratch \\\n#DW     capacity=5GiB \\\n#DWaccess_mode=striped\n#DW swap 3TiB\n",
	"#DW jobdw capacity=1GiB type=cache pfs=/a access_mode=striped(MFS=0,MFC=0)\n",
	"#DW jobdw capacity=1GiB write_window_length=86400 write_window_multiplier=10 optimization_strategy=bandwidth type=scratch access_mode=striped\n",
	"#DW jobdw capacity=1GiB\n#DW stage_out type=file source=$DW_JOB_STRIPED/a\\b destination=/p/x%%y\n",
}

// withoutLines clears what Format cannot keep: line numbers and warnings.
func withoutLines(s *Script) *Script {
	c := *s
	c.Warnings = nil
	if s.JobDW != nil {
		j := *s.JobDW
		j.Line, j.CapacityText = 0, ""
		c.JobDW = &j
	}
	c.JobDWs = nil
	for _, x := range s.JobDWs {
		j := *x
		j.Line, j.CapacityText = 0, ""
		c.JobDWs = append(c.JobDWs, &j)
	}
	if s.Swap != nil {
		w := *s.Swap
		w.Line = 0
		c.Swap = &w
	}
	c.Persistent = append([]PersistentDW(nil), s.Persistent...)
	for i := range c.Persistent {
		c.Persistent[i].Line = 0
	}
	c.StageIn = append([]Stage(nil), s.StageIn...)
	for i := range c.StageIn {
		c.StageIn[i].Line = 0
	}
	c.StageOut = append([]Stage(nil), s.StageOut...)
	for i := range c.StageOut {
		c.StageOut[i].Line = 0
	}
	c.Create = append([]CreatePersistent(nil), s.Create...)
	for i := range c.Create {
		c.Create[i].Line = 0
	}
	c.Destroy = append([]DestroyPersistent(nil), s.Destroy...)
	for i := range c.Destroy {
		c.Destroy[i].Line = 0
	}
	return &c
}

// checkRoundTrip fails unless Parse(Format(s)) equals s apart from lines and warnings.
func checkRoundTrip(t *testing.T, s *Script) {
	t.Helper()
	text := Format(s)
	back, err := Parse([]byte(text))
	if err != nil {
		t.Fatalf("Format output does not parse:\n%s\n%v", text, err)
	}
	if a, b := withoutLines(s), withoutLines(back); !reflect.DeepEqual(a, b) {
		t.Fatalf("round trip changed the script:\nformat:\n%s\nbefore %+v\nafter  %+v", text, a, b)
	}
	if again := Format(back); again != text {
		t.Fatalf("Format is not stable:\n%s\n%s", text, again)
	}
}

func TestFormatRoundTrip(t *testing.T) {
	for _, src := range corpus {
		checkRoundTrip(t, accept(t, src))
	}
}

func TestFormatCanonical(t *testing.T) {
	s := accept(t, "#DW stage_in destination=$DW_JOB_STRIPED/a source=/p/a type=file\n"+
		"#BB destroy_persistent hurry name=old\n"+
		"#DW jobdw capacity=2048MiB access_mode=private,striped(client_cache) type=scratch\n"+
		"#DW persistentdw name=p\n"+
		"#DW swap 1024MiB\n")
	want := "#DW jobdw type=scratch access_mode=striped(client_cache=yes),private capacity=2GiB\n" +
		"#DW swap 1GiB\n" +
		"#DW persistentdw name=p\n" +
		"#DW stage_in type=file source=/p/a destination=$DW_JOB_STRIPED/a\n" +
		"#BB destroy_persistent name=old hurry\n"
	if got := Format(s); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if Format(&Script{}) != "" {
		t.Error("an empty script formats to text")
	}
}

func TestFormatProgrammaticScript(t *testing.T) {
	// A Script built in code, without Given, still renders its non-default values.
	s := &Script{JobDW: &JobDW{Type: "cache", AccessModes: []string{"striped"}, Capacity: 1 << 30, PFS: "/p",
		OptimizationStrategy: "bandwidth", WriteWindowLength: 86400, WriteWindowMultiplier: 10, SyncOnClose: true}}
	want := "#DW jobdw type=cache capacity=1GiB pfs=/p sync_on_close=yes\n"
	if got := Format(s); got != want {
		t.Errorf("got %q want %q", got, want)
	}
}
