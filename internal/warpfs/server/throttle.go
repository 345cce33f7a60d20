package server

import (
	"log/slog"
	"sync"
	"time"
)

// throttledLog logs a warning at most once per interval for each message, and says how many
// were not logged in between: anyone who can reach the port could otherwise fill the
// storage node's log with refusals.
type throttledLog struct {
	log      *slog.Logger
	interval time.Duration

	mu   sync.Mutex
	last map[string]*throttleState // by message; the messages are the server's own, a few
}

type throttleState struct {
	at         time.Time
	suppressed int
}

func newThrottledLog(log *slog.Logger, interval time.Duration) *throttledLog {
	return &throttledLog{log: log, interval: interval, last: map[string]*throttleState{}}
}

// warn logs msg unless it was logged less than an interval ago.
func (t *throttledLog) warn(msg string, args ...any) {
	now := time.Now()
	t.mu.Lock()
	st := t.last[msg]
	if st == nil {
		st = &throttleState{}
		t.last[msg] = st
	} else if now.Sub(st.at) < t.interval {
		st.suppressed++
		t.mu.Unlock()
		return
	}
	suppressed := st.suppressed
	st.at, st.suppressed = now, 0
	t.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "not_logged_since_last", suppressed)
	}
	t.log.Warn(msg, args...)
}
