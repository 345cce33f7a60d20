package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/dwstat"
	"github.com/spillway-hpc/spillway/internal/instage"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
)

// namedStage is DataWarp's form of dwcli stage: --session, --configuration, --backing-path,
// --dir. It resolves to the target a path under the mount would (instage.Stager.Named) and
// asks for the same stages.
type namedStage struct {
	on                     bool
	session, configuration int64
	backingPath, dir       string
}

// namedFlags are the options of DataWarp's form; the others it takes are --when (stage
// out), --failed (list), --timeout (wait), --json and the connection's.
var namedFlags = map[string]bool{"session": true, "configuration": true, "backing-path": true, "dir": true,
	"when": true, "failed": true, "timeout": true, "json": true, "config": true, "controller": true, "token-file": true, "home": true}

// check refuses what DataWarp's form cannot mean, before connecting.
func (n *namedStage) check(verb string, set map[string]bool, words []string, when string) string {
	for f := range set {
		if !namedFlags[f] {
			return fmt.Sprintf("-%s is not an option of DataWarp's form (--session, --configuration, --backing-path, --dir): it stages directories; give a path instead to use the path form", f)
		}
	}
	if len(words) > 0 {
		return fmt.Sprintf("unexpected %q: DataWarp's form names the directory with --dir, not a path", words[0])
	}
	if n.session <= 0 || n.configuration <= 0 {
		return "DataWarp's form needs --session ID and --configuration ID (dwstat sessions, dwstat configurations)"
	}
	switch verb {
	case "in", "out":
		needPFS := verb == "in" || when != lifecycle.WhenRevoke && when != lifecycle.WhenActivate
		if needPFS && n.backingPath == "" {
			return fmt.Sprintf("stage %s needs --backing-path PFS_DIR/ (the PFS directory %s)", verb, map[string]string{"in": "to copy from", "out": "to copy into"}[verb])
		}
		if verb == "in" && set["when"] {
			return "--when is for stage out"
		}
	case "query", "list", "wait", "terminate":
		if n.backingPath != "" {
			return fmt.Sprintf("stage %s takes no --backing-path: it names the stages by --session, --configuration and --dir", verb)
		}
	default:
		return fmt.Sprintf("stage %s has no DataWarp form: give a path (dwcli stage --help)", verb)
	}
	return ""
}

func (n *namedStage) run(ctx context.Context, st *instage.Stager, verb, when string, failedOnly, asJSON bool, stdout io.Writer, finish func(map[string]any, error) int) int {
	t, err := st.Named(ctx, n.session, n.configuration, n.dir)
	if err != nil {
		return finish(nil, err)
	}
	where := fmt.Sprintf("session %d configuration %d dir %s", n.session, n.configuration, t.Rel)
	status := fmt.Sprintf("\"dwcli stage query --session %d --configuration %d\" for status", n.session, n.configuration)
	switch verb {
	case "in", "out":
		if verb == "in" {
			err = st.StageInTarget(ctx, t, model.StageDir, n.backingPath)
		} else {
			err = st.StageOutTarget(ctx, t, model.StageDir, when, n.backingPath)
		}
		if err == nil && !asJSON {
			fmt.Fprintf(stdout, "stage %s request for %s accepted, %s\n", verb, where, status)
		}
		return finish(nil, err)
	case "terminate":
		k, err := st.TerminateTarget(ctx, t)
		if err == nil && !asJSON {
			fmt.Fprintf(stdout, "%d stage(s) terminated\n", k)
		}
		return finish(map[string]any{"terminated": k}, err)
	case "wait":
		delay := 10 * time.Millisecond
		for {
			reply, err := st.QueryTarget(ctx, t)
			if err != nil || reply.Counts.Pending == 0 {
				return finish(nil, err)
			}
			select {
			case <-ctx.Done():
				return finish(nil, fmt.Errorf("%s: still staging after the timeout (%d pending)", where, reply.Counts.Pending))
			case <-time.After(delay):
			}
			delay = min(delay*2, 500*time.Millisecond)
		}
	}
	reply, err := st.QueryTarget(ctx, t)
	if err != nil {
		return finish(nil, err)
	}
	var rows []namedRow
	for _, s := range reply.Stages {
		if verb == "list" && failedOnly && s.Status != model.StageFailed {
			continue
		}
		rows = append(rows, n.row(s))
	}
	if asJSON {
		c := reply.Counts
		return jsonOut(stdout, map[string]any{"complete": c.Complete, "pending": c.Pending, "deferred": c.Deferred, "failed": c.Failed, "stages": nonNil(rows)}, nil)
	}
	if len(rows) == 0 {
		fmt.Fprintf(stdout, "no stages under %s\n", where)
		return 0
	}
	if verb == "list" {
		for _, r := range rows {
			line := fmt.Sprintf("%s %s %s %s", r.State, r.Direction, r.Dir, r.BackingPath)
			if r.Error != "" {
				line += ": " + r.Error
			}
			fmt.Fprintln(stdout, line)
		}
		return 0
	}
	table := [][]string{{"sess", "conf", "dir", "direction", "state", "backing_path", "files", "remaining", "bytes", "error"}}
	for _, r := range rows {
		table = append(table, []string{strconv.FormatInt(r.Session, 10), strconv.FormatInt(r.Configuration, 10), r.Dir, r.Direction, r.State,
			orDash(r.BackingPath), strconv.FormatInt(r.Files, 10), r.Remaining, strconv.FormatUint(r.Bytes, 10), orDash(r.Error)})
	}
	fmt.Fprint(stdout, dwstat.Align(table))
	return 0
}

