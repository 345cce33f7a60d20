package e2e

import (
	"strings"
	"testing"
)

// dwcli cache in a job with a cache instance (as nobody): a file written is not on the PFS
// until dwcli cache sync; a directory's policy set with dwcli cache policy is read back and
// taken by a file created in it, whose close then puts its data on the PFS; a path outside
// any cache is EOPNOTSUPP (95) with --json; a stage of a cache path is refused (EINVAL).
func TestDwcliCacheSyncAndPolicy(t *testing.T) {
	requireRoot(t)
	w := newWorld(t, true)
	cached := w.pfsDir("cached")
	dw := binary + " dwcli"
	script := w.script("job.sh", `#!/bin/sh
#DW jobdw type=cache access_mode=striped capacity=1GiB pfs=`+cached+`
bb=$DW_JOB_STRIPED_CACHE
pfs=`+cached+`
head -c 3000000 /dev/urandom > $bb/a
if cmp -s $bb/a $pfs/a; then echo "FAIL a on the PFS before the sync"; fi
`+dw+` cache sync $bb/a || echo "FAIL sync"
if cmp -s $bb/a $pfs/a; then echo "ok sync"; else echo "FAIL a not on the PFS after the sync"; fi
mkdir $bb/sub
`+dw+` cache policy --sync-on-close yes --read-ahead 1MiB $bb/sub || echo "FAIL policy set"
echo "policy: $(`+dw+` cache policy --json $bb/sub)"
head -c 3000000 /dev/urandom > $bb/sub/b
if cmp -s $bb/sub/b $pfs/sub/b; then echo "ok sync_on_close"; else echo "FAIL sub/b not on the PFS after its close"; fi
echo "file policy: $(`+dw+` cache policy $bb/sub/b)"
`+dw+` cache policy --json /tmp; echo "outside: $?"
`+dw+` stage out --json $bb/a $pfs/a.out; echo "stage: $?"
`)
	r := w.runEnv([]string{"SPILLWAY_BIN=" + binary}, "run", script)
	if r.code != 0 || strings.Contains(r.stdout, "FAIL") {
		t.Fatalf("the job:\n%s", r)
	}
	for _, want := range []string{
		"ok sync\n", "ok sync_on_close\n",
		`"policy":{"modified_threshold":`, `"read_ahead":1048576,"sync_on_close":true,"sync_to_pfs":false}`,
		"file policy: modified_threshold=", "read_ahead=1048576 sync_on_close=yes",
		`"errno":95`, "outside: 95\n",
		"a cache instance is not staged", "stage: 22\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("the job's output lacks %q:\n%s", want, r)
		}
	}
	w.waitNoSessions()
}
