package mount

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// The max_mds backends: one local, one remote.
func eachMaxMDS(t *testing.T, test func(t *testing.T, b testBackend)) {
	for _, b := range backends {
		if b.shards > 1 {
			t.Run(b.name, func(t *testing.T) {
				if os.Geteuid() != 0 {
					t.Skip("a striped namespace's layout is a trusted extended attribute: root only")
				}
				test(t, b)
			})
		}
	}
}

// holders lists the shards whose directory holds rel (relative to the namespace).
func holders(t *testing.T, src, rel string) []int {
	t.Helper()
	var out []int
	for s, dir := range shardDirs(src, testShards) {
		if _, err := os.Lstat(filepath.Join(dir, rel)); err == nil {
			out = append(out, s)
		} else if !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	return out
}

// Many files made in one directory spread over every shard, each file on one; the directory
// is on all of them; the mount lists each name once.
func TestMaxMDSSpreadsOneDirectory(t *testing.T) {
	eachMaxMDS(t, func(t *testing.T, b testBackend) {
		src, mp := dirs(t)
		m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("maxmds", 1<<30), Logger: quietLogger(t)})
		dir := filepath.Join(m.Path(), "out")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if got := holders(t, src, "out"); len(got) != testShards {
			t.Fatalf("the directory is on shards %v, want all %d", got, testShards)
		}
		const files = 300
		counts := make([]int, testShards)
		for i := 0; i < files; i++ {
			name := fmt.Sprintf("rank%04d.dat", i)
			if err := os.WriteFile(filepath.Join(dir, name), []byte(name), 0o644); err != nil {
				t.Fatal(err)
			}
			on := holders(t, src, "out/"+name)
			if len(on) != 1 {
				t.Fatalf("%s is on shards %v, want exactly one", name, on)
			}
			counts[on[0]]++
		}
		for s, c := range counts {
			if c < files/testShards/2 {
				t.Errorf("shard %d holds %d of %d files: %v", s, c, files, counts)
			}
		}
		t.Logf("%d files of one directory per shard: %v", files, counts)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != files {
			t.Fatalf("the mount lists %d entries, want %d", len(entries), files)
		}
		for i, e := range entries {
			if want := fmt.Sprintf("rank%04d.dat", i); e.Name() != want {
				t.Fatalf("entry %d is %s, want %s", i, e.Name(), want)
			}
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil || string(data) != e.Name() {
				t.Fatalf("%s holds %q (%v)", e.Name(), data, err)
			}
		}
		// Subdirectories are listed once, beside the files.
		if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		names, err := os.ReadDir(dir)
		if err != nil || len(names) != files+1 {
			t.Fatalf("with a subdirectory the mount lists %d entries (%v), want %d", len(names), err, files+1)
		}
	})
}

