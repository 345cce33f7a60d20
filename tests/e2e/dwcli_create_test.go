package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// DataWarp's manual walk-through on daemons: dwcli create session, instance, configuration
// with --root-permissions 2770 and a group, activation; the mounted root on the compute node
// has that mode, owner and group, and a file made in it takes the group (setgid); dwcli rm
// session leaves nothing (issue 23 item 7).
func TestDwcliCreateWalkThroughOnDaemons(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()
	ctx := context.Background()
	admin := func(want string, args ...string) {
		t.Helper()
		r := spillway(t, cmdOpts{}, append([]string{"dwcli", "--config", c.config}, args...)...)
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("dwcli %s: %s\nwant %q", strings.Join(args, " "), r, want)
		}
	}
	admin("create request for sessions entity with id = 1 accepted", "create", "session", "--token", "byhand", "--owner", "0", "--group", "0", "--hosts", "storage1")
	admin("create request for instances entity with id = 1 accepted", "create", "instance", "--session", "1", "--capacity", "1GiB", "--pool", "wlm_pool")
	admin("create request for configurations entity with id = 1 accepted", "create", "configuration", "--instance", "1", "--access-mode", "stripe", "--root-permissions", "2770", "--group", "4242")
	admin("create request for activations entity with id = 1 accepted", "create", "activation", "--session", "1", "--configuration", "1", "--mount", "byhand")
	mount := ""
	c.waitFor("the activation", func() bool {
		a, err := c.client.All(ctx)
		if err != nil || len(a.Activations) != 1 || !a.Activations[0].State.Actualized {
			return false
		}
		mount = a.Activations[0].Mount
		return true
	})
	if filepath.Base(mount) != "byhand" {
		t.Errorf("mounted at %s", mount)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(mount, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o2770 || st.Uid != 0 || st.Gid != 4242 {
		t.Errorf("the instance root at %s: mode %o uid %d gid %d, want 2770 0 4242", mount, st.Mode&0o7777, st.Uid, st.Gid)
	}
	if err := os.WriteFile(filepath.Join(mount, "f"), []byte("x"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(filepath.Join(mount, "f"), &st); err != nil || st.Gid != 4242 {
		t.Errorf("a file in the setgid root: gid %d, want 4242 (%v)", st.Gid, err)
	}
	admin("delete request for sessions entity with id = 1 done", "rm", "session", "-i", "1", "--hurry")
	c.waitFor("no session", func() bool {
		a, err := c.client.All(ctx)
		return err == nil && len(a.Sessions) == 0 && len(a.Fragments) == 0 && len(a.Activations) == 0
	})
	c.assertClean()
}
