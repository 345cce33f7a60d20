package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/instage"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
)

const dwcliStageUsage = `Usage: dwcli stage in  --session ID --configuration ID --backing-path PFS_DIR/ --dir /DIR
       dwcli stage out --session ID --configuration ID --backing-path PFS_DIR/ --dir /DIR [--when WHEN]
       dwcli stage query|list|wait|terminate --session ID --configuration ID [--dir /DIR]
       dwcli stage in  [--type file|directory] DW_PATH PFS_PATH
       dwcli stage in  --type list DW_DIRECTORY PFS_FILE...
       dwcli stage out [--type file|directory] [--when WHEN] DW_PATH [PFS_PATH]
       dwcli stage out --type list [--when WHEN] PFS_DIRECTORY DW_FILE...
       dwcli stage query PATH...
       dwcli stage wait [--timeout DURATION] PATH...
       dwcli stage terminate PATH...
       dwcli stage list --failed PATH
       dwcli stage accounting PATH
       dwcli stage concurrency PATH N

Stage a session's files while it lives, in either of two forms (the same requests underneath).

DataWarp's form names the session and configuration by id (dwstat sessions, dwstat
configurations) and works from any node, the instance mounted there or not:
  --session ID        the session (a job's, or a persistent instance's)
  --configuration ID  the configuration staged: the session's own, or the striped one of a
                      persistent instance the job uses
  --dir /DIR          a directory of the instance, relative to its root (${path#$DW_JOB_STRIPED});
                      the leading / is optional; default: the root
  --backing-path DIR/ the PFS directory (in: the source; out: the destination, which must
                      exist); the trailing / DataWarp asked for is optional
Stages run as the session's user, whoever asks (its owner, root or a controller.wlm_users
user). Directories only: a file is staged with the path form.
  query     one line per stage under --dir, DataWarp's columns first:
              sess conf dir direction state backing_path files remaining bytes error
            remaining (column 8) is the files still to copy, "-" once the stage ended
            (complete, failed or canceled: state says which); files the files copied so far
  list      the same stages, one a line: state, direction, dir, backing_path, error
            (--failed: only the failed ones)
  wait      until no stage under --dir is waiting or running (--timeout DURATION: at most
            that long); a failed one ends the wait too: query and list --failed show it
  terminate stop the waiting and running stages under --dir

  dwcli stage in --session 7 --configuration 9 --backing-path /lustre/me/input/ --dir /input
  dwcli stage out --session 7 --configuration 9 --backing-path /lustre/me/out/ --dir /results
  dwcli stage query --session 7 --configuration 9

The path form stages your own job's files while it runs, as libdatawarp's dw_stage_* calls do
(docs/libdatawarp.md). Paths are burst buffer paths as the job sees them
($DW_JOB_STRIPED/...); the mount, the session and the controller are found from them.

  in          copy from the PFS into the burst buffer now
  out         copy from the burst buffer to the PFS; --when:
                immediate   now (the default)
                at_job_end  when the job ends, before the burst buffer is released
                revoke      forget an at_job_end stage-out of the path (PFS_PATH not needed)
                activate    run an at_job_end stage-out of the path now
  query       count the stages of the paths: complete, pending, deferred, failed
  wait        until no stage of the paths is waiting or running (an error if one failed,
              unless --failed-ok)
  terminate   stop the paths' waiting and running stages
  list        --failed: the failed stages under PATH
  accounting  DataWarp's accounting JSON of the instance holding PATH (what Spillway counts)
  concurrency at most N of the job's stages run at once (its session's; clamped to the
              configuration's stage.max_job_concurrency, which is printed)

--type defaults to directory when the source is a directory, else file.
--json prints one JSON object, {"errno": 0, ...} or {"errno": N, "error": "..."}, and exits
with status N (the errno libdatawarp returns, negated): the machine interface libdatawarp uses.
`

