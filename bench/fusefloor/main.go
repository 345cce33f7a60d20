// Command fusefloor mounts a directory again through go-fuse's loopback file system, the
// library Spillway's mounts are built on, with every name and attribute cached as long as a
// Spillway lease: bench/metadata_bench.py's "fuse" target. What a workload costs there is the
// floor of any go-fuse file system on this machine — the kernel's FUSE round trips and the
// daemon's — with no network and no server: how far above it a Spillway mount is, and how far
// GlusterFS-relative targets can be reached by a FUSE client at all.
//
// Usage: fusefloor DIR MOUNTPOINT   (as root; runs until SIGTERM or SIGINT, then unmounts)
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	if len(os.Args) != 3 || os.Args[1] == "--help" || os.Args[1] == "-h" {
		fmt.Fprintln(os.Stderr, "usage: fusefloor DIR MOUNTPOINT\n\nMounts DIR at MOUNTPOINT through go-fuse's loopback file system, names and attributes\ncached for 10 s (a Spillway lease), until SIGTERM or SIGINT.")
		os.Exit(2)
	}
	root, err := fs.NewLoopbackRoot(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fusefloor:", err)
		os.Exit(1)
	}
	lease := 10 * time.Second // warpfs.lease's default
	server, err := fs.Mount(os.Args[2], root, &fs.Options{
		EntryTimeout: &lease, AttrTimeout: &lease, NegativeTimeout: &lease,
		MountOptions: fuse.MountOptions{AllowOther: true, FsName: "fusefloor", Name: "fusefloor",
			Options: []string{"default_permissions"}, MaxWrite: 1 << 20},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fusefloor: mount:", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; server.Unmount() }()
	fmt.Println("mounted") // the bench waits for this line
	server.Wait()
}
