package cachestore

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// SyncToPFS puts a file's writes on the PFS whatever its policy; Closing does only with
// sync_on_close; an open carrying an older policy setting than one the store heard of does
// not undo it, a newer one replaces it, and an unlink forgets it.
func TestSyncToPFSAndPolicyGenerations(t *testing.T) {
	pfs, door := newPFS(t)
	s := newStore(t, testConfig())
	data := randomBytes(1, 3*testExtent+5)
	ref := writePFS(t, pfs, "f", nil)
	f, err := s.OpenFile(door, ref, true)
	must(t, err)
	writeAll(t, f, data, 0, 10000)
	must(t, f.Closing()) // the defaults: no sync on close
	if bytes.Equal(readPFS(t, pfs, "f"), data) {
		t.Fatal("written with the defaults, on the PFS before any sync")
	}
	must(t, f.SyncToPFS())
	if !bytes.Equal(readPFS(t, pfs, "f"), data) {
		t.Fatal("after SyncToPFS the PFS does not hold the data")
	}

	yes := true
	set := ref
	set.Override.SyncOnClose, set.OverrideGen = &yes, 5
	g, err := s.OpenFile(door, set, true)
	must(t, err)
	policy := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.c.Policy(ref.Key).SyncOnClose
	}
	if !policy() {
		t.Fatal("the policy set with the open is not the file's")
	}
	old, err := s.OpenFile(door, ref, false) // made before the setting: generation 0
	must(t, err)
	if !policy() {
		t.Error("an open carrying an older policy undid the newer one")
	}
	data2 := randomBytes(2, 2*testExtent)
	writeAll(t, g, data2, 0, 7000)
	must(t, g.Closing())
	if got := readPFS(t, pfs, "f"); !bytes.Equal(got[:len(data2)], data2) {
		t.Error("sync_on_close: Closing did not put the data on the PFS")
	}
	reset := ref
	reset.OverrideGen = 6 // back to the defaults, later
	h, err := s.OpenFile(door, reset, false)
	must(t, err)
	if policy() {
		t.Error("a newer setting (the defaults) did not replace the older")
	}
	for _, x := range []*File{f, g, old, h} {
		must(t, x.Close())
	}
	must(t, os.Remove(filepath.Join(pfs, "f"))) // the namespace server removes the name first
	s.Unlink(ref.Key)
	s.mu.Lock()
	n := len(s.policies)
	s.mu.Unlock()
	if n != 0 {
		t.Errorf("after the unlink the store keeps %d policies", n)
	}
}
