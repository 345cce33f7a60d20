package spillwaycli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spillway-hpc/spillway/internal/warpfs/mount"
	"github.com/spillway-hpc/spillway/internal/warpfs/usage"
)

// stripesMount mounts spec (a temporary mount path) for the test; root only (FUSE, and the
// server's trusted attributes).
func stripesMount(t *testing.T, spec mount.Spec) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounts a Spillway namespace: root only")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	spec.MountPath = filepath.Join(t.TempDir(), "mnt")
	spec.Limits.UnmountBusyTimeout = 2 * time.Second
	m, err := mount.Mount(spec)
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	t.Cleanup(func() { m.Unmount() })
	return m.Path()
}

func runStripes(t *testing.T, args ...string) (string, []fileStripes) {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := stripesMain(args, &out, &errOut); code != 0 {
		t.Fatalf("spillway stripes %v: %d\n%s%s", args, code, out.String(), errOut.String())
	}
	var js bytes.Buffer
	if code := stripesMain(append([]string{"--json"}, args...), &js, &errOut); code != 0 {
		t.Fatalf("spillway stripes --json %v: %d\n%s", args, code, errOut.String())
	}
	var all []fileStripes
	if err := json.Unmarshal(js.Bytes(), &all); err != nil {
		t.Fatalf("--json: %v\n%s", err, js.String())
	}
	return out.String(), all
}

// A file of a loadbalance mount on two storage nodes is not striped: the command names its
// replicas and the one this node reads (issue 23 item 10), not "one storage node".
func TestStripesOfALoadbalanceFile(t *testing.T) {
	var replicas []mount.Server
	for _, node := range []string{"ssd1", "ssd2"} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "f"), []byte("copy"), 0o644); err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, mount.Server{Node: node, Dir: dir, Tracker: usage.New("replica", 1<<30)})
	}
	mp := stripesMount(t, mount.Spec{ReadOnly: true, Replicas: replicas, Client: "cn1"})
	text, all := runStripes(t, filepath.Join(mp, "f"))
	if !strings.Contains(text, "loadbalance") || !strings.Contains(text, "ssd1, ssd2") || !strings.Contains(text, "reads the copy on ssd1") || strings.Contains(text, "one storage node") {
		t.Errorf("spillway stripes: %q", text)
	}
	if len(all) != 1 || all[0].Striped || strings.Join(all[0].Replicas, " ") != "ssd1 ssd2" || all[0].Reading != "ssd1" || all[0].Size != 4 {
		t.Errorf("--json: %+v", all)
	}
}

// A file of an instance on one storage node: not striped, and the stripe configuration set on
// it (dw_set_stripe_configuration) is kept and shown.
func TestStripesOfAOneServerFile(t *testing.T) {
	src := t.TempDir()
	mp := stripesMount(t, mount.Spec{SourceDir: src, Tracker: usage.New("instance", 1<<30), Client: "cn1"})
	p := filepath.Join(mp, "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	text, all := runStripes(t, p)
	if !strings.Contains(text, "not striped (its instance is on one storage node)\n") || len(all) != 1 || all[0].StripeSize != 0 {
		t.Errorf("nothing set: %q %+v", text, all)
	}
	if err := setxattr(p, "user.spillway.layout", "stripe_size=1048576 stripe_width=1"); err != nil {
		t.Fatal(err)
	}
	text, all = runStripes(t, p)
	if !strings.Contains(text, "stripe configuration kept: stripe_size 1048576, stripe_width 1") || len(all) != 1 || all[0].Striped || all[0].StripeSize != 1<<20 || all[0].StripeWidth != 1 {
		t.Errorf("kept: %q %+v", text, all)
	}
}

func setxattr(path, name, value string) error { return unix.Setxattr(path, name, []byte(value), 0) }
