package e2e

// The failures a cache instance (issue 20, docs/cache.md "What a failure costs") must ride
// out: an agent restarted with dirty data, a PFS full or read-only at teardown, a controller
// killed mid-flush, a storage node lost.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/views"
)

// cacheJob is a cache job of nobody's on a cluster: its PFS directory, its mount.
type cacheJob struct {
	c     *cluster
	token string
	pfs   string            // the PFS directory the instance caches
	mount string            // $DW_JOB_STRIPED_CACHE, with its trailing slash
	files map[string]string // name → sha256 of what the job wrote
	data  map[string][]byte // and the bytes
}

// newCacheCluster is a cluster whose site allows caches of its PFS, started.
func newCacheCluster(t *testing.T) *cluster {
	c := newCluster(t)
	// The cluster's PFS, and the temporary directory where tests mount small file systems
	// as PFS stand-ins (outside the cluster's directory, which must be left without mounts).
	cfg, _ := os.ReadFile(c.config)
	os.WriteFile(c.config, append(cfg, []byte("[cache]\nallowed_pfs = [\""+filepath.Dir(c.dir)+"\"]\n")...), 0o644)
	return c
}

// startCacheJob sets up a cache instance of pfs (a directory of nobody's) and pre-runs it on
// storage1.
func (c *cluster) startCacheJob(token, pfs string) *cacheJob {
	c.t.Helper()
	ctx := context.Background()
	os.MkdirAll(pfs, 0o755)
	os.Chown(pfs, nobodyUID, nobodyGID)
	setup := lifecycle.Setup{Token: token, Creator: "TEST", Owner: nobodyUID, Group: nobodyGID,
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "cache", AccessModes: []string{"striped"},
			Cache: &lifecycle.CacheRequest{PFS: pfs}}}
	c.step(token, lifecycle.PhaseSetup, func() error { return c.client.Setup(ctx, setup) })
	c.step(token, lifecycle.PhasePreRun, func() error { return c.client.PreRun(ctx, token, []string{"storage1"}) })
	env, err := c.client.Paths(ctx, token)
	if err != nil || env["DW_JOB_STRIPED_CACHE"] == "" {
		c.t.Fatalf("paths of the cache job: %v %v", env, err)
	}
	return &cacheJob{c: c, token: token, pfs: pfs, mount: env["DW_JOB_STRIPED_CACHE"], files: map[string]string{}, data: map[string][]byte{}}
}

// write writes a file of size random bytes through the cache, as the job would (closed
// before it returns).
func (j *cacheJob) write(name string, size int, seed int64) {
	j.c.t.Helper()
	data := make([]byte, size)
	rand.New(rand.NewSource(seed)).Read(data)
	if err := os.WriteFile(filepath.Join(j.mount, name), data, 0o644); err != nil {
		j.c.t.Fatalf("the job cannot write %s: %v", name, err)
	}
	s := sha256.Sum256(data)
	j.files[name] = hex.EncodeToString(s[:])
	j.data[name] = data
}

// patch overwrites size bytes of a file the job wrote, at off, through the cache.
func (j *cacheJob) patch(name string, off int64, size int, seed int64) {
	j.c.t.Helper()
	data := make([]byte, size)
	rand.New(rand.NewSource(seed)).Read(data)
	f, err := os.OpenFile(filepath.Join(j.mount, name), os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteAt(data, off)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		j.c.t.Fatalf("the job cannot write into %s: %v", name, err)
	}
	j.data[name] = append(j.data[name][:0:0], j.data[name]...)
	copy(j.data[name][off:], data)
	s := sha256.Sum256(j.data[name])
	j.files[name] = hex.EncodeToString(s[:])
}

