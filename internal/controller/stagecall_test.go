package controller

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/spillway-hpc/spillway/internal/config"
	"github.com/spillway-hpc/spillway/internal/stagecall"
)

// stageCall sends POST /dw/v1/job_stages as uid; the answer is always 200 with the errno.
func (a *adminWorld) stageCall(uid uint32, call stagecall.Call) map[string]any {
	a.t.Helper()
	b, _ := json.Marshal(call)
	out := a.must(uid, "POST", "/dw/v1/job_stages", string(b), http.StatusOK)
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		a.t.Fatalf("%s: %v", out, err)
	}
	return m
}

func errnoIn(m map[string]any) syscall.Errno {
	f, _ := m["errno"].(float64)
	return syscall.Errno(int(f))
}

// The one call of every in-job staging client (libdatawarp, dwcli stage) resolves a path's
// mount to the caller's own session only: another user naming the same mount learns nothing
// of it (EINVAL, as for no mount; the answer holds the errno and the message naming its path only) and records nothing; the
// owner's calls are answered with libdatawarp's errnos, the checks made on the probes the
// client sent (its own stat/access answers); a list over stage.max_paths_per_request is
// E2BIG with the limit named.
func TestStageCallIsTheCallersOwn(t *testing.T) {
	a := newAdminWorld(t, func(c *config.Config) { c.Stage.MaxPathsPerRequest = 3 })
	a.heartbeat("ssd1", "wlm_pool")
	a.setup("77", userUID, 0)
	a.must(userUID, "POST", "/dw/v1/sessions/77/pre_run", `{"nodes":["ssd1"]}`, http.StatusAccepted)
	a.settle()
	all := a.all()
	if len(all.Activations) == 0 {
		t.Fatal("no activation after pre_run")
	}
	mount := all.Activations[0].Mount
	dir := stagecall.Stat{Kind: stagecall.KindDir, R: true, WX: true}
	file := stagecall.Stat{Kind: stagecall.KindFile, R: true}
	bb := func(rel string, st stagecall.Stat) stagecall.Probe {
		return stagecall.Probe{Given: mount + rel, Path: mount + rel, Mount: mount, Stat: st, Dir: dir}
	}
	pfs := stagecall.Probe{Given: "/pfs/out/x", Path: "/pfs/out/x", Stat: stagecall.Stat{Errno: int(syscall.ENOENT)}, Dir: dir}
	out := stagecall.Call{Verb: stagecall.VerbOut, Type: "file", When: "at_job_end", DW: []stagecall.Probe{bb("/x", file)}, PFS: []stagecall.Probe{pfs}}

	m := a.stageCall(2000, out)
	if errnoIn(m) != syscall.EINVAL || len(m) != 2 || !strings.Contains(fmt.Sprint(m["error"]), "not one of your jobs'") {
		t.Fatalf("another user's call on the mount: %v", m)
	}
	if n := a.inJobStages("77"); n != 0 {
		t.Fatalf("another user's call recorded %d stages", n)
	}
	for _, c := range []struct {
		name string
		call stagecall.Call
		want syscall.Errno
	}{
		{"outside every mount", stagecall.Call{Verb: stagecall.VerbQuery, DW: []stagecall.Probe{{Given: "/tmp/x", Path: "/tmp/x"}}}, syscall.EINVAL},
		{"a missing burst buffer file", stagecall.Call{Verb: stagecall.VerbOut, Type: "file", DW: []stagecall.Probe{bb("/y", stagecall.Stat{Errno: int(syscall.ENOENT)})}, PFS: []stagecall.Probe{pfs}}, syscall.ENOENT},
		{"an unwritable PFS directory", stagecall.Call{Verb: stagecall.VerbOut, Type: "file", DW: []stagecall.Probe{bb("/x", file)},
			PFS: []stagecall.Probe{{Given: "/pfs/ro/x", Path: "/pfs/ro/x", Stat: stagecall.Stat{Errno: int(syscall.ENOENT)}, Dir: stagecall.Stat{Kind: stagecall.KindDir, R: true}}}}, syscall.EACCES},
		{"a list over the limit", stagecall.Call{Verb: stagecall.VerbIn, Type: "list", DW: []stagecall.Probe{bb("/d", dir)},
			PFS: []stagecall.Probe{{Path: "/p/1", Stat: file}, {Path: "/p/2", Stat: file}, {Path: "/p/3", Stat: file}, {Path: "/p/4", Stat: file}}}, syscall.E2BIG},
		{"a file never staged", stagecall.Call{Verb: stagecall.VerbQuery, DW: []stagecall.Probe{bb("/x", file)}}, syscall.EINVAL},
		{"recorded", out, 0},
		{"a bad verb", stagecall.Call{Verb: "bogus"}, syscall.EINVAL},
	} {
		if m := a.stageCall(userUID, c.call); errnoIn(m) != c.want {
			t.Errorf("%s: %v, want %v", c.name, m, c.want)
		}
	}
	if n := a.inJobStages("77"); n != 1 {
		t.Fatalf("the owner's calls recorded %d stages, want 1", n)
	}
	m = a.stageCall(userUID, stagecall.Call{Verb: stagecall.VerbQuery, DW: []stagecall.Probe{bb("/x", file)}})
	if errnoIn(m) != 0 || m["deferred"] != float64(1) {
		t.Fatalf("query of the recorded stage: %v", m)
	}
	if st, _ := m["stages"].([]any); len(st) != 1 || st[0].(map[string]any)["path"] != mount+"/x" {
		t.Fatalf("the stage's path is not the caller's: %v", m["stages"])
	}
}
