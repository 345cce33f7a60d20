package agent

// Fragments as file systems of their own (agent.fragment_filesystem = "xfs-loop"), as
// DataWarp made them: each fragment is an XFS file system in a sparse image file under the
// SSD path, attached to a loop device with direct I/O (the image's pages are not cached a
// second time under the fragment's) and mounted nodev,nosuid,noexec at the fragment
// directory before anything is made inside it. The file system then holds the fragment to its
// capacity (ENOSPC when full) whoever writes, so the co-located mounts of an instance that
// lies wholly in the fragment hand writes to the kernel (FUSE passthrough), exactly as under
// a project quota (quota.go), on any file system and kernel with loop devices and XFS.
//
// Where things are (all under <ssd>/fragment, root's alone, mode 0700, so no user can swap a
// name the agent resolves):
//
//	<ssd>/fragment/images/<id>.img      the image; <id>.img.tmp while mkfs.xfs runs
//	<ssd>/fragment/<id>                 its mount point (the fragment directory)
//	<ssd>/fragment/<id>/reserved        a preallocated file holding what the file system
//	                                    offers beyond the fragment's capacity and headroom
//
// Every step is idempotent and a crash between two leaves what the next try finishes: the
// image appears under its name only once mkfs.xfs is done (rename), the loop device is
// attached with LO_FLAGS_AUTOCLEAR (it goes when the mount goes, or when the agent dies
// before mounting it), and an agent's start re-mounts the images it finds (after a reboot).
// Removal unmounts, detaches and removes the image, in that order.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/loopdev"
	"github.com/spillway-hpc/spillway/internal/units"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// The values of agent.fragment_filesystem.
const (
	FragmentDirectory = "directory" // a directory per fragment on the SSD path's file system
	FragmentXFSLoop   = "xfs-loop"  // an XFS file system per fragment on a loop device
)

// FragmentFSLimits bound the waits of making and removing fragment file systems.
type FragmentFSLimits struct {
	Mkfs  time.Duration // one mkfs.xfs (agent.fragment_mkfs_timeout)
	Mount time.Duration // one mount, or waiting for a busy one to unmount (agent.fragment_mount_timeout)
}

// DefaultFragmentFSLimits are the configuration's defaults.
func DefaultFragmentFSLimits() FragmentFSLimits {
	return FragmentFSLimits{Mkfs: time.Minute, Mount: 30 * time.Second}
}

const (
	// xfsMinImage: mkfs.xfs (xfsprogs 5.19 on) refuses file systems of 300 MiB or less.
	xfsMinImage = 320 << 20
	// reserveName holds what the file system offers beyond the fragment's capacity and
	// headroom (fallocate: unwritten extents, so the image stays sparse).
	reserveName = "reserved"
)

// imageSize is the size of the sparse image of a fragment of capacity bytes: the capacity,
// the headroom, and more than XFS takes for itself. Measured with xfsprogs 6.1 (-m reflink=0,
// what statfs's f_bavail lacks of the image's size): 79 MiB at 300 MiB, 97 MiB at 1 GiB,
// 161 MiB at 64 GiB, 1.55 GiB at 1 TiB (a log of 64 to 512 MiB, allocation group headers and
// btrees, the reserve pool of 8192 blocks, per-AG metadata reservations). The estimate only
// needs to be large enough: what the file system offers beyond capacity+headroom is held by
// the reserve file, and what is never written costs nothing in a sparse image.
func imageSize(capacity uint64) uint64 {
	s := capacity + fragmentHeadroom(capacity) + 192<<20 + capacity/256
	s = (s + 1<<20 - 1) &^ (1<<20 - 1)
	return max(s, xfsMinImage)
}

// fragmentHeadroom is the room the file system offers beyond the capacity: for its records
// of the data (inodes, directories, extent maps), so that the capacity in file data fits.
func fragmentHeadroom(capacity uint64) uint64 { return 1<<20 + capacity/1024 }

// checkFragmentFS says why this node cannot make fragment file systems of kind mode, if it
// cannot.
func checkFragmentFS(mode string) error {
	switch mode {
	case "", FragmentDirectory:
		return nil
	case FragmentXFSLoop:
	default:
		return fmt.Errorf("agent.fragment_filesystem %q: must be %q (a directory per fragment) or %q (an XFS file system per fragment on a loop device)",
			mode, FragmentDirectory, FragmentXFSLoop)
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("agent.fragment_filesystem = %q needs an agent running as root (it attaches loop devices and mounts)", mode)
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("agent.fragment_filesystem = %q needs loop devices: %v (modprobe loop)", mode, err)
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		return fmt.Errorf("agent.fragment_filesystem = %q needs mkfs.xfs: install xfsprogs", mode)
	}
	return nil
}