// sumOf is the sha256 of a file (or why it cannot be read).
func sumOf(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// assertOnPFS checks that every file the job wrote is on the PFS, whole.
func (j *cacheJob) assertOnPFS() {
	j.c.t.Helper()
	for name, want := range j.files {
		if got := sumOf(filepath.Join(j.pfs, name)); got != want {
			j.c.t.Errorf("%s on the PFS: %s, want sha256 %s", name, got, want)
		}
	}
}

// assertNotOnPFS checks that the data is not on the PFS yet (write-behind: the test must
// be able to fail).
func (j *cacheJob) assertNotOnPFS() {
	j.c.t.Helper()
	for name, want := range j.files {
		if sumOf(filepath.Join(j.pfs, name)) == want {
			j.c.t.Fatalf("%s is on the PFS already: the cache did not hold it dirty, the test shows nothing", name)
		}
	}
}

// teardown asks for the teardown and waits for its step.
func (j *cacheJob) teardown(hurry bool) lifecycle.StepStatus {
	j.c.t.Helper()
	ctx := context.Background()
	if err := j.c.client.Teardown(ctx, j.token, hurry); err != nil {
		j.c.t.Fatalf("teardown: %v", err)
	}
	st, err := j.c.client.WaitStep(ctx, j.token, lifecycle.PhaseTeardown, 60*time.Second)
	if err != nil {
		j.c.t.Fatalf("waiting for the teardown: %v", err)
	}
	return st
}

// postRun ends the job (post_run: the instance is unmounted from the compute node).
func (j *cacheJob) postRun() {
	j.c.t.Helper()
	j.c.step(j.token, lifecycle.PhasePostRun, func() error { return j.c.client.PostRun(context.Background(), j.token) })
}

// assertReadable checks that the job reads back every file it wrote, through the cache.
func (j *cacheJob) assertReadable() {
	j.c.t.Helper()
	for name, want := range j.files {
		if got := sumOf(filepath.Join(j.mount, name)); got != want {
			j.c.t.Errorf("the job reads %s as %s, want sha256 %s", name, got, want)
		}
	}
}

// TestCacheSurvivesAgentRestart: a cache job's data written (dirty: on the burst buffer, not
// on the PFS) survives its storage agent killed with SIGKILL during the job (after the writes
// were closed) and again between the job and the teardown: the job reads its files back
// after the first restart, and the teardown after the second flushes every byte to the PFS.
func TestCacheSurvivesAgentRestart(t *testing.T) {
	requireRoot(t)
	t.Run("local", cacheSurvivesAgentRestart)
	t.Run("remote", cacheSurvivesRemoteAgentRestart)
	t.Run("down-at-teardown", cacheAgentDownAtTeardown)
}

// cacheAgentDownAtTeardown: the teardown comes while the storage agent is down, and it stays
// down longer than the flush call's retries (executor.max_attempts) but less than
// controller.node_timeout: the teardown waits for it, and flushes every byte once it is back.
func cacheAgentDownAtTeardown(t *testing.T) {
	c := newCacheCluster(t)
	cfg, _ := os.ReadFile(c.config)
	os.WriteFile(c.config, []byte(strings.Replace(string(cfg), `node_timeout = "2s"`, `node_timeout = "20s"`, 1)), 0o644)
	c.startController()
	c.startAgent()
	j := c.startCacheJob("25", filepath.Join(c.dir, "pfs", "run"))
	j.write("a", 3<<20+1, 80)
	j.postRun()
	c.stopAgent()
	if err := c.client.Teardown(context.Background(), j.token, false); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the flush to fail", func() bool {
		all, err := c.client.All(context.Background())
		return err == nil && len(all.Fragments) == 1 && strings.Contains(all.Fragments[0].State.Error, "flush the cache")
	})
	// Down long enough for the retries (max_attempts 4, 100 ms to 500 ms apart: 1.2 s) to
	// be spent several times over.
	time.Sleep(4 * time.Second)
	if st, err := c.client.Status(context.Background(), j.token, lifecycle.PhaseTeardown, 0); err != nil || st.Failed {
		t.Fatalf("the teardown failed while the agent was down: %+v %v", st, err)
	}
	c.startAgent()
	if st, err := c.client.WaitStep(context.Background(), j.token, lifecycle.PhaseTeardown, 60*time.Second); err != nil || st.Failed {
		t.Fatalf("the teardown after the agent came back: %+v %v", st, err)
	}
	j.assertOnPFS()
	c.assertClean()
}

