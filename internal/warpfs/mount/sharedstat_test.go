package mount

import (
	"fmt"
	"github.com/spillway-hpc/spillway/internal/warpfs/client"
	"golang.org/x/sys/unix"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// IOR's ior-hard on one node: ranks open one shared file, read it, close it and stat it, all
// at once. A stat of the existing file must never fail, whatever the other ranks' opens and
// closes (their RELEASE reaches the mount after close(2) returned) are doing meanwhile.
func TestSharedFileStatWhileOthersOpenAndClose(t *testing.T) {
	for _, b := range []testBackend{{name: "local"}, {name: "remote", remote: true}} {
		t.Run(b.name, func(t *testing.T) {
			src, mp := dirs(t)
			m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("instance 21", 64*mib)})
			dir := filepath.Join(m.Path(), "ior")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, "shared")
			if err := os.WriteFile(p, make([]byte, 4*47008), 0o644); err != nil {
				t.Fatal(err)
			}
			var stop atomic.Bool
			var failures atomic.Int64
			var firstErr atomic.Value
			fail := func(err error) {
				if failures.Add(1) == 1 {
					firstErr.Store(err)
				}
			}
			var wg sync.WaitGroup
			for rank := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					buf := make([]byte, 47008)
					for !stop.Load() {
						f, err := os.Open(p)
						if err != nil {
							fail(err)
							continue
						}
						if _, err := f.ReadAt(buf, int64(rank)*47008); err != nil {
							fail(err)
						}
						f.Close()
						if _, err := os.Stat(p); err != nil {
							fail(err)
						}
					}
				}()
			}
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						if _, err := os.Stat(p); err != nil {
							fail(err)
						}
					}
				}()
			}
			// Ranks as processes too: their files are closed by their exit as well.
			script := `end=$(($(date +%s)+` + strconv.Itoa(int(stressTime/time.Second)) + `)); i=0
while [ $(date +%s) -lt $end ]; do
  dd if="$1" of=/dev/null bs=47008 count=1 skip=$(( i % 4 )) 2>/dev/null || echo "read failed"
  stat -c %s "$1" >/dev/null || echo "stat failed"
  i=$((i+1))
done`
			var outs [4][]byte
			for i := range outs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					outs[i], _ = exec.Command("sh", "-c", script, "rank", p).CombinedOutput()
				}()
			}
			time.Sleep(stressTime)
			stop.Store(true)
			wg.Wait()
			for i, out := range outs {
				if len(out) > 0 {
					fail(fmt.Errorf("process %d: %s", i, out))
				}
			}
			if n := failures.Load(); n > 0 {
				t.Fatalf("%d operations on the shared file failed; the first: %v", n, firstErr.Load())
			}
		})
	}
}

const stressTime = 3 * time.Second

// A signal a process handles (MPI runtimes and profilers send them) is no reason for its
// stat(2) to fail: the kernel tells the mount of any signal the caller gets during a request
// (FUSE_INTERRUPT), and a local file system's stat never fails with EINTR. Here a thread
// stats the file without retrying (raw system calls, as C programs such as IOR make them)
// while it gets SIGURG-like signals it handles; it must see every stat succeed.
func TestHandledSignalsDoNotFailRequests(t *testing.T) {
	for _, b := range []testBackend{{name: "local"}, {name: "remote", remote: true}} {
		t.Run(b.name, func(t *testing.T) {
			src, mp := dirs(t)
			m := b.mount(t, Spec{MountPath: mp, SourceDir: src, Tracker: usage.New("instance 21", 64*mib)})
			p := filepath.Join(m.Path(), "shared")
			if err := os.WriteFile(p, make([]byte, 47008), 0o644); err != nil {
				t.Fatal(err)
			}
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGUSR1) // handled, with SA_RESTART, as by a runtime
			defer signal.Stop(sigs)
			go func() {
				for range sigs {
				}
			}()
			tid := make(chan int)
			var stop atomic.Bool
			var stats, eintr atomic.Int64
			var other atomic.Value
			done := make(chan struct{})
			go func() {
				defer close(done)
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				tid <- unix.Gettid()
				var st unix.Stat_t
				buf := make([]byte, 4096)
				for !stop.Load() {
					stats.Add(1)
					if err := unix.Stat(p, &st); err == unix.EINTR {
						eintr.Add(1)
					} else if err != nil {
						other.Store(err)
					}
					// A read too: the kernel asks the attributes before it (auto_inval_data).
					if fd, err := unix.Open(p, unix.O_RDONLY, 0); err == nil {
						if _, err := unix.Pread(fd, buf, 0); err == unix.EINTR {
							eintr.Add(1)
						}
						unix.Close(fd)
					}
				}
			}()
			victim := <-tid
			deadline := time.Now().Add(stressTime)
			for time.Now().Before(deadline) && eintr.Load() == 0 {
				unix.Tgkill(os.Getpid(), victim, syscall.SIGUSR1)
				time.Sleep(20 * time.Microsecond)
			}
			stop.Store(true)
			<-done
			if err := other.Load(); err != nil {
				t.Errorf("stat: %v", err)
			}
			if n := eintr.Load(); n > 0 {
				t.Errorf("%d of %d stats (and reads) failed with EINTR because the thread got a signal it handles", n, stats.Load())
			}
		})
	}
}

// What a signal still does: a process killed while its request waits for a storage node
// that stopped answering (SIGKILL, or a signal it does not handle) goes long before the
// request's deadline (here 1 minute): as soon as the connection attempt under way gives up
// (its handshake timeout, 5 s), as before.
func TestKilledCallerStopsWaiting(t *testing.T) {
	src, mp := dirs(t)
	s := startServer(t, "", src, usage.New("instance 39", 4*mib), nil)
	m := mount(t, Spec{MountPath: mp, Logger: quietLogger(t), Remote: &Remote{Address: s.addr, Token: testToken,
		Limits: client.Limits{RequestTimeout: 60 * time.Second, KeepaliveInterval: 30 * time.Second, ReconnectWait: 50 * time.Millisecond}}})
	s.stop()
	l, err := net.Listen("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		var held []net.Conn // accepted, never answered
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		cmd := exec.Command("stat", filepath.Join(m.Path(), "hung"))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond) // in its request by now
		start := time.Now()
		cmd.Process.Signal(sig)
		cmd.Wait()
		took := time.Since(start)
		t.Logf("%v: gone after %v", sig, took.Round(time.Millisecond))
		if took > 10*time.Second {
			t.Errorf("a process sent %v while it waited for a silent storage node took %v to go", sig, took.Round(time.Millisecond))
		}
	}
}
