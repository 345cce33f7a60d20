package mount

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hanwen/go-fuse/v2/posixtest"

	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// documentedDifferences are the cases of go-fuse's POSIX suite that a backend may fail where
// the backing file system passes, each a DataWarp semantic written in docs/mounts.md.
var documentedDifferences = map[string]map[string]string{
	"striped": {
		"Link":             "a striped file has one name: hard links are refused with EPERM (docs/mounts.md, Striping)",
		"LinkUnlinkRename": "a striped file has one name: hard links are refused with EPERM (docs/mounts.md, Striping)",
		"NlinkZero":        "a striped file has one name: hard links are refused with EPERM (docs/mounts.md, Striping)",
	},
}

func init() {
	// max_mds: the striped differences, and a file renamed to a name another shard holds is
	// made anew there (its data stays), with a new inode number.
	maxmds := map[string]string{}
	for name, why := range documentedDifferences["striped"] {
		maxmds[name] = why
	}
	for _, name := range []string{"RenameOverwriteDestExist", "RenameOverwriteDestNoExist"} {
		maxmds[name] = "max_mds: a file renamed to a name of another shard gets a new inode number (docs/mounts.md, Striping)"
	}
	documentedDifferences["striped-maxmds"] = maxmds
}

// TestPosixSuite runs a third-party POSIX conformance suite (go-fuse's posixtest, from the Go
// module proxy) on the backing file system and on every backend's mount, striped ones
// included: a mount fails no case the backing file system passes, except the documented
// differences above.
func TestPosixSuite(t *testing.T) {
	names := make([]string, 0, len(posixtest.All))
	for name := range posixtest.All {
		names = append(names, name)
	}
	sort.Strings(names)
	backing := posixOnBacking(t)
	eachBackend(t, func(t *testing.T, b testBackend) {
		src, mp := dirs(t)
		m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("posix", 1<<30), Logger: quietLogger(t)})
		kind := "plain"
		if b.striped {
			kind = "striped"
		}
		if b.shards > 1 {
			kind = "striped-maxmds"
		}
		for _, name := range names {
			t.Run(name, func(t *testing.T) {
				if !backing[name] {
					t.Skip("the backing file system fails it too")
				}
				if why, ok := documentedDifferences[kind][name]; ok {
					t.Skip(why)
				}
				dir, err := os.MkdirTemp(m.Path(), name)
				if err != nil {
					t.Fatal(err)
				}
				posixtest.All[name](t, dir)
			})
		}
	})
}

// posixOnBacking runs the suite on a plain directory, in a process of its own (the cases that
// the backing file system fails must not fail this test), and says which cases passed.
func posixOnBacking(t *testing.T) map[string]bool {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestPosixBackingHelper$", "-test.v")
	cmd.Env = append(os.Environ(), posixBackingEnv+"=1")
	out, _ := cmd.CombinedOutput()
	passed := map[string]bool{}
	for _, m := range regexp.MustCompile(`--- PASS: TestPosixBackingHelper/(\w+)`).FindAllStringSubmatch(string(out), -1) {
		passed[m[1]] = true
	}
	if len(passed) < len(posixtest.All)/2 {
		t.Fatalf("the suite passed only %d cases on the backing file system:\n%s", len(passed), out)
	}
	return passed
}

const posixBackingEnv = "SPILLWAY_POSIX_BACKING"

// TestPosixBackingHelper is posixOnBacking's child: the suite on a temporary directory.
func TestPosixBackingHelper(t *testing.T) {
	if os.Getenv(posixBackingEnv) == "" {
		t.Skip("run by TestPosixSuite")
	}
	for name, test := range posixtest.All {
		t.Run(name, func(t *testing.T) { test(t, t.TempDir()) })
	}
}

// A name longer than NAME_MAX (255 bytes) fails with ENAMETOOLONG on every backend, as on the
// backing file system, whatever the call (pjdfstest's *::enametoolong_component cases found
// that the mounts said EINVAL: the kernel passes FUSE names up to 1024 bytes).
func TestLongNamesAreENAMETOOLONG(t *testing.T) {
	eachBackend(t, func(t *testing.T, b testBackend) {
		src, mp := dirs(t)
		m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("names", 1<<20), Logger: quietLogger(t)})
		ok := filepath.Join(m.Path(), strings.Repeat("n", 255))
		if err := os.WriteFile(ok, []byte("x"), 0o644); err != nil {
			t.Fatalf("a 255-byte name: %v", err)
		}
		long := filepath.Join(m.Path(), strings.Repeat("n", 256))
		for what, call := range map[string]func() error{
			"stat":     func() error { _, err := os.Lstat(long); return err },
			"create":   func() error { return os.WriteFile(long, nil, 0o644) },
			"mkdir":    func() error { return os.Mkdir(long, 0o755) },
			"mkfifo":   func() error { return syscall.Mkfifo(long, 0o644) },
			"symlink":  func() error { return os.Symlink("target", long) },
			"link":     func() error { return os.Link(ok, long) },
			"rename":   func() error { return os.Rename(ok, long) },
			"unlink":   func() error { return syscall.Unlink(long) },
			"rmdir":    func() error { return syscall.Rmdir(long) },
			"chmod":    func() error { return os.Chmod(long, 0o600) },
			"truncate": func() error { return os.Truncate(long, 0) },
		} {
			err := call()
			if !errors.Is(err, syscall.ENAMETOOLONG) {
				var errno syscall.Errno // the error without the path, 256 bytes of it
				if !errors.As(err, &errno) {
					t.Errorf("%s of a 256-byte name: %v, want ENAMETOOLONG", what, err)
				} else {
					t.Errorf("%s of a 256-byte name: %v, want ENAMETOOLONG", what, errno)
				}
			}
		}
		if _, err := os.Stat(ok); err != nil {
			t.Errorf("the 255-byte name after the refused calls: %v", err)
		}
	})
}

// fallocate changes a file's ctime on every backend, at once, as on the backing file system
// (pjdfstest's posix_fallocate::update_ctime_success found that a striped mount changed it only
// at the next flush).
func TestFallocateChangesCtime(t *testing.T) {
	eachBackend(t, func(t *testing.T, b testBackend) {
		src, mp := dirs(t)
		m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("fallocate", 1<<20), Logger: quietLogger(t)})
		f, err := os.Create(filepath.Join(m.Path(), "f"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var before, after unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &before); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // past the backing file system's timestamp granularity
		if err := fallocate(int(f.Fd()), 0, 0, 123); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fstat(int(f.Fd()), &after); err != nil {
			t.Fatal(err)
		}
		if after.Ctim == before.Ctim {
			t.Errorf("ctime %v did not change with fallocate", time.Unix(after.Ctim.Unix()))
		}
		if after.Size != 123 {
			t.Errorf("size after fallocate: %d, want 123", after.Size)
		}
	})
}

// fallocate is unix.Fallocate restarted when a signal interrupts it (fallocate(2) returns
// EINTR then; over FUSE a signal to the calling thread, SIGCHLD of a test's child process
// among them, interrupts the request), as a program calling it must.
func fallocate(fd int, mode uint32, off, size int64) error {
	for {
		if err := unix.Fallocate(fd, mode, off, size); err != unix.EINTR {
			return err
		}
	}
}

// copyFileRange is unix.CopyFileRange restarted when a signal interrupts it (EINTR).
func copyFileRange(rfd int, roff *int64, wfd int, woff *int64, n int, flags int) (int, error) {
	for {
		if c, err := unix.CopyFileRange(rfd, roff, wfd, woff, n, flags); err != unix.EINTR {
			return c, err
		}
	}
}
