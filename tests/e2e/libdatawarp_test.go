package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// libdatawarp is built once per test binary: installed under a temporary prefix, as
// `make install` does under /usr/local, and dwcheck (testdata/libdatawarp/dwcheck.c, written
// as a DataWarp user writes) compiled against it with the pkg-config line Cray documented.
var libdw struct {
	once    sync.Once
	err     string
	dir     string // build directory (0755: jobs run as nobody)
	prefix  string
	dwcheck string // linked with the shared library
	dwkeep  string // testdata/libdatawarp/dwkeep.c, linked with the shared library
	static  string // linked with libdatawarp.a
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func buildLibdatawarp(t *testing.T) {
	t.Helper()
	libdw.once.Do(func() {
		fail := func(what string, out []byte, err error) {
			libdw.err = what + ": " + err.Error() + "\n" + string(out)
		}
		dir, err := os.MkdirTemp("", "spillway-libdw-")
		if err != nil {
			fail("temp dir", nil, err)
			return
		}
		os.Chmod(dir, 0o755)
		libdw.dir, libdw.prefix = dir, filepath.Join(dir, "prefix")
		src := filepath.Join(repoRoot(), "libdatawarp")
		build := filepath.Join(dir, "build")
		os.MkdirAll(build, 0o755)
		for _, f := range []string{"Makefile", "datawarp.c", "datawarp.h", "cray-datawarp.pc.in"} {
			data, err := os.ReadFile(filepath.Join(src, f))
			if err != nil {
				fail("reading the sources", nil, err)
				return
			}
			os.WriteFile(filepath.Join(build, f), data, 0o644)
		}
		if out, err := exec.Command("make", "-C", build, "PREFIX="+libdw.prefix, "LDCONFIG=true", "install").CombinedOutput(); err != nil {
			fail("make install", out, err)
			return
		}
		pc := exec.Command("pkg-config", "--cflags", "--libs", "cray-datawarp")
		pc.Env = append(os.Environ(), "PKG_CONFIG_PATH="+filepath.Join(libdw.prefix, "lib", "pkgconfig"))
		flags, err := pc.Output()
		if err != nil {
			fail("pkg-config --cflags --libs cray-datawarp", flags, err)
			return
		}
		check := filepath.Join(repoRoot(), "tests", "e2e", "testdata", "libdatawarp", "dwcheck.c")
		libdw.dwcheck = filepath.Join(dir, "dwcheck")
		args := append([]string{"-Wall", "-o", libdw.dwcheck, check}, strings.Fields(string(flags))...)
		args = append(args, "-Wl,-rpath,"+filepath.Join(libdw.prefix, "lib"), "-lpthread")
		if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
			fail("cc dwcheck.c $(pkg-config --cflags --libs cray-datawarp)", out, err)
			return
		}
		libdw.dwkeep = filepath.Join(dir, "dwkeep")
		args = append([]string{"-Wall", "-o", libdw.dwkeep, filepath.Join(filepath.Dir(check), "dwkeep.c")}, strings.Fields(string(flags))...)
		args = append(args, "-Wl,-rpath,"+filepath.Join(libdw.prefix, "lib"), "-lpthread")
		if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
			fail("cc dwkeep.c $(pkg-config --cflags --libs cray-datawarp)", out, err)
			return
		}
		libdw.static = filepath.Join(dir, "dwcheck-static")
		if out, err := exec.Command("cc", "-o", libdw.static, check, "-I"+filepath.Join(libdw.prefix, "include"),
			filepath.Join(libdw.prefix, "lib", "libdatawarp.a"), "-lpthread").CombinedOutput(); err != nil {
			fail("cc dwcheck.c libdatawarp.a", out, err)
			return
		}
	})
	if libdw.err != "" {
		t.Fatal(libdw.err)
	}
}

