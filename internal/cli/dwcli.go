package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/dwstat"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/units"
	"github.com/spillway-hpc/spillway/internal/views"
)

// dwcliShort is what a mistake prints under its one line: the synopsis.
const dwcliShort = `Usage: dwcli ls OBJECT [--json]
       dwcli create pool --name POOL --granularity SIZE
       dwcli create session --token TOKEN --owner UID [--group GID] [--creator NAME] [--hosts NODE,...] [--persistent [--expiration WHEN]]
       dwcli create instance --session ID --capacity SIZE [--pool POOL] [--label LABEL] [--optimization bandwidth|interference]
       dwcli create configuration --instance ID --access-mode stripe|private|ldbal [--type scratch] [--root-permissions MODE] [--group GID]
       dwcli create activation --session ID --configuration ID --mount NAME
       dwcli rm pool --name POOL
       dwcli update node --name NODE[,NODE...] [--drain|--fill] [--offline|--online] [--pool POOL] [--storage] [--reason TEXT]
       dwcli rm node --name NODE
       dwcli rm session|instance|configuration|activation -i ID [--hurry]
       dwcli update registration -i ID --no-wait
       dwcli update fragment|namespace|activation -i ID --replace-fuse
       dwcli stage in|out --session ID --configuration ID --backing-path PFS_DIR/ --dir /DIR
       dwcli stage query|list|wait|terminate --session ID --configuration ID [--dir /DIR]
       dwcli stage in|out|query|wait|terminate|list|accounting|concurrency PATH...
       dwcli config backup [-o FILE] | dwcli config restore FILE
dwcli --help for the manual, dwcli VERB --help for one verb.
`

