package directive

import (
	"fmt"
	"sort"
	"strings"
)

// checkScript applies the rules that relate directives to each other.
func (p *parser) checkScript(s *Script, seen *seenDirectives) {
	if seen.buffers == 0 && len(seen.stages) > 0 {
		p.fail(&Error{Line: seen.stages[0], Directive: "#DW stage_in/stage_out", Problem: "the script stages data but asks for no burst buffer (Slurm refuses such a job too)",
			Fix: "add #DW jobdw type=scratch access_mode=striped capacity=<size>, or #DW persistentdw name=<name>"})
	} else {
		for _, c := range seen.stageChecks {
			p.checkStage(c.cmd, c.stage, s, seen)
		}
	}
	if s.Swap != nil && s.JobDW != nil && s.Swap.Pool != "" && s.JobDW.Pool != "" && s.Swap.Pool != s.JobDW.Pool {
		p.fail(&Error{Line: s.Swap.Line, Directive: "#DW swap", Field: "pool", Value: s.Swap.Pool,
			Problem: fmt.Sprintf("pool %s differs from the #DW jobdw pool %s on line %d: a job's buffer and swap come from one pool", s.Swap.Pool, s.JobDW.Pool, s.JobDW.Line),
			Fix:     "use the same pool, or leave pool= out of #DW swap"})
	}
	for _, x := range s.Destroy {
		if line, ok := seen.created[x.Name]; ok {
			p.fail(&Error{Line: x.Line, Directive: "#BB destroy_persistent", Field: "name", Value: x.Name,
				Problem: fmt.Sprintf("the same job creates %s on line %d: Slurm runs both before the job starts", x.Name, line),
				Fix:     "create and destroy a persistent buffer in different jobs"})
		}
		if line, ok := seen.persistent[x.Name]; ok {
			p.fail(&Error{Line: x.Line, Directive: "#BB destroy_persistent", Field: "name", Value: x.Name,
				Problem: fmt.Sprintf("the job uses %s (#DW persistentdw on line %d) but Slurm destroys it before the job starts", x.Name, line),
				Fix:     "destroy the buffer in a later job that does not use it"})
		}
	}
}

// checkStage checks both paths of a stage directive against the buffers of the script.
func (p *parser) checkStage(cmd string, st Stage, s *Script, seen *seenDirectives) {
	d := &dctx{p: p, line: st.Line, name: "#DW " + cmd}
	in := cmd == "stage_in"
	switch {
	case st.Type == "list":
		// The list file lives on the PFS in both directions; its lines name both sides.
		d.pfsPath("source", st.Source)
		if in {
			d.dwPath("destination", st.Destination, st, s, seen, in)
		} else {
			d.pfsPath("destination", st.Destination)
		}
	case in:
		d.pfsSide("source", st.Source, "destination", st.Destination)
		d.dwPath("destination", st.Destination, st, s, seen, in)
	default:
		d.dwPath("source", st.Source, st, s, seen, in)
		d.pfsSide("destination", st.Destination, "source", st.Source)
	}
}

// pfsSide checks a PFS path, with a hint when the two sides look swapped.
func (d *dctx) pfsSide(field, value, otherField, other string) {
	if _, _, ok := SplitDWPath(value); ok {
		d.fail(field, value, fmt.Sprintf("%s of %s is on the PFS, but this is a burst-buffer path", field, strings.TrimPrefix(d.name, "#DW ")),
			fmt.Sprintf("did you swap source and destination? %s=%s looks like the PFS side", otherField, clip(other, 60)))
		return
	}
	d.pfsPath(field, value)
}

