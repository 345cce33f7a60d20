package pfsio

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/swaprace"
	"github.com/spillway-hpc/spillway/internal/traceattack"
)

// The PFS's permissions hold exactly: the worker has the user's uid, gid and supplementary
// groups and nothing more.
func TestPermissionsHoldAsTheUser(t *testing.T) {
	needRoot(t)
	a := newArea(t)
	p := func(name string) string { return filepath.Join(a.pfs, name) }
	must(t, os.WriteFile(p("root-only"), []byte("secret"), 0o600))
	must(t, os.Mkdir(p("read-only"), 0o555))
	must(t, os.WriteFile(p("read-only/f"), []byte("x"), 0o644))
	must(t, os.Mkdir(p("group-dir"), 0o070))
	must(t, os.Chown(p("group-dir"), 0, userGroup))
	must(t, os.Chmod(p("group-dir"), 0o070)) // past the test's umask
	must(t, os.WriteFile(p("group-file"), []byte("for the group"), 0o060))
	must(t, os.Chown(p("group-file"), 0, userGroup))
	must(t, os.Chmod(p("group-file"), 0o060))
	must(t, os.WriteFile(p("stranger-file"), []byte("for another group"), 0o060))
	must(t, os.Chown(p("stranger-file"), 0, strangerGID))
	must(t, os.Chmod(p("stranger-file"), 0o060))
	must(t, os.Mkdir(p("closed"), 0o700))
	must(t, os.WriteFile(p("closed/f"), []byte("x"), 0o666))
	must(t, os.Chmod(p("closed/f"), 0o666))
	d := startDoor(t, a.pfs, Options{})

	if _, err := d.OpenFile("root-only", os.O_RDONLY, 0); !errnoIs(err, unix.EACCES) {
		t.Errorf("open of root's 0600 file: %v", err)
	}
	if _, err := d.Lstat("root-only"); err != nil {
		t.Errorf("lstat of root's file in a directory the user may read: %v", err)
	}
	if _, err := d.OpenFile("read-only/new", os.O_WRONLY|os.O_CREATE, 0o644); !errnoIs(err, unix.EACCES) {
		t.Errorf("create in a read-only directory: %v", err)
	}
	for name, err := range map[string]error{
		"mkdir":    d.Mkdir("read-only/d", 0o755),
		"unlink":   d.Unlink("read-only/f"),
		"rename":   d.Rename("read-only/f", "stolen", 0),
		"symlink":  d.Symlink("x", "read-only/l"),
		"chmod":    d.Chmod("read-only/f", 0o666),
		"chown":    d.Chown("read-only/f", userUID, userGID),
		"utimens":  d.Utimens("read-only/f", unix.Timespec{Sec: 1}, unix.Timespec{Sec: 1}),
		"setxattr": d.Setxattr("read-only/f", "user.k", []byte("v"), 0),
	} {
		if !errnoIs(err, unix.EACCES) && !errnoIs(err, unix.EPERM) {
			t.Errorf("%s in root's read-only directory: %v, want EACCES or EPERM", name, err)
		}
	}
	if _, err := d.Lstat("closed/f"); !errnoIs(err, unix.EACCES) {
		t.Errorf("lstat beneath a directory the user cannot enter: %v", err)
	}
	if _, err := d.OpenFile("closed/f", os.O_RDWR, 0); !errnoIs(err, unix.EACCES) {
		t.Errorf("open beneath a directory the user cannot enter: %v", err)
	}
	if err := d.ReadDir("closed", func([]Entry) error { return nil }); !errnoIs(err, unix.EACCES) {
		t.Errorf("readdir of a directory the user cannot read: %v", err)
	}

	// Group access through a supplementary group.
	f, err := d.OpenFile("group-file", os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open of a file of the user's supplementary group: %v", err)
	}
	buf := make([]byte, 32)
	if n, _ := f.ReadAt(buf, 0); string(buf[:n]) != "for the group" {
		t.Errorf("read %q", buf[:n])
	}
	f.Close()
	if _, err := d.OpenFile("stranger-file", os.O_RDONLY, 0); !errnoIs(err, unix.EACCES) {
		t.Errorf("open of another group's file: %v", err)
	}
	g, err := d.OpenFile("group-dir/new", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		t.Fatalf("create in a directory of the user's supplementary group: %v", err)
	}
	if n, err := g.WriteAt([]byte("mine"), 0); n != 4 || err != nil {
		t.Errorf("write: %d %v", n, err)
	}
	g.Close()
	must(t, d.Mkdir("group-dir/sub", 0o755))

	// What the user makes is theirs.
	for _, name := range []string{"group-dir/new", "group-dir/sub"} {
		var st unix.Stat_t
		must(t, unix.Lstat(p(name), &st))
		if st.Uid != userUID || st.Gid != userGID {
			t.Errorf("%s belongs to %d:%d, want the user's %d:%d", name, st.Uid, st.Gid, userUID, userGID)
		}
	}
	// Ownership: only to a group the user is in, never to another user.
	must(t, d.Chown("group-dir/new", -1, userGroup))
	if err := d.Chown("group-dir/new", -1, strangerGID); !errnoIs(err, unix.EPERM) {
		t.Errorf("chown to a group the user is not in: %v", err)
	}
	if err := d.Chown("group-dir/new", 0, -1); !errnoIs(err, unix.EPERM) {
		t.Errorf("chown to root: %v", err)
	}
	if err := d.Chmod("root-only", 0o644); !errnoIs(err, unix.EPERM) {
		t.Errorf("chmod of root's file: %v", err)
	}
}

