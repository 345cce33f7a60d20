package cli

import (
	"bytes"
	"strings"
	"testing"
)

// dwcli cache's mistakes are said before anything is asked; a path that is not a cache
// instance's answers EOPNOTSUPP (the mount's case is in tests/e2e, TestDwcliCacheSyncAndPolicy).
func TestDwcliCacheRefusals(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"cache", "policy", "--sync-on-close", "maybe", dir}, 64, `--sync-on-close "maybe": expected yes, no or default`},
		{[]string{"cache", "policy", "--read-ahead", "lots", dir}, 64, `--read-ahead "lots"`},
		{[]string{"cache", "policy", dir, dir}, 64, "policy takes one path, got 2"},
		{[]string{"cache", "sync", "--sync-to-pfs", "yes", dir}, 64, "sync takes no policy settings"},
		{[]string{"cache", "evict", dir}, 64, `unknown command "evict"`},
		{[]string{"cache", "policy", "--json", dir + "/missing"}, 2, `"errno":2`},
		{[]string{"cache", "policy", "--json", dir}, 95, "is not in a cache instance"},
		{[]string{"cache", "policy", "--json", "--sync-on-close", "yes", dir}, 95, "is not in a cache instance"},
	} {
		var out, errOut bytes.Buffer
		code := dwcliMain(c.args, &out, &errOut)
		if code != c.code || !strings.Contains(out.String()+errOut.String(), c.want) {
			t.Errorf("%v: exit %d, want %d with %q:\n%s%s", c.args, code, c.code, c.want, out.String(), errOut.String())
		}
	}
}
