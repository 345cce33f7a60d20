package controller

import (
	"errors"
	"testing"

	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
)

// TestCheckPFSAsOwner: the controller looks at a cache's PFS directory only when it runs as
// the session's owner (a one-machine home), never as root or for another user.
func TestCheckPFSAsOwner(t *testing.T) {
	oldEuid, oldCheck := euid, checkPFS
	t.Cleanup(func() { euid, checkPFS = oldEuid, oldCheck })
	var checked []string
	checkPFS = func(dir string) error {
		checked = append(checked, dir)
		return errors.New("pfs=" + dir + ": no such directory; create it on the PFS first (mkdir -p), or correct the path")
	}
	req := lifecycle.Setup{Token: "1", Owner: 1001, Instance: &lifecycle.InstanceRequest{Type: model.TypeScratch},
		More: []lifecycle.InstanceRequest{{Type: model.TypeCache, Cache: &lifecycle.CacheRequest{PFS: "/lustre/me"}}}}
	for _, id := range []int{0, 1002} {
		euid = func() int { return id }
		if err := checkPFSAsOwner(req); err != nil || len(checked) > 0 {
			t.Fatalf("euid %d: %v, checked %v", id, err, checked)
		}
	}
	euid = func() int { return 1001 }
	err := checkPFSAsOwner(req)
	var ue *lifecycle.UserError
	if !errors.As(err, &ue) || err.Error() != "pfs=/lustre/me: no such directory; create it on the PFS first (mkdir -p), or correct the path" {
		t.Fatalf("as the owner: %v", err)
	}
	checked = nil
	req.More[0].Cache.PFS = "/lustre/../etc" // the lifecycle refuses it, unlooked-at
	if err := checkPFSAsOwner(req); err != nil || len(checked) > 0 {
		t.Fatalf("unclean path: %v %v", err, checked)
	}
}

func TestCacheParamsOf(t *testing.T) {
	p := controllerapi.CacheParamsOf(config.Defaults().Cache)
	want := model.CacheSettings{ModifiedThreshold: 1 << 30, ReadAhead: 4 << 20, HighWatermark: 45, LowWatermark: 20}
	if p.Defaults != want || len(p.AllowedPFS) != 0 {
		t.Fatalf("%+v", p)
	}
}