// A PFS root the user cannot enter is refused when the door opens; one that does not exist
// too, each with its errno.
func TestARootTheUserCannotEnterIsRefused(t *testing.T) {
	needRoot(t)
	a := newArea(t)
	closed := filepath.Join(a.base, "closed")
	must(t, os.Mkdir(closed, 0o700))
	if _, err := Start(workerExe, closed, user(), Options{}); !errnoIs(err, unix.EACCES) {
		t.Errorf("a root the user cannot enter: %v", err)
	}
	if _, err := Start(workerExe, filepath.Join(a.base, "missing"), user(), Options{}); !errnoIs(err, unix.ENOENT) {
		t.Errorf("a root that does not exist: %v", err)
	}
	if _, err := Start(workerExe, "relative/path", user(), Options{}); !errnoIs(err, unix.EINVAL) {
		t.Errorf("a relative root: %v", err)
	}
}

// A worker that would keep a capability (here: asked to stay root) refuses to serve.
func TestWorkerRefusesCapabilities(t *testing.T) {
	needRoot(t)
	a := newArea(t)
	_, err := Start(workerExe, a.pfs, nil, Options{})
	if err == nil || !strings.Contains(err.Error(), "refusing to run holding capabilities") {
		t.Errorf("a worker left as root: %v", err)
	}
}

