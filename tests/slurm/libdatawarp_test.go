package slurm

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// manyFiles is how many small files the job's own #DW stage_out moves after it: enough to
// keep data_out busy for seconds after the 40 MiB deferred checkpoint is out, so that the test
// sees that stage complete before the teardown removes the session.
const manyFiles = 3000

// ckptMiB is the size of each checkpoint the job writes: five 8 MiB stripes, so that each is
// spread over both storage nodes and its stage-out is split over them.
const ckptMiB = 40

// buildLibdatawarp installs libdatawarp from the source tree under the cluster's directory
// (make install PREFIX=..., as scripts/install-deps does under /usr/local) and compiles the C
// programs the jobs run against it with the pkg-config line Cray documented: ckpt
// (testdata/ckpt.c) and dwcheck (tests/e2e/testdata/libdatawarp/dwcheck.c, every function and
// documented error). It returns the programs' directory, which the test user may read.
func buildLibdatawarp(t *testing.T, dir string) string {
	t.Helper()
	build, prefix := filepath.Join(dir, "libdatawarp-build"), filepath.Join(dir, "libdatawarp")
	os.MkdirAll(build, 0o755)
	for _, f := range []string{"Makefile", "datawarp.c", "datawarp.h", "cray-datawarp.pc.in"} {
		data, err := os.ReadFile(filepath.Join(top, "libdatawarp", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(build, f), data, 0o644)
	}
	if out, err := exec.Command("make", "-C", build, "PREFIX="+prefix, "LDCONFIG=true", "install").CombinedOutput(); err != nil {
		t.Fatalf("make -C libdatawarp install: %v\n%s", err, out)
	}
	pc := exec.Command("pkg-config", "--cflags", "--libs", "cray-datawarp")
	pc.Env = append(os.Environ(), "PKG_CONFIG_PATH="+filepath.Join(prefix, "lib", "pkgconfig"))
	flags, err := pc.Output()
	if err != nil {
		t.Fatalf("pkg-config --cflags --libs cray-datawarp: %v", err)
	}
	bin := filepath.Join(dir, "bin")
	for name, src := range map[string]string{
		"ckpt":    filepath.Join(top, "tests", "slurm", "testdata", "ckpt.c"),
		"dwcheck": filepath.Join(top, "tests", "e2e", "testdata", "libdatawarp", "dwcheck.c"),
	} {
		args := append([]string{"-Wall", "-o", filepath.Join(bin, name), src}, strings.Fields(string(flags))...)
		args = append(args, "-Wl,-rpath,"+filepath.Join(prefix, "lib"), "-lpthread")
		if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
			t.Fatalf("cc %s $(pkg-config --cflags --libs cray-datawarp): %v\n%s", filepath.Base(src), err, out)
		}
	}
	return bin
}

// stageView is what `dwstat --json stages` says of one stage.
type stageView struct {
	ID      int64             `json:"id"`
	PFSPath string            `json:"pfs_path"`
	Status  string            `json:"status"`
	InJob   bool              `json:"in_job"`
	Token   string            `json:"token"`
	Step    string            `json:"step"`
	Moved   map[string]uint64 `json:"bytes_by_node"`
}

// stagesUnder returns the stages whose PFS path is under dir, by PFS path.
func (c *cluster) stagesUnder(dir string) map[string]stageView {
	r := c.admin("dwstat", "--json", "stages")
	var doc struct {
		Stages []stageView `json:"stages"`
	}
	found := map[string]stageView{}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &doc) != nil {
		return found
	}
	for _, s := range doc.Stages {
		if strings.HasPrefix(s.PFSPath, dir+"/") {
			found[s.PFSPath] = s
		}
	}
	return found
}

// checkCkpt checks a staged-out checkpoint: mib MiB, byte i being (i*31 + n) & 0xff.
func checkCkpt(t *testing.T, path string, n, mib int) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Errorf("checkpoint %d on the PFS: %v", n, err)
		return
	}
	if len(data) != mib<<20 {
		t.Errorf("%s: %d bytes, want %d", path, len(data), mib<<20)
		return
	}
	for i, b := range data {
		if b != byte((i*31+n)&0xff) {
			t.Errorf("%s: byte %d is %d, want %d", path, i, b, byte((i*31+n)&0xff))
			return
		}
	}
}

