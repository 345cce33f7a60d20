package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/mungetest"
)

// startMunged runs a munged of the test's own in dir (package mungetest).
func startMunged(t *testing.T, dir, name string) string { return mungetest.Start(t, dir, name) }

// startOverTCPWithMunge starts the cluster's controller listening on TCP with MUNGE (its own
// munged) and its agent (with the cluster's token), and returns the controller's address and
// what a user on another host has: a munged of its own with the cluster's key (its socket) and
// a configuration naming that address and munged, no token.
func (c *cluster) startOverTCPWithMunge(t *testing.T) (addr, userSock, userConfig string) {
	t.Helper()
	sock := startMunged(t, c.dir, "munged-controller")
	userSock = startMunged(t, c.dir, "munged-user-host")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = l.Addr().String()
	l.Close()
	token := filepath.Join(c.dir, "token")
	os.WriteFile(token, []byte("munge-test-token\n"), 0o600)
	c.configure("controller", fmt.Sprintf("listen = %q\ntoken_file = %q\nmunge_socket = %q\n", addr, token, sock))
	c.configure("agent", fmt.Sprintf("token_file = %q\n", token))
	c.startController()
	c.startAgent()
	userConfig = filepath.Join(c.dir, "user.toml")
	os.WriteFile(userConfig, []byte(fmt.Sprintf("[client]\ncontroller = \"http://%s\"\nmunge_socket = %q\nconnect_retries = 1\n", addr, userSock)), 0o644)
	return addr, userSock, userConfig
}

// TestUsersOnOtherHostsAuthenticateWithMunge: a TCP controller takes MUNGE credentials from
// users: they act as themselves (their own persistent instance, refused another's), a
// credential is good once, a request without one is refused with the way to get one, and a
// MUNGE credential of root grants no administration.
func TestUsersOnOtherHostsAuthenticateWithMunge(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	addr, userSock, userConfig := c.startOverTCPWithMunge(t)
	as := func(uid uint32, args ...string) result {
		t.Helper()
		cmd := exec.Command(binary, args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/", "SPILLWAY_CONFIG=" + userConfig}
		cmd.Dir = "/"
		if uid != 0 {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: nobodyGID}}
		}
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		done := make(chan error, 1)
		cmd.Start()
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-ctx.Done():
			cmd.Process.Kill()
			<-done
			t.Fatalf("spillway %v as uid %d did not finish", args, uid)
		}
		return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
	}
	if r := as(nobodyUID, "persistent", "create", "mine", "--capacity", "1GiB"); r.code != 0 {
		t.Fatalf("nobody creating a persistent instance over TCP with MUNGE: %s", r)
	}
	r := as(nobodyUID, "dwstat", "sessions")
	mustContain(t, r, "mine")
	if !strings.Contains(squeeze(r.stdout), " 65534 ") {
		t.Errorf("the instance nobody made over TCP is not nobody's:\n%s", r.stdout)
	}
	const other = 4242
	if r := as(other, "persistent", "destroy", "mine"); r.code == 0 || !strings.Contains(r.stdout+r.stderr, "belongs to uid 65534") {
		t.Errorf("another user destroying nobody's instance: %s", r)
	}
	// Root on a compute node can make MUNGE credentials for anyone: they grant no
	// administration.
	if r := as(0, "persistent", "destroy", "mine"); r.code == 0 || !strings.Contains(r.stdout+r.stderr, "belongs to uid 65534") {
		t.Errorf("root with a MUNGE credential destroying nobody's instance: %s", r)
	}
	// nobody's job session is nobody's to see: another user, over TCP with MUNGE, does not.
	setupJob := `
import http.client, json, subprocess, sys
def call(path, body):
    cred = subprocess.run(["munge", "-n", "-S", sys.argv[2]], capture_output=True, text=True, check=True).stdout.strip()
    c = http.client.HTTPConnection(sys.argv[1])
    c.request("POST", path, body=body, headers={"Authorization": "MUNGE " + cred, "Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, r.read().decode()
status, body = call("/dw/v1/run_ids", "")
token = "run%d" % json.loads(body)["id"]
status, body = call("/dw/v1/sessions", json.dumps({"token": token, "creator": "RUN", "owner": 65534, "group": 65534,
    "instance": {"capacity": 1073741824, "pool": "wlm_pool", "type": "scratch", "access_modes": ["striped"]}}))
print(status, token)
`
	cmd := exec.Command("/usr/bin/python3", "-c", setupJob, addr, userSock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID}}
	out, err := cmd.CombinedOutput()
	var status int
	var jobToken string
	if fmt.Sscan(string(out), &status, &jobToken); err != nil || status != 202 {
		t.Fatalf("nobody setting up a job session over TCP with MUNGE: %v %s", err, out)
	}
	c.step(jobToken, "setup", func() error { return nil })
	if r := as(nobodyUID, "dwstat", "sessions"); !strings.Contains(r.stdout, jobToken) {
		t.Errorf("nobody does not see its own job session %s: %s", jobToken, r)
	}
	if r := as(other, "dwstat", "sessions"); r.code != 0 || strings.Contains(r.stdout, jobToken) || !strings.Contains(r.stdout, "mine") {
		t.Errorf("another user sees nobody's job session %s, or not the persistent instance: %s", jobToken, r)
	}
	c.step(jobToken, "teardown", func() error { return c.client.Teardown(context.Background(), jobToken, true) })

	// A credential is good once; no credential is refused with the way to get one.
	cred, err := exec.Command("munge", "-n", "-S", userSock).Output()
	if err != nil {
		t.Fatal(err)
	}
	get := func(auth string) (int, string) {
		cmd := exec.Command("/usr/bin/python3", "-c", `
import http.client, sys
c = http.client.HTTPConnection(sys.argv[1])
c.request("GET", "/dw/v1/sessions", headers={"Authorization": sys.argv[2]} if sys.argv[2] else {})
r = c.getresponse()
print(r.status, r.read().decode())
`, addr, auth)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("python client: %v %s", err, out)
		}
		var code int
		fmt.Sscan(string(out), &code)
		return code, string(out)
	}
	if code, out := get("MUNGE " + strings.TrimSpace(string(cred))); code != 200 {
		t.Errorf("a fresh credential: %s", out)
	}
	if code, out := get("MUNGE " + strings.TrimSpace(string(cred))); code != 401 || !strings.Contains(out, "Replayed") {
		t.Errorf("the same credential again: %s, want 401 replayed", out)
	}
	if code, out := get(""); code != 401 || !strings.Contains(out, "MUNGE") {
		t.Errorf("no credential: %s, want 401 naming MUNGE", out)
	}
	if r := as(nobodyUID, "persistent", "destroy", "mine"); r.code != 0 {
		t.Errorf("nobody destroying its instance: %s", r)
	}
	c.assertClean()
}
