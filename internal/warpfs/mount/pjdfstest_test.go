package mount

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// pjdfstestVersion is the version of pjdfstest (the Rust rewrite of the pjd POSIX file system
// test suite, from crates.io) that scripts/install-deps --test installs and this test expects.
const pjdfstestVersion = "0.2.2"

// requirePjdfstestEnv makes a missing pjdfstest a failure instead of a skip (scripts/test-all
// sets it, so that CI really runs the suite).
const requirePjdfstestEnv = "SPILLWAY_REQUIRE_PJDFSTEST"

// pjdfstestConfig is the suite's configuration. Every opt-in feature Linux has is enabled
// (chflags, NFSv4 ACLs and st_birthtime are FreeBSD's). The naptime, the sleep between two
// changes whose timestamps must differ, is above the backing file system's timestamp
// granularity (ext4's is a jiffy: with pjdfstest's example 1 ms the backing file system itself
// fails the timestamp cases). allow_remount stays off: the EROFS cases remount the file
// system under test read-only, and the backing file system is the machine's. The two
// unprivileged users the suite switches to exist on every Debian system.
const pjdfstestConfig = `[features]
posix_fallocate = {}
rename_ctime = {}
utime_now = {}
utimensat = {}

[settings]
naptime = 0.05
allow_remount = false

[dummy_auth]
entries = [["nobody", "nogroup"], ["daemon", "daemon"]]
`

// pjdfstestDifferences are the pjdfstest cases a mount may fail (or skip) where the backing
// file system passes, each with the DataWarp semantic of docs/mounts.md that makes it so, and
// what the suite's report of the case must say (so that a case failing for another reason
// still fails the test). The keys are a backend kind: "all", or "striped" (striped,
// striped-remote; a private instance's mount is a striped one: its own namespace, file data
// striped over all the instance's servers).
var pjdfstestDifferences = map[string]map[string]pjdfstestDiff{
	"all": {
		"link::link_count_max": {reason: "statfs().f_type is FUSE's (docs/mounts.md, Limits and differences): " +
			"glibc's pathconf(_PC_LINK_MAX) knows no limit for it, and the suite skips the case",
			output: "Cannot get value for LINK_MAX"},
	},
	"striped": {
		// Each links a regular file before what it tests; the same cases on the other file
		// types pass.
		"link::changed_ctime_success::regular":    {reason: hardLinkRefused, output: "link(&file, &new_path).is_ok()"},
		"link::remove_link::regular":              {reason: hardLinkRefused, output: "EPERM"},
		"link::share_metadata::regular":           {reason: hardLinkRefused, output: "EPERM"},
		"rename::preserve_metadata::regular":      {reason: hardLinkRefused, output: "EPERM"},
		"rename::to_multiply_linked::regular":     {reason: hardLinkRefused, output: "EPERM"},
		"unlink::unchanged_ctime_failed::regular": {reason: hardLinkRefused, output: "EPERM"},
		"unlink::update_ctime_success::regular":   {reason: hardLinkRefused, output: "EPERM"},
	},
	// max_mds: besides the striped ones, the cases whose random names may land on different
	// servers (so they may also pass: byName).
	"maxmds": maxMDSDifferences(),
}

// maxMDSDifferences are a max_mds mount's: a hard link of a non-regular file to a name another
// server holds is EXDEV, and a file renamed to such a name is made anew there, with a new
// inode number (docs/mounts.md, max_mds).
func maxMDSDifferences() map[string]pjdfstestDiff {
	out := map[string]pjdfstestDiff{}
	for _, kind := range []string{"block", "char", "fifo", "socket"} {
		for _, c := range []string{"link::changed_ctime_success", "link::remove_link", "link::share_metadata",
			"rename::to_multiply_linked", "unlink::unchanged_ctime_failed", "unlink::update_ctime_success"} {
			out[c+"::"+kind] = pjdfstestDiff{reason: crossShardLink, output: "EXDEV|link(&file, &new_path).is_ok()", byName: true}
		}
		out["rename::preserve_metadata::"+kind] = pjdfstestDiff{reason: crossShardLink + "; " + crossShardRename,
			output: "EXDEV|left == right", byName: true}
	}
	out["rename::preserve_metadata::regular"] = pjdfstestDiff{reason: hardLinkRefused + "; " + crossShardRename, output: "EPERM|left == right", byName: true}
	out["rename::preserve_metadata_symlink"] = pjdfstestDiff{reason: crossShardRename, output: "left == right", byName: true}
	return out
}

const (
	crossShardLink = "max_mds: a hard link of a non-regular file to a name another server holds " +
		"is refused with EXDEV (docs/mounts.md, max_mds)"
	crossShardRename = "max_mds: a file renamed to a name another server holds is made anew there, " +
		"with a new inode number (docs/mounts.md, max_mds)"
)

// pjdfstestDiff is a documented difference: why, and what the case's report says (any of
// output's |-separated texts). byName: whether it shows depends on the random names the case
// picks (max_mds), so it may also pass.
type pjdfstestDiff struct {
	reason, output string
	byName         bool
}

