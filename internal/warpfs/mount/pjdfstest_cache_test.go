package mount

import (
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/privdrop"
	"github.com/spillway-hpc/spillway/internal/traceattack"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/cachestore"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// pfsWorkerArg runs this test binary as a PFS door's worker (TestMain), as `spillway
// pfs-worker` does.
const pfsWorkerArg = "mount-pfs-worker"

// pjdfstestCacheDifferences are the pjdfstest cases a cache instance's mount fails where the
// backing file system passes, each with the cache semantic of docs/mounts.md ("Cache
// instances") that makes it so, and what the suite's report of the case says. Beside them, a
// cache mount has the differences of every mount (pjdfstestDifferences["all"]).
var pjdfstestCacheDifferences = cacheDifferences()

func cacheDifferences() map[string]pjdfstestDiff {
	out := map[string]pjdfstestDiff{}
	special := pjdfstestDiff{reason: cacheSpecialFiles, output: "EPERM|mknod(&file|f(&path, Mode"}
	// The cases run once per file type, each making a file of its type first: those of a FIFO,
	// a socket or a device node stop there. The same cases on regular files, directories and
	// symbolic links pass.
	for _, c := range []string{
		"chmod::change_perm", "chmod::enotdir_component", "chmod::failed_chmod_unchanged_ctime", "chmod::update_ctime",
		"chown::enotdir_component", "chown::lchown::enotdir_component",
		"link::changed_ctime_success", "link::eexist_dest_exists", "link::enotdir_component_either", "link::remove_link",
		"link::share_metadata", "link::unchanged_ctime_fails",
		"mkdir::eexist_file_exists", "mkdir::enotdir_component", "mkfifo::eexist_file_exists", "mkfifo::enotdir_component",
		"mknod::eexist_file_exists", "mknod::enotdir_comp_char_block", "mknod::enotdir_component",
		"mknod::privileged::eexist_file_exists", "open::eexist_file_exists",
		"rename::changed_ctime_success", "rename::eexist_enotempty_to_non_empty", "rename::eisdir_to_dir_from_not_dir",
		"rename::enotdir_component_either", "rename::enotdir_from_dir_to_not_dir", "rename::preserve_metadata",
		"rename::to_multiply_linked", "rename::unchanged_ctime_failed",
		"rmdir::eexist_enotempty_non_empty_dir", "rmdir::enotdir_component",
		"symlink::eexist_file_exists", "symlink::enotdir_component", "truncate::enotdir_component",
		"unlink::enotdir_component", "unlink::remove_type", "unlink::unchanged_ctime_failed",
		"unlink::update_ctime_success", "unlink::update_mtime_ctime_success_folder", "utimensat::changes_timestamps",
	} {
		for _, kind := range []string{"block", "char", "fifo", "socket"} {
			out[c+"::"+kind] = special
		}
	}
	for _, c := range []string{
		"symlink::create_symlink::block", "symlink::create_symlink::char", "symlink::create_symlink::fifo",
		"mknod::changed_times_success::block", "mknod::changed_times_success::char",
		"mknod::device_files::block", "mknod::device_files::char",
		"mkfifo::changed_time_fields_success", "mkfifo::permission_bits_from_mode", "mkfifo::uid_gid_eq_euid_egid",
		"mknod::changed_time_fields_success", "mknod::permission_bits_from_mode", "mknod::uid_gid_eq_euid_egid",
		"open::fifo_nonblock_wronly", "open::socket_error",
	} {
		out[c] = special
	}
	return out
}

const cacheSpecialFiles = "a cache refuses FIFOs, sockets and device nodes with EPERM: it moves regular files only " +
	"(docs/mounts.md, Cache instances)"

// cacheStoreData is a cache store as a storage server's cache fragment uses it (the agent's
// cacheData, internal/agent/cachepath.go).
type cacheStoreData struct{ s *cachestore.Store }

func cacheStoreRef(ref server.CacheFileRef) cachestore.FileRef {
	return cachestore.FileRef{Path: ref.Path, Key: cache.FileKey{Dev: ref.Key.Dev, Ino: ref.Key.Ino}, Layout: ref.Layout}
}

func (d cacheStoreData) OpenFile(door *pfsio.Door, ref server.CacheFileRef, write bool) (server.CacheFile, error) {
	f, err := d.s.OpenFile(door, cacheStoreRef(ref), write)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (d cacheStoreData) Truncate(door *pfsio.Door, ref server.CacheFileRef, size uint64) error {
	return d.s.Truncate(door, cacheStoreRef(ref), size)
}

func (d cacheStoreData) Unlink(key server.CacheFileKey) {
	d.s.Unlink(cache.FileKey{Dev: key.Dev, Ino: key.Ino})
}

// userDoors is a storage node's doors to a PFS directory, as the agent keeps them
// (internal/agent/pfsdoors.go): root's requests reach the PFS as the instance's owner (root
// here), in this process; every other user's through a worker process holding only that
// user's credentials (uid, gid and the user database's groups).
type userDoors struct {
	root string
	exe  []string

	mu    sync.Mutex
	doors map[uint32]*pfsio.Door
}

func newUserDoors(t *testing.T, root string, exe []string) *userDoors {
	d := &userDoors{root: root, exe: exe, doors: map[uint32]*pfsio.Door{}}
	t.Cleanup(func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, door := range d.doors {
			door.Close()
		}
	})
	return d
}

func (d *userDoors) For(uid, gid uint32) (*pfsio.Door, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if door := d.doors[uid]; door != nil && door.Alive() {
		return door, nil
	}
	opts := pfsio.Options{RequestTimeout: 30 * time.Second}
	var door *pfsio.Door
	var err error
	if uid == 0 {
		door, err = pfsio.Open(d.root, opts)
	} else {
		id := privdrop.Identity{UID: uid, GID: gid, Groups: []uint32{gid}}
		if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
			if known, err := privdrop.Lookup(u.Username); err == nil && known.UID == uid {
				for _, g := range known.Groups {
					if !slices.Contains(id.Groups, g) {
						id.Groups = append(id.Groups, g)
					}
				}
			}
		}
		door, err = pfsio.Start(d.exe, d.root, &id, opts)
	}
	if err != nil {
		return nil, err
	}
	d.doors[uid] = door
	return door, nil
}

