package directive

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestJobDWDefaults(t *testing.T) {
	s := accept(t, header+"#DW jobdw capacity=100GiB\n")
	j := s.JobDW
	if j == nil {
		t.Fatal("no JobDW")
	}
	want := JobDW{Line: 3, Type: "scratch", AccessModes: []string{"striped"}, Capacity: 100 << 30,
		OptimizationStrategy: "bandwidth", WriteWindowLength: 86400, WriteWindowMultiplier: 10, Given: []string{"capacity"}}
	if !equalJobDW(*j, want) {
		t.Errorf("got %+v\nwant %+v", *j, want)
	}
	if got := j.EnvVars(); !slices.Equal(got, []string{VarJobStriped}) {
		t.Errorf("EnvVars = %v", got)
	}
}

// equalJobDW compares two parsed directives, apart from the capacity's text as written.
func equalJobDW(a, b JobDW) bool {
	a.CapacityText, b.CapacityText = "", ""
	return reflect.DeepEqual(a, b)
}

func TestJobDWOptions(t *testing.T) {
	cases := []struct {
		name  string
		line  string
		check func(j *JobDW) bool
	}{
		{"type scratch", "type=scratch capacity=1GiB", func(j *JobDW) bool { return j.Type == "scratch" && j.Explicit("type") }},
		{"type cache", "type=cache pfs=/lustre/me/run capacity=1GiB", func(j *JobDW) bool { return j.Type == "cache" && j.PFS == "/lustre/me/run" }},
		{"cache loadbalance", "type=cache access_mode=ldbalance pfs=/lustre/x capacity=1GiB", func(j *JobDW) bool {
			return slices.Equal(j.AccessModes, []string{"loadbalance"}) && slices.Equal(j.EnvVars(), []string{VarJobLoadbalanceCache})
		}},
		{"cache striped env", "type=cache pfs=/lustre/x capacity=1GiB", func(j *JobDW) bool { return slices.Equal(j.EnvVars(), []string{VarJobStripedCache}) }},
		{"striped", "access_mode=striped capacity=1GiB", func(j *JobDW) bool { return slices.Equal(j.AccessModes, []string{"striped"}) }},
		{"private", "access_mode=private capacity=1GiB", func(j *JobDW) bool {
			return slices.Equal(j.AccessModes, []string{"private"}) && slices.Equal(j.EnvVars(), []string{VarJobPrivate})
		}},
		{"striped,private", "access_mode=striped,private capacity=1GiB", func(j *JobDW) bool {
			return slices.Equal(j.AccessModes, []string{"striped", "private"}) && slices.Equal(j.EnvVars(), []string{VarJobStriped, VarJobPrivate})
		}},
		{"private,striped is the same", "access_mode=private,striped capacity=1GiB", func(j *JobDW) bool { return slices.Equal(j.AccessModes, []string{"striped", "private"}) }},
		{"loadbalance", "access_mode=loadbalance capacity=1GiB", func(j *JobDW) bool {
			return slices.Equal(j.AccessModes, []string{"loadbalance"}) && slices.Equal(j.EnvVars(), []string{VarJobLoadbalance})
		}},
		{"ldbalance alias", "access_mode=ldbalance capacity=1GiB", func(j *JobDW) bool { return slices.Equal(j.AccessModes, []string{"loadbalance"}) }},
		{"ldbal alias", "access_mode=ldbal capacity=1GiB", func(j *JobDW) bool { return slices.Equal(j.AccessModes, []string{"loadbalance"}) }},
		{"MFS", "access_mode=striped(MFS=16GiB) capacity=1TiB", func(j *JobDW) bool { return j.MaxFileSize == 16<<30 && j.Explicit("MFS") && !j.ClientCache }},
		{"MFS and client_cache", "access_mode=striped(MFS=10GiB,client_cache) capacity=1TiB", func(j *JobDW) bool { return j.MaxFileSize == 10<<30 && j.ClientCache }},
		{"client_cache=yes", "access_mode=striped(client_cache=yes) capacity=1GiB", func(j *JobDW) bool { return j.ClientCache && j.Explicit("client_cache") }},
		{"client_cache=no", "access_mode=striped(client_cache=no) capacity=1GiB", func(j *JobDW) bool { return !j.ClientCache && j.Explicit("client_cache") }},
		{"MFC", "access_mode=striped(MFC=100000) capacity=1GiB", func(j *JobDW) bool { return j.MaxFilesCreated == 100000 && j.Explicit("MFC") }},
		{"suboptions on the second mode", "access_mode=private,striped(MFS=1GiB) capacity=1GiB", func(j *JobDW) bool {
			return j.MaxFileSize == 1<<30 && slices.Equal(j.AccessModes, []string{"striped", "private"})
		}},
		{"all suboptions", "access_mode=striped(MFS=1MiB,MFC=7,client_cache=true) capacity=1GiB", func(j *JobDW) bool {
			return j.MaxFileSize == 1<<20 && j.MaxFilesCreated == 7 && j.ClientCache
		}},
		{"pool", "capacity=1GiB pool=sm_pool", func(j *JobDW) bool { return j.Pool == "sm_pool" }},
		{"max_mds=yes", "capacity=1GiB max_mds=yes", func(j *JobDW) bool { return j.MaxMDS }},
		{"max_mds=no", "capacity=1GiB max_mds=no", func(j *JobDW) bool { return !j.MaxMDS && j.Explicit("max_mds") }},
		{"interference", "capacity=1GiB optimization_strategy=interference", func(j *JobDW) bool { return j.OptimizationStrategy == "interference" }},
		{"bandwidth", "capacity=1GiB optimization_strategy=bandwidth", func(j *JobDW) bool { return j.OptimizationStrategy == "bandwidth" }},
		{"write window", "capacity=1GiB write_window_length=3600 write_window_multiplier=4", func(j *JobDW) bool {
			return j.WriteWindowLength == 3600 && j.WriteWindowMultiplier == 4
		}},
		{"cache tunables", "type=cache pfs=/p capacity=1GiB modified_threshold=256MiB read_ahead=8MiB sync_on_close=yes sync_to_pfs=true", func(j *JobDW) bool {
			return j.ModifiedThreshold == 256<<20 && j.ReadAhead == 8<<20 && j.SyncOnClose && j.SyncToPFS
		}},
		{"cache tunables off", "type=cache pfs=/p capacity=1GiB sync_on_close=no sync_to_pfs=false read_ahead=0", func(j *JobDW) bool {
			return !j.SyncOnClose && !j.SyncToPFS && j.ReadAhead == 0 && j.Explicit("read_ahead") && !j.Explicit("modified_threshold")
		}},
		{"keys in any order", "capacity=2GiB access_mode=private type=scratch", func(j *JobDW) bool { return j.Capacity == 2<<30 && j.AccessModes[0] == "private" }},
		{"pfs with %d", "type=cache pfs=%d/run capacity=1GiB", func(j *JobDW) bool { return j.PFS == "%d/run" }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := accept(t, header+"#DW jobdw "+c.line+"\n")
			if !c.check(s.JobDW) {
				t.Errorf("unexpected %+v", *s.JobDW)
			}
		})
	}
}