// shows reports whether a case's report is the documented difference's.
func (d pjdfstestDiff) shows(detail string) bool {
	for _, text := range strings.Split(d.output, "|") {
		if strings.Contains(detail, text) {
			return true
		}
	}
	return false
}

const hardLinkRefused = "a striped file has one name: hard links to it are refused with EPERM " +
	"(docs/mounts.md, Striping)"

// pjdfstestDifference is the documented difference of a mount of kind on a case, if any.
func pjdfstestDifference(kind, name string) (pjdfstestDiff, bool) {
	kinds := []string{kind, "all"}
	if kind == "maxmds" {
		kinds = []string{kind, "striped", "all"}
	}
	for _, k := range kinds {
		if d, ok := pjdfstestDifferences[k][name]; ok {
			return d, true
		}
	}
	return pjdfstestDiff{}, false
}

// pjdfstestResult is one case's outcome: "ok", "FAILED", "skipped", "PASSED UNEXPECTEDLY" or
// "failed as expected", and what the suite printed under it (the failed assertion, the reason
// for a skip).
type pjdfstestResult struct {
	outcome string
	detail  string
}

func (r pjdfstestResult) passed() bool { return r.outcome == "ok" }

// TestPjdfstest runs pjdfstest, a third-party POSIX conformance suite installed from crates.io
// by scripts/install-deps --test, on the backing file system and on a mount of every backend:
// the local and remote loopbacks, and a striped namespace served by 3 stripe servers, in this
// process (striped) or over TCP (striped-remote). A private instance's mount is, at the
// mount level, a striped one (a namespace of its own, data striped over all its servers), so
// the striped backends cover it. A mount fails no case that the backing file system passes,
// except the differences listed in pjdfstestDifferences, each a DataWarp semantic written in
// docs/mounts.md.
//
// The whole suite runs on each target: about 400 cases, 6 s on the backing file system, 10 to
// 20 s on a mount, about a minute in all on a 2-core machine. The cases that cannot run here
// are skipped on every target alike: the EROFS cases (they remount the file system under test
// read-only) and those of FreeBSD's features (chflags, NFSv4 ACLs, st_birthtime).
func TestPjdfstest(t *testing.T) {
	bin := findPjdfstest(t)
	conf := filepath.Join(testBase, "pjdfstest.toml")
	if err := os.WriteFile(conf, []byte(pjdfstestConfig), 0o644); err != nil {
		t.Fatal(err)
	}

	// The suite binds Unix sockets at paths 55 to 90 bytes below the directory it is given, and
	// a socket's path has at most 107: the targets are short paths (/tmp/pjNNNN/b), beside the
	// longer ones of the mounts' namespaces and stripe directories (dirs).
	short, err := os.MkdirTemp(os.TempDir(), "pj")
	if err == nil {
		err = os.Chmod(short, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the subtests' cleanups, which unmount
		if left := mountsUnder(short); len(left) > 0 {
			t.Errorf("mounts left behind: %v", left)
			for _, p := range left {
				syscall.Unmount(p, syscall.MNT_DETACH)
			}
		}
		os.RemoveAll(short)
	})
	backingDir := filepath.Join(short, "b")
	if err := os.Mkdir(backingDir, 0o755); err != nil {
		t.Fatal(err)
	}
	backing := runPjdfstest(t, bin, conf, backingDir)
	passedOnBacking := 0
	for _, r := range backing {
		if r.passed() {
			passedOnBacking++
		}
	}
	if passedOnBacking < 300 {
		t.Fatalf("pjdfstest passed only %d of %d cases on the backing file system %s", passedOnBacking, len(backing), backingDir)
	}
	t.Logf("backing file system: %s", pjdfstestSummary(backing))

	eachBackend(t, func(t *testing.T, b testBackend) {
		src, _ := dirs(t)
		// open::interact_2gb writes a byte past 2 GiB, and a file counts against the capacity
		// by its apparent size (docs/mounts.md): the instance is large enough to hold it.
		m := b.mount(t, Spec{MountPath: filepath.Join(short, b.name), SourceDir: src, Tracker: usage.New("pjdfstest", 16<<30),
			AllowOther: true, Logger: quietLogger(t)})
		kind := "plain"
		switch {
		case b.shards > 1:
			kind = "maxmds"
		case b.striped:
			kind = "striped"
		}
		got := runPjdfstest(t, bin, conf, m.Path())
		t.Logf("%s mount: %s", b.name, pjdfstestSummary(got))
		names := make([]string, 0, len(backing))
		for name := range backing {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			if !backing[name].passed() {
				continue
			}
			r, ran := got[name]
			if ran && r.passed() {
				continue
			}
			if d, ok := pjdfstestDifference(kind, name); ok && ran && d.shows(r.detail) {
				t.Logf("%s: %s, as documented: %s", name, r.outcome, d.reason)
				continue
			}
			if !ran {
				t.Errorf("%s: passes on the backing file system, absent from the %s mount's run", name, b.name)
				continue
			}
			t.Errorf("%s: passes on the backing file system, %s on the %s mount:\n%s", name, r.outcome, b.name, r.detail)
		}
		// A documented difference that no longer shows is stale: the table stays exact.
		for _, k := range []string{kind, "all"} {
			for name, d := range pjdfstestDifferences[k] {
				if r, ok := got[name]; ok && r.passed() && !d.byName {
					t.Errorf("%s passes on the %s mount: remove it from pjdfstestDifferences (%s)", name, b.name, d.reason)
				}
			}
		}
	})
}

