package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestStripedAcrossStorageNodes: three storage nodes and two compute nodes, each a host of its
// own. A job's 3 GiB instance is placed on all three storage nodes (1 GiB grains, bandwidth);
// files larger and smaller than a stripe are staged in, written from both compute nodes into
// disjoint and overlapping ranges of one file, read back on both, staged out, and compared by
// checksum; private namespaces are each the compute node's own. Nothing is left behind.
func TestStripedAcrossStorageNodes(t *testing.T) {
	storage := []string{"hosta", "hostc", "hostd"}
	c := newNetClusterOf(t, storage, []string{"hostb", "hoste"})
	c.start("ctl")
	for _, h := range append(storage, "hostb", "hoste") {
		c.start(h)
	}
	pfs := filepath.Join(c.dir, "pfs")
	rng := rand.New(rand.NewSource(10))
	write := func(name string, size int) []byte {
		data := make([]byte, size)
		rng.Read(data)
		p := filepath.Join(pfs, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chown(p, nobodyUID, nobodyGID)
		return data
	}
	big := write("big.in", 20<<20+12345) // several 8 MiB stripes
	small := write("small.in", 1000)
	pieceB := write("piece-b", 6<<20)
	pieceE := write("piece-e", 6<<20)
	overlap := write("piece-overlap", 3<<20)

	job := c.jobFile("striped.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=3GiB\n"+
		"#DW stage_in type=file source="+pfs+"/big.in destination=$DW_JOB_STRIPED/big\n"+
		"#DW stage_in type=file source="+pfs+"/small.in destination=$DW_JOB_STRIPED/small\n"+
		"#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination="+pfs+"/out\n\x00")
	nodes := c.jobFile("striped.nodes", "hostb\nhoste\n")
	c.wlm("--function", "job_process", "--job", job)
	c.wlm("--function", "setup", "--token", "60", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:3GiB", "--job", job)
	for _, h := range storage {
		if f := c.fragments(h); len(f) != 1 {
			t.Errorf("%s holds %d fragments of the 3-grain instance, want 1 (bandwidth spreads the grains)", h, len(f))
		}
	}
	c.wlm("--function", "data_in", "--token", "60", "--job", job)
	// Every storage node staged in the stripes it holds, at once: big's three stripes came
	// one through each (dwstat stages: the bytes each node moved).
	c.assertStagedByEveryServer(t, "$DW_JOB_STRIPED/big", storage, uint64(len(big)))
	mount := c.jobPath("60", job, "DW_JOB_STRIPED")
	c.wlm("--function", "pre_run", "--token", "60", "--job", job, "--nodehostnamefile", nodes)

	run := func(host, script string) string { t.Helper(); return c.mustRun(t, host, script) }
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	// Both nodes see the staged files whole.
	for _, h := range []string{"hostb", "hoste"} {
		out := run(h, "sha256sum "+mount+"/big "+mount+"/small; df -B1 --output=size "+mount+" | tail -1")
		if !strings.Contains(out, sum(big)) || !strings.Contains(out, sum(small)) {
			t.Errorf("%s reads the staged files as:\n%s\nwant %s and %s", h, out, sum(big), sum(small))
		}
		if !strings.Contains(out, fmt.Sprint(3<<30)) {
			t.Errorf("%s: df does not show the 3 GiB instance:\n%s", h, out)
		}
	}
	// The finish step gave the staged file its source's mode and time.
	srcInfo, _ := os.Stat(filepath.Join(pfs, "big.in"))
	if out := run("hostb", "stat -c '%a %Y' "+mount+"/big"); strings.TrimSpace(out) != fmt.Sprintf("644 %d", srcInfo.ModTime().Unix()) {
		t.Errorf("staged-in big: mode and mtime %q, want the source's (644 %d)", out, srcInfo.ModTime().Unix())
	}
	// spillway stripes shows where big's three stripes are: one on each storage node.
	var shown []struct {
		Size    int64 `json:"size"`
		Servers []struct {
			Node  string `json:"node"`
			Bytes int64  `json:"bytes"`
		} `json:"servers"`
	}
	if err := json.Unmarshal([]byte(run("hostb", binary+" stripes --json "+mount+"/big")), &shown); err != nil || len(shown) != 1 {
		t.Fatalf("spillway stripes --json: %v %v", shown, err)
	}
	var held int64
	nodesSeen := map[string]bool{}
	for _, s := range shown[0].Servers {
		held += s.Bytes
		nodesSeen[s.Node] = s.Bytes > 0
	}
	if held != int64(len(big)) || len(nodesSeen) != 3 || !nodesSeen["hosta"] || !nodesSeen["hostc"] || !nodesSeen["hostd"] {
		t.Errorf("spillway stripes: %+v", shown)
	}
	// Two writers at once on disjoint ranges of one file, then an overlapping write.
	run("hostb", "mkdir "+mount+"/out")
	var wg sync.WaitGroup
	for host, seekMiB := range map[string]int{"hostb": 0, "hoste": 9} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := c.onHost(host, fmt.Sprintf("dd if=%s/piece-%s of=%s/out/shared bs=1M seek=%d conv=notrunc status=none",
				pfs, host[4:], mount, seekMiB)).CombinedOutput()
			if err != nil {
				t.Errorf("writer on %s: %v\n%s", host, err, out)
			}
		}()
	}
	wg.Wait()
	run("hoste", fmt.Sprintf("dd if=%s/piece-overlap of=%s/out/shared bs=1M seek=4 conv=notrunc status=none", pfs, mount))
	want := make([]byte, 15<<20)
	copy(want, pieceB)
	copy(want[9<<20:], pieceE)
	copy(want[4<<20:], overlap)
	for _, h := range []string{"hostb", "hoste"} {
		out := run(h, "sha256sum "+mount+"/out/shared; stat -c %s "+mount+"/out/shared")
		if !strings.Contains(out, sum(want)) || !strings.Contains(out, fmt.Sprint(len(want))) {
			t.Errorf("%s reads the shared file as:\n%s\nwant %s, %d bytes", h, out, sum(want), len(want))
		}
	}
	checkCoherentAcrossHosts(t, run, mount, "hostb", "hoste")
	// The stripes are on the storage nodes the stripe map names: big (3 stripes) on all
	// three, the shared file (2) on two, small (1) on one: six objects, on every node.
	total := 0
	for _, h := range storage {
		objects, _ := filepath.Glob(filepath.Join(c.dir, h, "ssd", "fragment", "*", "stripes", "*"))
		if len(objects) == 0 {
			t.Errorf("%s holds no stripe object", h)
		}
		total += len(objects)
	}
	if total != 6 {
		t.Errorf("the storage nodes hold %d stripe objects, want 6", total)
	}
	c.wlm("--function", "post_run", "--token", "60", "--job", job)
	c.wlm("--function", "data_out", "--token", "60", "--job", job)
	if got, err := os.ReadFile(filepath.Join(pfs, "out", "shared")); err != nil || !bytes.Equal(got, want) {
		t.Errorf("staged out: %d bytes (%v), want the %d written", len(got), err, len(want))
	}
	if fi, err := os.Stat(filepath.Join(pfs, "out", "shared")); err != nil || fi.Mode().Perm() != 0o644 || fi.Sys().(*syscall.Stat_t).Uid != nobodyUID {
		t.Errorf("staged out with mode %v (%v), want 0644 and the job's user: the finish step sets them", fi.Mode(), err)
	}
	// The two stripes of the shared file went out through the two nodes holding them.
	c.assertStagedByEveryServer(t, "$DW_JOB_STRIPED/out", storage[:0], uint64(len(want)))
	// Accounting: the stages' traffic is stage traffic, by the storage node it ran on, not a
	// client named after a storage node; the clients are the compute nodes (issue 23 item 9).
	acct, err := c.client.SessionAccounting(context.Background(), "60")
	if err != nil {
		t.Fatal(err)
	}
	var staged uint64
	for _, s := range acct.Realm.StageTraffic {
		if !slices.Contains(storage, s.Node) {
			t.Errorf("stage traffic on %q, not a storage node of the instance", s.Node)
		}
		staged += s.BytesWritten
	}
	if staged < uint64(len(big)) {
		t.Errorf("stage traffic %+v: wrote %d, want at least big's %d bytes staged in", acct.Realm.StageTraffic, staged, len(big))
	}
	for _, cl := range acct.Realm.Clients {
		if cl.Node != "hostb" && cl.Node != "hoste" {
			t.Errorf("accounting client %q: only the compute nodes are clients (%+v)", cl.Node, acct.Realm.Clients)
		}
	}
	c.wlm("--function", "teardown", "--token", "60", "--job", job)
	c.assertClean()

	// Private: each compute node its own namespace, its data striped over every server.
	job = c.jobFile("private.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=private capacity=3GiB\n\x00")
	c.wlm("--function", "setup", "--token", "61", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:3GiB", "--job", job)
	private := c.jobPath("61", job, "DW_JOB_PRIVATE")
	c.wlm("--function", "pre_run", "--token", "61", "--job", job, "--nodehostnamefile", nodes)
	for _, h := range []string{"hostb", "hoste"} {
		run(h, fmt.Sprintf("dd if=%s/big.in of=%s/mine-%s bs=1M status=none", pfs, private, h))
	}
	for _, h := range []string{"hostb", "hoste"} {
		out := run(h, "ls "+private+"; sha256sum "+private+"/mine-"+h)
		if strings.Count(out, "mine-") != 2 || !strings.Contains(out, sum(big)) {
			t.Errorf("%s's private namespace:\n%s", h, out)
		}
	}
	for _, h := range storage {
		objects, _ := filepath.Glob(filepath.Join(c.dir, h, "ssd", "fragment", "*", "stripes", "*"))
		if len(objects) != 2 {
			t.Errorf("%s holds %d stripe objects of the two private files, want 2", h, len(objects))
		}
	}
	c.wlm("--function", "post_run", "--token", "61", "--job", job)
	c.wlm("--function", "teardown", "--token", "61", "--job", job)
	c.assertClean()

	// Loadbalance: a replica on every storage node, each staged in by its own node; both
	// compute nodes read the file whole.
	job = c.jobFile("lb.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=loadbalance capacity=3GiB\n"+
		"#DW stage_in type=file source="+pfs+"/big.in destination=$DW_JOB_LDBAL/big\n\x00")
	c.wlm("--function", "setup", "--token", "63", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:3GiB", "--job", job)
	c.wlm("--function", "data_in", "--token", "63", "--job", job)
	for _, h := range storage {
		copies, _ := filepath.Glob(filepath.Join(c.dir, h, "ssd", "fragment", "*", "namespace", "*", "big"))
		if len(copies) != 1 || !bytes.Equal(mustRead(t, copies[0]), big) {
			t.Errorf("%s holds %d replicas of the staged file, want 1 whole", h, len(copies))
		}
	}
	lb := c.jobPath("63", job, "DW_JOB_LDBAL")
	c.wlm("--function", "pre_run", "--token", "63", "--job", job, "--nodehostnamefile", nodes)
	for _, h := range []string{"hostb", "hoste"} {
		if out := run(h, "sha256sum "+lb+"/big"); !strings.Contains(out, sum(big)) {
			t.Errorf("%s reads the loadbalance replica as %s", h, out)
		}
	}
	c.wlm("--function", "post_run", "--token", "63", "--job", job)
	c.wlm("--function", "teardown", "--token", "63", "--job", job)
	c.assertClean()

	t.Run("a data server dies and returns", func(t *testing.T) { c.stripeServerDies(t, pfs) })
	c.assertClean()
	t.Run("a compute node dies with files open", func(t *testing.T) { c.computeNodeDies(t) })
	c.assertClean()
}

// jobPath asks the controller for a job's paths (dw_wlm_cli paths) and returns the mount
// path of variable, without its trailing slash.
func (c *netCluster) jobPath(token, job, variable string) string {
	c.t.Helper()
	pathfile := filepath.Join(c.dir, "paths"+token)
	c.wlm("--function", "paths", "--token", token, "--job", job, "--pathfile", pathfile)
	env, _ := os.ReadFile(pathfile)
	for _, line := range strings.Split(string(env), "\n") {
		if v, ok := strings.CutPrefix(line, variable+"="); ok {
			return strings.TrimSuffix(v, "/")
		}
	}
	c.t.Fatalf("paths of job %s name no $%s:\n%s", token, variable, env)
	return ""
}

// mustRun runs script on a host as nobody (onHost) and returns its output; a failure ends
// the test.
func (c *netCluster) mustRun(t *testing.T, host, script string) string {
	t.Helper()
	out, err := c.onHost(host, "set -e; "+script).CombinedOutput()
	if err != nil {
		t.Fatalf("on %s: %s: %v\n%s", host, script, err, out)
	}
	return string(out)
}

// assertStagedByEveryServer checks the stage of dwPath (complete) in dwstat: the bytes it
// moved add up to want, and each of the nodes listed moved some of them.
func (c *netCluster) assertStagedByEveryServer(t *testing.T, dwPath string, nodes []string, want uint64) {
	t.Helper()
	cmd := exec.Command(binary, "dwstat", "--json", "stages")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "SPILLWAY_CONFIG=" + c.hosts["ctl"].config}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dwstat --json stages: %v\n%s", err, out)
	}
	var shown struct {
		Stages []struct {
			DWPath      string            `json:"dw_path"`
			Status      string            `json:"status"`
			Step        string            `json:"step"`
			BytesDone   uint64            `json:"bytes_done"`
			BytesByNode map[string]uint64 `json:"bytes_by_node"`
		} `json:"stages"`
	}
	if err := json.Unmarshal(out, &shown); err != nil {
		t.Fatalf("dwstat --json stages: %v\n%s", err, out)
	}
	for _, st := range shown.Stages {
		if st.DWPath != dwPath {
			continue
		}
		var sum uint64
		for _, n := range st.BytesByNode {
			sum += n
		}
		if st.Status != "complete" || st.Step != "finish" || sum != want || st.BytesDone != want {
			t.Errorf("stage of %s: %s, step %q, %d bytes (%v by node); want complete after the finish step, %d bytes", dwPath, st.Status, st.Step, st.BytesDone, st.BytesByNode, want)
		}
		for _, n := range nodes {
			if st.BytesByNode[n] == 0 {
				t.Errorf("stage of %s: %s moved nothing (%v); every server moves the stripes it holds", dwPath, n, st.BytesByNode)
			}
		}
		return
	}
	t.Errorf("dwstat shows no stage of %s:\n%s", dwPath, out)
}

