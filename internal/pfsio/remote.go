package pfsio

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/asuser"
	"github.com/spillway-hpc/spillway/internal/privdrop"
)

// workerName names the door's worker in asuser's errors.
const workerName = "the PFS door's worker"

// maxInFlightFlag tells the worker how many requests it may serve at once.
const maxInFlightFlag = "--max-in-flight="

// Start opens the door to root (an absolute path) with a worker process holding only id's
// credentials (uid, gid, groups; never root: the worker refuses to run with any capability).
// exe is the worker's argv prefix, e.g. {"/proc/self/exe", "pfs-worker"} (WorkerMain). A root
// agent starts it as root and it becomes id itself, sealed (package asuser); an agent that is
// not root passes id nil and the worker is the agent's own user. It returns once the worker
// holds the root, opened as the user: a root the user cannot enter is EACCES (an
// *fs.PathError), one that does not exist ENOENT.
//
// The worker lives as long as the door: it exits when the door is closed or its agent dies
// (its socket closes).
func Start(exe []string, root string, id *privdrop.Identity, opts Options) (*Door, error) {
	opts = opts.withDefaults()
	if len(exe) == 0 || exe[0] == "" {
		return nil, errors.New("no PFS worker program configured")
	}
	if !filepath.IsAbs(root) {
		return nil, &fs.PathError{Op: "open", Path: root, Err: unix.EINVAL}
	}
	uid := uint32(os.Getuid())
	if id != nil {
		if os.Getuid() != 0 {
			return nil, fmt.Errorf("cannot start a PFS worker as uid %d: this agent runs as uid %d, not root", id.UID, os.Getuid())
		}
		uid = id.UID
	}
	agentEnd, workerEnd, err := asuser.Pair()
	if err != nil {
		return nil, err
	}
	defer agentEnd.Close()
	cmd := asuser.Command(append(append([]string(nil), exe...), maxInFlightFlag+strconv.Itoa(opts.MaxInFlight), root), id, workerEnd)
	stderr := &asuser.HeadBuffer{Max: 4096}
	cmd.Stderr = stderr
	asuser.MarkDescriptorsCloseOnExec()
	err = cmd.Start()
	workerEnd.Close()
	if err != nil {
		return nil, fmt.Errorf("cannot start the PFS worker %s: %v", exe[0], err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	fail := func(err error) (*Door, error) {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		if text := stderr.Text(); text != "" {
			err = fmt.Errorf("%w; its error output: %s", err, text)
		}
		return nil, err
	}

	// The worker's socket, once it is sealed as the user; a worker that never sends it (it
	// failed, it hangs) is given up after the request timeout.
	stop := shutdownAfter(int(agentEnd.Fd()), opts.RequestTimeout)
	sock, err := asuser.Accept(int(agentEnd.Fd()), cmd.Process.Pid, uid, workerName)
	stop()
	if errors.Is(err, asuser.ErrNotAsked) {
		return fail(fmt.Errorf("the PFS worker (pid %d) did not start: %v", cmd.Process.Pid, err))
	}
	if err != nil {
		return fail(err)
	}
	c := &conn{sock: sock, cmd: cmd, exited: exited, pending: map[uint64]chan *reply{}, dead: make(chan struct{}),
		enc: newEncoder(), dec: newDecoder(), buf: make([]byte, maxMessage+1)}
	// Checked: let it open the root; its answer says whether it could.
	stop = shutdownAfter(sock, opts.RequestTimeout)
	hello, err := (*reply)(nil), error(nil)
	if c.enc.send(&request{Op: opHello}, func(msg []byte) error { return unix.Sendmsg(sock, msg, nil, nil, 0) }) != nil {
		err = errors.New("it closed its socket")
	} else {
		hello, err = c.receive()
	}
	stop()
	if err != nil {
		unix.Close(sock)
		return fail(fmt.Errorf("the PFS worker (pid %d) did not say whether it opened %s: %v", cmd.Process.Pid, root, err))
	}
	if hello.Errno != 0 {
		unix.Close(sock)
		<-exited
		return nil, &fs.PathError{Op: "open", Path: root, Err: syscall.Errno(hello.Errno)}
	}
	go c.read()
	return newDoor(root, hello.Text, opts, c), nil
}

// shutdownAfter shuts the socket fd down after d, waking whoever waits on it, unless stop is
// called first; once stop has returned it never will (fd may then be closed and its number
// reused).
func shutdownAfter(fd int, d time.Duration) (stop func()) {
	var mu sync.Mutex
	stopped := false
	timer := time.AfterFunc(d, func() {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			unix.Shutdown(fd, unix.SHUT_RDWR)
		}
	})
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		timer.Stop()
	}
}

// conn is the door's end of a worker's socket (SOCK_SEQPACKET: one message per request or
// reply, descriptors attached).
type conn struct {
	sock   int
	cmd    *exec.Cmd
	exited chan struct{}
	enc    *encoder
	dec    *decoder // and buf: read by one goroutine at a time (Start, then read)
	buf    []byte

	sendMu sync.RWMutex // senders hold it shared; close takes it to close sock once they are out
	mu     sync.Mutex
	nextID uint64
	// pending are the requests sent and not answered, by id.
	pending map[uint64]chan *reply
	dead    chan struct{} // closed when the socket is done: the worker went, or close
}

