package cachestore

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/traceattack"
)

// workerExe runs this test binary as a PFS door's worker ("pfsio-worker", as `spillway
// pfs-worker`), for the tests whose door is an ordinary user's process (root writes through
// any permission bits). Empty unless the tests run as root.
var workerExe []string

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "pfsio-worker" {
		os.Exit(pfsio.WorkerMain(os.Args[2:], os.Stderr))
	}
	if os.Getuid() == 0 {
		// The build directory is private to root: the user's worker runs a copy.
		exe, err := traceattack.PublicCopy("cachestore.test")
		if err != nil {
			fmt.Fprintln(os.Stderr, "cannot prepare the worker binary:", err)
			os.Exit(2)
		}
		workerExe = []string{exe, "pfsio-worker"}
		code := m.Run()
		os.RemoveAll(filepath.Dir(exe))
		os.Exit(code)
	}
	os.Exit(m.Run())
}
