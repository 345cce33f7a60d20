package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// heavy are the packages the small binary must not link (a path or a path prefix ending in
// "/"): the daemons and their libraries, whose initialisation and page faults cost every
// process start (about 7.5 ms of CPU each for the full spillway binary).
var heavy = []string{
	"go.etcd.io/",
	"google.golang.org/grpc",
	"google.golang.org/protobuf",
	"github.com/golang/protobuf",
	"github.com/prometheus/",
	"github.com/hanwen/go-fuse/",
	"modernc.org/sqlite",
	"github.com/spillway-hpc/spillway/internal/controller",
	"github.com/spillway-hpc/spillway/internal/agent",
	"github.com/spillway-hpc/spillway/internal/agentclient",
	"github.com/spillway-hpc/spillway/internal/store",
	"github.com/spillway-hpc/spillway/internal/store/",
	"github.com/spillway-hpc/spillway/internal/embedded",
	"github.com/spillway-hpc/spillway/internal/spillwaycli",
	"github.com/spillway-hpc/spillway/internal/ha",
	"github.com/spillway-hpc/spillway/internal/metrics",
	"github.com/spillway-hpc/spillway/internal/stage",
	"github.com/spillway-hpc/spillway/internal/warpfs/",
}

// light are the exceptions under a heavy prefix: warpfs/stripe is the stripe arithmetic
// (standard library only) that package lifecycle computes sizes with; warpfs/cache is a cache
// instance's pure decisions (no I/O, no goroutines; stripe and the standard library only),
// whose policy text dwcli's cache commands read and write.
var light = map[string]bool{
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe": true,
	"github.com/spillway-hpc/spillway/internal/warpfs/cache":  true,
}

// TestLinksNoDaemon fails when cmd/dw_wlm_cli links a daemon or a heavy library: go list
// -deps names every package the binary links (no network: only this module's sources and
// the module cache the build already used).
func TestLinksNoDaemon(t *testing.T) {
	list := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	// Offline: the modules it needs are those this test was built from.
	list.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=readonly")
	out, err := list.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 5 || !contains(deps, "github.com/spillway-hpc/spillway/internal/cli") {
		t.Fatalf("go list -deps gave %d packages, without internal/cli: %q", len(deps), deps)
	}
	for _, dep := range deps {
		if light[dep] {
			continue
		}
		for _, h := range heavy {
			if dep == h || (strings.HasSuffix(h, "/") && strings.HasPrefix(dep, h)) {
				t.Errorf("cmd/dw_wlm_cli links %s (%s): the small binary must stay free of the daemons; `go list -deps ./cmd/dw_wlm_cli` and `go mod why` show who imports it", dep, h)
			}
		}
	}
}

// TestHeavyListNamesRealPackages checks the list itself, so that a misspelt entry cannot pass
// silently: every library in it is a module go.mod requires, every package of this module a
// directory of the tree.
func TestHeavyListNamesRealPackages(t *testing.T) {
	goMod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var modules []string
	for _, line := range strings.Split(string(goMod), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && strings.Contains(f[0], ".") && strings.HasPrefix(f[1], "v") {
			modules = append(modules, f[0])
		}
	}
	const self = "github.com/spillway-hpc/spillway/"
	for _, h := range heavy {
		if rel, ok := strings.CutPrefix(h, self); ok {
			if info, err := os.Stat(filepath.Join("../..", rel)); err != nil || !info.IsDir() {
				t.Errorf("heavy names %s, which is not a directory of this module", h)
			}
			continue
		}
		found := false
		for _, m := range modules {
			if strings.HasPrefix(m+"/", h) || strings.HasPrefix(h, m) {
				found = true
			}
		}
		if !found {
			t.Errorf("heavy names %s, which no module in go.mod provides", h)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
