package directive

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/spillway-hpc/spillway/internal/units"
)

// Commands of each prefix, in the order messages list them.
var (
	dwCommands = []string{"jobdw", "persistentdw", "swap", "stage_in", "stage_out"}
	bbCommands = []string{"create_persistent", "destroy_persistent"}
)

// parse reads src into a Script and collects every fault; items whose own directive is faulty
// are left out of the Script.
func parse(src []byte, limits Limits) (*Script, *parser) {
	p := &parser{src: src, limits: limits.withDefaults()}
	block := p.scan(true)
	p.symbolWarnings(block.directives)
	s := &Script{}
	seen := &seenDirectives{}
	for _, l := range block.directives {
		if l.broken {
			continue
		}
		p.directive(l, s, seen)
	}
	p.checkScript(s, seen)
	p.finishWarnings()
	return s, p
}

// seenDirectives remembers directives across the script for the checks that relate them,
// including faulty ones, so that one fault does not cause another.
type seenDirectives struct {
	jobdwLine   int            // first #DW jobdw, even if faulty
	jobdwTypes  map[string]int // type -> line of the first #DW jobdw of that type, even if faulty
	swapLine    int
	persistent  map[string]int // name -> line of #DW persistentdw
	created     map[string]int
	destroyed   map[string]int
	stages      []int        // lines of stage_in/stage_out, faulty or not
	stageChecks []stageCheck // stages whose paths are to be checked against the buffers
	buffers     int          // directives that ask for a buffer (jobdw, persistentdw, swap, #BB), faulty or not
}

// stageCheck is a stage directive waiting for the checks that need the whole script.
type stageCheck struct {
	cmd   string // stage_in | stage_out
	stage Stage
}

func (p *parser) directive(l *logical, s *Script, seen *seenDirectives) {
	body := l.text[3:] // after "#DW" / "#BB"
	if body != "" && !isBlank(body[0]) && len(l.segments) > 0 && l.segments[0].end-l.segments[0].start > 3 {
		word := splitBlanks(body)[0]
		fix := fmt.Sprintf("directives start with \"#DW \" or \"#BB \"; %s%s belongs to another burst-buffer plugin (#BB_LUA is Slurm's lua plugin), which Spillway does not read",
			l.prefix, clip(word, 40))
		if knownCommand(word) {
			fix = fmt.Sprintf("write \"%s %s\"", l.prefix, word)
		}
		p.fail(&Error{Line: l.line, Directive: l.prefix.String() + clip(word, 40), Problem: fmt.Sprintf("%s must be followed by a space", l.prefix), Fix: fix})
		return
	}
	tokens := splitBlanks(body)
	if len(tokens) == 0 {
		p.fail(&Error{Line: l.line, Directive: l.prefix.String(), Problem: "empty directive", Fix: "expected a command such as " + l.prefix.commandList()})
		return
	}
	cmd, args := tokens[0], tokens[1:]
	d := &dctx{p: p, line: l.line, name: l.prefix.String() + " " + clip(cmd, 40)}
	if !d.checkText(body) {
		return
	}
	switch l.prefix {
	case prefixDW:
		switch cmd {
		case "jobdw":
			if seen.jobdwLine == 0 {
				seen.jobdwLine = l.line
			}
			seen.buffers++
			d.jobdw(args, s, seen, l)
		case "persistentdw":
			seen.buffers++
			d.persistentdw(args, s, seen)
		case "swap":
			seen.buffers++
			d.swap(args, s, seen)
		case "stage_in", "stage_out":
			seen.stages = append(seen.stages, l.line)
			d.stage(cmd, args, s, seen)
		case "create_persistent", "destroy_persistent":
			seen.buffers++
			d.fail("", "", "refused (Slurm refuses it too): persistent buffers are created and destroyed by the workload manager, through #BB lines",
				fmt.Sprintf("use #BB %s instead", cmd))
		default:
			fix := "expected one of: " + strings.Join(dwCommands, ", ")
			if s := suggest(cmd, append(append([]string{}, dwCommands...), bbCommands...)); s != "" {
				fix = fmt.Sprintf("did you mean %s? %s", s, fix)
			}
			d.fail("", "", "Unsupported #DW command "+clip(cmd, quoteLimit), fix)
		}
	case prefixBB:
		switch cmd {
		case "create_persistent":
			seen.buffers++
			d.createPersistent(args, s, seen, l)
		case "destroy_persistent":
			seen.buffers++
			d.destroyPersistent(args, s, seen, l)
		default:
			fix := "expected one of: " + strings.Join(bbCommands, ", ")
			if slices.Contains(dwCommands, cmd) {
				fix = fmt.Sprintf("%s is a DataWarp directive: write #DW %s", cmd, cmd)
			} else if s := suggest(cmd, bbCommands); s != "" {
				fix = fmt.Sprintf("did you mean %s? %s", s, fix)
			}
			d.fail("", "", "Unsupported #BB command "+clip(cmd, quoteLimit), fix)
		}
	}
}

