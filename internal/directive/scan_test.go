package directive

import (
	"strings"
	"testing"
)

// The four forms Slurm hands dw_wlm_cli as --job (slurm-datawarp-protocol.md §4), plus CRLF.
func TestJobFileVariants(t *testing.T) {
	cases := []struct {
		name string
		src  string
	}{
		{"batch script ending in NUL", "#!/bin/bash\n#SBATCH -N 1\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n#DW stage_in type=file source=/pfs/in destination=$DW_JOB_STRIPED/in\nsrun ./a.out\n\x00"},
		{"interactive, no final newline", "#!/bin/bash\n#DW jobdw capacity=1GiB access_mode=striped type=scratch\n#DW stage_in type=file source=/pfs/in destination=$DW_JOB_STRIPED/in"},
		{"memfd: #!/bin/sh and directives only", "#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n#DW stage_in type=file source=/pfs/in destination=$DW_JOB_STRIPED/in\n"},
		{"CRLF", "#!/bin/bash\r\n#SBATCH -N 1\r\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\r\n#DW stage_in type=file source=/pfs/in destination=$DW_JOB_STRIPED/in\r\nsrun ./a.out\r\n"},
		{"several trailing NULs", "#!/bin/bash\n#DW jobdw capacity=1GiB\n#DW stage_in type=file source=/pfs/in destination=$DW_JOB_STRIPED/in\n\x00\x00\x00"},
		{"NUL without final newline", "#!/bin/bash\n#DW jobdw capacity=1GiB\n#DW stage_in type=file source=/pfs/in destination=$DW_JOB_STRIPED/in\x00"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := accept(t, c.src)
			if s.JobDW == nil || s.JobDW.Capacity != 1<<30 || !s.JobDW.HasAccess("striped") {
				t.Fatalf("jobdw: %+v", s.JobDW)
			}
			if len(s.StageIn) != 1 {
				t.Fatalf("stage_in: %+v", s.StageIn)
			}
			st := s.StageIn[0]
			if st.Source != "/pfs/in" || st.Destination != "$DW_JOB_STRIPED/in" || st.Type != "file" {
				t.Errorf("stage_in %+v (a CR or NUL left in a value?)", st)
			}
			if len(s.Warnings) != 0 {
				t.Errorf("warnings: %v", s.Warnings)
			}
		})
	}
}

func TestStrayNUL(t *testing.T) {
	errs := reject(t, "#!/bin/bash\n#DW jobdw capacity=1GiB\n#DW stage_in \x00 type=file\nmore\n")
	findFault(t, errs, expectFault{3, "", []string{"NUL byte"}})
}

func TestLeadingBlock(t *testing.T) {
	src := "#!/bin/bash\n" + // 1
		"#SBATCH -N 2\n" + // 2
		"\n" + // 3: empty lines are skipped
		"#DW jobdw capacity=1GiB\n" + // 4
		"# a comment\n" + // 5
		"#PBS -l nodes=1\n" + // 6
		"#DW persistentdw name=alpha\n" + // 7
		"module load foo\n" + // 8: the first command ends the block
		"#DW stage_out type=file source=$DW_JOB_STRIPED/a destination=/pfs/a\n" + // 9: ignored, warned
		"#BB destroy_persistent name=alpha\n" + // 10: ignored, warned
		"   #DW swap 1GiB\n" // 11: ignored, warned
	s := accept(t, src)
	if s.JobDW == nil || s.JobDW.Line != 4 || len(s.Persistent) != 1 || s.Persistent[0].Line != 7 {
		t.Fatalf("%+v", s)
	}
	if len(s.StageOut) != 0 || len(s.Destroy) != 0 || s.Swap != nil {
		t.Errorf("directives after the block were used: %+v", s)
	}
	for _, line := range []int{9, 10, 11} {
		if !hasWarning(s.Warnings, line, "ignored: directives must be in the leading comment block, before the first command", "line 8") {
			t.Errorf("no warning for line %d: %v", line, s.Warnings)
		}
	}
	if !hasWarning(s.Warnings, 9, "#DW stage_out") || !hasWarning(s.Warnings, 10, "#BB destroy_persistent") {
		t.Errorf("warnings do not name the directive: %v", s.Warnings)
	}
}

