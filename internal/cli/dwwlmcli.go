package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/user"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/directive"
	"github.com/spillway-hpc/spillway/internal/jobspec"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/units"
)

const dwWLMUsage = `Usage: dw_wlm_cli --function FUNCTION [options]

The workload manager's interface to Spillway, with the exact protocol of Cray DataWarp's
dw_wlm_cli as Slurm's burst_buffer/datawarp plugin drives it. Point burst_buffer.conf's
GetSysState at this program: the small dw_wlm_cli binary installed beside spillway, which
Slurm starts several times per job and which starts faster than the full spillway (that one
runs the same code as "spillway dw_wlm_cli" or under the name dw_wlm_cli). It runs as
SlurmUser, which must be listed in controller.wlm_users, and reads $SPILLWAY_CONFIG or
/etc/spillway/spillway.toml. See docs/slurm.md.

Functions:
  pools                 {"pools": [...]}: id, units, granularity, quantity, free
  show_instances        {"instances": [...]}
  show_sessions         {"sessions": [...]}
  show_configurations   {"configurations": [...]}
  job_process  --job F  validate the directives of job script F (non-zero exit + message: refused)
  setup        --token T --caller C --user UID --groupid GID --capacity POOL:SIZE --job F
               [--nodehostnamefile F]       create the job's session and instance
  data_in      --token T --job F             stage in (waits until done)
  real_size    --token T                     {"token": T, "capacity": BYTES, "units": "bytes"}
  paths        --token T --job F --pathfile P  write NAME=value lines of the job's variables
  pre_run      --token T --job F --nodehostnamefile F  mount on the job's compute nodes
               (or --nodes A,B,...)
  post_run     --token T --job F             unmount
  data_out     --token T --job F             stage out (waits until done)
  teardown     --token T --job F [--hurry]   destroy a job's session, or a persistent
                                             instance by name
  create_persistent -c CALLER -t NAME -u UID -C POOL:BYTES [-a ACCESS] [-T TYPE]
                                             prints "created"

Output goes to stdout only; on success nothing else is printed (Slurm merges stdout and
stderr and parses the JSON). JSON numbers are integers and strings never contain an
apostrophe.
`

// wlmArgs are dw_wlm_cli's options (long and short, in any order).
type wlmArgs struct {
	function, token, caller, user, group, capacity, job, pathfile, nodefile, nodes, access, typ string
	hurry, help                                                                                 bool
}

func parseWLMArgs(args []string) (wlmArgs, error) {
	var a wlmArgs
	targets := map[string]*string{
		"--function": &a.function, "-f": &a.function,
		"--token": &a.token, "-t": &a.token,
		"--caller": &a.caller, "-c": &a.caller,
		"--user": &a.user, "-u": &a.user,
		"--groupid": &a.group, "-g": &a.group,
		"--capacity": &a.capacity, "-C": &a.capacity,
		"--job": &a.job, "-j": &a.job,
		"--pathfile": &a.pathfile, "-p": &a.pathfile,
		"--nodehostnamefile": &a.nodefile, "--nidlistfile": &a.nodefile,
		"--jobexecutionnodefile": new(string),
		"--nodes":                &a.nodes,
		"--access":               &a.access, "-a": &a.access,
		"--type": &a.typ, "-T": &a.typ,
	}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		switch arg {
		case "--hurry":
			a.hurry = true
			continue
		case "-h", "--help":
			a.help = true
			continue
		}
		name, value, inline := strings.Cut(arg, "=")
		target, ok := targets[name]
		if !ok {
			return a, fmt.Errorf("unknown option %q", arg)
		}
		if !inline {
			if i+1 >= len(args) {
				return a, fmt.Errorf("option %s needs a value", arg)
			}
			i++
			value = args[i]
		}
		*target = value
	}
	return a, nil
}

