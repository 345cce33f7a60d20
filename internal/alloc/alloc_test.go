package alloc

import (
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
)

func nodes(spec ...string) []Node {
	// "name:grains:used:instances[:off|:drain|:worn]"
	var out []Node
	for _, s := range spec {
		var n Node
		parts := strings.Split(s, ":")
		n.Name = parts[0]
		fmt.Sscan(parts[1], &n.Grains)
		fmt.Sscan(parts[2], &n.Used)
		fmt.Sscan(parts[3], &n.Instances)
		n.Online = true
		if len(parts) > 4 {
			n.Online = parts[4] != "off"
			n.Drain = parts[4] == "drain"
			n.Worn = parts[4] == "worn"
		}
		out = append(out, n)
	}
	return out
}

func show(p []Placement) string {
	var parts []string
	for _, x := range p {
		parts = append(parts, fmt.Sprintf("%s=%d", x.Node, x.Grains))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func TestBandwidthSpreadsLeastLoadedFirst(t *testing.T) {
	ns := nodes("a:10:0:2", "b:10:0:0", "c:10:0:1", "d:10:0:0")
	p, err := Place(ns, 3, Bandwidth)
	if err != nil {
		t.Fatal(err)
	}
	if got := show(p); got != "b=1 c=1 d=1" {
		t.Fatalf("3 grains over 4 nodes: %s, want the three least loaded", got)
	}
	p, _ = Place(nodes("a:10:0:0", "b:10:0:0"), 5, Bandwidth)
	if got := show(p); got != "a=3 b=2" {
		t.Fatalf("5 grains over 2 nodes: %s, want an even deal", got)
	}
}

func TestBandwidthFillsAroundFullNodes(t *testing.T) {
	p, err := Place(nodes("a:2:0:0", "b:10:0:0"), 6, Bandwidth)
	if err != nil {
		t.Fatal(err)
	}
	if got := show(p); got != "a=2 b=4" {
		t.Fatalf("got %s", got)
	}
}

func TestInterferencePacks(t *testing.T) {
	p, err := Place(nodes("a:4:0:0", "b:10:2:1", "c:6:0:0"), 9, Interference)
	if err != nil {
		t.Fatal(err)
	}
	if got := show(p); got != "b=8 c=1" {
		t.Fatalf("got %s, want the largest free node first", got)
	}
}

func TestNeverOnOfflineDrainedOrFullNodes(t *testing.T) {
	ns := nodes("off:10:0:0:off", "dr:10:0:0:drain", "worn:10:0:0:worn", "full:4:4:1", "ok:3:0:0")
	for _, s := range []string{Bandwidth, Interference} {
		p, err := Place(ns, 3, s)
		if err != nil {
			t.Fatal(err)
		}
		if got := show(p); got != "ok=3" {
			t.Fatalf("%s: got %s", s, got)
		}
	}
	_, err := Place(ns, 4, Bandwidth)
	var ie *InsufficientError
	if !errors.As(err, &ie) || ie.Free != 3 || ie.Requested != 4 {
		t.Fatalf("over-capacity: %v", err)
	}
	for _, want := range []string{"only 3 are free", "off offline", "dr drained", "worn SSD worn", "full full"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestUnknownStrategy(t *testing.T) {
	if _, err := Place(nodes("a:1:0:0"), 1, "fastest"); err == nil || !strings.Contains(err.Error(), "bandwidth") {
		t.Fatalf("got %v", err)
	}
}

// TestProperties checks, over many random pools, the allocator's promises.
func TestProperties(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for iter := 0; iter < 5000; iter++ {
		var ns []Node
		for i := 0; i < 1+rng.Intn(12); i++ {
			g := uint64(rng.Intn(20))
			n := Node{Name: fmt.Sprintf("n%02d", i), Grains: g, Used: uint64(rng.Intn(int(g) + 1)), Instances: rng.Intn(4), Online: rng.Intn(8) > 0, Drain: rng.Intn(8) == 0}
			ns = append(ns, n)
		}
		want := uint64(rng.Intn(60))
		strategy := []string{Bandwidth, Interference}[rng.Intn(2)]
		var free uint64
		eligible := 0
		var frees []uint64
		for _, n := range ns {
			if n.eligible() {
				free += n.Free()
				eligible++
				frees = append(frees, n.Free())
			}
		}
		p, err := Place(append([]Node(nil), ns...), want, strategy)
		if want > free {
			if err == nil {
				t.Fatalf("iter %d: %d grains placed with %d free", iter, want, free)
			}
			continue
		}
		if err != nil {
			t.Fatalf("iter %d: %v", iter, err)
		}
		byName := map[string]Node{}
		for _, n := range ns {
			byName[n.Name] = n
		}
		var total uint64
		seen := map[string]bool{}
		for _, x := range p {
			n := byName[x.Node]
			if seen[x.Node] {
				t.Fatalf("iter %d: node %s placed twice", iter, x.Node)
			}
			seen[x.Node] = true
			if !n.eligible() {
				t.Fatalf("iter %d: placed on ineligible node %+v", iter, n)
			}
			if x.Grains == 0 || n.Used+x.Grains > n.Grains {
				t.Fatalf("iter %d: over-commits %+v with %d", iter, n, x.Grains)
			}
			total += x.Grains
		}
		if total != want {
			t.Fatalf("iter %d: placed %d grains, asked %d", iter, total, want)
		}
		switch strategy {
		case Bandwidth:
			if wantNodes := min(int(want), eligible); len(p) < wantNodes && want > 0 {
				// Fewer nodes only if the others could not take a grain (never, as eligible ones have room).
				t.Fatalf("iter %d: bandwidth used %d nodes, %d possible", iter, len(p), wantNodes)
			}
		case Interference:
			sort.Slice(frees, func(i, j int) bool { return frees[i] > frees[j] })
			fewest, acc := 0, uint64(0)
			for acc < want {
				acc += frees[fewest]
				fewest++
			}
			if len(p) != fewest {
				t.Fatalf("iter %d: interference used %d nodes, fewest possible %d", iter, len(p), fewest)
			}
		}
	}
}

func TestInsufficientErrorCountsInWords(t *testing.T) {
	msg := (&InsufficientError{Requested: 1, Free: 1, FreeNodes: 1, TotalNodes: 2}).Error()
	if !strings.Contains(msg, "requested 1 grain but only 1 is free") {
		t.Errorf("%q", msg)
	}
	if msg := (&InsufficientError{Requested: 3, Free: 2}).Error(); !strings.Contains(msg, "requested 3 grains but only 2 are free") {
		t.Errorf("%q", msg)
	}
}
