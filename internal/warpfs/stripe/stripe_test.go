package stripe

import (
	"math/rand"
	"testing"
)

// place is the reference map, one byte at a time: the server and object offset of byte pos.
func place(l Layout, pos uint64) (int, uint64) {
	i := pos / l.Size
	return int((uint64(l.Start) + i%uint64(l.Width)) % uint64(l.Servers)), (i/uint64(l.Width))*l.Size + pos%l.Size
}

func randomLayout(r *rand.Rand) Layout {
	servers := uint32(1 + r.Intn(5))
	return Layout{ID: r.Uint64(), Size: Unit * uint64(1+r.Intn(3)), Width: uint32(1 + r.Intn(int(servers))),
		Servers: servers, Start: uint32(r.Intn(int(servers)))}
}

func TestPiecesMatchTheByteMap(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	for round := 0; round < 300; round++ {
		l := randomLayout(r)
		off := uint64(r.Intn(int(8 * l.Size)))
		length := uint64(r.Intn(int(6 * l.Size)))
		var covered uint64
		for _, p := range l.Pieces(off, length) {
			if p.BufOffset != covered {
				t.Fatalf("%+v: pieces not in order at %d: %+v", l, covered, p)
			}
			for k := uint64(0); k < p.Length; k += 997 {
				srv, obj := place(l, off+p.BufOffset+k)
				if srv != p.Server || obj != p.ObjOffset+k {
					t.Fatalf("%+v: byte %d: piece says server %d offset %d, map says %d %d", l, off+p.BufOffset+k, p.Server, p.ObjOffset+k, srv, obj)
				}
			}
			covered += p.Length
		}
		if covered != length {
			t.Fatalf("%+v: pieces cover %d of %d bytes", l, covered, length)
		}
	}
}

func TestObjectSizeIsOnePastTheLastByte(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	for round := 0; round < 200; round++ {
		l := randomLayout(r)
		length := uint64(r.Intn(int(7 * l.Size)))
		want := make([]uint64, l.Servers)
		for pos := uint64(0); pos < length; pos++ {
			srv, obj := place(l, pos)
			want[srv] = max(want[srv], obj+1)
		}
		for s := range want {
			if got := l.ObjectSize(length, s); got != want[s] {
				t.Fatalf("%+v length %d server %d: ObjectSize %d, want %d", l, length, s, got, want[s])
			}
			if (l.Slot(s) < 0) != (l.ObjectSize(l.Size*uint64(l.Servers)*2, s) == 0) {
				t.Fatalf("%+v server %d: Slot %d disagrees with ObjectSize", l, s, l.Slot(s))
			}
		}
		off := uint64(r.Intn(int(length + 1)))
		for s := range want {
			o, n := l.ObjectRange(off, length-off, s)
			var lo, hi uint64 = ^uint64(0), 0
			for pos := off; pos < length; pos++ {
				if srv, obj := place(l, pos); srv == s {
					lo, hi = min(lo, obj), max(hi, obj+1)
				}
			}
			if hi == 0 && n != 0 || hi > 0 && (o != lo || o+n != hi) {
				t.Fatalf("%+v range %d+%d server %d: ObjectRange %d+%d, bytes span [%d,%d)", l, off, length-off, s, o, n, lo, hi)
			}
		}
	}
}

func TestEncodingAndText(t *testing.T) {
	l := Layout{ID: 0xabc, Size: 8 << 20, Width: 3, Servers: 4, Start: 2, Length: 12345}
	back, err := Decode(l.Encode())
	if err != nil || back != l {
		t.Fatalf("Decode(Encode(%+v)) = %+v %v", l, back, err)
	}
	if _, err := Decode([]byte{1, 2, 3}); err == nil {
		t.Error("a short layout decoded")
	}
	bad := l
	bad.Width = 9
	if _, err := Decode(bad.Encode()); err == nil {
		t.Error("a layout wider than its servers decoded")
	}
	got, err := ParseText("stripe_size=65536 stripe_width=2", l)
	if err != nil || got.Size != 65536 || got.Width != 2 || got.Start != 2 || got.ID != l.ID {
		t.Errorf("ParseText = %+v %v", got, err)
	}
	for _, text := range []string{"", "stripe_size=1000", "stripe_width=5", "stripe_width=0", "colour=3", "stripe_size"} {
		if _, err := ParseText(text, l); err == nil {
			t.Errorf("ParseText(%q) accepted", text)
		}
	}
	if l.Text() != "stripe_size=8388608 stripe_width=3 start=2" {
		t.Errorf("Text = %q", l.Text())
	}
}