func dwWLMMain(args []string, stdout, stderr io.Writer) int {
	a, err := parseWLMArgs(args)
	if a.help {
		fmt.Fprint(stdout, dwWLMUsage)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stdout, "dw_wlm_cli: %v\n", err)
		return 64
	}
	if a.function == "" {
		fmt.Fprintf(stdout, "dw_wlm_cli: no --function given\n\n%s", dwWLMUsage)
		return 64
	}
	w := &wlm{a: a, out: stdout}
	// job_process needs nothing but the script: keep it fast and independent of the controller.
	if a.function == "job_process" {
		return w.jobProcess()
	}
	// Always the system install's controller: $SPILLWAY_CONFIG, /etc/spillway/spillway.toml,
	// or the built-in defaults (never a one-machine home).
	cfg, _, err := LoadSystemConfig("")
	if err != nil {
		fmt.Fprintf(stdout, "dw_wlm_cli: %s\n", oneLine(err.Error()))
		return 1
	}
	conn := Connection{controller: cfg.Client.Controller, tokenFile: cfg.Client.TokenFile}
	sess, err := conn.Connect(false, QuietLogger(io.Discard))
	if err != nil {
		fmt.Fprintf(stdout, "dw_wlm_cli: %s\n", oneLine(err.Error()))
		return 1
	}
	defer sess.Close()
	w.client, w.poll, w.stepTimeout = sess.client, cfg.Client.PollInterval.D(), cfg.Client.StepTimeout.D()
	w.ctx = context.Background()
	switch a.function {
	case "pools":
		return w.table("pools")
	case "show_instances":
		return w.table("instances")
	case "show_sessions":
		return w.table("sessions")
	case "show_configurations":
		return w.table("configurations")
	case "setup":
		return w.setup()
	case "data_in":
		return w.stage(model.StageIn)
	case "data_out":
		return w.stage(model.StageOut)
	case "real_size":
		return w.realSize()
	case "paths":
		return w.paths()
	case "pre_run":
		return w.preRun()
	case "post_run":
		return w.step(lifecycle.PhasePostRun, func() error { return w.client.PostRun(w.ctx, a.token) })
	case "teardown", "destroy_persistent":
		return w.teardown()
	case "create_persistent":
		return w.createPersistent()
	}
	fmt.Fprintf(stdout, "invalid function %q\n", a.function)
	return 64
}

type wlm struct {
	a           wlmArgs
	out         io.Writer
	client      *apiclient.Client
	ctx         context.Context
	poll        time.Duration
	stepTimeout time.Duration
}

// fail prints a one-line message (Slurm shows it as the job's reason) and returns 1.
func (w *wlm) fail(format string, args ...any) int {
	fmt.Fprintln(w.out, oneLine(fmt.Sprintf(format, args...)))
	return 1
}

// oneLine keeps Slurm's reasons readable: newlines become "; ".
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(strings.TrimSpace(s), "\n", " ; ")), " ")
}

func (w *wlm) require(names ...string) bool {
	values := map[string]string{"--token": w.a.token, "--job": w.a.job, "--pathfile": w.a.pathfile, "--capacity": w.a.capacity, "--user": w.a.user}
	for _, n := range names {
		if values[n] == "" {
			fmt.Fprintf(w.out, "dw_wlm_cli --function %s: %s is required\n", w.a.function, n)
			return false
		}
	}
	return true
}

// script reads and parses the --job file, whichever of Slurm's forms it has (the stored
// script ending in NUL, an interactive one without a final newline, a /proc/PID/fd/N memfd
// holding only the directives, a hard link).
func (w *wlm) script() (*directive.Script, error) {
	raw, err := jobspec.ReadScript(w.a.job)
	if err != nil {
		return nil, fmt.Errorf("cannot read the job script: %v", err)
	}
	s, err := directive.Parse(raw)
	if err != nil {
		return nil, err
	}
	return s, jobspec.Supported(s)
}

