package directive

import (
	"errors"
	"strings"
	"testing"
)

// accept parses src and fails the test on any error.
func accept(t *testing.T, src string) *Script {
	t.Helper()
	s, err := Parse([]byte(src))
	if err != nil {
		t.Fatalf("Parse(%q) failed:\n%v", src, err)
	}
	return s
}

// reject parses src and returns its errors, failing the test if it was accepted.
func reject(t *testing.T, src string) *Errors {
	t.Helper()
	s, err := Parse([]byte(src))
	if err == nil {
		t.Fatalf("Parse(%q) accepted it: %+v; want an error", src, s)
	}
	if s != nil {
		t.Fatalf("Parse(%q) returned a Script together with an error", src)
	}
	var list *Errors
	if !errors.As(err, &list) {
		t.Fatalf("Parse(%q) error is %T, want *Errors", src, err)
	}
	if len(list.List) == 0 {
		t.Fatalf("Parse(%q) returned an empty error list", src)
	}
	return list
}

// expectFault is one error a script must produce.
type expectFault struct {
	line  int
	field string   // "" = any
	has   []string // substrings of the rendered message (problem and fix)
}

// findFault fails the test unless errs holds an error on the line, for the field, whose
// message contains every substring.
func findFault(t *testing.T, errs *Errors, want expectFault) {
	t.Helper()
	for _, e := range errs.List {
		if e.Line != want.line || (want.field != "" && e.Field != want.field) {
			continue
		}
		msg := e.Error()
		ok := true
		for _, sub := range want.has {
			if !strings.Contains(msg, sub) {
				ok = false
			}
		}
		if ok {
			if !strings.HasPrefix(msg, "line ") {
				t.Errorf("message %q does not start with its line", msg)
			}
			if e.Fix == "" {
				t.Errorf("error %q has no fix", msg)
			}
			return
		}
	}
	t.Errorf("no error on line %d field %q containing %q; got:\n%v", want.line, want.field, want.has, errs)
}

// hasWarning reports whether a warning on line contains every substring.
func hasWarning(warnings []Warning, line int, subs ...string) bool {
	for _, w := range warnings {
		if w.Line != line {
			continue
		}
		ok := true
		for _, sub := range subs {
			if !strings.Contains(w.Message, sub) {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

const header = "#!/bin/bash\n#SBATCH -N 4\n" // directives after it start on line 3