func (a *Agent) imagesDir() string { return filepath.Join(a.ssd, "fragment", "images") }

func (a *Agent) imagePath(id int64) string {
	return filepath.Join(a.imagesDir(), strconv.FormatInt(id, 10)+".img")
}

// checkOwnTree refuses an SSD tree a user could change under the agent: the SSD path and
// <ssd>/fragment must be directories of root's that no one else may write.
func (a *Agent) checkOwnTree() error {
	for _, path := range []string{a.ssd, filepath.Join(a.ssd, "fragment")} {
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o022 != 0 {
			return fmt.Errorf("%s must be a directory owned by root that only root may write (mode %#o, uid %d)", path, st.Mode&0o7777, st.Uid)
		}
	}
	return nil
}

// hasImage says whether fragment id is (or was being made) a file system of its own.
func (a *Agent) hasImage(id int64) bool {
	_, err := os.Lstat(a.imagePath(id))
	return err == nil
}

// fragmentMount says whether fragment id's directory is the mount point of its image's file
// system, and its device number. Something else mounted there is an error.
func (a *Agent) fragmentMount(id int64) (dev uint64, mounted bool, err error) {
	var parent, st unix.Stat_t
	if err := unix.Lstat(filepath.Join(a.ssd, "fragment"), &parent); err != nil {
		return 0, false, err
	}
	dir := a.fragmentDir(id)
	if err := unix.Lstat(dir, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, false, nil
		}
		return 0, false, &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return 0, false, fmt.Errorf("%s is not a directory", dir)
	}
	if st.Dev == parent.Dev {
		return 0, false, nil
	}
	if !loopBackedBy(st.Dev, a.imagePath(id)) {
		backing := loopBacking(st.Dev)
		return 0, false, fmt.Errorf("%s is the mount point of device %d:%d (backing file %q), not of the fragment's image %s",
			dir, unix.Major(st.Dev), unix.Minor(st.Dev), backing, a.imagePath(id))
	}
	return st.Dev, true, nil
}

// loopBacking is the file behind loop device dev, as the kernel names it ("" when dev is no
// attached loop device); " (deleted)" is cut off.
func loopBacking(dev uint64) string {
	if unix.Major(dev) != loopdev.Major {
		return ""
	}
	raw, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", unix.Major(dev), unix.Minor(dev)))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(strings.TrimSpace(string(raw)), " (deleted)")
}

// loopBackedBy says whether block device dev is a loop device attached to the very file
// image (the kernel's record of the backing file's device and inode, LOOP_GET_STATUS64: no
// path compared, so symbolic links and bind mounts in the SSD path do not matter).
func loopBackedBy(dev uint64, image string) bool {
	if unix.Major(dev) != loopdev.Major {
		return false
	}
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(dev), unix.Minor(dev)))
	if err != nil {
		return false
	}
	return loopDeviceBackedBy("/dev/"+filepath.Base(link), image)
}

// loopDeviceBackedBy says whether the loop device at path (/dev/loopN) is attached to image.
func loopDeviceBackedBy(path, image string) bool {
	var img unix.Stat_t
	if err := unix.Lstat(image, &img); err != nil {
		return false
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	return err == nil && info.Device == img.Dev && info.Inode == img.Ino
}

// loopsOf lists the loop devices (/dev/loopN) attached to image: by the backing file's name
// (the kernel's, which a removed image keeps with " (deleted)"), or its identity.
func loopsOf(image string) []string {
	names, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var devs []string
	for _, p := range names {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(p)))
		if strings.TrimSuffix(strings.TrimSpace(string(raw)), " (deleted)") == image || loopDeviceBackedBy(dev, image) {
			devs = append(devs, dev)
		}
	}
	return devs
}