// findPjdfstest returns the path of pjdfstest at the expected version, or skips the test
// (fails it when requirePjdfstestEnv is set).
func findPjdfstest(t *testing.T) string {
	t.Helper()
	missing := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...) + fmt.Sprintf("; install it with scripts/install-deps --test "+
			"(cargo install --locked pjdfstest --version %s)", pjdfstestVersion)
		if os.Getenv(requirePjdfstestEnv) != "" {
			t.Fatalf("%s (%s is set)", msg, requirePjdfstestEnv)
		}
		t.Skip(msg)
	}
	candidates := []string{}
	if p, err := exec.LookPath("pjdfstest"); err == nil {
		candidates = append(candidates, p)
	}
	if home := os.Getenv("CARGO_HOME"); home != "" {
		candidates = append(candidates, filepath.Join(home, "bin", "pjdfstest"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		candidates = append(candidates, filepath.Join(home, ".cargo", "bin", "pjdfstest"))
	}
	candidates = append(candidates, "/usr/local/bin/pjdfstest")
	var seen []string
	for _, p := range candidates {
		out, err := exec.Command(p, "--version").Output()
		if err != nil {
			continue
		}
		version := strings.TrimSpace(string(out))
		if version == "pjdfstest "+pjdfstestVersion {
			return p
		}
		seen = append(seen, p+" is "+version)
	}
	if len(seen) > 0 {
		missing("pjdfstest %s not found (%s)", pjdfstestVersion, strings.Join(seen, ", "))
	}
	missing("pjdfstest not found in PATH, ~/.cargo/bin or /usr/local/bin")
	return ""
}

// pjdfstestLine is a case's line in pjdfstest's report: its name, padding, its outcome.
var pjdfstestLine = regexp.MustCompile(`^(\S+::\S+)\s+(ok|FAILED|skipped|PASSED UNEXPECTEDLY|failed as expected)$`)

// ansiEscape matches terminal colours, in case the suite prints them despite NO_COLOR.
var ansiEscape = regexp.MustCompile("\x1b\\[[0-9;]*m")

// runPjdfstest runs the whole suite in dir (as root; the suite switches users itself) and
// returns each case's result. The suite's exit status says whether any case failed; which
// ones is what the caller compares, so only a report without cases is an error.
func runPjdfstest(t *testing.T, bin, conf, dir string) map[string]pjdfstestResult {
	t.Helper()
	args := []string{"-c", conf, "-p", dir}
	// The EXDEV cases need a directory on another file system: /dev/shm (tmpfs), when it is one.
	var st, shm syscall.Stat_t
	if syscall.Stat(dir, &st) == nil && syscall.Stat("/dev/shm", &shm) == nil && st.Dev != shm.Dev {
		other, err := os.MkdirTemp("/dev/shm", "spillway-pjdfstest-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(other) })
		args = append(args, "-s", other)
	}
	cmd := exec.Command(bin, args...)
	// Not in dir: this process serves the mounts, and a child's chdir into one between fork and
	// exec (the parent's thread held in vfork) can wait for a server that a stop-the-world of
	// this process has paused until that very thread returns.
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "CLICOLOR=0", "RUST_BACKTRACE=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s %s: %v after %s", bin, strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond))
	results := parsePjdfstest(out.String())
	if len(results) == 0 {
		t.Fatalf("pjdfstest in %s reported no case (%v):\n%s", dir, err, out.String())
	}
	return results
}

// parsePjdfstest reads pjdfstest's report: a line per case, then the case's detail on
// indented lines.
func parsePjdfstest(report string) map[string]pjdfstestResult {
	results := map[string]pjdfstestResult{}
	var last string
	for _, line := range strings.Split(ansiEscape.ReplaceAllString(report, ""), "\n") {
		if m := pjdfstestLine.FindStringSubmatch(line); m != nil {
			last = m[1]
			results[last] = pjdfstestResult{outcome: m[2]}
			continue
		}
		// A case's detail is indented: a tab, then spaces for an assertion's further lines.
		if last != "" && (strings.HasPrefix(line, "\t") || strings.HasPrefix(line, " ")) {
			r := results[last]
			r.detail += strings.TrimRight(line, " ") + "\n"
			results[last] = r
			continue
		}
		last = ""
	}
	return results
}

// pjdfstestSummary counts the outcomes of a run.
func pjdfstestSummary(results map[string]pjdfstestResult) string {
	counts := map[string]int{}
	for _, r := range results {
		counts[r.outcome]++
	}
	var parts []string
	for _, o := range []string{"ok", "FAILED", "skipped", "PASSED UNEXPECTEDLY", "failed as expected"} {
		if counts[o] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[o], o))
		}
	}
	return fmt.Sprintf("%d cases: %s", len(results), strings.Join(parts, ", "))
}