// A batch job on cn1 (a compute node, not a storage node) runs a C program built against
// libdatawarp as installed. Its instance is striped over bb1 and bb2, so each stage is split over
// both storage nodes. The library's calls reach the controller from the compute node over TCP,
// as the job's user, with MUNGE (the node's configuration names the controller's address).
// The program writes three checkpoints into $DW_JOB_STRIPED: the first is staged out
// IMMEDIATE, seen write-protected while its split stage runs, and waited for (then writable
// again), the second and third are marked AT_JOB_END and the second's
// request is revoked. After the job the PFS holds the first and the third only, and Slurm's
// data_out and teardown waited for the deferred stage: dwstat showed it complete before the
// session went away, and the job completed.
func (c *cluster) libdatawarpCheckpoints(t *testing.T, m *multiCluster) {
	prog := filepath.Join(buildLibdatawarp(t, m.dir), "ckpt")
	compute := filepath.Join(m.dir, "etc", "compute.toml")
	id := c.sbatch("ckpt.sh", `#!/bin/bash
#SBATCH -N1 -w cn1 --output=ckpt-%j.out
#DW jobdw type=scratch access_mode=striped capacity=2GiB`+c.pool()+`
#DW stage_out type=directory source=$DW_JOB_STRIPED/many destination=%d/many-%j
set -e
# The compute node's own configuration (the controller's TCP address), not the submit host's.
export SPILLWAY_CONFIG=`+compute+` SPILLWAY_DATAWARP_DEBUG=1
echo "host=$(hostname)"
mkdir "ckpt-$SLURM_JOB_ID"
`+prog+` "$PWD/ckpt-$SLURM_JOB_ID" `+strconv.Itoa(ckptMiB)+`
mkdir "$DW_JOB_STRIPED/many" && (cd "$DW_JOB_STRIPED/many" && seq `+strconv.Itoa(manyFiles)+` | xargs touch)
sleep 2 # lets the test see the stages while the job runs
`)
	dir := filepath.Join(c.pfs, "ckpt-"+id)
	first, newest := filepath.Join(dir, "ckpt.1"), filepath.Join(dir, "ckpt.3")
	// Follow the job and its stages until it has finished and its session is gone (the
	// session's stages are listed as long as it exists).
	var (
		last         = map[string]stageView{} // the last view of each stage while the session was there
		final        map[string]stageView     // the last view of the session's stages
		deferredSeen bool                     // ckpt.3's stage seen deferred while the job ran
		completeIn   string                   // Slurm's burst buffer state when ckpt.3's stage was first seen complete
		bbStates     []string                 // Slurm's burst buffer states, in order
	)
	c.waitFor(3*time.Minute, "job "+id+" to finish and its session to be gone", func() bool {
		j := c.job(id)
		bb := j["BurstBufferState"]
		if bb != "" && (len(bbStates) == 0 || bbStates[len(bbStates)-1] != bb) {
			bbStates = append(bbStates, bb)
		}
		stages := c.stagesUnder(dir)
		if len(stages) > 0 {
			final = stages
		}
		for p, s := range stages {
			last[p] = s
			if p == newest && s.Status == "deferred" && j["JobState"] == "RUNNING" {
				deferredSeen = true
			}
			if p == newest && s.Status == "complete" && completeIn == "" {
				completeIn = j["JobState"] + "/" + bb
			}
		}
		if finished[j["JobState"]] && j["JobState"] != "COMPLETED" {
			return true // failed: said below
		}
		return finished[j["JobState"]] && len(stages) == 0 && !c.sessions()[id]
	})
	j := c.job(id)
	out := c.read("ckpt-" + id + ".out")
	t.Logf("job %s: %s, burst buffer states %v\n%s", id, j["JobState"], bbStates, out)
	if j["JobState"] != "COMPLETED" || j["ExitCode"] != "0:0" || !strings.Contains(out, "failures 0\n") || strings.Contains(out, "FAIL") {
		t.Fatalf("job %s: %s %s (%s)\n%s", id, j["JobState"], j["ExitCode"], j["Reason"], out)
	}
	if !strings.Contains(out, "host=cn1\n") {
		t.Errorf("the job did not run on cn1:\n%s", out)
	}
	// The PFS: the immediate checkpoint and the newest, not the revoked one.
	checkCkpt(t, first, 1, 6*ckptMiB) // ckpt.c's FIRST_FACTOR
	checkCkpt(t, newest, 3, ckptMiB)
	if _, err := os.Stat(filepath.Join(dir, "ckpt.2")); err == nil {
		t.Errorf("ckpt.2 was revoked but is on the PFS")
	}
	// The controller's view: both stages are the job's own, split over both storage nodes,
	// and the deferred one was complete before Slurm's teardown removed the session.
	if !deferredSeen {
		t.Errorf("ckpt.3's stage was never seen deferred while the job ran; seen last: %+v", last[newest])
	}
	for _, p := range []string{first, newest} {
		s, ok := last[p]
		switch {
		case !ok:
			t.Errorf("dwstat never showed the stage of %s", p)
		case !s.InJob || s.Status != "complete":
			t.Errorf("the stage of %s was last seen %q (in_job %v) before the session went away, want complete and in_job", p, s.Status, s.InJob)
		case s.Moved["bb1"] == 0 || s.Moved["bb2"] == 0:
			t.Errorf("the stage of %s was not split over bb1 and bb2: moved %v", p, s.Moved)
		}
	}
	// Slurm's data_out was still under way (the job's own stage-out) when the deferred stage
	// was seen complete: the teardown came after both.
	if !strings.HasSuffix(completeIn, "/staging-out") {
		t.Errorf("ckpt.3's stage was first seen complete with the job %q (state/burst buffer state), want it staging out (Slurm's data_out)", completeIn)
	}
	if got, err := os.ReadDir(filepath.Join(c.pfs, "many-"+id)); err != nil || len(got) != manyFiles {
		t.Errorf("the job's own stage-out: %d files (%v), want %d", len(got), err, manyFiles)
	}
	if s, ok := final[filepath.Join(dir, "ckpt.2")]; ok {
		t.Errorf("the revoked stage of ckpt.2 was still listed at the end: %+v", s)
	}
	c.assertGone(id)
}

