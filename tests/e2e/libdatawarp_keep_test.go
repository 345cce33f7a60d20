package e2e

import (
	"bufio"
	"context"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-hpc/spillway/internal/lifecycle"
)

// libdatawarp keeps its connection to the controller for the next call (over TCP with the
// identity of the connection's first MUNGE credential; on the Unix socket too), and stays
// right (testdata/libdatawarp/dwkeep.c, which tells the connections apart by their socket
// inodes): two calls in a row share one connection; 8 threads calling at once are all answered
// right, and one connection is kept after; a forked child's calls go on a connection of its
// own (the parent's is closed in it), and the parent's stays good; a process started as root
// keeps nothing of root's, and after seteuid is identified as its new user on its next call
// (uid 4242 is refused nobody's mount); a controller restarted between two stage-outs, and an
// idle timeout (controller.idle_timeout = 1s) between two, cost nothing: the next stage-out is
// made, once, on a new connection.
func TestLibdatawarpKeepsItsConnection(t *testing.T) {
	requireRoot(t)
	buildLibdatawarp(t)
	c := newCluster(t)
	addr, _, userConfig := c.startOverTCPWithMunge(t)
	_, port, _ := net.SplitHostPort(addr)
	tcp, unix := "tcp:"+port, "unix:"+filepath.Join(c.dir, "controller.sock")

	ctx := context.Background()
	job := "keepjob1"
	mount, out := c.nobodysStripedJob(t, job)

	// dwkeep runs a mode of dwkeep as nobody (as root for setuid); between calls, pause (if
	// not nil) runs once dwkeep says "paused".
	dwkeep := func(config, peer, mode string, pause func()) string {
		t.Helper()
		cx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(cx, libdw.dwkeep, peer, mode, out)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/", "SPILLWAY_CONFIG=" + config, "SPILLWAY_BIN=/nonexistent/spillway",
			"DW_JOB_STRIPED=" + mount, "SPILLWAY_DATAWARP_DEBUG=1"}
		cmd.Dir = "/"
		if mode != "setuid" {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID}}
		}
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var got strings.Builder
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			got.WriteString(sc.Text() + "\n")
			if sc.Text() == "paused" && pause != nil {
				pause()
				io.WriteString(stdin, "go on\n")
			}
		}
		err := cmd.Wait()
		r := got.String() + stderr.String()
		if err != nil || !strings.Contains(r, "failures 0") {
			t.Errorf("dwkeep %s %s: %v\n%s", peer, mode, err, r)
		}
		return r
	}
	for _, mode := range []string{"seq", "threads", "fork", "setuid"} {
		dwkeep(userConfig, tcp, mode, nil)
		dwkeep(c.config, unix, mode, nil)
	}
	// The controller restarted between two calls (its end of the kept connection closed):
	// seen before the request is sent.
	r := dwkeep(userConfig, tcp, "pause", func() { c.stopController(); c.startController() })
	if !strings.Contains(r, "closed the kept connection") {
		t.Errorf("the restart was not seen on the kept connection:\n%s", r)
	}
	dwkeep(c.config, unix, "pause", func() { c.stopController(); c.startController() })
	// The controller's idle timeout between two calls.
	c.stopController()
	c.configure("controller", "idle_timeout = \"1s\"\n")
	c.startController()
	dwkeep(userConfig, tcp, "pause", func() { time.Sleep(1500 * time.Millisecond) })
	dwkeep(c.config, unix, "pause", func() { time.Sleep(1500 * time.Millisecond) })

	c.step(job, lifecycle.PhasePostRun, func() error { return c.client.PostRun(ctx, job) })
	c.step(job, lifecycle.PhaseTeardown, func() error { return c.client.Teardown(ctx, job, true) })
}
