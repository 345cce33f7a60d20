package cli

import (
	"encoding/json"

	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spillway-hpc/spillway/internal/dwstat"
	"github.com/spillway-hpc/spillway/internal/lifecycle"

	"github.com/spillway-hpc/spillway/internal/units"
)

const dwcliUsage = `Usage: dwcli ls TABLE [--json]
       dwcli create pool --name NAME --granularity SIZE
       dwcli update node --name NODE (--drain [--reason TEXT] | --fill)
       dwcli update registration -i ID --no-wait
       dwcli rm session -i ID [--hurry]
       dwcli stage in|out|query|wait|terminate|list ...   (dwcli stage --help)
       dwcli config backup [-o FILE] | dwcli config restore FILE   (dwcli config --help)

Administrative changes, as DataWarp's dwcli makes them.

  ls TABLE                 list the ids of a table (nodes, pools, sessions, ...);
                           --json prints {"TABLE": [ids]}
  create pool              add a pool (or change the granularity of an unused one)
  update node --drain      take a storage node out of new allocations (existing instances
                           stay); --fill puts it back
  update registration      let a session's teardown proceed without waiting for its
    --no-wait              stage-outs (they are cancelled)
  rm session -i ID         tear a session down (a job's or a persistent instance's)
  stage ...                stage your own job's files while it runs (as libdatawarp does)
  config backup|restore    the pools and the nodes' drain settings as JSON, and back

Options may come anywhere (dwcli rm session -i 7 --hurry, dwcli --home DIR ls pools).
Administrative changes need root or a controller.wlm_users user.
`

func dwcliMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, dwcliUsage)
		if len(args) == 0 {
			return 64
		}
		return 0
	}
	if firstWord(args) == "config" {
		for i, a := range args {
			if a == "config" {
				return dwcliConfigMain(append(append([]string(nil), args[:i]...), args[i+1:]...), stdout, stderr)
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
	fs := newFlags("dwcli", dwcliUsage, stderr)
	var conn connection
	conn.flags(fs, true)
	name := fs.String("name", "", "pool or node name")
	gran := fs.String("granularity", "", "pool granularity, e.g. 16MiB")
	drain := fs.Bool("drain", false, "drain the node")
	fill := fs.Bool("fill", false, "return a drained node to service")
	reason := fs.String("reason", "", "why the node is drained (shown in dwstat nodes --json)")
	id := fs.Int64("i", 0, "object id")
	noWait := fs.Bool("no-wait", false, "registration: do not wait for stage-out at teardown")
	hurry := fs.Bool("hurry", false, "rm session: do not wait for stage-outs")
	asJSON := fs.Bool("json", false, "ls: print JSON")
	if code, ok := parseInterspersed(fs, args, stdout); !ok {
		return code
	}
	words := append(fs.Args(), "", "")
	verb, object := words[0], words[1]
	if len(fs.Args()) > 2 {
		fmt.Fprintf(stderr, "dwcli: unexpected %q after %s %s\n\n%s", fs.Args()[2], verb, object, dwcliUsage)
		return 64
	}
	conn.lookOnly = verb == "ls" || verb == "show"
	sess, err := conn.connect(false, quietLogger(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "dwcli: %v\n", err)
		return 1
	}
	defer sess.Close()
	ctx := background()
	fail := func(err error) int {
		fmt.Fprintf(stderr, "dwcli %s %s: %v\n", verb, object, err)
		return 1
	}
	switch verb + " " + object {
	case "ls nodes", "ls pools", "ls sessions", "ls instances", "ls configurations", "ls fragments", "ls namespaces", "ls registrations", "ls activations":
		all, err := sess.client.All(ctx)
		if err != nil {
			return fail(err)
		}
		// Every row has an "id"; print them in the table's order.
		raw, _ := json.Marshal(dwstat.Select(all, []string{object})[object])
		var rows []struct {
			ID any `json:"id"`
		}
		json.Unmarshal(raw, &rows)
		ids := []any{}
		for _, r := range rows {
			ids = append(ids, r.ID)
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			enc.Encode(map[string][]any{object: ids})
			return 0
		}
		for _, id := range ids {
			fmt.Fprintln(stdout, id)
		}
		return 0
	case "create pool":
		g, err := units.ParseSize(*gran)
		if *name == "" || err != nil || g == 0 {
			fmt.Fprintln(stderr, "dwcli create pool: give --name and a --granularity greater than 0, e.g. --granularity 16MiB")
			return 64
		}
		if err := sess.client.CreatePool(ctx, *name, g); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "create request for pools entity with id = %s accepted, \"dwstat pools\" for status\n", *name)
		return 0
	case "update node":
		if *name == "" || *drain == *fill {
			fmt.Fprintln(stderr, "dwcli update node: give --name and exactly one of --drain or --fill")
			return 64
		}
		if err := sess.client.SetDrain(ctx, *name, *drain, *reason); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "update request for nodes entity with id = %s accepted, \"dwstat nodes\" for status\n", *name)
		return 0
	case "update registration":
		if *id == 0 || !*noWait {
			fmt.Fprintln(stderr, "dwcli update registration: give -i ID and --no-wait")
			return 64
		}
		if err := sess.client.ReleaseRegistration(ctx, *id); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "update request for registrations entity with id = %d accepted, \"dwstat registrations\" for status\n", *id)
		return 0
	case "rm session":
		if *id == 0 {
			fmt.Fprintln(stderr, "dwcli rm session: give -i ID (dwstat sessions lists them)")
			return 64
		}
		all, err := sess.client.All(ctx)
		if err != nil {
			return fail(err)
		}
		token := ""
		for _, s := range all.Sessions {
			if s.ID == *id {
				token = s.Token
			}
		}
		if token == "" {
			return fail(fmt.Errorf("no session with id %s", strconv.FormatInt(*id, 10)))
		}
		if err := sess.client.Teardown(ctx, token, *hurry); err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "delete request for sessions entity with id = %d accepted, \"dwstat sessions\" for status\n", *id)
		// Wait for it, so that the command's success means the session is gone.
		st, err := sess.client.WaitStep(ctx, token, lifecycle.PhaseTeardown, sess.cfg.Client.PollInterval.D(), sess.cfg.Client.StepTimeout.D(), nil)
		if err == nil && st.Failed {
			err = fmt.Errorf("%s", st.Message)
		}
		if err != nil {
			return fail(err)
		}
		return 0
	}
	fmt.Fprintf(stderr, "dwcli: unknown command %q\n\n%s", verb+" "+object, dwcliUsage)
	return 64
}

// firstWord is the first argument that is not an option or an option's value.
func firstWord(args []string) string {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return a
		}
		switch strings.TrimLeft(a, "-") {
		case "home", "config", "controller", "token-file":
			i++ // its value follows
		}
	}
	return ""
}
