package stage

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

var past = time.Date(2021, 3, 4, 5, 6, 7, 890123456, time.UTC)

func TestStageInFileCreatesParentsKeepsModeAndTime(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "run.sh")
	writeFile(t, src, "#!/bin/sh\necho hi\n", 0o755, past)

	st := mustComplete(t, spec(a, "in", "file", src, "$DW_JOB_STRIPED/sub/dir/run.sh"))

	dst := filepath.Join(a.ns, "sub/dir/run.sh")
	if got := readFile(t, dst); got != "#!/bin/sh\necho hi\n" {
		t.Errorf("content %q", got)
	}
	fi, _ := os.Stat(dst)
	if fi.Mode() != 0o755 {
		t.Errorf("mode %v, want -rwxr-xr-x", fi.Mode())
	}
	if !fi.ModTime().Equal(past) {
		t.Errorf("mtime %v, want %v", fi.ModTime(), past)
	}
	ownedByStager(t, a.ns)
	if st.FilesTotal != 1 || st.FilesDone != 1 || st.BytesTotal != 18 || st.BytesDone != 18 {
		t.Errorf("counts: %+v", st)
	}
}

func TestStageFileIntoDirectory(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "input.dat")
	writeFile(t, src, "data", 0o644, past)
	mkdir(t, filepath.Join(a.ns, "existing"), 0o755)

	// A trailing slash means "into this directory", created if missing.
	mustComplete(t, spec(a, "in", "file", src, "$DW_JOB_STRIPED/new/"))
	// An existing directory receives the file, as with cp.
	mustComplete(t, spec(a, "in", "file", src, "$DW_JOB_STRIPED/existing"))
	// The namespace root itself.
	mustComplete(t, spec(a, "in", "file", src, "${DW_JOB_STRIPED}"))

	for _, p := range []string{"new/input.dat", "existing/input.dat", "input.dat"} {
		if got := readFile(t, filepath.Join(a.ns, p)); got != "data" {
			t.Errorf("%s: %q", p, got)
		}
	}
}

func TestStageOutFileTruncatesTheDestination(t *testing.T) {
	a := newArea(t)
	writeFile(t, filepath.Join(a.ns, "result"), "short", 0o640, past)
	dst := filepath.Join(a.pfs, "out", "result")
	mkdir(t, filepath.Join(a.pfs, "out"), 0o755)
	writeFile(t, dst, "a much longer previous result", 0o600, time.Now())

	mustComplete(t, spec(a, "out", "file", dst, "$DW_JOB_STRIPED/result"))

	if got := readFile(t, dst); got != "short" {
		t.Errorf("content %q, want the new content only", got)
	}
	fi, _ := os.Stat(dst)
	if fi.Mode() != 0o640 || !fi.ModTime().Equal(past) {
		t.Errorf("mode %v mtime %v, want 0640 and %v", fi.Mode(), fi.ModTime(), past)
	}
}

// makeTree builds a source tree with every kind of thing a stage must reproduce.
func makeTree(t *testing.T, root string) {
	mkdir(t, root, 0o750)
	mkdir(t, filepath.Join(root, "a/b/c"), 0o711)
	mkdir(t, filepath.Join(root, "a/b"), 0o755)
	mkdir(t, filepath.Join(root, "a"), 0o700)
	writeFile(t, filepath.Join(root, "top.txt"), "top", 0o644, past)
	writeFile(t, filepath.Join(root, "empty"), "", 0o600, past.Add(time.Hour))
	writeFile(t, filepath.Join(root, "a/b/c/deep.bin"), strings.Repeat("x", 100_000), os.ModeSetuid|0o755, past)
	writeFile(t, filepath.Join(root, "a/script"), "run", 0o755, past)
	// A read-only directory with contents: its mode can only be set after they are written.
	mkdir(t, filepath.Join(root, "ro"), 0o755)
	writeFile(t, filepath.Join(root, "ro/inside"), "locked", 0o444, past)
	symlink(t, "../top.txt", filepath.Join(root, "a/to-top"))
	symlink(t, "/etc/passwd", filepath.Join(root, "absolute-link"))
	symlink(t, "does/not/exist", filepath.Join(root, "dangling"))
	if err := os.Link(filepath.Join(root, "top.txt"), filepath.Join(root, "a/hard")); err != nil {
		t.Fatal(err)
	}
	// Links have times of their own, which cp -a keeps too.
	for _, link := range []string{"a/to-top", "absolute-link", "dangling"} {
		ts := []unix.Timespec{unix.NsecToTimespec(past.UnixNano()), unix.NsecToTimespec(past.Add(time.Minute).UnixNano())}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(root, link), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(root, "ro"), 0o555)
	// Directory times last: creating entries changed them.
	for _, d := range []string{"a/b/c", "a/b", "a", "ro", "."} {
		os.Chtimes(filepath.Join(root, d), past, past.Add(time.Duration(len(d))*time.Second))
	}
}

