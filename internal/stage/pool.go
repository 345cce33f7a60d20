package stage

// Stage workers kept between stages. Starting a worker (exec of a Go program, taking the
// user's identity) costs more CPU than staging a small file, and a burst of in-job stages of
// one job pays it once per stage. So a worker that ended a stage cleanly — its result line
// read, saying it closed the stage's directories and waits ("more") — is kept idle, keyed by
// its exact credential (uid, gid, supplementary groups), program and nice value, and the next
// stage of that key takes it instead of starting a process. Before each stage the agent checks
// it again as it did the first time (every thread the user's, untraced, not dumpable: the
// handoff's asuser.AcceptTagged, after a cheaper look when it is taken), and the stage's lines
// carry its sequence number.
//
// Nothing abnormal is ever reused: a stage canceled, timed out, stalled, a protocol error, a
// worker that wrote on stderr or sent anything while idle, or that exited, is killed or
// retired. An idle worker exits after stage.worker_idle_timeout, when the pool holds
// stage.max_idle_workers already, after stage.worker_max_stages stages, and when the agent
// goes (its stdin closes; CloseIdleWorkers kills them at shutdown).

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/asuser"
	"github.com/spillway-hpc/spillway/internal/privdrop"
)

// proc is one worker process, serving a stage or idle in the pool.
type proc struct {
	key   string
	pid   int
	cmd   *exec.Cmd
	stdin io.WriteCloser
	// lines are the worker's stdout lines; closed at its end or a read error (readErr, set
	// before). Exactly one goroutine reads them at a time: the stage's supervise, or the pool.
	lines   chan []byte
	readErr error
	stderr  *asuser.HeadBuffer
	handoff *net.UnixConn // the agent's end of the worker's fd 3
	exited  chan struct{} // closed once reaped (waitErr set)
	waitErr error
	served  int // stages given to it, the current one included

	mu     sync.Mutex
	reaped bool // its pid may belong to another process now
}

// spawn starts a worker process for exe as id (nil: the agent's own identity).
func spawn(exe []string, id *privdrop.Identity, limits Limits, key string) (*proc, error) {
	agentEnd, workerEnd, err := asuser.Pair()
	if err != nil {
		return nil, err
	}
	defer workerEnd.Close() // the worker has its own copy once started
	conn, err := net.FileConn(agentEnd)
	agentEnd.Close() // FileConn holds a copy
	if err != nil {
		return nil, fmt.Errorf("cannot make a worker's socket: %v", err)
	}
	unixConn, ok := conn.(*net.UnixConn)
	if !ok {
		conn.Close()
		return nil, errors.New("cannot make a worker's socket: not a Unix socket")
	}
	// fd 3 (asuser.HandoffFd): the worker asks for its directories there. Its stdin ending
	// stops it, so it outlives no agent.
	cmd := asuser.Command(exe, id, workerEnd)
	p := &proc{key: key, cmd: cmd, lines: make(chan []byte), stderr: &asuser.HeadBuffer{Max: limits.MaxStderrBytes},
		handoff: unixConn, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	cmd.WaitDelay = limits.CancelGrace
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		unixConn.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		unixConn.Close()
		return nil, err
	}
	asuser.MarkDescriptorsCloseOnExec()
	if err := cmd.Start(); err != nil {
		unixConn.Close()
		return nil, err
	}
	p.pid = cmd.Process.Pid
	if limits.Nice > 0 {
		lowerPriority(p.pid, limits.Nice)
	}
	workersAlive.Add(1)
	go p.read(stdout, limits.MaxLineBytes)
	return p, nil
}