// dwcliStageMain runs `dwcli stage ...`.
func dwcliStageMain(args []string, stdout, stderr io.Writer) int {
	fs := NewFlags("dwcli stage", dwcliStageUsage, stderr)
	var conn Connection
	conn.Flags(fs, true)
	typ := fs.String("type", "", "file, directory or list")
	when := fs.String("when", lifecycle.WhenImmediate, "stage out: immediate, at_job_end, revoke or activate")
	asJSON := fs.Bool("json", false, "print JSON and exit with the errno")
	timeout := fs.Duration("timeout", 0, "wait: give up after this long (0: never)")
	failed := fs.Bool("failed", false, "list: the failed stages")
	failedOK := fs.Bool("failed-ok", false, "wait: succeed once the stages ended, failed ones included, as DataWarp's dw_wait_* did (libdatawarp passes it); the failures show in query and list --failed")
	var named namedStage
	fs.Int64Var(&named.session, "session", 0, "DataWarp's form: the session's id")
	fs.Int64Var(&named.configuration, "configuration", 0, "DataWarp's form: the configuration's id")
	fs.StringVar(&named.backingPath, "backing-path", "", "DataWarp's form: the PFS directory")
	fs.StringVar(&named.dir, "dir", "", "DataWarp's form: a directory of the instance, relative to its root")
	if len(args) == 0 {
		fmt.Fprint(stdout, dwcliStageUsage)
		return 64
	}
	if msg := unknownStageFlag(fs, args); msg != "" {
		if hasJSON(args) {
			return jsonOut(stdout, nil, errorfErrno(syscall.EINVAL, "%s", msg))
		}
		fmt.Fprintln(stderr, "dwcli stage: "+msg)
		return 64
	}
	if code, ok := ParseInterspersed(fs, args, stdout); !ok {
		if *asJSON || hasJSON(args) {
			return jsonOut(stdout, nil, errorfErrno(syscall.EINVAL, "bad command line; see dwcli stage --help"))
		}
		return code
	}
	words := fs.Args()
	verb := ""
	if len(words) > 0 {
		verb, words = words[0], words[1:]
	}
	finish := func(extra map[string]any, err error) int {
		if *asJSON {
			return jsonOut(stdout, extra, err)
		}
		if err != nil {
			fmt.Fprintf(stderr, "dwcli stage %s: %v\n", verb, err)
			return 1
		}
		return 0
	}
	usage := func(msg string) int {
		if *asJSON {
			return jsonOut(stdout, nil, errorfErrno(syscall.EINVAL, "%s", msg))
		}
		fmt.Fprintf(stderr, "dwcli stage %s: %s\n\n%s", verb, msg, dwcliStageUsage)
		return 64
	}
	switch verb {
	case "in", "out", "query", "wait", "terminate", "list", "accounting", "concurrency":
	default:
		return usage(fmt.Sprintf("unknown verb %q: expected in, out, query, wait, terminate, list, accounting or concurrency", verb))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	named.on = set["session"] || set["configuration"] || set["backing-path"] || set["dir"]
	if named.on {
		if msg := named.check(verb, set, words, *when); msg != "" {
			return usage(msg)
		}
	}
	conn.lookOnly = true // staging never creates a home: the job's must exist
	ctx := context.Background()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	st := &instage.Stager{Dial: func() (*apiclient.Client, error) {
		sess, err := conn.Connect(false, QuietLogger(stderr))
		if err != nil {
			return nil, err
		}
		return sess.client, nil
	}}
	if named.on {
		return named.run(ctx, st, verb, *when, *failed, *asJSON, stdout, finish)
	}
	switch verb {
	case "in":
		if *typ == model.StageList {
			if len(words) < 2 {
				return usage("give the burst buffer directory and at least one PFS file")
			}
			return finish(nil, st.StageInList(ctx, words[0], words[1:]))
		}
		if len(words) != 2 {
			return usage("give DW_PATH and PFS_PATH")
		}
		return finish(nil, st.StageIn(ctx, orType(*typ, words[1]), words[0], words[1]))
	case "out":
		if *typ == model.StageList {
			if len(words) < 2 {
				return usage("give the PFS directory and at least one burst buffer file")
			}
			return finish(nil, st.StageOutList(ctx, *when, words[1:], words[0]))
		}
		needPFS := *when != lifecycle.WhenRevoke && *when != lifecycle.WhenActivate
		if len(words) < 1 || len(words) > 2 || needPFS && len(words) != 2 {
			return usage("give DW_PATH and PFS_PATH (PFS_PATH only for --when immediate or at_job_end)")
		}
		pfs := ""
		if len(words) == 2 {
			pfs = words[1]
		}
		return finish(nil, st.StageOut(ctx, orType(*typ, words[0]), *when, words[0], pfs))
	case "query":
		c, found, err := st.Query(ctx, words)
		if err != nil {
			return finish(nil, err)
		}
		if *asJSON {
			return jsonOut(stdout, map[string]any{"complete": c.Complete, "pending": c.Pending, "deferred": c.Deferred, "failed": c.Failed, "stages": nonNil(found)}, nil)
		}
		fmt.Fprintf(stdout, "complete %d  pending %d  deferred %d  failed %d\n", c.Complete, c.Pending, c.Deferred, c.Failed)
		for _, f := range found {
			line := fmt.Sprintf("  %-9s %-3s %-9s %s", f.Status, f.Direction, f.Type, f.Path)
			if f.PFSPath != "" {
				line += " <-> " + f.PFSPath
			}
			if f.Error != "" {
				line += ": " + f.Error
			}
			fmt.Fprintln(stdout, line)
		}
		return 0
	case "wait":
		return finish(nil, st.Wait(ctx, words, 10*time.Millisecond, *failedOK))
	case "terminate":
		n, err := st.Terminate(ctx, words)
		if err == nil && !*asJSON {
			fmt.Fprintf(stdout, "%d stage(s) terminated\n", n)
		}
		return finish(map[string]any{"terminated": n}, err)
	case "accounting":
		if len(words) != 1 {
			return usage("give one PATH")
		}
		acct, err := st.Accounting(ctx, words[0])
		if err != nil {
			return finish(nil, err)
		}
		if *asJSON {
			return finish(map[string]any{"realm": acct.Realm}, nil) // the realm last: libdatawarp takes it from there
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(acct)
		return 0
	case "concurrency":
		if len(words) != 2 {
			return usage("give PATH and N, the number of stages the job may run at once")
		}
		n, err := strconv.ParseInt(words[1], 10, 64)
		if err != nil {
			return usage(fmt.Sprintf("%q is not a number of stages (1 or more)", words[1]))
		}
		set, err := st.SetConcurrency(ctx, words[0], n)
		if err == nil && !*asJSON {
			fmt.Fprintf(stdout, "at most %d of the job's stages run at once\n", set)
		}
		return finish(map[string]any{"concurrency": set}, err)
	case "list":
		if !*failed || len(words) != 1 {
			return usage("give --failed and one PATH")
		}
		fails, err := st.Failed(ctx, words[0])
		if err != nil || *asJSON {
			return finish(map[string]any{"failed": fails}, err)
		}
		for _, f := range fails {
			fmt.Fprintf(stdout, "%s: %s\n", f.Path, f.Error)
		}
		return 0
	}
	return 64
}

// orType is the type given, else directory when source is a directory, else file.
func orType(typ, source string) string {
	if typ != "" {
		return typ
	}
	if fi, err := os.Stat(source); err == nil && fi.IsDir() {
		return model.StageDir
	}
	return model.StageFile
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func hasJSON(args []string) bool {
	for _, a := range args {
		if a == "--json" || a == "-json" {
			return true
		}
	}
	return false
}

func errorfErrno(errno syscall.Errno, format string, args ...any) error {
	return &instage.Error{Errno: errno, Msg: fmt.Sprintf(format, args...)}
}

// jsonOut prints the machine answer and returns the exit status: the errno (0 on success).
func jsonOut(w io.Writer, extra map[string]any, err error) int {
	out := map[string]any{}
	for k, v := range extra {
		out[k] = v
	}
	errno := instage.ErrnoOf(err)
	out["errno"] = int(errno)
	if err != nil {
		out["error"] = err.Error()
		var e *instage.Error
		if !errors.As(err, &e) {
			out["error"] = strings.TrimSpace(err.Error())
		}
	}
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(out)
	if errno > 255 {
		return 255
	}
	return int(errno)
}
