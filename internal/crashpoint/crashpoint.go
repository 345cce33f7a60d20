// Package crashpoint lets the crash-restart tests kill a process at a chosen step.
//
// The controller calls Hit at every point where a crash must leave a resumable state: after a
// request is persisted, before and after each side effect. With SPILLWAY_CRASH_AFTER=N in the
// environment, the Nth hit (counting from 1) exits the process at once with status 137, as a
// SIGKILL would; SPILLWAY_CRASH_LOG=FILE appends each hit's name to FILE so a test can count
// the points a run passes. Without these variables Hit does nothing.
package crashpoint

import (
	"fmt"
	"os"
	"strconv"
	"sync"
)

var (
	mu      sync.Mutex
	hits    int
	limit   = parse(os.Getenv("SPILLWAY_CRASH_AFTER"))
	logPath = os.Getenv("SPILLWAY_CRASH_LOG")
)

func parse(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// ExitCode is the status of a process stopped by a crash point.
const ExitCode = 137

// Hit marks a crash point.
func Hit(name string) {
	if limit == 0 && logPath == "" {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	hits++
	if logPath != "" {
		if f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
			fmt.Fprintf(f, "%d %s\n", hits, name)
			f.Close()
		}
	}
	if limit > 0 && hits == limit {
		fmt.Fprintf(os.Stderr, "spillway: crash point %d (%s) reached; exiting as if killed\n", hits, name)
		os.Exit(ExitCode)
	}
}
