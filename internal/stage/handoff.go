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
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/asuser"
)

// handoffRoot marks a root the worker receives through the handoff: "handoff:<index>".
const handoffRoot = "handoff:"

// handOver answers the worker's request for its directories on the agent's end: it accepts
// the worker's fresh socket (asuser.AcceptTagged checks who made it, that it is for this stage
// and that the worker is sealed) and sends the directories on it, tagged with the stage's
// sequence number. It returns when it has, or when the worker is gone or the caller set
// agent's read deadline (the stage ended without asking).
func handOver(agent *net.UnixConn, workerPid int, uid uint32, seq uint64, roots []*os.File) error {
	tag := seqTag(seq)
	sock, err := asuser.AcceptTagged(agent, workerPid, uid, workerName, tag)
	if err != nil {
		return err
	}
	defer unix.Close(sock)
	fds := make([]int, len(roots))
	for i, f := range roots {
		fds[i] = int(f.Fd())
	}
	if err := unix.Sendmsg(sock, tag, unix.UnixRights(fds...), nil, 0); err != nil {
		return fmt.Errorf("cannot hand the instance's directories to the staging worker: %v", err)
	}
	return nil
}

// seqTag is a stage's sequence number as the handoff's messages carry it.
func seqTag(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// receiveRoots is the worker's side: once it is non-dumpable, it asks for its directories and
// turns the "handoff:<i>" roots of its spec into paths of the descriptors it received, which
// it returns (closed when the stage ends). A request with a sequence number comes from an
// agent that may send more: fd 3 stays open for them, and every message carries the number.
func receiveRoots(roots map[string]string, seq uint64) ([]int, error) {
	n := 0
	for _, dir := range roots {
		if strings.HasPrefix(dir, handoffRoot) {
			n++
		}
	}
	if n == 0 {
		if seq == 0 {
			unix.Close(asuser.HandoffFd)
		}
		return nil, nil
	}
	var sock int
	var err error
	if seq == 0 {
		sock, err = asuser.Dial(unix.SOCK_STREAM)
	} else {
		sock, err = asuser.DialTagged(unix.SOCK_STREAM, seqTag(seq))
	}
	if err != nil {
		return nil, fmt.Errorf("cannot ask for the instance's directories: %v", err)
	}
	defer unix.Close(sock)
	var fds []int
	if seq == 0 {
		fds, err = asuser.ReceiveFds(sock, n)
	} else {
		fds, err = asuser.ReceiveFdsTagged(sock, n, seqTag(seq))
	}
	if err != nil {
		return nil, fmt.Errorf("the agent did not hand over the instance's directories: %v", err)
	}
	for name, dir := range roots {
		i, err := strconv.Atoi(strings.TrimPrefix(dir, handoffRoot))
		if !strings.HasPrefix(dir, handoffRoot) || err != nil || i < 0 || i >= len(fds) {
			continue
		}
		roots[name] = "/proc/self/fd/" + strconv.Itoa(fds[i])
	}
	return fds, nil
}
