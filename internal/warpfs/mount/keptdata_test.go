package mount

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A file another node wrote is read from the servers once, and then from this node's page
// cache at every open for reading (FOPEN_KEEP_CACHE), for as long as nobody changed it: a
// change made elsewhere while this node holds the file's lease drops the pages before it is
// acknowledged; one made after the lease ran out (nobody told this node) is noticed at the
// next open by the file's change time; this node's own writes drop them too, once.
func TestDataKeptAcrossOpens(t *testing.T) {
	scrape := serveMetrics(t)
	// Bytes the servers read for mounts, and the opens that kept the pages: the machine's
	// kernel may evict pages now and then (this one runs DAMON's proactive reclaim), which
	// are read again.
	reads := func() float64 {
		return scrape().Samples[`spillway_warpfs_read_bytes_total{transport="remote"}`]
	}
	const lease = time.Second
	for _, p := range coherencePairs {
		t.Run(p.name, func(t *testing.T) {
			_, a, b, mb := mountPairB(t, p, lease)
			kept := func() int64 { return mb.backend.kept.Load() }
			fa, fb := filepath.Join(a, "f"), filepath.Join(b, "f")
			const size = 200 << 10 // four stripes
			content := func(fill byte) []byte { return bytes.Repeat([]byte{fill}, size) }
			read := func(want []byte, why string) {
				t.Helper()
				got, err := os.ReadFile(fb)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%s: b read %d bytes starting %q, want %d of %q", why, len(got), got[:min(len(got), 1)], len(want), want[:1])
				}
			}
			if err := os.WriteFile(fa, content('1'), 0o644); err != nil {
				t.Fatal(err)
			}
			read(content('1'), "written on a")
			// Let a's release land (a co-located writer's release tells b again) and b's lease
			// run out; what b reads from here on is kept.
			time.Sleep(lease + lease/2)
			read(content('1'), "read again")
			before, keptBefore := reads(), kept()
			for i := 0; i < 5; i++ {
				read(content('1'), "read again")
			}
			// An open at the very end of b's lease may drop the pages once or twice (the
			// kernel did not ask again yet, or asks now); the kernel may evict a page.
			if n, k := reads()-before, kept()-keptBefore; k < 3 || n >= 3*size {
				t.Errorf("5 more opens and reads of an unchanged file of %d bytes: %d kept the pages, %.0f bytes read from the servers; want them kept", size, k, n)
			}

			// The lease runs out, nothing changes: the pages are still good (the file's change
			// time says so).
			time.Sleep(lease + lease/2)
			keptBefore = kept()
			read(content('1'), "read after b's lease ran out, unchanged")
			if k := kept() - keptBefore; k != 1 {
				t.Errorf("the open after b's lease ran out, of a file nobody changed, kept the pages %d times, want 1", k)
			}

			// Changed on a while b holds the lease: b is told, and reads the new bytes.
			read(content('1'), "read again")
			if err := os.WriteFile(fa, content('2'), 0o644); err != nil {
				t.Fatal(err)
			}
			read(content('2'), "rewritten on a within b's lease")

			// The lease runs out, a changes the file (nobody tells b) and puts its
			// modification time back: the size and mtime the kernel checks are the same, the
			// change time is not.
			time.Sleep(lease + lease/2)
			st, err := os.Stat(fa)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(fa, content('3'), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chtimes(fa, st.ModTime(), st.ModTime()); err != nil {
				t.Fatal(err)
			}
			read(content('3'), "rewritten on a after b's lease ran out, same size and mtime")

			// b's own writes, through a descriptor opened only for writing (which bypasses
			// the page cache).
			f, err := os.OpenFile(fb, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(content('4')); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			read(content('4'), "rewritten on b")
			// The writer's release (which the kernel sends after close, later under load) ends
			// the drop of a reader opened before it: a later open keeps the pages.
			keptBefore = kept()
			for i := 0; i < 20 && kept() == keptBefore; i++ {
				time.Sleep(50 * time.Millisecond)
				read(content('4'), "read again after b's own write")
			}
			if kept() == keptBefore {
				t.Errorf("20 opens for reading after b's own write (and its release) never kept the pages")
			}
		})
	}
}

// A storage server restarted under two mounts: pages a mount kept are dropped at its next
// open after another mount's change, even one that leaves the size and times as they were.
func TestServerRestartDropsKeptData(t *testing.T) {
	rs := newRestartableServer(t, "keptdata")
	mpA, mpB := rs.mp+"-a", rs.mp+"-b"
	mount(t, Spec{MountPath: mpA, Remote: &Remote{Address: rs.addr, Token: testToken, Client: "a", NamespaceID: 1, InstanceID: 3, Limits: rs.limits}, Logger: quietLogger(t)})
	mount(t, Spec{MountPath: mpB, Remote: &Remote{Address: rs.addr, Token: testToken, Client: "b", NamespaceID: 1, InstanceID: 3, Limits: rs.limits}, Logger: quietLogger(t)})
	a, b := filepath.Join(mpA, "f"), filepath.Join(mpB, "f")
	if err := os.WriteFile(a, []byte("before"), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if got, err := os.ReadFile(b); err != nil || string(got) != "before" {
			t.Fatalf("b reads %q (%v), want \"before\"", got, err)
		}
	}
	st, err := os.Stat(a)
	if err != nil {
		t.Fatal(err)
	}
	rs.stop()
	rs.start()
	if err := os.WriteFile(a, []byte("after!"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(a, st.ModTime(), st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(b); err != nil || string(got) != "after!" {
		t.Errorf("after the restart and a's change, b reads %q (%v), want \"after!\"", got, err)
	}
}
