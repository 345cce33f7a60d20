package lifecycle

import (
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/alloc"
	"github.com/spillway-hpc/spillway/internal/model"
)

// DataWarp's manual walk-through builds an instance by hand, object by object (dwcli create
// session, instance, configuration, activation): an administrator's way to make what a setup
// and a pre_run make at once, with the choices a directive does not offer (the instance
// root's permissions and group). The session comes from Setup with no instance; these add
// the rest to it.

// ManualInstance is `dwcli create instance`: capacity placed in a pool for a session.
type ManualInstance struct {
	Capacity uint64 `json:"capacity"`
	Pool     string `json:"pool"`
	Label    string `json:"label,omitempty"`                 // "" DataWarp's I<id>-0 (a persistent session: its name)
	Strategy string `json:"optimization_strategy,omitempty"` // bandwidth (default) or interference
}

// ManualConfiguration is `dwcli create configuration`: how an instance is used.
type ManualConfiguration struct {
	Instance   ID     `json:"instance"`
	Type       string `json:"type"`        // scratch (cache and swap are refused)
	AccessMode string `json:"access_mode"` // striped, private, loadbalance (DataWarp: stripe, private, ldbal)
	// RootPermissions and Group of the instance root; nil: 0700 for a job, 0755 for a
	// persistent instance, and the session's group.
	RootPermissions *uint32 `json:"root_permissions,omitempty"`
	Group           *uint32 `json:"group,omitempty"`
	BackingPath     string  `json:"backing_path,omitempty"` // type cache only
}

// ManualActivation is `dwcli create activation`: a configuration mounted on the session's
// compute nodes.
type ManualActivation struct {
	Configuration ID     `json:"configuration"`
	Mount         string `json:"mount"` // under controller.mount_root; a relative one is taken from there
}

// AccessModeOf turns DataWarp's access mode words (stripe, private, ldbal) and Spillway's
// into Spillway's; "" if it is neither.
func AccessModeOf(word string) string {
	switch word {
	case "stripe", "striped":
		return model.AccessStriped
	case "private":
		return model.AccessPrivate
	case "ldbal", "loadbalance":
		return model.AccessLoadbalance
	}
	return ""
}

// ApplyCreateInstance places an instance for the session of token, which has none yet, and
// returns its id.
func ApplyCreateInstance(w *World, token string, req ManualInstance, ids IDSource, p Params, now time.Time) (ID, error) {
	s, err := liveSession(w, token, "create instance")
	if err != nil {
		return 0, err
	}
	if insts := w.InstancesOf(s.ID); len(insts) > 0 {
		return 0, userErr("session %d (token %s) has instance %d already; add configurations to it (dwcli create configuration --instance %d), or create another session", s.ID, s.Token, insts[0].ID, insts[0].ID)
	}
	if req.Capacity == 0 {
		return 0, userErr("create instance: give a capacity greater than 0 (--capacity 1TiB)")
	}
	if req.Pool == "" {
		return 0, userErr("create instance: give the pool (--pool; dwstat pools lists them)")
	}
	if req.Strategy != "" && req.Strategy != alloc.Bandwidth && req.Strategy != "interference" {
		return 0, userErr("--optimization %s: expected bandwidth or interference", req.Strategy)
	}
	if len(req.Label) > 64 || strings.ContainsAny(req.Label, " \t\n/") {
		return 0, userErr("--label %q: at most 64 characters, no spaces or /", req.Label)
	}
	inst, _, err := placeInstance(w, s, InstanceRequest{Capacity: req.Capacity, Pool: req.Pool, Strategy: req.Strategy}, req.Label, ids, p, now)
	if err != nil {
		return 0, err
	}
	return inst.ID, nil
}

