// Package sqlite is the embedded store engine: one SQLite file in WAL mode, one controller.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/spillway-hpc/spillway/internal/store"

	_ "modernc.org/sqlite" // the pure-Go SQLite driver
)

const schema = `
CREATE TABLE IF NOT EXISTS kv (
	kind  TEXT NOT NULL,
	key   TEXT NOT NULL,
	value BLOB NOT NULL,
	PRIMARY KEY (kind, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS seq (
	name  TEXT PRIMARY KEY,
	value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
) WITHOUT ROWID;
`

// schemaVersion is bumped when the layout above changes; Open refuses newer databases and
// brings older ones to it. 2: the tables are the same, but the state in them may be of
// store.SchemaVersion 2, which Spillway before 2 would misread: this number makes those
// versions refuse the database ("newer than this Spillway understands").
const schemaVersion = 2

// ErrLocked is wrapped by Open's error when another process holds the database.
var ErrLocked = errors.New("state database locked")

// Engine is a store.Engine on one SQLite database file.
type Engine struct {
	db      *sql.DB
	lock    *os.File
	writeMu *writers // one writer at a time, the requests' before the executor's (writers)
	// readOnly: opened by OpenReadOnly, without the lock; Update is refused.
	readOnly bool
	// stmts are the statements every transaction runs, prepared once (database/sql keeps
	// each prepared on the connections it ran on): a request's reads do not parse SQL.
	stmts map[string]*sql.Stmt
	// log numbers this process's commits and remembers the keys the latest wrote
	// (store.Versioned); nil when opened read-only (another process writes).
	log *changeLog
}

// changeLog numbers the commits of the process holding the database (the only writer: Open
// takes its lock) and keeps the keys the latest of them wrote, so that a listing can read
// again only what changed since an earlier one (store.Shared). A read transaction knows the
// version it sees when no commit was under way from before it began until its snapshot was
// taken (a WAL read transaction takes it at its first read, and keeps it).
type changeLog struct {
	mu         sync.Mutex
	version    uint64   // commits so far
	committing bool     // a commit is under way: the version a snapshot sees is unknown
	changes    []change // the keys written by the commits after since, oldest first
	since      uint64
}

type change struct {
	version   uint64
	kind, key string
}

// maxChanges bounds the log; past it the older half is forgotten (a listing from before them
// reads its whole table again).
const maxChanges = 1 << 16

// now is the version and whether a commit is under way.
func (l *changeLog) now() (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.version, l.committing
}

func (l *changeLog) begin() {
	l.mu.Lock()
	l.committing = true
	l.mu.Unlock()
}

// end records a commit's keys (also when the commit reported an error: it may have happened,
// and a key listed in vain is only read again).
func (l *changeLog) end(written []change) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.version++
	for _, c := range written {
		c.version = l.version
		l.changes = append(l.changes, c)
	}
	if len(l.changes) > maxChanges {
		drop := len(l.changes) - maxChanges/2
		l.since = l.changes[drop-1].version
		l.changes = slices.Clone(l.changes[drop:])
		// A commit cut in two is forgotten whole: since means every change after it is here.
		for len(l.changes) > 0 && l.changes[0].version == l.since {
			l.changes = l.changes[1:]
		}
	}
	l.committing = false
}

// changedSince lists the keys of kind written by the commits after since, up to version
// upto; ok false when some are forgotten.
func (l *changeLog) changedSince(kind string, since, upto uint64) ([]string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if since < l.since || since > upto {
		return nil, false
	}
	var keys []string
	for i := len(l.changes) - 1; i >= 0 && l.changes[i].version > since; i-- {
		if c := l.changes[i]; c.version <= upto && c.kind == kind {
			keys = append(keys, c.key)
		}
	}
	return keys, true
}

// hotQueries are the statements every transaction runs: prepared when the engine opens (no
// transaction holds a connection then), bound to each transaction's connection after.
var hotQueries = []string{qGet, qPut, qDelete, qScan, qScanRange, qScanFrom, qScanValues, qScanJoined, qScanJoinedFrom, qNextSeq}

