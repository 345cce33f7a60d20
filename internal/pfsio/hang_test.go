package pfsio

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hangOpens makes every open of path block in the kernel until release is called (a
// fanotify permission event nobody answers: as an open on a PFS server that does not
// answer). It returns how many opens are held so far, and release. Only its goroutine uses
// the fanotify descriptor, and closes it: a descriptor closed under another goroutine's read
// could be reused by the next test's sockets and read from there.
func hangOpens(t *testing.T, path string) (held func() int, release func()) {
	t.Helper()
	fan, err := unix.FanotifyInit(unix.FAN_CLASS_CONTENT|unix.FAN_CLOEXEC|unix.FAN_NONBLOCK, unix.O_RDONLY|unix.O_LARGEFILE)
	if err != nil {
		t.Skipf("no fanotify here: %v", err)
	}
	if err := unix.FanotifyMark(fan, unix.FAN_MARK_ADD, unix.FAN_OPEN_PERM, unix.AT_FDCWD, path); err != nil {
		unix.Close(fan)
		t.Skipf("cannot mark %s: %v", path, err)
	}
	var mu sync.Mutex
	count := 0
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		var events []int32 // the held opens, by their event's descriptor
		buf := make([]byte, 4096)
		for {
			select {
			case <-stop:
				for _, fd := range events {
					allow(fan, fd)
				}
				unix.Close(fan) // answers anything not yet read
				return
			default:
			}
			unix.Poll([]unix.PollFd{{Fd: int32(fan), Events: unix.POLLIN}}, 20)
			n, err := unix.Read(fan, buf)
			if err != nil || n <= 0 {
				continue
			}
			for off := 0; off+int(unsafe.Sizeof(unix.FanotifyEventMetadata{})) <= n; {
				ev := (*unix.FanotifyEventMetadata)(unsafe.Pointer(&buf[off]))
				events = append(events, ev.Fd)
				off += int(ev.Event_len)
			}
			mu.Lock()
			count = len(events)
			mu.Unlock()
		}
	}()
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(stop)
			<-stopped
		})
	}
	t.Cleanup(release)
	return func() int { mu.Lock(); defer mu.Unlock(); return count }, release
}

func allow(fan int, fd int32) {
	resp := unix.FanotifyResponse{Fd: fd, Response: unix.FAN_ALLOW}
	unix.Write(fan, (*[unsafe.Sizeof(resp)]byte)(unsafe.Pointer(&resp))[:])
	unix.Close(int(fd))
}

// One file whose open hangs in the kernel (its server does not answer) costs its caller the
// request timeout and one slot, and nothing else: the other files are served meanwhile. When
// every slot is held by hung requests, the next request waits for one only as long as its
// timeout. Once the server answers, the slots come back and the late open is closed. Through
// a worker and in-process alike.
func TestHungOpenHoldsOneSlotUntilItIsAnswered(t *testing.T) {
	const timeout = 300 * time.Millisecond
	eachDoor(t, Options{MaxInFlight: 3, RequestTimeout: timeout}, func(t *testing.T, d *Door, a area) {
		hung := filepath.Join(a.pfs, "hung")
		userFile(t, hung, "never read\n", 0o644)
		userFile(t, filepath.Join(a.pfs, "other"), "served\n", 0o644)
		held, release := hangOpens(t, hung)

		start := time.Now()
		if _, err := d.OpenFile("hung", os.O_RDONLY, 0); !errnoIs(err, unix.ETIMEDOUT) {
			t.Errorf("open of a hung file: %v, want ETIMEDOUT", err)
		}
		if took := time.Since(start); took < timeout || took > timeout+2*time.Second {
			t.Errorf("the hung open took %v, want about %v", took, timeout)
		}
		if held() != 1 {
			t.Errorf("%d opens of the hung file reached the kernel, want 1", held())
		}
		f, err := d.OpenFile("other", os.O_RDONLY, 0)
		if err != nil {
			t.Fatalf("another file while one hangs: %v", err)
		}
		buf := make([]byte, 16)
		if n, _ := f.ReadAt(buf, 0); string(buf[:n]) != "served\n" {
			t.Errorf("read %q", buf[:n])
		}
		f.Close()
		if n := len(d.slots); n != 1 {
			t.Errorf("%d slots held with one request hung, want 1", n)
		}

		// Every slot hung: the next request waits for one within its timeout, no longer.
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.OpenFile("hung", os.O_RDONLY, 0)
			}()
		}
		wg.Wait()
		start = time.Now()
		if _, err := d.Lstat("other"); !errnoIs(err, unix.ETIMEDOUT) {
			t.Errorf("a request while every slot hangs: %v, want ETIMEDOUT", err)
		}
		if took := time.Since(start); took < timeout || took > timeout+2*time.Second {
			t.Errorf("waiting for a slot took %v, want about %v", took, timeout)
		}
		if held() != 3 {
			t.Errorf("%d opens of the hung file reached the kernel, want MaxInFlight = 3", held())
		}

		release()
		deadline := time.Now().Add(5 * time.Second)
		for len(d.slots) != 0 && time.Now().Before(deadline) {
			sleep(10)
		}
		if n := len(d.slots); n != 0 {
			t.Errorf("%d slots still held once the file answered", n)
		}
		if _, err := d.Lstat("other"); err != nil {
			t.Errorf("after the file answered: %v", err)
		}
		pid := d.Pid()
		if pid == 0 {
			pid = os.Getpid()
		}
		for openIn(pid, hung) && time.Now().Before(deadline) {
			sleep(10)
		}
		if openIn(pid, hung) {
			t.Error("the late opens of the hung file were not closed")
		}
	})
}
