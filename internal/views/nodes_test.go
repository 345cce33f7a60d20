package views

import (
	"testing"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
)

// A node whose agent serves no storage (no pool, no storage claim) is a compute node
// (issue 23 item 12: dwstat nodes listed compute-only agents as storage nodes).
func TestComputeOnlyNodes(t *testing.T) {
	w := lifecycle.NewWorld()
	w.Pools["p"] = &model.Pool{Name: "p", Granularity: 1 << 30}
	w.Nodes["bb1"] = &model.Node{Name: "bb1", Pool: "p", Capacity: 4 << 30}
	w.Nodes["cn1"] = &model.Node{Name: "cn1", Roles: []string{"client"}}
	w.Nodes["cn2"] = &model.Node{Name: "cn2", StorageClaim: "pool p, 64GiB"}
	got := map[string]bool{}
	for _, n := range BuildTables(w, "nodes").Nodes {
		got[n.ID] = n.ComputeOnly
	}
	if want := map[string]bool{"bb1": false, "cn1": true, "cn2": false}; len(got) != 3 || got["bb1"] || !got["cn1"] || got["cn2"] {
		t.Errorf("compute_only: %v, want %v", got, want)
	}
}
