package mount

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// unlinkPair mounts one namespace on two nodes: a reaches the storage node through a proxy
// that can slow its requests, b directly.
func unlinkPair(t *testing.T) (src string, a, b *Mounted, proxy *cutProxy) {
	t.Helper()
	src, mp := dirs(t)
	tr := usage.New("unlinks", 1<<30)
	addr := startLeaseServer(t, server.Target{Dir: src, Tracker: tr}, 0)
	proxy = newCutProxy(t, addr)
	a = mount(t, Spec{MountPath: mp + "-a", Remote: &Remote{Address: proxy.addr, Token: testToken, Client: "a", NamespaceID: 1, InstanceID: 3}, Logger: quietLogger(t)})
	b = mount(t, Spec{MountPath: mp + "-b", Remote: &Remote{Address: addr, Token: testToken, Client: "b", NamespaceID: 1, InstanceID: 3}, Logger: quietLogger(t)})
	return src, a, b, proxy
}

// makeFiles makes dir and empty files in it (mdtest-easy's).
func makeFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// makeClosedFiles is makeFiles in directory rel of m, and waits until m has had each file's
// RELEASE: the kernel sends it after close(2) has returned, and a file still open is removed
// the usual way, not behind.
func makeClosedFiles(t *testing.T, m *Mounted, rel string, names ...string) {
	t.Helper()
	makeFiles(t, filepath.Join(m.Path(), rel), names...)
	deadline := time.Now().Add(10 * time.Second)
	for _, name := range names {
		for {
			open := false
			if d := m.backend.dirNode(rel); d != nil {
				if c := d.childNode(name); c != nil {
					c.mu.Lock()
					open = len(c.handles) > 0
					c.mu.Unlock()
				}
			}
			if !open {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s/%s still open 10 s after its close", rel, name)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

func missing(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s: %v, want it missing", p, err)
	}
}

// Removals in a directory a node made go without waiting for the storage node, however slow
// its link: and another node sees every one of them at its next call, since the storage node
// recalls the remover's listing (and the remover lands its removals) before that call runs.
func TestUnlinksBehindAreSeenElsewhereAtOnce(t *testing.T) {
	src, a, b, proxy := unlinkPair(t)
	names := []string{"f0", "f1", "f2", "f3", "f4", "f5"}
	makeClosedFiles(t, a, "d", names...)
	proxy.slow(100 * time.Millisecond) // each of a's requests reaches the server 100 ms late
	for _, n := range names {
		if err := os.Remove(filepath.Join(a.Path(), "d", n)); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.backend.unlinksBehind.Load(); got != int64(len(names)) {
		t.Fatalf("%d removals went behind, want %d", got, len(names))
	}
	// Without the recall b would find most of them still there.
	for _, n := range names {
		missing(t, filepath.Join(b.Path(), "d", n))
	}
	if ents, err := os.ReadDir(filepath.Join(b.Path(), "d")); err != nil || len(ents) != 0 {
		t.Fatalf("b lists %v (%v), want nothing", ents, err)
	}
	for _, n := range names {
		missing(t, filepath.Join(src, "d", n))
	}
	// a's listing went with the recall: its later removals there wait for the server.
	makeFiles(t, filepath.Join(a.Path(), "d"), "g")
	if err := os.Remove(filepath.Join(a.Path(), "d", "g")); err != nil {
		t.Fatal(err)
	}
	if got := a.backend.unlinksBehind.Load(); got != int64(len(names)) {
		t.Fatalf("a removal after the recall went behind (%d)", got)
	}
	missing(t, filepath.Join(src, "d", "g"))
}

// The remover's own next calls in the directory come after its removals: a file made again
// under a removed name right after is the new one, and stays.
func TestCreateAfterUnlinkBehindKeepsTheNewFile(t *testing.T) {
	src, a, b, proxy := unlinkPair(t)
	dir := filepath.Join(a.Path(), "e")
	makeClosedFiles(t, a, "e", "x", "y")
	proxy.slow(100 * time.Millisecond)
	if err := os.Remove(filepath.Join(dir, "x")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "y")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "y"), 0o755); err != nil { // a directory in its place
		t.Fatal(err)
	}
	if a.backend.unlinksBehind.Load() == 0 {
		t.Fatal("no removal went behind")
	}
	if got, err := os.ReadFile(filepath.Join(b.Path(), "e", "x")); err != nil || string(got) != "new" {
		t.Fatalf("b reads e/x as %q (%v), want the new file", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(src, "e", "x")); err != nil || string(got) != "new" {
		t.Fatalf("the server holds e/x as %q (%v), want the new file", got, err)
	}
	if st, err := os.Stat(filepath.Join(src, "e", "y")); err != nil || !st.IsDir() {
		t.Fatalf("the server's e/y: %v %v, want the new directory", st, err)
	}
	// Removing the directory itself waits for the removals in it.
	if err := os.Remove(filepath.Join(dir, "x")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "y")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatalf("rmdir after the removals in it: %v", err)
	}
	missing(t, filepath.Join(src, "e"))
}

// A removal the storage node refuses after the caller had its answer shows the file again
// (logged), rather than leaving the node's cache claiming it is gone.
func TestUnlinkBehindRefusedShowsTheFileAgain(t *testing.T) {
	src, a, _, proxy := unlinkPair(t)
	dir := filepath.Join(a.Path(), "d")
	makeClosedFiles(t, a, "d", "f") // closed: an open file is removed the usual way
	// The directory made immutable on the storage node: its unlink fails EPERM there.
	fd, err := unix.Open(filepath.Join(src, "d"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err == nil {
		err = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags|fsImmutableFl))
	}
	if err != nil {
		t.Skipf("cannot make a directory immutable here: %v", err)
	}
	t.Cleanup(func() { unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags)) })
	proxy.slow(50 * time.Millisecond)
	if err := os.Remove(filepath.Join(dir, "f")); err != nil {
		t.Fatal(err)
	}
	if a.backend.unlinksBehind.Load() != 1 {
		t.Fatal("the removal did not go behind")
	}
	deadline := time.Now().Add(10 * time.Second)
	for a.backend.unlinksFailed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the refused removal was not noticed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	a.backend.unlinking.Wait()
	if _, err := os.Stat(filepath.Join(dir, "f")); err != nil {
		t.Fatalf("after the refused removal a finds no d/f (%v), want it back", err)
	}
}