func TestGivenIsCanonicalOrder(t *testing.T) {
	s := accept(t, "#DW jobdw write_window_length=10 capacity=1GiB access_mode=striped(client_cache,MFS=1GiB) type=scratch\n")
	want := []string{"type", "access_mode", "MFS", "client_cache", "capacity", "write_window_length"}
	if !slices.Equal(s.JobDW.Given, want) {
		t.Errorf("Given = %v, want %v", s.JobDW.Given, want)
	}
}

func TestCapacityUnits(t *testing.T) {
	cases := map[string]uint64{
		"1": 1, "1048576": 1 << 20, "1K": 1 << 10, "1KiB": 1 << 10, "1KB": 1000, "1kib": 1 << 10,
		"5M": 5 << 20, "5MiB": 5 << 20, "5MB": 5e6, "2G": 2 << 30, "2GiB": 2 << 30, "2GB": 2e9, "2gb": 2e9,
		"3T": 3 << 40, "3TiB": 3 << 40, "3TB": 3e12, "1P": 1 << 50, "1PiB": 1 << 50, "1PB": 1e15,
		"3.5TB": 3.5e12, "1.5GiB": 3 << 29, "0.5KiB": 512, "1.0001KB": 1001, "1000GB": 1e12, "200GB": 200e9,
	}
	for text, want := range cases {
		s := accept(t, "#DW jobdw capacity="+text+"\n")
		if s.JobDW.Capacity != want {
			t.Errorf("capacity=%s → %d, want %d", text, s.JobDW.Capacity, want)
		}
	}
}

