package server

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/proto"
	"github.com/spillway-hpc/spillway/internal/warpfs/stripe"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// Round trips of single requests to a server over TCP on the loopback interface, in a
// striped namespace: what each costs the storage node and the network, without FUSE.
//
//	go test -run '^$' -bench . -cpuprofile cpu.out ./internal/warpfs/server
func BenchmarkRequests(b *testing.B) {
	if unix.Geteuid() != 0 {
		b.Skip("a striped namespace's layout is a trusted extended attribute: root only")
	}
	f := newFixtureHolding(b, Limits{}, token, "")
	root := stripe.Layout{Size: 1 << 20, Width: 2, Servers: 2}
	if err := unix.Setxattr(f.dir, LayoutXattr, root.Encode(), 0); err != nil {
		b.Fatal(err)
	}
	c := f.client()
	b.Run("ping", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			do(c, proto.OpPing, &proto.Empty{}, nil)
		}
	})
	b.Run("create+release", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var rep proto.OpenReply
			if errno := do(c, proto.OpCreate, &proto.CreateReq{Name: "c" + strconv.Itoa(i), Flags: syscall.O_WRONLY | syscall.O_CREAT, Mode: 0o644}, &rep); errno != 0 {
				b.Fatal(errno)
			}
			do(c, proto.OpRelease, &proto.HandleReq{Handle: rep.Handle}, nil)
		}
	})
	b.Run("lookup", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var rep proto.AttrReply
			if errno := do(c, proto.OpLookup, &proto.PathReq{Path: "c0"}, &rep); errno != 0 {
				b.Fatal(errno)
			}
		}
	})
	b.Run("getattr", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var rep proto.AttrReply
			if errno := do(c, proto.OpGetattr, &proto.NodeReq{Path: "c0"}, &rep); errno != 0 {
				b.Fatal(errno)
			}
		}
	})
}

// The server's own cost of creating and removing files, against the file system's: N files
// created (create + release) and removed (unlink) in a subdirectory of the namespace through
// a Local server (the requests' handlers, no network, no FUSE), and the same loop of raw
// open(O_CREAT)/close and unlink in a directory of the same file system, in one run. Both a
// plain and a striped namespace (whose files are stubs with a layout attribute).
//
//	SPILLWAY_BENCH_DIR=/dev/shm go test -run '^$' -bench 'CreateUnlink' -benchtime 2000x -cpuprofile cpu.out ./internal/warpfs/server
func BenchmarkCreateUnlink(b *testing.B) {
	if unix.Geteuid() != 0 {
		b.Skip("files are created as their caller: root only")
	}
	const sub = "job/rank0"
	b.Run("raw", func(b *testing.B) {
		dir := filepath.Join(benchDir(b), sub)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		names := benchNames(b.N)
		b.ResetTimer()
		start := now()
		for i := 0; i < b.N; i++ {
			fd, err := unix.Open(filepath.Join(dir, names[i]), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
			if err != nil {
				b.Fatal(err)
			}
			unix.Close(fd)
		}
		created := now()
		for i := 0; i < b.N; i++ {
			if err := unix.Unlink(filepath.Join(dir, names[i])); err != nil {
				b.Fatal(err)
			}
		}
		reportPhases(b, start, created, created)
	})
	for _, striped := range []bool{false, true} {
		name := "server"
		if striped {
			name = "server-striped"
		}
		b.Run(name, func(b *testing.B) {
			dir := benchDir(b)
			if striped {
				root := stripe.Layout{Size: 1 << 20, Width: 4, Servers: 4}
				if err := unix.Setxattr(dir, LayoutXattr, root.Encode(), 0); err != nil {
					b.Fatal(err)
				}
			}
			if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
				b.Fatal(err)
			}
			l, err := OpenLocal(LocalOptions{Dir: dir, Tracker: usage.New("bench", 1<<40), Name: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			names := benchNames(b.N)
			b.ResetTimer()
			start := now()
			for i := 0; i < b.N; i++ {
				rep, _, errno := l.Exec(proto.OpCreate, 1000, 1000, &proto.CreateReq{Dir: sub, Name: names[i], Flags: syscall.O_WRONLY | syscall.O_CREAT | syscall.O_EXCL, Mode: 0o644}, nil)
				if errno != 0 {
					b.Fatal(errno)
				}
				l.Exec(proto.OpRelease, 1000, 1000, &proto.HandleReq{Handle: rep.(*proto.OpenReply).Handle}, nil)
			}
			created := now()
			if striped { // mdtest-hard's files: the size report at the close of each, alone
				hs := make([]uint64, b.N)
				for i := 0; i < b.N; i++ {
					rep, _, errno := l.Exec(proto.OpOpen, 1000, 1000, &proto.OpenReq{Path: sub + "/" + names[i], Flags: syscall.O_WRONLY}, nil)
					if errno != 0 {
						b.Fatal(errno)
					}
					hs[i] = rep.(*proto.OpenReply).Handle
				}
				before := now()
				for i := 0; i < b.N; i++ {
					if _, _, errno := l.Exec(proto.OpSetattr, 1000, 1000, &proto.SetattrReq{Handle: hs[i], Valid: proto.SetSizeAtLeast | proto.SetMtimeNow, Size: 3901}, nil); errno != 0 {
						b.Fatal(errno)
					}
				}
				after := now()
				b.ReportMetric(float64(after.cpu-before.cpu)/float64(b.N), "report-cpu-ns/file")
				for i := 0; i < b.N; i++ {
					l.Exec(proto.OpRelease, 1000, 1000, &proto.HandleReq{Handle: hs[i]}, nil)
				}
			}
			removing := now()
			for i := 0; i < b.N; i++ {
				if _, _, errno := l.Exec(proto.OpUnlink, 1000, 1000, &proto.EntryReq{Dir: sub, Name: names[i]}, nil); errno != 0 {
					b.Fatal(errno)
				}
			}
			reportPhases(b, start, created, removing)
		})
	}
}

func benchNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = "file." + strconv.Itoa(i)
	}
	return names
}