// computeNodeDies: hostb's agent (its FUSE client) is killed while a process there has a
// striped file open after syncing it; hoste reads what was synced, whole; hostb's agent comes
// back, remounts, and the job ends cleanly.
func (c *netCluster) computeNodeDies(t *testing.T) {
	job := c.jobFile("cdies.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=3GiB\n\x00")
	c.wlm("--function", "setup", "--token", "64", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:3GiB", "--job", job)
	mount := c.jobPath("64", job, "DW_JOB_STRIPED")
	c.wlm("--function", "pre_run", "--token", "64", "--job", job, "--nodehostnamefile", c.jobFile("cdies.nodes", "hostb\nhoste\n"))
	// 20 MiB written and synced, then the file stays open.
	holder := c.onHost("hostb", "exec 3>"+mount+"/kept; head -c 20971520 /dev/zero | tr '\\0' x >&3; "+
		"python3 -c 'import os; os.fsync(3)'; echo synced; exec sleep 600")
	var out strings.Builder
	holder.Stdout, holder.Stderr = &out, &out
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	c.waitFor("the file synced on hostb", func() bool { return strings.Contains(out.String(), "synced") })
	c.stop("hostb", true)
	got, err := c.onHost("hoste", "stat -c %s "+mount+"/kept; tr -d x < "+mount+"/kept | wc -c").CombinedOutput()
	if err != nil || string(got) != "20971520\n0\n" {
		t.Errorf("hoste reads the file hostb synced before dying as %q (%v), want 20971520 bytes of x", got, err)
	}
	holder.Process.Kill()
	c.start("hostb")
	c.wlm("--function", "post_run", "--token", "64", "--job", job)
	c.wlm("--function", "teardown", "--token", "64", "--job", job)
}

// stripeServerDies: with a striped instance on hosta (its metadata server), hostc and hostd,
// hostd's agent is killed while a process on hostb writes a file and another reads one: both
// get an error within warpfs.request_timeout; a file whose stripes are all on hostc keeps
// working, and new files can be placed there. When hostd returns, the file written before it
// died reads back whole.
func (c *netCluster) stripeServerDies(t *testing.T, pfs string) {
	job := c.jobFile("faults.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=3GiB\n\x00")
	c.wlm("--function", "setup", "--token", "62", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:3GiB", "--job", job)
	mount := c.jobPath("62", job, "DW_JOB_STRIPED")
	c.wlm("--function", "pre_run", "--token", "62", "--job", job, "--nodehostnamefile", c.jobFile("faults.nodes", "hostb\n"))
	run := func(script string) (string, error) {
		out, err := c.onHost("hostb", script).CombinedOutput()
		return string(out), err
	}
	// big's stripes are on all three servers; "safe" has one stripe, on hostc.
	if out, err := run(fmt.Sprintf("set -e; cp %s/big.in %s/big; touch %s/safe", pfs, mount, mount)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := run(binary + " stripes --json " + mount + "/big")
	var shown []struct {
		Servers []struct {
			Index int    `json:"index"`
			Node  string `json:"node"`
		} `json:"servers"`
	}
	if err != nil || json.Unmarshal([]byte(out), &shown) != nil || len(shown) != 1 || len(shown[0].Servers) != 3 {
		t.Fatalf("spillway stripes: %v\n%s", err, out)
	}
	index := map[string]int{}
	for _, s := range shown[0].Servers {
		index[s.Node] = s.Index
	}
	setLayout := `python3 -c 'import os, sys; os.setxattr(sys.argv[1], "user.spillway.layout", sys.argv[2].encode())' `
	onC := fmt.Sprintf("'stripe_width=1 start=%d'", index["hostc"])
	if out, err := run("set -e; " + setLayout + mount + "/safe " + onC + "; echo kept > " + mount + "/safe; mkdir " + mount + "/onc; " +
		setLayout + mount + "/onc " + onC); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := sha256.Sum256(mustRead(t, filepath.Join(pfs, "big.in")))

	// A writer of a file that spans every server, then hostd dies.
	writer := c.onHost("hostb", "exec 3>"+mount+"/spanning; while dd if=/dev/zero bs=1M count=8 status=none >&3; do sleep 0.05; done; echo writer-failed")
	var wout strings.Builder
	writer.Stdout, writer.Stderr = &wout, &wout
	if err := writer.Start(); err != nil {
		t.Fatal(err)
	}
	defer writer.Process.Kill()
	time.Sleep(500 * time.Millisecond)
	c.stop("hostd", true)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- writer.Wait() }()
	select {
	case <-done:
		if took := time.Since(start); took > netRequestTimeout+netSlack || !strings.Contains(wout.String(), "writer-failed") {
			t.Errorf("the writer ended after %s (bound %s): %s", took, netRequestTimeout, wout.String())
		}
	case <-time.After(netRequestTimeout + netSlack + 10*time.Second):
		t.Fatalf("the writer still writes %s after its stripe server died: %s", time.Since(start), wout.String())
	}
	// Reading big needs hostd: an error within the bound. safe and new files on hostc work.
	start = time.Now()
	if out, err := run("cat " + mount + "/big > /dev/null"); err == nil || time.Since(start) > netRequestTimeout+netSlack {
		t.Errorf("reading a file with stripes on the dead server: %v after %s\n%s", err, time.Since(start), out)
	}
	if out, err := run("set -e; cat " + mount + "/safe; echo new > " + mount + "/onc/new; cat " + mount + "/onc/new"); err != nil ||
		out != "kept\nnew\n" {
		t.Errorf("files with no stripe on the dead server: %v\n%s", err, out)
	}
	// hostd returns: big reads back whole.
	c.start("hostd")
	var sum string
	c.waitFor("big readable again", func() bool {
		out, err := run("sha256sum < " + mount + "/big")
		sum = out
		return err == nil
	})
	if !strings.HasPrefix(sum, hex.EncodeToString(want[:])) {
		t.Errorf("after hostd returned, big reads as %s, want %x", sum, want)
	}
	c.wlm("--function", "post_run", "--token", "62", "--job", job)
	c.wlm("--function", "teardown", "--token", "62", "--job", job)
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMaxMDSAcrossStorageNodes: max_mds=yes on a striped instance over three storage nodes
// spreads its namespace: a shard on each node. A staged-in file is read whole; two compute
// nodes make files in one directory at once, which end up on every storage node's shard, are
// read back whole by the other node, renamed (between shards too), and staged out.
func TestMaxMDSAcrossStorageNodes(t *testing.T) {
	storage := []string{"hosta", "hostc", "hostd"}
	c := newNetClusterOf(t, storage, []string{"hostb", "hoste"})
	c.start("ctl")
	for _, h := range append(storage, "hostb", "hoste") {
		c.start(h)
	}
	pfs := filepath.Join(c.dir, "pfs")
	data := make([]byte, 9<<20+777)
	rand.New(rand.NewSource(11)).Read(data)
	if err := os.WriteFile(filepath.Join(pfs, "big.in"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chown(filepath.Join(pfs, "big.in"), nobodyUID, nobodyGID)
	job := c.jobFile("maxmds.sh", "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=3GiB max_mds=yes\n"+
		"#DW stage_in type=file source="+pfs+"/big.in destination=$DW_JOB_STRIPED/in/big\n"+
		"#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination="+pfs+"/maxmds-out\n\x00")
	nodes := c.jobFile("maxmds.nodes", "hostb\nhoste\n")
	c.wlm("--function", "job_process", "--job", job)
	c.wlm("--function", "setup", "--token", "70", "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:3GiB", "--job", job)
	shardsOf := func(h string) []string {
		dirs, _ := filepath.Glob(filepath.Join(c.dir, h, "ssd", "fragment", "*", "namespace", "*"))
		return dirs
	}
	for _, h := range storage {
		if got := shardsOf(h); len(got) != 1 {
			t.Fatalf("%s holds %d namespaces of the max_mds instance, want its shard: %v", h, len(got), got)
		}
	}
	c.wlm("--function", "data_in", "--token", "70", "--job", job)
	mount := c.jobPath("70", job, "DW_JOB_STRIPED")
	c.wlm("--function", "pre_run", "--token", "70", "--job", job, "--nodehostnamefile", nodes)
	run := func(host, script string) string { t.Helper(); return c.mustRun(t, host, script) }
	sum := sha256.Sum256(data)
	for _, h := range []string{"hostb", "hoste"} {
		if out := run(h, "sha256sum "+mount+"/in/big"); !strings.Contains(out, hex.EncodeToString(sum[:])) {
			t.Errorf("%s reads the staged-in file as %s", h, out)
		}
	}
	// Both compute nodes make files in one directory at once.
	const perNode = 60
	run("hostb", "mkdir "+mount+"/out")
	var wg sync.WaitGroup
	for _, h := range []string{"hostb", "hoste"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := c.onHost(h, fmt.Sprintf("for i in $(seq 1 %d); do echo %s-$i > %s/out/%s-$i; done", perNode, h, mount, h)).CombinedOutput()
			if err != nil {
				t.Errorf("writer on %s: %v\n%s", h, err, out)
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, h := range storage {
		files, _ := filepath.Glob(filepath.Join(shardsOf(h)[0], "out", "host*"))
		if len(files) == 0 {
			t.Errorf("%s's shard holds none of the directory's files", h)
		}
		t.Logf("%s's shard holds %d of the directory's files", h, len(files))
		total += len(files)
	}
	if total != 2*perNode {
		t.Errorf("the shards hold %d files of the directory, want %d, each once", total, 2*perNode)
	}
	// Each node reads the other's files, and lists them all once.
	for h, other := range map[string]string{"hostb": "hoste", "hoste": "hostb"} {
		out := run(h, fmt.Sprintf("ls %s/out | wc -l; for i in $(seq 1 %d); do cat %s/out/%s-$i; done", mount, perNode, mount, other))
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != perNode+1 || strings.TrimSpace(lines[0]) != fmt.Sprint(2*perNode) {
			t.Fatalf("%s lists and reads %s's files as:\n%s", h, other, out)
		}
		for i, l := range lines[1:] {
			if want := fmt.Sprintf("%s-%d", other, i+1); l != want {
				t.Fatalf("%s reads %s, want %s", h, l, want)
			}
		}
	}
	// Renames (most between shards) keep the data; the big file moves into out/.
	run("hoste", fmt.Sprintf("for i in $(seq 1 %d); do mv %s/out/hostb-$i %s/out/renamed-$i; done; mv %s/in/big %s/out/big",
		perNode, mount, mount, mount, mount))
	out := run("hostb", fmt.Sprintf("for i in $(seq 1 %d); do cat %s/out/renamed-$i; done; sha256sum %s/out/big; ls %s/out | grep -c hostb- || true",
		perNode, mount, mount, mount))
	if !strings.Contains(out, hex.EncodeToString(sum[:])) || strings.Count(out, "hostb-") != perNode || !strings.HasSuffix(strings.TrimSpace(out), "\n0") {
		t.Errorf("after the renames hostb reads:\n%s", out)
	}
	c.wlm("--function", "post_run", "--token", "70", "--job", job)
	c.wlm("--function", "data_out", "--token", "70", "--job", job)
	if got, err := os.ReadFile(filepath.Join(pfs, "maxmds-out", "big")); err != nil || !bytes.Equal(got, data) {
		t.Errorf("staged out big: %d bytes (%v), want %d", len(got), err, len(data))
	}
	staged, _ := os.ReadDir(filepath.Join(pfs, "maxmds-out"))
	if len(staged) != 2*perNode+1 {
		t.Errorf("staged out %d files, want %d", len(staged), 2*perNode+1)
	}
	c.wlm("--function", "teardown", "--token", "70", "--job", job)
	c.assertClean()
}

// checkCoherentAcrossHosts changes names and attributes on host a and checks that host b,
// which looked them up (and so caches them: warpfs leases) just before, sees each change at
// its next command.
func checkCoherentAcrossHosts(t *testing.T, run func(host, script string) string, mount, a, b string) {
	t.Helper()
	d := mount + "/coherence"
	run(a, "mkdir "+d)
	check := func(host, script, want string) {
		t.Helper()
		if out := strings.TrimSpace(run(host, script)); out != want {
			t.Errorf("on %s, %q printed %q, want %q", host, script, out, want)
		}
	}
	missing := "test -e " + d + "/f && echo there || echo missing"
	check(b, missing, "missing")
	run(a, "echo one > "+d+"/f")
	check(b, "cat "+d+"/f", "one")
	check(b, "stat -c %a "+d+"/f", "644")
	run(a, "chmod 600 "+d+"/f")
	check(b, "stat -c %a "+d+"/f", "600")
	run(a, "echo two >> "+d+"/f")
	check(b, "stat -c %s "+d+"/f", "8")
	check(b, "cat "+d+"/f | tail -1", "two")
	run(a, "mv "+d+"/f "+d+"/g")
	check(b, missing, "missing")
	check(b, "cat "+d+"/g | head -1", "one")
	run(a, "rm "+d+"/g")
	check(b, "ls -A "+d+" | wc -l", "0")
	run(b, "rmdir "+d)
	check(a, "test -e "+d+" && echo there || echo gone", "gone")
}
