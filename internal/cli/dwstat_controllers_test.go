package cli

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-hpc/spillway/internal/views"
)

// dwstat controllers asks each controller it is given, one by one: a real controller says it
// is the only one (no [ha]) and its engine; an address nothing answers at is a row saying
// so, and the command still succeeds (it is what an admin runs when things are wrong).
func TestDwstatControllers(t *testing.T) {
	_, addr := testController(t)
	nobody := "unix:" + filepath.Join(t.TempDir(), "nobody.sock")
	run := func(args ...string) cliResult {
		var out, errb bytes.Buffer
		code := dwstatMain(append([]string{"--controller", addr + "," + nobody}, args...), &out, &errb)
		return cliResult{code, out.String(), errb.String()}
	}
	r := run("controllers")
	if r.code != 0 {
		t.Fatalf("dwstat controllers: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "address") ||
		!strings.Contains(lines[1], addr) || !strings.Contains(lines[1], " only ") || !strings.Contains(lines[1], "sqlite") ||
		!strings.Contains(lines[2], nobody) || !strings.Contains(lines[2], "unreachable: ") {
		t.Fatalf("dwstat controllers:\n%s", r.stdout)
	}
	r = run("--json", "ctl")
	var got struct {
		Controllers []views.Controller `json:"controllers"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != 0 {
		t.Fatalf("dwstat --json ctl: exit %d, %v\n%s", r.code, err, r.stdout)
	}
	if len(got.Controllers) != 2 || got.Controllers[0].Role != "only" || got.Controllers[0].Engine != "sqlite" ||
		got.Controllers[1].Role != "unreachable" || got.Controllers[1].Error == "" {
		t.Fatalf("dwstat --json ctl: %+v", got.Controllers)
	}
}
