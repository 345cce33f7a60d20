package sqlite

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, dir string) store.Engine {
		e, err := Open(filepath.Join(dir, "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}

func TestSecondOpenIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	first, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := Open(path); err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("second open: %v, want a clear in-use error", err)
	}
}

// TestOlderLayoutIsBroughtUp: a database of layout 1 opens and is marked with the current
// layout, which Spillway versions before it refuse (they would misread a state of schema 2).
func TestOlderLayoutIsBroughtUp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	e, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Exec(`UPDATE meta SET value = '1' WHERE key = 'schema_version'`); err != nil {
		t.Fatal(err)
	}
	e.Close()
	if e, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var v string
	if err := e.db.QueryRow(`SELECT value FROM meta WHERE key = 'schema_version'`).Scan(&v); err != nil || v != "2" {
		t.Fatalf("layout after opening a layout 1 database: %q %v, want 2", v, err)
	}
}

// SQLite reads a child index with its records in one query.
var _ store.IndexJoiner = (*kv)(nil)

// SQLite scans a kind's values without their keys (the listings).
var _ store.ValueScanner = (*kv)(nil)
