package controller

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/mungetest"
)

// Credentials without MUNGE's form cost munged nothing; well-formed ones that munged refuses are
// decoded at most controller.munge_failures_per_minute times a minute per network, then
// answered 429 undecoded, while other networks are decoded as before.
func TestBadMungeCredentialsAreCheap(t *testing.T) {
	a := newAdminWorld(t, nil)
	g := a.srv.munge
	// A munged of the test's own judges the credentials (without one, every credential is
	// unavailable, not refused), and the gate's clock stands still: however slowly the machine
	// decodes, no budget refills during the test.
	g.socket = mungetest.Start(t, t.TempDir(), "munged")
	frozen := time.Now()
	g.now = func() time.Time { return frozen }
	call := func(from, cred string) (int, string) {
		req := httptest.NewRequest("GET", "/dw/v1/pools", nil)
		req.RemoteAddr = from
		req.Header.Set("Authorization", "MUNGE "+cred)
		rec := httptest.NewRecorder()
		a.srv.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	junk := strings.Repeat("x", 4096)
	for i := 0; i < 200; i++ {
		if code, out := call("192.0.2.10:4000", junk); code != http.StatusUnauthorized || !strings.Contains(out, "not a MUNGE credential") {
			t.Fatalf("4 KB of junk: %d %s", code, out)
		}
	}
	if n := g.decodes.Load(); n != 0 {
		t.Errorf("junk cost %d decodes, want 0", n)
	}
	forged := func() string {
		b := make([]byte, 102)
		rand.Read(b)
		return "MUNGE:" + base64.StdEncoding.EncodeToString(b) + ":"
	}
	perMinute := a.c.cfg.Controller.MungeFailuresPerMinute
	throttled := 0
	for i := 0; i < perMinute+40; i++ {
		from := "192.0.2." + []string{"10", "77", "200"}[i%3] + ":5000" // one /24
		code, out := call(from, forged())
		switch code {
		case http.StatusUnauthorized:
		case http.StatusTooManyRequests:
			throttled++
			if !strings.Contains(out, "controller.munge_failures_per_minute") || !strings.Contains(out, "192.0.2.0/24") {
				t.Errorf("the refusal does not name the limit and the network: %s", out)
			}
		default:
			t.Fatalf("a forged credential: %d %s", code, out)
		}
	}
	if n := g.decodes.Load(); n > int64(perMinute)+1 || throttled < 39 {
		t.Errorf("%d forged credentials from one /24: %d decoded, %d refused undecoded; want at most %d decoded",
			perMinute+40, n, throttled, perMinute)
	}
	before := g.decodes.Load()
	if code, out := call("198.51.100.7:5000", forged()); code != http.StatusUnauthorized || g.decodes.Load() != before+1 {
		t.Errorf("another network's credential: %d %s (decoded %d)", code, out, g.decodes.Load()-before)
	}

	// munged down is this host's fault: the caller is told to retry (503, naming munged), and
	// no network's budget pays for it.
	g.socket = filepath.Join(t.TempDir(), "no-munged.sock")
	for i := 0; i < perMinute+5; i++ {
		code, out := call("203.0.113.9:5000", forged())
		if code != http.StatusServiceUnavailable || !strings.Contains(out, "munged") {
			t.Fatalf("a credential while munged is down (try %d): %d %s", i+1, code, out)
		}
	}
}