func (c *conn) pid() int { return c.cmd.Process.Pid }

func (c *conn) gone() <-chan struct{} { return c.dead }

// receive reads one reply and the descriptor it carries, if any.
func (c *conn) receive() (*reply, error) {
	buf := c.buf
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, flags, _, err := unix.Recvmsg(c.sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		fds := receivedFds(oob[:oobn])
		if n == 0 && oobn == 0 {
			return nil, errors.New("the worker closed its socket")
		}
		var r reply
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || c.dec.decode(buf[:n], &r) != nil || len(fds) > 1 {
			closeFds(fds)
			return nil, errors.New("the worker sent a malformed message")
		}
		r.fd = -1
		if len(fds) == 1 {
			r.fd = fds[0]
		}
		return &r, nil
	}
}

func receivedFds(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// read hands each reply to its request until the socket ends; then every request still
// pending ends with ENOTCONN.
func (c *conn) read() {
	var err error
	for {
		var r *reply
		r, err = c.receive()
		if err != nil {
			break
		}
		c.mu.Lock()
		ch := c.pending[r.ID]
		delete(c.pending, r.ID)
		c.mu.Unlock()
		if ch == nil { // an answer to nothing asked: a confused (or hostile) worker
			if r.fd >= 0 {
				unix.Close(r.fd)
			}
			err = fmt.Errorf("the worker answered request %d, which was not asked", r.ID)
			break
		}
		if r.fd >= 0 && !validDescriptor(r) {
			unix.Close(r.fd)
			r.fd, r.Errno = -1, int32(unix.EIO)
		}
		ch <- r
	}
	unix.Shutdown(c.sock, unix.SHUT_RDWR) // the worker sees its end close and exits
	c.mu.Lock()
	close(c.dead) // from here on close may close sock
	c.mu.Unlock()
}

// validDescriptor: the worker hands over only regular files it opened. A descriptor of
// anything else (a FIFO that would block the caller, a socket) is refused.
func validDescriptor(r *reply) bool {
	var st unix.Stat_t
	return unix.Fstat(r.fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG
}

// roundTrip sends req and waits for its reply, however long the worker takes, or until the
// socket ends (Door.call bounds the caller's wait).
func (c *conn) roundTrip(req *request) *reply {
	ch := make(chan *reply, 1)
	c.mu.Lock()
	select {
	case <-c.dead:
		c.mu.Unlock()
		if req.dataFd >= 0 {
			unix.Close(req.dataFd)
		}
		return &reply{Errno: int32(ErrClosed), fd: -1}
	default:
	}
	c.nextID++
	req.ID = c.nextID
	c.pending[req.ID] = ch
	c.mu.Unlock()
	r, pipeW := c.send(req)
	if r != nil {
		c.mu.Lock()
		delete(c.pending, req.ID)
		c.mu.Unlock()
		return r
	}
	if pipeW >= 0 {
		// A write's bytes, outside sendMu: a worker that stops reading (a hung PFS) must
		// not keep close from closing the socket. The worker splices what comes; if it
		// stops (an error, it died) the pipe breaks (EPIPE: no signal for a Go program's
		// other descriptors) and its reply says why.
		for data := req.data; len(data) > 0; {
			n, err := unix.Write(pipeW, data)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				break
			}
			data = data[n:]
		}
		unix.Close(pipeW)
	}
	select {
	case r := <-ch:
		return r
	case <-c.dead:
		select {
		case r := <-ch:
			return r
		default:
			return &reply{Errno: int32(ErrClosed), fd: -1}
		}
	}
}

// send sends req: a failure's reply, or nil and, for a write, the pipe to write its bytes to
// (its read end went with the request).
func (c *conn) send(req *request) (failed *reply, pipeW int) {
	c.sendMu.RLock()
	defer c.sendMu.RUnlock()
	var rights []byte
	pipeW = -1
	if req.Op == opWrite {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return &reply{Errno: int32(errnoOf(err)), fd: -1}, -1
		}
		unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, int(min(req.Size, 1<<20)))
		rights, pipeW = unix.UnixRights(p[0]), p[1]
		defer unix.Close(p[0]) // the worker has its own copy once sent
	}
	err := c.enc.send(req, func(msg []byte) error {
		return retry(func() error { return unix.Sendmsg(c.sock, msg, rights, nil, 0) })
	})
	if err != nil {
		if pipeW >= 0 {
			unix.Close(pipeW)
		}
		if err != errTooLarge && err != unix.EMSGSIZE {
			return &reply{Errno: int32(ErrClosed), fd: -1}, -1
		}
		// Cannot be (Door.do checks what a request carries); the stream is given up.
		unix.Shutdown(c.sock, unix.SHUT_RDWR)
		return &reply{Errno: int32(unix.E2BIG), fd: -1}, -1
	}
	return nil, pipeW
}

func (c *conn) close() error {
	unix.Shutdown(c.sock, unix.SHUT_RDWR) // wakes read and blocked senders
	<-c.dead
	c.sendMu.Lock()
	unix.Close(c.sock)
	c.sock = -1
	c.sendMu.Unlock()
	// The worker exits once it sees its socket end; one blocked in a hung PFS cannot die
	// before the PFS answers, and is reaped in the background then.
	go func() {
		select {
		case <-c.exited:
		case <-time.After(5 * time.Second):
			syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		}
	}()
	return nil
}
