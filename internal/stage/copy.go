package stage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// errGrewBeyondPlan marks a source that holds more bytes than the plan counted.
var errGrewBeyondPlan = errors.New("grew beyond the plan")

// copy carries out a plan: directories first (parents before children), then files and links
// in parallel, then directory modes and times (children before parents, since a read-only
// directory could not receive its contents, and writing into a directory changes its mtime).
func (w *worker) copy(ctx context.Context, p *plan) error {
	if err := w.prepareAllDirectories(ctx, p); err != nil {
		return err
	}
	if err := w.copyEntries(ctx, p, w.copyEntry); err != nil {
		return err
	}
	// Every file is in place: a stop asked for now comes too late to undo the stage, which
	// completes (the directories' modes and times are a moment's work). Reporting it
	// canceled would leave complete files behind a stage said to be stopped (issue 23 #15).
	return w.finishAllDirectories(context.WithoutCancel(ctx), p)
}

// prepareAllDirectories creates every directory of the plan, parents before children.
func (w *worker) prepareAllDirectories(ctx context.Context, p *plan) error {
	dirs := newDirCache()
	defer dirs.close()
	for _, job := range p.jobs {
		if err := w.prepareDirectories(ctx, job, dirs); err != nil {
			return fmt.Errorf("%s%w", job.label, err)
		}
	}
	return nil
}

// finishAllDirectories gives every directory of the plan its mode and times, children
// before parents, then flushes the destinations if SyncAtEnd.
func (w *worker) finishAllDirectories(ctx context.Context, p *plan) error {
	dirs := newDirCache()
	defer dirs.close()
	for i := len(p.jobs) - 1; i >= 0; i-- {
		if err := w.finishDirectories(ctx, p.jobs[i], dirs); err != nil {
			return fmt.Errorf("%s%w", p.jobs[i].label, err)
		}
	}
	if w.limits.SyncAtEnd {
		return w.syncDestinations(p)
	}
	return nil
}

// syncDestinations flushes each destination file system once (SyncAtEnd).
func (w *worker) syncDestinations(p *plan) error {
	synced := map[uint64]bool{}
	for _, job := range p.jobs {
		dir := job.dstName
		if !job.tree {
			dir, _ = job.dst.split(job.dstName)
		}
		h, err := job.dst.openDirHandle(dir)
		if err != nil {
			return fmt.Errorf("%scannot flush %s: %s", job.label, job.dst.display(dir), w.reason(err))
		}
		st, err := fstat(h.fd)
		if err == nil && !synced[st.Dev] {
			synced[st.Dev] = true
			err = unix.Syncfs(h.fd)
		}
		h.close()
		if err != nil {
			return fmt.Errorf("%scannot flush %s: %s", job.label, job.dst.display(dir), w.writeReason(job.dst, err))
		}
	}
	return nil
}

// prepareDirectories creates the destination directory of a job and, for a tree, every
// directory below it, private (0700) until finishDirectories gives each its source's mode.
func (w *worker) prepareDirectories(ctx context.Context, job *copyJob, dirs *dirCache) error {
	d := job.dst
	if !job.tree {
		dir, _ := d.split(job.dstName)
		if err := d.mkdirAll(dir); err != nil {
			return fmt.Errorf("cannot create directory %s: %s", d.display(dir), w.writeReason(d, err))
		}
		return nil
	}
	if !job.dstExists {
		if dir, _ := d.split(job.dstName); !d.isTop(job.dstName) {
			if err := d.mkdirAll(dir); err != nil {
				return fmt.Errorf("cannot create directory %s: %s", d.display(dir), w.writeReason(d, err))
			}
		}
		if err := w.makeDirectory(d, job.dstName, dirs); err != nil {
			return err
		}
	}
	for _, e := range job.entries {
		if e.kind != kindDir {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.makeDirectory(d, d.join(job.dstName, e.rel), dirs); err != nil {
			return err
		}
	}
	return nil
}

// makeDirectory creates name, or accepts an existing directory there — never a link to one.
func (w *worker) makeDirectory(d *side, name string, dirs *dirCache) error {
	parent, err := dirs.parent(d, name)
	if err != nil {
		return fmt.Errorf("cannot create directory %s: %s", d.display(name), w.writeReason(d, err))
	}
	err = parent.mkdir(0o700)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("cannot create directory %s: %s", d.display(name), w.writeReason(d, err))
	}
	st, err := parent.lstat()
	if err != nil {
		return fmt.Errorf("cannot create directory %s: %s", d.display(name), w.writeReason(d, err))
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
	case unix.S_IFLNK:
		return fmt.Errorf("cannot put a directory at %s: a symbolic link is there, and staging never writes through links; remove it or choose another destination", d.display(name))
	default:
		return fmt.Errorf("cannot put a directory at %s: a file that is not a directory is there", d.display(name))
	}
	// An existing directory of ours that we could not write into (a read-only directory from an
	// earlier stage) is opened up now; finishDirectories sets its final mode.
	if int(st.Uid) == w.uid && st.Mode&0o700 != 0o700 {
		if fd, err := parent.open(unix.O_RDONLY|unix.O_DIRECTORY, 0); err == nil {
			fchmod(fd, st.Mode&0o777|0o700)
			unix.Close(fd)
		}
	}
	return nil
}

