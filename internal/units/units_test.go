package units

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	cases := []struct {
		in   string
		want uint64
	}{
		{"100", 100},
		{"1KiB", 1024}, {"1kib", 1024}, {"1K", 1024}, {"1KB", 1000},
		{"2MiB", 2 << 20}, {"2MB", 2e6},
		{"1GiB", 1 << 30}, {"1G", 1 << 30}, {"1GB", 1e9},
		{"3.5TB", 3.5e12}, {"3.5TiB", 3848290697216},
		{"1.5PiB", 1688849860263936}, {"1PB", 1e15},
		{"0.5KiB", 512},
		{"1.0001KB", 1001}, // 1000.1 bytes rounds up, never down
		{"0.1", 1},
		{"0", 0},
		{" 7GiB ", 7 << 30},
		{"4 GiB", 4 << 30},
		{"240GB", 240e9},
	}
	for _, c := range cases {
		got, err := ParseSize(c.in)
		if err != nil {
			t.Errorf("ParseSize(%q): unexpected error %v", c.in, err)
			continue
		}
		if got != c.want {
			t.Errorf("ParseSize(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestParseSizeRejects(t *testing.T) {
	for _, in := range []string{"", "GiB", "-1GiB", "1XB", "1.2.3GB", "abc", "1GiB,foo", "99999999999999999999", "20EiB", "17000PiB", "1e9", "."} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		} else if !strings.Contains(err.Error(), in) && in != "" {
			t.Errorf("ParseSize(%q) error %q does not quote the input", in, err)
		}
	}
}

func TestFormatHuman(t *testing.T) {
	cases := map[uint64]string{
		0: "0B", 1000: "1000B", 1024: "1KiB", 16 << 20: "16MiB", 512 << 20: "512MiB",
		32 << 30: "32GiB", 368 << 30: "368GiB", 1 << 30: "1GiB",
		8004799006310: "7.28TiB", 1536 << 40: "1.5PiB", 15942918602752: "14.5TiB",
		1<<20 - 1: "1MiB", // 1023.999KiB rounds to 1MiB, not "1024KiB"
	}
	for in, want := range cases {
		if got := FormatHuman(in); got != want {
			t.Errorf("FormatHuman(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestFormatExactRoundTrips(t *testing.T) {
	cases := map[uint64]string{0: "0", 1 << 30: "1GiB", 2 << 30: "2GiB", 1500e6: "1500MB", 4097: "4097", 1e15: "1PB", 3 << 50: "3PiB", 1000: "1KB"}
	for in, want := range cases {
		got := FormatExact(in)
		if got != want {
			t.Errorf("FormatExact(%d) = %q, want %q", in, got, want)
		}
		back, err := ParseSize(got)
		if err != nil || back != in {
			t.Errorf("ParseSize(FormatExact(%d)=%q) = %d, %v", in, got, back, err)
		}
	}
}

func TestGrains(t *testing.T) {
	g := uint64(1 << 30)
	if Grains(0, g) != 0 || Grains(1, g) != 1 || Grains(g, g) != 1 || Grains(g+1, g) != 2 {
		t.Fatal("Grains rounds up to whole grains")
	}
}

func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"1GiB", "3.5TB", "0", "abc", "1.5.5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err != nil {
			return
		}
		// Anything accepted prints exactly and reads back to the same number.
		back, err := ParseSize(FormatExact(n))
		if err != nil || back != n {
			t.Fatalf("%q -> %d -> %q -> %d, %v", s, n, FormatExact(n), back, err)
		}
	})
}
