// Package swaparea is a compute node's mechanism for swap areas on the burst buffer (#DW swap,
// issue 22): a file of the asked size with its space reserved, a loop device over it (direct
// I/O, so that swapped pages are not cached a second time in the page cache of the file), the
// swap signature, and swapon; swapoff within a bound, the loop device and the file going after
// it. This file holds its decisions (no I/O): the swap header, /proc/swaps and the loop
// device's counters read from text, and what a swapoff that has run for a while means.
package swaparea

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/mounttable"
)

// MinPages is the fewest pages a swap area may have: the kernel refuses smaller areas
// ("swapon: swap area needs to be at least 40 KiB").
const MinPages = 10

// magic ends the first page of a swap area (version 1, the only one Linux reads).
const magic = "SWAPSPACE2"

// Header is the first page of a swap area of size bytes (what mkswap writes): version 1, the
// last page's index, no bad pages, label and uuid as given (label up to 16 bytes). The rest of
// the area is not read by swapon.
func Header(size uint64, pageSize int, uuid [16]byte, label string) ([]byte, error) {
	if pageSize < 4096 || pageSize&(pageSize-1) != 0 {
		return nil, fmt.Errorf("page size %d is not a power of two of at least 4096", pageSize)
	}
	pages := size / uint64(pageSize)
	if pages < MinPages {
		return nil, fmt.Errorf("a swap area of %d bytes has %d pages of %d bytes; it needs at least %d", size, pages, pageSize, MinPages)
	}
	if pages-1 > 0xffffffff {
		return nil, fmt.Errorf("a swap area of %d bytes has more pages than a swap header can count (2^32)", size)
	}
	if len(label) > 16 {
		return nil, fmt.Errorf("swap label %q is longer than 16 bytes", label)
	}
	h := make([]byte, pageSize)
	// union swap_header.info: bootbits[1024], version, last_page, nr_badpages, uuid[16],
	// volume[16], all in the host's byte order (x86 and arm64 Linux: little-endian).
	binary.LittleEndian.PutUint32(h[1024:], 1)
	binary.LittleEndian.PutUint32(h[1028:], uint32(pages-1))
	binary.LittleEndian.PutUint32(h[1032:], 0)
	copy(h[1036:1052], uuid[:])
	copy(h[1052:1068], label)
	copy(h[pageSize-len(magic):], magic)
	return h, nil
}

// ValidHeader says whether page is a swap header for an area of size bytes (a file prepared
// before a crash is not prepared again).
func ValidHeader(page []byte, size uint64, pageSize int) bool {
	if len(page) < pageSize || string(page[pageSize-len(magic):pageSize]) != magic {
		return false
	}
	return binary.LittleEndian.Uint32(page[1024:]) == 1 &&
		uint64(binary.LittleEndian.Uint32(page[1028:])) == size/uint64(pageSize)-1
}

// SwapsEntry is one line of /proc/swaps.
type SwapsEntry struct {
	Filename string // the device or file, e.g. /dev/loop7
	Type     string // partition | file
	Size     uint64 // bytes
	Used     uint64 // bytes
	Priority int
}

// ParseSwaps reads /proc/swaps (sizes there are KiB). The kernel escapes blanks in names
// as \040 and so on; they are unescaped.
func ParseSwaps(text string) ([]SwapsEntry, error) {
	var out []SwapsEntry
	sc := bufio.NewScanner(strings.NewReader(text))
	first := true
	for sc.Scan() {
		line := sc.Text()
		if first {
			first = false
			if strings.HasPrefix(line, "Filename") {
				continue
			}
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) != 5 {
			return nil, fmt.Errorf("/proc/swaps: line %q has %d fields, not 5", line, len(f))
		}
		size, err1 := strconv.ParseUint(f[2], 10, 64)
		used, err2 := strconv.ParseUint(f[3], 10, 64)
		prio, err3 := strconv.Atoi(f[4])
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("/proc/swaps: line %q: size, used and priority must be numbers", line)
		}
		out = append(out, SwapsEntry{Filename: mounttable.Unescape(f[0]), Type: f[1], Size: size << 10, Used: used << 10, Priority: prio})
	}
	return out, sc.Err()
}

// Counters are what the kernel paged out to and in from an area: its loop device's sectors
// written and read (/sys/block/loopN/stat), in bytes.
type Counters struct {
	BytesWritten uint64
	BytesRead    uint64
}

// ParseBlockStat reads a block device's stat file (Documentation/block/stat.rst): field 3 is
// sectors read, field 7 sectors written, in 512-byte units whatever the device's block size.
func ParseBlockStat(text string) (Counters, error) {
	f := strings.Fields(text)
	if len(f) < 7 {
		return Counters{}, fmt.Errorf("block stat %q has %d fields, fewer than 7", strings.TrimSpace(text), len(f))
	}
	read, err1 := strconv.ParseUint(f[2], 10, 64)
	written, err2 := strconv.ParseUint(f[6], 10, 64)
	if err1 != nil || err2 != nil {
		return Counters{}, fmt.Errorf("block stat %q: sectors read and written must be numbers", strings.TrimSpace(text))
	}
	return Counters{BytesWritten: written * 512, BytesRead: read * 512}, nil
}

// SwaponFlags are swapon(2)'s flags for priority: -1 (or below) leaves the priority to the
// kernel, which gives each new area one below every area before it; 0..32767 is asked for.
// The kernel ignores a negative priority given with SWAP_FLAG_PREFER, so none is sent.
func SwaponFlags(priority int) (int, error) {
	const (
		flagPrefer   = 0x8000
		flagPrioMask = 0x7fff
	)
	switch {
	case priority < 0:
		return 0, nil
	case priority > flagPrioMask:
		return 0, fmt.Errorf("swap priority %d is above 32767", priority)
	}
	return flagPrefer | priority&flagPrioMask, nil
}

// Verdict is what a detach that has run for a while amounts to.
type Verdict int

const (
	Running  Verdict = iota // swapoff still brings pages back, within its bound
	Detached                // swapoff finished: the loop device and the file may go
	Failed                  // swapoff failed, or the bound passed: the area stays attached
)

// Judge decides a detach's state from what its swapoff did: finished (with err) or still
// running after elapsed, against bound. A swapoff past its bound is stopped by the caller (a
// killed swapoff gives the area back to the kernel, its pages where they were).
func Judge(finished bool, err error, elapsed, bound time.Duration) (Verdict, string) {
	switch {
	case finished && err == nil:
		return Detached, ""
	case finished:
		return Failed, err.Error()
	case bound > 0 && elapsed >= bound:
		return Failed, fmt.Sprintf("swapoff did not finish within %s ([swap] detach_timeout): the swapped pages could not all come back into memory in time; swapoff was stopped and the area stays attached, the node usable", bound)
	}
	return Running, ""
}