// finishDirectories gives each directory of a tree its source's mode and times. The top
// destination gets them only if the stage created it: an existing destination (a namespace
// root, a user's PFS directory) keeps the permissions someone chose for it.
func (w *worker) finishDirectories(ctx context.Context, job *copyJob, dirs *dirCache) error {
	if !job.tree {
		return nil
	}
	for i := len(job.entries) - 1; i >= 0; i-- {
		e := job.entries[i]
		if e.kind != kindDir {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.finishDirectory(job, e.rel, dirs); err != nil {
			return err
		}
	}
	if !job.dstExists {
		return w.finishDirectory(job, "", dirs)
	}
	return nil
}

func (w *worker) finishDirectory(job *copyJob, rel string, dirs *dirCache) error {
	srcName, dstName := job.src.join(job.srcName, rel), job.dst.join(job.dstName, rel)
	var fi os.FileInfo
	var err error
	if rel == "" {
		fi, err = job.src.stat(srcName)
	} else {
		fi, err = job.src.lstat(srcName)
	}
	if err != nil {
		return w.sourceError(job.src, srcName, err)
	}
	st := statOf(fi)
	if st == nil || !fi.IsDir() {
		return fmt.Errorf("source %s changed during the stage: it is no longer a directory", job.src.display(srcName))
	}
	parent, err := dirs.parent(job.dst, dstName)
	if err != nil {
		return fmt.Errorf("cannot open directory %s: %s", job.dst.display(dstName), w.writeReason(job.dst, err))
	}
	fd, err := parent.open(unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("cannot open directory %s: %s", job.dst.display(dstName), w.writeReason(job.dst, err))
	}
	defer unix.Close(fd)
	dst, err := fstat(fd)
	if err != nil {
		return fmt.Errorf("cannot read back %s: %s", job.dst.display(dstName), w.reason(err))
	}
	return w.applyMetadata(fd, job.dst.display(dstName), dst, st.Mode, st.Gid, unix.Timespec(st.Atim), unix.Timespec(st.Mtim))
}

// applyMetadata gives an open destination (whose stat is dst) its source's group (when the
// user belongs to it), mode and times. On an object another user owns (a shared PFS
// directory, a group-writable file) the kernel refuses; the data is in place, so that is a
// warning, as with cp -a.
func (w *worker) applyMetadata(fd int, display string, dst unix.Stat_t, mode, gid uint32, atime, mtime unix.Timespec) error {
	ours := int(dst.Uid) == w.uid
	if gid != dst.Gid {
		// Best effort, like cp -a: it works only if the user belongs to the source's group.
		unix.Fchown(fd, -1, int(gid))
	}
	if err := fchmod(fd, mode&0o7777); err != nil {
		if !ours && isPermission(err) {
			w.out.warn(fmt.Sprintf("%s: kept the mode of %s, which belongs to uid %d", w.prefix, display, dst.Uid))
		} else {
			return fmt.Errorf("cannot set the mode of %s: %s", display, w.reason(err))
		}
	}
	if err := futimens(fd, atime, mtime); err != nil {
		if !ours && isPermission(err) {
			w.out.warn(fmt.Sprintf("%s: kept the times of %s, which belongs to uid %d", w.prefix, display, dst.Uid))
		} else {
			return fmt.Errorf("cannot set the times of %s: %s", display, w.reason(err))
		}
	}
	return nil
}

// copyEntries copies every file and link of the plan, w.parallel at a time. The first failure
// stops the others; each removes the file it was writing. A stop (ctx) that comes once every
// entry is done is no failure: the copy is complete.
func (w *worker) copyEntries(ctx context.Context, p *plan, do entryAction) error {
	type task struct {
		job   *copyJob
		entry entry
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tasks := make(chan task)
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
		total    int          // entries fed to the workers
		finished atomic.Int64 // and done
	)
	for _, job := range p.jobs {
		for _, e := range job.entries {
			if e.kind != kindDir {
				total++
			}
		}
	}
	for range w.parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dirs := newDirCache()
			defer dirs.close()
			var buf []byte // allocated on first use: most copies never need it
			for t := range tasks {
				if ctx.Err() != nil {
					continue // drain: a stop was asked for
				}
				if err := do(ctx, t.job, t.entry, &buf, dirs); err != nil {
					mu.Lock()
					if firstErr == nil && ctx.Err() == nil {
						firstErr = fmt.Errorf("%s%w", t.job.label, err)
					}
					mu.Unlock()
					cancel()
					continue
				}
				w.filesDone.Add(1)
				finished.Add(1)
			}
		}()
	}
