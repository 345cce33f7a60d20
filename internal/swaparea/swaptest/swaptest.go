// Package swaptest helps the tests of swap areas: swap is global to the kernel, so they take
// one lock (LockFile) across packages; they make memory cgroups (v1), XFS file systems on loop
// devices, and run a memory hog (HogMain, run by the test binary) in a cgroup.
package swaptest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// LockFile serializes every test that attaches swap on this host.
const LockFile = "/run/spillway-swaptest.lock"

// HogArg is the test binary's first argument that makes it the hog (HogMain).
const HogArg = "swap-hog"

// Require skips the test unless it runs as root with what swap tests need.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("swap areas need root")
	}
	for _, p := range []string{"/dev/loop-control", "/proc/swaps", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("swap tests need %s (loop devices, swap, cgroup v1 memory): %v", p, err)
		}
	}
	for _, tool := range []string{"swapoff", "mkfs.xfs", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("swap tests need %s", tool)
		}
	}
}

// Lock takes the host's swap test lock until the test ends, and checks at the end that no
// swap area and no loop device over a file of the test's (its temporary directories, named
// after it) is left. Others' (another suite's run on the host) are not the test's concern.
func Lock(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(LockFile, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	mine := func(file string) bool { return strings.Contains(file, "/"+t.Name()) }
	t.Cleanup(func() {
		defer f.Close()
		if t.Failed() {
			return
		}
		loops := loopsNow()
		raw, _ := os.ReadFile("/proc/swaps")
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n")[1:] {
			name, _, _ := strings.Cut(line, " ")
			if mine(name) || mine(loops[filepath.Base(name)]) {
				t.Errorf("swap area left after the test: %s", line)
			}
		}
		for dev, file := range loops {
			if mine(file) {
				t.Errorf("loop device %s (over %s) left after the test", dev, file)
			}
		}
	})
}

func loopsNow() map[string]string {
	names, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	out := map[string]string{}
	for _, p := range names {
		raw, _ := os.ReadFile(p)
		out[filepath.Base(filepath.Dir(filepath.Dir(p)))] = strings.TrimSpace(string(raw))
	}
	return out
}

// XFS makes an XFS file system of size bytes in an image under a temporary directory, mounts
// it and returns its mount point (root's, 0700); everything goes at the test's end, after
// the cleanups registered later (the swap areas on it).
func XFS(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	image := filepath.Join(dir, "xfs.img")
	f, err := os.Create(image)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(size)
	f.Close()
	if out, err := exec.Command("mkfs.xfs", "-q", image).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	out, err := exec.Command("losetup", "--find", "--show", image).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o700)
	if err := unix.Mount(dev, mnt, "xfs", 0, ""); err != nil {
		exec.Command("losetup", "-d", dev).Run()
		t.Fatalf("mount %s: %v", dev, err)
	}
	os.Chmod(mnt, 0o700)
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		exec.Command("losetup", "-d", dev).Run()
	})
	return mnt
}

// Cgroup makes a v1 memory cgroup limited to limit bytes, memory.swappiness 60 (the
// kernel's default, set so that a host's tuning does not change the test), removed at the
// test's end.
func Cgroup(t testing.TB, limit int64) string {
	t.Helper()
	path := fmt.Sprintf("/sys/fs/cgroup/memory/spillway-swaptest-%d-%d", os.Getpid(), time.Now().UnixNano())
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 100; i++ { // its processes may take a moment to be reaped
			if err := os.Remove(path); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Errorf("cannot remove cgroup %s", path)
	})
	for file, v := range map[string]string{"memory.limit_in_bytes": strconv.FormatInt(limit, 10), "memory.swappiness": "60"} {
		if err := os.WriteFile(filepath.Join(path, file), []byte(v), 0); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	return path
}

