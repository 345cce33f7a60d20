// Package netnstest helps tests that make hosts out of network namespaces clean up after a
// test run that was killed before its own cleanup ran.
package netnstest

import (
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// RemoveStale deletes the namespaces named PREFIX<pid>-... whose test process (pid) is gone.
// Tests name their namespaces that way so that concurrent runs leave each other's alone.
func RemoveStale(prefix string) {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		if pid, err := strconv.Atoi(pidText); err == nil && syscall.Kill(pid, 0) == nil {
			continue // its test is still running
		}
		exec.Command("ip", "netns", "del", name).Run()
	}
}
