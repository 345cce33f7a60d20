// Package dwstat renders DataWarp's status tables from the controller's views, with the
// headers, units and empty-table messages of Cray's dwstat (which scripts and Slurm parse).
package dwstat

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/units"
	"github.com/spillway-hpc/spillway/internal/views"
)

// Options change how tables print.
type Options struct {
	Bytes         bool           // -b: raw byte counts instead of human units
	ConfigDetails bool           // --cd: configurations with amode and backing_path
	Location      *time.Location // for timestamps; nil = local time
}

// Tables lists every table name dwstat knows, in the order `all` prints them.
var Tables = []string{"pools", "nodes", "sessions", "instances", "configurations", "registrations", "activations", "fragments", "namespaces", "stages"}

// Spillway's own tables: known by name, not printed by `all` (DataWarp's dwstat has none).
var Own = []string{"accounting", "controllers"}

// Most is what `dwstat most` prints.
var Most = []string{"pools", "sessions", "instances", "configurations", "registrations", "activations"}

// Aliases maps the singular and short names DataWarp users type to table names.
var Aliases = map[string]string{
	"pool": "pools", "node": "nodes", "session": "sessions", "sess": "sessions", "instance": "instances", "inst": "instances",
	"configuration": "configurations", "config": "configurations", "configs": "configurations", "conf": "configurations", "confs": "configurations",
	"registration": "registrations", "reg": "registrations", "regs": "registrations",
	"activation": "activations", "activ": "activations", "activs": "activations",
	"fragment": "fragments", "frag": "fragments", "frags": "fragments",
	"namespace": "namespaces", "nss": "namespaces", "ns": "namespaces", "stage": "stages",
	"acct": "accounting", "controller": "controllers", "ctl": "controllers", "ctls": "controllers",
}