// read passes the worker's lines on until its stdout ends, then reaps it.
func (p *proc) read(stdout io.Reader, maxLine int) {
	scanner := bufio.NewScanner(stdout)
	scanner.Buffer(make([]byte, 0, 4096), maxLine)
	for scanner.Scan() {
		p.lines <- slices.Clone(scanner.Bytes())
	}
	p.readErr = scanner.Err()
	close(p.lines)
	io.Copy(io.Discard, stdout) // until the worker is gone
	err := p.cmd.Wait()
	p.mu.Lock()
	p.reaped, p.waitErr = true, err
	p.mu.Unlock()
	p.handoff.Close()
	workersAlive.Add(-1)
	close(p.exited)
}

// signal sends sig to the worker's process group while the worker is known not to have been
// reaped (after that its pid, and so its group id, may belong to someone else).
func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaped {
		syscall.Kill(-p.pid, sig)
	}
}

// retire ends a worker that served its stage but is not kept: its stdin closes (it exits at
// once, holding nothing), and it is killed if still there grace later. Its lines, if any,
// are nobody's.
func (p *proc) retire(grace time.Duration) {
	p.stdin.Close()
	go func() {
		for range p.lines {
		}
	}()
	go func() {
		select {
		case <-p.exited:
		case <-time.After(grace):
			p.signal(syscall.SIGKILL)
		}
	}()
}

// kill ends a worker that must not be used again at once.
func (p *proc) kill() {
	p.stdin.Close()
	p.signal(syscall.SIGKILL)
	go func() {
		for range p.lines {
		}
	}()
}

// usable checks a worker taken from the pool, cheaply (one file of /proc, and its descriptors
// when the agent is root): still there (not a zombie), its main thread untraced, and holding
// no file or directory. The full check — every thread the user's, none traced, not dumpable —
// is the handoff's (asuser.AcceptTagged), right before the stage's directories are sent.
func (p *proc) usable() error {
	p.mu.Lock()
	reaped := p.reaped
	p.mu.Unlock()
	if reaped {
		return errors.New("it exited")
	}
	status, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/status")
	if err != nil {
		return err
	}
	if state := privdrop.StatusField(string(status), "State"); strings.HasPrefix(state, "Z") || strings.HasPrefix(state, "X") {
		return errors.New("it exited")
	}
	if tracer := privdrop.StatusField(string(status), "TracerPid"); tracer != "0" {
		return fmt.Errorf("it is traced by pid %s", tracer)
	}
	return holdsNothing(p.pid)
}

// holdsNothing checks that an idle worker closed its stage's files and directories, as it
// said: between stages it holds pipes and sockets, and what the Go runtime keeps (the
// cgroup's CPU quota file, for GOMAXPROCS). A root agent can see its descriptors (an agent
// of the worker's own uid cannot, the worker being non-dumpable; it has nothing but that
// uid's anyway).
func holdsNothing(pid int) error {
	if os.Geteuid() != 0 {
		return nil
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/fd/"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		target, err := os.Readlink(dir + e.Name())
		if err != nil || !strings.HasPrefix(target, "/") || strings.HasPrefix(target, "/sys/") || strings.HasPrefix(target, "/proc/") {
			continue // gone, or a pipe, a socket, an eventpoll; the runtime's
		}
		return fmt.Errorf("it still holds %s (descriptor %s) between stages", target, e.Name())
	}
	return nil
}

// idle is a worker waiting in the pool, watched by one goroutine until it is taken.
type idle struct {
	p       *proc
	taken   chan struct{} // closed by take
	stopped chan struct{} // closed when the watcher no longer reads the worker's lines
	bad     bool          // the watcher found it dead or talking: it is not handed a stage
}

// workerPool holds the idle workers of this process's agents.
type workerPool struct {
	mu   sync.Mutex
	idle map[string][]*idle // by key, oldest first
	n    int
}

var pool = &workerPool{idle: map[string][]*idle{}}

// poolKey is what a worker must share with a stage to serve it.
func poolKey(exe []string, id *privdrop.Identity, nice int) string {
	var b strings.Builder
	for _, a := range exe {
		b.WriteString(strconv.Quote(a))
		b.WriteByte(' ')
	}
	if id == nil {
		b.WriteString("self")
	} else {
		groups := slices.Sorted(slices.Values(id.Groups))
		fmt.Fprintf(&b, "uid=%d gid=%d groups=%v", id.UID, id.GID, groups)
	}
	fmt.Fprintf(&b, " nice=%d", nice)
	return b.String()
}

