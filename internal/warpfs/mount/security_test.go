package mount

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/swaprace"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// swapRaceDuration is how long each attack runs. The path-based server this replaced lost a
// root-owned file's mode within a second of it.
const swapRaceDuration = 3 * time.Second

// A hostile ordinary user swaps a directory of their own instance with a symbolic link to a
// root-owned directory outside it, while chmod, truncate and create race through the mount
// (package swaprace). The root server must never act outside the instance: the victim's file
// keeps its mode and contents, and nothing appears beside it. With one mount, and with the
// swap on one mount and the victims' operations on a second mount of the same namespace.
func TestSymlinkSwapCannotLeaveTheInstance(t *testing.T) {
	eachBackend(t, func(t *testing.T, b testBackend) {
		for _, mounts := range []int{1, 2} {
			t.Run(map[int]string{1: "one mount", 2: "two mounts"}[mounts], func(t *testing.T) {
				testSymlinkSwap(t, b, mounts)
			})
		}
	})
}

func testSymlinkSwap(t *testing.T, b testBackend, mounts int) {
	if b.shards > 1 {
		// The server code under attack is the striped backends'; what differs is the router.
		t.Skip("max_mds refuses the attack's swap, RENAME_EXCHANGE of a directory with a symbolic link (EXDEV)")
	}
	src, mp := dirs(t)
	if err := os.Chown(src, 65534, 65534); err != nil { // the namespace root is the job user's
		t.Fatal(err)
	}
	victim := filepath.Join(filepath.Dir(src), "victim") // root's, outside the instance
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	secret := []byte("root's file: mode 600, never truncated\n")
	target := filepath.Join(victim, swaprace.TargetName)
	if err := os.WriteFile(target, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	tr := usage.New("instance 9", 64*mib)
	spec := Spec{MountPath: mp, SourceDir: src, Tracker: tr, AllowOther: true, Logger: quietLogger(t)}
	first := b.mount(t, spec)
	through := ""
	if mounts == 2 {
		second := spec
		second.MountPath = filepath.Join(filepath.Dir(mp), "42_second")
		through = b.mount(t, second).Path()
	}

	encoded, _ := json.Marshal(swaprace.Spec{Work: first.Path(), Through: through, Victim: victim, Duration: swapRaceDuration})
	cmd := exec.Command(runnableByNobody(t))
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/", attackEnv + "=" + string(encoded)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the attacker (as nobody): %v: %s", err, out)
	}
	var rep swaprace.Report
	if err := json.Unmarshal(bytes.TrimSpace(out), &rep); err != nil {
		t.Fatalf("the attacker's report %q: %v", out, err)
	}
	t.Logf("attack through the mount as nobody for %s: %s", swapRaceDuration, rep)
	if rep.Exchanges < 10 || rep.Chmods < 10 || rep.Creates < 10 {
		t.Fatalf("the attack did not run (%s): the test would prove nothing", rep)
	}

	st := statOf(t, target)
	if st.Mode&0o7777 != 0o600 || st.Uid != 0 {
		t.Errorf("root's file outside the instance has mode %o owner %d after the attack, want 600 and root", st.Mode&0o7777, st.Uid)
	}
	if data, err := os.ReadFile(target); err != nil || !bytes.Equal(data, secret) {
		t.Errorf("root's file outside the instance holds %q (%v) after the attack, want it unchanged", data, err)
	}
	entries, err := os.ReadDir(victim)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != swaprace.TargetName {
			t.Errorf("the attack created %s in root's directory outside the instance", filepath.Join(victim, e.Name()))
		}
	}
}
