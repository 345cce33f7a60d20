package mount

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/swaprace"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage/xfstest"
)

// swapRaceDuration is how long each attack runs. The path-based server this replaced lost a
// root-owned file's mode within a second of it.
const swapRaceDuration = 3 * time.Second

// A hostile ordinary user swaps a directory of their own instance with a symbolic link to a
// root-owned directory outside it, while chmod, truncate and create race through the mount
// (package swaprace). The root server must never act outside the instance: the victim's file
// keeps its mode and contents, and nothing appears beside it. With one mount, and with the
// swap on one mount and the victims' operations on a second mount of the same namespace.
func TestSymlinkSwapCannotLeaveTheInstance(t *testing.T) {
	eachBackend(t, func(t *testing.T, b testBackend) {
		for _, mounts := range []int{1, 2} {
			t.Run(map[int]string{1: "one mount", 2: "two mounts"}[mounts], func(t *testing.T) {
				testSymlinkSwap(t, b, mounts)
			})
		}
	})
}

func testSymlinkSwap(t *testing.T, b testBackend, mounts int) {
	if b.shards > 1 {
		// The server code under attack is the striped backends'; what differs is the router.
		t.Skip("max_mds refuses the attack's swap, RENAME_EXCHANGE of a directory with a symbolic link (EXDEV)")
	}
	src, mp := dirs(t)
	if err := os.Chown(src, 65534, 65534); err != nil { // the namespace root is the job user's
		t.Fatal(err)
	}
	victim := filepath.Join(filepath.Dir(src), "victim") // root's, outside the instance
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	secret := []byte("root's file: mode 600, never truncated\n")
	target := filepath.Join(victim, swaprace.TargetName)
	if err := os.WriteFile(target, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	tr := usage.New("instance 9", 64*mib)
	spec := Spec{MountPath: mp, SourceDir: src, Tracker: tr, AllowOther: true, Logger: quietLogger(t)}
	first := b.mount(t, spec)
	through := ""
	if mounts == 2 {
		second := spec
		second.MountPath = filepath.Join(filepath.Dir(mp), "42_second")
		through = b.mount(t, second).Path()
	}

	encoded, _ := json.Marshal(swaprace.Spec{Work: first.Path(), Through: through, Victim: victim, Duration: swapRaceDuration})
	cmd := exec.Command(runnableByNobody(t))
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/", attackEnv + "=" + string(encoded)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the attacker (as nobody): %v: %s", err, out)
	}
	var rep swaprace.Report
	if err := json.Unmarshal(bytes.TrimSpace(out), &rep); err != nil {
		t.Fatalf("the attacker's report %q: %v", out, err)
	}
	t.Logf("attack through the mount as nobody for %s: %s", swapRaceDuration, rep)
	if rep.Exchanges < 10 || rep.Chmods < 10 || rep.Creates < 10 {
		t.Fatalf("the attack did not run (%s): the test would prove nothing", rep)
	}

	st := statOf(t, target)
	if st.Mode&0o7777 != 0o600 || st.Uid != 0 {
		t.Errorf("root's file outside the instance has mode %o owner %d after the attack, want 600 and root", st.Mode&0o7777, st.Uid)
	}
	if data, err := os.ReadFile(target); err != nil || !bytes.Equal(data, secret) {
		t.Errorf("root's file outside the instance holds %q (%v) after the attack, want it unchanged", data, err)
	}
	entries, err := os.ReadDir(victim)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != swaprace.TargetName {
			t.Errorf("the attack created %s in root's directory outside the instance", filepath.Join(victim, e.Name()))
		}
	}
}

// spaceAttackEnv selects the space attacker's role (spaceAttack): an ordinary user trying to
// take more of the storage node's disk than their instance's capacity through a mount.
const spaceAttackEnv = "SPILLWAY_LOCALFS_TEST_SPACE_ATTACK"