// dwcliHelp is the manual: the synopsis, then a section per verb (dwcli VERB --help prints
// the synopsis and that section).
var dwcliHelp = map[string]string{
	"": `Administrative changes, as DataWarp's dwcli makes them: list objects, make and remove
pools, drain and fill nodes, take them offline and online, move them between pools, forget
retired ones, replace blown fuses, build an instance by hand (session, instance,
configuration, activation), stage a session's directories, remove sessions and their
objects. Every command takes --json: it then prints one JSON object on standard output
(errors too: {"error": "..."}). Changes need root or a controller.wlm_users user; ordinary
users may list (what they may see), stage and remove their own sessions. Options may come anywhere (dwcli rm session -i 7
--hurry, dwcli --config FILE ls pools).

Connection, as dwstat's: --config FILE (a system install's configuration; default
$SPILLWAY_CONFIG, else /etc/spillway/spillway.toml if it exists), --controller ADDRESS
(unix:/path or http(s)://host:port), --token-file FILE (the shared secret over TCP),
--home DIR (a one-machine home; default $SPILLWAY_HOME).

Exit status: 0 done, 1 refused or failed (the message says why and what to do), 64 a
mistake on the command line.
`,
	"ls": `  ls OBJECT
      Print the ids of a table, one a line, in dwstat's order. OBJECT is a table's name,
      plural or singular or short as dwstat takes them: pools, nodes, sessions, instances,
      configurations, registrations, activations, fragments, namespaces, stages (pool,
      node, sess, inst, conf, reg, activ, frag, nss, stage, ...).
        dwcli ls nodes
        dwcli ls pool --json        {"pools": ["sm_pool", "wlm_pool"]}
`,
	"create": `  create pool --name POOL --granularity SIZE
      Add a pool (or change the granularity of one with no instance). SIZE: 16MiB, 1GiB,
      ... Nodes join it by their agent.pool, or by dwcli update node --pool.
        dwcli create pool --name sm_pool --granularity 16MiB
        --json: {"request": "create", "entity": "pools", "ids": ["sm_pool"], "status": "accepted"}

  DataWarp's manual walk-through: an instance built by hand, object by object, with the
  choices a #DW jobdw line does not offer (the instance root's permissions and group). Each
  command prints the new object's id ("create request for configurations entity with id =
  3 accepted, ..."); dwcli rm session -i ID takes it all down again. Administrators only
  (a user's own instances come from #DW directives, spillway run and spillway persistent
  create).

  create session --token TOKEN --owner UID [--group GID] [--creator NAME] [--hosts NODE,...]
                 [--persistent [--expiration WHEN]]
      A session with no instance yet. --owner and --group take ids or names (--group
      defaults to the owner's primary group); --creator defaults to CLI; --hosts are the
      compute nodes an activation mounts on. A job id as TOKEN belongs to the workload
      manager (Slurm removes sessions of job ids it does not know): give a name. --persistent
      makes a persistent instance's session (TOKEN its name, as #BB create_persistent);
      --expiration WHEN (seconds since the epoch, 2026-12-31T18:00:00, 72h, 30d or never) is
      for those only.
  create instance --session ID --capacity SIZE [--pool POOL] [--label LABEL]
                  [--optimization bandwidth|interference]
      Place capacity in a pool (default: controller.default_pool) for a session that has no
      instance: fragments on the pool's nodes as a setup places them. --label defaults to
      I<id>-0 (a persistent session's: its name).
  create configuration --instance ID --access-mode stripe|private|ldbal [--type scratch]
                       [--root-permissions MODE] [--group GID]
      How the instance is used: its namespace(s), owned by the session's user, the root
      with mode MODE (octal, e.g. 0755 or 2770; default 0700 for a job, 0755 for a persistent
      instance) and group GID (default the session's). One configuration per access mode;
      private is not for persistent instances; --type cache and swap are not made by hand
      (#DW jobdw type=cache pfs=DIR, spillway persistent create --type cache; #DW swap SIZE).
  create activation --session ID --configuration ID --mount NAME
      Mount the configuration on every compute node of the session (its --hosts), at
      controller.mount_root/NAME (NAME alone, or that whole path): the session's own
      configuration, or one of a persistent instance the session uses.
        dwcli create session --token mybuf --owner alice --hosts nid00012,nid00013
        dwcli create instance --session 5 --capacity 200GiB --pool wlm_pool
        dwcli create configuration --instance 5 --access-mode stripe --root-permissions 2770 --group proj
        dwcli create activation --session 5 --configuration 8 --mount mybuf
`,
	"update": `  update node --name NODE[,NODE...] CHANGES [--reason TEXT]
      Change storage nodes; CHANGES are one or more of:
        --drain     take no new fragments (instances on it stay until their sessions end)
        --fill      take new fragments again (also after an auto-drain: its counted
                    failures are forgotten)
        --offline   take the node out of service: the controller treats it as offline
                    whatever its heartbeats say (no new fragments, no mounts, no stages;
                    sessions on it are torn down without it and its agent deletes their
                    leftovers), until --online
        --online    let its heartbeats bring it online again
        --pool POOL move it to another pool (refused while it holds fragments: drain it and
                    wait until dwstat fragments shows none on it); its agent's agent.pool
                    no longer changes it. It also admits the node, as --storage does
        --storage   admit the node as a storage node: the pool, capacity and data address
                    its agent reports count from its next heartbeat. An agent holding only
                    its own node key (spillway node-key) is never a storage node without
                    this; dwstat nodes shows such a node "not admitted"
      --reason says why (dwstat nodes --json shows it); --fill and --online clear it.
        dwcli update node --name bb3 --drain --reason "SSD errors"
        dwcli update node --name bb3,bb4 --pool sm_pool
        dwcli update node --name bb5 --storage
        --json: {"request": "update", "entity": "nodes", "ids": ["bb3"], "status": "accepted"}

  update registration -i ID --no-wait
      Let a session's teardown go on without waiting for its stage-outs (they are
      canceled).

  update fragment|namespace|activation -i ID --replace-fuse
      An object whose effect on its agent failed executor.max_attempts times has a blown
      fuse (F in dwstat's state column) and is not tried again. Once the cause is fixed,
      --replace-fuse forgets the failures and the executor tries again at once.
        dwcli update fragment -i 12 --replace-fuse
`,
	"rm": `  rm session -i ID [--hurry]
      Tear a session down (a job's or a persistent instance's) and wait until it is gone:
      its mounts, namespaces and fragments are removed from the nodes. A teardown waits for
      the session's stage-outs; --hurry cancels them. Owners may remove their own sessions.
        dwcli rm session -i 7 --hurry
        --json: {"request": "delete", "entity": "sessions", "ids": [7], "status": "done"}

  rm instance|configuration -i ID [--hurry]
      An instance, and its configurations, belong to one session: removing one tears its
      session down, as rm session does (the command says which session).

  rm activation -i ID
      Unmount one activation from its compute node, and wait until it is gone.

  rm pool --name POOL
      Remove a pool with no node and no instance in it (not one listed in the controller's
      configuration, which would make it again).

  rm node --name NODE
      Forget a retired node: refused while it holds fragments or mounts (the message names
      them), or while its agent still sends heartbeats (stop the agent first).
`,
	"stage": `  stage in|out --session ID --configuration ID --backing-path PFS_DIR/ --dir /DIR
  stage query|list|wait|terminate --session ID --configuration ID [--dir /DIR]
      DataWarp's form: stage a directory of a session's configuration (ids from dwstat
      sessions and dwstat configurations) from or to a PFS directory, from any node; the
      stage runs as the session's user. query prints DataWarp's columns (the 8th is the
      files remaining, "-" once the stage ended).
        dwcli stage out --session 7 --configuration 9 --backing-path /lustre/me/out/ --dir /results
        dwcli stage query --session 7 --configuration 9
  stage in|out|query|wait|terminate|list|accounting|concurrency PATH...
      The path form: stage your own job's files while it runs, as libdatawarp does.
      dwcli stage --help is the whole manual of both forms.
`,
	"cache": `  cache policy [--modified-threshold SIZE] [--read-ahead SIZE] [--sync-on-close yes|no|default]
               [--sync-to-pfs yes|no|default] PATH
  cache sync PATH...
      A cache instance's file or directory ($DW_JOB_STRIPED_CACHE): print (and set) its cache
      policy, or wait until files' data is on the PFS, as libdatawarp's dw_get_cache_policy,
      dw_set_cache_policy and dw_wait_sync_complete. dwcli cache --help is the whole manual.
        dwcli cache policy --sync-on-close yes $DW_JOB_STRIPED_CACHE/out
        dwcli cache sync $DW_JOB_STRIPED_CACHE/out/result.h5
`,
	"config": `  config backup [-o FILE]
  config restore FILE
      DataWarp's dump of the node and pool configuration: the pools (name, granularity) and
      the storage nodes' drain settings (drained or not, and why) as one JSON document, to
      stdout or FILE; restore puts them back through the API: creates the pools that are
      missing (a pool of another granularity changes if no instance uses it), drains or
      fills the nodes the controller knows, and lists the ones it does not (their agent
      never started). The controller's whole state (sessions, instances, ...) is backed up
      with spillway admin backup (docs/admin.md).
`,
}

