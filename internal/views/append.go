package views

import (
	"strconv"
	"unicode/utf8"
)

// The Append functions write a row as encoding/json's Marshal writes it, byte for byte (the
// tests compare them on odd strings and a fuzzer), without reflection: a listing of 10,000
// instances is written in a few milliseconds instead of tens (issue 11).

// AppendTable appends {"<name>":[rows]} and a newline, as json.Encoder writes a one-key
// map: the answer of GET /dw/v1/<name>. ok is false for a table without appenders (nodes,
// stages, stage_history: small, written with encoding/json).
func AppendTable(dst []byte, name string, a All) (out []byte, ok bool) {
	dst = append(dst, `{"`...)
	dst = append(dst, name...) // a table's name: [a-z_], nothing to escape
	dst = append(dst, `":`...)
	switch name {
	case "pools":
		dst = appendRows(dst, a.Pools, AppendPool)
	case "sessions":
		dst = appendRows(dst, a.Sessions, AppendSession)
	case "instances":
		dst = appendRows(dst, a.Instances, AppendInstance)
	case "configurations":
		dst = appendRows(dst, a.Configurations, AppendConfiguration)
	case "fragments":
		dst = appendRows(dst, a.Fragments, AppendFragment)
	case "namespaces":
		dst = appendRows(dst, a.Namespaces, AppendNamespace)
	case "registrations":
		dst = appendRows(dst, a.Registrations, AppendRegistration)
	case "activations":
		dst = appendRows(dst, a.Activations, AppendActivation)
	default:
		return dst, false
	}
	return append(dst, "}\n"...), true
}

// appendRows appends a JSON array of rows; nil is null, as encoding/json writes it.
func appendRows[T any](dst []byte, rows []T, row func([]byte, *T) []byte) []byte {
	if rows == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i := range rows {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = row(dst, &rows[i])
	}
	return append(dst, ']')
}

// AppendPool appends a Pool as encoding/json writes it.
func AppendPool(dst []byte, p *Pool) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, p.ID)
	dst = append(dst, `,"units":`...)
	dst = appendString(dst, p.Units)
	dst = append(dst, `,"granularity":`...)
	dst = strconv.AppendUint(dst, p.Granularity, 10)
	dst = append(dst, `,"quantity":`...)
	dst = strconv.AppendUint(dst, p.Quantity, 10)
	dst = append(dst, `,"free":`...)
	dst = strconv.AppendUint(dst, p.Free, 10)
	return append(dst, '}')
}

// AppendSession appends a Session as encoding/json writes it.
func AppendSession(dst []byte, s *Session) []byte {
	dst = append(dst, `{"created":`...)
	dst = strconv.AppendInt(dst, s.Created, 10)
	dst = append(dst, `,"creator":`...)
	dst = appendString(dst, s.Creator)
	dst = append(dst, `,"expiration":`...)
	dst = strconv.AppendInt(dst, s.Expiration, 10)
	dst = append(dst, `,"expired":`...)
	dst = strconv.AppendBool(dst, s.Expired)
	dst = append(dst, `,"id":`...)
	dst = strconv.AppendInt(dst, s.ID, 10)
	dst = append(dst, `,"links":{"client_nodes":`...)
	dst = appendStrings(dst, s.Links.ClientNodes)
	dst = append(dst, `},"owner":`...)
	dst = strconv.AppendUint(dst, uint64(s.Owner), 10)
	dst = append(dst, `,"state":`...)
	dst = AppendState(dst, &s.State)
	dst = append(dst, `,"token":`...)
	dst = appendString(dst, s.Token)
	dst = append(dst, `,"group":`...)
	dst = strconv.AppendUint(dst, uint64(s.Group), 10)
	dst = append(dst, `,"persistent":`...)
	dst = strconv.AppendBool(dst, s.Persistent)
	dst = append(dst, `,"phase":`...)
	dst = appendString(dst, s.Phase)
	if s.Hurry {
		dst = append(dst, `,"hurry":true`...)
	}
	if s.Failure != "" {
		dst = append(dst, `,"failure":`...)
		dst = appendString(dst, s.Failure)
	}
	if len(s.Uses) > 0 {
		dst = append(dst, `,"uses":`...)
		dst = appendStrings(dst, s.Uses)
	}
	return append(dst, '}')
}