func (p prefix) commandList() string {
	if p == prefixBB {
		return strings.Join(bbCommands, " or ")
	}
	return strings.Join(dwCommands, ", ")
}

// jobdwKeys are the keys of #DW jobdw.
var jobdwKeys = keySet{
	keys: []string{"type", "access_mode", "capacity", "pool", "pfs", "max_mds", "optimization_strategy",
		"write_window_length", "write_window_multiplier", "modified_threshold", "read_ahead", "sync_on_close", "sync_to_pfs"},
	hints: map[string]string{
		"access":            "for #DW jobdw the key is access_mode=, e.g. access_mode=striped",
		"mfs":               "MFS is an access-mode suboption: access_mode=striped(MFS=10GiB)",
		"max_file_size":     "the maximum file size is an access-mode suboption: access_mode=striped(MFS=10GiB)",
		"mfc":               "MFC is an access-mode suboption: access_mode=striped(MFC=100000)",
		"max_files_created": "the maximum number of files is an access-mode suboption: access_mode=striped(MFC=100000)",
		"client_cache":      "client_cache is an access-mode suboption: access_mode=striped(client_cache)",
		"size":              "the size is written capacity=, e.g. capacity=100GiB",
		"swap":              "swap is its own directive: #DW swap 10GiB",
		"name":              "a job buffer has no name; to use a persistent buffer write #DW persistentdw name=<name>",
		"mds":               "for several metadata servers write max_mds=yes",
	},
}

// cacheOnly are the jobdw options that only a cache instance takes.
var cacheOnly = []string{"modified_threshold", "read_ahead", "sync_on_close", "sync_to_pfs"}

