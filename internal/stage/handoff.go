package stage

// How a worker gets its instance's directories. The worker runs as the job's user, who can
// open /proc/<pid>/fd/N of any dumpable process of theirs: a namespace descriptor inherited
// across exec would be theirs to write past the capacity, or into a read-only (loadbalance)
// instance, for as long as they like. So the worker inherits none. It is never dumpable
// while it is the user's (identity.go: a root agent starts it as root, and it takes the
// user's identity only once it is non-dumpable; its /proc entries then belong to root and
// ptrace is refused), and only then asks for the directories: it makes a fresh socket pair, sends one end to the agent over the
// socket it did inherit (fd 3), and receives the directories on the other. The agent answers
// only a socket pair made by the worker's own pid, which is checked with SO_PEERCRED: a user
// who duplicated fd 3 before the worker became non-dumpable can send the agent a socket of
// their own, but it is refused (the stage fails), and they can never receive the answer.
// Before it answers, the agent checks again that the worker is the user's, untraced and
// non-dumpable (checkSealed).

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// handoffFd is the worker's inherited end of the agent's socket.
const handoffFd = 3

// handoffRoot marks a root the worker receives through the handoff: "handoff:<index>".
const handoffRoot = "handoff:"

// handoffPair makes the agent's and the worker's ends of the handoff socket.
func handoffPair() (agent, worker *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot make the staging worker's socket: %v", err)
	}
	return os.NewFile(uintptr(fds[0]), "stage-handoff-agent"), os.NewFile(uintptr(fds[1]), "stage-handoff-worker"), nil
}

// handOver answers the worker's request for its directories on the agent's end: it receives
// the worker's fresh socket, checks that the worker's pid made it, and sends the directories
// on it. It returns when it has, or when the worker is gone or the caller shut agent down.
func handOver(agent int, workerPid int, uid uint32, roots []*os.File) error {
	reply, err := receiveFds(agent, 1)
	if err != nil {
		return nil // the worker never asked (it had no directories to stage, or died)
	}
	sock := reply[0]
	defer unix.Close(sock)
	cred, err := unix.GetsockoptUcred(sock, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return fmt.Errorf("cannot check who asked for the instance's directories: %v", err)
	}
	if int(cred.Pid) != workerPid {
		return fmt.Errorf("pid %d, not the staging worker (pid %d), asked for the instance's directories; "+
			"another process holds the worker's socket, so the stage is refused", cred.Pid, workerPid)
	}
	if err := checkSealed(workerPid, uid); err != nil {
		return err
	}
	fds := make([]int, len(roots))
	for i, f := range roots {
		fds[i] = int(f.Fd())
	}
	if err := unix.Sendmsg(sock, []byte{'d'}, unix.UnixRights(fds...), nil, 0); err != nil {
		return fmt.Errorf("cannot hand the instance's directories to the staging worker: %v", err)
	}
	return nil
}

// receiveRoots is the worker's side: once it is non-dumpable, it asks for its directories and
// turns the "handoff:<i>" roots of its spec into paths of the descriptors it received.
func receiveRoots(roots map[string]string) error {
	n := 0
	for _, dir := range roots {
		if strings.HasPrefix(dir, handoffRoot) {
			n++
		}
	}
	defer unix.Close(handoffFd)
	if n == 0 {
		return nil
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cannot make a socket for the instance's directories: %v", err)
	}
	defer unix.Close(pair[0])
	err = unix.Sendmsg(handoffFd, []byte{'?'}, unix.UnixRights(pair[1]), nil, 0)
	unix.Close(pair[1])
	if err != nil {
		return fmt.Errorf("cannot ask the agent for the instance's directories: %v", err)
	}
	fds, err := receiveFds(pair[0], n)
	if err != nil {
		return fmt.Errorf("the agent did not hand over the instance's directories: %v", err)
	}
	for name, dir := range roots {
		i, err := strconv.Atoi(strings.TrimPrefix(dir, handoffRoot))
		if !strings.HasPrefix(dir, handoffRoot) || err != nil || i < 0 || i >= len(fds) {
			continue
		}
		roots[name] = "/proc/self/fd/" + strconv.Itoa(fds[i])
	}
	return nil
}

// receiveFds reads one message carrying exactly want descriptors.
func receiveFds(sock, want int) ([]int, error) {
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*want))
	n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("the socket was closed")
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
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
