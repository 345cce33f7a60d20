package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/agentapi"
	"github.com/spillway-hpc/spillway/internal/apiclient"
	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// wlmAt points dw_wlm_cli at the controller at addr (its system configuration) and returns
// a function running it in this process.
func wlmAt(t *testing.T, addr string) func(args ...string) cliResult {
	cfg := filepath.Join(t.TempDir(), "spillway.toml")
	if err := os.WriteFile(cfg, []byte("[client]\ncontroller = "+strconv.Quote(addr)+"\nconnect_retries = 2\nretry_wait = \"10ms\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SPILLWAY_CONFIG", cfg)
	return func(args ...string) cliResult {
		var out, errb bytes.Buffer
		code := dwWLMMain(args, &out, &errb)
		return cliResult{code, out.String(), errb.String()}
	}
}

// decodedAndEncodedAgain is what dw_wlm_cli printed before it passed listings on as they
// came: the answer decoded, encoded again, apostrophes escaped.
func decodedAndEncodedAgain(t *testing.T, addr, table string) string {
	t.Helper()
	cl, err := apiclient.New(addr, apiclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var tables map[string]json.RawMessage
	if err := cl.Do(context.Background(), "GET", "/dw/v1/"+table, nil, &tables); err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(map[string]json.RawMessage{table: tables[table]})
	if err != nil {
		t.Fatal(err)
	}
	return string(bytes.ReplaceAll(raw, []byte("'"), []byte(`\u0027`))) + "\n"
}

// oddNode is a node name with characters JSON escapes, an apostrophe (Slurm's parser's
// trouble) and HTML's: it reaches the listings in the fragments' node and the errors.
const oddNode = "bb'1<&>\"\\\t\u2028é"

// The listings Slurm reads print byte for byte what they printed when dw_wlm_cli decoded and
// encoded them again, strange characters included.
func TestWLMListingsPrintWhatTheyPrinted(t *testing.T) {
	c, addr := testController(t)
	ctx := context.Background()
	if _, err := c.Heartbeat(ctx, agentapi.NodeReport{Name: oddNode, Pool: "wlm_pool", Capacity: 4 << 30, Roles: []string{"storage", "client"}}); err != nil {
		t.Fatal(err)
	}
	for _, req := range []lifecycle.Setup{
		{Token: "proj", Creator: "CLI", Persistent: true,
			Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}, Strategy: "bandwidth"}},
		{Token: "12", Creator: "SLURM", Owner: 1000, Group: 1000,
			Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}, Strategy: "bandwidth"}},
	} {
		if err := c.Setup(ctx, req, false); err != nil {
			t.Fatal(err)
		}
	}
	// The executor fails the effects (no agents): wait for the node's name to reach the
	// sessions' failures.
	for deadline := time.Now().Add(time.Minute); !strings.Contains(decodedAndEncodedAgain(t, addr, "sessions"), `\u0027`); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the sessions never failed with the node's name: %s", decodedAndEncodedAgain(t, addr, "sessions"))
		}
	}
	wlm := wlmAt(t, addr)
	for _, fn := range []struct{ function, table string }{
		{"pools", "pools"}, {"show_sessions", "sessions"}, {"show_instances", "instances"}, {"show_configurations", "configurations"},
	} {
		// The executor is changing the state (no agents: effects fail): compare a print with
		// the reference printed before and after it, when those agree.
		for attempt := 0; ; attempt++ {
			before := decodedAndEncodedAgain(t, addr, fn.table)
			r := wlm("--function", fn.function)
			if after := decodedAndEncodedAgain(t, addr, fn.table); before != after {
				if attempt == 100 {
					t.Fatalf("%s: the state never stood still", fn.function)
				}
				continue
			}
			if r.code != 0 || r.stdout != before || r.stderr != "" {
				t.Errorf("dw_wlm_cli --function %s: exit %d\n%s%s\nprinted before:\n%s", fn.function, r.code, r.stdout, r.stderr, before)
			}
			break
		}
	}
	r := wlm("--function", "show_sessions")
	for _, want := range []string{`\u0027`, `\u003c\u0026\u003e`, `\"\\\t\u2028é`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show_sessions has no %s: the strange characters did not reach it, the comparison proves less\n%s", want, r.stdout)
		}
	}
}

