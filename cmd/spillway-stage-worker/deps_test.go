package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// heavy are the packages the stage worker must not link (a path, or a prefix ending in "/"):
// the daemons and their libraries, whose initialisation and page faults cost every stage
// (about 7.5 ms of CPU each for the full spillway binary, 1.7 ms for this one).
var heavy = []string{
	"go.etcd.io/",
	"google.golang.org/grpc",
	"google.golang.org/protobuf",
	"github.com/prometheus/",
	"github.com/hanwen/go-fuse/",
	"modernc.org/sqlite",
	"github.com/BurntSushi/toml",
	"github.com/spillway-hpc/spillway/internal/controller",
	"github.com/spillway-hpc/spillway/internal/agent",
	"github.com/spillway-hpc/spillway/internal/store",
	"github.com/spillway-hpc/spillway/internal/embedded",
	"github.com/spillway-hpc/spillway/internal/spillwaycli",
	"github.com/spillway-hpc/spillway/internal/metrics",
	"github.com/spillway-hpc/spillway/internal/warpfs/server",
	"github.com/spillway-hpc/spillway/internal/warpfs/mount",
}

// TestLinksNoDaemon fails when cmd/spillway-stage-worker links a daemon or a heavy library.
func TestLinksNoDaemon(t *testing.T) {
	list := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	list.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=readonly")
	out, err := list.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	found := false
	for _, dep := range deps {
		found = found || dep == "github.com/spillway-hpc/spillway/internal/stage"
		for _, h := range heavy {
			if dep == h || (strings.HasSuffix(h, "/") && strings.HasPrefix(dep, h)) {
				t.Errorf("cmd/spillway-stage-worker links %s (%s): the worker must stay small; `go mod why` shows who imports it", dep, h)
			}
		}
	}
	if !found {
		t.Fatalf("go list -deps does not name internal/stage: %q", deps)
	}
}