// dwcheck all (every function and documented error, tests/e2e/testdata/libdatawarp) in a
// batch job on cn2, a compute node that is not a storage node, on a one-server instance: the
// checks the e2e tests run under spillway run, under Slurm.
func (c *cluster) libdatawarpEveryFunction(t *testing.T, m *multiCluster) {
	bin := filepath.Join(m.dir, "bin")
	if _, err := os.Stat(filepath.Join(bin, "dwcheck")); err != nil {
		bin = buildLibdatawarp(t, m.dir)
	}
	// The PFS directory: a subdirectory the user cannot write, and root's write-protected
	// file in a directory of the user's.
	out := filepath.Join(c.pfs, "dwcheck")
	for _, d := range []string{"readonly", "locked"} {
		if err := os.MkdirAll(filepath.Join(out, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{out, filepath.Join(out, "locked")} {
		os.Chown(d, c.uid, c.gid)
	}
	if err := os.WriteFile(filepath.Join(out, "locked", "e.dat"), []byte("root's\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	id := c.sbatch("dwcheck.sh", `#!/bin/bash
#SBATCH -N1 -w cn2 --output=dwcheck-%j.out
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
export SPILLWAY_CONFIG=`+filepath.Join(m.dir, "etc", "compute.toml")+`
echo "host=$(hostname)"
exec `+filepath.Join(bin, "dwcheck")+` all `+out+`
`)
	j := c.waitEnd(id, 3*time.Minute)
	got := c.read("dwcheck-" + id + ".out")
	if j["JobState"] != "COMPLETED" || !strings.Contains(got, "failures 0") || strings.Contains(got, "FAIL") || !strings.Contains(got, "host=cn2\n") {
		t.Fatalf("dwcheck all in job %s: %s %s\n%s", id, j["JobState"], j["ExitCode"], got)
	}
	if n := strings.Count("\n"+got, "\nok "); n < 69 {
		t.Errorf("only %d checks ran:\n%s", n, got)
	}
	if data, err := os.ReadFile(filepath.Join(out, "b.dat")); err != nil || string(data) != "b\n" {
		t.Errorf("b.dat (activated in the job) on the PFS: %q %v", data, err)
	}
	c.assertGone(id)
}
