package directive

import (
	"bytes"
	"testing"
)

var syms = Symbols{ArrayJobID: "100", ArrayTaskID: "17", WorkDir: "/home/u/run", JobID: "117", User: "alice", JobName: "sim"}

func TestSubstituteSymbols(t *testing.T) {
	cases := []struct{ in, want string }{
		{"#DW stage_out destination=/p/out.%j\n", "#DW stage_out destination=/p/out.117\n"},
		{"#DW x %A %a %b %d %j %u %x\n", "#DW x 100 17 7 /home/u/run 117 alice sim\n"},
		{"#DW x 100%%\n", "#DW x 100%\n"},
		{"#DW x %%j\n", "#DW x %j\n"},                                             // %% is consumed first: no second replacement
		{"#DW x a%zb\n", "#DW x ab\n"},                                            // an unknown symbol is deleted, as Slurm deletes it
		{"#DW x a%\n#DW y\n", "#DW x a\n#DW y\n"},                                 // a lone % at the end of a directive is dropped
		{"#BB create_persistent name=%u\n", "#BB create_persistent name=alice\n"}, // #BB lines too
		{"#DW x %j \\\\ %j\n#DW y %j\n", "#DW x 117 \\\\ %j\n#DW y %j\n"},         // \\ stops for the rest of the directives
		{"#DW y %j\n#DW x \\\\%j\n", "#DW y 117\n#DW x \\\\%j\n"},                 // ... but not before it
		{"#DW x %j\r\n", "#DW x 117\r\n"},                                         // CRLF kept
		{"#DW x %j\n\x00", "#DW x 117\n\x00"},                                     // trailing NUL kept
		{"#DW x %j", "#DW x 117"},                                                 // no final newline
	}
	for _, c := range cases {
		got := string(Substitute([]byte(c.in), syms))
		if got != c.want {
			t.Errorf("Substitute(%q)\n got %q\nwant %q", c.in, got, c.want)
		}
	}
}

func TestSubstituteOnlyDirectivesOfTheBlock(t *testing.T) {
	in := "#!/bin/bash\n#SBATCH -o out.%j\n#DW jobdw capacity=1GiB\n# comment %j\necho %j\n#DW stage_out destination=/p/%j\n"
	want := "#!/bin/bash\n#SBATCH -o out.%j\n#DW jobdw capacity=1GiB\n# comment %j\necho %j\n#DW stage_out destination=/p/%j\n"
	if got := string(Substitute([]byte(in), syms)); got != want {
		t.Errorf("got %q", got)
	}
}

func TestSubstituteAcrossContinuation(t *testing.T) {
	// Slurm joins "...%" and "j..." into "%j" before replacing; so must Substitute.
	in := "#DW jobdw capacity=1GiB\n#DW stage_out type=file source=$DW_JOB_STRIPED/o destination=/p/out.%\\\n#DWj\n"
	out := Substitute([]byte(in), syms)
	s := accept(t, string(out))
	if s.StageOut[0].Destination != "/p/out.117" {
		t.Errorf("got %q from %q", s.StageOut[0].Destination, out)
	}
}

func TestSubstituteKeepsLines(t *testing.T) {
	in := []byte("#!/bin/bash\n#DW jobdw capacity=1GiB\n#DW stage_in type=file source=%d/in destination=$DW_JOB_STRIPED/in\n#DW stage_out type=file source=$DW_JOB_STRIPED/out destination=%d/out.%j\nsrun a\n")
	out := Substitute(in, syms)
	if bytes.Count(in, []byte("\n")) != bytes.Count(out, []byte("\n")) {
		t.Fatalf("line count changed:\n%s", out)
	}
	s := accept(t, string(out))
	if s.StageIn[0].Source != "/home/u/run/in" || s.StageOut[0].Destination != "/home/u/run/out.117" || s.StageOut[0].Line != 4 {
		t.Errorf("%+v %+v", s.StageIn, s.StageOut)
	}
}

func TestSubstituteCleansValues(t *testing.T) {
	out := Substitute([]byte("#DW x /p/%x\n"), Symbols{JobName: "a\nb\r\x00"})
	if string(out) != "#DW x /p/a_b__\n" {
		t.Errorf("%q", out)
	}
}

func TestSubstituteWithoutSymbolsIsIdentity(t *testing.T) {
	in := []byte("#!/bin/bash\n#DW jobdw capacity=1GiB \\\\\n#DW stage_in x\r\n\x00")
	out := Substitute(in, syms)
	if !bytes.Equal(in, out) {
		t.Errorf("%q", out)
	}
	out[0] = 'X'
	if in[0] == 'X' {
		t.Error("Substitute returned its input slice")
	}
}

func TestSymbolWarnings(t *testing.T) {
	s := accept(t, "#DW jobdw capacity=1GiB\n#DW stage_out type=file source=$DW_JOB_STRIPED/o destination=/p/%z\n")
	if !hasWarning(s.Warnings, 2, `"%z" is not a Slurm symbol`) {
		t.Errorf("%v", s.Warnings)
	}
	s = accept(t, "#DW jobdw capacity=1GiB\n#DW stage_out type=file source=$DW_JOB_STRIPED/o destination=/p/\\\\x\n#DW stage_out type=file source=$DW_JOB_STRIPED/o2 destination=/p/%j\n")
	if !hasWarning(s.Warnings, 2, "stops replacing", "line 3") {
		t.Errorf("%v", s.Warnings)
	}
	s = accept(t, "#DW jobdw capacity=1GiB\n#DW stage_out type=file source=$DW_JOB_STRIPED/o destination=/p/%b\n")
	if !hasWarning(s.Warnings, 2, "%b", "22.05") {
		t.Errorf("%v", s.Warnings)
	}
	s = accept(t, "#DW jobdw capacity=1GiB\n#DW stage_out type=file source=$DW_JOB_STRIPED/o destination=/p/%j.%u.%%\n")
	if len(s.Warnings) != 0 {
		t.Errorf("known symbols warned: %v", s.Warnings)
	}
}
