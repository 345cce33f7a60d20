package slurm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDatawarpPlugin drives Spillway through Slurm's burst_buffer/datawarp plugin: the
// scenarios run one after the other on one cluster, each checking that nothing of its jobs
// is left behind.
func TestDatawarpPlugin(t *testing.T) {
	c := up(t, "datawarp", "16GiB")
	c.run("stage_in_and_out", (*cluster).stageInAndOut)
	c.run("striped_private", (*cluster).stripedPrivate)
	c.run("srun_bb_and_salloc_bbf", (*cluster).interactive)
	c.run("job_array", (*cluster).jobArray)
	c.run("persistent", (*cluster).persistent)
	c.run("capacity_exhausted", (*cluster).capacityExhausted)
	c.run("invalid_directives", (*cluster).invalidDirectives)
	c.run("unreadable_stage_in", (*cluster).unreadableStageIn)
	c.run("scancel_hurry", (*cluster).cancelHurry)
	c.run("afterburstbuffer", (*cluster).afterBurstBuffer)
	c.run("slurmctld_restart_during_stage_out", (*cluster).restartDuringStageOut)
	c.run("scontrol_show_dwstat", (*cluster).showDwstat)
	c.run("cache_and_scratch_cache", (*cluster).cacheJobs)
	c.run("swap", (*cluster).swapJobs)
	c.assertClean()
}

// pool is the pool= option jobs name: the lua plugin requires it with capacity=; the
// datawarp plugin's jobs rely on DefaultPool instead.
func (c *cluster) pool() string {
	if c.plugin == "lua" {
		return " pool=wlm_pool"
	}
	return ""
}

// A batch job with a job instance, a directory staged in and a file staged out: the job
// reads the staged data, `scontrol show burst` lists its buffer, the result arrives with the
// right content, and the buffer is gone after the job.
func (c *cluster) stageInAndOut(t *testing.T) {
	c.writeFile("in1/a", "3\n1\n2\n", 0o644)
	c.writeFile("in1/sub/b", "bee\n", 0o640)
	id := c.sbatch("stage.sh", `#!/bin/bash
#SBATCH --output=stage-%j.out
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
#DW stage_in type=directory source=%d/in1 destination=$DW_JOB_STRIPED/in
#DW stage_out type=file source=$DW_JOB_STRIPED/result destination=%d/result-%j
set -e
echo "striped=$DW_JOB_STRIPED"
cat "$DW_JOB_STRIPED/in/sub/b"
stat -c 'mode=%a' "$DW_JOB_STRIPED/in/sub/b"
scontrol show burst
sort "$DW_JOB_STRIPED/in/a" > "$DW_JOB_STRIPED/result"
`)
	j := c.waitEnd(id, 2*time.Minute)
	if j["JobState"] != "COMPLETED" || j["ExitCode"] != "0:0" {
		t.Fatalf("job %s: %s %s\n%s", id, j["JobState"], j["ExitCode"], c.read("stage-"+id+".out"))
	}
	out := c.read("stage-" + id + ".out")
	wantPath := filepath.Join(c.dir, "mounts", id+"_striped_scratch") + "/"
	for _, want := range []string{"striped=" + wantPath + "\n", "bee\n", "mode=640\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("job output lacks %q:\n%s", want, out)
		}
	}
	if c.plugin == "datawarp" && !strings.Contains(out, "JobID="+id+" ") {
		t.Errorf("scontrol show burst inside the job does not list job %s:\n%s", id, out)
	}
	if got := c.read("result-" + id); got != "1\n2\n3\n" {
		t.Errorf("staged-out result: %q", got)
	}
	if fi, err := os.Stat(filepath.Join(c.pfs, "result-"+id)); err == nil && int(fi.Sys().(*syscall.Stat_t).Uid) != c.uid {
		t.Errorf("staged-out file is not owned by the job's user")
	}
	c.assertGone(id)
}