var dwcliVerbs = []string{"ls", "create", "update", "rm", "stage", "cache", "config"}

// dwcliManual is the whole manual, or one verb's part of it.
func dwcliManual(verb string) string {
	var b strings.Builder
	b.WriteString(dwcliShort + "\n" + dwcliHelp[""])
	if _, ok := dwcliHelp[verb]; ok && verb != "" {
		b.WriteString("\n" + dwcliHelp[verb])
		return b.String()
	}
	for _, v := range dwcliVerbs {
		b.WriteString("\n" + dwcliHelp[v])
	}
	return b.String()
}

// dwcliObjects are the tables the verbs act on, and their kinds (lifecycle.Kind*).
var dwcliKinds = map[string]string{"sessions": lifecycle.KindSession, "instances": lifecycle.KindInstance, "configurations": lifecycle.KindConfiguration,
	"activations": lifecycle.KindActivation, "fragments": lifecycle.KindFragment, "namespaces": lifecycle.KindNamespace,
	"registrations": lifecycle.KindRegistration, "nodes": lifecycle.KindNode, "pools": lifecycle.KindPool, "stages": lifecycle.KindStage}

func dwcliMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, "dwcli: give a command\n"+dwcliShort)
		return 64
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		verb := ""
		if len(args) > 1 {
			verb = args[1]
		}
		fmt.Fprint(stdout, dwcliManual(verb))
		return 0
	}
	if firstWord(args) == "config" {
		for i, a := range args {
			if a == "config" {
				return dwcliConfigMain(append(append([]string(nil), args[:i]...), args[i+1:]...), stdout, stderr)
			}
		}
	}
	if firstWord(args) == "cache" {
		for i, a := range args {
			if a == "cache" {
				return dwcliCacheMain(append(append([]string(nil), args[:i]...), args[i+1:]...), stdout, stderr)
			}
		}
	}
	if firstWord(args) == "stage" {
		for i, a := range args {
			if a == "stage" {
				return dwcliStageMain(append(append([]string(nil), args[:i]...), args[i+1:]...), stdout, stderr)
			}
		}
	}
	fs := NewFlags("dwcli", dwcliShort, stderr)
	fs.Usage = func() {
		if fs.Output() == stdout {
			fmt.Fprint(stdout, dwcliManual(firstWord(args)))
			return
		}
		fmt.Fprint(stderr, dwcliShort)
	}
	var conn Connection
	conn.Flags(fs, true)
	name := fs.String("name", "", "pool or node name (nodes: a comma-separated list)")
	gran := fs.String("granularity", "", "pool granularity, e.g. 16MiB")
	drain := fs.Bool("drain", false, "update node: take no new fragments")
	fill := fs.Bool("fill", false, "update node: take new fragments again")
	offline := fs.Bool("offline", false, "update node: hold it offline")
	online := fs.Bool("online", false, "update node: let its heartbeats bring it online")
	pool := fs.String("pool", "", "update node: move it to this pool")
	storage := fs.Bool("storage", false, "update node: admit it as a storage node")
	reason := fs.String("reason", "", "update node: why (shown in dwstat nodes --json)")
	id := fs.Int64("i", 0, "object id")
	noWait := fs.Bool("no-wait", false, "update registration: do not wait for stage-out at teardown")
	replaceFuse := fs.Bool("replace-fuse", false, "update fragment|namespace|activation: try its failed effect again")
	hurry := fs.Bool("hurry", false, "rm session: do not wait for stage-outs")
	asJSON := fs.Bool("json", false, "print JSON")
	var co createOpts
	fs.StringVar(&co.token, "token", "", "create session: its token (a job id, or a persistent instance's name)")
	fs.StringVar(&co.owner, "owner", "", "create session: its user (uid or name)")
	fs.StringVar(&co.creator, "creator", "", "create session: who made it (default CLI)")
	fs.StringVar(&co.hosts, "hosts", "", "create session: its compute nodes, comma-separated")
	fs.StringVar(&co.expiration, "expiration", "", "create session --persistent: when it expires")
	fs.StringVar(&co.group, "group", "", "create session|configuration: the group (gid or name)")
	fs.BoolVar(&co.persistent, "persistent", false, "create session: a persistent instance's session")
	fs.Int64Var(&co.session, "session", 0, "create instance|activation: the session's id")
	fs.StringVar(&co.capacity, "capacity", "", "create instance: its capacity, e.g. 1TiB")
	fs.StringVar(&co.label, "label", "", "create instance: its label")
	fs.StringVar(&co.optimization, "optimization", "", "create instance: bandwidth or interference")
	fs.Int64Var(&co.instance, "instance", 0, "create configuration: the instance's id")
	fs.StringVar(&co.typ, "type", "", "create configuration: scratch")
	fs.StringVar(&co.accessMode, "access-mode", "", "create configuration: stripe, private or ldbal")
	fs.StringVar(&co.rootPermissions, "root-permissions", "", "create configuration: the mode of the instance root, octal")
	fs.StringVar(&co.backingPath, "backing-path", "", "create configuration --type cache: the PFS directory")
	fs.Int64Var(&co.configuration, "configuration", 0, "create activation: the configuration's id")
	fs.StringVar(&co.mount, "mount", "", "create activation: where it is mounted")
	mistake := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "dwcli: "+format+"\n", a...)
		fmt.Fprint(stderr, dwcliShort)
		return 64
	}
	if msg := unknownDwcliFlag(fs, args); msg != "" {
		return mistake("%s", msg)
	}
	if code, ok := ParseInterspersed(fs, args, stdout); !ok {
		return code
	}
	words := fs.Args()
	if len(words) == 0 {
		return mistake("give a command")
	}
	verb := words[0]
	switch verb {
	case "ls", "create", "update", "rm":
	default:
		return mistake("unknown command %q: expected %s", verb, strings.Join(dwcliVerbs, ", "))
	}
	if len(words) < 2 {
		return mistake("%s what? give an object, e.g. dwcli %s %s", verb, verb, map[string]string{"ls": "nodes", "create": "pool --name POOL --granularity SIZE", "update": "node --name NODE --drain", "rm": "session -i ID"}[verb])
	}
	if len(words) > 2 {
		return mistake("unexpected %q after %s %s", words[2], verb, words[1])
	}
	object := words[1]
	tables, _, err := dwstat.Resolve([]string{object})
	if err != nil || len(tables) != 1 || (verb != "ls" && (object == "most" || object == "all")) {
		return mistake("unknown object %q: expected pools, nodes, sessions, instances, configurations, registrations, activations, fragments, namespaces or stages (singular or plural)", object)
	}
	table := tables[0]
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// allowed lists the options of each command; any other one is a mistake.
	allowed := map[string][]string{
		"ls pools": nil, "ls nodes": nil, "ls sessions": nil, "ls instances": nil, "ls configurations": nil, "ls registrations": nil,
		"ls activations": nil, "ls fragments": nil, "ls namespaces": nil, "ls stages": nil,
		"create pools":          {"name", "granularity"},
		"create sessions":       createOptions["create sessions"],
		"create instances":      createOptions["create instances"],
		"create configurations": createOptions["create configurations"],
		"create activations":    createOptions["create activations"],
		"rm pools":              {"name"},
		"update nodes":          {"name", "drain", "fill", "offline", "online", "pool", "storage", "reason"},
		"rm nodes":              {"name"},
		"rm sessions":           {"i", "hurry"},
		"rm instances":          {"i", "hurry"},
		"rm configurations":     {"i", "hurry"},
		"rm activations":        {"i"},
		"update registrations":  {"i", "no-wait"},
		"update fragments":      {"i", "replace-fuse"},
		"update namespaces":     {"i", "replace-fuse"},
		"update activations":    {"i", "replace-fuse"},
	}
	command := verb + " " + table
	opts, known := allowed[command]
	if !known {
		return mistake("%s %s is not a command", verb, object)
	}
	for f := range set {
		switch f {
		case "json", "config", "controller", "token-file", "home":
			continue
		}
		ok := false
		for _, o := range opts {
			ok = ok || o == f
		}
		if !ok {
			return mistake("%s %s takes no -%s", verb, object, f)
		}
	}
	var createReq any
	if createOptions[command] != nil {
		co.pool = *pool
		var msg string
		if createReq, msg = co.check(command, set); msg != "" {
			return mistake("%s", msg)
		}
	}
	// The checks of each command's options, before connecting.
	var nodeChange controllerapi.NodeUpdate
	var granularity uint64
	switch command {
	case "create pools":
		if *name == "" || *gran == "" {
			return mistake("create pool needs --name POOL and --granularity SIZE")
		}
		g, err := units.ParseSize(*gran)
		if err != nil || g == 0 {
			return mistake("--granularity %q: give a size greater than 0, e.g. 16MiB", *gran)
		}
		granularity = g
	case "rm pools", "rm nodes":
		if *name == "" {
			return mistake("%s %s needs --name", verb, object)
		}
	case "update nodes":
		if *name == "" {
			return mistake("update node needs --name NODE")
		}
		if *drain && *fill {
			return mistake("--drain and --fill contradict each other: give one")
		}
		if *offline && *online {
			return mistake("--offline and --online contradict each other: give one")
		}
		if *drain || *fill {
			nodeChange.Drain = drain
		}
		if *offline || *online {
			nodeChange.Offline = offline
		}
		if set["pool"] {
			if *pool == "" {
				return mistake("--pool needs a pool name")
			}
			nodeChange.Pool = pool
		}
		if *storage {
			nodeChange.Storage = storage
		}
		if nodeChange.Drain == nil && nodeChange.Offline == nil && nodeChange.Pool == nil && nodeChange.Storage == nil {
			return mistake("update node needs a change: --drain, --fill, --offline, --online, --pool POOL or --storage")
		}
		nodeChange.Reason = *reason
	case "update registrations":
		if *id <= 0 || !*noWait {
			return mistake("update registration needs -i ID and --no-wait")
		}
	case "update fragments", "update namespaces", "update activations":
		if *id <= 0 || !*replaceFuse {
			return mistake("update %s needs -i ID and --replace-fuse", object)
		}
	case "rm sessions", "rm instances", "rm configurations", "rm activations":
		if *id <= 0 {
			return mistake("rm %s needs -i ID (dwstat %s lists them)", object, table)
		}
	}

	conn.lookOnly = verb == "ls"
	sess, err := conn.Connect(false, QuietLogger(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "dwcli: %v\n", err)
		return 1
	}
	defer sess.Close()
	ctx := background()
	fail := dwcliRefusal(stdout, stderr, *asJSON, verb+" "+object)
	// done reports a request DataWarp's way, or as JSON.
	done := func(request, status string, ids ...any) int {
		if *asJSON {
			writeJSON(stdout, map[string]any{"request": request, "entity": table, "ids": ids, "status": status})
			return 0
		}
		for _, i := range ids {
			fmt.Fprintf(stdout, "%s request for %s entity with id = %v %s, \"dwstat %s\" for status\n", request, table, i, status, table)
		}
		return 0
	}
	switch command {
	case "create pools":
		if err := sess.client.CreatePool(ctx, *name, granularity); err != nil {
			return fail(err)
		}
		return done("create", "accepted", *name)
	case "create sessions", "create instances", "create configurations", "create activations":
		made, err := co.create(ctx, sess, command, createReq)
		if err != nil {
			return fail(err)
		}
		ids := []any{}
		for _, id := range made {
			ids = append(ids, id)
		}
		return done("create", "accepted", ids...)
	case "rm pools":
		if err := sess.client.RemovePool(ctx, *name); err != nil {
			return fail(err)
		}
		return done("delete", "done", *name)
	case "update nodes":
		var ids []any
		for _, n := range strings.Split(*name, ",") {
			if n == "" {
				continue
			}
			if err := sess.client.UpdateNode(ctx, n, nodeChange); err != nil {
				return fail(err)
			}
			ids = append(ids, n)
		}
		return done("update", "accepted", ids...)
	case "rm nodes":
		if err := sess.client.RemoveNode(ctx, *name); err != nil {
			return fail(err)
		}
		return done("delete", "done", *name)
	case "update registrations":
		if err := sess.client.ReleaseRegistration(ctx, *id); err != nil {
			return fail(err)
		}
		return done("update", "accepted", *id)
	case "update fragments", "update namespaces", "update activations":
		if err := sess.client.ReplaceFuse(ctx, table, *id); err != nil {
			return fail(err)
		}
		return done("update", "accepted", *id)
	case "rm activations":
		if err := sess.client.RemoveActivation(ctx, *id); err != nil {
			return fail(err)
		}
		// Wait for it, so that the command's success means the mount is gone.
		if err := waitGone(ctx, sess, func(a views.All) bool {
			for _, act := range a.Activations {
				if act.ID == *id {
					return false
				}
			}
			return true
		}); err != nil {
			return fail(fmt.Errorf("activation %d: %w", *id, err))
		}
		return done("delete", "done", *id)
	case "rm sessions", "rm instances", "rm configurations":
		all, err := sess.client.All(ctx)
		if err != nil {
			return fail(err)
		}
		s, err := owningSession(all, table, *id)
		if err != nil {
			return fail(err)
		}
		if table != "sessions" && !*asJSON {
			fmt.Fprintf(stdout, "%s %d belongs to session %d (token %s): removing the session\n", lifecycleKind(table), *id, s.ID, s.Token)
		}
		if err := sess.client.Teardown(ctx, s.Token, *hurry); err != nil {
			return fail(err)
		}
		// Wait for it, so that the command's success means the session is gone.
		st, err := sess.client.WaitStep(ctx, s.Token, lifecycle.PhaseTeardown, sess.cfg.Client.StepTimeout.D())
		if err == nil && st.Failed {
			err = errors.New(st.Message)
		}
		if err != nil {
			return fail(err)
		}
		return done("delete", "done", *id)
	}
	// ls
	all, err := sess.client.All(ctx)
	if err != nil {
		return fail(err)
	}
	// Every row has an "id"; print them in the table's order.
	raw, _ := json.Marshal(dwstat.Select(all, []string{table})[table])
	var rows []struct {
		ID any `json:"id"`
	}
	json.Unmarshal(raw, &rows)
	ids := []any{}
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	if *asJSON {
		writeJSON(stdout, map[string][]any{table: ids})
		return 0
	}
	for _, id := range ids {
		fmt.Fprintln(stdout, id)
	}
	return 0
}

