package cachestore

import (
	"sync"

	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
)

// punchQueue carries out evictions (punch a hole) and drops (empty the object) in the order
// the core decided them, on one goroutine, after the log records that allowed them are on
// disk. Any other I/O on objects first waits for the punches queued before it (waitQueued):
// otherwise a punch decided before a write could land after the write's data and erase it.
type punchQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	jobs   []punchJob
	queued uint64 // tickets handed out
	done   uint64 // tickets carried out, in order
	closed bool
}

type punchJob struct {
	ticket  uint64
	logPos  uint64 // the log must be on disk up to here first
	actions []cache.Action
}

func newPunchQueue() *punchQueue {
	q := &punchQueue{}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// push queues actions (called under the store's lock, so tickets follow the core's order).
func (q *punchQueue) push(logPos uint64, actions []cache.Action) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queued++
	q.jobs = append(q.jobs, punchJob{ticket: q.queued, logPos: logPos, actions: actions})
	q.cond.Broadcast()
}

// waitQueued returns once every punch queued so far is carried out.
func (q *punchQueue) waitQueued() {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.queued
	for q.done < t && !q.closed {
		q.cond.Wait()
	}
}

// run carries out the jobs until close; do is called outside the queue's lock.
func (q *punchQueue) run(do func(punchJob)) {
	for {
		q.mu.Lock()
		for len(q.jobs) == 0 && !q.closed {
			q.cond.Wait()
		}
		if len(q.jobs) == 0 {
			q.mu.Unlock()
			return
		}
		j := q.jobs[0]
		q.jobs = q.jobs[1:]
		q.mu.Unlock()
		do(j)
		q.mu.Lock()
		q.done = j.ticket
		q.cond.Broadcast()
		q.mu.Unlock()
	}
}

// close lets run finish the queued jobs and return.
func (q *punchQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}