// spaceAttackSpec is what the attacker does in Dir, a directory of the mount.
type spaceAttackSpec struct {
	Dir string
	// Op is "fallocate": one fallocate(FALLOC_FL_KEEP_SIZE) of Big bytes, then Chunk bytes at
	// a time past the end of a file of size 0 until refused or Total allocated; "mkdir":
	// up to Count directories with long names; "xattr": up to Count files, each with an
	// extended attribute of Chunk bytes.
	Op                string
	Big, Chunk, Total uint64
	Count             int
}

// spaceAttackReport is what the attacker did.
type spaceAttackReport struct {
	BigErrno  int    // the single big fallocate's errno (0: it succeeded)
	Done      uint64 // bytes allocated, or directories or attributes made
	LastErrno int    // what stopped the loop (0: it ran to the end)
}

func spaceAttack(encoded string) int {
	var spec spaceAttackSpec
	if err := json.Unmarshal([]byte(encoded), &spec); err != nil {
		fmt.Println("error:", err)
		return 2
	}
	var rep spaceAttackReport
	errnoOf := func(err error) int {
		var e syscall.Errno
		if errors.As(err, &e) {
			return int(e)
		}
		if err != nil {
			return -1
		}
		return 0
	}
	switch spec.Op {
	case "fallocate":
		f, err := os.Create(filepath.Join(spec.Dir, "hog"))
		if err != nil {
			fmt.Println("error:", err)
			return 1
		}
		rep.BigErrno = errnoOf(fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, int64(spec.Big)))
		if rep.BigErrno == 0 {
			rep.Done = spec.Big
		}
		for off := rep.Done; off < spec.Total; off += spec.Chunk {
			if err := fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(spec.Chunk)); err != nil {
				rep.LastErrno = errnoOf(err)
				break
			}
			rep.Done = off + spec.Chunk
		}
		f.Close()
	case "mkdir":
		long := strings.Repeat("d", 200)
		for i := 0; i < spec.Count; i++ {
			if err := restarted(func() error { return os.Mkdir(filepath.Join(spec.Dir, fmt.Sprintf("%s%06d", long, i)), 0o755) }); err != nil {
				rep.LastErrno = errnoOf(err)
				break
			}
			rep.Done++
		}
	case "xattr":
		value := bytes.Repeat([]byte("x"), int(spec.Chunk))
		for i := 0; i < spec.Count; i++ {
			p := filepath.Join(spec.Dir, fmt.Sprintf("x%06d", i))
			err := restarted(func() error { return os.WriteFile(p, nil, 0o644) })
			if err == nil {
				err = restarted(func() error { return unix.Setxattr(p, "user.ballast", value, 0) })
			}
			if err != nil {
				rep.LastErrno = errnoOf(err)
				break
			}
			rep.Done++
		}
	default:
		fmt.Println("error: unknown op", spec.Op)
		return 2
	}
	out, _ := json.Marshal(rep)
	fmt.Println(string(out))
	return 0
}

// spaceAttackerUID is the ordinary user the space attacker runs as: a uid of its own, not
// nobody, so that no other test's process of that uid can get in its way (a tracer).
const spaceAttackerUID = 61019

// restarted runs op again while a signal interrupts it (EINTR: the Go runtime's own signals
// interrupt FUSE requests). The attacker's names are new, so EEXIST means an attempt that
// was interrupted (here, or inside package os, which restarts mkdir itself) made the entry:
// done.
func restarted(op func() error) error {
	err := op()
	for errors.Is(err, syscall.EINTR) {
		err = op()
	}
	if errors.Is(err, syscall.EEXIST) {
		return nil
	}
	return err
}

// runSpaceAttack runs the attacker as spaceAttackerUID against spec.Dir (a directory of a
// mount that this user may write) and returns its report.
func runSpaceAttack(t *testing.T, spec spaceAttackSpec) spaceAttackReport {
	t.Helper()
	encoded, _ := json.Marshal(spec)
	cmd := exec.Command(runnableByNobody(t))
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/", spaceAttackEnv + "=" + string(encoded)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: spaceAttackerUID, Gid: spaceAttackerUID, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the attacker (uid %d): %v: %s", spaceAttackerUID, err, out)
	}
	var rep spaceAttackReport
	if err := json.Unmarshal(bytes.TrimSpace(out), &rep); err != nil {
		t.Fatalf("the attacker's report %q: %v", out, err)
	}
	return rep
}

