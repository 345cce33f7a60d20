package stage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

type entryKind uint8

const (
	kindFile entryKind = iota
	kindDir
	kindSymlink
)

// entry is one thing to create under a job's destination. rel is "" for the job's own source
// and destination (a file stage); size is the planned size of a file, which it may not exceed.
type entry struct {
	rel  string
	kind entryKind
	size int64
}

// copyJob is one source → destination pair: the whole stage for file and directory stages,
// one line for a list.
type copyJob struct {
	label     string // "list /pfs/u/l.txt line 3: " or ""
	src, dst  *side
	srcName   string
	dstName   string
	tree      bool // a directory stage: entries are below srcName and dstName
	dstExists bool // a directory stage whose destination directory existed before
	entries   []entry
}

type plan struct {
	jobs  []*copyJob
	files int64 // regular files and symbolic links to create
	bytes uint64
	// charge is what the entries will take on the instance's file system, as its capacity
	// counts it (usage.Footprint): each file's size in whole blocks, a block for each
	// directory and symbolic link. The agent reserves it for a stage-in.
	charge uint64
}

// chargeBlock is the block size charge assumes: the common one of ext4 and XFS.
const chargeBlock = 4096

// location is a path on one side, as resolved from the user's text.
type location struct {
	side          *side
	name          string
	trailingSlash bool
}

func (w *worker) locateDW(text string) (location, error) {
	p, err := parseDWPath(text)
	if err != nil {
		return location{}, err
	}
	s, ok := w.dwSides[p.variable]
	if !ok {
		rootDir, known := w.spec.Roots[p.variable]
		if !known {
			return location{}, unknownVariableError(text, p.variable, w.spec.Roots)
		}
		s, err = openDWSide(p.variable, rootDir)
		if err != nil {
			return location{}, fmt.Errorf("cannot open the burst buffer $%s on this node: %s", p.variable, w.reason(err))
		}
		w.dwSides[p.variable] = s
	}
	return location{side: s, name: p.rel, trailingSlash: p.trailingSlash}, nil
}

func (w *worker) locatePFS(text string) (location, error) {
	p, err := parsePFSPath(text)
	if err != nil {
		return location{}, err
	}
	return location{side: w.pfs, name: p.name, trailingSlash: p.trailingSlash}, nil
}

// endpoints resolves a source and destination text by direction: in = PFS → DW, out = DW → PFS.
func (w *worker) endpoints(srcText, dstText string) (src, dst location, err error) {
	if w.spec.Direction == "in" {
		if src, err = w.locatePFS(srcText); err != nil {
			return src, dst, fmt.Errorf("source: %w", err)
		}
		if dst, err = w.locateDW(dstText); err != nil {
			return src, dst, fmt.Errorf("destination: %w", err)
		}
		return src, dst, nil
	}
	if src, err = w.locateDW(srcText); err != nil {
		return src, dst, fmt.Errorf("source: %w", err)
	}
	if dst, err = w.locatePFS(dstText); err != nil {
		return src, dst, fmt.Errorf("destination: %w", err)
	}
	return src, dst, nil
}

func (w *worker) plan(ctx context.Context) (*plan, error) {
	p := &plan{}
	switch w.spec.Type {
	case "list":
		if err := w.planList(ctx, p); err != nil {
			return nil, err
		}
	default:
		srcText, dstText := w.spec.PFSPath, w.spec.DWPath
		if w.spec.Direction == "out" {
			srcText, dstText = w.spec.DWPath, w.spec.PFSPath
		}
		src, dst, err := w.endpoints(srcText, dstText)
		if err != nil {
			return nil, err
		}
		var job *copyJob
		if w.spec.Type == "file" {
			job, err = w.planFile(src, dst, "")
		} else {
			job, err = w.planTree(ctx, src, dst)
		}
		if err != nil {
			return nil, err
		}
		p.jobs = append(p.jobs, job)
	}
	for _, job := range p.jobs {
		for _, e := range job.entries {
			switch e.kind {
			case kindFile:
				p.files++
				p.bytes += uint64(e.size)
				p.charge += (uint64(e.size) + chargeBlock - 1) / chargeBlock * chargeBlock
			case kindSymlink:
				p.files++
				p.charge += chargeBlock
			case kindDir:
				p.charge += chargeBlock
			}
		}
	}
	return p, nil
}

// sourceError words a failure to reach a source.
func (w *worker) sourceError(s *side, name string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("source %s does not exist", s.display(name))
	}
	return fmt.Errorf("cannot read %s: %s", s.display(name), w.reason(err))
}