// makeFragmentFS makes fragment id's file system, of capacity bytes, and mounts it at the
// fragment directory, finishing whatever an earlier try left.
func (a *Agent) makeFragmentFS(id int64, capacity uint64) error {
	image := a.imagePath(id)
	if !a.hasImage(id) {
		start := time.Now()
		if err := a.makeImage(image, capacity); err != nil {
			return err
		}
		a.opt.Log.Debug("made a fragment file system", "fragment", id, "image", image, "ms", time.Since(start).Milliseconds())
	}
	dir := a.fragmentDir(id)
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	_, mounted, err := a.fragmentMount(id)
	if err != nil {
		return err
	}
	if !mounted {
		if err := a.mountImage(image, dir); err != nil {
			return err
		}
	}
	fd, err := openOwnDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, 0o711); err != nil { // mkfs.xfs makes its root 0755
		return &os.PathError{Op: "chmod", Path: dir, Err: err}
	}
	return a.reserveExcess(fd, dir, capacity)
}

// makeImage makes the sparse image of a fragment of capacity bytes and its XFS file system;
// it appears under its name only when mkfs.xfs has finished.
func (a *Agent) makeImage(image string, capacity uint64) error {
	if err := os.Mkdir(a.imagesDir(), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	tmp := image + ".tmp"
	os.Remove(tmp) // an earlier try's
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	size := imageSize(capacity)
	err = f.Truncate(int64(size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("image %s of %s: %w", tmp, units.FormatHuman(size), err)
	}
	limit := a.opt.FragmentFSLimits.Mkfs
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	// -K: nothing to discard in a new sparse file; reflink off: no copy-on-write to reserve
	// room for (a fifth less overhead).
	cmd := exec.CommandContext(ctx, "mkfs.xfs", "-q", "-K", "-m", "reflink=0", tmp)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs.xfs %s did not finish within agent.fragment_mkfs_timeout (%v)", tmp, limit)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs.xfs %s: %v: %s", tmp, err, bytes.TrimSpace(out))
	}
	if err := os.Rename(tmp, image); err != nil {
		return err
	}
	syncDir(a.imagesDir())
	return nil
}

func syncDir(path string) {
	if fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		unix.Fsync(fd)
		unix.Close(fd)
	}
}

// mountImage attaches image to a free loop device (direct I/O, cleared automatically when
// its last user goes) and mounts its file system at dir, which must be empty.
func (a *Agent) mountImage(image, dir string) error {
	if names, err := os.ReadDir(dir); err != nil {
		return err
	} else if len(names) > 0 {
		return fmt.Errorf("%s is not empty and its file system (%s) is not mounted on it: "+
			"remove what is in it, or the image if the fragment was a directory", dir, image)
	}
	loop, dev, err := attachLoop(image)
	if err != nil {
		return fmt.Errorf("attaching %s to a loop device: %w", image, err)
	}
	// Closed once mounted (the mount holds the device), or on failure (the device detaches).
	defer unix.Close(loop)
	if raw, err := os.ReadFile("/sys/block/" + filepath.Base(dev) + "/loop/dio"); err == nil && strings.TrimSpace(string(raw)) != "1" {
		a.opt.Log.Warn("the loop device of a fragment does not use direct I/O: its pages are cached twice "+
			"(the SSD path's file system or block size does not allow it)", "device", dev, "image", image)
	}
	limit := a.opt.FragmentFSLimits.Mount
	done := make(chan error, 1)
	go func() {
		// A fixed, small speculative preallocation: the blocks XFS takes past the end of a
		// file being written count against the instance (usage.XFSFragmentOptions).
		done <- unix.Mount(dev, dir, "xfs", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, usage.XFSFragmentOptions)
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("mount %s (%s) at %s: %w", dev, image, dir, err)
		}
		return nil
	case <-time.After(limit):
		// The mount may still finish: the next try finds it mounted.
		return fmt.Errorf("mounting %s (%s) at %s did not finish within agent.fragment_mount_timeout (%v)", dev, image, dir, limit)
	}
}

// attachLoop attaches image to a free loop device with direct I/O and LO_FLAGS_AUTOCLEAR; it
// returns the device open, and its path.
func attachLoop(image string) (int, string, error) {
	img, err := unix.Open(image, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", &os.PathError{Op: "open", Path: image, Err: err}
	}
	defer unix.Close(img)
	return loopdev.Attach(img, image)
}

