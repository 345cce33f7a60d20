package server

// The cache policies set on a cache namespace's files and directories (libdatawarp's
// dw_set_cache_policy, dwcli cache policy): the namespace server keeps them by PFS file
// identity, beside the reported sizes (cachesizes.go), for every session of the namespace on
// this server. They live in memory only: a restarted agent (or a persistent instance's next
// job) starts with the instance's defaults again.
//
//   - user.spillway.cache.policy (cache.PolicyXattr) reads the policy in effect (the
//     instance's defaults, Target.Cache.Defaults, with the overrides) and sets overrides.
//   - A regular file's overrides go with every open (proto.CacheRef.Policy) to the stripe
//     servers, which apply them to the file for all its opens there (the mount that set them
//     opens the file at once, so that they apply to the opens already there).
//   - A directory's are inherited by the regular files created in it afterwards (not by its
//     subdirectories, nor by files already there), as a directory's stripe configuration.
//   - They go with the file's last name.
//   - user.spillway.cache.sync is the mount's (it syncs the file on every stripe server);
//     it never reaches the namespace server's PFS.

import (
	"path"
	"strings"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// policy is the overrides set on key.
func (t *sizeTable) policy(key CacheFileKey) cache.Override {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pol[key]
}

// setPolicy records key's overrides (none: forgets it).
func (t *sizeTable) setPolicy(key CacheFileKey, o cache.Override) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if o.Empty() {
		delete(t.pol, key)
		return
	}
	if t.pol == nil {
		t.pol = map[CacheFileKey]cache.Override{}
	}
	t.pol[key] = o
}

// policyOf is the wire form of overrides.
func policyOf(o cache.Override) proto.CachePolicy {
	var p proto.CachePolicy
	if o.ModifiedThreshold != nil {
		p.Set |= proto.PolicyModifiedThreshold
		p.ModifiedThreshold = *o.ModifiedThreshold
	}
	if o.ReadAhead != nil {
		p.Set |= proto.PolicyReadAhead
		p.ReadAhead = *o.ReadAhead
	}
	if o.SyncOnClose != nil {
		p.Set |= proto.PolicySyncOnClose
		p.SyncOnClose = *o.SyncOnClose
	}
	if o.SyncToPFS != nil {
		p.Set |= proto.PolicySyncToPFS
		p.SyncToPFS = *o.SyncToPFS
	}
	return p
}

// overrideOf is the overrides of a wire policy.
func overrideOf(p proto.CachePolicy) cache.Override {
	var o cache.Override
	if p.Set&proto.PolicyModifiedThreshold != 0 {
		v := p.ModifiedThreshold
		o.ModifiedThreshold = &v
	}
	if p.Set&proto.PolicyReadAhead != 0 {
		v := p.ReadAhead
		o.ReadAhead = &v
	}
	if p.Set&proto.PolicySyncOnClose != 0 {
		v := p.SyncOnClose
		o.SyncOnClose = &v
	}
	if p.Set&proto.PolicySyncToPFS != 0 {
		v := p.SyncToPFS
		o.SyncToPFS = &v
	}
	return o
}

// cacheXattr says whether name is one of the cache's own attributes (never the PFS's).
func cacheXattr(name string) bool { return strings.HasPrefix(name, "user.spillway.cache.") }

// policyXattr serves the cache's attributes of path (st its lstat).
func (c *cacheNS) policyXattr(door *pfsio.Door, op proto.Op, r *proto.XattrReq, path string,
	sized func([]byte) (proto.XattrReply, syscall.Errno)) (proto.XattrReply, syscall.Errno) {
	if r.Name != cache.PolicyXattr {
		if op == proto.OpGetxattr {
			return proto.XattrReply{}, syscall.ENODATA
		}
		return proto.XattrReply{}, syscall.EINVAL // user.spillway.cache.sync is the mount's
	}
	st, errno := c.lstat(door, path)
	if errno != 0 {
		return proto.XattrReply{}, errno
	}
	kind := st.Mode & syscall.S_IFMT
	if kind != syscall.S_IFREG && kind != syscall.S_IFDIR {
		if op == proto.OpGetxattr {
			return proto.XattrReply{}, syscall.ENODATA
		}
		return proto.XattrReply{}, syscall.EPERM
	}
	key := keyOfStat(&st)
	switch op {
	case proto.OpGetxattr:
		return sized([]byte(c.sizes.policy(key).Apply(c.t.Defaults).Text()))
	case proto.OpSetxattr:
		// Who may write the file or directory may set its policy, as any of its user.*
		// attributes: the mount's kernel checks it (default_permissions).
		o, err := cache.ParseOverride(string(r.Value), c.sizes.policy(key))
		if err != nil {
			return proto.XattrReply{}, syscall.EINVAL
		}
		c.sizes.setPolicy(key, o)
		return proto.XattrReply{}, 0
	case proto.OpRemovexattr:
		c.sizes.setPolicy(key, cache.Override{})
		return proto.XattrReply{}, 0
	}
	return proto.XattrReply{}, syscall.EINVAL
}

// inheritPolicy gives the file key, just created at path, its directory's policy.
func (c *cacheNS) inheritPolicy(door *pfsio.Door, p string, key CacheFileKey) {
	dir := path.Dir(p)
	if dir == "." {
		dir = ""
	}
	st, err := door.Lstat(dir)
	if err != nil {
		return
	}
	if o := c.sizes.policy(keyOfStat(&st)); !o.Empty() {
		c.sizes.setPolicy(key, o)
	}
}