// namespaceDirs are the directories that hold namespace src on the storage side: src, a
// striped backend's stripe directories, a max_mds backend's shards.
func namespaceDirs(src string) []string {
	dirs := []string{src}
	for _, dir := range append(stripeDirs(src), shardDirs(src, testShards)[1:]...) {
		if _, err := os.Stat(dir); err == nil {
			dirs = append(dirs, dir)
		}
	}
	return dirs
}

// allocatedUnder is what the storage node's file system gives to what is under dirs: the
// blocks (st_blocks) of every file, directory and link, each inode once.
func allocatedUnder(t *testing.T, dirs []string) uint64 {
	t.Helper()
	seen := map[uint64]bool{}
	var total uint64
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			if !seen[st.Ino] {
				seen[st.Ino] = true
				total += uint64(st.Blocks) * 512
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return total
}

// attackersNamespace makes a namespace directory the job's user (spaceAttackerUID) owns.
func attackersNamespace(t *testing.T) (src, mp string) {
	t.Helper()
	src, mp = dirs(t)
	if err := os.Chown(src, spaceAttackerUID, spaceAttackerUID); err != nil {
		t.Fatal(err)
	}
	return src, mp
}

// Security issue 19, item 1: an ordinary user fallocates with FALLOC_FL_KEEP_SIZE through
// their mount far past their instance's capacity. The space allocated past a file's end counts
// as any other: the call is refused with ENOSPC once the instance is full, and what the
// namespace holds on the storage node's disk stays within the capacity. Before, the size
// stayed 0, nothing was charged, and a 1 GiB instance allocated 20 GiB of the node's SSD.
func TestKeepSizeFallocateCannotFillTheNode(t *testing.T) {
	eachBackend(t, func(t *testing.T, b testBackend) {
		src, mp := attackersNamespace(t)
		const capacity = 8 * mib
		tr := usage.New("instance 19", capacity)
		m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, AllowOther: true, Logger: quietLogger(t)})
		rep := runSpaceAttack(t, spaceAttackSpec{Dir: m.Path(), Op: "fallocate", Big: 256 * mib, Chunk: mib, Total: 256 * mib})
		held := allocatedUnder(t, namespaceDirs(src))
		t.Logf("as an ordinary user: fallocate(KEEP_SIZE, 256 MiB): %v; then %d MiB allocated 1 MiB at a time, stopped by %v; the namespace holds %d KiB on disk, the tracker counts %d KiB",
			syscall.Errno(rep.BigErrno), rep.Done/mib, syscall.Errno(rep.LastErrno), held/kib, tr.Used()/kib)
		if syscall.Errno(rep.BigErrno) != syscall.ENOSPC {
			t.Errorf("fallocate(KEEP_SIZE) of 256 MiB in an %d MiB instance: %v, want ENOSPC", capacity/mib, syscall.Errno(rep.BigErrno))
		}
		if syscall.Errno(rep.LastErrno) != syscall.ENOSPC || rep.Done > capacity {
			t.Errorf("fallocate(KEEP_SIZE) 1 MiB at a time allocated %d MiB then %v; want at most %d MiB, then ENOSPC",
				rep.Done/mib, syscall.Errno(rep.LastErrno), capacity/mib)
		}
		if slack := uint64(256 * kib); held > capacity+slack {
			t.Errorf("the namespace holds %d KiB of the node's disk; the instance's capacity is %d KiB", held/kib, capacity/kib)
		}
		checkAccounting(t, tr, src)
	})
}

