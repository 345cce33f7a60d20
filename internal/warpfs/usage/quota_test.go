package usage

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/usage/xfstest"
)

func openDir(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// A project quota on XFS limits root's writes below the directory, subdirectories created
// afterwards included, and reports what they use.
func TestProjectQuotaOnXFS(t *testing.T) {
	mnt := xfstest.Mount(t, t.TempDir(), 320<<20)
	frag := filepath.Join(mnt, "fragment")
	if err := os.Mkdir(frag, 0o700); err != nil {
		t.Fatal(err)
	}
	fd := openDir(t, frag)
	id := ProjectID(7)
	if _, err := CheckProjectQuota(fd, id); !errors.Is(err, ErrNoQuota) {
		t.Fatalf("before: CheckProjectQuota = %v, want ErrNoQuota", err)
	}
	if err := SetProjectQuota(fd, id, 8<<20); err != nil {
		t.Fatal(err)
	}
	if limit, err := CheckProjectQuota(fd, id); err != nil || limit != 8<<20 {
		t.Fatalf("CheckProjectQuota = %d, %v; want 8 MiB", limit, err)
	}
	sub := filepath.Join(frag, "namespace")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckProjectQuota(openDir(t, sub), id); err != nil {
		t.Errorf("a directory created below does not inherit the project: %v", err)
	}
	f, err := os.Create(filepath.Join(sub, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var written int
	for i := 0; i < 12; i++ {
		n, err := f.Write(buf)
		written += n
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("write past the limit: %v, want ENOSPC", err)
			}
			break
		}
	}
	if err := f.Sync(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatal(err)
	}
	if written > 8<<20 || written < 7<<20 {
		t.Errorf("root wrote %d bytes under an 8 MiB project quota", written)
	}
	used, limit, err := ProjectUsage(fd, id)
	if err != nil || limit != 8<<20 || used < uint64(written) || used > 8<<20 {
		t.Errorf("ProjectUsage = %d used, %d limit, %v; wrote %d", used, limit, err, written)
	}
	if err := ClearProjectQuota(fd, id); err != nil {
		t.Fatal(err)
	}
	if _, limit, _ := ProjectUsage(fd, id); limit != 0 {
		t.Errorf("after ClearProjectQuota the limit is %d", limit)
	}
}

// Without project quotas on the file system nothing is set and the error says so.
func TestProjectQuotaRefusedWithoutQuotas(t *testing.T) {
	fd := openDir(t, t.TempDir())
	if err := SetProjectQuota(fd, ProjectID(7), 1<<20); err == nil {
		t.Fatal("SetProjectQuota succeeded on a file system without project quotas")
	}
	if _, err := CheckProjectQuota(fd, ProjectID(7)); !errors.Is(err, ErrNoQuota) {
		t.Errorf("CheckProjectQuota = %v, want ErrNoQuota", err)
	}
}

// Without prjquota XFS still takes project ids (the descriptor calls are right), but no limit
// can be set, and the directory does not count as limited.
func TestProjectQuotaOnXFSWithoutPrjquota(t *testing.T) {
	mnt := xfstest.MountPlain(t, t.TempDir(), 320<<20)
	fd := openDir(t, mnt)
	id := ProjectID(12)
	if err := SetProjectQuota(fd, id, 1<<20); err == nil {
		t.Fatal("SetProjectQuota succeeded on XFS mounted without prjquota")
	} else {
		t.Log(err)
	}
	x, err := getFsxattr(fd)
	if err != nil || x.Projid != 0 || x.Xflags&xflagInherit != 0 {
		t.Fatalf("a refused SetProjectQuota changed the directory: %+v, %v", x, err)
	}
	if err := SetProjectOf(fd, id); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(mnt, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	x, err = getFsxattr(openDir(t, sub))
	if err != nil || x.Projid != id || x.Xflags&xflagInherit == 0 {
		t.Errorf("a directory made below one of project %d: %+v, %v; want the project, inherited", id, x, err)
	}
	if _, err := CheckProjectQuota(fd, id); !errors.Is(err, ErrNoQuota) {
		t.Errorf("CheckProjectQuota = %v, want ErrNoQuota", err)
	} else {
		t.Log(err)
	}
}