func (w *wlm) jobProcess() int {
	if !w.require("--job") {
		return 64
	}
	// Every check of the script (the parser's, the site's bounds) comes before the refusal
	// of what this version cannot run yet (jobspec.Supported).
	raw, err := jobspec.ReadScript(w.a.job)
	if err != nil {
		err = fmt.Errorf("cannot read the job script: %v", err)
	}
	var s *directive.Script
	if err == nil {
		s, err = directive.Parse(raw)
	}
	if err == nil {
		err = checkSiteLimits(s)
	}
	if err == nil {
		err = slurmCanRun(s)
	}
	if err == nil {
		err = jobspec.Supported(s)
	}
	if err != nil {
		fmt.Fprintf(w.out, "job_file_valid False\n%v\n", err)
		return 1
	}
	return 0
}

// checkSiteLimits refuses a job asking past the site's write-protection bounds ([limits] of
// the system config; the controller checks them again at setup).
func checkSiteLimits(s *directive.Script) error {
	if len(s.JobDWs) == 0 && s.Swap == nil {
		return nil
	}
	cfg, _, err := LoadSystemConfig("")
	if err != nil {
		return err
	}
	p := lifecycle.Params{Limits: controllerapi.WriteLimitsOf(cfg.Limits), Cache: controllerapi.CacheParamsOf(cfg.Cache)}
	for _, j := range s.JobDWs {
		if err := lifecycle.CheckInstance(jobspec.InstanceRequest(j), false, p); err != nil {
			return fmt.Errorf("line %d: #DW jobdw: %v", j.Line, err)
		}
	}
	if s.Swap != nil { // [swap] max_per_node, before the job is queued
		return lifecycle.CheckSwap(*jobspec.SwapRequest(s.Swap, 0), controllerapi.SwapParamsOf(cfg.Swap))
	}
	return nil
}

// slurmCanRun refuses what Slurm cannot hand to dw_wlm_cli: Slurm calls create_persistent
// with the name, capacity, access mode and type only (slurm-datawarp-protocol.md §3.13), so a
// persistent cache's pfs= never reaches it.
func slurmCanRun(s *directive.Script) error {
	for _, c := range s.Create {
		if c.Type == model.TypeCache {
			return fmt.Errorf("line %d: #BB create_persistent type=cache: Slurm passes no pfs= to create_persistent; create the persistent cache outside Slurm (spillway persistent create %s --type cache --pfs %s), then use it with #DW persistentdw name=%s",
				c.Line, c.Name, c.PFS, c.Name)
		}
	}
	return nil
}

// writeJSON prints JSON the way Slurm parses it: integers only (Go encodes integer fields
// as integers), and no apostrophe, which Slurm turns into a double quote before parsing.
func (w *wlm) writeJSON(v any) int {
	raw, err := json.Marshal(v)
	if err != nil {
		return w.fail("dw_wlm_cli: %v", err)
	}
	raw = bytes.ReplaceAll(raw, []byte("'"), []byte(`\u0027`))
	w.out.Write(append(raw, '\n'))
	return 0
}

// table prints the controller's listing {"<name>": [...]} as it sent it (megabytes at a
// site's scale: not decoded and encoded again), once it is whole: a broken or cut-off answer
// prints one line, never part of a document.
func (w *wlm) table(name string) int {
	// One answer of a few megabytes, held until this short process exits: collecting
	// garbage while it arrives only costs time.
	debug.SetGCPercent(800)
	var answer bytes.Buffer
	if err := w.client.Stream(w.ctx, "GET", "/dw/v1/"+name, &answer); err != nil {
		return w.fail("%v", err)
	}
	doc, err := listingDocument(name, answer.Bytes())
	if err != nil {
		return w.fail("dw_wlm_cli: the controller's answer to GET /dw/v1/%s %v", name, err)
	}
	w.out.Write(doc)
	return 0
}

