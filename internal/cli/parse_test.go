package cli

import (
	"bytes"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
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
		code, ok := ParseInterspersed(fs, tc.args, io.Discard)
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
	fs := NewFlags("spillway thing", "Usage: spillway thing\n", &stderr)
	if code, ok := Parse(fs, []string{"--help"}, &stdout); ok || code != 0 {
		t.Fatalf("--help: ok %v code %d", ok, code)
	}
	if n := strings.Count(stdout.String(), "Usage:"); n != 1 || stderr.Len() != 0 {
		t.Errorf("--help printed usage %d times on stdout, %q on stderr", n, stderr.String())
	}
	stdout.Reset()
	fs = NewFlags("spillway thing", "Usage: spillway thing\n", &stderr)
	if code, ok := Parse(fs, []string{"--nope"}, &stdout); ok || code != 64 {
		t.Fatalf("--nope: ok %v code %d", ok, code)
	}
	if !strings.Contains(stderr.String(), "-nope") || !strings.Contains(stderr.String(), "Usage:") || stdout.Len() != 0 {
		t.Errorf("bad flag: stderr %q stdout %q", stderr.String(), stdout.String())
	}
}

func TestParseExpiration(t *testing.T) {
	now := time.Date(2026, 11, 25, 17, 0, 0, 0, time.Local)
	for in, want := range map[string]int64{
		"":                     0,
		"never":                lifecycle.ExpirationNever,
		"72h":                  now.Add(72 * time.Hour).Unix(),
		"30d":                  now.Add(30 * 24 * time.Hour).Unix(),
		"2026-12-31T18:00:00":  time.Date(2026, 12, 31, 18, 0, 0, 0, time.Local).Unix(),
		"2026-12-31T18:00:00Z": time.Date(2026, 12, 31, 18, 0, 0, 0, time.UTC).Unix(),
	} {
		got, err := parseExpiration(in, now)
		if err != nil || got != want {
			t.Errorf("%q: got %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"tomorrow", "-3h", "0d", "2026-13-01"} {
		if _, err := parseExpiration(bad, now); err == nil || !strings.Contains(err.Error(), "--expiration") || !strings.Contains(err.Error(), "never") {
			t.Errorf("%q: want an error naming --expiration and the forms, got %v", bad, err)
		}
	}
}
