package ha

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/etcd"
	"github.com/spillway-hpc/spillway/internal/store/etcd/etcdtest"
)

const prefix = "/spillway/ha/"

func open(t *testing.T, endpoint string) *etcd.Engine {
	t.Helper()
	eng, err := etcd.Open(context.Background(), etcd.Options{Endpoints: []string{endpoint}, Prefix: prefix,
		DialTimeout: 5 * time.Second, RequestTimeout: 5 * time.Second, TxnRetries: 20, MaxTxnOps: 128, MaxRequestBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng
}

// candidate is one controller's election, with a lead function that counts its terms and
// tells when its context ended.
type candidate struct {
	el      *Elector
	eng     *etcd.Engine
	stop    context.CancelFunc
	done    chan struct{}
	leading atomic.Int32 // lead calls running
}

func campaign(t *testing.T, endpoint, name string) *candidate {
	t.Helper()
	eng := open(t, endpoint)
	el, err := New(eng, Options{Advertise: "http://" + name, LeaseTTL: 2 * time.Second, RetryWait: 100 * time.Millisecond,
		RequestTimeout: 5 * time.Second, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &candidate{el: el, eng: eng, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		el.Run(ctx, func(ctx context.Context) {
			c.leading.Add(1)
			<-ctx.Done()
			c.leading.Add(-1)
		})
	}()
	t.Cleanup(func() { stop(); <-c.done })
	return c
}

func write(eng *etcd.Engine, key string) error {
	return eng.Update(context.Background(), func(kv store.KV) error { return kv.Put("test", key, []byte("x")) })
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOneLeaderAndFencedWrites: of two candidates one leads and writes; the other's writes are
// refused. When the leader's key goes behind its back (its lease expired in etcd while it
// still believed it led), its writes are fenced by etcd itself, the other leads, and the
// deposed one steps down (its lead context ends) and becomes a candidate again. A leader
// that stops hands over at once (its lease revoked).
func TestOneLeaderAndFencedWrites(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	a := campaign(t, srv.Endpoint, "a")
	waitFor(t, "a to lead", func() bool { return a.el.Leading() && a.leading.Load() == 1 })
	b := campaign(t, srv.Endpoint, "b")
	if err := write(a.eng, "by-a"); err != nil {
		t.Fatalf("the leader's write: %v", err)
	}
	if err := write(b.eng, "by-b"); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("a candidate's write: %v, want ErrFenced", err)
	}
	if addr, err := b.el.Leader(context.Background()); err != nil || addr != "http://a" {
		t.Fatalf("b sees the leader at %q (%v), want http://a", addr, err)
	}

	// Depose a behind its back: its key goes, as when etcd expires its lease while a's
	// renewals are late. x is a process that still holds a's fence and has not heard: its
	// writes commit while the key lives and are refused by etcd itself once it went.
	key, rev := leaderKV(t, a)
	x := open(t, srv.Endpoint)
	x.Fence(key, rev)
	if err := write(x, "by-a-fence"); err != nil {
		t.Fatalf("a write under the leader's fence: %v", err)
	}
	cli := a.eng.Client()
	if _, err := cli.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	err := write(x, "by-deposed-a")
	if !errors.Is(err, store.ErrFenced) || !strings.Contains(err.Error(), "won at revision") {
		t.Fatalf("a write under the deposed leader's fence: %v, want ErrFenced from etcd's compare", err)
	}
	waitFor(t, "b to lead", func() bool { return b.el.Leading() })
	if err := write(b.eng, "by-b"); err != nil {
		t.Fatalf("the new leader's write: %v", err)
	}
	if err := write(x, "by-deposed-a"); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("a write under the deposed leader's fence after the new leader's: %v, want ErrFenced", err)
	}
	waitFor(t, "a to step down", func() bool { return !a.el.Leading() && a.leading.Load() == 0 })
	if resp, _ := cli.Get(context.Background(), prefix+"kv/test/by-deposed-a"); len(resp.Kvs) != 0 {
		t.Fatal("the deposed leader's write is in etcd")
	}

	// b stops cleanly: its lease is revoked, a leads again without waiting out a TTL.
	b.stop()
	<-b.done
	waitFor(t, "a to lead again", func() bool { return a.el.Leading() && a.leading.Load() == 1 })
	if a.el.Terms() != 2 {
		t.Fatalf("a led %d terms, want 2", a.el.Terms())
	}
	if err := write(a.eng, "by-a-again"); err != nil {
		t.Fatalf("the leader's write: %v", err)
	}
}

// leaderKV returns the current leader's key and its create revision.
func leaderKV(t *testing.T, c *candidate) (string, int64) {
	t.Helper()
	resp, err := c.eng.Client().Get(context.Background(), prefix+"election/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("no leader key: %v", err)
	}
	return string(resp.Kvs[0].Key), resp.Kvs[0].CreateRevision
}
