// Package directive reads the burst-buffer directives of a job script: DataWarp's `#DW jobdw`,
// `#DW persistentdw`, `#DW swap`, `#DW stage_in`, `#DW stage_out`, and Slurm's
// `#BB create_persistent` / `#BB destroy_persistent`.
//
// It sees a script the way Slurm's burst_buffer/datawarp plugin does — only the leading comment
// block counts, `\` joins continuation lines that repeat the prefix, symbols such as %j are
// Slurm's — and then validates every directive the way DataWarp's job_process does: unknown
// commands, unknown keys and bad values are errors naming the line, the directive, the field,
// the reason and the fix. All errors of a script are returned at once.
//
// The package is pure: it reads bytes and returns values, with no I/O. The user reference is
// docs/directives.md.
package directive

import (
	"fmt"
	"slices"
	"strings"
)

// Script is everything the burst-buffer directives of one job script ask for.
type Script struct {
	JobDW *JobDW // the first #DW jobdw; nil when absent
	// JobDWs is every #DW jobdw, in script order: at most one of each type (a job may hold a
	// scratch instance and a cache instance at once, DataWarp's Phase 3).
	JobDWs     []*JobDW
	Persistent []PersistentDW      // #DW persistentdw, in script order
	Swap       *Swap               // #DW swap; nil when absent
	StageIn    []Stage             // #DW stage_in, in script order
	StageOut   []Stage             // #DW stage_out, in script order
	Create     []CreatePersistent  // #BB create_persistent
	Destroy    []DestroyPersistent // #BB destroy_persistent
	Warnings   []Warning           // things that are legal but probably not what the user meant
}

// JobDWOfType returns the #DW jobdw of type typ (scratch or cache), or nil.
func (s *Script) JobDWOfType(typ string) *JobDW {
	for _, j := range s.JobDWs {
		if j.Type == typ {
			return j
		}
	}
	return nil
}

// HasDirectives reports whether the script asks for anything at all.
func (s *Script) HasDirectives() bool {
	return s.JobDW != nil || len(s.Persistent) > 0 || s.Swap != nil || len(s.StageIn) > 0 ||
		len(s.StageOut) > 0 || len(s.Create) > 0 || len(s.Destroy) > 0
}

// JobDW is a `#DW jobdw` directive: a burst buffer that lives as long as the job.
type JobDW struct {
	Line                  int
	Type                  string   // scratch (default) | cache
	AccessModes           []string // canonical and in this order: striped, private, loadbalance
	Capacity              uint64   // bytes, > 0
	CapacityText          string   // capacity as the script wrote it ("3.5TB"), for messages
	Pool                  string   // "" = the site's default pool
	PFS                   string   // type=cache: the PFS directory cached; "" for scratch
	MaxMDS                bool     // max_mds=yes: a metadata server on every server of the instance
	OptimizationStrategy  string   // bandwidth (default) | interference
	WriteWindowLength     int64    // seconds (default 86400)
	WriteWindowMultiplier int64    // bytes per window = multiplier × capacity (default 10)
	MaxFileSize           uint64   // access-mode suboption MFS; 0 = unlimited
	MaxFilesCreated       uint64   // access-mode suboption MFC; 0 = unlimited
	ClientCache           bool     // access-mode suboption client_cache
	ModifiedThreshold     uint64   // cache: dirty bytes per file before write-back
	ReadAhead             uint64   // cache: bytes read ahead
	SyncOnClose           bool     // cache: write dirty data back to the PFS at close()
	SyncToPFS             bool     // cache: fsync()/sync() reach the PFS
	// Given lists the options the script wrote (the rest hold defaults), in the order of
	// JobDWOptions. Sites can apply their own defaults to options not given; the cache
	// tunables in particular have no DataWarp default and mean "the site's default" when absent.
	Given []string
}

// JobDWOptions is the canonical order of #DW jobdw options, as they appear in JobDW.Given and
// in Format's output. MFS, MFC and client_cache are suboptions of access_mode.
var JobDWOptions = []string{
	"type", "access_mode", "MFS", "MFC", "client_cache", "capacity", "pool", "pfs", "max_mds",
	"optimization_strategy", "write_window_length", "write_window_multiplier",
	"modified_threshold", "read_ahead", "sync_on_close", "sync_to_pfs",
}

// Explicit reports whether the script wrote option key (a name from JobDWOptions).
func (j *JobDW) Explicit(key string) bool { return slices.Contains(j.Given, key) }

// HasAccess reports whether the instance has access mode mode (canonical spelling).
func (j *JobDW) HasAccess(mode string) bool { return slices.Contains(j.AccessModes, mode) }

// EnvVars returns the variables DataWarp sets for this instance, in AccessModes order:
// scratch striped → DW_JOB_STRIPED, private → DW_JOB_PRIVATE, loadbalance → DW_JOB_LDBAL;
// cache striped → DW_JOB_STRIPED_CACHE, loadbalance → DW_JOB_LDBAL_CACHE.
func (j *JobDW) EnvVars() []string {
	var vars []string
	for _, mode := range j.AccessModes {
		if v := jobVariable(j.Type, mode); v != "" {
			vars = append(vars, v)
		}
	}
	return vars
}

// PersistentDW is a `#DW persistentdw name=<name>` directive: the job uses a persistent buffer.
type PersistentDW struct {
	Line int
	Name string
}

// Swap is a `#DW swap <size>` directive: swap space on each compute node of the job.
type Swap struct {
	Line        int
	SizePerNode uint64 // bytes
	Pool        string // "" = the jobdw's pool, else the default pool
}

