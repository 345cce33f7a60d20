package spillwaycli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// issue 23 items 4 and 5: `spillway agent --check` says what a start would do with the
// configuration. A compute-only node with agent.data_listen starts without it (with a
// warning); a TCP listen is advertised as http://host:port; a wildcard one needs
// agent.advertise.
func TestAgentCheck(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, toml   string
		code         int
		stdout, warn string
	}{
		{"compute-only with data_listen", "[agent]\nname = \"cn1\"\nlisten = \"127.0.0.1:17711\"\ndata_listen = \"0.0.0.0:7702\"\n", 1,
			"node cn1 (compute-only), called by the controller at http://127.0.0.1:17711",
			`warning: agent.data_listen "0.0.0.0:7702" is set on a compute-only node (agent.pool is empty)`},
		{"wildcard listen", "[agent]\nname = \"bb1\"\npool = \"wlm_pool\"\nlisten = \"0.0.0.0:7701\"\n", 78, "",
			`agent.listen "0.0.0.0:7701" is a wildcard address the controller cannot dial: set agent.advertise`},
		{"clean", "[agent]\nname = \"bb1\"\npool = \"wlm_pool\"\nlisten = \"0.0.0.0:7701\"\nadvertise = \"http://bb1:7701\"\n", 0,
			"node bb1 (storage node of pool wlm_pool), called by the controller at http://bb1:7701", ""},
	}
	for i, c := range cases {
		path := filepath.Join(dir, c.name+".toml")
		if err := os.WriteFile(path, []byte(c.toml), 0o644); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		code := agentMain([]string{"--config", path, "--check"}, &stdout, &stderr)
		if code != c.code || !strings.Contains(stdout.String(), c.stdout) || !strings.Contains(stderr.String(), c.warn) || (c.warn == "") != (stderr.Len() == 0) {
			t.Errorf("case %d, %s: exit %d (want %d)\nstdout: %s\nstderr: %s", i, c.name, code, c.code, stdout.String(), stderr.String())
		}
	}
}
