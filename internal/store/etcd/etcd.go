// Package etcd is the store engine on etcd v3: the state of one or several clusters (each under
// its own key prefix) in an etcd cluster, reached with the official Go client.
//
// Transactions are optimistic. Every transaction reads at one revision of etcd (a snapshot),
// buffers its writes, and commits them in one etcd Txn guarded by a single compare: the commit
// key's modification revision is still the one it read. Every committing Update writes the
// commit key, so two Updates that overlap never both commit: the loser runs again, up to
// store.etcd_txn_retries times. Updates of one process take turns (a mutex), so only writers
// in other processes (a restore, a second controller) make an Update run again. A transaction
// writes at most MaxTxnOps-1 keys and MaxRequestBytes bytes (etcd's --max-txn-ops and
// --max-request-bytes); more is refused before anything is sent, naming the limits.
//
// Fencing (a highly available controller, package ha): once Fence is called, every commit also
// compares the create revision of the leader's election key with the revision it won with, so
// that the writes of a controller that lost its leadership (its lease expired, its key went, or
// another won since) never commit: Update returns store.ErrFenced.
//
// Keys: <prefix>kv/<kind>/<key> for the objects, <prefix>seq/<name> for the sequences,
// <prefix>commit for the commit key.
package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/spillway-hpc/spillway/internal/store"
)

// Options reach one etcd cluster.
type Options struct {
	Endpoints []string
	Prefix    string // ends with "/"
	TLS       *tls.Config
	Username  string
	Password  string
	// DialTimeout bounds connecting; RequestTimeout one request.
	DialTimeout    time.Duration
	RequestTimeout time.Duration
	// TxnRetries bounds how often an Update that lost a race is run again.
	TxnRetries int
	// MaxTxnOps and MaxRequestBytes are the members' --max-txn-ops and --max-request-bytes.
	MaxTxnOps       int
	MaxRequestBytes int
}

// ErrTooLarge is wrapped by an Update's error when its writes exceed a transaction's limits.
var ErrTooLarge = errors.New("transaction too large for etcd")

// ErrConflict is wrapped by an Update's error when it lost TxnRetries races in a row.
var ErrConflict = errors.New("transaction kept conflicting with other writers")

// Engine is a store.Engine on etcd.
type Engine struct {
	cli     *clientv3.Client
	o       Options
	writeMu sync.Mutex

	fenceMu  sync.Mutex
	fenceKey string // the election key the writes are guarded by ("" = not fenced)
	fenceRev int64  // its create revision when won; 0 = fenced with no leadership held
}

// Client is the engine's etcd connection (the election of package ha shares it).
func (e *Engine) Client() *clientv3.Client { return e.cli }

// Prefix is the key prefix of the engine's state.
func (e *Engine) Prefix() string { return e.o.Prefix }

// Fence guards every later commit: it commits only while key exists with create revision rev
// (the election key this process won with). rev 0 refuses every write without asking etcd
// (a controller that leads no more, or not yet).
func (e *Engine) Fence(key string, rev int64) {
	e.fenceMu.Lock()
	e.fenceKey, e.fenceRev = key, rev
	e.fenceMu.Unlock()
}

func (e *Engine) fence() (string, int64) {
	e.fenceMu.Lock()
	defer e.fenceMu.Unlock()
	return e.fenceKey, e.fenceRev
}

