package stripe

// The metadata map of a namespace sharded over several servers (max_mds=yes): which shard
// holds an entry. Like the stripe map it is pure, so every compute node computes the same
// answer with no central directory.
//
// A directory exists on every shard. A non-directory entry NAME of directory D lives on one
// shard only: Shard(id of D, NAME, shards). A directory's id names it for as long as it
// exists and does not change when it is renamed (so renaming a directory never moves its
// children); the root's is RootDirID. A directory entry's lookup goes to the same shard, so
// that looking a name up is one request whatever it names.

import "hash/fnv"

// RootDirID is the id of a sharded namespace's root directory.
const RootDirID = 0

// Shard is the shard, in [0, shards), of the entry name in the directory whose id is dir.
// It panics when shards < 1.
func Shard(dir uint64, name string, shards int) int {
	if shards < 1 {
		panic("stripe.Shard: no shards")
	}
	if shards == 1 {
		return 0
	}
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(dir >> (8 * i))
	}
	h.Write(b[:])
	h.Write([]byte(name))
	// fnv's low bits mix poorly for short keys: fold the high half in.
	s := h.Sum64()
	s ^= s >> 32
	return int(s % uint64(shards))
}

// ShardLimit is the share of a namespace-wide count limit (MFC, files created) each of
// shards shards enforces on its own, with no coordination: ceil(total/shards), so that the
// namespace never holds more than total plus shards-1 (docs/decisions.md). 0 stays 0 (no
// limit).
func ShardLimit(total uint64, shards int) uint64 {
	if total == 0 || shards <= 1 {
		return total
	}
	n := uint64(shards)
	return (total + n - 1) / n
}
