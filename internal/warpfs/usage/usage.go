// Package usage tracks how much of an instance's capacity is used on this node.
//
// One Tracker per instance is shared by everything that writes into the instance here — the
// FUSE mount (package mount) and the stage engine — so that together they never grow the
// instance beyond its capacity. "Used" is the sum of the footprints (Footprint) of the regular
// files, directories and symbolic links in the instance's namespaces: each one's apparent size
// or the space allocated to it, whichever is larger. A sparse file counts its full length, as
// a user expects when they compare `ls -l` with `df`; space allocated past a file's end
// (fallocate with FALLOC_FL_KEEP_SIZE), a directory's blocks and an inode's extended
// attributes count as what they take on disk. A file with several hard links counts once.
//
// Writers Reserve growth before they make it and Release what they give back (truncate,
// unlink of the last link, a failed or short write). After a restart Scan recomputes Used
// from the files themselves.
package usage

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/units"
)

// XFSFragmentOptions are the mount options of a fragment's own XFS file system (the agent's
// "xfs-loop" fragments). XFS preallocates blocks past the end of a file being extended
// (speculative preallocation, up to gigabytes for a large file, trimmed when it is closed)
// and counts them in st_blocks: charged, they could refuse an honest job's writes well short
// of its capacity. allocsize fixes that preallocation at 64 KiB per file being extended.
// Directory fragments on a host XFS should be mounted with it too (docs/config.md).
const XFSFragmentOptions = "allocsize=64k"

// FullError is the refusal of a reservation that would take an instance past its capacity.
// It wraps syscall.ENOSPC, so errors.Is(err, syscall.ENOSPC) holds and a FUSE server can
// return it to the kernel as is.
type FullError struct {
	Name      string // what the tracker counts, e.g. "instance 42"
	Requested uint64 // bytes the caller asked to add
	Used      uint64 // bytes in use when asked
	Capacity  uint64 // the instance's capacity
}

func (e *FullError) Error() string {
	return fmt.Sprintf("%s is full: adding %s would exceed its capacity (%s used of %s, %s free); "+
		"delete files from it or request a larger capacity (#DW jobdw capacity=...)",
		e.Name, units.FormatHuman(e.Requested), units.FormatHuman(e.Used),
		units.FormatHuman(e.Capacity), units.FormatHuman(e.Capacity-min(e.Used, e.Capacity)))
}

// Unwrap makes errors.Is(err, syscall.ENOSPC) true.
func (e *FullError) Unwrap() error { return syscall.ENOSPC }

// Tracker counts the bytes used in one instance against its capacity. It is safe for
// concurrent use.
type Tracker struct {
	name string

	mu       sync.Mutex
	capacity uint64
	used     uint64
	peak     uint64 // the most Used has been (reservations included)
}

// New returns a tracker for capacity bytes with nothing used. name appears in errors
// ("instance 42").
func New(name string, capacity uint64) *Tracker {
	return &Tracker{name: name, capacity: capacity}
}

// Name is what the tracker counts, as shown in its errors.
func (t *Tracker) Name() string { return t.name }

// Capacity is the instance's size in bytes.
func (t *Tracker) Capacity() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.capacity
}

// SetCapacity changes the capacity. Bytes already used stay used even if they now exceed it;
// only new growth is refused.
func (t *Tracker) SetCapacity(capacity uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.capacity = capacity
}

// Used is the number of bytes counted as used.
func (t *Tracker) Used() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.used
}

// Peak is the most bytes the tracker has counted as used at once since it was made
// (reservations of writes in flight included): DataWarp's capacity_max.
func (t *Tracker) Peak() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.peak
}

// Free is Capacity − Used, or 0 when more than the capacity is used.
func (t *Tracker) Free() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.freeLocked()
}

func (t *Tracker) freeLocked() uint64 {
	if t.used >= t.capacity {
		return 0
	}
	return t.capacity - t.used
}

// Over reports whether more than the capacity is counted as used: growth charged after the
// fact (Charge) took the instance past it.
func (t *Tracker) Over() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.used > t.capacity
}

// Reserve counts n more bytes as used, or refuses with a *FullError (wrapping
// syscall.ENOSPC) naming used and capacity if that would exceed the capacity. Reserving 0
// always succeeds.
func (t *Tracker) Reserve(n uint64) error {
	if n == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n > t.freeLocked() {
		return &FullError{Name: t.name, Requested: n, Used: t.used, Capacity: t.capacity}
	}
	t.used += n
	t.peak = max(t.peak, t.used)
	return nil
}

// ReserveUpTo counts as used as many of n bytes as fit (possibly 0) and returns that number.
// A writer uses it to fill the instance to the brim with a short write, as a full disk does.
func (t *Tracker) ReserveUpTo(n uint64) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	granted := min(n, t.freeLocked())
	t.used += granted
	t.peak = max(t.peak, t.used)
	return granted
}

// Charge counts n bytes as used even if that exceeds the capacity: for growth that has
// already happened and was not reserved (a file found larger than accounted for).
func (t *Tracker) Charge(n uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.used+n < t.used { // overflow: saturate rather than wrap
		t.used = ^uint64(0)
		t.peak = t.used
		return
	}
	t.used += n
	t.peak = max(t.peak, t.used)
}

// Release gives n bytes back. Releasing more than is used leaves 0 (accounting drift after
// files were changed behind the tracker's back is corrected by the next Scan).
func (t *Tracker) Release(n uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n >= t.used {
		t.used = 0
		return
	}
	t.used -= n
}

