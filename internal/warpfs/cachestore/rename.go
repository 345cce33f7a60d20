package cachestore

import (
	"path"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/pfsio"
)

// A file's PFS path is what the store learned at its last open (and, after a restart, what
// its log says). The namespace server renames files on the PFS itself, and a store hears of
// the new name only at the file's next open through it, which may never come: a job that
// writes a file, closes it and renames it (write to a temporary name, then rename: a common
// pattern), then ends, leaves dirty data whose path no longer names it. While the store holds
// the file open for writing that does not matter (the descriptor follows the file); once it
// must open the file again (after a restart, or a closed door) it would find nothing
// (ENOENT) or another file (ESTALE), and the data could never be flushed. movedFiles finds
// such a file by its inode number, under the door's root (the instance's PFS directory).

// movedFiles is an index of the regular files under a door's root, by inode number, walked
// when a lookup misses it (one walk answers every renamed file a drain looks for).
type movedFiles struct {
	mu   sync.Mutex // one walk at a time
	root string     // the door root the index is of
	ino  map[uint64]string
}

// find is the path (relative to the door's root) of the regular file with inode number ino,
// or "" if there is none (removed from the PFS, or unreadable to the door's user).
func (m *movedFiles) find(door *pfsio.Door, ino uint64) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.root == door.Root() {
		if p, ok := m.ino[ino]; ok {
			if st, err := door.Lstat(p); err == nil && st.Ino == ino {
				return p
			}
		}
	}
	m.root, m.ino = door.Root(), map[uint64]string{}
	m.walk(door, ".")
	return m.ino[ino]
}

func (m *movedFiles) walk(door *pfsio.Door, dir string) {
	var subdirs []string
	door.ReadDir(dir, func(entries []pfsio.Entry) error {
		for _, e := range entries {
			p := path.Join(dir, e.Name)
			switch e.Stat.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				m.ino[e.Stat.Ino] = p
			case unix.S_IFDIR:
				subdirs = append(subdirs, p)
			}
		}
		return nil
	})
	for _, d := range subdirs {
		m.walk(door, d)
	}
}
