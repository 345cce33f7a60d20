// Package loopdev attaches files to Linux loop devices: a fragment's XFS image (agent,
// agent.fragment_filesystem = "xfs-loop") and a compute node's swap area (swaparea).
package loopdev

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Major is the loop devices' block major number.
const Major = 7

const (
	loFlagsAutoclear = 4  // LO_FLAGS_AUTOCLEAR: the device frees itself when its last holder closes it
	loFlagsDirectIO  = 16 // LO_FLAGS_DIRECT_IO: the backing file's pages are not cached twice
	configureTries   = 20 // tries when another process takes the free device first
)

// Attach attaches the open file to a free loop device with direct I/O and
// LO_FLAGS_AUTOCLEAR, name recorded as its backing file's; it returns the device, open (the
// caller's hold: closing it frees the device once nothing else holds it), and its path.
func Attach(file int, name string) (int, string, error) {
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", &os.PathError{Op: "open", Path: "/dev/loop-control", Err: err}
	}
	defer unix.Close(ctl)
	var last error
	for try := 0; try < configureTries; try++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return -1, "", fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			// udev may not have made the node of a new device yet.
			last = &os.PathError{Op: "open", Path: dev, Err: err}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		cfg := unix.LoopConfig{Fd: uint32(file)}
		cfg.Info.Flags = loFlagsAutoclear | loFlagsDirectIO
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], name)
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if err == nil {
			return fd, dev, nil
		}
		unix.Close(fd)
		if !errors.Is(err, unix.EBUSY) {
			return -1, "", fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
		}
		last = fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err) // taken by someone else meanwhile
	}
	return -1, "", last
}
