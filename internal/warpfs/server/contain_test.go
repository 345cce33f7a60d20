package server

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// fuzzUID is the ordinary user FuzzHandlers acts as.
const fuzzUID = 65534

// faultyUID is the caller whose requests panic while a test sets handlerFault.
const faultyUID = 4242

// A handler's panic fails its request with EIO and closes its connection; the server, the
// node's other mounts and the next connection of the same client go on.
func TestHandlerPanicIsContained(t *testing.T) {
	f := newFixture(t, DefaultLimits())
	handlerFault = func(op proto.Op, uid uint32) {
		if uid == faultyUID {
			panic("a defect in a handler")
		}
	}
	t.Cleanup(func() { handlerFault = nil })
	other := f.client() // another mount of the node, connected before
	before := counterValue(dataPath.panics)

	nc, br := handshake(t, f.addr)
	nc.Write(proto.AppendFrame(nil, proto.Header{Op: proto.OpStatfs, ID: 3, UID: faultyUID, GID: faultyUID}, &proto.Empty{}))
	h, _, err := readFrame(br, proto.MaxBody)
	if err != nil {
		t.Fatalf("no reply to the request whose handler panicked: %v", err)
	}
	if syscall.Errno(h.Errno) != syscall.EIO {
		t.Errorf("the request whose handler panicked answered %v, want EIO", syscall.Errno(h.Errno))
	}
	if !closed(nc, br) {
		t.Error("the connection whose request panicked stayed open")
	}
	if got := counterValue(dataPath.panics) - before; got != 1 {
		t.Errorf("spillway_warpfs_handler_panics_total grew by %v, want 1", got)
	}
	if !strings.Contains(f.logs.String(), "a request's handler panicked") || !strings.Contains(f.logs.String(), "a defect in a handler") {
		t.Errorf("the panic was not logged:\n%s", f.logs.String())
	}
	var st proto.StatfsReply
	if errno := do(other, proto.OpStatfs, &proto.Empty{}, &st); errno != 0 {
		t.Errorf("another mount after the panic: %v", errno)
	}
	if errno := do(f.client(), proto.OpStatfs, &proto.Empty{}, &st); errno != 0 {
		t.Errorf("a new connection after the panic: %v", errno)
	}
}

// FuzzHandlers sends every request the protocol decodes, in sequences (so that a CREATE or
// OPEN can be followed by requests on its handle), to a real namespace through the code
// every connection runs: no input may make a handler panic.
func FuzzHandlers(f *testing.F) {
	dir := f.TempDir()
	ns := filepath.Join(dir, "namespace")
	if err := os.Mkdir(ns, 0o755); err != nil {
		f.Fatal(err)
	}
	os.WriteFile(filepath.Join(ns, "file"), []byte("some data"), 0o644)
	os.Mkdir(filepath.Join(ns, "dir"), 0o755)
	os.Symlink("/etc/passwd", filepath.Join(ns, "link"))
	// The requests come from an ordinary user: as root, a MKNOD of a block device and an OPEN
	// of it would reach this machine's disk.
	for _, p := range []string{ns, filepath.Join(ns, "file"), filepath.Join(ns, "dir")} {
		os.Lchown(p, fuzzUID, fuzzUID)
	}
	l, err := OpenLocal(LocalOptions{Dir: ns, Tracker: usage.New("fuzz", 1<<20), MaxFileSize: 1 << 19})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(l.Close)
	// Seeds: each request of the protocol with an empty body, and a few whole sequences.
	for op := proto.OpLookup; op < 255; op++ {
		if proto.NewRequest(op) != nil {
			f.Add(seq(op, nil))
		}
	}
	f.Add(append(seq(proto.OpCreate, proto.AppendFrame(nil, proto.Header{}, &proto.CreateReq{Name: "new", Mode: 0o644, Flags: uint32(os.O_RDWR)})[proto.HeaderSize:]),
		seq(proto.OpWrite, proto.AppendFrame(nil, proto.Header{}, &proto.WriteReq{Handle: 1, Offset: 4096, Data: []byte("x")})[proto.HeaderSize:])...))
	dest := make([]byte, 1<<16)
	f.Fuzz(func(t *testing.T, data []byte) {
		for len(data) >= 3 {
			op := proto.Op(data[0])
			n := int(binary.LittleEndian.Uint16(data[1:3]))
			data = data[3:]
			n = min(n, len(data))
			body := data[:n]
			data = data[n:]
			m := proto.NewRequest(op)
			if m == nil || proto.Decode(body, m) != nil {
				continue
			}
			if _, _, _, panicked := l.sess.contained(op, fuzzUID, fuzzUID, m, dest); panicked {
				t.Fatalf("%s %+v panicked (see the log above)", op, m)
			}
		}
	})
}

// seq is one request of a FuzzHandlers input: its op, its body's length and its body.
func seq(op proto.Op, body []byte) []byte {
	out := []byte{byte(op), 0, 0}
	binary.LittleEndian.PutUint16(out[1:], uint16(len(body)))
	return append(out, body...)
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	c.Write(&m)
	return m.GetCounter().GetValue()
}
