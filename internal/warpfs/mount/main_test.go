package mount

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/mounttable"
	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/swaprace"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// testBase holds every test's directories and mounts. It is 0755 and outside t.TempDir()
// (0700) so that child processes running as nobody can reach the mounts.
var testBase string

// helperEnv selects the helper role of the test binary: a separate process that serves a
// mount, so that tests can kill it (a crashed agent) or run it as another user.
const helperEnv = "SPILLWAY_LOCALFS_TEST_HELPER"

// attackEnv selects the attacker role: the symlink-swap attack of package swaprace, run as an
// ordinary user against a mount (see security_test.go).
const attackEnv = "SPILLWAY_LOCALFS_TEST_ATTACK"

// helperSpec is what the helper mounts.
type helperSpec struct {
	MountPath  string
	SourceDir  string
	Capacity   uint64
	AllowOther bool
	ReadOnly   bool
	Limits     Limits // for benchmarks of the tunables (bench_mount.sh)
	// PassthroughWrites (bench_mount.sh's PASSTHROUGH_WRITES) lets the kernel write a writable
	// mount's files: "quota" puts SourceDir under a project quota of Capacity first (its file
	// system must be XFS mounted with prjquota), "test" without a quota (the data path alone,
	// on kernels without XFS quotas); "" writes through the server.
	PassthroughWrites string
}

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == pfsWorkerArg {
		os.Exit(pfsio.WorkerMain(os.Args[2:], os.Stderr))
	}
	if spec := os.Getenv(helperEnv); spec != "" {
		os.Exit(runHelper(spec))
	}
	if spec := os.Getenv(attackEnv); spec != "" {
		os.Exit(swaprace.Main(spec))
	}
	if spec := os.Getenv(spaceAttackEnv); spec != "" {
		os.Exit(spaceAttack(spec))
	}
	if path := os.Getenv(create0Env); path != "" {
		if err := create0(path); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if p := os.Getenv(directEnv); p != "" {
		if err := directCheck(p); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("ok")
		os.Exit(0)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "mount tests mount FUSE file systems and switch users: run them as root")
		os.Exit(1)
	}
	base, err := os.MkdirTemp("", "spillway-mount-")
	if err == nil {
		err = os.Chmod(base, 0o755)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testBase = base
	code := m.Run()
	// Never leave a mount behind: any left is a failure, and is removed.
	if left := mountsUnder(base); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: mounts left behind: %v\n", left)
		for _, p := range left {
			syscall.Unmount(p, syscall.MNT_DETACH)
		}
		code = 1
	}
	os.RemoveAll(base)
	os.Exit(code)
}

// mountsUnder lists the mount points under dir, from /proc/self/mountinfo.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{err.Error()}
	}
	var found []string
	for _, line := range strings.Split(string(data), "\n") {
		if e, ok := mounttable.ParseLine(line); ok && within(e.MountPoint, dir) {
			found = append(found, e.MountPoint)
		}
	}
	return found
}

