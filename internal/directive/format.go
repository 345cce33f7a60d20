package directive

import (
	"slices"
	"strconv"
	"strings"

	"github.com/spillway-hpc/spillway/internal/units"
)

// Format renders a Script as canonical directives, one a line, each ending in "\n": #DW jobdw,
// #DW swap, #DW persistentdw, #DW stage_in, #DW stage_out, #BB create_persistent, then
// #BB destroy_persistent. Sizes are exact (units.FormatExact); a jobdw option appears when
// the script gave it (JobDW.Given) or its value is not the default. Parse(Format(s)) gives s
// back, apart from line numbers and warnings. Warnings are not rendered.
func Format(s *Script) string {
	var b strings.Builder
	jobs := s.JobDWs
	if len(jobs) == 0 && s.JobDW != nil {
		jobs = []*JobDW{s.JobDW}
	}
	for _, j := range jobs {
		b.WriteString(formatJobDW(j))
		b.WriteByte('\n')
	}
	if sw := s.Swap; sw != nil {
		b.WriteString("#DW swap " + sizeWithUnit(sw.SizePerNode))
		if sw.Pool != "" {
			b.WriteString(" pool=" + sw.Pool)
		}
		b.WriteByte('\n')
	}
	for _, p := range s.Persistent {
		b.WriteString("#DW persistentdw name=" + p.Name + "\n")
	}
	for _, st := range s.StageIn {
		b.WriteString("#DW stage_in type=" + st.Type + " source=" + st.Source + " destination=" + st.Destination + "\n")
	}
	for _, st := range s.StageOut {
		b.WriteString("#DW stage_out type=" + st.Type + " source=" + st.Source + " destination=" + st.Destination + "\n")
	}
	for _, c := range s.Create {
		b.WriteString("#BB create_persistent name=" + c.Name + " capacity=" + units.FormatExact(c.Capacity))
		if len(c.AccessModes) > 0 {
			b.WriteString(" access_mode=" + strings.Join(c.AccessModes, ","))
		}
		if c.Type != "" {
			b.WriteString(" type=" + c.Type)
		}
		if c.Pool != "" {
			b.WriteString(" pool=" + c.Pool)
		}
		if c.PFS != "" {
			b.WriteString(" pfs=" + c.PFS)
		}
		if c.OptimizationStrategy != "" {
			b.WriteString(" optimization_strategy=" + c.OptimizationStrategy)
		}
		b.WriteByte('\n')
	}
	for _, x := range s.Destroy {
		b.WriteString("#BB destroy_persistent name=" + x.Name)
		if x.Hurry {
			b.WriteString(" hurry")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// sizeWithUnit is units.FormatExact with "B" for sizes that have no larger exact unit, for
// the places (#DW swap) where a size must carry a unit.
func sizeWithUnit(n uint64) string {
	text := units.FormatExact(n)
	if strings.Trim(text, "0123456789") == "" {
		text += "B"
	}
	return text
}

func formatJobDW(j *JobDW) string {
	show := func(key string, isDefault bool) bool { return j.Explicit(key) || !isDefault }
	parts := []string{"#DW jobdw"}
	if show("type", j.Type == "scratch") {
		parts = append(parts, "type="+j.Type)
	}
	var sub []string
	if show("MFS", j.MaxFileSize == 0) {
		sub = append(sub, "MFS="+units.FormatExact(j.MaxFileSize))
	}
	if show("MFC", j.MaxFilesCreated == 0) {
		sub = append(sub, "MFC="+strconv.FormatUint(j.MaxFilesCreated, 10))
	}
	if show("client_cache", !j.ClientCache) {
		sub = append(sub, "client_cache="+yesNo(j.ClientCache))
	}
	if len(j.AccessModes) > 0 && (show("access_mode", slices.Equal(j.AccessModes, []string{"striped"})) || len(sub) > 0) {
		modes := slices.Clone(j.AccessModes)
		if len(sub) > 0 {
			modes[0] += "(" + strings.Join(sub, ",") + ")"
		}
		parts = append(parts, "access_mode="+strings.Join(modes, ","))
	}
	parts = append(parts, "capacity="+units.FormatExact(j.Capacity))
	if j.Pool != "" {
		parts = append(parts, "pool="+j.Pool)
	}
	if j.PFS != "" {
		parts = append(parts, "pfs="+j.PFS)
	}
	if show("max_mds", !j.MaxMDS) {
		parts = append(parts, "max_mds="+yesNo(j.MaxMDS))
	}
	if show("optimization_strategy", j.OptimizationStrategy == "bandwidth") {
		parts = append(parts, "optimization_strategy="+j.OptimizationStrategy)
	}
	if show("write_window_length", j.WriteWindowLength == 86400) {
		parts = append(parts, "write_window_length="+strconv.FormatInt(j.WriteWindowLength, 10))
	}
	if show("write_window_multiplier", j.WriteWindowMultiplier == 10) {
		parts = append(parts, "write_window_multiplier="+strconv.FormatInt(j.WriteWindowMultiplier, 10))
	}
	if show("modified_threshold", j.ModifiedThreshold == 0) {
		parts = append(parts, "modified_threshold="+units.FormatExact(j.ModifiedThreshold))
	}
	if show("read_ahead", j.ReadAhead == 0) {
		parts = append(parts, "read_ahead="+units.FormatExact(j.ReadAhead))
	}
	if show("sync_on_close", !j.SyncOnClose) {
		parts = append(parts, "sync_on_close="+yesNo(j.SyncOnClose))
	}
	if show("sync_to_pfs", !j.SyncToPFS) {
		parts = append(parts, "sync_to_pfs="+yesNo(j.SyncToPFS))
	}
	return strings.Join(parts, " ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
