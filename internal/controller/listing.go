package controller

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/spillway-hpc/spillway/internal/httpapi"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/views"
)

// The listings, GET /dw/v1/<table>: what Slurm asks for every 30 s (pools, show_sessions,
// show_instances, show_configurations) at a site's scale, 10,000 persistent instances and more
// (issue 11). Each reads only the tables its rows are made of, decodes only the records that
// changed since the last listing (store.Shared), and writes its rows without reflection
// (views.AppendTable).

// listingReads are the tables of the state each listing's rows are made of. pools and nodes
// read the pools and the nodes as well; pools, the totals of the nodes' fragments
// (countElsewhere) rather than the fragments.
var listingReads = map[string][]string{
	"pools":          {},
	"nodes":          {"fragments", "activations"},
	"sessions":       {"sessions"},
	"instances":      {"sessions", "instances", "configurations", "fragments"},
	"configurations": {"configurations", "activations"},
	"fragments":      {"fragments"},
	"namespaces":     {"namespaces"},
	"registrations":  {"registrations"},
	"activations":    {"activations"},
	"stages":         {"stages", "sessions"},
}

// visibilityReads are the tables views.All.VisibleTo looks at, besides the listing's own, to
// tell an ordinary user's objects from others' (controller.private_data): the rows' parents up
// to their sessions.
var visibilityReads = map[string][]string{
	"instances":      {"sessions"},
	"configurations": {"sessions", "instances"},
	"fragments":      {"sessions", "instances"},
	"namespaces":     {"sessions", "instances", "configurations"},
	"registrations":  {"sessions"},
	"activations":    {"sessions"},
	"stages":         {"sessions"},
}

// listingWorld reads, in one read transaction, the tables the listing of table is made of
// (listingReads) and, when private, those its visibility needs (visibilityReads). The objects
// but the pools and nodes come from the listings' cache, shared: the world is for rendering
// only.
func (c *Controller) listingWorld(ctx context.Context, table string, private bool) (*lifecycle.World, error) {
	reads := listingReads[table]
	if private {
		reads = append(reads[:len(reads):len(reads)], visibilityReads[table]...)
	}
	var w *lifecycle.World
	err := c.store.View(ctx, func(tx *store.Tx) error {
		var err error
		switch table {
		case "pools", "nodes":
			if w, err = loadNodesAndPools(tx, c.now(), c.cfg.Controller.NodeTimeout.D()); err != nil {
				return err
			}
			if table == "pools" {
				return countElsewhere(tx, w)
			}
		default:
			w = lifecycle.NewWorld()
		}
		read := map[string]bool{}
		for _, t := range reads {
			if !read[t] {
				read[t] = true
				if err := c.listInto(tx, w, t); err != nil {
					return err
				}
			}
		}
		return nil
	})
	return w, err
}

// listInto adds every object of one table to w, through the listings' cache.
func (c *Controller) listInto(tx *store.Tx, w *lifecycle.World, table string) error {
	return tableInto(tx, &c.listed, w, table)
}

// loadTableInto is listInto from the store, without the listings' cache: objects of the
// caller's own.
func loadTableInto(tx *store.Tx, w *lifecycle.World, table string) error {
	return tableInto(tx, nil, w, table)
}

// tableInto adds every object of one table to w: through cache, or from the store (nil).
func tableInto(tx *store.Tx, cache *store.Shared, w *lifecycle.World, table string) error {
	switch table {
	case "sessions":
		return sharedInto(tx, cache, store.Sessions, w.Sessions, func(o *model.Session) int64 { return o.ID })
	case "instances":
		return sharedInto(tx, cache, store.Instances, w.Instances, func(o *model.Instance) int64 { return o.ID })
	case "configurations":
		return sharedInto(tx, cache, store.Configurations, w.Configurations, func(o *model.Configuration) int64 { return o.ID })
	case "fragments":
		return sharedInto(tx, cache, store.Fragments, w.Fragments, func(o *model.Fragment) int64 { return o.ID })
	case "namespaces":
		return sharedInto(tx, cache, store.Namespaces, w.Namespaces, func(o *model.Namespace) int64 { return o.ID })
	case "registrations":
		return sharedInto(tx, cache, store.Registrations, w.Registrations, func(o *model.Registration) int64 { return o.ID })
	case "activations":
		return sharedInto(tx, cache, store.Activations, w.Activations, func(o *model.Activation) int64 { return o.ID })
	case "stages":
		return sharedInto(tx, cache, store.Stages, w.Stages, func(o *model.Stage) int64 { return o.ID })
	}
	return fmt.Errorf("listing: no table %q to read", table)
}

// sharedInto adds a table's objects to into: through cache, or from the store (nil: objects
// of the caller's own, loadInto).
func sharedInto[T any](tx *store.Tx, cache *store.Shared, table store.IDTable[T], into map[int64]*T, id func(*T) int64) error {
	if cache == nil {
		return loadInto(tx, table, into, id)
	}
	all, err := table.ListShared(tx, cache)
	if err != nil {
		return err
	}
	for _, o := range all {
		into[id(o)] = o
	}
	return nil
}

// table answers GET /dw/v1/<table>: {"<table>": [rows]}, the rows the caller may see.
func (s *Server) table(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("table")
	private := !who(r).privileged && s.c.cfg.Controller.PrivateData
	var all views.All
	switch _, listed := listingReads[name]; {
	case name == "stage_history":
		history, err := s.c.StageHistory(r.Context())
		if err != nil {
			s.fail(w, err)
			return
		}
		all.StageHistory = views.History(history)
	case listed:
		world, err := s.c.listingWorld(r.Context(), name, private)
		if err != nil {
			s.fail(w, err)
			return
		}
		build := []string{name}
		if private {
			build = append(build, visibilityReads[name]...)
		}
		all = views.BuildTables(world, build...)
	default:
		httpapi.WriteError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no table %q; tables: %s", name, strings.Join(Tables, ", ")))
		return
	}
	if private {
		all = all.VisibleTo(who(r).uid)
	}
	// Sized from the table's last answer (megabytes at 10,000 instances): written without
	// growing, and copying, the buffer again and again.
	last := &listingSizes[slices.Index(Tables, name)]
	buf, ok := views.AppendTable(make([]byte, 0, last.Load()+last.Load()/8+4096), name, all)
	if !ok {
		rows := map[string]any{"nodes": all.Nodes, "stages": all.Stages, "stage_history": all.StageHistory}[name]
		httpapi.WriteJSON(w, 200, map[string]any{name: rows})
		return
	}
	last.Store(int64(len(buf)))
	// The length announced: a client tells a cut-off answer from a whole one.
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(buf)))
	w.WriteHeader(200)
	w.Write(buf)
}

// listingSizes are the sizes of the last answers of the Tables, in their order.
var listingSizes = make([]atomic.Int64, len(Tables))