feed:
	for _, job := range p.jobs {
		for _, e := range job.entries {
			if e.kind == kindDir {
				continue
			}
			select {
			case tasks <- task{job, e}:
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(tasks)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if finished.Load() == int64(total) {
		return nil // every entry copied, even if a stop came meanwhile
	}
	return ctx.Err()
}

// entryAction is what copyEntries does with one file or link of the plan.
type entryAction func(ctx context.Context, job *copyJob, e entry, buf *[]byte, dirs *dirCache) error

// copyEntry copies one file or link whole: the action of an unsplit stage.
func (w *worker) copyEntry(ctx context.Context, job *copyJob, e entry, buf *[]byte, dirs *dirCache) error {
	if e.kind == kindSymlink {
		return w.copySymlink(job, e, dirs)
	}
	return w.copyFile(ctx, job, e, buf, dirs)
}

// copySymlink reproduces a link as a link, replacing a file or link at the destination (never
// a directory), with the link's own times.
func (w *worker) copySymlink(job *copyJob, e entry, dirs *dirCache) error {
	srcName, dstName := job.src.join(job.srcName, e.rel), job.dst.join(job.dstName, e.rel)
	sp, err := dirs.parent(job.src, srcName)
	if err != nil {
		return w.sourceError(job.src, srcName, err)
	}
	target, err := sp.readlink()
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("source %s changed during the stage: it is no longer a symbolic link", job.src.display(srcName))
		}
		return w.sourceError(job.src, srcName, err)
	}
	st, err := sp.lstat()
	if err != nil {
		return w.sourceError(job.src, srcName, err)
	}
	dp, err := dirs.parent(job.dst, dstName)
	if err != nil {
		return fmt.Errorf("cannot open the directory of %s: %s", job.dst.display(dstName), w.writeReason(job.dst, err))
	}
	err = dp.symlink(target)
	if errors.Is(err, unix.EEXIST) {
		existing, lerr := dp.lstat()
		if lerr == nil && existing.Mode&unix.S_IFMT == unix.S_IFDIR {
			return fmt.Errorf("cannot put a symbolic link at %s: a directory is there", job.dst.display(dstName))
		}
		if err = dp.unlink(); err == nil {
			err = dp.symlink(target)
		}
	}
	if err != nil {
		return fmt.Errorf("cannot create symbolic link %s: %s", job.dst.display(dstName), w.writeReason(job.dst, err))
	}
	if err := unix.UtimesNanoAt(dp.fd, dp.base, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("cannot set the times of %s: %s", job.dst.display(dstName), w.reason(err))
	}
	return nil
}

// openSource opens a file to copy: the path the user named follows links, as in the plan;
// anything below it never does.
func (w *worker) openSource(job *copyJob, e entry, name string, dirs *dirCache) (fd int, keep *os.File, err error) {
	if e.rel != "" {
		sp, err := dirs.parent(job.src, name)
		if err != nil {
			return -1, nil, err
		}
		fd, err = sp.open(unix.O_RDONLY, 0)
		return fd, nil, err
	}
	if job.src.dw {
		f, err := job.src.root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return -1, nil, err
		}
		return int(f.Fd()), f, nil // Fd makes the descriptor blocking again
	}
	fd, err = openNoBlock(unix.AT_FDCWD, name, unix.O_RDONLY, 0)
	return fd, nil, err
}

