package agent

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
)

// TestCacheMountRefused: a cache mount order without stripe servers (a controller older than
// the agent) is refused with a clear error and mounts nothing: a cache namespace must never be
// served as scratch.
func TestCacheMountRefused(t *testing.T) {
	dir := t.TempDir()
	a, err := New(Options{Name: "cn1"})
	if err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(dir, "run1_striped_cache")
	err = a.Mount(context.Background(), agentapi.MountSpec{ActivationID: 1, MountPath: mnt, NamespaceID: 2, InstanceID: 3,
		Cache: &agentapi.CacheSpec{PFS: "/lustre/me/run", UID: 1000, GID: 1000}})
	want := "mount " + mnt + ": type=cache of pfs=/lustre/me/run: the mount order names no stripe servers (a controller older than this agent?)"
	if err == nil || err.Error() != want {
		t.Fatalf("Mount = %v\nwant %s", err, want)
	}
	if _, err := os.Stat(mnt); !os.IsNotExist(err) {
		t.Errorf("the mount path was made: %v", err)
	}
}