// NoSwap forbids the cgroup any swap (memory.memsw.limit_in_bytes equal to its memory limit):
// "without swap" whatever swap areas the host has (another suite's, the node's own).
func NoSwap(t testing.TB, cgroup string) {
	t.Helper()
	limit, err := os.ReadFile(filepath.Join(cgroup, "memory.limit_in_bytes"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cgroup, "memory.memsw.limit_in_bytes"), []byte(strings.TrimSpace(string(limit))), 0); err != nil {
		t.Skipf("cannot forbid a cgroup swap (memory.memsw.limit_in_bytes; swapaccount=1 missing?): %v", err)
	}
}

// TestPriority is the swapon priority tests give their areas: above any other area the host
// may have (another suite's), so that the pages go to the area under test.
const TestPriority = 32000

// OOMKills is how many processes the kernel's OOM killer killed in the cgroup.
func OOMKills(cgroup string) int {
	raw, _ := os.ReadFile(filepath.Join(cgroup, "memory.oom_control"))
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// Hog is a memory hog running in a cgroup.
type Hog struct {
	Cmd    *exec.Cmd
	Out    *bytes.Buffer
	ready  *os.File // the hog writes a line once it has touched its memory
	resume *os.File // closing it lets the hog read its memory back and end
}

// StartHog runs the test binary (exe) as a hog in cgroup: it touches mib MiB of anonymous
// memory (each page written with its own number), says so, waits until Finish, then reads
// every page back and checks it.
func StartHog(t testing.TB, exe, cgroup string, mib int) *Hog {
	t.Helper()
	readyR, readyW, _ := os.Pipe()
	resumeR, resumeW, _ := os.Pipe()
	cmd := exec.Command(exe, HogArg, filepath.Join(cgroup, "cgroup.procs"), strconv.Itoa(mib))
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = []*os.File{readyW, resumeR} // fds 3 and 4
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	readyW.Close()
	resumeR.Close()
	h := &Hog{Cmd: cmd, Out: out, ready: readyR, resume: resumeW}
	t.Cleanup(func() {
		h.resume.Close()
		h.ready.Close()
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return h
}

// Touched waits until the hog has touched all its memory (true), or it ended first (false).
func (h *Hog) Touched() bool {
	buf := make([]byte, 16)
	n, _ := h.ready.Read(buf)
	return n > 0
}

// Finish lets the hog read its memory back and waits for it: its wait status.
func (h *Hog) Finish() syscall.WaitStatus {
	h.resume.Close()
	h.Cmd.Wait()
	return h.Cmd.ProcessState.Sys().(syscall.WaitStatus)
}

// Pid is the hog's process id.
func (h *Hog) Pid() int { return h.Cmd.Process.Pid }

// HogMain is the hog: args are the cgroup.procs file to join and the MiB to touch.
func HogMain(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: swap-hog CGROUP_PROCS MIB")
		return 2
	}
	if err := os.WriteFile(args[0], []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		fmt.Fprintln(os.Stderr, "join cgroup:", err)
		return 2
	}
	mib, _ := strconv.Atoi(args[1])
	size := mib << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mmap:", err)
		return 2
	}
	page := os.Getpagesize()
	for off := 0; off < size; off += page {
		// Distinct contents (no zero page, nothing to merge): the page's number and a pattern.
		binary.LittleEndian.PutUint64(mem[off:], uint64(off/page)^0x5a5a5a5a5a5a5a5a)
		mem[off+page-1] = byte(off / page)
	}
	ready, resume := os.NewFile(3, "ready"), os.NewFile(4, "resume")
	ready.Write([]byte("touched\n"))
	ready.Close()
	buf := make([]byte, 1)
	resume.Read(buf) // until the test lets it go on (or goes away)
	for off := 0; off < size; off += page {
		if binary.LittleEndian.Uint64(mem[off:]) != uint64(off/page)^0x5a5a5a5a5a5a5a5a || mem[off+page-1] != byte(off/page) {
			fmt.Fprintf(os.Stderr, "page %d came back wrong\n", off/page)
			return 1
		}
	}
	fmt.Printf("verified %d MiB\n", mib)
	return 0
}