// access_mode=striped,private gives both variables, two different namespaces.
func (c *cluster) stripedPrivate(t *testing.T) {
	id := c.sbatch("sp.sh", `#!/bin/bash
#SBATCH --output=sp-%j.out
#DW jobdw type=scratch access_mode=striped,private capacity=2GiB`+c.pool()+`
set -e
echo "S=$DW_JOB_STRIPED"
echo "P=$DW_JOB_PRIVATE"
echo shared > "$DW_JOB_STRIPED/s"
echo mine > "$DW_JOB_PRIVATE/p"
test ! -e "$DW_JOB_PRIVATE/s"
echo ok
`)
	j := c.waitEnd(id, 2*time.Minute)
	out := c.read("sp-" + id + ".out")
	if j["JobState"] != "COMPLETED" || !strings.Contains(out, "ok\n") {
		t.Fatalf("job %s: %s\n%s", id, j["JobState"], out)
	}
	for _, want := range []string{
		"S=" + filepath.Join(c.dir, "mounts", id+"_striped_scratch") + "/\n",
		"P=" + filepath.Join(c.dir, "mounts", id+"_private_scratch") + "/\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("job output lacks %q:\n%s", want, out)
		}
	}
	c.assertGone(id)
}

// srun --bb and salloc --bbf: interactive jobs get their instance too. The datawarp plugin
// turns --bb's options into a #DW jobdw line; the lua plugin takes the line itself.
func (c *cluster) interactive(t *testing.T) {
	bb := "--bb=capacity=1GiB access_mode=striped type=scratch"
	if c.plugin == "lua" {
		bb = "--bb=#DW jobdw capacity=1GiB access_mode=striped type=scratch pool=wlm_pool"
	}
	r := c.user("srun", bb, "bash", "-c",
		`echo "S=$DW_JOB_STRIPED"; echo hi > "$DW_JOB_STRIPED/x" && cat "$DW_JOB_STRIPED/x"`)
	if r.code != 0 || !strings.Contains(r.stdout, "_striped_scratch/\n") || !strings.Contains(r.stdout, "hi\n") {
		t.Errorf("srun --bb: %s", r)
	}
	c.writeFile("sp.bbf", "#DW jobdw type=scratch access_mode=striped,private capacity=1GiB"+c.pool()+"\n", 0o644)
	r = c.user("salloc", "--bbf=sp.bbf", "srun", "bash", "-c", `echo "S=$DW_JOB_STRIPED P=$DW_JOB_PRIVATE"; touch "$DW_JOB_PRIVATE/p"`)
	if r.code != 0 || !strings.Contains(r.stdout, "_striped_scratch/ P=") || !strings.Contains(r.stdout, "_private_scratch/\n") {
		t.Errorf("salloc --bbf: %s", r)
	}
	c.assertClean()
}

// A job array: one instance per task, %A and %a replaced in the stage paths.
func (c *cluster) jobArray(t *testing.T) {
	id := c.sbatch("array.sh", `#!/bin/bash
#SBATCH --array=1-2 --output=array-%A_%a.out
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
#DW stage_out type=file source=$DW_JOB_STRIPED/out destination=%d/array-%A_%a.result
echo "task $SLURM_ARRAY_TASK_ID" > "$DW_JOB_STRIPED/out"
`)
	c.waitFor(2*time.Minute, "both array tasks to finish and stage out", func() bool {
		_, e1 := os.Stat(filepath.Join(c.pfs, "array-"+id+"_1.result"))
		_, e2 := os.Stat(filepath.Join(c.pfs, "array-"+id+"_2.result"))
		return e1 == nil && e2 == nil && strings.TrimSpace(c.admin("squeue", "-h", "-j", id).stdout) == ""
	})
	for _, task := range []string{"1", "2"} {
		if got := c.read("array-" + id + "_" + task + ".result"); got != "task "+task+"\n" {
			t.Errorf("task %s staged out %q", task, got)
		}
	}
	c.assertClean()
}

