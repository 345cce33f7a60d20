package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestStageInComputeStageOutAsUser is the core promise, end to end, as an ordinary user:
// a directory staged in (modes kept), a job that reads it in the burst buffer and writes a
// result, the result staged out as the user, and nothing left afterwards.
func TestStageInComputeStageOutAsUser(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	w.file("in/a.txt", "alpha\n", 0o644)
	w.file("in/run.sh", "#!/bin/sh\necho run\n", 0o755)
	w.file("in/deep/b.txt", "beta\n", 0o600)
	w.file("single.dat", strings.Repeat("x", 3<<20), 0o644)
	os.MkdirAll(filepath.Join(w.pfs, "results"), 0o755)
	os.Chown(filepath.Join(w.pfs, "results"), nobodyUID, nobodyGID)
	script := w.script("job.sh", `#!/bin/bash
#SBATCH -N 1
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_in type=directory source=`+w.pfs+`/in destination=$DW_JOB_STRIPED/in
#DW stage_in type=file source=`+w.pfs+`/single.dat destination=$DW_JOB_STRIPED/copy/
#DW stage_out type=file source=$DW_JOB_STRIPED/out.txt destination=`+w.pfs+`/results/out.%j.txt
set -eu
case "$DW_JOB_STRIPED" in */) ;; *) echo "DW_JOB_STRIPED must end in /"; exit 3;; esac
stat -c '%a %n' "$DW_JOB_STRIPED"in/run.sh "$DW_JOB_STRIPED"in/deep/b.txt
cat "$DW_JOB_STRIPED"in/a.txt "$DW_JOB_STRIPED"in/deep/b.txt | tr a-z A-Z > "$DW_JOB_STRIPED"out.txt
wc -c < "$DW_JOB_STRIPED"copy/single.dat
id -u
`)
	r := w.run("run", script)
	if r.code != 0 {
		t.Fatalf("job failed: %s", r)
	}
	mustContain(t, r, "755 ", "run.sh", "600 ", "b.txt", "3145728", "65534", "setup", "data_in", "pre_run", "post_run", "data_out", "teardown")
	out := filepath.Join(w.pfs, "results", "out.1.txt")
	got, err := os.ReadFile(out)
	if err != nil || string(got) != "ALPHA\nBETA\n" {
		t.Fatalf("staged-out file: %q %v", got, err)
	}
	st, _ := os.Stat(out)
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid != nobodyUID {
		t.Errorf("staged-out file owned by uid %d, want the job's user %d", uid, nobodyUID)
	}
	w.assertClean()
}

// TestUnreadableStageSourceIsRefused: a user cannot stage a file they cannot read; the job
// does not run and the error names the file.
func TestUnreadableStageSourceIsRefused(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	secret := filepath.Join(w.pfs, "secret.txt")
	os.WriteFile(secret, []byte("root only"), 0o600) // owned by root
	marker := filepath.Join(w.root, "ran")
	script := w.script("job.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_in type=file source=`+secret+` destination=$DW_JOB_STRIPED/secret.txt
touch `+marker+`
`)
	r := w.run("run", script)
	if r.code != 69 {
		t.Fatalf("want exit 69 (burst buffer failed before the job), got %s", r)
	}
	mustContain(t, r, secret, "permission denied", "line 3")
	if _, err := os.Stat(marker); err == nil {
		t.Error("the job ran although its stage-in failed")
	}
	w.assertClean()
}

// TestBadInputIsRefusedWithTheLine covers the directive errors a user meets.
func TestBadInputIsRefusedWithTheLine(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, false)
	cases := []struct {
		name, directives string
		code             int
		want             []string
	}{
		{"malformed capacity", "#DW jobdw type=scratch access_mode=striped capacity=3.5XB", 65, []string{"line 2", "capacity", "XB"}},
		{"unknown option", "#DW jobdw type=scratch capacity=1GiB bogus=1", 65, []string{"line 2", "bogus"}},
		{"escaping destination", "#DW jobdw type=scratch capacity=1GiB\n#DW stage_in type=file source=/etc/hostname destination=$DW_JOB_STRIPED/../../x", 65, []string{"line 3"}},
		{"unknown pool", "#DW jobdw type=scratch capacity=1GiB pool=nosuch", 69, []string{"line 2: #DW jobdw pool=nosuch: pool \"nosuch\" does not exist; pools: wlm_pool"}},
		{"over capacity", "#DW jobdw type=scratch capacity=6GiB", 69, []string{"line 2: #DW jobdw capacity=6GiB: pool wlm_pool cannot hold 6GiB", "free"}},
		{"missing persistent", "#DW persistentdw name=ghost", 69, []string{"line 2: #DW persistentdw name=ghost: no persistent instance of that name exists"}},
		{"missing persistent to destroy", "#BB destroy_persistent name=ghost", 69, []string{"line 2: #BB destroy_persistent name=ghost: no persistent instance named ghost"}},
		{"missing source", "#DW jobdw type=scratch capacity=1GiB\n#DW stage_in type=file source=/nonexistent/x destination=$DW_JOB_STRIPED/x", 69, []string{"/nonexistent/x"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			script := w.script("bad.sh", "#!/bin/bash\n"+c.directives+"\necho the job ran\n")
			r := w.run("run", script)
			if r.code != c.code {
				t.Fatalf("want exit %d: %s", c.code, r)
			}
			mustContain(t, r, c.want...)
			if strings.Contains(r.stdout, "the job ran") {
				t.Error("the job ran")
			}
			if c.name == "over capacity" && (strings.Contains(r.stderr+r.stdout, "instance released") || !strings.Contains(r.stderr+r.stdout, "nothing to release")) {
				t.Errorf("a refused setup created no instance; the teardown line says otherwise:\n%s", r)
			}
		})
	}
	w.assertClean()
}

// TestJobStatusAndCapacityLimit: the job's exit status passes through; writing past the
// instance's capacity fails with ENOSPC inside the job.
func TestJobStatusAndCapacityLimit(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	script := w.script("fill.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
dd if=/dev/zero of="$DW_JOB_STRIPED/big" bs=1M count=1100 2>&1 | grep -i space
df -B1 --output=size "$DW_JOB_STRIPED" | tail -1
exit 7
`)
	r := w.run("run", script)
	if r.code != 7 {
		t.Fatalf("want the job's status 7: %s", r)
	}
	mustContain(t, r, "No space left on device", "1073741824")
	w.assertClean()
}