const (
	qGet    = `SELECT value FROM kv WHERE kind = ? AND key = ?`
	qPut    = "INSERT INTO kv(kind, key, value) VALUES (?, ?, ?) ON CONFLICT(kind, key) DO UPDATE SET value = excluded.value"
	qDelete = `DELETE FROM kv WHERE kind = ? AND key = ?`
	// qNextSeq draws a sequence's next number (every object a decision creates: each
	// libdatawarp call that records a stage); parsing it each time cost a tenth of a
	// millisecond.
	qNextSeq   = "INSERT INTO seq(name, value) VALUES (?, 1) ON CONFLICT(name) DO UPDATE SET value = value + 1 RETURNING value"
	qScan      = `SELECT key, value FROM kv WHERE kind = ? ORDER BY key`
	qScanRange = `SELECT key, value FROM kv WHERE kind = ? AND key >= ? AND key < ? ORDER BY key`
	qScanFrom  = `SELECT key, value FROM kv WHERE kind = ? AND key >= ? ORDER BY key`
	// qScanValues reads one kind's values alone: a column fewer to fetch per row, a third of
	// a scan's cost in the driver (store.ValueScanner).
	qScanValues = `SELECT value FROM kv WHERE kind = ? ORDER BY key`
	// The record's key is the index key past the prefix: cut in bytes (substr counts
	// characters in TEXT, bytes in a BLOB), then compared as text, byte for byte. A LEFT JOIN,
	// so that an entry whose record is missing shows (value NULL) instead of vanishing.
	joinedRecord    = `CAST(substr(CAST(i.key AS BLOB), ?1) AS TEXT)`
	joinedSelect    = `SELECT ` + joinedRecord + `, o.value FROM kv AS i LEFT JOIN kv AS o ON o.kind = ?2 AND o.key = ` + joinedRecord + ` WHERE i.kind = ?3 AND i.key >= ?4`
	qScanJoined     = joinedSelect + ` AND i.key < ?5 ORDER BY i.key`
	qScanJoinedFrom = joinedSelect + ` ORDER BY i.key`
)

// prepare prepares the hot statements.
func (e *Engine) prepare() error {
	e.stmts = map[string]*sql.Stmt{}
	for _, q := range hotQueries {
		st, err := e.db.Prepare(q)
		if err != nil {
			return err
		}
		e.stmts[q] = st
	}
	return nil
}

// Open opens (creating if needed) the database at path. Only one process may hold it: a second
// controller on the same file is refused with the holder's pid.
func Open(path string) (*Engine, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	lock, err := lockFile(path + ".lock")
	if err != nil {
		return nil, err
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(ON)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("open state database %s: %w", path, err)
	}
	// A handful of connections: readers run beside the writer in WAL mode.
	db.SetMaxOpenConns(4)
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		lock.Close()
		return nil, fmt.Errorf("state database %s: create schema: %w", path, err)
	}
	if err := checkVersion(db); err != nil {
		db.Close()
		lock.Close()
		return nil, fmt.Errorf("state database %s: %w", path, err)
	}
	e := &Engine{db: db, lock: lock, log: &changeLog{}, writeMu: newWriters()}
	if err := e.prepare(); err != nil {
		db.Close()
		lock.Close()
		return nil, fmt.Errorf("state database %s: %w", path, err)
	}
	return e, nil
}

// YieldToRequests sets how many requests' write transactions a background one (the
// executor's, store.Background) lets go first while it waits (executor.yield_to_requests).
func (e *Engine) YieldToRequests(n int) {
	if e.writeMu != nil {
		e.writeMu.setYieldLimit(n)
	}
}

