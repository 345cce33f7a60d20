package metrics

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Scrape is one scrape in Prometheus' text format, as the tests read it: every sample by its
// name and labels as the format writes them (`spillway_sessions{kind="job",phase="setup"}`),
// and the metric families (# TYPE lines) it holds.
type Scrape struct {
	Samples  map[string]float64
	Families map[string]bool
}

// Parse reads a scrape in the text format (what Handler answers a client that asks for no
// other format).
func Parse(r io.Reader) (Scrape, error) {
	s := Scrape{Samples: map[string]float64{}, Families: map[string]bool{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f := strings.Fields(line); len(f) >= 4 && f[0] == "#" && f[1] == "TYPE" {
			s.Families[f[2]] = true
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return s, fmt.Errorf("a sample without a value: %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return s, fmt.Errorf("a sample whose value is not a number: %q", line)
		}
		s.Samples[line[:i]] = v
	}
	return s, sc.Err()
}
