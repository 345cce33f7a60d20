package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// On a system install (allow_root off, its default there) a root job's stage-in is refused
// with one message naming [stage] allow_root, why, and the fix; data_in says it once (issue 23
// item 12).
func TestSystemInstallRefusesRootStagesSayingWhy(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	cfg, _ := os.ReadFile(c.config)
	os.WriteFile(c.config, []byte(strings.Replace(string(cfg), "allow_root = true\n", "", 1)), 0o644)
	c.startController()
	c.startAgent()
	ctx := context.Background()
	in := filepath.Join(c.dir, "pfs", "in.txt")
	os.WriteFile(in, []byte("x\n"), 0o644)
	c.step("300", lifecycle.PhaseSetup, func() error {
		return c.client.Setup(ctx, lifecycle.Setup{Token: "300", Creator: "TEST", Owner: 0, Group: 0,
			Instance: &lifecycle.InstanceRequest{Capacity: 1 << 30, Pool: "wlm_pool", Type: "scratch", AccessModes: []string{"striped"}}})
	})
	if err := c.client.Stages(ctx, "300", "in", []lifecycle.StageRequest{{Type: "file", PFSPath: in, DWVar: "DW_JOB_STRIPED", DWPath: "/in.txt", Line: 2}}); err != nil {
		t.Fatal(err)
	}
	st, err := c.client.WaitStep(ctx, "300", lifecycle.PhaseDataIn, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const why = "refusing to stage as uid 0 (root): [stage] allow_root is off, the default of a system install (DataWarp staged as the job's user, and a uid 0 there is almost always a missing one; a home that root runs allows it); if root's own jobs must stage, set allow_root = true under [stage] in the storage nodes' configuration and restart their agents"
	if !st.Failed || strings.Count(st.Message, "refusing to stage") != 1 || !strings.Contains(st.Message, why) {
		t.Errorf("data_in: failed %v, message %q\nwant it once: %q", st.Failed, st.Message, why)
	}
	c.step("300", lifecycle.PhaseTeardown, func() error { return c.client.Teardown(ctx, "300", true) })
	c.assertClean()
}
