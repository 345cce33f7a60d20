// Package engines opens the store engine the configuration chooses ([store] engine).
package engines

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/etcd"
	"github.com/spillway-hpc/spillway/internal/store/sqlite"
)

// SQLitePath is the state database of the sqlite engine.
func SQLitePath(cfg *config.Config) string {
	return filepath.Join(cfg.Controller.StateDir, "state.db")
}

// Describe names where the state is, for logs and messages.
func Describe(cfg *config.Config) string {
	if cfg.Store.Engine == "etcd" {
		return fmt.Sprintf("etcd %s prefix %s", strings.Join(cfg.Store.EtcdEndpoints, ","), cfg.Store.EtcdPrefix)
	}
	return "sqlite " + SQLitePath(cfg)
}

// Open opens the engine for reading and writing: the controller's, or a restore's. The
// sqlite engine is held by one process at a time.
func Open(ctx context.Context, cfg *config.Config) (store.Engine, error) {
	if cfg.Store.Engine == "etcd" {
		return openEtcd(ctx, cfg)
	}
	e, err := sqlite.Open(SQLitePath(cfg))
	if err != nil {
		return nil, err
	}
	e.YieldToRequests(cfg.Executor.YieldToRequests)
	return e, nil
}

// OpenReader opens the engine to read it beside a running controller (a backup): the sqlite
// engine's file read-only, without its lock.
func OpenReader(ctx context.Context, cfg *config.Config) (store.Engine, error) {
	if cfg.Store.Engine == "etcd" {
		return openEtcd(ctx, cfg)
	}
	return sqlite.OpenReadOnly(SQLitePath(cfg))
}

// OpenState opens the engine for the controller and brings its state to the current schema
// version (in one transaction), logging an upgrade.
func OpenState(ctx context.Context, cfg *config.Config, log *slog.Logger) (*store.Store, error) {
	eng, err := Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	st := store.New(eng)
	from, err := store.Upgrade(ctx, st)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("state (%s): %w", Describe(cfg), err)
	}
	if from != 0 && from != store.SchemaVersion {
		log.Info("state upgraded", "state", Describe(cfg), "from_schema_version", from, "to_schema_version", store.SchemaVersion)
	}
	return st, nil
}

func openEtcd(ctx context.Context, cfg *config.Config) (*etcd.Engine, error) {
	s := cfg.Store
	o := etcd.Options{
		Endpoints: s.EtcdEndpoints, Prefix: s.EtcdPrefix,
		DialTimeout: s.EtcdDialTimeout.D(), RequestTimeout: s.EtcdRequestTimeout.D(),
		TxnRetries: s.EtcdTxnRetries, MaxTxnOps: s.EtcdMaxTxnOps, MaxRequestBytes: int(s.EtcdMaxRequestBytes),
		Username: s.EtcdUsername,
	}
	if s.EtcdPasswordFile != "" {
		pw, err := os.ReadFile(s.EtcdPasswordFile)
		if err != nil {
			return nil, fmt.Errorf("store.etcd_password_file: %w", err)
		}
		o.Password = strings.TrimRight(string(pw), "\r\n")
	}
	if s.EtcdCAFile != "" || s.EtcdCertFile != "" {
		t := &tls.Config{MinVersion: tls.VersionTLS12}
		if s.EtcdCAFile != "" {
			pem, err := os.ReadFile(s.EtcdCAFile)
			if err != nil {
				return nil, fmt.Errorf("store.etcd_ca_file: %w", err)
			}
			t.RootCAs = x509.NewCertPool()
			if !t.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("store.etcd_ca_file %s: no PEM certificate in it", s.EtcdCAFile)
			}
		}
		if s.EtcdCertFile != "" {
			cert, err := tls.LoadX509KeyPair(s.EtcdCertFile, s.EtcdKeyFile)
			if err != nil {
				return nil, fmt.Errorf("store.etcd_cert_file, store.etcd_key_file: %w", err)
			}
			t.Certificates = []tls.Certificate{cert}
		}
		o.TLS = t
	}
	return etcd.Open(ctx, o)
}
