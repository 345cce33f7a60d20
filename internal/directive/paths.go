package directive

import (
	"path"
	"strings"
)

// The variables DataWarp sets for a job, and that stage directives may start with.
const (
	VarJobStriped          = "DW_JOB_STRIPED"         // scratch, access_mode striped
	VarJobPrivate          = "DW_JOB_PRIVATE"         // scratch, access_mode private (never staged)
	VarJobLoadbalance      = "DW_JOB_LDBAL"           // scratch, access_mode loadbalance (Spillway's name)
	VarJobStripedCache     = "DW_JOB_STRIPED_CACHE"   // cache, access_mode striped
	VarJobLoadbalanceCache = "DW_JOB_LDBAL_CACHE"     // cache, access_mode loadbalance
	VarPersistentPrefix    = "DW_PERSISTENT_STRIPED_" // + the name of a #DW persistentdw
	// The variables of a persistent cache instance (Spillway's names, docs/decisions.md: no
	// DataWarp source names them; DW_PERSISTENT_STRIPED_CACHE_<name> would also be the
	// variable of a persistent scratch buffer named CACHE_<name>).
	VarPersistentCachePrefix      = "DW_PERSISTENT_CACHE_STRIPED_" // + name: striped cache
	VarPersistentLdbalCachePrefix = "DW_PERSISTENT_CACHE_LDBAL_"   // + name: loadbalance cache
)

// PersistentCacheVar is the variable of the persistent cache instance name with access mode
// mode (striped or loadbalance); "" for another mode.
func PersistentCacheVar(name, mode string) string {
	switch mode {
	case "striped":
		return VarPersistentCachePrefix + name
	case "loadbalance":
		return VarPersistentLdbalCachePrefix + name
	}
	return ""
}

// PersistentVar is the variable of the persistent buffer name: "DW_PERSISTENT_STRIPED_" + name.
func PersistentVar(name string) string { return VarPersistentPrefix + name }

// jobVariable is the variable of a job instance of type typ with access mode mode.
func jobVariable(typ, mode string) string {
	switch {
	case typ == "scratch" && mode == "striped":
		return VarJobStriped
	case typ == "scratch" && mode == "private":
		return VarJobPrivate
	case typ == "scratch" && mode == "loadbalance":
		return VarJobLoadbalance
	case typ == "cache" && mode == "striped":
		return VarJobStripedCache
	case typ == "cache" && mode == "loadbalance":
		return VarJobLoadbalanceCache
	}
	return ""
}

// isDWVariable reports whether name is one of DataWarp's variables.
func isDWVariable(name string) bool {
	switch name {
	case VarJobStriped, VarJobPrivate, VarJobLoadbalance, VarJobStripedCache, VarJobLoadbalanceCache:
		return true
	}
	for _, prefix := range []string{VarPersistentPrefix, VarPersistentCachePrefix, VarPersistentLdbalCachePrefix} {
		if buf, ok := strings.CutPrefix(name, prefix); ok {
			return checkName(buf, DefaultLimits().MaxNameBytes) == nil
		}
	}
	return false
}

// IsPersistentCacheVar reports whether name is the variable of a persistent cache instance.
func IsPersistentCacheVar(name string) bool {
	return strings.HasPrefix(name, VarPersistentCachePrefix) || strings.HasPrefix(name, VarPersistentLdbalCachePrefix)
}

// splitVariable reads a leading "$NAME" or "${NAME}" as the shell would: an unbraced name runs
// over letters, digits and _. ok is false when p does not start with a well-formed variable.
func splitVariable(p string) (name, rest string, ok bool) {
	if strings.HasPrefix(p, "${") {
		end := strings.IndexByte(p, '}')
		if end < 0 {
			return "", "", false
		}
		name, rest = p[2:end], p[end+1:]
	} else if strings.HasPrefix(p, "$") {
		end := 1
		for end < len(p) && isIdentByte(p[end], end == 1) {
			end++
		}
		name, rest = p[1:end], p[end:]
	} else {
		return "", "", false
	}
	if name == "" {
		return "", "", false
	}
	for i := 0; i < len(name); i++ {
		if !isIdentByte(name[i], i == 0) {
			return "", "", false
		}
	}
	return name, rest, true
}

// escapes reports whether rest, a path below an instance root, climbs above the root with "..".
func escapes(rest string) bool {
	depth := 0
	for part := range strings.SplitSeq(rest, "/") {
		switch part {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return true
			}
		default:
			depth++
		}
	}
	return false
}

// SplitDWPath splits a burst-buffer path into its variable and the path below it:
// "$DW_JOB_STRIPED/a/b" → ("DW_JOB_STRIPED", "/a/b"); "${DW_PERSISTENT_STRIPED_foo}/x" →
// ("DW_PERSISTENT_STRIPED_foo", "/x"); "$DW_JOB_STRIPED" → ("DW_JOB_STRIPED", "/").
//
// rest is cleaned, always starts with "/", and keeps a trailing "/" when the path had one
// (a file staged to "$DW_JOB_STRIPED/sub/" goes into that directory). ok is false when p does
// not start with one of DataWarp's variables (see the Var constants), when something other
// than "/" follows the variable, or when ".." would climb out of the instance.
func SplitDWPath(p string) (variable, rest string, ok bool) {
	name, tail, ok := splitVariable(p)
	if !ok || !isDWVariable(name) {
		return "", "", false
	}
	if tail != "" && tail[0] != '/' {
		return "", "", false
	}
	if escapes(tail) {
		return "", "", false
	}
	clean := path.Clean("/" + tail)
	if clean != "/" && strings.HasSuffix(tail, "/") {
		clean += "/"
	}
	return name, clean, true
}
