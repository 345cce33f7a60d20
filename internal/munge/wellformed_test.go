package munge

import (
	"strings"
	"testing"
)

func TestWellFormed(t *testing.T) {
	// A credential munged 0.5.15 made (Debian 12), without payload.
	real := "MUNGE:AwQFAACDB34mLQQPU3/jWJdntVIqe5etYfwI36vO58ozWXYkZeuk7B7pQrYX7GlnaJDKnCuD2Pjk8eWiJBfIxBtxk/w7yiNo49Jwg5V5WrouRx07T6y7OW7HFw7lFBSJw5JGs1s=:"
	if err := WellFormed(real); err != nil {
		t.Errorf("a real credential: %v", err)
	}
	for _, bad := range []string{
		"", "MUNGE:", "MUNGE::", strings.Repeat("x", 4096),
		strings.TrimSuffix(real, ":"),                 // no closing colon
		"MUNGE:" + strings.Repeat("A", 2000) + ":",    // too long
		"MUNGE:AwQFAACD:",                             // too short
		strings.Replace(real, "AwQF", "Aw!F", 1),      // not base64
		"MUNGE:" + strings.Repeat("QUFB", 30) + "\n:", // a newline
	} {
		if WellFormed(bad) == nil {
			t.Errorf("%.60q accepted", bad)
		}
	}
}
