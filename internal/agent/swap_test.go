package agent

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/agentclient"
	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/swaparea"
	"github.com/spillway-hpc/spillway/internal/swaparea/swaptest"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
)

const (
	swapCgroupLimit = 64 << 20
	swapHogMiB      = 128 // twice the cgroup's limit
	swapAreaSize    = 256 << 20
)

// swapStorage is a storage agent with an XFS fragment (1) of instance 1 holding the swap
// instance's namespace (2): root's, 0700, as the controller makes it.
func swapStorage(t *testing.T, name string) (*Agent, string) {
	t.Helper()
	needXFSLoop(t)
	ssd := filepath.Join(t.TempDir(), "ssd")
	a, err := New(Options{Name: name, Pool: "p", SSDPath: ssd, Capacity: 8 << 30, FragmentFS: FragmentXFSLoop, Token: "swap-secret",
		Swap: SwapOptions{DetachTimeout: time.Minute, LockMemory: true}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 1, InstanceID: 1, Capacity: 1 << 30, InstanceCapacity: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.Close()
		if err := a.DeleteFragment(context.Background(), 1); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: 2, FragmentID: 1, InstanceID: 1, Owner: 0, Group: 0, Mode: 0o700}); err != nil {
		t.Fatal(err)
	}
	return a, ssd
}

func swapSpec(id int64, node, storage string) agentapi.SwapSpec {
	return agentapi.SwapSpec{ID: id, InstanceID: 1, Job: "job-" + strconv.FormatInt(id, 10), Node: node, Size: swapAreaSize, Priority: swaptest.TestPriority,
		StorageNode: storage, FragmentID: 1, NamespaceID: 2, FileName: "swap-" + strconv.FormatInt(id, 10) + "-" + node}
}