// MFS bounds what one file may allocate, past its end too: fallocate(KEEP_SIZE) of a range
// that passes it fails with EFBIG, however much room the instance has.
func TestKeepSizeFallocateRespectsMaxFileSize(t *testing.T) {
	eachBackend(t, func(t *testing.T, b testBackend) {
		src, mp := attackersNamespace(t)
		const mfs = mib
		tr := usage.New("instance 19", 64*mib)
		m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, AllowOther: true, MaxFileSize: mfs, Logger: quietLogger(t)})
		rep := runSpaceAttack(t, spaceAttackSpec{Dir: m.Path(), Op: "fallocate", Big: 32 * mib, Chunk: 256 * kib, Total: 32 * mib})
		held := allocatedUnder(t, namespaceDirs(src))
		t.Logf("as an ordinary user with MFS=1MiB: fallocate(KEEP_SIZE, 32 MiB): %v; then %d KiB allocated 256 KiB at a time, stopped by %v; the namespace holds %d KiB",
			syscall.Errno(rep.BigErrno), rep.Done/kib, syscall.Errno(rep.LastErrno), held/kib)
		if syscall.Errno(rep.BigErrno) != syscall.EFBIG {
			t.Errorf("fallocate(KEEP_SIZE) of 32 MiB with MFS=1MiB: %v, want EFBIG", syscall.Errno(rep.BigErrno))
		}
		if syscall.Errno(rep.LastErrno) != syscall.EFBIG || rep.Done > mfs {
			t.Errorf("fallocate(KEEP_SIZE) 256 KiB at a time with MFS=1MiB allocated %d KiB then %v; want at most 1 MiB, then EFBIG",
				rep.Done/kib, syscall.Errno(rep.LastErrno))
		}
		if held > mfs+256*kib {
			t.Errorf("one file of a namespace with MFS=1MiB holds %d KiB of the node's disk", held/kib)
		}
		checkAccounting(t, tr, src)
	})
}

// What directories and extended attributes take counts too: an ordinary user making
// directories, or files that hold nothing but a large attribute, fills the instance (ENOSPC)
// and no more of the node's disk.
func TestDirectoriesAndAttributesAreCharged(t *testing.T) {
	for _, op := range []string{"mkdir", "xattr"} {
		t.Run(op, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b testBackend) {
				src, mp := attackersNamespace(t)
				const capacity = 2 * mib
				tr := usage.New("instance 19", capacity)
				m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, AllowOther: true, Logger: quietLogger(t)})
				rep := runSpaceAttack(t, spaceAttackSpec{Dir: m.Path(), Op: op, Chunk: 3000, Count: 4000})
				held := allocatedUnder(t, namespaceDirs(src))
				t.Logf("as an ordinary user: %d made, then %v; the namespace holds %d KiB on disk, the tracker counts %d KiB",
					rep.Done, syscall.Errno(rep.LastErrno), held/kib, tr.Used()/kib)
				if held <= capacity/2 && rep.LastErrno == 0 {
					t.Skipf("%d of them take %d KiB on this file system: nothing to charge", rep.Done, held/kib)
				}
				if syscall.Errno(rep.LastErrno) != syscall.ENOSPC {
					t.Errorf("%d made in a %d MiB instance, then %v; want ENOSPC", rep.Done, capacity/mib, syscall.Errno(rep.LastErrno))
				}
				if slack := uint64(64 * kib); held > capacity+slack {
					t.Errorf("the namespace holds %d KiB of the node's disk; the instance's capacity is %d KiB", held/kib, capacity/kib)
				}
				checkAccounting(t, tr, src)
			})
		})
	}
}

