// Package cache is the pure core of a cache instance's storage server: one server's cache of
// the extents of the PFS files it holds stripes of (package stripe's map), and every decision
// about them — which extents to fetch, which to flush and when, which to evict, which request
// must wait and when it may go on — with no I/O, no goroutines, no locks and no clock. The I/O
// layer (the server's cache backend) serialises the calls, passes time in, carries out the
// Actions each call returns and reports their outcomes (FetchDone, FlushDone, SyncDone).
//
// The unit is the extent (Config.ExtentSize, 1 MiB by default): file bytes
// [k×ExtentSize, (k+1)×ExtentSize), always inside one stripe. Its states:
//
//	absent ──read miss, or a write that must read first──▶ fetching ──FetchDone ok──▶ clean
//	absent ──a write with nothing to read first──────────▶ dirty
//	clean ───write──▶ dirty ──flush──▶ flushing ──FlushDone ok──▶ clean
//	                    ▲                  │
//	                    └──────────────────┘  FlushDone failed (data kept, the error kept for
//	                                          the next sync), or ok after a write during it
//	fetching ──FetchDone failed──▶ absent (its requests fail EIO)
//	clean ──eviction, invalidation──▶ absent
//	any ──truncated away, unlinked (at the last close), Discard──▶ absent
//
// docs/architecture.md ("Cache instances: the extent state machine") explains the decisions.
package cache

import (
	"syscall"
	"time"
)

// Block is the allocation unit extents are charged in: an extent holding n bytes is charged
// n rounded up to a Block (the SSD object is sparse past them).
const Block = 4096

// DefaultExtentSize is the unit of caching (DataWarp's 1 MiB extents).
const DefaultExtentSize = 1 << 20

// FileKey is a PFS file's identity as the server saw it at open: (st_dev, st_ino). The cache is
// keyed by it, not by path, so a rename on the PFS does not lose the file's cached data.
type FileKey struct{ Dev, Ino uint64 }

// Handle is one open of a file (the server's file handle).
type Handle uint64

// WaiterID names a request the I/O layer holds until the cache wakes or fails it.
type WaiterID uint64

// Attrs is what the PFS said about a file (fstat): close-to-open coherence compares them.
type Attrs struct {
	Size         uint64
	Mtime, Ctime int64 // nanoseconds since the epoch
}

// State is an extent's state.
type State uint8

const (
	Absent   State = iota // not in the cache: its object region is a hole
	Fetching              // being read from the PFS (or queued to be)
	Clean                 // in the cache, the same as on the PFS
	Dirty                 // in the cache, newer than the PFS
	Flushing              // being written to the PFS
)

func (s State) String() string {
	return [...]string{"absent", "fetching", "clean", "dirty", "flushing"}[s]
}

// Policy is a file's cache policy: the instance's defaults (Config.Defaults) with the file's
// overrides (SetOverride) applied.
type Policy struct {
	// ModifiedThreshold: when a file's dirty bytes on this server pass it, they are flushed
	// down to half of it. 0: no per-file threshold (only the server's dirty watermarks).
	ModifiedThreshold uint64
	// ReadAhead: bytes of this server's part of a file read ahead of a sequential reader.
	ReadAhead uint64
	// SyncOnClose: close() returns after the file's dirty data is on the PFS and synced.
	SyncOnClose bool
	// SyncToPFS: fsync() returns after the file's dirty data is on the PFS and synced.
	SyncToPFS bool
}

// Override is a file's (or, resolved by the I/O layer, its directory's) policy settings;
// nil fields keep the instance's default.
type Override struct {
	ModifiedThreshold, ReadAhead *uint64
	SyncOnClose, SyncToPFS       *bool
}

// Apply is p with o's settings.
func (o Override) Apply(p Policy) Policy {
	if o.ModifiedThreshold != nil {
		p.ModifiedThreshold = *o.ModifiedThreshold
	}
	if o.ReadAhead != nil {
		p.ReadAhead = *o.ReadAhead
	}
	if o.SyncOnClose != nil {
		p.SyncOnClose = *o.SyncOnClose
	}
	if o.SyncToPFS != nil {
		p.SyncToPFS = *o.SyncToPFS
	}
	return p
}

// Config is one server's cache of one instance. Zero fields take the defaults (Defaults).
type Config struct {
	Server   int    // this server's index in the instance (stripe.Layout.Server)
	Capacity uint64 // bytes of the instance's capacity on this server (its fragment)

	ExtentSize uint64 // unit of caching; a multiple of Block dividing every file's stripe size

	// Write-back: when dirty bytes (dirty + flushing extents) pass DirtyHigh × Capacity,
	// flush the oldest until they are under DirtyLow × Capacity.
	DirtyHigh, DirtyLow float64
	// Eviction: when charged bytes pass EvictHigh × Capacity, evict least recently used clean
	// extents until they are under EvictLow × Capacity (headroom for writes).
	EvictHigh, EvictLow float64

	MaxFlushesInFlight int    // PFS writes at once
	MaxFetchesInFlight int    // PFS reads at once
	MaxIOBytes         uint64 // the longest PFS write or read made of coalesced extents
	MaxWaiters         int    // requests held at once; past it a request fails EAGAIN

	RetryMin, RetryMax time.Duration // backoff of a file's failed flushes

	// Defaults is the instance's policy, from its directive and the site's configuration
	// (DefaultPolicy is the spec's suggestion; the zero Policy reads nothing ahead).
	Defaults Policy
}

