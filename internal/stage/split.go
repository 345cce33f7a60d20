package stage

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
)

// A stage of a striped namespace on several servers is split (agentapi.StagePart): every
// server moves the stripes it holds between the PFS and the instance, so a file staged into a
// four-server instance is read from the PFS and written by four workers at once, each into
// its own server's disk without crossing the network. The controller runs the steps in
// order: prepare on the metadata server (directories, links, every file created at its
// final size, and that server's stripes), copy on every other server at once, then finish on
// the metadata server (modes, times, the flush) — or abort, which removes the files prepare
// created, if a copy failed. Every step plans the same tree, so they agree on what to move;
// a source that changes between the steps fails the stage as it does an unsplit one.

// validatePart checks a split stage's step.
func validatePart(p *agentapi.StagePart) error {
	switch p.Step {
	case agentapi.StepPrepare, agentapi.StepCopy, agentapi.StepFinish, agentapi.StepAbort:
	default:
		return fmt.Errorf("step %q is not prepare, copy, finish or abort", p.Step)
	}
	if p.Servers < 1 || p.Servers > stripe.MaxServers || p.Server < 0 || p.Server >= p.Servers {
		return fmt.Errorf("server %d of %d: expected 0 to servers-1, servers 1 to %d", p.Server, p.Servers, stripe.MaxServers)
	}
	if p.RestoreMode&^0o7777 != 0 {
		return fmt.Errorf("restore_mode %o: expected permission bits (at most 07777)", p.RestoreMode)
	}
	return nil
}

// runPart carries out one step of a split stage.
func (w *worker) runPart(ctx context.Context, p *plan) error {
	switch w.spec.Part.Step {
	case agentapi.StepPrepare:
		if err := w.prepareAllDirectories(ctx, p); err != nil {
			return err
		}
		return w.copyEntries(ctx, p, w.prepareEntry)
	case agentapi.StepCopy:
		return w.copyEntries(ctx, p, w.copyStripesOf)
	case agentapi.StepFinish:
		if err := w.copyEntries(ctx, p, w.finishFile); err != nil {
			return err
		}
		return w.finishAllDirectories(ctx, p)
	case agentapi.StepAbort:
		return w.copyEntries(ctx, p, w.removeFile)
	}
	return fmt.Errorf("unknown step %q", w.spec.Part.Step)
}

// prepareEntry creates a link whole, or a file at its final size (0600 until the finish step)
// with this server's stripes in it. A failure removes the file, as an unsplit copy does.
func (w *worker) prepareEntry(ctx context.Context, job *copyJob, e entry, buf *[]byte, dirs *dirCache) (err error) {
	if e.kind == kindSymlink {
		return w.copySymlink(job, e, dirs)
	}
	in, st, release, err := w.openPlannedSource(ctx, job, e, dirs)
	if err != nil {
		return err
	}
	defer release()
	if w.protects(job) {
		// The file being staged out is write-protected before any of it is copied, until
		// the finish or abort step gives its mode back (DataWarp's behaviour, as an unsplit
		// stage-out). The controller records the mode it had.
		if mode := protect(in, st.Mode); mode != 0 {
			w.out.send(event{Event: eventProtected, Mode: mode})
			defer func() {
				if err != nil {
					unprotect(in, mode) // this stage copies no more of it
				}
			}()
		}
	}
	dstName := job.dst.join(job.dstName, e.rel)
	dstShown := job.dst.display(dstName)
	dp, err := dirs.parent(job.dst, dstName)
	if err != nil {
		return fmt.Errorf("cannot open the directory of %s: %s", dstShown, w.writeReason(job.dst, err))
	}
	out, _, err := w.createDestination(dp, dstShown)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			dp.unlink() // no half-written file may pose as complete
		}
	}()
	if err := unix.Ftruncate(out, st.Size); err != nil {
		unix.Close(out)
		return fmt.Errorf("cannot write %s: %s", dstShown, w.writeReason(job.dst, err))
	}
	return w.writeStripes(ctx, job, e, in, out, st.Size, buf)
}

