package server

// The sizes a cache namespace's writers reported (cachens.go): a mount reports how far its
// writes reached when it closes, flushes or syncs a file, and the data engine may not have
// written those bytes back to the PFS yet. The namespace server answers a regular file's
// size as max(PFS size, reported size); a report is kept only while it is larger than the
// PFS file, and goes when the PFS size reaches it, when the file is truncated through the
// burst buffer, or when its last name is removed through it.
//
// The table is shared by every session of the namespace on this server and kept in a file of
// the instance's SSD directory (Target.Dir/cacheSizesFile), rewritten (a new file renamed
// over it) at every change, so that a restarted server still answers the sizes of data not
// yet written back. Changes are rare: only reports beyond the PFS size make entries.

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// cacheSizesFile is the table's file in Target.Dir. Its lines are "dev ino size", decimal.
const cacheSizesFile = ".spillway-cache-sizes"

// sizeTable is a cache namespace's reported sizes.
type sizeTable struct {
	path string
	refs int // guarded by sizeTables.mu

	mu      sync.Mutex
	m       map[CacheFileKey]uint64
	pol     map[CacheFileKey]setPolicy // cachepolicy.go: in memory only
	lastGen uint64

	omu   sync.Mutex
	opens map[CacheFileKey]*openFile // cacheopens.go: in memory only
}

// sizeTables holds the tables in use, by file.
var sizeTables = struct {
	mu sync.Mutex
	m  map[string]*sizeTable
}{m: map[string]*sizeTable{}}

// acquireSizes returns the table of the namespace whose SSD directory is dir, loading it
// from its file the first time; releaseSizes ends the use.
func acquireSizes(dir string) (*sizeTable, error) {
	path := filepath.Join(filepath.Clean(dir), cacheSizesFile)
	sizeTables.mu.Lock()
	defer sizeTables.mu.Unlock()
	if t := sizeTables.m[path]; t != nil {
		t.refs++
		return t, nil
	}
	t := &sizeTable{path: path, m: map[CacheFileKey]uint64{}, refs: 1}
	if err := t.load(); err != nil {
		return nil, err
	}
	sizeTables.m[path] = t
	return t, nil
}

func releaseSizes(t *sizeTable) {
	if t == nil {
		return
	}
	sizeTables.mu.Lock()
	defer sizeTables.mu.Unlock()
	t.refs--
	if t.refs == 0 {
		delete(sizeTables.m, t.path)
	}
}

func (t *sizeTable) load() error {
	f, err := os.Open(t.path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		var k CacheFileKey
		var size uint64
		if _, err := fmt.Sscanf(sc.Text(), "%d %d %d", &k.Dev, &k.Ino, &size); err != nil {
			return fmt.Errorf("%s line %d: %v", t.path, line, err)
		}
		t.m[k] = size
	}
	return sc.Err()
}

// save writes the table (the caller holds t.mu).
func (t *sizeTable) save() syscall.Errno {
	tmp := t.path + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return errnoOf(err)
	}
	w := bufio.NewWriter(f)
	for k, size := range t.m {
		fmt.Fprintf(w, "%d %d %d\n", k.Dev, k.Ino, size)
	}
	err = w.Flush()
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, t.path)
	}
	if err != nil {
		os.Remove(tmp)
		return errnoOf(err)
	}
	return 0
}

// size is the size to answer for the file key whose PFS size is pfs; an entry the PFS
// reached goes.
func (t *sizeTable) size(key CacheFileKey, pfs uint64) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.m[key]
	if !ok {
		return pfs
	}
	if pfs >= r {
		delete(t.m, key)
		t.save()
		return pfs
	}
	return r
}

// report records that a writer's data reaches size in the file key, whose PFS size is pfs.
func (t *sizeTable) report(key CacheFileKey, size, pfs uint64) syscall.Errno {
	t.mu.Lock()
	defer t.mu.Unlock()
	if size <= pfs || size <= t.m[key] {
		return 0
	}
	t.m[key] = size
	return t.save()
}

// forget drops the report of the file key (truncated, or its last name gone).
func (t *sizeTable) forget(key CacheFileKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.m[key]; ok {
		delete(t.m, key)
		t.save()
	}
}

// len is the number of reports kept (tests).
func (t *sizeTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}
