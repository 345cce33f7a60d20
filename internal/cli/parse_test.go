package cli

import (
	"bytes"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestParseInterspersed(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		wantNames []string
		wantJSON  bool
	}{
		{[]string{"sessions", "--json"}, []string{"sessions"}, true},
		{[]string{"--json", "sessions", "instances"}, []string{"sessions", "instances"}, true},
		{[]string{"sessions", "instances"}, []string{"sessions", "instances"}, false},
		{[]string{"a", "--", "--json", "b"}, []string{"a", "--json", "b"}, false},
		{nil, nil, false},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		asJSON := fs.Bool("json", false, "")
		code, ok := parseInterspersed(fs, tc.args, io.Discard)
		if !ok || code != 0 {
			t.Fatalf("%q: parse failed (%d)", tc.args, code)
		}
		names := fs.Args()
		if len(names) == 0 {
			names = nil
		}
		if !reflect.DeepEqual(names, tc.wantNames) || *asJSON != tc.wantJSON {
			t.Errorf("%q: names %q json %v, want %q %v", tc.args, names, *asJSON, tc.wantNames, tc.wantJSON)
		}
	}
}

// Help goes to stdout once, and nothing to stderr; a bad flag goes to stderr with the usage.
func TestParseHelpOnce(t *testing.T) {
	var stdout, stderr bytes.Buffer
	fs := newFlags("spillway thing", "Usage: spillway thing\n", &stderr)
	if code, ok := parse(fs, []string{"--help"}, &stdout); ok || code != 0 {
		t.Fatalf("--help: ok %v code %d", ok, code)
	}
	if n := strings.Count(stdout.String(), "Usage:"); n != 1 || stderr.Len() != 0 {
		t.Errorf("--help printed usage %d times on stdout, %q on stderr", n, stderr.String())
	}
	stdout.Reset()
	fs = newFlags("spillway thing", "Usage: spillway thing\n", &stderr)
	if code, ok := parse(fs, []string{"--nope"}, &stdout); ok || code != 64 {
		t.Fatalf("--nope: ok %v code %d", ok, code)
	}
	if !strings.Contains(stderr.String(), "-nope") || !strings.Contains(stderr.String(), "Usage:") || stdout.Len() != 0 {
		t.Errorf("bad flag: stderr %q stdout %q", stderr.String(), stdout.String())
	}
}