func runHelper(encoded string) int {
	var hs helperSpec
	if err := json.Unmarshal([]byte(encoded), &hs); err != nil {
		fmt.Println("error:", err)
		return 2
	}
	var quota uint32
	switch hs.PassthroughWrites {
	case "":
	case "test":
		testKernelWritesWithoutQuota = true
	case "quota":
		quota = usage.ProjectID(1)
		fd, err := syscall.Open(hs.SourceDir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
		if err == nil {
			err = usage.SetProjectQuota(fd, quota, hs.Capacity)
			syscall.Close(fd)
		}
		if err != nil {
			fmt.Println("error: a project quota on", hs.SourceDir, err)
			return 1
		}
	default:
		fmt.Printf("error: PassthroughWrites %q: want quota, test or nothing\n", hs.PassthroughWrites)
		return 2
	}
	m, err := Mount(Spec{
		MountPath:    hs.MountPath,
		SourceDir:    hs.SourceDir,
		Tracker:      usage.New("helper instance", hs.Capacity),
		AllowOther:   hs.AllowOther,
		ReadOnly:     hs.ReadOnly,
		Limits:       hs.Limits,
		ProjectQuota: quota,
	})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	if hs.PassthroughWrites != "" && !hs.ReadOnly {
		fmt.Println("passthrough writes:", m.backend.kernelWrites)
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin) // serve until the test closes our stdin (or kills us)
	if err := m.Unmount(); err != nil {
		fmt.Println("unmount error:", err)
		return 1
	}
	fmt.Println("unmounted")
	return 0
}

// runnableByNobody returns a copy of the test binary that nobody can run (the go test binary
// sits in a 0700 build directory).
func runnableByNobody(t *testing.T) string {
	t.Helper()
	copyPath := filepath.Join(testBase, "mount-helper.test")
	if _, err := os.Stat(copyPath); err == nil {
		return copyPath
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyPath, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return copyPath
}

// helperProc is a running helper.
type helperProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

// startHelper runs the test binary as a mount helper, as uid (0 or 65534), and waits until it
// has mounted.
func startHelper(t *testing.T, hs helperSpec, uid uint32) *helperProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if uid != 0 {
		exe = runnableByNobody(t)
	}
	encoded, _ := json.Marshal(hs)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), helperEnv+"="+string(encoded))
	cmd.Stderr = os.Stderr
	cmd.Dir = "/"
	if uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
		cmd.Env = append(cmd.Env, "HOME=/", "PATH=/usr/bin:/bin")
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helperProc{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
	t.Cleanup(func() {
		h.stdin.Close()
		h.cmd.Process.Kill()
		h.cmd.Wait()
		if err := UnmountPath(hs.MountPath, Limits{}); err != nil {
			t.Errorf("removing the helper's mount: %v", err)
		}
	})
	line := make(chan string, 1)
	go func() {
		l, _ := h.out.ReadString('\n')
		line <- strings.TrimSpace(l)
	}()
	select {
	case l := <-line:
		if l != "ready" {
			t.Fatalf("mount helper (uid %d): %s", uid, l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("mount helper did not report within 20s")
	}
	return h
}

// stop asks the helper to unmount and exit, and returns what it printed.
func (h *helperProc) stop(t *testing.T) string {
	t.Helper()
	h.stdin.Close()
	rest, _ := io.ReadAll(h.out)
	if err := h.cmd.Wait(); err != nil {
		t.Errorf("mount helper exited with %v: %s", err, rest)
	}
	return strings.TrimSpace(string(rest))
}

// dirs makes a fresh namespace directory and a mount path (not yet existing) for one test.
func dirs(t *testing.T) (source, mountPath string) {
	t.Helper()
	d, err := os.MkdirTemp(testBase, strings.NewReplacer("/", "_").Replace(t.Name())+"-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	source = filepath.Join(d, "namespace")
	if err := os.Mkdir(source, 0o755); err != nil {
		t.Fatal(err)
	}
	return source, filepath.Join(d, "mounts", "batch", "42_striped_scratch")
}

// mount mounts spec and unmounts it when the test ends.
func mount(t *testing.T, spec Spec) *Mounted {
	t.Helper()
	if spec.Limits.UnmountBusyTimeout == 0 {
		spec.Limits.UnmountBusyTimeout = 2 * time.Second
	}
	m, err := Mount(spec)
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("Unmount in cleanup: %v", err)
		}
	})
	return m
}

// asNobody runs a shell script as uid 65534 and returns its combined output.
func asNobody(t *testing.T, script string) (string, error) {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// quietLogger sends the package's diagnostics to the test log.
func quietLogger(t *testing.T) *log.Logger {
	return log.New(testWriter{t}, "", 0)
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// waitFor polls cond for up to 10s: for effects the kernel delivers asynchronously (RELEASE
// after close). It bounds a wait; it does not measure speed.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Errorf("timed out waiting for %s", what)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
