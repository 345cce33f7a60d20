package lifecycle

import (
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/model"
)

// DataWarp's manual walk-through (dwcli create session, instance, configuration, activation):
// the configuration's root_permissions and group reach the agent's namespace order, and the
// activation mounts it on the session's hosts (issue 23 item 7).
func TestManualInstance(t *testing.T) {
	h := newHarness(t, "ssd1", "ssd2")
	h.must(ApplySetup(h.w, Setup{Token: "manual1", Creator: "CLI", Owner: 1001, Group: 1001, ClientNodes: []string{"cn1", "cn2"}}, h, h.p, h.now))
	iid, err := ApplyCreateInstance(h.w, "manual1", ManualInstance{Capacity: 2 << 30, Pool: "wlm_pool", Label: "mybuf"}, h, h.p, h.now)
	h.must(err)
	if inst := h.w.Instances[iid]; inst == nil || inst.Label != "mybuf" || len(h.w.FragmentsOf(iid)) != 2 || len(h.w.ConfigurationsOf(iid)) != 0 {
		t.Fatalf("instance %d: %+v", iid, inst)
	}
	perm, group := uint32(0o2770), uint32(4242)
	cid, err := ApplyCreateConfiguration(h.w, "manual1", ManualConfiguration{Instance: iid, Type: "scratch", AccessMode: "stripe", RootPermissions: &perm, Group: &group}, h, h.p)
	h.must(err)
	c := h.w.Configurations[cid]
	if c == nil || c.AccessMode != model.AccessStriped || c.RootPermissions != 0o2770 || c.Group != 4242 || c.Owner != 1001 || len(h.w.NamespacesOf(cid)) != 1 {
		t.Fatalf("configuration %d: %+v", cid, c)
	}
	// The default, as a setup's: 0700 for a job, and the session's group.
	lb, err := ApplyCreateConfiguration(h.w, "manual1", ManualConfiguration{Instance: iid, AccessMode: "ldbal"}, h, h.p)
	h.must(err)
	if c := h.w.Configurations[lb]; c.AccessMode != model.AccessLoadbalance || c.RootPermissions != 0o700 || c.Group != 1001 || len(h.w.NamespacesOf(lb)) != 2 {
		t.Errorf("default configuration: %+v", c)
	}
	made, err := ApplyCreateActivation(h.w, "manual1", ManualActivation{Configuration: cid, Mount: "manual1"}, h, h.p)
	h.must(err)
	if len(made) != 2 {
		t.Fatalf("activations: %v", made)
	}
	for _, id := range made {
		if a := h.w.Activations[id]; a.MountPath != "/mnt/bb/manual1" || a.ConfigurationID != cid {
			t.Errorf("activation %+v", a)
		}
	}
	// What the agents are asked: the namespace root with the mode and group given.
	var modes []uint32
	var groups []uint32
	h.fail = func(e Effect) error {
		if e.Op == OpCreateNamespace && e.Namespace.ID == h.w.NamespacesOf(cid)[0].ID {
			modes, groups = append(modes, e.Namespace.Mode), append(groups, e.Namespace.Group)
		}
		return nil
	}
	h.settle()
	if len(modes) != 1 || modes[0] != 0o2770 || groups[0] != 4242 {
		t.Errorf("namespace orders: modes %o groups %v, want 2770 and 4242", modes, groups)
	}
	for _, id := range made {
		if a := h.w.Activations[id]; !a.State.Actualized {
			t.Errorf("activation %d not mounted: %+v", id, a.State)
		}
	}

	for _, tc := range []struct {
		err  error
		want string
	}{
		{second(ApplyCreateInstance(h.w, "manual1", ManualInstance{Capacity: 1 << 30, Pool: "wlm_pool"}, h, h.p, h.now)),
			"session 1 (token manual1) has instance 1 already; add configurations to it (dwcli create configuration --instance 1), or create another session"},
		{second(ApplyCreateConfiguration(h.w, "manual1", ManualConfiguration{Instance: iid, AccessMode: "stripe"}, h, h.p)),
			"instance 1 has a striped configuration already (configuration 1)"},
		{second(ApplyCreateConfiguration(h.w, "manual1", ManualConfiguration{Instance: iid, AccessMode: "sideways"}, h, h.p)),
			`--access-mode "sideways": expected stripe, private or ldbal (or striped, loadbalance)`},
		{second(ApplyCreateConfiguration(h.w, "manual1", ManualConfiguration{Instance: iid, Type: "cache", AccessMode: "stripe", BackingPath: "/lustre/p"}, h, h.p)),
			"--type cache: a cache configuration is not made by hand in this version; make a cache instance with #DW jobdw type=cache pfs=DIR or spillway persistent create NAME --type cache --pfs DIR"},
		{second(ApplyCreateConfiguration(h.w, "manual1", ManualConfiguration{Instance: iid, Type: "swap"}, h, h.p)),
			`--type swap: a swap configuration is not made by hand; ask for swap in the job script with #DW swap SIZE (Slurm: --bb "swap=N"), and pre_run gives each compute node its area`},
		{second(ApplyCreateConfiguration(h.w, "manual1", ManualConfiguration{Instance: 99, AccessMode: "private"}, h, h.p)),
			"session 1 (token manual1) has no instance 99 (dwstat instances: the sess column)"},
		{second(ApplyCreateActivation(h.w, "manual1", ManualActivation{Configuration: cid, Mount: "/etc"}, h, h.p)),
			"--mount /etc: give a name for a directory of /mnt/bb (controller.mount_root), e.g. --mount /mnt/bb/manual1_manual, or the name alone"},
		{second(ApplyCreateActivation(h.w, "manual1", ManualActivation{Configuration: cid, Mount: "manual1"}, h, h.p)),
			"configuration 1 is mounted on every compute node of session 1 already"},
		{second(ApplyCreateActivation(h.w, "manual1", ManualActivation{Configuration: lb, Mount: "manual1"}, h, h.p)),
			"--mount /mnt/bb/manual1: activation 1 is mounted there on cn1 already"},
	} {
		if tc.err == nil || tc.err.Error() != tc.want {
			t.Errorf("got %v\nwant %s", tc.err, tc.want)
		}
	}

	// A persistent session's configuration defaults to 0755; private is refused for it.
	h.must(ApplySetup(h.w, Setup{Token: "proj", Creator: "CLI", Owner: 1001, Group: 1001, Persistent: true, Expiration: ExpirationNever, Manual: true}, h, h.p, h.now))
	pi, err := ApplyCreateInstance(h.w, "proj", ManualInstance{Capacity: 1 << 30, Pool: "wlm_pool"}, h, h.p, h.now)
	h.must(err)
	pc, err := ApplyCreateConfiguration(h.w, "proj", ManualConfiguration{Instance: pi, AccessMode: "striped"}, h, h.p)
	h.must(err)
	if c := h.w.Configurations[pc]; c.RootPermissions != 0o755 || h.w.Instances[pi].Label != "proj" {
		t.Errorf("persistent: %+v %+v", c, h.w.Instances[pi])
	}
	if _, err := ApplyCreateConfiguration(h.w, "proj", ManualConfiguration{Instance: pi, AccessMode: "private"}, h, h.p); err == nil || !strings.Contains(err.Error(), "not available for a persistent instance") {
		t.Errorf("private persistent: %v", err)
	}
}

func second[T any](_ T, err error) error { return err }