// copyFile copies one regular file: open the source (O_NOFOLLOW below the top), truncate or
// create the destination (never through a link), copy at most the planned size, then group,
// mode, times, fsync (unless SyncAtEnd). On any failure the destination file is removed.
func (w *worker) copyFile(ctx context.Context, job *copyJob, e entry, buf *[]byte, dirs *dirCache) (err error) {
	in, st, release, err := w.openPlannedSource(ctx, job, e, dirs)
	if err != nil {
		return err
	}
	defer release()
	if w.spec.Protect && job.src.dw && !job.tree {
		// The file being staged out is write-protected until its copy ends (DataWarp's
		// behaviour: applications take "not writable" for "stage-out in progress"). The
		// destination gets the mode the file had.
		if restore := protect(in, st.Mode); restore != 0 {
			st.Mode = st.Mode&^0o7777 | restore
			defer unprotect(in, restore) // unless its owner changed the mode meanwhile
		}
	}
	dstName := job.dst.join(job.dstName, e.rel)
	srcShown, dstShown := job.src.display(job.src.join(job.srcName, e.rel)), job.dst.display(dstName)

	dp, err := dirs.parent(job.dst, dstName)
	if err != nil {
		return fmt.Errorf("cannot open the directory of %s: %s", dstShown, w.writeReason(job.dst, err))
	}
	out, outStat, err := w.createDestination(dp, dstShown)
	if err != nil {
		return err
	}
	open := true
	defer func() {
		if err != nil {
			if open {
				unix.Close(out)
			}
			// No half-written file may pose as complete.
			dp.unlink()
		}
	}()

	if err = w.copyData(ctx, out, in, e.size, buf); err != nil {
		switch {
		case errors.Is(err, errGrewBeyondPlan):
			return fmt.Errorf("source %s grew during the stage beyond the %d bytes planned; the capacity reserved for the stage would be exceeded — stage it again once it stops changing", srcShown, e.size)
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, errReadSide):
			return fmt.Errorf("cannot read %s: %s", srcShown, w.reason(err))
		case errors.Is(err, errWriteSide) || isDestinationErrno(err):
			return fmt.Errorf("cannot write %s: %s", dstShown, w.writeReason(job.dst, err))
		default:
			return fmt.Errorf("cannot copy %s to %s: %s", srcShown, dstShown, w.reason(err))
		}
	}
	if err = w.applyMetadata(out, dstShown, outStat, st.Mode, st.Gid, st.Atim, st.Mtim); err != nil {
		return err
	}
	for !w.limits.SyncAtEnd {
		err = unix.Fsync(out)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("cannot write %s: %s", dstShown, w.writeReason(job.dst, err))
	}
	open = false
	if err = closeFD(out); err != nil {
		return fmt.Errorf("cannot write %s: %s", dstShown, w.writeReason(job.dst, err))
	}
	return nil
}

// openPlannedSource opens a file's source and checks that it is still the regular file the
// plan counted, no larger; release closes it.
func (w *worker) openPlannedSource(ctx context.Context, job *copyJob, e entry, dirs *dirCache) (in int, st unix.Stat_t, release func(), err error) {
	srcName := job.src.join(job.srcName, e.rel)
	srcShown := job.src.display(srcName)
	in, keep, err := w.openSource(job, e, srcName, dirs)
	if err != nil {
		if e.rel != "" && errors.Is(err, unix.ELOOP) {
			return -1, st, nil, fmt.Errorf("source %s changed during the stage: it is now a symbolic link", srcShown)
		}
		return -1, st, nil, w.sourceError(job.src, srcName, err)
	}
	release = func() { unix.Close(in) }
	if keep != nil {
		release = func() { keep.Close() }
	}
	fail := func(err error) (int, unix.Stat_t, func(), error) {
		release()
		return -1, st, nil, err
	}
	if st, err = fstat(in); err != nil {
		return fail(fmt.Errorf("cannot read %s: %s", srcShown, w.reason(err)))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fail(fmt.Errorf("source %s changed during the stage: it is no longer a regular file", srcShown))
	}
	if st.Size > e.size {
		return fail(fmt.Errorf("source %s grew after the plan (%d bytes planned, %d now); the capacity reserved for the stage would be exceeded — stage it again once it stops changing", srcShown, e.size, st.Size))
	}
	if err := ctx.Err(); err != nil {
		return fail(err) // do not touch a destination for a stage that is stopping
	}
	return in, st, release, nil
}

