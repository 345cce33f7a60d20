package directive

import (
	"bytes"
	"sort"
	"strings"
)

// Symbols are the values Slurm substitutes for %-symbols in burst-buffer directives.
type Symbols struct {
	ArrayJobID  string // %A: the array master job id
	ArrayTaskID string // %a: the array task id (%b: its last digit)
	WorkDir     string // %d: the job's working directory
	JobID       string // %j: the job id
	User        string // %u: the user name
	JobName     string // %x: the job name
}

// value returns what %sym becomes; known is false for a symbol Slurm does not know (Slurm
// then deletes the % and the character after it).
func (s Symbols) value(sym byte) (v string, known bool) {
	switch sym {
	case '%':
		return "%", true
	case 'A':
		return clean(s.ArrayJobID), true
	case 'a':
		return clean(s.ArrayTaskID), true
	case 'b':
		// Newer Slurm: the array task id modulo 10, i.e. its last decimal digit.
		id := clean(s.ArrayTaskID)
		if id == "" {
			return "", true
		}
		return id[len(id)-1:], true
	case 'd':
		return clean(s.WorkDir), true
	case 'j':
		return clean(s.JobID), true
	case 'u':
		return clean(s.User), true
	case 'x':
		return clean(s.JobName), true
	}
	return "", false
}

// clean keeps a value on its line: a newline in a job name must not become a new directive.
func clean(v string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == 0 {
			return '_'
		}
		return r
	}, v)
}

// bbText is the burst-buffer string Slurm builds from the leading block (the directives with
// their continuations joined, one directive a line), with where each piece of it came from.
type bbText struct {
	text   string
	pieces []bbPiece // in text order
}

// bbPiece is a run of text copied from the script (src >= 0) or the "\n" between two
// directives (src = -1).
type bbPiece struct {
	at   int // offset in text
	src  int // offset in the script
	line int // script line number; 0 for a separator
}

func (p *parser) bbText(directives []*logical) bbText {
	var b strings.Builder
	var t bbText
	for _, l := range directives {
		if l.broken {
			continue
		}
		if b.Len() > 0 {
			t.pieces = append(t.pieces, bbPiece{at: b.Len(), src: -1})
			b.WriteByte('\n')
		}
		for k, seg := range l.segments {
			t.pieces = append(t.pieces, bbPiece{at: b.Len(), src: seg.start, line: l.lines[k]})
			b.Write(p.src[seg.start:seg.end])
		}
	}
	t.text = b.String()
	return t
}

// piece returns the piece holding text offset i.
func (t bbText) piece(i int) bbPiece {
	k := sort.Search(len(t.pieces), func(k int) bool { return t.pieces[k].at > i }) - 1
	return t.pieces[k]
}

// source is the script offset of text offset i, or -1 for a separator.
func (t bbText) source(i int) int {
	pc := t.piece(i)
	if pc.src < 0 {
		return -1
	}
	return pc.src + i - pc.at
}

func (t bbText) line(i int) int { return t.piece(i).line }

// hasPercent reports whether any directive holds a "%", before building the text.
func (p *parser) hasPercent(directives []*logical) bool {
	for _, l := range directives {
		for _, seg := range l.segments {
			if bytes.IndexByte(p.src[seg.start:seg.end], '%') >= 0 {
				return true
			}
		}
	}
	return false
}

// symbolWalk visits the %-symbols of Slurm's burst-buffer string the way Slurm's
// _handle_replacement does: "%X" is one symbol (so "%%j" is "%" then a literal "j"), and the
// first "\\" stops replacement for the rest of the string — that is, for the rest of its
// directive and every directive after it. A "%" at the end of a directive is reported with
// lone set (Slurm then swallows the newline; Spillway only drops the "%").
// It returns the index of the stopping "\\", or -1.
func symbolWalk(t bbText, visit func(i int, sym byte, lone bool)) int {
	s := t.text
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '%':
			if i+1 >= len(s) || t.source(i+1) < 0 {
				visit(i, 0, true)
				continue
			}
			visit(i, s[i+1], false)
			i++
		case s[i] == '\\' && i+1 < len(s) && s[i+1] == '\\':
			return i
		}
	}
	return -1
}

// edit replaces script bytes [start, end) with text.
type edit struct {
	start, end int
	text       string
}

// Substitute does Slurm's symbol replacement on the #DW and #BB lines of the leading comment
// block: %% → %, %A array master job id, %a array task id, %b last digit of the array task id,
// %d working directory, %j job id, %u user name, %x job name; an unknown %X is deleted, as
// Slurm deletes it. The first \\ stops replacement for the rest of the directives, as Slurm's
// code does (its documentation says "of the line").
//
// Unlike Slurm, which hands dw_wlm_cli a new file holding only the joined directives,
// Substitute edits the script in place: every other byte, and every line number, stays as it
// was, so messages about the result still point at the user's lines. Newlines and NULs in
// symbol values become "_".
func Substitute(script []byte, s Symbols) []byte {
	p := &parser{src: script, limits: DefaultLimits().withDefaults()}
	p.limits.MaxDirectives = int(^uint(0) >> 1) // every directive is substituted, however many
	p.limits.MaxDirectiveBytes = len(script) + 1
	block := p.scan(false)
	var edits []edit
	if p.hasPercent(block.directives) {
		t := p.bbText(block.directives)
		symbolWalk(t, func(i int, sym byte, lone bool) {
			at := t.source(i)
			if lone {
				edits = append(edits, edit{at, at + 1, ""})
				return
			}
			v, _ := s.value(sym)
			next := t.source(i + 1)
			edits = append(edits, edit{at, at + 1, v}, edit{next, next + 1, ""})
		})
	}
	if len(edits) == 0 {
		return append([]byte(nil), script...)
	}
	out := make([]byte, 0, len(script)+64)
	last := 0
	for _, e := range edits {
		out = append(out, script[last:e.start]...)
		out = append(out, e.text...)
		last = e.end
	}
	return append(out, script[last:]...)
}

// symbolWarnings reports symbols that will not do what they seem to.
func (p *parser) symbolWarnings(directives []*logical) {
	if !p.hasPercent(directives) {
		return
	}
	t := p.bbText(directives)
	stop := symbolWalk(t, func(i int, sym byte, lone bool) {
		switch {
		case lone:
			p.warn(t.line(i), "a %% at the end of a directive is not a Slurm symbol: Slurm removes it and joins the next directive onto this one; write %%%% for a literal %%")
		case sym == 'b':
			p.warn(t.line(i), "%%b (the last digit of the array task id) is replaced only by newer Slurm versions; Slurm 22.05 deletes it")
		default:
			if _, known := (Symbols{}).value(sym); !known {
				p.warn(t.line(i), "%s is not a Slurm symbol: Slurm deletes it; write %%%% for a literal %% (symbols: %%%% %%A %%a %%d %%j %%u %%x)", quote("%"+string(sym)))
			}
		}
	})
	if stop >= 0 {
		if later := strings.IndexByte(t.text[stop:], '%'); later >= 0 {
			p.warn(t.line(stop), "Slurm stops replacing %%-symbols at \\\\ for the rest of this directive and for every directive after it (its documentation says \"of the line\"), so the %% on line %d reaches Spillway unreplaced; move the line with \\\\ after the lines that use symbols",
				t.line(stop+later))
		}
	}
}