func cacheSurvivesAgentRestart(t *testing.T) {
	c := newCacheCluster(t)
	c.startController()
	c.startAgent()
	j := c.startCacheJob("21", filepath.Join(c.dir, "pfs", "run"))
	j.write("a", 3<<20+17, 1)
	j.write("small", 1000, 2)
	j.assertNotOnPFS()
	// Killed during the job: the mount comes back, the data with it.
	c.killAgent()
	c.startAgent()
	c.waitFor("the cache mount to come back", func() bool {
		_, err := os.Stat(filepath.Join(j.mount, "small"))
		return err == nil
	})
	j.assertReadable()
	// A file still open, written and fsync'ed: what fsync() returned for survives too.
	synced := make([]byte, 2<<20+77)
	rand.New(rand.NewSource(5)).Read(synced)
	f, err := os.Create(filepath.Join(j.mount, "synced"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(synced); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	c.killAgent()
	f.Close() // fails: its mount died with the agent
	c.startAgent()
	c.waitFor("the cache mount to come back", func() bool {
		_, err := os.Stat(filepath.Join(j.mount, "synced"))
		return err == nil
	})
	sum := sha256.Sum256(synced)
	j.files["synced"], j.data["synced"] = hex.EncodeToString(sum[:]), synced
	j.assertReadable()
	// The job goes on writing, into a file the store recovered dirty too.
	j.patch("a", 1<<20+100, 1<<20, 4)
	j.assertReadable()
	j.write("b", 2<<20+5, 3)
	// Written under a temporary name, then renamed into place: the store learned the
	// first name, and must find the file at the teardown's flush after the restart.
	j.write("b.tmp", 1<<20+9, 6)
	os.Mkdir(filepath.Join(j.mount, "results"), 0o755)
	if err := os.Rename(filepath.Join(j.mount, "b.tmp"), filepath.Join(j.mount, "results", "b.final")); err != nil {
		t.Fatal(err)
	}
	j.files["results/b.final"], j.data["results/b.final"] = j.files["b.tmp"], j.data["b.tmp"]
	delete(j.files, "b.tmp")
	delete(j.data, "b.tmp")
	j.assertNotOnPFS()
	j.postRun()
	// Killed between the job and the teardown: nothing mounts the instance, the store is
	// opened by the flush.
	c.killAgent()
	c.startAgent()
	j.assertNotOnPFS()
	if st := j.teardown(false); st.Failed {
		t.Fatalf("teardown failed: %s", st.Message)
	}
	j.assertOnPFS()
	c.assertClean()

	// Killed while the teardown's flush drains (or just after): the restarted agent drains
	// what its log says is still dirty.
	j = c.startCacheJob("22", filepath.Join(c.dir, "pfs", "run2"))
	for i := range 4 {
		j.write(fmt.Sprintf("f%d", i), 16<<20+i, int64(60+i))
	}
	j.assertNotOnPFS()
	j.postRun()
	if err := c.client.Teardown(context.Background(), j.token, false); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the agent to begin draining", func() bool {
		logs, _ := os.ReadFile(filepath.Join(c.dir, "agent.log"))
		return strings.Count(string(logs), "cache flush: draining to the PFS") >= 2
	})
	c.killAgent()
	logs, _ := os.ReadFile(filepath.Join(c.dir, "agent.log"))
	t.Logf("the agent killed with the drain done already: %v", strings.Count(string(logs), "cache flush: drained") == 2)
	c.startAgent()
	st, err := c.client.WaitStep(context.Background(), j.token, lifecycle.PhaseTeardown, 60*time.Second)
	if err != nil || st.Failed {
		t.Fatalf("the teardown after the agent was killed mid-flush: %+v %v", st, err)
	}
	j.assertOnPFS()
	c.assertClean()

	// Restarted, then torn down with hurry: the reopened store discards what its log says
	// is dirty, and the accounting record says how much.
	j = c.startCacheJob("23", filepath.Join(c.dir, "pfs", "run3"))
	j.write("x", 3<<20, 70)
	j.postRun()
	c.killAgent()
	c.startAgent()
	if st := j.teardown(true); st.Failed {
		t.Fatalf("teardown with hurry: %+v", st)
	}
	c.waitFor("the instance's accounting record", func() bool { return len(recordsOf(c.accountingLog(), "23")) > 0 })
	if recs := recordsOf(c.accountingLog(), "23"); len(recs) != 1 || recs[0].CacheDiscarded < 3<<20 || recs[0].CacheDiscarded > 3<<20+4096 {
		t.Errorf("the accounting record must say the 3 MiB discarded: %+v", recs)
	}
	if sumOf(filepath.Join(j.pfs, "x")) == j.files["x"] {
		t.Error("x reached the PFS although the teardown discarded it")
	}
	c.assertClean()
}

// cacheSurvivesRemoteAgentRestart: the same across hosts, two storage nodes and a compute
// node: hostc's agent is killed and restarted during the job, and the compute node's mount
// reads the files back once it answers again; then both storage agents are killed and
// restarted between the job and the teardown, which flushes every byte.
func cacheSurvivesRemoteAgentRestart(t *testing.T) {
	c := newNetClusterOf(t, []string{"hosta", "hostc"}, []string{"hostb"})
	// (every net cluster lets cache instances front its pfs directory)
	for _, h := range []string{"ctl", "hosta", "hostc", "hostb"} {
		c.start(h)
	}
	pfs := filepath.Join(c.dir, "pfs", "run")
	os.MkdirAll(pfs, 0o755)
	os.Chown(pfs, nobodyUID, nobodyGID)
	job := c.jobFile("cache.sh", "#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=2GiB pfs="+pfs+"\n\x00")
	c.wlm("--function", "setup", "--token", "24", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:2GiB", "--job", job)
	mount := c.jobPath("24", job, "DW_JOB_STRIPED_CACHE")
	c.wlm("--function", "pre_run", "--token", "24", "--job", job, "--nodehostnamefile", c.jobFile("cache.nodes", "hostb\n"))
	sums := map[string]string{}
	write := func(name string, size int) {
		t.Helper()
		c.mustRun(t, "hostb", fmt.Sprintf("head -c %d /dev/urandom > %s/%s", size, mount, name))
		sums[name] = strings.Fields(c.mustRun(t, "hostb", "sha256sum < "+mount+"/"+name))[0]
		if sumOf(filepath.Join(pfs, name)) == sums[name] {
			t.Fatalf("%s is on the PFS already: the cache did not hold it dirty", name)
		}
	}
	write("spanning", 20000000)
	for i := range 4 {
		write(fmt.Sprintf("f%d", i), 300000+i)
	}
	c.stop("hostc", true)
	c.start("hostc")
	for name, want := range sums {
		c.waitFor(name+" readable on hostb again", func() bool {
			out, err := c.onHost("hostb", "sha256sum < "+mount+"/"+name).CombinedOutput()
			if err == nil && !strings.HasPrefix(string(out), want) {
				t.Fatalf("after hostc's restart hostb reads %s as %s, want %s", name, out, want)
			}
			return err == nil
		})
	}
	write("after", 9000000)
	// Written under a temporary name and renamed into place: stripes on both nodes.
	write("big.tmp", 20000000)
	c.mustRun(t, "hostb", "mv "+mount+"/big.tmp "+mount+"/big.final")
	sums["big.final"] = sums["big.tmp"]
	delete(sums, "big.tmp")
	c.wlm("--function", "post_run", "--token", "24", "--job", job)
	for _, h := range c.storage {
		c.stop(h, true)
		c.start(h)
	}
	c.wlm("--function", "teardown", "--token", "24", "--job", job)
	for name, want := range sums {
		if got := sumOf(filepath.Join(pfs, name)); got != want {
			t.Errorf("%s on the PFS: %s, want %s", name, got, want)
		}
	}
	c.assertClean()
}

// mountTmpfs mounts a small tmpfs of nobody's, the PFS stand-in a test can fill up or make
// read-only, on a new directory beside the cluster's; it is unmounted when the test ends.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "spillway-pfs-")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0755", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs as the PFS: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run(); os.Remove(dir) })
	os.Chown(dir, nobodyUID, nobodyGID)
	return dir
}

