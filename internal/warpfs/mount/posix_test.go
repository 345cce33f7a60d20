package mount

import (
	"os"
	"os/exec"
	"regexp"
	"sort"
	"testing"

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