// TestPersistentInstanceAcrossJobs: create, use from two jobs (data survives between them),
// list, destroy — through #BB directives and through `spillway persistent`.
func TestPersistentInstanceAcrossJobs(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	if r := w.run("persistent", "create", "shared", "--capacity", "2GiB"); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	use := w.script("use.sh", `#!/bin/bash
#DW persistentdw name=shared
echo "job $SPILLWAY_JOB_ID" >> "$DW_PERSISTENT_STRIPED_shared/log"
cat "$DW_PERSISTENT_STRIPED_shared/log"
`)
	w.run("run", use)
	r := w.run("run", use)
	if r.code != 0 || !strings.Contains(r.stdout, "job 1\njob 2\n") {
		t.Fatalf("second job must see the first job's file: %s", r)
	}
	r = w.run("persistent", "list", "--json")
	mustContain(t, r, `"name": "shared"`, `"capacity": 2147483648`)
	if r := w.run("persistent", "destroy", "shared"); r.code != 0 {
		t.Fatalf("destroy: %s", r)
	}
	r = w.run("run", use)
	if r.code != 69 {
		t.Fatalf("a job using a destroyed instance must not run: %s", r)
	}
	// The same through #BB directives.
	create := w.script("create.sh", "#!/bin/bash\n#BB create_persistent name=bb capacity=1GiB access_mode=striped type=scratch\n")
	destroy := w.script("destroy.sh", "#!/bin/bash\n#BB destroy_persistent name=bb\n")
	if r := w.run("run", create); r.code != 0 {
		t.Fatalf("#BB create_persistent: %s", r)
	}
	if r := w.run("dwstat", "instances"); !strings.Contains(r.stdout, " bb ") || !strings.Contains(r.stdout, "true") {
		t.Errorf("dwstat instances must list bb as public: %s", r)
	}
	if r := w.run("run", destroy); r.code != 0 {
		t.Fatalf("#BB destroy_persistent: %s", r)
	}
	w.assertClean()
}

// TestStripedPrivateAndLoadbalance checks the namespace rules of each access mode.
func TestStripedPrivateAndLoadbalance(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	w.file("ro/data.txt", "read me\n", 0o644)
	script := w.script("modes.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped,private capacity=1GiB
echo s > "$DW_JOB_STRIPED/s"; echo p > "$DW_JOB_PRIVATE/p"
ls "$DW_JOB_STRIPED"; ls "$DW_JOB_PRIVATE"
`)
	r := w.run("run", script)
	if r.code != 0 || !strings.Contains(r.stdout, "s\np\n") {
		t.Fatalf("striped,private: %s", r)
	}
	lb := w.script("lb.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=loadbalance capacity=1GiB
#DW stage_in type=file source=`+w.pfs+`/ro/data.txt destination=$DW_JOB_LDBAL/data.txt
cat "$DW_JOB_LDBAL/data.txt"
echo x > "$DW_JOB_LDBAL/new" 2>&1 || echo "write refused"
`)
	r = w.run("run", lb)
	if r.code != 0 {
		t.Fatalf("loadbalance: %s", r)
	}
	mustContain(t, r, "read me", "Read-only file system", "write refused")
	w.assertClean()
}

