package fuseuring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Transport is how requests reach the server.
type Transport int

const (
	Dev   Transport = iota // read and writev on /dev/fuse
	Uring                  // FUSE over io_uring, /dev/fuse for FORGET and INTERRUPT only
)

func (t Transport) String() string {
	if t == Uring {
		return "io_uring"
	}
	return "/dev/fuse"
}

// Options of a prototype mount.
type Options struct {
	Files     int       // files f0 … f<Files-1> in the root; file i has size i
	Transport Transport // Uring falls back to Dev when the kernel does not offer it
	Entries   int       // ring entries per CPU queue (Uring), default 2
	Readers   int       // goroutines reading /dev/fuse (Dev), default 2
	// Workers (Uring): each request is handled on a goroutine of its own, its answer handed
	// back to the queue's thread (which alone submits to the ring) through an eventfd the
	// ring polls, instead of inline on that thread: what a handler that blocks (a network
	// round trip) needs so that a queue keeps serving.
	Workers bool
	// Delay is slept by every LOOKUP and GETATTR, blocked in nanosleep(2): a handler waiting
	// on something (a network file system's do). Not time.Sleep: Go's timers fire late while
	// every thread is blocked in a system call, which would measure the runtime, not the queue.
	Delay time.Duration
}

// The FUSE protocol's parts the prototype speaks (include/uapi/linux/fuse.h).
const (
	opLookup      = 1
	opForget      = 2
	opGetattr     = 3
	opInit        = 26
	opInterrupt   = 36
	opDestroy     = 38
	opBatchForget = 42

	inHeaderSize   = 40
	outHeaderSize  = 16
	initOutSize    = 64
	attrSize       = 88
	entryOutSize   = 40 + attrSize
	attrOutSize    = 16 + attrSize
	initExt        = 1 << 30
	initMaxPages   = 1 << 22
	flags2OverUrng = 1 << (41 - 32) // FUSE_OVER_IO_URING in init's flags2
	maxWrite       = 128 << 10
	maxPages       = maxWrite / 4096

	// struct fuse_uring_req_header: in_out (128), op_in (128), fuse_uring_ent_in_out (32)
	ringInOut, ringOpIn, ringEntInOut, ringHeaderSize = 0, 128, 256, 288
	cmdRegister, cmdCommitAndFetch                    = 1, 2
)

// Server is a mounted prototype.
type Server struct {
	mnt       string
	opts      Options
	dev       int
	transport Transport
	conn      uint32 // the connection's number in /sys/fs/fuse/connections
	done      sync.WaitGroup
	failure   atomic.Pointer[error]

	ringRequests, devRequests atomic.Uint64
}

// Mount mounts the fixed tree at mnt (as root) and serves it until Close.
func Mount(mnt string, o Options) (*Server, error) {
	if o.Entries <= 0 {
		o.Entries = 2
	}
	if o.Readers <= 0 {
		o.Readers = 2
	}
	dev, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/fuse: %w", err)
	}
	s := &Server{mnt: mnt, opts: o, dev: dev}
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=%d,group_id=%d,allow_other", dev, os.Getuid(), os.Getgid())
	if err := unix.Mount("fuseuring", mnt, "fuse.fuseuring", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		unix.Close(dev)
		return nil, fmt.Errorf("mount %s: %w", mnt, err)
	}
	s.conn = connection(mnt) // from mountinfo: a stat of mnt would wait for INIT's answer
	offered, err := s.init()
	if err != nil {
		s.Close()
		return nil, err
	}
	s.transport = Dev
	if o.Transport == Uring && offered {
		s.transport = Uring
		if err := s.startQueues(); err != nil {
			s.Close()
			return nil, err
		}
		s.done.Add(1)
		go s.devLoop() // FORGET and INTERRUPT still come through /dev/fuse
		return s, nil
	}
	for range o.Readers {
		s.done.Add(1)
		go s.devLoop()
	}
	return s, nil
}

// connection is the device minor of the FUSE mount at mnt (its /sys/fs/fuse/connections number).
func connection(mnt string) uint32 {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == mnt {
			if _, minor, ok := strings.Cut(f[2], ":"); ok {
				n, _ := strconv.Atoi(minor)
				return uint32(n)
			}
		}
	}
	return 0
}

// Transport is the transport the kernel and the server agreed on.
func (s *Server) Transport() Transport { return s.transport }

// Requests counts the requests answered through the rings and through /dev/fuse.
func (s *Server) Requests() (ring, dev uint64) { return s.ringRequests.Load(), s.devRequests.Load() }

