package mount

import (
	"os"
	"path/filepath"
	"testing"
)

// The directories a mount path needs are made 0711: a user reaches their own mount by its
// path but cannot list the others' (their names hold other users' job tokens).
func TestMountParentsCannotBeListed(t *testing.T) {
	root := filepath.Join(t.TempDir(), "mounts", "batch")
	if _, err := canonicalMountPath(filepath.Join(root, "77_striped_scratch"), true); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{root, filepath.Dir(root)} {
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o711 {
			t.Errorf("%s is mode %o, want 0711", dir, got)
		}
	}
}