func TestStageDirectoryBothWays(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "inputs")
	makeTree(t, src)

	in := mustComplete(t, spec(a, "in", "directory", src, "$DW_JOB_STRIPED/work"))
	sameTree(t, src, filepath.Join(a.ns, "work"))
	ownedByStager(t, a.ns)
	// Regular files and links: top, empty, deep.bin, script, inside, hard, and three links.
	if in.FilesTotal != 9 || in.FilesDone != 9 || in.BytesTotal != 3+100_000+3+6+3 {
		t.Errorf("counts: %+v", in)
	}
	// The created top directory takes the source's mode.
	if fi, _ := os.Stat(filepath.Join(a.ns, "work")); fi.Mode().Perm() != 0o750 {
		t.Errorf("created destination mode %v, want 0750", fi.Mode())
	}

	back := filepath.Join(a.pfs, "back")
	mkdir(t, back, 0o700)
	mustComplete(t, spec(a, "out", "directory", back, "$DW_JOB_STRIPED/work"))
	sameTree(t, src, back)
	// An existing destination keeps its own mode: a private directory stays private.
	if fi, _ := os.Stat(back); fi.Mode().Perm() != 0o700 {
		t.Errorf("existing destination mode changed to %v", fi.Mode())
	}
}

func TestRestageOverReadOnlyFilesAndDirectories(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "ref")
	makeTree(t, src)
	mustComplete(t, spec(a, "in", "directory", src, "$DW_JOB_STRIPED/ref"))
	// Stage the same tree again over its read-only copy (a second job on a persistent buffer).
	os.Chmod(filepath.Join(src, "ro"), 0o755) // only root may write into it as it is
	writeFile(t, filepath.Join(src, "ro/new"), "more", 0o644, past)
	os.Chmod(filepath.Join(src, "ro"), 0o555)
	os.Chtimes(filepath.Join(src, "ro"), past, past)
	mustComplete(t, spec(a, "in", "directory", src, "$DW_JOB_STRIPED/ref"))
	sameTree(t, src, filepath.Join(a.ns, "ref"))
}

func TestStageListBothWays(t *testing.T) {
	a := newArea(t)
	writeFile(t, filepath.Join(a.pfs, "one"), "1", 0o644, past)
	writeFile(t, filepath.Join(a.pfs, "two"), "22", 0o600, past)
	list := filepath.Join(a.pfs, "in.list")
	writeFile(t, list, fmt.Sprintf("# inputs\n\n%s $DW_JOB_STRIPED/x/one\n  %s\t${DW_JOB_STRIPED}/y/  \r\n", filepath.Join(a.pfs, "one"), filepath.Join(a.pfs, "two")), 0o644, past)

	st := mustComplete(t, spec(a, "in", "list", list, ""))
	if readFile(t, filepath.Join(a.ns, "x/one")) != "1" || readFile(t, filepath.Join(a.ns, "y/two")) != "22" {
		t.Error("list stage_in did not copy both files")
	}
	if st.FilesTotal != 2 || st.BytesTotal != 3 {
		t.Errorf("counts: %+v", st)
	}

	outList := filepath.Join(a.pfs, "out.list")
	writeFile(t, outList, fmt.Sprintf("$DW_JOB_STRIPED/x/one %s/back/one\n$DW_JOB_STRIPED/y/two %s/back/\n", a.pfs, a.pfs), 0o644, past)
	mustComplete(t, spec(a, "out", "list", outList, ""))
	if readFile(t, filepath.Join(a.pfs, "back/one")) != "1" || readFile(t, filepath.Join(a.pfs, "back/two")) != "22" {
		t.Error("list stage_out did not copy both files")
	}
	if fi, _ := os.Stat(filepath.Join(a.pfs, "back/two")); fi.Mode() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode())
	}
}