// OpenReadOnly opens an existing database for reading only, beside the controller that holds
// it (no lock): a View is one read transaction, a consistent snapshot in WAL mode (spillway
// admin backup).
func OpenReadOnly(path string) (*Engine, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("state database: %w", err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		return nil, fmt.Errorf("open state database %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	var text string
	if err := db.QueryRow(`SELECT value FROM meta WHERE key = 'schema_version'`).Scan(&text); err != nil {
		db.Close()
		return nil, fmt.Errorf("state database %s: %w", path, err)
	}
	if v, _ := strconv.Atoi(text); v > schemaVersion {
		db.Close()
		return nil, fmt.Errorf("state database %s: schema version %d is newer than this Spillway understands (%d); upgrade Spillway", path, v, schemaVersion)
	}
	e := &Engine{db: db, readOnly: true}
	if err := e.prepare(); err != nil {
		db.Close()
		return nil, fmt.Errorf("state database %s: %w", path, err)
	}
	return e, nil
}

func checkVersion(db *sql.DB) error {
	var text string
	err := db.QueryRow(`SELECT value FROM meta WHERE key = 'schema_version'`).Scan(&text)
	if errors.Is(err, sql.ErrNoRows) {
		_, err = db.Exec(`INSERT INTO meta(key, value) VALUES ('schema_version', ?)`, strconv.Itoa(schemaVersion))
		return err
	}
	if err != nil {
		return err
	}
	v, _ := strconv.Atoi(text)
	if v > schemaVersion {
		return fmt.Errorf("schema version %d is newer than this Spillway understands (%d); upgrade Spillway", v, schemaVersion)
	}
	if v < schemaVersion {
		_, err = db.Exec(`UPDATE meta SET value = ? WHERE key = 'schema_version'`, strconv.Itoa(schemaVersion))
	}
	return err
}

func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("%w: the state database is in use by another process (pid %s, lock %s): stop it, or point this one at another state directory", ErrLocked, strings.TrimSpace(string(holder)), path)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// Close closes the database and releases the lock.
func (e *Engine) Close() error {
	err := e.db.Close()
	if e.lock != nil {
		e.lock.Close()
	}
	return err
}

// Update runs fn in a write transaction.
func (e *Engine) Update(ctx context.Context, fn func(store.KV) error) error {
	if e.readOnly {
		return store.ErrReadOnly
	}
	if err := e.writeMu.lock(ctx); err != nil {
		return err
	}
	defer e.writeMu.unlock()
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			tx.Rollback()
		}
	}()
	k := &kv{e: e, tx: tx, ctx: ctx, writable: true}
	if err := fn(k); err != nil {
		return err
	}
	e.log.begin()
	err = tx.Commit()
	e.log.end(k.written)
	if err != nil {
		return err
	}
	committed = true
	return nil
}

// View runs fn in a read transaction.
func (e *Engine) View(ctx context.Context, fn func(store.KV) error) error {
	k := &kv{e: e, ctx: ctx}
	if e.log != nil {
		k.begun, k.begunCommitting = e.log.now() // before the snapshot, whenever it is taken
	}
	tx, err := e.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	k.tx = tx
	return fn(k)
}

type kv struct {
	e        *Engine
	stmts    map[string]*sql.Stmt // the engine's statements bound to tx
	tx       *sql.Tx
	ctx      context.Context
	writable bool
	written  []change // a write transaction's keys (changeLog)
	wrote    map[change]bool
	// A read transaction's version (store.Versioned): the log's when it began, and once
	// asked, the version it reads (known: 1 yes, -1 unknown, 0 not asked yet).
	begun           uint64
	begunCommitting bool
	read            bool // a statement ran: the snapshot is taken
	version         uint64
	known           int8
}

// Version is store.Versioned's: the version of a read transaction's snapshot, known when
// no commit was under way from before the transaction began until after its snapshot was
// taken (by its first statement: one is run if none has); a write transaction's until it
// writes.
func (k *kv) Version() (any, uint64, bool) {
	if k.writable {
		// Writers take turns (writeMu): until it writes, a write transaction reads the
		// state of the log's version.
		if k.e.log == nil || len(k.written) > 0 {
			return k.e, 0, false
		}
		v, _ := k.e.log.now()
		return k.e, v, true
	}
	if k.known == 0 {
		k.known = -1
		if k.e.log != nil && !k.writable && !k.begunCommitting {
			if !k.read {
				if _, err := k.Get("", ""); err != nil && !errors.Is(err, store.ErrNotFound) {
					return k.e, 0, false
				}
			}
			if v, committing := k.e.log.now(); !committing && v == k.begun {
				k.version, k.known = v, 1
			}
		}
	}
	return k.e, k.version, k.known > 0
}