// #BB create_persistent and destroy_persistent (in -N0 jobs), a #DW persistentdw job
// submitted before the instance exists (it waits, then runs), and data kept between jobs.
func (c *cluster) persistent(t *testing.T) {
	use := `#!/bin/bash
#SBATCH --output=use-%j.out
#DW persistentdw name=keep1
set -e
echo "P=$DW_PERSISTENT_STRIPED_keep1"
echo "written by $SLURM_JOB_ID" >> "$DW_PERSISTENT_STRIPED_keep1/log"
cat "$DW_PERSISTENT_STRIPED_keep1/log"
`
	first := c.sbatch("use1.sh", use)
	c.waitFor(30*time.Second, "the persistentdw job to wait for its instance", func() bool {
		return c.reason(first) == "BurstBufferResources"
	})
	create := c.sbatch("create.sh", "#!/bin/bash\n#BB create_persistent name=keep1 capacity=1GiB access_mode=striped type=scratch\n", "-N0")
	c.waitEnd(create, time.Minute)
	if j := c.waitEnd(first, 2*time.Minute); j["JobState"] != "COMPLETED" {
		t.Fatalf("persistentdw job %s: %s\n%s", first, j["JobState"], c.read("use-"+first+".out"))
	}
	second := c.sbatch("use2.sh", use)
	c.waitEnd(second, 2*time.Minute)
	out := c.read("use-" + second + ".out")
	if !strings.Contains(out, "written by "+first+"\nwritten by "+second+"\n") {
		t.Errorf("the persistent instance did not keep the first job's data:\n%s", out)
	}
	if !strings.Contains(out, "P="+filepath.Join(c.dir, "mounts", "keep1_"+second+"_striped_scratch")+"/") {
		t.Errorf("DW_PERSISTENT_STRIPED_keep1 not as DataWarp names it:\n%s", out)
	}
	if !c.sessions()["keep1"] {
		t.Fatalf("the persistent session keep1 vanished while no job used it")
	}
	destroy := c.sbatch("destroy.sh", "#!/bin/bash\n#BB destroy_persistent name=keep1\n", "-N0")
	c.waitEnd(destroy, time.Minute)
	c.waitFor(20*time.Second, "keep1 to be gone from Spillway and Slurm", func() bool {
		return !c.sessions()["keep1"] && !strings.Contains(c.admin("scontrol", "show", "burst").stdout, "Name=keep1")
	})
	c.assertClean()
}

// A job asking for more than is free waits with BurstBufferResources and runs once the
// space is released.
func (c *cluster) capacityExhausted(t *testing.T) {
	os.Remove(filepath.Join(c.pfs, "release"))
	big := c.sbatch("big.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=12GiB`+c.pool()+`
for i in $(seq 600); do [ -e release ] && exit 0; sleep 0.2; done
exit 1
`)
	c.waitState(big, time.Minute, "RUNNING")
	second := c.sbatch("second.sh", `#!/bin/bash
#SBATCH --output=second-%j.out
#DW jobdw type=scratch access_mode=striped capacity=8GiB`+c.pool()+`
echo "ran with $DW_JOB_STRIPED"
`)
	// Several scheduler passes: it must keep waiting for space, not fail.
	time.Sleep(5 * time.Second)
	if r := c.reason(second); r != "BurstBufferResources" {
		t.Errorf("job asking for more than is free: reason %q, want BurstBufferResources", r)
	}
	if st := c.job(second)["JobState"]; st != "PENDING" {
		t.Errorf("job asking for more than is free is %s, want PENDING", st)
	}
	c.writeFile("release", "", 0o644)
	if j := c.waitEnd(second, 2*time.Minute); j["JobState"] != "COMPLETED" {
		t.Errorf("waiting job: %s", j["JobState"])
	}
	if out := c.read("second-" + second + ".out"); !strings.Contains(out, "ran with ") {
		t.Errorf("waiting job output: %q", out)
	}
	c.assertClean()
}

// Invalid directives are refused by sbatch with the parser's message, naming the line.
func (c *cluster) invalidDirectives(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		want         []string
	}{
		{"unknown option", "#!/bin/bash\n#SBATCH -N1\n#DW jobdw capacity=1GiB bogus=1" + c.pool() + "\ntrue\n",
			[]string{"line 3", "bogus", "expected one of"}},
		{"bad access mode", "#!/bin/bash\n#DW jobdw capacity=1GiB access_mode=stripy type=scratch" + c.pool() + "\ntrue\n",
			[]string{"line 2", "access_mode", "stripy"}},
		{"stage_in escaping the instance", "#!/bin/bash\n#DW jobdw capacity=1GiB type=scratch access_mode=striped" + c.pool() +
			"\n#DW stage_in type=file source=/etc/hostname destination=$DW_JOB_STRIPED/../../escape\ntrue\n",
			[]string{"line 3", "destination"}},
		{"unknown pool", "#!/bin/bash\n#DW jobdw capacity=1GiB type=scratch access_mode=striped pool=nosuch\ntrue\n",
			[]string{"Burst Buffer request invalid"}},
	} {
		c.writeFile("bad.sh", tc.script, 0o755)
		r := c.user("sbatch", "bad.sh")
		if r.code == 0 {
			t.Errorf("%s: sbatch accepted it: %s", tc.name, r)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: sbatch's message lacks %q:\n%s", tc.name, w, r.stderr)
			}
		}
	}
	c.assertClean()
}

// A stage-in source the user cannot read holds the job with a reason naming the file;
// cancelling it tears the buffer down.
func (c *cluster) unreadableStageIn(t *testing.T) {
	secret := filepath.Join(c.pfs, "secret.txt")
	os.WriteFile(secret, []byte("root only\n"), 0o600) // owned by root
	id := c.sbatch("unreadable.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
#DW stage_in type=file source=`+secret+` destination=$DW_JOB_STRIPED/secret
cat "$DW_JOB_STRIPED/secret"
`)
	var reason string
	c.waitFor(time.Minute, "job "+id+" to be held for its stage-in", func() bool {
		reason = c.reason(id)
		return strings.Contains(reason, secret)
	})
	if !strings.Contains(reason, "permission denied") {
		t.Errorf("reason does not say why: %q", reason)
	}
	if j := c.job(id); j["JobState"] != "PENDING" || j["Priority"] != "0" {
		t.Errorf("job with a failed stage-in: %s priority %s, want PENDING, held", j["JobState"], j["Priority"])
	}
	if r := c.user("scancel", id); r.code != 0 {
		t.Fatalf("scancel: %s", r)
	}
	c.waitEnd(id, time.Minute)
	c.assertGone(id)
	c.assertClean()
}

