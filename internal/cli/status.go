package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/controllerapi"
	"github.com/spillway-hpc/spillway/internal/dwstat"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
	"github.com/spillway-hpc/spillway/internal/units"
	"github.com/spillway-hpc/spillway/internal/views"
)

const dwstatUsage = `Usage: dwstat [options] [TABLE...]

Show the state of the burst buffer, as DataWarp's dwstat does. With no TABLE, the pools.
TABLEs: pools, nodes, sessions, instances, configurations, registrations, activations,
fragments, namespaces, stages (Spillway's: staging progress, then the finished stages kept
after their sessions went, [stage] history of them), accounting (Spillway's: bytes,
operations, files, capacity and write window per instance and storage node; not in all),
controllers (Spillway's: each controller given, asked one by one whether it is the only
one, leads or follows and whom, its store engine and version; works with no leader
elected; not in all), and the words most (pools, sessions, instances, configurations, registrations,
activations) and all. Singular and short names work too (instance, inst, frag, nss, acct).

Sizes print in binary units with at most two decimals (7.28TiB) unless -b; times are
local, YYYY-MM-DDTHH:MM:SS; an expiration of never means none. The state column has five
flags: C/D (goal create/destroy), A (actualized), F (fuse blown: an operator must look),
T (transitioning), M (mixed); - where unset.

Examples:
  dwstat                  the pools
  dwstat most
  dwstat instances fragments
  dwstat -b pools         granularity and sizes in bytes
  dwstat --json sessions
  dwstat accounting       what each instance read and wrote, per storage node
  dwstat --controller https://ctl1:7700,https://ctl2:7700 controllers
                          which of several controllers leads
`