// No operation follows a symbolic link of the user's, whether it is the last component or in
// the middle of the path: a link to a directory outside the root that the user could write
// to themselves, and one to /etc/shadow.
func TestSymlinksAreNeverFollowed(t *testing.T) {
	eachDoor(t, Options{}, func(t *testing.T, d *Door, a area) {
		userSymlink(t, a.outside, filepath.Join(a.pfs, "out"))
		userSymlink(t, a.canary, filepath.Join(a.pfs, "canary"))
		userSymlink(t, "/etc/shadow", filepath.Join(a.pfs, "shadow"))
		userDir(t, filepath.Join(a.pfs, "in"), 0o755)

		st, err := d.Lstat("canary")
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			t.Errorf("lstat of a link: %o %v, want the link itself", st.Mode, err)
		}
		if target, err := d.Readlink("shadow"); err != nil || target != "/etc/shadow" {
			t.Errorf("readlink: %q %v", target, err)
		}
		for _, name := range []string{"canary", "shadow"} {
			for _, flags := range []int{os.O_RDONLY, os.O_RDWR, os.O_WRONLY | os.O_CREATE, os.O_WRONLY | os.O_TRUNC} {
				if _, err := d.OpenFile(name, flags, 0o644); !errnoIs(err, unix.ELOOP) {
					t.Errorf("open %s flags %#x: %v, want ELOOP", name, flags, err)
				}
			}
			if _, err := d.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); !errnoIs(err, unix.EEXIST) {
				t.Errorf("exclusive create on the link %s: %v, want EEXIST", name, err)
			}
			if err := d.Chmod(name, 0o666); !errnoIs(err, unix.EOPNOTSUPP) {
				t.Errorf("chmod %s: %v, want EOPNOTSUPP", name, err)
			}
			if err := d.Setxattr(name, "user.k", []byte("v"), 0); !errnoIs(err, unix.EPERM) {
				t.Errorf("setxattr %s: %v, want EPERM (user attributes on a link)", name, err)
			}
			if _, err := d.Getxattr(name, "user.k"); !errnoIs(err, unix.ENODATA) {
				t.Errorf("getxattr %s: %v, want ENODATA (the link's own)", name, err)
			}
			// These act on the link itself, as lchown and lutimes do.
			must(t, d.Chown(name, userUID, userGID))
			must(t, d.Utimens(name, unix.Timespec{Sec: 5}, unix.Timespec{Sec: 5}))
		}
		if err := d.ReadDir("out", func([]Entry) error { return nil }); !errnoIs(err, unix.ELOOP) {
			t.Errorf("readdir of a link to a directory: %v, want ELOOP", err)
		}
		// A link in the middle of a path: ELOOP, for every operation.
		mid := "out/" + swaprace.TargetName
		checks := map[string]error{}
		_, checks["lstat"] = d.Lstat(mid)
		_, checks["readlink"] = d.Readlink(mid)
		_, checks["open"] = d.OpenFile(mid, os.O_RDWR, 0)
		_, checks["create"] = d.OpenFile("out/planted", os.O_WRONLY|os.O_CREATE, 0o644)
		checks["mkdir"] = d.Mkdir("out/d", 0o755)
		checks["rmdir"] = d.Rmdir("out/d")
		checks["unlink"] = d.Unlink(mid)
		checks["rename from"] = d.Rename(mid, "in/stolen", 0)
		checks["rename to"] = d.Rename("in", "out/in", 0)
		checks["exchange"] = d.Rename("in", mid, unix.RENAME_EXCHANGE)
		checks["link from"] = d.Link(mid, "in/stolen")
		checks["link to"] = d.Link("canary", "out/l")
		checks["symlink"] = d.Symlink("x", "out/l")
		checks["chmod"] = d.Chmod(mid, 0o666)
		checks["chown"] = d.Chown(mid, userUID, userGID)
		checks["utimens"] = d.Utimens(mid, unix.Timespec{Sec: 1}, unix.Timespec{Sec: 1})
		checks["setxattr"] = d.Setxattr(mid, "user.k", []byte("v"), 0)
		checks["removexattr"] = d.Removexattr(mid, "user.k")
		_, checks["getxattr"] = d.Getxattr(mid, "user.k")
		_, checks["listxattr"] = d.Listxattr(mid)
		checks["readdir"] = d.ReadDir("out/", func([]Entry) error { return nil })
		for name, err := range checks {
			if name == "readdir" {
				continue // "out/" is "out", the link itself: checked above
			}
			if !errnoIs(err, unix.ELOOP) {
				t.Errorf("%s through a link in the path: %v, want ELOOP", name, err)
			}
		}
		// Renaming and linking a link moves and links the link, never its target.
		must(t, d.Link("canary", "in/hard"))
		must(t, d.Rename("in/hard", "in/renamed", 0))
		if st, err := d.Lstat("in/renamed"); err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
			t.Errorf("a hard link of a link: %o %v, want a link", st.Mode, err)
		}
		must(t, d.Unlink("in/renamed"))
		must(t, d.Unlink("canary"))
		a.untouched(t)
	})
}

