package mount

import (
	"io"
	"log"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// Benchmarks of the metadata and small-I/O paths through a real mount (the bandwidth figures
// come from bench_mount.sh, which drives fio). Compare with the same operations on the
// namespace directory itself: go test -bench . -run '^$' ./internal/warpfs/mount
// (SPILLWAY_TEST_LEASE=0: without caching, to compare)

func benchMount(b *testing.B, direct bool) string {
	b.Helper()
	dir, err := os.MkdirTemp(testBase, "bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	src := filepath.Join(dir, "namespace")
	if err := os.Mkdir(src, 0o755); err != nil {
		b.Fatal(err)
	}
	if direct {
		return src
	}
	m, err := Mount(Spec{MountPath: filepath.Join(dir, "mnt"), SourceDir: src, Tracker: usage.New("bench", 1<<40),
		Limits: Limits{Lease: testLease()}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			b.Error(err)
		}
	})
	return m.Path()
}

func benchmarkCreate(b *testing.B, direct bool) {
	root := benchMount(b, direct)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := os.Create(filepath.Join(root, strconv.Itoa(i)))
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

func BenchmarkCreateMount(b *testing.B)  { benchmarkCreate(b, false) }
func BenchmarkCreateDirect(b *testing.B) { benchmarkCreate(b, true) }

func benchmarkStat(b *testing.B, direct bool) {
	root := benchMount(b, direct)
	p := filepath.Join(root, "f")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := os.Stat(p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStatMount(b *testing.B)  { benchmarkStat(b, false) }
func BenchmarkStatDirect(b *testing.B) { benchmarkStat(b, true) }

// benchmarkWrite writes block-sized chunks sequentially into one file (restarting every
// 256 MiB so the file stays in memory).
func benchmarkWrite(b *testing.B, direct bool, block int) {
	root := benchMount(b, direct)
	f, err := os.Create(filepath.Join(root, "f"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, block)
	b.SetBytes(int64(block))
	b.ResetTimer()
	var off int64
	for i := 0; i < b.N; i++ {
		if off+int64(block) > 256<<20 {
			off = 0
		}
		if _, err := f.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
		off += int64(block)
	}
}

func BenchmarkWrite4KiBMount(b *testing.B)  { benchmarkWrite(b, false, 4<<10) }
func BenchmarkWrite4KiBDirect(b *testing.B) { benchmarkWrite(b, true, 4<<10) }
func BenchmarkWrite1MiBMount(b *testing.B)  { benchmarkWrite(b, false, 1<<20) }
func BenchmarkWrite1MiBDirect(b *testing.B) { benchmarkWrite(b, true, 1<<20) }

// The same small operations on a striped namespace served over TCP (the striped-remote test
// backend: a metadata server and three stripe servers in this process, 64 KiB stripes), the
// path of a compute node that is not a storage node. Profile the client and the servers
// together with
//
//	go test -run '^$' -bench StripedRemote -cpuprofile cpu.out ./internal/warpfs/mount
func stripedRemoteMount(b *testing.B) string {
	b.Helper()
	return remoteMount(b, true)
}

// remoteMount mounts a namespace served over the network: striped over servers, or on one.
func remoteMount(b *testing.B, striped bool) string {
	b.Helper()
	dir, err := os.MkdirTemp(testBase, "bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	src := filepath.Join(dir, "namespace")
	if err := os.Mkdir(src, 0o755); err != nil {
		b.Fatal(err)
	}
	be := testBackend{name: "remote", remote: true, striped: striped}
	if striped {
		be.name = "striped-remote"
	}
	spec := be.prepare(b, Spec{MountPath: filepath.Join(dir, "mnt"), SourceDir: src, Tracker: usage.New("bench", 1<<40),
		Logger: log.New(io.Discard, "", 0)})
	m, err := Mount(spec)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			b.Error(err)
		}
	})
	return m.Path()
}

func BenchmarkStripedRemoteCreate(b *testing.B) {
	root := stripedRemoteMount(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := os.Create(filepath.Join(root, strconv.Itoa(i)))
		if err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkStripedRemoteStat(b *testing.B) {
	root := stripedRemoteMount(b)
	p := filepath.Join(root, "f")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := os.Stat(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStripedRemoteWriteFdatasync appends 4 KiB and fdatasyncs, as a log writer does
// (and fio's latency job: its median, p50-µs, is what bench/ reports).
func BenchmarkStripedRemoteWriteFdatasync(b *testing.B) { benchmarkWriteFdatasync(b, true) }

// BenchmarkRemoteWriteFdatasync is the same on a one-server instance on another node.
func BenchmarkRemoteWriteFdatasync(b *testing.B) { benchmarkWriteFdatasync(b, false) }

func benchmarkWriteFdatasync(b *testing.B, striped bool) {
	root := remoteMount(b, striped)
	f, err := os.Create(filepath.Join(root, "log"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4<<10)
	took := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := f.Write(buf); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		took[i] = time.Since(start)
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
}

// BenchmarkStripedRemoteRewriteFdatasync writes 4 KiB inside a file written before and
// fdatasyncs, a database's page write: no size to report.
func BenchmarkStripedRemoteRewriteFdatasync(b *testing.B) {
	root := stripedRemoteMount(b)
	p := filepath.Join(root, "pages")
	const size = 4 << 20
	if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4<<10)
	took := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := f.WriteAt(buf, int64(i*4096%size)); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		took[i] = time.Since(start)
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
}

// BenchmarkStripedRemoteRead4KiBDirect reads 4 KiB blocks at random offsets with O_DIRECT
// from 16 goroutines at once (as fio's iodepth does).
func BenchmarkStripedRemoteRead4KiBDirect(b *testing.B) {
	root := stripedRemoteMount(b)
	p := filepath.Join(root, "data")
	const size = 8 << 20
	if err := os.WriteFile(p, make([]byte, size), 0o644); err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.SetParallelism(16)
	b.SetBytes(4 << 10)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		mem, err := unix.Mmap(-1, 0, 4<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			b.Error(err)
			return
		}
		defer unix.Munmap(mem)
		r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
		for pb.Next() {
			if _, err := f.ReadAt(mem, int64(r.IntN(size/4096))*4096); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// Small sequential writes on a one-server instance reached over TCP (the remote test
// backend): what a write(2) of 4 KiB or of IOR-hard's 47,008 bytes costs, and how many WRITE
// requests reach the server per write(2) (write-behind gathers a sequential writer's small
// writes into requests of up to 1 MiB). A file opened only for writing bypasses the page
// cache (node.openFlags); one opened for reading and writing goes through it.
//
//	go test -run '^$' -bench SmallWritesRemote -benchtime 4000x ./internal/warpfs/mount
func BenchmarkSmallWritesRemote(b *testing.B) {
	for _, c := range []struct {
		block int
		flags int
		name  string
	}{{4096, os.O_WRONLY, "4096-wronly"}, {47008, os.O_WRONLY, "47008-wronly"}, {4096, os.O_RDWR, "4096-rdwr"}, {47008, os.O_RDWR, "47008-rdwr"}} {
		block := c.block
		b.Run(c.name, func(b *testing.B) {
			dir, err := os.MkdirTemp(testBase, "bench-")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { os.RemoveAll(dir) })
			src := filepath.Join(dir, "namespace")
			if err := os.Mkdir(src, 0o755); err != nil {
				b.Fatal(err)
			}
			requests := func() float64 { return remoteWriteRequests(b) }
			be := testBackend{name: "remote", remote: true}
			m, err := Mount(be.prepare(b, Spec{MountPath: filepath.Join(dir, "mnt"), SourceDir: src, Tracker: usage.New("bench", 1<<40),
				Logger: log.New(io.Discard, "", 0)}))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { m.Unmount() })
			f, err := os.OpenFile(filepath.Join(m.Path(), "f"), c.flags|os.O_CREATE, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, block)
			b.SetBytes(int64(block))
			before := requests()
			b.ResetTimer()
			var off int64
			for i := 0; i < b.N; i++ {
				if off+int64(block) > 256<<20 {
					off = 0
				}
				if _, err := f.WriteAt(buf, off); err != nil {
					b.Fatal(err)
				}
				off += int64(block)
			}
			if err := f.Close(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric((requests()-before)/float64(b.N), "requests/write")
		})
	}
}
