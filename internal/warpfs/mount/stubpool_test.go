package mount

import (
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// The pool of files made ahead gives each key's files in the order they came, only those of
// the connection they were made on (a new connection's replace them), takes back one not
// used, asks for more before a key runs out, and keeps at most proto.MaxStubs files and
// maxStubKeys keys, dropping the oldest keys first.
func TestStubPool(t *testing.T) {
	var p stubPool
	a, b := stubKey{dir: 1, uid: 5, gid: 5, mode: 0o644}, stubKey{dir: 2, uid: 5, gid: 5, mode: 0o644}
	if _, _, _, ok, low := p.take(a); ok || !low {
		t.Fatalf("an empty pool gave a file (%v) or did not ask for more (%v)", ok, low)
	}
	p.mu.Lock()
	p.addLocked(a, 1, proto.Attr{Mode: 0o100644}, []uint64{10, 11, 12})
	p.next[a] = 2
	p.mu.Unlock()
	ino, gen, attr, ok, low := p.take(a)
	if !ok || ino != 10 || gen != 1 || attr.Mode != 0o100644 || low {
		t.Fatalf("take: %d gen %d %o ok %v low %v; want 10 of generation 1, enough left", ino, gen, attr.Mode, ok, low)
	}
	p.giveBack(a, ino, gen)
	if ino, _, _, _, _ := p.take(a); ino != 10 {
		t.Fatalf("after giveBack, take gave %d, want 10 again", ino)
	}
	if _, _, _, _, low := p.take(a); !low {
		t.Error("one file left of a batch of 2: not asked for more")
	}
	if _, _, _, ok, _ := p.take(b); ok {
		t.Error("another directory's key took a's file")
	}
	p.mu.Lock()
	p.addLocked(a, 2, proto.Attr{}, []uint64{20}) // a new connection: 12 went with the old one
	held := p.held
	p.mu.Unlock()
	if ino, gen, _, _, _ := p.take(a); ino != 20 || gen != 2 || held != 1 {
		t.Fatalf("after a reconnection: %d of generation %d (%d held), want 20 of generation 2, 1 held", ino, gen, held)
	}
	p.giveBack(a, 12, 1) // of the old connection: not taken back
	if _, _, _, ok, _ := p.take(a); ok {
		t.Error("a file of an earlier connection was taken back")
	}

	var q stubPool
	q.mu.Lock()
	for k := 0; k <= maxStubKeys; k++ {
		q.addLocked(stubKey{dir: uint64(100 + k)}, 1, proto.Attr{}, []uint64{uint64(1000 + k)})
	}
	keys, files := len(q.order), q.held
	many := make([]uint64, proto.MaxStubs)
	for i := range many {
		many[i] = uint64(5000 + i)
	}
	q.addLocked(stubKey{dir: 99}, 1, proto.Attr{}, many)
	q.mu.Unlock()
	if keys != maxStubKeys || files != maxStubKeys {
		t.Errorf("%d keys, %d files after %d keys' batches; want at most %d", keys, files, maxStubKeys+1, maxStubKeys)
	}
	if _, _, _, ok, _ := q.take(stubKey{dir: 100}); ok {
		t.Error("the oldest key's files were kept past maxStubKeys")
	}
	if q.held != proto.MaxStubs {
		t.Errorf("%d files held, want %d (the newest key's batch alone)", q.held, proto.MaxStubs)
	}
}

// A key whose RESERVE was refused does not ask again for reserveRetry.
func TestStubPoolWaitsAfterARefusal(t *testing.T) {
	var p stubPool
	k := stubKey{dir: 7}
	p.refused = map[stubKey]time.Time{k: time.Now().Add(time.Hour)}
	if _, _, _, _, low := p.take(k); low {
		t.Error("a refused key asked again at once")
	}
	p.refused[k] = time.Now().Add(-time.Millisecond)
	if _, _, _, _, low := p.take(k); !low {
		t.Error("a key refused long ago did not ask again")
	}
}
