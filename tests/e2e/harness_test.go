// Package e2e runs the real spillway binary as real processes: `spillway run` as root and as
// an ordinary user, the controller and agent daemons, crashes and restarts. Tests here are
// slower than unit tests and need root (for the non-root user and FUSE); run them with
// `go test ./tests/e2e/`.
package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/swaprace"
)

// binary is the spillway binary built for the tests; smallBinary the small dw_wlm_cli beside
// it (cmd/dw_wlm_cli), as they are installed: Slurm's dw_wlm_cli is the small one.
var binary, smallBinary string

// nobody is the ordinary user the tests run jobs as.
const nobodyUID, nobodyGID = 65534, 65534

func TestMain(m *testing.M) {
	if spec := os.Getenv(attackEnv); spec != "" {
		os.Exit(swaprace.Main(spec))
	}
	if spec := os.Getenv(opsEnv); spec != "" {
		os.Exit(opsMain(spec))
	}
	dir, err := os.MkdirTemp("", "spillway-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Chmod(dir, 0o755)
	binary, smallBinary = filepath.Join(dir, "spillway"), filepath.Join(dir, "dw_wlm_cli")
	build := exec.Command("go", "build", "-o", dir+"/", "github.com/spillway-hpc/spillway/cmd/spillway", "github.com/spillway-hpc/spillway/cmd/dw_wlm_cli", "github.com/spillway-hpc/spillway/cmd/spillway-stage-worker")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building spillway and dw_wlm_cli:", err)
		os.Exit(1)
	}
	for _, b := range []string{binary, smallBinary} {
		if _, err := os.Stat(b); err != nil {
			fmt.Fprintln(os.Stderr, "the build made no", b)
			os.Exit(1)
		}
	}
	if os.Geteuid() == 0 {
		// An ordinary user may use FUSE only if /dev/fuse is open to everyone, as Debian's
		// udev rule makes it; some containers and VMs leave it 0600.
		os.Chmod("/dev/fuse", 0o666)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs jobs as another user and mounts FUSE for them")
	}
}

// result is a finished command.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// cmdOpts says how to run the binary.
type cmdOpts struct {
	home    string // SPILLWAY_HOME
	asUser  bool   // as nobody
	dir     string // working directory
	env     []string
	timeout time.Duration
}

func spillway(t *testing.T, o cmdOpts, args ...string) result {
	t.Helper()
	return runAs(t, binary, o, args...)
}

// run runs a program (the binary under another name) with default options.
func run(t *testing.T, program string, args ...string) result {
	t.Helper()
	return runAs(t, program, cmdOpts{}, args...)
}

func runAs(t *testing.T, program string, o cmdOpts, args ...string) result {
	t.Helper()
	if o.timeout == 0 {
		o.timeout = 2 * time.Minute
	}
	cmd := exec.Command(program, args...)
	cmd.Dir = o.dir
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=" + o.home}, o.env...)
	if o.home != "" {
		cmd.Env = append(cmd.Env, "SPILLWAY_HOME="+o.home)
	}
	if o.asUser {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID}}
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(o.timeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("spillway %s did not finish within %s\n%s\n%s", strings.Join(args, " "), o.timeout, out.String(), errb.String())
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: out.String(), stderr: errb.String()}
}

// world is a temporary machine: a PFS directory tree and a Spillway home, owned by nobody
// when asUser.
type world struct {
	t      *testing.T
	root   string
	pfs    string
	home   string
	asUser bool
	// agentExtra goes into the configuration's [agent] table (writeConfig).
	agentExtra string
}