// scancel --hurry of a running job: no stage-out, the buffer is torn down at once.
func (c *cluster) cancelHurry(t *testing.T) {
	id := c.sbatch("hurry.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
#DW stage_out type=file source=$DW_JOB_STRIPED/out destination=%d/hurry-%j
echo data > "$DW_JOB_STRIPED/out"
touch started-$SLURM_JOB_ID
sleep 300
`)
	c.waitFor(time.Minute, "job "+id+" to start", func() bool {
		_, err := os.Stat(filepath.Join(c.pfs, "started-"+id))
		return err == nil
	})
	if r := c.user("scancel", "--hurry", id); r.code != 0 {
		t.Fatalf("scancel --hurry: %s", r)
	}
	if j := c.waitEnd(id, time.Minute); j["JobState"] != "CANCELLED" {
		t.Errorf("job %s: %s, want CANCELLED", id, j["JobState"])
	}
	c.assertGone(id)
	if _, err := os.Stat(filepath.Join(c.pfs, "hurry-"+id)); err == nil {
		t.Errorf("scancel --hurry still staged out")
	}
	c.assertClean()
}

// --depend=afterburstbuffer: the dependent job starts after the first one's stage-out, so
// it sees the staged-out file.
func (c *cluster) afterBurstBuffer(t *testing.T) {
	first := c.sbatch("producer.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination=%d/produced-%j
mkdir "$DW_JOB_STRIPED/out"
for i in $(seq 200); do echo "line $i" > "$DW_JOB_STRIPED/out/f$i"; done
`)
	second := c.sbatch("consumer.sh", fmt.Sprintf(`#!/bin/bash
#SBATCH --output=consumer-%%j.out
ls produced-%s | wc -l
cat produced-%s/f200
`, first, first), "--depend=afterburstbuffer:"+first)
	j := c.waitEnd(second, 2*time.Minute)
	out := c.read("consumer-" + second + ".out")
	if j["JobState"] != "COMPLETED" || out != "200\nline 200\n" {
		t.Errorf("dependent job %s (%s) saw:\n%s", second, j["JobState"], out)
	}
	c.assertClean()
}