func (d *dctx) jobdw(args []string, s *Script, seen *seenDirectives, l *logical) {
	v, _ := d.collect(args, jobdwKeys)
	// A job may hold one instance of each type (a scratch and a cache, DataWarp's Phase 3);
	// a second of one type is refused. Still read the rest, so that its own faults are
	// reported too.
	typ := v["type"]
	if typ == "" {
		typ = "scratch"
	}
	if typ == "scratch" || typ == "cache" {
		if seen.jobdwTypes == nil {
			seen.jobdwTypes = map[string]int{}
		}
		if first, dup := seen.jobdwTypes[typ]; dup {
			other := "cache access_mode=striped pfs=<dir>"
			if typ == "cache" {
				other = "scratch"
			}
			d.fail("", "", fmt.Sprintf("only one #DW jobdw of type=%s per job is allowed (the first is on line %d)", typ, first),
				fmt.Sprintf("put all the capacity into one #DW jobdw type=%s; a job may add one #DW jobdw type=%s, and use #DW persistentdw for other buffers", typ, other))
		} else {
			seen.jobdwTypes[typ] = l.line
		}
	}
	j := &JobDW{Line: d.line, Type: "scratch", AccessModes: []string{"striped"}, OptimizationStrategy: "bandwidth",
		WriteWindowLength: 86400, WriteWindowMultiplier: 10}
	given := map[string]bool{}
	for k := range v {
		given[k] = true
	}
	if t, ok := v["type"]; ok {
		j.Type, _ = d.oneOf("type", t, "scratch", "cache")
	}
	if a, ok := v["access_mode"]; ok {
		if spec, ok := d.accessMode("access_mode", a, true); ok {
			j.AccessModes = spec.modes
			j.MaxFileSize, j.MaxFilesCreated, j.ClientCache = spec.maxFileSize, spec.maxFiles, spec.clientCache
			for _, k := range spec.given {
				given[k] = true
			}
		}
	}
	if c, ok := v["capacity"]; ok {
		j.Capacity, j.CapacityText = d.capacity("capacity", c), c
	} else {
		d.fail("capacity", "", "capacity is required", "add capacity=<size>, e.g. capacity=100GiB")
	}
	if pool, ok := v["pool"]; ok && d.pool("pool", pool) {
		j.Pool = pool
	}
	if pfs, ok := v["pfs"]; ok {
		if clean, good := d.pfsDir("pfs", pfs); good {
			j.PFS = clean
		}
	}
	if m, ok := v["max_mds"]; ok {
		j.MaxMDS, _ = d.yesNo("max_mds", m)
	}
	if o, ok := v["optimization_strategy"]; ok {
		j.OptimizationStrategy, _ = d.oneOf("optimization_strategy", o, "bandwidth", "interference")
	}
	if w, ok := v["write_window_length"]; ok {
		j.WriteWindowLength, _ = d.count("write_window_length", w, 1, "a number of seconds, e.g. 86400")
	}
	if w, ok := v["write_window_multiplier"]; ok {
		j.WriteWindowMultiplier, _ = d.count("write_window_multiplier", w, 1, "a whole multiple of the capacity, e.g. 10")
	}
	if m, ok := v["modified_threshold"]; ok {
		j.ModifiedThreshold, _ = d.size("modified_threshold", m)
	}
	if r, ok := v["read_ahead"]; ok {
		j.ReadAhead, _ = d.size("read_ahead", r)
	}
	if b, ok := v["sync_on_close"]; ok {
		j.SyncOnClose, _ = d.yesNo("sync_on_close", b)
	}
	if b, ok := v["sync_to_pfs"]; ok {
		j.SyncToPFS, _ = d.yesNo("sync_to_pfs", b)
	}
	// Rules that relate options.
	switch j.Type {
	case "cache":
		if _, ok := v["pfs"]; !ok {
			d.fail("pfs", "", "type=cache needs pfs=", "add pfs=<absolute PFS directory to cache>, e.g. pfs=/lustre/me/run1")
		}
		if j.HasAccess("private") {
			// DataWarp's Table I: a cache's files are the PFS's, visible to every node.
			d.fail("access_mode", v["access_mode"], "access_mode=private is not available for type=cache (as in DataWarp): a cache's files are the PFS directory's, which every compute node sees",
				"use access_mode=striped or access_mode=loadbalance")
		}
		if j.MaxMDS {
			d.fail("max_mds", v["max_mds"], "max_mds is for type=scratch: a cache keeps its metadata on the PFS", "remove max_mds")
		}
	case "scratch":
		if pfs, ok := v["pfs"]; ok {
			d.fail("pfs", pfs, "pfs= is only for type=cache: a scratch buffer starts empty", "remove pfs= and copy data in with #DW stage_in, or use type=cache")
		}
		for _, k := range cacheOnly {
			if val, ok := v[k]; ok {
				d.fail(k, val, fmt.Sprintf("%s is a cache tunable, only for type=cache", k), fmt.Sprintf("remove %s, or use type=cache pfs=<dir>", k))
			}
		}
		if j.MaxMDS && !j.HasAccess("striped") {
			d.fail("max_mds", v["max_mds"], "max_mds=yes needs access_mode striped (a private namespace has one metadata server per node already)", "remove max_mds, or use access_mode=striped")
		}
	}
	d.slurmAgrees(l, "capacity", v)
	d.slurmAgrees(l, "pool", v)
	if d.failed {
		return
	}
	for _, k := range JobDWOptions {
		if given[k] {
			j.Given = append(j.Given, k)
		}
	}
	if s.JobDW == nil {
		s.JobDW = j
	}
	s.JobDWs = append(s.JobDWs, j)
}