func TestListErrorsNameTheLine(t *testing.T) {
	a := newArea(t)
	writeFile(t, filepath.Join(a.pfs, "one"), "1", 0o644, past)
	one := filepath.Join(a.pfs, "one")
	cases := []struct {
		name, content string
		want          []string
	}{
		{"three words", "# c\n\n" + one + " $DW_JOB_STRIPED/a extra\n", []string{`line 3: expected "<source> <destination>", found 3 words`}},
		{"missing source", one + " $DW_JOB_STRIPED/a\n" + one + "x $DW_JOB_STRIPED/b\n", []string{"line 2: source " + one + "x does not exist"}},
		{"same destination", one + " $DW_JOB_STRIPED/a\n" + one + " $DW_JOB_STRIPED/a\n", []string{"line 2: destination $DW_JOB_STRIPED/a is also the destination of line 1"}},
		{"directory source", a.pfs + " $DW_JOB_STRIPED/a\n", []string{"line 1: source " + a.pfs + " is a directory"}},
		{"escape", one + " $DW_JOB_STRIPED/../../etc/x\n", []string{"line 1: destination: ", "climbs out of $DW_JOB_STRIPED"}},
		{"relative source", "one $DW_JOB_STRIPED/a\n", []string{`line 1: source: PFS path "one" must be absolute`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			list := filepath.Join(a.pfs, "list.txt")
			writeFile(t, list, c.content, 0o644, past)
			want := append([]string{"stage_in line 12: list " + list}, c.want...)
			s := spec(a, "in", "list", list, "")
			s.Line = 12
			mustFail(t, s, want...)
			emptyDir(t, a.ns)
		})
	}
	mustFail(t, spec(a, "in", "list", filepath.Join(a.pfs, "nope.txt"), ""), "list "+filepath.Join(a.pfs, "nope.txt")+" does not exist")
	// Every bad line is named at once, so that the user fixes them all in one go.
	list := filepath.Join(a.pfs, "list.txt")
	writeFile(t, list, one+" $DW_JOB_STRIPED/a\n"+one+" $DW_JOB_STRIPED/b extra\n"+one+"x $DW_JOB_STRIPED/c\n"+one+" $DW_JOB_STRIPED/../x\n", 0o644, past)
	mustFail(t, spec(a, "in", "list", list, ""), "3 lines are wrong", "line 2: expected", "line 3: source "+one+"x does not exist", "line 4: destination")
	emptyDir(t, a.ns)
}

func TestPathErrors(t *testing.T) {
	a := newArea(t)
	writeFile(t, filepath.Join(a.pfs, "f"), "f", 0o644, past)
	f := filepath.Join(a.pfs, "f")
	cases := []struct {
		name          string
		dir, typ      string
		pfs, dw, want string
	}{
		{"missing source", "in", "file", filepath.Join(a.pfs, "missing"), "$DW_JOB_STRIPED/x", "source " + filepath.Join(a.pfs, "missing") + " does not exist"},
		{"missing dw source", "out", "file", filepath.Join(a.pfs, "x"), "$DW_JOB_STRIPED/missing", "source $DW_JOB_STRIPED/missing does not exist"},
		{"unknown variable", "in", "file", f, "$DW_JOB_PRIVATE/x", "$DW_JOB_PRIVATE is not a burst buffer of this job (known: $DW_JOB_STRIPED)"},
		{"typo hint", "in", "file", f, "$DW_JOB_STRIPEDx", "did you mean $DW_JOB_STRIPED/x?"},
		{"no variable", "in", "file", f, "/var/x", "must start with a variable"},
		{"shell variable", "in", "file", "$SCRATCH/f", "$DW_JOB_STRIPED/x", "environment variables are not expanded"},
		{"directory as file", "in", "file", a.pfs, "$DW_JOB_STRIPED/x", "is a directory; stage it with type=directory"},
		{"file as directory", "in", "directory", f, "$DW_JOB_STRIPED/x", "is not a directory (it is not a regular file"},
		{"bad type", "in", "tree", f, "$DW_JOB_STRIPED/x", `type "tree" is not file, directory or list`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mustFail(t, spec(a, c.dir, c.typ, c.pfs, c.dw), c.want)
		})
	}
}

