package swaparea

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/loopdev"
)

// Spec is a swap area to attach: the file Name in the directory Rel beneath Root. Root is the
// agent's own (its configuration, or a mount it made) and is opened as given; Rel and Name
// are resolved beneath it without following any symbolic link, and the directory they name
// must be the agent's user's and writable by no one else.
type Spec struct {
	Root     string
	Rel      string // "." for Root itself
	Name     string // one path component
	Size     uint64 // bytes
	Priority int    // swapon priority; -1: the kernel's choice
	Label    string // up to 16 bytes, shown by blkid/swaplabel
}

// File is the backing file's path, as the kernel names it in the loop device's backing_file
// (when Root holds no symbolic link).
func (s Spec) File() string { return filepath.Join(s.Root, s.Rel, s.Name) }

// Area is an attached (or found) swap area.
type Area struct {
	File     string // the backing file
	Device   string // the loop device, /dev/loopN
	DirectIO bool   // the loop device reads and writes the file with direct I/O
	Swapping bool   // the device is in /proc/swaps
	Priority int    // its priority there
	// Base is what the loop device had counted when the area was attached: a loop device's
	// counters are the block device's, kept from its earlier attachments (Attach sets it; an
	// area found again has it zero, and its owner keeps the one it got).
	Base Counters
}

// Since is what was paged out and in since base was read.
func (c Counters) Since(base Counters) Counters {
	if c.BytesWritten < base.BytesWritten || c.BytesRead < base.BytesRead {
		return c // the device was attached anew: its counters restarted
	}
	return Counters{BytesWritten: c.BytesWritten - base.BytesWritten, BytesRead: c.BytesRead - base.BytesRead}
}

func (s Spec) check() error {
	if s.Name == "" || s.Name == "." || s.Name == ".." || strings.Contains(s.Name, "/") {
		return fmt.Errorf("swap file name %q must be one path component", s.Name)
	}
	if !filepath.IsAbs(s.Root) {
		return fmt.Errorf("swap area root %q is not an absolute path", s.Root)
	}
	if filepath.IsAbs(s.Rel) || s.Rel == "" {
		return fmt.Errorf("swap area directory %q must be relative to its root (\".\" for the root)", s.Rel)
	}
	return nil
}

// openDir opens the directory holding the file: beneath Root, no symbolic link followed, the
// caller's own and writable by no one else (no other user may swap the file under root).
func (s Spec) openDir() (int, error) {
	root, err := unix.Open(s.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: s.Root, Err: err}
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, s.Rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: filepath.Join(s.Root, s.Rel), Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		unix.Close(fd)
		return -1, fmt.Errorf("the directory of swap file %s is owned by uid %d with mode %o: it must be uid %d's and writable by no one else",
			s.File(), st.Uid, st.Mode&0o7777, os.Geteuid())
	}
	return fd, nil
}

// openFile opens the swap file beneath dir without following a link: a regular file of one
// link, the caller's.
func openFile(dir int, name string, flags int) (int, error) {
	fd, err := unix.Openat2(dir, name, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW), Mode: 0o600,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 || int(st.Uid) != os.Geteuid() {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is not a regular file of one link owned by uid %d (mode %o, %d links, uid %d)", name, os.Geteuid(), st.Mode, st.Nlink, st.Uid)
	}
	return fd, nil
}

// attachMu serializes attaches in this process: finding a free loop device and taking it.
var attachMu sync.Mutex

// Attach makes the swap area and switches it on; an area already attached over the same file
// is found and returned (switched on if it was not).
func Attach(s Spec) (Area, error) {
	if err := s.check(); err != nil {
		return Area{}, err
	}
	flags, err := SwaponFlags(s.Priority)
	if err != nil {
		return Area{}, err
	}
	attachMu.Lock()
	defer attachMu.Unlock()
	dir, err := s.openDir()
	if err != nil {
		return Area{}, err
	}
	defer unix.Close(dir)
	f, err := openFile(dir, s.Name, unix.O_RDWR|unix.O_CREAT)
	if err != nil {
		return Area{}, fmt.Errorf("swap file %s: %w", s.File(), err)
	}
	defer unix.Close(f)
	if a, ok := findByFD(f, s.File()); ok {
		if a.Swapping {
			return a, nil
		}
		// Attached but not switched on: a crash between the two kept the loop device.
		if err := swapon(a.Device, flags); err != nil {
			return a, fmt.Errorf("swapon %s (over %s): %w", a.Device, a.File, err)
		}
		a.Swapping = true
		return a, nil
	}
	if err := prepare(f, s); err != nil {
		return Area{}, fmt.Errorf("swap file %s: %w", s.File(), err)
	}
	// The loop device reads and writes the file with direct I/O when the file allows it:
	// swapped pages then do not sit a second time in the file's page cache, and page-out
	// needs no page cache memory of the file.
	backing := f
	if d, err := openFile(dir, s.Name, unix.O_RDWR|unix.O_DIRECT); err == nil {
		defer unix.Close(d)
		backing = d
	}
	loop, dev, err := loopdev.Attach(backing, s.File())
	if err != nil {
		return Area{}, fmt.Errorf("loop device over %s: %w", s.File(), err)
	}
	// The loop device is LO_FLAGS_AUTOCLEAR: it goes when its last opener closes it, so a
	// crash before swapon leaves nothing; swapon holds it open from now on.
	defer unix.Close(loop)
	base, _ := ReadCounters(dev)
	if err := swapon(dev, flags); err != nil {
		return Area{}, fmt.Errorf("swapon %s (over %s): %w", dev, s.File(), err)
	}
	a := Area{File: s.File(), Device: dev, DirectIO: loopDirectIO(dev), Swapping: true, Base: base}
	if e, ok := swapsEntry(dev); ok {
		a.Priority = e.Priority
	}
	return a, nil
}

