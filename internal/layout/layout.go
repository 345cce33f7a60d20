// Package layout converts the controller's state (views.All, what GET /dw/v1/all returns)
// into the layout snapshot the bbsim simulator reads: "Spillway layout snapshot", format
// version 1 or 2 (docs/bbsim.md; JSON Schemas sim/bbsim/schemas/spillway-layout-v1.json and
// -v2.json). Version 2 is version 1 plus a cache configuration's settings
// (configurations[].cache); a snapshot holding none is written as version 1, which every
// bbsim reads.
//
// The conversion is pure: a views.All in, a Snapshot out, no I/O. The snapshot keeps what a
// bandwidth prediction needs and drops the rest: pools (granularity, quantity and free in
// grains), the storage nodes (the nodes that belong to a pool), every instance with its
// fragments nested and its session named by token, configurations, and sessions with their
// client nodes, and a cache configuration's write-behind settings. Field names and units are
// the controller's.
package layout

import (
	"fmt"
	"time"

	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/views"
)

// Format and the versions identify the snapshot format; a reader rejects any other version.
// Version is the newest: a snapshot is written as Version1 unless it needs Version's fields.
const (
	Format   = "spillway-layout"
	Version1 = 1
	Version  = 2
)

// Snapshot is one layout snapshot, in the order the format lists its fields.
type Snapshot struct {
	Format         string          `json:"format"`
	Version        int             `json:"version"`
	Generated      string          `json:"generated,omitempty"`
	Controller     string          `json:"controller,omitempty"`
	Pools          []Pool          `json:"pools"`
	Nodes          []Node          `json:"nodes"`
	Instances      []Instance      `json:"instances"`
	Configurations []Configuration `json:"configurations"`
	Sessions       []Session       `json:"sessions"`
}

// Pool is a pool: granularity in bytes per grain, quantity and free in grains.
type Pool struct {
	ID          string `json:"id"`
	Granularity uint64 `json:"granularity"`
	Quantity    uint64 `json:"quantity"`
	Free        uint64 `json:"free"`
}

// Node is a storage node: the bytes it offers, whether its agent is online, whether it is
// drained (takes no new fragments; its existing fragments still serve data).
type Node struct {
	ID       string `json:"id"`
	Pool     string `json:"pool"`
	Capacity uint64 `json:"capacity"`
	Online   bool   `json:"online"`
	Drain    bool   `json:"drain"`
}

// Instance is an instance with its fragments; Session is the owning session's token.
type Instance struct {
	ID        int64      `json:"id"`
	Capacity  uint64     `json:"capacity"`
	Session   string     `json:"session"`
	Pool      string     `json:"pool,omitempty"`
	Fragments []Fragment `json:"fragments"`
}

// Fragment is the part of an instance on one storage node, in bytes.
type Fragment struct {
	ID       int64  `json:"id"`
	Node     string `json:"node"`
	Capacity uint64 `json:"capacity"`
}

// Configuration is one use of an instance: its type and access mode, and for a cache its
// settings (version 2).
type Configuration struct {
	ID         int64  `json:"id"`
	Instance   int64  `json:"instance"`
	Type       string `json:"type"`
	AccessMode string `json:"access_mode"`
	Cache      *Cache `json:"cache,omitempty"`
}

// Cache is what bbsim needs of a cache configuration's settings to model its write-behind
// (the cache's capacity is its instance's): the PFS directory (informational), the dirty
// watermarks in % of the capacity, the per-file threshold and the read-ahead in bytes. A
// watermark or threshold left out (unset in the configuration) is the cache's default.
type Cache struct {
	PFS               string `json:"pfs,omitempty"`
	HighWatermark     int    `json:"high_watermark,omitempty"`
	LowWatermark      int    `json:"low_watermark,omitempty"`
	ModifiedThreshold uint64 `json:"modified_threshold,omitempty"`
	ReadAhead         uint64 `json:"read_ahead"`
}

// Session is a job (token = job id) or a persistent instance (token = its name); ClientNodes
// are the job's compute nodes, empty until the workload manager names them.
type Session struct {
	ID          int64    `json:"id"`
	Token       string   `json:"token"`
	Owner       uint32   `json:"owner"`
	ClientNodes []string `json:"client_nodes"`
}

// Options are the informational fields of a snapshot.
type Options struct {
	Generated  time.Time // when the state was read; zero leaves "generated" out
	Controller string    // which controller it came from; "" leaves "controller" out
}