// libdwWorld is a world whose jobs run as nobody, with a PFS directory out/ of theirs, a
// directory they cannot write (out/readonly) and another user's write-protected file in a
// directory of theirs (out/locked/e.dat).
func libdwWorld(t *testing.T) (*world, string) {
	requireRoot(t)
	buildLibdatawarp(t)
	w := newWorld(t, true)
	out := w.pfsDir("out")
	os.MkdirAll(filepath.Join(out, "readonly"), 0o755)
	w.pfsDir("out/locked")
	os.WriteFile(filepath.Join(out, "locked", "e.dat"), []byte("root's\n"), 0o444)
	return w, out
}

// runDwcheck runs dwcheck MODE inside a job and checks that every check passed.
func runDwcheck(t *testing.T, w *world, out, capacity string, env []string, prefix ...string) result {
	t.Helper()
	cmd := strings.Join(prefix, " ")
	script := w.script("job.sh", "#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity="+capacity+"\n"+
		"exec "+cmd+"\n")
	r := w.runEnv(append([]string{"SPILLWAY_BIN=" + binary}, env...), "run", script)
	if r.code != 0 || !strings.Contains(r.stdout, "failures 0") || strings.Contains(r.stdout, "FAIL") {
		t.Fatalf("dwcheck in a job:\n%s", r)
	}
	return r
}

// Every function and documented error, in a real job, through the shared library found with
// pkg-config; the job runs as nobody.
func TestLibdatawarpEveryFunction(t *testing.T) {
	w, out := libdwWorld(t)
	r := runDwcheck(t, w, out, "1GiB", nil, libdw.dwcheck, "all", out)
	if n := strings.Count("\n"+r.stdout, "\nok "); n < 69 {
		t.Errorf("only %d checks ran:\n%s", n, r.stdout)
	}
	// The deferred stage activated in the job ran; the job's files are on the PFS.
	if data, err := os.ReadFile(filepath.Join(out, "b.dat")); err != nil || string(data) != "b\n" {
		t.Errorf("b.dat on the PFS: %q %v", data, err)
	}
	w.waitNoSessions()
	w.assertClean()
}

// The calls speak to the controller themselves (issue 23 item 16): with no spillway binary
// to be found (SPILLWAY_BIN names none, none on the PATH) every kind of call works, none runs
// a process (no SIGCHLD), none leaves a descriptor open; 16 threads call at once (about 600
// calls) while a child forked among them calls too. The helper would fail every call here
// with -EIO.
func TestLibdatawarpSpeaksToTheControllerItself(t *testing.T) {
	w, out := libdwWorld(t)
	r := runDwcheck(t, w, out, "1GiB", []string{"SPILLWAY_BIN=/nonexistent/spillway", "PATH=/usr/bin:/bin"}, libdw.dwcheck, "direct", out)
	if n := strings.Count("\n"+r.stdout, "\nok "); n < 15 {
		t.Errorf("only %d checks ran:\n%s", n, r.stdout)
	}
	w.waitNoSessions()
	w.assertClean()
}

// A cache instance's calls in a real job (type=cache over a PFS directory of the job's user):
// dw_wait_sync_complete puts a file's data on the PFS, the cache policy reads back as set and
// sync_on_close puts the data on the PFS by close(), and stages of a cache path are refused
// (-EINVAL). The scratch side (-EOPNOTSUPP) is in TestLibdatawarpEveryFunction.
func TestLibdatawarpCache(t *testing.T) {
	w, _ := libdwWorld(t)
	cached := w.pfsDir("out/cached")
	script := w.script("job.sh", "#!/bin/sh\n#DW jobdw type=cache access_mode=striped capacity=1GiB pfs="+cached+"\n"+
		"exec "+libdw.dwcheck+" cache "+cached+"\n")
	r := w.runEnv([]string{"SPILLWAY_BIN=" + binary}, "run", script)
	if r.code != 0 || !strings.Contains(r.stdout, "failures 0") || strings.Contains(r.stdout, "FAIL") {
		t.Fatalf("dwcheck cache in a job:\n%s", r)
	}
	if n := strings.Count("\n"+r.stdout, "\nok "); n < 12 {
		t.Errorf("only %d checks ran:\n%s", n, r.stdout)
	}
	w.waitNoSessions()
}