func TestEscapesAreRefused(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "f")
	writeFile(t, src, "payload", 0o644, past)
	secret := filepath.Join(a.outside, "secret")
	writeFile(t, secret, "secret", 0o644, past)
	victim := filepath.Join(a.outside, "victim")
	writeFile(t, victim, "untouched", 0o644, past)
	// Links planted inside the instance by a job.
	symlink(t, a.outside, filepath.Join(a.ns, "abs-dir"))
	symlink(t, "../outside", filepath.Join(a.ns, "rel-dir"))
	symlink(t, secret, filepath.Join(a.ns, "leak"))
	symlink(t, victim, filepath.Join(a.ns, "result"))

	t.Run("dot-dot", func(t *testing.T) {
		mustFail(t, spec(a, "in", "file", src, "$DW_JOB_STRIPED/../outside/f"), `climbs out of $DW_JOB_STRIPED with ".."`)
	})
	t.Run("write through absolute link", func(t *testing.T) {
		mustFail(t, spec(a, "in", "file", src, "$DW_JOB_STRIPED/abs-dir/f"), "$DW_JOB_STRIPED/abs-dir", "leads outside the instance")
	})
	t.Run("write through relative link", func(t *testing.T) {
		mustFail(t, spec(a, "in", "directory", a.pfs, "$DW_JOB_STRIPED/rel-dir/sub"), "leads outside the instance")
	})
	t.Run("read through link", func(t *testing.T) {
		mustFail(t, spec(a, "out", "file", filepath.Join(a.pfs, "stolen"), "$DW_JOB_STRIPED/leak"), "$DW_JOB_STRIPED/leak", "leads outside the instance")
		if exists(filepath.Join(a.pfs, "stolen")) {
			t.Error("a file was read through a link leaving the instance")
		}
	})
	t.Run("last component link is replaced, not followed", func(t *testing.T) {
		mustComplete(t, spec(a, "in", "file", src, "$DW_JOB_STRIPED/result"))
		if readFile(t, victim) != "untouched" {
			t.Error("the stage wrote through a link")
		}
		fi, _ := os.Lstat(filepath.Join(a.ns, "result"))
		if !fi.Mode().IsRegular() || readFile(t, filepath.Join(a.ns, "result")) != "payload" {
			t.Errorf("destination is %v, want the staged regular file", fi.Mode())
		}
	})
	t.Run("links in a staged-out tree stay links", func(t *testing.T) {
		out := filepath.Join(a.pfs, "tree-out")
		mustComplete(t, spec(a, "out", "directory", out, "$DW_JOB_STRIPED/"))
		target, err := os.Readlink(filepath.Join(out, "leak"))
		if err != nil || target != secret {
			t.Errorf("leak copied as %q (%v), want a link to %s", target, err, secret)
		}
	})
	t.Run("a directory over a link is refused", func(t *testing.T) {
		tree := filepath.Join(a.pfs, "tree")
		mkdir(t, filepath.Join(tree, "rel-dir"), 0o755)
		writeFile(t, filepath.Join(tree, "rel-dir/f"), "x", 0o644, past)
		mustFail(t, spec(a, "in", "directory", tree, "$DW_JOB_STRIPED/"), "a symbolic link is there, and staging never writes through links")
	})
	list, _ := os.ReadDir(a.outside)
	if len(list) != 2 || readFile(t, secret) != "secret" || readFile(t, victim) != "untouched" {
		t.Errorf("outside the instance changed: %v", list)
	}
}

