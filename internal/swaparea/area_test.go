package swaparea

import (
	"os"
	"path/filepath"
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
	s := Spec{Root: fs, Rel: "ns", Name: "swap-1-c1", Size: areaSize, Priority: 7, Label: "spillway-test"}
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
	if !a.Swapping || !inSwaps(a.Device) || a.Priority != 7 || a.File != filepath.Join(fs, "ns", "swap-1-c1") {
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
