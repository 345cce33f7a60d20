// Command fuseuringstat measures a stat loop over three FUSE servers of the same fixed tree
// (files f0 … f<N-1>, file i of size i, entry and attribute timeouts 0 so that every stat
// is a LOOKUP and a GETATTR): internal/fuseuring's Go prototype over io_uring, the same
// prototype over /dev/fuse, and go-fuse v2's fs package over /dev/fuse (what Spillway's
// mounts are built on). The servers run in this process; the loop runs in a child process
// (this program again, with -loop), so the daemon's CPU (this process) and the workload's
// (the child) are counted apart. Part of bench/fuse_uring_bench.py, which sets
// /sys/module/fuse/parameters/enable_uring for it; prints a Markdown table.
//
// The prototype's io_uring runs twice: each request handled on its queue's thread (as libfuse
// and go-fuse's iouring branch do) and on a goroutine of its own (Workers). With -delay every
// LOOKUP and GETATTR sleeps, as a network file system's handler waits: what the queue's thread
// serializes.
//
// Usage: fuseuringstat [-files 1000] [-stats 100000] [-threads 1,4] [-repeat 3] [-delay 0]
//
//	[-readers 2] [-entries 4]   (as root)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/spillway-hpc/spillway/internal/fuseuring"
)

func main() {
	files := flag.Int("files", 1000, "files in the tree")
	stats := flag.Int("stats", 100000, "stats per run, split over the threads")
	threadList := flag.String("threads", "1,4", "threads of the stat loop, comma-separated (a run each)")
	repeat := flag.Int("repeat", 3, "repetitions (the figures are their medians)")
	loop := flag.String("loop", "", "internal: run the stat loop on this directory")
	flag.DurationVar(&delay, "delay", 0, "every LOOKUP and GETATTR of the prototype sleeps this long (a handler "+
		"waiting on the network); go-fuse is then left out")
	flag.IntVar(&readers, "readers", 2, "goroutines reading /dev/fuse in the prototype's /dev/fuse variant")
	flag.IntVar(&entries, "entries", 4, "ring entries per CPU queue in the prototype's io_uring variants")
	flag.Parse()
	if *loop != "" {
		os.Exit(statLoop(*loop, *files, *stats, *threadList))
	}
	if delay > 0 {
		variants = slices.DeleteFunc(variants, func(v string) bool { return v == "gofuse" })
	}
	if err := run(*files, *stats, *threadList, *repeat); err != nil {
		fmt.Fprintln(os.Stderr, "fuseuringstat:", err)
		os.Exit(1)
	}
}

// statLoop stats the tree's files round robin, stats/threads times in each of threads
// goroutines, and prints the seconds it took.
func statLoop(dir string, files, stats int, threadArg string) int {
	threads, err := strconv.Atoi(threadArg)
	if err != nil || threads < 1 {
		fmt.Fprintln(os.Stderr, "-threads: want one number with -loop")
		return 2
	}
	names := make([]string, files)
	for i := range names {
		names[i] = filepath.Join(dir, "f"+strconv.Itoa(i))
	}
	var wg sync.WaitGroup
	errs := make(chan error, threads)
	start := time.Now()
	for t := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st syscall.Stat_t
			for i := range stats / threads {
				n := (t*7919 + i) % files
				if err := syscall.Stat(names[n], &st); err != nil || st.Size != int64(n) {
					errs <- fmt.Errorf("stat %s: %v (size %d)", names[n], err, st.Size)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(time.Since(start).Seconds())
	return 0
}

type server interface {
	close() error
	requests() (ring, dev uint64) // ^0 when not counted
}

type proto struct{ *fuseuring.Server }

func (p proto) close() error                 { return p.Close() }
func (p proto) requests() (ring, dev uint64) { return p.Requests() }

type gofuse struct{ *fuse.Server }

func (g gofuse) close() error                 { return g.Unmount() }
func (g gofuse) requests() (ring, dev uint64) { return ^uint64(0), ^uint64(0) }

// tree is go-fuse's version of the prototype's fixed tree.
type tree struct {
	fs.Inode
	files int
}

func (r *tree) OnAdd(ctx context.Context) {
	for i := range r.files {
		ch := r.NewPersistentInode(ctx, &file{size: uint64(i)}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: uint64(i) + 2})
		r.AddChild("f"+strconv.Itoa(i), ch, false)
	}
}

type file struct {
	fs.Inode
	size uint64
}

func (f *file) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode, out.Size, out.Nlink = syscall.S_IFREG|0o644, f.size, 1
	return 0
}

var (
	variants = []string{"uring", "uringw", "dev", "gofuse"}
	delay    time.Duration
	readers  int
	entries  int
)

var labels = map[string]string{
	"uring":  "Go prototype, io_uring, handled on the queue's thread",
	"uringw": "Go prototype, io_uring, handled on a goroutine each",
	"dev":    "Go prototype, /dev/fuse",
	"gofuse": "go-fuse v2 fs, /dev/fuse",
}