// A file renamed to a name of another shard keeps its data and its stripe objects; the old
// name is gone; a file it replaces goes with its objects.
func TestMaxMDSRenameBetweenShards(t *testing.T) {
	eachMaxMDS(t, func(t *testing.T, b testBackend) {
		src, mp := dirs(t)
		m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("maxmds", 1<<30), Logger: quietLogger(t)})
		root := m.Path()
		if err := os.Mkdir(filepath.Join(root, "a"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(root, "b"), 0o700); err != nil {
			t.Fatal(err)
		}
		data := func(i int) []byte { return bytes.Repeat([]byte{byte(i), byte(i >> 8)}, 100<<10) } // 200 KiB: every stripe server
		crossed := 0
		for i := 0; i < 30; i++ {
			from, to := fmt.Sprintf("a/f%d", i), fmt.Sprintf("b/g%d", i)
			if err := os.WriteFile(filepath.Join(root, from), data(i), 0o640); err != nil {
				t.Fatal(err)
			}
			before := holders(t, src, from)
			if err := os.Rename(filepath.Join(root, from), filepath.Join(root, to)); err != nil {
				t.Fatalf("rename %s to %s: %v", from, to, err)
			}
			after := holders(t, src, to)
			if len(holders(t, src, from)) != 0 || len(after) != 1 {
				t.Fatalf("after the rename %s is on %v and %s on %v", from, holders(t, src, from), to, after)
			}
			if before[0] != after[0] {
				crossed++
			}
			got, err := os.ReadFile(filepath.Join(root, to))
			if err != nil || !bytes.Equal(got, data(i)) {
				t.Fatalf("%s after the rename: %d bytes (%v), want its %d", to, len(got), err, len(data(i)))
			}
			st := statOf(t, filepath.Join(root, to))
			if st.Mode&0o777 != 0o640 || st.Size != int64(len(data(i))) {
				t.Fatalf("%s after the rename: mode %o size %d", to, st.Mode&0o777, st.Size)
			}
		}
		if crossed == 0 {
			t.Fatal("no rename crossed shards: the test proves nothing")
		}
		t.Logf("%d of 30 renames crossed shards", crossed)
		objects := func() int {
			n := 0
			for _, d := range stripeDirs(src) {
				entries, _ := os.ReadDir(d)
				n += len(entries)
			}
			return n
		}
		// Over an existing file: the replaced file's objects go.
		had := objects()
		for i := 1; i < 30; i++ {
			if err := os.Rename(filepath.Join(root, fmt.Sprintf("b/g%d", i)), filepath.Join(root, "b/g0")); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(filepath.Join(root, "b/g0"))
		if err != nil || !bytes.Equal(got, data(29)) {
			t.Fatalf("b/g0 after the renames over it: %d bytes (%v)", len(got), err)
		}
		if left, want := objects(), had/30; left != want {
			t.Errorf("%d stripe objects left of %d, want the last file's %d", left, had, want)
		}
		entries, _ := os.ReadDir(filepath.Join(root, "b"))
		if len(entries) != 1 {
			t.Errorf("b lists %d entries, want 1", len(entries))
		}
		// RENAME_NOREPLACE over a file of another shard.
		if err := os.WriteFile(filepath.Join(root, "a/x"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 20; i++ {
			other := fmt.Sprintf("a/y%d", i)
			if err := os.WriteFile(filepath.Join(root, other), []byte("y"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := renameat2(filepath.Join(root, "a/x"), filepath.Join(root, other), unix.RENAME_NOREPLACE); !errors.Is(err, syscall.EEXIST) {
				t.Fatalf("RENAME_NOREPLACE over %s: %v, want EEXIST", other, err)
			}
		}
		// A directory renamed keeps its children where they are.
		if err := os.Rename(filepath.Join(root, "b"), filepath.Join(root, "a/b2")); err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(filepath.Join(root, "a/b2/g0")); err != nil || !bytes.Equal(got, data(29)) {
			t.Fatalf("a/b2/g0 after renaming its directory: %d bytes (%v)", len(got), err)
		}
		if got := holders(t, src, "a/b2"); len(got) != testShards {
			t.Fatalf("the renamed directory is on shards %v", got)
		}
		if st := statOf(t, filepath.Join(root, "a/b2")); st.Mode&0o777 != 0o700 {
			t.Errorf("the renamed directory has mode %o", st.Mode&0o777)
		}
	})
}

func renameat2(from, to string, flags uint) error {
	return unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, flags)
}

// rmdir fails with ENOTEMPTY while any shard holds an entry of the directory, and leaves the
// directory whole; once it is empty everywhere it goes from every shard. chmod of a
// directory reaches every shard.
func TestMaxMDSRmdir(t *testing.T) {
	eachMaxMDS(t, func(t *testing.T, b testBackend) {
		src, mp := dirs(t)
		m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("maxmds", 1<<30), Logger: quietLogger(t)})
		root := m.Path()
		var names []string
		seen := map[int]bool{}
		for i := 0; len(seen) < testShards; i++ {
			if i > 100 {
				t.Fatalf("100 files fell on shards %v only", seen)
			}
			d := fmt.Sprintf("d%d", i)
			if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, d, "only"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			on := holders(t, src, d+"/only")[0]
			if seen[on] {
				continue
			}
			seen[on] = true
			names = append(names, d)
		}
		sort.Strings(names)
		for _, d := range names {
			shard := holders(t, src, d+"/only")
			if err := os.Remove(filepath.Join(root, d)); !errors.Is(err, syscall.ENOTEMPTY) {
				t.Fatalf("rmdir of %s holding a file on shard %v: %v, want ENOTEMPTY", d, shard, err)
			}
			if got := holders(t, src, d); len(got) != testShards {
				t.Fatalf("a refused rmdir left %s on shards %v", d, got)
			}
			if err := os.Chmod(filepath.Join(root, d), 0o750); err != nil {
				t.Fatal(err)
			}
			for s, dir := range shardDirs(src, testShards) {
				if st := statOf(t, filepath.Join(dir, d)); st.Mode&0o777 != 0o750 {
					t.Errorf("shard %d: %s has mode %o after chmod 750", s, d, st.Mode&0o777)
				}
			}
			if err := os.Remove(filepath.Join(root, d, "only")); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(root, d)); err != nil {
				t.Fatalf("rmdir of the emptied %s: %v", d, err)
			}
			if got := holders(t, src, d); len(got) != 0 {
				t.Fatalf("after rmdir %s is still on shards %v", d, got)
			}
			if _, err := os.Stat(filepath.Join(root, d)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("stat of the removed %s: %v", d, err)
			}
		}
	})
}