// The attack of the symlink-swap tests (internal/swaprace), by the user against the door: in
// a directory of their own on the PFS they exchange a directory "d" with a link "l" to a
// directory outside the root (their own: permissions do not protect it, only the door's
// rules) in a loop, while the door opens, creates, writes, truncates, changes and lists
// beneath "d" as fast as it can. Nothing outside the root is ever touched.
func TestSymlinkSwapCannotLeaveTheRoot(t *testing.T) {
	eachDoor(t, Options{}, func(t *testing.T, d *Door, a area) {
		work := filepath.Join(a.pfs, "attack")
		decoy := filepath.Join(a.pfs, "decoy") // the attacker's own loops act here, harmlessly
		userDir(t, work, 0o755)
		userDir(t, decoy, 0o755)
		userDir(t, filepath.Join(decoy, swaprace.DirName), 0o755)
		userFile(t, filepath.Join(decoy, swaprace.DirName, swaprace.TargetName), "decoy\n", 0o644)
		const attack = 3 * time.Second
		spec, _ := json.Marshal(swaprace.Spec{Work: work, Through: decoy, Victim: a.outside, Duration: attack})
		attacker := exec.Command(workerExe[0], "swap-attacker")
		attacker.Env = []string{"SWAPRACE_SPEC=" + string(spec)}
		attacker.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: userUID, Gid: userGID, Groups: []uint32{}}}
		attacker.Dir = "/"
		var out bytes.Buffer
		attacker.Stdout, attacker.Stderr = &out, &out
		must(t, attacker.Start())

		var stop atomic.Bool
		var wg sync.WaitGroup
		var done, refused atomic.Int64
		target := swaprace.DirName + "/" + swaprace.TargetName
		plant := swaprace.DirName + "/" + swaprace.PlantName
		victimOps := []func() error{
			func() error {
				f, err := d.OpenFile("attack/"+target, os.O_RDWR, 0)
				if err != nil {
					return err
				}
				defer f.Close()
				if _, err := f.WriteAt([]byte("overwritten by the door\n"), 0); err != nil {
					return err
				}
				return f.Truncate(3)
			},
			func() error {
				f, err := d.OpenFile("attack/"+plant, os.O_WRONLY|os.O_CREATE, 0o644)
				if err != nil {
					return err
				}
				f.Close()
				return d.Unlink("attack/" + plant)
			},
			func() error { _, err := d.Lstat("attack/" + target); return err },
			func() error { return d.Chmod("attack/"+target, 0o666) },
			func() error { return d.Chown("attack/"+target, userUID, userGroup) },
			func() error { return d.Utimens("attack/"+target, unix.Timespec{Sec: 7}, unix.Timespec{Sec: 7}) },
			func() error { return d.Setxattr("attack/"+target, "user.door", []byte("x"), 0) },
			func() error {
				if err := d.Mkdir("attack/"+swaprace.DirName+"/newdir", 0o755); err != nil {
					return err
				}
				return d.Rmdir("attack/" + swaprace.DirName + "/newdir")
			},
			func() error {
				return d.ReadDir("attack/"+swaprace.DirName, func([]Entry) error { return nil })
			},
		}
		for _, op := range victimOps {
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						if op() == nil {
							done.Add(1)
						} else {
							refused.Add(1)
						}
					}
				}()
			}
		}
		err := attacker.Wait()
		stop.Store(true)
		wg.Wait()
		if err != nil {
			t.Fatalf("the attacker: %v\n%s", err, out.String())
		}
		var rep swaprace.Report
		if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &rep); err != nil {
			t.Fatalf("the attacker's report %q: %v", out.String(), err)
		}
		t.Logf("attacker: %s; the door: %d operations done, %d refused", rep, done.Load(), refused.Load())
		if rep.Exchanges == 0 || done.Load() == 0 {
			t.Errorf("the race never ran (%d exchanges, %d operations done): this test proves nothing", rep.Exchanges, done.Load())
		}
		a.untouched(t)
	})
}

// The job's user, watching for their door workers and seizing each the moment it may, never
// traces one (the start is package asuser's, shared with the stage worker).
func TestUserCannotTraceAStartingDoor(t *testing.T) {
	needRoot(t)
	a := newArea(t)
	attacker := exec.Command(workerExe[0], "trace-attacker")
	attacker.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: userUID, Gid: userGID, Groups: []uint32{}}}
	attacker.Dir = "/"
	stdin, err := attacker.StdinPipe()
	must(t, err)
	var out bytes.Buffer
	attacker.Stdout, attacker.Stderr = &out, &out
	must(t, attacker.Start())
	defer attacker.Process.Kill()
	time.Sleep(100 * time.Millisecond) // let it start watching

	const starts = 12
	for range starts {
		d, err := Start(workerExe, a.pfs, user(), Options{})
		if err != nil {
			t.Errorf("a door under attack: %v", err)
			continue
		}
		if _, err := d.Lstat(""); err != nil {
			t.Errorf("lstat through a door under attack: %v", err)
		}
		d.Close()
	}
	stdin.Close()
	waited := make(chan error, 1)
	go func() { waited <- attacker.Wait() }()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("the attacker: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the attacker did not stop:\n%s", out.String())
	}
	seen, won := traceattack.Result(out.String())
	if won != 0 {
		t.Errorf("the user seized %d of %d door workers:\n%s", won, starts, out.String())
	}
	if seen == 0 {
		t.Errorf("the attacker never saw a door worker, so this test proves nothing:\n%s", out.String())
	}
	t.Logf("the attacker watched %d door workers and seized %d", seen, won)
}

// A worker outlives no agent: killed with SIGKILL, the agent's end of the socket closes and
// the worker exits.
func TestWorkerDiesWithItsAgent(t *testing.T) {
	needRoot(t)
	a := newArea(t)
	agent := exec.Command(workerExe[0], "pfsio-agent", a.pfs)
	stdin, err := agent.StdinPipe()
	must(t, err)
	defer stdin.Close()
	stdout, err := agent.StdoutPipe()
	must(t, err)
	must(t, agent.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("the agent said nothing: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("the agent said %q", line)
	}
	if gone(pid, 0) {
		t.Fatalf("the worker (pid %d) is not running", pid)
	}
	agent.Process.Kill()
	agent.Wait()
	if !gone(pid, 5) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("the worker (pid %d) still runs 5 s after its agent was killed", pid)
	}
}

