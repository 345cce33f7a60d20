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
// requests. Requests take their turns in their order of arrival; with yieldLimit 0 a
// waiting background transaction takes the next turn.
type writers struct {
	mu         sync.Mutex
	cond       *sync.Cond
	busy       bool
	waiting    int      // requests' transactions waiting for their turn
	tickets    uint64   // requests' tickets handed out: they go in their order
	granted    uint64   // turns given to requests' transactions so far (the ticket served)
	background []uint64 // the background transactions waiting: granted when each began
	yieldLimit uint64
}

// overdue reports whether a background transaction waiting has let yieldLimit requests go
// first: the next turn is its (the requests wait for it).
func (w *writers) overdue() bool {
	for _, since := range w.background {
		if w.granted-since >= w.yieldLimit {
			return true
		}
	}
	return false
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

// lock waits for ctx's turn to write. A request's transaction waits for its ticket whatever
// ctx says (a ticket given up would hold back every one behind it; a turn lasts one
// transaction); a background one gives up when ctx ends, seen at every turn's end.
func (w *writers) lock(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !store.IsBackground(ctx) {
		w.waiting++
		ticket := w.tickets
		w.tickets++
		for w.busy || w.overdue() || ticket != w.granted {
			w.cond.Wait()
		}
		w.waiting--
		w.granted++
		w.busy = true
		return nil
	}
	since := w.granted
	w.background = append(w.background, since)
	defer func() { // this one's entry (one of those with its since: any is as good)
		for i, s := range w.background {
			if s == since {
				w.background = append(w.background[:i], w.background[i+1:]...)
				break
			}
		}
		w.cond.Broadcast() // the requests an overdue entry held back
	}()
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
