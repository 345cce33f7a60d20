package server

// The write window's arithmetic (DataWarp's write protection, spec §5.3), pure: no clock, no
// lock. A fragment may take limit bytes of writes within any `length` of time; the window is
// kept as WindowBuckets buckets of length/WindowBuckets each, so a write stops counting
// between length and length+length/WindowBuckets after it was made (the granularity
// docs/decisions.md states).

// WindowBuckets is how many buckets a write window is cut into.
const WindowBuckets = 60

// window counts the bytes written in the last WindowBuckets buckets. The zero value counts
// nothing; bucket numbers are absolute (time since the Unix epoch divided by the bucket's
// width), so a window saved and restored after a restart goes on where it was.
type window struct {
	width int64 // nanoseconds per bucket; 0: no window
	slot  [WindowBuckets]windowSlot
	peak  uint64 // the most the window ever held (DataWarp's max_window_write)
}

type windowSlot struct {
	Bucket int64  `json:"bucket"` // which bucket the bytes belong to
	Bytes  uint64 `json:"bytes"`
}

// newWindow returns a window of length nanoseconds (rounded up to whole buckets of at least
// a millisecond).
func newWindow(length int64) window {
	if length <= 0 {
		return window{}
	}
	width := max((length+WindowBuckets-1)/WindowBuckets, int64(1e6))
	return window{width: width}
}

// add counts n bytes written at now (Unix nanoseconds) and returns the window's sum after it.
func (w *window) add(n uint64, now int64) uint64 {
	if w.width == 0 {
		return 0
	}
	b := now / w.width
	s := &w.slot[b%WindowBuckets]
	if s.Bucket != b {
		*s = windowSlot{Bucket: b}
	}
	s.Bytes += n
	sum := w.sum(now)
	w.peak = max(w.peak, sum)
	return sum
}

// sum is what was written within the window ending at now.
func (w *window) sum(now int64) uint64 {
	if w.width == 0 {
		return 0
	}
	b := now / w.width
	var total uint64
	for _, s := range w.slot {
		if s.Bucket > b-WindowBuckets && s.Bucket <= b {
			total += s.Bytes
		}
	}
	return total
}

// coolsAt is when (Unix nanoseconds) the window's sum falls below limit if nothing more is
// written: the end of the oldest bucket whose expiry brings it there. It is now when the sum
// is already below.
func (w *window) coolsAt(limit uint64, now int64) int64 {
	sum := w.sum(now)
	if w.width == 0 || sum < limit {
		return now
	}
	b := now / w.width
	for old := b - WindowBuckets + 1; old <= b; old++ {
		s := w.slot[old%WindowBuckets]
		if s.Bucket == old {
			sum -= s.Bytes
		}
		if sum < limit {
			return (old + WindowBuckets) * w.width // when bucket old leaves the window
		}
	}
	return (b + WindowBuckets) * w.width
}
