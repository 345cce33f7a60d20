package agent

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/agentclient"
	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/warpfs/cache"
)

// memStore is an in-memory cacheStore: its dirty bytes go to the "PFS" step bytes per tick
// the test sends; with fail set, a drain stops with it at its next tick, keeping the data.
type memStore struct {
	mu             sync.Mutex
	dirty, flushed uint64
	discarded      uint64
	step           uint64
	fail           error
	drains         int
	tick           chan struct{} // one step per receive
	moved          chan struct{} // sent after each step
	drainReturned  chan error
}

func newMemStore(dirty, step uint64) *memStore {
	return &memStore{dirty: dirty, step: step, tick: make(chan struct{}), moved: make(chan struct{}, 16), drainReturned: make(chan error, 16)}
}

func (m *memStore) Drain(ctx context.Context) (err error) {
	defer func() { m.drainReturned <- err }()
	m.mu.Lock()
	m.drains++
	m.mu.Unlock()
	for {
		m.mu.Lock()
		dirty := m.dirty
		m.mu.Unlock()
		if dirty == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.tick:
		}
		m.mu.Lock()
		if m.fail != nil {
			err := m.fail
			m.mu.Unlock()
			m.moved <- struct{}{}
			return err
		}
		n := min(m.step, m.dirty)
		m.dirty -= n
		m.flushed += n
		m.mu.Unlock()
		m.moved <- struct{}{}
	}
}

func (m *memStore) Discard() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.dirty
	m.discarded += n
	m.dirty = 0
	return n
}

func (m *memStore) Stats() cache.Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return cache.Stats{Dirty: m.dirty, FlushedBytes: m.flushed, DiscardedBytes: m.discarded}
}

func (m *memStore) drainCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.drains
}

