package cachestore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/pfsio"
)

// dirtyAcrossRestart writes data into name through a store, closes it (its dirty state in
// its log) and returns the store's directory, the door and what the file holds.
func dirtyAcrossRestart(t *testing.T, pfs string, door *pfsio.Door, name string) (string, []byte) {
	t.Helper()
	ref := writePFS(t, pfs, name, nil)
	dir := t.TempDir()
	s, err := Open(Options{Dir: dir, Config: testConfig()})
	must(t, err)
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	data := randomBytes(31, 300_000)
	writeAll(t, f, data, 0, 64_000)
	must(t, f.Close())
	must(t, s.Close())
	return dir, data
}

// TestRenamedDirtyFileAfterRestart: a file written through the store, closed, then renamed
// on the PFS (by the namespace server: the store is not told) into a subdirectory, is
// flushed at its new path after a restart, found by its inode number; an unrelated new file
// at the old name is left alone.
func TestRenamedDirtyFileAfterRestart(t *testing.T) {
	pfs, door := newPFS(t)
	dir, data := dirtyAcrossRestart(t, pfs, door, "tmp.out")
	must(t, os.Mkdir(filepath.Join(pfs, "results"), 0o755))
	must(t, os.Rename(filepath.Join(pfs, "tmp.out"), filepath.Join(pfs, "results", "final.out")))
	must(t, os.WriteFile(filepath.Join(pfs, "tmp.out"), []byte("another file"), 0o644))

	s := openStore(t, dir, testConfig())
	s.SetDoor(func(string) (*pfsio.Door, error) { return door, nil })
	drain(t, s)
	if sum(readPFS(t, pfs, "results/final.out")) != sum(data) {
		t.Fatal("the renamed file does not hold what was written")
	}
	if got := string(readPFS(t, pfs, "tmp.out")); got != "another file" {
		t.Fatalf("the new file at the old name was written over: %q", got)
	}
}

// TestRemovedDirtyFileFailsDrain: a dirty file removed from the PFS by someone else cannot
// be flushed: Drain says so, naming it, instead of retrying for ever.
func TestRemovedDirtyFileFailsDrain(t *testing.T) {
	pfs, door := newPFS(t)
	dir, _ := dirtyAcrossRestart(t, pfs, door, "gone.out")
	must(t, os.Remove(filepath.Join(pfs, "gone.out")))
	s := openStore(t, dir, testConfig())
	s.SetDoor(func(string) (*pfsio.Door, error) { return door, nil })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var fe *FileError
	if err := s.Drain(ctx); !errors.As(err, &fe) || fe.Path != "gone.out" || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("Drain of a file removed from the PFS: %v, want a FileError naming gone.out, ENOENT", err)
	}
	if s.Stats().Dirty == 0 {
		t.Fatal("the data must be kept (a hurry discards it)")
	}
}