// listingDocument checks that answer is one whole JSON object {"<name>":[...]} as the
// controller writes it (compact: encoding/json's or views.AppendTable's), and returns it as
// writeJSON would print it: apostrophes as \u0027, one newline at the end.
func listingDocument(name string, answer []byte) ([]byte, error) {
	doc := bytes.TrimRight(answer, " \t\r\n")
	head := `{"` + name + `":[`
	if !bytes.HasPrefix(doc, []byte(head)) {
		return nil, fmt.Errorf("does not begin with %s: %.60q", head, doc)
	}
	end, err := closingBracket(doc, len(head)-1)
	if err != nil {
		return nil, err
	}
	if string(doc[end+1:]) != "}" {
		return nil, fmt.Errorf("is not one object {%q: [...]}: %.60q follows its list", name, doc[end+1:])
	}
	if bytes.IndexByte(doc, '\'') >= 0 { // Slurm turns an apostrophe into a double quote before parsing
		doc = bytes.ReplaceAll(doc, []byte("'"), []byte(`\u0027`))
	} else {
		doc = doc[:len(doc):len(doc)] // the newline appended below must not write into answer
	}
	return append(doc, '\n'), nil
}

// closingBracket returns the index of the bracket closing the one at doc[open], following
// strings (escapes included) and nested lists and objects; an error when doc ends first
// (the answer was cut off) or a bracket closes what it did not open. About a gigabyte a
// second: a few milliseconds for 10,000 instances.
func closingBracket(doc []byte, open int) (int, error) {
	var stack []byte // the closing brackets awaited, innermost last
	for i := open; i < len(doc); i++ {
		c := doc[i]
		if !jsonStructural[c] {
			continue
		}
		switch c {
		case '"':
			for { // to the string's closing quote, over escaped characters
				i++
				end := bytes.IndexByte(doc[i:], '"')
				if end < 0 {
					return 0, fmt.Errorf("is cut off inside a string, after %d bytes", len(doc))
				}
				if esc := bytes.IndexByte(doc[i:i+end], '\\'); esc >= 0 {
					i += esc + 1 // the escaped character, passed by the i++ above
					continue
				}
				i += end
				break
			}
		case '[', '{':
			stack = append(stack, c+2) // ']' is '['+2, '}' is '{'+2
		case ']', '}':
			if len(stack) == 0 || stack[len(stack)-1] != c {
				return 0, fmt.Errorf("is malformed: %q at byte %d closes nothing it opened", c, i)
			}
			if stack = stack[:len(stack)-1]; len(stack) == 0 {
				return i, nil
			}
		}
	}
	return 0, fmt.Errorf("is cut off: %d bracket(s) still open after its %d bytes", len(stack), len(doc))
}

// jsonStructural are the bytes closingBracket looks at outside strings.
var jsonStructural = func() (set [256]bool) {
	for _, c := range `"[]{}` {
		set[c] = true
	}
	return set
}()

// wait waits for a step and turns its outcome into the exit status.
func (w *wlm) wait(step string, timeout time.Duration) int {
	st, err := w.client.WaitStep(w.ctx, w.a.token, step, timeout)
	if err != nil {
		return w.fail("%s: %v", step, err)
	}
	if st.Failed {
		return w.fail("%s", st.Message)
	}
	return 0
}

// send sends a request, retrying while the token's previous teardown finishes (Slurm reuses a
// token after a teardown).
func (w *wlm) send(req func() error) error {
	deadline := time.Now().Add(w.stepTimeout)
	for {
		err := req()
		if err == nil || !apiclient.IsBusy(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(w.poll)
	}
}

func (w *wlm) step(step string, req func() error) int {
	if !w.require("--token") {
		return 64
	}
	if err := w.send(req); err != nil {
		if apiclient.IsNotFound(err) {
			return w.fail("No matching session")
		}
		return w.fail("%v", err)
	}
	return w.wait(step, w.stepTimeout)
}

func parseID(s, what string) (uint32, error) {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%s %q is not a number", what, s)
	}
	return uint32(v), nil
}

