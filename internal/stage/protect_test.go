package stage

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
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

// A mode the file's owner sets while it is protected (chmod needs no write permission) is
// kept when the stage-out ends; the copy has the mode the file had when the copy started.
func TestProtectedStageOutKeepsAModeTheOwnerSet(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.ns, "ckpt")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(512 << 20); err != nil {
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
	if ev := w.next(t); ev.Event != eventProgress {
		t.Skipf("the copy ended before a progress report (%+v); too fast to look", ev)
	}
	if err := os.Chmod(src, 0o400); err != nil {
		t.Fatal(err)
	}
	if last, status := w.finish(t); status != 0 {
		t.Fatalf("stage: %+v %d", last, status)
	}
	for p, want := range map[string]os.FileMode{src: 0o400, filepath.Join(a.pfs, "ckpt"): 0o640} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s after the stage: %v %v, want mode %v", p, fi.Mode(), err, want)
		}
	}
}

// A split stage-out with Protect (a striped instance on several servers): the prepare step
// write-protects the source before it copies anything and reports the mode the source had;
// the copy steps leave it protected; the finish step gives the mode back and the destination
// gets the source's own mode; the abort step gives it back too and removes the destination.
// A mode the owner set meanwhile is kept.
func TestSplitStageOutWriteProtectsTheSource(t *testing.T) {
	for _, end := range []string{agentapi.StepFinish, agentapi.StepAbort, "owner_changed_the_mode"} {
		t.Run(end, func(t *testing.T) {
			a := newArea(t)
			src, dst := filepath.Join(a.ns, "ckpt"), filepath.Join(a.pfs, "ckpt")
			content := strings.Repeat("0123456789", 2000) // five 4 KiB stripes over two servers
			writeFile(t, src, content, 0o640, time.Unix(1_700_000_000, 0))
			// The layout a striped mount shows (the worker reads it through the mount).
			if err := unix.Setxattr(src, stripe.UserXattr, []byte("stripe_size=4096 stripe_width=2 start=0"), 0); err != nil {
				t.Skipf("this file system keeps no user extended attributes: %v", err)
			}
			owned(t, a.pfs)
			s := spec(a, "out", "file", dst, "$DW_JOB_STRIPED/ckpt")
			s.Protect = true
			run := func(step string, server int, restore uint32) agentapi.StageStatus {
				t.Helper()
				ps := s
				ps.Part = &agentapi.StagePart{Step: step, Server: server, Servers: 2, RestoreMode: restore}
				return mustComplete(t, ps)
			}
			perm := func(p string) os.FileMode {
				t.Helper()
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				return fi.Mode().Perm()
			}
			if st := run(agentapi.StepPrepare, 0, 0); st.ProtectedMode != 0o640 {
				t.Fatalf("prepare reported protected mode %o, want 0640", st.ProtectedMode)
			}
			if m := perm(src); m != 0o440 {
				t.Fatalf("after prepare the source's mode is %v, want 0440 (write-protected while it is staged out)", m)
			}
			if st := run(agentapi.StepCopy, 1, 0o640); st.ProtectedMode != 0 || perm(src) != 0o440 {
				t.Fatalf("after the copy: source %v, reported %o; want 0440 and nothing reported", perm(src), st.ProtectedMode)
			}
			want := os.FileMode(0o640)
			if end == "owner_changed_the_mode" {
				os.Chmod(src, 0o400)
				want = 0o400
			}
			final := end
			if final != agentapi.StepAbort {
				final = agentapi.StepFinish
			}
			run(final, 0, 0o640)
			if m := perm(src); m != want {
				t.Errorf("after %s the source's mode is %v, want %v", final, m, want)
			}
			if final == agentapi.StepAbort {
				if exists(dst) {
					t.Errorf("abort left the partly staged %s", dst)
				}
				return
			}
			if got := readFile(t, dst); got != content {
				t.Errorf("staged out %d bytes, want the %d of the source", len(got), len(content))
			}
			if m := perm(dst); m != 0o640 {
				t.Errorf("the staged-out file's mode is %v, want the source's own 0640", m)
			}
		})
	}
}

// A prepare step run again (its agent restarted before the controller heard the first run's
// report) reports the mode the file had before the first run protected it, not the protected
// mode; the finish gives it back and leaves no saved mode behind.
func TestSplitStageOutProtectedTwiceGivesBackTheFirstMode(t *testing.T) {
	a := newArea(t)
	src, dst := filepath.Join(a.ns, "ckpt"), filepath.Join(a.pfs, "ckpt")
	writeFile(t, src, strings.Repeat("x", 10000), 0o640, time.Unix(1_700_000_000, 0))
	if err := unix.Setxattr(src, stripe.UserXattr, []byte("stripe_size=4096 stripe_width=2 start=0"), 0); err != nil {
		t.Skipf("this file system keeps no user extended attributes: %v", err)
	}
	owned(t, a.pfs)
	s := spec(a, "out", "file", dst, "$DW_JOB_STRIPED/ckpt")
	s.Protect = true
	run := func(step string, restore uint32) agentapi.StageStatus {
		t.Helper()
		ps := s
		ps.Part = &agentapi.StagePart{Step: step, Server: 0, Servers: 2, RestoreMode: restore}
		return mustComplete(t, ps)
	}
	for i := 1; i <= 2; i++ {
		if st := run(agentapi.StepPrepare, 0); st.ProtectedMode != 0o640 {
			t.Fatalf("prepare run %d reported protected mode %o, want 0640", i, st.ProtectedMode)
		}
	}
	run(agentapi.StepCopy, 0o640)
	run(agentapi.StepFinish, 0o640)
	for _, p := range []string{src, dst} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o640 {
			t.Errorf("%s after the stage: %v %v, want mode 0640", p, fi.Mode(), err)
		}
	}
	if _, err := unix.Getxattr(src, protectedModeXattr, make([]byte, 16)); err != unix.ENODATA {
		t.Errorf("the saved mode outlived the stage: %v", err)
	}
}

// A file its owner made read-only is not taken for one a stage protected.
func TestProtectLeavesAReadOnlyFileAlone(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, nil, 0o440); err != nil {
		t.Fatal(err)
	}
	os.Chmod(p, 0o440)
	fd, err := unix.Open(p, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if got := protect(fd, 0o440); got != 0 {
		t.Fatalf("protect of a read-only file: %o, want 0 (nothing to give back)", got)
	}
	os.Chmod(p, 0o644)
	if got := protect(fd, 0o644); got != 0o644 {
		t.Fatalf("protect: %o", got)
	}
	if got := protect(fd, 0o444); got != 0o644 {
		t.Fatalf("protect again (a rerun): %o, want the first mode 0644", got)
	}
	if err := unprotect(fd, 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
		t.Fatalf("after unprotect: %v", fi.Mode())
	}
	if got := protect(fd, 0o644); got != 0o644 {
		t.Fatalf("a later stage-out protects afresh: %o", got)
	}
}
