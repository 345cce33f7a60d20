// Package asuser starts and checks the processes a root agent runs as a user: the stage worker
// (internal/stage) and the PFS door's worker (internal/pfsio). Both hold something the user
// must never reach into (an instance's directories, a PFS root the cache serves from), and
// both move data with the user's rights only. One implementation of the three steps keeps
// them alike:
//
//   - Command: the agent starts the worker as root (a process the user cannot trace or
//     inspect), with an empty environment, no inherited descriptor but the handoff socket (fd
//     3), and the identity to take on its command line (Arg).
//   - Become: the worker's first act. It makes itself non-dumpable, then takes the user's
//     groups, gid and uid for every thread (privdrop), checks it holds exactly them and no
//     capability, and stays non-dumpable (a credential change keeps a process non-dumpable
//     unless fs.suid_dumpable is 1, which it refuses). It never execs and never makes itself
//     dumpable, so the user can never trace it or open its /proc/<pid>/fd, mem or environ.
//   - Dial and Accept: once sealed, the worker makes a fresh socket pair and sends one end to
//     the agent over fd 3; the agent takes it only if SO_PEERCRED says the worker's own pid
//     made it and CheckSealed finds every thread the user's, untraced and not dumpable. Only
//     then does anything of value cross (descriptors, requests). A user who somehow held fd 3
//     could send the agent a socket of their own, which is refused.
//
// An agent that runs as an ordinary user (a one-machine home) starts its workers as itself:
// no Arg, and the user is the agent's own.
package asuser

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/privdrop"
)

// Env is the whole environment of a worker: nothing of the agent's (tokens, keys, proxies)
// reaches a process that runs as a user.
var Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}

// HandoffFd is the worker's inherited end of the agent's socket (Command's handoff).
const HandoffFd = 3

// identityFlag carries the worker's identity on its command line: --as=UID:GID:G1,G2,...
const identityFlag = "--as="

// Arg is the argument that tells a worker started as root whom to become.
func Arg(id privdrop.Identity) string {
	groups := make([]string, len(id.Groups))
	for i, g := range id.Groups {
		groups[i] = strconv.FormatUint(uint64(g), 10)
	}
	return fmt.Sprintf("%s%d:%d:%s", identityFlag, id.UID, id.GID, strings.Join(groups, ","))
}

// ParseArg reads Arg's form back; ok is false when arg is not one.
func ParseArg(arg string) (id privdrop.Identity, ok bool, err error) {
	rest, found := strings.CutPrefix(arg, identityFlag)
	if !found {
		return id, false, nil
	}
	parts := strings.Split(rest, ":")
	if len(parts) != 3 {
		return id, true, fmt.Errorf("malformed %s%s: want UID:GID:GROUPS", identityFlag, rest)
	}
	uid, err1 := strconv.ParseUint(parts[0], 10, 32)
	gid, err2 := strconv.ParseUint(parts[1], 10, 32)
	if err1 != nil || err2 != nil {
		return id, true, fmt.Errorf("malformed %s%s: the uid and gid must be numbers", identityFlag, rest)
	}
	id = privdrop.Identity{UID: uint32(uid), GID: uint32(gid), Groups: []uint32{}}
	if parts[2] != "" {
		for _, g := range strings.Split(parts[2], ",") {
			n, err := strconv.ParseUint(g, 10, 32)
			if err != nil {
				return id, true, fmt.Errorf("malformed %s%s: group %q is not a number", identityFlag, rest, g)
			}
			id.Groups = append(id.Groups, uint32(n))
		}
	}
	return id, true, nil
}