// poolAndSize splits Slurm's POOL:SIZE (setup: a size string such as 1GiB; create_persistent:
// bytes).
func poolAndSize(s string) (string, uint64, error) {
	pool, size, ok := strings.Cut(s, ":")
	if !ok {
		return "", 0, fmt.Errorf("capacity %q: expected POOL:SIZE", s)
	}
	n, err := units.ParseSize(size)
	return pool, n, err
}

func (w *wlm) setup() int {
	if !w.require("--token", "--job", "--user", "--capacity") {
		return 64
	}
	uid, err := parseID(w.a.user, "--user")
	if err != nil {
		return w.fail("%v", err)
	}
	gid := uid
	if w.a.group != "" {
		if gid, err = parseID(w.a.group, "--groupid"); err != nil {
			return w.fail("%v", err)
		}
	}
	pool, size, err := poolAndSize(w.a.capacity)
	if err != nil {
		return w.fail("%v", err)
	}
	s, err := w.script()
	if err != nil {
		return w.fail("%v", err)
	}
	nodes, err := readNodeFile(w.a.nodefile)
	if err != nil {
		return w.fail("%v", err)
	}
	creator := w.a.caller
	if creator == "" {
		creator = "SLURM"
	}
	req, err := jobspec.Setup(s, w.a.token, creator, uid, gid, nodes)
	if err != nil {
		return w.fail("%v", err)
	}
	if req.Swap != nil {
		// Swap is reserved for the job's compute nodes: Slurm names them at setup only when
		// it has planned them (--nodehostnamefile); otherwise the count the script asks for
		// (#SBATCH --nodes, its maximum), as Slurm's plugin counts swap; otherwise one.
		if len(nodes) == 0 {
			if raw, err := jobspec.ReadScript(w.a.job); err == nil {
				req.Swap.Nodes = jobspec.SbatchNodes(raw)
			}
		}
		if req.Swap.Pool == "" && pool != "" && pool != "(null)" {
			req.Swap.Pool = pool
		}
	}
	if req.Instance != nil {
		if size == 0 {
			// Slurm allots no job capacity (a persistent-only job): no instance, and no
			// stage-out into it to register (data_out says why, if it is asked). Swap is
			// reserved whatever Slurm counted (its plugins count swap wrongly or not at
			// all: docs/swap.md).
			req.Instance, req.More = nil, nil
			req.StageOut = jobspec.WithoutJobInstance(req.StageOut, len(req.Uses) > 0)
		} else {
			// Slurm's --capacity is the sum of every #DW jobdw (a scratch and a cache);
			// each instance keeps its own capacity, and the job's pool where it names none.
			if req.Instance.Pool == "" {
				req.Instance.Pool = pool
			}
			for i := range req.More {
				if req.More[i].Pool == "" {
					req.More[i].Pool = pool
				}
			}
		}
	}
	// A refusal names the script's line and quotes the directive as the user wrote it.
	return w.step(lifecycle.PhaseSetup, func() error { return jobspec.SetupError(s, w.client.Setup(w.ctx, req)) })
}

func (w *wlm) stage(direction string) int {
	if !w.require("--token", "--job") {
		return 64
	}
	s, err := w.script()
	if err != nil {
		return w.fail("%v", err)
	}
	list, step := s.StageIn, lifecycle.PhaseDataIn
	if direction == model.StageOut {
		list, step = s.StageOut, lifecycle.PhaseDataOut
	}
	reqs, err := jobspec.Stages(list, direction)
	if err != nil {
		return w.fail("%v", err)
	}
	if err := w.send(func() error { return w.client.Stages(w.ctx, w.a.token, direction, reqs) }); err != nil {
		if apiclient.IsNotFound(err) {
			return w.fail("No matching session")
		}
		return w.fail("%v", err)
	}
	// Staging is bounded by Slurm's StageInTimeout/StageOutTimeout, not by ours.
	return w.wait(step, 0)
}

