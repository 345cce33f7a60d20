package mount

import (
	"bytes"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/server"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// createPair mounts one striped namespace on two nodes: a reaches its metadata server through
// a proxy that can slow its requests, b directly. With rs, the metadata server is rs's (a
// server that can be stopped and started again).
func createPair(t *testing.T, rs *restartableServer) (src string, a, b *Mounted, proxy *cutProxy, logs *strings.Builder) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a striped namespace's layout is a trusted extended attribute: root only")
	}
	var mp, addr string
	if rs != nil {
		src, mp, addr = rs.src, rs.mp, rs.addr
	} else {
		src, mp = dirs(t)
	}
	l := stripe.Layout{Size: testStripeSize, Width: testStripeServers, Servers: testStripeServers}
	if err := unix.Setxattr(src, server.LayoutXattr, l.Encode(), 0); err != nil {
		t.Fatal(err)
	}
	tr := usage.New("creates", 1<<30)
	var stripes []Server
	for i, dir := range stripeDirs(src) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if i == 0 && rs != nil && rs.stripes != nil {
			stripes = append(stripes, Server{}) // the metadata server's own, set per mount below
			continue
		}
		saddr := startLeaseServer(t, server.Target{Dir: dir, Tracker: tr}, 0)
		stripes = append(stripes, Server{Remote: &Remote{Address: saddr, Token: testToken, Client: "n", FragmentID: 2 + int64(i), InstanceID: 3}})
	}
	if rs == nil {
		addr = startLeaseServer(t, server.Target{Dir: src, Tracker: tr}, 0)
	}
	proxy = newCutProxy(t, addr)
	remote := func(address, client string) *Remote {
		r := &Remote{Address: address, Token: testToken, Client: client, FragmentID: 1, NamespaceID: 1, InstanceID: 3}
		if rs != nil {
			r.Limits = rs.limits
		}
		return r
	}
	// A metadata server holding the first stripes is reached for them as for the namespace:
	// through the proxy from a.
	stripesVia := func(address string) []Server {
		out := slices.Clone(stripes)
		if out[0].Remote == nil {
			out[0] = Server{Remote: &Remote{Address: address, Token: testToken, Client: "n", FragmentID: 1, InstanceID: 3, Limits: rs.limits}}
		}
		return out
	}
	// Files placed whole are so however slow the machine: a create behind waits for its
	// file's close as long as allowed (it leaves at once at any other call about the file).
	var limits Limits
	if rs != nil && rs.stripes != nil {
		limits.CreateWriteWait = time.Second
	}
	logs = &strings.Builder{}
	a = mount(t, Spec{MountPath: mp + "-a", Remote: remote(proxy.addr, "a"), Stripes: stripesVia(proxy.addr), Limits: limits, Logger: log.New(logs, "", 0)})
	b = mount(t, Spec{MountPath: mp + "-b", Remote: remote(addr, "b"), Stripes: stripesVia(addr), Limits: limits, Logger: quietLogger(t)})
	return src, a, b, proxy, logs
}

// readyToCreateBehind makes directory dir on a and two files in it (the second asks the
// storage node for files made ahead), and waits until a holds some for dir.
func readyToCreateBehind(t *testing.T, a *Mounted, dir string) {
	t.Helper()
	makeFiles(t, dir, "first", "second")
	ino := inode(t, dir)
	deadline := time.Now().Add(10 * time.Second)
	for {
		held := 0
		a.backend.stubs.mu.Lock()
		for key, b := range a.backend.stubs.batches {
			if key.dir == ino {
				held += len(b.inos)
			}
		}
		a.backend.stubs.mu.Unlock()
		if held > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the storage node made no files ahead")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// Creates in a directory a node made go without waiting for the storage node, however slow its
// link; another node sees every file at its next call, with the inode number the creator
// saw: the storage node recalls the creator's listing, and the creator lands its creates,
// before that call runs.
func TestCreatesBehindAreSeenElsewhereAtOnce(t *testing.T) {
	src, a, b, proxy, _ := createPair(t, nil)
	dir := filepath.Join(a.Path(), "d")
	readyToCreateBehind(t, a, dir)
	proxy.slow(100 * time.Millisecond) // each of a's requests reaches the server 100 ms late
	names := createBehind(t, a, dir, "f0", "f1", "f2")
	inos := map[string]uint64{}
	for _, n := range names {
		inos[n] = inode(t, filepath.Join(dir, n))
	}
	// Without the recall b would find most of them missing.
	for _, n := range names {
		if ino := inode(t, filepath.Join(b.Path(), "d", n)); ino != inos[n] {
			t.Errorf("%s: b sees inode %d, a %d", n, ino, inos[n])
		}
	}
	ents, err := os.ReadDir(filepath.Join(b.Path(), "d"))
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, e := range ents {
		listed = append(listed, e.Name())
	}
	sort.Strings(listed)
	if strings.Join(listed, " ") != "f0 f1 f2 first second" {
		t.Errorf("b lists %v, want f0 f1 f2 first second", listed)
	}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(src, "d", n), &st); err != nil || st.Ino != inos[n] || st.Mode != syscall.S_IFREG|0o644 {
			t.Errorf("%s on the server: %v, inode %d mode %o; want inode %d, 0644", n, err, st.Ino, st.Mode, inos[n])
		}
	}
	// a's listing went with the recall: its later creates there wait for the server.
	makeFiles(t, dir, "g")
	if got := a.backend.createsBehind.Load(); got != int64(len(names)) {
		t.Errorf("a create after the recall went behind (%d)", got)
	}
}

