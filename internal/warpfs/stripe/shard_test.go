package stripe

import (
	"fmt"
	"testing"
)

func TestShardIsDeterministicAndInRange(t *testing.T) {
	for shards := 1; shards <= 7; shards++ {
		for i := 0; i < 200; i++ {
			name := fmt.Sprintf("f%d", i)
			s := Shard(42, name, shards)
			if s < 0 || s >= shards {
				t.Fatalf("Shard(42, %q, %d) = %d, out of range", name, shards, s)
			}
			if again := Shard(42, name, shards); again != s {
				t.Fatalf("Shard(42, %q, %d) = %d then %d", name, shards, s, again)
			}
		}
	}
}

// Many names of one directory spread evenly: the point of max_mds.
func TestShardSpreadsOneDirectory(t *testing.T) {
	for _, shards := range []int{2, 3, 4, 8} {
		const n = 12000
		counts := make([]int, shards)
		for i := 0; i < n; i++ {
			counts[Shard(7, fmt.Sprintf("rank%05d.out", i), shards)]++
		}
		for s, c := range counts {
			if want := n / shards; c < want*85/100 || c > want*115/100 {
				t.Fatalf("%d shards: shard %d holds %d of %d names, want about %d: %v", shards, s, c, n, want, counts)
			}
		}
	}
}

// The same name in different directories (rank directories holding the same file names)
// spreads too: the directory's id is part of the key.
func TestShardSpreadsOneNameOverDirectories(t *testing.T) {
	const shards, n = 4, 4000
	counts := make([]int, shards)
	for d := uint64(0); d < n; d++ {
		counts[Shard(1000+d*7919, "output.h5", shards)]++
	}
	for s, c := range counts {
		if c < n/shards*85/100 || c > n/shards*115/100 {
			t.Fatalf("shard %d holds %d of %d directories' output.h5: %v", s, c, n, counts)
		}
	}
}

func TestShardOfOneShard(t *testing.T) {
	if s := Shard(99, "x", 1); s != 0 {
		t.Fatalf("one shard: got %d", s)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Shard with 0 shards did not panic")
		}
	}()
	Shard(1, "x", 0)
}
