package controller

import (
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/nodekey"
)

// grant signs, for a max_mds mount, a capability for every namespace shard: each names its
// shard's fragment and namespace, on the shard's node, for the mounting node.
func TestGrantSignsEveryShard(t *testing.T) {
	c := &Controller{cfg: config.Defaults(), now: time.Now}
	c.SetSecret("cluster-secret")
	spec := agentapi.MountSpec{StorageNode: "bb1", FragmentID: 1, NamespaceID: 11, InstanceID: 5,
		Stripes: []agentapi.StripeServer{{Node: "bb1", FragmentID: 1}, {Node: "bb2", FragmentID: 2}},
		MDS:     []agentapi.Replica{{Node: "bb1", FragmentID: 1, NamespaceID: 11}, {Node: "bb2", FragmentID: 2, NamespaceID: 12}}}
	got := c.grant(spec, "cn7")
	if len(got.MDS) != 2 {
		t.Fatalf("granted %d shards, want 2", len(got.MDS))
	}
	for i, r := range got.MDS {
		cp, err := nodekey.ParseCapability(r.Capability)
		if err != nil {
			t.Fatalf("shard %d: %v", i, err)
		}
		if cp.Fragment != r.FragmentID || cp.Namespace != r.NamespaceID || cp.Stripes || cp.Client != "cn7" || cp.Instance != 5 {
			t.Errorf("shard %d's capability %+v does not grant namespace %d of fragment %d to cn7", i, cp, r.NamespaceID, r.FragmentID)
		}
		if r.CapabilityKey != nodekey.SessionKey(nodekey.Derive("cluster-secret", r.Node), r.Capability) {
			t.Errorf("shard %d's key is not derived for its node %s", i, r.Node)
		}
	}
	if spec.MDS[0].Capability != "" {
		t.Error("grant changed the caller's spec")
	}
}
