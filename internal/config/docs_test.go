package config

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestEveryKeyIsDocumented keeps docs/config.md in step with the configuration.
func TestEveryKeyIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	section := ""
	for _, line := range strings.Split(Encode(Defaults()), "\n") {
		if m := regexp.MustCompile(`^\[+([a-z_]+)\]+$`).FindStringSubmatch(line); m != nil {
			section = m[1]
			if !strings.Contains(string(doc), "["+section+"]") {
				t.Errorf("section [%s] is not documented in docs/config.md", section)
			}
			continue
		}
		if k := strings.SplitN(line, " = ", 2); len(k) == 2 {
			if !strings.Contains(string(doc), "| `"+k[0]+"` |") {
				t.Errorf("key %s.%s is not documented in docs/config.md", section, k[0])
			}
		}
	}
}