// note records a key the write transaction writes.
func (k *kv) note(kind, key string) {
	c := change{kind: kind, key: key}
	if k.wrote == nil {
		k.wrote = map[change]bool{}
	}
	if !k.wrote[c] {
		k.wrote[c] = true
		k.written = append(k.written, c)
	}
}

// Wrote is store.WriteVersioned's: whether this write transaction wrote the key.
func (k *kv) Wrote(kind, key string) bool { return k.wrote[change{kind: kind, key: key}] }

// WriteVersion is store.Versioned's for a write transaction: writers take turns (writeMu),
// so the state it started from is the log's version (its own writes come after).
func (k *kv) WriteVersion() (any, uint64, bool) {
	if k.e.log == nil || !k.writable {
		return k.e, 0, false
	}
	v, _ := k.e.log.now()
	return k.e, v, true
}

// ChangedSince is store.Versioned's (for a write transaction: up to the version it started
// from, its own writes not included).
func (k *kv) ChangedSince(kind string, since uint64) ([]string, bool) {
	_, v, ok := k.Version()
	if k.writable {
		_, v, ok = k.WriteVersion() // Rows: its own writes are told apart by Wrote
	}
	if !ok {
		return nil, false
	}
	return k.e.log.changedSince(kind, since, v)
}

// txStmt is the prepared statement of q bound to the transaction (once per transaction).
func (k *kv) txStmt(q string) (*sql.Stmt, error) {
	k.read = true
	if st := k.stmts[q]; st != nil {
		return st, nil
	}
	st := k.e.stmts[q]
	if k.stmts == nil {
		k.stmts = map[string]*sql.Stmt{}
	}
	k.stmts[q] = k.tx.StmtContext(k.ctx, st)
	return k.stmts[q], nil
}

// query runs a prepared statement in the transaction.
func (k *kv) query(q string, args ...any) (*sql.Rows, error) {
	st, err := k.txStmt(q)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(k.ctx, args...)
}

func (k *kv) exec(q string, args ...any) error {
	st, err := k.txStmt(q)
	if err != nil {
		return err
	}
	_, err = st.ExecContext(k.ctx, args...)
	return err
}

func (k *kv) Get(kind, key string) ([]byte, error) {
	st, err := k.txStmt(qGet)
	if err != nil {
		return nil, err
	}
	var v []byte
	err = st.QueryRowContext(k.ctx, kind, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, store.ErrNotFound
	}
	return v, err
}

func (k *kv) Put(kind, key string, value []byte) error {
	if !k.writable {
		return store.ErrReadOnly
	}
	k.note(kind, key)
	return k.exec(qPut, kind, key, value)
}

func (k *kv) Delete(kind, key string) error {
	if !k.writable {
		return store.ErrReadOnly
	}
	k.note(kind, key)
	return k.exec(qDelete, kind, key)
}

func (k *kv) Scan(kind string, fn func(key string, value []byte) error) error {
	return k.ScanPrefix(kind, "", fn)
}

// ScanPrefix reads the key range [prefix, prefix's successor) of the primary key (kind, key).
func (k *kv) ScanPrefix(kind, prefix string, fn func(key string, value []byte) error) error {
	var rows *sql.Rows
	var err error
	if end, bounded := prefixEnd(prefix); prefix == "" {
		rows, err = k.query(qScan, kind)
	} else if bounded {
		rows, err = k.query(qScanRange, kind, prefix, end)
	} else {
		rows, err = k.query(qScanFrom, kind, prefix)
	}
	if err != nil {
		return err
	}
	return visitRows(rows, func(key string, value []byte, _ bool) error { return fn(key, value) })
}

