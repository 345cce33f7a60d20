// Package warpfs is the burst buffer's data path, one tree from the wire to the disk:
//
//	proto   the wire protocol (pure): frames, messages, the handshake's proofs
//	stripe  the stripe map (pure): which server holds which bytes of a striped file
//	cache   a cache instance's server (pure): extent states, when to fetch, flush and
//	        evict, which requests wait, the log that makes dirty data survive a restart
//	server  the storage node's server: namespaces, stub files, stripe objects, beneath
//	        the namespace root's descriptor
//	client  the compute node's connection to one server: multiplexing, deadlines,
//	        reconnection, reopening
//	mount   the FUSE layer a job sees at $DW_JOB_STRIPED: one namespace, its striped
//	        files' pieces sent to their servers in parallel, replicas for loadbalance,
//	        the mount's lifecycle (stale, hung and busy mounts)
//	usage   capacity accounting per instance on a storage node, shared by the server
//	        and the stage engine
//
// docs/architecture.md ("The data path") explains how they fit together.
package warpfs