// Stage is one `#DW stage_in` or `#DW stage_out` directive. Paths are as written: variables
// such as $DW_JOB_STRIPED are not expanded (SplitDWPath splits them).
//
// For type=file and type=directory the burst-buffer side is Destination for stage_in and
// Source for stage_out. For type=list, Source is always the list file on the PFS.
type Stage struct {
	Line        int
	Type        string // file | directory | list
	Source      string
	Destination string
}

// CreatePersistent is a `#BB create_persistent` directive.
type CreatePersistent struct {
	Line                 int
	Name                 string
	Capacity             uint64   // bytes, > 0
	AccessModes          []string // canonical; default [striped]
	Type                 string   // scratch (default) | cache
	Pool                 string   // "" = the site's default pool
	OptimizationStrategy string   // bandwidth (default) | interference
	PFS                  string   // type=cache: the PFS directory cached; "" for scratch
}

// DestroyPersistent is a `#BB destroy_persistent` directive.
type DestroyPersistent struct {
	Line  int
	Name  string
	Hurry bool // destroy without waiting for stage-out
}

// Warning is something Parse accepted but the user should hear about.
type Warning struct {
	Line    int
	Message string
}

func (w Warning) String() string {
	if w.Line > 0 {
		return fmt.Sprintf("line %d: %s", w.Line, w.Message)
	}
	return w.Message
}

// Error is one fault in a script.
type Error struct {
	Line      int    // 1-based line of the directive (its first line when continued); 0 = whole script
	Directive string // "#DW jobdw", "#BB create_persistent", ...; "" when no directive applies
	Field     string // the option at fault, e.g. "capacity"; "" for the directive as a whole
	Value     string // the value as written
	Problem   string // what is wrong
	Fix       string // what to write instead
}

// Error renders "line 4: #DW jobdw: capacity="3.5XB": unknown unit "XB"; expected a size ...".
// The field=value part is left out when the problem already names the field.
func (e *Error) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Directive != "" {
		b.WriteString(e.Directive)
		b.WriteString(": ")
	}
	if e.Field != "" && !strings.Contains(e.Problem, e.Field) {
		if e.Value != "" {
			fmt.Fprintf(&b, "%s=%s: ", e.Field, quote(e.Value))
		} else {
			fmt.Fprintf(&b, "%s: ", e.Field)
		}
	}
	b.WriteString(e.Problem)
	if e.Fix != "" {
		b.WriteString("; ")
		b.WriteString(e.Fix)
	}
	return b.String()
}

// Errors is every fault found in a script, in line order.
type Errors struct {
	List     []*Error
	Omitted  int       // faults found beyond Limits.MaxErrors
	Warnings []Warning // the warnings of the same script, for callers that show both
}

// Error joins the faults one per line.
func (e *Errors) Error() string {
	lines := make([]string, 0, len(e.List)+1)
	for _, err := range e.List {
		lines = append(lines, err.Error())
	}
	if e.Omitted > 0 {
		lines = append(lines, fmt.Sprintf("... and %d more errors (limit MaxErrors)", e.Omitted))
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.As find each *Error.
func (e *Errors) Unwrap() []error {
	out := make([]error, len(e.List))
	for i, err := range e.List {
		out[i] = err
	}
	return out
}

// Limits bound what one script may ask of the parser. A zero field takes its default.
type Limits struct {
	MaxDirectives     int // directives per script (after joining continuations)
	MaxDirectiveBytes int // bytes of one directive after joining its continuation lines
	MaxPathBytes      int // bytes of one path (PATH_MAX)
	MaxNameBytes      int // bytes of a persistent-buffer or pool name
	MaxErrors         int // errors kept; the rest are counted in Errors.Omitted
	MaxWarnings       int // warnings kept; one more warning says how many were left out
}

// DefaultLimits returns the limits Parse uses.
func DefaultLimits() Limits {
	return Limits{
		MaxDirectives:     10000,
		MaxDirectiveBytes: 64 << 10,
		MaxPathBytes:      4096,
		MaxNameBytes:      64,
		MaxErrors:         100,
		MaxWarnings:       100,
	}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	fill := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	fill(&l.MaxDirectives, d.MaxDirectives)
	fill(&l.MaxDirectiveBytes, d.MaxDirectiveBytes)
	fill(&l.MaxPathBytes, d.MaxPathBytes)
	fill(&l.MaxNameBytes, d.MaxNameBytes)
	fill(&l.MaxErrors, d.MaxErrors)
	fill(&l.MaxWarnings, d.MaxWarnings)
	return l
}

// Parse reads the directives of a job script (any of the forms Slurm hands to dw_wlm_cli:
// a full script ending in a NUL byte, an interactive script without a final newline, the
// symbol-replaced directives-only copy, or a CRLF script). On any fault it returns nil and an
// *Errors holding every fault.
func Parse(script []byte) (*Script, error) {
	return ParseWithLimits(script, DefaultLimits())
}

// ParseWithLimits is Parse with explicit limits.
func ParseWithLimits(script []byte, limits Limits) (*Script, error) {
	s, p := parse(script, limits)
	if len(p.errs) > 0 {
		return nil, p.errorList()
	}
	s.Warnings = p.warnings
	return s, nil
}

// quoteLimit keeps messages readable when a value is huge.
const quoteLimit = 120

func quote(s string) string {
	if len(s) > quoteLimit {
		return fmt.Sprintf("%q...", s[:quoteLimit])
	}
	return fmt.Sprintf("%q", s)
}