// FromAll converts the controller's state into a snapshot. Instances that have no fragments
// yet (or any more) cannot be placed on storage nodes: they are left out, with their
// configurations, and named in the warnings. State that would make an invalid snapshot (a
// fragment on a node outside every pool, an instance of an unknown session, an unknown
// configuration type or access mode) is an error naming the object.
func FromAll(all views.All, opt Options) (Snapshot, []string, error) {
	snap := Snapshot{
		Format: Format, Version: Version1, Controller: opt.Controller,
		Pools: []Pool{}, Nodes: []Node{}, Instances: []Instance{}, Configurations: []Configuration{}, Sessions: []Session{},
	}
	if !opt.Generated.IsZero() {
		snap.Generated = opt.Generated.UTC().Format(time.RFC3339)
	}
	var warnings []string

	pools := map[string]bool{}
	for _, p := range all.Pools {
		if p.Granularity == 0 {
			return Snapshot{}, nil, fmt.Errorf("pool %s has granularity 0", p.ID)
		}
		pools[p.ID] = true
		snap.Pools = append(snap.Pools, Pool{ID: p.ID, Granularity: p.Granularity, Quantity: p.Quantity, Free: p.Free})
	}

	storage := map[string]bool{}
	for _, n := range all.Nodes {
		if n.Pool == "" {
			continue // compute-only: it appears as a session's client node
		}
		if !pools[n.Pool] {
			return Snapshot{}, nil, fmt.Errorf("node %s belongs to pool %s, which the controller does not list", n.ID, n.Pool)
		}
		storage[n.ID] = true
		snap.Nodes = append(snap.Nodes, Node{ID: n.ID, Pool: n.Pool, Capacity: n.Capacity, Online: n.Online, Drain: n.Drain})
	}

	tokens := map[int64]string{}
	for _, s := range all.Sessions {
		tokens[s.ID] = s.Token
		nodes := append([]string{}, s.Links.ClientNodes...)
		snap.Sessions = append(snap.Sessions, Session{ID: s.ID, Token: s.Token, Owner: s.Owner, ClientNodes: nodes})
	}

	fragments := map[int64][]Fragment{}
	for _, f := range all.Fragments {
		if !storage[f.Node] {
			return Snapshot{}, nil, fmt.Errorf("fragment %d of instance %d is on node %q, which is not a storage node of any pool", f.ID, f.Instance, f.Node)
		}
		fragments[f.Instance] = append(fragments[f.Instance], Fragment{ID: f.ID, Node: f.Node, Capacity: f.Capacity})
	}

	placed := map[int64]bool{}
	for _, i := range all.Instances {
		token, ok := tokens[i.Links.Session]
		if !ok {
			return Snapshot{}, nil, fmt.Errorf("instance %d belongs to session %d, which the controller does not list", i.ID, i.Links.Session)
		}
		frags := fragments[i.ID]
		if len(frags) == 0 {
			warnings = append(warnings, fmt.Sprintf("instance %d (session %s) has no fragments: left out", i.ID, token))
			continue
		}
		placed[i.ID] = true
		snap.Instances = append(snap.Instances, Instance{ID: i.ID, Capacity: i.Capacity.Bytes, Session: token, Pool: i.Pool, Fragments: frags})
	}

	for _, c := range all.Configurations {
		if !placed[c.Links.Instance] {
			continue
		}
		switch c.Type {
		case model.TypeScratch, model.TypeCache, model.TypeSwap:
		default:
			return Snapshot{}, nil, fmt.Errorf("configuration %d has type %q, which the snapshot format does not know", c.ID, c.Type)
		}
		switch c.AccessMode {
		case model.AccessStriped, model.AccessPrivate, model.AccessLoadbalance:
		default:
			return Snapshot{}, nil, fmt.Errorf("configuration %d has access mode %q, which the snapshot format does not know", c.ID, c.AccessMode)
		}
		conf := Configuration{ID: c.ID, Instance: c.Links.Instance, Type: c.Type, AccessMode: c.AccessMode}
		if k := c.Cache; k != nil && c.Type == model.TypeCache {
			conf.Cache = &Cache{PFS: k.PFS, ModifiedThreshold: k.ModifiedThreshold, ReadAhead: k.ReadAhead}
			// Watermarks the cache would not take (unset: 0) are the cache's defaults, as on
			// the storage nodes (agent/cachepath.go): left out, bbsim takes the same defaults.
			if 0 < k.LowWatermark && k.LowWatermark < k.HighWatermark && k.HighWatermark <= 100 {
				conf.Cache.HighWatermark, conf.Cache.LowWatermark = k.HighWatermark, k.LowWatermark
			}
			snap.Version = Version
		}
		snap.Configurations = append(snap.Configurations, conf)
	}
	return snap, warnings, nil
}
