package pfsio

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkLstat: one namespace request's round trip, through a worker and in-process.
func BenchmarkLstat(b *testing.B) {
	if os.Getuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644)
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Dir(dir), 0o755)
	for _, way := range []string{"worker", "in-process"} {
		b.Run(way, func(b *testing.B) {
			var d *Door
			var err error
			if way == "worker" {
				d, err = Start(workerExe, dir, user(), Options{})
			} else {
				d, err = Open(dir, Options{})
			}
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := d.Lstat("f"); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkWriteAt: 8 MiB writes through the worker (a pipe, spliced into the file).
func BenchmarkWriteAt(b *testing.B) {
	if os.Getuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	os.Chmod(dir, 0o777)
	os.Chmod(filepath.Dir(dir), 0o755)
	d, err := Start(workerExe, dir, user(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	f, err := d.OpenFile("f", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 8<<20)
	b.SetBytes(int64(len(buf)))
	for i := 0; b.Loop(); i++ {
		if _, err := f.WriteAt(buf, int64(i%8)*int64(len(buf))); err != nil {
			b.Fatal(err)
		}
	}
}
