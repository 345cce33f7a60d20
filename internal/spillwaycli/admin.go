package spillwaycli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spillway-hpc/spillway/internal/cli"
	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/engines"
)

const adminUsage = `Usage: spillway admin backup [--config FILE] [-o FILE]
       spillway admin restore [--config FILE] [--force] FILE

backup writes the controller's whole state — every kind of object and every sequence, read in
one transaction — as one JSON document (format spillway-state-backup, with the state's schema
version and cluster id) to stdout or FILE. It reads the state store the configuration names
([store]) directly, while the controller runs.

restore writes a backup into the configured store, upgraded to this Spillway's schema version:
from either engine into either engine (a SQLite backup into etcd, for one). It refuses a store
that is not empty; --force deletes that state first. Stop the controller before a restore (the
SQLite engine refuses while it runs); start it when the restore has finished. FILE "-" reads
stdin.

Both need read (backup) or write (restore) access to the state: run them as root on the
controller's host. See docs/admin.md.
`

func adminMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "backup" && args[0] != "restore") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			fmt.Fprint(stdout, adminUsage)
			return 0
		}
		fmt.Fprint(stderr, adminUsage)
		return 64
	}
	verb := args[0]
	fs := cli.NewFlags("spillway admin "+verb, adminUsage, stderr)
	cfgPath := fs.String("config", "", "configuration file (default $SPILLWAY_CONFIG, else "+config.DefaultPath+")")
	out := fs.String("o", "", "backup: write to FILE instead of stdout")
	force := fs.Bool("force", false, "restore: replace a state that is not empty")
	if code, ok := cli.Parse(fs, args[1:], stdout); !ok {
		return code
	}
	cfg, _, err := cli.LoadSystemConfig(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "spillway admin: %v\n", err)
		return 78
	}
	ctx, stop := signalContext()
	defer stop()
	if verb == "backup" {
		if fs.NArg() != 0 {
			fs.Usage()
			return 64
		}
		return adminBackup(ctx, &cfg, *out, stdout, stderr)
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "spillway admin restore: name the backup file (\"-\" for stdin)")
		return 64
	}
	return adminRestore(ctx, &cfg, fs.Arg(0), *force, stdout, stderr)
}

func adminBackup(ctx context.Context, cfg *config.Config, out string, stdout, stderr io.Writer) int {
	eng, err := engines.OpenReader(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "spillway admin backup: %v\n", err)
		return 1
	}
	defer eng.Close()
	b, err := store.TakeBackup(ctx, eng)
	if err != nil {
		fmt.Fprintf(stderr, "spillway admin backup: %s: %v\n", engines.Describe(cfg), err)
		return 1
	}
	b.SpillwayVersion = cli.Version
	b.Engine = cfg.Store.Engine
	doc, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		fmt.Fprintf(stderr, "spillway admin backup: %v\n", err)
		return 1
	}
	doc = append(doc, '\n')
	if out == "" || out == "-" {
		if _, err := stdout.Write(doc); err != nil {
			fmt.Fprintf(stderr, "spillway admin backup: %v\n", err)
			return 1
		}
	} else if err := writePrivateFile(out, doc); err != nil {
		fmt.Fprintf(stderr, "spillway admin backup: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "spillway admin backup: %d keys in %d kinds, %d sequences (schema version %d, cluster id %s) from %s\n",
		b.Count(), len(b.Kinds), len(b.Sequences), b.SchemaVersion, b.ClusterID, engines.Describe(cfg))
	return 0
}

// writePrivateFile writes a file readable by its owner only (the state names every user's
// sessions) under a temporary name, then renames it: a failed backup leaves no half file.
func writePrivateFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func adminRestore(ctx context.Context, cfg *config.Config, file string, force bool, stdout, stderr io.Writer) int {
	var raw []byte
	var err error
	if file == "-" {
		raw, err = io.ReadAll(os.Stdin)
	} else {
		raw, err = os.ReadFile(file)
	}
	if err != nil {
		fmt.Fprintf(stderr, "spillway admin restore: %v\n", err)
		return 1
	}
	b, err := store.ReadBackup(raw)
	if err != nil {
		fmt.Fprintf(stderr, "spillway admin restore: %s: %v\n", file, err)
		return 1
	}
	eng, err := engines.Open(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "spillway admin restore: %v\n", err)
		return 1
	}
	defer eng.Close()
	opts := store.RestoreOptions{Force: force, Batch: cfg.Store.RestoreBatch, MaxBatchBytes: int(cfg.Store.EtcdMaxRequestBytes) / 2}
	if err := store.Restore(ctx, eng, b, opts); err != nil {
		fmt.Fprintf(stderr, "spillway admin restore: %s: %v\n", engines.Describe(cfg), err)
		return 1
	}
	fmt.Fprintf(stdout, "restored %d keys in %d kinds, %d sequences (cluster id %s, schema version %d, now %d) into %s\n",
		b.Count(), len(b.Kinds), len(b.Sequences), b.ClusterID, b.SchemaVersion, store.SchemaVersion, engines.Describe(cfg))
	return 0
}