// ScanValues is store.ValueScanner: every value of a kind, in key order, without the keys.
func (k *kv) ScanValues(kind string, fn func(value []byte) error) error {
	rows, err := k.query(qScanValues, kind)
	if err != nil {
		return err
	}
	defer rows.Close()
	// Read everything first, as visitRows does: fn may query the same transaction.
	var values [][]byte
	for rows.Next() {
		var v []byte
		if err := rows.Scan(&v); err != nil {
			return err
		}
		values = append(values, v)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows.Close()
	for _, v := range values {
		if err := fn(v); err != nil {
			return err
		}
	}
	return nil
}

// ScanJoined is store.IndexJoiner: the index range and the records it lists in one query.
func (k *kv) ScanJoined(indexKind, prefix, kind string, fn func(key string, value []byte) error) error {
	var rows *sql.Rows
	var err error
	if end, bounded := prefixEnd(prefix); bounded {
		rows, err = k.query(qScanJoined, len(prefix)+1, kind, indexKind, prefix, end)
	} else {
		rows, err = k.query(qScanJoinedFrom, len(prefix)+1, kind, indexKind, prefix)
	}
	if err != nil {
		return err
	}
	return visitRows(rows, func(key string, value []byte, present bool) error {
		if !present {
			return fmt.Errorf("%s %s listed by %s %s%s: %w", kind, key, indexKind, prefix, key, store.ErrNotFound)
		}
		return fn(key, value)
	})
}

// visitRows reads every (key, value) row, then calls fn on each (fn may query the same
// transaction, which an open result set would block); present is false for a NULL value.
func visitRows(rows *sql.Rows, fn func(key string, value []byte, present bool) error) error {
	defer rows.Close()
	type row struct {
		key   string
		value []byte
	}
	var all []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.key, &r.value); err != nil {
			return err
		}
		all = append(all, r)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	rows.Close()
	for _, r := range all {
		if err := fn(r.key, r.value, r.value != nil); err != nil {
			return err
		}
	}
	return nil
}

// prefixEnd is the smallest string greater than every string beginning with prefix (keys
// compare as bytes: SQLite's BINARY collation); false when there is none (all 0xff).
func prefixEnd(prefix string) (string, bool) {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1]), true
		}
	}
	return "", false
}

func (k *kv) Kinds() ([]string, error) {
	k.read = true
	rows, err := k.tx.QueryContext(k.ctx, `SELECT DISTINCT kind FROM kv ORDER BY kind`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var kinds []string
	for rows.Next() {
		var kind string
		if err := rows.Scan(&kind); err != nil {
			return nil, err
		}
		kinds = append(kinds, kind)
	}
	return kinds, rows.Err()
}

func (k *kv) Sequences() (map[string]int64, error) {
	k.read = true
	rows, err := k.tx.QueryContext(k.ctx, `SELECT name, value FROM seq`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	seqs := map[string]int64{}
	for rows.Next() {
		var name string
		var v int64
		if err := rows.Scan(&name, &v); err != nil {
			return nil, err
		}
		seqs[name] = v
	}
	return seqs, rows.Err()
}

func (k *kv) SetSequence(name string, value int64) error {
	if !k.writable {
		return store.ErrReadOnly
	}
	if value == 0 {
		_, err := k.tx.ExecContext(k.ctx, `DELETE FROM seq WHERE name = ?`, name)
		return err
	}
	_, err := k.tx.ExecContext(k.ctx, `INSERT INTO seq(name, value) VALUES (?, ?)
		ON CONFLICT(name) DO UPDATE SET value = excluded.value`, name, value)
	return err
}

func (k *kv) NextSeq(name string) (int64, error) {
	if !k.writable {
		return 0, store.ErrReadOnly
	}
	st, err := k.txStmt(qNextSeq)
	if err != nil {
		return 0, err
	}
	var v int64
	err = st.QueryRowContext(k.ctx, name).Scan(&v)
	return v, err
}