// The same program linked statically with libdatawarp.a.
func TestLibdatawarpStaticLibrary(t *testing.T) {
	w, out := libdwWorld(t)
	runDwcheck(t, w, out, "1GiB", nil, libdw.static, "threads", out)
}

// Checkpoint rotation: each checkpoint AT_JOB_END, the previous one revoked; after the job
// only the newest is on the PFS, staged when the job ended.
func TestLibdatawarpCheckpointRotation(t *testing.T) {
	w, out := libdwWorld(t)
	runDwcheck(t, w, out, "1GiB", nil, libdw.dwcheck, "rotate", out)
	for _, name := range []string{"ckpt.1", "ckpt.2"} {
		if _, err := os.Stat(filepath.Join(out, name)); err == nil {
			t.Errorf("%s was revoked but is on the PFS", name)
		}
	}
	if data, err := os.ReadFile(filepath.Join(out, "ckpt.3")); err != nil || string(data) != "ckpt.3" {
		t.Errorf("the newest checkpoint on the PFS: %q %v", data, err)
	}
	w.waitNoSessions()
}

// A multi-GiB stage-out terminated while it runs: write-protected while it runs, stopped,
// no partial file on the PFS, the file writable again, and the job ends cleanly.
func TestLibdatawarpTerminateLargeStage(t *testing.T) {
	w, out := libdwWorld(t)
	runDwcheck(t, w, out, "3GiB", []string{"DWCHECK_BIG_MIB=2048"}, libdw.dwcheck, "terminate", out)
	w.waitNoSessions()
	w.assertClean()
}

// No leak and no memory error in the library: the checks under valgrind.
func TestLibdatawarpUnderValgrind(t *testing.T) {
	if _, err := exec.LookPath("valgrind"); err != nil {
		t.Skip("valgrind is not installed (scripts/install-deps --test installs it)")
	}
	w, out := libdwWorld(t)
	runDwcheck(t, w, out, "1GiB", nil, "valgrind", "--quiet", "--leak-check=full", "--show-leak-kinds=definite,indirect",
		"--errors-for-leak-kinds=definite,indirect", "--error-exitcode=99", libdw.dwcheck, "all", out)
}

// An autoconf probe, AC_CHECK_LIB([datawarp],[dw_stage_file_out]), links against the library.
func TestLibdatawarpAutoconfProbe(t *testing.T) {
	buildLibdatawarp(t)
	dir := t.TempDir()
	conftest := filepath.Join(dir, "conftest.c")
	// What autoconf writes for AC_CHECK_LIB: a prototype of its own and a call.
	os.WriteFile(conftest, []byte("#ifdef __cplusplus\nextern \"C\"\n#endif\nchar dw_stage_file_out ();\nint\nmain (void)\n{\nreturn dw_stage_file_out ();\n  ;\n  return 0;\n}\n"), 0o644)
	out, err := exec.Command("cc", "-o", filepath.Join(dir, "conftest"), conftest, "-L"+filepath.Join(libdw.prefix, "lib"), "-ldatawarp").CombinedOutput()
	if err != nil {
		t.Fatalf("AC_CHECK_LIB([datawarp],[dw_stage_file_out]) would fail: %v\n%s", err, out)
	}
	// The soname is Cray's.
	if target, err := os.Readlink(filepath.Join(libdw.prefix, "lib", "libdatawarp.so.0")); err != nil || !strings.HasPrefix(target, "libdatawarp.so.0.") {
		t.Errorf("libdatawarp.so.0 -> %q %v", target, err)
	}
	dump, err := exec.Command("objdump", "-p", filepath.Join(libdw.prefix, "lib", "libdatawarp.so")).Output()
	if err == nil && !strings.Contains(string(dump), "SONAME               libdatawarp.so.0") {
		t.Errorf("soname:\n%s", dump)
	}
}

// The Python package, in a job that gets SPILLWAY_BIN and SPILLWAY_HOME from spillway run
// itself (not from the test).
func TestLibdatawarpPython(t *testing.T) { testLibdatawarpPython(t, nil) }

