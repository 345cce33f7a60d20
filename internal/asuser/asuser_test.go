package asuser

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/privdrop"
)

// The agent hands anything over only to a worker of the user's uid that nobody traces and
// that is not dumpable. (TestUserCannotTraceAStartingWorker in internal/stage and
// TestUserCannotTraceAStartingDoor in internal/pfsio attack real workers started through this
// package.)
func TestCheckSealedRefusesAReachableWorker(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the processes must run as another user")
	}
	const uid, gid = 65534, 65534
	start := func(cred *syscall.Credential) *exec.Cmd {
		cmd := exec.Command("/bin/sleep", "30")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	// A process started as the user is dumpable: theirs to trace.
	user := start(&syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}})
	if err := CheckSealed(user.Process.Pid, uid, "w"); err == nil || !strings.Contains(err.Error(), "is dumpable") {
		t.Errorf("a dumpable process of the user: %v", err)
	}
	if err := CheckSealed(user.Process.Pid, uid+1, "w"); err == nil || !strings.Contains(err.Error(), "runs as uids") {
		t.Errorf("another user's process: %v", err)
	}
	// A traced process.
	traced := start(nil)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(traced.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if err := CheckSealed(traced.Process.Pid, 0, "w"); err == nil || !strings.Contains(err.Error(), "is traced by pid") {
		t.Errorf("a traced process: %v", err)
	}
}

func TestIdentityArgumentRoundTrips(t *testing.T) {
	for _, id := range []privdrop.Identity{
		{UID: 1003, GID: 1004, Groups: []uint32{1004, 27, 100}},
		{UID: 65534, GID: 65534, Groups: []uint32{}},
	} {
		got, ok, err := ParseArg(Arg(id))
		if !ok || err != nil || got.UID != id.UID || got.GID != id.GID || fmt.Sprint(got.Groups) != fmt.Sprint(id.Groups) {
			t.Errorf("%+v came back as %+v (%v, %v)", id, got, ok, err)
		}
	}
	for _, bad := range []string{"--as=1", "--as=a:1:", "--as=1:1:x", "--as=1:1:1:1"} {
		if _, ok, err := ParseArg(bad); !ok || err == nil {
			t.Errorf("%q accepted (%v)", bad, ok)
		}
	}
	if _, ok, _ := ParseArg("stage-worker"); ok {
		t.Error("an argument without --as= read as an identity")
	}
}

// A socket sent by another process than the worker is refused.
func TestAcceptRefusesASocketOfAnotherProcess(t *testing.T) {
	agent, worker, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	defer worker.Close()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	if err := unix.Sendmsg(int(worker.Fd()), []byte{'?'}, unix.UnixRights(pair[1]), nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(pair[1])
	if _, err := Accept(int(agent.Fd()), os.Getpid()+100000, uint32(os.Getuid()), "w"); err == nil || !strings.Contains(err.Error(), "another process holds") {
		t.Errorf("a socket made by the wrong pid: %v", err)
	}
	worker.Close()
	if _, err := Accept(int(agent.Fd()), os.Getpid(), uint32(os.Getuid()), "w"); !errors.Is(err, ErrNotAsked) {
		t.Errorf("a worker that never asked: %v", err)
	}
}

// A worker kept for several requests asks on the same fd 3 each time, its message numbered:
// the agent takes a socket only with the number of the request it waits for, and a message
// of another request (a stale one) is refused, its socket closed.
func TestAcceptTaggedTakesOnlyItsRequest(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root: the asker is this process, sealed only as root")
	}
	agentEnd, workerEnd, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer workerEnd.Close()
	conn, err := net.FileConn(agentEnd)
	agentEnd.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ask := func(tag string) {
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(pair[0])
		defer unix.Close(pair[1])
		if err := unix.Sendmsg(int(workerEnd.Fd()), append([]byte{'?'}, tag...), unix.UnixRights(pair[1]), nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	ask("\x00\x00\x00\x00\x00\x00\x00\x01")
	if _, err := AcceptTagged(conn.(*net.UnixConn), os.Getpid(), 0, "the test worker", []byte("\x00\x00\x00\x00\x00\x00\x00\x02")); err == nil || !strings.Contains(err.Error(), "asked for request 0000000000000001 during request 0000000000000002") {
		t.Errorf("a stale request: %v", err)
	}
	ask("\x00\x00\x00\x00\x00\x00\x00\x02")
	sock, err := AcceptTagged(conn.(*net.UnixConn), os.Getpid(), 0, "the test worker", []byte("\x00\x00\x00\x00\x00\x00\x00\x02"))
	if err != nil {
		t.Fatalf("the request waited for: %v", err)
	}
	unix.Close(sock)
	// Nobody asks: a deadline ends the wait without closing the socket.
	conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := AcceptTagged(conn.(*net.UnixConn), os.Getpid(), 0, "the test worker", []byte("x")); !errors.Is(err, ErrNotAsked) {
		t.Errorf("no request: %v, want ErrNotAsked", err)
	}
}