// pfsDir checks the PFS directory of a cache instance (pfs=): an absolute path in clean form,
// since the site's allowed_pfs prefixes are matched against it as written. One trailing "/"
// is allowed and dropped. It returns the directory without the trailing "/".
func (d *dctx) pfsDir(field, value string) (string, bool) {
	if !d.pfsPath(field, value) {
		return "", false
	}
	dir := value
	if len(dir) > 1 {
		dir = strings.TrimSuffix(dir, "/")
	}
	// Slurm makes %d the job's working directory: the part after it must be clean too.
	body, sym := dir, ""
	if rest, ok := strings.CutPrefix(dir, "%d"); ok {
		body, sym = "/"+strings.TrimPrefix(rest, "/"), "%d"
	}
	if path.Clean(body) == body {
		return dir, true
	}
	clean := sym + path.Clean(body)
	if sym != "" && clean == "%d/" {
		clean = "%d"
	}
	for _, part := range strings.Split(body, "/") {
		if part == ".." {
			d.fail(field, value, fmt.Sprintf("%s=%s contains \"..\": the site's allowed directories are matched against the path as written", field, quote(value)),
				fmt.Sprintf("write the directory itself, e.g. %s=%s", field, clip(clean, 80)))
			return "", false
		}
	}
	d.fail(field, value, fmt.Sprintf("%s=%s is not in clean form (an empty or \".\" component)", field, quote(value)), fmt.Sprintf("write %s=%s", field, clip(clean, 80)))
	return "", false
}

// capacity reads a capacity: a size greater than zero. It warns when Slurm will read a
// different number (Slurm's strtoull stops at the decimal point) or when the number is
// bytes by accident.
func (d *dctx) capacity(field, value string) uint64 {
	n, ok := d.size(field, value)
	if !ok {
		return 0
	}
	if n == 0 {
		d.fail(field, value, fmt.Sprintf("%s must be greater than zero", field), sizeFix)
		return 0
	}
	number, suffix := splitNumber(value)
	if strings.Contains(number, ".") {
		whole := strings.SplitN(number, ".", 2)[0]
		d.p.warn(d.line, "%s: %s=%s: Slurm reads only the whole number %q of a decimal size (as that many bytes) when it schedules and accounts the job, while Spillway allocates %s; write %s=%s so both agree",
			d.name, field, value, whole, value, field, units.FormatExact(n))
	} else if suffix == "" && n < 1<<20 {
		d.p.warn(d.line, "%s: %s=%s means %d bytes (no unit means bytes); write e.g. %s=%sGiB if you meant gibibytes", d.name, field, value, n, field, number)
	}
	return n
}

// slurmAgrees checks that Slurm, which finds "key=" anywhere in the line with strstr and takes
// the value up to the next space, reads the same value as this parser.
func (d *dctx) slurmAgrees(l *logical, key string, v map[string]string) {
	text := l.text
	i := strings.Index(text, key+"=")
	if i < 0 {
		return
	}
	slurm := text[i+len(key)+1:]
	if sp := strings.IndexByte(slurm, ' '); sp >= 0 {
		slurm = slurm[:sp]
	}
	ours, ok := v[key]
	if ok && ours == slurm && (i == 0 || isBlank(text[i-1])) {
		return
	}
	if ok && len(slurm) > len(ours) && strings.HasPrefix(slurm, ours) && strings.ContainsAny(slurm[len(ours):len(ours)+1], "\t\v\f\r") {
		d.fail(key, ours, fmt.Sprintf("Slurm separates options with spaces only and would read %s=%s", key, quote(slurm)),
			"separate the options with spaces, not tabs")
		return
	}
	d.fail(key, ours, fmt.Sprintf("Slurm looks for %q anywhere in the line and would read %s from inside another value", key+"=", quote(slurm)),
		fmt.Sprintf("rename the path or value that contains %q", key+"="))
}

// accessSpec is a parsed access_mode value.
type accessSpec struct {
	modes       []string
	maxFileSize uint64
	maxFiles    uint64
	clientCache bool
	given       []string // MFS, MFC, client_cache as written
}

// accessAliases maps every accepted spelling to its canonical access mode.
var accessAliases = map[string]string{
	"striped": "striped", "private": "private",
	"loadbalance": "loadbalance", "ldbalance": "loadbalance", "ldbal": "loadbalance",
}

var accessOrder = []string{"striped", "private", "loadbalance"}