// AppendInstance appends an Instance as encoding/json writes it.
func AppendInstance(dst []byte, i *Instance) []byte {
	dst = append(dst, `{"capacity":{"bytes":`...)
	dst = strconv.AppendUint(dst, i.Capacity.Bytes, 10)
	dst = append(dst, `,"nodes":`...)
	dst = strconv.AppendInt(dst, int64(i.Capacity.Nodes), 10)
	dst = append(dst, `},"created":`...)
	dst = strconv.AppendInt(dst, i.Created, 10)
	dst = append(dst, `,"expiration":`...)
	dst = strconv.AppendInt(dst, i.Expiration, 10)
	dst = append(dst, `,"expired":`...)
	dst = strconv.AppendBool(dst, i.Expired)
	dst = append(dst, `,"id":`...)
	dst = strconv.AppendInt(dst, i.ID, 10)
	dst = append(dst, `,"intact":`...)
	dst = strconv.AppendBool(dst, i.Intact)
	dst = append(dst, `,"label":`...)
	dst = appendString(dst, i.Label)
	dst = append(dst, `,"limits":{"write_window_length":`...)
	dst = strconv.AppendInt(dst, i.Limits.WriteWindowLength, 10)
	dst = append(dst, `,"write_window_multiplier":`...)
	dst = strconv.AppendInt(dst, i.Limits.WriteWindowMultiplier, 10)
	dst = append(dst, `},"links":{"configurations":`...)
	dst = appendInts(dst, i.Links.Configurations)
	dst = append(dst, `,"session":`...)
	dst = strconv.AppendInt(dst, i.Links.Session, 10)
	dst = append(dst, `},"public":`...)
	dst = strconv.AppendBool(dst, i.Public)
	dst = append(dst, `,"state":`...)
	dst = AppendState(dst, &i.State)
	dst = append(dst, `,"pool":`...)
	dst = appendString(dst, i.Pool)
	dst = append(dst, `,"requested":`...)
	dst = strconv.AppendUint(dst, i.Requested, 10)
	dst = append(dst, `,"optimization_strategy":`...)
	dst = appendString(dst, i.Strategy)
	return append(dst, '}')
}

// AppendConfiguration appends a Configuration as encoding/json writes it.
func AppendConfiguration(dst []byte, c *Configuration) []byte {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendInt(dst, c.ID, 10)
	dst = append(dst, `,"type":`...)
	dst = appendString(dst, c.Type)
	dst = append(dst, `,"access_type":`...)
	dst = appendString(dst, c.AccessType)
	dst = append(dst, `,"access_mode":`...)
	dst = appendString(dst, c.AccessMode)
	dst = append(dst, `,"root_permissions":`...)
	dst = strconv.AppendUint(dst, uint64(c.RootPermissions), 10)
	dst = append(dst, `,"group":`...)
	dst = strconv.AppendUint(dst, uint64(c.Group), 10)
	if c.BackingPath != "" {
		dst = append(dst, `,"backing_path":`...)
		dst = appendString(dst, c.BackingPath)
	}
	if k := c.Cache; k != nil {
		dst = append(dst, `,"cache":{"pfs":`...)
		dst = appendString(dst, k.PFS)
		dst = append(dst, `,"modified_threshold":`...)
		dst = strconv.AppendUint(dst, k.ModifiedThreshold, 10)
		dst = append(dst, `,"read_ahead":`...)
		dst = strconv.AppendUint(dst, k.ReadAhead, 10)
		dst = append(dst, `,"sync_on_close":`...)
		dst = strconv.AppendBool(dst, k.SyncOnClose)
		dst = append(dst, `,"sync_to_pfs":`...)
		dst = strconv.AppendBool(dst, k.SyncToPFS)
		dst = append(dst, `,"high_watermark":`...)
		dst = strconv.AppendInt(dst, int64(k.HighWatermark), 10)
		dst = append(dst, `,"low_watermark":`...)
		dst = strconv.AppendInt(dst, int64(k.LowWatermark), 10)
		dst = append(dst, '}')
	}
	dst = append(dst, `,"activs":`...)
	dst = strconv.AppendInt(dst, int64(c.Activations), 10)
	dst = append(dst, `,"links":{"instance":`...)
	dst = strconv.AppendInt(dst, c.Links.Instance, 10)
	dst = append(dst, `},"state":`...)
	dst = AppendState(dst, &c.State)
	return append(dst, '}')
}

