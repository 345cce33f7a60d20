package embedded

import (
	"slices"
	"testing"
)

// TestHomeAllowsAnyPFS: a one-machine home runs as its user, whose own permissions decide
// (checked as the user at setup): its [cache] allowed_pfs is "/", while a system install
// allows nothing until the administrator lists directories.
func TestHomeAllowsAnyPFS(t *testing.T) {
	if got := Defaults(t.TempDir()).Cache.AllowedPFS; !slices.Equal(got, []string{"/"}) {
		t.Fatalf("home allowed_pfs = %v", got)
	}
}