func remount(t *testing.T, dir, opts string) {
	t.Helper()
	if out, err := exec.Command("mount", "-o", "remount,"+opts, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount -o remount,%s %s: %v %s", opts, dir, err, out)
	}
}

// sessionJSON is what dwstat --json sessions says.
func (c *cluster) sessionJSON() string {
	return spillway(c.t, cmdOpts{}, "dwstat", "--config", c.config, "--json", "sessions").stdout
}

// assertFlushFailed checks a teardown that must fail to flush: undone, its message naming
// the PFS directory, the error and the two ways out, the session and its data kept.
func (j *cacheJob) assertFlushFailed(st lifecycle.StepStatus, pfsError string) {
	j.c.t.Helper()
	if !st.Failed {
		j.c.t.Fatalf("the teardown must fail when the PFS cannot take the data: %+v", st)
	}
	j.c.t.Logf("the failed teardown says: %s", st.Message)
	for _, want := range []string{"teardown undone, the instance is kept", "could not flush to " + j.pfs, pfsError,
		"Fix the PFS", "tear down again", "--hurry to discard"} {
		if !strings.Contains(st.Message, want) {
			j.c.t.Errorf("the failed teardown's message lacks %q:\n%s", want, st.Message)
		}
	}
	if out := j.c.sessionJSON(); !strings.Contains(out, `"token": "`+j.token+`"`) || !strings.Contains(out, "teardown undone") {
		j.c.t.Errorf("dwstat must show the session kept, with its failure:\n%s", out)
	}
	if frags, _ := os.ReadDir(filepath.Join(j.c.dir, "ssd", "fragment")); len(frags) != 1 {
		j.c.t.Errorf("the instance's fragment must be kept: %d on the disk", len(frags))
	}
	if out := spillway(j.c.t, cmdOpts{}, "dwstat", "--config", j.c.config, "--json", "fragments").stdout; !strings.Contains(out, `"cache_flush_error": "`) ||
		!strings.Contains(out, pfsError) {
		j.c.t.Errorf("dwstat must show the fragment's flush error:\n%s", out)
	}
	// An administrator reading the text tables sees it too.
	if out := spillway(j.c.t, cmdOpts{}, "dwstat", "--config", j.c.config, "sessions", "fragments").stdout; !strings.Contains(out, "teardown undone, the instance is kept") ||
		!strings.Contains(out, "flush failed: ") || !strings.Contains(out, pfsError) {
		j.c.t.Errorf("dwstat's tables must show the session's failure and the fragment's flush error:\n%s", out)
	}
}

