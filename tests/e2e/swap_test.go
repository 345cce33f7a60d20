package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/views"
	"golang.org/x/sys/unix"
)

// Swap on the burst buffer (#DW swap, issue 22), end to end: real swap areas (loop devices,
// swapon) on this machine's kernel, a job's process in a v1 memory cgroup limited to about
// half of what it touches. Swap is global to the kernel: every test that attaches swap takes
// swapLockFile (the node side's tests take the same lock).

const swapLockFile = "/run/spillway-swaptest.lock"

// swapHogMiB is what the job's process touches, about twice swapLimit.
const (
	swapLimit  = 64 << 20
	swapHogMiB = 128
)

// requireSwap skips a test this machine cannot run, takes the swap lock until the test
// ends, and checks then that no swap area and no loop device over the test's files is left.
func requireSwap(t *testing.T, under string) {
	t.Helper()
	requireRoot(t)
	for _, p := range []string{"/dev/loop-control", "/proc/swaps", "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/usr/bin/python3"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("swap tests need %s (loop devices, swap, cgroup v1 memory, python3): %v", p, err)
		}
	}
	f, err := os.OpenFile(swapLockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if areas := swapAreas(); len(areas) > 0 {
		f.Close()
		t.Skipf("this machine has swap already (%v): the test's job would not be killed without its own", areas)
	}
	t.Cleanup(func() {
		defer f.Close()
		if areas := swapAreas(); len(areas) > 0 {
			t.Errorf("swap areas left after the test: %v", areas)
			for _, a := range areas { // leave the machine as it was for the next test
				exec.Command("swapoff", a).Run()
			}
		}
		if loops := loopsOver(under); len(loops) > 0 {
			t.Errorf("loop devices left over the test's files: %v", loops)
			for _, l := range loops {
				exec.Command("losetup", "-d", strings.TrimSuffix(strings.Fields(l)[0], ":")).Run()
			}
		}
	})
}

// swapAreas lists /proc/swaps' areas.
func swapAreas() []string {
	raw, _ := os.ReadFile("/proc/swaps")
	var out []string
	for i, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if f := strings.Fields(line); i > 0 && len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out
}

// loopsOver lists the loop devices (losetup -a) whose backing file is under dir.
func loopsOver(dir string) []string {
	out, _ := exec.Command("losetup", "-a").Output()
	var loops []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, dir) {
			loops = append(loops, line)
		}
	}
	return loops
}

// memCgroup makes a v1 memory cgroup limited to swapLimit, swappiness 60, whose tasks file a
// job of user uid may join; removed at the test's end.
func memCgroup(t *testing.T, uid int) string {
	t.Helper()
	path := fmt.Sprintf("/sys/fs/cgroup/memory/spillway-e2e-swap-%d-%d", os.Getpid(), time.Now().UnixNano())
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 100; i++ {
			if err := os.Remove(path); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Errorf("cannot remove cgroup %s", path)
	})
	for file, v := range map[string]string{"memory.limit_in_bytes": strconv.Itoa(swapLimit), "memory.swappiness": "60"} {
		if err := os.WriteFile(filepath.Join(path, file), []byte(v), 0); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	os.Chown(filepath.Join(path, "cgroup.procs"), uid, -1)
	return path
}