func TestBlockEndedByBlankLineOfSpaces(t *testing.T) {
	s := accept(t, "#!/bin/bash\n#DW jobdw capacity=1GiB\n   \n#DW persistentdw name=a\n")
	if len(s.Persistent) != 0 {
		t.Fatal("a line of spaces ends the block for Slurm; the directive after it must not count")
	}
	if !hasWarning(s.Warnings, 4, "a line of blanks") {
		t.Errorf("warning does not explain the blank line: %v", s.Warnings)
	}
}

func TestIndentedDirectiveEndsBlock(t *testing.T) {
	s := accept(t, "#!/bin/bash\n#DW jobdw capacity=1GiB\n  #DW persistentdw name=a\n#DW persistentdw name=b\n")
	if len(s.Persistent) != 0 {
		t.Fatalf("%+v", s.Persistent)
	}
	if !hasWarning(s.Warnings, 3, "first column") || !hasWarning(s.Warnings, 4, "leading comment block") {
		t.Errorf("%v", s.Warnings)
	}
}

func TestLookalikeComments(t *testing.T) {
	s := accept(t, "#!/bin/bash\n#dw jobdw capacity=1GiB\n# DW stage_in type=file\n#Dw persistentdw name=x\n# BB settings follow\n#DW jobdw capacity=1GiB\n")
	for _, line := range []int{2, 3, 4} {
		if !hasWarning(s.Warnings, line, "looks like a directive but is an ordinary comment") {
			t.Errorf("line %d not warned: %v", line, s.Warnings)
		}
	}
	if hasWarning(s.Warnings, 5) {
		t.Errorf("an ordinary comment was warned about: %v", s.Warnings)
	}
}

func TestPrefixNeedsSpace(t *testing.T) {
	errs := reject(t, "#DWjobdw capacity=1GiB\n#BB_LUA pool=x\n")
	findFault(t, errs, expectFault{1, "", []string{"#DW must be followed by a space", `"#DW jobdw"`}})
	findFault(t, errs, expectFault{2, "", []string{"#BB must be followed by a space", "lua"}})
}

func TestEmptyDirective(t *testing.T) {
	errs := reject(t, "#DW\n#BB   \n")
	findFault(t, errs, expectFault{1, "", []string{"empty directive", "jobdw"}})
	findFault(t, errs, expectFault{2, "", []string{"empty directive", "create_persistent"}})
}

func TestUnknownCommands(t *testing.T) {
	errs := reject(t, "#DW bogus foo=bar\n#DW jobdwx capacity=1GiB\n#BB jobdw capacity=1GiB\n#BB create_persistant name=a capacity=1GiB\n#DW create_persistent name=a capacity=1GiB\n#DW destroy_persistent name=a\n")
	findFault(t, errs, expectFault{1, "", []string{"Unsupported #DW command bogus", "jobdw, persistentdw, swap, stage_in, stage_out"}})
	findFault(t, errs, expectFault{2, "", []string{"Unsupported #DW command jobdwx", "did you mean jobdw?"}})
	findFault(t, errs, expectFault{3, "", []string{"Unsupported #BB command jobdw", "write #DW jobdw"}})
	findFault(t, errs, expectFault{4, "", []string{"Unsupported #BB command create_persistant", "did you mean create_persistent?"}})
	findFault(t, errs, expectFault{5, "", []string{"#DW create_persistent", "use #BB create_persistent"}})
	findFault(t, errs, expectFault{6, "", []string{"#DW destroy_persistent", "use #BB destroy_persistent"}})
}