// prepare gives the file its size with the space reserved and writes the swap header, unless
// a valid header for this size is there already (a file prepared before a crash).
func prepare(f int, s Spec) error {
	page := os.Getpagesize()
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil {
		return err
	}
	if uint64(st.Size) == s.Size {
		buf := make([]byte, page)
		if n, err := unix.Pread(f, buf, 0); err == nil && n == page && ValidHeader(buf, s.Size, page) {
			return nil
		}
	}
	var uuid [16]byte
	rand.Read(uuid[:])
	uuid[6] = uuid[6]&0x0f | 0x40 // version 4
	uuid[8] = uuid[8]&0x3f | 0x80
	header, err := Header(s.Size, page, uuid, s.Label)
	if err != nil {
		return err
	}
	if err := unix.Ftruncate(f, 0); err != nil {
		return err
	}
	if err := reserve(f, int64(s.Size)); err != nil {
		return err
	}
	if _, err := unix.Pwrite(f, header, 0); err != nil {
		return fmt.Errorf("writing the swap header: %w", err)
	}
	return unix.Fsync(f)
}

// reserve gives the file size bytes of allocated space: fallocate, or zeros written where
// the file system cannot (a page-out must never find the file system full).
func reserve(f int, size int64) error {
	err := unix.Fallocate(f, 0, 0, size)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("reserving %d bytes (fallocate): %w", size, err)
	}
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < size; {
		n := min(int64(len(zeros)), size-off)
		w, err := unix.Pwrite(f, zeros[:n], off)
		if err != nil {
			return fmt.Errorf("writing zeros at %d of %d: %w", off, size, err)
		}
		off += int64(w)
	}
	return nil
}

func sysLoop(dev, file string) string {
	return filepath.Join("/sys/block", filepath.Base(dev), file)
}

func loopDirectIO(dev string) bool {
	raw, err := os.ReadFile(sysLoop(dev, "loop/dio"))
	return err == nil && strings.TrimSpace(string(raw)) == "1"
}

// loops lists the attached loop devices and their backing files (the kernel's names, without
// the " (deleted)" of a removed file).
func loops() map[string]string {
	names, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	out := map[string]string{}
	for _, p := range names {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		out["/dev/"+filepath.Base(filepath.Dir(filepath.Dir(p)))] = strings.TrimSuffix(strings.TrimSpace(string(raw)), " (deleted)")
	}
	return out
}

// findByFD finds the loop device attached to the open file f (by the backing file's device
// and inode, LOOP_GET_STATUS64: no path compared).
func findByFD(f int, name string) (Area, bool) {
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil {
		return Area{}, false
	}
	for dev := range loops() {
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(fd)
		unix.Close(fd)
		if err == nil && info.Device == st.Dev && info.Inode == st.Ino {
			return describe(dev, name), true
		}
	}
	return Area{}, false
}

func describe(dev, file string) Area {
	a := Area{File: file, Device: dev, DirectIO: loopDirectIO(dev)}
	if e, ok := swapsEntry(dev); ok {
		a.Swapping, a.Priority = true, e.Priority
	}
	return a
}

// Find finds the area whose loop device's backing file is file (by its name: the file may be
// unreachable, e.g. through a mount whose server is gone).
func Find(file string) (Area, bool) {
	for dev, backing := range loops() {
		if backing == file {
			return describe(dev, file), true
		}
	}
	return Area{}, false
}

