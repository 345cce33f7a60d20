package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestXFSLoopFragmentJob: `spillway run` on a home whose agent makes every fragment an XFS
// on a loop device (agent.fragment_filesystem = "xfs-loop"). The job sees the fragment's
// file system under its instance, writes and reads its data back, df shows the capacity, a
// write past it fails with ENOSPC; afterwards no mount, loop device or image is left.
func TestXFSLoopFragmentJob(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices (/dev/loop-control: %v)", err)
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		t.Skip("mkfs.xfs is not installed (xfsprogs)")
	}
	w := newWorld(t, false) // the home's server runs as root: it attaches loop devices
	w.agentExtra = `fragment_filesystem = "xfs-loop"`
	w.writeConfig("")
	ssd := filepath.Join(w.home, "ssd")
	script := w.script("xfs.sh", `#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=1GiB
set -u
awk -v p="`+ssd+`/fragment/" 'index($2, p) == 1 && $3 == "xfs" && $1 ~ /^\/dev\/loop/ { print "fragment-fs", $3, $4 }' /proc/mounts
head -c 64M /dev/urandom > /tmp/xfsjob.$$ || exit 3
cp /tmp/xfsjob.$$ "$DW_JOB_STRIPED/data" && sync "$DW_JOB_STRIPED/data" || exit 4
cmp /tmp/xfsjob.$$ "$DW_JOB_STRIPED/data" && echo read-back-ok
rm -f /tmp/xfsjob.$$
df -B1 --output=size "$DW_JOB_STRIPED" | tail -1
dd if=/dev/zero of="$DW_JOB_STRIPED/big" bs=1M count=1100 2>&1 | grep -i space
exit 7
`)
	r := w.run("run", script)
	if r.code != 7 {
		t.Fatalf("want the job's status 7: %s", r)
	}
	mustContain(t, r, "fragment-fs xfs", "nodev", "nosuid", "noexec", "read-back-ok", "1073741824", "No space left on device")
	if out, _ := exec.Command("losetup", "-l", "-n", "-O", "BACK-FILE").Output(); strings.Contains(string(out), ssd) {
		t.Errorf("loop devices left on the home's images:\n%s", out)
	}
	if m := mountsUnder(ssd); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if imgs, _ := os.ReadDir(filepath.Join(ssd, "fragment", "images")); len(imgs) > 0 {
		t.Errorf("images left: %v", imgs)
	}
	frags, err := os.ReadDir(filepath.Join(ssd, "fragment"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range frags {
		if e.Name() != "images" {
			t.Errorf("fragment %s left on the SSD path", e.Name())
		}
	}
}
