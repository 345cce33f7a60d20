package mount

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// A node shows its own processes every byte they wrote and closed: four writers of one
// striped file (ior-hard's interleaved transfers) close it, and at once its size is all they
// wrote and every transfer reads back. Before, the writers' size reports at close overlapped:
// the metadata server took a smaller one first, but its reply came back last and was kept
// (leased) as the file's attributes, and the next stat or read (the kernel asks at every
// buffered read) saw a transfer less — on about 1 round in 30.
func TestOwnWritesNeverShrinkAfterClose(t *testing.T) {
	in := newStripedInstance(t, 64*mib)
	m := in.mountAt(t, "cn1")
	const ranks, segs, xfer, rounds = 4, 6, 47008, 150
	want := int64(ranks * segs * xfer)
	failed := 0
	for round := 0; round < rounds; round++ {
		p := filepath.Join(m.Path(), fmt.Sprintf("shared%d", round))
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for r := 0; r < ranks; r++ {
			wg.Add(1)
			go func(r int) {
				defer wg.Done()
				f, err := os.OpenFile(p, os.O_RDWR, 0)
				if err != nil {
					t.Error(err)
					return
				}
				b := make([]byte, xfer)
				for s := 0; s < segs; s++ {
					if _, err := f.WriteAt(b, int64((s*ranks+r)*xfer)); err != nil {
						t.Error(err)
						break
					}
				}
				if err := f.Close(); err != nil {
					t.Error(err)
				}
			}(r)
		}
		wg.Wait()
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() != want {
			failed++
			t.Errorf("round %d: stat after close: %d bytes, want %d", round, st.Size(), want)
			continue
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, xfer)
		for off := int64(0); off < want; off += xfer {
			if _, err := f.ReadAt(b, off); err != nil {
				failed++
				t.Errorf("round %d: read at %d after close: %v", round, off, err)
				break
			}
		}
		f.Close()
		os.Remove(p)
		if failed > 5 {
			t.Fatalf("%d of %d rounds failed", failed, round+1)
		}
	}
}
