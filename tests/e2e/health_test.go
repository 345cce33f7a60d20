package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/views"
)

// node returns the controller's view of one node.
func (c *cluster) node(name string) views.Node {
	c.t.Helper()
	all, err := c.client.All(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	for _, n := range all.Nodes {
		if n.ID == name {
			return n
		}
	}
	c.t.Fatalf("no node %s", name)
	return views.Node{}
}

// dwstatNode is the row of dwstat nodes for a node, its fields squeezed.
func (c *cluster) dwstatNode(name string) string {
	c.t.Helper()
	r := spillway(c.t, cmdOpts{}, "dwstat", "--config", c.config, "nodes")
	for _, line := range strings.Split(r.stdout, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == name {
			return strings.Join(f, " ")
		}
	}
	c.t.Fatalf("dwstat nodes has no %s: %s", name, r)
	return ""
}

// A persistent instance given an expiration is torn down when it comes, as
// destroy_persistent would: its session, instance and fragments go, and the fragment's
// directory leaves the storage node's SSD. dwstat shows the expiration meanwhile.
func TestExpiredPersistentInstanceIsTornDown(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()
	fragments := func() int { d, _ := os.ReadDir(filepath.Join(c.dir, "ssd", "fragment")); return len(d) }
	at := time.Now().Add(10 * 24 * time.Hour).Format("2006-01-02T15:04:05") // local, as dwstat prints it
	r := spillway(t, cmdOpts{}, "persistent", "create", "--config", c.config, "longlived", "--capacity", "1GiB", "--expiration", at)
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	r = spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "sessions", "instances")
	if strings.Contains(r.stdout, "never") || strings.Count(r.stdout, at) != 2 {
		t.Fatalf("dwstat sessions and instances must show the expiration: %s", r)
	}
	r = spillway(t, cmdOpts{}, "persistent", "create", "--config", c.config, "shortlived", "--capacity", "1GiB", "--expiration", "2s")
	if r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	c.waitFor("the expired persistent instance to be torn down", func() bool {
		all, err := c.client.All(context.Background())
		return err == nil && len(all.Sessions) == 1 && all.Sessions[0].Token == "longlived" && len(all.Fragments) == 1
	})
	if n := fragments(); n != 1 {
		t.Fatalf("%d fragment directories on the SSD: the expired instance's must be gone, the other's kept", n)
	}
	if r := spillway(t, cmdOpts{}, "persistent", "destroy", "--config", c.config, "longlived"); r.code != 0 {
		t.Fatalf("destroy: %s", r)
	}
	c.assertClean()
	// A lifetime past the site's maximum is refused, naming the key.
	c.stopController()
	c.configure("controller", "max_persistent_expiration = \"1h\"\n")
	c.startController()
	r = spillway(t, cmdOpts{}, "persistent", "create", "--config", c.config, "toolong", "--capacity", "1GiB", "--expiration", "2h")
	if r.code == 0 || !strings.Contains(r.stderr, "controller.max_persistent_expiration") {
		t.Fatalf("an expiration past the maximum must be refused naming the key: %s", r)
	}
}

// A storage node whose SSD reports less remaining endurance than controller.endurance_threshold
// (here through agent.endurance_file) takes no new fragments, and dwstat nodes says why; when
// the wear reported is back within bounds (a new SSD), it takes them again.
func TestWornNodeTakesNoNewInstances(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	wear := filepath.Join(c.dir, "wear")
	os.WriteFile(wear, []byte("95\n"), 0o644) // 5% remaining
	c.configure("agent", "endurance_file = \""+wear+"\"\nendurance_interval = \"100ms\"\n")
	c.startController()
	c.startAgent()
	c.waitFor("the node to be worn", func() bool { return c.node("storage1").Worn })
	row := c.dwstatNode("storage1")
	if !strings.Contains(row, "online worn") || !strings.Contains(row, " 5% SSD endurance 5% remaining, below controller.endurance_threshold") {
		t.Fatalf("dwstat nodes: %q", row)
	}
	r := spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "--json", "nodes")
	var js struct{ Nodes []views.Node }
	json.Unmarshal([]byte(r.stdout), &js)
	if len(js.Nodes) == 0 || js.Nodes[0].Endurance == nil || js.Nodes[0].Endurance.PercentRemaining != 5 || js.Nodes[0].Endurance.Source != "file "+wear {
		t.Fatalf("dwstat --json nodes: %s", r.stdout)
	}
	r = spillway(t, cmdOpts{}, "persistent", "create", "--config", c.config, "p1", "--capacity", "1GiB")
	if r.code == 0 || !strings.Contains(r.stderr, "storage1 SSD worn") {
		t.Fatalf("a new instance must not go to the worn node, saying why: %s", r)
	}
	os.WriteFile(wear, []byte("2\n"), 0o644) // the SSD was replaced
	c.waitFor("the node to be usable again", func() bool { return !c.node("storage1").Worn })
	if r := spillway(t, cmdOpts{}, "persistent", "create", "--config", c.config, "p1", "--capacity", "1GiB"); r.code != 0 {
		t.Fatalf("create on the new SSD: %s", r)
	}
	if row := c.dwstatNode("storage1"); !strings.Contains(row, "online fill") || !strings.Contains(row, " 98% -") {
		t.Fatalf("dwstat nodes: %q", row)
	}
}