func newWorld(t *testing.T, asUser bool) *world {
	t.Helper()
	root, err := os.MkdirTemp("", "spillway-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(root, 0o755)
	w := &world{t: t, root: root, pfs: filepath.Join(root, "pfs"), home: filepath.Join(root, "home"), asUser: asUser}
	for _, d := range []string{w.pfs, w.home} {
		os.MkdirAll(d, 0o755)
		if asUser {
			os.Chown(d, nobodyUID, nobodyGID)
		}
	}
	// A small pool keeps capacity tests quick and independent of the disk's free space.
	w.writeConfig("")
	t.Cleanup(func() {
		w.stopServer()
		w.unmountAll()
		os.RemoveAll(root)
	})
	return w
}

// stopServer stops the home's background server (a test must leave no process behind).
func (w *world) stopServer() {
	if r := spillway(w.t, cmdOpts{home: w.home}, "home", "stop", "--force"); r.code != 0 {
		w.t.Errorf("stopping the home's server: %s", r)
	}
}

// writeConfig writes the home's configuration: a 4 GiB pool of 1 GiB grains plus extra.
func (w *world) writeConfig(extra string) {
	cfg := fmt.Sprintf(`[controller]
state_dir = %q
socket = %q
mount_root = %q
[agent]
pool = "wlm_pool"
ssd_path = %q
capacity = "4GiB"
%s
[client]
controller = "unix:%s"
[stage]
allow_root = true
%s
`, filepath.Join(w.home, "state"), filepath.Join(w.home, "controller.sock"), filepath.Join(w.home, "mounts"),
		filepath.Join(w.home, "ssd"), w.agentExtra, filepath.Join(w.home, "controller.sock"), extra)
	path := filepath.Join(w.home, "spillway.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		w.t.Fatal(err)
	}
	if w.asUser {
		os.Chown(path, nobodyUID, nobodyGID)
	}
}

// file writes a file under the PFS, owned by nobody when the world is nobody's.
func (w *world) file(rel, content string, mode os.FileMode) string {
	p := filepath.Join(w.pfs, rel)
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		w.t.Fatal(err)
	}
	os.Chmod(p, mode)
	if w.asUser {
		for d := filepath.Dir(p); strings.HasPrefix(d, w.pfs); d = filepath.Dir(d) {
			os.Chown(d, nobodyUID, nobodyGID)
		}
		os.Chown(p, nobodyUID, nobodyGID)
	}
	return p
}

// script writes a job script into the world's root.
func (w *world) script(name, body string) string {
	p := filepath.Join(w.root, name)
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		w.t.Fatal(err)
	}
	return p
}

func (w *world) run(args ...string) result {
	w.t.Helper()
	return spillway(w.t, cmdOpts{home: w.home, asUser: w.asUser, dir: w.root}, args...)
}

// unmountAll removes any mount left under the world (a failing test must not leak mounts).
func (w *world) unmountAll() {
	raw, _ := os.ReadFile("/proc/mounts")
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], w.root) {
			exec.Command("fusermount3", "-uz", f[1]).Run()
			syscall.Unmount(f[1], syscall.MNT_DETACH)
		}
	}
}

// mountsUnder lists mounts under a directory.
func mountsUnder(dir string) []string {
	raw, _ := os.ReadFile("/proc/mounts")
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], dir) {
			out = append(out, f[1])
		}
	}
	return out
}

// assertClean checks that nothing is left: no sessions in dwstat, no fragments on disk, no
// mounts.
func (w *world) assertClean() {
	w.t.Helper()
	r := w.run("dwstat", "--json", "all")
	if r.code != 0 {
		w.t.Fatalf("dwstat: %s", r)
	}
	// Live objects: none. Finished stages stay in stage_history (stage.history), which is
	// not checked here.
	for _, table := range []string{"sessions", "instances", "fragments", "namespaces", "activations", "registrations", "configurations", "stages"} {
		if !strings.Contains(r.stdout, fmt.Sprintf("%q: []", table)) {
			w.t.Errorf("%s left behind:\n%s", table, r.stdout)
		}
	}
	if frags, _ := os.ReadDir(filepath.Join(w.home, "ssd", "fragment")); len(frags) > 0 {
		w.t.Errorf("%d fragment directories left on the SSD path", len(frags))
	}
	if m := mountsUnder(w.root); len(m) > 0 {
		w.t.Errorf("mounts left: %v", m)
	}
}

// mustContain checks that the output holds each part; runs of spaces count as one, so that
// aligned table columns compare by their words.
func mustContain(t *testing.T, r result, parts ...string) {
	t.Helper()
	all := squeeze(r.stdout + r.stderr)
	for _, p := range parts {
		if !strings.Contains(all, squeeze(p)) {
			t.Errorf("output lacks %q\n%s", p, r)
		}
	}
}

func squeeze(s string) string {
	var b strings.Builder
	space := false
	for _, c := range s {
		if c == ' ' {
			if !space {
				b.WriteRune(c)
			}
			space = true
			continue
		}
		space = false
		b.WriteRune(c)
	}
	return b.String()
}
