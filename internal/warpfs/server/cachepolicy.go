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
//   - Each setting has a generation (proto.CachePolicy.Gen): a stripe server keeps the newest
//     it heard of for the file, so that an open made before a setting (on another compute
//     node, which opens its objects later) does not undo it there.
//   - user.spillway.cache.sync is the mount's (it syncs the file on every stripe server);
//     it never reaches the namespace server's PFS.

import (
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-hpc/spillway/internal/pfsio"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
)

// setPolicy is a file's or directory's policy as set: its overrides and when (proto.CachePolicy.Gen).
type setPolicy struct {
	o   cache.Override
	gen uint64
}

// policy is the policy set on key (gen 0: none).
func (t *sizeTable) policy(key CacheFileKey) setPolicy {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pol[key]
}

// setPolicy records key's overrides (none: the instance's defaults, which a setting of
// before must not outlive on the stripe servers: kept with its generation too).
func (t *sizeTable) setPolicy(key CacheFileKey, o cache.Override) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pol == nil {
		t.pol = map[CacheFileKey]setPolicy{}
	}
	// The clock, so that settings after a restart of this server still come after those
	// the stripe servers heard of before it; never twice the same.
	gen := max(uint64(time.Now().UnixNano()), t.lastGen+1)
	t.lastGen = gen
	t.pol[key] = setPolicy{o: o, gen: gen}
}

// dropPolicy forgets key's policy (its last name is gone).
func (t *sizeTable) dropPolicy(key CacheFileKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.pol, key)
}

// policyOf is the wire form of a policy set.
func policyOf(sp setPolicy) proto.CachePolicy {
	o := sp.o
	p := proto.CachePolicy{Gen: sp.gen}
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
		return sized([]byte(c.sizes.policy(key).o.Apply(c.t.Defaults).Text()))
	case proto.OpSetxattr:
		// Who may write the file or directory may set its policy, as any of its user.*
		// attributes: the mount's kernel checks it (default_permissions).
		o, err := cache.ParseOverride(string(r.Value), c.sizes.policy(key).o)
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
	if sp := c.sizes.policy(keyOfStat(&st)); !sp.o.Empty() {
		c.sizes.setPolicy(key, sp.o)
	}
}