// oomKills is how many processes the OOM killer killed in a cgroup.
func oomKills(cgroup string) int {
	raw, _ := os.ReadFile(filepath.Join(cgroup, "memory.oom_control"))
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// hogScript is a job's body: join the cgroup, show /proc/swaps, touch swapHogMiB MiB (each
// page its own content), read it back and check it. marker, when set, is touched once the
// memory is touched, and the job then waits (at most 10 minutes) until marker.go exists
// before it reads its memory back (a job to kill, or to pull the swap from, while it swaps).
func hogScript(cgroup, marker string) string {
	wait := ""
	if marker != "" {
		// The marker holds /proc/swaps as it was with every page touched.
		wait = fmt.Sprintf("open(%q, 'w').write(open('/proc/swaps').read())\nimport os, time\nfor _ in range(6000):\n    if os.path.exists(%q): break\n    time.sleep(0.1)\n", marker, marker+".go")
	}
	return fmt.Sprintf(`echo $$ > %s/cgroup.procs
echo "swaps during the job:"
cat /proc/swaps
/usr/bin/python3 - <<'EOF'
import sys
n = %d << 20
b = bytearray(n)
for i in range(0, n, 4096):
    b[i] = (i >> 12) %% 251 + 1
print("touched", flush=True)
%sfor i in range(0, n, 4096):
    if b[i] != (i >> 12) %% 251 + 1:
        sys.exit("page %%d came back wrong" %% (i >> 12))
print("verified %d MiB")
EOF
`, cgroup, swapHogMiB, wait, swapHogMiB)
}

// TestSwapRunCoLocated: under `spillway run` (one node, its own storage: the area is on the
// node's fragment, used directly), a process touching twice its cgroup's memory limit is
// killed without swap and completes with #DW swap, swap-only and beside a scratch instance;
// /proc/swaps lists the area during the job and nothing after; no loop device is left.
func TestSwapRunCoLocated(t *testing.T) {
	w := newWorld(t, false)
	requireSwap(t, w.root)
	cg := memCgroup(t, 0)

	without := w.script("noswap.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\n"+hogScript(cg, ""))
	r := w.run("run", without)
	if r.code == 0 || strings.Contains(r.stdout, "verified") || oomKills(cg) == 0 {
		t.Fatalf("without swap the job must be killed for memory (OOM kills %d): %s", oomKills(cg), r)
	}

	for _, tc := range []struct{ name, directives string }{
		{"swap-only", "#DW swap 512MiB\n"},
		{"scratch+swap", "#DW jobdw type=scratch access_mode=striped capacity=1GiB\n#DW swap 512MiB\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kills := oomKills(cg)
			script := w.script(tc.name+".sh", "#!/bin/bash\n"+tc.directives+hogScript(cg, ""))
			r := w.run("run", script)
			if r.code != 0 || !strings.Contains(r.stdout, fmt.Sprintf("verified %d MiB", swapHogMiB)) {
				t.Fatalf("with #DW swap the job must complete: %s", r)
			}
			if oomKills(cg) != kills {
				t.Errorf("the OOM killer ran with swap")
			}
			during := r.stdout[strings.Index(r.stdout, "swaps during the job:"):]
			if !strings.Contains(during, "/dev/loop") {
				t.Errorf("/proc/swaps during the job lists no loop device:\n%s", during)
			}
			if areas := swapAreas(); len(areas) > 0 {
				t.Errorf("swap areas after the job: %v", areas)
			}
			if loops := loopsOver(w.root); len(loops) > 0 {
				t.Errorf("loop devices after the job: %v", loops)
			}
			w.assertClean()
		})
	}
}

// swappedTo reports whether a /proc/swaps listing has a loop device with pages on it.
func swappedTo(procSwaps string) bool {
	for _, line := range strings.Split(procSwaps, "\n") {
		if f := strings.Fields(line); len(f) >= 4 && strings.HasPrefix(f[0], "/dev/loop") && f[3] != "0" {
			return true
		}
	}
	return false
}

// TestSwapJobKilledWhileSwapping: a `spillway run` killed (SIGKILL) while its job has pages
// on its swap area: the next run cleans the abandoned job up, kills what is left of it, and
// its area is detached — nothing in /proc/swaps, no loop device.
func TestSwapJobKilledWhileSwapping(t *testing.T) {
	w := newWorld(t, false)
	requireSwap(t, w.root)
	cg := memCgroup(t, 0)
	marker := filepath.Join(w.root, "touched")
	script := w.script("killed.sh", "#!/bin/bash\n#DW swap 512MiB\n"+
		fmt.Sprintf("( while [ ! -e %s ]; do sleep 0.1; done; kill -KILL $PPID ) &\n", marker)+hogScript(cg, marker))
	r := w.run("run", script)
	if r.code != -1 {
		t.Fatalf("the run must die of SIGKILL while its job swaps: %s", r)
	}
	// The home may already be cleaning the abandoned job up: what the job saw says it swapped.
	if seen, _ := os.ReadFile(marker); !swappedTo(string(seen)) {
		t.Fatalf("the killed run's job had no swap area in use when it was killed; /proc/swaps then:\n%s", seen)
	}
	next := w.script("next.sh", "#!/bin/sh\necho next ran\n")
	if r := w.run("run", next); r.code != 0 || !strings.Contains(r.stdout, "next ran") {
		t.Fatalf("the next run: %s", r)
	}
	w.waitNoSessions()
	waitFor(t, "the abandoned job's swap area to go", func() bool { return len(swapAreas()) == 0 })
	if loops := loopsOver(w.root); len(loops) > 0 {
		t.Errorf("loop devices after the cleanup: %v", loops)
	}
	w.assertClean()
}

