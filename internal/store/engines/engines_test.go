package engines

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/model"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/etcd/etcdtest"
)

var (
	ctx   = context.Background()
	quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
)

// v1Fixture is a state database written by Spillway at commit 5dcccc3, before the state had
// a schema version: a persistent instance proj1 (session, instance, fragment, configuration,
// namespace, its token's index entry) and the traces of one finished `spillway run` job
// (testdata/README.md says how it was made).
const v1Fixture = "testdata/state-v1.db"

func sqliteConfig(t *testing.T) config.Config {
	cfg := config.Defaults()
	cfg.Controller.StateDir = t.TempDir()
	return cfg
}

func etcdConfig(endpoint, prefix string) config.Config {
	cfg := config.Defaults()
	cfg.Store.Engine = "etcd"
	cfg.Store.EtcdEndpoints = []string{endpoint}
	cfg.Store.EtcdPrefix = prefix
	return cfg
}

// copyFixture puts the version 1 database where cfg's sqlite engine looks.
func copyFixture(t *testing.T, cfg *config.Config) {
	raw, err := os.ReadFile(v1Fixture)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(SQLitePath(cfg), raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// checkUpgradedFixture: what the old version wrote reads with this one.
func checkUpgradedFixture(t *testing.T, st *store.Store) {
	t.Helper()
	err := st.Update(ctx, func(tx *store.Tx) error {
		s, err := store.SessionByToken(tx, "proj1")
		if err != nil {
			return fmt.Errorf("the persistent instance's session by its token: %w", err)
		}
		insts, err := store.Instances.Filter(tx, func(i *model.Instance) bool { return i.SessionID == s.ID })
		if err != nil || len(insts) != 1 || insts[0].Capacity != 1<<30 {
			return fmt.Errorf("its instance: %v %v", insts, err)
		}
		p, err := store.Pools.Get(tx, "wlm_pool")
		if err != nil || p.Granularity != 1<<30 {
			return fmt.Errorf("pool: %+v %v", p, err)
		}
		if _, err := store.Meta.Get(tx, "cluster_id"); err != nil {
			return err
		}
		v, err := store.Meta.Get(tx, "schema_version")
		if err != nil || v.Value != fmt.Sprint(store.SchemaVersion) {
			return fmt.Errorf("schema version after the upgrade: %+v %v", v, err)
		}
		// Sequences go on where the old version left them: no id is handed out twice.
		id, err := store.Sessions.NewID(tx)
		if err != nil || id != 3 {
			return fmt.Errorf("next session id = %d %v, want 3", id, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestUpgradeFromVersion1: the controller's start upgrades a database an older Spillway wrote,
// in one transaction, and the state reads as before.
func TestUpgradeFromVersion1(t *testing.T) {
	cfg := sqliteConfig(t)
	copyFixture(t, &cfg)
	st, err := OpenState(ctx, &cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	checkUpgradedFixture(t, st)
	// The index entry is JSON now.
	b, err := store.TakeBackup(ctx, st.Engine())
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Kinds["session_token"]; len(got) != 1 || string(got[0].Value) != `{"session":1}` {
		t.Fatalf("session_token after the upgrade: %+v", got)
	}
}

// TestNewerSchemaIsRefused: a state written by a newer Spillway is not touched.
func TestNewerSchemaIsRefused(t *testing.T) {
	cfg := sqliteConfig(t)
	st, err := OpenState(ctx, &cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Update(ctx, func(tx *store.Tx) error {
		return store.Meta.Put(tx, &store.MetaValue{Key: "schema_version", Value: "99"})
	}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	_, err = OpenState(ctx, &cfg, quiet)
	if err == nil || !strings.Contains(err.Error(), "schema version 99, newer than this Spillway understands (2)") {
		t.Fatalf("opening a version 99 state: %v, want a refusal naming both versions", err)
	}
}

// TestBackupRestoreAcrossEngines: a backup of the old SQLite database, taken while another
// process holds it (online), restores into etcd upgraded; the result is the same state as the
// SQLite database upgraded in place. A restore into a state that is not empty is refused
// unless forced, and a restore cut short leaves a state no controller starts on.
func TestBackupRestoreAcrossEngines(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	src := sqliteConfig(t)
	copyFixture(t, &src)
	holder, err := Open(ctx, &src) // the running controller's handle, with the lock
	if err != nil {
		t.Fatal(err)
	}
	reader, err := OpenReader(ctx, &src)
	if err != nil {
		t.Fatal(err)
	}
	b, err := store.TakeBackup(ctx, reader)
	reader.Close()
	if err != nil {
		t.Fatal(err)
	}
	if b.SchemaVersion != 1 || b.ClusterID == "" || b.Sequences["session"] != 2 || len(b.Kinds["pool"]) != 1 {
		t.Fatalf("backup of the version 1 database: schema %d, cluster %q, sequences %v, kinds %v", b.SchemaVersion, b.ClusterID, b.Sequences, len(b.Kinds))
	}
	doc, err := json.MarshalIndent(b, "", "  ") // as spillway admin backup writes it
	if err != nil {
		t.Fatal(err)
	}
	back, err := store.ReadBackup(doc)
	if err != nil {
		t.Fatal(err)
	}
	dst := etcdConfig(srv.Endpoint, "/spillway/restored/")
	target, err := Open(ctx, &dst)
	if err != nil {
		t.Fatal(err)
	}
	opts := store.RestoreOptions{Batch: 3, MaxBatchBytes: int(dst.Store.EtcdMaxRequestBytes) / 2}
	if err := store.Restore(ctx, target, back, opts); err != nil {
		t.Fatal(err)
	}
	target.Close()
	st, err := OpenState(ctx, &dst, quiet)
	if err != nil {
		t.Fatal(err)
	}
	etcdAfter, err := store.TakeBackup(ctx, st.Engine())
	if err != nil {
		t.Fatal(err)
	}
	checkUpgradedFixture(t, st)
	st.Close()

	// The same database upgraded in place holds the same state.
	holder.Close()
	sq, err := OpenState(ctx, &src, quiet)
	if err != nil {
		t.Fatal(err)
	}
	sqliteAfter, err := store.TakeBackup(ctx, sq.Engine())
	if err != nil {
		t.Fatal(err)
	}
	sq.Close()
	if !reflect.DeepEqual(etcdAfter.Kinds, sqliteAfter.Kinds) || etcdAfter.ClusterID != sqliteAfter.ClusterID {
		t.Fatalf("restored into etcd and upgraded:\n%s\nupgraded in SQLite:\n%s", mustJSON(etcdAfter.Kinds), mustJSON(sqliteAfter.Kinds))
	}

	// Not into a state that is not empty, unless forced.
	target, err = Open(ctx, &dst)
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	err = store.Restore(ctx, target, back, opts)
	if !errors.Is(err, store.ErrNotEmpty) || !strings.Contains(err.Error(), "--force") || !strings.Contains(err.Error(), b.ClusterID) {
		t.Fatalf("restore into a state: %v, want ErrNotEmpty naming --force and the cluster id", err)
	}
	// Forced, it replaces everything: a key only the old state had is gone.
	if err := target.Update(ctx, func(kv store.KV) error { return kv.Put("stray", "x", []byte("{}")) }); err != nil {
		t.Fatal(err)
	}
	opts.Force = true
	if err := store.Restore(ctx, target, back, opts); err != nil {
		t.Fatal(err)
	}
	forced, err := store.TakeBackup(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	// The version 1 backup gains its schema version on the way in.
	if _, ok := forced.Kinds["stray"]; ok || forced.Count() != b.Count()+1 {
		t.Fatalf("forced restore: %d keys (stray kept: %v), want the backup's %d and the schema version", forced.Count(), ok, b.Count())
	}

	// A restore cut short (its mark left in the state) stops the controller from starting.
	if err := target.Update(ctx, func(kv store.KV) error {
		return kv.Put("meta", "restore_incomplete", []byte(`{"key":"restore_incomplete","value":"now"}`))
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenState(ctx, &dst, quiet); !errors.Is(err, store.ErrRestoreIncomplete) || !strings.Contains(err.Error(), "spillway admin restore") {
		t.Fatalf("controller start on an incomplete restore: %v, want ErrRestoreIncomplete saying what to run", err)
	}
}

// TestRestoreIntoSQLite: the way back, etcd to SQLite, and a whole transaction per batch
// bounded by restore_batch.
func TestRestoreIntoSQLite(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	src := etcdConfig(srv.Endpoint, "/spillway/a/")
	st, err := OpenState(ctx, &src, quiet)
	if err != nil {
		t.Fatal(err)
	}
	// More keys than one etcd transaction holds, written over several.
	for i := 0; i < 3; i++ {
		if err := st.Update(ctx, func(tx *store.Tx) error {
			for j := 0; j < 100; j++ {
				id, err := store.Stages.NewID(tx)
				if err != nil {
					return err
				}
				if err := store.Stages.Put(tx, &model.Stage{ID: id}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	b, err := store.TakeBackup(ctx, st.Engine())
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	dst := sqliteConfig(t)
	target, err := Open(ctx, &dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Restore(ctx, target, b, store.RestoreOptions{Batch: dst.Store.RestoreBatch, MaxBatchBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	got, err := store.TakeBackup(ctx, target)
	target.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Kinds, b.Kinds) || !reflect.DeepEqual(got.Sequences, b.Sequences) || got.Sequences["stage"] != 300 {
		t.Fatalf("restored into SQLite: %d keys, sequences %v; want %d keys, %v", got.Count(), got.Sequences, b.Count(), b.Sequences)
	}
}

func mustJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", " ")
	return string(b)
}

// TestEtcdTLSAndAuth: the controller's configuration reaches an etcd that serves TLS, requires
// a client certificate and has its authentication on, with the files the keys name; without
// the certificate, or with a wrong password, Open fails and says which keys to look at.
func TestEtcdTLSAndAuth(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{TLS: true})
	srv.EnableAuth(t, "spillway", "s3cret", "/spillway/")
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "password")
	os.WriteFile(pwFile, []byte("s3cret\n"), 0o600)
	cfg := etcdConfig(srv.Endpoint, "/spillway/")
	cfg.Store.EtcdCAFile, cfg.Store.EtcdCertFile, cfg.Store.EtcdKeyFile = srv.CAFile, srv.CertFile, srv.KeyFile
	cfg.Store.EtcdUsername, cfg.Store.EtcdPasswordFile = "spillway", pwFile
	cfg.Store.EtcdDialTimeout = config.Duration(2 * time.Second)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	st, err := OpenState(ctx, &cfg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Update(ctx, func(tx *store.Tx) error {
		return store.Pools.Put(tx, &model.Pool{Name: "wlm_pool", Granularity: 1 << 30})
	}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	// Outside its prefix the user may not write: the role etcd gives it holds.
	other := cfg
	other.Store.EtcdPrefix = "/other/"
	if _, err := OpenState(ctx, &other, quiet); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("a prefix the user has no permission on: %v, want etcd's permission denied", err)
	}
	wrong := cfg
	os.WriteFile(filepath.Join(dir, "wrong"), []byte("nope\n"), 0o600)
	wrong.Store.EtcdPasswordFile = filepath.Join(dir, "wrong")
	if _, err := Open(ctx, &wrong); err == nil || !strings.Contains(err.Error(), "store.etcd_username") {
		t.Fatalf("a wrong password: %v, want an error naming store.etcd_username", err)
	}
	noCert := cfg
	noCert.Store.EtcdCertFile, noCert.Store.EtcdKeyFile = "", ""
	if _, err := Open(ctx, &noCert); err == nil || !strings.Contains(err.Error(), "store.etcd_cert_file") {
		t.Fatalf("no client certificate: %v, want an error naming store.etcd_cert_file", err)
	}
}