// A file created behind is written, changed and read at once, as any: its first write, chmod
// and new open wait for its create; what b then reads is what a wrote.
func TestCreateBehindThenWrite(t *testing.T) {
	src, a, b, proxy, _ := createPair(t, nil)
	dir := filepath.Join(a.Path(), "w")
	readyToCreateBehind(t, a, dir)
	proxy.slow(50 * time.Millisecond)
	data := bytes.Repeat([]byte("spillway"), 10000)
	p := filepath.Join(dir, "data")
	if err := os.WriteFile(p, data, 0o644); err != nil { // the mode its files ahead were made with
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("a reads back %d bytes (%v), want %d", len(got), err, len(data))
	}
	if a.backend.createsBehind.Load() != 1 {
		t.Fatalf("%d creates went behind, want 1", a.backend.createsBehind.Load())
	}
	if got, err := os.ReadFile(filepath.Join(b.Path(), "w", "data")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("b reads %d bytes (%v), want %d", len(got), err, len(data))
	}
	if st, err := os.Stat(filepath.Join(src, "w", "data")); err != nil || st.Mode().Perm() != 0o640 {
		t.Fatalf("the server's w/data: %v %v, want mode 0640", st, err)
	}
}

// A file created behind is written through the handle its PLACE opened, not by its name:
// another node that renames it between two writes and the close finds all of it under its
// new name, and one that removes it leaves the writer's close a success.
func TestCreateBehindWrittenWhileAnotherNodeMovesIt(t *testing.T) {
	t.Run("objects elsewhere", func(t *testing.T) { writtenWhileMoved(t, nil) })
	// The first write held for a whole PLACE: the other node's look sends it as the first
	// write, before the rename or removal runs.
	t.Run("placed whole", func(t *testing.T) { writtenWhileMoved(t, newRestartableServerHolding(t, "moves")) })
}

