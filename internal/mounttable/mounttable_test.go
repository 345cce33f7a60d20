package mounttable

import "testing"

func TestParseMountinfo(t *testing.T) {
	e, ok := ParseLine(`612 28 0:53 / /var/opt/spillway/mounts/batch/42\040x rw,nosuid,nodev,relatime shared:1 - fuse.spillway I42-0 rw,user_id=0,group_id=0,default_permissions`)
	if !ok || e.Minor != 53 || e.MountPoint != "/var/opt/spillway/mounts/batch/42 x" || e.FSType != "fuse.spillway" || e.Source != "I42-0" {
		t.Errorf("parsed %+v, %v", e, ok)
	}
	if _, ok := ParseLine("garbage"); ok {
		t.Error("garbage parsed")
	}
}
