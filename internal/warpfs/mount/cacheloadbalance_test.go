package mount

import (
	"bytes"
	"errors"
	"math/rand"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/cachestore"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// A load-balanced cache (access_mode=loadbalance, type=cache) as two compute nodes see it:
// two servers, each serving the PFS directory read-only and the data of whole files from its
// own cache store (a real one, fetching through real PFS doors), mounted as replicas the way
// the controller orders them: each node reads a different server first. Both read the PFS
// file's data; each server fetched it from the PFS once; a re-read is a hit; a node whose
// server goes away reads the other's cache, which fetches nothing more; nothing can be
// written. The second node's first replica is on its own host (a local Dir with the engine).
func TestCacheLoadbalanceReplicas(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a FUSE mount")
	}
	pfs, mpA := dirs(t)
	_, mpB := dirs(t)
	data := make([]byte, 3<<20+4567)
	rand.New(rand.NewSource(20)).Read(data)
	if err := os.MkdirAll(filepath.Join(pfs, "in"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pfs, "in", "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	layout := stripe.Layout{Size: 1 << 20, Width: 1, Servers: 1}
	var stores []*cachestore.Store
	var targets []*server.CacheTarget
	var servers []*testServer
	var ssds []string
	for range 2 {
		s, err := cachestore.Open(cachestore.Options{Dir: t.TempDir(), Config: cache.Config{Server: 0, Capacity: 64 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		ct := &server.CacheTarget{PFSRoot: pfs, Door: newPFSDoors(t, pfs).For, Data: server.StoreData(s), Layout: layout, Loadbalance: true}
		ssd := t.TempDir()
		srv := startServerFor(t, "", server.Target{Dir: ssd, Tracker: usage.New("ldbal cache", 1<<30), Cache: ct}, quietSlog(t), nil)
		stores, targets, servers, ssds = append(stores, s), append(targets, ct), append(servers, srv), append(ssds, ssd)
	}
	remote := func(i int, client string) Server {
		return Server{Node: []string{"ssd1", "ssd2"}[i], Remote: &Remote{Address: servers[i].addr, Token: testToken, Client: client,
			FragmentID: int64(10 + i), NamespaceID: int64(20 + i), InstanceID: 3}}
	}
	// Node A reads ssd1 first; node B reads ssd2 first, on its own host.
	a := mount(t, Spec{MountPath: mpA, ReadOnly: true, AllowOther: true, Logger: quietLogger(t), Replicas: []Server{remote(0, "cnA"), remote(1, "cnA")}})
	b := mount(t, Spec{MountPath: mpB, ReadOnly: true, AllowOther: true, Logger: quietLogger(t), Client: "ssd2",
		Replicas: []Server{{Node: "ssd2", Dir: ssds[1], Tracker: usage.New("ldbal cache local", 1<<30), NamespaceID: 21, Cache: targets[1]}, remote(0, "ssd2")}})

	read := func(m *Mounted) {
		t.Helper()
		got, err := os.ReadFile(filepath.Join(m.Path(), "in", "data"))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: read %d bytes (%v), want the PFS file's %d (equal: %v)", m.Path(), len(got), err, len(data), bytes.Equal(got, data))
		}
	}
	read(a)
	read(b)
	for i, s := range stores {
		if st := s.Stats(); st.FetchedBytes != uint64(len(data)) {
			t.Errorf("server %d fetched %d bytes from the PFS, want the file's %d once", i+1, st.FetchedBytes, len(data))
		}
	}
	if st, err := os.Stat(filepath.Join(b.Path(), "in", "data")); err != nil || st.Size() != int64(len(data)) {
		t.Errorf("stat through the mount: %v %v", st, err)
	}
	if names, err := os.ReadDir(filepath.Join(a.Path(), "in")); err != nil || len(names) != 1 || names[0].Name() != "data" {
		t.Errorf("listing: %v %v", names, err)
	}

	// A re-read is served from each server's cache.
	before := []cache.Stats{stores[0].Stats(), stores[1].Stats()}
	read(a)
	read(b)
	for i, s := range stores {
		st := s.Stats()
		if st.FetchedBytes != before[i].FetchedBytes || st.Hits <= before[i].Hits {
			t.Errorf("server %d: a re-read fetched %d more bytes with %d more hits; want none and some",
				i+1, st.FetchedBytes-before[i].FetchedBytes, st.Hits-before[i].Hits)
		}
	}

	// Read-only: nothing reaches the PFS.
	if err := os.WriteFile(filepath.Join(a.Path(), "in", "new"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("creating a file: %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(b.Path(), "in", "data"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("rewriting a file: %v, want EROFS", err)
	}
	if err := os.Remove(filepath.Join(a.Path(), "in", "data")); !errors.Is(err, syscall.EROFS) {
		t.Errorf("removing a file: %v, want EROFS", err)
	}
	if got, err := os.ReadFile(filepath.Join(pfs, "in", "data")); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the PFS file changed: %d bytes, %v", len(got), err)
	}

	// Node A's server goes away: A reads ssd2's cache, which has the file already.
	servers[0].stop()
	held := stores[1].Stats()
	read(a)
	if st := stores[1].Stats(); st.FetchedBytes != held.FetchedBytes || st.Hits <= held.Hits {
		t.Errorf("after the failover, server 2 fetched %d more bytes with %d more hits; want none and some",
			st.FetchedBytes-held.FetchedBytes, st.Hits-held.Hits)
	}

	// A file changed on the PFS reads anew (close-to-open).
	changed := bytes.Repeat([]byte("new data "), 1000)
	if err := os.WriteFile(filepath.Join(pfs, "in", "data"), changed, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(b.Path(), "in", "data")); err != nil || !bytes.Equal(got, changed) {
		t.Errorf("after the PFS file changed: %d bytes (%v), want the new %d", len(got), err, len(changed))
	}
}

// A load-balanced cache on one server, mounted on that server's own host (a local namespace,
// served in-process): its files have no descriptor to read from, so their reads go through
// the namespace server to the cache store, as a remote mount's do.
func TestCacheLoadbalanceLocalNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a FUSE mount")
	}
	pfs, mp := dirs(t)
	data := make([]byte, 2<<20+99)
	rand.New(rand.NewSource(21)).Read(data)
	if err := os.WriteFile(filepath.Join(pfs, "data"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := cachestore.Open(cachestore.Options{Dir: t.TempDir(), Config: cache.Config{Server: 0, Capacity: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ct := &server.CacheTarget{PFSRoot: pfs, Door: newPFSDoors(t, pfs).For, Data: server.StoreData(s),
		Layout: stripe.Layout{Size: 1 << 20, Width: 1, Servers: 1}, Loadbalance: true}
	m := mount(t, Spec{MountPath: mp, SourceDir: t.TempDir(), Tracker: usage.New("ldbal cache", 1<<30), Cache: ct,
		ReadOnly: true, AllowOther: true, Logger: quietLogger(t)})
	for i := range 2 {
		got, err := os.ReadFile(filepath.Join(m.Path(), "data"))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read %d: %d bytes (%v), want the PFS file's %d (equal: %v)", i+1, len(got), err, len(data), bytes.Equal(got, data))
		}
	}
	if st := s.Stats(); st.FetchedBytes != uint64(len(data)) || st.Hits == 0 {
		t.Errorf("the store fetched %d bytes with %d hits: want the file's %d once, and hits", st.FetchedBytes, st.Hits, len(data))
	}
	if err := os.WriteFile(filepath.Join(m.Path(), "new"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("creating a file: %v, want EROFS", err)
	}
}
