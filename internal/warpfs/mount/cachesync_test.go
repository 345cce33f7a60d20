package mount

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/cachestore"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// mountCacheStores mounts a cache instance of PFS directory pfs on two stripe servers whose
// engines are real cache stores (write-behind: nothing reaches the PFS unless synced).
func mountCacheStores(t *testing.T, pfs, mountPath string) (*Mounted, []*cachestore.Store, Spec) {
	layout := stripe.Layout{Size: 1 << 20, Width: 2, Servers: 2}
	ns := startServerFor(t, "", server.Target{Dir: t.TempDir(), Tracker: usage.New("cache ns", 1<<30), Cache: &server.CacheTarget{
		PFSRoot: pfs, Door: newPFSDoors(t, pfs).For, Data: &writeThrough{}, Layout: layout, Defaults: cache.DefaultPolicy}}, quietSlog(t), nil)
	spec := Spec{MountPath: mountPath, AllowOther: true,
		Remote: &Remote{Address: ns.addr, Token: testToken, Client: "cn1", FragmentID: 1, NamespaceID: 2, InstanceID: 3}}
	var stores []*cachestore.Store
	for i := range 2 {
		st, err := cachestore.Open(cachestore.Options{Dir: t.TempDir(),
			Config: cache.Config{Server: i, Capacity: 1 << 30, Defaults: cache.DefaultPolicy}, Log: quietSlog(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		stores = append(stores, st)
		s := startServerFor(t, "", server.Target{Dir: t.TempDir(), Tracker: usage.New("cache stripes", 1<<30), Cache: &server.CacheTarget{
			PFSRoot: pfs, Door: newPFSDoors(t, pfs).For, Data: server.StoreData(st), Layout: layout, Defaults: cache.DefaultPolicy}}, quietSlog(t), nil)
		spec.Stripes = append(spec.Stripes, Server{Remote: &Remote{Address: s.addr, Token: testToken, Client: "cn1", FragmentID: int64(10 + i), InstanceID: 3}})
	}
	return mount(t, spec), stores, spec
}

func getxattr(t *testing.T, path, name string) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Getxattr(path, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// libdatawarp's cache calls through a real mount of a cache instance whose stripe servers
// cache (cachestore): data written with the default policy stays on the burst buffer until
// user.spillway.cache.sync (dw_wait_sync_complete) puts it on the PFS; a policy set on a file
// or its directory (dw_set_cache_policy) is read back as set and makes close or fsync put the
// data on the PFS; a scratch instance refuses them.
func TestCacheInstanceSyncAndPolicy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a FUSE mount")
	}
	pfs, mountPath := dirs(t)
	m, stores, spec := mountCacheStores(t, pfs, mountPath)
	root := m.Path()
	rng := rand.New(rand.NewSource(20))
	data := make([]byte, 3<<20+12345) // on both servers
	rng.Read(data)
	onPFS := func(name string) bool {
		got, _ := os.ReadFile(filepath.Join(pfs, name))
		return bytes.Equal(got, data)
	}

	// The default policy: written and closed, the data is on the burst buffer only.
	if err := os.WriteFile(filepath.Join(root, "a"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if onPFS("a") {
		t.Fatal("written with the default policy, the data is on the PFS already: the test proves nothing")
	}
	dirty := uint64(0)
	for _, s := range stores {
		for _, n := range s.DirtyFiles() {
			dirty += n
		}
	}
	if dirty == 0 {
		t.Fatal("nothing dirty on the stripe servers")
	}
	if got, err := os.ReadFile(filepath.Join(root, "a")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read through the mount: %d bytes, %v", len(got), err)
	}
	// dw_wait_sync_complete: fsync, then the sync attribute set through the descriptor.
	f, err := os.OpenFile(filepath.Join(root, "a"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsetxattr(int(f.Fd()), cache.SyncXattr, []byte("1"), 0); err != nil {
		t.Fatalf("sync: %v", err)
	}
	f.Close()
	if !onPFS("a") {
		t.Fatal("after the sync the PFS file does not hold the data")
	}
	for i, s := range stores {
		if d := s.DirtyFiles(); len(d) != 0 {
			t.Errorf("after the sync stripe server %d holds dirty data %v", i, d)
		}
	}

	// The policy of a file: read as the instance's defaults, set, read back as set.
	b := filepath.Join(root, "b")
	fb, err := os.Create(b)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := getxattr(t, b, cache.PolicyXattr); err != nil || got != cache.DefaultPolicy.Text() {
		t.Errorf("a new file's policy %q %v, want the defaults %q", got, err, cache.DefaultPolicy.Text())
	}
	set := "modified_threshold=67108864 read_ahead=1048576 sync_on_close=yes sync_to_pfs=no"
	if err := unix.Fsetxattr(int(fb.Fd()), cache.PolicyXattr, []byte(set), 0); err != nil {
		t.Fatalf("setting the policy: %v", err)
	}
	if got, err := getxattr(t, b, cache.PolicyXattr); err != nil || got != set {
		t.Errorf("policy read back %q %v, want %q", got, err, set)
	}
	// Set on the open file, it applies to that open: its close puts the data on the PFS.
	if _, err := fb.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := fb.Close(); err != nil {
		t.Fatalf("close with sync_on_close: %v", err)
	}
	if !onPFS("b") {
		t.Error("sync_on_close: after close the PFS file does not hold the data")
	}
	// A partial setting keeps the others; "default" goes back to the instance's.
	if err := unix.Setxattr(b, cache.PolicyXattr, []byte("sync_to_pfs=yes sync_on_close=default"), 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := getxattr(t, b, cache.PolicyXattr); got != "modified_threshold=67108864 read_ahead=1048576 sync_on_close=no sync_to_pfs=yes" {
		t.Errorf("after a partial setting: %q", got)
	}
	// sync_to_pfs: fsync puts the data on the PFS.
	fb, err = os.OpenFile(b, os.O_RDWR|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	rng.Read(data)
	if _, err := fb.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := fb.Sync(); err != nil {
		t.Fatal(err)
	}
	if !onPFS("b") {
		t.Error("sync_to_pfs: after fsync the PFS file does not hold the data")
	}
	fb.Close()

	// A directory's policy is inherited by the files created in it.
	d := filepath.Join(root, "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(d, cache.PolicyXattr, []byte("sync_on_close=yes"), 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := getxattr(t, d, cache.PolicyXattr); !strings.Contains(got, "sync_on_close=yes") {
		t.Errorf("the directory's policy: %q", got)
	}
	if err := os.WriteFile(filepath.Join(d, "c"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if !onPFS("d/c") {
		t.Error("a file created in a sync_on_close directory: after close the PFS file does not hold the data")
	}
	if got, _ := getxattr(t, filepath.Join(d, "c"), cache.PolicyXattr); !strings.Contains(got, "sync_on_close=yes") {
		t.Errorf("the new file's policy: %q", got)
	}

	// Another compute node's open made before a setting on this one: its first write to each
	// server opens its objects with the policy it was opened with (none), which must not undo
	// the newer setting there; its close puts the data on the PFS.
	spec2 := spec
	spec2.MountPath = filepath.Join(filepath.Dir(mountPath), "cn2")
	spec2.Remote = &Remote{Address: spec.Remote.Address, Token: testToken, Client: "cn2", FragmentID: 1, NamespaceID: 2, InstanceID: 3}
	spec2.Stripes = nil
	for _, st := range spec.Stripes {
		r := *st.Remote
		r.Client = "cn2"
		spec2.Stripes = append(spec2.Stripes, Server{Remote: &r})
	}
	m2 := mount(t, spec2)
	if err := os.WriteFile(filepath.Join(root, "e"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fe, err := os.OpenFile(filepath.Join(m2.Path(), "e"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(root, "e"), cache.PolicyXattr, []byte("sync_on_close=yes"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := fe.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := fe.Close(); err != nil {
		t.Fatal(err)
	}
	if !onPFS("e") {
		t.Error("an open of another node made before the setting: after its close the PFS file does not hold the data")
	}

	// Nonsense is EINVAL; nothing of the cache's is stored on the PFS.
	if err := unix.Setxattr(b, cache.PolicyXattr, []byte("sync_on_close=maybe"), 0); err != syscall.EINVAL {
		t.Errorf("a bad policy: %v, want EINVAL", err)
	}
	if err := unix.Setxattr(d, cache.SyncXattr, []byte("1"), 0); err != syscall.EINVAL {
		t.Errorf("syncing a directory: %v, want EINVAL", err)
	}
	for _, p := range []string{"a", "b", "d"} {
		if n, _ := unix.Listxattr(filepath.Join(pfs, p), make([]byte, 256)); n > 0 {
			t.Errorf("the PFS's %s has extended attributes", p)
		}
	}
}

// On a scratch instance the cache's attributes are EOPNOTSUPP, and nothing is stored.
func TestScratchRefusesCacheCalls(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a FUSE mount")
	}
	src, mountPath := dirs(t)
	m := mount(t, Spec{SourceDir: src, MountPath: mountPath, Tracker: usage.New("scratch", 1<<30)})
	p := filepath.Join(m.Path(), "f")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{cache.SyncXattr, cache.PolicyXattr} {
		if err := unix.Setxattr(p, name, []byte("sync_on_close=yes"), 0); err != syscall.EOPNOTSUPP {
			t.Errorf("setxattr %s on scratch: %v, want EOPNOTSUPP", name, err)
		}
	}
	if _, err := getxattr(t, p, cache.PolicyXattr); err != syscall.EOPNOTSUPP {
		t.Errorf("getxattr of the policy on scratch: %v, want EOPNOTSUPP", err)
	}
}
