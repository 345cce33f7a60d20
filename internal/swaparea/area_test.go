package swaparea

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/swaparea/swaptest"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == swaptest.HogArg {
		os.Exit(swaptest.HogMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

const (
	cgroupLimit = 64 << 20
	hogMiB      = 128 // twice the cgroup's limit
	areaSize    = 256 << 20
)

// detach switches an area off and releases it, as the agent does.
func detach(t *testing.T, s Spec, a Area, bound time.Duration) {
	t.Helper()
	off, err := StartSwapoff(a.Device)
	if err != nil {
		t.Fatal(err)
	}
	for {
		v, msg := off.Poll(bound)
		if v == Failed {
			t.Fatalf("detach: %s", msg)
		}
		if v == Detached {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := Release(s, a.Device); err != nil {
		t.Fatal(err)
	}
}

func inSwaps(dev string) bool {
	_, ok := swapsEntry(dev)
	return ok
}

// A process touching twice its cgroup's memory limit is OOM-killed without swap, and
// completes with a swap area on a file of an XFS file system (a co-located compute node's
// case: the fragment's own file system).
func TestAreaLetsAHogTwiceItsLimitComplete(t *testing.T) {
	swaptest.Require(t)
	swaptest.Lock(t)
	exe, _ := os.Executable()

	cg := swaptest.Cgroup(t, cgroupLimit)
	swaptest.NoSwap(t, cg)
	hog := swaptest.StartHog(t, exe, cg, hogMiB)
	if hog.Touched() {
		t.Fatal("the hog touched twice its cgroup's limit with no swap on the host")
	}
	ws := hog.Finish()
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL || swaptest.OOMKills(cg) == 0 {
		t.Fatalf("without swap the hog ended with %v (oom kills %d), not an OOM kill: %s", ws, swaptest.OOMKills(cg), hog.Out)
	}

	fs := swaptest.XFS(t, 512<<20)
	os.Mkdir(filepath.Join(fs, "ns"), 0o700)
	s := Spec{Root: fs, Rel: "ns", Name: "swap-1-c1", Size: areaSize, Priority: swaptest.TestPriority, Label: "spillway-test"}
	a, err := Attach(s)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	t.Cleanup(func() {
		if !released {
			StartSwapoff(a.Device)
			Release(s, a.Device)
		}
	})
	if !a.Swapping || !inSwaps(a.Device) || a.Priority != swaptest.TestPriority || a.File != filepath.Join(fs, "ns", "swap-1-c1") {
		t.Fatalf("attached %+v; /proc/swaps has it: %v", a, inSwaps(a.Device))
	}
	if !a.DirectIO {
		t.Errorf("the loop device over a file on XFS does not use direct I/O")
	}
	var st syscall.Stat_t
	syscall.Stat(a.File, &st)
	if st.Blocks*512 < areaSize || st.Mode&0o777 != 0o600 {
		t.Errorf("the swap file has %d bytes allocated and mode %o; want %d reserved, 0600", st.Blocks*512, st.Mode&0o777, areaSize)
	}
	// Attaching again finds the area: no second loop device, no second swap area.
	again, err := Attach(s)
	if err != nil || again.Device != a.Device {
		t.Fatalf("attaching again: %+v, %v (first %s)", again, err, a.Device)
	}
	if found, ok := Find(a.File); !ok || found.Device != a.Device || !found.Swapping {
		t.Errorf("Find: %+v %v", found, ok)
	}
	if l := List(fs); len(l) != 1 || l[0].Device != a.Device {
		t.Errorf("List(%s): %+v", fs, l)
	}

	cg2 := swaptest.Cgroup(t, cgroupLimit)
	hog = swaptest.StartHog(t, exe, cg2, hogMiB)
	if !hog.Touched() {
		t.Fatalf("with a swap area the hog was killed: %s", hog.Out)
	}
	if ws := hog.Finish(); ws.ExitStatus() != 0 || !strings.Contains(hog.Out.String(), "verified 128 MiB") {
		t.Fatalf("with a swap area the hog ended with %v: %s", ws, hog.Out)
	}
	c, err := ReadCounters(a.Device)
	if err != nil {
		t.Fatal(err)
	}
	c = c.Since(a.Base)
	if c.BytesWritten < 32<<20 || c.BytesRead == 0 || c.BytesWritten > areaSize {
		t.Errorf("counters %+v: want at least the 64 MiB over the limit paged out (less what the cgroup's slack kept), some paged in, no more than the area holds", c)
	}
	t.Logf("paged out %d MiB, in %d MiB", c.BytesWritten>>20, c.BytesRead>>20)

	detach(t, s, a, time.Minute)
	released = true
	if inSwaps(a.Device) {
		t.Error("the area is still in /proc/swaps after its detach")
	}
	if _, ok := Find(a.File); ok {
		t.Error("the loop device is still attached after the detach")
	}
	if _, err := os.Lstat(a.File); !os.IsNotExist(err) {
		t.Errorf("the swap file is still there: %v", err)
	}
}

// The swap file is reached without following a link: a link in its place is refused, and so
// is a directory others may write.
func TestAttachRefusesLinksAndOpenDirectories(t *testing.T) {
	swaptest.Require(t)
	swaptest.Lock(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o700)
	target := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(target, []byte("keep me"), 0o600)
	os.Symlink(target, filepath.Join(dir, "swap-1"))
	if _, err := Attach(Spec{Root: dir, Rel: ".", Name: "swap-1", Size: 1 << 20, Priority: -1}); err == nil {
		t.Fatal("a swap file that is a symbolic link was attached")
	}
	if raw, _ := os.ReadFile(target); string(raw) != "keep me" {
		t.Fatalf("the link's target was changed: %q", raw)
	}
	os.Mkdir(filepath.Join(dir, "sub"), 0o700)
	os.Symlink(filepath.Join(dir, "sub"), filepath.Join(dir, "link"))
	if _, err := Attach(Spec{Root: dir, Rel: "link", Name: "swap-2", Size: 1 << 20, Priority: -1}); err == nil {
		t.Fatal("a directory reached through a link was used")
	}
	open := filepath.Join(dir, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	if _, err := Attach(Spec{Root: dir, Rel: "open", Name: "swap-3", Size: 1 << 20, Priority: -1}); err == nil || !strings.Contains(err.Error(), "writable by no one else") {
		t.Fatalf("a directory anyone may write was used: %v", err)
	}
}

// attachWithHog attaches an area on XFS and fills it with the pages of a hog twice its
// cgroup's limit, which holds them until Finish. oomOff disables the cgroup's OOM killer.
func attachWithHog(t *testing.T, oomOff bool) (Spec, Area, *swaptest.Hog, string) {
	t.Helper()
	exe, _ := os.Executable()
	fs := swaptest.XFS(t, 512<<20)
	s := Spec{Root: fs, Rel: ".", Name: "swap-2-c1", Size: areaSize, Priority: swaptest.TestPriority}
	a, err := Attach(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if inSwaps(a.Device) {
			off, _ := StartSwapoff(a.Device)
			<-off.Done()
		}
		Release(s, a.Device)
	})
	cg := swaptest.Cgroup(t, cgroupLimit)
	if oomOff {
		os.WriteFile(filepath.Join(cg, "memory.oom_control"), []byte("1"), 0)
	}
	hog := swaptest.StartHog(t, exe, cg, hogMiB)
	if !hog.Touched() {
		t.Fatalf("with a swap area the hog was killed: %s", hog.Out)
	}
	return s, a, hog, cg
}

// A swapoff that cannot bring the pages back (their cgroup is at its limit, its OOM killer
// off: the kernel cannot charge them) fails; the area stays attached, the pages safe.
func TestDetachThatCannotBringThePagesBackFails(t *testing.T) {
	swaptest.Require(t)
	swaptest.Lock(t)
	s, a, hog, _ := attachWithHog(t, true)
	off, err := StartSwapoff(a.Device)
	if err != nil {
		t.Fatal(err)
	}
	var v Verdict
	var msg string
	for v, msg = off.Poll(time.Minute); v == Running; v, msg = off.Poll(time.Minute) {
		time.Sleep(20 * time.Millisecond)
	}
	if v != Failed || !strings.Contains(msg, "do not fit") || !inSwaps(a.Device) {
		t.Fatalf("swapoff of pages that cannot come back: %v %q; still attached: %v", v, msg, inSwaps(a.Device))
	}
	t.Logf("reported: %s", msg)
	if ws := hog.Finish(); ws.ExitStatus() != 0 {
		t.Fatalf("the hog's pages did not come back intact: %v %s", ws, hog.Out)
	}
	detach(t, s, a, time.Minute)
}

// A swapoff past its bound is stopped and reported at once, the node usable meanwhile; the
// area is not switched off under the job (the kernel ends the stopped swapoff once it has
// walked the address space it was at, then the area is in /proc/swaps or gone), and a later
// detach finishes. The swapoff is made slow for real: it runs in a blkio cgroup that reads
// the swap device at 4 MiB/s, the hog's cgroup given room for its pages.
func TestDetachPastItsBoundIsStoppedAndReported(t *testing.T) {
	swaptest.Require(t)
	if _, err := os.Stat("/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device"); err != nil {
		t.Skip("no cgroup v1 blkio throttling to slow swapoff down")
	}
	swaptest.Lock(t)
	s, a, hog, cg := attachWithHog(t, false)
	// Room for the pages to come back: swapoff charges them to the hog's cgroup, and fails
	// (ENOMEM) where they do not fit.
	os.WriteFile(filepath.Join(cg, "memory.limit_in_bytes"), []byte("536870912"), 0)
	blk := filepath.Join("/sys/fs/cgroup/blkio", "spillway-swaptest-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(blk, 0o755); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	syscall.Stat(a.Device, &st)
	majmin := strconv.Itoa(int(st.Rdev>>8)) + ":" + strconv.Itoa(int(st.Rdev&0xff))
	t.Cleanup(func() {
		// Unthrottled, a swapoff still running ends at once.
		os.WriteFile(filepath.Join(blk, "blkio.throttle.read_bps_device"), []byte(majmin+" 0"), 0)
		os.WriteFile(filepath.Join(blk, "blkio.throttle.read_iops_device"), []byte(majmin+" 0"), 0)
		for i := 0; i < 200 && os.Remove(blk) != nil; i++ {
			time.Sleep(50 * time.Millisecond)
		}
	})
	for file, v := range map[string]string{"blkio.throttle.read_bps_device": majmin + " 4194304", "blkio.throttle.read_iops_device": majmin + " 1024"} {
		if err := os.WriteFile(filepath.Join(blk, file), []byte(v), 0); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	defer func(old func(string) []string) { swapoffArgv = old }(swapoffArgv)
	swapoffArgv = func(dev string) []string {
		return []string{"sh", "-c", `echo $$ > "$1/cgroup.procs" && exec swapoff "$2"`, "sh", blk, dev}
	}
	off, err := StartSwapoff(a.Device)
	if err != nil {
		t.Fatal(err)
	}
	const bound = time.Second
	var v Verdict
	var msg string
	for v, msg = off.Poll(bound); v == Running; v, msg = off.Poll(bound) {
		time.Sleep(50 * time.Millisecond)
	}
	if v != Failed || !strings.Contains(msg, "did not finish within 1s") || time.Since(off.Started) > 5*time.Second {
		t.Fatalf("a swapoff at 4 MiB/s of 64 MiB and more, bound 1s: %v %q after %s", v, msg, time.Since(off.Started))
	}
	if off.Ended() {
		t.Fatal("the swapoff ended at once: the test did not slow it down")
	}
	// The node is usable meanwhile: a new process runs and gets memory.
	if out, err := exec.Command("sh", "-c", "head -c 16777216 /dev/zero | wc -c").Output(); err != nil || strings.TrimSpace(string(out)) != "16777216" {
		t.Fatalf("the node is not usable while a stopped swapoff ends: %q %v", out, err)
	}
	select {
	case <-off.Done():
	case <-time.After(2 * time.Minute):
		t.Fatal("the stopped swapoff has not ended two minutes later")
	}
	swapoffArgv = func(dev string) []string { return []string{"swapoff", dev} }
	if ws := hog.Finish(); ws.ExitStatus() != 0 {
		t.Fatalf("the hog's pages did not come back intact: %v %s", ws, hog.Out)
	}
	if inSwaps(a.Device) {
		detach(t, s, a, time.Minute)
	} else if err := Release(s, a.Device); err != nil {
		t.Fatal(err)
	}
}
