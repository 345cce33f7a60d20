package stage

import (
	"context"
	"fmt"
	"github.com/spillway-hpc/spillway/internal/traceattack"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
)

// workerExe runs this test binary as the worker: TestMain turns "stage-worker" into WorkerMain,
// exactly as `spillway stage-worker` will.
var workerExe []string

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "stage-worker" {
		os.Exit(WorkerMain(os.Args[2:], os.Stdin, os.Stdout))
	}
	if len(os.Args) > 1 && os.Args[1] == "stage-worker-stalls" {
		// A worker whose copy blocks for good and does not heed SIGTERM, as one reading from
		// a FUSE server its user stopped (TestStalledStageIsEnded).
		copyHook = func() {
			for {
				time.Sleep(time.Hour)
			}
		}
		os.Exit(WorkerMain(os.Args[2:], os.Stdin, os.Stdout))
	}
	if len(os.Args) > 1 && os.Args[1] == "stage-worker-slow" {
		// A worker that copies slowly but steadily (TestSlowStageIsNotStalled).
		copyHook = func() { time.Sleep(50 * time.Millisecond) }
		os.Exit(WorkerMain(os.Args[2:], os.Stdin, os.Stdout))
	}
	if len(os.Args) > 1 && os.Args[1] == "stage-worker-probe" {
		// The worker's way to the user's identity, then the command of the rest of the
		// arguments (TestWorkerGetsTheUserIdentityAndNothingElse).
		rest, err := becomeStageUser(os.Args[2:])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, syscall.Exec(rest[0], rest, os.Environ()))
		os.Exit(1)
	}
	if len(os.Args) > 1 && os.Args[1] == "trace-attacker" {
		os.Exit(traceAttacker())
	}
	// The build directory is private to root; the worker may run as nobody, so it runs from a
	// copy in a directory anyone may enter.
	exe, err := traceattack.PublicCopy("stage.test")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot prepare the worker binary:", err)
		os.Exit(2)
	}
	workerExe = []string{exe, "stage-worker"}
	code := m.Run()
	os.RemoveAll(filepath.Dir(exe))
	os.Exit(code)
}

func isRoot() bool { return os.Getuid() == 0 }

// stageIdentity is who stages in the tests: nobody when the tests run as root (the real
// situation: a root agent staging for a user), else the test's own user.
func stageIdentity() (uid, gid uint32) {
	if isRoot() {
		return 65534, 65534
	}
	return uint32(os.Getuid()), uint32(os.Getgid())
}

// area is a PFS directory and a namespace root, both owned by the staging user, inside a
// directory anyone may enter, plus "outside", a directory next to the namespace that no stage
// may touch.
type area struct {
	base, pfs, ns, outside string
}

func newArea(t *testing.T) area {
	t.Helper()
	base, err := os.MkdirTemp("", "stage-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	a := area{base: base, pfs: filepath.Join(base, "pfs"), ns: filepath.Join(base, "ns"), outside: filepath.Join(base, "outside")}
	for _, dir := range []string{a.pfs, a.ns, a.outside} {
		mkdir(t, dir, 0o755)
	}
	return a
}

// owned gives path to the staging user (when running as root).
func owned(t *testing.T, path string) {
	t.Helper()
	uid, gid := stageIdentity()
	if err := os.Lchown(path, int(uid), int(gid)); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	owned(t, path)
}

// writeFile writes a file owned by the staging user with the given mode and mtime.
func writeFile(t *testing.T, path, content string, mode fs.FileMode, mtime time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	owned(t, path)
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	owned(t, path)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func spec(a area, direction, typ, pfsPath, dwPath string) agentapi.StageSpec {
	uid, gid := stageIdentity()
	return agentapi.StageSpec{
		ID: 7, Direction: direction, Type: typ, PFSPath: pfsPath, DWPath: dwPath,
		Roots: map[string]string{"DW_JOB_STRIPED": a.ns}, UID: uid, GID: gid, Parallel: 4,
	}
}

// testLimits keep a hung stage from hanging the tests.
func testLimits() Limits {
	return Limits{Timeout: 60 * time.Second, CancelGrace: 5 * time.Second, ProgressInterval: 20 * time.Millisecond}
}

func runStage(t *testing.T, s agentapi.StageSpec) (agentapi.StageStatus, *Run) {
	t.Helper()
	r := Start(context.Background(), workerExe, s, testLimits(), nil)
	return r.Wait(), r
}

func mustComplete(t *testing.T, s agentapi.StageSpec) agentapi.StageStatus {
	t.Helper()
	st, _ := runStage(t, s)
	if st.Status != "complete" {
		t.Fatalf("stage %s %s: status %q, error %q", s.Direction, s.Type, st.Status, st.Error)
	}
	return st
}

func mustFail(t *testing.T, s agentapi.StageSpec, wantInError ...string) agentapi.StageStatus {
	t.Helper()
	st, _ := runStage(t, s)
	if st.Status != "failed" {
		t.Fatalf("stage %s %s: status %q, want failed (error %q)", s.Direction, s.Type, st.Status, st.Error)
	}
	for _, want := range wantInError {
		if !strings.Contains(st.Error, want) {
			t.Errorf("error %q does not contain %q", st.Error, want)
		}
	}
	return st
}

// sameTree checks that dst reproduces src: same entries, types, modes, sizes, contents,
// mtimes and link targets; hard links in src become separate files in dst.
func sameTree(t *testing.T, src, dst string) {
	t.Helper()
	seen := map[string]bool{}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if rel == "." {
			return nil
		}
		seen[rel] = true
		other := filepath.Join(dst, rel)
		sfi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		dfi, err := os.Lstat(other)
		if err != nil {
			t.Errorf("%s: missing in the copy: %v", rel, err)
			return nil
		}
		if sfi.Mode() != dfi.Mode() {
			t.Errorf("%s: mode %v, want %v", rel, dfi.Mode(), sfi.Mode())
		}
		if !sfi.ModTime().Equal(dfi.ModTime()) {
			t.Errorf("%s: mtime %v, want %v", rel, dfi.ModTime(), sfi.ModTime())
		}
		switch {
		case sfi.Mode().IsRegular():
			if a, b := readFile(t, path), readFile(t, other); a != b {
				t.Errorf("%s: content %q, want %q", rel, b, a)
			}
			if statOf(dfi).Nlink != 1 {
				t.Errorf("%s: %d links in the copy, want a separate file", rel, statOf(dfi).Nlink)
			}
		case sfi.Mode()&fs.ModeSymlink != 0:
			a, _ := os.Readlink(path)
			b, _ := os.Readlink(other)
			if a != b {
				t.Errorf("%s: link to %q, want %q", rel, b, a)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	filepath.WalkDir(dst, func(path string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(dst, path)
		if err == nil && rel != "." && !seen[rel] {
			t.Errorf("%s: in the copy but not in the source", rel)
		}
		return nil
	})
}

// ownedByStager checks that everything below dir belongs to the staging user.
func ownedByStager(t *testing.T, dir string) {
	t.Helper()
	uid, _ := stageIdentity()
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Error(err)
			return nil
		}
		fi, err := os.Lstat(path)
		if err == nil && statOf(fi).Uid != uid {
			t.Errorf("%s belongs to uid %d, want %d", path, statOf(fi).Uid, uid)
		}
		return nil
	})
}

func emptyDir(t *testing.T, dir string) {
	t.Helper()
	list, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		var names []string
		for _, e := range list {
			names = append(names, e.Name())
		}
		t.Errorf("%s should be empty, holds %v", dir, names)
	}
}

func sparseFile(t *testing.T, path string, size int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	owned(t, path)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