// TestDwstatTables checks the tables users and scripts read while a job runs.
func TestDwstatTables(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, false)
	script := w.script("look.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
`+binary+` dwstat most
`+binary+` dwstat -b pools
`+binary+` dwstat nodes fragments
`)
	r := w.run("run", script)
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	mustContain(t, r, "pool units quantity free gran", "sess state token creator owner created expiration nodes",
		"CA---", "run1", "RUN", "inst state sess bytes nodes created expiration intact label public confs", "I1-0",
		"conf state inst type activs", "reg state sess conf wait", "activ state sess conf nodes mount", "run1_striped_scratch",
		"wlm_pool bytes 4294967296 3221225472 1073741824", "node pool online drain gran capacity insts activs", "frag state inst capacity node")
	if r := w.run("dwstat", "bogus"); r.code == 0 || !strings.Contains(r.stderr, "unknown table") {
		t.Errorf("unknown table: %s", r)
	}
	if r := w.run("dwstat"); !strings.Contains(r.stdout, "4GiB") {
		t.Errorf("pools after the job: %s", r)
	}
}

// TestListStagingAndWarnings stages a list in and out, and reports a skipped special file.
func TestListStagingAndWarnings(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	w.file("l/one.txt", "one\n", 0o644)
	w.file("l/two.txt", "two\n", 0o644)
	w.file("tree/plain.txt", "plain\n", 0o644)
	if err := syscall.Mkfifo(filepath.Join(w.pfs, "tree", "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Lchown(filepath.Join(w.pfs, "tree", "fifo"), nobodyUID, nobodyGID)
	os.MkdirAll(filepath.Join(w.pfs, "back"), 0o755)
	os.Chown(filepath.Join(w.pfs, "back"), nobodyUID, nobodyGID)
	w.file("in.list", w.pfs+"/l/one.txt $DW_JOB_STRIPED/a/one.txt\n# a comment\n"+w.pfs+"/l/two.txt $DW_JOB_STRIPED/b/two.txt\n", 0o644)
	w.file("out.list", "$DW_JOB_STRIPED/a/one.txt "+w.pfs+"/back/one.txt\n$DW_JOB_STRIPED/b/two.txt "+w.pfs+"/back/two.txt\n", 0o644)
	script := w.script("list.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_in type=list source=`+w.pfs+`/in.list destination=$DW_JOB_STRIPED
#DW stage_in type=directory source=`+w.pfs+`/tree destination=$DW_JOB_STRIPED/tree
#DW stage_out type=list source=`+w.pfs+`/out.list destination=`+w.pfs+`/back
cat "$DW_JOB_STRIPED/a/one.txt" "$DW_JOB_STRIPED/b/two.txt"
ls "$DW_JOB_STRIPED/tree"
`)
	r := w.run("run", script)
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	mustContain(t, r, "one\ntwo\n", "plain.txt", "warning: data_in line 4:", "fifo")
	for _, f := range []string{"one.txt", "two.txt"} {
		if b, err := os.ReadFile(filepath.Join(w.pfs, "back", f)); err != nil || !strings.HasPrefix(f, strings.TrimSpace(string(b))) {
			t.Errorf("staged-out %s: %q %v", f, b, err)
		}
	}
	w.assertClean()
}

// TestPercentSymbols: %j becomes the job id in stage paths and %% a literal %, with no warning
// about the literal (warnings are about what the user wrote, not the substituted text).
func TestPercentSymbols(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	os.Chown(w.pfs, nobodyUID, nobodyGID)
	script := w.script("pct.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
#DW stage_out type=file source=$DW_JOB_STRIPED/x destination=`+w.pfs+`/out-100%%-%j
echo hi > "$DW_JOB_STRIPED/x"
`)
	r := w.run("run", script)
	if r.code != 0 || strings.Contains(r.stdout+r.stderr, "warning") {
		t.Fatalf("%s", r)
	}
	matches, _ := filepath.Glob(filepath.Join(w.pfs, "out-100%-[0-9]*"))
	if len(matches) != 1 {
		t.Errorf("staged-out file with %%%% and %%j replaced: %v", matches)
	}
	w.assertClean()
}
