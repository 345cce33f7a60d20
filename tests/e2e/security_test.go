package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestOrdinaryUserCannotImpersonate sends setup requests to a real controller's socket as the
// ordinary user nobody: another user's session, a group nobody is not in (stages would run
// with it), and a job id's token (which would block the workload manager's job) are refused;
// the user's own run<N> session is accepted, and its backing directory on the storage node
// cannot be reached around the mount.
func TestOrdinaryUserCannotImpersonate(t *testing.T) {
	requireRoot(t)
	python, err := exec.LookPath("/usr/bin/python3") // Debian's, reachable by nobody
	if err != nil {
		t.Skip("/usr/bin/python3 (the HTTP client run as nobody) is not installed")
	}
	c := newCluster(t)
	c.startController()
	c.startAgent()
	post := func(body string) (int, string) {
		return postAsNobody(t, python, c.dir+"/controller.sock", "/dw/v1/sessions", body)
	}
	instance := `"instance":{"capacity":1073741824,"pool":"wlm_pool","type":"scratch","access_modes":["striped"]}`
	for _, tc := range []struct {
		name, body, want string
	}{
		{"another user's session", `{"token":"run900","creator":"RUN","owner":0,"group":65534,` + instance + `}`, "may not create a session for uid 0"},
		{"a group nobody is not in", `{"token":"run901","creator":"RUN","owner":65534,"group":42,` + instance + `}`, "not in group 42"},
		{"a job id", `{"token":"5000","creator":"RUN","owner":65534,"group":65534,` + instance + `}`, "reserved for the workload manager"},
	} {
		code, body := post(tc.body)
		if code != 403 || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want 403 %q", tc.name, code, body, tc.want)
		}
	}
	// run<N> tokens: only the user who drew N may use it (spillway run draws its own).
	if code, body := post(`{"token":"run902","creator":"RUN","owner":65534,"group":65534,` + instance + `}`); code != 403 || !strings.Contains(body, "was not drawn by uid 65534") {
		t.Errorf("a run token nobody did not draw: %d %s, want 403", code, body)
	}
	code, body := postAsNobody(t, python, c.dir+"/controller.sock", "/dw/v1/run_ids", "")
	var drawn struct{ ID int64 }
	if json.Unmarshal([]byte(body), &drawn); code != 200 || drawn.ID == 0 {
		t.Fatalf("drawing a run id as nobody: %d %s", code, body)
	}
	token := fmt.Sprintf("run%d", drawn.ID)
	if code, body := post(`{"token":"` + token + `","creator":"RUN","owner":65534,"group":65534,` + instance + `}`); code != 202 {
		t.Fatalf("nobody's own session: %d %s", code, body)
	}
	c.step(token, "setup", func() error { return nil })
	// The namespace's backing directory is nobody's, but nobody cannot reach it by path: the
	// SSD tree is the agent's, so writes go through mounts that count capacity.
	backing, _ := filepath.Glob(filepath.Join(c.dir, "ssd", "fragment", "*", "namespace", "*"))
	if len(backing) != 1 {
		t.Fatalf("namespace directories on the storage node: %v", backing)
	}
	touch := exec.Command("/usr/bin/touch", filepath.Join(backing[0], "around-the-mount"))
	touch.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID}}
	if out, err := touch.CombinedOutput(); err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Errorf("nobody wrote into the SSD tree directly: %v %s", err, out)
	}
	c.step(token, "teardown", func() error { return c.client.Teardown(context.Background(), token, true) })
	c.assertClean()
}