// detachAll polls a detach until it is done.
func detachSwap(t *testing.T, ag agentapi.Agent, id int64) agentapi.SwapStatus {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := ag.DetachSwap(context.Background(), agentapi.SwapDetachSpec{ID: id, Timeout: time.Minute.Milliseconds()})
		if err != nil {
			t.Fatalf("detach swap area %d: %v", id, err)
		}
		if st.Done {
			return st
		}
		if st.Error != "" || time.Now().After(deadline) {
			t.Fatalf("detach swap area %d: %+v", id, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runHog runs a hog twice its cgroup's limit to its end: whether it completed. noSwap
// forbids its cgroup any swap.
func runHog(t *testing.T, noSwap bool) (bool, string) {
	t.Helper()
	exe, _ := os.Executable()
	cg := swaptest.Cgroup(t, swapCgroupLimit)
	if noSwap {
		swaptest.NoSwap(t, cg)
	}
	hog := swaptest.StartHog(t, exe, cg, swapHogMiB)
	if !hog.Touched() {
		hog.Finish()
		return false, hog.Out.String()
	}
	ws := hog.Finish()
	return ws.ExitStatus() == 0 && strings.Contains(hog.Out.String(), "verified"), hog.Out.String()
}

func swapUsageOf(t *testing.T, a *Agent, id int64) agentapi.SwapUsage {
	t.Helper()
	rep, _ := a.Report(context.Background())
	for _, u := range rep.Usage.Swaps {
		if u.ID == id {
			return u
		}
	}
	t.Fatalf("no usage of swap area %d in %+v", id, rep.Usage.Swaps)
	return agentapi.SwapUsage{}
}

func inProcSwaps(dev string) bool {
	entries, _ := swaparea.Swaps()
	for _, e := range entries {
		if e.Filename == dev {
			return true
		}
	}
	return false
}

// A co-located compute node (the storage node is the node itself) gets a swap area on its
// fragment's file system, through the agent API over HTTP: a process twice its cgroup's limit
// completes with it, /proc/swaps shows the area while it is attached and not after; the
// report counts the pages; an agent restarted with the area attached finds it again
// (attaching it again attaches nothing twice) and detaches it.
func TestSwapAreaCoLocatedThroughTheAgentAPI(t *testing.T) {
	swaptest.Require(t)
	swaptest.Lock(t)
	a, ssd := swapStorage(t, "ssd1")
	srv := httptest.NewServer(Handler(a, "api-secret"))
	defer srv.Close()
	c, err := agentclient.New("ssd1", srv.URL, apiclient.Options{Token: "api-secret", ConnectRetries: 1, RequestTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if ok, out := runHog(t, true); ok {
		t.Fatalf("without swap the hog completed: %s", out)
	}
	spec := swapSpec(5, "ssd1", "ssd1")
	if err := c.AttachSwap(ctx, spec); err != nil {
		t.Fatal(err)
	}
	detached := false
	t.Cleanup(func() {
		if !detached {
			detachSwap(t, a, 5)
		}
	})
	file := filepath.Join(ssd, "fragment/1/namespace/2", spec.FileName)
	area, ok := swaparea.Find(file)
	if !ok || !area.Swapping || !area.DirectIO || !inProcSwaps(area.Device) {
		t.Fatalf("after the attach: %+v %v (in /proc/swaps: %v)", area, ok, inProcSwaps(area.Device))
	}
	if err := c.AttachSwap(ctx, spec); err != nil {
		t.Fatalf("attaching again: %v", err)
	}
	if ok, out := runHog(t, false); !ok {
		t.Fatalf("with a swap area the hog did not complete: %s", out)
	}
	u := swapUsageOf(t, a, 5)
	if u.BytesWritten == 0 || u.BytesRead == 0 || u.Instance != 1 || u.Node != "ssd1" {
		t.Errorf("usage after the hog: %+v", u)
	}

	// The agent restarts: the area is found again, attached once.
	a.Close()
	b, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: ssd, Capacity: 8 << 30, FragmentFS: FragmentXFSLoop, Swap: SwapOptions{DetachTimeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a = b
	if u2 := swapUsageOf(t, b, 5); u2.BytesWritten != u.BytesWritten {
		t.Errorf("after the restart the counters are %+v, were %+v", u2, u)
	}
	if err := b.AttachSwap(ctx, spec); err != nil {
		t.Fatalf("attaching again after the restart: %v", err)
	}
	if l := swaparea.List(filepath.Join(ssd, "fragment", "1")); len(l) != 1 || l[0].Device != area.Device {
		t.Fatalf("after the restart and an attach: %+v, want only %s", l, area.Device)
	}
	srv.Config.Handler = Handler(b, "api-secret")
	var st agentapi.SwapStatus
	for {
		if st, err = c.DetachSwap(ctx, agentapi.SwapDetachSpec{ID: 5, Timeout: time.Minute.Milliseconds()}); err != nil || st.Done || st.Error != "" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	detached = true
	if err != nil || !st.Done || st.BytesWritten == 0 {
		t.Fatalf("detach over the API: %+v %v", st, err)
	}
	if inProcSwaps(area.Device) {
		t.Error("the area is still in /proc/swaps after its detach")
	}
	if _, err := os.Lstat(file); !os.IsNotExist(err) {
		t.Errorf("the swap file is still there: %v", err)
	}
	if st, err := c.DetachSwap(ctx, agentapi.SwapDetachSpec{ID: 5}); err != nil || !st.Done {
		t.Errorf("detaching a detached area: %+v %v", st, err)
	}
}

// The reaper: an area the controller no longer lists is detached once older than the grace
// period (an abandoned job's), a listed one is kept.
func TestSwapAreaReaper(t *testing.T) {
	swaptest.Require(t)
	swaptest.Lock(t)
	a, _ := swapStorage(t, "ssd1")
	ctx := context.Background()
	for _, id := range []int64{6, 7} {
		s := swapSpec(id, "ssd1", "ssd1")
		s.Size = 16 << 20
		if err := a.AttachSwap(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { detachSwap(t, a, 7) })
	as := agentapi.Assignment{ClusterID: "c", Fragments: []int64{1}, Namespaces: []agentapi.NamespaceSpec{{ID: 2, FragmentID: 1}}, Swaps: []agentapi.SwapSpec{swapSpec(7, "ssd1", "ssd1")}}
	a.Reconcile(ctx, as, time.Hour)
	if len(a.swapUsage()) != 2 {
		t.Fatal("an area younger than the grace period was reaped")
	}
	for deadline := time.Now().Add(time.Minute); len(a.swapUsage()) != 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the reaper did not detach area 6: %+v", a.swapUsage())
		}
		a.Reconcile(ctx, as, time.Millisecond)
	}
	if u := a.swapUsage(); u[0].ID != 7 {
		t.Fatalf("the reaper took the listed area: %+v", u)
	}
}

// A remote compute node reaches the area through its agent's own Spillway mount of the
// namespace, served by the storage node's agent over the network: the hog completes, the
// agent's memory is locked (it serves the page-outs). Then the storage node is lost under a
// swapping process: the process is killed (SIGBUS) when it needs a page that was there, the
// agent says what happened (log, SwapStatus.Error), and the node survives: the area detaches.
func TestSwapAreaRemote(t *testing.T) {
	swaptest.Require(t)
	swaptest.Lock(t)
	storage, _ := swapStorage(t, "ssd1")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveCtx, stopServing := context.WithCancel(context.Background())
	defer stopServing()
	go storage.ServeData(serveCtx, l)

	compute, err := New(Options{Name: "c1", SSDPath: filepath.Join(t.TempDir(), "state"), Token: "swap-secret",
		Warpfs: client.Limits{RequestTimeout: 3 * time.Second, ConnectTimeout: time.Second, KeepaliveInterval: time.Second},
		Swap:   SwapOptions{DetachTimeout: time.Minute, LockMemory: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer compute.Close()
	mountSpec := func() *agentapi.MountSpec {
		return &agentapi.MountSpec{StorageNode: "ssd1", FragmentID: 1, NamespaceID: 2, InstanceID: 1, Capacity: 1 << 30, DataAddress: l.Addr().String()}
	}
	ctx := context.Background()
	spec := swapSpec(8, "c1", "ssd1")
	spec.Mount = mountSpec()
	if err := compute.AttachSwap(ctx, spec); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(compute.opt.SSDPath, "swap", "mnt", "8")
	area, ok := swaparea.Find(filepath.Join(mnt, spec.FileName))
	if !ok || !inProcSwaps(area.Device) {
		t.Fatalf("remote area not attached: %+v %v", area, ok)
	}
	t.Logf("remote area %s, direct I/O %v", area.Device, area.DirectIO)
	if locked := vmLocked(t); locked == 0 {
		t.Error("the agent serving a remote swap area has no memory locked (VmLck 0)")
	}
	if ok, out := runHog(t, false); !ok {
		t.Fatalf("with a remote swap area the hog did not complete: %s", out)
	}
	if u := swapUsageOf(t, compute, 8); u.BytesWritten == 0 || u.BytesRead == 0 {
		t.Errorf("usage of the remote area: %+v", u)
	}
	detachSwap(t, compute, 8)
	if inProcSwaps(area.Device) {
		t.Fatal("the remote area is still in /proc/swaps")
	}
	if _, err := os.Stat(filepath.Join(storage.namespaceDir(1, 2), spec.FileName)); !os.IsNotExist(err) {
		t.Errorf("the remote swap file is still on the storage node: %v", err)
	}
	if mountOptions(t, mnt) != "" {
		t.Error("the agent's mount of the remote area is still there")
	}

	// The storage node is lost under a swapping process.
	spec = swapSpec(9, "c1", "ssd1")
	spec.Mount = mountSpec()
	if err := compute.AttachSwap(ctx, spec); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	hog := swaptest.StartHog(t, exe, swaptest.Cgroup(t, swapCgroupLimit), swapHogMiB)
	if !hog.Touched() {
		t.Fatalf("with a remote swap area the hog was killed: %s", hog.Out)
	}
	stopServing()
	storage.Close()
	// The hog is a Go program: the runtime turns the SIGBUS into a fatal error, exit status 2.
	// Where the page the kernel would write the signal's frame on (the runtime's signal stack)
	// was on the lost node too, the kernel cannot deliver the SIGBUS and kills it with SIGSEGV
	// instead (seen on a loaded machine): the same outcome, the process alone pays.
	ws := hog.Finish()
	forced := ws.Signaled() && ws.Signal() == syscall.SIGSEGV && hog.Out.Len() == 0
	if !(ws.Signaled() && ws.Signal() == syscall.SIGBUS) && !strings.Contains(hog.Out.String(), "SIGBUS") && !forced {
		t.Errorf("a process whose pages were on a lost storage node ended with %v, not SIGBUS: %s", ws, hog.Out)
	}
	var st agentapi.SwapStatus
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		compute.Report(ctx) // the report looks at the remote areas
		st, err = compute.DetachSwap(ctx, agentapi.SwapDetachSpec{ID: 9, Timeout: time.Minute.Milliseconds()})
		if err != nil {
			t.Fatal(err)
		}
		if st.Done || time.Now().After(deadline) {
			break
		}
	}
	if !st.Done || !strings.Contains(st.Error, "storage node ssd1 of swap area 9") {
		t.Errorf("the detach of the lost storage node's area: %+v", st)
	}
	t.Logf("said: %s", st.Error)
	if inProcSwaps(area.Device) || mountOptions(t, filepath.Join(compute.opt.SSDPath, "swap", "mnt", "9")) != "" {
		t.Error("the area of the lost storage node is not gone")
	}
}

// vmLocked is this process's locked memory (VmLck), in kB.
func vmLocked(t *testing.T) int {
	raw, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmLck:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	return 0
}

// A detach whose pages cannot come back (the hog's cgroup at its limit, its OOM killer off,
// so the kernel cannot charge them) is reported with the kernel's reason, the area left
// attached and the hog's pages intact; the next call after the report tries again, and once
// the hog has ended the detach finishes.
func TestSwapDetachThatCannotFinishIsReported(t *testing.T) {
	swaptest.Require(t)
	swaptest.Lock(t)
	a, _ := swapStorage(t, "ssd1")
	ctx := context.Background()
	if err := a.AttachSwap(ctx, swapSpec(11, "ssd1", "ssd1")); err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	cg := swaptest.Cgroup(t, swapCgroupLimit)
	os.WriteFile(filepath.Join(cg, "memory.oom_control"), []byte("1"), 0)
	hog := swaptest.StartHog(t, exe, cg, swapHogMiB)
	if !hog.Touched() {
		t.Fatalf("with a swap area the hog was killed: %s", hog.Out)
	}
	var st agentapi.SwapStatus
	for deadline := time.Now().Add(time.Minute); st.Error == ""; time.Sleep(20 * time.Millisecond) {
		var err error
		if st, err = a.DetachSwap(ctx, agentapi.SwapDetachSpec{ID: 11, Timeout: time.Minute.Milliseconds()}); err != nil {
			t.Fatal(err)
		}
		if st.Done || time.Now().After(deadline) {
			t.Fatalf("the detach of pages that cannot come back: %+v", st)
		}
	}
	if !st.Attached || !strings.Contains(st.Error, "do not fit") || !inProcSwaps(st.Device) {
		t.Fatalf("a failed detach: %+v (in /proc/swaps: %v)", st, inProcSwaps(st.Device))
	}
	t.Logf("reported: %s", st.Error)
	if ws := hog.Finish(); ws.ExitStatus() != 0 {
		t.Fatalf("the hog's pages did not come back intact: %v %s", ws, hog.Out)
	}
	if st := detachSwap(t, a, 11); st.BytesWritten == 0 {
		t.Errorf("the final status has no counters: %+v", st)
	}
}

// swapAgentArg makes the test binary a compute node's agent that attaches remote swap area
// 12 and serves it until it is killed (swapAgentMain).
const swapAgentArg = "swap-agent"

func swapAgentMain(args []string) int {
	a, err := New(Options{Name: "c1", SSDPath: args[0], Token: "swap-secret", Swap: SwapOptions{LockMemory: true}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	spec := swapSpec(12, "c1", "ssd1")
	spec.Mount = &agentapi.MountSpec{StorageNode: "ssd1", FragmentID: 1, NamespaceID: 2, InstanceID: 1, Capacity: 1 << 30, DataAddress: args[1]}
	if err := a.AttachSwap(context.Background(), spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("attached")
	select {}
}

// A compute node's agent that stops while it serves a remote area takes the area's mount
// with it (a loop device cannot be given another file): the agent started again finds the
// area by its record, says what happened, and detaches it; nothing is left.
func TestSwapAreaRemoteAfterTheAgentStopped(t *testing.T) {
	swaptest.Require(t)
	swaptest.Lock(t)
	storage, _ := swapStorage(t, "ssd1")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveCtx, stopServing := context.WithCancel(context.Background())
	defer stopServing()
	go storage.ServeData(serveCtx, l)
	state := filepath.Join(t.TempDir(), "state")
	exe, _ := os.Executable()
	cmd := exec.Command(exe, swapAgentArg, state, l.Addr().String())
	var out strings.Builder
	cmd.Stderr = &out
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := stdout.Read(buf)
	if !strings.Contains(string(buf[:n]), "attached") {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the agent did not attach: %s", out.String())
	}
	cmd.Process.Kill()
	cmd.Wait()
	file := filepath.Join(state, "swap", "mnt", "12", "swap-12-c1")
	if area, ok := swaparea.Find(file); !ok || !area.Swapping {
		t.Fatalf("the area is not attached after its agent stopped: %+v %v", area, ok)
	}

	a, err := New(Options{Name: "c1", SSDPath: state, Token: "swap-secret", Swap: SwapOptions{DetachTimeout: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	st := detachSwap(t, a, 12)
	if !strings.Contains(st.Error, "ended when that agent process stopped") {
		t.Errorf("the detach does not say what happened: %+v", st)
	}
	t.Logf("said: %s", st.Error)
	if _, ok := swaparea.Find(file); ok {
		t.Error("the loop device is still there")
	}
	if mountOptions(t, filepath.Join(state, "swap", "mnt", "12")) != "" {
		t.Error("the dead mount is still there")
	}
}
