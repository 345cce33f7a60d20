package agent

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/agentapi"
)

// A namespace root takes the configuration's root_permissions whole, the setgid and sticky
// bits included (dwcli create configuration --root-permissions 2770 --group proj: the
// group's files stay the group's), and its owner and group (issue 23 item 7).
func TestNamespaceRootPermissionsAndGroup(t *testing.T) {
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: filepath.Join(t.TempDir(), "ssd"), Capacity: 256 * mib})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	if err := a.CreateFragment(ctx, agentapi.FragmentSpec{ID: 5, InstanceID: 3, Capacity: 16 * mib, InstanceCapacity: 16 * mib, Job: "42"}); err != nil {
		t.Fatal(err)
	}
	owner, group := uint32(os.Geteuid()), uint32(os.Getegid())
	if os.Geteuid() == 0 {
		owner, group = 1000, 4242
	}
	for i, mode := range []uint32{0o2770, 0o1777, 0o750} {
		id := int64(i + 1)
		if err := a.CreateNamespace(ctx, agentapi.NamespaceSpec{ID: id, FragmentID: 5, InstanceID: 3, Owner: owner, Group: group, Mode: mode}); err != nil {
			t.Fatal(err)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(a.namespaceDir(5, id), &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&0o7777 != mode || st.Uid != owner || st.Gid != group {
			t.Errorf("namespace root: mode %o uid %d gid %d, want %o %d %d", st.Mode&0o7777, st.Uid, st.Gid, mode, owner, group)
		}
	}
}