func dwstatMain(args []string, stdout, stderr io.Writer) int {
	fs := NewFlags("dwstat", dwstatUsage, stderr)
	var conn Connection
	conn.Flags(fs, true)
	bytes := fs.Bool("b", false, "print sizes in bytes")
	cd := fs.Bool("cd", false, "configuration details: add amode and backing_path")
	asJSON := fs.Bool("json", false, "print the tables as JSON")
	allFlag := fs.Bool("all", false, "the same as the table word all")
	if code, ok := ParseInterspersed(fs, args, stdout); !ok {
		return code
	}
	words := fs.Args()
	if *allFlag {
		words = append(words, "all")
	}
	tables, summary, err := dwstat.Resolve(words)
	if err != nil {
		fmt.Fprintf(stderr, "dwstat: %v\n", err)
		return 64
	}
	conn.lookOnly = true
	sess, err := conn.Connect(false, QuietLogger(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "dwstat: %v\n", err)
		return 1
	}
	defer sess.Close()
	var all views.All
	if slices.ContainsFunc(tables, func(t string) bool { return t != "controllers" }) {
		all, err = sess.client.All(background())
	}
	if slices.Contains(tables, "controllers") { // each one's own answer: no leader needed
		all.Controllers = sess.client.Controllers(background())
	}
	if err == nil && slices.Contains(tables, "accounting") {
		var list controllerapi.AccountingList
		list, err = sess.client.AllAccounting(background())
		all.Accounting = list.Accounting
	}
	if err != nil {
		fmt.Fprintf(stderr, "dwstat: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(dwstat.Select(all, tables))
		return 0
	}
	fmt.Fprint(stdout, dwstat.Render(all, tables, summary, dwstat.Options{Bytes: *bytes, ConfigDetails: *cd}))
	return 0
}

const persistentUsage = `Usage: spillway persistent create NAME --capacity SIZE [--expiration WHEN] [options]
       spillway persistent list [--json]
       spillway persistent destroy NAME [--hurry]

Manage persistent instances: burst-buffer storage that outlives jobs, shared by your jobs
with #DW persistentdw name=NAME (the job then sees $DW_PERSISTENT_STRIPED_NAME). The same
as #BB create_persistent / #BB destroy_persistent in a job script.

NAME: letters, digits and _, not starting with a digit, at most 64 characters.
SIZE: 100GiB, 3.5TB, ... rounded up to the pool's granularity.
WHEN: a lifetime (72h, 30d), a local time (2026-12-31T18:00:00) or never. Past it the
instance takes no new jobs and is destroyed once the jobs using it end; without
--expiration it gets the site's default (often never), at most the site's maximum.
destroy refuses while a job uses the instance; with --hurry (the owner or an administrator)
it unmounts the instance from those jobs first. Its data is gone afterwards.

Examples:
  spillway persistent create myproject --capacity 200GiB
  spillway persistent create projcache --capacity 10TiB --type cache --pfs /lustre/proj
  spillway persistent list
  spillway persistent destroy myproject
`

// PersistentMain runs spillway persistent (a command of the full binary).
func PersistentMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, persistentUsage)
		if len(args) == 0 {
			return 64
		}
		return 0
	}
	verb, rest := args[0], args[1:]
	fs := NewFlags("spillway persistent "+verb, persistentUsage, stderr)
	var conn Connection
	conn.Flags(fs, true)
	capacity := fs.String("capacity", "", "create: the capacity, e.g. 200GiB")
	pool := fs.String("pool", "", "create: the pool (default: the controller's default pool)")
	access := fs.String("access", "striped", "create: access mode: striped or loadbalance (private is per job only)")
	strategy := fs.String("optimization", "bandwidth", "create: optimization_strategy: bandwidth or interference")
	typ := fs.String("type", "scratch", "create: scratch or cache (a cache of --pfs DIR)")
	pfs := fs.String("pfs", "", "create: with --type cache, the PFS directory cached (absolute)")
	expiration := fs.String("expiration", "", "create: when it expires: a lifetime (72h, 30d), a time (2026-12-31T18:00:00, local) or never; default: the site's (controller.persistent_expiration)")
	hurry := fs.Bool("hurry", false, "destroy: do not wait for stage-outs")
	asJSON := fs.Bool("json", false, "list: print JSON")
	if code, ok := ParseInterspersed(fs, rest, stdout); !ok {
		return code
	}
	positional := fs.Args()
	sess, err := conn.Connect(false, QuietLogger(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "spillway persistent: %v\n", err)
		return 1
	}
	defer sess.Close()
	ctx := background()
	timeout := sess.cfg.Client.StepTimeout.D()
	switch verb {
	case "create":
		if len(positional) != 1 || *capacity == "" {
			fmt.Fprintln(stderr, "spillway persistent create: give one NAME and --capacity SIZE")
			return 64
		}
		size, err := units.ParseSize(*capacity)
		if err != nil || size == 0 {
			fmt.Fprintf(stderr, "spillway persistent create: --capacity %q: %v\n", *capacity, orZero(err))
			return 64
		}
		expires, err := parseExpiration(*expiration, time.Now())
		if err != nil {
			fmt.Fprintf(stderr, "spillway persistent create: %v\n", err)
			return 64
		}
		req := lifecycle.Setup{Token: positional[0], Creator: "CLI", Owner: uint32(os.Getuid()), Group: uint32(os.Getgid()), Persistent: true,
			Expiration: expires,
			Instance:   &lifecycle.InstanceRequest{Capacity: size, Pool: *pool, Type: *typ, AccessModes: strings.Split(*access, ","), Strategy: *strategy}}
		for i, m := range req.Instance.AccessModes {
			if m == "ldbalance" || m == "ldbal" { // DataWarp's spellings of loadbalance
				req.Instance.AccessModes[i] = "loadbalance"
			}
		}
		if *typ == "cache" || *pfs != "" {
			req.Instance.Cache = &lifecycle.CacheRequest{PFS: *pfs}
		}
		if err := sess.client.Setup(ctx, req); err != nil {
			fmt.Fprintf(stderr, "spillway persistent create: %v\n", err)
			return 1
		}
		st, err := sess.client.WaitStep(ctx, req.Token, lifecycle.PhaseSetup, timeout)
		if err == nil && st.Failed {
			err = fmt.Errorf("%s", st.Message)
		}
		if err != nil {
			fmt.Fprintf(stderr, "spillway persistent create: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "created persistent instance %s\n", req.Token)
		return 0
	case "destroy":
		if len(positional) != 1 {
			fmt.Fprintln(stderr, "spillway persistent destroy: give one NAME")
			return 64
		}
		if err := sess.client.Teardown(ctx, positional[0], *hurry); err != nil {
			if apiclient.IsNotFound(err) {
				err = fmt.Errorf("no persistent instance named %s", positional[0])
			}
			fmt.Fprintf(stderr, "spillway persistent destroy: %v\n", err)
			return 1
		}
		st, err := sess.client.WaitStep(ctx, positional[0], lifecycle.PhaseTeardown, timeout)
		if err == nil && st.Failed {
			err = fmt.Errorf("%s", st.Message)
		}
		if err != nil {
			fmt.Fprintf(stderr, "spillway persistent destroy: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "destroyed persistent instance %s\n", positional[0])
		return 0
	case "list":
		all, err := sess.client.All(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "spillway persistent list: %v\n", err)
			return 1
		}
		type row struct {
			Name     string   `json:"name"`
			Owner    uint32   `json:"owner"`
			Capacity uint64   `json:"capacity"`
			Pool     string   `json:"pool"`
			Created  string   `json:"created"`
			State    string   `json:"state"`
			UsedBy   []string `json:"used_by"`
			// Expiration: seconds since the epoch, 0 = never; Expired: past it (destroyed once
			// no job uses it).
			Expiration int64 `json:"expiration"`
			Expired    bool  `json:"expired"`
		}
		var rows []row
		for _, s := range all.Sessions {
			if !s.Persistent {
				continue
			}
			r := row{Name: s.Token, Owner: s.Owner, Created: time.Unix(s.Created, 0).Format("2006-01-02T15:04:05"), State: s.State.Flags(), UsedBy: []string{},
				Expiration: s.Expiration, Expired: s.Expired}
			for _, i := range all.Instances {
				if i.Links.Session == s.ID {
					r.Capacity, r.Pool = i.Capacity.Bytes, i.Pool
				}
			}
			for _, other := range all.Sessions {
				for _, u := range other.Uses {
					if u == s.Token {
						r.UsedBy = append(r.UsedBy, other.Token)
					}
				}
			}
			rows = append(rows, r)
		}
		sort.Slice(rows, func(i, j int) bool { return rows[i].Name < rows[j].Name })
		if *asJSON {
			if rows == nil {
				rows = []row{}
			}
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			enc.Encode(map[string]any{"persistent": rows})
			return 0
		}
		if len(rows) == 0 {
			fmt.Fprintln(stdout, "no persistent instances")
			return 0
		}
		fmt.Fprintf(stdout, "%-20s %6s %10s %-12s %-19s %-19s %-5s %s\n", "name", "owner", "capacity", "pool", "created", "expiration", "state", "used_by")
		for _, r := range rows {
			exp := "never"
			if r.Expiration != 0 {
				exp = time.Unix(r.Expiration, 0).Format("2006-01-02T15:04:05")
			}
			if r.Expired {
				exp = "expired"
			}
			fmt.Fprintf(stdout, "%-20s %6d %10s %-12s %-19s %-19s %-5s %s\n", r.Name, r.Owner, units.FormatHuman(r.Capacity), r.Pool, r.Created, exp, r.State, strings.Join(r.UsedBy, ","))
		}
		return 0
	}
	fmt.Fprintf(stderr, "spillway persistent: unknown verb %q\n\n%s", verb, persistentUsage)
	return 64
}

// parseExpiration reads --expiration: "" (the site's default: 0), "never"
// (lifecycle.ExpirationNever), a lifetime from now ("72h", "30d"), or a local time
// ("2026-12-31T18:00:00", as dwstat prints it; RFC 3339 too), or seconds since the epoch
// (DataWarp's dwcli create session --expiration). It returns seconds since the epoch.
func parseExpiration(s string, now time.Time) (int64, error) {
	switch s {
	case "":
		return 0, nil
	case "never":
		return lifecycle.ExpirationNever, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n > 0 {
			return now.Add(time.Duration(n) * 24 * time.Hour).Unix(), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(d).Unix(), nil
	}
	if t, err := time.ParseInLocation("2006-01-02T15:04:05", s, time.Local); err == nil {
		return t.Unix(), nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > 0 {
		return n, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t.Unix(), nil
	}
	return 0, fmt.Errorf("--expiration %q: give a lifetime (72h, 30d), a local time (2026-12-31T18:00:00) or never", s)
}

func orZero(err error) error {
	if err == nil {
		return fmt.Errorf("must be greater than 0")
	}
	return err
}