func TestSpecialFilesAreSkippedWithAWarning(t *testing.T) {
	a := newArea(t)
	tree := filepath.Join(a.pfs, "tree")
	mkdir(t, tree, 0o755)
	writeFile(t, filepath.Join(tree, "file"), "f", 0o644, past)
	if err := syscall.Mkfifo(filepath.Join(tree, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	owned(t, filepath.Join(tree, "pipe"))
	ln, err := net.Listen("unix", filepath.Join(tree, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	st, r := runStage(t, spec(a, "in", "directory", tree, "$DW_JOB_STRIPED/t"))
	if st.Status != "complete" {
		t.Fatalf("status %q error %q", st.Status, st.Error)
	}
	warnings, _ := r.Warnings()
	joined := strings.Join(warnings, "\n")
	for _, want := range []string{"skipped " + filepath.Join(tree, "pipe") + ": it is a named pipe", "skipped " + filepath.Join(tree, "sock") + ": it is a socket"} {
		if !strings.Contains(joined, want) {
			t.Errorf("warnings %q lack %q", joined, want)
		}
	}
	if exists(filepath.Join(a.ns, "t/pipe")) || exists(filepath.Join(a.ns, "t/sock")) || !exists(filepath.Join(a.ns, "t/file")) {
		t.Error("special files were copied or the regular file was not")
	}
	// Named on its own, a special file is an error: the user asked for it.
	mustFail(t, spec(a, "in", "file", filepath.Join(tree, "pipe"), "$DW_JOB_STRIPED/p"), "is a named pipe; only regular files are staged")
}

func TestRefusedPlanWritesNothing(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "tree")
	makeTree(t, src)
	var asked []uint64
	r := Start(context.Background(), workerExe, spec(a, "in", "directory", src, "$DW_JOB_STRIPED/deep/work"), testLimits(), func(bytes uint64) error {
		asked = append(asked, bytes)
		return errors.New("instance 12 has 100 bytes free, the stage needs 100015")
	})
	st := r.Wait()
	if st.Status != "failed" || st.Error != "stage_in: not started: instance 12 has 100 bytes free, the stage needs 100015" {
		t.Errorf("status %q error %q", st.Status, st.Error)
	}
	// What 100015 bytes take on disk: each file's size in whole blocks, a block for each
	// directory and symbolic link (usage.Footprint).
	if len(asked) != 1 || asked[0] < 100015 || asked[0]%chargeBlock != 0 || st.BytesTotal != 100015 {
		t.Errorf("reserve asked for %v, plan says %d bytes; want one request for 100015 bytes in whole blocks", asked, st.BytesTotal)
	}
	emptyDir(t, a.ns)
}

func TestCancelStopsALargeStage(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "huge")
	sparseFile(t, src, 64<<30)
	limits := testLimits()
	limits.ChunkBytes = 4 << 20
	r := Start(context.Background(), workerExe, spec(a, "in", "file", src, "$DW_JOB_STRIPED/huge"), limits, nil)
	for r.Status().BytesDone == 0 {
		select {
		case <-r.Done():
			t.Fatalf("ended before it could be canceled: %+v", r.Status())
		case <-time.After(5 * time.Millisecond):
		}
	}
	r.Cancel()
	r.Cancel() // twice is once
	select {
	case <-r.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the stage did not stop after Cancel")
	}
	st := r.Status()
	if st.Status != "canceled" || st.Error != "stage_in: canceled" {
		t.Errorf("status %q error %q", st.Status, st.Error)
	}
	if st.BytesDone >= st.BytesTotal {
		t.Errorf("copied everything (%d bytes) before the cancel took effect", st.BytesDone)
	}
	if exists(filepath.Join(a.ns, "huge")) {
		t.Error("the partial file was left behind")
	}
}

func TestTimeoutFailsTheStage(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "huge")
	sparseFile(t, src, 64<<30)
	limits := testLimits()
	limits.Timeout = 300 * time.Millisecond
	limits.ChunkBytes = 4 << 20
	r := Start(context.Background(), workerExe, spec(a, "in", "file", src, "$DW_JOB_STRIPED/huge"), limits, nil)
	st := r.Wait()
	if st.Status != "failed" || !strings.Contains(st.Error, "stage_in: timed out after 300ms (limit stage.timeout) with 0 of 1 files and ") {
		t.Errorf("status %q error %q", st.Status, st.Error)
	}
	if exists(filepath.Join(a.ns, "huge")) {
		t.Error("the partial file was left behind")
	}
}

func TestContextEndCancels(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "huge")
	sparseFile(t, src, 64<<30)
	ctx, cancel := context.WithCancel(context.Background())
	r := Start(ctx, workerExe, spec(a, "in", "file", src, "$DW_JOB_STRIPED/huge"), testLimits(), nil)
	cancel()
	if st := r.Wait(); st.Status != "canceled" {
		t.Errorf("status %q error %q", st.Status, st.Error)
	}
}

