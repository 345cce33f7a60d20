package jobspec

import (
	"errors"
	"os"
	"reflect"
	"testing"

	"github.com/spillway-hpc/spillway/internal/directive"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

func parse(t *testing.T, src string) *directive.Script {
	t.Helper()
	s, err := directive.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSupportedCache: a striped cache, a job with a scratch and a cache, and a load-balanced
// cache (job or persistent) pass the front door.
func TestSupportedCache(t *testing.T) {
	s := parse(t, "#!/bin/bash\n#DW jobdw capacity=1GiB\n#DW jobdw type=cache capacity=1TiB pfs=/lustre/me\n#BB create_persistent name=p capacity=1GiB type=cache pfs=/lustre/p\n")
	if err := Supported(s); err != nil {
		t.Errorf("a scratch and a striped cache: %v", err)
	}
	s = parse(t, "#!/bin/bash\n#DW jobdw type=cache access_mode=loadbalance capacity=1TiB pfs=/lustre/me\n#BB create_persistent name=p capacity=1GiB type=cache access_mode=loadbalance pfs=/lustre/p\n")
	if err := Supported(s); err != nil {
		t.Errorf("a load-balanced cache: %v", err)
	}
}

// TestCheckPFSAsUser: spillway run checks each cache's pfs= as its user, naming the line.
func TestCheckPFSAsUser(t *testing.T) {
	old := checkPFS
	defer func() { checkPFS = old }()
	checkPFS = func(dir string) error {
		if dir == "/lustre/ok" {
			return nil
		}
		return errors.New("pfs=" + dir + ": no such directory; create it on the PFS first (mkdir -p), or correct the path")
	}
	s := parse(t, "#DW jobdw capacity=1GiB\n#DW jobdw type=cache capacity=1TiB pfs=/lustre/gone\n#BB create_persistent name=p capacity=1GiB type=cache pfs=/lustre/ok\n")
	err := CheckPFSAsUser(s)
	if os.Geteuid() == 0 {
		if err != nil {
			t.Fatalf("as root nothing is checked: %v", err)
		}
		return
	}
	if err == nil || err.Error() != "line 2: #DW jobdw: pfs=/lustre/gone: no such directory; create it on the PFS first (mkdir -p), or correct the path" {
		t.Fatalf("got %v", err)
	}
}

// TestSetupCarriesCacheAndBothInstances: the setup request holds the first #DW jobdw in
// Instance and the other in More, a cache's pfs= and the tunables the job named (the others
// left to the site's defaults).
func TestSetupCarriesCacheAndBothInstances(t *testing.T) {
	s := parse(t, "#DW jobdw type=cache access_mode=ldbalance capacity=1TiB pfs=/lustre/me/ read_ahead=0 sync_to_pfs=yes\n#DW jobdw capacity=2GiB\n")
	req, err := Setup(s, "7", "SLURM", 1001, 1002, nil)
	if err != nil {
		t.Fatal(err)
	}
	zero, on := uint64(0), true
	want := &lifecycle.InstanceRequest{Capacity: 1 << 40, Type: "cache", AccessModes: []string{"loadbalance"}, Strategy: "bandwidth",
		Cache: &lifecycle.CacheRequest{PFS: "/lustre/me", ReadAhead: &zero, SyncToPFS: &on}}
	if !reflect.DeepEqual(req.Instance, want) {
		t.Errorf("Instance %+v cache %+v", req.Instance, req.Instance.Cache)
	}
	if len(req.More) != 1 || req.More[0].Type != "scratch" || req.More[0].Capacity != 2<<30 || req.More[0].Cache != nil {
		t.Errorf("More %+v", req.More)
	}
	c := CreatePersistent(parse(t, "#BB create_persistent name=p capacity=1GiB type=cache pfs=/lustre/p\n").Create[0], "CLI", 1, 1)
	if c.Instance.Type != "cache" || c.Instance.Cache == nil || c.Instance.Cache.PFS != "/lustre/p" {
		t.Errorf("create_persistent %+v", c.Instance)
	}
	if got := Summary(s); got != "jobdw 1TiB cache loadbalance pfs=/lustre/me; jobdw 2GiB scratch striped" {
		t.Errorf("Summary %q", got)
	}
}

// TestSetupErrorNamesTheCacheLine: the controller's refusals about a cache are tied to the
// type=cache line even when it is not the first #DW jobdw.
func TestSetupErrorNamesTheCacheLine(t *testing.T) {
	s := parse(t, "#!/bin/bash\n#DW jobdw capacity=1GiB\n#DW jobdw type=cache capacity=1TiB pfs=/home/me\n")
	cases := []struct{ in, want string }{
		{"pfs=/home/me is outside the directories this site allows for cache instances ([cache] allowed_pfs: /lustre); choose a directory under one of them, or ask the administrator to add it",
			"line 3: #DW jobdw: pfs=/home/me is outside the directories this site allows for cache instances ([cache] allowed_pfs: /lustre); choose a directory under one of them, or ask the administrator to add it"},
		{"pfs=/home/me: no such directory; create it on the PFS first (mkdir -p), or correct the path",
			"line 3: #DW jobdw: pfs=/home/me: no such directory; create it on the PFS first (mkdir -p), or correct the path"},
		{"pool wlm_pool cannot hold 1TiB (1024 grains of 1GiB): 4 free; 4GiB free in the pool",
			"line 3: #DW jobdw capacity=1TiB: pool wlm_pool cannot hold 1TiB (1024 grains of 1GiB): 4 free; 4GiB free in the pool"},
	}
	for _, c := range cases {
		if got := SetupError(s, errors.New(c.in)).Error(); got != c.want {
			t.Errorf("got  %s\nwant %s", got, c.want)
		}
	}
}
