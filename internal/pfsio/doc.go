// Package pfsio is a cache instance's only door to the parallel file system (PFS): every
// access to a PFS directory (its root) is made with the job user's credentials — uid, gid and
// supplementary groups, a process holding only them — never as root on the user's behalf, so
// that the PFS's permissions, ACLs and quotas hold exactly as on the PFS, and no symbolic link
// of the user's leads a Spillway process out of the root or into another user's files.
//
// # Two ways in, one API
//
// Start runs a worker process per (root, user): a root agent starts it as root through
// package asuser, as the stage worker is started (non-dumpable first, then the user's groups,
// gid and uid on every thread, then the agent's check that it is sealed); it refuses to run
// with any capability left, and opens the root as the user, so a root the user cannot enter
// is EACCES at Start. Open serves the same API in-process, for a caller that already runs as
// the user (a one-machine home): no process, the same rules (tree.go), the same bounds.
//
// # Paths
//
// Paths are relative to the root, cleaned ("a//b/./c" is "a/b/c"; "" and "." are the root);
// an absolute path, a ".." component or a NUL is EINVAL before anything is looked up. The
// directories of a path are opened beneath the root with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS): a symbolic link anywhere in the middle of a
// path is ELOOP, atomically, whatever the user renames meanwhile. The last component is never
// followed: Lstat describes a link, Readlink reads it, OpenFile of a link is ELOOP (as
// O_NOFOLLOW), Chown and Utimens change the link itself, Chmod of a link is EOPNOTSUPP (as
// fchmodat2), Rename, Link and Unlink act on the name. Mounts below the root are crossed (only
// an administrator can make them in the worker's mount namespace).
//
// # Data: reads by descriptor, writes by the user's process
//
// OpenFile opens regular files only (a FIFO, socket or device is ENXIO, a directory EISDIR:
// nothing the cache moves, and a FIFO would block the door) and returns a *File. The file's
// descriptor, opened by the user's process, comes back to the caller with SCM_RIGHTS: reads
// (File.ReadAt) are pread on it, at the caller's speed — a descriptor opened as the user is a
// capability for that one file in that one mode, checked by the kernel when it was opened.
// Writes, truncation, fallocate and fsync go to the user's process instead (WriteAt moves the
// bytes through a pipe that the worker splices into the file, 2.5 GB/s for 8 MiB writes on
// the test VM): a root process writing through the same descriptor would pass the user's
// quotas and the reserved blocks (CAP_SYS_RESOURCE) and keep set-id bits a write must clear
// (CAP_FSETID). Namespace operations (ReadDir in batches of up to 128 names with their lstat
// attributes, Mkdir, Rename with renameat2's flags, the user.* extended attributes...) are
// requests to the worker.
//
// # Bounds
//
// Options.MaxInFlight (pfs.max_in_flight) requests are in flight at once, to the worker and
// in it; Options.RequestTimeout (pfs.request_timeout) bounds each, waiting for a slot
// included: past it the caller gets ETIMEDOUT. A request that timed out keeps its slot until
// the PFS answers it (a thread blocked in a hung PFS cannot be taken back), so a hung PFS
// holds at most MaxInFlight of the worker's threads and every later request times out in
// bounded time; a late reply to an open is closed. A closed door or a dead worker is ENOTCONN.
//
// # Lifetime
//
// The worker exits when its socket to the agent ends: the door closed, or the agent died (no
// PR_SET_PDEATHSIG: a credential change clears it, and it follows the forking thread, not the
// agent).
//
// # Wire
//
// Requests and replies are SOCK_SEQPACKET messages of one gob stream each way (names on a PFS
// are any bytes), a request id in each, replies in any order (proto.go).
package pfsio