// TestPjdfstestOnACacheMount runs pjdfstest on the backing file system and on a cache
// instance's mount, built as the agent builds one: a namespace server over a PFS directory
// (server.CacheTarget) and 3 stripe servers, each with a real cache store (warpfs/cachestore)
// over the PFS, reaching it through the users' doors (root in this process, every other user
// through a worker holding only that user's credentials). The mount fails no case the backing
// file system passes, except the documented differences of every mount and of a cache
// (pjdfstestCacheDifferences, docs/mounts.md "Cache instances").
func TestPjdfstestOnACacheMount(t *testing.T) {
	bin := findPjdfstest(t)
	conf := filepath.Join(testBase, "pjdfstest-cache.toml")
	if err := os.WriteFile(conf, []byte(pjdfstestConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	exe, err := traceattack.PublicCopy("mount.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(exe)) })

	// Short paths: the suite binds Unix sockets below the directory it is given.
	short, err := os.MkdirTemp(os.TempDir(), "pjc")
	if err == nil {
		err = os.Chmod(short, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if left := mountsUnder(short); len(left) > 0 {
			t.Errorf("mounts left behind: %v", left)
			for _, p := range left {
				syscall.Unmount(p, syscall.MNT_DETACH)
			}
		}
		os.RemoveAll(short)
	})
	backingDir, pfs, mountPath := filepath.Join(short, "b"), filepath.Join(short, "p"), filepath.Join(short, "c")
	for _, d := range []string{backingDir, pfs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	backing := runPjdfstest(t, bin, conf, backingDir)
	t.Logf("backing file system: %s", pjdfstestSummary(backing))

	m := mountCache(t, pfs, mountPath, exe)

	got := runPjdfstest(t, bin, conf, m.Path())
	t.Logf("cache mount: %s", pjdfstestSummary(got))
	difference := func(name string) (pjdfstestDiff, bool) {
		if d, ok := pjdfstestCacheDifferences[name]; ok {
			return d, true
		}
		d, ok := pjdfstestDifferences["all"][name]
		return d, ok
	}
	names := make([]string, 0, len(backing))
	for name := range backing {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !backing[name].passed() {
			continue
		}
		r, ran := got[name]
		if ran && r.passed() {
			continue
		}
		if d, ok := difference(name); ok && ran && d.shows(r.detail) {
			t.Logf("%s: %s, as documented: %s", name, r.outcome, d.reason)
			continue
		}
		if !ran {
			t.Errorf("%s: passes on the backing file system, absent from the cache mount's run", name)
			continue
		}
		t.Errorf("%s: passes on the backing file system, %s on the cache mount:\n%s", name, r.outcome, r.detail)
	}
	for name, d := range pjdfstestCacheDifferences {
		if r, ok := got[name]; ok && r.passed() && !d.byName {
			t.Errorf("%s passes on the cache mount: remove it from pjdfstestCacheDifferences (%s)", name, d.reason)
		}
	}
}

// mountCache mounts at mountPath a cache instance of the PFS directory pfs, as the agent
// serves one: a namespace server and testStripeServers stripe servers, each with its own cache
// store, the namespace on the node of stripe 0 (with that node's store); the doors run
// workers from exe.
func mountCache(t *testing.T, pfs, mountPath, exe string) *Mounted {
	doors := newUserDoors(t, pfs, []string{exe, pfsWorkerArg})
	// Stripes of one cache extent (1 MiB; a cache refuses stripes that are not whole extents):
	// files past 1 MiB span servers.
	layout := stripe.Layout{Size: 1 << 20, Width: testStripeServers, Servers: testStripeServers}
	var stores []*cachestore.Store
	for i := range testStripeServers {
		s, err := cachestore.Open(cachestore.Options{Dir: t.TempDir(), Log: quietSlog(t),
			Config: cache.Config{Server: i, Capacity: 16 << 30}})
		if err != nil {
			t.Fatal(err)
		}
		s.SetDoor(func(string) (*pfsio.Door, error) { return doors.For(0, 0) })
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	target := func(i int) *server.CacheTarget {
		return &server.CacheTarget{PFSRoot: pfs, Door: doors.For, Data: cacheStoreData{stores[i]}, Layout: layout}
	}
	// The namespace is served by the node of stripe 0, with that node's store, as the agent does.
	ns := startServerFor(t, "", server.Target{Dir: t.TempDir(), Tracker: usage.New("cache ns", 16<<30), Cache: target(0)}, quietSlog(t), nil)
	spec := Spec{MountPath: mountPath, AllowOther: true, Logger: quietLogger(t),
		Remote: &Remote{Address: ns.addr, Token: testToken, Client: "cn1", FragmentID: 1, NamespaceID: 2, InstanceID: 3}}
	for i := range testStripeServers {
		s := startServerFor(t, "", server.Target{Dir: t.TempDir(), Tracker: usage.New("cache stripes", 16<<30), Cache: target(i)}, quietSlog(t), nil)
		spec.Stripes = append(spec.Stripes, Server{Remote: &Remote{Address: s.addr, Token: testToken, Client: "cn1", FragmentID: int64(10 + i), InstanceID: 3}})
	}
	return mount(t, spec)
}