// TestSwapRemoteComputeNode: a job driven by dw_wlm_cli as Slurm does, its swap instance on
// storage node hosta and its process on compute node hostb (network namespaces), which
// reaches its area through the burst buffer's data path: without the swap the process is
// killed, with it it completes; /proc/swaps lists the area from pre_run to post_run only.
func TestSwapRemoteComputeNode(t *testing.T) {
	c := newNetCluster(t)
	requireSwap(t, c.dir)
	// A compute-only node keeps its swap areas' records (and its mounts of remote areas)
	// under its agent.ssd_path: this cluster's, not the machine's default.
	cfg := c.hosts["hostb"].config
	raw, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(raw), "[agent]\n", "[agent]\nssd_path = \""+filepath.Join(c.dir, "hostb", "ssd")+"\"\n", 1)), 0o644)
	c.start("ctl")
	c.start("hosta")
	c.start("hostb")
	cg := memCgroup(t, nobodyUID)

	// The job's process on hostb, as its user: in hostb's network namespace (its own mount
	// namespace, made by ip netns exec, has a sysfs without the cgroup file systems; swap and
	// cgroups are the kernel's, the same in every namespace).
	onHostb := func(script string) *exec.Cmd {
		cmd := exec.Command("nsenter", "-t", strconv.Itoa(c.hosts["hostb"].cmd.Process.Pid), "-n", "--",
			"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "/bin/sh", "-c", script)
		cmd.Env, cmd.Dir = []string{"PATH=/usr/bin:/bin", "HOME=/"}, "/"
		return cmd
	}
	hog := "set -e\n" + hogScript(cg, "")
	if out, err := onHostb(hog).CombinedOutput(); err == nil || strings.Contains(string(out), "verified") || oomKills(cg) == 0 {
		t.Fatalf("without swap the process must be killed for memory (OOM kills %d): %v\n%s", oomKills(cg), err, out)
	}

	job := c.jobFile("swap.sh", "#!/bin/bash\n#SBATCH --nodes=1\n#DW swap 512MiB\nsrun ./a.out\n\x00")
	nodes := c.jobFile("nodes", "hostb\n")
	c.wlm("--function", "job_process", "--job", job)
	c.wlm("--function", "setup", "--token", "60", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:1GiB", "--job", job)
	if size := c.wlm("--function", "real_size", "--token", "60"); !strings.Contains(size, `"capacity":1073741824`) {
		t.Errorf("real_size: %s", size)
	}
	c.wlm("--function", "pre_run", "--token", "60", "--job", job, "--nodehostnamefile", nodes)
	if areas := swapAreas(); len(areas) != 1 || !strings.HasPrefix(areas[0], "/dev/loop") {
		t.Fatalf("/proc/swaps after pre_run: %v", areas)
	}
	kills := oomKills(cg)
	out, err := onHostb(hog).CombinedOutput()
	if err != nil || !strings.Contains(string(out), fmt.Sprintf("verified %d MiB", swapHogMiB)) {
		t.Fatalf("with the swap area the process must complete: %v\n%s", err, out)
	}
	if oomKills(cg) != kills || !strings.Contains(string(out), "/dev/loop") {
		t.Errorf("the OOM killer ran with swap, or /proc/swaps showed the job no area:\n%s", out)
	}
	if dw := c.wlm("--function", "show_configurations"); !strings.Contains(dw, `"swap"`) {
		t.Errorf("show_configurations lists no swap configuration: %s", dw)
	}
	c.wlm("--function", "post_run", "--token", "60", "--job", job)
	if areas := swapAreas(); len(areas) != 0 {
		t.Errorf("/proc/swaps after post_run: %v", areas)
	}
	c.wlm("--function", "teardown", "--token", "60", "--job", job)
	c.assertClean()
	// The swap instance's accounting record counts what hostb paged out to its area and in
	// from it: at least what the process had beyond its cgroup's limit.
	var rec views.Realm
	waitFor(t, "the swap instance's accounting record", func() bool {
		raw, _ := os.ReadFile(filepath.Join(c.dir, "state", "accounting.log"))
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			var a views.Accounting
			if json.Unmarshal([]byte(line), &a) == nil && a.Realm.Token == "60" && len(a.Realm.Swap) > 0 {
				rec = a.Realm
				return true
			}
		}
		return false
	})
	excess := uint64(swapHogMiB<<20 - swapLimit)
	if len(rec.Swap) != 1 || rec.Swap[0].Node != "hostb" || rec.Swap[0].BytesWritten < excess/2 || rec.Swap[0].BytesRead == 0 ||
		rec.SwapBytesWritten != rec.Swap[0].BytesWritten || rec.SwapBytesRead != rec.Swap[0].BytesRead {
		t.Errorf("accounting of the swap: %+v (written %d, read %d)", rec.Swap, rec.SwapBytesWritten, rec.SwapBytesRead)
	}
	t.Logf("hostb paged out %d MiB to its area and in %d MiB", rec.SwapBytesWritten>>20, rec.SwapBytesRead>>20)
}