// copyStripesOf writes this server's stripes of one file into the destination the prepare
// step created, which must still have the source's size.
func (w *worker) copyStripesOf(ctx context.Context, job *copyJob, e entry, buf *[]byte, dirs *dirCache) error {
	if e.kind != kindFile {
		return nil
	}
	in, st, release, err := w.openPlannedSource(ctx, job, e, dirs)
	if err != nil {
		return err
	}
	defer release()
	out, dst, err := w.openPrepared(job, e, unix.O_WRONLY, dirs)
	if err != nil {
		return err
	}
	if dst.Size != st.Size {
		unix.Close(out)
		return fmt.Errorf("destination %s changed during the stage: %d bytes, the source %d", job.dst.display(job.dst.join(job.dstName, e.rel)), dst.Size, st.Size)
	}
	return w.writeStripes(ctx, job, e, in, out, st.Size, buf)
}

// finishFile gives a file its source's group, mode and times once every server wrote its
// stripes, and flushes it.
func (w *worker) finishFile(ctx context.Context, job *copyJob, e entry, buf *[]byte, dirs *dirCache) error {
	if e.kind != kindFile {
		return nil
	}
	in, st, release, err := w.openPlannedSource(ctx, job, e, dirs)
	if err != nil {
		return err
	}
	defer release()
	mode := st.Mode
	if restore := w.restoreMode(job); restore != 0 {
		// The copy ends here, whatever its outcome: the source gets its write bits back, and
		// the destination the mode the source had before it was protected.
		defer w.restoreSource(job, e, in)
		mode = st.Mode&^0o7777 | restore
	}
	out, dst, err := w.openPrepared(job, e, unix.O_RDONLY, dirs)
	if err != nil {
		return err
	}
	shown := job.dst.display(job.dst.join(job.dstName, e.rel))
	if err := w.applyMetadata(out, shown, dst, mode, st.Gid, st.Atim, st.Mtim); err != nil {
		unix.Close(out)
		return err
	}
	return w.flushAndClose(out, job, shown)
}

// protects reports whether this stage write-protects the file it stages out (a file
// stage-out with Protect).
func (w *worker) protects(job *copyJob) bool {
	return w.spec.Protect && job.src.dw && !job.tree
}

// restoreMode is the mode the prepare step took the write bits from (0: none).
func (w *worker) restoreMode(job *copyJob) uint32 {
	if !w.protects(job) || w.spec.Part == nil {
		return 0
	}
	return w.spec.Part.RestoreMode
}

// restoreSource gives a protected source (open as in) its write bits back, unless its owner
// changed its mode since the prepare step removed them.
func (w *worker) restoreSource(job *copyJob, e entry, in int) {
	restore := w.restoreMode(job)
	if restore == 0 {
		return
	}
	if err := unprotect(in, restore); err != nil {
		w.out.warn(fmt.Sprintf("%s: could not give %s its write permission back (mode %04o): %s", w.prefix,
			job.src.display(job.src.join(job.srcName, e.rel)), restore, w.reason(err)))
	}
}

// removeFile removes a file the prepare step created (the abort step).
func (w *worker) removeFile(ctx context.Context, job *copyJob, e entry, buf *[]byte, dirs *dirCache) error {
	if e.kind != kindFile {
		return nil
	}
	dstName := job.dst.join(job.dstName, e.rel)
	dp, err := dirs.parent(job.dst, dstName)
	if err == nil {
		if err = dp.unlink(); errors.Is(err, unix.ENOENT) {
			err = nil
		}
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		w.out.warn(fmt.Sprintf("%s: could not remove the partly staged %s: %s", w.prefix, job.dst.display(dstName), w.reason(err)))
	}
	if w.restoreMode(job) != 0 {
		if in, _, release, err := w.openPlannedSource(ctx, job, e, dirs); err == nil {
			w.restoreSource(job, e, in)
			release()
		}
	}
	return nil
}

