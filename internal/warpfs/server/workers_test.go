package server

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// goroutineID is the calling goroutine's number, from its stack's header ("goroutine N [").
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// workers is how many goroutines are a connection's workers now.
func workers() int {
	buf := make([]byte, 1<<20)
	return bytes.Count(buf[:runtime.Stack(buf, true)], []byte("server.(*srvConn).worker("))
}

// A connection's requests run on workers that outlive them, no more than max_in_flight (a
// new goroutine per request paid for growing its stack to the handlers' depth each time);
// at once, no more than max_in_flight of them run; the workers end with the connection.
func TestRequestsRunOnWorkers(t *testing.T) {
	const maxInFlight = 3
	f := newFixture(t, Limits{MaxInFlight: maxInFlight})
	c := f.client()
	var mu sync.Mutex
	ran := map[uint64]int{} // goroutine → GETATTRs run on it
	running, most := 0, 0
	var gate chan struct{} // while set, each GETATTR waits on it
	handlerFault = func(op proto.Op, uid uint32) {
		if op != proto.OpGetattr {
			return
		}
		mu.Lock()
		ran[goroutineID()]++
		running++
		most = max(most, running)
		g := gate
		mu.Unlock()
		if g != nil {
			<-g
		}
		mu.Lock()
		running--
		mu.Unlock()
	}
	t.Cleanup(func() { handlerFault = nil })

	const sequential = 20
	for i := 0; i < sequential; i++ {
		if errno := do(c, proto.OpGetattr, &proto.NodeReq{}, &proto.AttrReply{}); errno != 0 {
			t.Fatal(errno)
		}
	}
	mu.Lock()
	if len(ran) > maxInFlight {
		t.Errorf("%d requests one after another ran on %d goroutines, want at most max_in_flight (%d) workers", sequential, len(ran), maxInFlight)
	}
	gate = make(chan struct{})
	mu.Unlock()

	const concurrent = 8
	var wg sync.WaitGroup
	errs := make(chan syscall.Errno, concurrent)
	for i := 0; i < concurrent; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- do(c, proto.OpGetattr, &proto.NodeReq{}, &proto.AttrReply{})
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		r := running
		mu.Unlock()
		if r == maxInFlight || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // a request past the limit would have started by now
	mu.Lock()
	close(gate)
	gate = nil
	mu.Unlock()
	wg.Wait()
	close(errs)
	for errno := range errs {
		if errno != 0 {
			t.Fatal(errno)
		}
	}
	mu.Lock()
	if most != maxInFlight {
		t.Errorf("%d requests at once: %d ran at once, want max_in_flight (%d)", concurrent, most, maxInFlight)
	}
	if len(ran) > maxInFlight {
		t.Errorf("the requests ran on %d goroutines, want at most max_in_flight (%d) workers", len(ran), maxInFlight)
	}
	mu.Unlock()
	if n := workers(); n == 0 || n > maxInFlight {
		t.Errorf("%d workers wait for the connection's next requests, want 1 to %d", n, maxInFlight)
	}

	c.Close()
	deadline = time.Now().Add(5 * time.Second)
	for workers() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := workers(); n > 0 {
		t.Errorf("%d workers left after the connection ended", n)
	}
}