// ApplyCreateConfiguration adds a configuration (and its namespaces, and for a job its
// registration) to an instance of the session of token, and returns its id.
func ApplyCreateConfiguration(w *World, token string, req ManualConfiguration, ids IDSource, p Params) (ID, error) {
	s, err := liveSession(w, token, "create configuration")
	if err != nil {
		return 0, err
	}
	inst := w.Instances[req.Instance]
	if inst == nil || inst.SessionID != s.ID {
		return 0, userErr("session %d (token %s) has no instance %d (dwstat instances: the sess column)", s.ID, s.Token, req.Instance)
	}
	switch orDefault(req.Type, model.TypeScratch) {
	case model.TypeScratch:
		if req.BackingPath != "" {
			return 0, userErr("--backing-path is for --type cache: a scratch configuration starts empty")
		}
	case model.TypeCache:
		return 0, userErr("--type cache: a cache configuration is not made by hand in this version; make a cache instance with #DW jobdw type=cache pfs=DIR or spillway persistent create NAME --type cache --pfs DIR")
	case model.TypeSwap:
		return 0, userErr("--type swap: a swap configuration is not made by hand; ask for swap in the job script with #DW swap SIZE (Slurm: --bb \"swap=N\"), and pre_run gives each compute node its area")
	default:
		return 0, userErr("--type %s: expected scratch, cache or swap", req.Type)
	}
	mode := AccessModeOf(req.AccessMode)
	if mode == "" {
		return 0, userErr("--access-mode %q: expected stripe, private or ldbal (or striped, loadbalance)", req.AccessMode)
	}
	if s.Persistent && mode == model.AccessPrivate {
		return 0, userErr("--access-mode private is not available for a persistent instance (as in DataWarp): each job's compute nodes would get namespaces no other job sees; use stripe or ldbal")
	}
	for _, c := range w.ConfigurationsOf(inst.ID) {
		if c.AccessMode == mode { // two configurations would share one mount path
			return 0, userErr("instance %d has a %s configuration already (configuration %d)", inst.ID, mode, c.ID)
		}
	}
	perm := DefaultRootPermissions(s)
	if req.RootPermissions != nil {
		perm = *req.RootPermissions
	}
	if perm > 0o7777 {
		return 0, userErr("--root-permissions %o: give permission bits, at most 7777 (octal), e.g. 0755", perm)
	}
	group := s.Group
	if req.Group != nil {
		group = *req.Group
	}
	c := &model.Configuration{InstanceID: inst.ID, Type: model.TypeScratch, AccessMode: mode, RootPermissions: perm, Owner: s.Owner, Group: group,
		MaxFilesCreated: p.Limits.FilesCreated, State: model.Created()}
	if err := addConfiguration(w, s, c, w.FragmentsOf(inst.ID), ids); err != nil {
		return 0, err
	}
	return c.ID, nil
}

// ApplyCreateActivation mounts a configuration on every compute node of the session of token
// (its hosts) at req.Mount, and returns the activations' ids. The configuration is the
// session's own, or one of a persistent instance the session uses.
func ApplyCreateActivation(w *World, token string, req ManualActivation, ids IDSource, p Params) ([]ID, error) {
	s, err := liveSession(w, token, "create activation")
	if err != nil {
		return nil, err
	}
	c := w.Configurations[req.Configuration]
	var inst *model.Instance
	if c != nil {
		inst = w.Instances[c.InstanceID]
	}
	if inst == nil {
		return nil, userErr("no configuration %d (dwstat configurations lists them)", req.Configuration)
	}
	if owner := w.Sessions[inst.SessionID]; inst.SessionID != s.ID && (owner == nil || !owner.Persistent || !slices.Contains(s.Uses, owner.Token)) {
		return nil, userErr("configuration %d is not session %d's, nor one of a persistent instance it uses", c.ID, s.ID)
	}
	if c.Type == model.TypeSwap {
		return nil, userErr("configuration %d is a job's swap: its areas are attached by the job's pre_run on its compute nodes, not mounted by hand", c.ID)
	}
	if len(s.ClientNodes) == 0 {
		return nil, userErr("session %d (token %s) has no compute nodes to mount on (dwcli create session --hosts)", s.ID, s.Token)
	}
	for _, node := range s.ClientNodes {
		if _, ok := w.Nodes[node]; !ok {
			return nil, userErr("create activation: compute node %q has no Spillway agent registered (start `spillway agent` there)", node)
		}
	}
	mount := req.Mount
	if mount == "" {
		return nil, userErr("create activation: give the mount path (--mount)")
	}
	if !path.IsAbs(mount) {
		mount = path.Join(p.MountRoot, mount)
	}
	root := path.Clean(p.MountRoot)
	if path.Clean(mount) != mount || !strings.HasPrefix(mount, root+"/") || strings.Contains(mount[len(root)+1:], "/") {
		return nil, userErr("--mount %s: give a name for a directory of %s (controller.mount_root), e.g. --mount %s/%s_manual, or the name alone", req.Mount, root, root, s.Token)
	}
	nodes := map[string]bool{}
	for _, n := range s.ClientNodes {
		nodes[n] = true
	}
	for _, id := range slices.Sorted(maps.Keys(w.Activations)) {
		a := w.Activations[id]
		if a.MountPath == mount && nodes[a.Node] && (a.SessionID != s.ID || a.ConfigurationID != c.ID) {
			return nil, userErr("--mount %s: activation %d is mounted there on %s already", mount, a.ID, a.Node)
		}
	}
	mounted := map[mountKey]bool{}
	before := map[ID]bool{}
	for _, a := range w.ActivationsOf(s.ID) {
		mounted[mountKey{a.ConfigurationID, a.Node}] = true
		before[a.ID] = true
	}
	if err := activate(w, s, c, s.ClientNodes, mount, mounted, ids, "create activation"); err != nil {
		return nil, err
	}
	var made []ID
	for _, a := range w.ActivationsOf(s.ID) {
		if !before[a.ID] {
			made = append(made, a.ID)
		}
	}
	if len(made) == 0 {
		return nil, userErr("configuration %d is mounted on every compute node of session %d already", c.ID, s.ID)
	}
	return made, nil
}
