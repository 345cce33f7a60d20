package mount

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// lazyFile creates name on m with content and closes it: m then holds its attributes
// (leased) and layout, and opens it without asking the metadata server.
func lazyFile(t *testing.T, m *Mounted, name, content string) string {
	t.Helper()
	p := filepath.Join(m.Path(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// readAt reads up to 100 bytes of f at 0.
func readAt(f *os.File) (string, error) {
	buf := make([]byte, 100)
	n, err := f.ReadAt(buf, 0)
	if n > 0 || errors.Is(err, os.ErrClosed) {
		err = nil
	}
	return string(buf[:n]), err
}

// A file this node created is opened and closed without a request to its metadata server,
// for reading and for reading and writing (as mdtest's read phase opens): the mount holds
// its attributes, leased, and its layout. Its data comes from its stripe server.
func TestLazyOpenAsksNothing(t *testing.T) {
	in := newCountedInstance(t)
	m := in.mountAt(t, "cn1")
	p := lazyFile(t, m, "f", "hello")
	in.settle()
	for _, flags := range []int{os.O_RDONLY, os.O_RDWR} {
		f, err := os.OpenFile(p, flags, 0)
		if err != nil {
			t.Fatal(err)
		}
		got, err := readAt(f)
		if err != nil || got != "hello" {
			t.Errorf("flags %#o: read %q, %v; want hello", flags, got, err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		c := phaseCounts(in.settle())
		if len(c[0]) != 0 {
			t.Errorf("flags %#o: open, read, close asked the metadata server: %v", flags, c)
		}
		if c[1:].ops(proto.OpRead) != 1 {
			t.Errorf("flags %#o: want one READ from the stripe server: %v", flags, c)
		}
	}
	// A writer registers with the metadata server at its first write, and its size is seen
	// after the close, here and on another node.
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(" world"), 5); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if c := phaseCounts(in.settle()); c[0][proto.OpOpen] != 1 {
		t.Errorf("a lazily opened writer's first write: want one OPEN on the metadata server: %v", c)
	}
	other := in.mountAt(t, "cn2")
	if b, err := os.ReadFile(filepath.Join(other.Path(), "f")); err != nil || string(b) != "hello world" {
		t.Errorf("another node reads %q, %v; want hello world", b, err)
	}
}

// A file opened lazily here and appended to by another node: the next read here past the
// size it knew sees the new bytes (the metadata server told this node, which then asks).
func TestLazyOpenSeesOtherNodesWrites(t *testing.T) {
	in := newCountedInstance(t)
	a, b := in.mountAt(t, "cn1"), in.mountAt(t, "cn2")
	p := lazyFile(t, a, "grows", "first ")
	in.settle()
	r, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if c := phaseCounts(in.settle()); len(c[0]) != 0 {
		t.Fatalf("the open was not lazy: %v", c)
	}
	w, err := os.OpenFile(filepath.Join(b.Path(), "grows"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("second"); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got, err := readAt(r); err != nil || got != "first second" {
		t.Errorf("read %q, %v; want %q", got, err, "first second")
	}
	if st, err := r.Stat(); err != nil || st.Size() != int64(len("first second")) {
		t.Errorf("fstat: %v, %v; want size %d", st, err, len("first second"))
	}
}

// Another node renames a file open here lazily and puts a new file at its name: this node
// never reads or stats the new file through its descriptor. Its data is the old file's
// (the layout names the objects); what needs the metadata server fails with ESTALE, the
// name no longer leading to the file (docs/mounts.md).
func TestLazyOpenNeverFollowsARenamedName(t *testing.T) {
	in := newCountedInstance(t)
	a, b := in.mountAt(t, "cn1"), in.mountAt(t, "cn2")
	p := lazyFile(t, a, "f", "old")
	in.settle()
	r, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if c := phaseCounts(in.settle()); len(c[0]) != 0 {
		t.Fatalf("the open was not lazy: %v", c)
	}
	if err := os.Rename(filepath.Join(b.Path(), "f"), filepath.Join(b.Path(), "g")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.Path(), "f"), []byte("a new and longer file"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readAt(r)
	t.Logf("read through the descriptor: %q, %v", got, err)
	if err == nil && got != "old" {
		t.Errorf("read %q through the renamed file's descriptor, want %q or an error", got, "old")
	}
	st, err := r.Stat()
	t.Logf("fstat: %v, %v", st, err)
	if err == nil && st.Size() != 3 {
		t.Errorf("fstat gave size %d (the new file's?), want 3 or an error", st.Size())
	} else if err != nil && !errors.Is(err, syscall.ESTALE) {
		t.Errorf("fstat: %v, want ESTALE", err)
	}
	_, err = r.WriteAt([]byte("X"), 0)
	t.Logf("write: %v", err)
	if err == nil {
		t.Errorf("a write through the descriptor succeeded: it must not reach the new file")
	}
	if got, err := os.ReadFile(filepath.Join(b.Path(), "f")); err != nil || string(got) != "a new and longer file" {
		t.Errorf("the new file reads %q, %v", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(b.Path(), "g")); err != nil || string(got) != "old" {
		t.Errorf("the renamed file reads %q, %v", got, err)
	}
}

// This node removes a file it has open lazily: the descriptor goes on, as POSIX says (the
// handle is opened on the metadata server before the name goes).
func TestLazyOpenSurvivesOwnUnlink(t *testing.T) {
	in := newCountedInstance(t)
	m := in.mountAt(t, "cn1")
	p := lazyFile(t, m, "tmp", "hello")
	in.settle()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if c := phaseCounts(in.settle()); len(c[0]) != 0 {
		t.Fatalf("the open was not lazy: %v", c)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(" world"), 5); err != nil {
		t.Fatalf("write after unlink: %v", err)
	}
	if got, err := readAt(f); err != nil || got != "hello world" {
		t.Errorf("read after unlink %q, %v; want hello world", got, err)
	}
	if st, err := f.Stat(); err != nil || st.Size() != 11 {
		t.Errorf("fstat after unlink: %v, %v; want size 11", st, err)
	}
}

// Only the file's owner opens it lazily: for anyone else the kernel's check of the mode bits
// may let in what an ACL on the server refuses, so the open asks the metadata server.
func TestLazyOpenOnlyForTheOwner(t *testing.T) {
	in := newCountedInstance(t)
	m := in.mountAt(t, "cn1")
	for d := filepath.Dir(m.Path()); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		os.Chmod(d, 0o755) // the test's directories: uid 65534 reaches the mount
	}
	if err := os.Chmod(m.Path(), 0o755); err != nil {
		t.Fatal(err)
	}
	p := lazyFile(t, m, "roots", "data") // root's, 0644
	in.settle()
	// Open it as uid 65534: FUSE names the caller by its file system uid (this thread's).
	func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		unix.Setfsgid(65534)
		unix.Setfsuid(65534)
		defer unix.Setfsgid(0)
		defer unix.Setfsuid(0)
		fd, err := unix.Open(p, unix.O_RDONLY, 0)
		if err != nil {
			t.Fatalf("open as uid 65534: %v", err)
		}
		unix.Close(fd)
	}()
	if c := phaseCounts(in.settle()); c[0][proto.OpOpen] != 1 {
		t.Errorf("an open by another user than the owner: want one OPEN on the metadata server: %v", c)
	}
	if f, err := os.Open(p); err == nil { // the owner's open stays lazy
		f.Close()
	}
	if c := phaseCounts(in.settle()); len(c[0]) != 0 {
		t.Errorf("the owner's open asked the metadata server: %v", c)
	}
}
