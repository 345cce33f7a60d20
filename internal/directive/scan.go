package directive

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
)

// This file finds the directives of a script the way Slurm's burst_buffer/datawarp plugin
// (_xlate_batch) does: lines are split on "\n"; empty lines are skipped; the leading comment
// block ends at the first line not starting with "#" (a line of spaces counts as a command);
// lines starting "#DW" or "#BB" are directives; a directive ending in "\" continues on the next
// line of the same prefix, whose text after the prefix is appended (leading blanks dropped when
// the continued line had a blank before its "\").

// prefix is the kind of a directive line.
type prefix int

const (
	prefixNone prefix = iota
	prefixDW
	prefixBB
)

func (p prefix) String() string {
	switch p {
	case prefixDW:
		return "#DW"
	case prefixBB:
		return "#BB"
	}
	return "#"
}

func lineKind(content []byte) prefix {
	switch {
	case bytes.HasPrefix(content, []byte("#DW")):
		return prefixDW
	case bytes.HasPrefix(content, []byte("#BB")):
		return prefixBB
	}
	return prefixNone
}

// line is one line of the script: its 1-based number and the byte range of its content in
// the script, without the "\n" and without a trailing "\r".
type line struct {
	num        int
	start, end int
}

// segment is a byte range of the script that is part of a directive's text.
type segment struct{ start, end int }

// logical is one directive as Slurm collects it: its first line and its continuation lines.
type logical struct {
	prefix   prefix
	line     int       // first line
	lines    []int     // every line, first included
	segments []segment // joined in order they give the directive's text, starting "#DW"/"#BB"
	text     string
	broken   bool // too long or otherwise not worth parsing (already reported)
}

// parser collects the faults and warnings of one script.
type parser struct {
	src      []byte
	limits   Limits
	errs     []*Error
	omitted  int
	warnings []Warning
	warnOmit int
}

func (p *parser) fail(e *Error) {
	if len(p.errs) >= p.limits.MaxErrors {
		p.omitted++
		return
	}
	p.errs = append(p.errs, e)
}

func (p *parser) warn(line int, format string, args ...any) {
	if len(p.warnings) >= p.limits.MaxWarnings {
		p.warnOmit++
		return
	}
	p.warnings = append(p.warnings, Warning{Line: line, Message: fmt.Sprintf(format, args...)})
}

func (p *parser) errorList() *Errors {
	sort.SliceStable(p.errs, func(i, j int) bool { return p.errs[i].Line < p.errs[j].Line })
	return &Errors{List: p.errs, Omitted: p.omitted, Warnings: p.warnings}
}

func (p *parser) finishWarnings() {
	if p.warnOmit > 0 {
		p.warnings = append(p.warnings, Warning{Message: fmt.Sprintf("%d more warnings left out (limit MaxWarnings)", p.warnOmit)})
		p.warnOmit = 0
	}
}

// visibleEnd is where Slurm stops reading: at the first NUL byte (the script is a C string).
// A NUL that is not part of trailing padding is a fault; the caller reports it.
func visibleEnd(src []byte) (end int, strayNUL bool) {
	i := bytes.IndexByte(src, 0)
	if i < 0 {
		return len(src), false
	}
	for _, c := range src[i:] {
		if c != 0 {
			return i, true
		}
	}
	return i, false
}

// splitLines cuts src[:end] into lines.
func splitLines(src []byte, end int) []line {
	var lines []line
	start, num := 0, 1
	for start < end {
		nl := bytes.IndexByte(src[start:end], '\n')
		stop, next := end, end
		if nl >= 0 {
			stop, next = start+nl, start+nl+1
		}
		contentEnd := stop
		if contentEnd > start && src[contentEnd-1] == '\r' {
			contentEnd--
		}
		lines = append(lines, line{num: num, start: start, end: contentEnd})
		start, num = next, num+1
	}
	return lines
}

// blockResult is what scanning found.
type blockResult struct {
	directives []*logical // the directives of the leading comment block, in order
}