// TestConnectionHoarderCannotStarveTheController: an ordinary user opens many connections to
// the controller's socket and keeps them (two processes of theirs did exhaust the old
// controller's descriptors, and dwstat hung). The controller keeps at most
// max_connections_per_peer of them, and answers everyone else meanwhile.
func TestConnectionHoarderCannotStarveTheController(t *testing.T) {
	requireRoot(t)
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("/usr/bin/python3 (the hoarder run as nobody) is not installed")
	}
	c := newCluster(t)
	c.startController()
	c.startAgent()
	pid := c.controller.Process.Pid
	before := openFiles(t, pid)

	const hoard = 300 // per process, two processes
	hoarder := `
import socket, sys, time
held = []
for i in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sys.argv[1])
    except OSError:
        continue
    held.append(s)
print("holding", len(held), flush=True)
time.sleep(60)
`
	var hoarders []*exec.Cmd
	for i := 0; i < 2; i++ {
		cmd := exec.Command(python, "-c", hoarder, c.dir+"/controller.sock", strconv.Itoa(hoard))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID}}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		hoarders = append(hoarders, cmd)
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		line := make([]byte, 64)
		n, _ := out.Read(line) // "holding N": every connect has returned
		t.Logf("hoarder %d: %s", i, strings.TrimSpace(string(line[:n])))
	}
	// Refused connections are closed as they are accepted; give the accept loop a moment to
	// work through the backlog before counting (far less than request_timeout, after which
	// even the old controller dropped silent connections: the hoarder would simply reconnect).
	var during int
	deadline := time.Now().Add(3 * time.Second)
	for {
		during = openFiles(t, pid)
		if during-before <= 64+8 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if grew := during - before; grew > 64+8 { // the per-peer limit, and a few of the controller's own
		t.Errorf("nobody's %d held connections cost the controller %d descriptors, want at most max_connections_per_peer (64)", 2*hoard, grew)
	}
	r := spillway(t, cmdOpts{timeout: 20 * time.Second}, "dwstat", "--config", c.config, "nodes")
	mustContain(t, r, "storage1 wlm_pool online")
	for _, h := range hoarders {
		h.Process.Kill()
	}
}

// openFiles counts a process's open descriptors.
func openFiles(t *testing.T, pid int) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// postAsNobody sends a POST to the controller's socket as the ordinary user nobody and returns
// the status and the body.
func postAsNobody(t *testing.T, python, socket, path, body string) (int, string) {
	return requestAs(t, python, socket, nobodyUID, "POST", path, body)
}

// requestAs sends a request to the controller's socket as uid (group nobody) and returns the
// status and the body.
func requestAs(t *testing.T, python, socket string, uid uint32, method, path, body string) (int, string) {
	t.Helper()
	client := `
import http.client, socket, sys
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sys.argv[1])
c = Unix("localhost")
c.request(sys.argv[2], sys.argv[3], body=sys.argv[4] or None, headers={"Content-Type": "application/json"})
r = c.getresponse()
print(r.status)
print(r.read().decode())
`
	cmd := exec.Command(python, "-c", client, socket, method, path, body)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: nobodyGID}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as uid %d: %v\n%s", uid, err, out)
	}
	status, rest, _ := strings.Cut(string(out), "\n")
	code := 0
	json.Unmarshal([]byte(status), &code)
	return code, rest
}

