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