func flushAgent(t *testing.T) *Agent {
	t.Helper()
	a, err := New(Options{Name: "ssd1", Pool: "p", SSDPath: filepath.Join(t.TempDir(), "ssd"), Capacity: 256 * mib})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// pollUntil polls the flush until cond holds (the drain's goroutine records its end a moment
// after its last step).
func pollUntil(t *testing.T, a *Agent, spec agentapi.CacheFlushSpec, cond func(agentapi.CacheFlushStatus) bool) agentapi.CacheFlushStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := a.FlushCache(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("flush never got there: last %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFlushCachePollsUntilDrained: the first poll starts one drain, later polls report its
// progress from the store's counters, and the drain's end is Done; polls after Done say
// Done. A fragment without a store is Done at once.
func TestFlushCachePollsUntilDrained(t *testing.T) {
	a := flushAgent(t)
	if st, err := a.FlushCache(context.Background(), agentapi.CacheFlushSpec{FragmentID: 9, InstanceID: 1}); err != nil || st != (agentapi.CacheFlushStatus{Done: true}) {
		t.Fatalf("no store: %+v %v", st, err)
	}
	m := newMemStore(300, 100)
	a.setCacheStore(7, m)
	spec := agentapi.CacheFlushSpec{FragmentID: 7, InstanceID: 1}
	st, err := a.FlushCache(context.Background(), spec)
	if err != nil || st.Done || st.DirtyBytes != 300 || st.FlushedBytes != 0 || st.Error != "" {
		t.Fatalf("first poll: %+v %v", st, err)
	}
	for i, wantDirty := range []uint64{200, 100} {
		m.tick <- struct{}{}
		<-m.moved
		st, err := a.FlushCache(context.Background(), spec)
		if err != nil || st.Done || st.DirtyBytes != wantDirty || st.FlushedBytes != 300-wantDirty {
			t.Fatalf("poll %d: %+v %v", i+2, st, err)
		}
	}
	m.tick <- struct{}{}
	<-m.moved
	st = pollUntil(t, a, spec, func(s agentapi.CacheFlushStatus) bool { return s.Done })
	if st.DirtyBytes != 0 || st.FlushedBytes != 300 || st.Error != "" {
		t.Fatalf("done: %+v", st)
	}
	if st, _ := a.FlushCache(context.Background(), spec); !st.Done {
		t.Fatalf("after done: %+v", st)
	}
	if n := m.drainCount(); n != 1 {
		t.Fatalf("%d drains for one fragment, want 1 however often it is polled", n)
	}
	// The fragment deleted: its store and flush are forgotten.
	if err := a.DeleteFragment(context.Background(), 7); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.caches.stores[7]; ok || a.caches.flushes[7] != nil {
		t.Fatal("a deleted fragment's cache is still registered")
	}
}

// TestFlushCacheFailure: a drain that fails is reported once with its error, the data kept;
// the next poll drains again, which (the PFS fixed) ends Done.
func TestFlushCacheFailure(t *testing.T) {
	a := flushAgent(t)
	m := newMemStore(300, 100)
	m.fail = errors.New("pfs: no space left on device (ENOSPC) on /lustre/me/run/out.dat")
	a.setCacheStore(7, m)
	spec := agentapi.CacheFlushSpec{FragmentID: 7, InstanceID: 1}
	if st, err := a.FlushCache(context.Background(), spec); err != nil || st.Done || st.Error != "" {
		t.Fatalf("first poll: %+v %v", st, err)
	}
	m.tick <- struct{}{}
	<-m.moved
	st := pollUntil(t, a, spec, func(s agentapi.CacheFlushStatus) bool { return s.Error != "" })
	if st.Done || st.Error != m.fail.Error() || st.DirtyBytes != 300 {
		t.Fatalf("failed flush: %+v", st)
	}
	m.mu.Lock()
	m.fail = nil
	m.mu.Unlock()
	if st, err := a.FlushCache(context.Background(), spec); err != nil || st.Done || st.Error != "" {
		t.Fatalf("the poll after the failure starts again: %+v %v", st, err)
	}
	if n := m.drainCount(); n != 2 {
		// The second drain may not have counted yet: wait for it.
		pollUntil(t, a, spec, func(agentapi.CacheFlushStatus) bool { return m.drainCount() == 2 })
	}
	for range 3 {
		m.tick <- struct{}{}
		<-m.moved
	}
	st = pollUntil(t, a, spec, func(s agentapi.CacheFlushStatus) bool { return s.Done })
	if st.FlushedBytes != 300 || st.Error != "" {
		t.Fatalf("after the fix: %+v", st)
	}
}

// TestFlushCacheDiscard: with Discard the dirty data is dropped (the drain under way stops)
// and the answer is Done with the bytes dropped, the same at every later call.
func TestFlushCacheDiscard(t *testing.T) {
	a := flushAgent(t)
	m := newMemStore(500, 100)
	a.setCacheStore(7, m)
	spec := agentapi.CacheFlushSpec{FragmentID: 7, InstanceID: 1}
	if st, _ := a.FlushCache(context.Background(), spec); st.Done {
		t.Fatalf("first poll: %+v", st)
	}
	m.tick <- struct{}{}
	<-m.moved // 100 flushed, 400 dirty
	spec.Discard = true
	st, err := a.FlushCache(context.Background(), spec)
	if err != nil || !st.Done || st.DiscardedBytes != 400 || st.FlushedBytes != 100 {
		t.Fatalf("discard: %+v %v", st, err)
	}
	select {
	case <-m.drainReturned:
	case <-time.After(10 * time.Second):
		t.Fatal("the drain under way did not stop at the discard")
	}
	for _, discard := range []bool{true, false} {
		spec.Discard = discard
		if st, err := a.FlushCache(context.Background(), spec); err != nil || !st.Done || st.DiscardedBytes != 400 {
			t.Fatalf("again (discard %v): %+v %v", discard, st, err)
		}
	}
	if n := m.drainCount(); n != 1 {
		t.Fatalf("%d drains", n)
	}
}

// TestFlushCacheOverHTTP: the controller's client of a remote agent reaches FlushCache
// through the agent's API, the spec and the status whole.
func TestFlushCacheOverHTTP(t *testing.T) {
	a := flushAgent(t)
	m := newMemStore(42, 1)
	a.setCacheStore(7, m)
	srv := httptest.NewServer(Handler(a, "secret"))
	defer srv.Close()
	c, err := agentclient.New("ssd1", srv.URL, apiclient.Options{Token: "secret", ConnectRetries: 1, RequestTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.FlushCache(context.Background(), agentapi.CacheFlushSpec{FragmentID: 7, InstanceID: 1, Discard: true})
	if err != nil || st != (agentapi.CacheFlushStatus{Done: true, DiscardedBytes: 42}) {
		t.Fatalf("discard over HTTP: %+v %v", st, err)
	}
	if st, err := c.FlushCache(context.Background(), agentapi.CacheFlushSpec{FragmentID: 8, InstanceID: 1}); err != nil || !st.Done {
		t.Fatalf("a fragment without a store over HTTP: %+v %v", st, err)
	}
}