// TestSwapStorageNodeLost: storage node hosta dies while the job's process on hostb has pages
// on its area there. The process is killed when it needs them back (the pages are gone); the
// session says which area was lost and why; hostb survives (its agent answers, the area is
// detached at post_run, nothing left in /proc/swaps); hosta cleans up when it comes back.
func TestSwapStorageNodeLost(t *testing.T) {
	c := newNetCluster(t)
	requireSwap(t, c.dir)
	cfg := c.hosts["hostb"].config
	raw, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(raw), "[agent]\n", "[agent]\nssd_path = \""+filepath.Join(c.dir, "hostb", "ssd")+"\"\n", 1)), 0o644)
	c.start("ctl")
	c.start("hosta")
	c.start("hostb")
	cg := memCgroup(t, nobodyUID)

	job := c.jobFile("lost.sh", "#!/bin/bash\n#DW swap 512MiB\n\x00")
	nodes := c.jobFile("nodes", "hostb\n")
	c.wlm("--function", "setup", "--token", "62", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:1GiB", "--job", job, "--nodehostnamefile", nodes)
	c.wlm("--function", "pre_run", "--token", "62", "--job", job, "--nodehostnamefile", nodes)
	if len(swapAreas()) != 1 {
		t.Fatalf("/proc/swaps after pre_run: %v", swapAreas())
	}
	flags := filepath.Join(c.dir, "flags")
	os.Mkdir(flags, 0o777)
	os.Chmod(flags, 0o777)
	marker := filepath.Join(flags, "touched")
	hog := exec.Command("nsenter", "-t", strconv.Itoa(c.hosts["hostb"].cmd.Process.Pid), "-n", "--",
		"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "/bin/sh", "-c", hogScript(cg, marker))
	hog.Env, hog.Dir = []string{"PATH=/usr/bin:/bin", "HOME=/"}, "/"
	var out strings.Builder
	hog.Stdout, hog.Stderr = &out, &out
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	done, ended := make(chan error, 1), make(chan struct{})
	go func() { err := hog.Wait(); close(ended); done <- err }()
	t.Cleanup(func() {
		hog.Process.Kill()
		select { // a process stuck in a page-in cannot be killed: never wait for ever
		case <-ended:
		case <-time.After(30 * time.Second):
			t.Errorf("the process on hostb (pid %d) does not die", hog.Process.Pid)
		}
	})
	waitFor(t, "the process on hostb to touch its memory", func() bool { _, err := os.Stat(marker); return err == nil })

	c.stop("hosta", true)
	os.WriteFile(marker+".go", nil, 0o644)
	select {
	case err := <-done:
		if err == nil || strings.Contains(out.String(), "verified") {
			t.Errorf("the process read its memory back although its swap's storage node is gone: %v\n%s", err, out.String())
		}
		t.Logf("the process on hostb ended: %v", err)
	case <-time.After(time.Minute):
		raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stack", hog.Process.Pid))
		t.Fatalf("the process on hostb neither got its pages nor was killed in a minute:\n%s\n%s", out.String(), raw)
	}
	var failure string
	waitFor(t, "the session to report its lost swap area (dwstat sessions)", func() bool {
		all, err := c.client.All(context.Background())
		if err != nil {
			return false
		}
		for _, s := range all.Sessions {
			if s.Token == "62" {
				failure = s.Failure
			}
		}
		return strings.Contains(failure, "lost: its storage node hosta is offline")
	})
	if !strings.Contains(failure, "compute node hostb") {
		t.Errorf("session failure: %q", failure)
	}
	// hostb survives: its agent still answers, and its area goes at post_run.
	if out, err := c.onHost("hostb", "echo alive").CombinedOutput(); err != nil || !strings.Contains(string(out), "alive") {
		t.Errorf("hostb after the loss: %v %s", err, out)
	}
	c.wlm("--function", "post_run", "--token", "62", "--job", job)
	if areas := swapAreas(); len(areas) != 0 {
		t.Errorf("/proc/swaps after post_run: %v", areas)
	}
	c.wlm("--function", "teardown", "--token", "62", "--job", job, "--hurry")
	c.start("hosta")
	c.waitFor("hosta to remove the lost job's fragment", func() bool { return len(c.fragments()) == 0 })
	c.assertClean()
}
