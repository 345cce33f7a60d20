// Package jobspec turns a job script's parsed directives into the controller's requests. It
// is shared by `spillway run` and `dw_wlm_cli`, so both drive the lifecycle the same way.
package jobspec

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spillway-hpc/spillway/internal/directive"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/pfsaccess"
	"github.com/spillway-hpc/spillway/internal/units"
)

// Supported refuses what this version of Spillway parses but cannot run yet, naming the line
// (nothing today: #DW swap runs since issue 22).
func Supported(s *directive.Script) error {
	var problems []string
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "\n"))
	}
	return nil
}

// CheckPFSAsUser checks, with the calling process's credentials, that the PFS directory of
// every cache the script asks for (#DW jobdw type=cache, #BB create_persistent type=cache)
// exists and can be entered. Only a process running as the job's user may call it honestly
// (spillway run); as root it checks nothing (root's view says nothing of the user's).
func CheckPFSAsUser(s *directive.Script) error {
	if os.Geteuid() == 0 {
		return nil
	}
	var problems []string
	for _, j := range s.JobDWs {
		if j.Type == model.TypeCache && j.PFS != "" {
			if err := checkPFS(j.PFS); err != nil {
				problems = append(problems, fmt.Sprintf("line %d: #DW jobdw: %v", j.Line, err))
			}
		}
	}
	for _, c := range s.Create {
		if c.Type == model.TypeCache && c.PFS != "" {
			if err := checkPFS(c.PFS); err != nil {
				problems = append(problems, fmt.Sprintf("line %d: #BB create_persistent: %v", c.Line, err))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "\n"))
	}
	return nil
}

// checkPFS is pfsaccess.Check (a variable for tests).
var checkPFS = pfsaccess.Check

// Setup is the setup request of a job: its #DW jobdw instance, the persistent instances it
// uses, and its stage-outs (registered as deferred until data_out).
func Setup(s *directive.Script, token, creator string, uid, gid uint32, nodes []string) (lifecycle.Setup, error) {
	req := lifecycle.Setup{Token: token, Creator: creator, Owner: uid, Group: gid, ClientNodes: nodes}
	// The stage-outs are registered with the session from the start (deferred until
	// data_out): the controller then never releases the instance with them undone.
	out, err := Stages(s.StageOut, model.StageOut)
	if err != nil {
		return req, err
	}
	req.StageOut = out
	for i, j := range s.JobDWs {
		r := InstanceRequest(j)
		if i == 0 {
			req.Instance = &r
		} else {
			req.More = append(req.More, r)
		}
	}
	for _, p := range s.Persistent {
		req.Uses = append(req.Uses, p.Name)
	}
	if sw := s.Swap; sw != nil {
		req.Swap = SwapRequest(sw, len(nodes))
		if req.Swap.Pool == "" && req.Instance != nil {
			req.Swap.Pool = req.Instance.Pool // a job's buffer and swap come from one pool
		}
	}
	return req, nil
}

// SwapRequest is the request of a #DW swap for a job reserved on nodes compute nodes (0:
// unknown, the controller reserves for the setup's client nodes or one).
func SwapRequest(sw *directive.Swap, nodes int) *lifecycle.SwapRequest {
	return &lifecycle.SwapRequest{SizePerNode: sw.SizePerNode, Nodes: nodes, Pool: sw.Pool, Line: sw.Line}
}

// SbatchNodes is the node count a job script asks Slurm for in its #SBATCH lines (-N,
// --nodes; of a range min-max, max, as Slurm's datawarp plugin counts swap: max_nodes, else
// min_nodes), 0 when it names none. Slurm reads #SBATCH lines until the first line that is
// not a comment; so does this.
func SbatchNodes(raw []byte) int {
	nodes := 0
	for i, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if i == 0 && strings.HasPrefix(line, "#!") {
			continue
		}
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, "#") {
			break
		}
		rest, ok := strings.CutPrefix(line, "#SBATCH")
		if !ok {
			continue
		}
		words := strings.Fields(rest)
		for j := 0; j < len(words); j++ {
			w, val := words[j], ""
			switch {
			case w == "-N" || w == "--nodes":
				if j+1 < len(words) {
					val = words[j+1]
					j++
				}
			case strings.HasPrefix(w, "--nodes="):
				val = strings.TrimPrefix(w, "--nodes=")
			case strings.HasPrefix(w, "-N") && len(w) > 2:
				val = strings.TrimPrefix(w, "-N")
			default:
				continue
			}
			if n := nodeCount(val); n > 0 {
				nodes = n
			}
		}
	}
	return nodes
}