// createDestination opens the destination file for writing, truncated, and returns its stat.
// A link there is replaced by the file (staging never writes through a link); a
// write-protected file of the user's own (say a 0444 input staged by an earlier job) is
// replaced, as cp -f would.
func (w *worker) createDestination(dp parentDir, shown string) (int, unix.Stat_t, error) {
	const flags = unix.O_WRONLY | unix.O_CREAT
	out, err := dp.open(flags|unix.O_TRUNC, 0o600)
	replace := false
	switch {
	case errors.Is(err, unix.ELOOP):
		replace = true
	case errors.Is(err, unix.EACCES):
		if st, lerr := dp.lstat(); lerr == nil && st.Mode&unix.S_IFMT == unix.S_IFREG && int(st.Uid) == w.uid {
			replace = true
		}
	case errors.Is(err, unix.EISDIR):
		return -1, unix.Stat_t{}, fmt.Errorf("destination %s is a directory", shown)
	case errors.Is(err, unix.ENXIO):
		return -1, unix.Stat_t{}, fmt.Errorf("destination %s is a named pipe or socket; staging writes only regular files", shown)
	}
	if replace {
		if uerr := dp.unlink(); uerr == nil {
			out, err = dp.open(flags|unix.O_EXCL, 0o600)
		}
	}
	if err != nil {
		return -1, unix.Stat_t{}, fmt.Errorf("cannot write %s: %s", shown, w.reason(err))
	}
	st, err := fstat(out)
	if err != nil {
		unix.Close(out)
		return -1, unix.Stat_t{}, fmt.Errorf("cannot write %s: %s", shown, w.reason(err))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(out)
		return -1, unix.Stat_t{}, fmt.Errorf("destination %s exists and is not a regular file", shown)
	}
	return out, st, nil
}

var (
	errReadSide  = errors.New("read side")
	errWriteSide = errors.New("write side")
)

type sideError struct {
	side error
	err  error
}

func (e *sideError) Error() string   { return e.err.Error() }
func (e *sideError) Unwrap() []error { return []error{e.side, e.err} }

// copyData copies at most limit bytes from in to out, ChunkBytes at a time, with
// copy_file_range (the kernel moves the data; on a file system that supports it, no byte
// crosses into user space) and a buffered copy where the kernel cannot. A source holding more
// than limit bytes is errGrewBeyondPlan: the plan's byte count is what the agent reserved.
// copyHook, when set, runs before each chunk a worker copies: a test seam (a copy that
// blocks, as on a stalled FUSE server).
var copyHook func()

func (w *worker) copyData(ctx context.Context, out, in int, limit int64, buf *[]byte) error {
	useKernel := true
	kernelCopied := false
	var copied int64
	for copied < limit {
		if err := ctx.Err(); err != nil {
			return err
		}
		if copyHook != nil {
			copyHook()
		}
		want := min(limit-copied, w.limits.ChunkBytes)
		var n int
		var err error
		if useKernel {
			n, err = unix.CopyFileRange(in, nil, out, nil, int(want), 0)
			if err == unix.EINTR {
				continue
			}
			unsupported := err == unix.ENOSYS || err == unix.EXDEV || err == unix.EOPNOTSUPP || err == unix.EINVAL || err == unix.EBADF
			// Some file systems answer 0 rather than an error when they cannot copy.
			if (unsupported || (err == nil && n == 0)) && !kernelCopied {
				useKernel = false
				continue
			}
			if err != nil {
				return err
			}
			if n == 0 {
				return nil // the source shrank: copy what is there
			}
			kernelCopied = true
		} else {
			if *buf == nil {
				*buf = make([]byte, w.limits.BufferBytes)
			}
			n, err = readFD(in, (*buf)[:min(int64(len(*buf)), want)])
			if err != nil {
				return &sideError{errReadSide, err}
			}
			if n == 0 {
				return nil // the source shrank: copy what is there
			}
			if err := writeFD(out, (*buf)[:n]); err != nil {
				return &sideError{errWriteSide, err}
			}
		}
		copied += int64(n)
		w.bytesDone.Add(uint64(n))
	}
	// The planned size is copied; one more byte means the source grew.
	var probe [1]byte
	n, err := readFD(in, probe[:])
	if err != nil {
		return &sideError{errReadSide, err}
	}
	if n > 0 {
		return errGrewBeyondPlan
	}
	return nil
}

func readFD(fd int, p []byte) (int, error) {
	for {
		n, err := unix.Read(fd, p)
		if err != unix.EINTR {
			return max(n, 0), err
		}
	}
}

func writeFD(fd int, p []byte) error {
	for len(p) > 0 {
		n, err := unix.Write(fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}
