package stage

import (
	"strconv"

	"golang.org/x/sys/unix"
)

// A file a stage-out write-protects keeps the mode it had in this extended attribute until the
// stage gives it back, so that a stage run again (its agent restarted between protecting the
// file and the controller learning of it) gives back the write bits the first run took,
// instead of taking the protected mode for the file's own.
const protectedModeXattr = "user.spillway.protected_mode"

// protect removes the write bits of the source open as in, whose mode is mode, and returns the
// mode to give back when the stage ends (0: none to give back). A file an earlier run of the
// stage protected gives back the mode that run saved.
func protect(in int, mode uint32) uint32 {
	mode &= 0o7777
	if saved, ok := savedProtectedMode(in); ok && saved&0o222 != 0 && saved&^0o222 == mode {
		return saved
	}
	if mode&0o222 == 0 {
		return 0
	}
	// Saved first: a crash between the two leaves a writable file with a stale record, which
	// the next protect overwrites; the other order could lose the write bits.
	value := []byte(strconv.FormatUint(uint64(mode), 8))
	if err := retryEINTR(func() error { return unix.Fsetxattr(in, protectedModeXattr, value, 0) }); err != nil && err != unix.ENOTSUP {
		return 0 // not protected rather than protected with no way back
	}
	if fchmod(in, mode&^0o222) != nil {
		unprotect(in, 0)
		return 0
	}
	return mode
}

// unprotect gives the source open as in the mode restore (when non-zero) unless its owner
// changed its mode since it was protected, and forgets the saved mode.
func unprotect(in int, restore uint32) error {
	var err error
	if restore != 0 {
		if cur, serr := fstat(in); serr == nil && cur.Mode&0o7777 == restore&^0o222 {
			err = fchmod(in, restore)
		}
	}
	retryEINTR(func() error { return unix.Fremovexattr(in, protectedModeXattr) })
	return err
}

// savedProtectedMode reads the mode protect saved on the file, if any.
func savedProtectedMode(in int) (uint32, bool) {
	buf := make([]byte, 16)
	var n int
	err := retryEINTR(func() (err error) { n, err = unix.Fgetxattr(in, protectedModeXattr, buf); return })
	if err != nil {
		return 0, false
	}
	m, err := strconv.ParseUint(string(buf[:n]), 8, 32)
	if err != nil || m&^0o7777 != 0 {
		return 0, false
	}
	return uint32(m), true
}

// retryEINTR calls fn again while a signal interrupts it (a remote mount answers an
// interrupted request with EINTR).
func retryEINTR(fn func() error) error {
	err := fn()
	for err == unix.EINTR {
		err = fn()
	}
	return err
}
