package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/views"
)

// TestLoadbalanceCacheRun (issue 20 item 8): `spillway run` of a job with a load-balanced
// cache (type=cache access_mode=loadbalance) of a PFS directory: the job reads the PFS files
// through $DW_JOB_LDBAL_CACHE (twice), every change is refused (read-only file system), the
// PFS directory is unchanged, the accounting record says the cache read the file from the
// PFS once, and nothing is left behind.
func TestLoadbalanceCacheRun(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	w.file("ref/small.txt", "reference data\n", 0o644)
	big := make([]byte, 5<<20+321)
	rand.New(rand.NewSource(8)).Read(big)
	w.file("ref/big.dat", string(big), 0o644)
	sum := sha256.Sum256(big)
	script := w.script("ldbal-cache.sh", `#!/bin/bash
#DW jobdw type=cache access_mode=loadbalance capacity=1GiB pfs=`+w.pfs+`/ref
set -u
case "$DW_JOB_LDBAL_CACHE" in */) ;; *) echo "DW_JOB_LDBAL_CACHE must end in /"; exit 3;; esac
cat "$DW_JOB_LDBAL_CACHE"small.txt
sha256sum "$DW_JOB_LDBAL_CACHE"big.dat
sha256sum "$DW_JOB_LDBAL_CACHE"big.dat
ls "$DW_JOB_LDBAL_CACHE"
echo x > "$DW_JOB_LDBAL_CACHE"new.txt 2>&1 || echo "create refused"
echo x >> "$DW_JOB_LDBAL_CACHE"small.txt 2>&1 || echo "write refused"
rm "$DW_JOB_LDBAL_CACHE"big.dat 2>&1 || echo "remove refused"
mkdir "$DW_JOB_LDBAL_CACHE"d 2>&1 || echo "mkdir refused"
`)
	r := w.run("run", script)
	if r.code != 0 {
		t.Fatalf("job failed: %s", r)
	}
	mustContain(t, r, "reference data", hex.EncodeToString(sum[:]), "big.dat\nsmall.txt", "Read-only file system",
		"create refused", "write refused", "remove refused", "mkdir refused", "setup", "pre_run", "teardown")
	if n := strings.Count(r.stdout, hex.EncodeToString(sum[:])); n != 2 {
		t.Errorf("the big file read right %d times of 2:\n%s", n, r)
	}
	if got, err := os.ReadFile(filepath.Join(w.pfs, "ref", "big.dat")); err != nil || !bytes.Equal(got, big) {
		t.Errorf("the PFS file changed: %d bytes, %v", len(got), err)
	}
	if got, _ := os.ReadFile(filepath.Join(w.pfs, "ref", "small.txt")); string(got) != "reference data\n" {
		t.Errorf("the PFS file changed: %q", got)
	}
	if names, _ := os.ReadDir(filepath.Join(w.pfs, "ref")); len(names) != 2 {
		t.Errorf("the PFS directory holds %d entries, want 2", len(names))
	}
	// The accounting record: the cache read each file from the PFS once, the re-read hit.
	var raw []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if raw, _ = os.ReadFile(filepath.Join(w.home, "state", "accounting.log")); len(raw) > 0 {
			break
		}
	}
	var found bool
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var a views.Accounting
		if err := json.Unmarshal([]byte(line), &a); err != nil || a.Realm.Cache == nil {
			continue
		}
		found = true
		c := a.Realm.Cache
		t.Logf("the cache's accounting: %+v", *c)
		want := uint64(len(big) + len("reference data\n"))
		if c.PFSBytesRead < uint64(len(big)) || c.PFSBytesRead > want || c.Hits == 0 || c.PFSBytesWritten != 0 {
			t.Errorf("the cache's accounting: %+v; want %d bytes at most read from the PFS (each file once), hits, nothing written", c, want)
		}
	}
	if !found {
		t.Errorf("no accounting record of the cache in:\n%s", raw)
	}
	w.assertClean()
}