// Python's calls go through the C library, which speaks to the controller itself: with no
// spillway binary to be found they all work (the helper would fail each with EIO).
func TestLibdatawarpPythonNeedsNoHelper(t *testing.T) {
	testLibdatawarpPython(t, []string{"SPILLWAY_BIN=/nonexistent/spillway", "PATH=/usr/bin:/bin"})
}

func testLibdatawarpPython(t *testing.T, extraEnv []string) {
	w, out := libdwWorld(t)
	// The system's Python: one under root's home (pyenv) is not for nobody.
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("/usr/bin/python3 is not installed")
	}
	check := filepath.Join(repoRoot(), "tests", "e2e", "testdata", "libdatawarp", "pycheck.py")
	script := w.script("job.sh", "#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\nexec "+py+" "+check+" "+out+"\n")
	// Readable by nobody: the package from the source tree, the library from the build.
	env := []string{"PYTHONPATH=" + filepath.Join(repoRoot(), "python"), "SPILLWAY_LIBDATAWARP=" + filepath.Join(libdw.prefix, "lib", "libdatawarp.so.0")}
	r := w.runEnv(append(env, extraEnv...), "run", script)
	if r.code != 0 || !strings.Contains(r.stdout, "failures 0") {
		t.Fatalf("pycheck in a job:\n%s", r)
	}
	if data, err := os.ReadFile(filepath.Join(out, "k2")); err != nil || strings.TrimSpace(string(data)) == "" {
		t.Errorf("k2 (at job end) on the PFS: %q %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(out, "k1")); err == nil {
		t.Error("k1 was revoked but is on the PFS")
	}
}

// The Python package's cache calls in a job with a cache instance.
func TestLibdatawarpPythonCache(t *testing.T) {
	w, _ := libdwWorld(t)
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Skip("/usr/bin/python3 is not installed")
	}
	cached := w.pfsDir("out/cached")
	check := filepath.Join(repoRoot(), "tests", "e2e", "testdata", "libdatawarp", "pycheck_cache.py")
	script := w.script("job.sh", "#!/bin/sh\n#DW jobdw type=cache access_mode=striped capacity=1GiB pfs="+cached+"\nexec "+py+" "+check+" "+cached+"\n")
	env := []string{"SPILLWAY_BIN=" + binary, "PYTHONPATH=" + filepath.Join(repoRoot(), "python"), "SPILLWAY_LIBDATAWARP=" + filepath.Join(libdw.prefix, "lib", "libdatawarp.so.0")}
	r := w.runEnv(env, "run", script)
	if r.code != 0 || !strings.Contains(r.stdout, "failures 0") || strings.Count(r.stdout, "\nok ") < 5 {
		t.Fatalf("pycheck_cache in a job:\n%s", r)
	}
}

// The example (examples/libdatawarp): built as its comment says, run as its job script says;
// after the job only the newest checkpoint is on the PFS.
func TestLibdatawarpExample(t *testing.T) {
	w, out := libdwWorld(t)
	dir := filepath.Join(w.root, "example")
	os.MkdirAll(dir, 0o755)
	for _, f := range []string{"checkpoint.c", "job.sh"} {
		data, err := os.ReadFile(filepath.Join(repoRoot(), "examples", "libdatawarp", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, f), data, 0o755)
	}
	pc := exec.Command("pkg-config", "--cflags", "--libs", "cray-datawarp")
	pc.Env = append(os.Environ(), "PKG_CONFIG_PATH="+filepath.Join(libdw.prefix, "lib", "pkgconfig"))
	flags, err := pc.Output()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-o", filepath.Join(dir, "checkpoint"), filepath.Join(dir, "checkpoint.c")}, strings.Fields(string(flags))...)
	if b, err := exec.Command("cc", append(args, "-Wl,-rpath,"+filepath.Join(libdw.prefix, "lib"))...).CombinedOutput(); err != nil {
		t.Fatalf("building the example: %v\n%s", err, b)
	}
	r := w.run("run", filepath.Join(dir, "job.sh"), out)
	if r.code != 0 {
		t.Fatalf("the example's job:\n%s", r)
	}
	var ckpts []string
	entries, _ := os.ReadDir(out)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "ckpt.") {
			ckpts = append(ckpts, e.Name())
		}
	}
	if len(ckpts) != 1 || ckpts[0] != "ckpt.000100" {
		t.Fatalf("checkpoints on the PFS after the job: %v, want only ckpt.000100\n%s", ckpts, r)
	}
	if data, _ := os.ReadFile(filepath.Join(out, "ckpt.000100")); !strings.HasPrefix(string(data), "step 100 state 5.18737751") {
		t.Errorf("ckpt.000100 holds %q", data)
	}
}