// Repeated failures to make fragments on a node (its SSD path refuses new directories) drain
// it automatically, with the reason in dwstat nodes and the controller's log; an
// administrator returns it to service with dwcli update node --fill.
func TestRepeatedFragmentFailuresDrainTheNode(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("chattr"); err != nil {
		t.Skip("chattr (e2fsprogs) is not installed")
	}
	c := newCluster(t)
	c.configure("controller", "auto_drain_failures = 3\n")
	c.startController()
	c.startAgent()
	fragDir := filepath.Join(c.dir, "ssd", "fragment")
	// An immutable directory refuses new entries, even root's: every fragment creation fails
	// on the node, as on an SSD gone read-only.
	if out, err := exec.Command("chattr", "+i", fragDir).CombinedOutput(); err != nil {
		t.Skipf("chattr +i %s: %v %s (the file system has no immutable flag)", fragDir, err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", fragDir).Run() })
	if err := c.client.Setup(context.Background(), persistentRequest("doomed")); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the node to be drained", func() bool { return c.node("storage1").Drain })
	n := c.node("storage1")
	if !n.AutoDrained || !strings.HasPrefix(n.Reason, "auto-drained: 3 failures in 10m: create-fragment: ") {
		t.Fatalf("reason %q", n.Reason)
	}
	if row := c.dwstatNode("storage1"); !strings.Contains(row, "online drain") || !strings.Contains(row, "auto-drained: 3 failures in 10m") {
		t.Fatalf("dwstat nodes: %q", row)
	}
	if log, _ := os.ReadFile(filepath.Join(c.dir, "controller.log")); !strings.Contains(string(log), "node drained") {
		t.Errorf("the controller's log must say the node was drained:\n%s", log)
	}
	if r := spillway(t, cmdOpts{}, "persistent", "create", "--config", c.config, "next", "--capacity", "1GiB"); r.code == 0 || !strings.Contains(r.stderr, "storage1 drained") {
		t.Fatalf("a drained node takes no new instance: %s", r)
	}
	// The administrator fixes the disk and returns the node to service.
	exec.Command("chattr", "-i", fragDir).Run()
	if r := spillway(t, cmdOpts{}, "persistent", "destroy", "--config", c.config, "doomed", "--hurry"); r.code != 0 {
		t.Fatalf("destroy: %s", r)
	}
	if r := spillway(t, cmdOpts{}, "dwcli", "--config", c.config, "update", "node", "--name", "storage1", "--fill"); r.code != 0 {
		t.Fatalf("dwcli update node --fill: %s", r)
	}
	if n := c.node("storage1"); n.Drain || n.AutoDrained || n.Reason != "" || n.RecentFailures != 0 {
		t.Fatalf("--fill must clear the auto-drain and its failures: %+v", n)
	}
	if r := spillway(t, cmdOpts{}, "persistent", "create", "--config", c.config, "next", "--capacity", "1GiB"); r.code != 0 {
		t.Fatalf("create after --fill: %s", r)
	}
	spillway(t, cmdOpts{}, "persistent", "destroy", "--config", c.config, "next")
	c.assertClean()
}

func persistentRequest(name string) lifecycle.Setup {
	return lifecycle.Setup{Token: name, Creator: "CLI", Owner: 0, Group: 0, Persistent: true,
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}
}