// Command is the worker process for exe (its argv prefix) that becomes id (nil: it stays the
// agent's own identity), with handoff as its fd 3. The caller adds its pipes and starts it,
// after MarkDescriptorsCloseOnExec.
func Command(exe []string, id *privdrop.Identity, handoff *os.File) *exec.Cmd {
	args := append([]string(nil), exe[1:]...)
	if id != nil {
		args = append(args, Arg(*id))
	}
	cmd := exec.Command(exe[0], args...)
	cmd.Env = Env
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true, // signals reach the whole group
		// No Pdeathsig: it fires when the forking thread exits, not the agent. A worker
		// outlives no agent anyway: it stops when its socket or stdin to the agent closes.
	}
	cmd.ExtraFiles = []*os.File{handoff}
	return cmd
}

// MarkDescriptorsCloseOnExec keeps descriptors the agent inherited from whoever started it
// (a careless init script, a shell) out of workers, which run as users. Go opens every
// descriptor of its own close-on-exec, so only inherited ones change; the agent itself keeps
// them. Call it before every start, since non-Go code may open more.
func MarkDescriptorsCloseOnExec() {
	if unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC) == nil {
		return
	}
	// Kernels before 5.11: one descriptor at a time.
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, flags|unix.FD_CLOEXEC)
		}
	}
}

// suidDumpablePath is where the kernel says what a credential change does to dumpability.
const suidDumpablePath = "/proc/sys/fs/suid_dumpable"

// Become makes the worker non-dumpable and, when args name an identity (the agent started it
// as root), takes that identity for every thread. It returns the arguments left. who names
// the worker in errors ("the staging worker").
func Become(args []string, who string) ([]string, error) {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return args, fmt.Errorf("cannot make %s non-dumpable: %v", who, err)
	}
	var want *privdrop.Identity
	var rest []string
	for _, a := range args {
		id, ok, err := ParseArg(a)
		if err != nil {
			return args, err
		}
		if ok {
			want = &id
			continue
		}
		rest = append(rest, a)
	}
	if want == nil {
		return rest, nil
	}
	if os.Geteuid() != 0 {
		return rest, fmt.Errorf("%s was asked to become uid %d but runs as uid %d, not root", who, want.UID, os.Geteuid())
	}
	if want.UID != 0 {
		// With fs.suid_dumpable = 1 the kernel makes a process dumpable again as its
		// credentials change: the user could trace the worker from that moment on.
		if b, err := os.ReadFile(suidDumpablePath); err != nil {
			return rest, fmt.Errorf("cannot read %s: %v", suidDumpablePath, err)
		} else if strings.TrimSpace(string(b)) == "1" {
			return rest, fmt.Errorf("fs.suid_dumpable is 1 on this node, which would let the job's user trace %s "+
				"once it takes their identity; it refuses to run until it is 0 (the default) or 2: sysctl -w fs.suid_dumpable=0", who)
		}
	}
	if err := privdrop.Become(*want); err != nil {
		return rest, fmt.Errorf("%s %v", who, err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return rest, fmt.Errorf("cannot keep %s non-dumpable: %v", who, err)
	}
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		return rest, fmt.Errorf("%s is still dumpable (%d, %v)", who, d, err)
	}
	return rest, nil
}

