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
// width), so a window saved and restored after a restart goes on where it was. It keeps a
// running total, so adding and asking cost the same whatever the number of buckets.
type window struct {
	width int64 // nanoseconds per bucket; 0: no window
	slot  [WindowBuckets]windowSlot
	cur   int64  // the latest bucket the window has moved to
	total uint64 // the sum of the slots of buckets (cur-WindowBuckets, cur]
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

// advance moves the window to bucket b, dropping the buckets that left it. Time going back
// (a clock stepped backwards) changes nothing.
func (w *window) advance(b int64) {
	if b <= w.cur {
		return
	}
	if b-w.cur >= WindowBuckets {
		w.slot = [WindowBuckets]windowSlot{}
		w.total = 0
	} else {
		for k := w.cur + 1; k <= b; k++ {
			s := &w.slot[k%WindowBuckets]
			w.total -= s.Bytes
			*s = windowSlot{}
		}
	}
	w.cur = b
}

// restore puts saved slots back (the window then moves on at the next add or sum, dropping
// what left it meanwhile) and returns their total.
func (w *window) restore(slots []windowSlot) uint64 {
	if w.width == 0 {
		return 0
	}
	w.slot, w.total, w.cur = [WindowBuckets]windowSlot{}, 0, 0
	for _, s := range slots {
		w.cur = max(w.cur, s.Bucket)
	}
	for _, s := range slots {
		if s.Bucket > w.cur-WindowBuckets && s.Bytes > 0 {
			w.slot[s.Bucket%WindowBuckets] = s
			w.total += s.Bytes
		}
	}
	return w.total
}

// add counts n bytes written at now (Unix nanoseconds) and returns the window's sum after it.
func (w *window) add(n uint64, now int64) uint64 {
	if w.width == 0 {
		return 0
	}
	w.advance(now / w.width)
	b := w.cur // a write at a time before the latest (the clock went back) counts in the latest
	s := &w.slot[b%WindowBuckets]
	if s.Bucket != b { // an empty slot: every slot is empty or of a bucket within the window
		*s = windowSlot{Bucket: b}
	}
	s.Bytes += n
	w.total += n
	w.peak = max(w.peak, w.total)
	return w.total
}

// sum is what was written within the window ending at now.
func (w *window) sum(now int64) uint64 {
	if w.width == 0 {
		return 0
	}
	w.advance(now / w.width)
	return w.total
}

// coolsAt is when (Unix nanoseconds) the window's sum falls below limit if nothing more is
// written: the end of the oldest bucket whose expiry brings it there. It is now when the sum
// is already below.
func (w *window) coolsAt(limit uint64, now int64) int64 {
	sum := w.sum(now)
	if w.width == 0 || sum < limit {
		return now
	}
	b := w.cur
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
