package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/testca"
)

// TestControllerAPIOverTLS: with [tls], the controller's TCP API speaks TLS only: a command
// that trusts the cluster's CA uses it, one that does not is refused with the reason, and the
// shared token never crosses the network in clear.
func TestControllerAPIOverTLS(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	ca, cert, key, err := testca.Write(c.dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	token := filepath.Join(c.dir, "token")
	os.WriteFile(token, []byte("tls-test-token\n"), 0o600)
	c.configure("controller", fmt.Sprintf("listen = %q\ntoken_file = %q\n", addr, token))
	c.configure("agent", fmt.Sprintf("token_file = %q\n", token))
	os.WriteFile(c.config, append(must(os.ReadFile(c.config)), []byte(fmt.Sprintf("[tls]\ncert_file = %q\nkey_file = %q\nca_file = %q\n", cert, key, ca))...), 0o644)
	c.startController()
	c.startAgent()

	client := func(name, extra string) string {
		p := filepath.Join(c.dir, name)
		os.WriteFile(p, []byte(fmt.Sprintf("[client]\ncontroller = \"https://%s\"\ntoken_file = %q\nconnect_retries = 1\n%s", addr, token, extra)), 0o644)
		return p
	}
	trusting := client("trusting.toml", fmt.Sprintf("[tls]\nca_file = %q\n", ca))
	r := spillway(t, cmdOpts{env: []string{"SPILLWAY_CONFIG=" + trusting}}, "dwstat", "nodes")
	mustContain(t, r, "storage1 wlm_pool online")
	r = spillway(t, cmdOpts{env: []string{"SPILLWAY_CONFIG=" + client("untrusting.toml", "")}}, "dwstat", "nodes")
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "certificate") {
		t.Errorf("a client that does not trust the CA: %s", r)
	}
	plain := client("plain.toml", "")
	os.WriteFile(plain, []byte(strings.Replace(string(must(os.ReadFile(plain))), "https://", "http://", 1)), 0o644)
	r = spillway(t, cmdOpts{env: []string{"SPILLWAY_CONFIG=" + plain}}, "dwstat", "nodes")
	if r.code == 0 {
		t.Errorf("plain HTTP to the TLS port: %s", r)
	}
	c.assertClean()
}