// CheckSealed is the agent's check that the user cannot reach into the process pid: every
// thread runs as uid (all four uids) and has no tracer (both are per thread), and the process
// is not dumpable (a dumpable process's /proc entries belong to its uid; those of a
// non-dumpable one to root).
func CheckSealed(pid int, uid uint32, who string) error {
	dir := "/proc/" + strconv.Itoa(pid)
	tasks, err := os.ReadDir(dir + "/task")
	if err != nil || len(tasks) == 0 {
		return fmt.Errorf("cannot check %s (pid %d): %v", who, pid, err)
	}
	want := strconv.FormatUint(uint64(uid), 10)
	for _, task := range tasks {
		status, err := os.ReadFile(dir + "/task/" + task.Name() + "/status")
		if err != nil {
			return fmt.Errorf("cannot check %s (pid %d, thread %s): %v", who, pid, task.Name(), err)
		}
		if uids := strings.Fields(privdrop.StatusField(string(status), "Uid")); len(uids) != 4 || uids[0] != want || uids[1] != want || uids[2] != want || uids[3] != want {
			return fmt.Errorf("%s (pid %d, thread %s) runs as uids %v, not uid %d", who, pid, task.Name(), uids, uid)
		}
		if tracer := privdrop.StatusField(string(status), "TracerPid"); tracer != "0" {
			return fmt.Errorf("%s (pid %d, thread %s) is traced by pid %s; nothing is handed over", who, pid, task.Name(), tracer)
		}
	}
	if uid != 0 {
		var st unix.Stat_t
		if err := unix.Stat(dir+"/status", &st); err != nil {
			return fmt.Errorf("cannot check %s (pid %d): %v", who, pid, err)
		}
		if st.Uid == uid {
			return fmt.Errorf("%s (pid %d) is dumpable: the job's user could read its memory and descriptors; nothing is handed over", who, pid)
		}
	}
	return nil
}

// Pair makes the agent's and the worker's ends of the handoff socket (the worker's becomes
// its fd 3 through Command).
func Pair() (agent, worker *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot make a worker's socket: %v", err)
	}
	return os.NewFile(uintptr(fds[0]), "handoff-agent"), os.NewFile(uintptr(fds[1]), "handoff-worker"), nil
}

// Dial is the worker's side, once Become has sealed it: it makes a fresh socket pair of
// sockType (unix.SOCK_STREAM, unix.SOCK_SEQPACKET), sends one end to the agent over fd 3,
// closes fd 3 and returns the other end.
func Dial(sockType int) (int, error) {
	defer unix.Close(HandoffFd)
	pair, err := unix.Socketpair(unix.AF_UNIX, sockType|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("cannot make a socket to the agent: %v", err)
	}
	err = unix.Sendmsg(HandoffFd, []byte{'?'}, unix.UnixRights(pair[1]), nil, 0)
	for err == unix.EINTR {
		err = unix.Sendmsg(HandoffFd, []byte{'?'}, unix.UnixRights(pair[1]), nil, 0)
	}
	unix.Close(pair[1])
	if err != nil {
		unix.Close(pair[0])
		return -1, fmt.Errorf("cannot reach the agent: %v", err)
	}
	return pair[0], nil
}

// DialTagged is Dial for a worker that serves several requests (a stage worker kept between
// stages): fd 3 stays open for the next one, and the message carries tag (the request's
// sequence number), so that the agent never takes one request's socket for another's.
func DialTagged(sockType int, tag []byte) (int, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, sockType|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("cannot make a socket to the agent: %v", err)
	}
	msg := append([]byte{'?'}, tag...)
	err = unix.Sendmsg(HandoffFd, msg, unix.UnixRights(pair[1]), nil, 0)
	for err == unix.EINTR {
		err = unix.Sendmsg(HandoffFd, msg, unix.UnixRights(pair[1]), nil, 0)
	}
	unix.Close(pair[1])
	if err != nil {
		unix.Close(pair[0])
		return -1, fmt.Errorf("cannot reach the agent: %v", err)
	}
	return pair[0], nil
}

// AcceptTagged is Accept on the agent's end of a kept worker's fd 3 (DialTagged): the message
// must carry exactly tag. conn is read with its deadline, so that the caller can stop the
// wait (SetReadDeadline) without closing a socket the worker's next request will use.
func AcceptTagged(conn *net.UnixConn, workerPid int, uid uint32, who string, tag []byte) (int, error) {
	want := append([]byte{'?'}, tag...)
	buf := make([]byte, len(want)+1)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return -1, fmt.Errorf("%w (%v)", ErrNotAsked, err)
	}
	if n == 0 {
		return -1, fmt.Errorf("%w (the socket was closed)", ErrNotAsked)
	}
	fds, err := parseRights(oob[:oobn], 1)
	if err != nil {
		return -1, fmt.Errorf("%s sent a request without its socket: %v", who, err)
	}
	if string(buf[:n]) != string(want) {
		unix.Close(fds[0])
		return -1, fmt.Errorf("%s asked for request %x during request %x; it is not used again", who, buf[min(n, 1):n], tag)
	}
	return checkAsker(fds[0], workerPid, uid, who)
}

