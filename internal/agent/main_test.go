package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/swaparea/swaptest"
	"github.com/spillway-hpc/spillway/internal/traceattack"
)

// pfsWorkerExe runs this test binary as a PFS door's worker, as `spillway pfs-worker` does.
var pfsWorkerExe []string

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == swaptest.HogArg {
		os.Exit(swaptest.HogMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == swapAgentArg {
		os.Exit(swapAgentMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "pfs-worker" {
		os.Exit(pfsio.WorkerMain(os.Args[2:], os.Stderr))
	}
	// Workers run as ordinary users: from a copy in a directory anyone may enter.
	exe, err := traceattack.PublicCopy("agent.test")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot prepare the worker binary:", err)
		os.Exit(2)
	}
	pfsWorkerExe = []string{exe, "pfs-worker"}
	code := m.Run()
	os.RemoveAll(filepath.Dir(exe))
	os.Exit(code)
}
