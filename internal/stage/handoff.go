package stage

// How a worker gets its instance's directories. The worker runs as the job's user, who can
// open /proc/<pid>/fd/N of any dumpable process of theirs: a namespace descriptor inherited
// across exec would be theirs to write past the capacity, or into a read-only (loadbalance)
// instance, for as long as they like. So the worker inherits none. It is never dumpable
// while it is the user's (identity.go), and only then asks for the directories: it dials the
// agent over the socket it did inherit (fd 3, asuser.Dial) and receives the directories on
// the fresh socket; the agent answers only a socket made by the worker's own pid, once it has
// checked again that the worker is the user's, untraced and non-dumpable (asuser.Accept).

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/asuser"
)

// handoffRoot marks a root the worker receives through the handoff: "handoff:<index>".
const handoffRoot = "handoff:"

// handOver answers the worker's request for its directories on the agent's end: it accepts
// the worker's fresh socket (asuser.Accept checks who made it and that the worker is sealed)
// and sends the directories on it. It returns when it has, or when the worker is gone or the
// caller shut agent down.
func handOver(agent int, workerPid int, uid uint32, roots []*os.File) error {
	sock, err := asuser.Accept(agent, workerPid, uid, workerName)
	if errors.Is(err, asuser.ErrNotAsked) {
		return nil // the worker never asked (it had no directories to stage, or died)
	}
	if err != nil {
		return err
	}
	defer unix.Close(sock)
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
	if n == 0 {
		unix.Close(asuser.HandoffFd)
		return nil
	}
	sock, err := asuser.Dial(unix.SOCK_STREAM)
	if err != nil {
		return fmt.Errorf("cannot ask for the instance's directories: %v", err)
	}
	defer unix.Close(sock)
	fds, err := asuser.ReceiveFds(sock, n)
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
