package lifecycle

import (
	"path"
	"slices"
	"strings"

	"github.com/spillway-hpc/spillway/internal/model"
)

// Cache instances (issue 20): the checks of a setup's instance requests.

// checkInstances checks every instance a setup asks for (a job may hold one of each type,
// DataWarp's Phase 3).
func checkInstances(req Setup, p Params) error {
	var all []InstanceRequest
	if req.Instance != nil {
		all = append(all, *req.Instance)
	}
	all = append(all, req.More...)
	seen := map[string]bool{}
	for _, r := range all {
		if err := checkInstance(r, req.Persistent, p); err != nil {
			return err
		}
		typ := orDefault(r.Type, model.TypeScratch)
		if seen[typ] {
			return userErr("type=%s: a job may hold one instance of each type (a scratch and a cache); put all the capacity of one type into one #DW jobdw", typ)
		}
		seen[typ] = true
	}
	if len(req.More) > 0 && req.Persistent {
		return userErr("create_persistent %s: a persistent instance is one instance", req.Token)
	}
	if req.Swap != nil {
		if req.Persistent {
			return userErr("create_persistent %s: swap belongs to a job's compute nodes (#DW swap); a persistent instance cannot be of type swap", req.Token)
		}
		return CheckSwap(*req.Swap, p.Swap)
	}
	return nil
}

// CheckInstance checks one instance request on its own, as setup will: the site's [limits],
// its type, access modes and, for a cache, its PFS directory against the site's [cache]
// allowed_pfs. dw_wlm_cli's job_process calls it before the job is queued.
func CheckInstance(req InstanceRequest, persistent bool, p Params) error {
	return checkInstance(req, persistent, p)
}

func checkInstance(req InstanceRequest, persistent bool, p Params) error {
	if err := p.Limits.Check(req); err != nil {
		return err
	}
	switch req.Type {
	case "", model.TypeScratch:
		if req.Cache != nil {
			return userErr("pfs= and the cache tunables are only for type=cache: a scratch instance starts empty; remove them, or use type=cache")
		}
	case model.TypeCache:
		if err := checkCache(req, p.Cache); err != nil {
			return err
		}
	case model.TypeSwap:
		return userErr("type=swap is not a #DW jobdw type: swap is its own directive, #DW swap <size per compute node>, e.g. #DW swap 4GiB")
	default:
		return userErr("type=%s: expected scratch or cache", req.Type)
	}
	if persistent && slices.Contains(req.AccessModes, model.AccessPrivate) {
		// DataWarp's Table I: a private namespace per compute node belongs to one job's nodes.
		return userErr("access_mode=private is not available for a persistent instance (as in DataWarp): each job's compute nodes would get namespaces no other job sees; use access_mode=striped or loadbalance")
	}
	if req.MaxMDS && len(req.AccessModes) > 0 && !slices.Contains(req.AccessModes, model.AccessStriped) {
		return userErr("max_mds=yes needs access_mode striped (a private namespace has one metadata server per node already)")
	}
	return nil
}

func checkCache(req InstanceRequest, cp CacheParams) error {
	if slices.Contains(req.AccessModes, model.AccessPrivate) {
		return userErr("access_mode=private is not available for type=cache (as in DataWarp): a cache's files are the PFS directory's, which every compute node sees; use access_mode=striped or access_mode=loadbalance")
	}
	if req.MaxMDS {
		return userErr("max_mds=yes is for type=scratch: a cache keeps its metadata on the PFS; remove max_mds")
	}
	if req.Cache == nil || req.Cache.PFS == "" {
		return userErr("type=cache needs pfs=<absolute PFS directory to cache>")
	}
	dir := req.Cache.PFS
	if !path.IsAbs(dir) || path.Clean(dir) != dir {
		return userErr("pfs=%s: the PFS directory must be absolute and in clean form (no .., no //, no trailing /); write pfs=%s", dir, path.Clean("/"+dir))
	}
	if len(cp.AllowedPFS) == 0 {
		return userErr("pfs=%s: this site allows no PFS directory for cache instances yet ([cache] allowed_pfs is empty); ask the administrator to list the PFS directories users may cache", dir)
	}
	if !AllowedPFS(cp.AllowedPFS, dir) {
		return userErr("pfs=%s is outside the directories this site allows for cache instances ([cache] allowed_pfs: %s); choose a directory under one of them, or ask the administrator to add it",
			dir, strings.Join(cp.AllowedPFS, ", "))
	}
	return nil
}

// AllowedPFS reports whether dir (absolute, clean) is one of allowed or below one, by whole
// path components: /lustre allows /lustre and /lustre/me, never /lustre2.
func AllowedPFS(allowed []string, dir string) bool {
	for _, a := range allowed {
		if a == "/" || dir == a || strings.HasPrefix(dir, strings.TrimSuffix(a, "/")+"/") {
			return true
		}
	}
	return false
}

// cacheSettings fills a request's tunables with the site's defaults.
func cacheSettings(r CacheRequest, d model.CacheSettings) *model.CacheSettings {
	c := d
	c.PFS = r.PFS
	if r.ModifiedThreshold != nil {
		c.ModifiedThreshold = *r.ModifiedThreshold
	}
	if r.ReadAhead != nil {
		c.ReadAhead = *r.ReadAhead
	}
	if r.SyncOnClose != nil {
		c.SyncOnClose = *r.SyncOnClose
	}
	if r.SyncToPFS != nil {
		c.SyncToPFS = *r.SyncToPFS
	}
	return &c
}