// pfsPath checks an absolute PFS path.
func (d *dctx) pfsPath(field, value string) bool {
	switch {
	case len(value) > d.p.limits.MaxPathBytes:
		d.fail(field, value, fmt.Sprintf("the path is longer than %d bytes (limit MaxPathBytes)", d.p.limits.MaxPathBytes), "use a shorter path")
	case strings.HasSuffix(value, `\`):
		d.fail(field, value, `a path cannot end with \ (at the end of a line it joins the next line)`, `remove the trailing \`)
	case strings.HasPrefix(value, "$"):
		d.fail(field, value, "environment variables are not expanded in directives (only DataWarp's own $DW_... variables, and only on the burst-buffer side)",
			"write the absolute path, e.g. /lustre/scratch/me/input")
	case strings.HasPrefix(value, "~"):
		d.fail(field, value, "~ is not expanded in directives", "write the absolute path, e.g. /home/me/input")
	case !strings.HasPrefix(value, "/") && !strings.HasPrefix(value, "%d"): // Slurm makes %d the absolute working directory
		d.fail(field, value, "a PFS path must be absolute", "start it with /, e.g. /lustre/scratch/me/"+clip(value, 40))
	case strings.Contains(value, "*"):
		d.fail(field, value, "wildcards are not expanded in directives", "stage the directory (type=directory) or a list of files (type=list)")
	default:
		return true
	}
	return false
}

// dwPath checks a burst-buffer path and that the script has the buffer it names.
func (d *dctx) dwPath(field, value string, st Stage, s *Script, seen *seenDirectives, in bool) {
	const where = "start it with $DW_JOB_STRIPED/ (a #DW jobdw buffer) or $DW_PERSISTENT_STRIPED_<name>/ (a #DW persistentdw buffer)"
	if len(value) > d.p.limits.MaxPathBytes {
		d.fail(field, value, fmt.Sprintf("the path is longer than %d bytes (limit MaxPathBytes)", d.p.limits.MaxPathBytes), "use a shorter path")
		return
	}
	if strings.HasSuffix(value, `\`) {
		d.fail(field, value, `a path cannot end with \ (at the end of a line it joins the next line)`, `remove the trailing \`)
		return
	}
	if !strings.HasPrefix(value, "$") {
		fix := where
		if strings.HasPrefix(value, "/") {
			other := st.Source
			if field == "source" {
				other = st.Destination
			}
			if _, _, ok := SplitDWPath(other); ok {
				fix = "did you swap source and destination? " + where
			}
		}
		d.fail(field, value, fmt.Sprintf("the %s of %s must be inside a burst buffer", field, strings.TrimPrefix(d.name, "#DW ")), fix)
		return
	}
	name, rest, ok := splitVariable(value)
	if !ok {
		d.fail(field, value, "malformed variable", where)
		return
	}
	if !isDWVariable(name) {
		for _, v := range []string{VarJobStripedCache, VarJobLoadbalanceCache, VarJobStriped, VarJobPrivate, VarJobLoadbalance} {
			if tail, ok := strings.CutPrefix(name, v); ok && tail != "" {
				d.fail(field, value, fmt.Sprintf("$%s is not a DataWarp variable", name), fmt.Sprintf("did you mean $%s/%s?", v, strings.TrimPrefix(tail, "_")))
				return
			}
		}
		if buf, ok := strings.CutPrefix(name, VarPersistentPrefix); ok {
			f := checkName(buf, d.p.limits.MaxNameBytes)
			d.fail(field, value, fmt.Sprintf("$%s: %q is not a persistent buffer name (%s)", name, buf, f.problem), f.fix)
			return
		}
		fix := where
		if guess := guessVariable(name); guess != "" {
			fix = fmt.Sprintf("did you mean $%s? %s", guess, where)
		}
		d.fail(field, value, fmt.Sprintf("$%s is not expanded in directives: only DataWarp's variables are", name), fix)
		return
	}
	if rest != "" && rest[0] != '/' {
		d.fail(field, value, fmt.Sprintf("expected / after the variable $%s", name), fmt.Sprintf("write ${%s}/%s", name, clip(rest, 60)))
		return
	}
	if escapes(rest) {
		d.fail(field, value, "paths that escape an instance are refused: .. climbs above $"+name, "remove the .. components")
		return
	}
	if st.Type == "file" && !in && (rest == "" || rest == "/") {
		d.fail(field, value, "type=file needs a file, not the whole buffer", "name the file, e.g. $"+name+"/output.dat, or use type=directory")
		return
	}
	d.available(field, value, name, s, seen, in)
}

// available checks that the script has the buffer the variable name belongs to.
func (d *dctx) available(field, value, name string, s *Script, seen *seenDirectives, in bool) {
	j := s.JobDWOfType("scratch")
	switch name {
	case VarJobPrivate:
		d.fail(field, value, "staging is not supported for access_mode=private, by design in DataWarp: each compute node has its own namespace",
			"add striped (access_mode=striped,private) and stage to $DW_JOB_STRIPED")
	case VarJobStripedCache, VarJobLoadbalanceCache:
		d.fail(field, value, "a cache buffer (type=cache) is not staged: it reads and writes its pfs= directory itself", "remove the directive, or use type=scratch with $DW_JOB_STRIPED")
	case VarJobStriped, VarJobLoadbalance:
		mode := "striped"
		if name == VarJobLoadbalance {
			mode = "loadbalance"
		}
		cache := s.JobDWOfType("cache")
		switch {
		case j == nil && cache != nil && seen.jobdwTypes["scratch"] == 0:
			d.fail(field, value, fmt.Sprintf("the #DW jobdw on line %d is type=cache, which is not staged: it reads and writes its pfs= directory itself", cache.Line),
				fmt.Sprintf("use type=scratch to stage data, or add a #DW jobdw type=scratch access_mode=%s capacity=<size> beside the cache", mode))
		case j == nil && seen.jobdwLine != 0:
			// The #DW jobdw is faulty and already reported.
		case j == nil:
			d.fail(field, value, fmt.Sprintf("$%s needs a #DW jobdw", name), fmt.Sprintf("add #DW jobdw type=scratch access_mode=%s capacity=<size>", mode))
		case !j.HasAccess(mode):
			fix := "use access_mode=loadbalance, or stage to $DW_JOB_STRIPED"
			if mode == "striped" {
				fix = "use access_mode=striped (or striped,private to keep the private view)"
			}
			d.fail(field, value, fmt.Sprintf("$%s needs access_mode %s, but the #DW jobdw on line %d has access_mode=%s", name, mode, j.Line, strings.Join(j.AccessModes, ",")), fix)
		case mode == "loadbalance" && !in:
			d.fail(field, value, "a loadbalance buffer is read-only to the job: it holds only what was staged in", "stage out from a striped buffer instead")
		}
	default:
		if IsPersistentCacheVar(name) {
			d.fail(field, value, "a cache buffer (type=cache) is not staged: it reads and writes its pfs= directory itself", "remove the directive, or stage into a scratch buffer")
			return
		}
		buf := strings.TrimPrefix(name, VarPersistentPrefix)
		if _, ok := seen.persistent[buf]; ok {
			return
		}
		fix := fmt.Sprintf("add #DW persistentdw name=%s", buf)
		if line, ok := seen.created[buf]; ok {
			fix = fmt.Sprintf("the #BB create_persistent on line %d creates it, but only #DW persistentdw gives a job its variable; %s", line, fix)
		} else if len(seen.persistent) > 0 {
			names := make([]string, 0, len(seen.persistent))
			for n := range seen.persistent {
				names = append(names, n)
			}
			sort.Strings(names)
			if s := suggest(buf, names); s != "" {
				fix = fmt.Sprintf("did you mean $%s? %s", PersistentVar(s), fix)
			}
		}
		d.fail(field, value, fmt.Sprintf("persistent buffer %s is not attached to this job", buf), fix)
	}
}

// guessVariable returns the DataWarp variable name is a misspelling of, or "":
// DW_JOB_STRIPPED → DW_JOB_STRIPED, DW_JPERSISTENT_STRIPED_x → DW_PERSISTENT_STRIPED_x.
func guessVariable(name string) string {
	if s := suggest(name, []string{VarJobStriped, VarJobPrivate, VarJobLoadbalance, VarJobStripedCache, VarJobLoadbalanceCache}); s != "" {
		return s
	}
	// Try every split of name into a misspelt prefix and a valid buffer name; keep the closest.
	best, bestDist := "", 3
	n := len(VarPersistentPrefix)
	for k := max(n-2, 1); k <= n+2 && k < len(name); k++ {
		dist := editDistance(strings.ToUpper(name[:k]), VarPersistentPrefix)
		if name[k-1] != '_' {
			dist++ // the prefix ends in "_": a split elsewhere is a worse guess
		}
		if dist < bestDist && checkName(name[k:], DefaultLimits().MaxNameBytes) == nil {
			best, bestDist = VarPersistentPrefix+name[k:], dist
		}
	}
	return best
}
