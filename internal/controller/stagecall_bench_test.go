package controller

import (
	"encoding/json"
	"fmt"
	"net/http"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/stagecall"
)

// BenchmarkStageCall is one libdatawarp call on the controller, in process (no socket): a
// stage-out at job end of a file, then its revoke, on a mounted job session.
func BenchmarkStageCall(b *testing.B) {
	a := newAdminWorld(b, nil)
	a.heartbeat("ssd1", "wlm_pool")
	a.setup("77", userUID, 0)
	a.must(userUID, "POST", "/dw/v1/sessions/77/pre_run", `{"nodes":["ssd1"]}`, http.StatusAccepted)
	a.settle()
	mount := a.all().Activations[0].Mount
	dir := stagecall.Stat{Kind: stagecall.KindDir, R: true, WX: true}
	file := stagecall.Stat{Kind: stagecall.KindFile, R: true}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := stagecall.Probe{Given: "x", Path: fmt.Sprintf("%s/f%d", mount, i%100), Mount: mount, Stat: file, Dir: dir}
		pfs := stagecall.Probe{Given: "/pfs/x", Path: "/pfs/x", Stat: stagecall.Stat{Errno: int(syscall.ENOENT)}, Dir: dir}
		for _, when := range []string{"at_job_end", "revoke"} {
			body, _ := json.Marshal(stagecall.Call{Verb: "out", Type: "file", When: when, DW: []stagecall.Probe{p}, PFS: []stagecall.Probe{pfs}})
			if code, out := a.call(userUID, "POST", "/dw/v1/job_stages", string(body)); code != 200 || out[:11] != `{"errno":0}` {
				b.Fatalf("%d %s", code, out)
			}
		}
	}
}