// An answer that is not one whole {"<name>":[...]} is refused, however it is cut.
func TestListingDocumentRefusesBrokenAnswers(t *testing.T) {
	whole := `{"sessions":[{"token":"a'b","links":{"client_nodes":["n]1","n\"}2"]},"state":{"error":"x\\"}},{"token":"[{"}]}` + "\n"
	doc, err := listingDocument("sessions", []byte(whole))
	if want := strings.ReplaceAll(whole, "'", `\u0027`); err != nil || string(doc) != want {
		t.Fatalf("the whole answer: %q %v, want %q", doc, err, want)
	}
	for cut := 0; cut < len(whole)-1; cut++ { // every cut but the final newline's
		if doc, err := listingDocument("sessions", []byte(whole[:cut])); err == nil {
			t.Errorf("cut after %d bytes: accepted %q", cut, doc)
		}
	}
	for _, broken := range []string{
		`{"instances":[]}`, `{"sessions":null}`, `{"sessions":[]}{"sessions":[]}`, `{"sessions":[]]}`, `{"sessions":[}]}`,
		`{"sessions":[],"x":1}`, `["sessions"]`, ``, `{"sessions":["\"]}`, `{"sessions":[{]}`,
	} {
		if doc, err := listingDocument("sessions", []byte(broken)); err == nil {
			t.Errorf("%s: accepted %q", broken, doc)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: the error is not one line: %q", broken, err)
		}
	}
	if doc, err := listingDocument("sessions", []byte(`{"sessions":[]}`)); err != nil || string(doc) != "{\"sessions\":[]}\n" {
		t.Errorf("an empty list: %q %v", doc, err)
	}
}

// A controller whose answer breaks off (the HTTP body shorter than announced, or a whole body
// holding part of a document): dw_wlm_cli prints one line and exits 1, never part of the
// listing.
func TestWLMListingCutOffPrintsOneLine(t *testing.T) {
	_, real := testController(t)
	listing := decodedAndEncodedAgain(t, real, "pools")
	for _, tc := range []struct {
		name   string
		answer func(w http.ResponseWriter)
	}{
		{"body shorter than announced", func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", strconv.Itoa(len(listing)))
			w.WriteHeader(200)
			w.Write([]byte(listing[:len(listing)/2]))
		}},
		{"half a document", func(w http.ResponseWriter) {
			w.WriteHeader(200)
			w.Write([]byte(listing[:len(listing)/2]))
		}},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tc.answer(w) }))
		r := wlmAt(t, srv.URL)("--function", "pools")
		srv.Close()
		if r.code != 1 || strings.Count(r.stdout, "\n") != 1 || strings.Contains(r.stdout, `{"pools"`) || r.stderr != "" {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1 and one line, no part of the listing", tc.name, r.code, r.stdout, r.stderr)
		}
	}
}

// Any answer: the check never panics; what it accepts is framed as {"sessions":[...]} with a
// newline; a compact, valid {"sessions": [...]} and nothing else is accepted as it is.
func FuzzListingDocument(f *testing.F) {
	f.Add([]byte(`{"sessions":[{"token":"a'b","links":{"client_nodes":["n]1"]},"e":"x\\"}]}` + "\n"))
	f.Add([]byte(`{"sessions":[]}`))
	f.Add([]byte(`{"sessions":["\`))
	f.Fuzz(func(t *testing.T, answer []byte) {
		doc, err := listingDocument("sessions", answer)
		if err == nil && (!bytes.HasPrefix(doc, []byte(`{"sessions":[`)) || !bytes.HasSuffix(doc, []byte("]}\n"))) {
			t.Fatalf("%q accepted as %q", answer, doc)
		}
		var compact bytes.Buffer
		if json.Compact(&compact, answer) != nil || !bytes.Equal(compact.Bytes(), answer) {
			return
		}
		var one map[string]json.RawMessage
		if json.Unmarshal(answer, &one) != nil || !bytes.HasPrefix(one["sessions"], []byte("[")) || string(answer) != `{"sessions":`+string(one["sessions"])+"}" {
			return
		}
		if want := strings.ReplaceAll(string(answer), "'", `\u0027`) + "\n"; err != nil || string(doc) != want {
			t.Fatalf("%q: %q %v, want it accepted as %q", answer, doc, err, want)
		}
	})
}