// Close unmounts and waits for the server's goroutines (aborting the connection after 10 s).
func (s *Server) Close() error {
	err := unix.Unmount(s.mnt, 0)
	if err != nil {
		err = unix.Unmount(s.mnt, unix.MNT_DETACH)
	}
	stopped := make(chan struct{})
	go func() { s.done.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		os.WriteFile(fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", s.conn), []byte("1"), 0)
		<-stopped
	}
	unix.Close(s.dev)
	if p := s.failure.Load(); p != nil {
		return *p
	}
	return err
}

func (s *Server) fail(err error) { s.failure.CompareAndSwap(nil, &err) }

// init answers the kernel's INIT; returns whether the kernel offered FUSE over io_uring.
func (s *Server) init() (bool, error) {
	buf := make([]byte, maxWrite+4096)
	n, err := unix.Read(s.dev, buf)
	if err != nil {
		return false, fmt.Errorf("reading INIT: %w", err)
	}
	if n < inHeaderSize+20 || binary.LittleEndian.Uint32(buf[4:]) != opInit {
		return false, fmt.Errorf("the first request was not INIT (%d bytes)", n)
	}
	unique := binary.LittleEndian.Uint64(buf[8:])
	in := buf[inHeaderSize:n]
	major, minor := binary.LittleEndian.Uint32(in[0:]), binary.LittleEndian.Uint32(in[4:])
	readahead, flags := binary.LittleEndian.Uint32(in[8:]), binary.LittleEndian.Uint32(in[12:])
	var flags2 uint32
	if flags&initExt != 0 && len(in) >= 20 {
		flags2 = binary.LittleEndian.Uint32(in[16:])
	}
	if major != 7 || minor < 31 {
		return false, fmt.Errorf("FUSE protocol %d.%d: the prototype needs 7.31 or later", major, minor)
	}
	offered := flags2&flags2OverUrng != 0
	out := make([]byte, outHeaderSize+initOutSize)
	o := out[outHeaderSize:]
	binary.LittleEndian.PutUint32(o[0:], 7)
	binary.LittleEndian.PutUint32(o[4:], minor)
	binary.LittleEndian.PutUint32(o[8:], readahead)
	binary.LittleEndian.PutUint32(o[12:], initExt|initMaxPages)
	binary.LittleEndian.PutUint16(o[16:], 16) // max_background
	binary.LittleEndian.PutUint16(o[18:], 12) // congestion_threshold
	binary.LittleEndian.PutUint32(o[20:], maxWrite)
	binary.LittleEndian.PutUint32(o[24:], 1) // time_gran
	binary.LittleEndian.PutUint16(o[28:], maxPages)
	if offered && s.opts.Transport == Uring {
		binary.LittleEndian.PutUint32(o[32:], flags2OverUrng)
	}
	putOutHeader(out, len(out), 0, unique)
	if _, err := unix.Write(s.dev, out); err != nil {
		return false, fmt.Errorf("answering INIT: %w", err)
	}
	return offered, nil
}

func putOutHeader(b []byte, length int, errno int32, unique uint64) {
	binary.LittleEndian.PutUint32(b[0:], uint32(length))
	binary.LittleEndian.PutUint32(b[4:], uint32(errno))
	binary.LittleEndian.PutUint64(b[8:], unique)
}

// handle answers one request: its out arguments written into out, their length, and an
// errno (negative) or 0; reply false for requests that take none.
func (s *Server) handle(opcode uint32, node uint64, opIn, payload, out []byte) (n int, errno int32, reply bool) {
	switch opcode {
	case opForget, opBatchForget, opInterrupt:
		return 0, 0, false
	case opDestroy:
		return 0, 0, true
	case opLookup:
		s.wait()
		name := payload
		if i := strings.IndexByte(string(name), 0); i >= 0 {
			name = name[:i]
		}
		if node != 1 || len(name) < 2 || name[0] != 'f' {
			return 0, -int32(syscall.ENOENT), true
		}
		i, err := strconv.Atoi(string(name[1:]))
		if err != nil || i < 0 || i >= s.opts.Files || strconv.Itoa(i) != string(name[1:]) {
			return 0, -int32(syscall.ENOENT), true
		}
		clear(out[:entryOutSize])
		binary.LittleEndian.PutUint64(out[0:], uint64(i)+2) // nodeid; generation and timeouts 0
		s.attr(out[40:], uint64(i)+2)
		return entryOutSize, 0, true
	case opGetattr:
		s.wait()
		if node != 1 && (node < 2 || node >= uint64(s.opts.Files)+2) {
			return 0, -int32(syscall.ENOENT), true
		}
		clear(out[:attrOutSize])
		s.attr(out[16:], node)
		return attrOutSize, 0, true
	}
	return 0, -int32(syscall.ENOSYS), true
}

func (s *Server) wait() {
	if s.opts.Delay > 0 {
		ts := unix.NsecToTimespec(s.opts.Delay.Nanoseconds())
		for unix.Nanosleep(&ts, &ts) == unix.EINTR {
		}
	}
}

// attr writes struct fuse_attr of node: 1 the root directory, 2+i file f<i> of size i.
func (s *Server) attr(b []byte, node uint64) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], node)
	mode, nlink, size := uint32(unix.S_IFREG|0o644), uint32(1), node-2
	if node == 1 {
		mode, nlink, size = unix.S_IFDIR|0o755, 2, 0
	}
	le.PutUint64(b[8:], size)
	const t = 1700000000
	le.PutUint64(b[24:], t)
	le.PutUint64(b[32:], t)
	le.PutUint64(b[40:], t)
	le.PutUint32(b[60:], mode)
	le.PutUint32(b[64:], nlink)
	le.PutUint32(b[80:], 4096) // blksize
}