func fileKind(mode fs.FileMode) string {
	switch {
	case mode.IsDir():
		return "a directory"
	case mode&fs.ModeSymlink != 0:
		return "a symbolic link"
	case mode&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case mode&fs.ModeSocket != 0:
		return "a socket"
	case mode&fs.ModeCharDevice != 0:
		return "a character device"
	case mode&fs.ModeDevice != 0:
		return "a block device"
	}
	return "not a regular file"
}

// planFile plans one file: the source must be a regular file (links to one are followed,
// since the user named it); the destination is that path, or the directory it names.
func (w *worker) planFile(src, dst location, label string) (*copyJob, error) {
	fi, err := src.side.stat(src.name)
	if err != nil {
		return nil, w.sourceError(src.side, src.name, err)
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("source %s is a directory; stage it with type=directory", src.side.display(src.name))
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("source %s is %s; only regular files are staged", src.side.display(src.name), fileKind(fi.Mode()))
	}
	dstName := dst.name
	into := dst.trailingSlash
	if !into {
		dfi, err := dst.side.stat(dst.name)
		switch {
		case err == nil && dfi.IsDir():
			into = true // like cp: an existing directory (or a link to one) receives the file
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			// A link that cannot be followed (it leaves the instance, or loops) is replaced
			// by the file, like any link in the last component.
			if lfi, lerr := dst.side.lstat(dst.name); lerr != nil || lfi.Mode()&fs.ModeSymlink == 0 {
				return nil, fmt.Errorf("destination %s: %s", dst.side.display(dst.name), w.reason(err))
			}
		}
	}
	if into {
		_, base := src.side.split(src.name)
		dstName = dst.side.join(dst.name, base)
	}
	if dst.side.isTop(dstName) {
		return nil, fmt.Errorf("destination %s is a directory", dst.side.display(dstName))
	}
	if lfi, err := dst.side.lstat(dstName); err == nil && lfi.IsDir() {
		return nil, fmt.Errorf("destination %s is a directory; name a file, or end the destination with / to stage into it", dst.side.display(dstName))
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("destination %s: %s", dst.side.display(dstName), w.reason(err))
	}
	dir, _ := dst.side.split(dstName)
	if err := w.checkWritable(dst.side, dir); err != nil {
		return nil, err
	}
	return &copyJob{
		label: label, src: src.side, dst: dst.side, srcName: src.name, dstName: dstName,
		entries: []entry{{kind: kindFile, size: fi.Size()}},
	}, nil
}

// checkWritable finds the nearest existing directory at or above dir and checks that the user
// may create entries in it, so that a destination the user cannot write is refused by the plan,
// before any capacity is reserved or any byte copied.
func (w *worker) checkWritable(s *side, dir string) error {
	for {
		fi, err := s.stat(dir)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("destination %s is not a directory", s.display(dir))
			}
			d, err := s.openDir(dir)
			if err != nil {
				return fmt.Errorf("destination %s: %s", s.display(dir), w.reason(err))
			}
			err = unix.Faccessat(int(d.Fd()), ".", unix.W_OK|unix.X_OK, 0)
			d.Close()
			if err != nil {
				return fmt.Errorf("cannot create files in %s: %s", s.display(dir), w.reason(err))
			}
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) || s.isTop(dir) {
			return fmt.Errorf("destination %s: %s", s.display(dir), w.reason(err))
		}
		dir, _ = s.split(dir)
	}
}

