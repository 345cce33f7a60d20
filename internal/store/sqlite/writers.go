package sqlite

import (
	"context"
	"sync"

	"github.com/spillway-hpc/spillway/internal/store"
)

// writers gives the write transactions their turns, one at a time (SQLite serializes
// writers anyway; taking turns here avoids SQLITE_BUSY). A background transaction (the
// executor's: store.Background) lets the requests' transactions waiting beside it go first,
// up to yieldLimit of them while it waits: a request that records something (a
// libdatawarp call, a heartbeat) waits for at most the transaction under way, not for a
// queue of the executor's, and the executor still gets its turn under a steady stream of
// requests. With yieldLimit 0 turns are taken in arrival order (about: Go's mutex).
type writers struct {
	mu         sync.Mutex
	cond       *sync.Cond
	busy       bool
	waiting    int    // requests' transactions waiting for their turn
	granted    uint64 // turns given to requests' transactions so far
	yieldLimit uint64
}

func newWriters() *writers {
	w := &writers{}
	w.cond = sync.NewCond(&w.mu)
	return w
}

// setYieldLimit sets how many requests' transactions a waiting background one lets go first.
func (w *writers) setYieldLimit(n int) {
	w.mu.Lock()
	w.yieldLimit = uint64(max(n, 0))
	w.mu.Unlock()
}

// lock waits for ctx's turn to write. A waiter wakes on every turn's end, so ctx's end is
// seen then (a turn lasts one transaction).
func (w *writers) lock(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !store.IsBackground(ctx) {
		w.waiting++
		for w.busy {
			w.cond.Wait()
		}
		w.waiting--
		w.granted++
		w.busy = true
		return nil
	}
	since := w.granted
	for w.busy || (w.waiting > 0 && w.granted-since < w.yieldLimit) {
		if err := ctx.Err(); err != nil {
			return err
		}
		w.cond.Wait()
	}
	w.busy = true
	return nil
}

func (w *writers) unlock() {
	w.mu.Lock()
	w.busy = false
	w.mu.Unlock()
	w.cond.Broadcast()
}