// Two mounts of one sharded namespace (two compute nodes) see each other's files and
// directories, wherever they live.
func TestMaxMDSTwoMounts(t *testing.T) {
	eachMaxMDS(t, func(t *testing.T, b testBackend) {
		src, mp := dirs(t)
		spec := Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("maxmds", 1<<30), Logger: quietLogger(t)}
		one := b.mount(t, spec)
		spec.MountPath = filepath.Join(filepath.Dir(mp), "42_second")
		two := b.mount(t, spec)
		for i := 0; i < 40; i++ {
			sub := fmt.Sprintf("dir%d/inner", i%4)
			if err := os.MkdirAll(filepath.Join(one.Path(), sub), 0o755); err != nil {
				t.Fatal(err)
			}
			name := filepath.Join(sub, fmt.Sprintf("from-two-%d", i))
			if err := os.WriteFile(filepath.Join(two.Path(), name), []byte(name), 0o644); err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(filepath.Join(one.Path(), name)); err != nil || string(got) != name {
				t.Fatalf("%s written by the second mount reads %q (%v) on the first", name, got, err)
			}
		}
		for i := 0; i < 4; i++ {
			entries, err := os.ReadDir(filepath.Join(one.Path(), fmt.Sprintf("dir%d/inner", i)))
			if err != nil || len(entries) != 10 {
				t.Fatalf("dir%d/inner lists %d entries (%v), want 10", i, len(entries), err)
			}
		}
	})
}

// Adding or removing an entry held by another shard moves the directory's modification and
// change times, which shard 0's copy holds, as on a local file system.
func TestMaxMDSParentTimesMove(t *testing.T) {
	eachMaxMDS(t, func(t *testing.T, b testBackend) {
		src, mp := dirs(t)
		m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("maxmds", 1<<30), Logger: quietLogger(t)})
		dir := filepath.Join(m.Path(), "d")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		times := func() (mtime, ctime unix.Timespec) {
			var st unix.Stat_t
			if err := unix.Stat(dir, &st); err != nil {
				t.Fatal(err)
			}
			return st.Mtim, st.Ctim
		}
		for i, op := range []func(name string) error{
			func(name string) error { return os.WriteFile(name, nil, 0o644) },
			func(name string) error { return os.Symlink("target", name) },
			func(name string) error { return unix.Mkfifo(name, 0o644) },
			os.Remove,
		} {
			// Names until one lands on a shard other than 0 (the one that needs the update).
			for n := 0; ; n++ {
				name := fmt.Sprintf("e%d-%d", i, n)
				if i == 3 {
					name = fmt.Sprintf("e0-%d", n)
				}
				path := filepath.Join(dir, name)
				if i == 3 {
					if _, err := os.Lstat(path); err != nil {
						t.Fatalf("no file of the first round on a shard other than 0: %v", err)
					}
				}
				held := holders(t, src, filepath.Join("d", name))
				if i != 3 && (len(held) > 0 || n > 50) {
					t.Fatalf("%s already held by %v", name, held)
				}
				m0, c0 := times()
				time.Sleep(20 * time.Millisecond)
				if err := op(path); err != nil {
					t.Fatal(err)
				}
				if i != 3 {
					held = holders(t, src, filepath.Join("d", name))
				}
				if len(held) == 1 && held[0] != 0 {
					if m1, c1 := times(); m1 == m0 || c1 == c0 {
						t.Errorf("op %d on %s (shard %v): the directory's times did not move (%v %v)", i, name, held, m1, c1)
					}
					break
				}
			}
		}
	})
}
