package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// A compute node's job reaches a TCP controller (a cluster's): libdatawarp speaks to it
// itself, each connection's first request with a fresh MUNGE credential of the job's user from the node's munged
// (asked of munged in its own protocol; libmunge only when that fails), no child process (dwcheck direct: no SIGCHLD, no spillway
// binary to be found, 16 threads and a forked child calling; no leak under valgrind). The
// controller acts as that
// user: nobody's session is staged; another user's calls on the same mount are refused
// (EINVAL), as on the Unix socket.
func TestLibdatawarpOverTCPWithMunge(t *testing.T) {
	requireRoot(t)
	buildLibdatawarp(t)
	c := newCluster(t)
	_, _, userConfig := c.startOverTCPWithMunge(t) // what a compute node has: the address and munged, no token

	ctx := context.Background()
	job := "tcpjob1"
	mount, out := c.nobodysStripedJob(t, job)

	as := func(uid uint32, args ...string) (string, int) {
		t.Helper()
		cx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cx, libdw.dwcheck, args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/", "SPILLWAY_CONFIG=" + userConfig, "SPILLWAY_BIN=/nonexistent/spillway",
			"DW_JOB_STRIPED=" + mount, "SPILLWAY_DATAWARP_DEBUG=1"}
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: nobodyGID}}
		b, _ := cmd.CombinedOutput()
		return string(b), cmd.ProcessState.ExitCode()
	}
	r, code := as(nobodyUID, "direct", out)
	if code != 0 || !strings.Contains(r, "failures 0") || strings.Count("\n"+r, "\nok ") < 15 {
		t.Fatalf("dwcheck direct over TCP with MUNGE, as nobody: exit %d\n%s", code, r)
	}
	if data, err := os.ReadFile(filepath.Join(out, "forked.dat")); err != nil || string(data) != "forked\n" {
		t.Errorf("the forked child's stage-out on the PFS: %q %v", data, err)
	}
	// A node with munged but without libmunge (the library asks munged itself, in its
	// protocol): the calls still go direct, no helper. libmunge is hidden in a mount namespace
	// of the run's own.
	if lib := libmungePath(t); lib != "" {
		out2 := filepath.Join(c.dir, "pfs", "out-nolibmunge")
		os.MkdirAll(out2, 0o755)
		os.Chown(out2, nobodyUID, nobodyGID)
		cx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		cmd := exec.CommandContext(cx, "unshare", "-m", "--propagation", "private", "sh", "-c",
			`mount --bind /dev/null "$1" && exec setpriv --reuid=`+strconv.Itoa(nobodyUID)+` --regid=`+strconv.Itoa(nobodyGID)+` --clear-groups "$2" direct "$3"`,
			"sh", lib, libdw.dwcheck, out2)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/", "SPILLWAY_CONFIG=" + userConfig, "SPILLWAY_BIN=/nonexistent/spillway",
			"DW_JOB_STRIPED=" + mount, "SPILLWAY_DATAWARP_DEBUG=1"}
		cmd.Dir = "/"
		b, err := cmd.CombinedOutput()
		cancel()
		if err != nil || !strings.Contains(string(b), "failures 0") || strings.Count("\n"+string(b), "\nok ") < 15 {
			t.Fatalf("dwcheck direct over TCP with munged but no libmunge, as nobody: %v\n%s", err, b)
		}
	}
	// The TCP path leaks nothing either (its credential, its connection).
	if _, err := exec.LookPath("valgrind"); err == nil {
		vg := exec.Command("valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect", "--error-exitcode=99", libdw.dwcheck, "threads", out)
		vg.Env = []string{"PATH=/usr/bin:/bin", "HOME=/", "SPILLWAY_CONFIG=" + userConfig, "SPILLWAY_BIN=/nonexistent/spillway", "DW_JOB_STRIPED=" + mount}
		vg.Dir = "/"
		vg.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID}}
		b, err := vg.CombinedOutput()
		if err != nil || !strings.Contains(string(b), "failures 0") {
			t.Errorf("dwcheck threads over TCP under valgrind: %v\n%s", err, b)
		}
	}
	// Another user on the same node, naming nobody's mount: refused, as no mount of theirs.
	query := exec.Command("/usr/bin/python3", "-c", `
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
n = (ctypes.c_int * 4)()
p = [ctypes.byref(n, 4 * i) for i in range(4)]
print("rc", lib.dw_query_directory_stage(sys.argv[2].encode(), *p))
`, filepath.Join(libdw.prefix, "lib", "libdatawarp.so.0"), mount)
	query.Env = []string{"PATH=/usr/bin:/bin", "HOME=/", "SPILLWAY_CONFIG=" + userConfig, "SPILLWAY_BIN=/nonexistent/spillway", "SPILLWAY_DATAWARP_DEBUG=1"}
	query.Dir = "/"
	query.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 4242, Gid: nobodyGID}}
	if b, _ := query.CombinedOutput(); !strings.Contains(string(b), "rc -22") || !strings.Contains(string(b), "not one of your jobs'") {
		t.Errorf("another user's query of nobody's mount: %s", b)
	}
	c.step(job, lifecycle.PhasePostRun, func() error { return c.client.PostRun(ctx, job) })
	c.step(job, lifecycle.PhaseTeardown, func() error { return c.client.Teardown(ctx, job, true) })
}

// libmungePath is the file the dynamic loader opens for libmunge.so.2 (ldconfig's cache), or
// "" when none is installed.
func libmungePath(t *testing.T) string {
	b, err := exec.Command("ldconfig", "-p").Output()
	if err != nil {
		t.Logf("ldconfig -p: %v", err)
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if name, path, ok := strings.Cut(strings.TrimSpace(line), " => "); ok && strings.HasPrefix(name, "libmunge.so.2 ") {
			return path
		}
	}
	return ""
}

// nobodysStripedJob sets up job, nobody's, a striped scratch instance of 1 GiB mounted on
// storage1, and makes a PFS directory nobody owns: the mount's path and that directory.
func (c *cluster) nobodysStripedJob(t *testing.T, job string) (mount, out string) {
	t.Helper()
	ctx := context.Background()
	setup := lifecycle.Setup{Token: job, Creator: "TEST", Owner: nobodyUID, Group: nobodyGID,
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}
	c.step(job, lifecycle.PhaseSetup, func() error { return c.client.Setup(ctx, setup) })
	c.step(job, lifecycle.PhasePreRun, func() error { return c.client.PreRun(ctx, job, []string{"storage1"}) })
	paths, err := c.client.Paths(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	out = filepath.Join(c.dir, "pfs", "out")
	os.MkdirAll(out, 0o755)
	os.Chown(out, nobodyUID, nobodyGID)
	return paths["DW_JOB_STRIPED"], out
}