// benchDir is a new directory for one benchmark: under $SPILLWAY_BENCH_DIR when set (a
// tmpfs such as /dev/shm shows the server's own cost best: its creates cost the file system
// little, and the same on every run), else the test's temporary directory.
func benchDir(b *testing.B) string {
	base := os.Getenv("SPILLWAY_BENCH_DIR")
	if base == "" {
		return b.TempDir()
	}
	dir, err := os.MkdirTemp(base, "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// reportPhases reports the time per file of the create phase (start to created) and of the
// remove phase (removing to now), and the CPU each took (the process's, user and system: on
// a disk file system the time also waits for the disk, which the CPU leaves out).
func reportPhases(b *testing.B, start, created, removing phase) {
	now := now()
	b.ReportMetric(float64(created.wall.Sub(start.wall).Nanoseconds())/float64(b.N), "create-ns/file")
	b.ReportMetric(float64(now.wall.Sub(removing.wall).Nanoseconds())/float64(b.N), "unlink-ns/file")
	b.ReportMetric(float64(created.cpu-start.cpu)/float64(b.N), "create-cpu-ns/file")
	b.ReportMetric(float64(now.cpu-removing.cpu)/float64(b.N), "unlink-cpu-ns/file")
}

// phase is a point of a benchmark: the time, and the CPU the process used so far.
type phase struct {
	wall time.Time
	cpu  int64 // ns
}

func now() phase {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return phase{wall: time.Now(), cpu: ru.Utime.Nano() + ru.Stime.Nano()}
}

// The server's cost of a small stripe object written once by name (WRITE_NAME: created,
// written and closed, as a striped file's first small write makes it on a data server) and
// removed (UNLINK by name), against the raw open(O_CREAT), write, close and unlink.
//
//	SPILLWAY_BENCH_DIR=/dev/shm go test -run '^$' -bench 'WriteName' -benchtime 2000x -cpuprofile cpu.out ./internal/warpfs/server
func BenchmarkWriteName(b *testing.B) {
	if unix.Geteuid() != 0 {
		b.Skip("objects are created as their caller: root only")
	}
	data := make([]byte, 3901) // mdtest-hard's files
	b.Run("raw", func(b *testing.B) {
		dir := benchDir(b)
		names := benchNames(b.N)
		b.ResetTimer()
		start := now()
		for i := 0; i < b.N; i++ {
			fd, err := unix.Open(filepath.Join(dir, names[i]), unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := unix.Pwrite(fd, data, 0); err != nil {
				b.Fatal(err)
			}
			unix.Close(fd)
		}
		created := now()
		for i := 0; i < b.N; i++ {
			if err := unix.Unlink(filepath.Join(dir, names[i])); err != nil {
				b.Fatal(err)
			}
		}
		reportPhases(b, start, created, created)
	})
	b.Run("server", func(b *testing.B) {
		l, err := OpenLocal(LocalOptions{Dir: benchDir(b), Tracker: usage.New("bench", 1<<40), Name: "bench", Stripes: true})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		names := benchNames(b.N)
		b.ResetTimer()
		start := now()
		for i := 0; i < b.N; i++ {
			if _, _, errno := l.Exec(proto.OpWriteName, 0, 0, &proto.WriteNameReq{Name: names[i], Data: data}, nil); errno != 0 {
				b.Fatal(errno)
			}
		}
		created := now()
		for i := 0; i < b.N; i++ {
			if _, _, errno := l.Exec(proto.OpUnlink, 0, 0, &proto.EntryReq{Name: names[i]}, nil); errno != 0 {
				b.Fatal(errno)
			}
		}
		reportPhases(b, start, created, created)
	})
}
