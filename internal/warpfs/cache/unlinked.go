package cache

import (
	"path"
	"strconv"
	"strings"
)

// A PFS file of a cache instance whose name is removed (unlink, or a rename over it) while
// the instance has it open keeps a hidden name until its last close, as NFS's "silly rename":
// the namespace server renames it to UnlinkedName(ino) in the same directory instead of
// removing it, and removes that name at the last release. The storage servers, which open a
// file's PFS path when its first I/O reaches them, look for that name when the path is gone
// (checking the inode, as always). The namespace hides these names; the PFS shows them.

// UnlinkedPrefix begins every hidden name.
const UnlinkedPrefix = ".spillway-unlinked-"

// UnlinkedName is the hidden name of the removed file of inode ino.
func UnlinkedName(ino uint64) string { return UnlinkedPrefix + strconv.FormatUint(ino, 16) }

// IsUnlinkedName says whether the last component of p is a hidden name.
func IsUnlinkedName(p string) bool { return strings.HasPrefix(path.Base(p), UnlinkedPrefix) }

// UnlinkedPath is the hidden path, in the directory of the PFS path p ("" or a
// slash-separated path relative to the instance's directory), of the removed file of inode
// ino.
func UnlinkedPath(p string, ino uint64) string {
	dir := path.Dir(p)
	if dir == "." || dir == "/" || dir == "" {
		return UnlinkedName(ino)
	}
	return dir + "/" + UnlinkedName(ino)
}