// Open connects to etcd and checks that it answers.
func Open(ctx context.Context, o Options) (*Engine, error) {
	if !strings.HasSuffix(o.Prefix, "/") {
		return nil, fmt.Errorf("etcd prefix %q must end with \"/\"", o.Prefix)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   o.Endpoints,
		DialTimeout: o.DialTimeout,
		TLS:         o.TLS,
		Username:    o.Username,
		Password:    o.Password,
		Logger:      zap.NewNop(),
		Context:     context.WithoutCancel(ctx),
	})
	failed := func(err error) error {
		return fmt.Errorf("etcd %s does not answer: %w (store.etcd_endpoints, store.etcd_dial_timeout; TLS: store.etcd_ca_file, store.etcd_cert_file; auth: store.etcd_username, store.etcd_password_file)", strings.Join(o.Endpoints, ","), err)
	}
	if err != nil {
		return nil, failed(err)
	}
	e := &Engine{cli: cli, o: o}
	rctx, cancel := context.WithTimeout(ctx, o.DialTimeout)
	defer cancel()
	if _, err := cli.Get(rctx, e.commitKey()); err != nil {
		cli.Close()
		return nil, failed(err)
	}
	return e, nil
}

// Close closes the connection.
func (e *Engine) Close() error { return e.cli.Close() }

func (e *Engine) commitKey() string              { return e.o.Prefix + "commit" }
func (e *Engine) kindPrefix() string             { return e.o.Prefix + "kv/" }
func (e *Engine) objKey(kind, key string) string { return e.o.Prefix + "kv/" + kind + "/" + key }
func (e *Engine) seqPrefix() string              { return e.o.Prefix + "seq/" }

// Update runs fn in a read-write transaction, again if it lost a race with another writer.
func (e *Engine) Update(ctx context.Context, fn func(store.KV) error) error {
	e.writeMu.Lock()
	defer e.writeMu.Unlock()
	for attempt := 1; ; attempt++ {
		if key, rev := e.fence(); key != "" && rev == 0 {
			return fmt.Errorf("etcd: %w", store.ErrFenced)
		}
		t, err := e.begin(ctx, true)
		if err != nil {
			return err
		}
		err = fn(t)
		if t.stale {
			// A read found its revision compacted away: the snapshot is gone, start again.
		} else if err != nil {
			return err
		} else {
			ok, err := t.commit()
			if err != nil || ok {
				return err
			}
		}
		if attempt >= e.o.TxnRetries {
			return fmt.Errorf("etcd: %w: %d attempts (store.etcd_txn_retries); does another controller write under the prefix %q?", ErrConflict, attempt, e.o.Prefix)
		}
	}
}

// View runs fn in a read-only transaction: every read at one revision.
func (e *Engine) View(ctx context.Context, fn func(store.KV) error) error {
	t, err := e.begin(ctx, false)
	if err != nil {
		return err
	}
	return fn(t)
}

func (e *Engine) begin(ctx context.Context, writable bool) (*txn, error) {
	t := &txn{e: e, ctx: ctx, writable: writable, writes: map[string]*write{}}
	resp, err := e.get(ctx, e.commitKey())
	if err != nil {
		return nil, err
	}
	t.rev = resp.Header.Revision
	if len(resp.Kvs) > 0 {
		t.commitRev = resp.Kvs[0].ModRevision
	}
	return t, nil
}

func (e *Engine) get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	rctx, cancel := context.WithTimeout(ctx, e.o.RequestTimeout)
	defer cancel()
	resp, err := e.cli.Get(rctx, key, opts...)
	if err != nil {
		return nil, fmt.Errorf("etcd: read %s: %w", key, err)
	}
	return resp, nil
}

type write struct {
	value   []byte
	deleted bool
}

type txn struct {
	e         *Engine
	ctx       context.Context
	writable  bool
	rev       int64 // the snapshot every read sees
	commitRev int64 // the commit key's modification revision at rev (0: none yet)
	writes    map[string]*write
	stale     bool // a read's revision was compacted
}

func (t *txn) read(key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := t.e.get(t.ctx, key, append(opts, clientv3.WithRev(t.rev))...)
	if errors.Is(err, rpctypes.ErrCompacted) {
		t.stale = true
	}
	return resp, err
}

func checkKind(kind string) error {
	if kind == "" || strings.Contains(kind, "/") {
		return fmt.Errorf("kind %q: must be non-empty and without \"/\"", kind)
	}
	return nil
}

