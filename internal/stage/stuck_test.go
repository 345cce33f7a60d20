package stage

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// stallFS is a user's FUSE server that stops answering: it serves one file, "input", whose
// reads wait until release is closed (as a server the user SIGSTOPped does; SIGTERM's
// interrupt is ignored, as a stopped server ignores it).
type stallRoot struct {
	fs.Inode
	file *stallFile
}

type stallFile struct {
	fs.Inode
	uid, gid uint32
	size     uint64
	release  chan struct{}
}

func (r *stallRoot) OnAdd(ctx context.Context) {
	r.AddChild("input", r.NewPersistentInode(ctx, r.file, fs.StableAttr{Mode: syscall.S_IFREG}), false)
}

func (r *stallRoot) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o755
	return 0
}

func (f *stallFile) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode, out.Size, out.Uid, out.Gid = syscall.S_IFREG|0o644, f.size, f.uid, f.gid
	out.Mtime = uint64(past.Unix())
	return 0
}

func (f *stallFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (f *stallFile) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	<-f.release
	n := min(int64(len(dest)), int64(f.size)-off)
	if n < 0 {
		n = 0
	}
	return fuse.ReadResultData(make([]byte, n)), 0
}

// A worker blocked in a FUSE request the server never answers cannot die, even from SIGKILL,
// until the server answers. Its stage must end all the same (bounded: stall_timeout, then
// cancel_grace twice), saying so, and the process must be counted as stuck until it is gone.
func TestStuckWorkerEndsItsStageAndIsCounted(t *testing.T) {
	if !isRoot() {
		t.Skip("mounting the stalling FUSE server for another user needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("needs /dev/fuse")
	}
	a := newArea(t)
	uid, gid := stageIdentity()
	file := &stallFile{uid: uid, gid: gid, size: 1 << 20, release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(file.release) }) }
	mnt := filepath.Join(a.pfs, "home")
	mkdir(t, mnt, 0o755)
	server, err := fs.Mount(mnt, &stallRoot{file: file}, &fs.Options{MountOptions: fuse.MountOptions{
		AllowOther: true, DirectMount: true, Name: "stalltest"}})
	if err != nil {
		t.Skipf("cannot mount a FUSE file system here: %v", err)
	}
	t.Cleanup(func() { release(); server.Unmount() })

	CloseIdleWorkers(10 * time.Second) // the earlier tests' idle workers: only this stage's is counted
	limits := testLimits()
	limits.StallTimeout = 500 * time.Millisecond
	limits.CancelGrace = 300 * time.Millisecond
	r := Start(context.Background(), workerExe, spec(a, "in", "file", filepath.Join(mnt, "input"), "$DW_JOB_STRIPED/input"), limits, nil)
	select {
	case <-r.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("the stage of a worker stuck on a FUSE read is still running 30 s later: %+v", r.Status())
	}
	st := r.Status()
	for _, want := range []string{"no progress for 500ms (stage.stall_timeout)", "did not exit 300ms after SIGKILL", "spillway_agent_stage_workers_stuck"} {
		if st.Status != "failed" || !strings.Contains(st.Error, want) {
			t.Errorf("status %q error %q, want failed with %q", st.Status, st.Error, want)
		}
	}
	if alive, stuck := WorkerProcesses(); alive != 1 || stuck != 1 {
		t.Errorf("while the worker is blocked: %d worker processes alive, %d stuck; want 1 and 1", alive, stuck)
	}
	// The server answers: the killed worker dies at once and is no longer counted.
	release()
	deadline := time.Now().Add(30 * time.Second)
	for {
		alive, stuck := WorkerProcesses()
		if alive == 0 && stuck == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after the server answered: %d worker processes alive, %d stuck", alive, stuck)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := r.Status(); st.Status != "failed" {
		t.Errorf("the worker's exit changed the ended stage: %+v", st)
	}
}