func TestDestinationNotWritableIsRefusedByThePlan(t *testing.T) {
	a := newArea(t)
	writeFile(t, filepath.Join(a.ns, "result"), "r", 0o644, past)
	locked := filepath.Join(a.pfs, "locked")
	mkdir(t, locked, 0o555)
	uid, _ := stageIdentity()
	mustFail(t, spec(a, "out", "file", filepath.Join(locked, "sub/result"), "$DW_JOB_STRIPED/result"),
		fmt.Sprintf("stage_out: cannot create files in %s: permission denied (staging runs as uid %d)", locked, uid))
}

func TestUnreadableSourceAsAnotherUser(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root: the agent must run the worker as another user (nobody) to show the kernel refusing it")
	}
	a := newArea(t)
	secret := filepath.Join(a.pfs, "root-only")
	if err := os.WriteFile(secret, []byte("root's"), 0o600); err != nil { // owned by root
		t.Fatal(err)
	}
	s := spec(a, "in", "file", secret, "$DW_JOB_STRIPED/x")
	s.Line = 4
	mustFail(t, s, fmt.Sprintf("stage_in line 4: cannot read %s: permission denied (staging runs as uid 65534)", secret))
	emptyDir(t, a.ns)

	// The same inside a tree: the copy of the readable part is not left behind half-done.
	tree := filepath.Join(a.pfs, "tree")
	mkdir(t, tree, 0o755)
	if err := os.WriteFile(filepath.Join(tree, "root-only"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustFail(t, spec(a, "in", "directory", tree, "$DW_JOB_STRIPED/t"), "cannot read "+filepath.Join(tree, "root-only")+": permission denied (staging runs as uid 65534)")
	if exists(filepath.Join(a.ns, "t/root-only")) {
		t.Error("a file that could not be read exists in the destination")
	}
}

func TestRootStagesAreRefusedByDefault(t *testing.T) {
	a := newArea(t)
	s := spec(a, "in", "file", "/etc/hostname", "$DW_JOB_STRIPED/x")
	s.UID, s.GID = 0, 0
	mustFail(t, s, "refusing to stage as uid 0 (root): [stage] allow_root is off, the default of a system install (DataWarp staged as the job's user, and a uid 0 there is almost always a missing one; a home that root runs allows it); if root's own jobs must stage, set allow_root = true under [stage] in the storage nodes' configuration and restart their agents")
}

func TestWorkerCredential(t *testing.T) {
	groups := func(uid, gid uint32) ([]uint32, error) { return []uint32{gid, 4242}, nil }
	s := spec(area{}, "in", "file", "/x", "$DW_JOB_STRIPED/x")
	s.UID, s.GID = 1001, 1001

	if _, err := workerCredential(s, 1000, false, groups); err == nil || err.Error() != "cannot stage as uid 1001: this agent runs as uid 1000, not root" {
		t.Errorf("non-root agent for another uid: %v", err)
	}
	if c, err := workerCredential(s, 1001, false, groups); err != nil || c != nil {
		t.Errorf("non-root agent for its own uid: %v %v; want to run as itself", c, err)
	}
	c, err := workerCredential(s, 0, false, groups)
	if err != nil || c.Uid != 1001 || c.Gid != 1001 || len(c.Groups) != 2 || c.Groups[1] != 4242 {
		t.Errorf("root agent: %+v %v", c, err)
	}
	failing := func(uid, gid uint32) ([]uint32, error) { return nil, errors.New("no such user") }
	if _, err := workerCredential(s, 0, false, failing); err == nil {
		t.Error("a user whose groups cannot be found was accepted")
	}
	s.UID = 0
	if _, err := workerCredential(s, 0, true, groups); err != nil {
		t.Errorf("AllowRoot: %v", err)
	}
}

func TestLimitsAreValidated(t *testing.T) {
	a := newArea(t)
	r := Start(context.Background(), workerExe, spec(a, "in", "file", "/etc/hostname", "$DW_JOB_STRIPED/x"), Limits{MaxParallel: -1}, nil)
	if st := r.Wait(); st.Status != "failed" || !strings.Contains(st.Error, "staging limit MaxParallel is negative") {
		t.Errorf("status %q error %q", st.Status, st.Error)
	}
}

func TestSyncAtEndStagesTheSame(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "tree")
	makeTree(t, src)
	limits := testLimits()
	limits.SyncAtEnd = true
	st := Start(context.Background(), workerExe, spec(a, "in", "directory", src, "$DW_JOB_STRIPED/t"), limits, nil).Wait()
	if st.Status != "complete" {
		t.Fatalf("status %q error %q", st.Status, st.Error)
	}
	sameTree(t, src, filepath.Join(a.ns, "t"))
}

