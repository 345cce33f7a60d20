package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
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

// TestLoadbalanceCacheMountSource (issue 20 item 8): a load-balanced cache's fragment is
// served as server 0 of a one-server layout whatever its place in the instance, its target
// serves whole files with the namespace (CacheTarget.Loadbalance), and a compute node's mount
// order becomes a read-only mount of the replicas, the one on this node served in-process
// through the fragment's cache; an order naming stripe servers is refused.
func TestLoadbalanceCacheMountSource(t *testing.T) {
	dir := t.TempDir()
	pfs := filepath.Join(dir, "pfs")
	os.Mkdir(pfs, 0o755)
	a, err := New(Options{Name: "s1", Pool: "p", SSDPath: filepath.Join(dir, "ssd"), Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	k := &agentapi.CacheSpec{PFS: pfs, UID: uint32(os.Geteuid()), GID: uint32(os.Getegid()), Servers: 1, StripeSize: 1 << 20, Loadbalance: true}
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 5, InstanceID: 9, Capacity: 64 << 20, InstanceCapacity: 128 << 20, Cache: k, StripeIndex: 1}); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: 6, FragmentID: 5, InstanceID: 9, Owner: k.UID, Group: k.GID, Mode: 0o755, Cache: k}); err != nil {
		t.Fatal(err)
	}
	target, err := a.cacheTargetOf(5)
	if err != nil || target == nil {
		t.Fatalf("cache target: %v", err)
	}
	if !target.Loadbalance || target.Layout.Width != 1 || target.Layout.Servers != 1 {
		t.Errorf("target: loadbalance %v layout %+v, want a one-server layout", target.Loadbalance, target.Layout)
	}
	// The store serves all of a file: it is server 0 of the one-server layout.
	data := bytes.Repeat([]byte("whole file "), 300<<10)
	os.WriteFile(filepath.Join(pfs, "in"), data, 0o644)
	door, err := target.Door(k.UID, k.GID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := door.Lstat("in")
	if err != nil {
		t.Fatal(err)
	}
	key := server.CacheFileKey{Dev: st.Dev, Ino: st.Ino}
	f, err := target.Data.OpenFile(door, server.CacheFileRef{Path: "in", Key: key, Layout: target.Layout.ForFile(12345)}, false)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if n, err := f.ReadAt(got, 0); n != len(data) || err != nil || !bytes.Equal(got, data) {
		t.Errorf("read the whole file through the store: %d %v (equal: %v)", n, err, bytes.Equal(got, data))
	}
	f.Close()
	if st := a.openCacheStore(5).Stats(); st.FetchedBytes != uint64(len(data)) {
		t.Errorf("the store fetched %d bytes, want the file's %d", st.FetchedBytes, len(data))
	}

	spec := agentapi.MountSpec{ActivationID: 1, MountPath: filepath.Join(dir, "run1_loadbalance_cache"), NamespaceID: 6, InstanceID: 9, FragmentID: 5,
		StorageNode: "s1", ReadOnly: true, Cache: k, Replicas: []agentapi.Replica{
			{Node: "s1", FragmentID: 5, NamespaceID: 6},
			{Node: "s2", FragmentID: 7, NamespaceID: 8, DataAddress: "s2:7001"}}}
	ls, remote, err := a.mountSource(spec)
	if err != nil {
		t.Fatal(err)
	}
	if remote || !ls.ReadOnly || len(ls.Stripes) != 0 || len(ls.Replicas) != 2 {
		t.Fatalf("mount: remote %v read-only %v stripes %d replicas %d", remote, ls.ReadOnly, len(ls.Stripes), len(ls.Replicas))
	}
	if r := ls.Replicas[0]; r.Dir == "" || r.Cache == nil || !r.Cache.Loadbalance {
		t.Errorf("the local replica: dir %q cache %+v", r.Dir, r.Cache)
	}
	if r := ls.Replicas[1]; r.Remote == nil || r.Remote.Address != "s2:7001" || r.Remote.NamespaceID != 8 {
		t.Errorf("the remote replica: %+v", r.Remote)
	}

	bad := spec
	bad.Stripes = []agentapi.StripeServer{{Node: "s1", FragmentID: 5}}
	want := "mount " + spec.MountPath + ": type=cache access_mode=loadbalance of pfs=" + pfs + ": the mount order names stripe servers, which a load-balanced cache has none of"
	if err := a.Mount(ctx, bad); err == nil || err.Error() != want {
		t.Errorf("Mount with stripe servers = %v\nwant %s", err, want)
	}
}
