package directive

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/spillway-hpc/spillway/internal/units"
)

// dctx is one directive being parsed: where it is, what it is called, and its faults.
type dctx struct {
	p      *parser
	line   int
	name   string // "#DW jobdw"
	failed bool   // a fault was reported: the directive is not added to the Script
}

func (d *dctx) fail(field, value, problem, fix string) {
	d.failed = true
	d.p.fail(&Error{Line: d.line, Directive: d.name, Field: field, Value: value, Problem: problem, Fix: fix})
}

// arg is one key=value token of a directive, or a bare word.
type arg struct {
	key, value string
	bare       bool
}

// keySet describes the keys a command accepts, for messages and lookups.
type keySet struct {
	keys  []string          // accepted keys, in the order messages list them
	hints map[string]string // a likely mistake -> how to write it
	bare  func(word string) bool
}

func (k keySet) expected() string {
	return "expected one of: " + strings.Join(k.keys, ", ")
}

// collect splits tokens into key=value pairs, reporting malformed tokens, unknown keys and
// keys given twice. Bare words accepted by ks.bare are returned in order.
func (d *dctx) collect(tokens []string, ks keySet) (map[string]string, []string) {
	values := map[string]string{}
	var bare []string
	for _, tok := range tokens {
		key, value, hasEq := strings.Cut(tok, "=")
		if !hasEq {
			if ks.bare != nil && ks.bare(tok) {
				bare = append(bare, tok)
				continue
			}
			fix := "options are written key=value, e.g. capacity=100GiB"
			if slices.Contains(ks.keys, tok) {
				fix = fmt.Sprintf("write %s=<value>", tok)
			} else if s := suggest(tok, ks.keys); s != "" {
				fix = fmt.Sprintf("did you mean %s=<value>? %s", s, ks.expected())
			}
			d.fail("", "", "Malformed keyword[=value]: "+clip(tok, quoteLimit), fix)
			continue
		}
		if key == "" {
			d.fail("", "", "Malformed keyword[=value]: "+clip(tok, quoteLimit), "a value needs its key in front, e.g. capacity=100GiB")
			continue
		}
		if !slices.Contains(ks.keys, key) {
			fix := ks.expected()
			if h, ok := ks.hints[key]; ok {
				fix = h
			} else if h, ok := ks.hints[strings.ToLower(key)]; ok {
				fix = h
			} else if s := suggest(key, ks.keys); s != "" {
				fix = fmt.Sprintf("did you mean %s? %s", s, ks.expected())
			}
			d.fail(key, value, "Unsupported argument - "+clip(key, quoteLimit), fix)
			continue
		}
		if _, dup := values[key]; dup {
			d.fail(key, value, fmt.Sprintf("%s is given twice", key), "give each option once")
			continue
		}
		if value == "" {
			d.fail(key, "", fmt.Sprintf("Malformed keyword[=value]: %s=", key), fmt.Sprintf("give %s a value, with no space after =", key))
			continue
		}
		if value[0] == '"' || value[0] == '\'' {
			d.fail(key, value, "quotes are not understood in directives: a value runs to the next space", "remove the quotes (paths with spaces cannot be staged by a directive)")
			continue
		}
		values[key] = value
	}
	return values, bare
}

// oneOf checks an enumerated value.
func (d *dctx) oneOf(field, value string, allowed ...string) (string, bool) {
	if slices.Contains(allowed, value) {
		return value, true
	}
	fix := "expected " + orList(allowed)
	if s := suggest(value, allowed); s != "" {
		fix = fmt.Sprintf("did you mean %s? %s", s, fix)
	}
	d.fail(field, value, fmt.Sprintf("Invalid argument: %s=%s", field, clip(value, quoteLimit)), fix)
	return "", false
}