func mount(v, dir string, files int) (server, error) {
	switch v {
	case "uring", "uringw", "dev":
		t := fuseuring.Dev
		if v != "dev" {
			t = fuseuring.Uring
		}
		s, err := fuseuring.Mount(dir, fuseuring.Options{Files: files, Transport: t, Workers: v == "uringw",
			Entries: entries, Readers: readers, Delay: delay})
		if err != nil {
			return nil, err
		}
		if s.Transport() != t {
			s.Close()
			return nil, fmt.Errorf("%s: the kernel did not offer FUSE over io_uring (set /sys/module/fuse/parameters/enable_uring to Y)", v)
		}
		return proto{s}, nil
	}
	zero := time.Duration(0)
	s, err := fs.Mount(dir, &tree{files: files}, &fs.Options{EntryTimeout: &zero, AttrTimeout: &zero,
		NegativeTimeout: &zero, MountOptions: fuse.MountOptions{AllowOther: true, FsName: "fuseuringstat"}})
	if err != nil {
		return nil, err
	}
	return gofuse{s}, nil
}

type record struct{ rate, daemon, workload, requests float64 }

func run(files, stats int, threadList string, repeat int) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root: the prototype mounts FUSE itself")
	}
	var threads []int
	for _, f := range strings.Split(threadList, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return fmt.Errorf("-threads %q: want numbers like 1,4", threadList)
		}
		threads = append(threads, n)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	base, err := os.MkdirTemp("", "fuseuringstat-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(base)
	servers := map[string]server{}
	defer func() {
		for _, s := range servers {
			s.close()
		}
	}()
	dirs := map[string]string{}
	for _, v := range variants {
		dirs[v] = filepath.Join(base, v)
		if err := os.Mkdir(dirs[v], 0o755); err != nil {
			return err
		}
		s, err := mount(v, dirs[v], files)
		if err != nil {
			return fmt.Errorf("%s: %w", labels[v], err)
		}
		servers[v] = s
	}
	results := map[string][]record{}
	load0 := loadavg()
	for rep := range repeat {
		order := append(slices.Clone(variants[rep%len(variants):]), variants[:rep%len(variants)]...)
		for _, v := range order {
			for _, t := range threads {
				key := v + "/" + strconv.Itoa(t)
				var self0, child0 syscall.Rusage
				syscall.Getrusage(syscall.RUSAGE_SELF, &self0)
				syscall.Getrusage(syscall.RUSAGE_CHILDREN, &child0)
				ring0, dev0 := servers[v].requests()
				out, err := exec.Command(self, "-loop", dirs[v], "-files", strconv.Itoa(files), "-stats",
					strconv.Itoa(stats), "-threads", strconv.Itoa(t)).Output()
				if err != nil {
					return fmt.Errorf("%s, %d threads: the stat loop: %v", labels[v], t, err)
				}
				var self1, child1 syscall.Rusage
				syscall.Getrusage(syscall.RUSAGE_SELF, &self1)
				syscall.Getrusage(syscall.RUSAGE_CHILDREN, &child1)
				ring1, dev1 := servers[v].requests()
				secs, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
				if err != nil || secs <= 0 {
					return fmt.Errorf("%s: the stat loop said %q", labels[v], out)
				}
				n := float64(stats / t * t)
				req := -1.0
				if ring0 != ^uint64(0) {
					req = float64(ring1-ring0+dev1-dev0) / n
				}
				results[key] = append(results[key], record{rate: n / secs, daemon: cpu(self0, self1) / n,
					workload: cpu(child0, child1) / n, requests: req})
			}
		}
	}
	fmt.Printf("| stat loop | %s |\n|---|%s\n", strings.Join(mapLabels(), " | "), strings.Repeat("---:|", len(variants)))
	for _, t := range threads {
		cells := []string{}
		for _, v := range variants {
			rs := results[v+"/"+strconv.Itoa(t)]
			m := func(f func(record) float64) float64 {
				xs := []float64{}
				for _, r := range rs {
					xs = append(xs, f(r))
				}
				sort.Float64s(xs)
				return xs[len(xs)/2]
			}
			rate := m(func(r record) float64 { return r.rate })
			cell := fmt.Sprintf("**%.0f**", rate)
			if v == "uring" || v == "uringw" {
				dev := results["dev/"+strconv.Itoa(t)]
				if len(dev) > 0 {
					cell += fmt.Sprintf(" (%.2f× /dev/fuse)", rate/medianRate(dev))
				}
			}
			d, w := m(func(r record) float64 { return r.daemon }), m(func(r record) float64 { return r.workload })
			cell += fmt.Sprintf("<br>%.1f µs (%.1f + %.1f)", (d+w)*1e6, d*1e6, w*1e6)
			if req := m(func(r record) float64 { return r.requests }); req >= 0 {
				cell += fmt.Sprintf("<br>%.1f requests", req)
			}
			cells = append(cells, cell)
		}
		fmt.Printf("| %d thread%s, stats/s | %s |\n", t, map[bool]string{true: "s", false: ""}[t > 1], strings.Join(cells, " | "))
	}
	fmt.Printf("\nload average %.2f at the start, %.2f at the end\n", load0, loadavg())
	return nil
}

func medianRate(rs []record) float64 {
	xs := []float64{}
	for _, r := range rs {
		xs = append(xs, r.rate)
	}
	sort.Float64s(xs)
	return xs[len(xs)/2]
}

func mapLabels() []string {
	out := []string{}
	for _, v := range variants {
		out = append(out, labels[v])
	}
	return out
}

func cpu(a, b syscall.Rusage) float64 {
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(b.Utime) - tv(a.Utime) + tv(b.Stime) - tv(a.Stime)
}

func loadavg() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f, _ := strconv.ParseFloat(strings.Fields(string(b) + " 0")[0], 64)
	return f
}