// scan finds the directives of the leading comment block and reports continuation faults,
// directives after the block, and comment lines that look like directives but are not.
// With report false it only finds the directives (for Substitute, which reports nothing).
func (p *parser) scan(report bool) blockResult {
	end, stray := visibleEnd(p.src)
	if stray && report {
		lineNum := 1 + bytes.Count(p.src[:end], []byte("\n"))
		p.fail(&Error{Line: lineNum, Problem: "the script contains a NUL byte; Slurm reads a script only up to its first NUL (and sbatch refuses such scripts)", Fix: "remove the NUL byte: a job script must be text"})
	}
	lines := splitLines(p.src, end)
	var res blockResult
	var cur *logical   // directive being read
	continued := false // cur's last line ended in "\"
	hadSpace := false  // ... with a blank before the "\"
	finish := func() {
		if cur != nil {
			cur.text = p.joined(cur)
			res.directives = append(res.directives, cur)
		}
		cur, continued = nil, false
	}
	inBlock := true
	var endLine line
	for _, ln := range lines {
		content := p.src[ln.start:ln.end]
		if !inBlock {
			if report {
				p.warnAfterBlock(ln, content, endLine)
			}
			continue
		}
		if len(content) == 0 {
			continue // Slurm's strtok skips empty lines, even inside a continuation
		}
		if content[0] != '#' {
			if continued && report {
				p.fail(&Error{Line: cur.line, Directive: p.nameOf(cur), Problem: fmt.Sprintf("the directive ends with \\ but line %d is a command, not a continuation", ln.num),
					Fix: fmt.Sprintf("start each continuation line with %s, e.g. \"%s   type=directory\"", cur.prefix, cur.prefix)})
			}
			finish()
			inBlock, endLine = false, ln
			if report {
				p.warnAfterBlock(ln, content, endLine)
			}
			continue
		}
		kind := lineKind(content)
		if kind == prefixNone {
			if continued && report {
				p.fail(&Error{Line: cur.line, Directive: p.nameOf(cur), Problem: fmt.Sprintf("the directive ends with \\ but line %d does not start with %s", ln.num, cur.prefix),
					Fix: fmt.Sprintf("start each continuation line with %s, or remove the \\", cur.prefix)})
			}
			finish()
			if report {
				p.warnLookalike(ln, content)
			}
			continue
		}
		segStart := ln.start
		continuedBefore := continued
		if continued {
			if kind != cur.prefix {
				if report {
					p.fail(&Error{Line: cur.line, Directive: p.nameOf(cur), Problem: fmt.Sprintf("continued on line %d with %s: a continued directive cannot mix #DW and #BB", ln.num, kind),
						Fix: "end the directive before the other prefix, or continue it with the same prefix"})
				}
				finish()
			} else {
				segStart = ln.start + 3
				for hadSpace && segStart < ln.end && isBlank(p.src[segStart]) {
					segStart++
				}
			}
		}
		if cur == nil {
			if len(res.directives) >= p.limits.MaxDirectives {
				if report && len(res.directives) == p.limits.MaxDirectives {
					p.fail(&Error{Line: ln.num, Directive: kind.String(), Problem: fmt.Sprintf("more than %d directives (limit MaxDirectives)", p.limits.MaxDirectives), Fix: "stage whole directories or use type=list instead of one directive per file"})
					res.directives = append(res.directives, &logical{prefix: kind, line: ln.num, lines: []int{ln.num}, broken: true})
				}
				continue
			}
			cur = &logical{prefix: kind, line: ln.num}
		}
		cur.lines = append(cur.lines, ln.num)
		segEnd := ln.end
		continued = false
		switch {
		case ln.end > ln.start && p.src[ln.end-1] == '\\':
			continued, segEnd = true, ln.end-1
		case bytes.HasSuffix(bytes.TrimRight(content, " \t\v\f"), []byte(`\`)):
			// Slurm joins only when "\" is the very last character; read it as meant, but say so.
			segEnd = ln.start + len(bytes.TrimRight(content, " \t\v\f")) - 1
			continued = true
			if report {
				name := kind.String()
				if !continuedBefore {
					name = directiveName(kind, string(content))
				}
				p.fail(&Error{Line: ln.num, Directive: name, Problem: "blanks after the continuation \\: Slurm joins the next line only when \\ is the very last character",
					Fix: "remove the spaces after the \\"})
			}
		}
		if continued {
			hadSpace = segEnd > ln.start && isBlank(p.src[segEnd-1])
		}
		if segEnd < segStart {
			segEnd = segStart
		}
		cur.segments = append(cur.segments, segment{segStart, segEnd})
		if !continued {
			finish()
		}
	}
	if continued && report {
		p.fail(&Error{Line: cur.line, Directive: p.nameOf(cur), Problem: "the directive ends with \\ but the script ends there", Fix: "remove the final \\"})
	}
	finish()
	return res
}

// nameOf names a directive still being read, for messages: "#DW stage_in".
func (p *parser) nameOf(l *logical) string {
	if len(l.segments) == 0 {
		return l.prefix.String()
	}
	first := l.segments[0]
	return directiveName(l.prefix, string(p.src[first.start:first.end]))
}

// joined is the directive's text with its continuations, bounded by MaxDirectiveBytes.
func (p *parser) joined(l *logical) string {
	var b strings.Builder
	for _, s := range l.segments {
		if b.Len()+(s.end-s.start) > p.limits.MaxDirectiveBytes {
			l.broken = true
			p.fail(&Error{Line: l.line, Directive: l.prefix.String(), Problem: fmt.Sprintf("the directive is longer than %d bytes (limit MaxDirectiveBytes)", p.limits.MaxDirectiveBytes),
				Fix: "split it into several directives"})
			return ""
		}
		b.Write(p.src[s.start:s.end])
	}
	return b.String()
}

func isBlank(c byte) bool {
	return c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r'
}

// warnAfterBlock reports a directive that Slurm ignores because it follows the first command.
func (p *parser) warnAfterBlock(ln line, content []byte, endLine line) {
	trimmed := bytes.TrimLeft(content, " \t")
	kind := lineKind(trimmed)
	if kind == prefixNone {
		return
	}
	what := directiveName(kind, string(trimmed))
	if ln.num == endLine.num {
		p.warn(ln.num, "%s ignored: a directive must start in the first column; Slurm ends the leading comment block at this indented line, so it and every directive after it are ignored; remove the indentation", what)
		return
	}
	p.warn(ln.num, "%s ignored: directives must be in the leading comment block, before the first command (the block ended at line %d: %s); move it above line %d",
		what, endLine.num, describeLine(p.src[endLine.start:endLine.end]), endLine.num)
}

func describeLine(content []byte) string {
	if len(bytes.TrimSpace(content)) == 0 {
		return "a line of blanks, which Slurm treats as a command"
	}
	if bytes.HasPrefix(content, []byte("\uFEFF")) {
		return "it starts with an invisible byte-order mark (U+FEFF), which Slurm treats as a command; save the script without BOM"
	}
	return quote(string(content))
}

// directiveName is "#DW stage_out" for messages about a line not otherwise parsed.
func directiveName(kind prefix, text string) string {
	fields := splitBlanks(strings.TrimPrefix(strings.TrimPrefix(text, "#DW"), "#BB"))
	if len(fields) == 0 {
		return kind.String()
	}
	return kind.String() + " " + clip(fields[0], 40)
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// warnLookalike reports comment lines such as "#dw jobdw" or "# DW stage_in" that a user
// meant as directives: Slurm reads them as ordinary comments.
func (p *parser) warnLookalike(ln line, content []byte) {
	text := string(content[1:])
	fields := splitBlanks(text)
	if len(fields) < 2 {
		// "#dwjobdw"-style: the prefix glued to a command
		if len(fields) == 1 && len(fields[0]) > 2 {
			head := fields[0][:2]
			if (strings.EqualFold(head, "DW") || strings.EqualFold(head, "BB")) && knownCommand(fields[0][2:]) && len(text) > 0 && !isBlank(text[0]) {
				p.warn(ln.num, "%s looks like a directive but is an ordinary comment: directives start with exactly #DW or #BB followed by a space", quote(string(content)))
			}
		}
		return
	}
	if (strings.EqualFold(fields[0], "DW") || strings.EqualFold(fields[0], "BB")) && knownCommand(fields[1]) {
		p.warn(ln.num, "%s looks like a directive but is an ordinary comment: directives start with exactly #DW or #BB (upper case, no space after #), e.g. \"#%s %s\"",
			quote(clip(string(content), 60)), strings.ToUpper(fields[0]), fields[1])
	}
}

func knownCommand(word string) bool {
	switch word {
	case "jobdw", "persistentdw", "swap", "stage_in", "stage_out", "create_persistent", "destroy_persistent":
		return true
	}
	return false
}

// splitBlanks splits on ASCII blanks only. Slurm and DataWarp split on spaces; a non-breaking
// space pasted from a web page is not a separator and is reported by the caller.
func splitBlanks(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r < 0x80 && isBlank(byte(r)) })
}
