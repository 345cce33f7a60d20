package fuseuring

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

const uringParam = "/sys/module/fuse/parameters/enable_uring"

// setUring sets the kernel's enable_uring for the test and puts it back after.
func setUring(t *testing.T, on bool) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting FUSE by hand needs root")
	}
	old, err := os.ReadFile(uringParam)
	if err != nil {
		t.Skipf("this kernel has no FUSE over io_uring (%v)", err)
	}
	want := "N"
	if on {
		want = "Y"
	}
	if err := os.WriteFile(uringParam, []byte(want), 0); err != nil {
		t.Fatalf("setting %s to %s: %v", uringParam, want, err)
	}
	t.Cleanup(func() { os.WriteFile(uringParam, old, 0) })
}

func mount(t *testing.T, o Options) (*Server, string) {
	t.Helper()
	mnt := t.TempDir()
	s, err := Mount(mnt, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s, mnt
}

// statTree checks what stat says of the fixed tree: f<i> a regular file of size i, nothing else.
func statTree(t *testing.T, mnt string, files, rounds int) {
	t.Helper()
	for r := range rounds {
		for i := range files {
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(mnt, "f"+itoa(i)), &st); err != nil {
				t.Fatalf("round %d: stat f%d: %v", r, i, err)
			}
			if st.Size != int64(i) || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Ino != uint64(i)+2 {
				t.Fatalf("stat f%d: size %d mode %o ino %d, want size %d, a regular file, ino %d", i, st.Size, st.Mode, st.Ino, i, i+2)
			}
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(mnt, "f"+itoa(files)), &st); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("stat f%d (past the tree): %v, want ENOENT", files, err)
	}
}

func itoa(i int) string { return string(appendInt(nil, i)) }

func appendInt(b []byte, i int) []byte {
	if i >= 10 {
		b = appendInt(b, i/10)
	}
	return append(b, byte('0'+i%10))
}

// With the kernel's FUSE over io_uring on, every LOOKUP and GETATTR of a stat loop is
// answered through the rings, none through /dev/fuse: handled on the queues' threads, or
// on goroutines of their own that hand their answers back (Workers).
func TestStatOverIoUring(t *testing.T) {
	setUring(t, true)
	for _, workers := range []bool{false, true} {
		s, mnt := mount(t, Options{Files: 50, Transport: Uring, Workers: workers, Entries: 4})
		if s.Transport() != Uring {
			t.Fatalf("workers %v: transport %v, want io_uring", workers, s.Transport())
		}
		ring0, dev0 := s.Requests()
		statTree(t, mnt, 50, 3)
		ring1, dev1 := s.Requests()
		// entry and attribute timeouts are 0: every stat is a LOOKUP and a GETATTR
		if ring1-ring0 < 150 {
			t.Errorf("workers %v: %d requests through the rings for 150 stats, want at least 150", workers, ring1-ring0)
		}
		if dev1-dev0 > 15 { // a FORGET or two may come through /dev/fuse
			t.Errorf("workers %v: %d requests through /dev/fuse during the stats, want (almost) none", workers, dev1-dev0)
		}
	}
}

// A kernel that does not offer FUSE over io_uring (enable_uring off) is served over /dev/fuse.
func TestFallsBackToDevFuse(t *testing.T) {
	setUring(t, false)
	s, mnt := mount(t, Options{Files: 20, Transport: Uring})
	if s.Transport() != Dev {
		t.Fatalf("transport %v with enable_uring off, want /dev/fuse", s.Transport())
	}
	statTree(t, mnt, 20, 2)
	if ring, dev := s.Requests(); ring != 0 || dev < 40 {
		t.Errorf("requests: %d through rings, %d through /dev/fuse; want 0 and at least 40", ring, dev)
	}
}