// slurmctld stopped while a job stages out, then started again: Slurm runs post_run,
// data_out and teardown again; the stage-out completes once, whole, and nothing leaks.
func (c *cluster) restartDuringStageOut(t *testing.T) {
	const files = 60000 // long enough to be caught on a fast day: the stage-out must outlast slurmctld's stop
	id := c.sbatch("many.sh", fmt.Sprintf(`#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
#DW stage_out type=directory source=$DW_JOB_STRIPED/many destination=%%d/many-%%j
mkdir "$DW_JOB_STRIPED/many"
cd "$DW_JOB_STRIPED/many" && seq %d | xargs touch
echo end > "$DW_JOB_STRIPED/many/zz-last"
`, files))
	c.waitFor(3*time.Minute, "job "+id+" to stage out", func() bool {
		j := c.job(id)
		if finished[j["JobState"]] && !strings.Contains(j["BurstBufferState"], "staging") {
			t.Fatalf("job %s ended (%s, burst buffer %s) before its stage-out could be caught; make the stage-out longer", id, j["JobState"], j["BurstBufferState"])
		}
		return strings.Contains(j["BurstBufferState"], "staging-out")
	})
	pidFile := filepath.Join(c.dir, "run", "slurmctld.pid")
	pid, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	if r := c.admin("kill", "-TERM", strings.TrimSpace(string(pid))); r.code != 0 {
		t.Fatalf("stopping slurmctld: %s", r)
	}
	c.waitFor(30*time.Second, "slurmctld to stop", func() bool {
		return c.admin("kill", "-0", strings.TrimSpace(string(pid))).code != 0
	})
	// The stage must still be under way, or this test tested nothing.
	stages := c.admin("dwstat", "stages").stdout
	if !strings.Contains(stages, "running") {
		t.Fatalf("the stage-out ended before slurmctld stopped; make it longer:\n%s", stages)
	}
	if r := c.admin(filepath.Join(c.dir, "bin", "start-slurmctld")); r.code != 0 {
		t.Fatalf("restarting slurmctld: %s", r)
	}
	c.waitFor(30*time.Second, "slurmctld to answer", func() bool {
		return strings.Contains(c.admin("scontrol", "ping").stdout, "UP")
	})
	j := c.waitEnd(id, 3*time.Minute)
	if j["JobState"] != "COMPLETED" {
		t.Errorf("job %s after the restart: %s (%s)", id, j["JobState"], j["Reason"])
	}
	entries, err := os.ReadDir(filepath.Join(c.pfs, "many-"+id))
	if err != nil || len(entries) != files+1 {
		t.Errorf("staged out %d entries (%v), want %d", len(entries), err, files+1)
	}
	if got := c.read("many-" + id + "/zz-last"); got != "end\n" {
		t.Errorf("last file: %q", got)
	}
	c.assertGone(id)
	c.assertClean()
}

// scontrol show dwstat (bbstat with the lua plugin) runs Spillway's dwstat through Slurm,
// within Slurm's fixed 2 s, with the headers Slurm's own test expects.
func (c *cluster) showDwstat(t *testing.T) {
	word := "dwstat"
	if c.plugin == "lua" {
		word = "bbstat"
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, `(?m)^ *pool +units +quantity +free +gran$`},
		{[]string{"pools"}, `(?m)^ *wlm_pool +bytes +16GiB +16GiB +1GiB$`},
		{[]string{"sessions"}, `(?m)^no sessions$|sess +state +token +creator +owner +created +expiration +nodes`},
		{[]string{"configurations"}, `(?m)^no scratch, cache, swap configurations$|conf +state +inst +type +activs`},
	} {
		r := c.user("scontrol", append([]string{"show", word}, tc.args...)...)
		if r.code != 0 || !regexp.MustCompile(tc.want).MatchString(r.stdout) {
			t.Errorf("scontrol show %s %v: want %s\n%s", word, tc.args, tc.want, r)
		}
	}
}