// List lists the loop devices whose backing files are under one of roots: the areas this
// agent made, attached or not (the reaper's and the restart's view).
func List(roots ...string) []Area {
	var out []Area
	for dev, backing := range loops() {
		for _, r := range roots {
			if rel, err := filepath.Rel(r, backing); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
				out = append(out, describe(dev, backing))
				break
			}
		}
	}
	return out
}

// Swaps reads /proc/swaps.
func Swaps() ([]SwapsEntry, error) {
	raw, err := os.ReadFile("/proc/swaps")
	if err != nil {
		return nil, err
	}
	return ParseSwaps(string(raw))
}

func swapsEntry(dev string) (SwapsEntry, bool) {
	entries, _ := Swaps()
	for _, e := range entries {
		if e.Filename == dev {
			return e, true
		}
	}
	return SwapsEntry{}, false
}

// ReadCounters reads what the kernel paged out to and in from the area on dev.
func ReadCounters(dev string) (Counters, error) {
	raw, err := os.ReadFile(sysLoop(dev, "stat"))
	if err != nil {
		return Counters{}, err
	}
	return ParseBlockStat(string(raw))
}

// Swapoff is a swapoff under way. It runs as a process of its own (util-linux swapoff): the
// kernel brings every page of the area back into memory before it returns, which may take
// long or never finish, and only a signal stops it — the kernel then puts the area back, the
// pages not yet brought back where they were. The kernel looks at signals between the address
// spaces it walks, not within one: a stopped swapoff may still take a while to end (or finish
// after all).
type Swapoff struct {
	Device  string
	Started time.Time
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
	stopped bool
}

// swapoffArgv is the command that switches dev off (tests run it in a throttled cgroup).
var swapoffArgv = func(dev string) []string { return []string{"swapoff", dev} }

// StartSwapoff starts switching dev off.
func StartSwapoff(dev string) (*Swapoff, error) {
	argv := swapoffArgv(dev)
	cmd := exec.Command(argv[0], argv[1:]...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("swapoff %s: %w", dev, err)
	}
	s := &Swapoff{Device: dev, Started: time.Now(), cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		if err != nil {
			msg := strings.TrimPrefix(strings.TrimSpace(out.String()), "swapoff: "+dev+": ")
			if strings.Contains(msg, "Cannot allocate memory") {
				msg += ": the swapped pages do not fit in the node's memory (or in their memory cgroups' limits)"
			}
			if msg == "" {
				msg = err.Error()
			}
			err = fmt.Errorf("swapoff %s: %s", dev, msg)
		}
		s.err = err
		close(s.done)
	}()
	return s, nil
}

// Poll says how the swapoff stands against bound; past it the swapoff is stopped (a signal)
// and the area stays attached.
func (s *Swapoff) Poll(bound time.Duration) (Verdict, string) {
	finished := false
	select {
	case <-s.done:
		finished = true
	default:
	}
	var err error
	if finished {
		err = s.err
	}
	v, msg := Judge(finished, err, time.Since(s.Started), bound)
	if v == Failed && !finished {
		s.Stop()
	}
	return v, msg
}

// Stop stops the swapoff (the area stays attached); Done is closed once its process is gone.
func (s *Swapoff) Stop() {
	if !s.stopped {
		s.stopped = true
		s.cmd.Process.Kill()
	}
}

// Ended says whether the swapoff process has ended. A stopped swapoff ends only once the
// kernel has finished the address space it was bringing back (it looks at signals between
// them): until then the area is neither usable for new pages nor gone.
func (s *Swapoff) Ended() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Done is closed when the swapoff process has ended.
func (s *Swapoff) Done() <-chan struct{} { return s.done }

// Release removes what is left of a switched-off area: the loop device (if it is still
// attached) and the file.
func Release(s Spec, dev string) error {
	if err := s.check(); err != nil {
		return err
	}
	if dev != "" && loops()[dev] == s.File() { // autoclear may have freed it, and another taken it
		if _, ok := swapsEntry(dev); ok {
			return fmt.Errorf("%s is still a swap area: switch it off first", dev)
		}
		if fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
			unix.Close(fd)
			if err != nil && !errors.Is(err, unix.ENXIO) {
				return fmt.Errorf("detaching %s: %w", dev, err)
			}
		}
	}
	dir, err := s.openDir()
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	if err := unix.Unlinkat(dir, s.Name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return &os.PathError{Op: "remove", Path: s.File(), Err: err}
	}
	return nil
}

// swapon is swapon(2) (x/sys/unix has no wrapper).
func swapon(dev string, flags int) error {
	p, err := unix.BytePtrFromString(dev)
	if err != nil {
		return err
	}
	_, _, errno := unix.Syscall(unix.SYS_SWAPON, uintptr(unsafe.Pointer(p)), uintptr(flags), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
