package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// dwConfigFormat names the document of dwcli config backup.
const dwConfigFormat = "spillway-dwcli-config"

type dwConfig struct {
	Format        string         `json:"format"`
	FormatVersion int            `json:"format_version"`
	Pools         []dwConfigPool `json:"pools"`
	Nodes         []dwConfigNode `json:"nodes"`
}

type dwConfigPool struct {
	ID          string `json:"id"`
	Granularity uint64 `json:"granularity"`
}

type dwConfigNode struct {
	ID     string `json:"id"`
	Pool   string `json:"pool,omitempty"`
	Drain  bool   `json:"drain"`
	Reason string `json:"reason,omitempty"`
}

func dwcliConfigMain(args []string, stdout, stderr io.Writer) int {
	fs := NewFlags("dwcli config", dwcliShort, stderr)
	fs.Usage = func() {
		if fs.Output() == stdout {
			fmt.Fprint(stdout, dwcliManual("config"))
			return
		}
		fmt.Fprint(stderr, dwcliShort)
	}
	var conn Connection
	conn.Flags(fs, true)
	out := fs.String("o", "", "config backup: write to FILE instead of stdout")
	asJSON := fs.Bool("json", false, "print JSON")
	if code, ok := ParseInterspersed(fs, args, stdout); !ok {
		return code
	}
	words := fs.Args()
	mistake := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "dwcli: "+format+"\n", a...)
		fmt.Fprint(stderr, dwcliShort)
		return 64
	}
	switch {
	case len(words) == 0:
		return mistake("config what? give backup [-o FILE] or restore FILE")
	case words[0] == "backup" && len(words) == 1:
	case words[0] == "restore" && len(words) == 2 && *out == "":
	case words[0] == "backup" || words[0] == "restore":
		return mistake("config backup takes no argument but -o FILE; config restore takes FILE")
	default:
		return mistake("unknown command %q after config: expected backup or restore", words[0])
	}
	conn.lookOnly = words[0] == "backup"
	sess, err := conn.Connect(false, QuietLogger(stderr))
	if err != nil {
		fmt.Fprintf(stderr, "dwcli: %v\n", err)
		return 1
	}
	defer sess.Close()
	ctx := background()
	fail := dwcliRefusal(stdout, stderr, *asJSON, "config "+words[0])
	all, err := sess.client.All(ctx)
	if err != nil {
		return fail(err)
	}
	if words[0] == "backup" {
		doc := dwConfig{Format: dwConfigFormat, FormatVersion: 1, Pools: []dwConfigPool{}, Nodes: []dwConfigNode{}}
		for _, p := range all.Pools {
			doc.Pools = append(doc.Pools, dwConfigPool{ID: p.ID, Granularity: p.Granularity})
		}
		for _, n := range all.Nodes {
			if n.Pool == "" {
				continue // a compute-only node has nothing to configure
			}
			node := dwConfigNode{ID: n.ID, Pool: n.Pool, Drain: n.Drain}
			if n.Drain {
				node.Reason = n.Reason
			}
			doc.Nodes = append(doc.Nodes, node)
		}
		raw, _ := json.MarshalIndent(doc, "", "  ")
		raw = append(raw, '\n')
		if *out == "" || *out == "-" {
			stdout.Write(raw)
			return 0
		}
		if err := WriteFileAtomic(*out, raw); err != nil {
			return fail(err)
		}
		return 0
	}
	raw, err := os.ReadFile(words[1])
	if err != nil {
		return fail(err)
	}
	var doc dwConfig
	if err := json.Unmarshal(raw, &doc); err != nil || doc.Format != dwConfigFormat {
		return fail(fmt.Errorf("%s is not a dwcli config backup (format %q, %v)", words[1], doc.Format, err))
	}
	done := map[string][]string{"pools": {}, "drained": {}, "filled": {}, "skipped": {}}
	for _, p := range doc.Pools {
		if err := sess.client.CreatePool(ctx, p.ID, p.Granularity); err != nil {
			return fail(fmt.Errorf("pool %s: %w", p.ID, err))
		}
		done["pools"] = append(done["pools"], p.ID)
		if !*asJSON {
			fmt.Fprintf(stdout, "pool %s: granularity %d\n", p.ID, p.Granularity)
		}
	}
	known := map[string]bool{}
	for _, n := range all.Nodes {
		known[n.ID] = true
	}
	for _, n := range doc.Nodes {
		if !known[n.ID] {
			done["skipped"] = append(done["skipped"], n.ID)
			if !*asJSON {
				fmt.Fprintf(stdout, "node %s: not registered (its agent has not started): skipped\n", n.ID)
			}
			continue
		}
		if err := sess.client.SetDrain(ctx, n.ID, n.Drain, n.Reason); err != nil {
			return fail(fmt.Errorf("node %s: %w", n.ID, err))
		}
		state := "filled"
		if n.Drain {
			state = "drained"
		}
		done[state] = append(done[state], n.ID)
		if !*asJSON {
			fmt.Fprintf(stdout, "node %s: %s\n", n.ID, map[string]string{"drained": "drain", "filled": "fill"}[state])
		}
	}
	if *asJSON {
		writeJSON(stdout, done)
	}
	return 0
}