// devLoop reads requests from /dev/fuse and answers them with one writev each.
func (s *Server) devLoop() {
	defer s.done.Done()
	buf := make([]byte, maxWrite+4096)
	out := make([]byte, outHeaderSize+4096)
	for {
		n, err := unix.Read(s.dev, buf)
		switch {
		case err == unix.EINTR || err == unix.ENOENT:
			continue
		case err == unix.ENODEV:
			return // unmounted
		case err != nil:
			s.fail(fmt.Errorf("reading /dev/fuse: %w", err))
			return
		case n < inHeaderSize:
			s.fail(fmt.Errorf("short request from /dev/fuse: %d bytes", n))
			return
		}
		le := binary.LittleEndian
		opcode, unique, node := le.Uint32(buf[4:]), le.Uint64(buf[8:]), le.Uint64(buf[16:])
		args := buf[inHeaderSize:n]
		var opIn, payload []byte
		switch opcode {
		case opGetattr:
			opIn = args
		default:
			payload = args
		}
		m, errno, reply := s.handle(opcode, node, opIn, payload, out[outHeaderSize:])
		s.devRequests.Add(1)
		if !reply {
			continue
		}
		if errno != 0 {
			m = 0
		}
		putOutHeader(out, outHeaderSize+m, errno, unique)
		if _, err := unix.Write(s.dev, out[:outHeaderSize+m]); err != nil && err != unix.ENOENT {
			if err == unix.ENODEV {
				return
			}
			s.fail(fmt.Errorf("answering on /dev/fuse: %w", err))
			return
		}
	}
}

// possibleCPUs is the kernel's number of queues: num_possible_cpus().
func possibleCPUs() (int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, found := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		z := a
		var err2 error
		if found {
			z, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || z < a {
			return 0, fmt.Errorf("/sys/devices/system/cpu/possible: %q", b)
		}
		n += z - a + 1
	}
	return n, nil
}

