package stage

import (
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// dwPath is a burst-buffer path split into its variable and the path below it.
type dwPath struct {
	variable      string // without "$", e.g. DW_JOB_STRIPED
	rel           string // cleaned, relative to the namespace root; "." for the root itself
	trailingSlash bool   // the text ended in "/": "into this directory"
}

// parseDWPath reads "$DW_JOB_STRIPED/sub/file" or "${DW_PERSISTENT_STRIPED_x}/file". Variable
// names are checked against roots by the caller. ".." may not climb above the variable: that
// is refused here, by name, rather than left to os.Root's terser error.
func parseDWPath(text string) (dwPath, error) {
	if strings.IndexByte(text, 0) >= 0 {
		return dwPath{}, fmt.Errorf("burst buffer path %q contains a NUL byte", text)
	}
	if !strings.HasPrefix(text, "$") {
		return dwPath{}, fmt.Errorf("burst buffer path %q must start with a variable such as $DW_JOB_STRIPED or $DW_PERSISTENT_STRIPED_<name>", text)
	}
	var name, rest string
	if strings.HasPrefix(text, "${") {
		end := strings.IndexByte(text, '}')
		if end < 0 {
			return dwPath{}, fmt.Errorf("burst buffer path %q has no closing } after ${", text)
		}
		name, rest = text[2:end], text[end+1:]
	} else {
		end := 1
		for end < len(text) && isNameByte(text[end], end == 1) {
			end++
		}
		name, rest = text[1:end], text[end:]
	}
	if name == "" || !validName(name) {
		return dwPath{}, fmt.Errorf("burst buffer path %q does not start with a valid variable name (letters, digits and _)", text)
	}
	if rest != "" && rest[0] != '/' {
		return dwPath{}, fmt.Errorf("burst buffer path %q: expected / after $%s", text, name)
	}
	depth := 0
	for part := range strings.SplitSeq(rest, "/") {
		switch part {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return dwPath{}, fmt.Errorf("burst buffer path %q climbs out of $%s with \"..\"; staging never leaves the instance", text, name)
			}
		default:
			depth++
		}
	}
	rel := strings.TrimPrefix(path.Clean("/"+rest), "/")
	if rel == "" {
		rel = "."
	}
	return dwPath{variable: name, rel: rel, trailingSlash: strings.HasSuffix(rest, "/") || rest == ""}, nil
}

func isNameByte(c byte, first bool) bool {
	return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (!first && c >= '0' && c <= '9')
}

func validName(name string) bool {
	for i := 0; i < len(name); i++ {
		if !isNameByte(name[i], i == 0) {
			return false
		}
	}
	return true
}

// unknownVariableError names the variable, the ones that exist, and the likely typo: since
// $DW_JOB_STRIPED ends in "/", "$DW_JOB_STRIPEDdata" is an easy mistake.
func unknownVariableError(text, variable string, roots map[string]string) error {
	known := make([]string, 0, len(roots))
	for name := range roots {
		known = append(known, "$"+name)
	}
	slices.Sort(known)
	hint := ""
	for name := range roots {
		if strings.HasPrefix(variable, name) && len(variable) > len(name) {
			hint = fmt.Sprintf("; did you mean $%s/%s?", name, variable[len(name):])
		}
	}
	if len(known) == 0 {
		return fmt.Errorf("burst buffer path %q: $%s is not a burst buffer of this job (it has none on this node)", text, variable)
	}
	return fmt.Errorf("burst buffer path %q: $%s is not a burst buffer of this job (known: %s)%s", text, variable, strings.Join(known, ", "), hint)
}

// pfsPath is a cleaned absolute PFS path.
type pfsPath struct {
	name          string
	trailingSlash bool
}

// parsePFSPath checks that text is absolute. DataWarp does not expand environment variables
// other than its own placeholders, so "$SCRATCH/x" gets a message saying so.
func parsePFSPath(text string) (pfsPath, error) {
	if strings.IndexByte(text, 0) >= 0 {
		return pfsPath{}, fmt.Errorf("PFS path %q contains a NUL byte", text)
	}
	if strings.HasPrefix(text, "$") {
		return pfsPath{}, fmt.Errorf("PFS path %q: environment variables are not expanded in stage directives; write the absolute path", text)
	}
	if !filepath.IsAbs(text) {
		return pfsPath{}, fmt.Errorf("PFS path %q must be absolute (start with /)", text)
	}
	return pfsPath{name: filepath.Clean(text), trailingSlash: strings.HasSuffix(text, "/")}, nil
}

// listLine is one "<source> <destination>" line of a list file.
type listLine struct {
	number   int
	src, dst string
}

// parseList reads a list file: one "<source> <destination>" pair a line; blank lines and lines
// starting with "#" are skipped. Paths are separated by white space, so they cannot contain it.
// Malformed lines are added to bad (every one is reported, not only the first); err is a
// list too large to stage at all.
func parseList(data []byte, listName string, maxEntries int, bad *listErrors) (lines []listLine, err error) {
	for i, raw := range strings.Split(string(data), "\n") {
		number := i + 1
		text := strings.TrimSpace(raw)
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 2 {
			found := fmt.Sprintf("%d words", len(fields))
			if len(fields) == 1 {
				found = "1 word"
			}
			bad.add(fmt.Errorf("list %s line %d: expected \"<source> <destination>\", found %s (paths cannot contain spaces)", listName, number, found))
			continue
		}
		if len(lines) >= maxEntries {
			return nil, fmt.Errorf("list %s has more than %d entries (limit stage.max_files_per_stage); split it into several lists", listName, maxEntries)
		}
		lines = append(lines, listLine{number: number, src: fields[0], dst: fields[1]})
	}
	return lines, nil
}

// listErrors gathers the errors of a list's lines, so that a user fixes them all at once; the
// stage's message is shortened to stage.worker_output_limit by the emitter if it must be.
type listErrors []error

func (l *listErrors) add(err error) { *l = append(*l, err) }

func (l listErrors) err() error {
	switch len(l) {
	case 0:
		return nil
	case 1:
		return l[0]
	}
	msgs := make([]string, len(l))
	for i, e := range l {
		msgs[i] = e.Error()
	}
	return fmt.Errorf("%d lines are wrong: %s", len(l), strings.Join(msgs, "; "))
}
