// Command swapbench drives swap areas for bench/swap_bench.py (issue 22's benchmark): a
// storage agent serving a swap instance's namespace (serve), and one measurement of a memory
// hog twice its cgroup's limit through a co-located area, a remote area or a plain swap file
// on the storage node's raw file system (run). It uses the agent's own AttachSwap/DetachSwap,
// in process: the job path (#DW swap through the controller) is another branch's.
//
//	swapbench serve --ssd DIR --listen ADDR --token T
//	swapbench run --mode colocated|remote|raw --dir DIR [--data ADDR --token T]
//	              [--limit-mib 512] [--hog-mib 1024]
//
// run prints one JSON line: the bytes paged out while the hog touched its memory and the
// seconds that took, the bytes paged in while it read its memory back and the seconds that
// took (/proc/vmstat pswpout and pswpin, so the three kinds are counted alike).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/agent"
	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/swaparea/swaptest"
	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == swaptest.HogArg {
		os.Exit(swaptest.HogMain(os.Args[2:]))
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: swapbench serve|run ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "run":
		err = run(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "swapbench:", err)
		os.Exit(1)
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// storage makes an agent holding fragment 1 of instance 1 and the swap instance's namespace 2.
func storage(name, ssd, token string) (*agent.Agent, error) {
	a, err := agent.New(agent.Options{Name: name, Pool: "p", SSDPath: ssd, Capacity: 8 << 30, Token: token, Log: quiet,
		Swap: agent.SwapOptions{DetachTimeout: 5 * time.Minute, LockMemory: true}})
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 1, InstanceID: 1, Capacity: 4 << 30, InstanceCapacity: 4 << 30}); err != nil {
		return nil, err
	}
	return a, a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: 2, FragmentID: 1, InstanceID: 1, Mode: 0o700})
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	ssd := fs.String("ssd", "", "the storage agent's SSD path")
	listen := fs.String("listen", "", "the data server's address")
	token := fs.String("token", "", "the cluster's secret")
	fs.Parse(args)
	a, err := storage("s1", *ssd, *token)
	if err != nil {
		return err
	}
	defer func() { a.Close(); a.DeleteFragment(context.Background(), 1) }()
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	// The storage node's agent locks its memory too, as a compute node's does.
	unix.Mlockall(unix.MCL_CURRENT | unix.MCL_FUTURE)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	fmt.Println("ready")
	return a.ServeData(ctx, l)
}

type result struct {
	Mode       string  `json:"mode"`
	OutBytes   uint64  `json:"out_bytes"`
	OutSeconds float64 `json:"out_seconds"`
	InBytes    uint64  `json:"in_bytes"`
	InSeconds  float64 `json:"in_seconds"`
	// InPhaseOut is what was paged out again while the hog read its memory back (the cgroup
	// is still at its limit: reading a page back pushes another out).
	InPhaseOut uint64 `json:"in_phase_out_bytes"`
}