func (t *txn) rawGet(key string) ([]byte, error) {
	if w, ok := t.writes[key]; ok {
		if w.deleted {
			return nil, store.ErrNotFound
		}
		return w.value, nil
	}
	resp, err := t.read(key)
	if err != nil {
		return nil, err
	}
	if len(resp.Kvs) == 0 {
		return nil, store.ErrNotFound
	}
	return resp.Kvs[0].Value, nil
}

// rawRange returns the keys under prefix with their values, the transaction's own writes
// included, in ascending key order.
func (t *txn) rawRange(prefix string, keysOnly bool) ([]string, map[string][]byte, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if keysOnly {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	resp, err := t.read(prefix, opts...)
	if err != nil {
		return nil, nil, err
	}
	values := map[string][]byte{}
	for _, kv := range resp.Kvs {
		values[string(kv.Key)] = kv.Value
	}
	for k, w := range t.writes {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		if w.deleted {
			delete(values, k)
		} else {
			values[k] = w.value
		}
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, values, nil
}

func (t *txn) rawPut(key string, value []byte) error {
	if !t.writable {
		return store.ErrReadOnly
	}
	t.writes[key] = &write{value: append([]byte(nil), value...)}
	return nil
}

func (t *txn) rawDelete(key string) error {
	if !t.writable {
		return store.ErrReadOnly
	}
	t.writes[key] = &write{deleted: true}
	return nil
}

func (t *txn) Get(kind, key string) ([]byte, error) {
	if err := checkKind(kind); err != nil {
		return nil, err
	}
	return t.rawGet(t.e.objKey(kind, key))
}

func (t *txn) Put(kind, key string, value []byte) error {
	if err := checkKind(kind); err != nil {
		return err
	}
	return t.rawPut(t.e.objKey(kind, key), value)
}

func (t *txn) Delete(kind, key string) error {
	if err := checkKind(kind); err != nil {
		return err
	}
	return t.rawDelete(t.e.objKey(kind, key))
}

func (t *txn) Scan(kind string, fn func(key string, value []byte) error) error {
	return t.ScanPrefix(kind, "", fn)
}

// ScanPrefix is a prefix range read of <prefix>kv/<kind>/<key prefix> at the snapshot's
// revision, the transaction's own writes overlaid.
func (t *txn) ScanPrefix(kind, keyPrefix string, fn func(key string, value []byte) error) error {
	if err := checkKind(kind); err != nil {
		return err
	}
	prefix := t.e.objKey(kind, "")
	keys, values, err := t.rawRange(prefix+keyPrefix, false)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := fn(strings.TrimPrefix(k, prefix), values[k]); err != nil {
			return err
		}
	}
	return nil
}

func (t *txn) NextSeq(name string) (int64, error) {
	if !t.writable {
		return 0, store.ErrReadOnly
	}
	key := t.e.seqPrefix() + name
	var n int64
	raw, err := t.rawGet(key)
	switch {
	case err == nil:
		if n, err = strconv.ParseInt(string(raw), 10, 64); err != nil {
			return 0, fmt.Errorf("sequence %s: corrupt value %q", name, raw)
		}
	case !errors.Is(err, store.ErrNotFound):
		return 0, err
	}
	n++
	return n, t.rawPut(key, []byte(strconv.FormatInt(n, 10)))
}

func (t *txn) Kinds() ([]string, error) {
	prefix := t.e.kindPrefix()
	keys, _, err := t.rawRange(prefix, true)
	if err != nil {
		return nil, err
	}
	var kinds []string
	for _, k := range keys {
		kind, _, _ := strings.Cut(strings.TrimPrefix(k, prefix), "/")
		if len(kinds) == 0 || kinds[len(kinds)-1] != kind {
			kinds = append(kinds, kind)
		}
	}
	return kinds, nil
}

func (t *txn) Sequences() (map[string]int64, error) {
	prefix := t.e.seqPrefix()
	keys, values, err := t.rawRange(prefix, false)
	if err != nil {
		return nil, err
	}
	seqs := map[string]int64{}
	for _, k := range keys {
		n, err := strconv.ParseInt(string(values[k]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("sequence %s: corrupt value %q", k, values[k])
		}
		seqs[strings.TrimPrefix(k, prefix)] = n
	}
	return seqs, nil
}

func (t *txn) SetSequence(name string, value int64) error {
	key := t.e.seqPrefix() + name
	if value == 0 {
		return t.rawDelete(key)
	}
	return t.rawPut(key, []byte(strconv.FormatInt(value, 10)))
}

// opOverhead is what one operation adds to a Txn request beside its key and value (protobuf
// framing), counted generously.
const opOverhead = 32

// commit sends the writes in one Txn if the commit key is unchanged since the snapshot. It
// returns false when another writer committed first.
func (t *txn) commit() (bool, error) {
	if len(t.writes) == 0 {
		return true, nil
	}
	keys := make([]string, 0, len(t.writes))
	for k := range t.writes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	ops := make([]clientv3.Op, 0, len(keys)+1)
	size := 0
	for _, k := range keys {
		w := t.writes[k]
		if w.deleted {
			ops = append(ops, clientv3.OpDelete(k))
		} else {
			ops = append(ops, clientv3.OpPut(k, string(w.value)))
		}
		size += len(k) + len(w.value) + opOverhead
	}
	ops = append(ops, clientv3.OpPut(t.e.commitKey(), ""))
	if len(ops) > t.e.o.MaxTxnOps {
		return false, fmt.Errorf("etcd: %w: it writes %d keys, and one etcd transaction holds at most store.etcd_max_txn_ops - 1 = %d; "+
			"raise etcd's --max-txn-ops and store.etcd_max_txn_ops together", ErrTooLarge, len(keys), t.e.o.MaxTxnOps-1)
	}
	if size > t.e.o.MaxRequestBytes {
		return false, fmt.Errorf("etcd: %w: it writes about %d bytes, more than store.etcd_max_request_bytes (%d); "+
			"raise etcd's --max-request-bytes and store.etcd_max_request_bytes together", ErrTooLarge, size, t.e.o.MaxRequestBytes)
	}
	rctx, cancel := context.WithTimeout(t.ctx, t.e.o.RequestTimeout)
	defer cancel()
	guards := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(t.e.commitKey()), "=", t.commitRev)}
	var orElse []clientv3.Op
	fenceKey, fenceRev := t.e.fence()
	if fenceKey != "" {
		if fenceRev == 0 {
			return false, fmt.Errorf("etcd: %w", store.ErrFenced)
		}
		guards = append(guards, clientv3.Compare(clientv3.CreateRevision(fenceKey), "=", fenceRev))
		orElse = append(orElse, clientv3.OpGet(fenceKey, clientv3.WithKeysOnly()))
	}
	resp, err := t.e.cli.Txn(rctx).
		If(guards...).
		Then(ops...).
		Else(orElse...).
		Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrRequestTooLarge) {
			return false, fmt.Errorf("etcd: %w: %v: the members' --max-txn-ops or --max-request-bytes are below store.etcd_max_txn_ops or store.etcd_max_request_bytes; make them agree", ErrTooLarge, err)
		}
		return false, fmt.Errorf("etcd: commit: %w", err)
	}
	if !resp.Succeeded && fenceKey != "" {
		// Which compare failed: the fence (leadership lost, never again for this rev) or the
		// commit key (another writer won the race: run again).
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].CreateRevision != fenceRev {
			return false, fmt.Errorf("etcd: %w (election key %s, won at revision %d, is gone or won again by another)", store.ErrFenced, fenceKey, fenceRev)
		}
	}
	return resp.Succeeded, nil
}
