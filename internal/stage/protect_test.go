package stage

import (
	"os"
	"path/filepath"
	"testing"
)

// A file being staged out with Protect (libdatawarp's stage-outs) has no write bits while it
// is copied; they come back at the end, and the copy has the file's own mode.
func TestProtectedStageOutWriteProtectsTheSourceWhileItCopies(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.ns, "ckpt")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(512 << 20); err != nil { // sparse: quick to make, long enough to copy
		t.Fatal(err)
	}
	f.Close()
	os.Chmod(src, 0o640)
	owned(t, src)
	s := spec(a, "out", "file", filepath.Join(a.pfs, "ckpt"), "$DW_JOB_STRIPED/ckpt")
	s.Protect = true
	owned(t, a.pfs)
	w := startWorker(t, s, true)
	if ev := w.next(t); ev.Event != eventPlan {
		t.Fatalf("plan: %+v", ev)
	}
	w.answer(t, decision{Go: true})
	ev := w.next(t)
	if ev.Event != eventProgress {
		t.Skipf("the copy ended before a progress report (%+v); too fast to look", ev)
	}
	fi, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o440 {
		t.Errorf("during the stage-out the source's mode is %v, want 0440", fi.Mode().Perm())
	}
	if last, status := w.finish(t); status != 0 {
		t.Fatalf("stage: %+v %d", last, status)
	}
	for _, p := range []string{src, filepath.Join(a.pfs, "ckpt")} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o640 {
			t.Errorf("%s after the stage: %v %v, want mode 0640", p, fi.Mode(), err)
		}
	}
}
