package cachestore

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
)

// A file whose name was removed while open is kept by the namespace server under its hidden
// name (cache.UnlinkedPath) until its last close: a server whose first I/O of it comes after
// the removal opens it there, and still checks it is the file named (ESTALE otherwise).
func TestOpenAfterUnlinkFindsTheHiddenName(t *testing.T) {
	pfs, door := newPFS(t)
	must(t, os.Mkdir(filepath.Join(pfs, "d"), 0o755))
	ref := writePFS(t, pfs, "d/f", []byte("before"))
	hidden := cache.UnlinkedPath(ref.Path, ref.Key.Ino)
	if hidden != "d/"+cache.UnlinkedName(ref.Key.Ino) {
		t.Fatalf("hidden path %q", hidden)
	}
	must(t, os.Rename(filepath.Join(pfs, ref.Path), filepath.Join(pfs, hidden)))
	s := newStore(t, testConfig())
	f, err := s.OpenFile(door, ref, true)
	if err != nil {
		t.Fatalf("open of a file renamed to its hidden name: %v", err)
	}
	writeAll(t, f, []byte("after!"), 0, 6)
	must(t, f.Close())
	must(t, s.Truncate(door, ref, 3))
	drain(t, s)
	if got := readPFS(t, pfs, hidden); !bytes.Equal(got, []byte("aft")) {
		t.Errorf("the hidden file holds %q", got)
	}
	// Another file at the hidden name is not the file named.
	must(t, os.Remove(filepath.Join(pfs, hidden)))
	must(t, os.WriteFile(filepath.Join(pfs, hidden), []byte("other"), 0o644))
	if _, err := s.OpenFile(door, ref, false); err != syscall.ESTALE {
		t.Errorf("open with another file at the hidden name: %v, want ESTALE", err)
	}
	// Neither name: ENOENT, as before.
	must(t, os.Remove(filepath.Join(pfs, hidden)))
	if _, err := s.OpenFile(door, ref, false); err != syscall.ENOENT {
		t.Errorf("open of a file gone: %v, want ENOENT", err)
	}
}
