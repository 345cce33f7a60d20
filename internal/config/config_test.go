package config

import (
	"strings"
	"testing"
	"time"
)

func TestDefaultsAreValid(t *testing.T) {
	c := Defaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestEncodeRoundTrips(t *testing.T) {
	c := Defaults()
	c.Stage.Timeout = Duration(90 * time.Minute)
	c.Agent.Capacity = Size(3 << 30)
	back, err := Parse([]byte(Encode(c)), "encoded", Defaults())
	if err != nil {
		t.Fatal(err)
	}
	if back.Stage.Timeout != c.Stage.Timeout || back.Agent.Capacity != c.Agent.Capacity || len(back.Pools) != 1 {
		t.Fatalf("round trip lost values: %+v", back)
	}
}

func TestParseUnitsAndDurations(t *testing.T) {
	c, err := Parse([]byte(`
[agent]
capacity = "3.5TB"
[stage]
poll_interval = "2s"
[[pool]]
name = "small"
granularity = "16MiB"
[[pool]]
name = "big"
granularity = "1TiB"
`), "t.toml", Defaults())
	if err != nil {
		t.Fatal(err)
	}
	if c.Agent.Capacity != 3500000000000 || c.Stage.PollInterval.D() != 2*time.Second {
		t.Fatalf("got %+v", c)
	}
	if len(c.Pools) != 2 || c.Pools[0].Name != "small" || c.Pools[1].Granularity != 1<<40 {
		t.Fatalf("pools must replace the default list: %+v", c.Pools)
	}
}

func TestParseErrorsNameTheKey(t *testing.T) {
	cases := map[string]string{
		"[stage]\nmax_runing = 3\n":                   "stage.max_runing",
		"[agent]\ncapacity = \"12XB\"\n":              "XB",
		"[stage]\ntimeout = \"soon\"\n":               "soon",
		"[executor]\nmax_attempts = 0\n":              "executor.max_attempts must be greater than 0",
		"[[pool]]\nname = \"p\"\ngranularity = \"0\"": "granularity must be greater than 0",
		"[controller]\nmount_root = \"rel/dir\"\n":    "must be an absolute path",
	}
	for text, want := range cases {
		_, err := Parse([]byte(text), "bad.toml", Defaults())
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "bad.toml") {
			t.Errorf("%q: error %v, want one naming %q and the file", text, err, want)
		}
	}
}