// startQueues starts one ring per CPU queue, each served by a goroutine locked to an OS
// thread pinned to the queue's CPU (the kernel queues a request on the caller's CPU), and
// returns once every queue has registered its entries: the kernel holds requests until then.
func (s *Server) startQueues() error {
	n, err := possibleCPUs()
	if err != nil {
		return err
	}
	started := make(chan error, n)
	for q := range n {
		s.done.Add(1)
		go s.queue(q, started)
	}
	var errs []error
	for range n {
		if err := <-started; err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// entry is one ring entry's memory: the request header area and the payload buffer.
type entry struct {
	headers, payload []byte
	iov              [2]unix.Iovec
}

func (s *Server) queue(q int, started chan<- error) {
	defer s.done.Done()
	runtime.LockOSThread() // the ring's completions run as task work of the thread that submits
	var cpus unix.CPUSet
	cpus.Set(q)
	unix.SchedSetaffinity(0, &cpus) // best effort: a CPU may be offline
	k := s.opts.Entries
	r, err := newRing(uint32(2 * k))
	if err != nil {
		started <- fmt.Errorf("queue %d: %w", q, err)
		return
	}
	defer r.close()
	stride := ringHeaderSize + maxWrite
	mem, err := unix.Mmap(-1, 0, k*stride, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		started <- fmt.Errorf("queue %d: buffers: %w", q, err)
		return
	}
	defer unix.Munmap(mem)
	ents := make([]entry, k)
	for i := range ents {
		e := &ents[i]
		e.headers = mem[i*stride : i*stride+ringHeaderSize]
		e.payload = mem[i*stride+ringHeaderSize : (i+1)*stride]
		e.iov[0] = unix.Iovec{Base: &e.headers[0]}
		e.iov[0].SetLen(len(e.headers))
		e.iov[1] = unix.Iovec{Base: &e.payload[0]}
		e.iov[1].SetLen(len(e.payload))
		s.command(r.sqe(), cmdRegister, q, uint64(i), 0, e)
	}
	var w *workers
	if s.opts.Workers {
		if w, err = newWorkers(); err != nil {
			started <- fmt.Errorf("queue %d: %w", q, err)
			return
		}
		defer w.close()
		w.poll(r.sqe())
	}
	if err := r.enter(0); err != nil {
		started <- fmt.Errorf("queue %d: registering: %w", q, err)
		return
	}
	started <- nil
	live := k
	le := binary.LittleEndian
	// answer handles the request in entry i and writes its COMMIT_AND_FETCH, on any goroutine
	// when commit is nil (workers), else on this one.
	answer := func(i uint64) {
		e := &ents[i]
		h := e.headers[ringInOut:]
		opcode, unique, node := le.Uint32(h[4:]), le.Uint64(h[8:]), le.Uint64(h[16:])
		size := le.Uint32(e.headers[ringEntInOut+16:])
		m, errno, _ := s.handle(opcode, node, e.headers[ringOpIn:ringEntInOut], e.payload[:size], e.payload)
		s.ringRequests.Add(1)
		if errno != 0 {
			m = 0
		}
		putOutHeader(h, outHeaderSize+m, errno, unique)
		le.PutUint32(e.headers[ringEntInOut+16:], uint32(m))
		if w != nil {
			w.done(i, unique)
			return
		}
		s.command(r.sqe(), cmdCommitAndFetch, q, i, unique, e)
	}
	for live > 0 {
		if err := r.enter(1); err != nil {
			s.fail(fmt.Errorf("queue %d: %w", q, err))
			return
		}
		r.completions(func(i uint64, res int32) {
			if i == pollTag { // answers from the workers
				for _, a := range w.take() {
					s.command(r.sqe(), cmdCommitAndFetch, q, a.entry, a.unique, &ents[a.entry])
				}
				w.poll(r.sqe())
				return
			}
			if res < 0 { // the connection ended (ENOTCONN) or the command failed
				if res != -int32(unix.ENOTCONN) && res != -int32(unix.ECANCELED) {
					s.fail(fmt.Errorf("queue %d entry %d: %w", q, i, syscall.Errno(-res)))
				}
				live--
				return
			}
			if w != nil {
				w.wg.Add(1)
				go func() { defer w.wg.Done(); answer(i) }()
				return
			}
			answer(i)
		})
	}
}

const pollTag = ^uint64(0)

// workers hands answers made on other goroutines back to a queue's thread.
type workers struct {
	efd     int
	mu      sync.Mutex
	answers []answered
	wg      sync.WaitGroup
}

type answered struct{ entry, unique uint64 }

func newWorkers() (*workers, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &workers{efd: efd}, nil
}

// poll writes the SQE that completes (user data pollTag) once an answer is waiting.
func (w *workers) poll(sqe []byte) {
	le := binary.LittleEndian
	sqe[0] = opPollAdd
	le.PutUint32(sqe[4:], uint32(w.efd))
	le.PutUint32(sqe[28:], unix.POLLIN)
	le.PutUint64(sqe[32:], pollTag)
}

func (w *workers) done(entry, unique uint64) {
	w.mu.Lock()
	w.answers = append(w.answers, answered{entry, unique})
	w.mu.Unlock()
	one := [8]byte{1}
	unix.Write(w.efd, one[:])
}

// take returns the answers waiting and clears the eventfd.
func (w *workers) take() []answered {
	var buf [8]byte
	unix.Read(w.efd, buf[:])
	w.mu.Lock()
	a := w.answers
	w.answers = nil
	w.mu.Unlock()
	return a
}

func (w *workers) close() {
	w.wg.Wait()
	unix.Close(w.efd)
}

// command writes a FUSE_IO_URING_CMD_* SQE for entry i of queue q.
func (s *Server) command(sqe []byte, cmd uint32, q int, i, commit uint64, e *entry) {
	le := binary.LittleEndian
	sqe[0] = opURingCmd
	le.PutUint32(sqe[4:], uint32(s.dev))
	le.PutUint32(sqe[8:], cmd)
	le.PutUint64(sqe[16:], uint64(uintptr(unsafe.Pointer(&e.iov[0]))))
	le.PutUint32(sqe[24:], 2)
	le.PutUint64(sqe[32:], i) // user data: the entry
	c := sqe[sqeCmdOffset:]   // struct fuse_uring_cmd_req
	le.PutUint64(c[8:], commit)
	le.PutUint16(c[16:], uint16(q))
}