func TestCapacityWarnings(t *testing.T) {
	s := accept(t, "#DW jobdw capacity=3.5TB\n")
	if !hasWarning(s.Warnings, 1, `Slurm reads only the whole number "3"`, "capacity=3500GB") {
		t.Errorf("no decimal warning: %v", s.Warnings)
	}
	s = accept(t, "#DW jobdw capacity=100\n")
	if !hasWarning(s.Warnings, 1, "100 bytes", "100GiB") {
		t.Errorf("no bytes warning: %v", s.Warnings)
	}
	s = accept(t, "#DW jobdw capacity=100GiB\n")
	if len(s.Warnings) != 0 {
		t.Errorf("unexpected warnings: %v", s.Warnings)
	}
}

func TestJobDWErrors(t *testing.T) {
	cases := []struct {
		line  string
		field string
		has   []string
	}{
		{"capacity=3.5XB", "capacity", []string{`capacity="3.5XB"`, `unknown unit "XB"`, "expected a size such as 100GiB or 3.5TB"}},
		{"capacity=0", "capacity", []string{"greater than zero"}},
		{"capacity=0GiB", "capacity", []string{"greater than zero"}},
		{"capacity=-1GiB", "capacity", []string{"cannot be negative"}},
		{"capacity=GiB", "capacity", []string{"not a size"}},
		{"capacity=2N", "capacity", []string{"Slurm extension", "100GiB"}},
		{"capacity=2nodes", "capacity", []string{"Slurm extension"}},
		{"capacity=1GiB,foo", "capacity", []string{`unknown unit "GiB,foo"`}},
		{"capacity=99999999999PiB", "capacity", []string{"too large"}},
		{"capacity=1.5.5GiB", "capacity", []string{"more than one decimal point", "expected a size such as"}},
		{"capacity=3.5.TB", "capacity", []string{"more than one decimal point"}},
		{"type=scratch", "capacity", []string{"capacity is required", "capacity=<size>"}},
		{"capacity=", "capacity", []string{"Malformed keyword[=value]: capacity=", "give capacity a value"}},
		{"capacity=1GiB capacity=2GiB", "capacity", []string{"given twice"}},
		{"capacity=1GiB type=bogus", "type", []string{"Invalid argument: type=bogus", "expected scratch or cache"}},
		{"capacity=1GiB type=scrach", "type", []string{"did you mean scratch?"}},
		{"capacity=1GiB capcity=2GiB", "capcity", []string{"Unsupported argument - capcity", "did you mean capacity?"}},
		{"capacity=1GiB Capacity=2GiB", "Capacity", []string{"Unsupported argument - Capacity", "did you mean capacity?"}},
		{"capacity=1GiB access=striped", "access", []string{"Unsupported argument - access", "access_mode="}},
		{"capacity=1GiB max_file_size=1GiB", "max_file_size", []string{"access_mode=striped(MFS=10GiB)"}},
		{"capacity=1GiB client_cache=yes", "client_cache", []string{"access-mode suboption"}},
		{"capacity=1GiB striped", "", []string{"Malformed keyword[=value]: striped", "key=value"}},
		{"capacity=1GiB =striped", "", []string{"Malformed keyword[=value]: =striped"}},
		{"capacity=1GiB access_mode=stripe", "access_mode", []string{"Invalid argument: access_mode=stripe", "did you mean striped?"}},
		{"capacity=1GiB access_mode=striped,striped", "access_mode", []string{"striped is given twice"}},
		{"capacity=1GiB access_mode=striped,", "access_mode", []string{"empty access mode"}},
		{"capacity=1GiB access_mode=loadbalance,striped", "access_mode", []string{"loadbalance cannot be combined"}},
		{"capacity=1GiB access_mode=striped(MFS=1GiB", "access_mode", []string{"unbalanced parentheses"}},
		{"capacity=1GiB access_mode=striped)", "access_mode", []string{"unbalanced parentheses"}},
		{"capacity=1GiB access_mode=striped(MFS=1XB)", "MFS", []string{`unknown unit "XB"`}},
		{"capacity=1GiB access_mode=striped(MFC=many)", "MFC", []string{"not a whole number"}},
		{"capacity=1GiB access_mode=striped(MDS=4)", "access_mode", []string{"MDS=4", "max_mds=yes"}},
		{"capacity=1GiB access_mode=striped(mfs=1GiB)", "access_mode", []string{"did you mean MFS?"}},
		{"capacity=1GiB access_mode=striped(MFS=1GiB,MFS=2GiB)", "access_mode", []string{"MFS is given twice"}},
		{"capacity=1GiB access_mode=striped(client_cache=maybe)", "client_cache", []string{"expected yes or no"}},
		{"capacity=1GiB access_mode=striped(x)y", "access_mode", []string{"malformed suboptions"}},
		{"capacity=1GiB pool=a:b", "pool", []string{"not allowed in a pool name"}},
		{"capacity=1GiB pfs=/lustre/x", "pfs", []string{"only for type=cache", "stage_in"}},
		{"type=cache capacity=1GiB", "pfs", []string{"type=cache needs pfs="}},
		{"type=cache pfs=lustre/x capacity=1GiB", "pfs", []string{"must be absolute"}},
		{"type=cache pfs=$SCRATCH/x capacity=1GiB", "pfs", []string{"not expanded"}},
		{"type=cache pfs=/x access_mode=private capacity=1GiB", "access_mode", []string{"private is not available for type=cache"}},
		{"type=cache pfs=/x max_mds=yes capacity=1GiB", "max_mds", []string{"for type=scratch"}},
		{"access_mode=private max_mds=yes capacity=1GiB", "max_mds", []string{"needs access_mode striped"}},
		{"capacity=1GiB max_mds=maybe", "max_mds", []string{"expected yes or no"}},
		{"capacity=1GiB optimization_strategy=fast", "optimization_strategy", []string{"expected bandwidth or interference"}},
		{"capacity=1GiB write_window_length=1h", "write_window_length", []string{"not a whole number", "seconds"}},
		{"capacity=1GiB write_window_length=0", "write_window_length", []string{"at least 1"}},
		{"capacity=1GiB write_window_multiplier=-2", "write_window_multiplier", []string{"not a whole number"}},
		{"capacity=1GiB write_window_multiplier=99999999999999999999", "write_window_multiplier", []string{"too large"}},
		{"capacity=1GiB read_ahead=1MiB", "read_ahead", []string{"cache tunable", "type=cache"}},
		{"capacity=1GiB sync_on_close=yes", "sync_on_close", []string{"cache tunable"}},
		{"type=cache pfs=/p capacity=1GiB sync_to_pfs=always", "sync_to_pfs", []string{"expected yes or no"}},
		{"type=cache pfs=/p capacity=1GiB modified_threshold=lots", "modified_threshold", []string{"not a size"}},
		{`capacity=1GiB pool="wlm"`, "pool", []string{"quotes are not understood"}},
		{"capacity=1GiB name=x", "name", []string{"persistentdw"}},
		{"capacity=1GiB pfs=/a/pool=b type=cache", "pool", []string{"Slurm looks for", "pool="}},
		{"capacity=1GiB\ttype=scratch", "capacity", []string{"spaces only", "not tabs"}},
		{"capacity=1GiB\u00a0type=scratch", "", []string{"U+00A0", "ordinary space"}},
		{"capacity=1GiB type=scratch\x01", "", []string{"control character"}},
	}
	for _, c := range cases {
		t.Run(c.line, func(t *testing.T) {
			errs := reject(t, header+"#DW jobdw "+c.line+"\n")
			findFault(t, errs, expectFault{line: 3, field: c.field, has: c.has})
			for _, e := range errs.List {
				if !strings.Contains(e.Error(), "#DW jobdw") {
					t.Errorf("message does not name the directive: %s", e)
				}
			}
		})
	}
}