// Cache instances (issue 20): a cache job reads a file of its PFS directory through
// $DW_JOB_STRIPED_CACHE and writes its result there, which is on the PFS after the job, the
// user's; a root-only file stays unreadable through the cache. Then a job with a scratch and
// a cache instance: each with its own variable, the result copied from scratch to the cache.
func (c *cluster) cacheJobs(t *testing.T) {
	dir := filepath.Join(c.pfs, "cachedir")
	c.writeFile("cachedir/in", "from the pfs\n", 0o644)
	secret := filepath.Join(dir, "root-only")
	os.WriteFile(secret, []byte("secret\n"), 0o600) // root's
	id := c.sbatch("cache.sh", `#!/bin/bash
#SBATCH --output=cache-%j.out
#DW jobdw type=cache access_mode=striped capacity=1GiB pfs=`+dir+c.pool()+`
set -e
echo "C=$DW_JOB_STRIPED_CACHE"
cat "$DW_JOB_STRIPED_CACHE/in"
if cat "$DW_JOB_STRIPED_CACHE/root-only" 2>/dev/null; then echo "LEAK"; fi
seq 1 200000 > "$DW_JOB_STRIPED_CACHE/out-$SLURM_JOB_ID"
`)
	j := c.waitEnd(id, 2*time.Minute)
	out := c.read("cache-" + id + ".out")
	if j["JobState"] != "COMPLETED" || j["ExitCode"] != "0:0" {
		t.Fatalf("cache job %s: %s %s\n%s", id, j["JobState"], j["ExitCode"], out)
	}
	if want := "C=" + filepath.Join(c.dir, "mounts", id+"_striped_cache") + "/\n"; !strings.Contains(out, want) || !strings.Contains(out, "from the pfs\n") {
		t.Errorf("job output lacks %q or the PFS file's content:\n%s", want, out)
	}
	if strings.Contains(out, "LEAK") || strings.Contains(out, "secret") {
		t.Errorf("a root-only PFS file was read through the cache:\n%s", out)
	}
	c.assertGone(id)
	var want strings.Builder
	for i := 1; i <= 200000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	result := filepath.Join(dir, "out-"+id)
	if got, err := os.ReadFile(result); err != nil || string(got) != want.String() {
		t.Errorf("the result on the PFS after the job: %d bytes, %v", len(got), err)
	}
	if fi, err := os.Stat(result); err == nil && int(fi.Sys().(*syscall.Stat_t).Uid) != c.uid {
		t.Errorf("the result on the PFS is not the job user's: uid %d", fi.Sys().(*syscall.Stat_t).Uid)
	}

	id = c.sbatch("both.sh", `#!/bin/bash
#SBATCH --output=both-%j.out
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
#DW jobdw type=cache access_mode=striped capacity=1GiB pfs=`+dir+c.pool()+`
set -e
echo "S=$DW_JOB_STRIPED"
echo "C=$DW_JOB_STRIPED_CACHE"
seq 1 1000 > "$DW_JOB_STRIPED/tmp"
cp "$DW_JOB_STRIPED/tmp" "$DW_JOB_STRIPED_CACHE/both-$SLURM_JOB_ID"
`)
	j = c.waitEnd(id, 2*time.Minute)
	out = c.read("both-" + id + ".out")
	if j["JobState"] != "COMPLETED" || j["ExitCode"] != "0:0" {
		t.Fatalf("scratch+cache job %s: %s %s\n%s", id, j["JobState"], j["ExitCode"], out)
	}
	for _, want := range []string{
		"S=" + filepath.Join(c.dir, "mounts", id+"_striped_scratch") + "/\n",
		"C=" + filepath.Join(c.dir, "mounts", id+"_striped_cache") + "/\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("job output lacks %q:\n%s", want, out)
		}
	}
	c.assertGone(id)
	var seq strings.Builder
	for i := 1; i <= 1000; i++ {
		fmt.Fprintf(&seq, "%d\n", i)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "both-"+id)); err != nil || string(got) != seq.String() {
		t.Errorf("the scratch+cache job's result on the PFS: %q %v", got, err)
	}
}