// accessMode reads "striped", "striped,private", "private,striped", "ldbalance",
// "striped(MFS=16GiB,client_cache)" and the like.
func (d *dctx) accessMode(field, value string, subOK bool) (accessSpec, bool) {
	const fix = "expected striped, private, striped,private or loadbalance (also written ldbalance or ldbal), optionally with suboptions such as striped(MFS=10GiB,MFC=100000,client_cache)"
	var spec accessSpec
	items, ok := splitTopLevel(value)
	if !ok {
		d.fail(field, value, "unbalanced parentheses", fix)
		return spec, false
	}
	have := map[string]bool{}
	ok = true
	for _, item := range items {
		name, sub, hasSub := strings.Cut(item, "(")
		if hasSub {
			if !strings.HasSuffix(sub, ")") || strings.ContainsAny(sub[:len(sub)-1], "()") {
				d.fail(field, value, fmt.Sprintf("malformed suboptions in %q", item), fix)
				ok = false
				continue
			}
			sub = sub[:len(sub)-1]
		}
		mode, known := accessAliases[name]
		if !known {
			problem := fmt.Sprintf("Invalid argument: %s=%s", field, clip(value, quoteLimit))
			if name == "" {
				problem = fmt.Sprintf("an empty access mode in %s=%s", field, clip(value, quoteLimit))
			}
			f := fix
			if s := suggest(name, []string{"striped", "private", "loadbalance", "ldbalance"}); s != "" && name != "" {
				f = fmt.Sprintf("did you mean %s? %s", s, fix)
			}
			d.fail(field, value, problem, f)
			ok = false
			continue
		}
		if have[mode] {
			d.fail(field, value, fmt.Sprintf("access mode %s is given twice", mode), fix)
			ok = false
			continue
		}
		have[mode] = true
		if hasSub {
			if !subOK {
				d.fail(field, value, "access-mode suboptions are not supported here", "remove the parentheses: MFS, MFC and client_cache apply to #DW jobdw only")
				ok = false
				continue
			}
			if !d.suboptions(field, value, sub, &spec) {
				ok = false
			}
		}
	}
	if have["loadbalance"] && len(have) > 1 {
		d.fail(field, value, "loadbalance cannot be combined with another access mode", fix)
		ok = false
	}
	for _, m := range accessOrder {
		if have[m] {
			spec.modes = append(spec.modes, m)
		}
	}
	return spec, ok && len(spec.modes) > 0
}

// splitTopLevel splits at commas outside parentheses.
func splitTopLevel(s string) ([]string, bool) {
	var items []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth < 0 {
				return nil, false
			}
		case ',':
			if depth == 0 {
				items = append(items, s[start:i])
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, false
	}
	return append(items, s[start:]), true
}

func (d *dctx) suboptions(field, value, sub string, spec *accessSpec) bool {
	const fix = "suboptions are MFS=<size> (maximum file size), MFC=<count> (maximum files created) and client_cache[=yes|no]"
	ok := true
	for _, opt := range strings.Split(sub, ",") {
		key, val, hasEq := strings.Cut(opt, "=")
		if slices.Contains(spec.given, key) {
			d.fail(field, value, fmt.Sprintf("suboption %s is given twice", key), "give each suboption once; it applies to the whole buffer")
			ok = false
			continue
		}
		switch {
		case key == "client_cache" && !hasEq:
			spec.clientCache = true
		case key == "client_cache":
			b, good := d.yesNo("client_cache", val)
			spec.clientCache = b
			ok = ok && good
		case key == "MFS" && hasEq:
			n, good := d.size("MFS", val)
			spec.maxFileSize = n
			ok = ok && good
		case key == "MFC" && hasEq:
			n, good := d.count("MFC", val, 0, "a number of files, e.g. 100000 (0 means no limit)")
			spec.maxFiles = uint64(n)
			ok = ok && good
		default:
			f := fix
			if key == "MDS" {
				f = "for several metadata servers write max_mds=yes; " + fix
			} else if s := suggest(key, []string{"MFS", "MFC", "client_cache"}); s != "" && key != "" {
				f = fmt.Sprintf("did you mean %s? %s", s, fix)
			}
			d.fail(field, value, "Unsupported argument - "+clip(opt, quoteLimit)+" (access-mode suboption)", f)
			ok = false
			continue
		}
		spec.given = append(spec.given, key)
	}
	return ok
}

var persistentdwKeys = keySet{keys: []string{"name"}}

func (d *dctx) persistentdw(args []string, s *Script, seen *seenDirectives) {
	v, _ := d.collect(args, persistentdwKeys)
	name, ok := v["name"]
	if !ok {
		if !d.failed {
			d.fail("name", "", "name is required", "write #DW persistentdw name=<name of the persistent buffer>")
		}
		return
	}
	if !d.bufferName("name", name) {
		return
	}
	if seen.persistent == nil {
		seen.persistent = map[string]int{}
	}
	if first, dup := seen.persistent[name]; dup {
		d.fail("name", name, fmt.Sprintf("persistent buffer %s is already attached on line %d", name, first), "attach each persistent buffer once")
		return
	}
	seen.persistent[name] = d.line
	if d.failed {
		return
	}
	s.Persistent = append(s.Persistent, PersistentDW{Line: d.line, Name: name})
}

