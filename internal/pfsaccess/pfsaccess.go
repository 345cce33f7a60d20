// Package pfsaccess checks, with the calling process's own credentials, that a cache
// instance's PFS directory (#DW jobdw type=cache pfs=<dir>) exists, is a directory and can be
// entered. It is honest only in a process that runs as the job's user: a one-machine home's
// controller, `spillway run`. A system controller runs as a service user and cannot decide
// for the job's user; there the check that counts is made at setup on each storage node by
// the PFS door running as the user (internal/pfsio, the data-path integration of issue 20).
// It never uses root's view: a root process is refused rather than answered.
package pfsaccess

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Check reports why the process cannot use dir as a cache's PFS directory, or nil. The
// message starts with "pfs=<dir>: " so that callers can tie it to the directive.
func Check(dir string) error {
	if os.Geteuid() == 0 {
		return fmt.Errorf("pfs=%s: not checked as root: root's view says nothing of what the job's user may enter", dir)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("pfs=%s: %s; %s", dir, describe(err), fix(err))
	}
	defer unix.Close(fd)
	// Search (execute) permission on the directory itself, checked with the effective ids on
	// the descriptor just opened (not the path again, which may have changed).
	err = unix.Faccessat2(fd, "", unix.X_OK, unix.AT_EMPTY_PATH|unix.AT_EACCESS)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) {
		// Kernels before 5.8 have no faccessat2: ask through the descriptor's /proc link.
		err = unix.Faccessat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), unix.X_OK, unix.AT_EACCESS)
	}
	if err != nil {
		return fmt.Errorf("pfs=%s: you cannot enter this directory (%s); choose a directory you can cd into, or ask its owner for search (x) permission", dir, describe(err))
	}
	return nil
}

func describe(err error) string {
	switch {
	case errors.Is(err, unix.ENOENT):
		return "no such directory"
	case errors.Is(err, unix.ENOTDIR):
		return "not a directory"
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return "permission denied"
	}
	return err.Error()
}

func fix(err error) string {
	switch {
	case errors.Is(err, unix.ENOENT):
		return "create it on the PFS first (mkdir -p), or correct the path"
	case errors.Is(err, unix.ENOTDIR):
		return "pfs= names the directory to cache, not a file"
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return "a directory on the way to it cannot be searched by you; choose a directory you can cd into"
	}
	return "choose a directory on the PFS that you can cd into"
}