// openPrepared opens a destination file of the plan, never through a link, and checks it is
// a regular file.
func (w *worker) openPrepared(job *copyJob, e entry, flags int, dirs *dirCache) (int, unix.Stat_t, error) {
	dstName := job.dst.join(job.dstName, e.rel)
	shown := job.dst.display(dstName)
	dp, err := dirs.parent(job.dst, dstName)
	if err != nil {
		return -1, unix.Stat_t{}, fmt.Errorf("cannot open the directory of %s: %s", shown, w.writeReason(job.dst, err))
	}
	fd, err := dp.open(flags, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
			return -1, unix.Stat_t{}, fmt.Errorf("destination %s changed during the stage: the file the stage created is gone", shown)
		}
		return -1, unix.Stat_t{}, fmt.Errorf("cannot open %s: %s", shown, w.writeReason(job.dst, err))
	}
	st, err := fstat(fd)
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
		err = fmt.Errorf("destination %s changed during the stage: it is no longer a regular file", shown)
	} else if err != nil {
		err = fmt.Errorf("cannot read back %s: %s", shown, w.reason(err))
	}
	if err != nil {
		unix.Close(fd)
		return -1, st, err
	}
	return fd, st, nil
}

// writeStripes copies from in to out the stripes of a file of size bytes that this server
// holds, then flushes and closes out (closing it on every path).
func (w *worker) writeStripes(ctx context.Context, job *copyJob, e entry, in, out int, size int64, buf *[]byte) error {
	dwFD := out
	if w.spec.Direction == "out" {
		dwFD = in
	}
	shown := job.dst.display(job.dst.join(job.dstName, e.rel))
	layout, err := w.layoutOf(dwFD)
	if err != nil {
		unix.Close(out)
		return fmt.Errorf("cannot read the striping of %s: %s", job.src.display(job.src.join(job.srcName, e.rel)), err)
	}
	for _, piece := range layout.Pieces(0, uint64(size)) {
		if piece.Server != w.spec.Part.Server {
			continue
		}
		if err := w.copyRange(ctx, out, in, int64(piece.BufOffset), int64(piece.Length), buf); err != nil {
			unix.Close(out)
			switch {
			case ctx.Err() != nil:
				return ctx.Err()
			case errors.Is(err, errReadSide):
				return fmt.Errorf("cannot read %s: %s", job.src.display(job.src.join(job.srcName, e.rel)), w.reason(err))
			default:
				return fmt.Errorf("cannot write %s: %s", shown, w.writeReason(job.dst, err))
			}
		}
	}
	return w.flushAndClose(out, job, shown)
}

// flushAndClose fsyncs out (unless SyncAtEnd flushes everything at the end) and closes it.
func (w *worker) flushAndClose(out int, job *copyJob, shown string) error {
	var err error
	for !w.limits.SyncAtEnd {
		if err = unix.Fsync(out); err != unix.EINTR {
			break
		}
	}
	if cerr := closeFD(out); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cannot write %s: %s", shown, w.writeReason(job.dst, err))
	}
	return nil
}

// layoutOf reads a striped file's layout through the mount (stripe.UserXattr).
func (w *worker) layoutOf(fd int) (stripe.Layout, error) {
	var buf [256]byte
	n, err := unix.Fgetxattr(fd, stripe.UserXattr, buf[:])
	for err == unix.EINTR { // the runtime's signals interrupt requests to a remote mount
		n, err = unix.Fgetxattr(fd, stripe.UserXattr, buf[:])
	}
	if err != nil {
		return stripe.Layout{}, fmt.Errorf("%s: %w (is the namespace striped?)", stripe.UserXattr, err)
	}
	return stripe.ParseText(string(buf[:n]), stripe.Layout{Servers: uint32(w.spec.Part.Servers)})
}

// copyRange copies length bytes at off from in to out (the same offset on both sides), a
// buffer at a time. A source shorter than planned is an error: the plan and the other
// servers' steps counted those bytes.
func (w *worker) copyRange(ctx context.Context, out, in int, off, length int64, buf *[]byte) error {
	if *buf == nil {
		*buf = make([]byte, w.limits.BufferBytes)
	}
	for done := int64(0); done < length; {
		if err := ctx.Err(); err != nil {
			return err
		}
		chunk := (*buf)[:min(int64(len(*buf)), length-done)]
		n, err := unix.Pread(in, chunk, off+done)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &sideError{errReadSide, err}
		}
		if n == 0 {
			return &sideError{errReadSide, errors.New("the file shrank during the stage")}
		}
		for written := 0; written < n; {
			m, err := unix.Pwrite(out, chunk[written:n], off+done+int64(written))
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return &sideError{errWriteSide, err}
			}
			written += m
		}
		done += int64(n)
		w.bytesDone.Add(uint64(n))
	}
	return nil
}