func TestErrorRendering(t *testing.T) {
	errs := reject(t, "#!/bin/bash\n#SBATCH -N 1\n\n#DW jobdw capacity=3.5XB\n")
	got := errs.List[0].Error()
	want := `line 4: #DW jobdw: capacity="3.5XB": unknown unit "XB"; expected a size such as 100GiB or 3.5TB`
	if !strings.HasPrefix(got, want) {
		t.Errorf("got  %s\nwant %s...", got, want)
	}
	e := errs.List[0]
	if e.Line != 4 || e.Directive != "#DW jobdw" || e.Field != "capacity" || e.Value != "3.5XB" {
		t.Errorf("fields: %+v", *e)
	}
}

func TestAllErrorsReturned(t *testing.T) {
	src := header +
		"#DW jobdw capacity=1XB type=bogus\n" + // line 3: two faults
		"#DW persistentdw name=9lives\n" + // line 4
		"#DW swap 0GiB\n" + // line 5
		"#DW stage_in type=file source=rel destination=$DW_JOB_STRIPED/x\n" + // line 6
		"#BB create_persistent capacity=1GiB\n" // line 7
	errs := reject(t, src)
	for _, f := range []expectFault{
		{3, "capacity", []string{"unknown unit"}}, {3, "type", []string{"Invalid argument"}},
		{4, "name", []string{"digit"}}, {5, "size", []string{"greater than zero"}},
		{6, "source", []string{"absolute"}}, {7, "name", []string{"name is required"}},
	} {
		findFault(t, errs, f)
	}
	lines := strings.Split(errs.Error(), "\n")
	if len(lines) != len(errs.List) {
		t.Errorf("Error() has %d lines for %d errors", len(lines), len(errs.List))
	}
	for i := 1; i < len(errs.List); i++ {
		if errs.List[i].Line < errs.List[i-1].Line {
			t.Errorf("errors not in line order: %v", errs)
		}
	}
}