func (w *wlm) realSize() int {
	if !w.require("--token") {
		return 64
	}
	all, err := w.client.All(w.ctx)
	if err != nil {
		return w.fail("%v", err)
	}
	var capacity uint64
	for _, s := range all.Sessions {
		if s.Token != w.a.token {
			continue
		}
		for _, i := range all.Instances {
			if i.Links.Session == s.ID {
				capacity += i.Capacity.Bytes
			}
		}
	}
	return w.writeJSON(struct {
		Token    string `json:"token"`
		Capacity uint64 `json:"capacity"`
		Units    string `json:"units"`
	}{w.a.token, capacity, "bytes"})
}

func (w *wlm) paths() int {
	if !w.require("--token", "--pathfile") {
		return 64
	}
	env, err := w.client.Paths(w.ctx, w.a.token)
	if err != nil {
		if apiclient.IsNotFound(err) {
			return w.fail("No matching session")
		}
		return w.fail("%v", err)
	}
	var keys []string
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, env[k])
	}
	if err := os.WriteFile(w.a.pathfile, []byte(b.String()), 0o644); err != nil {
		return w.fail("paths: %v", err)
	}
	return 0
}

func (w *wlm) preRun() int {
	nodes, err := readNodeFile(w.a.nodefile)
	if err != nil {
		return w.fail("%v", err)
	}
	if w.a.nodes != "" { // Spillway's burst_buffer.lua passes the nodes as a list
		nodes = append(nodes, strings.Split(w.a.nodes, ",")...)
	}
	return w.step(lifecycle.PhasePreRun, func() error { return w.client.PreRun(w.ctx, w.a.token, nodes) })
}

func (w *wlm) teardown() int {
	if !w.require("--token") {
		return 64
	}
	err := w.send(func() error { return w.client.Teardown(w.ctx, w.a.token, w.a.hurry) })
	if apiclient.IsNotFound(err) {
		// Slurm runs teardown at the end of every job that might have a buffer.
		fmt.Fprintln(w.out, "token not found")
		return 0
	}
	if err != nil {
		return w.fail("%v", err)
	}
	return w.wait(lifecycle.PhaseTeardown, w.stepTimeout)
}

func (w *wlm) createPersistent() int {
	if !w.require("--token", "--user", "--capacity") {
		return 64
	}
	uid, err := parseID(w.a.user, "-u")
	if err != nil {
		return w.fail("%v", err)
	}
	gid := uid
	if w.a.group != "" {
		if gid, err = parseID(w.a.group, "-g"); err != nil {
			return w.fail("%v", err)
		}
	} else if u, err := user.LookupId(w.a.user); err == nil {
		if g, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
			gid = uint32(g)
		}
	}
	pool, size, err := poolAndSize(w.a.capacity)
	if err != nil {
		return w.fail("%v", err)
	}
	c := directive.CreatePersistent{Name: w.a.token, Capacity: size, Pool: pool, Type: w.a.typ}
	if w.a.access != "" {
		for _, m := range strings.Split(w.a.access, ",") {
			switch m {
			case "ldbalance", "ldbal":
				m = model.AccessLoadbalance
			}
			c.AccessModes = append(c.AccessModes, m)
		}
	}
	caller := w.a.caller
	if caller == "" {
		caller = "CLI"
	}
	req := jobspec.CreatePersistent(c, caller, uid, gid)
	if code := w.step(lifecycle.PhaseSetup, func() error { return w.client.Setup(w.ctx, req) }); code != 0 {
		return code
	}
	fmt.Fprintln(w.out, "created")
	return 0
}

// readNodeFile reads Slurm's --nodehostnamefile: one host name per line.
func readNodeFile(path string) ([]string, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("node file: %v", err)
	}
	defer f.Close()
	var nodes []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if n := strings.TrimSpace(strings.Trim(sc.Text(), "\x00")); n != "" {
			nodes = append(nodes, n)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("node file %s: %v", path, err)
	}
	return nodes, nil
}