func lifecycleKind(table string) string { return dwcliKinds[table] }

// owningSession finds the session a session, instance or configuration id belongs to.
func owningSession(all views.All, table string, id int64) (views.Session, error) {
	sid := int64(0)
	switch table {
	case "sessions":
		sid = id
	case "instances":
		for _, i := range all.Instances {
			if i.ID == id {
				sid = i.Links.Session
			}
		}
	case "configurations":
		for _, c := range all.Configurations {
			if c.ID == id {
				for _, i := range all.Instances {
					if i.ID == c.Links.Instance {
						sid = i.Links.Session
					}
				}
			}
		}
	}
	for _, s := range all.Sessions {
		if s.ID == sid && sid != 0 {
			return s, nil
		}
	}
	return views.Session{}, fmt.Errorf("no %s with id %s (dwstat %s lists them)", lifecycleKind(table), strconv.FormatInt(id, 10), table)
}

// waitGone polls the state until gone says so, within the client's step timeout.
func waitGone(ctx context.Context, sess *Session, gone func(views.All) bool) error {
	deadline := time.Now().Add(sess.cfg.Client.StepTimeout.D())
	for {
		all, err := sess.client.All(ctx)
		if err != nil {
			return err
		}
		if gone(all) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still there after %s (client.step_timeout); dwstat shows why", sess.cfg.Client.StepTimeout.D())
		}
		time.Sleep(sess.cfg.Client.PollInterval.D())
	}
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// firstWord is the first argument that is not an option or an option's value.
func firstWord(args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return a
		}
		switch strings.TrimLeft(a, "-") {
		case "home", "config", "controller", "token-file", "name", "granularity", "pool", "reason", "i",
			"token", "owner", "creator", "hosts", "expiration", "group", "session", "capacity", "label", "optimization",
			"instance", "type", "access-mode", "root-permissions", "backing-path", "configuration", "mount":
			i++ // its value follows
		}
	}
	return ""
}

// dwcliRefusal reports what the controller refused (or a failure to reach it) for command
// what: one line on standard error, or {"error": ...} on standard output with --json; exit
// status 1.
func dwcliRefusal(stdout, stderr io.Writer, asJSON bool, what string) func(error) int {
	return func(err error) int {
		if asJSON {
			writeJSON(stdout, map[string]any{"error": err.Error()})
			return 1
		}
		fmt.Fprintf(stderr, "dwcli %s: %v\n", what, err)
		return 1
	}
}