func TestOnlyOneJobDW(t *testing.T) {
	errs := reject(t, header+"#DW jobdw capacity=1GiB\n#DW jobdw capacity=2GiB tpye=x\n")
	findFault(t, errs, expectFault{4, "", []string{"only one #DW jobdw", "line 3"}})
	findFault(t, errs, expectFault{4, "tpye", []string{"did you mean type?"}})
}

func TestMaxErrors(t *testing.T) {
	var b strings.Builder
	for i := 0; i < 300; i++ {
		b.WriteString("#DW bogus\n")
	}
	s, err := ParseWithLimits([]byte(b.String()), Limits{MaxErrors: 10})
	if s != nil || err == nil {
		t.Fatal("accepted")
	}
	errs := err.(*Errors)
	if len(errs.List) != 10 || errs.Omitted != 290 {
		t.Errorf("kept %d, omitted %d", len(errs.List), errs.Omitted)
	}
	if !strings.Contains(errs.Error(), "290 more errors (limit MaxErrors)") {
		t.Errorf("Error() does not count the rest: %s", errs.Error()[len(errs.Error())-100:])
	}
}

func TestLimits(t *testing.T) {
	long := "#DW jobdw capacity=1GiB pool=" + strings.Repeat("p", 100) + "\n"
	findFault(t, reject(t, long), expectFault{1, "pool", []string{"limit MaxNameBytes"}})

	_, err := ParseWithLimits([]byte("#DW jobdw capacity=1GiB "+strings.Repeat("x", 200)+"\n"), Limits{MaxDirectiveBytes: 100})
	findFault(t, err.(*Errors), expectFault{1, "", []string{"limit MaxDirectiveBytes"}})

	_, err = ParseWithLimits([]byte("#DW persistentdw name=a\n#DW persistentdw name=b\n#DW persistentdw name=c\n"), Limits{MaxDirectives: 2})
	findFault(t, err.(*Errors), expectFault{3, "", []string{"limit MaxDirectives"}})

	path := "/" + strings.Repeat("d", 5000)
	errs := reject(t, "#DW jobdw capacity=1GiB\n#DW stage_in type=file source="+path+" destination=$DW_JOB_STRIPED/x\n")
	findFault(t, errs, expectFault{2, "source", []string{"limit MaxPathBytes"}})
	if len(errs.Error()) > 2000 {
		t.Errorf("a huge value makes a huge message (%d bytes)", len(errs.Error()))
	}
}