// put keeps p, which ended a stage cleanly, for the next stage of its key; or retires it when
// it has served limits.WorkerMaxStages or the pool is full.
func (pl *workerPool) put(p *proc, limits Limits) {
	pl.mu.Lock()
	if p.served >= limits.WorkerMaxStages || pl.n >= limits.MaxIdleWorkers {
		pl.mu.Unlock()
		p.retire(limits.CancelGrace)
		return
	}
	it := &idle{p: p, taken: make(chan struct{}), stopped: make(chan struct{})}
	pl.idle[p.key] = append(pl.idle[p.key], it)
	pl.n++
	pl.mu.Unlock()
	go pl.watch(it, limits)
}

// remove takes it out of the pool; false if take (or CloseIdleWorkers) did first.
func (pl *workerPool) remove(it *idle) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	list := pl.idle[it.p.key]
	i := slices.Index(list, it)
	if i < 0 {
		return false
	}
	pl.idle[it.p.key] = slices.Delete(list, i, i+1)
	if len(pl.idle[it.p.key]) == 0 {
		delete(pl.idle, it.p.key)
	}
	pl.n--
	return true
}

// watch waits for it to be taken; meanwhile the worker must say nothing and stay, and it is
// retired after limits.WorkerIdleTimeout.
func (pl *workerPool) watch(it *idle, limits Limits) {
	defer close(it.stopped)
	timer := time.NewTimer(limits.WorkerIdleTimeout)
	defer timer.Stop()
	select {
	case <-it.taken:
	case _, open := <-it.p.lines:
		// A line while idle is garbage; the end of its output, a worker that died. Either
		// way it is not handed a stage, taken meanwhile or not (take sees bad).
		pl.remove(it)
		pl.mu.Lock()
		it.bad = true
		pl.mu.Unlock()
		if open {
			it.p.kill()
		}
	case <-timer.C:
		if pl.remove(it) {
			it.p.retire(limits.CancelGrace)
		}
	}
}

// take returns an idle worker of key fit for a stage, or nil.
func (pl *workerPool) take(key string) *proc {
	for {
		pl.mu.Lock()
		list := pl.idle[key]
		if len(list) == 0 {
			pl.mu.Unlock()
			return nil
		}
		it := list[len(list)-1] // the most recent: the least likely to time out meanwhile
		pl.idle[key] = list[:len(list)-1]
		if len(pl.idle[key]) == 0 {
			delete(pl.idle, key)
		}
		pl.n--
		pl.mu.Unlock()
		close(it.taken)
		<-it.stopped
		pl.mu.Lock()
		bad := it.bad
		pl.mu.Unlock()
		if bad {
			continue // the watcher dealt with it
		}
		if err := it.p.usable(); err != nil {
			it.p.kill()
			continue
		}
		return it.p
	}
}

// IdleWorkers is how many workers wait for a stage in this process.
func IdleWorkers() int {
	pool.mu.Lock()
	defer pool.mu.Unlock()
	return pool.n
}

// CloseIdleWorkers kills every idle worker and waits, at most wait, until they are gone: the
// agent's shutdown.
func CloseIdleWorkers(wait time.Duration) {
	pool.mu.Lock()
	var all []*idle
	for _, list := range pool.idle {
		all = append(all, list...)
	}
	pool.idle, pool.n = map[string][]*idle{}, 0
	pool.mu.Unlock()
	deadline := time.After(wait)
	for _, it := range all {
		close(it.taken)
		<-it.stopped
		it.p.kill()
	}
	for _, it := range all {
		select {
		case <-it.p.exited:
		case <-deadline:
			return
		}
	}
}
