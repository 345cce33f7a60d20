package mount

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/mounttable"
)

// fsType is the type our mounts carry in /proc/mounts ("fuse." + the subtype).
const (
	fsSubtype = "spillway"
	fsType    = mounttable.SpillwayFSType
)

type pathState int

const (
	pathAbsent       pathState = iota
	pathDirectory              // exists, a directory (possibly a live mount)
	pathNotDirectory           // exists, not a directory
	pathStale                  // a FUSE mount whose server is gone: "transport endpoint is not connected"
	pathHung                   // a mount whose server does not answer within the probe timeout
	pathForbidden              // exists, but we may not look (another user's FUSE mount without allow_other)
)

func (s pathState) String() string {
	return [...]string{"absent", "directory", "not a directory", "stale FUSE mount", "hung mount",
		"inaccessible"}[s]
}

// probe lstats path, giving up after timeout: a hung FUSE server must not hang the agent.
// The goroutine of a hung lstat finishes when the connection is aborted.
func probe(path string, timeout time.Duration) (pathState, error) {
	type result struct {
		st  unix.Stat_t // only Mode is filled
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		// FORCE_SYNC: the kernel may answer from attributes cached a moment ago; only a round
		// trip to the server tells whether it is alive.
		var x unix.Statx_t
		r.err = unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_FORCE_SYNC, unix.STATX_TYPE, &x)
		r.st.Mode = uint32(x.Mode)
		done <- r
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		switch {
		case r.err == nil && r.st.Mode&unix.S_IFMT == unix.S_IFDIR:
			return pathDirectory, nil
		case r.err == nil:
			return pathNotDirectory, nil
		case errors.Is(r.err, unix.ENOENT):
			return pathAbsent, nil
		case errors.Is(r.err, unix.ENOTCONN), errors.Is(r.err, unix.ECONNABORTED):
			return pathStale, nil
		case errors.Is(r.err, unix.EACCES), errors.Is(r.err, unix.EPERM):
			return pathForbidden, nil
		default:
			return pathAbsent, fmt.Errorf("cannot inspect mount path %s: %w", path, r.err)
		}
	case <-timer.C:
		return pathHung, nil
	}
}

// abortConnection makes every request of a FUSE connection fail at once (fusectl's abort),
// so that processes blocked on a dead or hung server wake up with an error. Root only.
func abortConnection(minor uint32) error {
	const fusectl = "/sys/fs/fuse/connections"
	abort := filepath.Join(fusectl, strconv.FormatUint(uint64(minor), 10), "abort")
	if _, err := os.Stat(abort); err != nil {
		// fusectl is not mounted on every distribution; mount it where systemd would.
		if merr := unix.Mount("fusectl", fusectl, "fusectl", 0, ""); merr != nil && !errors.Is(merr, unix.EBUSY) {
			return fmt.Errorf("cannot abort FUSE connection %d: %s is missing and mounting fusectl failed: %v",
				minor, abort, merr)
		}
	}
	if err := os.WriteFile(abort, []byte("1"), 0o200); err != nil {
		return fmt.Errorf("cannot abort FUSE connection %d: %w", minor, err)
	}
	return nil
}

// connectionOutlives reports whether FUSE connection minor, whose mount was just unmounted
// here, is still alive: its fusectl directory exists and no mount in this namespace uses it
// (such a mount would be a new one that got the number again). False when that cannot be
// told (no fusectl, and it cannot be mounted).
func connectionOutlives(minor uint32) bool {
	if minor == 0 || !connectionAlive(minor) {
		return false
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if e, ok := mounttable.ParseLine(line); ok && e.Major == 0 && e.Minor == minor {
			return false
		}
	}
	return true
}

// connectionAlive reports whether the kernel still has FUSE connection minor (its fusectl
// directory exists). False when that cannot be told (no fusectl, and it cannot be mounted).
func connectionAlive(minor uint32) bool {
	const fusectl = "/sys/fs/fuse/connections"
	const fusectlMagic = 0x65735543
	var fs unix.Statfs_t
	if err := unix.Statfs(fusectl, &fs); err != nil || fs.Type != fusectlMagic {
		if merr := unix.Mount("fusectl", fusectl, "fusectl", 0, ""); merr != nil && !errors.Is(merr, unix.EBUSY) {
			return false
		}
	}
	_, err := os.Stat(filepath.Join(fusectl, strconv.FormatUint(uint64(minor), 10)))
	return err == nil
}

// errNotMounted is what an unmount of a path that is not a mount point gives.
var errNotMounted = errors.New("not mounted")

// unmountOnce unmounts path once: nil, errNotMounted, unix.EBUSY or another error.
func unmountOnce(path string, detach bool) error {
	if os.Geteuid() == 0 {
		flags := 0
		if detach {
			flags = unix.MNT_DETACH
		}
		err := unix.Unmount(path, flags)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return errNotMounted
		case errors.Is(err, unix.EBUSY):
			return unix.EBUSY
		default:
			return fmt.Errorf("umount %s: %w", path, err)
		}
	}
	helper, err := lookPathWithFallback("fusermount3")
	if err != nil {
		return fmt.Errorf("cannot unmount %s: %v; install fuse3", path, err)
	}
	args := []string{"-u"}
	if detach {
		args = append(args, "-z")
	}
	var stderr bytes.Buffer
	cmd := exec.Command(helper, append(args, "--", path)...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		switch {
		case strings.Contains(msg, "busy"):
			return unix.EBUSY
		case strings.Contains(msg, "not found"), strings.Contains(msg, "not mounted"),
			strings.Contains(msg, "Invalid argument"):
			return errNotMounted
		default:
			return fmt.Errorf("%s -u %s: %v: %s", helper, path, err, msg)
		}
	}
	return nil
}

// holder is a process keeping a mount busy.
type holder struct {
	pid  int
	comm string
	path string // an open file or working directory under the mount
}

func (h holder) String() string { return fmt.Sprintf("%d (%s) %s", h.pid, h.comm, h.path) }

// maxHolders bounds how many busy processes an error message lists.
const maxHolders = 10

// holdersOf lists processes with an open file or working directory under mountPath (read
// from /proc, which does not call into the mount), at most maxHolders, lowest pid first.
func holdersOf(mountPath string) []holder {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	under := func(p string) bool { return p == mountPath || strings.HasPrefix(p, mountPath+"/") }
	var found []holder
	for _, pid := range pids {
		if len(found) >= maxHolders {
			break
		}
		dir := filepath.Join("/proc", strconv.Itoa(pid))
		hit := ""
		if cwd, err := os.Readlink(filepath.Join(dir, "cwd")); err == nil && under(cwd) {
			hit = cwd
		}
		if hit == "" {
			fds, _ := os.ReadDir(filepath.Join(dir, "fd"))
			for _, fd := range fds {
				if target, err := os.Readlink(filepath.Join(dir, "fd", fd.Name())); err == nil && under(target) {
					hit = target
					break
				}
			}
		}
		if hit != "" {
			comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
			found = append(found, holder{pid: pid, comm: strings.TrimSpace(string(comm)), path: hit})
		}
	}
	return found
}