// namedRow is one stage as DataWarp's form shows it (query's columns; --json's objects).
type namedRow struct {
	Session       int64  `json:"session"`
	Configuration int64  `json:"configuration"`
	ID            int64  `json:"id"`
	Dir           string `json:"dir"`
	Direction     string `json:"direction"`
	Type          string `json:"type"`
	State         string `json:"state"`
	BackingPath   string `json:"backing_path"`
	Files         int64  `json:"files"`
	Remaining     string `json:"remaining"` // files still to copy; "-" once ended
	Bytes         uint64 `json:"bytes"`
	Error         string `json:"error,omitempty"`
}

func (n *namedStage) row(s lifecycle.StageProgress) namedRow {
	dir := s.DWPath
	if _, rest, ok := strings.Cut(strings.TrimPrefix(dir, "$"), "/"); ok && strings.HasPrefix(dir, "$") {
		dir = "/" + rest
	} else if strings.HasPrefix(dir, "$") {
		dir = "/"
	}
	remaining := "-"
	switch s.Status {
	case model.StagePending, model.StageRunning, model.StageDeferred:
		remaining = strconv.FormatInt(max(s.FilesTotal-s.FilesDone, 1), 10)
	}
	return namedRow{Session: n.session, Configuration: n.configuration, ID: int64(s.ID), Dir: dir, Direction: s.Direction, Type: s.Type, State: s.Status,
		BackingPath: s.PFSPath, Files: s.FilesDone, Remaining: remaining, Bytes: s.BytesDone, Error: s.Error}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// unknownStageFlag says, in one line, what is wrong with an option dwcli stage does not have
// (rather than the flag package's "flag provided but not defined" and the whole usage). In
// DataWarp's form (--session, --configuration, ...) an unknown option is taken for one of
// DataWarp's that this version lacks.
func unknownStageFlag(fs *flag.FlagSet, args []string) string {
	dataWarp := false
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && (name == "session" || name == "configuration" || name == "backing-path" || name == "dir") {
			dataWarp = true
		}
	}
	name := unknownFlag(fs, args)
	switch {
	case name == "":
		return ""
	case dataWarp:
		return fmt.Sprintf("--%s is a DataWarp flag this version does not support; DataWarp's form takes --session ID --configuration ID --backing-path PFS_DIR/ --dir /DIR (dwcli stage --help)", name)
	}
	return fmt.Sprintf("--%s is not an option of dwcli stage (dwcli stage --help lists them)", name)
}

// dwcliDataWarpFlags are DataWarp's dwcli options this version does not take, and what to
// do instead.
var dwcliDataWarpFlags = map[string]string{
	"public": "a persistent instance is built from a session made with dwcli create session --persistent",
}

// unknownDwcliFlag says, in one line, what is wrong with an option dwcli does not have.
func unknownDwcliFlag(fs *flag.FlagSet, args []string) string {
	name := unknownFlag(fs, args)
	if name == "" {
		return ""
	}
	if hint, ok := dwcliDataWarpFlags[name]; ok {
		return fmt.Sprintf("--%s is a DataWarp flag this version does not support; %s", name, hint)
	}
	return fmt.Sprintf("--%s is not an option of dwcli (dwcli --help lists them)", name)
}

// unknownFlag is the name of the first option in args that fs does not define ("" if none).
func unknownFlag(fs *flag.FlagSet, args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return ""
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "h" || name == "help" {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			return name
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) {
			i++ // its value follows
		}
	}
	return ""
}
