package stage

// How a worker becomes the job's user without ever being traceable by them. A process the
// user can ptrace is theirs entirely (its memory, its descriptors, its code), and a worker
// started with the user's credentials is traceable from its execve until it makes itself
// non-dumpable, after the Go runtime has started: long enough for a user watching for it to
// PTRACE_SEIZE it, rewrite its prctl and later read the instance's directories from
// /proc/<pid>/fd. So a root agent starts its workers as root (a process the user cannot
// trace), each worker makes itself non-dumpable first, and only then takes the user's
// groups, gid and uid. Changing credentials never makes a process dumpable again unless
// fs.suid_dumpable is 1 (the kernel then sets the mm's dumpability to that value), which the
// worker refuses. Nothing afterwards can undo it: the worker never execs and never calls
// prctl(PR_SET_DUMPABLE, 1). The agent checks all of this again before it hands over the
// directories (handoff.go).

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/privdrop"
)

// identityFlag carries the worker's identity on its command line: --as=UID:GID:G1,G2,...
const identityFlag = "--as="

// identityArg is the argument that tells a worker started as root whom to become.
func identityArg(c *syscall.Credential) string {
	groups := make([]string, len(c.Groups))
	for i, g := range c.Groups {
		groups[i] = strconv.FormatUint(uint64(g), 10)
	}
	return fmt.Sprintf("%s%d:%d:%s", identityFlag, c.Uid, c.Gid, strings.Join(groups, ","))
}

// parseIdentity reads identityArg's form back; ok is false when arg is not one.
func parseIdentity(arg string) (c *syscall.Credential, ok bool, err error) {
	rest, found := strings.CutPrefix(arg, identityFlag)
	if !found {
		return nil, false, nil
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 3 {
		return nil, true, fmt.Errorf("malformed %s%s: want UID:GID:GROUPS", identityFlag, rest)
	}
	uid, err1 := strconv.ParseUint(parts[0], 10, 32)
	gid, err2 := strconv.ParseUint(parts[1], 10, 32)
	if err1 != nil || err2 != nil {
		return nil, true, fmt.Errorf("malformed %s%s: the uid and gid must be numbers", identityFlag, rest)
	}
	c = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	if parts[2] != "" {
		for _, g := range strings.Split(parts[2], ",") {
			n, err := strconv.ParseUint(g, 10, 32)
			if err != nil {
				return nil, true, fmt.Errorf("malformed %s%s: group %q is not a number", identityFlag, rest, g)
			}
			c.Groups = append(c.Groups, uint32(n))
		}
	}
	return c, true, nil
}

// suidDumpablePath is where the kernel says what a credential change does to dumpability.
const suidDumpablePath = "/proc/sys/fs/suid_dumpable"

// becomeStageUser makes the worker non-dumpable and, when args name an identity (the agent
// started it as root), takes that identity for every thread. It returns the arguments left.
func becomeStageUser(args []string) ([]string, error) {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return args, fmt.Errorf("cannot make the staging worker non-dumpable: %v", err)
	}
	var want *syscall.Credential
	var rest []string
	for _, a := range args {
		c, ok, err := parseIdentity(a)
		if err != nil {
			return args, err
		}
		if ok {
			want = c
			continue
		}
		rest = append(rest, a)
	}
	if want == nil {
		return rest, nil
	}
	if os.Geteuid() != 0 {
		return rest, fmt.Errorf("the staging worker was asked to become uid %d but runs as uid %d, not root", want.Uid, os.Geteuid())
	}
	if want.Uid != 0 {
		// With fs.suid_dumpable = 1 the kernel makes a process dumpable again as its
		// credentials change: the user could trace the worker from that moment on.
		if b, err := os.ReadFile(suidDumpablePath); err != nil {
			return rest, fmt.Errorf("cannot read %s: %v", suidDumpablePath, err)
		} else if strings.TrimSpace(string(b)) == "1" {
			return rest, errors.New("fs.suid_dumpable is 1 on this node, which would let the job's user trace the staging worker " +
				"once it takes their identity; staging is refused until it is 0 (the default) or 2: sysctl -w fs.suid_dumpable=0")
		}
	}
	if err := privdrop.Become(privdrop.Identity{UID: want.Uid, GID: want.Gid, Groups: want.Groups}); err != nil {
		return rest, fmt.Errorf("the staging worker %v", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return rest, fmt.Errorf("cannot keep the staging worker non-dumpable: %v", err)
	}
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		return rest, fmt.Errorf("the staging worker is still dumpable (%d, %v)", d, err)
	}
	return rest, nil
}

// checkSealed is the agent's check, before it hands the directories to the worker pid, that
// the user cannot reach into that process: every thread runs as uid (all four uids) and has
// no tracer (both are per thread), and the process is not dumpable (a dumpable process's
// /proc entries belong to its uid; those of a non-dumpable one to root).
func checkSealed(pid int, uid uint32) error {
	dir := "/proc/" + strconv.Itoa(pid)
	tasks, err := os.ReadDir(dir + "/task")
	if err != nil || len(tasks) == 0 {
		return fmt.Errorf("cannot check the staging worker (pid %d): %v", pid, err)
	}
	want := strconv.FormatUint(uint64(uid), 10)
	for _, task := range tasks {
		status, err := os.ReadFile(dir + "/task/" + task.Name() + "/status")
		if err != nil {
			return fmt.Errorf("cannot check the staging worker (pid %d, thread %s): %v", pid, task.Name(), err)
		}
		if uids := strings.Fields(privdrop.StatusField(string(status), "Uid")); len(uids) != 4 || uids[0] != want || uids[1] != want || uids[2] != want || uids[3] != want {
			return fmt.Errorf("the staging worker (pid %d, thread %s) runs as uids %v, not uid %d", pid, task.Name(), uids, uid)
		}
		if tracer := privdrop.StatusField(string(status), "TracerPid"); tracer != "0" {
			return fmt.Errorf("the staging worker (pid %d, thread %s) is traced by pid %s; its directories are not handed over", pid, task.Name(), tracer)
		}
	}
	if uid != 0 {
		var st unix.Stat_t
		if err := unix.Stat(dir+"/status", &st); err != nil {
			return fmt.Errorf("cannot check the staging worker (pid %d): %v", pid, err)
		}
		if st.Uid == uid {
			return fmt.Errorf("the staging worker (pid %d) is dumpable: the job's user could read its memory and descriptors; its directories are not handed over", pid)
		}
	}
	return nil
}