func vmstat() (out, in uint64) {
	raw, _ := os.ReadFile("/proc/vmstat")
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, _ := strings.Cut(line, " ")
		n, _ := strconv.ParseUint(v, 10, 64)
		switch k {
		case "pswpout":
			out = n * uint64(os.Getpagesize())
		case "pswpin":
			in = n * uint64(os.Getpagesize())
		}
	}
	return
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	mode := fs.String("mode", "", "colocated | remote | raw")
	dir := fs.String("dir", "", "a directory on the storage node's raw file system")
	data := fs.String("data", "", "the storage agent's data address (remote)")
	token := fs.String("token", "", "the cluster's secret (remote)")
	limitMiB := fs.Int("limit-mib", 512, "the hog's cgroup limit")
	hogMiB := fs.Int("hog-mib", 1024, "the memory the hog touches")
	fs.Parse(args)
	lock, err := os.OpenFile(swaptest.LockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	size := uint64(*hogMiB+*hogMiB/2) << 20
	ctx := context.Background()
	res := result{Mode: *mode}
	var detach func() error
	switch *mode {
	case "colocated":
		a, err := storage("c1", filepath.Join(*dir, "colocated"), "")
		if err != nil {
			return err
		}
		defer func() { a.Close(); a.DeleteFragment(ctx, 1) }()
		spec := agentapi.SwapSpec{ID: 1, InstanceID: 1, Node: "c1", Size: size, Priority: swaptest.TestPriority, StorageNode: "c1", FragmentID: 1, NamespaceID: 2, FileName: "swap-1-c1"}
		if err := a.AttachSwap(ctx, spec); err != nil {
			return err
		}
		detach = func() error { return detachAll(a) }
	case "remote":
		a, err := agent.New(agent.Options{Name: "c1", SSDPath: filepath.Join(*dir, "compute"), Token: *token, Log: quiet,
			Swap: agent.SwapOptions{DetachTimeout: 5 * time.Minute, LockMemory: true}})
		if err != nil {
			return err
		}
		defer a.Close()
		spec := agentapi.SwapSpec{ID: 1, InstanceID: 1, Node: "c1", Size: size, Priority: swaptest.TestPriority, StorageNode: "s1", FragmentID: 1, NamespaceID: 2, FileName: "swap-1-c1",
			Mount: &agentapi.MountSpec{StorageNode: "s1", FragmentID: 1, NamespaceID: 2, InstanceID: 1, Capacity: 4 << 30, DataAddress: *data}}
		if err := a.AttachSwap(ctx, spec); err != nil {
			return err
		}
		detach = func() error { return detachAll(a) }
	case "raw":
		// The kernel's own swap file, on the file system the storage node's SSD path is on.
		os.MkdirAll(*dir, 0o700)
		file := filepath.Join(*dir, "raw.swap")
		f, err := os.OpenFile(file, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		err = unix.Fallocate(int(f.Fd()), 0, 0, int64(size))
		f.Close()
		if err != nil {
			return err
		}
		for _, argv := range [][]string{{"mkswap", "-q", file}, {"swapon", "-p", strconv.Itoa(swaptest.TestPriority), file}} {
			if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
				os.Remove(file)
				return fmt.Errorf("%s: %v: %s", argv[0], err, out)
			}
		}
		detach = func() error {
			if out, err := exec.Command("swapoff", file).CombinedOutput(); err != nil {
				return fmt.Errorf("swapoff: %v: %s", err, out)
			}
			return os.Remove(file)
		}
	default:
		return fmt.Errorf("--mode %q: give colocated, remote or raw", *mode)
	}
	measureErr := measure(&res, *limitMiB, *hogMiB)
	if err := detach(); err != nil {
		return err
	}
	if measureErr != nil {
		return measureErr
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// detachAll polls the detach of area 1 until it is done.
func detachAll(a *agent.Agent) error {
	for {
		st, err := a.DetachSwap(context.Background(), agentapi.SwapDetachSpec{ID: 1})
		if err != nil {
			return err
		}
		if st.Error != "" {
			return fmt.Errorf("detach: %s", st.Error)
		}
		if st.Done {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// measure runs the hog in a cgroup of its own and times its two phases.
func measure(res *result, limitMiB, hogMiB int) error {
	cg := fmt.Sprintf("/sys/fs/cgroup/memory/spillway-swapbench-%d", os.Getpid())
	if err := os.Mkdir(cg, 0o755); err != nil {
		return err
	}
	defer func() {
		for i := 0; i < 100 && os.Remove(cg) != nil; i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}()
	for file, v := range map[string]string{"memory.limit_in_bytes": strconv.Itoa(limitMiB << 20), "memory.swappiness": "60"} {
		if err := os.WriteFile(filepath.Join(cg, file), []byte(v), 0); err != nil {
			return err
		}
	}
	exe, _ := os.Executable()
	readyR, readyW, _ := os.Pipe()
	resumeR, resumeW, _ := os.Pipe()
	cmd := exec.Command(exe, swaptest.HogArg, filepath.Join(cg, "cgroup.procs"), strconv.Itoa(hogMiB))
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{readyW, resumeR}
	out0, _ := vmstat()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	readyW.Close()
	resumeR.Close()
	buf := make([]byte, 16)
	if n, _ := readyR.Read(buf); n == 0 {
		cmd.Wait()
		return fmt.Errorf("the hog ended before it touched its memory: %v", cmd.ProcessState)
	}
	res.OutSeconds = time.Since(start).Seconds()
	out1, in1 := vmstat()
	res.OutBytes = out1 - out0
	start = time.Now()
	resumeW.Close()
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("the hog: %v", err)
	}
	res.InSeconds = time.Since(start).Seconds()
	out2, in2 := vmstat()
	res.InBytes, res.InPhaseOut = in2-in1, out2-out1
	return nil
}
