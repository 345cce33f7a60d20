package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/pfsio"
)

// TestPFSDoorsActAsTheUser: a root agent's door for a user is a worker holding that user's
// credentials (the PFS's permissions hold: another user's private file is EACCES, the
// user's own file readable), one per (directory, user); a worker that died is started again
// at the next access; pfs.max_workers bounds them with EAGAIN naming the key.
func TestPFSDoorsActAsTheUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: workers run as another user")
	}
	const uid, gid = 65534, 65534
	tmp := t.TempDir()
	os.Chmod(tmp, 0o755)
	os.Chmod(filepath.Dir(tmp), 0o755)
	pfs := filepath.Join(tmp, "pfs")
	os.Mkdir(pfs, 0o755)
	os.WriteFile(filepath.Join(pfs, "root-only"), []byte("secret"), 0o600)
	os.WriteFile(filepath.Join(pfs, "mine"), []byte("data"), 0o600)
	os.Chown(filepath.Join(pfs, "mine"), uid, gid)

	doors := newPFSDoors(pfsWorkerExe, pfsio.Options{}, 2)
	defer doors.closeAll()
	d, err := doors.door(pfs, uid, gid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.OpenFile("root-only", os.O_RDONLY, 0); !errors.Is(err, syscall.EACCES) {
		t.Errorf("root's private file through the user's door: %v, want EACCES", err)
	}
	f, err := d.OpenFile("mine", os.O_RDONLY, 0)
	if err != nil {
		t.Fatalf("the user's own file: %v", err)
	}
	f.Close()
	if again, _ := doors.door(pfs, uid, gid); again != d {
		t.Error("a second access started another worker")
	}

	syscall.Kill(d.Pid(), syscall.SIGKILL)
	<-d.Gone()
	d2, err := doors.door(pfs, uid, gid)
	if err != nil || d2 == d {
		t.Fatalf("after the worker died: %v (same door: %v)", err, d2 == d)
	}
	if _, err := d2.Lstat("mine"); err != nil {
		t.Errorf("the new worker: %v", err)
	}

	if _, err := doors.door(pfs, 1, 1); err != nil { // a second user: the bound's second worker
		t.Fatal(err)
	}
	if _, err := doors.door(pfs, 2, 2); !errors.Is(err, syscall.EAGAIN) || !strings.Contains(err.Error(), "pfs.max_workers") {
		t.Errorf("a third user past pfs.max_workers = 2: %v", err)
	}
}