// fsImmutableFl is FS_IMMUTABLE_FL of linux/fs.h (chattr +i).
const fsImmutableFl = 0x00000010

// Removals on their way when the storage agent restarts are sent again on the mount's next
// connection (the first may have landed: ENOENT then), never lost.
func TestUnlinksBehindLandAfterAServerRestart(t *testing.T) {
	rs := newRestartableServer(t, "unlinks")
	src, mp, limits := rs.src, rs.mp, rs.limits
	proxy := newCutProxy(t, rs.addr)
	a := mount(t, Spec{MountPath: mp + "-a", Remote: &Remote{Address: proxy.addr, Token: testToken, Client: "a", NamespaceID: 1, InstanceID: 3, Limits: limits}, Logger: quietLogger(t)})
	names := []string{"f0", "f1", "f2", "f3"}
	makeClosedFiles(t, a, "d", names...)
	proxy.slow(200 * time.Millisecond)
	for _, n := range names {
		if err := os.Remove(filepath.Join(a.Path(), "d", n)); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.backend.unlinksBehind.Load(); got != int64(len(names)) {
		t.Fatalf("%d removals went behind, want %d", got, len(names))
	}
	rs.stop() // most of them are still in the slow link
	proxy.slow(0)
	rs.start()
	a.backend.unlinking.Wait()
	if n := a.backend.unlinksFailed.Load(); n != 0 {
		t.Fatalf("%d removals failed", n)
	}
	for _, n := range names {
		missing(t, filepath.Join(src, "d", n))
	}
}

// A file that holds data is removed as before, waiting for the storage node: its space is
// back when unlink returns, so that "rm old; write new" in a full instance does not fail.
// So is a file linked or moved since its creation.
func TestUnlinkOfAFileWithDataWaits(t *testing.T) {
	src, a, _, _ := unlinkPair(t)
	dir := filepath.Join(a.Path(), "d")
	makeFiles(t, dir, "empty", "moved", "linked")
	if err := os.WriteFile(filepath.Join(dir, "data"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "empty"), 0); err != nil { // resized (to nothing)
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "moved"), filepath.Join(dir, "moved2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "linked"), filepath.Join(dir, "linked2")); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"data", "empty", "moved2", "linked", "linked2"} {
		if err := os.Remove(filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
		missing(t, filepath.Join(src, "d", n)) // on the server when unlink returned
	}
	if got := a.backend.unlinksBehind.Load(); got != 0 {
		t.Errorf("%d removals went behind, want none", got)
	}
}

// The storage agent stopped at any moment of a burst of removals, and started again: every
// removal that returned is done on the server afterwards. (A removal that waited for the
// server and lost its connection fails with EIO, as before: it was not acknowledged.)
func TestUnlinksBehindSurviveAServerStopAtAnyMoment(t *testing.T) {
	for step := 0; step < 6; step++ {
		t.Run(fmt.Sprintf("after %d ms", 15*step), func(t *testing.T) {
			rs := newRestartableServer(t, "unlinks")
			proxy := newCutProxy(t, rs.addr)
			a := mount(t, Spec{MountPath: rs.mp + "-a", Remote: &Remote{Address: proxy.addr, Token: testToken, Client: "a", NamespaceID: 1, InstanceID: 3, Limits: rs.limits}, Logger: quietLogger(t)})
			var names []string
			for i := 0; i < 24; i++ {
				names = append(names, fmt.Sprintf("f%d", i))
			}
			makeFiles(t, filepath.Join(a.Path(), "d"), names...)
			proxy.slow(10 * time.Millisecond)
			gone := acrossRestart(t, rs, time.Duration(15*step)*time.Millisecond, names, func(name string) error {
				return os.Remove(filepath.Join(a.Path(), "d", name))
			})
			proxy.slow(0)
			a.backend.unlinking.Wait()
			if a.backend.unlinksBehind.Load() == 0 {
				t.Error("no removal went behind")
			}
			if n := a.backend.unlinksFailed.Load(); n != 0 {
				t.Errorf("%d removals failed after they returned", n)
			}
			for _, n := range gone {
				missing(t, filepath.Join(rs.src, "d", n))
			}
		})
	}
}