// TestCacheFlushFailureKeepsTheInstance: the PFS full (a small tmpfs) or read-only at teardown
// makes the teardown fail, saying the PFS directory, its error and the two ways out; the
// instance and its data are kept (dwstat shows the session and why); once the PFS is fixed
// a second teardown flushes every byte. With --hurry instead the data is discarded and the
// bytes are said on the teardown and in the accounting record.
func TestCacheFlushFailureKeepsTheInstance(t *testing.T) {
	requireRoot(t)
	c := newCacheCluster(t)
	c.startController()
	c.startAgent()
	t.Run("full", func(t *testing.T) {
		defer func(parent *testing.T) { c.t = parent }(c.t)
		c.t = t
		pfs := mountTmpfs(t, "2m")
		j := c.startCacheJob("31", pfs)
		j.write("big", 5<<20+3, 11)
		j.write("small", 4000, 12)
		j.assertNotOnPFS()
		j.postRun()
		j.assertFlushFailed(j.teardown(false), "no space left on device")
		// Still there, still whole: the job's data is on the burst buffer, and survives an
		// agent restart while the session waits.
		c.killAgent()
		c.startAgent()
		j.assertFlushFailed(j.teardown(false), "no space left on device")
		remount(t, pfs, "size=64m")
		if st := j.teardown(false); st.Failed {
			t.Fatalf("the teardown after the PFS was fixed failed: %s", st.Message)
		}
		j.assertOnPFS()
		c.assertClean()
	})
	t.Run("readonly", func(t *testing.T) {
		defer func(parent *testing.T) { c.t = parent }(c.t)
		c.t = t
		pfs := mountTmpfs(t, "64m")
		j := c.startCacheJob("32", pfs)
		j.write("data", 3<<20+9, 21)
		j.assertNotOnPFS()
		j.postRun()
		// The store holds its dirty files open for writing (write-behind), and a file
		// system with files open for writing cannot be remounted read-only: the agent is
		// stopped meanwhile (as if the PFS went read-only during a restart), and the flush
		// reopens the files on the read-only PFS.
		c.stopAgent()
		remount(t, pfs, "ro")
		c.startAgent()
		j.assertFlushFailed(j.teardown(false), "read-only file system")
		remount(t, pfs, "rw")
		if st := j.teardown(false); st.Failed {
			t.Fatalf("the teardown after the PFS was fixed failed: %s", st.Message)
		}
		j.assertOnPFS()
		c.assertClean()
	})
	t.Run("hurry", func(t *testing.T) {
		defer func(parent *testing.T) { c.t = parent }(c.t)
		c.t = t
		pfs := mountTmpfs(t, "1m")
		j := c.startCacheJob("33", pfs)
		j.write("big", 4<<20, 31)
		j.assertNotOnPFS()
		j.postRun()
		// As Slurm tears it down: dw_wlm_cli fails, saying why and the ways out.
		job := filepath.Join(c.dir, "job33.sh")
		os.WriteFile(job, []byte("#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=1GiB pfs="+pfs+"\n"), 0o644)
		wlm := func(args ...string) result {
			return runAs(t, smallBinary, cmdOpts{env: []string{"SPILLWAY_CONFIG=" + c.config}}, append([]string{"--function", "teardown", "--token", "33", "--job", job}, args...)...)
		}
		r := wlm()
		if r.code == 0 {
			t.Fatalf("dw_wlm_cli teardown must fail when the flush fails: %s", r)
		}
		mustContain(t, r, "teardown undone, the instance is kept", "could not flush to "+pfs, "no space left on device", "--hurry to discard")
		j.assertFlushFailed(j.teardown(false), "no space left on device")
		r = wlm("--hurry")
		if r.code != 0 {
			t.Fatalf("dw_wlm_cli teardown --hurry must not fail: %s", r)
		}
		c.waitFor("the instance's accounting record", func() bool { return len(recordsOf(c.accountingLog(), "33")) > 0 })
		recs := recordsOf(c.accountingLog(), "33")
		// What the PFS had no room for: at least the 3 MiB past its 1 MiB.
		if len(recs) != 1 || recs[0].CacheDiscarded < 3<<20 || recs[0].CacheDiscarded > 4<<20+4096 {
			t.Errorf("the accounting record must say the bytes discarded: %+v", recs)
		}
		c.assertClean()
	})
}

// runCacheJob drives a cache job through its lifecycle over the API (up to its post_run
// unless teardown), riding out controller crashes (c.step), and writes files through the
// cache as the job would; it returns the job.
func (c *cluster) runCacheJob(token, pfs string, teardown bool) *cacheJob {
	c.t.Helper()
	ctx := context.Background()
	os.MkdirAll(pfs, 0o755)
	os.Chown(pfs, nobodyUID, nobodyGID)
	setup := lifecycle.Setup{Token: token, Creator: "TEST", Owner: nobodyUID, Group: nobodyGID,
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "cache", AccessModes: []string{"striped"},
			Cache: &lifecycle.CacheRequest{PFS: pfs}}}
	c.step(token, lifecycle.PhaseSetup, func() error { return c.client.Setup(ctx, setup) })
	c.step(token, lifecycle.PhasePreRun, func() error { return c.client.PreRun(ctx, token, []string{"storage1"}) })
	var env map[string]string
	c.waitFor("paths", func() bool {
		var err error
		env, err = c.client.Paths(ctx, token)
		if err != nil {
			c.restartIfCrashed()
		}
		return err == nil
	})
	j := &cacheJob{c: c, token: token, pfs: pfs, mount: env["DW_JOB_STRIPED_CACHE"], files: map[string]string{}, data: map[string][]byte{}}
	j.write("a", 3<<20+17, 41)
	j.write("b", 1000, 42)
	j.assertNotOnPFS()
	c.step(token, lifecycle.PhasePostRun, func() error { return c.client.PostRun(ctx, token) })
	if !teardown {
		return j
	}
	c.step(token, lifecycle.PhaseTeardown, func() error {
		err := c.client.Teardown(ctx, token, false)
		if apiclient.IsNotFound(err) {
			return nil // the teardown before the crash finished
		}
		return err
	})
	return j
}