func TestContinuations(t *testing.T) {
	cases := []struct {
		name string
		src  string
	}{
		{"space before backslash", "#DW jobdw type=scratch \\\n#DW       capacity=5GiB \\\n#DW access_mode=private\n"},
		{"no space before backslash", "#DW jobdw type=scratch\\\n#DW capacity=5GiB\\\n#DW access_mode=private\n"},
		{"CRLF continuation", "#DW jobdw type=scratch \\\r\n#DW capacity=5GiB \\\r\n#DW access_mode=private\r\n"},
		{"empty line inside continuation", "#DW jobdw type=scratch \\\n\n#DW capacity=5GiB \\\n\n\n#DW access_mode=private\n"},
		{"joins without a blank, as Slurm does", "#DW jobdw type=scratch capacity=5\\\n#DWGiB access_mode=private\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := accept(t, c.src)
			j := s.JobDW
			if j.Line != 1 || j.Capacity != 5<<30 || j.AccessModes[0] != "private" || j.Type != "scratch" {
				t.Errorf("%+v", *j)
			}
		})
	}
}

func TestContinuationErrors(t *testing.T) {
	// Mixing prefixes (Slurm: invalid request).
	errs := reject(t, "#!/bin/bash\n#DW jobdw capacity=1GiB \\\n#BB access_mode=striped\n")
	findFault(t, errs, expectFault{2, "", []string{"cannot mix #DW and #BB"}})

	// The continuation line forgot its prefix (as in a slide of NERSC's tutorial).
	errs = reject(t, "#!/bin/bash\n#DW jobdw capacity=1GiB\n#DW stage_in source=/lustre/inputs destination=$DW_JOB_STRIPED/inputs \\\ntype=directory\n")
	findFault(t, errs, expectFault{3, "", []string{"line 4 is a command", `"#DW   type=directory"`}})

	// Another comment after the backslash.
	errs = reject(t, "#DW jobdw \\\n#SBATCH -N 1\n#DW capacity=1GiB\n")
	findFault(t, errs, expectFault{1, "", []string{"line 2 does not start with #DW"}})

	// A backslash on the last line.
	errs = reject(t, "#DW jobdw capacity=1GiB \\")
	findFault(t, errs, expectFault{1, "", []string{"the script ends there"}})

	// Blanks after the backslash: Slurm does not join.
	errs = reject(t, "#DW jobdw type=scratch \\  \n#DW capacity=1GiB\n")
	findFault(t, errs, expectFault{1, "", []string{"blanks after the continuation", "remove the spaces"}})
	if len(errs.List) != 1 {
		t.Errorf("the continuation should still be read as meant, giving one error: %v", errs)
	}
}

func TestContinuedDirectiveErrorUsesFirstLine(t *testing.T) {
	errs := reject(t, "#!/bin/bash\n#DW jobdw type=scratch \\\n#DW   capacity=1XB\n")
	findFault(t, errs, expectFault{2, "capacity", []string{`unknown unit "XB"`}})
}

func TestNoDirectives(t *testing.T) {
	for _, src := range []string{"", "\x00", "#!/bin/bash\necho hi\n", "#!/bin/bash\n#SBATCH -N 1\n", "\n\n\n"} {
		s := accept(t, src)
		if s.HasDirectives() {
			t.Errorf("%q: %+v", src, s)
		}
	}
}

func TestDirectivesAfterBlockOnlyWarn(t *testing.T) {
	// Garbage after the block is Slurm's to ignore; it must not fail the job, only warn.
	s := accept(t, "#!/bin/bash\n#DW jobdw capacity=1GiB\necho\n#DW jobdw capacity=nonsense\n")
	if s.JobDW.Capacity != 1<<30 || !hasWarning(s.Warnings, 4, "ignored") {
		t.Errorf("%+v %v", s.JobDW, s.Warnings)
	}
}

func TestMaxWarnings(t *testing.T) {
	src := "#!/bin/bash\necho\n" + strings.Repeat("#DW jobdw capacity=1GiB\n", 500)
	s, err := ParseWithLimits([]byte(src), Limits{MaxWarnings: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Warnings) != 6 || !strings.Contains(s.Warnings[5].Message, "495 more warnings") {
		t.Errorf("%d warnings, last %v", len(s.Warnings), s.Warnings[len(s.Warnings)-1])
	}
}

func TestByteOrderMarkExplained(t *testing.T) {
	s := accept(t, "\uFEFF#!/bin/bash\n#DW jobdw capacity=1GiB\n")
	if s.JobDW != nil || !hasWarning(s.Warnings, 2, "byte-order mark") {
		t.Errorf("%+v %v", s.JobDW, s.Warnings)
	}
}
