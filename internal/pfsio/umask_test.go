package pfsio

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The modes asked are the modes made, whatever the umask of the process the door runs in: an
// in-process door (the agent's own user) makes the same modes as a worker (umask 0), and a
// set-group-ID bit the kernel gives a directory made in a set-group-ID one stays.
func TestModesIgnoreTheProcessUmask(t *testing.T) {
	old := unix.Umask(0o027)
	t.Cleanup(func() { unix.Umask(old) })
	if got := processUmask(); got != 0o027 {
		t.Fatalf("processUmask = %o, want 027", got)
	}
	eachDoor(t, Options{}, func(t *testing.T, d *Door, a area) {
		must(t, d.Mkdir("d", 0o777))
		f, err := d.OpenFile("d/f", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if err != nil {
			t.Fatal(err)
		}
		if f.Stat.Mode != unix.S_IFREG|0o666 {
			t.Errorf("the open's stat of a new file of mode 0666: %o", f.Stat.Mode)
		}
		f.Close()
		f, err = d.OpenFile("d/g", os.O_RDWR|os.O_CREATE, 0o640)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		for path, want := range map[string]uint32{"d": unix.S_IFDIR | 0o777, "d/f": unix.S_IFREG | 0o666, "d/g": unix.S_IFREG | 0o640} {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(a.pfs, path), &st); err != nil || st.Mode != want {
				t.Errorf("%s: mode %o (%v), want %o", path, st.Mode, err, want)
			}
		}
		// A directory with a default ACL: the ACL gives the modes, not the umask.
		acl := []byte{2, 0, 0, 0, // version 2; entries: tag, perm (u16), id (u32)
			1, 0, 7, 0, 0xff, 0xff, 0xff, 0xff, // user::rwx
			4, 0, 5, 0, 0xff, 0xff, 0xff, 0xff, // group::r-x
			0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0xff} // other::---
		must(t, d.Mkdir("acl", 0o755))
		if err := unix.Setxattr(filepath.Join(a.pfs, "acl"), "system.posix_acl_default", acl, 0); err != nil {
			t.Logf("no default ACL on this file system (%v): that case is not tried", err)
		} else {
			must(t, d.Mkdir("acl/d", 0o777))
			must(t, d.Mkdir("acl/sub", 0o777))
			f, err := d.OpenFile("acl/sub/f", os.O_RDWR|os.O_CREATE, 0o666)
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			for path, want := range map[string]uint32{"acl/d": unix.S_IFDIR | 0o750, "acl/sub/f": unix.S_IFREG | 0o640} {
				var st unix.Stat_t
				if err := unix.Lstat(filepath.Join(a.pfs, path), &st); err != nil || st.Mode != want {
					t.Errorf("%s (default ACL): mode %o (%v), want %o", path, st.Mode, err, want)
				}
			}
		}
		// A set-group-ID directory: a directory made in it inherits the bit.
		must(t, d.Chmod("d", 0o2775))
		must(t, d.Mkdir("d/sub", 0o770))
		if st, err := d.Lstat("d/sub"); err != nil || st.Mode != unix.S_IFDIR|0o2770 {
			t.Errorf("d/sub: mode %o (%v), want %o", st.Mode, err, unix.S_IFDIR|0o2770)
		}
	})
}