// A stage-out the job deferred to its end (dwcli stage, from a shell) that fails there keeps
// the session, as a failed #DW stage_out does; --retry-stage-out runs it again once the cause
// is fixed. The job finds the binary and the home through what spillway run gives it.
func TestDwcliStageAtJobEndFailureKeepsTheSession(t *testing.T) {
	w, out := libdwWorld(t)
	script := w.script("job.sh", "#!/bin/sh\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\nset -e\n"+
		"echo result > $DW_JOB_STRIPED/r\n"+
		"\"$SPILLWAY_BIN\" dwcli stage out --when at_job_end $DW_JOB_STRIPED/r "+filepath.Join(out, "locked", "e.dat")+"\n"+
		"\"$SPILLWAY_BIN\" dwcli stage query $DW_JOB_STRIPED/r\n")
	r := w.run("run", script)
	if r.code != 74 || !strings.Contains(r.stdout+r.stderr, "deferred") || !strings.Contains(r.stderr, "keeping session run1") {
		t.Fatalf("a failed at_job_end stage-out must keep the session (exit 74):\n%s", r)
	}
	os.Remove(filepath.Join(out, "locked", "e.dat")) // the cause, fixed
	r = w.run("run", "--retry-stage-out", "run1")
	if r.code != 0 {
		t.Fatalf("retry:\n%s", r)
	}
	if data, err := os.ReadFile(filepath.Join(out, "locked", "e.dat")); err != nil || string(data) != "result\n" {
		t.Fatalf("after the retry the PFS has %q %v", data, err)
	}
	w.waitNoSessions()
	w.assertClean()
}