// A worker that dies (killed, crashed) ends its door: Gone says so, and requests end with
// ENOTCONN at once rather than at their timeout.
func TestAWorkerThatDiesEndsItsDoor(t *testing.T) {
	needRoot(t)
	a := newArea(t)
	d := startDoor(t, a.pfs, Options{RequestTimeout: time.Minute})
	gone := d.Gone()
	must(t, syscall.Kill(d.Pid(), syscall.SIGKILL))
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("Gone is still open 5 s after the worker was killed")
	}
	start := time.Now()
	if _, err := d.Lstat(""); !errnoIs(err, ErrClosed) || time.Since(start) > time.Second {
		t.Errorf("a request to a door whose worker died: %v after %v, want ENOTCONN at once", err, time.Since(start))
	}
}

// A hung PFS (here: the worker stopped, so that nothing is answered, as when every request
// waits on a server that does not answer) gives ETIMEDOUT after the request timeout, never a
// hang; the requests that timed out keep their slots (at most MaxInFlight wait in the
// worker), later ones wait for a slot within their own timeout; once the PFS answers, the
// slots come back and the door works again.
func TestHungPFSTimesOut(t *testing.T) {
	needRoot(t)
	a := newArea(t)
	userFile(t, filepath.Join(a.pfs, "f"), "x", 0o644)
	const timeout = 300 * time.Millisecond
	d := startDoor(t, a.pfs, Options{MaxInFlight: 2, RequestTimeout: timeout})
	if _, err := d.Lstat("f"); err != nil {
		t.Fatal(err)
	}
	must(t, syscall.Kill(d.Pid(), syscall.SIGSTOP))
	stopped := true
	defer func() {
		if stopped {
			syscall.Kill(d.Pid(), syscall.SIGCONT)
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, 5)
	took := make([]time.Duration, 5)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			if i == 0 {
				_, errs[i] = d.OpenFile("f", os.O_RDONLY, 0) // its late reply must be closed
			} else {
				_, errs[i] = d.Lstat("f")
			}
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errnoIs(err, unix.ETIMEDOUT) || took[i] < timeout || took[i] > timeout+2*time.Second {
			t.Errorf("request %d to a hung PFS: %v after %v, want ETIMEDOUT after %v", i, err, took[i], timeout)
		}
	}
	if n := len(d.slots); n != 2 {
		t.Errorf("%d requests hold a slot while the PFS hangs, want MaxInFlight = 2", n)
	}
	must(t, syscall.Kill(d.Pid(), syscall.SIGCONT))
	stopped = false
	deadline := time.Now().Add(5 * time.Second)
	for len(d.slots) != 0 && time.Now().Before(deadline) {
		sleep(10)
	}
	if n := len(d.slots); n != 0 {
		t.Errorf("%d slots still held once the PFS answered", n)
	}
	if _, err := d.Lstat("f"); err != nil {
		t.Errorf("after the PFS came back: %v", err)
	}
	// The open that timed out was closed in the worker: nothing of f stays open there.
	deadline = time.Now().Add(5 * time.Second)
	for openIn(d.Pid(), filepath.Join(a.pfs, "f")) && time.Now().Before(deadline) {
		sleep(10)
	}
	if openIn(d.Pid(), filepath.Join(a.pfs, "f")) {
		t.Error("the file of an open that timed out is still open in the worker")
	}
}

// openIn says whether process pid has path open.
func openIn(pid int, path string) bool {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if target, _ := os.Readlink(filepath.Join(dir, e.Name())); target == path {
			return true
		}
	}
	return false
}

// Writes are the user's process's, not root's through the descriptor it was given: a write
// or truncate clears the set-user-id bit of the user's file, as the kernel does for every
// writer without CAP_FSETID (root writing would keep it; it would also pass the user's quotas
// and the file system's reserved blocks with CAP_SYS_RESOURCE).
func TestWritesAreTheUsers(t *testing.T) {
	needRoot(t)
	a := newArea(t)
	d := startDoor(t, a.pfs, Options{})
	for _, write := range []string{"pwrite", "ftruncate"} {
		name := "setuid-" + write
		userFile(t, filepath.Join(a.pfs, name), "#!/bin/sh\n", 0o4755)
		f, err := d.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if write == "pwrite" {
			_, err = f.WriteAt([]byte("#"), 0)
		} else {
			err = f.Truncate(3)
		}
		if err != nil {
			t.Fatalf("%s: %v", write, err)
		}
		f.Close()
		if st, _ := d.Lstat(name); st.Mode&unix.S_ISUID != 0 {
			t.Errorf("after a %s through the door the file is still set-user-id (%o): the write was not the user's", write, st.Mode)
		}
	}
}
