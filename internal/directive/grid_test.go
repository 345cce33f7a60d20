package directive

import (
	"strings"
	"testing"
)

// TestOptionGrid tries every type × access mode × suboption set × extra option, checks the
// fuzz properties on each, and that exactly the combinations DataWarp allows are accepted.
func TestOptionGrid(t *testing.T) {
	types := []string{"", "type=scratch", "type=cache pfs=/lustre/p"}
	modes := []string{"", "striped", "private", "striped,private", "private,striped", "loadbalance", "ldbalance", "ldbal", "loadbalance,private"}
	subs := []string{"", "(MFS=1GiB)", "(MFC=10)", "(client_cache)", "(client_cache=no,MFS=0)", "(MFS=2TB,MFC=0,client_cache=yes)"}
	extras := []string{"", "max_mds=yes", "max_mds=no", "optimization_strategy=interference", "write_window_length=60 write_window_multiplier=2",
		"modified_threshold=1MiB", "read_ahead=0", "sync_on_close=true", "sync_to_pfs=no", "pool=p1"}
	accepted := 0
	for _, typ := range types {
		for _, mode := range modes {
			for _, sub := range subs {
				if mode == "" && sub != "" {
					continue
				}
				for _, extra := range extras {
					parts := []string{"#DW jobdw capacity=1TiB"}
					if typ != "" {
						parts = append(parts, typ)
					}
					if mode != "" {
						parts = append(parts, "access_mode="+mode+sub)
					}
					if extra != "" {
						parts = append(parts, extra)
					}
					src := strings.Join(parts, " ") + "\n"
					checkProperties(t, []byte(src))
					_, err := Parse([]byte(src))
					cache := strings.Contains(typ, "cache")
					want := !strings.Contains(mode, "loadbalance,") && // loadbalance combines with nothing
						!(cache && strings.Contains(mode, "private")) && // cache: striped or loadbalance
						!(cache && extra == "max_mds=yes") && // a cache keeps metadata on the PFS
						!(!cache && (strings.HasPrefix(extra, "modified_threshold") || strings.HasPrefix(extra, "read_ahead") || strings.HasPrefix(extra, "sync_"))) &&
						!(!cache && extra == "max_mds=yes" && (mode == "private" || strings.HasPrefix(mode, "l")))
					if (err == nil) != want {
						t.Errorf("%q: accepted=%v, want %v (%v)", src, err == nil, want, err)
					}
					if err == nil {
						accepted++
					}
				}
			}
		}
	}
	if accepted < 100 {
		t.Errorf("only %d combinations accepted; the grid is not testing much", accepted)
	}
}
