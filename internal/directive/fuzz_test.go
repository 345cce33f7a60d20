package directive

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// referenceScan is a second, independent reading of Slurm's _xlate_batch: it returns the first
// line of every directive in the leading comment block, and the lines after the block that
// start (after indentation) with #DW or #BB. Like Parse it cuts the script at its first NUL
// and drops one "\r" before each "\n"; like Parse it reads a "\" followed only by blanks as a
// continuation (Parse reports it as an error).
func referenceScan(src []byte) (starts, after []int) {
	if i := bytes.IndexByte(src, 0); i >= 0 {
		src = src[:i]
	}
	inBlock, continued, prev := true, false, ""
	for i, ln := range strings.Split(string(src), "\n") {
		num := i + 1
		ln = strings.TrimSuffix(ln, "\r")
		if !inBlock {
			t := strings.TrimLeft(ln, " \t")
			if strings.HasPrefix(t, "#DW") || strings.HasPrefix(t, "#BB") {
				after = append(after, num)
			}
			continue
		}
		if ln == "" {
			continue
		}
		if ln[0] != '#' {
			inBlock = false
			t := strings.TrimLeft(ln, " \t")
			if strings.HasPrefix(t, "#DW") || strings.HasPrefix(t, "#BB") {
				after = append(after, num)
			}
			continue
		}
		kind := ""
		if strings.HasPrefix(ln, "#DW") || strings.HasPrefix(ln, "#BB") {
			kind = ln[:3]
		}
		if kind == "" {
			continued = false
			continue
		}
		if !continued || kind != prev {
			starts = append(starts, num)
		}
		prev = kind
		continued = strings.HasSuffix(strings.TrimRight(ln, " \t\v\f"), `\`)
	}
	return starts, after
}

// scriptLines are the lines that a parsed Script represents.
func scriptLines(s *Script) map[int]bool {
	lines := map[int]bool{}
	for _, j := range s.JobDWs {
		lines[j.Line] = true
	}
	if s.Swap != nil {
		lines[s.Swap.Line] = true
	}
	for _, x := range s.Persistent {
		lines[x.Line] = true
	}
	for _, x := range s.StageIn {
		lines[x.Line] = true
	}
	for _, x := range s.StageOut {
		lines[x.Line] = true
	}
	for _, x := range s.Create {
		lines[x.Line] = true
	}
	for _, x := range s.Destroy {
		lines[x.Line] = true
	}
	return lines
}

// checkProperties is what must hold for every input.
func checkProperties(t *testing.T, src []byte) {
	limits := Limits{MaxDirectives: 1 << 30, MaxDirectiveBytes: len(src) + 1, MaxErrors: 1 << 30, MaxWarnings: 1 << 30}
	s, p := parse(src, limits)

	// Never accept garbage silently: every directive of the leading block is in the Script or
	// has an error on its line; every directive after the block has a warning.
	starts, after := referenceScan(src)
	represented := scriptLines(s)
	errLines := map[int]bool{}
	for _, e := range p.errs {
		errLines[e.Line] = true
		if e.Problem == "" || e.Fix == "" {
			t.Errorf("error without problem or fix: %+v", *e)
		}
	}
	for _, line := range starts {
		if !represented[line] && !errLines[line] {
			t.Errorf("directive on line %d is neither in the Script nor reported\nScript: %+v\nerrors: %v", line, s, p.errorList())
		}
	}
	warned := map[int]bool{}
	for _, w := range p.warnings {
		warned[w.Line] = true
	}
	for _, line := range after {
		if !warned[line] {
			t.Errorf("directive on line %d after the block is not warned about: %v", line, p.warnings)
		}
	}
	for line := range represented {
		if !slices.Contains(starts, line) {
			t.Errorf("Script holds a directive on line %d, which is not a directive of the leading block %v", line, starts)
		}
	}

	// The public API agrees with the core.
	public, err := ParseWithLimits(src, limits)
	if (err == nil) != (len(p.errs) == 0) || (err == nil) != (public != nil) {
		t.Fatalf("ParseWithLimits disagrees: %v / %d errors", err, len(p.errs))
	}

	// An accepted script survives Format and Parse unchanged.
	if err == nil {
		checkRoundTrip(t, public)
	}

	// Substitute keeps the line structure and changes nothing when there is no "%".
	out := Substitute(src, Symbols{ArrayJobID: "1", ArrayTaskID: "23", WorkDir: "/w", JobID: "9", User: "u", JobName: "n\nm"})
	if bytes.Count(out, []byte("\n")) != bytes.Count(src, []byte("\n")) {
		t.Errorf("Substitute changed the number of lines:\n%q\n%q", src, out)
	}
	if bytes.IndexByte(src, '%') < 0 && !bytes.Equal(out, src) {
		t.Errorf("Substitute changed a script without symbols:\n%q\n%q", src, out)
	}
	_, _ = Parse(out)
}

// FuzzParse checks that no input panics, hangs or is accepted silently, and that accepted
// scripts round-trip through Format. Seeds: the corpus and the scripts of the table tests;
// crashers found by `go test -fuzz` live in testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	for _, src := range corpus {
		f.Add([]byte(src))
	}
	for _, src := range []string{
		"#DW jobdw capacity=3.5XB\n#DW jobdw capcity=1GiB\n",
		"#DW stage_in type=file source=$SCRATCH/x destination=/ss/x\n",
		"#DW jobdw \\\n#BB capacity=1G\n",
		"#DW jobdw type=scratch \\  \n#DW capacity=1GiB\n",
		"#!/bin/bash\necho\n  #DW jobdw capacity=1GiB\n#BB destroy_persistent name=a\n",
		"#dw jobdw capacity=1GiB\n# DW stage_in x\n",
		"#DW jobdw capacity=1GiB access_mode=striped(MFS=1GiB,client_cache\n",
		"#DW x %j \\\\ %j\n#DW y %\n",
		"#BB destroy_persistent name=hurry_x\n#BB create_persistent name=a capacity=1GiB pool=p\n",
		"#DW jobdw capacity=1GiB pfs=/a/capacity=2\n",
		"#DW stage_in type=file source=/a destination=$DW_JPERSISTENT_STRIPED_x/a\n",
		"#DWjobdw\n#BB_LUA x\n#DW\n",
		"\x00#DW jobdw capacity=1GiB\n",
		"#DW jobdw capacity=1GiB\n#DW stage_in \x00type=file\n",
		"#DW jobdw capacity=1GiB\u00a0type=scratch\n",
	} {
		f.Add([]byte(src))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		checkProperties(t, src)
	})
}

// TestPropertiesOnCorpus runs the fuzz properties on every table-test script, so that a plain
// `go test` exercises them without -fuzz.
func TestPropertiesOnCorpus(t *testing.T) {
	for _, src := range corpus {
		checkProperties(t, []byte(src))
	}
}

// The reference must itself be right, or the property above proves nothing.
func TestReferenceScan(t *testing.T) {
	src := "#!/bin/bash\n" + // 1
		"#DW jobdw type=scratch \\\n" + // 2 start
		"#DW capacity=1GiB\n" + // 3 continuation
		"#SBATCH -N 1\n" + // 4
		"\n" + // 5
		"#BB create_persistent \\ \n" + // 6 start (blank after \)
		"#BB name=a capacity=1GiB\n" + // 7 continuation
		"#DW persistentdw name=a \\\n" + // 8 start
		"#BB destroy_persistent name=b\n" + // 9 start: mixed prefixes
		"#DW\r\n" + // 10 start
		"echo\n" + // 11 ends the block
		"  #DW swap 1GiB\n" + // 12 after
		"#BB x\n" + // 13 after
		"# DW y\n" // 14 not a directive
	starts, after := referenceScan([]byte(src))
	if !slices.Equal(starts, []int{2, 6, 8, 9, 10}) || !slices.Equal(after, []int{12, 13}) {
		t.Errorf("starts %v after %v", starts, after)
	}
	// And the property notices a directive that is silently dropped.
	s, p := parse([]byte(src), Limits{})
	lines := scriptLines(s)
	for _, e := range p.errs {
		lines[e.Line] = true
	}
	for _, l := range starts {
		if !lines[l] {
			t.Errorf("line %d unaccounted for", l)
		}
	}
	if lines[3] || lines[7] {
		t.Errorf("a continuation line was taken for a directive: %v", lines)
	}
}