// Resolve turns command-line words into table names: aliases, `most`, `all`; no words means
// the pools table. Unknown words are an error that lists the valid ones.
func Resolve(words []string) ([]string, bool, error) {
	if len(words) == 0 {
		return []string{"pools"}, false, nil
	}
	var out []string
	summary := false
	seen := map[string]bool{}
	add := func(t string) {
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	for _, w := range words {
		switch w {
		case "most":
			summary = true
			for _, t := range Most {
				add(t)
			}
			continue
		case "all":
			summary = true
			for _, t := range Tables {
				add(t)
			}
			continue
		}
		if a, ok := Aliases[w]; ok {
			w = a
		}
		known := false
		for _, t := range append(Tables[:len(Tables):len(Tables)], Own...) {
			known = known || t == w
		}
		if !known {
			return nil, false, fmt.Errorf("unknown table %q; tables: %s, %s, most, all", w, strings.Join(Tables, ", "), strings.Join(Own, ", "))
		}
		add(w)
	}
	return out, summary, nil
}

// Render prints the tables. With summary (most, all) empty tables are not printed one by one
// but named on a last "did not find any ..." line, as DataWarp does.
func Render(a views.All, tables []string, summary bool, o Options) string {
	var b strings.Builder
	var missing []string
	first := true
	computeNodes := false
	for _, n := range a.Nodes {
		computeNodes = computeNodes || n.ComputeOnly
	}
	var expanded []string
	for _, t := range tables {
		expanded = append(expanded, t)
		if t == "nodes" && computeNodes {
			expanded = append(expanded, "compute nodes") // after the storage nodes
		}
	}
	for _, t := range expanded {
		rows, header, empty := table(a, t, o)
		if t == "nodes" && computeNodes {
			empty = "no storage nodes"
		}
		if t == "configurations" && summary {
			for _, typ := range []string{"scratch", "cache", "swap"} {
				if !hasType(a, typ) {
					missing = append(missing, typ+" configurations")
				}
			}
			if len(rows) == 0 {
				continue
			}
		} else if len(rows) == 0 {
			if summary {
				if t == "nodes" && computeNodes {
					missing = append(missing, "storage nodes")
				} else {
					missing = append(missing, t)
				}
				continue
			}
			if !first {
				b.WriteString("\n")
			}
			b.WriteString(empty + "\n")
			first = false
			continue
		}
		if !first {
			b.WriteString("\n")
		}
		first = false
		b.WriteString(align(append([][]string{header}, rows...)))
	}
	if summary && len(missing) > 0 {
		if !first {
			b.WriteString("\n")
		}
		b.WriteString("did not find any " + strings.Join(missing, ", ") + "\n")
	}
	return b.String()
}

func hasType(a views.All, typ string) bool {
	for _, c := range a.Configurations {
		if c.Type == typ {
			return true
		}
	}
	return false
}

// align right-aligns every column, separated by one space.
func align(rows [][]string) string {
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len(c))
		}
	}
	// A last column of free text (a stage's error, a session's failure, a cache fragment's
	// flush) is written as it is: padded to the longest message, it would push every row's
	// columns off a terminal.
	freeText := slices.Contains([]string{"error", "failure", "cache"}, rows[0][len(rows[0])-1])
	var b strings.Builder
	for _, r := range rows {
		for i, c := range r {
			if i > 0 {
				b.WriteByte(' ')
			}
			if !(freeText && i == len(r)-1) {
				b.WriteString(strings.Repeat(" ", widths[i]-len(c)))
			}
			b.WriteString(c)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func table(a views.All, name string, o Options) (rows [][]string, header []string, empty string) {
	size := func(n uint64) string {
		if o.Bytes {
			return strconv.FormatUint(n, 10)
		}
		return units.FormatHuman(n)
	}
	loc := o.Location
	if loc == nil {
		loc = time.Local
	}
	stamp := func(epoch int64) string { return time.Unix(epoch, 0).In(loc).Format("2006-01-02T15:04:05") }
	expiration := func(e int64) string {
		if e == 0 {
			return "never"
		}
		return stamp(e)
	}
	tf := func(b bool) string { return strconv.FormatBool(b) }
	id := func(i int64) string { return strconv.FormatInt(i, 10) }
	switch name {
	case "pools":
		header, empty = []string{"pool", "units", "quantity", "free", "gran"}, "no pools"
		for _, p := range a.Pools {
			rows = append(rows, []string{p.ID, p.Units, size(p.Quantity * p.Granularity), size(p.Free * p.Granularity), size(p.Granularity)})
		}
	case "nodes":
		// DataWarp's columns, then Spillway's: the SSD's remaining endurance and why the node
		// takes no new fragments (last: the reason has spaces).
		header, empty = []string{"node", "pool", "online", "drain", "gran", "capacity", "insts", "activs", "endurance", "reason"}, "no nodes"
		for _, n := range a.Nodes {
			if n.ComputeOnly {
				continue // listed apart, in the compute nodes' table
			}
			online, drain, pool, endurance, reason := "offline", "fill", n.Pool, "-", "-"
			if n.Online {
				online = "online"
			}
			switch {
			case n.Drain:
				drain = "drain"
			case n.Worn:
				drain = "worn"
			}
			if pool == "" {
				pool, drain = "-", "-"
			}
			if n.StorageClaim != "" {
				drain = "unadmitted" // reason names the claim and the command that admits it
			}
			if e := n.Endurance; e != nil && e.Known {
				endurance = strconv.Itoa(e.PercentRemaining) + "%"
			}
			if n.Reason != "" {
				reason = n.Reason
			}
			rows = append(rows, []string{n.ID, pool, online, drain, size(n.Granularity), size(n.Capacity), strconv.Itoa(n.Instances), strconv.Itoa(n.Activations), endurance, reason})
		}
	case "compute nodes":
		// Nodes whose agent serves no storage: DataWarp's dwstat nodes listed its servers
		// only, so they are not rows of the storage table (whose scripts count $3 != "online"
		// as a drained server) but a table of their own, column 3 online as there.
		header = []string{"node", "role", "online", "activs", "reason"}
		for _, n := range a.Nodes {
			if !n.ComputeOnly {
				continue
			}
			online, reason := "offline", "-"
			if n.Online {
				online = "online"
			}
			if n.Reason != "" {
				reason = n.Reason
			}
			rows = append(rows, []string{n.ID, "compute", online, strconv.Itoa(n.Activations), reason})
		}
	case "sessions":
		// DataWarp's columns, then Spillway's: why the session is stuck (a failed stage-out or
		// cache flush that undid its teardown), last and unpadded as it has spaces.
		header, empty = []string{"sess", "state", "token", "creator", "owner", "created", "expiration", "nodes", "failure"}, "no sessions"
		for _, s := range a.Sessions {
			rows = append(rows, []string{id(s.ID), s.State.Flags(), s.Token, s.Creator, strconv.FormatUint(uint64(s.Owner), 10), stamp(s.Created), expiration(s.Expiration), strconv.Itoa(len(s.Links.ClientNodes)), orDash(s.Failure)})
		}
	case "instances":
		header, empty = []string{"inst", "state", "sess", "bytes", "nodes", "created", "expiration", "intact", "label", "public", "confs"}, "no instances"
		for _, i := range a.Instances {
			rows = append(rows, []string{id(i.ID), i.State.Flags(), id(i.Links.Session), size(i.Capacity.Bytes), strconv.Itoa(i.Capacity.Nodes), stamp(i.Created), expiration(i.Expiration), tf(i.Intact), i.Label, tf(i.Public), strconv.Itoa(len(i.Links.Configurations))})
		}
	case "configurations":
		header, empty = []string{"conf", "state", "inst", "type", "activs"}, "no scratch, cache, swap configurations"
		if o.ConfigDetails {
			header = []string{"conf", "state", "inst", "type", "amode", "activs", "backing_path"}
		}
		for _, c := range a.Configurations {
			if o.ConfigDetails {
				rows = append(rows, []string{id(c.ID), c.State.Flags(), id(c.Links.Instance), c.Type, orDash(c.AccessType), strconv.Itoa(c.Activations), orDash(c.BackingPath)})
			} else {
				rows = append(rows, []string{id(c.ID), c.State.Flags(), id(c.Links.Instance), c.Type, strconv.Itoa(c.Activations)})
			}
		}
	case "registrations":
		header, empty = []string{"reg", "state", "sess", "conf", "wait"}, "no registrations"
		for _, r := range a.Registrations {
			rows = append(rows, []string{id(r.ID), r.State.Flags(), id(r.Session), id(r.Configuration), tf(r.Wait)})
		}
	case "activations":
		header, empty = []string{"activ", "state", "sess", "conf", "nodes", "mount"}, "no activations"
		for _, act := range a.Activations {
			rows = append(rows, []string{id(act.ID), act.State.Flags(), id(act.Session), id(act.Configuration), act.Node, orDash(act.Mount)}) // a swap area has no mount
		}
	case "fragments":
		// DataWarp's columns, then Spillway's: a cache fragment's teardown flush (its bytes not
		// yet on the PFS, why it failed, what was lost with its node), last as it has spaces.
		header, empty = []string{"frag", "state", "inst", "capacity", "node", "cache"}, "no fragments"
		for _, f := range a.Fragments {
			cache := "-"
			switch {
			case f.CacheLost != "":
				cache = "lost: " + f.CacheLost
			case f.CacheFlushError != "":
				cache = "flush failed: " + f.CacheFlushError
			case f.CacheDirty > 0:
				cache = size(f.CacheDirty) + " not yet on the PFS"
			}
			rows = append(rows, []string{id(f.ID), f.State.Flags(), id(f.Instance), size(f.Capacity), f.Node, cache})
		}
	case "namespaces":
		header, empty = []string{"nss", "state", "conf", "frag", "span"}, "no namespaces"
		for _, n := range a.Namespaces {
			rows = append(rows, []string{id(n.ID), n.State.Flags(), id(n.Configuration), id(n.Fragment), strconv.Itoa(n.Span)})
		}
	case "accounting":
		// One row per fragment (its storage node), then the instance's totals (node "*")
		// with its stages' bytes; window: bytes written within the current write window,
		// of limit (spec §5.3); ro: the window tripped, the instance is read-only.
		header, empty = []string{"inst", "token", "node", "written", "read", "wops", "rops", "files", "used", "peak", "window", "limit", "ro", "stage_in", "stage_out"}, "no accounting"
		orNone := func(n uint64) string {
			if n == 0 {
				return "-"
			}
			return size(n)
		}
		u := func(n uint64) string { return strconv.FormatUint(n, 10) }
		for _, acct := range a.Accounting {
			r := acct.Realm
			for _, f := range r.Fragments {
				rows = append(rows, []string{id(r.RealmID), r.Token, f.ServerHostname, size(f.BytesWritten), size(f.BytesRead), u(f.WriteOps), u(f.ReadOps),
					u(f.FilesCreated), size(f.CapacityUsed), size(f.CapacityMax), size(f.WindowWritten), orNone(f.WriteLimit), tf(f.ReadOnly), "-", "-"})
			}
			rows = append(rows, []string{id(r.RealmID), r.Token, "*", size(r.BytesWritten), size(r.BytesRead), u(r.WriteOps), u(r.ReadOps),
				u(r.FilesCreated), size(r.CapacityUsed), size(r.CapacityMax), "-", "-", "-", size(r.StageBytesIn), size(r.StageBytesOut)})
		}
	case "controllers":
		// One row per controller the command was given, as each answered for itself.
		header, empty = []string{"address", "role", "leader", "engine", "version"}, "no controllers"
		for _, c := range a.Controllers {
			role := c.Role
			if c.Error != "" {
				role += ": " + c.Error
			}
			rows = append(rows, []string{c.Address, role, orDash(c.Leader), orDash(c.Engine), orDash(c.Version)})
		}
	case "stages":
		header, empty = []string{"stage", "sess", "token", "dir", "type", "status", "files", "bytes", "source", "destination", "error"}, "no stages"
		// The live stages, then the finished ones kept after their sessions went.
		for _, s := range append(append([]views.Stage(nil), a.Stages...), a.StageHistory...) {
			src, dst := s.PFSPath, s.DWPath
			if s.Direction == "out" {
				src, dst = s.DWPath, s.PFSPath
			}
			rows = append(rows, []string{id(s.ID), id(s.Session), s.Token, s.Direction, s.Type, s.Status,
				fmt.Sprintf("%d/%d", s.FilesDone, s.FilesTotal), size(s.BytesDone) + "/" + size(s.BytesTotal), orDash(src), orDash(dst), orDash(s.Error)})
		}
	}
	return rows, header, empty
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Select returns the named tables of a as a map, for --json.
func Select(a views.All, tables []string) map[string]any {
	out := map[string]any{}
	for _, t := range tables {
		switch t {
		case "pools":
			out[t] = a.Pools
		case "nodes":
			out[t] = a.Nodes
		case "sessions":
			out[t] = a.Sessions
		case "instances":
			out[t] = a.Instances
		case "configurations":
			out[t] = a.Configurations
		case "registrations":
			out[t] = a.Registrations
		case "activations":
			out[t] = a.Activations
		case "fragments":
			out[t] = a.Fragments
		case "namespaces":
			out[t] = a.Namespaces
		case "stages":
			out[t] = a.Stages
			history := a.StageHistory
			if history == nil {
				history = []views.Stage{}
			}
			out["stage_history"] = history
		case "accounting":
			out[t] = a.Accounting
			if a.Accounting == nil {
				out[t] = []views.Accounting{}
			}
		case "controllers":
			out[t] = a.Controllers
			if a.Controllers == nil {
				out[t] = []views.Controller{}
			}
		}
	}
	return out
}

// Align right-aligns rows (the header first) as dwstat's tables are; a last column named
// "error" is free text, not padded.
func Align(rows [][]string) string { return align(rows) }