func orList(words []string) string {
	switch len(words) {
	case 0:
		return ""
	case 1:
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}

// yesNo reads a boolean: yes, no, true or false.
func (d *dctx) yesNo(field, value string) (bool, bool) {
	switch value {
	case "yes", "true":
		return true, true
	case "no", "false":
		return false, true
	}
	d.fail(field, value, fmt.Sprintf("Invalid argument: %s=%s", field, clip(value, quoteLimit)), "expected yes or no (true and false are accepted too)")
	return false, false
}

// sizeFix is the fix of every size fault.
const sizeFix = "expected a size such as 100GiB or 3.5TB (KiB MiB GiB TiB PiB are powers of 1024, KB MB GB TB PB powers of 1000, no unit means bytes)"

// size reads a size through units.ParseSize and names the fault precisely when it fails.
func (d *dctx) size(field, value string) (uint64, bool) {
	n, err := units.ParseSize(value)
	if err == nil {
		return n, true
	}
	number, suffix := splitNumber(value)
	switch {
	case strings.HasPrefix(strings.TrimSpace(value), "-"):
		d.fail(field, value, "a size cannot be negative", sizeFix)
	case number == "" || number == ".":
		d.fail(field, value, "not a size", sizeFix)
	case strings.HasPrefix(suffix, "."):
		d.fail(field, value, "not a size: more than one decimal point", sizeFix)
	case isNodeUnit(suffix):
		d.fail(field, value, "sizes in nodes (N, node, nodes) are a Slurm extension that DataWarp does not accept", "give bytes, e.g. 100GiB; the pool granularity decides how many servers you get")
	case !knownUnit(suffix):
		d.fail(field, value, fmt.Sprintf("unknown unit %q", suffix), sizeFix)
	default:
		d.fail(field, value, "too large (the limit is 16EiB)", sizeFix)
	}
	return 0, false
}

// splitNumber cuts "3.5TB" into "3.5" and "TB" the way units.ParseSize reads it.
func splitNumber(v string) (number, suffix string) {
	v = strings.TrimSpace(v)
	i, dot := 0, false
	for i < len(v) {
		c := v[i]
		if c >= '0' && c <= '9' {
			i++
			continue
		}
		if c == '.' && !dot {
			dot = true
			i++
			continue
		}
		break
	}
	return v[:i], strings.TrimSpace(v[i:])
}

func knownUnit(suffix string) bool {
	_, err := units.ParseSize("1" + suffix)
	return err == nil
}

func isNodeUnit(suffix string) bool {
	switch strings.ToLower(suffix) {
	case "n", "node", "nodes":
		return true
	}
	return false
}

// count reads a non-negative decimal integer no smaller than min.
func (d *dctx) count(field, value string, min int64, what string) (int64, bool) {
	for i := 0; i < len(value); i++ {
		if value[i] < '0' || value[i] > '9' {
			d.fail(field, value, "not a whole number", fmt.Sprintf("expected %s, written with digits only", what))
			return 0, false
		}
	}
	n, err := strconv.ParseInt(value, 10, 64)
	if err != nil {
		d.fail(field, value, "too large", fmt.Sprintf("expected %s below 2^63", what))
		return 0, false
	}
	if n < min {
		d.fail(field, value, fmt.Sprintf("must be at least %d", min), "expected "+what)
		return 0, false
	}
	return n, true
}

// name checks a persistent-buffer name.
func (d *dctx) bufferName(field, value string) bool {
	if err := checkName(value, d.p.limits.MaxNameBytes); err != nil {
		d.fail(field, value, err.problem, err.fix)
		return false
	}
	return true
}

// pool checks a pool name: it travels to dw_wlm_cli as "<pool>:<size>".
func (d *dctx) pool(field, value string) bool {
	if len(value) > d.p.limits.MaxNameBytes {
		d.fail(field, value, fmt.Sprintf("longer than %d bytes (limit MaxNameBytes)", d.p.limits.MaxNameBytes), "use the pool name shown by dwstat pools")
		return false
	}
	for i := 0; i < len(value); i++ {
		c := value[i]
		if !(c == '_' || c == '-' || c == '.' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			d.fail(field, value, fmt.Sprintf("%q is not allowed in a pool name", rune(c)), "pool names use letters, digits, _, - and . ; see dwstat pools")
			return false
		}
	}
	return true
}

// nameFault is why a persistent-buffer name is refused.
type nameFault struct{ problem, fix string }

func (f *nameFault) Error() string { return f.problem + "; " + f.fix }

func checkName(name string, maxBytes int) *nameFault {
	const fix = "a name is letters, digits and _, not starting with a digit (it becomes part of $DW_PERSISTENT_STRIPED_<name>)"
	switch {
	case name == "":
		return &nameFault{"the name is empty", fix}
	case len(name) > maxBytes:
		return &nameFault{fmt.Sprintf("longer than %d bytes (limit MaxNameBytes)", maxBytes), "choose a shorter name"}
	case name[0] >= '0' && name[0] <= '9':
		return &nameFault{"a name must not start with a digit: numeric names are job ids", "start the name with a letter or _ (it becomes part of $DW_PERSISTENT_STRIPED_<name>)"}
	}
	for i := 0; i < len(name); i++ {
		if !isIdentByte(name[i], false) {
			r, _ := utf8.DecodeRuneInString(name[i:])
			return &nameFault{fmt.Sprintf("%q is not allowed in a name", r), fix}
		}
	}
	return nil
}

// CheckName reports why name cannot be a persistent-buffer name, or nil. Names are
// [A-Za-z_][A-Za-z0-9_]* (at most DefaultLimits().MaxNameBytes bytes) because the name becomes
// part of the environment variable DW_PERSISTENT_STRIPED_<name>.
func CheckName(name string) error {
	if f := checkName(name, DefaultLimits().MaxNameBytes); f != nil {
		return f
	}
	return nil
}

func isIdentByte(c byte, first bool) bool {
	return c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || !first && c >= '0' && c <= '9'
}

// checkText reports characters that cannot be meant: control characters and Unicode spaces
// (a non-breaking space pasted from a web page looks like a separator but is not one).
func (d *dctx) checkText(text string) bool {
	for i, r := range text {
		if r == utf8.RuneError {
			continue // bytes that are not UTF-8 are legal in Linux paths
		}
		if r < 0x80 && isBlank(byte(r)) {
			continue
		}
		if unicode.IsSpace(r) {
			d.fail("", "", fmt.Sprintf("the directive contains %U (a non-ASCII space) at byte %d, probably pasted from a document", r, i), "replace it with an ordinary space")
			return false
		}
		if unicode.IsControl(r) {
			d.fail("", "", fmt.Sprintf("the directive contains the control character %U at byte %d", r, i), "remove it")
			return false
		}
	}
	return true
}

// suggest returns the candidate closest to word (ignoring case, at most 2 edits away), or "".
func suggest(word string, candidates []string) string {
	if len(word) > 64 {
		return ""
	}
	best, bestDist := "", 3
	lw := strings.ToLower(word)
	for _, c := range candidates {
		dist := editDistance(lw, strings.ToLower(c))
		if dist < bestDist {
			best, bestDist = c, dist
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
