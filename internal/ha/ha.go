// Package ha makes the controller highly available: several controllers share one etcd store,
// and one of them, the leader, runs the executor and takes writes.
//
// Election: each controller holds an etcd session (a lease of ha.lease_ttl, kept alive by the
// client) and campaigns with etcd's election recipe (package concurrency) under
// <store.etcd_prefix>election/, its value the controller's advertised API address
// (ha.advertise). The candidate whose key was created first leads; the others wait for its key
// to go. A leader killed or cut off stops renewing its lease, etcd deletes its key after at
// most ha.lease_ttl, and the next candidate leads.
//
// Fencing: a controller that wins guards every later store write with its election key's
// create revision (etcd.Engine.Fence), so a write sent after its key went (lease expired, or
// another won) never commits, whatever this process believes. When its session ends (its
// lease expired or could not be renewed), it fences itself at once (every write refused
// without asking etcd), stops leading (the executor's context ends and Run waits for it), and
// campaigns again as a candidate after ha.retry_wait: a deposed leader steps down; it does not
// exit.
package ha

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/spillway-hpc/spillway/internal/store/etcd"
)

// Options configure an Elector (config section [ha]).
type Options struct {
	// Advertise is this controller's API address as clients and agents reach it
	// (ha.advertise): the leader's is what followers name in their not_leader answers.
	Advertise string
	// LeaseTTL is the session's lease (ha.lease_ttl): a leader that stops renewing it is
	// replaced at most this long after.
	LeaseTTL time.Duration
	// RetryWait is the pause before campaigning again after leadership was lost or etcd
	// failed (ha.retry_wait).
	RetryWait time.Duration
	// RequestTimeout bounds one etcd request (store.etcd_request_timeout).
	RequestTimeout time.Duration
	Log            *slog.Logger
}

// Elector campaigns for one controller.
type Elector struct {
	eng     *etcd.Engine
	o       Options
	prefix  string // the election's key prefix (with its trailing "/")
	leading atomic.Bool
	// terms counts the leaderships won (tests, metrics).
	terms atomic.Int64
}

// New makes an Elector on the engine's etcd, under its prefix. The engine is fenced at once:
// no write commits until this controller is elected.
func New(eng *etcd.Engine, o Options) (*Elector, error) {
	if o.Advertise == "" {
		return nil, errors.New("ha.advertise is empty: name this controller's API address as clients reach it, e.g. \"https://10.0.0.1:7700\"")
	}
	ttl := int(o.LeaseTTL / time.Second)
	if ttl < 1 || o.LeaseTTL%time.Second != 0 {
		return nil, fmt.Errorf("ha.lease_ttl %s: etcd leases count whole seconds; give at least 1s, in seconds", o.LeaseTTL)
	}
	e := &Elector{eng: eng, o: o, prefix: eng.Prefix() + "election/"}
	eng.Fence(e.prefix, 0)
	return e, nil
}

// Leading reports whether this controller leads now.
func (e *Elector) Leading() bool { return e.leading.Load() }

// Terms is how many times this controller was elected.
func (e *Elector) Terms() int64 { return e.terms.Load() }

// Leader returns the advertised address of the current leader ("" when none is elected).
func (e *Elector) Leader(ctx context.Context) (string, error) {
	rctx, cancel := context.WithTimeout(ctx, e.o.RequestTimeout)
	defer cancel()
	resp, err := e.eng.Client().Get(rctx, e.prefix, clientv3.WithFirstCreate()...)
	if err != nil {
		return "", fmt.Errorf("etcd: who leads: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}

// Run campaigns until ctx ends. Each time this controller is elected, lead runs with a context
// that ends when the leadership is lost (or ctx ends); Run waits for lead to return before it
// campaigns again, so that two lead calls of one process never overlap.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context)) {
	for ctx.Err() == nil {
		err := e.term(ctx, lead)
		if ctx.Err() != nil {
			return
		}
		e.o.Log.Warn("not leading; campaigning again", "err", err, "retry_wait", e.o.RetryWait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(e.o.RetryWait):
		}
	}
}

// errLost ends a term whose session ended.
var errLost = errors.New("leadership lost: the session's lease expired or could not be renewed (ha.lease_ttl)")

// watchGone returns a channel closed when key, created at rev, is deleted.
func (e *Elector) watchGone(ctx context.Context, key string, rev int64) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		for resp := range e.eng.Client().Watch(clientv3.WithRequireLeader(ctx), key, clientv3.WithRev(rev)) {
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					close(gone)
					return
				}
			}
		}
	}()
	return gone
}

// term is one session: campaign, lead until the session ends, step down.
func (e *Elector) term(ctx context.Context, lead func(ctx context.Context)) error {
	// The lease is granted under a deadline (a controller cut off from etcd must still stop
	// on SIGTERM); the session keeps it alive until this term ends, and revokes it then, so
	// that a controller that stops cleanly hands over at once instead of after ha.lease_ttl.
	ttl := int64(e.o.LeaseTTL / time.Second)
	gctx, gcancel := context.WithTimeout(ctx, e.o.RequestTimeout)
	lease, err := e.eng.Client().Grant(gctx, ttl)
	gcancel()
	if err != nil {
		return fmt.Errorf("etcd: grant a lease: %w", err)
	}
	s, err := concurrency.NewSession(e.eng.Client(), concurrency.WithLease(lease.ID), concurrency.WithTTL(int(ttl)),
		concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return fmt.Errorf("etcd: open a session: %w", err)
	}
	defer func() {
		e.eng.Fence(e.prefix, 0)
		s.Orphan() // stop renewing
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.o.RequestTimeout)
		defer cancel()
		e.eng.Client().Revoke(rctx, lease.ID) // the key goes with it; an expired lease is gone anyway
	}()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.Done():
			cancel()
		case <-cctx.Done():
		}
	}()
	el := concurrency.NewElection(s, e.eng.Prefix()+"election")
	e.o.Log.Info("campaigning for leadership", "advertise", e.o.Advertise, "lease_ttl", e.o.LeaseTTL)
	campaigned := make(chan error, 1)
	go func() { campaigned <- el.Campaign(cctx, e.o.Advertise) }()
	select {
	case err = <-campaigned:
	case <-ctx.Done():
		// Stopping: a campaign cut off from etcd may still be cleaning up its key there; the
		// lease's revocation (or expiry) removes it anyway.
		return ctx.Err()
	}
	if err != nil {
		select {
		case <-s.Done():
			return errLost
		default:
		}
		return fmt.Errorf("etcd: campaign: %w", err)
	}
	e.eng.Fence(el.Key(), el.Rev())
	e.leading.Store(true)
	e.terms.Add(1)
	e.o.Log.Info("elected leader: running the executor", "key", el.Key(), "revision", el.Rev())
	lctx, lcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); lead(lctx) }()
	// The key may also go while the session lives (an administrator deleted it, or etcd's
	// lease expired while this process's renewals were late): step down then too.
	gone := e.watchGone(cctx, el.Key(), el.Rev())
	select {
	case <-s.Done():
		err = errLost
	case <-gone:
		err = errors.New("leadership lost: the election key was deleted")
	case <-ctx.Done():
	case <-done: // lead returned on its own: give the leadership up
		err = errors.New("the executor stopped")
	}
	// Step down: refuse every write from now on, then stop the executor and wait for it, so
	// that nothing of this term acts after Run campaigns again.
	e.eng.Fence(e.prefix, 0)
	e.leading.Store(false)
	lcancel()
	<-done
	if err != nil {
		e.o.Log.Error("stepped down: the executor stopped, writes are fenced", "err", err)
	}
	return err
}