var swapKeys = keySet{keys: []string{"pool"}, bare: func(string) bool { return true }}

func (d *dctx) swap(args []string, s *Script, seen *seenDirectives) {
	if seen.swapLine != 0 {
		d.fail("", "", fmt.Sprintf("only one #DW swap per job is allowed (the first is on line %d)", seen.swapLine), "give the swap size per node once")
	} else {
		seen.swapLine = d.line
	}
	v, sizes := d.collect(args, swapKeys)
	sw := &Swap{Line: d.line}
	switch len(sizes) {
	case 0:
		d.fail("size", "", "the swap size is missing", "write #DW swap <size per compute node>, e.g. #DW swap 10GiB")
	case 1:
		number, suffix := splitNumber(sizes[0])
		if suffix == "" && number != "" {
			d.fail("size", sizes[0], "the swap size has no unit", fmt.Sprintf("write a unit, e.g. #DW swap %sGiB (Slurm's --bb swap=%s means %sGiB)", number, number, number))
			break
		}
		if n, ok := d.size("size", sizes[0]); ok {
			if n == 0 {
				d.fail("size", sizes[0], "the swap size must be greater than zero", "write the swap per compute node, e.g. #DW swap 4GiB")
			}
			sw.SizePerNode = n
		}
	default:
		d.fail("size", strings.Join(sizes, " "), "more than one swap size", "write one size per compute node, e.g. #DW swap 10GiB")
	}
	if pool, ok := v["pool"]; ok && d.pool("pool", pool) {
		sw.Pool = pool
	}
	if d.failed {
		return
	}
	s.Swap = sw
}

var stageKeys = keySet{
	keys: []string{"type", "source", "destination"},
	hints: map[string]string{
		"src": "write source=", "dst": "write destination=", "dest": "write destination=",
		"from": "write source=", "to": "write destination=", "target": "write destination=",
	},
}

func (d *dctx) stage(cmd string, args []string, s *Script, seen *seenDirectives) {
	v, _ := d.collect(args, stageKeys)
	st := Stage{Line: d.line}
	for _, k := range []string{"type", "source", "destination"} {
		if _, ok := v[k]; !ok && !(d.failed && hasKeyToken(args, k)) {
			d.fail(k, "", fmt.Sprintf("%s is required", k), fmt.Sprintf("write #DW %s type=file|directory|list source=<path> destination=<path>", cmd))
		}
	}
	if t, ok := v["type"]; ok {
		st.Type, _ = d.oneOf("type", t, "file", "directory", "list")
	}
	st.Source, st.Destination = v["source"], v["destination"]
	if st.Source != "" && st.Destination != "" {
		// Check the paths even when the type is faulty, so that all faults show at once.
		seen.stageChecks = append(seen.stageChecks, stageCheck{cmd, st})
	}
	if d.failed {
		return
	}
	if cmd == "stage_in" {
		s.StageIn = append(s.StageIn, st)
	} else {
		s.StageOut = append(s.StageOut, st)
	}
}

func hasKeyToken(args []string, key string) bool {
	for _, a := range args {
		if strings.HasPrefix(a, key+"=") {
			return true
		}
	}
	return false
}

var createKeys = keySet{
	keys: []string{"name", "capacity", "access", "access_mode", "type", "pool", "optimization_strategy", "pfs"},
	hints: map[string]string{
		"size": "the size is written capacity=, e.g. capacity=100GiB",
	},
}

