package e2e

import (
	"bytes"
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
