package pfsio

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/privdrop"
	"github.com/spillway-hpc/spillway/internal/swaprace"
	"github.com/spillway-hpc/spillway/internal/traceattack"
)

// workerExe runs this test binary as the door's worker: TestMain turns "pfsio-worker" into
// WorkerMain, exactly as `spillway pfs-worker` does.
var workerExe []string

// The user of the tests: nobody, with a supplementary group of its own for the group tests.
const (
	userUID     = 65534
	userGID     = 65534
	userGroup   = 4242 // a supplementary group of the user
	strangerGID = 4343 // a group the user is not in
)

func user() *privdrop.Identity {
	return &privdrop.Identity{UID: userUID, GID: userGID, Groups: []uint32{userGID, userGroup}}
}

func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "pfsio-worker":
			os.Exit(WorkerMain(os.Args[2:], os.Stderr))
		case "swap-attacker":
			os.Exit(swaprace.Main(os.Getenv("SWAPRACE_SPEC")))
		case "trace-attacker":
			self, _ := os.Executable()
			os.Exit(traceattack.Main([]string{self, "pfsio-worker"}))
		case "pfsio-agent":
			// An agent that opens a door for the user, says its worker's pid and waits to be
			// killed (TestWorkerDiesWithItsAgent).
			self, _ := os.Executable()
			d, err := Start([]string{self, "pfsio-worker"}, os.Args[2], user(), Options{})
			if err != nil {
				fmt.Println("error:", err)
				os.Exit(1)
			}
			fmt.Println(d.Pid())
			io.Copy(io.Discard, os.Stdin)
			os.Exit(0)
		}
	}
	// The build directory is private to root; attackers run as nobody from a copy in a
	// directory anyone may enter.
	exe, err := traceattack.PublicCopy("pfsio.test")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot prepare the worker binary:", err)
		os.Exit(2)
	}
	workerExe = []string{exe, "pfsio-worker"}
	code := m.Run()
	os.RemoveAll(filepath.Dir(exe))
	os.Exit(code)
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root: the worker must run as another user than the agent")
	}
}

// area is a PFS root owned by the user inside a directory anyone may enter, and "outside", a
// directory next to it, also the user's (so that only the door's rules, not permissions,
// keep the door out of it), holding a canary file.
type area struct {
	base, pfs, outside, canary string
}

const canaryText = "the canary outside the PFS root\n"

var canaryTime = time.Unix(1_600_000_000, 0)

func newArea(t *testing.T) area {
	t.Helper()
	base, err := os.MkdirTemp("", "pfsio-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	must(t, os.Chmod(base, 0o755))
	a := area{base: base, pfs: filepath.Join(base, "pfs"), outside: filepath.Join(base, "outside")}
	a.canary = filepath.Join(a.outside, swaprace.TargetName)
	for _, dir := range []string{a.pfs, a.outside} {
		must(t, os.Mkdir(dir, 0o755))
		must(t, os.Chown(dir, userUID, userGID))
	}
	must(t, os.WriteFile(a.canary, []byte(canaryText), 0o644))
	must(t, os.Chown(a.canary, userUID, userGID))
	must(t, os.Chtimes(a.canary, canaryTime, canaryTime))
	return a
}

// untouched checks that nothing outside the PFS root changed: the canary's content, mode,
// owner, times and attributes, and no new entry beside it.
func (a area) untouched(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(a.canary)
	if err != nil || string(b) != canaryText {
		t.Errorf("the canary outside the root now holds %q (%v)", b, err)
	}
	var st syscall.Stat_t
	must(t, syscall.Lstat(a.canary, &st))
	if st.Mode != syscall.S_IFREG|0o644 || st.Uid != userUID || st.Gid != userGID || st.Mtim.Sec != canaryTime.Unix() {
		t.Errorf("the canary outside the root changed: mode %o owner %d:%d mtime %d", st.Mode, st.Uid, st.Gid, st.Mtim.Sec)
	}
	if sz, _ := syscall.Listxattr(a.canary, make([]byte, 1024)); sz != 0 {
		t.Errorf("the canary outside the root gained extended attributes")
	}
	entries, _ := os.ReadDir(a.outside)
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the directory outside the root holds %v, want only the canary", names)
	}
}

// userFile writes a file of the user's.
func userFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	must(t, os.WriteFile(path, []byte(content), 0o600))
	must(t, os.Chmod(path, mode))
	must(t, os.Lchown(path, userUID, userGID))
}

func userDir(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	must(t, os.Mkdir(path, 0o700))
	must(t, os.Chmod(path, mode))
	must(t, os.Lchown(path, userUID, userGID))
}

func userSymlink(t *testing.T, target, path string) {
	t.Helper()
	must(t, os.Symlink(target, path))
	must(t, os.Lchown(path, userUID, userGID))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// startDoor opens a door on root for the user, through a worker.
func startDoor(t *testing.T, root string, opts Options) *Door {
	t.Helper()
	d, err := Start(workerExe, root, user(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// eachDoor runs fn with each of the two ways in, each on an area of its own: a worker holding
// the user's credentials, and in-process (this root test process playing a caller that
// already is its user: no permission stops it, so only the door's own rules do).
func eachDoor(t *testing.T, opts Options, fn func(t *testing.T, d *Door, a area)) {
	needRoot(t)
	t.Run("worker", func(t *testing.T) {
		a := newArea(t)
		fn(t, startDoor(t, a.pfs, opts), a)
	})
	t.Run("in-process", func(t *testing.T) {
		a := newArea(t)
		d, err := Open(a.pfs, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		fn(t, d, a)
	})
}

func errnoIs(err error, want syscall.Errno) bool { return errors.Is(err, want) }

func sleep(ms int) { time.Sleep(time.Duration(ms) * time.Millisecond) }
