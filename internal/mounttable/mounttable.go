// Package mounttable reads the kernel's mount table (/proc/self/mountinfo): which mounts are
// where, of which type. Apart from package warpfs/mount, which mounts and unmounts, so that
// the commands that only look (dwcli stage, libdatawarp's helpers) link no FUSE code.
package mounttable

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// SpillwayFSType is the type Spillway's FUSE mounts carry in the mount table ("fuse." and
// the subtype package warpfs/mount mounts them with).
const SpillwayFSType = "fuse.spillway"

// Entry is one line of /proc/self/mountinfo.
type Entry struct {
	Major, Minor uint32 // device of the mounted file system; for FUSE, minor is the fusectl connection
	MountPoint   string
	FSType       string
	Source       string
}

// At returns the mounts whose mount point is path, bottom first (the last is the one
// a lookup of path reaches).
func At(path string) ([]Entry, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cannot read the mount table: %w", err)
	}
	var found []Entry
	scanner := bufio.NewScanner(bytes.NewReader(data))
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	for scanner.Scan() {
		e, ok := ParseLine(scanner.Text())
		if ok && e.MountPoint == path {
			found = append(found, e)
		}
	}
	return found, scanner.Err()
}

// ParseLine reads "36 35 0:53 / /mnt rw,nosuid - fuse.spillway I42-0 rw,user_id=0".
func ParseLine(line string) (Entry, bool) {
	fields := strings.Fields(line)
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if len(fields) < 5 || sep < 0 || sep+2 >= len(fields) {
		return Entry{}, false
	}
	majmin := strings.SplitN(fields[2], ":", 2)
	if len(majmin) != 2 {
		return Entry{}, false
	}
	major, err1 := strconv.ParseUint(majmin[0], 10, 32)
	minor, err2 := strconv.ParseUint(majmin[1], 10, 32)
	if err1 != nil || err2 != nil {
		return Entry{}, false
	}
	return Entry{
		Major:      uint32(major),
		Minor:      uint32(minor),
		MountPoint: Unescape(fields[4]),
		FSType:     fields[sep+1],
		Source:     Unescape(fields[sep+2]),
	}, true
}

// Unescape undoes the kernel's octal escapes (\040 for a space, \011, \012, \134).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// pathState is what a bounded lstat of a mount path found.

// SpillwayMountPoints lists the mount points of Spillway's FUSE mounts (type fuse.spillway) this
// process sees, from /proc/self/mountinfo: what libdatawarp needs to find the instance a path
// is in.
func SpillwayMountPoints() ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cannot read the mount table: %w", err)
	}
	var points []string
	scanner := bufio.NewScanner(bytes.NewReader(data))
	scanner.Buffer(make([]byte, 64<<10), 1<<20)
	for scanner.Scan() {
		if e, ok := ParseLine(scanner.Text()); ok && e.FSType == SpillwayFSType {
			points = append(points, e.MountPoint)
		}
	}
	return points, scanner.Err()
}
