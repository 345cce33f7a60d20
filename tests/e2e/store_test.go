package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/etcd/etcdtest"
)

// setStore replaces the cluster's [store] section (the daemons read it at start).
func (c *cluster) setStore(section string) {
	c.t.Helper()
	cfg, err := os.ReadFile(c.config)
	if err != nil {
		c.t.Fatal(err)
	}
	text, _, _ := strings.Cut(string(cfg), "[store]\n")
	if err := os.WriteFile(c.config, []byte(text+"[store]\n"+section), 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// TestEtcdEngine runs a job with the controller's state in a real etcd; takes a backup with
// `spillway admin backup` while the controller runs; restores it into SQLite (refused a second
// time unless forced) and runs the next job with the controller on the restored state, the
// same agent carrying on (the state's cluster id came along).
func TestEtcdEngine(t *testing.T) {
	requireRoot(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	c := newCluster(t)
	c.setStore("engine = \"etcd\"\netcd_endpoints = [\"" + srv.Endpoint + "\"]\netcd_prefix = \"/spillway/e2e/\"\n")
	c.startController()
	c.startAgent()
	start := time.Now()
	c.runJob("200")
	t.Logf("a job's setup to teardown on etcd: %v", time.Since(start))
	c.assertClean()
	if _, err := os.Stat(filepath.Join(c.dir, "state", "state.db")); err == nil {
		t.Fatal("the controller on etcd wrote a SQLite database")
	}

	// Online backup: the controller keeps running.
	backup := filepath.Join(c.dir, "backup.json")
	r := spillway(t, cmdOpts{}, "admin", "backup", "--config", c.config, "-o", backup)
	if r.code != 0 || !strings.Contains(r.stderr, "from etcd "+srv.Endpoint+" prefix /spillway/e2e/") {
		t.Fatalf("spillway admin backup: %s", r)
	}
	raw, err := os.ReadFile(backup)
	if err != nil {
		t.Fatal(err)
	}
	b, err := store.ReadBackup(raw)
	if err != nil {
		t.Fatal(err)
	}
	if b.SchemaVersion != store.SchemaVersion || b.ClusterID == "" || b.Engine != "etcd" || b.Sequences["session"] != 1 {
		t.Fatalf("backup: schema %d, cluster id %q, engine %q, sequences %v", b.SchemaVersion, b.ClusterID, b.Engine, b.Sequences)
	}
	var node struct {
		Name string `json:"id"`
	}
	if len(b.Kinds["node"]) != 1 || json.Unmarshal(b.Kinds["node"][0].Value, &node) != nil || node.Name != "storage1" {
		t.Fatalf("the backup's nodes: %+v", b.Kinds["node"])
	}
	if r := spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "nodes"); r.code != 0 {
		t.Fatalf("the controller after the backup: %s", r)
	}

	// Restore into SQLite (the cluster's state_dir, unused on etcd), from the file and again.
	c.stopController()
	c.setStore("engine = \"sqlite\"\n")
	r = spillway(t, cmdOpts{}, "admin", "restore", "--config", c.config, backup)
	if r.code != 0 || !strings.Contains(r.stdout, "restored") || !strings.Contains(r.stdout, b.ClusterID) {
		t.Fatalf("spillway admin restore: %s", r)
	}
	r = spillway(t, cmdOpts{}, "admin", "restore", "--config", c.config, backup)
	if r.code != 1 || !strings.Contains(r.stderr, "the store is not empty") || !strings.Contains(r.stderr, "--force") {
		t.Fatalf("a second restore: %s, want a refusal naming --force", r)
	}
	r = spillway(t, cmdOpts{}, "admin", "restore", "--config", c.config, "--force", backup)
	if r.code != 0 {
		t.Fatalf("spillway admin restore --force: %s", r)
	}
	c.startController()
	start = time.Now()
	c.runJob("201")
	t.Logf("a job's setup to teardown on SQLite: %v", time.Since(start))
	c.assertClean()
	// The ids go on from the backup's sequences.
	r = spillway(t, cmdOpts{}, "admin", "backup", "--config", c.config)
	if r.code != 0 {
		t.Fatalf("spillway admin backup from SQLite: %s", r)
	}
	after, err := store.ReadBackup([]byte(r.stdout))
	if err != nil {
		t.Fatal(err)
	}
	if after.Sequences["session"] != 2 || after.ClusterID != b.ClusterID {
		t.Fatalf("after the restore and a job: session sequence %d (want 2), cluster id %q (want %q)", after.Sequences["session"], after.ClusterID, b.ClusterID)
	}
}

// TestControllerKilledAtEveryStepOnEtcd: the controller killed at each crash point of a job
// resumes it with its state in etcd as it does on SQLite.
func TestControllerKilledAtEveryStepOnEtcd(t *testing.T) {
	requireRoot(t)
	srv := etcdtest.Start(t, etcdtest.Options{})
	n := 0
	controllerKilledAtEveryStep(t, func(c *cluster) {
		n++ // a cluster of its own per run: a prefix of its own
		c.setStore(fmt.Sprintf("engine = \"etcd\"\netcd_endpoints = [%q]\netcd_prefix = \"/spillway/run%d/\"\n", srv.Endpoint, n))
	})
}

// TestDwcliConfigBackup: dwcli config backup keeps the pools and the nodes' drain settings;
// restore puts them back through the API, creates a missing pool and skips an unknown node.
func TestDwcliConfigBackup(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()
	dwcli := func(args ...string) result {
		return spillway(t, cmdOpts{}, append([]string{"dwcli", "--config", c.config}, args...)...)
	}
	if r := dwcli("update", "node", "--name", "storage1", "--drain", "--reason", "disk check"); r.code != 0 {
		t.Fatal(r)
	}
	file := filepath.Join(c.dir, "dwconfig.json")
	if r := dwcli("config", "backup", "-o", file); r.code != 0 {
		t.Fatal(r)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	want := `[map[drain:true id:storage1 pool:wlm_pool reason:disk check]]`
	if got := fmt.Sprint(doc["nodes"]); got != want || fmt.Sprint(doc["pools"]) != "[map[granularity:1.073741824e+09 id:wlm_pool]]" {
		t.Fatalf("dwcli config backup:\n%s", raw)
	}
	if r := dwcli("update", "node", "--name", "storage1", "--fill"); r.code != 0 {
		t.Fatal(r)
	}
	// The file gains a pool this controller lacks and a node it never saw.
	doc["pools"] = append(doc["pools"].([]any), map[string]any{"id": "extra_pool", "granularity": 2 << 30})
	doc["nodes"] = append(doc["nodes"].([]any), map[string]any{"id": "gone", "pool": "wlm_pool", "drain": false})
	raw, _ = json.Marshal(doc)
	os.WriteFile(file, raw, 0o600)
	r := dwcli("config", "restore", file)
	if r.code != 0 {
		t.Fatal(r)
	}
	mustContain(t, r, "pool extra_pool: granularity 2147483648", "node storage1: drain", "node gone: not registered (its agent has not started): skipped")
	mustContain(t, dwcli("ls", "pools"), "extra_pool")
	mustContain(t, spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "nodes"), "storage1 wlm_pool online drain")
}
