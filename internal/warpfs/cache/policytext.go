package cache

// The text form of a file's cache policy, as the user.spillway.cache.policy extended
// attribute of a cache instance's file or directory reads and sets it (libdatawarp's
// dw_get_cache_policy and dw_set_cache_policy, dwcli cache policy):
//
//	modified_threshold=8388608 read_ahead=4194304 sync_on_close=no sync_to_pfs=yes
//
// Reading gives the four settings in effect (the instance's defaults with the file's
// overrides). Setting takes any of them, space-separated: a key not given keeps its
// setting, and the value "default" goes back to the instance's.

import (
	"fmt"
	"strconv"
	"strings"
)

// PolicyXattr is the extended attribute of a cache instance's file or directory that reads
// and sets its cache policy; SyncXattr, set (to anything), waits until the file's data is on
// the PFS. Neither is stored on the PFS.
const (
	PolicyXattr = "user.spillway.cache.policy"
	SyncXattr   = "user.spillway.cache.sync"
)

// Text is p in the attribute's form.
func (p Policy) Text() string {
	return fmt.Sprintf("modified_threshold=%d read_ahead=%d sync_on_close=%s sync_to_pfs=%s",
		p.ModifiedThreshold, p.ReadAhead, yesNo(p.SyncOnClose), yesNo(p.SyncToPFS))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// Empty says whether o overrides nothing.
func (o Override) Empty() bool {
	return o.ModifiedThreshold == nil && o.ReadAhead == nil && o.SyncOnClose == nil && o.SyncToPFS == nil
}

// ParseOverride is o changed by the settings of text (the attribute's form).
func ParseOverride(text string, o Override) (Override, error) {
	fields := strings.Fields(text)
	if len(fields) == 0 {
		return o, fmt.Errorf("no setting: give modified_threshold=, read_ahead=, sync_on_close= or sync_to_pfs=")
	}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return o, fmt.Errorf("%q is not key=value", f)
		}
		def := v == "default"
		switch k {
		case "modified_threshold", "read_ahead":
			var p *uint64
			if !def {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return o, fmt.Errorf("%s=%q: not a number of bytes", k, v)
				}
				p = &n
			}
			if k == "modified_threshold" {
				o.ModifiedThreshold = p
			} else {
				o.ReadAhead = p
			}
		case "sync_on_close", "sync_to_pfs":
			var p *bool
			if !def {
				var b bool
				switch v {
				case "yes", "1", "true", "on":
					b = true
				case "no", "0", "false", "off":
				default:
					return o, fmt.Errorf("%s=%q: not yes or no", k, v)
				}
				p = &b
			}
			if k == "sync_on_close" {
				o.SyncOnClose = p
			} else {
				o.SyncToPFS = p
			}
		default:
			return o, fmt.Errorf("%q is not a cache policy setting (modified_threshold, read_ahead, sync_on_close, sync_to_pfs)", k)
		}
	}
	return o, nil
}
