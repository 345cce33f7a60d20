// Package traceattack is the attacker of the tests that start workers as users (package
// asuser): what a job's user runs to take over a worker before it protects itself. It watches
// the newest pids and PTRACE_SEIZEs each worker as soon as it can, from its exec on; a worker
// it seizes is its to rewrite (its prctl, its code) and later to read what the worker holds.
// It is test support, run as the user in a separate process by the stage and PFS-door tests,
// so both suites run the same attack.
package traceattack

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/privdrop"
)

// Main attacks the processes whose command line begins with the NUL-separated words of
// cmdline until stdin closes, then prints "seen N" (workers it watched and could not seize),
// "won M" (workers it seized) and the pids it won; it returns the exit status. Only those
// processes are attacked: the user's others (other packages' tests among them) must not be
// stopped.
func Main(cmdline []string) int {
	runtime.LockOSThread() // a tracee belongs to the thread that seized it
	stop := make(chan struct{})
	go func() {
		bufio.NewReader(os.Stdin).ReadString('\n')
		close(stop)
	}()
	marker := []byte(strings.Join(cmdline, "\x00"))
	seen, won := map[int]bool{}, map[int]bool{}
	selfPid := os.Getpid()
	// workerOf is the worker process that the thread pid belongs to (0: none).
	workerOf := func(pid int) int {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if !bytes.HasPrefix(b, marker) {
			return 0
		}
		status, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		tgid, _ := strconv.Atoi(privdrop.StatusField(string(status), "Tgid"))
		return tgid
	}
	for {
		select {
		case <-stop:
			fmt.Printf("seen %d\nwon %d\n", len(seen), len(won))
			for pid := range won {
				fmt.Printf("won worker %d\n", pid)
			}
			return 0
		default:
		}
		b, err := os.ReadFile("/proc/sys/kernel/ns_last_pid")
		if err != nil {
			fmt.Println("cannot read ns_last_pid:", err)
			return 1
		}
		last, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		for pid := last - 24; pid <= last+2; pid++ {
			if pid <= 1 || pid == selfPid {
				continue
			}
			w := workerOf(pid)
			if w == 0 {
				continue
			}
			err := unix.PtraceSeize(pid)
			if err == nil {
				// Seized: stop it (where a real attacker would rewrite it) and let it go, so
				// that its exit still reaches its parent.
				won[w] = true
				unix.PtraceInterrupt(pid)
				var ws unix.WaitStatus
				unix.Wait4(pid, &ws, unix.WALL, nil)
				unix.PtraceDetach(pid)
				continue
			}
			if err == unix.EPERM {
				seen[w] = true
			}
		}
	}
}

// Result reads Main's report: how many workers it watched and how many it seized.
func Result(report string) (seen, won int) {
	for _, line := range strings.Split(report, "\n") {
		fmt.Sscanf(line, "seen %d", &seen)
		fmt.Sscanf(line, "won %d", &won)
	}
	return seen, won
}

// PublicCopy copies the test binary (os.Args[0], in a build directory private to root) into a
// new directory anyone may enter, as name, so that workers dropped to an ordinary user (and
// the attacker) can run it; remove the directory (filepath.Dir of the path) when done.
func PublicCopy(name string) (string, error) {
	dir, err := os.MkdirTemp("", name+"-bin-")
	if err != nil {
		return "", err
	}
	exe := filepath.Join(dir, name)
	if err := copyExecutable(os.Args[0], exe); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return exe, nil
}

func copyExecutable(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
