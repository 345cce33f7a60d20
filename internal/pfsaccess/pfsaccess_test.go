package pfsaccess

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// asNobody runs this test again as uid/gid 65534 from a copy of the test binary every user
// can run, and reports its outcome: the check means something only for an ordinary user.
func asNobody(t *testing.T, name string) {
	dir, err := os.MkdirTemp("", "pfsaccess")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	bin := filepath.Join(dir, "pfsaccess.test")
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(dst, src)
	dst.Close()
	work := filepath.Join(dir, "tmp")
	os.Mkdir(work, 0o777)
	os.Chmod(work, 0o777)
	cmd := exec.Command(bin, "-test.run=^"+name+"$", "-test.v")
	cmd.Env = []string{"TMPDIR=" + work, "PFSACCESS_AS_NOBODY=1"}
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("as nobody: %v\n%s", err, out)
	}
	t.Logf("as nobody:\n%s", out)
}

func TestCheck(t *testing.T) {
	if os.Geteuid() == 0 {
		if err := Check(t.TempDir()); err == nil {
			t.Fatal("root's check answered")
		}
		asNobody(t, "TestCheck")
		return
	}
	dir := t.TempDir()
	if err := Check(dir); err != nil {
		t.Fatalf("own directory: %v", err)
	}
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o600)
	locked := filepath.Join(dir, "locked")
	os.Mkdir(locked, 0o600) // readable, not searchable
	inner := filepath.Join(dir, "closed")
	os.Mkdir(inner, 0o700)
	os.Mkdir(filepath.Join(inner, "sub"), 0o700)
	os.Chmod(inner, 0o600)
	defer os.Chmod(inner, 0o700)
	cases := map[string]string{
		filepath.Join(dir, "none"):  "pfs=" + filepath.Join(dir, "none") + ": no such directory; create it on the PFS first (mkdir -p), or correct the path",
		file:                        "pfs=" + file + ": not a directory; pfs= names the directory to cache, not a file",
		locked:                      "pfs=" + locked + ": you cannot enter this directory (permission denied); choose a directory you can cd into, or ask its owner for search (x) permission",
		filepath.Join(inner, "sub"): "pfs=" + filepath.Join(inner, "sub") + ": permission denied; a directory on the way to it cannot be searched by you; choose a directory you can cd into",
	}
	for path, want := range cases {
		err := Check(path)
		if err == nil || err.Error() != want {
			t.Errorf("Check(%s) = %v\nwant %s", path, err, want)
		}
	}
}