// nodeCount reads Slurm's node count: N, or min-max (max counts).
func nodeCount(v string) int {
	if _, hi, ok := strings.Cut(v, "-"); ok {
		v = hi
	}
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' || n > lifecycle.MaxSwapNodes {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// InstanceRequest is the request of one #DW jobdw: what the job does not name is the site's
// default ([limits], [cache]), not DataWarp's.
func InstanceRequest(j *directive.JobDW) lifecycle.InstanceRequest {
	r := lifecycle.InstanceRequest{
		Capacity: j.Capacity, Pool: j.Pool, Type: j.Type, AccessModes: j.AccessModes,
		Strategy: j.OptimizationStrategy, MaxFileSize: j.MaxFileSize, ClientCache: j.ClientCache,
		MaxMDS: j.MaxMDS, MaxFilesCreated: j.MaxFilesCreated,
	}
	if j.Explicit("write_window_length") {
		r.WriteWindowLength = j.WriteWindowLength
	}
	if j.Explicit("write_window_multiplier") {
		r.WriteWindowMultiplier = j.WriteWindowMultiplier
	}
	if j.Type == model.TypeCache {
		c := &lifecycle.CacheRequest{PFS: j.PFS}
		if j.Explicit("modified_threshold") {
			c.ModifiedThreshold = &j.ModifiedThreshold
		}
		if j.Explicit("read_ahead") {
			c.ReadAhead = &j.ReadAhead
		}
		if j.Explicit("sync_on_close") {
			c.SyncOnClose = &j.SyncOnClose
		}
		if j.Explicit("sync_to_pfs") {
			c.SyncToPFS = &j.SyncToPFS
		}
		r.Cache = c
	}
	return r
}

// CreatePersistent is the setup request of a #BB create_persistent directive.
func CreatePersistent(c directive.CreatePersistent, creator string, uid, gid uint32) lifecycle.Setup {
	r := &lifecycle.InstanceRequest{Capacity: c.Capacity, Pool: c.Pool, Type: c.Type, AccessModes: c.AccessModes, Strategy: c.OptimizationStrategy}
	if c.Type == model.TypeCache || c.PFS != "" {
		r.Cache = &lifecycle.CacheRequest{PFS: c.PFS}
	}
	return lifecycle.Setup{Token: c.Name, Creator: creator, Owner: uid, Group: gid, Persistent: true, Instance: r}
}

// Stages converts stage directives of one direction (model.StageIn or model.StageOut).
func Stages(stages []directive.Stage, direction string) ([]lifecycle.StageRequest, error) {
	var out []lifecycle.StageRequest
	for _, st := range stages {
		r := lifecycle.StageRequest{Type: st.Type, Line: st.Line}
		pfs, dw := st.Source, st.Destination
		if direction == model.StageOut {
			pfs, dw = st.Destination, st.Source
		}
		if st.Type == model.StageList {
			// Each line names its own paths; a stage-in list's destination names the buffer
			// whose capacity it fills.
			r.PFSPath = st.Source
			if direction == model.StageIn {
				if v, _, ok := directive.SplitDWPath(st.Destination); ok {
					r.DWVar = v
				}
			}
			out = append(out, r)
			continue
		}
		v, rest, ok := directive.SplitDWPath(dw)
		if !ok {
			return nil, fmt.Errorf("line %d: %q must start with $DW_JOB_STRIPED, $DW_JOB_LDBAL or $DW_PERSISTENT_STRIPED_<name> and stay inside the instance", st.Line, dw)
		}
		r.PFSPath, r.DWVar, r.DWPath = pfs, v, rest
		out = append(out, r)
	}
	return out, nil
}

// Summary describes a script's requests in one line, for `spillway run`'s job_process phase.
func Summary(s *directive.Script) string {
	var parts []string
	for _, j := range s.JobDWs {
		part := fmt.Sprintf("jobdw %s %s %s", units.FormatHuman(j.Capacity), j.Type, strings.Join(j.AccessModes, ","))
		if j.PFS != "" {
			part += " pfs=" + j.PFS
		}
		parts = append(parts, part)
	}
	for _, p := range s.Persistent {
		parts = append(parts, "persistentdw "+p.Name)
	}
	if s.Swap != nil {
		parts = append(parts, fmt.Sprintf("swap %s per compute node", units.FormatHuman(s.Swap.SizePerNode)))
	}
	for _, c := range s.Create {
		parts = append(parts, fmt.Sprintf("create_persistent %s %s", c.Name, units.FormatHuman(c.Capacity)))
	}
	for _, d := range s.Destroy {
		parts = append(parts, "destroy_persistent "+d.Name)
	}
	if n := len(s.StageIn); n > 0 {
		parts = append(parts, fmt.Sprintf("%d stage_in", n))
	}
	if n := len(s.StageOut); n > 0 {
		parts = append(parts, fmt.Sprintf("%d stage_out", n))
	}
	if len(parts) == 0 {
		return "no burst-buffer directives"
	}
	return strings.Join(parts, "; ")
}

// SetupError ties the controller's refusal of a job's setup to the directive it is about, the
// way the parser's errors read ("line 2: #DW jobdw pool=nosuch: pool "nosuch" does not exist;
// pools: wlm_pool"): the controller knows the request, only the script knows its lines.
// Errors about nothing the script wrote (too many sessions, a failing disk) are returned as
// they are.
func SetupError(s *directive.Script, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, p := range s.Persistent {
		prefix := "persistentdw name=" + p.Name + ": "
		if strings.HasPrefix(msg, prefix) {
			return fmt.Errorf("line %d: #DW persistentdw name=%s: %s%w", p.Line, p.Name, strings.TrimPrefix(msg, prefix), unwrapped{err})
		}
	}
	j := s.JobDW
	if j == nil {
		return err
	}
	// A refusal about a cache (its pfs=, its type) belongs to the type=cache line, which
	// need not be the first #DW jobdw.
	if c := s.JobDWOfType(model.TypeCache); c != nil && (strings.HasPrefix(msg, "pfs=") || strings.HasPrefix(msg, "type=cache") || strings.Contains(msg, "for type=cache")) {
		j = c
	}
	// A pool that cannot hold one of a job's instances names its capacity.
	if len(s.JobDWs) > 1 {
		for _, x := range s.JobDWs {
			if strings.Contains(msg, " cannot hold "+units.FormatHuman(x.Capacity)+" ") {
				j = x
				break
			}
		}
	}
	field := ""
	switch {
	case strings.HasPrefix(msg, "pool ") && strings.Contains(msg, "does not exist"):
		field = " pool=" + j.Pool
	case strings.Contains(msg, "cannot hold"):
		field = " capacity=" + units.FormatExact(j.Capacity)
		if j.CapacityText != "" {
			field = " capacity=" + j.CapacityText // as the user wrote it
		}
		if j.Pool != "" {
			field = " pool=" + j.Pool + field
		}
	case strings.HasPrefix(msg, "type=") || strings.HasPrefix(msg, "access_mode=") || strings.HasPrefix(msg, "pool ") || strings.HasPrefix(msg, "pfs=") ||
		strings.HasPrefix(msg, "max_mds="):
	default:
		return err
	}
	return fmt.Errorf("line %d: #DW jobdw%s: %s%w", j.Line, field, msg, unwrapped{err})
}

// CreateError ties a refused #BB create_persistent or destroy_persistent to its line.
func CreateError(line int, directiveName, name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("line %d: #BB %s name=%s: %s%w", line, directiveName, name, err.Error(), unwrapped{err})
}

// unwrapped keeps the original error reachable (errors.Is/As) without printing it twice.
type unwrapped struct{ err error }

func (u unwrapped) Error() string { return "" }
func (u unwrapped) Unwrap() error { return u.err }

// MaxScriptBytes bounds the job script read by `spillway run` and `dw_wlm_cli job_process`
// (directives come first, and no real script comes near it): a path such as /dev/zero must
// give an error, not an endless read.
const MaxScriptBytes = 16 << 20

// ReadScript reads a job script of at most MaxScriptBytes.
func ReadScript(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("job script: %w", err)
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, MaxScriptBytes+1))
	if err != nil {
		return nil, fmt.Errorf("job script %s: %w", path, err)
	}
	if len(raw) > MaxScriptBytes {
		return nil, fmt.Errorf("job script %s is larger than %s; directives belong in a script, not data", path, units.FormatHuman(MaxScriptBytes))
	}
	return raw, nil
}

// WithoutJobInstance keeps the stage requests that do not need the job's own instance: those
// of persistent instances, and lists when the job uses one (a list goes to the first).
func WithoutJobInstance(reqs []lifecycle.StageRequest, usesPersistent bool) []lifecycle.StageRequest {
	var kept []lifecycle.StageRequest
	for _, r := range reqs {
		switch {
		case strings.HasPrefix(r.DWVar, lifecycle.VarPersistentPre):
			kept = append(kept, r)
		case r.DWVar == "" && usesPersistent:
			kept = append(kept, r)
		}
	}
	return kept
}
