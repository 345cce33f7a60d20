package etcd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/store"
	"github.com/spillway-hpc/spillway/internal/store/etcd/etcdtest"
	"github.com/spillway-hpc/spillway/internal/store/storetest"
)

var ctx = context.Background()

func options(endpoint, prefix string) Options {
	return Options{
		Endpoints: []string{endpoint}, Prefix: prefix,
		DialTimeout: 5 * time.Second, RequestTimeout: 10 * time.Second,
		TxnRetries: 20, MaxTxnOps: 128, MaxRequestBytes: 1536 << 10,
	}
}

func open(t *testing.T, o Options) *Engine {
	t.Helper()
	e, err := Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// TestConformance runs the suite every engine passes against a real etcd. Each test's
// directory names its own prefix: the tests share one etcd, as clusters may.
func TestConformance(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	storetest.Run(t, func(t *testing.T, dir string) store.Engine {
		sum := sha256.Sum256([]byte(dir))
		e, err := Open(ctx, options(srv.Endpoint, "/spillway-test/"+hex.EncodeToString(sum[:8])+"/"))
		if err != nil {
			t.Fatal(err)
		}
		return e
	})
}

// TestPrefixesAreSeparate: two clusters' state in one etcd do not see each other.
func TestPrefixesAreSeparate(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	a := open(t, options(srv.Endpoint, "/spillway/a/"))
	b := open(t, options(srv.Endpoint, "/spillway/ab/"))
	must(t, a.Update(ctx, func(kv store.KV) error {
		kv.NextSeq("job")
		return kv.Put("pool", "wlm_pool", []byte("a"))
	}))
	must(t, b.View(ctx, func(kv store.KV) error {
		kinds, err := kv.Kinds()
		seqs, _ := kv.Sequences()
		if err != nil || len(kinds) != 0 || len(seqs) != 0 {
			return fmt.Errorf("cluster b sees %v %v (%v)", kinds, seqs, err)
		}
		return nil
	}))
}

// TestConflictingWritersRetry: Updates of two processes (two clients) on the same counter
// race; the losers run again and no update is lost.
func TestConflictingWritersRetry(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	o := options(srv.Endpoint, "/spillway/")
	o.TxnRetries = 1000
	engines := []*Engine{open(t, o), open(t, o)}
	const each = 50
	var wg sync.WaitGroup
	var mu sync.Mutex
	runs := 0
	errs := make(chan error, len(engines))
	for _, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				err := e.Update(ctx, func(kv store.KV) error {
					mu.Lock()
					runs++
					mu.Unlock()
					n := 0
					if v, err := kv.Get("c", "n"); err == nil {
						fmt.Sscan(string(v), &n)
					} else if !errors.Is(err, store.ErrNotFound) {
						return err
					}
					return kv.Put("c", "n", []byte(fmt.Sprint(n+1)))
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	must(t, engines[0].View(ctx, func(kv store.KV) error {
		v, err := kv.Get("c", "n")
		if err != nil || string(v) != fmt.Sprint(2*each) {
			return fmt.Errorf("counter = %q (%v), want %d", v, err, 2*each)
		}
		return nil
	}))
	t.Logf("%d updates took %d runs of their functions", 2*each, runs)
}

// TestConflictRetriesAreBounded: an Update that always loses fails after TxnRetries runs,
// naming the key, and writes nothing.
func TestConflictRetriesAreBounded(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	o := options(srv.Endpoint, "/spillway/")
	o.TxnRetries = 3
	e, other := open(t, o), open(t, o)
	runs := 0
	err := e.Update(ctx, func(kv store.KV) error {
		runs++
		if _, err := kv.Get("c", "n"); !errors.Is(err, store.ErrNotFound) {
			return err
		}
		// Another writer commits between this transaction's snapshot and its commit.
		if err := other.Update(ctx, func(kv store.KV) error { return kv.Put("c", "other", []byte("x")) }); err != nil {
			return err
		}
		return kv.Put("c", "n", []byte("1"))
	})
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "store.etcd_txn_retries") || runs != 3 {
		t.Fatalf("Update that always loses: %v after %d runs, want ErrConflict naming store.etcd_txn_retries after 3", err, runs)
	}
	must(t, e.View(ctx, func(kv store.KV) error {
		if _, err := kv.Get("c", "n"); !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("the losing transaction's write is visible: %v", err)
		}
		return nil
	}))
}

// TestTransactionLimits: a transaction writing more keys than one etcd Txn holds fails before
// anything is written, naming the keys to raise; with both limits raised, it commits.
func TestTransactionLimits(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{MaxTxnOps: 512})
	o := options(srv.Endpoint, "/spillway/")
	e := open(t, o)
	write := func(e *Engine, n int) error {
		return e.Update(ctx, func(kv store.KV) error {
			for i := 0; i < n; i++ {
				if err := kv.Put("k", fmt.Sprintf("%04d", i), []byte("v")); err != nil {
					return err
				}
			}
			return nil
		})
	}
	count := func() int {
		n := 0
		must(t, e.View(ctx, func(kv store.KV) error {
			return kv.Scan("k", func(string, []byte) error { n++; return nil })
		}))
		return n
	}
	// The most one transaction may write at the defaults.
	must(t, write(e, o.MaxTxnOps-1))
	if n := count(); n != o.MaxTxnOps-1 {
		t.Fatalf("%d keys after writing %d", n, o.MaxTxnOps-1)
	}
	err := write(e, 200)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "store.etcd_max_txn_ops") || !strings.Contains(err.Error(), "--max-txn-ops") {
		t.Fatalf("writing 200 keys at etcd_max_txn_ops = 128: %v, want ErrTooLarge naming both limits", err)
	}
	if n := count(); n != o.MaxTxnOps-1 {
		t.Fatalf("a refused transaction wrote: %d keys", n)
	}
	// Too many bytes.
	big := e.Update(ctx, func(kv store.KV) error {
		return kv.Put("big", "x", make([]byte, 2<<20))
	})
	if !errors.Is(big, ErrTooLarge) || !strings.Contains(big.Error(), "store.etcd_max_request_bytes") {
		t.Fatalf("writing 2 MiB: %v, want ErrTooLarge naming store.etcd_max_request_bytes", big)
	}
	// Raised on both sides, 200 keys go in one transaction.
	o.MaxTxnOps = 512
	raised := open(t, o)
	must(t, write(raised, 200))
	if n := count(); n != 200 {
		t.Fatalf("%d keys after a 200-key transaction", n)
	}
	// Raised only on Spillway's side: etcd refuses, and the error says to make them agree.
	o.MaxTxnOps = 1024
	mismatched := open(t, o)
	err = write(mismatched, 600)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "make them agree") {
		t.Fatalf("600 keys on a member with --max-txn-ops 512: %v, want ErrTooLarge saying the limits disagree", err)
	}
}

// TestUnreachable: an etcd that does not answer fails Open within the dial timeout, naming
// the keys.
func TestUnreachable(t *testing.T) {
	o := options("http://127.0.0.1:1", "/spillway/")
	o.DialTimeout = 500 * time.Millisecond
	_, err := Open(ctx, o)
	if err == nil || !strings.Contains(err.Error(), "store.etcd_endpoints") {
		t.Fatalf("Open of a closed port: %v, want an error naming store.etcd_endpoints", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
