package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/swaprace"
	"golang.org/x/sys/unix"
)

// Cache instances (issue 20) end to end: a PFS stand-in directory (shared by every host: the
// network namespaces share the machine's file system), cache instances over several storage
// nodes used from compute nodes, jobs run as nobody.

// opsEnv makes the test binary the file-operation runner of these tests (see TestMain and
// opsMain): the job's processes on the compute nodes run it, as nobody, on the cache's mount.
const opsEnv = "SPILLWAY_E2E_OPS"

// fsOp is one file operation; its data (create, pwrite, append) is Len bytes of the seeded
// PRNG Seed, so a list of operations is small and applies the same anywhere.
type fsOp struct {
	Kind string `json:"k"` // create (O_TRUNC), pwrite, append (O_APPEND), truncate, rename, link, unlink, mkdir
	Path string `json:"p"`
	To   string `json:"to,omitempty"`
	Off  int64  `json:"off,omitempty"` // pwrite's offset, truncate's size
	Len  int64  `json:"len,omitempty"`
	Seed int64  `json:"seed,omitempty"`
}

func opData(seed, n int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

// apply does op in dir.
func (op fsOp) apply(dir string) error {
	p := filepath.Join(dir, op.Path)
	write := func(flags int, at int64) error {
		f, err := os.OpenFile(p, flags, 0o644)
		if err != nil {
			return err
		}
		data := opData(op.Seed, op.Len)
		if at >= 0 {
			_, err = f.WriteAt(data, at)
		} else {
			_, err = f.Write(data)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
	var err error
	switch op.Kind {
	case "create":
		err = write(os.O_WRONLY|os.O_CREATE|os.O_TRUNC, -1)
	case "pwrite":
		err = write(os.O_WRONLY, op.Off)
	case "append":
		err = write(os.O_WRONLY|os.O_APPEND, -1)
	case "truncate":
		err = os.Truncate(p, op.Off)
	case "rename":
		err = os.Rename(p, filepath.Join(dir, op.To))
	case "link":
		err = os.Link(p, filepath.Join(dir, op.To))
	case "unlink":
		err = os.Remove(p)
	case "mkdir":
		err = os.Mkdir(p, 0o755)
	default:
		err = fmt.Errorf("unknown operation %q", op.Kind)
	}
	if err != nil {
		return fmt.Errorf("%s %s %s: %w", op.Kind, op.Path, op.To, err)
	}
	return nil
}

// genFile is a file as genOps sees it: its names share it (hard links).
type genFile struct{ size int64 }

// genOps is n operations from seed on the files of a tree under root (files: name → file,
// changed as the operations go): small files created, large ones (several stripes),
// overwrites at random offsets (some past the end), appends, truncates (shorter and longer),
// renames (some over another file), hard links and unlinks, in a few directories.
func genOps(seed int64, n int, files map[string]*genFile, root string) []fsOp {
	rng := rand.New(rand.NewSource(seed))
	dirs := []string{root, filepath.Join(root, "a"), filepath.Join(root, "a", "b"), filepath.Join(root, "c")}
	var ops []fsOp
	if root != "" {
		ops = append(ops, fsOp{Kind: "mkdir", Path: root})
	}
	for _, d := range dirs[1:] {
		ops = append(ops, fsOp{Kind: "mkdir", Path: d})
	}
	next, large := 0, 0
	newName := func() string {
		next++
		return filepath.Join(dirs[rng.Intn(len(dirs))], fmt.Sprintf("f%03d", next))
	}
	existing := func() (string, bool) {
		names := make([]string, 0, len(files))
		for f := range files {
			names = append(names, f)
		}
		if len(names) == 0 {
			return "", false
		}
		sort.Strings(names)
		return names[rng.Intn(len(names))], true
	}
	for len(ops) < n {
		r := rng.Intn(100)
		name, ok := existing()
		switch {
		case r < 28 || !ok:
			size := int64(rng.Intn(100 << 10))
			if rng.Intn(10) == 0 {
				size = 0
			}
			p := newName()
			if ok && rng.Intn(4) == 0 {
				p = name // rewrite an existing file whole
			}
			ops = append(ops, fsOp{Kind: "create", Path: p, Len: size, Seed: rng.Int63()})
			if files[p] == nil {
				files[p] = &genFile{}
			}
			files[p].size = size
		case r < 32 && large < 4:
			large++
			p, size := newName(), int64(4<<20+rng.Intn(16<<20))
			ops = append(ops, fsOp{Kind: "create", Path: p, Len: size, Seed: rng.Int63()})
			files[p] = &genFile{size: size}
		case r < 50:
			f := files[name]
			n := 1 + rng.Int63n(64<<10)
			if f.size > 1<<20 {
				n = 1 + rng.Int63n(3<<20)
			}
			off := rng.Int63n(f.size + 512<<10 + 1)
			ops = append(ops, fsOp{Kind: "pwrite", Path: name, Off: off, Len: n, Seed: rng.Int63()})
			f.size = max(f.size, off+n)
		case r < 62:
			n := 1 + rng.Int63n(256<<10)
			ops = append(ops, fsOp{Kind: "append", Path: name, Len: n, Seed: rng.Int63()})
			files[name].size += n
		case r < 70:
			f := files[name]
			f.size = rng.Int63n(f.size*5/4 + 4096 + 1)
			ops = append(ops, fsOp{Kind: "truncate", Path: name, Off: f.size})
		case r < 84:
			to := newName()
			if other, _ := existing(); other != name && files[other] != files[name] && rng.Intn(3) == 0 {
				to = other // replaces another file
			}
			ops = append(ops, fsOp{Kind: "rename", Path: name, To: to})
			files[to] = files[name]
			delete(files, name)
		case r < 89:
			to := newName()
			ops = append(ops, fsOp{Kind: "link", Path: name, To: to})
			files[to] = files[name]
		default:
			ops = append(ops, fsOp{Kind: "unlink", Path: name})
			delete(files, name)
		}
	}
	return ops
}

// opsSpec is what the runner does: Ops (a JSON file) applied to Dir in order, then, with
// Manifest, the tree's manifest printed as JSON.
type opsSpec struct {
	Dir, Ops string
	Manifest bool
}

// entry is a name of a tree: its type (f, d, l), size and SHA-256.
type entry struct {
	Type string
	Size int64
	Sum  string
}

func manifest(dir string) (map[string]entry, error) {
	out := map[string]entry{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		switch {
		case d.IsDir():
			out[rel] = entry{Type: "d"}
		case d.Type().IsRegular():
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			h := sha256.New()
			n, err := io.Copy(h, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			out[rel] = entry{Type: "f", Size: n, Sum: hex.EncodeToString(h.Sum(nil))}
		default:
			out[rel] = entry{Type: d.Type().String()}
		}
		return nil
	})
	return out, err
}

func opsMain(encoded string) int {
	var spec opsSpec
	if err := json.Unmarshal([]byte(encoded), &spec); err != nil {
		fmt.Println("error:", err)
		return 2
	}
	if spec.Ops != "" {
		var ops []fsOp
		raw, err := os.ReadFile(spec.Ops)
		if err == nil {
			err = json.Unmarshal(raw, &ops)
		}
		if err != nil {
			fmt.Println("error:", err)
			return 2
		}
		for i, op := range ops {
			if err := op.apply(spec.Dir); err != nil {
				fmt.Printf("error: operation %d: %v\n", i, err)
				return 1
			}
		}
	}
	if spec.Manifest {
		m, err := manifest(spec.Dir)
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
		out, _ := json.Marshal(m)
		fmt.Println(string(out))
	}
	return 0
}

var helperOnce sync.Once

// helperBinary is a copy of the test binary that nobody may run (the runner, the attacker).
func helperBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(filepath.Dir(binary), "e2e-helper.test")
	var err error
	helperOnce.Do(func() {
		var data []byte
		if data, err = os.ReadFile(os.Args[0]); err == nil {
			err = os.WriteFile(p, data, 0o755)
		}
	})
	if err != nil {
		t.Fatalf("installing the test helper: %v", err)
	}
	return p
}

// netCacheJob is a job with a cache instance, driven by dw_wlm_cli as Slurm drives it.
type netCacheJob struct {
	c     *netCluster
	token string
	job   string
	mount string // $DW_JOB_STRIPED_CACHE, no trailing slash
}

// startCacheJob sets up a job with "#DW jobdw type=cache access_mode=striped capacity=...
// pfs=... <more>" on the nodes and runs its pre_run.
func (c *netCluster) startCacheJob(t *testing.T, token, capacity, pfs, more string, nodes ...string) *netCacheJob {
	t.Helper()
	job := c.jobFile("cache"+token+".sh", fmt.Sprintf("#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=%s pfs=%s %s\n\x00", capacity, pfs, more))
	c.wlm("--function", "job_process", "--job", job)
	c.wlm("--function", "setup", "--token", token, "--caller", "SLURM", "--user", "65534", "--groupid", "65534",
		"--capacity", "wlm_pool:"+capacity, "--job", job)
	j := &netCacheJob{c: c, token: token, job: job, mount: c.jobPath(token, job, "DW_JOB_STRIPED_CACHE")}
	c.wlm("--function", "pre_run", "--token", token, "--job", job, "--nodehostnamefile", c.jobFile("cache"+token+".nodes", strings.Join(nodes, "\n")+"\n"))
	return j
}

// end is the job's end: post_run, data_out, teardown (which flushes the cache). A teardown
// that does not finish within 2 minutes fails the test (and is hurried, to clean up).
func (j *netCacheJob) end() {
	c := j.c
	c.t.Helper()
	c.wlm("--function", "post_run", "--token", j.token, "--job", j.job)
	c.wlm("--function", "data_out", "--token", j.token, "--job", j.job)
	cmd := exec.Command(filepath.Join(c.dir, "dw_wlm_cli"), "--function", "teardown", "--token", j.token, "--job", j.job)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "SPILLWAY_CONFIG=" + c.hosts["ctl"].config}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	timer := time.AfterFunc(2*time.Minute, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	if !timer.Stop() {
		st := exec.Command(binary, "dwstat", "sessions")
		st.Env = cmd.Env
		status, _ := st.CombinedOutput()
		c.wlm("--function", "teardown", "--token", j.token, "--job", j.job, "--hurry")
		c.t.Fatalf("the teardown of job %s did not finish within 2 minutes (hurried):\n%s", j.token, status)
	}
	if err != nil || out.Len() > 0 {
		c.t.Fatalf("teardown of job %s: %v\n%s", j.token, err, out.String())
	}
}

// runOps runs ops in dir on host, as nobody, and returns the tree's manifest after them
// (when manifest); a failure ends the test.
func (c *netCluster) runOps(t *testing.T, host, dir string, ops []fsOp, manifest bool) map[string]entry {
	t.Helper()
	m, err := c.opsOn(host, dir, ops, manifest)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// opsOn is runOps for any goroutine: it returns its failure.
func (c *netCluster) opsOn(host, dir string, ops []fsOp, manifest bool) (map[string]entry, error) {
	spec := opsSpec{Dir: dir, Manifest: manifest}
	if len(ops) > 0 {
		raw, _ := json.Marshal(ops)
		f, err := os.CreateTemp(c.dir, "ops-*.json")
		if err != nil {
			return nil, err
		}
		f.Write(raw)
		f.Close()
		os.Chmod(f.Name(), 0o644)
		spec.Ops = f.Name()
	}
	enc, _ := json.Marshal(spec)
	cmd := c.onHost(host, fmt.Sprintf("%s=%s exec %s", opsEnv, shellQuote(string(enc)), helperBinary(c.t)))
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// A hung cache must fail the test, not hang it.
	timer := time.AfterFunc(3*time.Minute, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	timer.Stop()
	out := buf.Bytes()
	if err != nil {
		return nil, fmt.Errorf("the operations on %s: %v\n%s", host, err, out)
	}
	if !manifest {
		return nil, nil
	}
	var m map[string]entry
	if err := json.Unmarshal(out, &m); err != nil {
		return nil, fmt.Errorf("the manifest from %s: %v\n%s", host, err, out)
	}
	return m, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// sameTree reports how got differs from want (nothing: "").
func sameTree(want, got map[string]entry) string {
	var diffs []string
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s missing (want %+v)", name, w))
		case g != w:
			diffs = append(diffs, fmt.Sprintf("%s is %+v, want %+v", name, g, w))
		}
	}
	for name, g := range got {
		if _, ok := want[name]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s should not exist (%+v)", name, g))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 20 {
		diffs = append(diffs[:20], fmt.Sprintf("... and %d more", len(diffs)-20))
	}
	return strings.Join(diffs, "\n")
}

// pfsFile writes a file on the PFS stand-in as the test (root), then gives it to uid:gid with
// mode.
func pfsFile(t *testing.T, path string, data []byte, uid, gid int, mode os.FileMode) {
	t.Helper()
	os.MkdirAll(filepath.Dir(path), 0o755)
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
	os.Chown(path, uid, gid)
	os.Chmod(path, mode)
}

// cacheConfig is a pool of granularity grain (and stripe size stripe, "" for the default);
// every net cluster lets cache instances front $DIR/pfs.
func cacheConfig(grain, stripe string) string {
	cfg := "[[pool]]\nname = \"wlm_pool\"\ngranularity = \"" + grain + "\"\n"
	if stripe != "" {
		cfg += "stripe_size = \"" + stripe + "\"\n"
	}
	return cfg
}

// TestCacheAcrossStorageNodes: a cache instance over three storage nodes used from two compute
// nodes by nobody. A file on the PFS before the job is read through the cache from both; a
// large file written and closed is not (all) on the PFS while the job runs (write-behind);
// then a seeded sequence of operations (small and large files, overwrites at random offsets,
// appends, truncates, renames, unlinks) runs in turns on both compute nodes through the cache
// and on a plain directory (the model). Both compute nodes read the tree as the model has
// it; after teardown the PFS directory is the model, name for name and byte for byte, and
// nothing else.
func TestCacheAcrossStorageNodes(t *testing.T) {
	storage := []string{"hosta", "hostc", "hostd"}
	c := newNetClusterWith(t, storage, []string{"hostb", "hoste"}, cacheConfig("1GiB", ""))
	c.start("ctl")
	for _, h := range append(storage, "hostb", "hoste") {
		c.start(h)
	}
	pfs := filepath.Join(c.dir, "pfs", "run")
	model := filepath.Join(c.dir, "model")
	for _, d := range []string{pfs, model} {
		os.MkdirAll(d, 0o755)
		os.Chown(d, nobodyUID, nobodyGID)
	}
	// On the PFS before the job (and in the model): a file of several stripes, a small one.
	files := map[string]*genFile{}
	for name, size := range map[string]int64{"pre-big": 17<<20 + 4321, "pre-small": 3000} {
		data := opData(int64(len(name)), size)
		pfsFile(t, filepath.Join(pfs, name), data, nobodyUID, nobodyGID, 0o644)
		pfsFile(t, filepath.Join(model, name), data, nobodyUID, nobodyGID, 0o644)
		files[name] = &genFile{size: size}
	}
	j := c.startCacheJob(t, "80", "3GiB", pfs, "", "hostb", "hoste")
	for _, h := range storage {
		if f := c.fragments(h); len(f) != 1 {
			t.Errorf("%s holds %d fragments of the 3-grain cache instance, want 1", h, len(f))
		}
	}
	before, _ := manifest(model)
	for _, h := range []string{"hostb", "hoste"} {
		if diff := sameTree(before, c.runOps(t, h, j.mount, nil, true)); diff != "" {
			t.Errorf("%s reads the PFS directory through the cache as:\n%s", h, diff)
		}
	}

	// Write-behind: 20 MiB written and closed is below modified_threshold (64 MiB) and the
	// watermarks (45 % of 1 GiB per server), and nothing syncs it: while the job runs, the PFS
	// file does not hold it.
	wb := fsOp{Kind: "create", Path: "written-behind", Len: 20 << 20, Seed: 99}
	c.runOps(t, "hostb", j.mount, []fsOp{wb}, false)
	wb.apply(model)
	if onPFS, err := os.ReadFile(filepath.Join(pfs, wb.Path)); err != nil || bytes.Equal(onPFS, opData(wb.Seed, wb.Len)) {
		t.Errorf("a closed file below every flush threshold is on the PFS already (%d bytes, %v): no write-behind", len(onPFS), err)
	} else {
		t.Logf("written-behind: %d bytes on the PFS while the job runs", len(onPFS))
	}

	seed := int64(80)
	if s := os.Getenv("CACHE_SEED"); s != "" {
		fmt.Sscan(s, &seed)
	}
	applyModel := func(ops []fsOp) {
		t.Helper()
		for _, op := range ops {
			if err := op.apply(model); err != nil {
				t.Fatalf("the model: %v", err)
			}
		}
	}
	// In turns: a third of the operations on hostb, a third on hoste, a third on hostb.
	ops := genOps(seed, 300, files, "")
	third := len(ops) / 3
	for i, part := range [][]fsOp{ops[:third], ops[third : 2*third], ops[2*third:]} {
		c.runOps(t, []string{"hostb", "hoste", "hostb"}[i], j.mount, part, false)
		applyModel(part)
	}
	// At once: each compute node its own subtree.
	var wg sync.WaitGroup
	for i, h := range []string{"hostb", "hoste"} {
		sub := genOps(seed+int64(i)+1, 120, map[string]*genFile{}, "on-"+h)
		ops = append(ops, sub...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.opsOn(h, j.mount, sub, false); err != nil {
				t.Error(err)
			}
		}()
		applyModel(sub)
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	want, err := manifest(model)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, e := range want {
		total += e.Size
	}
	t.Logf("%d operations; the model holds %d names, %d bytes", len(ops)+1, len(want), total)
	for _, h := range []string{"hoste", "hostb"} {
		got := c.runOps(t, h, j.mount, nil, true)
		if diff := sameTree(want, got); diff != "" {
			t.Errorf("%s reads the tree through the cache as:\n%s", h, diff)
			c.explainDiff(t, h, j.mount, model, pfs, want, got, ops)
		}
	}
	// Dirty data survives a restart of the storage nodes' agents (it is in their logs), files
	// renamed since their last open included, a directory with them too: teardown finds them
	// under their new names.
	late := []fsOp{{Kind: "mkdir", Path: "late"}, {Kind: "create", Path: "late/x", Len: 9<<20 + 3, Seed: 301},
		{Kind: "create", Path: "late/y", Len: 5000, Seed: 302}, {Kind: "create", Path: "z", Len: 2<<20 + 1, Seed: 303},
		{Kind: "rename", Path: "late/y", To: "late/y2"}, {Kind: "rename", Path: "late", To: "moved"},
		{Kind: "rename", Path: "z", To: "a/z2"}, {Kind: "create", Path: "z", Len: 100, Seed: 304}}
	c.runOps(t, "hoste", j.mount, late, false)
	applyModel(late)
	for _, h := range storage {
		c.stop(h, true)
		c.start(h)
	}
	if want, err = manifest(model); err != nil {
		t.Fatal(err)
	}
	j.end()
	got, err := manifest(pfs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := sameTree(want, got); diff != "" {
		t.Errorf("after teardown the PFS directory differs from the model:\n%s", diff)
	}
	// The job's files on the PFS are nobody's.
	filepath.WalkDir(pfs, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			if st, err := os.Lstat(p); err == nil && st.Sys().(*syscall.Stat_t).Uid != nobodyUID {
				t.Errorf("%s on the PFS is owned by uid %d, want nobody", p, st.Sys().(*syscall.Stat_t).Uid)
			}
		}
		return nil
	})
	c.assertClean()
}

// explainDiff logs, for each file host reads wrong through the cache at mount, the byte
// ranges that differ from the model's and the operations that named it.
func (c *netCluster) explainDiff(t *testing.T, host, mount, model, pfs string, want, got map[string]entry, ops []fsOp) {
	t.Helper()
	for name, w := range want {
		if got[name] == w || w.Type != "f" {
			continue
		}
		copied := filepath.Join(c.dir, "read-"+strings.ReplaceAll(name, "/", "_"))
		os.WriteFile(copied, nil, 0o666)
		os.Chmod(copied, 0o666)
		c.mustRun(t, host, "cat "+mount+"/"+name+" > "+copied)
		a, _ := os.ReadFile(copied)
		b, _ := os.ReadFile(filepath.Join(model, name))
		var ranges []string
		for off := 0; off < len(a) && off < len(b) && len(ranges) < 10; {
			if a[off] == b[off] {
				off++
				continue
			}
			start := off
			for off < len(a) && off < len(b) && a[off] != b[off] {
				off++
			}
			ranges = append(ranges, fmt.Sprintf("[%d,%d) zeros=%v", start, off, bytes.Count(a[start:off], []byte{0}) == off-start))
		}
		onPFS, _ := os.ReadFile(filepath.Join(pfs, name))
		t.Logf("%s: %d bytes read on %s, differing at %v; the PFS holds %d bytes (the same as read: %v)", name, len(a), host, ranges, len(onPFS), bytes.Equal(onPFS, a))
		for i, op := range ops {
			if filepath.Base(op.Path) == filepath.Base(name) || filepath.Base(op.To) == filepath.Base(name) {
				t.Logf("  operation %d: %+v", i, op)
			}
		}
	}
}

// onPFS reports whether the PFS file holds exactly data.
func onPFS(path string, data []byte) bool {
	got, err := os.ReadFile(path)
	return err == nil && bytes.Equal(got, data)
}

// TestCacheSyncPolicies: with sync_on_close=yes a file the job closed is on the PFS while the
// job still runs; with sync_to_pfs=yes a file is not on the PFS after its writes and is after
// its fsync (the file still open); with neither, a closed file is not on the PFS while the job
// runs and is after teardown. A file changed on the PFS underneath the job, between two
// opens, is read fresh at the second.
func TestCacheSyncPolicies(t *testing.T) {
	storage := []string{"hosta", "hostc", "hostd"}
	c := newNetClusterWith(t, storage, []string{"hostb"}, cacheConfig("1GiB", ""))
	c.start("ctl")
	for _, h := range append(storage, "hostb") {
		c.start(h)
	}
	pfs := filepath.Join(c.dir, "pfs")
	// 20 MiB: three stripes, one on each storage node, each flushed by its own server.
	big := func(name string, seed int64) fsOp {
		return fsOp{Kind: "create", Path: name, Len: 20<<20 + 5, Seed: seed}
	}

	t.Run("sync_on_close", func(t *testing.T) {
		dir := filepath.Join(pfs, "soc")
		os.Mkdir(dir, 0o755)
		os.Chown(dir, nobodyUID, nobodyGID)
		j := c.startCacheJob(t, "90", "3GiB", dir, "sync_on_close=yes", "hostb")
		op := big("closed", 1)
		c.runOps(t, "hostb", j.mount, []fsOp{op}, false)
		if !onPFS(filepath.Join(dir, op.Path), opData(op.Seed, op.Len)) {
			t.Errorf("sync_on_close=yes: the file the job closed is not on the PFS")
		}
		// An overwrite in the middle, closed: on the PFS too.
		over := fsOp{Kind: "pwrite", Path: "closed", Off: 9<<20 + 17, Len: 3 << 20, Seed: 2}
		c.runOps(t, "hostb", j.mount, []fsOp{over}, false)
		want := opData(op.Seed, op.Len)
		copy(want[over.Off:], opData(over.Seed, over.Len))
		if !onPFS(filepath.Join(dir, op.Path), want) {
			t.Errorf("sync_on_close=yes: the overwrite the job closed is not on the PFS")
		}
		// Changed on the PFS after the job's own (synced) writes: the next open reads the change.
		patch := opData(8, 5000)
		f, err := os.OpenFile(filepath.Join(dir, op.Path), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt(patch, 17<<20)
		f.Close()
		copy(want[17<<20:], patch)
		sum := sha256.Sum256(want)
		if out := c.mustRun(t, "hostb", "sha256sum "+j.mount+"/"+op.Path); !strings.HasPrefix(out, hex.EncodeToString(sum[:])) {
			t.Errorf("a file the job wrote and synced, then changed on the PFS, reads stale at the next open: %s", out)
		}
		j.end()
		if !onPFS(filepath.Join(dir, op.Path), want) {
			t.Errorf("after teardown the file is not on the PFS")
		}
		c.assertClean()
	})

	t.Run("sync_to_pfs", func(t *testing.T) {
		dir := filepath.Join(pfs, "stp")
		os.Mkdir(dir, 0o755)
		os.Chown(dir, nobodyUID, nobodyGID)
		j := c.startCacheJob(t, "91", "3GiB", dir, "sync_to_pfs=yes", "hostb")
		data := opData(3, 20<<20+5)
		src := filepath.Join(c.dir, "stp.src")
		os.WriteFile(src, data, 0o644)
		// The job writes, says so and waits; then fsyncs, says so and waits, the file open.
		job := c.onHost("hostb", fmt.Sprintf(`exec python3 -c '
import os, sys
fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
with open(sys.argv[1], "rb") as f:
    os.write(fd, f.read())
print("written", flush=True)
sys.stdin.readline()
os.fsync(fd)
print("synced", flush=True)
sys.stdin.readline()
os.close(fd)
' %s %s/held`, src, j.mount))
		stdin, _ := job.StdinPipe()
		stdout, _ := job.StdoutPipe()
		job.Stderr = os.Stderr
		if err := job.Start(); err != nil {
			t.Fatal(err)
		}
		defer job.Process.Kill()
		lines := make(chan string, 4)
		go func() {
			buf := make([]byte, 4096)
			var acc string
			for {
				n, err := stdout.Read(buf)
				acc += string(buf[:n])
				for {
					line, rest, ok := strings.Cut(acc, "\n")
					if !ok {
						break
					}
					lines <- line
					acc = rest
				}
				if err != nil {
					close(lines)
					return
				}
			}
		}()
		expect := func(want string) {
			t.Helper()
			if got := <-lines; got != want {
				t.Fatalf("the job printed %q, want %q", got, want)
			}
		}
		expect("written")
		if onPFS(filepath.Join(dir, "held"), data) {
			t.Errorf("sync_to_pfs=yes: the data is on the PFS before any fsync (write-behind expected)")
		}
		io.WriteString(stdin, "go\n")
		expect("synced")
		if !onPFS(filepath.Join(dir, "held"), data) {
			t.Errorf("sync_to_pfs=yes: after fsync() returned the data is not on the PFS")
		}
		io.WriteString(stdin, "go\n")
		if err := job.Wait(); err != nil {
			t.Fatalf("the job: %v", err)
		}
		j.end()
		c.assertClean()
	})

	t.Run("neither, and a file changed underneath", func(t *testing.T) {
		dir := filepath.Join(pfs, "plain")
		os.Mkdir(dir, 0o755)
		os.Chown(dir, nobodyUID, nobodyGID)
		fresh := filepath.Join(dir, "fresh")
		pfsFile(t, fresh, []byte("version one\n"), nobodyUID, nobodyGID, 0o644)
		sameSize := opData(4, 3<<20)
		pfsFile(t, filepath.Join(dir, "same-size"), sameSize, nobodyUID, nobodyGID, 0o644)
		j := c.startCacheJob(t, "92", "3GiB", dir, "", "hostb")
		op := big("behind", 5)
		c.runOps(t, "hostb", j.mount, []fsOp{op, {Kind: "create", Path: "small", Len: 1000, Seed: 6}}, false)
		if onPFS(filepath.Join(dir, op.Path), opData(op.Seed, op.Len)) {
			t.Errorf("without sync_on_close and sync_to_pfs a closed file is on the PFS while the job runs")
		}
		sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
		read := func(name string) string {
			t.Helper()
			return strings.Fields(c.mustRun(t, "hostb", "sha256sum "+j.mount+"/"+name))[0]
		}
		if got := read("fresh"); got != sum([]byte("version one\n")) {
			t.Errorf("fresh reads as %s before the change", got)
		}
		if got := read("same-size"); got != sum(sameSize) {
			t.Errorf("same-size reads as %s before the change", got)
		}
		// Changed on the PFS between two opens: one file's size changes, the other's bytes
		// (in the middle, the size kept).
		pfsFile(t, fresh, []byte("version two, longer\n"), nobodyUID, nobodyGID, 0o644)
		f, err := os.OpenFile(filepath.Join(dir, "same-size"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		patch := opData(7, 100<<10)
		f.WriteAt(patch, 1<<20+12345)
		f.Close()
		copy(sameSize[1<<20+12345:], patch)
		if got := read("fresh"); got != sum([]byte("version two, longer\n")) {
			t.Errorf("a file changed on the PFS reads stale at the next open: %s", got)
		}
		if got := read("same-size"); got != sum(sameSize) {
			t.Errorf("a file whose bytes changed on the PFS (same size) reads stale at the next open: %s", got)
		}
		j.end()
		if !onPFS(filepath.Join(dir, op.Path), opData(op.Seed, op.Len)) || !onPFS(filepath.Join(dir, "small"), opData(6, 1000)) {
			t.Errorf("after teardown the job's files are not on the PFS")
		}
		if !onPFS(filepath.Join(dir, "same-size"), sameSize) || !onPFS(fresh, []byte("version two, longer\n")) {
			t.Errorf("teardown changed the files the job only read")
		}
		c.assertClean()
	})
}

// TestCacheWorkingSetLargerThanInstance: a 48 MiB cache instance (a 16 MiB grain on each of
// three storage nodes) takes a working set four times its size: files written whole, parts of
// the first ones (long evicted) overwritten, everything read back through the cache, without
// ENOSPC; the PFS holds it all after teardown.
func TestCacheWorkingSetLargerThanInstance(t *testing.T) {
	storage := []string{"hosta", "hostc", "hostd"}
	c := newNetClusterWith(t, storage, []string{"hostb"}, cacheConfig("16MiB", ""))
	c.start("ctl")
	for _, h := range append(storage, "hostb") {
		c.start(h)
	}
	pfs := filepath.Join(c.dir, "pfs", "big")
	model := filepath.Join(c.dir, "model")
	for _, d := range []string{pfs, model} {
		os.MkdirAll(d, 0o755)
		os.Chown(d, nobodyUID, nobodyGID)
	}
	const capacity = 48 << 20
	j := c.startCacheJob(t, "95", "48MiB", pfs, "", "hostb")
	for _, h := range storage {
		if f := c.fragments(h); len(f) != 1 {
			t.Errorf("%s holds %d fragments of the 3-grain cache instance, want 1", h, len(f))
		}
	}
	var ops []fsOp
	var total int64
	for i := 0; total < 4*capacity; i++ {
		size := int64(16<<20 + i*4099)
		ops = append(ops, fsOp{Kind: "create", Path: fmt.Sprintf("part%02d", i), Len: size, Seed: int64(100 + i)})
		total += size
	}
	// The first files' data left the cache long ago: overwriting part of an extent of them
	// reads it from the PFS first.
	for i := 0; i < 4; i++ {
		ops = append(ops, fsOp{Kind: "pwrite", Path: fmt.Sprintf("part%02d", i), Off: int64(i)<<20 + 777, Len: 3<<20 + 1, Seed: int64(200 + i)})
	}
	c.runOps(t, "hostb", j.mount, ops, false)
	for _, op := range ops {
		if err := op.apply(model); err != nil {
			t.Fatal(err)
		}
	}
	want, _ := manifest(model)
	t.Logf("a working set of %d bytes in %d files through a %d-byte cache instance", total, len(want), capacity)
	// The cache stays within its capacity: each storage node's objects hold at most its
	// share (eviction punches holes; allow it to catch up, and 1 MiB of slack).
	held := func(h string) int64 {
		var n int64
		objects, _ := filepath.Glob(filepath.Join(c.dir, h, "ssd", "fragment", "*", "cache", "objects", "*"))
		for _, o := range objects {
			if st, err := os.Stat(o); err == nil {
				n += st.Sys().(*syscall.Stat_t).Blocks * 512
			}
		}
		return n
	}
	for _, h := range storage {
		deadline := time.Now().Add(30 * time.Second)
		for held(h) > capacity/3+1<<20 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if n := held(h); n > capacity/3+1<<20 {
			t.Errorf("%s's cache objects hold %d bytes, more than its %d-byte share of the instance", h, n, capacity/3)
		} else {
			t.Logf("%s's cache objects hold %d bytes", h, n)
		}
	}
	if diff := sameTree(want, c.runOps(t, "hostb", j.mount, nil, true)); diff != "" {
		t.Errorf("hostb reads the working set through the cache as:\n%s", diff)
	}
	j.end()
	got, err := manifest(pfs)
	if err != nil {
		t.Fatal(err)
	}
	if diff := sameTree(want, got); diff != "" {
		t.Errorf("after teardown the PFS directory differs from the model:\n%s", diff)
	}
	c.assertClean()
}

// TestCacheKeepsPFSPermissions: nobody's cache job reaches the PFS with nobody's rights only.
// Root's 0600 file is unreadable through the cache (EACCES), and so is a 0644 file whose ACL
// denies nobody (only the PFS, asked as nobody, refuses that one), as it is for root on the compute
// node (root's requests act as the instance's owner); no file is created in root's read-only
// directory; a file of nobody's group is readable, one of another group is not; what the job
// creates is nobody's on the PFS. Then symlink swaps: while the job reads and writes files
// through the cache (sync_on_close=yes, so that flushes run too), nobody exchanges a
// directory of the PFS tree with a link to root's directory outside it, in a loop, and races
// chmod, truncate and create through the cache (package swaprace): root's directory and its
// canary are untouched, and the job never read the canary.
func TestCacheKeepsPFSPermissions(t *testing.T) {
	c := newNetClusterWith(t, []string{"hosta"}, []string{"hostb"}, cacheConfig("1GiB", ""))
	c.start("ctl")
	c.start("hosta")
	c.start("hostb")
	pfs := filepath.Join(c.dir, "pfs", "perm")
	os.MkdirAll(pfs, 0o755)
	os.Chown(pfs, nobodyUID, nobodyGID)
	pfsFile(t, filepath.Join(pfs, "secret"), []byte("root's secret\n"), 0, 0, 0o600)
	pfsFile(t, filepath.Join(pfs, "ro", "inside"), []byte("root's readable file\n"), 0, 0, 0o644)
	pfsFile(t, filepath.Join(pfs, "group-in"), []byte("nogroup may read\n"), 0, nobodyGID, 0o640)
	pfsFile(t, filepath.Join(pfs, "group-out"), []byte("only root's group\n"), 0, 0, 0o640)
	os.MkdirAll(filepath.Join(pfs, "work"), 0o755)
	os.Chown(filepath.Join(pfs, "work"), nobodyUID, nobodyGID)
	// A file its mode lets everyone read, but an ACL entry denies nobody: only the PFS itself,
	// asked as nobody, refuses it (not a check of the mode bits the mount sees).
	aclDenied := filepath.Join(pfs, "acl-denied")
	pfsFile(t, aclDenied, []byte("not for nobody\n"), 0, 0, 0o644)
	acl := []byte{2, 0, 0, 0} // POSIX ACL version 2; entries: tag, perm (uint16), id (uint32)
	for _, e := range []struct {
		tag, perm uint16
		id        uint32
	}{{0x01, 6, ^uint32(0)}, {0x02, 0, nobodyUID}, {0x04, 4, ^uint32(0)}, {0x10, 4, ^uint32(0)}, {0x20, 4, ^uint32(0)}} {
		acl = append(acl, byte(e.tag), byte(e.tag>>8), byte(e.perm), byte(e.perm>>8), byte(e.id), byte(e.id>>8), byte(e.id>>16), byte(e.id>>24))
	}
	hasACL := unix.Setxattr(aclDenied, "system.posix_acl_access", acl, 0) == nil
	if !hasACL {
		t.Log("the PFS stand-in's file system takes no POSIX ACL: the ACL check is skipped")
	}

	victim := filepath.Join(c.dir, "victim") // root's, outside the PFS tree
	os.Mkdir(victim, 0o755)
	canary := []byte("root's canary outside the PFS tree: never read, never changed\n")
	target := filepath.Join(victim, swaprace.TargetName)
	if err := os.WriteFile(target, canary, 0o600); err != nil {
		t.Fatal(err)
	}
	canaryInfo, _ := os.Stat(target)

	j := c.startCacheJob(t, "97", "1GiB", pfs, "sync_on_close=yes", "hostb")
	m := j.mount
	try := func(what, script string) string {
		out, _ := c.onHost("hostb", script+" 2>&1 && echo ok || echo failed").CombinedOutput()
		return what + ": " + strings.TrimSpace(string(out))
	}
	for _, tc := range []struct{ script, want string }{
		{"cat " + m + "/secret", "Permission denied"},
		{"cat " + m + "/group-out", "Permission denied"},
		{"touch " + m + "/ro/new", "Permission denied"},
		{"mkdir " + m + "/ro/newdir", "Permission denied"},
		{"echo more >> " + m + "/ro/inside", "Permission denied"},
		{"mv " + m + "/ro/inside " + m + "/stolen", "Permission denied"},
		{"cat " + m + "/group-in", "nogroup may read\nok"},
		{"cat " + m + "/acl-denied", "Permission denied"},
		{"cat " + m + "/ro/inside", "root's readable file\nok"},
		{"echo mine > " + m + "/mine && mkdir " + m + "/mydir && echo deeper > " + m + "/mydir/f && cat " + m + "/mydir/f", "deeper\nok"},
	} {
		if !hasACL && strings.Contains(tc.script, "acl-denied") {
			continue
		}
		if got := try(tc.script, tc.script); !strings.Contains(got, tc.want) || strings.Contains(tc.want, "denied") && !strings.HasSuffix(got, "failed") {
			t.Errorf("%s\nwant %q", got, tc.want)
		}
	}
	// Root on the compute node reads through the cache with the instance owner's rights.
	pid := fmt.Sprint(c.hosts["hostb"].cmd.Process.Pid)
	asRoot := exec.Command("nsenter", "-t", pid, "-m", "-n", "--", "/bin/sh", "-c", "cat "+m+"/group-in && cat "+m+"/secret")
	if out, err := asRoot.CombinedOutput(); err == nil || !strings.Contains(string(out), "nogroup may read") || strings.Contains(string(out), "root's secret") {
		t.Errorf("root on the compute node, through the cache: %v\n%s\nwant group-in read and secret refused", err, out)
	}
	for _, p := range []string{"secret", "group-out", "ro/inside", "acl-denied"} {
		if st, _ := os.Stat(filepath.Join(pfs, p)); st == nil || st.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("%s changed hands on the PFS: %v", p, st)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(pfs, "ro")); len(entries) != 1 {
		t.Errorf("root's read-only directory on the PFS holds %v", entries)
	}

	// The swaps, with the job's I/O through the cache beside them.
	attack, _ := json.Marshal(swaprace.Spec{Work: filepath.Join(pfs, "work"), Through: m + "/work", Victim: victim, Duration: 3 * time.Second})
	attacker := c.onHost("hostb", fmt.Sprintf("%s=%s exec %s", attackEnv, shellQuote(string(attack)), helperBinary(t)))
	jobIO := c.onHost("hostb", fmt.Sprintf(`d=%s/work/d; end=$(($(date +%%s)+4)); n=0
while [ $(date +%%s) -lt $end ]; do
  n=$((n+1))
  cat $d/target 2>/dev/null
  echo "written $n" >> $d/target 2>/dev/null
  head -c 300000 /dev/urandom > $d/data 2>/dev/null && cat $d/data > /dev/null 2>&1
  echo "file $n" > $d/f$n 2>/dev/null; cat $d/f$n 2>/dev/null
done; echo "rounds $n"`, m))
	var attackOut, ioOut bytes.Buffer
	attacker.Stdout, attacker.Stderr = &attackOut, &attackOut
	jobIO.Stdout, jobIO.Stderr = &ioOut, &ioOut
	if err := attacker.Start(); err != nil {
		t.Fatal(err)
	}
	if err := jobIO.Start(); err != nil {
		t.Fatal(err)
	}
	ioErr, attackErr := jobIO.Wait(), attacker.Wait()
	var rep swaprace.Report
	if attackErr != nil || json.Unmarshal(bytes.TrimSpace(attackOut.Bytes()), &rep) != nil {
		t.Fatalf("the attacker: %v\n%s", attackErr, attackOut.String())
	}
	t.Logf("the attack: %s; the job's I/O: %v, %s", rep, ioErr, lastLine(ioOut.String()))
	if rep.Exchanges < 10 || rep.Chmods < 10 || rep.Creates < 10 {
		t.Fatalf("the attack did not run (%s): the test would prove nothing", rep)
	}
	if bytes.Contains(ioOut.Bytes(), []byte("canary")) {
		t.Errorf("the job read root's canary outside the PFS tree through the cache")
	}
	// Leave the directory a directory (the attack may stop mid-swap), as the job's user would.
	work := filepath.Join(pfs, "work")
	if st, err := os.Lstat(filepath.Join(work, swaprace.DirName)); err == nil && st.Mode()&os.ModeSymlink != 0 {
		if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(work, swaprace.DirName), unix.AT_FDCWD, filepath.Join(work, swaprace.LinkName), unix.RENAME_EXCHANGE); err != nil {
			t.Fatal(err)
		}
	}
	j.end()
	assertCanary := func() {
		t.Helper()
		st, err := os.Lstat(target)
		if err != nil || st.Mode() != canaryInfo.Mode() || !st.ModTime().Equal(canaryInfo.ModTime()) || st.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Errorf("root's canary outside the PFS tree changed: %v %v (was %v, %v)", st.Mode(), err, canaryInfo.Mode(), canaryInfo.ModTime())
		}
		if data, _ := os.ReadFile(target); !bytes.Equal(data, canary) {
			t.Errorf("root's canary outside the PFS tree holds %q", data)
		}
		if entries, _ := os.ReadDir(victim); len(entries) != 1 {
			t.Errorf("files were created in root's directory outside the PFS tree: %v", entries)
		}
	}
	assertCanary()
	// What the job made is nobody's, on the PFS, with what it wrote.
	filepath.WalkDir(pfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == pfs {
			return nil
		}
		rel, _ := filepath.Rel(pfs, p)
		if rel == "secret" || rel == "acl-denied" || rel == "ro" || strings.HasPrefix(rel, "ro/") || strings.HasPrefix(rel, "group-") {
			return nil
		}
		if st, err := os.Lstat(p); err == nil && (st.Sys().(*syscall.Stat_t).Uid != nobodyUID || st.Sys().(*syscall.Stat_t).Gid != nobodyGID) {
			t.Errorf("%s on the PFS is owned by %d:%d, want nobody's", rel, st.Sys().(*syscall.Stat_t).Uid, st.Sys().(*syscall.Stat_t).Gid)
		}
		return nil
	})
	if data, err := os.ReadFile(filepath.Join(pfs, "mydir", "f")); err != nil || string(data) != "deeper\n" {
		t.Errorf("the job's file on the PFS: %q %v", data, err)
	}
	c.assertClean()
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
