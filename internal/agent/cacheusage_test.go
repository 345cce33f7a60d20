package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/warpfs/server"
)

// TestCacheFragmentUsage: a cache fragment's store is opened by its first use, its figures
// (PFS bytes read and written, the flush backlog) reach the fragment's usage report (the
// accounting record's source) and the node's metrics, and teardown's flush drains it.
func TestCacheFragmentUsage(t *testing.T) {
	dir := t.TempDir()
	pfs := filepath.Join(dir, "pfs")
	os.Mkdir(pfs, 0o755)
	os.WriteFile(filepath.Join(pfs, "in"), bytes.Repeat([]byte("r"), 300<<10), 0o644)
	a, err := New(Options{Name: "s1", Pool: "p", SSDPath: filepath.Join(dir, "ssd"), Capacity: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	me := uint32(os.Geteuid())
	spec := agentapi.FragmentSpec{ID: 5, InstanceID: 9, Capacity: 64 << 20, InstanceCapacity: 64 << 20,
		Cache: &agentapi.CacheSpec{PFS: pfs, UID: me, GID: uint32(os.Getegid()), Servers: 1, StripeSize: 64 << 10}} // a stripe 1 MiB does not divide
	if err := a.CreateFragment(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if u, found, err := a.FragmentUsage(ctx, 5); err != nil || !found || u.Cache != nil {
		t.Fatalf("before any use: %+v %v %v (no store opened yet)", u.Cache, found, err)
	}
	target, err := a.cacheTargetOf(5)
	if err != nil || target == nil {
		t.Fatalf("cache target: %v", err)
	}
	door, err := target.Door(me, uint32(os.Getegid()))
	if err != nil {
		t.Fatal(err)
	}
	ref := func(name string) server.CacheFileRef {
		st, err := door.Lstat(name)
		if err != nil {
			t.Fatal(err)
		}
		key := server.CacheFileKey{Dev: st.Dev, Ino: st.Ino}
		return server.CacheFileRef{Path: name, Key: key, Layout: target.Layout.ForFile(7)}
	}
	in, err := target.Data.OpenFile(door, ref("in"), false)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 300<<10)
	if n, err := in.ReadAt(buf, 0); n != len(buf) || err != nil {
		t.Fatalf("read through: %d %v", n, err)
	}
	in.Close()
	f, err := door.OpenFile("out", os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := target.Data.OpenFile(door, ref("out"), true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := out.WriteAt(bytes.Repeat([]byte("w"), 200<<10), 0); err != nil {
		t.Fatal(err)
	}
	out.Close()
	u, _, _ := a.FragmentUsage(ctx, 5)
	if u.Cache == nil || u.Cache.PFSBytesRead < 300<<10 || u.Cache.Misses == 0 || u.Cache.Dirty != 200<<10 || u.Cache.PFSBytesWritten != 0 {
		t.Fatalf("after a read through and a write behind: %+v", u.Cache)
	}
	families, err := a.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]float64{}
	for _, mf := range families {
		if !strings.HasPrefix(mf.GetName(), "spillway_agent_cache_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := ""
			for _, l := range m.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + " "
			}
			if labels != "fragment=5 instance=9 " {
				t.Errorf("%s labels %q", mf.GetName(), labels)
			}
			seen[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	if seen["spillway_agent_cache_dirty_bytes"] != 200<<10 || seen["spillway_agent_cache_pfs_read_bytes_total"] < 300<<10 {
		t.Errorf("metrics: %v", seen)
	}
	for i := 0; ; i++ {
		st, err := a.FlushCache(ctx, agentapi.CacheFlushSpec{FragmentID: 5, InstanceID: 9})
		if err != nil || st.Error != "" {
			t.Fatalf("flush: %v %s", err, st.Error)
		}
		if st.Done {
			break
		}
		if i > 6000 {
			t.Fatal("the flush did not end within a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got, _ := os.ReadFile(filepath.Join(pfs, "out")); !bytes.Equal(got, bytes.Repeat([]byte("w"), 200<<10)) {
		t.Errorf("the PFS file after the flush: %d bytes", len(got))
	}
	if u, _, _ := a.FragmentUsage(ctx, 5); u.Cache == nil || u.Cache.PFSBytesWritten != 200<<10 || u.Cache.Dirty != 0 {
		t.Errorf("after the flush: %+v", u.Cache)
	}
}

// TestCacheExtentFitsTheStripe: a pool's stripe size that 1 MiB does not divide (any multiple
// of 4 KiB is allowed) gets extents that do divide it, so the cache accepts its layouts.
func TestCacheExtentFitsTheStripe(t *testing.T) {
	for stripe, want := range map[uint64]uint64{0: 1 << 20, 8 << 20: 1 << 20, 1 << 20: 1 << 20, 64 << 10: 64 << 10, 3 << 20: 1 << 20, 12 << 10: 4 << 10, 1536 << 10: 512 << 10} {
		if got := extentSize(stripe); got != want {
			t.Errorf("stripe %d: extent %d, want %d", stripe, got, want)
		}
	}
}