func writtenWhileMoved(t *testing.T, rs *restartableServer) {
	_, a, b, _, _ := createPair(t, rs)
	first, second := bytes.Repeat([]byte("a"), 3000), bytes.Repeat([]byte("b"), 5000)
	// write creates dir/name on a (behind), writes first, runs between, writes second, closes.
	write := func(dir, name string, between func()) error {
		readyToCreateBehind(t, a, filepath.Join(a.Path(), dir))
		behind := a.backend.createsBehind.Load()
		f, err := os.OpenFile(filepath.Join(a.Path(), dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		if a.backend.createsBehind.Load() != behind+1 {
			t.Fatalf("the create of %s/%s did not go behind", dir, name)
		}
		if _, err := f.Write(first); err != nil {
			return err
		}
		between()
		if _, err := f.Write(second); err != nil {
			return err
		}
		return f.Close()
	}
	if err := write("m", "moved", func() {
		if err := os.Rename(filepath.Join(b.Path(), "m", "moved"), filepath.Join(b.Path(), "m", "there")); err != nil {
			t.Fatal(err)
		}
	}); err != nil {
		t.Fatalf("writing a file another node renamed meanwhile: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(b.Path(), "m", "there")); err != nil || !bytes.Equal(got, append(first, second...)) {
		t.Errorf("b reads %d bytes of the renamed file (%v), want %d", len(got), err, len(first)+len(second))
	}
	if err := write("r", "removed", func() {
		if err := os.Remove(filepath.Join(b.Path(), "r", "removed")); err != nil {
			t.Fatal(err)
		}
	}); err != nil {
		t.Errorf("writing a file another node removed meanwhile: %v, want success (it is open)", err)
	}
}

// Where the metadata server holds the first stripes (the first fragment's node does), a file
// created behind, written and closed at once is placed whole: its data rides in the PLACE,
// one request. Whatever else happens before the close sends the held bytes as the file's
// first write instead, and nothing is lost or reordered: a stat (sees the size held), a read
// through the same descriptor, an fsync, more than CreateWholeMax, a first write past
// offset 0, a directory that fixes where its files start (the server refuses the data).
func TestPlacedWhole(t *testing.T) {
	_, a, b, _, _ := createPair(t, newRestartableServerHolding(t, "whole"))
	dir := filepath.Join(a.Path(), "d")
	readyToCreateBehind(t, a, dir)
	if err := os.Mkdir(filepath.Join(dir, "fixed"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(dir, "fixed"), stripe.UserXattr, []byte("start=1"), 0); err != nil {
		t.Fatal(err)
	}
	readyToCreateBehind(t, a, filepath.Join(dir, "fixed"))
	small := bytes.Repeat([]byte("spillway"), 488)
	cases := []struct {
		name  string
		whole bool
		write func(f *os.File) ([]byte, error) // the file's bytes after
	}{
		{"one write", true, func(f *os.File) ([]byte, error) { _, err := f.Write(small); return small, err }},
		{"two writes", true, func(f *os.File) ([]byte, error) {
			if _, err := f.Write(small[:1000]); err != nil {
				return nil, err
			}
			_, err := f.Write(small[1000:])
			return small, err
		}},
		{"a stat before the close", true, func(f *os.File) ([]byte, error) {
			f.Write(small)
			st, err := f.Stat()
			if err == nil && st.Size() != int64(len(small)) {
				err = fmt.Errorf("stat says %d bytes, want %d", st.Size(), len(small))
			}
			return small, err
		}},
		{"a read before the close", false, func(f *os.File) ([]byte, error) {
			f.Write(small)
			got := make([]byte, len(small))
			if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, small) {
				return nil, fmt.Errorf("read back %q… (%v)", got[:8], err)
			}
			return small, nil
		}},
		{"an fsync", false, func(f *os.File) ([]byte, error) { f.Write(small); return small, f.Sync() }},
		{"past the most held", false, func(f *os.File) ([]byte, error) {
			big := bytes.Repeat(small, 20) // 78 KB, past 64 KiB
			_, err := f.Write(big)
			return big, err
		}},
		{"a first write past 0", false, func(f *os.File) ([]byte, error) {
			_, err := f.WriteAt(small, 100)
			return append(make([]byte, 100), small...), err
		}},
		{"fixed/in a directory that fixes its files' start", false, func(f *os.File) ([]byte, error) { _, err := f.Write(small); return small, err }},
	}
	wants := map[string][]byte{}
	for _, c := range cases {
		name := strings.ReplaceAll(c.name, " ", "-")
		whole := a.backend.placedWhole.Load()
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		want, err := c.write(f)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if err := f.Close(); err != nil {
			t.Errorf("%s: close: %v", c.name, err)
		}
		if got := a.backend.placedWhole.Load() - whole; got != map[bool]int64{true: 1, false: 0}[c.whole] {
			t.Errorf("%s: %d files placed whole, want whole %v (%d behind)", c.name, got, c.whole, a.backend.createsBehind.Load())
		}
		wants[c.name] = want
	}
	// b looks last: its first look takes a's listing, and a's creates there wait from then on.
	for _, c := range cases {
		name := strings.ReplaceAll(c.name, " ", "-")
		for _, m := range []*Mounted{a, b} {
			if got, err := os.ReadFile(filepath.Join(m.Path(), "d", name)); err != nil || !bytes.Equal(got, wants[c.name]) {
				t.Errorf("%s: %s reads %d bytes (%v), want the %d written", c.name, m.Path(), len(got), err, len(wants[c.name]))
			}
		}
	}
}

// A create the storage node refuses after its caller had its answer (here: the directory
// made immutable meanwhile) is logged, and its name dropped: the file does not show, and the
// handle's next operation fails.
func TestCreateBehindRefusedDropsTheName(t *testing.T) {
	src, a, _, proxy, logs := createPair(t, nil)
	dir := filepath.Join(a.Path(), "r")
	readyToCreateBehind(t, a, dir)
	proxy.slow(300 * time.Millisecond)
	f, err := os.OpenFile(filepath.Join(dir, "late"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if a.backend.createsBehind.Load() != 1 {
		t.Fatalf("%d creates went behind, want 1", a.backend.createsBehind.Load())
	}
	d, err := os.Open(filepath.Join(src, "r"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := unix.IoctlSetPointerInt(int(d.Fd()), unix.FS_IOC_SETFLAGS, fsImmutableFl); err != nil {
		t.Skipf("chattr +i: %v", err)
	}
	defer unix.IoctlSetPointerInt(int(d.Fd()), unix.FS_IOC_SETFLAGS, 0)
	if _, err := f.Write([]byte("x")); err == nil {
		t.Fatal("a write to a file whose create was refused succeeded")
	}
	if a.backend.createsFailed.Load() != 1 {
		t.Fatalf("%d creates failed, want 1", a.backend.createsFailed.Load())
	}
	unix.IoctlSetPointerInt(int(d.Fd()), unix.FS_IOC_SETFLAGS, 0)
	proxy.slow(0)
	missing(t, filepath.Join(dir, "late"))
	missing(t, filepath.Join(src, "r", "late"))
	if !strings.Contains(logs.String(), "failed on the storage node") {
		t.Errorf("the refusal was not logged: %q", logs.String())
	}
}

// Creates on their way when the storage agent restarts are made again on the mount's next
// connection (the files made ahead went with the first), never lost.
func TestCreatesBehindLandAfterAServerRestart(t *testing.T) {
	rs := newRestartableServer(t, "creates")
	src, a, _, proxy, _ := createPair(t, rs)
	dir := filepath.Join(a.Path(), "d")
	readyToCreateBehind(t, a, dir)
	proxy.slow(200 * time.Millisecond)
	names := createBehind(t, a, dir, "f0", "f1", "f2")
	rs.stop() // most of them are still in the slow link
	proxy.slow(0)
	rs.start()
	landed(t, a, filepath.Join(src, "d"), names)
	for _, n := range names {
		if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s: %v on a", n, err)
		}
	}
}

// createBehind creates names in dir on a, and fails unless they all went behind.
func createBehind(t *testing.T, a *Mounted, dir string, names ...string) []string {
	t.Helper()
	before := a.backend.createsBehind.Load()
	for _, n := range names {
		makeFiles(t, dir, n)
	}
	if got := a.backend.createsBehind.Load() - before; got != int64(len(names)) {
		t.Fatalf("%d creates went behind, want %d", got, len(names))
	}
	return names
}

// landed waits until a's creates on their way are answered, and fails unless none was
// refused and every one of names is in the server's directory dir.
func landed(t *testing.T, a *Mounted, dir string, names []string) {
	t.Helper()
	a.backend.creating.Wait()
	if n := a.backend.createsFailed.Load(); n != 0 {
		t.Fatalf("%d creates failed", n)
	}
	for _, n := range names {
		if _, err := os.Lstat(filepath.Join(dir, n)); err != nil {
			t.Errorf("%s: %v on the server", n, err)
		}
	}
}

// Another node's rename of a directory above one with creates on their way waits for them:
// the storage node recalls the listings beneath the moved directory too, since the creates
// name their directory by its old path.
func TestCreatesBehindLandBeforeAnAncestorMoves(t *testing.T) {
	src, a, b, proxy, _ := createPair(t, nil)
	dir := filepath.Join(a.Path(), "p", "q", "d")
	readyToCreateBehind(t, a, dir)
	proxy.slow(150 * time.Millisecond)
	names := createBehind(t, a, dir, "f0", "f1", "f2")
	if err := os.Rename(filepath.Join(b.Path(), "p"), filepath.Join(b.Path(), "p2")); err != nil {
		t.Fatal(err)
	}
	landed(t, a, filepath.Join(src, "p2", "q", "d"), names)
}

// The storage agent stopped at any moment of a burst of creates — a RESERVE on its way, files
// made ahead and unused, PLACEs on their way or landed with their answers lost — and started
// again: every create that returned is on the server afterwards, none refused after it
// returned. (A create that waited for the server and lost its connection fails with EIO, as
// before: it was not acknowledged.)
func TestCreatesBehindSurviveAServerStopAtAnyMoment(t *testing.T) {
	createsAcrossRestarts(t, newRestartableServer, func(p string) error { return os.WriteFile(p, nil, 0o644) }, nil)
}

// Files created behind and written at once — the PLACE opens each for its write, the size
// report at close releases that handle — with the storage agent stopped at any moment and
// started again: every file whose close returned holds all its data, as another node reads
// it, and removing every file leaves no object on the stripe servers (where a file's objects
// are was recorded, or is unknown and looked for on every server).
func TestCreatesBehindWrittenSurviveAServerStopAtAnyMoment(t *testing.T) {
	writtenAcrossRestarts(t, newRestartableServer)
}

// The same with a metadata server that holds the first stripes too, as the first fragment's
// node does: each file, written and closed at once, is placed whole (its data in its PLACE,
// kept there) — what a stop between the object's data and the file's name leaves.
func TestCreatesPlacedWholeSurviveAServerStopAtAnyMoment(t *testing.T) {
	writtenAcrossRestarts(t, newRestartableServerHolding)
}

// writtenAcrossRestarts is createsAcrossRestarts of files written and closed at once (os.WriteFile),
// whose data node b reads back, and whose objects go with them.
func writtenAcrossRestarts(t *testing.T, newServer func(*testing.T, string) *restartableServer) {
	data := bytes.Repeat([]byte("spillway"), 488) // 3904 bytes: mdtest-hard's size, about
	createsAcrossRestarts(t, newServer, func(p string) error { return os.WriteFile(p, data, 0o644) },
		func(t *testing.T, src string, b *Mounted, all, names []string) {
			for _, n := range names {
				if got, err := os.ReadFile(filepath.Join(b.Path(), "d", n)); err != nil || !bytes.Equal(got, data) {
					t.Errorf("%s, written and closed on a: b reads %d bytes (%v), want %d", n, len(got), err, len(data))
				}
			}
			for _, n := range all {
				if err := os.Remove(filepath.Join(b.Path(), "d", n)); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Errorf("removing %s: %v", n, err)
				}
			}
			for _, sd := range stripeDirs(src) {
				filepath.WalkDir(sd, func(p string, d os.DirEntry, err error) error {
					if err == nil && d.Type().IsRegular() {
						t.Errorf("object %s left after every file was removed", p)
					}
					return nil
				})
			}
		})
}

// createsAcrossRestarts creates 24 files d/f0… on node a with create (behind, through a link
// slowed 10 ms a request) while the metadata server is stopped 0, 15, … 75 ms in and started
// again, checks that every create that returned landed, and hands the rest to check (nil:
// nothing more): the subtest, the server's directory, node b, all the names and those whose
// create returned.
func createsAcrossRestarts(t *testing.T, newServer func(*testing.T, string) *restartableServer, create func(path string) error, check func(t *testing.T, src string, b *Mounted, all, names []string)) {
	for step := 0; step < 6; step++ {
		t.Run(fmt.Sprintf("after %d ms", 15*step), func(t *testing.T) {
			rs := newServer(t, "creates")
			src, a, b, proxy, _ := createPair(t, rs)
			dir := filepath.Join(a.Path(), "d")
			readyToCreateBehind(t, a, dir)
			var all []string
			for i := 0; i < 24; i++ {
				all = append(all, fmt.Sprintf("f%d", i))
			}
			proxy.slow(10 * time.Millisecond)
			names := acrossRestart(t, rs, time.Duration(15*step)*time.Millisecond, all, func(name string) error {
				return create(filepath.Join(dir, name))
			})
			proxy.slow(0)
			if a.backend.createsBehind.Load() == 0 {
				t.Error("no create went behind")
			}
			if rs.stripes != nil && a.backend.placedWhole.Load() == 0 {
				t.Error("no file was placed whole")
			}
			landed(t, a, filepath.Join(src, "d"), names)
			if check != nil {
				check(t, src, b, all, names)
			}
		})
	}
}

// acrossRestart runs do on each of names in turn while rs is stopped after wait and started
// again, and returns the names do succeeded for; do may fail with EIO alone (a request that
// waited for the server and lost its connection).
func acrossRestart(t *testing.T, rs *restartableServer, wait time.Duration, names []string, do func(name string) error) []string {
	t.Helper()
	done := make(chan string, len(names))
	go func() {
		defer close(done)
		for _, n := range names {
			if err := do(n); err != nil {
				if !errors.Is(err, syscall.EIO) {
					t.Errorf("%s: %v, want success or EIO", n, err)
				}
				continue
			}
			done <- n
		}
	}()
	time.Sleep(wait)
	rs.stop()
	rs.start()
	var ok []string
	for n := range done {
		ok = append(ok, n)
	}
	return ok
}
