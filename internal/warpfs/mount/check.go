package mount

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// fuseEnv is what decides whether this process can mount FUSE. Tests point it at other files.
type fuseEnv struct {
	device   string // the FUSE device, /dev/fuse
	uid      int    // effective uid of the agent
	gids     []int  // its effective and supplementary groups
	fuseConf string // /etc/fuse.conf
	lookPath func(file string) (string, error)
}

func currentFUSEEnv() fuseEnv {
	gids, _ := os.Getgroups()
	return fuseEnv{
		device:   "/dev/fuse",
		uid:      os.Geteuid(),
		gids:     append(gids, os.Getegid()),
		fuseConf: "/etc/fuse.conf",
		lookPath: lookPathWithFallback,
	}
}

// lookPathWithFallback finds a helper in PATH, or in /usr/bin and /bin when PATH is empty (as
// it can be for daemons started by systemd units with a bare environment).
func lookPathWithFallback(file string) (string, error) {
	if p, err := exec.LookPath(file); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/bin", "/bin"} {
		if p, err := exec.LookPath(filepath.Join(dir, file)); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in PATH, /usr/bin or /bin", file)
}

// check reports, with the fix, why this process cannot mount FUSE; nil if it can.
func (e fuseEnv) check(allowOther bool) error {
	info, err := os.Stat(e.device)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("FUSE is not available: %s does not exist; load the fuse kernel module "+
			"(modprobe fuse) and install fuse3", e.device)
	}
	if err != nil {
		return fmt.Errorf("FUSE is not available: %w", err)
	}
	if info.Mode()&fs.ModeCharDevice == 0 {
		return fmt.Errorf("FUSE is not available: %s is not a character device (mode %v); "+
			"recreate it with `mknod -m 0666 /dev/fuse c 10 229` or reboot", e.device, info.Mode())
	}
	if e.uid == 0 {
		return nil // root mounts with mount(2) and needs no helper
	}
	st := info.Sys().(*syscall.Stat_t)
	perm := uint32(info.Mode().Perm())
	var rw uint32
	switch {
	case int(st.Uid) == e.uid:
		rw = (perm >> 6) & 6
	case slices.Contains(e.gids, int(st.Gid)):
		rw = (perm >> 3) & 6
	default:
		rw = perm & 6
	}
	if rw != 6 {
		return fmt.Errorf("FUSE is not available to uid %d: %s is mode %04o (owner %d:%d); "+
			"install fuse3 and make %s mode 0666 (Debian's udev rule does), or run the agent as root",
			e.uid, e.device, perm, st.Uid, st.Gid, e.device)
	}
	helper, err := e.lookPath("fusermount3")
	if err != nil {
		return fmt.Errorf("FUSE is not available to uid %d: no fusermount3 (%v); install fuse3, "+
			"which provides the setuid helper that mounts FUSE for non-root users, or run the agent as root",
			e.uid, err)
	}
	if hi, err := os.Stat(helper); err == nil {
		hst := hi.Sys().(*syscall.Stat_t)
		if hi.Mode()&fs.ModeSetuid == 0 || hst.Uid != 0 {
			return fmt.Errorf("FUSE is not available to uid %d: %s is not setuid root (mode %v, owner %d); "+
				"reinstall fuse3 or run `chown root %s && chmod u+s %s`, or run the agent as root",
				e.uid, helper, hi.Mode(), hst.Uid, helper, helper)
		}
	}
	if allowOther && !e.userAllowOther() {
		return fmt.Errorf("allow_other is refused to uid %d: %s lacks the line user_allow_other; "+
			"add it (so that the job's user can reach a mount made by the agent's user), "+
			"or run the agent as root", e.uid, e.fuseConf)
	}
	return nil
}

// userAllowOther reports whether fuse.conf lets non-root users mount with allow_other.
func (e fuseEnv) userAllowOther() bool {
	f, err := os.Open(e.fuseConf)
	if err != nil {
		return false
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		if strings.TrimSpace(scanner.Text()) == "user_allow_other" {
			return true
		}
	}
	return false
}
