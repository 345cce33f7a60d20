package spillwaycli

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestStageWorkerCommand: the small worker beside the binary is used only when no one but
// the binary's owner (or root) could have put it there; otherwise `exe stage-worker`.
func TestStageWorkerCommand(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "spillway")
	if err := os.WriteFile(exe, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	small := filepath.Join(dir, StageWorkerName)
	fallback := []string{exe, "stage-worker"}
	check := func(what string, want []string) {
		t.Helper()
		if got := StageWorkerCommand(exe); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %q, want %q", what, got, want)
		}
	}
	check("none beside", fallback)
	if err := os.WriteFile(small, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	check("a fit one", []string{small})
	for _, mode := range []os.FileMode{0o775, 0o757, 0o644} {
		if err := os.Chmod(small, mode); err != nil {
			t.Fatal(err)
		}
		check("mode "+mode.String(), fallback)
	}
	os.Remove(small)
	other := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(other, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, small); err != nil {
		t.Fatal(err)
	}
	check("a link", fallback)
	os.Remove(small)
	if os.Getuid() == 0 {
		if err := os.WriteFile(small, []byte("x"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(exe, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		check("root's beside another's binary", []string{small})
		if err := os.Chown(small, 12345, 12345); err != nil {
			t.Fatal(err)
		}
		check("a third user's", fallback)
	}
}