// reserveExcess holds, in a preallocated file at the root of the fragment's file system
// (open as fd), what the file system offers beyond the capacity and headroom, once.
func (a *Agent) reserveExcess(fd int, dir string, capacity uint64) error {
	var st unix.Stat_t
	if err := unix.Fstatat(fd, reserveName, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		return nil
	}
	tmp := reserveName + ".tmp"
	f, err := unix.Openat(fd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &os.PathError{Op: "open", Path: filepath.Join(dir, tmp), Err: err}
	}
	defer unix.Close(f)
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return err
	}
	avail := sfs.Bavail * uint64(sfs.Bsize)
	want := capacity + fragmentHeadroom(capacity)
	if avail < want {
		return fmt.Errorf("the file system of %s offers %s, less than the fragment's %s and %s of headroom: "+
			"this mkfs.xfs takes more for itself than the agent allows (imageSize)",
			dir, units.FormatHuman(avail), units.FormatHuman(capacity), units.FormatHuman(fragmentHeadroom(capacity)))
	}
	if excess := avail - want; excess > 0 {
		if err := unix.Fallocate(f, 0, 0, int64(excess)); err != nil {
			return fmt.Errorf("preallocating %s beyond the capacity in %s: %w", units.FormatHuman(excess), dir, err)
		}
	}
	if err := unix.Renameat(fd, tmp, fd, reserveName); err != nil {
		return err
	}
	return nil
}

// removeFragmentFS unmounts fragment id's file system, detaches its loop device and removes
// its image. A mount still busy after agent.fragment_mount_timeout is detached lazily: the
// loop device then goes when its last file closes.
func (a *Agent) removeFragmentFS(id int64) error {
	dir, image := a.fragmentDir(id), a.imagePath(id)
	_, mounted, err := a.fragmentMount(id)
	if err != nil {
		return err
	}
	if mounted {
		if err := a.unmountFragment(dir); err != nil {
			return err
		}
	}
	for _, dev := range loopsOf(image) {
		// Attached without a mount: a crash between the two on a kernel that kept it.
		if fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
				a.opt.Log.Warn("cannot detach the loop device of a removed fragment", "device", dev, "image", image, "err", err)
			}
			unix.Close(fd)
		}
	}
	for _, p := range []string{image, image + ".tmp"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	syncDir(a.imagesDir())
	return nil
}

// unmountFragment unmounts a fragment's file system, waiting up to agent.fragment_mount_timeout
// for its files to close.
func (a *Agent) unmountFragment(dir string) error {
	deadline := time.Now().Add(a.opt.FragmentFSLimits.Mount)
	for {
		err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
		if err == nil || errors.Is(err, unix.EINVAL) { // EINVAL: not a mount point (any more)
			return nil
		}
		if !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
		if time.Now().After(deadline) {
			a.opt.Log.Warn("a removed fragment's file system is still busy: detached lazily; its loop device goes when its files close",
				"dir", dir, "waited", a.opt.FragmentFSLimits.Mount)
			if err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("unmount %s: %w", dir, err)
			}
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// reattachFragments mounts the file systems of the fragments this node has (after a reboot,
// or an agent that was stopped with them unmounted) and removes images whose mkfs.xfs never
// finished. A fragment that cannot be mounted is logged: its next creation tries again.
func (a *Agent) reattachFragments() {
	entries, err := os.ReadDir(a.imagesDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, ".img.tmp") {
			os.Remove(filepath.Join(a.imagesDir(), name)) // its creation is retried whole
			continue
		}
		idText, ok := strings.CutSuffix(name, ".img")
		id, err := strconv.ParseInt(idText, 10, 64)
		if !ok || err != nil {
			continue
		}
		dir := a.fragmentDir(id)
		if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, fs.ErrExist) {
			a.opt.Log.Error("cannot re-mount a fragment's file system", "fragment", id, "err", err)
			continue
		}
		_, mounted, err := a.fragmentMount(id)
		if err == nil && !mounted {
			if err = a.mountImage(a.imagePath(id), dir); err == nil {
				a.opt.Log.Info("re-mounted a fragment's file system", "fragment", id, "image", a.imagePath(id))
			}
		}
		if err != nil {
			a.opt.Log.Error("cannot re-mount a fragment's file system", "fragment", id, "err", err)
		}
	}
}

// fragmentDevice is the device number of fragment id's own file system when it is mounted and
// holds a whole instance (its capacity then holds the instance, as a project quota would),
// or 0.
func (a *Agent) fragmentDevice(id int64) uint64 {
	if !a.root || !a.hasImage(id) {
		return 0
	}
	meta, err := a.readFragment(id)
	if err != nil || meta.Capacity == 0 || meta.Capacity < meta.InstanceCapacity {
		return 0
	}
	dev, mounted, err := a.fragmentMount(id)
	if err != nil || !mounted {
		return 0
	}
	return dev
}