// planTree plans a directory stage: the contents of src, recursively, into dst.
func (w *worker) planTree(ctx context.Context, src, dst location) (*copyJob, error) {
	fi, err := src.side.stat(src.name)
	if err != nil {
		return nil, w.sourceError(src.side, src.name, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("source %s is not a directory (it is %s); stage a file with type=file", src.side.display(src.name), fileKind(fi.Mode()))
	}
	job := &copyJob{src: src.side, dst: dst.side, srcName: src.name, dstName: dst.name, tree: true}
	dfi, err := dst.side.stat(dst.name)
	switch {
	case err == nil && !dfi.IsDir():
		return nil, fmt.Errorf("destination %s exists and is not a directory", dst.side.display(dst.name))
	case err == nil:
		job.dstExists = true
		if err := w.checkWritable(dst.side, dst.name); err != nil {
			return nil, err
		}
	case errors.Is(err, fs.ErrNotExist):
		if err := w.checkWritable(dst.side, dst.name); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("destination %s: %s", dst.side.display(dst.name), w.reason(err))
	}
	if err := w.walk(ctx, job); err != nil {
		return nil, err
	}
	return job, nil
}

// readDirBatch is how many directory entries are read at a time while walking.
const readDirBatch = 1024

// walk lists the source tree into job.entries, parents before children, never following a
// link below the top. Special files are skipped with a warning.
func (w *worker) walk(ctx context.Context, job *copyJob) error {
	s := job.src
	pending := []string{""}
	for len(pending) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		rel := pending[len(pending)-1]
		pending = pending[:len(pending)-1]
		name := s.join(job.srcName, rel)
		d, err := s.openDir(name)
		if err != nil {
			return fmt.Errorf("cannot read directory %s: %s", s.display(name), w.reason(err))
		}
		for {
			list, err := d.ReadDir(readDirBatch)
			w.planned.Add(int64(len(list)))
			for _, de := range list {
				childRel := de.Name()
				if rel != "" {
					childRel = rel + "/" + de.Name()
				}
				if len(job.entries) >= w.limits.MaxEntries {
					d.Close()
					return fmt.Errorf("source %s holds more than %d files, directories and links (limit stage.max_files_per_stage); stage it in parts", s.display(job.srcName), w.limits.MaxEntries)
				}
				switch t := de.Type(); {
				case t.IsDir():
					job.entries = append(job.entries, entry{rel: childRel, kind: kindDir})
					pending = append(pending, childRel)
				case t&fs.ModeSymlink != 0:
					job.entries = append(job.entries, entry{rel: childRel, kind: kindSymlink})
				case t.IsRegular():
					info, err := de.Info()
					if err != nil {
						d.Close()
						return fmt.Errorf("cannot read %s: %s", s.display(s.join(job.srcName, childRel)), w.reason(err))
					}
					job.entries = append(job.entries, entry{rel: childRel, kind: kindFile, size: info.Size()})
				default:
					w.out.warn(fmt.Sprintf("%s: skipped %s: it is %s; only regular files, directories and symbolic links are staged", w.prefix, s.display(s.join(job.srcName, childRel)), fileKind(t)))
				}
			}
			if errors.Is(err, io.EOF) || (err == nil && len(list) == 0) {
				break
			}
			if err != nil {
				d.Close()
				return fmt.Errorf("cannot read directory %s: %s", s.display(name), w.reason(err))
			}
		}
		d.Close()
	}
	return nil
}

// planList reads the list file (as the user) and plans each line as a file stage.
func (w *worker) planList(ctx context.Context, p *plan) error {
	list, err := w.locatePFS(w.spec.PFSPath)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	f, err := os.OpenFile(list.name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("list %s does not exist", list.name)
		}
		return fmt.Errorf("cannot read list %s: %s", list.name, w.reason(err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("cannot read list %s: %s", list.name, w.reason(err))
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("list %s is %s; a list is a file of \"<source> <destination>\" lines", list.name, fileKind(fi.Mode()))
	}
	data, err := io.ReadAll(io.LimitReader(f, w.limits.MaxListBytes+1))
	if err != nil {
		return fmt.Errorf("cannot read list %s: %s", list.name, w.reason(err))
	}
	if int64(len(data)) > w.limits.MaxListBytes {
		return fmt.Errorf("list %s is larger than %d bytes (limit stage.max_list_size); split it into several lists", list.name, w.limits.MaxListBytes)
	}
	var bad listErrors
	lines, err := parseList(data, list.name, w.limits.MaxEntries, &bad)
	if err != nil {
		return err
	}
	type destinationKey struct {
		side *side
		name string
	}
	claimed := map[destinationKey]int{}
	for _, line := range lines {
		if err := ctx.Err(); err != nil {
			return err
		}
		label := fmt.Sprintf("list %s line %d", list.name, line.number)
		src, dst, err := w.endpoints(line.src, line.dst)
		if err != nil {
			bad.add(fmt.Errorf("%s: %w", label, err))
			continue
		}
		job, err := w.planFile(src, dst, label+": ")
		if err != nil {
			bad.add(fmt.Errorf("%s: %w", label, err))
			continue
		}
		key := destinationKey{job.dst, job.dstName}
		if first, dup := claimed[key]; dup {
			bad.add(fmt.Errorf("%s: destination %s is also the destination of line %d; each file may be written once", label, job.dst.display(job.dstName), first))
			continue
		}
		claimed[key] = line.number
		p.jobs = append(p.jobs, job)
	}
	return bad.err()
}