// AppendFragment appends a Fragment as encoding/json writes it.
func AppendFragment(dst []byte, f *Fragment) []byte {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendInt(dst, f.ID, 10)
	dst = append(dst, `,"instance":`...)
	dst = strconv.AppendInt(dst, f.Instance, 10)
	dst = append(dst, `,"capacity":`...)
	dst = strconv.AppendUint(dst, f.Capacity, 10)
	dst = append(dst, `,"node":`...)
	dst = appendString(dst, f.Node)
	dst = append(dst, `,"state":`...)
	dst = AppendState(dst, &f.State)
	if f.CacheDirty != 0 {
		dst = append(dst, `,"cache_dirty":`...)
		dst = strconv.AppendUint(dst, f.CacheDirty, 10)
	}
	if f.CacheFlushError != "" {
		dst = append(dst, `,"cache_flush_error":`...)
		dst = appendString(dst, f.CacheFlushError)
	}
	if f.CacheLost != "" {
		dst = append(dst, `,"cache_lost":`...)
		dst = appendString(dst, f.CacheLost)
	}
	return append(dst, '}')
}

// AppendNamespace appends a Namespace as encoding/json writes it.
func AppendNamespace(dst []byte, n *Namespace) []byte {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendInt(dst, n.ID, 10)
	dst = append(dst, `,"configuration":`...)
	dst = strconv.AppendInt(dst, n.Configuration, 10)
	dst = append(dst, `,"fragment":`...)
	dst = strconv.AppendInt(dst, n.Fragment, 10)
	dst = append(dst, `,"span":`...)
	dst = strconv.AppendInt(dst, int64(n.Span), 10)
	if n.ClientNode != "" {
		dst = append(dst, `,"client_node":`...)
		dst = appendString(dst, n.ClientNode)
	}
	dst = append(dst, `,"state":`...)
	dst = AppendState(dst, &n.State)
	return append(dst, '}')
}

// AppendRegistration appends a Registration as encoding/json writes it.
func AppendRegistration(dst []byte, r *Registration) []byte {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendInt(dst, r.ID, 10)
	dst = append(dst, `,"session":`...)
	dst = strconv.AppendInt(dst, r.Session, 10)
	dst = append(dst, `,"configuration":`...)
	dst = strconv.AppendInt(dst, r.Configuration, 10)
	dst = append(dst, `,"wait":`...)
	dst = strconv.AppendBool(dst, r.Wait)
	dst = append(dst, `,"state":`...)
	dst = AppendState(dst, &r.State)
	return append(dst, '}')
}

// AppendActivation appends an Activation as encoding/json writes it.
func AppendActivation(dst []byte, a *Activation) []byte {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendInt(dst, a.ID, 10)
	dst = append(dst, `,"session":`...)
	dst = strconv.AppendInt(dst, a.Session, 10)
	dst = append(dst, `,"configuration":`...)
	dst = strconv.AppendInt(dst, a.Configuration, 10)
	dst = append(dst, `,"namespace":`...)
	dst = strconv.AppendInt(dst, a.Namespace, 10)
	dst = append(dst, `,"node":`...)
	dst = appendString(dst, a.Node)
	dst = append(dst, `,"mount":`...)
	dst = appendString(dst, a.Mount)
	dst = append(dst, `,"read_only":`...)
	dst = strconv.AppendBool(dst, a.ReadOnly)
	dst = append(dst, `,"state":`...)
	dst = AppendState(dst, &a.State)
	return append(dst, '}')
}

// AppendState appends a State as encoding/json writes it.
func AppendState(dst []byte, s *State) []byte {
	dst = append(dst, `{"actualized":`...)
	dst = strconv.AppendBool(dst, s.Actualized)
	dst = append(dst, `,"fuse_blown":`...)
	dst = strconv.AppendBool(dst, s.FuseBlown)
	dst = append(dst, `,"goal":`...)
	dst = appendString(dst, s.Goal)
	dst = append(dst, `,"mixed":`...)
	dst = strconv.AppendBool(dst, s.Mixed)
	dst = append(dst, `,"transitioning":`...)
	dst = strconv.AppendBool(dst, s.Transitioning)
	if s.Error != "" {
		dst = append(dst, `,"error":`...)
		dst = appendString(dst, s.Error)
	}
	return append(dst, '}')
}

func appendStrings(dst []byte, ss []string) []byte {
	if ss == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, s := range ss {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, s)
	}
	return append(dst, ']')
}

func appendInts(dst []byte, ns []int64) []byte {
	if ns == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, n := range ns {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, n, 10)
	}
	return append(dst, ']')
}

// plainASCII are the bytes encoding/json writes as they are in a string (with HTML escaping,
// its default): printable ASCII but for " \ < > &, and DEL.
var plainASCII = func() (set [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		set[b] = true
	}
	for _, b := range `"\<>&` {
		set[b] = false
	}
	return set
}()

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string exactly as encoding/json's Marshal does: " and \
// escaped; \b \f \n \r \t by name, other control bytes and < > & as \u00XX; invalid UTF-8 as
// \ufffd; U+2028 and U+2029 as \u2028 and \u2029.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if plainASCII[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
