package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/views"
)

// accountingLog reads the cluster's accounting log (controller.accounting_log's default,
// accounting.log in the state directory), one record a line.
func (c *cluster) accountingLog() []views.Accounting {
	c.t.Helper()
	raw, err := os.ReadFile(filepath.Join(c.dir, "state", "accounting.log"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		c.t.Fatal(err)
	}
	var out []views.Accounting
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if line == "" {
			continue
		}
		var a views.Accounting
		if err := json.Unmarshal([]byte(line), &a); err != nil {
			c.t.Fatalf("accounting log line %q: %v", line, err)
		}
		out = append(out, a)
	}
	return out
}

// recordsOf are the log's records of a session token.
func recordsOf(log []views.Accounting, token string) []views.Realm {
	var out []views.Realm
	for _, a := range log {
		if a.Realm.Token == token {
			out = append(out, a.Realm)
		}
	}
	return out
}

// within reports whether got is within 1% of want.
func within(got, want uint64) bool {
	d := float64(got) - float64(want)
	return d <= float64(want)/100 && -d <= float64(want)/100
}

// TestAccountingMatchesWhatTheJobWrote (issue 13 item 2): a job writes N bytes through its
// mount in files of its own, reads some back and creates K more empty files; its instance's
// accounting — live from the API while it runs, and the record the teardown appends to the
// accounting log, once — counts them within 1%, with the stage-in's and stage-out's bytes,
// per storage node and per compute node; the node's bytes_written (endurance) grew by them.
//
// The counters come from the data path (agentapi.NodeReport.Usage, filled by the storage
// node's server).
func TestAccountingMatchesWhatTheJobWrote(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()
	ctx := context.Background()
	const token = "77"
	const (
		files    = 4
		fileSize = 4 << 20
		written  = files * fileSize
		read     = 2 * fileSize
		empty    = 5
	)
	in := filepath.Join(c.dir, "pfs", "in.bin")
	inData := bytes.Repeat([]byte("i"), 64<<10)
	os.WriteFile(in, inData, 0o644)
	out := filepath.Join(c.dir, "pfs", "out.bin")
	setup := lifecycle.Setup{Token: token, Creator: "TEST", Owner: 0, Group: 0,
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}
	c.step(token, lifecycle.PhaseSetup, func() error { return c.client.Setup(ctx, setup) })
	c.step(token, lifecycle.PhaseDataIn, func() error {
		return c.client.Stages(ctx, token, "in", []lifecycle.StageRequest{{Type: "file", PFSPath: in, DWVar: "DW_JOB_STRIPED", DWPath: "/in.bin"}})
	})
	c.step(token, lifecycle.PhasePreRun, func() error { return c.client.PreRun(ctx, token, []string{"storage1"}) })
	env, err := c.client.Paths(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	mount := env["DW_JOB_STRIPED"]
	block := bytes.Repeat([]byte("w"), fileSize)
	for i := range files {
		if err := os.WriteFile(fmt.Sprintf("%sdata%d", mount, i), block, 0o644); err != nil {
			t.Fatalf("the job cannot write: %v", err)
		}
	}
	for i := range 2 {
		if b, err := os.ReadFile(fmt.Sprintf("%sdata%d", mount, i)); err != nil || len(b) != fileSize {
			t.Fatalf("the job cannot read back: %d bytes, %v", len(b), err)
		}
	}
	for i := range empty {
		f, err := os.Create(fmt.Sprintf("%sempty%d", mount, i))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}

	// The live record, once a heartbeat carried the counters of the job's writes.
	var live views.Accounting
	counted := false
	for range 50 { // 50 heartbeat intervals (agent.heartbeat_interval 200ms)
		live, err = c.client.SessionAccounting(ctx, token)
		if err != nil {
			t.Fatal(err)
		}
		if live.Realm.Updated > 0 && live.Realm.BytesWritten >= written {
			counted = true
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !counted {
		t.Fatalf("the live record never counted the %d bytes written (updated %d: 0 = no counters came with the heartbeats): %+v", written, live.Realm.Updated, live.Realm)
	}
	r := live.Realm
	if !within(r.BytesWritten, written) || !within(r.BytesRead, read) {
		t.Errorf("live: written %d read %d, want %d and %d within 1%%", r.BytesWritten, r.BytesRead, written, read)
	}
	if r.FilesCreated < files+empty || r.FilesCreated > files+empty+1 { // +1: the staged-in file, if the data path made it
		t.Errorf("live: files created %d, want %d (or one more, the staged-in file)", r.FilesCreated, files+empty)
	}
	if r.WriteOps == 0 || r.ReadOps == 0 || !within(r.CapacityUsed, written+uint64(len(inData))) || r.CapacityMax < r.CapacityUsed {
		t.Errorf("live: ops %d/%d, capacity used %d (want %d within 1%%), peak %d", r.WriteOps, r.ReadOps, r.CapacityUsed, written+len(inData), r.CapacityMax)
	}
	if r.StageBytesIn != uint64(len(inData)) || r.ServerCount != 1 || len(r.Fragments) != 1 || r.Fragments[0].ServerHostname != "storage1" {
		t.Errorf("live: stage bytes in %d (want %d), servers %d, fragments %+v", r.StageBytesIn, len(inData), r.ServerCount, r.Fragments)
	}
	if len(r.Clients) != 1 || r.Clients[0].Node != "storage1" || !within(r.Clients[0].BytesWritten, written) {
		t.Errorf("live: the compute node's share: %+v", r.Clients)
	}
	if len(r.Namespaces) != 1 || !within(r.Namespaces[0].BytesWritten, written) || r.Namespaces[0].StageBytesWritten != uint64(len(inData)) {
		t.Errorf("live: namespaces %+v", r.Namespaces)
	}

	// Stage out one file, tear down: one record in the log, the final counters.
	c.step(token, lifecycle.PhasePostRun, func() error { return c.client.PostRun(ctx, token) })
	c.step(token, lifecycle.PhaseDataOut, func() error {
		return c.client.Stages(ctx, token, "out", []lifecycle.StageRequest{{Type: "file", PFSPath: out, DWVar: "DW_JOB_STRIPED", DWPath: "/data0"}})
	})
	c.step(token, lifecycle.PhaseTeardown, func() error { return c.client.Teardown(ctx, token, false) })
	var recs []views.Realm
	c.waitFor("the accounting record", func() bool { recs = recordsOf(c.accountingLog(), token); return len(recs) > 0 })
	if len(recs) != 1 {
		t.Fatalf("%d records of the job, want 1", len(recs))
	}
	rec := recs[0]
	if !rec.Final || rec.Ended == 0 || rec.RecordID == "" {
		t.Errorf("record: final %v ended %d id %q", rec.Final, rec.Ended, rec.RecordID)
	}
	if !within(rec.BytesWritten, written) || !within(rec.BytesRead, read+fileSize) && !within(rec.BytesRead, read) {
		t.Errorf("record: written %d read %d, want %d and %d (or %d with the stage-out's reads) within 1%%", rec.BytesWritten, rec.BytesRead, written, read, read+fileSize)
	}
	if rec.StageBytesIn != uint64(len(inData)) || rec.StageBytesOut != fileSize {
		t.Errorf("record: stage bytes in %d out %d, want %d and %d", rec.StageBytesIn, rec.StageBytesOut, len(inData), fileSize)
	}
	if rec.FilesCreated != r.FilesCreated || !within(rec.BytesWritten, r.BytesWritten) {
		t.Errorf("record and live API differ: files %d/%d written %d/%d", rec.FilesCreated, r.FilesCreated, rec.BytesWritten, r.BytesWritten)
	}
	all, err := c.client.All(ctx)
	if err != nil || len(all.Nodes) != 1 || all.Nodes[0].Written < rec.BytesWritten {
		t.Errorf("the node's bytes_written (endurance) %+v, want at least %d: %v", all.Nodes, rec.BytesWritten, err)
	}
	c.assertClean()
}

// TestAccountingRecordAtTeardown: the teardown writes one record per instance with what the
// controller knows besides the counters (the instance, its session, its server and
// namespace, the stages' bytes), once per instance.
func TestAccountingRecordAtTeardown(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()
	c.runJob("5")
	c.runJob("6")
	c.waitFor("two records", func() bool { return len(c.accountingLog()) >= 2 })
	for _, token := range []string{"5", "6"} {
		recs := recordsOf(c.accountingLog(), token)
		if len(recs) != 1 {
			t.Fatalf("job %s: %d records, want 1", token, len(recs))
		}
		r := recs[0]
		payload := uint64(len("payload " + token + "\n"))
		if r.ServerCount != 1 || r.NamespaceCount != 1 || r.Fragments[0].ServerHostname != "storage1" || r.StageBytesIn != payload ||
			r.StageBytesOut != uint64(len("result "+token+"\n")) || r.Capacity != 1<<30 || !r.Final || r.Namespaces[0].StageBytesWritten != payload {
			t.Errorf("job %s: record %+v", token, r)
		}
	}
	r := spillway(t, cmdOpts{}, "dwstat", "--config", c.config, "accounting")
	mustContain(t, r, "no accounting")
}

// TestAccountingAcrossHosts (issue 13 item 2): a striped instance on two storage nodes, two
// compute nodes writing and reading over the network. The record has a share per storage
// node (each held a stripe of what was written) and per compute node (what each wrote and
// read), each within 1% of what the jobs did, live and in the log at teardown.
func TestAccountingAcrossHosts(t *testing.T) {
	storage := []string{"hosta", "hostc"}
	c := newNetClusterOf(t, storage, []string{"hostb", "hoste"})
	c.start("ctl")
	for _, h := range append(storage, "hostb", "hoste") {
		c.start(h)
	}
	job := c.jobFile("acct.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=2GiB\n\x00")
	nodes := c.jobFile("acct.nodes", "hostb\nhoste\n")
	c.wlm("--function", "job_process", "--job", job)
	c.wlm("--function", "setup", "--token", "90", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:2GiB", "--job", job)
	c.wlm("--function", "pre_run", "--token", "90", "--job", job, "--nodehostnamefile", nodes)
	mount := c.jobPath("90", job, "DW_JOB_STRIPED")
	// hostb writes 16 MiB (two 8 MiB stripes: one on each server), hoste 8 MiB, and hostb
	// reads hoste's file back.
	c.mustRun(t, "hostb", "dd if=/dev/zero of="+mount+"/b bs=1M count=16 status=none")
	c.mustRun(t, "hoste", "dd if=/dev/zero of="+mount+"/e bs=1M count=8 status=none")
	c.mustRun(t, "hostb", "cat "+mount+"/e > /dev/null")
	const mib = 1 << 20
	check := func(what string, r views.Realm) {
		t.Helper()
		if r.ServerCount != 2 || len(r.Fragments) != 2 || !within(r.BytesWritten, 24*mib) || !within(r.BytesRead, 8*mib) || r.FilesCreated != 2 {
			t.Errorf("%s: servers %d, written %d (want 24 MiB), read %d (want 8 MiB), files %d (want 2)", what, r.ServerCount, r.BytesWritten, r.BytesRead, r.FilesCreated)
		}
		for _, f := range r.Fragments {
			if f.BytesWritten < 8*mib*99/100 || (f.ServerHostname != "hosta" && f.ServerHostname != "hostc") {
				t.Errorf("%s: storage node %s wrote %d, want a stripe (8 MiB) at least", what, f.ServerHostname, f.BytesWritten)
			}
		}
		clients := map[string]views.RealmClient{}
		for _, cl := range r.Clients {
			clients[cl.Node] = cl
		}
		if b, e := clients["hostb"], clients["hoste"]; len(clients) != 2 || !within(b.BytesWritten, 16*mib) || !within(b.BytesRead, 8*mib) ||
			!within(e.BytesWritten, 8*mib) || e.BytesRead > mib/100 || b.FilesCreated != 1 || e.FilesCreated != 1 {
			t.Errorf("%s: compute nodes' shares %+v, want hostb 16 MiB written and 8 MiB read, hoste 8 MiB written", what, r.Clients)
		}
		// The namespace's file-system bytes, summed over the servers holding its files' stripes.
		var nsWritten, nsRead uint64
		for _, n := range r.Namespaces {
			nsWritten += n.BytesWritten
			nsRead += n.BytesRead
		}
		if !within(nsWritten, 24*mib) || !within(nsRead, 8*mib) {
			t.Errorf("%s: namespaces' bytes written %d read %d, want 24 MiB and 8 MiB: %+v", what, nsWritten, nsRead, r.Namespaces)
		}
	}
	// Read at once, as a job reads its own accounting: the storage nodes are asked now, not
	// the last heartbeat's figures (issue 23 item 9).
	live, err := c.client.SessionAccounting(context.Background(), "90")
	if err != nil {
		t.Fatal(err)
	}
	if !live.Realm.Current || len(live.Realm.StaleNodes) != 0 {
		t.Errorf("live record: current %v, stale nodes %v", live.Realm.Current, live.Realm.StaleNodes)
	}
	check("live", live.Realm)
	c.wlm("--function", "post_run", "--token", "90", "--job", job)
	c.wlm("--function", "teardown", "--token", "90", "--job", job)
	var recs []views.Realm
	c.waitFor("the accounting record", func() bool {
		raw, _ := os.ReadFile(filepath.Join(c.dir, "state", "accounting.log"))
		recs = nil
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			var a views.Accounting
			if json.Unmarshal([]byte(line), &a) == nil && a.Realm.Token == "90" {
				recs = append(recs, a.Realm)
			}
		}
		return len(recs) > 0
	})
	if len(recs) != 1 || !recs[0].Final {
		t.Fatalf("records of the job: %+v, want one, final", recs)
	}
	check("record", recs[0])
	c.assertClean()
}

// TestAccountingCountsReplacedInJobStages: a job stages the same file out twice in-job
// (libdatawarp's checkpoint pattern: the second request replaces the first); the instance's
// stage_bytes_out counts both, live and in the teardown record.
func TestAccountingCountsReplacedInJobStages(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	c.startController()
	c.startAgent()
	ctx := context.Background()
	const token, size = "88", 1 << 20
	setup := lifecycle.Setup{Token: token, Creator: "TEST", Owner: 0, Group: 0,
		Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}}
	c.step(token, lifecycle.PhaseSetup, func() error { return c.client.Setup(ctx, setup) })
	c.step(token, lifecycle.PhasePreRun, func() error { return c.client.PreRun(ctx, token, []string{"storage1"}) })
	env, err := c.client.Paths(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(env["DW_JOB_STRIPED"]+"ckpt", bytes.Repeat([]byte("c"), size), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, out := range []string{"ckpt.1", "ckpt.2"} {
		req := lifecycle.InJobStage{Direction: "out", Type: "file", DWVar: "DW_JOB_STRIPED", DWPath: "/ckpt", PFSPath: filepath.Join(c.dir, "pfs", out)}
		if err := c.client.JobStages(ctx, token, []lifecycle.InJobStage{req}); err != nil {
			t.Fatalf("stage-out %d: %v", i+1, err)
		}
		c.waitFor("the stage-out", func() bool {
			q, err := c.client.QueryJobStages(ctx, token, "DW_JOB_STRIPED", "/ckpt")
			return err == nil && q.Counts.Complete == 1 && q.Counts.Pending == 0
		})
	}
	live, err := c.client.SessionAccounting(ctx, token)
	if err != nil || live.Realm.StageBytesOut != 2*size || len(live.Realm.Namespaces) != 1 || live.Realm.Namespaces[0].StageBytesRead != 2*size {
		t.Fatalf("live: stage bytes out %d (want %d, both stage-outs), namespaces %+v: %v", live.Realm.StageBytesOut, 2*size, live.Realm.Namespaces, err)
	}
	c.step(token, lifecycle.PhasePostRun, func() error { return c.client.PostRun(ctx, token) })
	c.step(token, lifecycle.PhaseTeardown, func() error { return c.client.Teardown(ctx, token, false) })
	var recs []views.Realm
	c.waitFor("the accounting record", func() bool { recs = recordsOf(c.accountingLog(), token); return len(recs) > 0 })
	if len(recs) != 1 || recs[0].StageBytesOut != 2*size || recs[0].Namespaces[0].StageBytesRead != 2*size {
		t.Fatalf("records: %+v, want one with %d bytes staged out", recs, 2*size)
	}
	c.assertClean()
}
