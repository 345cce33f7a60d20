package sqlite

import "github.com/spillway-hpc/spillway/internal/store"

// qScanValues reads one kind's values alone: a column fewer to fetch per row, a third of a
// scan's cost in the driver (store.ValueScanner).
const qScanValues = `SELECT value FROM kv WHERE kind = ? ORDER BY key`

func init() { hotQueries = append(hotQueries, qScanValues) }

var _ store.ValueScanner = (*kv)(nil)

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