func TestSizeLimitsAreEnforced(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "tree")
	makeTree(t, src)
	limits := testLimits()
	limits.MaxEntries = 5
	st := Start(context.Background(), workerExe, spec(a, "in", "directory", src, "$DW_JOB_STRIPED/t"), limits, nil).Wait()
	if st.Status != "failed" || !strings.Contains(st.Error, "source "+src+" holds more than 5 files, directories and links (limit stage.max_files_per_stage)") {
		t.Errorf("status %q error %q", st.Status, st.Error)
	}
	list := filepath.Join(a.pfs, "list")
	writeFile(t, list, strings.Repeat("# padding\n", 200), 0o644, past)
	limits = testLimits()
	limits.MaxListBytes = 1000
	st = Start(context.Background(), workerExe, spec(a, "in", "list", list, ""), limits, nil).Wait()
	if st.Status != "failed" || !strings.Contains(st.Error, "list "+list+" is larger than 1000 bytes (limit stage.max_list_size)") {
		t.Errorf("status %q error %q", st.Status, st.Error)
	}
	emptyDir(t, a.ns)
}

func TestParentsCreatedByAStageAre0755(t *testing.T) {
	a := newArea(t)
	src := filepath.Join(a.pfs, "f")
	writeFile(t, src, "x", 0o600, past)
	old := unix.Umask(0o077) // the agent's umask must not matter
	defer unix.Umask(old)
	mustComplete(t, spec(a, "in", "file", src, "$DW_JOB_STRIPED/p/q/f"))
	for _, dir := range []string{"p", "p/q"} {
		if fi, err := os.Stat(filepath.Join(a.ns, dir)); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v %v, want 0755", dir, fi.Mode(), err)
		}
	}
}

// The namespace sits below a directory only root may enter (the agent's SSD tree): the worker,
// running as the user, still stages both ways, since the agent hands it the namespace as an
// open descriptor rather than a path.
func TestNamespaceBehindRootOnlyDirectory(t *testing.T) {
	if !isRoot() {
		t.Skip("needs root: the worker must run as another user than the owner of the SSD tree")
	}
	a := newArea(t)
	private := filepath.Join(a.base, "ssd")
	mkdir(t, private, 0o700)
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	a.ns = filepath.Join(private, "fragment", "ns")
	mkdir(t, a.ns, 0o755)
	owned(t, a.ns)
	src := filepath.Join(a.pfs, "in.txt")
	writeFile(t, src, "through a descriptor\n", 0o644, past)
	owned(t, src)
	mustComplete(t, spec(a, "in", "file", src, "$DW_JOB_STRIPED/in.txt"))
	if got := readFile(t, filepath.Join(a.ns, "in.txt")); got != "through a descriptor\n" {
		t.Errorf("staged in: %q", got)
	}
	out := filepath.Join(a.pfs, "back")
	mkdir(t, out, 0o755)
	owned(t, out)
	mustComplete(t, spec(a, "out", "file", out+"/copy.txt", "$DW_JOB_STRIPED/in.txt"))
	if got := readFile(t, filepath.Join(out, "copy.txt")); got != "through a descriptor\n" {
		t.Errorf("staged out: %q", got)
	}
}