// failingTeardown sends a teardown that must fail (the PFS cannot take the data), riding out
// controller crashes, and returns its message.
func (c *cluster) failingTeardown(token string) string {
	c.t.Helper()
	ctx := context.Background()
	for attempt := 0; attempt < 20; attempt++ {
		err := c.client.Teardown(ctx, token, false)
		if err == nil {
			st, werr := c.client.WaitStep(ctx, token, lifecycle.PhaseTeardown, 60*time.Second)
			if werr == nil {
				if !st.Failed {
					c.t.Fatalf("the teardown must fail when the PFS cannot take the data: %+v", st)
				}
				return st.Message
			}
			err = werr
		}
		time.Sleep(100 * time.Millisecond)
		if !c.restartIfCrashed() {
			var un *apiclient.Unreachable
			if !errors.As(err, &un) {
				c.t.Fatalf("teardown: %v", err)
			}
		}
	}
	c.t.Fatal("the teardown did not complete after 20 attempts")
	return ""
}

// TestCacheControllerCrashMidFlush: a cache job's teardown flushes its data to the PFS
// whatever the controller's crashes. "every-point": the controller is killed at each crash
// point of a cache job's path in turn (as TestControllerKilledAtEveryStep does for scratch;
// the teardown's flush polls have none, but the points around it are the teardown's request
// persisted before the first poll and the deletions after the last), restarted, and the job
// ends with every byte on the PFS and nothing left. "failed-flush-every-point": the same at
// each crash point of a teardown whose flush fails (the PFS full), undone, and of the second
// teardown once the PFS has room. "while-draining": the controller is
// killed with SIGKILL once the agent has begun draining, and restarted: the teardown asks on
// and completes.
func TestCacheControllerCrashMidFlush(t *testing.T) {
	requireRoot(t)
	t.Run("every-point", func(t *testing.T) {
		c := newCacheCluster(t)
		logPath := filepath.Join(c.dir, "crash.log")
		c.startController("SPILLWAY_CRASH_LOG=" + logPath)
		c.startAgent()
		c.runCacheJob("1", filepath.Join(c.dir, "pfs", "run"), true).assertOnPFS()
		c.assertClean()
		c.waitFor("the reference job's accounting record", func() bool { // past its crash points
			list, err := c.client.AllAccounting(context.Background())
			return err == nil && list.PendingRecords != nil && *list.PendingRecords == 0 && len(recordsOf(c.accountingLog(), "1")) == 1
		})
		raw, _ := os.ReadFile(logPath)
		points := strings.Split(strings.TrimSpace(string(raw)), "\n")
		if !slices.ContainsFunc(points, func(p string) bool { return strings.HasSuffix(p, " request-persisted:teardown") }) {
			t.Fatalf("no teardown among a cache job's crash points: %v", points)
		}
		for k := 1; k <= len(points); k++ {
			name := strings.SplitN(points[k-1], " ", 2)[1]
			t.Run(strconv.Itoa(k)+"-"+name, func(t *testing.T) {
				c := newCacheCluster(t)
				c.startController("SPILLWAY_CRASH_AFTER=" + strconv.Itoa(k))
				c.startAgent()
				j := c.runCacheJob(strconv.Itoa(1000+k), filepath.Join(c.dir, "pfs", "run"), true)
				c.waitFor("the teardown to finish", func() bool {
					c.restartIfCrashed()
					all, err := c.client.All(context.Background())
					return err == nil && len(all.Sessions) == 0
				})
				j.assertOnPFS()
				c.waitFor("the agent's disk to be empty", func() bool {
					frags, _ := os.ReadDir(filepath.Join(c.dir, "ssd", "fragment"))
					return len(frags) == 0
				})
				token := strconv.Itoa(1000 + k)
				c.waitFor("the job's accounting record", func() bool {
					c.restartIfCrashed()
					list, err := c.client.AllAccounting(context.Background())
					return err == nil && list.PendingRecords != nil && *list.PendingRecords == 0 && len(recordsOf(c.accountingLog(), token)) > 0
				})
				c.assertClean()
				logs, _ := os.ReadFile(filepath.Join(c.dir, "controller.log"))
				if !strings.Contains(string(logs), fmt.Sprintf("crash point %d (", k)) {
					t.Fatalf("the controller never crashed at point %d (%s in the reference run)", k, name)
				}
			})
		}
	})
	t.Run("failed-flush-every-point", func(t *testing.T) {
		// The first teardown's flush fails (the PFS full): the undone teardown, and the
		// second one once the PFS is fixed, with the controller killed at each of their
		// crash points.
		run := func(t *testing.T, c *cluster, token string) {
			pfs := mountTmpfs(t, "2m")
			j := c.runCacheJob(token, pfs, false)
			if msg := c.failingTeardown(token); !strings.Contains(msg, "teardown undone, the instance is kept") || !strings.Contains(msg, "no space left on device") {
				t.Fatalf("the failed teardown says: %s", msg)
			}
			remount(t, pfs, "size=64m")
			c.step(token, lifecycle.PhaseTeardown, func() error {
				err := c.client.Teardown(context.Background(), token, false)
				if apiclient.IsNotFound(err) {
					return nil
				}
				return err
			})
			c.waitFor("the teardown to finish", func() bool {
				c.restartIfCrashed()
				all, err := c.client.All(context.Background())
				return err == nil && len(all.Sessions) == 0
			})
			j.assertOnPFS()
			c.waitFor("the job's accounting record", func() bool {
				c.restartIfCrashed()
				list, err := c.client.AllAccounting(context.Background())
				return err == nil && list.PendingRecords != nil && *list.PendingRecords == 0 && len(recordsOf(c.accountingLog(), token)) > 0
			})
			c.assertClean()
		}
		c := newCacheCluster(t)
		logPath := filepath.Join(c.dir, "crash.log")
		c.startController("SPILLWAY_CRASH_LOG=" + logPath)
		c.startAgent()
		run(t, c, "1")
		raw, _ := os.ReadFile(logPath)
		points := strings.Split(strings.TrimSpace(string(raw)), "\n")
		// The points before the teardown are every-point's.
		first := slices.IndexFunc(points, func(p string) bool { return strings.HasSuffix(p, " request-persisted:teardown") })
		if first < 0 {
			t.Fatalf("no teardown among the crash points: %v", points)
		}
		for k := first + 1; k <= len(points); k++ {
			name := strings.SplitN(points[k-1], " ", 2)[1]
			t.Run(strconv.Itoa(k)+"-"+name, func(t *testing.T) {
				c := newCacheCluster(t)
				c.startController("SPILLWAY_CRASH_AFTER=" + strconv.Itoa(k))
				c.startAgent()
				run(t, c, strconv.Itoa(2000+k))
				logs, _ := os.ReadFile(filepath.Join(c.dir, "controller.log"))
				if !strings.Contains(string(logs), fmt.Sprintf("crash point %d (", k)) {
					t.Fatalf("the controller never crashed at point %d (%s in the reference run)", k, name)
				}
			})
		}
	})
	t.Run("while-draining", func(t *testing.T) {
		c := newCacheCluster(t)
		c.startController()
		c.startAgent()
		j := c.startCacheJob("2", filepath.Join(c.dir, "pfs", "run"))
		for i := range 4 {
			j.write(fmt.Sprintf("f%d", i), 16<<20+i, int64(50+i))
		}
		j.assertNotOnPFS()
		j.postRun()
		if err := c.client.Teardown(context.Background(), "2", false); err != nil {
			t.Fatal(err)
		}
		c.waitFor("the agent to begin draining", func() bool {
			logs, _ := os.ReadFile(filepath.Join(c.dir, "agent.log"))
			return strings.Contains(string(logs), "cache flush: draining to the PFS")
		})
		logs, _ := os.ReadFile(filepath.Join(c.dir, "agent.log"))
		t.Logf("the controller killed with the drain done already: %v", strings.Contains(string(logs), "cache flush: drained"))
		c.controller.Process.Kill()
		<-c.ctlExit
		c.controller = nil
		c.startController()
		c.waitFor("the teardown to finish", func() bool {
			all, err := c.client.All(context.Background())
			return err == nil && len(all.Sessions) == 0
		})
		j.assertOnPFS()
		c.waitFor("the agent's disk to be empty", func() bool {
			frags, _ := os.ReadDir(filepath.Join(c.dir, "ssd", "fragment"))
			return len(frags) == 0
		})
		c.assertClean()
	})
}