// ErrNotAsked: the worker closed its end of the handoff socket (or died) without dialing.
var ErrNotAsked = errors.New("the worker never asked")

// Accept is the agent's side of Dial on its end of the handoff socket: it receives the
// worker's fresh socket, checks that the worker's pid made it and that the worker is sealed
// as uid (CheckSealed), and returns it (the caller closes it). It returns when it has, or
// when the worker is gone or the caller shut agent down (ErrNotAsked).
func Accept(agent int, workerPid int, uid uint32, who string) (int, error) {
	reply, err := ReceiveFds(agent, 1)
	if err != nil {
		return -1, fmt.Errorf("%w (%v)", ErrNotAsked, err)
	}
	return checkAsker(reply[0], workerPid, uid, who)
}

// checkAsker takes the socket sock a worker sent if its pid made it and it is sealed as uid.
func checkAsker(sock, workerPid int, uid uint32, who string) (int, error) {
	cred, err := unix.GetsockoptUcred(sock, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		unix.Close(sock)
		return -1, fmt.Errorf("cannot check who is asking on %s's socket: %v", who, err)
	}
	if int(cred.Pid) != workerPid {
		unix.Close(sock)
		return -1, fmt.Errorf("pid %d, not %s (pid %d), sent a socket; "+
			"another process holds the worker's socket, so it is refused", cred.Pid, who, workerPid)
	}
	if err := CheckSealed(workerPid, uid, who); err != nil {
		unix.Close(sock)
		return -1, err
	}
	return sock, nil
}

// ReceiveFds reads one message carrying exactly want descriptors.
func ReceiveFds(sock, want int) ([]int, error) {
	fds, _, err := receiveFds(sock, want, 1)
	return fds, err
}

// ReceiveFdsTagged is ReceiveFds of a message that must carry exactly tag.
func ReceiveFdsTagged(sock, want int, tag []byte) ([]int, error) {
	fds, got, err := receiveFds(sock, want, len(tag)+1)
	if err != nil {
		return nil, err
	}
	if string(got) != string(tag) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("the descriptors came for request %x, not %x", got, tag)
	}
	return fds, nil
}

// receiveFds reads one message of at most size bytes carrying exactly want descriptors.
func receiveFds(sock, want, size int) ([]int, []byte, error) {
	buf := make([]byte, size)
	oob := make([]byte, unix.CmsgSpace(4*want))
	n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
	for err == unix.EINTR {
		n, oobn, _, _, err = unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
	}
	if err != nil {
		return nil, nil, err
	}
	if n == 0 {
		return nil, nil, fmt.Errorf("the socket was closed")
	}
	fds, err := parseRights(oob[:oobn], want)
	return fds, buf[:n], err
}

// parseRights is the descriptors of a message's control data, exactly want of them.
func parseRights(oob []byte, want int) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("no descriptors in the message")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil {
		return nil, err
	}
	if len(fds) != want {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("%d descriptors instead of %d", len(fds), want)
	}
	return fds, nil
}

// HeadBuffer keeps the first Max bytes written to it: the start of a worker's crash report
// (its standard error) says why it died.
type HeadBuffer struct {
	mu  sync.Mutex
	buf []byte
	any bool
	Max int
}

func (b *HeadBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.any = b.any || len(p) > 0
	if room := b.Max - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// Wrote says whether anything was written at all.
func (b *HeadBuffer) Wrote() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.any
}

// Text is what was kept, without surrounding space.
func (b *HeadBuffer) Text() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(string(b.buf))
}
