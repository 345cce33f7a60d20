package server

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// A READ sent from its file (sendfile) is the header and the file's bytes; where the file
// turned out shorter than its span (a truncate after the size was taken), zeros make up the
// count the header promised, and the connection goes on: the next reply follows intact.
func TestSendSpanMakesUpAShrunkFileWithZeros(t *testing.T) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	server, client := conn(pair[0]), conn(pair[1])
	raw, err := server.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	c := &srvConn{s: &Server{lim: Limits{IdleTimeout: time.Minute}}, nc: server, raw: raw}

	p := filepath.Join(t.TempDir(), "object")
	data := bytes.Repeat([]byte("0123456789"), 30000) // 300,000 bytes: more than a socket buffer
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	whole, errno := span(int(f.Fd()), 5, proto.MaxIO)
	if errno != 0 || whole.n != len(data)-5 {
		t.Fatalf("span of the file from 5: %+v %v", whole, errno)
	}
	read := func(id uint64) []byte {
		t.Helper()
		client.SetReadDeadline(time.Now().Add(10 * time.Second))
		var hdr [proto.HeaderSize]byte
		if _, err := io.ReadFull(client, hdr[:]); err != nil {
			t.Fatal(err)
		}
		h, err := proto.ParseHeader(hdr[:], proto.MaxIO)
		if err != nil || h.ID != id || h.Kind != proto.KindReply {
			t.Fatalf("header %+v, %v (want a reply to %d)", h, err, id)
		}
		body := make([]byte, h.BodyLen)
		if _, err := io.ReadFull(client, body); err != nil {
			t.Fatal(err)
		}
		return body
	}
	sent := make(chan struct{}, 2)
	send := func(id uint64, sp *fileSpan) {
		c.sendSpan(proto.Header{Op: proto.OpRead, ID: id}, sp)
		sent <- struct{}{}
	}
	go send(7, whole)
	if got := read(7); !bytes.Equal(got, data[5:]) {
		t.Errorf("the whole file's span: %d bytes, not the file's %d from offset 5", len(got), len(data)-5)
	}
	shrunk, errno := span(int(f.Fd()), 100, 1000)
	if errno != 0 {
		t.Fatal(errno)
	}
	if err := os.Truncate(p, 600); err != nil { // the file shrinks after its span was taken
		t.Fatal(err)
	}
	go send(8, shrunk)
	got := read(8)
	want := append(append([]byte(nil), data[100:600]...), make([]byte, 500)...)
	if !bytes.Equal(got, want) {
		t.Errorf("the shrunk file's span: %q..., want its 500 bytes left and 500 zeros", got[:min(len(got), 40)])
	}
	<-sent
	<-sent
	for _, fd := range []int{whole.fd, shrunk.fd} { // sendSpan closed the duplicates
		if target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); err == nil && target == p {
			t.Errorf("descriptor %d of the file is still open after its span was sent", fd)
		}
	}
}
