// Package units parses and prints byte sizes the way DataWarp users write and read them.
//
// Parsing accepts every unit a DataWarp or Slurm script may carry (KiB…PiB as powers of 1024,
// KB…PB as powers of 1000, the one-letter K/M/G/T/P shorthands as powers of 1024, and plain
// bytes) and honours decimals: "3.5TB" is 3.5 TB, rounded up to a whole byte — never the 3
// bytes that Slurm's strtoull reading gives.
//
// Two printers exist because two audiences read sizes: FormatHuman is dwstat's rounded
// binary form ("7.28TiB"), FormatExact is Slurm's lossless largest-unit form ("1500MB").
package units

import (
	"fmt"
	"math/big"
	"strings"
)

// unitFactors maps a lower-cased unit suffix to its multiplier.
var unitFactors = map[string]uint64{
	"": 1, "b": 1, "byte": 1, "bytes": 1,
	"k": 1 << 10, "kib": 1 << 10, "kb": 1000,
	"m": 1 << 20, "mib": 1 << 20, "mb": 1000 * 1000,
	"g": 1 << 30, "gib": 1 << 30, "gb": 1000 * 1000 * 1000,
	"t": 1 << 40, "tib": 1 << 40, "tb": 1000 * 1000 * 1000 * 1000,
	"p": 1 << 50, "pib": 1 << 50, "pb": 1000 * 1000 * 1000 * 1000 * 1000,
}

// Expected describes the accepted syntax, for error messages.
const Expected = "a size such as 100GiB, 3.5TB, 512MiB or 1048576 (units KiB MiB GiB TiB PiB = powers of 1024, KB MB GB TB PB = powers of 1000, no unit = bytes)"

// ParseSize reads a size such as "1GiB", "3.5TB", "100" (bytes). Decimals are honoured and the
// result is rounded up to a whole byte. Zero is accepted here (callers that need a positive
// size say so in their own message); negative numbers, garbage and overflow are errors.
func ParseSize(s string) (uint64, error) {
	text := strings.TrimSpace(s)
	if text == "" {
		return 0, fmt.Errorf("empty size; expected %s", Expected)
	}
	i := 0
	seenDigit, seenDot := false, false
	for i < len(text) {
		c := text[i]
		if c >= '0' && c <= '9' {
			seenDigit = true
		} else if c == '.' && !seenDot {
			seenDot = true
		} else {
			break
		}
		i++
	}
	number, suffix := text[:i], strings.ToLower(strings.TrimSpace(text[i:]))
	if !seenDigit {
		return 0, fmt.Errorf("%q is not a size; expected %s", s, Expected)
	}
	if strings.HasPrefix(suffix, ".") {
		return 0, fmt.Errorf("%q is not a size: more than one decimal point; expected %s", s, Expected)
	}
	factor, ok := unitFactors[suffix]
	if !ok {
		return 0, fmt.Errorf("%q has unknown unit %q; expected %s", s, text[i:], Expected)
	}
	value, ok := new(big.Rat).SetString(number)
	if !ok {
		return 0, fmt.Errorf("%q is not a size; expected %s", s, Expected)
	}
	value.Mul(value, new(big.Rat).SetInt(new(big.Int).SetUint64(factor)))
	// Round up to a whole byte: a decimal request must never shrink.
	whole := new(big.Int).Quo(value.Num(), value.Denom())
	if new(big.Rat).SetInt(whole).Cmp(value) < 0 {
		whole.Add(whole, big.NewInt(1))
	}
	if !whole.IsUint64() {
		return 0, fmt.Errorf("%q is too large (the limit is 16EiB)", s)
	}
	return whole.Uint64(), nil
}

var binaryUnits = []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}

// FormatHuman prints a size the way dwstat does: binary units, at most two decimals, trailing
// zeros dropped ("7.28TiB", "1.5PiB", "32GiB", "512MiB", "0B").
func FormatHuman(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	value := float64(n)
	unit := 0
	for value >= 1024 && unit < len(binaryUnits)-1 {
		value /= 1024
		unit++
	}
	text := fmt.Sprintf("%.2f", value)
	// Rounding can carry into the next unit (1023.999KiB prints as 1024.00).
	if text == "1024.00" && unit < len(binaryUnits)-1 {
		text, unit = "1.00", unit+1
	}
	text = strings.TrimRight(strings.TrimRight(text, "0"), ".")
	return text + binaryUnits[unit]
}

// exactUnits is Slurm's bb_get_size_str order: the largest unit that divides the size exactly.
var exactUnits = []struct {
	name   string
	factor uint64
}{
	{"PiB", 1 << 50}, {"PB", 1e15}, {"TiB", 1 << 40}, {"TB", 1e12},
	{"GiB", 1 << 30}, {"GB", 1e9}, {"MiB", 1 << 20}, {"MB", 1e6},
	{"KiB", 1 << 10}, {"KB", 1e3},
}

// FormatExact prints a size losslessly in the largest unit that divides it ("1GiB", "1500MB",
// "4097"), as Slurm's bb_get_size_str does; ParseSize reads it back to the same number.
func FormatExact(n uint64) string {
	if n == 0 {
		return "0"
	}
	for _, u := range exactUnits {
		if n%u.factor == 0 {
			return fmt.Sprintf("%d%s", n/u.factor, u.name)
		}
	}
	return fmt.Sprintf("%d", n)
}

// Grains returns how many allocation units of size granularity hold n bytes (rounded up).
func Grains(n, granularity uint64) uint64 {
	if granularity == 0 {
		return 0
	}
	return n/granularity + boolToUint(n%granularity != 0)
}

func boolToUint(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
