package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"testing"
	"time"
)

// slowWriter records each write (one system call's worth) and takes a while over it, as a
// busy socket does: senders arriving meanwhile queue up.
type slowWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	writes int
	fail   error
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(200 * time.Microsecond)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fail != nil {
		return 0, w.fail
	}
	w.writes++
	return w.buf.Write(p)
}

// Every frame of many concurrent senders arrives whole and in each sender's order, in fewer
// writes than frames; each Send returns only once its frame is written.
func TestBatchWriterJoinsConcurrentFrames(t *testing.T) {
	w := &slowWriter{}
	b := NewBatchWriter(w, nil)
	const senders, each = 16, 50
	var wg sync.WaitGroup
	for s := 0; s < senders; s++ {
		wg.Add(1)
		go func(s int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				head := make([]byte, 8)
				binary.BigEndian.PutUint32(head, uint32(s))
				binary.BigEndian.PutUint32(head[4:], uint32(i))
				body := bytes.Repeat([]byte{byte(s)}, 24)
				if err := b.Send(head, nil, body); err != nil {
					t.Error(err)
					return
				}
				// Returned: the frame is in the writer already (the caller may reuse it).
				for j := range body {
					body[j] = 0xff
				}
			}
		}(s)
	}
	wg.Wait()
	data := w.buf.Bytes()
	if len(data) != senders*each*32 {
		t.Fatalf("%d bytes written, want %d", len(data), senders*each*32)
	}
	next := make([]int, senders)
	for off := 0; off < len(data); off += 32 {
		s, i := int(binary.BigEndian.Uint32(data[off:])), int(binary.BigEndian.Uint32(data[off+4:]))
		if s >= senders || i != next[s] {
			t.Fatalf("frame at %d: sender %d frame %d, want frame %d", off, s, i, next[s])
		}
		next[s]++
		if !bytes.Equal(data[off+8:off+32], bytes.Repeat([]byte{byte(s)}, 24)) {
			t.Fatalf("frame at %d: body changed after Send returned (or torn)", off)
		}
	}
	frames, writes := b.Counts()
	t.Logf("%d frames in %d writes", frames, writes)
	if frames != senders*each || writes >= frames/2 {
		t.Errorf("%d frames took %d writes: concurrent frames were not joined", frames, writes)
	}
}

// A failed write fails its senders and every later one.
func TestBatchWriterError(t *testing.T) {
	broken := errors.New("broken pipe")
	w := &slowWriter{fail: broken}
	b := NewBatchWriter(w, nil)
	if err := b.Send([]byte("x")); !errors.Is(err, broken) {
		t.Fatalf("Send: %v, want %v", err, broken)
	}
	if err := b.Send([]byte("y")); !errors.Is(err, broken) {
		t.Fatalf("a later Send: %v, want %v", err, broken)
	}
	var _ io.Writer = w
}
