package pfsio

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/asuser"
	"github.com/spillway-hpc/spillway/internal/privdrop"
)

// WorkerMain is the door's worker (`spillway pfs-worker`): it becomes the user its arguments
// name (asuser.Become: non-dumpable first), refuses to go on holding any capability, sends the
// agent its socket (asuser.Dial), opens the PFS root as the user, says whether it could, and
// then serves requests until the socket ends. args: [--max-in-flight=N] ROOT [--as=...].
// It returns the exit status.
func WorkerMain(args []string, stderr io.Writer) int {
	rest, err := asuser.Become(args, workerName)
	if err != nil {
		fmt.Fprintln(stderr, "pfs-worker:", err)
		return 1
	}
	if err := noCapabilities(); err != nil {
		fmt.Fprintln(stderr, "pfs-worker:", err)
		return 1
	}
	maxInFlight, root := DefaultMaxInFlight, ""
	for _, a := range rest {
		if v, ok := strings.CutPrefix(a, maxInFlightFlag); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				fmt.Fprintf(stderr, "pfs-worker: %s%s is not a positive number\n", maxInFlightFlag, v)
				return 2
			}
			maxInFlight = n
			continue
		}
		if root != "" || !strings.HasPrefix(a, "/") {
			fmt.Fprintf(stderr, "pfs-worker: unexpected argument %q\n", a)
			return 2
		}
		root = a
	}
	if root == "" {
		fmt.Fprintln(stderr, "pfs-worker: no PFS root directory given")
		return 2
	}
	// Modes are the caller's, as given (the cache passes what its own caller asked, umask
	// applied); a lost agent is a failed send, not a death by SIGPIPE.
	unix.Umask(0)
	signal.Ignore(syscall.SIGPIPE)
	sock, err := asuser.Dial(unix.SOCK_SEQPACKET)
	if err != nil {
		fmt.Fprintln(stderr, "pfs-worker:", err)
		return 1
	}
	w := &worker{sock: sock, enc: newEncoder(), dec: newDecoder()}
	// Nothing is touched before the agent has checked this process and says go.
	if !w.hello() {
		return 1
	}
	t, err := openTree(root)
	hello := &reply{fd: -1}
	if err != nil {
		hello.Errno = int32(errnoOf(err))
	} else {
		hello.Text = t.realRoot()
	}
	w.send(hello)
	if err != nil {
		return 1
	}
	w.serve(t, maxInFlight)
	return 0
}

// noCapabilities refuses a worker that holds any capability: the door is the user's rights,
// never more (a worker asked to stay root, or started with securebits that keep capabilities).
func noCapabilities() error {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return fmt.Errorf("cannot check the worker's capabilities: %v", err)
	}
	for _, field := range []string{"CapPrm", "CapEff", "CapAmb"} {
		if v := privdrop.StatusField(string(status), field); strings.Trim(v, "0") != "" {
			return fmt.Errorf("refusing to run holding capabilities (%s=%s, uid %d): the PFS is reached with a user's credentials only", field, v, os.Getuid())
		}
	}
	return nil
}

type worker struct {
	sock int
	enc  *encoder
	dec  *decoder // read by serve's loop only
}

// hello waits for the agent's first message, which must be opHello.
func (w *worker) hello() bool {
	buf := make([]byte, maxMessage+1)
	for {
		n, _, err := unix.Recvfrom(w.sock, buf, 0)
		if err == unix.EINTR {
			continue
		}
		var req request
		return err == nil && n > 0 && w.dec.decode(buf[:n], &req) == nil && req.Op == opHello
	}
}

// serve reads requests and answers each in its own goroutine, at most maxInFlight at once:
// past that it stops reading, and the agent's sends wait.
func (w *worker) serve(t *tree, maxInFlight int) {
	slots := make(chan struct{}, maxInFlight)
	buf := make([]byte, maxMessage+1)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, flags, _, err := unix.Recvmsg(w.sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil || (n == 0 && oobn == 0) {
			return // the agent closed the door, or died
		}
		fds := receivedFds(oob[:oobn])
		req := &request{}
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || w.dec.decode(buf[:n], req) != nil || len(fds) > 1 ||
			(len(fds) == 1) != (req.Op == opWrite) {
			closeFds(fds)
			return // not the agent speaking
		}
		req.dataFd = -1
		if len(fds) == 1 {
			req.dataFd = fds[0]
		}
		slots <- struct{}{}
		go func() {
			defer func() { <-slots }()
			w.send(t.serve(req))
		}()
	}
}

// send sends a reply, with the descriptor of an opened file. Replies are bounded by
// construction (batches, attribute values); one that cannot be sent ends the worker.
func (w *worker) send(r *reply) {
	var rights []byte
	if r.fd >= 0 {
		rights = unix.UnixRights(r.fd)
	}
	err := w.enc.send(r, func(msg []byte) error {
		return retry(func() error { return unix.Sendmsg(w.sock, msg, rights, nil, 0) })
	})
	if err != nil {
		os.Exit(0) // the agent is gone (or the stream broke): so is the door
	}
}