// Defaults fills c's zero fields.
func (c Config) withDefaults() Config {
	if c.ExtentSize == 0 {
		c.ExtentSize = DefaultExtentSize
	}
	if c.DirtyHigh == 0 {
		c.DirtyHigh, c.DirtyLow = 0.45, 0.20
	}
	if c.EvictHigh == 0 {
		c.EvictHigh, c.EvictLow = 0.95, 0.90
	}
	if c.MaxFlushesInFlight == 0 {
		c.MaxFlushesInFlight = 4
	}
	if c.MaxFetchesInFlight == 0 {
		c.MaxFetchesInFlight = 8
	}
	if c.MaxIOBytes == 0 {
		c.MaxIOBytes = 8 << 20
	}
	if c.MaxIOBytes < c.ExtentSize {
		c.MaxIOBytes = c.ExtentSize
	}
	if c.MaxWaiters == 0 {
		c.MaxWaiters = 1024
	}
	if c.RetryMin == 0 {
		c.RetryMin = time.Second
	}
	if c.RetryMax == 0 {
		c.RetryMax = time.Minute
	}
	return c
}

// DefaultPolicy is the spec's suggestion (../shared/specs/cache-and-swap.md §3.1): read-ahead
// 4 MiB, no per-file threshold, no sync to the PFS at close or fsync.
var DefaultPolicy = Policy{ReadAhead: 4 << 20}

// Range is a byte range of a file and where it is in the server's stripe object.
type Range struct {
	Off, Len uint64 // in the file (the PFS file's offsets)
	ObjOff   uint64 // in this server's stripe object of the file
}

// End is Off+Len.
func (r Range) End() uint64 { return r.Off + r.Len }

// ActionKind is what the I/O layer must do.
type ActionKind uint8

const (
	// ActFetch: read Range from the PFS file into the object, then FetchDone(ID, err). Bytes
	// past the PFS file's end stay a hole.
	ActFetch ActionKind = iota + 1
	// ActFlush: write Range from the object to the PFS file (one pwrite), then
	// FlushDone(ID, attrs after it, err).
	ActFlush
	// ActEvict: punch a hole over Range in the object (Len 0: from ObjOff to the end).
	ActEvict
	// ActDrop: remove the file's object: its cache data is gone (unlink, discard).
	ActDrop
	// ActSyncPFS: fsync the PFS file, then SyncDone(ID, err).
	ActSyncPFS
	// ActWake: Waiter's request is admitted now, as if its call had returned Ready.
	ActWake
	// ActFail: Waiter's request fails with Errno.
	ActFail
)

func (k ActionKind) String() string {
	return [...]string{"?", "fetch", "flush", "evict", "drop", "sync-pfs", "wake", "fail"}[k]
}

// Action is one thing for the I/O layer to do.
type Action struct {
	Kind   ActionKind
	ID     uint64 // ActFetch, ActFlush, ActSyncPFS: to pass back with the outcome
	File   FileKey
	Path   string // the PFS path the file was opened by (the I/O layer checks File on it)
	Range  Range
	Waiter WaiterID
	Errno  syscall.Errno
}

// Status is a call's answer.
type Status uint8

const (
	Ready Status = iota // go on now
	Wait                // hold the request until ActWake or ActFail for Result.Waiter
	Fail                // fail it with Result.Errno
)

// Result is the answer to Read, Write, Fsync, Close, Truncate, Drain.
type Result struct {
	Status Status
	Waiter WaiterID
	Errno  syscall.Errno
}

// Stats are the counters the server exports as metrics and accounting.
type Stats struct {
	Hits, Misses          uint64 // extents of reads served from the cache / fetched for them
	ReadAheadBytes        uint64 // bytes fetched ahead of sequential readers
	FetchedBytes          uint64 // bytes read from the PFS
	FlushedBytes          uint64 // bytes written to the PFS
	Evictions             uint64 // extents evicted
	EvictedBytes          uint64
	FlushErrors           uint64 // failed flushes
	FetchErrors           uint64
	DiscardedBytes        uint64 // dirty bytes dropped: unlink, Discard (teardown --hurry)
	ConflictBytes         uint64 // dirty bytes kept at an open that found the PFS file changed
	Waits                 uint64 // requests that had to wait
	Used, Dirty, Flushing uint64 // gauges: charged bytes, dirty (incl. flushing) bytes
}