// TestUsersSeeOnlyTheirOwn: with controller.private_data (the default) an ordinary user sees
// their own sessions and everything under them, and the persistent instances, but not another
// user's job, its mounts or its stages; an administrator sees everything. Another user can
// neither read the job's status nor its paths.
func TestUsersSeeOnlyTheirOwn(t *testing.T) {
	requireRoot(t)
	python, err := exec.LookPath("/usr/bin/python3")
	if err != nil {
		t.Skip("/usr/bin/python3 (the HTTP client run as ordinary users) is not installed")
	}
	c := newCluster(t)
	c.startController()
	c.startAgent()
	sock := c.dir + "/controller.sock"
	const other = 4242 // a second ordinary user
	code, body := requestAs(t, python, sock, nobodyUID, "POST", "/dw/v1/run_ids", "")
	var drawn struct{ ID int64 }
	if json.Unmarshal([]byte(body), &drawn); code != 200 {
		t.Fatalf("drawing a run id: %d %s", code, body)
	}
	job := fmt.Sprintf("run%d", drawn.ID)
	instance := `"instance":{"capacity":1073741824,"pool":"wlm_pool","type":"scratch","access_modes":["striped"]}`
	for _, req := range []string{
		`{"token":"` + job + `","creator":"RUN","owner":65534,"group":65534,` + instance + `}`,
		`{"token":"shared","creator":"CLI","owner":65534,"group":65534,"persistent":true,` + instance + `}`,
	} {
		if code, body := requestAs(t, python, sock, nobodyUID, "POST", "/dw/v1/sessions", req); code != 202 {
			t.Fatalf("setup as nobody: %d %s", code, body)
		}
	}
	c.step(job, "setup", func() error { return nil })
	c.step("shared", "setup", func() error { return nil })
	tokens := func(uid uint32) []string {
		code, body := requestAs(t, python, sock, uid, "GET", "/dw/v1/all", "")
		var all struct {
			Sessions  []struct{ Token string }
			Instances []struct{ ID int64 }
		}
		if err := json.Unmarshal([]byte(body), &all); code != 200 || err != nil {
			t.Fatalf("GET /dw/v1/all as uid %d: %d %s", uid, code, body)
		}
		var out []string
		for _, s := range all.Sessions {
			out = append(out, s.Token)
		}
		sort.Strings(out)
		return out
	}
	if got := strings.Join(tokens(nobodyUID), " "); got != job+" shared" && got != "shared "+job {
		t.Errorf("nobody sees sessions %q, want its job and its persistent instance", got)
	}
	if got := strings.Join(tokens(other), " "); got != "shared" {
		t.Errorf("another user sees sessions %q, want only the persistent instance", got)
	}
	// Another user's job is answered as a token that does not exist: they cannot even learn
	// that it exists, nor whose it is.
	for _, route := range []string{"/paths", "/status?step=setup"} {
		code, body := requestAs(t, python, sock, other, "GET", "/dw/v1/sessions/"+job+route, "")
		unknownCode, unknownBody := requestAs(t, python, sock, other, "GET", "/dw/v1/sessions/no"+job+route, "")
		if code != unknownCode || strings.ReplaceAll(body, `"`+job+`"`, `"no`+job+`"`) != unknownBody || strings.Contains(body, strconv.Itoa(nobodyUID)) {
			t.Errorf("another user reading nobody's job's %s: %d %s, want what an unknown token gets: %d %s", route, code, body, unknownCode, unknownBody)
		}
	}
	all, err := c.client.All(context.Background()) // root: everything
	if err != nil || len(all.Sessions) != 2 {
		t.Errorf("root sees %d sessions (%v), want 2", len(all.Sessions), err)
	}
	for _, token := range []string{job, "shared"} {
		c.step(token, "teardown", func() error { return c.client.Teardown(context.Background(), token, true) })
	}
	c.assertClean()
}

// TestOrdinaryUsersHaveQuotas: an ordinary user's own sessions are bounded by the per-user
// quotas of a system controller (5,000 empty sessions of one user once slowed everyone's
// setups threefold), and cannot take names that spillway run uses.
func TestOrdinaryUsersHaveQuotas(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.configure("controller", "max_sessions_per_user = 3\nmax_persistent_per_user = 2\nmax_capacity_per_user = \"3GiB\"\n")
	c.startController()
	c.startAgent()
	jobs := filepath.Join(c.dir, "jobs")
	os.Mkdir(jobs, 0o777)
	asNobody := func(args ...string) result {
		return spillway(t, cmdOpts{dir: jobs, asUser: true, timeout: time.Minute, env: []string{"SPILLWAY_CONFIG=" + c.config}}, args...)
	}
	for _, name := range []string{"p1", "p2"} {
		if r := asNobody("persistent", "create", name, "--capacity", "1GiB"); r.code != 0 {
			t.Fatalf("persistent %s: %s", name, r)
		}
	}
	r := asNobody("persistent", "create", "p3", "--capacity", "1GiB")
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "controller.max_persistent_per_user") {
		t.Errorf("a third persistent instance with max_persistent_per_user 2: %s", r)
	}
	script := func(name, capacity string) string {
		p := filepath.Join(jobs, name)
		os.WriteFile(p, []byte("#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity="+capacity+"\necho ran\n"), 0o755)
		return p
	}
	r = asNobody("run", "--node", "storage1", script("big.sh", "2GiB"))
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "controller.max_capacity_per_user") {
		t.Errorf("a 2GiB job on top of 2GiB with max_capacity_per_user 3GiB: %s", r)
	}
	if r := asNobody("run", "--node", "storage1", script("small.sh", "1GiB")); r.code != 0 {
		t.Errorf("a 1GiB job within every quota: %s", r)
	}
	r = asNobody("persistent", "create", "run13", "--capacity", "1GiB")
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "is reserved") {
		t.Errorf("a persistent instance named run13: %s", r)
	}
	for _, name := range []string{"p1", "p2"} {
		if r := asNobody("persistent", "destroy", name); r.code != 0 {
			t.Errorf("destroying %s: %s", name, r)
		}
	}
	c.assertClean()
}