func (d *dctx) createPersistent(args []string, s *Script, seen *seenDirectives, l *logical) {
	v, _ := d.collect(args, createKeys)
	c := CreatePersistent{Line: d.line, AccessModes: []string{"striped"}, Type: "scratch", OptimizationStrategy: "bandwidth"}
	if name, ok := v["name"]; !ok {
		d.fail("name", "", "name is required", "add name=<name>, e.g. name=mydata")
	} else if d.bufferName("name", name) {
		c.Name = name
	}
	if cap, ok := v["capacity"]; ok {
		c.Capacity = d.capacity("capacity", cap)
	} else {
		d.fail("capacity", "", "capacity is required", "add capacity=<size>, e.g. capacity=1TiB")
	}
	_, hasAccess := v["access"]
	_, hasMode := v["access_mode"]
	switch {
	case hasAccess && hasMode:
		d.fail("access", v["access"], "both access= and access_mode= are given", "keep one of them (they mean the same)")
	case hasAccess || hasMode:
		key := "access_mode"
		if hasAccess {
			key = "access"
		}
		if spec, ok := d.accessMode(key, v[key], false); ok {
			if slices.Contains(spec.modes, "private") {
				// DataWarp's Table I: private namespaces belong to one job's compute nodes.
				d.fail(key, v[key], "access_mode=private is not available for a persistent buffer (as in DataWarp): each job's compute nodes would get namespaces no other job sees",
					"use "+key+"=striped (or loadbalance); for a private view, ask for it per job: #DW jobdw access_mode=striped,private")
			} else {
				c.AccessModes = spec.modes
			}
		}
	}
	if t, ok := v["type"]; ok {
		c.Type, _ = d.oneOf("type", t, "scratch", "cache")
	}
	if pfs, ok := v["pfs"]; ok {
		if clean, good := d.pfsDir("pfs", pfs); good {
			c.PFS = clean
		}
	}
	switch c.Type {
	case "cache":
		if _, ok := v["pfs"]; !ok {
			d.fail("pfs", "", "type=cache needs pfs=", "add pfs=<absolute PFS directory to cache>, e.g. pfs=/lustre/me/project")
		}
	case "scratch":
		if pfs, ok := v["pfs"]; ok {
			d.fail("pfs", pfs, "pfs= is only for type=cache: a scratch buffer starts empty", "remove pfs=, or add type=cache")
		}
	}
	if pool, ok := v["pool"]; ok && d.pool("pool", pool) {
		c.Pool = pool
	}
	if o, ok := v["optimization_strategy"]; ok {
		c.OptimizationStrategy, _ = d.oneOf("optimization_strategy", o, "bandwidth", "interference")
	}
	for _, k := range []string{"name", "capacity", "pool", "access_mode", "type"} {
		d.slurmAgrees(l, k, v)
	}
	if _, ok := v["access_mode"]; !ok {
		d.slurmAgrees(l, "access", v)
	}
	if c.Name != "" {
		if seen.created == nil {
			seen.created = map[string]int{}
		}
		if first, dup := seen.created[c.Name]; dup {
			d.fail("name", c.Name, fmt.Sprintf("persistent buffer %s is already created on line %d", c.Name, first), "create each persistent buffer once")
		} else {
			seen.created[c.Name] = d.line
		}
	}
	if d.failed {
		return
	}
	s.Create = append(s.Create, c)
}

var destroyKeys = keySet{keys: []string{"name"}, bare: func(w string) bool { return w == "hurry" }}

func (d *dctx) destroyPersistent(args []string, s *Script, seen *seenDirectives, l *logical) {
	v, flags := d.collect(args, destroyKeys)
	x := DestroyPersistent{Line: d.line, Hurry: len(flags) > 0}
	if len(flags) > 1 {
		d.fail("hurry", "", "hurry is given twice", "write hurry once")
	}
	name, ok := v["name"]
	if !ok {
		d.fail("name", "", "name is required", "write #BB destroy_persistent name=<name> [hurry]")
	} else if d.bufferName("name", name) {
		x.Name = name
		if strings.Contains(name, "hurry") && !x.Hurry {
			d.fail("name", name, "Slurm destroys without waiting for stage-out whenever the word \"hurry\" appears anywhere in the line, and this name contains it",
				"add the word hurry to accept that: Slurm cannot destroy a buffer of this name any other way")
		}
	}
	d.slurmAgrees(l, "name", v)
	if x.Name != "" {
		if seen.destroyed == nil {
			seen.destroyed = map[string]int{}
		}
		if first, dup := seen.destroyed[x.Name]; dup {
			d.fail("name", x.Name, fmt.Sprintf("persistent buffer %s is already destroyed on line %d", x.Name, first), "destroy each persistent buffer once")
		} else {
			seen.destroyed[x.Name] = d.line
		}
	}
	if d.failed {
		return
	}
	s.Destroy = append(s.Destroy, x)
}