// TestCacheStorageNodeLost: a cache instance on two storage nodes, hosta and hostc, written
// from compute node hostb; one node's agent is killed for good with dirty data on it (each
// in turn). The job gets EIO for the files with stripes there (and reads those without,
// unless the node served the namespace: then every open fails);
// the teardown, sent at once, waits for the node to be offline and completes without it,
// says what was lost (the accounting record: "storage node X offline: its unflushed data
// ... is lost"), and the data the other node held is on the PFS whole.
func TestCacheStorageNodeLost(t *testing.T) {
	// The second server of the instance, then the first, which serves its namespace.
	t.Run("hostc", func(t *testing.T) { cacheStorageNodeLost(t, "hostc", "hosta") })
	t.Run("hosta", func(t *testing.T) { cacheStorageNodeLost(t, "hosta", "hostc") })
}

func cacheStorageNodeLost(t *testing.T, dead, kept string) {
	c := newNetClusterOf(t, []string{"hosta", "hostc"}, []string{"hostb"})
	// (every net cluster lets cache instances front its pfs directory)
	for _, h := range []string{"ctl", "hosta", "hostc", "hostb"} {
		c.start(h)
	}
	pfs := filepath.Join(c.dir, "pfs", "run")
	os.MkdirAll(pfs, 0o755)
	os.Chown(pfs, nobodyUID, nobodyGID)
	job := c.jobFile("cache.sh", "#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=2GiB pfs="+pfs+"\n\x00")
	c.wlm("--function", "setup", "--token", "70", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:2GiB", "--job", job)
	for _, h := range c.storage {
		if f := c.fragments(h); len(f) != 1 {
			t.Fatalf("%s holds %d fragments of the 2-grain cache, want 1", h, len(f))
		}
	}
	mount := c.jobPath("70", job, "DW_JOB_STRIPED_CACHE")
	c.wlm("--function", "pre_run", "--token", "70", "--job", job, "--nodehostnamefile", c.jobFile("cache.nodes", "hostb\n"))

	// Files of one stripe each, and one spanning both servers, written from hostb (random
	// data, dirty in the cache: write-behind).
	var names []string
	for i := range 6 {
		names = append(names, fmt.Sprintf("f%d", i))
	}
	names = append(names, "spanning")
	c.mustRun(t, "hostb", fmt.Sprintf("for f in f0 f1 f2 f3 f4 f5; do head -c 300000 /dev/urandom > %s/$f; done; "+
		"head -c 20000000 /dev/urandom > %s/spanning", mount, mount))
	sums := map[string]string{} // what hostb wrote
	onDead := map[string]bool{} // the files with a stripe on the dead node
	for _, n := range names {
		sums[n] = strings.Fields(c.mustRun(t, "hostb", "sha256sum < "+mount+"/"+n))[0]
		if sumOf(filepath.Join(pfs, n)) == sums[n] {
			t.Fatalf("%s is on the PFS already: the cache did not hold it dirty", n)
		}
		var shown []struct {
			Servers []struct {
				Node  string `json:"node"`
				Bytes int64  `json:"bytes"`
			} `json:"servers"`
		}
		out := c.mustRun(t, "hostb", binary+" stripes --json "+mount+"/"+n)
		if err := json.Unmarshal([]byte(out), &shown); err != nil || len(shown) != 1 {
			t.Fatalf("spillway stripes --json %s: %v\n%s", n, err, out)
		}
		for _, s := range shown[0].Servers {
			if s.Node == dead && s.Bytes > 0 {
				onDead[n] = true
			}
		}
	}
	if !onDead["spanning"] || len(onDead) == len(names) {
		t.Fatalf("the files must be spread over both servers, some on %s only: on %s %v", kept, dead, onDead)
	}
	t.Logf("files with a stripe on %s: %v", dead, onDead)

	// The node dies for good: the job gets EIO for the files with stripes there; for every
	// file if it served the instance's namespace (its first server), where files are
	// opened.
	all, err := c.client.All(context.Background())
	if err != nil || len(all.Namespaces) != 1 {
		t.Fatalf("the instance's namespace: %+v %v", all.Namespaces, err)
	}
	namespaceLost := false
	for _, f := range all.Fragments {
		namespaceLost = namespaceLost || f.ID == all.Namespaces[0].Fragment && f.Node == dead
	}
	c.stop(dead, true)
	for _, n := range names {
		out, err := c.onHost("hostb", "sha256sum < "+mount+"/"+n).CombinedOutput()
		switch {
		case (onDead[n] || namespaceLost) && (err == nil || !strings.Contains(string(out), "Input/output error")):
			t.Errorf("reading %s, with a stripe on the dead %s: %v\n%s", n, dead, err, out)
		case !onDead[n] && !namespaceLost && (err != nil || !strings.HasPrefix(string(out), sums[n])):
			t.Errorf("reading %s, all on %s: %v\n%s", n, kept, err, out)
		}
	}
	// Writing over the spanning file (stripes on both nodes) fails too.
	if out, err := c.onHost("hostb", "head -c 20000000 /dev/zero | dd of="+mount+"/spanning bs=1M conv=notrunc,fsync status=none").CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "Input/output error") {
		t.Errorf("writing over spanning, with stripes on the dead %s: %v\n%s", dead, err, out)
	}
	c.wlm("--function", "post_run", "--token", "70", "--job", job)
	// Torn down at once, as Slurm does when the job ends: the node is not offline yet (no
	// heartbeat for controller.node_timeout), its flush calls fail; the teardown waits for
	// it to be found offline, and goes on without it.
	out := c.wlm("--function", "teardown", "--token", "70", "--job", job)
	t.Logf("teardown: %s", out)
	// The data the other node held is on the PFS; the dead node's is lost, and said so.
	for _, n := range names {
		if !onDead[n] && sumOf(filepath.Join(pfs, n)) != sums[n] {
			t.Errorf("%s, all on %s, is not on the PFS whole after the teardown", n, kept)
		}
	}
	var lost []string
	c.waitFor("the instance's accounting record", func() bool {
		raw, _ := os.ReadFile(filepath.Join(c.dir, "state", "accounting.log"))
		for _, line := range strings.Split(string(raw), "\n") {
			var a views.Accounting
			if json.Unmarshal([]byte(line), &a) == nil && a.Realm.Token == "70" {
				lost = a.Realm.CacheLost
				return true
			}
		}
		return false
	})
	if len(lost) != 1 || !strings.Contains(lost[0], "storage node "+dead+" offline: its unflushed data (") || !strings.Contains(lost[0], ") is lost") {
		t.Errorf("the accounting record must say what was lost with %s: %q", dead, lost)
	}
	if all, err := c.client.All(context.Background()); err != nil || len(all.Sessions)+len(all.Instances)+len(all.Fragments) != 0 {
		t.Errorf("the teardown left %+v (%v)", all, err)
	}
}