// Scan sets Used to the total footprint (Footprint) of what is under dirs, dirs themselves
// included (each inode counted once, however many hard links it has): the truth after an
// agent restart. It does not follow symbolic links. Call it when no writer is active on the
// instance — growth reserved while the scan runs may be counted twice or lost. On error Used
// is unchanged.
func (t *Tracker) Scan(dirs ...string) error {
	total, err := Charged(dirs...)
	if err != nil {
		return fmt.Errorf("%s: %w", t.name, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.used = total
	t.peak = max(t.peak, t.used)
	return nil
}

// Footprint is what one file system object is charged against its instance's capacity and
// the maximum file size: the larger of its apparent size and the bytes allocated to it
// (st_blocks × 512: data, blocks preallocated past its end, extent maps, extended
// attributes), for regular files, directories and symbolic links; 0 for other kinds (devices,
// FIFOs, sockets), which hold no data.
func Footprint(st *unix.Stat_t) uint64 {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG, unix.S_IFDIR, unix.S_IFLNK:
		return max(uint64(max(st.Size, 0)), uint64(max(st.Blocks, 0))*512)
	}
	return 0
}

// Charged is the total footprint (Footprint) of the regular files, directories and symbolic
// links under dirs, dirs themselves included, each inode once. Entries that vanish while it
// walks are skipped; any other error names the path.
func Charged(dirs ...string) (uint64, error) {
	type fileID struct{ dev, ino uint64 }
	seen := map[fileID]bool{} // only inodes with more than one link are remembered
	var total uint64
	for _, dir := range dirs {
		info, err := os.Stat(dir)
		if err != nil {
			return 0, fmt.Errorf("cannot scan namespace directory %s: %w; "+
				"check that the fragment still exists on this node", dir, err)
		}
		if !info.IsDir() {
			return 0, fmt.Errorf("cannot scan %s: it is not a directory; "+
				"pass the namespace root directories of the instance", dir)
		}
		err = filepath.WalkDir(dir, func(path string, entry fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed while we walked
				}
				return fmt.Errorf("cannot scan %s: %w", path, err)
			}
			var st unix.Stat_t
			if err := unix.Lstat(path, &st); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return fmt.Errorf("cannot stat %s: %w", path, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
				id := fileID{st.Dev, st.Ino}
				if seen[id] {
					return nil
				}
				seen[id] = true
			}
			total += Footprint(&st)
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	return total, nil
}

// Registry holds the trackers of the instances present on this node, keyed by instance id.
// It is safe for concurrent use.
type Registry struct {
	mu       sync.Mutex
	trackers map[int64]*Tracker
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{trackers: map[int64]*Tracker{}}
}

// Get returns the tracker of instance id, creating it with capacity if it does not exist
// (created reports which). If it exists with another capacity, the capacity is updated: the
// controller's word is the latest truth. A caller that creates a tracker for an instance that
// may already hold data (after an agent restart) should Scan it before writing.
func (r *Registry) Get(id int64, capacity uint64) (tracker *Tracker, created bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.trackers[id]; ok {
		if t.Capacity() != capacity {
			t.SetCapacity(capacity)
		}
		return t, false
	}
	t := New(fmt.Sprintf("instance %d", id), capacity)
	r.trackers[id] = t
	return t, true
}

// Lookup returns the tracker of instance id if there is one.
func (r *Registry) Lookup(id int64) (*Tracker, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.trackers[id]
	return t, ok
}

// Forget drops the tracker of instance id (the instance left this node). Holders of the
// tracker may keep using it; a later Get creates a fresh one.
func (r *Registry) Forget(id int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.trackers, id)
}

// IDs returns the ids of the instances tracked, in no particular order.
func (r *Registry) IDs() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]int64, 0, len(r.trackers))
	for id := range r.trackers {
		ids = append(ids, id)
	}
	return ids
}

// FallocateWorst bounds what an fallocate(2) of (mode, off, length) can do to a file of
// size bytes with allocated bytes allocated (st_blocks × 512), block being the file system's
// block size: worst is the most the file's footprint (Footprint) can be afterwards, not
// counting the few blocks of its extent map, and allocEnd the end of the range the call may
// allocate (0 when it only gives space back: PUNCH_HOLE, COLLAPSE_RANGE), which the maximum
// file size bounds whether or not the call keeps the file's size (FALLOC_FL_KEEP_SIZE).
// Inserting a range grows the file by its length; every other mode that allocates (0,
// KEEP_SIZE, ZERO_RANGE, UNSHARE_RANGE, and any the kernel adds) may allocate every block the
// range touches and make the file off+length long unless it keeps the size.
func FallocateWorst(mode uint32, off, length uint64, size int64, allocated, block uint64) (worst, allocEnd uint64) {
	before := max(uint64(max(size, 0)), allocated)
	switch {
	case mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_COLLAPSE_RANGE) != 0:
		return before, 0
	case mode&unix.FALLOC_FL_INSERT_RANGE != 0:
		return before + length, uint64(max(size, 0)) + length
	}
	if block == 0 {
		block = 4096
	}
	end := off + length
	touched := (end+block-1)/block*block - off/block*block // the blocks the range touches
	newSize := uint64(max(size, 0))
	if mode&unix.FALLOC_FL_KEEP_SIZE == 0 {
		newSize = max(newSize, end)
	}
	return max(newSize, allocated+touched, before), end
}