// The honest job's side of charging allocated blocks: on XFS, blocks speculatively
// preallocated past the end of a file being extended count in st_blocks until it is closed.
// On a fragment file system mounted as the agent mounts it (usage.XFSFragmentOptions) a job
// still fills its instance to within a few blocks of its capacity, and the count drops back to
// the data once the file is closed. With XFS's default options the test only reports how far
// the same job got (the measurement behind the option).
func TestHonestJobFillsItsInstanceOnXFS(t *testing.T) {
	for _, c := range []struct{ name, options string }{{"fragment options", usage.XFSFragmentOptions}, {"default options", ""}} {
		t.Run(c.name, func(t *testing.T) {
			mnt := xfstest.MountWith(t, testBase, 512*mib, c.options)
			src := filepath.Join(mnt, "namespace")
			if err := os.Mkdir(src, 0o755); err != nil {
				t.Fatal(err)
			}
			const capacity = 256 * mib
			const want = capacity - 4*mib // what the job writes: 98% of its capacity
			tr := usage.New("instance 20", capacity)
			if err := tr.Scan(src); err != nil {
				t.Fatal(err)
			}
			m := mount(t, Spec{MountPath: filepath.Join(mnt, "mnt"), SourceDir: src, Tracker: tr, DisablePassthrough: true})
			f, err := os.Create(filepath.Join(m.Path(), "output"))
			if err != nil {
				t.Fatal(err)
			}
			buf := bytes.Repeat([]byte{7}, mib)
			var written uint64
			for written < want && err == nil {
				var n int
				n, err = f.Write(buf)
				written += uint64(n)
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			t.Logf("XFS mounted with %q: wrote %d MiB of %d MiB (%v); the tracker peaked at %d KiB, counts %d KiB after the close",
				c.options, written/mib, want/mib, err, tr.Peak()/kib, tr.Used()/kib)
			if c.options == "" {
				return // a measurement
			}
			if err != nil || written != want {
				t.Errorf("an honest job wrote %d MiB of %d MiB into a %d MiB instance: %v", written/mib, want/mib, capacity/mib, err)
			}
			waitFor(t, func() bool { return tr.Used() <= want+64*kib }, "the count to drop to the data once the file is closed")
			checkAccounting(t, tr, src)
		})
	}
}

// Counts do not drift: what directories, attributes, blocks past a file's end, long symbolic
// links and hard links were charged comes back exactly as they go (rmdir, removexattr, punching
// a hole, truncate, unlink of the last link, a rename over an empty directory), and the count
// equals what a rescan finds at every step.
func TestChargesComeBackExactly(t *testing.T) {
	eachBackend(t, func(t *testing.T, b testBackend) {
		src, mp := dirs(t)
		tr := usage.New("instance 21", 64*mib)
		m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: tr, Logger: quietLogger(t)})
		tree := filepath.Join(m.Path(), "tree")
		if err := os.Mkdir(tree, 0o755); err != nil {
			t.Fatal(err)
		}
		long := strings.Repeat("n", 200)
		value := bytes.Repeat([]byte("v"), 3000)
		for i := range 40 {
			d := filepath.Join(tree, fmt.Sprintf("%s%02d", long, i))
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
			f := filepath.Join(d, "f")
			if err := os.WriteFile(f, []byte("data"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := unix.Setxattr(f, "user.big", value, 0); err != nil {
				t.Fatal(err)
			}
		}
		checkAccounting(t, tr, src)
		for i := range 20 {
			if err := unix.Removexattr(filepath.Join(tree, fmt.Sprintf("%s%02d", long, i), "f"), "user.big"); err != nil {
				t.Fatal(err)
			}
		}
		checkAccounting(t, tr, src)

		p := filepath.Join(tree, "prealloc")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, 2*mib); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(make([]byte, 100*kib)); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(p, filepath.Join(tree, "second-link")); err != nil && !errors.Is(err, syscall.EPERM) { // striped: one name
			t.Fatal(err)
		}
		settled(t, b, f)
		checkAccounting(t, tr, src)
		if err := fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, mib, 512*kib); err != nil {
			t.Fatal(err)
		}
		settled(t, b, f)
		checkAccounting(t, tr, src)
		if err := f.Truncate(50 * kib); err != nil { // gives back the blocks past the new end
			t.Fatal(err)
		}
		settled(t, b, f)
		f.Close()
		checkAccounting(t, tr, src)

		if err := os.Symlink(strings.Repeat("t/", 1000), filepath.Join(tree, "long-link")); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(tree, "empty"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(tree, "other"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Rename(filepath.Join(tree, "other"), filepath.Join(tree, "empty")); err != nil { // os.Rename refuses an existing directory
			t.Fatal(err)
		}
		checkAccounting(t, tr, src)

		if err := os.RemoveAll(tree); err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool {
			want, _ := usage.Charged(namespaceDirs(src)...)
			return tr.Used() <= want
		}, "the count to come back once everything is removed")
		checkAccounting(t, tr, src)
		t.Logf("after removing everything the tracker counts %d bytes (the namespace roots' growth)", tr.Used())
	})
}