// TestLoadbalanceCacheAcrossStorageNodes (issue 20 item 8): a load-balanced cache on two
// storage nodes, read by two compute nodes, each a host of its own: the controller spreads
// the compute nodes over the servers (hoste reads the first, hostb the second, by name), both
// read the PFS file right, twice; each server read it from the PFS once (the accounting of
// each fragment's cache), and nothing can be written. Nothing is left behind.
func TestLoadbalanceCacheAcrossStorageNodes(t *testing.T) {
	storage := []string{"hosta", "hostc"}
	c := newNetClusterOf(t, storage, []string{"hostb", "hoste"})
	c.start("ctl")
	for _, h := range append(storage, "hostb", "hoste") {
		c.start(h)
	}
	pfs := filepath.Join(c.dir, "pfs")
	ref := filepath.Join(pfs, "ref")
	os.Mkdir(ref, 0o755)
	os.Chown(ref, nobodyUID, nobodyGID)
	big := make([]byte, 9<<20+77)
	rand.New(rand.NewSource(9)).Read(big)
	if err := os.WriteFile(filepath.Join(ref, "big.dat"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chown(filepath.Join(ref, "big.dat"), nobodyUID, nobodyGID)
	sum := sha256.Sum256(big)

	job := c.jobFile("ldbal-cache.sh", "#!/bin/bash\n#DW jobdw type=cache access_mode=loadbalance capacity=2GiB pfs="+ref+"\n\x00")
	nodes := c.jobFile("ldbal-cache.nodes", "hostb\nhoste\n")
	c.wlm("--function", "job_process", "--job", job)
	c.wlm("--function", "setup", "--token", "70", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:2GiB", "--job", job)
	for _, h := range storage {
		if f := c.fragments(h); len(f) != 1 {
			t.Fatalf("%s holds %d fragments of the 2-grain instance, want 1", h, len(f))
		}
	}
	mount := c.jobPath("70", job, "DW_JOB_LDBAL_CACHE")
	c.wlm("--function", "pre_run", "--token", "70", "--job", job, "--nodehostnamefile", nodes)
	run := func(host, script string) string { t.Helper(); return c.mustRun(t, host, script) }
	for _, h := range []string{"hostb", "hoste"} {
		out := run(h, "sha256sum "+mount+"/big.dat; sha256sum "+mount+"/big.dat")
		if n := strings.Count(out, hex.EncodeToString(sum[:])); n != 2 {
			t.Errorf("%s reads the cached file as:\n%s\nwant %x twice", h, out, sum)
		}
		out = run(h, "echo x > "+mount+"/new 2>&1 || echo refused; rm "+mount+"/big.dat 2>&1 || echo refused")
		if strings.Count(out, "refused") != 2 || !strings.Contains(out, "Read-only file system") {
			t.Errorf("%s changed the load-balanced cache:\n%s", h, out)
		}
	}
	// Which server each node reads: the replicas' order differs by node.
	firsts := map[string]bool{}
	for _, h := range []string{"hostb", "hoste"} {
		if out := strings.TrimSpace(run(h, "getfattr --only-values -n user.spillway.replica "+mount+"/big.dat 2>/dev/null || true")); out != "" {
			firsts[out] = true
		}
	}
	if len(firsts) == 1 { // none: no getfattr here (the accounting below tells as much)
		t.Errorf("both compute nodes read the replica on %v: not spread", firsts)
	}
	acct, err := c.client.SessionAccounting(context.Background(), "70")
	if err != nil {
		t.Fatal(err)
	}
	if len(acct.Realm.Fragments) != 2 {
		t.Fatalf("accounting of %d fragments, want 2", len(acct.Realm.Fragments))
	}
	for _, f := range acct.Realm.Fragments {
		if f.Cache == nil || f.Cache.PFSBytesRead != uint64(len(big)) || f.Cache.Hits == 0 || f.Cache.PFSBytesWritten != 0 {
			t.Errorf("the cache on %s: %+v; want the file read from the PFS once (%d bytes), hits, nothing written", f.ServerHostname, f.Cache, len(big))
		}
	}
	if got, err := os.ReadFile(filepath.Join(ref, "big.dat")); err != nil || !bytes.Equal(got, big) {
		t.Errorf("the PFS file changed: %d bytes, %v", len(got), err)
	}
	c.wlm("--function", "post_run", "--token", "70", "--job", job)
	c.wlm("--function", "teardown", "--token", "70", "--job", job)
	c.assertClean()
}