// Swap (issue 22): a job with swap only — `--bb swap=2` with the datawarp plugin (Slurm
// writes #DW swap 2GiB, and counts it as 2 bytes: one granule), the directive itself with the
// lua plugin (which counts no swap) — and a scratch+swap job. While the first runs, its area
// is in /proc/swaps, Spillway holds at least 2 GiB of the pool for it, real_size says so and
// Slurm took it as the job's size (datawarp), dwstat configurations shows a swap
// configuration; the job completes, and nothing of its swap is left after it.
func (c *cluster) swapJobs(t *testing.T) {
	// Swap is global to the kernel: the tests that attach swap take turns.
	lock, err := os.OpenFile("/run/spillway-swaptest.lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if areas := procSwaps(); len(areas) != 0 {
		t.Skipf("this machine has swap already: %v", areas)
	}
	var args []string
	directive := "#DW swap 2GiB\n"
	if c.plugin == "datawarp" {
		args, directive = []string{"--bb=swap=2"}, ""
	}
	flag := filepath.Join(c.pfs, "swap-go")
	os.Remove(flag)
	id := c.sbatch("swap.sh", "#!/bin/bash\n#SBATCH --output=swap-%j.out\n"+directive+
		"cat /proc/swaps\nwhile [ ! -e "+flag+" ]; do sleep 0.2; done\necho done\n", args...)
	c.waitState(id, 2*time.Minute, "RUNNING")
	if areas := procSwaps(); len(areas) != 1 || !strings.HasPrefix(areas[0], "/dev/loop") {
		t.Errorf("/proc/swaps while the job runs: %v", areas)
	}
	r := c.admin("dw_wlm_cli", "--function", "real_size", "--token", id)
	var size struct{ Capacity uint64 }
	if err := json.Unmarshal([]byte(r.stdout), &size); err != nil || size.Capacity < 2<<30 {
		t.Errorf("real_size of the swap job: %s (want at least 2GiB)", r)
	}
	r = c.admin("dw_wlm_cli", "--function", "pools")
	var doc struct {
		Pools []struct{ Quantity, Free, Granularity uint64 } `json:"pools"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil || len(doc.Pools) != 1 || (doc.Pools[0].Quantity-doc.Pools[0].Free)*doc.Pools[0].Granularity < 2<<30 {
		t.Errorf("pools while the swap job runs: %s (want at least 2GiB held)", r)
	}
	if r := c.admin("dwstat", "configurations"); !regexp.MustCompile(`(?m)^ *\d+ +\S+ +\d+ +swap +1$`).MatchString(r.stdout) {
		t.Errorf("dwstat configurations: %s", r)
	}
	if c.plugin == "datawarp" {
		// Slurm's own count of --bb swap=2 is 2 bytes, one granule (1GiB): its allocation
		// record keeps that. real_size made the whole 2GiB the job's size, and the pools
		// answer (read every 30 s) makes Slurm's free space 14GiB: the space its capacity
		// waits for later jobs count from (the larger of its records and the pools' use).
		log, _ := os.ReadFile(filepath.Join(c.dir, "log", "slurmctld.log"))
		if !strings.Contains(string(log), "JobId="+id+" total_size increased from 1073741824 to 2147483648") {
			t.Errorf("slurmctld did not take real_size as job %s's size", id)
		}
		c.waitFor(45*time.Second, "Slurm to see the swap's 2GiB gone from the pool", func() bool {
			return strings.Contains(c.admin("scontrol", "show", "burst").stdout, " FreeSpace=14GiB ")
		})
	}
	c.writeFile("swap-go", "", 0o644)
	j := c.waitEnd(id, 2*time.Minute)
	out := c.read("swap-" + id + ".out")
	if j["JobState"] != "COMPLETED" || !strings.Contains(out, "/dev/loop") || !strings.Contains(out, "done\n") {
		t.Fatalf("swap job %s: %s %s\n%s", id, j["JobState"], j["ExitCode"], out)
	}
	c.assertGone(id)
	if areas := procSwaps(); len(areas) != 0 {
		t.Errorf("/proc/swaps after the job: %v", areas)
	}

	id = c.sbatch("scratchswap.sh", `#!/bin/bash
#SBATCH --output=scratchswap-%j.out
#DW jobdw type=scratch access_mode=striped capacity=1GiB`+c.pool()+`
#DW swap 1GiB
set -e
echo "S=$DW_JOB_STRIPED"
echo hi > "$DW_JOB_STRIPED/x"
grep -c /dev/loop /proc/swaps
`)
	j = c.waitEnd(id, 2*time.Minute)
	out = c.read("scratchswap-" + id + ".out")
	if j["JobState"] != "COMPLETED" || !strings.Contains(out, "_striped_scratch/\n1\n") {
		t.Fatalf("scratch+swap job %s: %s %s\n%s", id, j["JobState"], j["ExitCode"], out)
	}
	c.assertGone(id)
	if areas := procSwaps(); len(areas) != 0 {
		t.Errorf("/proc/swaps after the scratch+swap job: %v", areas)
	}
}

// procSwaps lists the swap areas of /proc/swaps.
func procSwaps() []string {
	raw, _ := os.ReadFile("/proc/swaps")
	var out []string
	for i, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if f := strings.Fields(line); i > 0 && len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out
}
