// Command fusefloor mounts a directory again through go-fuse's loopback file system, the
// library Spillway's mounts are built on, with every name and attribute cached as long as a
// Spillway lease: bench/metadata_bench.py's "fuse" target. What a workload costs there is the
// floor of any go-fuse file system on this machine — the kernel's FUSE round trips and the
// daemon's — with no network and no server: how far above it a Spillway mount is, and how far
// GlusterFS-relative targets can be reached by a FUSE client at all. Every read and write is a
// FUSE round trip, as a network file system's are: the kernel's passthrough of a file's I/O to
// its backing file (which go-fuse's loopback uses where it can) is turned off.
//
// With --io-uring it sets MountOptions.EnableIoUring, which only go-fuse's experimental
// io_uring branch has (github.com/hanwen/go-fuse, branch iouring): bench/fuse_uring_bench.py
// builds it against that tree (--gofuse-src) to measure the transport in go-fuse itself;
// built against a go-fuse without the field it refuses the flag.
//
// Usage: fusefloor [--io-uring] DIR MOUNTPOINT   (as root; runs until SIGTERM or SIGINT, then unmounts)
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"reflect"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

func main() {
	args := os.Args[1:]
	uring := len(args) > 0 && args[0] == "--io-uring"
	if uring {
		args = args[1:]
	}
	if len(args) != 2 || args[0] == "--help" || args[0] == "-h" {
		fmt.Fprintln(os.Stderr, "usage: fusefloor [--io-uring] DIR MOUNTPOINT\n\nMounts DIR at MOUNTPOINT through go-fuse's loopback file system, names and attributes\ncached for 10 s (a Spillway lease), until SIGTERM or SIGINT. --io-uring: FUSE over io_uring,\nwith a go-fuse that has MountOptions.EnableIoUring (its iouring branch).")
		os.Exit(2)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(args[0], &st); err != nil {
		fmt.Fprintln(os.Stderr, "fusefloor:", err)
		os.Exit(1)
	}
	data := &fs.LoopbackRoot{Path: args[0], Dev: uint64(st.Dev)}
	data.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &node{fs.LoopbackNode{RootData: r}}
	}
	root := data.NewNode(data, nil, "", &st)
	data.RootNode = root
	lease := 10 * time.Second // warpfs.lease's default
	// The kernel settings Spillway's mounts ask for (mount.Mount): a floor without ASYNC_DIO
	// serves an iodepth of 32 one request at a time, and would bound what no Spillway mount
	// is bound by.
	mo := fuse.MountOptions{AllowOther: true, FsName: "fusefloor", Name: "fusefloor",
		Options: []string{"default_permissions"}, MaxWrite: 1 << 20, MaxBackground: 64,
		ExtraCapabilities: fuse.CAP_ASYNC_DIO}
	if uring { // by name: the field exists only in go-fuse's iouring branch
		f := reflect.ValueOf(&mo).Elem().FieldByName("EnableIoUring")
		if !f.IsValid() {
			fmt.Fprintln(os.Stderr, "fusefloor: --io-uring: this go-fuse has no MountOptions.EnableIoUring (build against its iouring branch)")
			os.Exit(2)
		}
		f.SetBool(true)
	}
	server, err := fs.Mount(args[1], root, &fs.Options{
		EntryTimeout: &lease, AttrTimeout: &lease, NegativeTimeout: &lease, MountOptions: mo,
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

// node is go-fuse's loopback node whose files are served through FUSE, never passed through.
type node struct{ fs.LoopbackNode }

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return &served{fh}, fl, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	return in, &served{fh}, fl, 0
}

// served forwards a loopback file's operations, but not its descriptor for passthrough.
type served struct{ fh fs.FileHandle }

func (f *served) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return f.fh.(fs.FileReader).Read(ctx, dest, off)
}
func (f *served) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	return f.fh.(fs.FileWriter).Write(ctx, data, off)
}
func (f *served) Flush(ctx context.Context) syscall.Errno { return f.fh.(fs.FileFlusher).Flush(ctx) }
func (f *served) Release(ctx context.Context) syscall.Errno {
	return f.fh.(fs.FileReleaser).Release(ctx)
}
func (f *served) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return f.fh.(fs.FileFsyncer).Fsync(ctx, flags)
}
func (f *served) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return f.fh.(fs.FileGetattrer).Getattr(ctx, out)
}
func (f *served) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return f.fh.(fs.FileSetattrer).Setattr(ctx, in, out)
}
func (f *served) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return f.fh.(fs.FileLseeker).Lseek(ctx, off, whence)
}
func (f *served) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	return f.fh.(fs.FileAllocater).Allocate(ctx, off, size, mode)
}