// A controller restart loses no in-job stage: the job asks for a stage-out at its end, the
// home's server (controller and agent) is killed, and the request still runs at the job's end.
func TestInJobStageSurvivesAControllerRestart(t *testing.T) {
	w, out := libdwWorld(t)
	job := w.script("j.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
set -e
echo kept > "$DW_JOB_STRIPED/k"
"$SPILLWAY_BIN" dwcli stage out --when at_job_end "$DW_JOB_STRIPED/k" `+out+`/k
kill -KILL $(sed -n 's/.*"pid":\([0-9]*\).*/\1/p' `+w.home+`/server.json) || exit 8
for i in $(seq 600); do cat "$DW_JOB_STRIPED/k" >/dev/null 2>&1 && break; sleep 0.1; done
"$SPILLWAY_BIN" dwcli stage query "$DW_JOB_STRIPED/k"
`)
	r := w.run("run", job)
	if r.code != 0 || !strings.Contains(r.stdout, "deferred 1") {
		t.Fatalf("%s", r)
	}
	if got, _ := os.ReadFile(filepath.Join(out, "k")); string(got) != "kept\n" {
		t.Errorf("the deferred stage-out after the restart: %q", got)
	}
	w.assertClean()
}

// dwcli stage concurrency (dw_set_stage_concurrency's helper): a request above
// stage.max_job_concurrency is clamped to it, and with a limit of 1 the job's three
// stage-outs run one at a time (the system would run them at once), and all complete.
func TestDwcliStageConcurrency(t *testing.T) {
	w, out := libdwWorld(t)
	script := w.script("job.sh", `#!/bin/sh
#DW jobdw type=scratch access_mode=striped capacity=2GiB
set -e
B="$SPILLWAY_BIN"
"$B" dwcli stage concurrency "$DW_JOB_STRIPED" 1000
"$B" dwcli stage concurrency "$DW_JOB_STRIPED" 1
for i in 1 2 3; do dd if=/dev/zero of="$DW_JOB_STRIPED/big$i" bs=1M count=300 status=none; done
for i in 1 2 3; do "$B" dwcli stage out "$DW_JOB_STRIPED/big$i" `+out+`/big$i; done
most=0
while :; do
	q=$("$B" dwcli stage query --json "$DW_JOB_STRIPED/")
	n=$(printf '%s' "$q" | grep -o '"status":"running"' | wc -l)
	[ "$n" -gt "$most" ] && most=$n
	printf '%s' "$q" | grep -q '"pending":0' && break
done
echo "most running at once: $most"
"$B" dwcli stage query "$DW_JOB_STRIPED/"
`)
	r := w.runEnv([]string{"SPILLWAY_BIN=" + binary}, "run", script)
	if r.code != 0 {
		t.Fatalf("job:\n%s", r)
	}
	for _, want := range []string{
		"at most 8 of the job's stages run at once\n", // clamped to stage.max_job_concurrency
		"at most 1 of the job's stages run at once\n",
		"most running at once: 1\n",
		"complete 3  pending 0  deferred 0  failed 0\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("job output lacks %q:\n%s", want, r)
		}
	}
	for i := 1; i <= 3; i++ {
		if fi, err := os.Stat(filepath.Join(out, fmt.Sprintf("big%d", i))); err != nil || fi.Size() != 300<<20 {
			t.Errorf("big%d on the PFS: %v %v", i, fi, err)
		}
	}
}

// make, then make install PREFIX=X: what holds the prefix (cray-datawarp.pc, the library's
// fallback path to the spillway binary) is built again for X; with DESTDIR the files land
// under it, still naming X, and no ldconfig runs.
func TestLibdatawarpInstallHonoursPrefixAndDestdir(t *testing.T) {
	build, dir := t.TempDir(), t.TempDir()
	src := filepath.Join(repoRoot(), "libdatawarp")
	for _, f := range []string{"Makefile", "datawarp.c", "datawarp.h", "cray-datawarp.pc.in"} {
		os.WriteFile(filepath.Join(build, f), must(os.ReadFile(filepath.Join(src, f))), 0o644)
	}
	// LDCONFIG names a program that leaves a mark: it must not run for a DESTDIR install.
	mark := filepath.Join(dir, "ldconfig-ran")
	ldconfig := filepath.Join(dir, "ldconfig")
	os.WriteFile(ldconfig, []byte("#!/bin/sh\ntouch "+mark+"\n"), 0o755)
	prefix := filepath.Join(dir, "opt")
	for _, args := range [][]string{{"-C", build}, {"-C", build, "install", "PREFIX=" + prefix, "DESTDIR=" + filepath.Join(dir, "stage"), "LDCONFIG=" + ldconfig}} {
		if out, err := exec.Command("make", args...).CombinedOutput(); err != nil {
			t.Fatalf("make %v: %v\n%s", args, err, out)
		}
	}
	pc, err := os.ReadFile(filepath.Join(dir, "stage", prefix, "lib", "pkgconfig", "cray-datawarp.pc"))
	if err != nil || !strings.Contains(string(pc), "prefix="+prefix+"\n") {
		t.Errorf("cray-datawarp.pc under DESTDIR names prefix %q? %v\n%s", prefix, err, pc)
	}
	lib := must(os.ReadFile(filepath.Join(dir, "stage", prefix, "lib", "libdatawarp.so.0.1.0")))
	if !strings.Contains(string(lib), filepath.Join(prefix, "bin", "spillway")) {
		t.Errorf("the installed library does not fall back to %s", filepath.Join(prefix, "bin", "spillway"))
	}
	if _, err := os.Stat(mark); err == nil {
		t.Error("ldconfig ran for a DESTDIR install")
	}
}
