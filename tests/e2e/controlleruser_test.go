package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A controller started as root with controller.user becomes that user for good, once it has
// made its socket: its state directory and accounting log are the user's, the process holds
// the user's uids. An accounting log that is a symbolic link is refused, not followed.
func TestControllerBecomesItsUser(t *testing.T) {
	requireRoot(t)
	dir, err := os.MkdirTemp("", "spillway-e2e-user-") // t.TempDir's parent is root's alone
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	conf := filepath.Join(dir, "spillway.toml")
	write := func(log string) {
		os.WriteFile(conf, []byte(`[controller]
state_dir = "`+dir+`/state"
socket = "`+dir+`/run/controller.sock"
accounting_log = "`+log+`"
user = "nobody"
`), 0o644)
	}
	write(filepath.Join(dir, "log", "accounting.log"))
	cmd := exec.Command(binary, "controller", "--config", conf)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	sock := filepath.Join(dir, "run", "controller.sock")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the controller made no socket:\n%s", out.String())
		}
	}
	if r := spillway(t, cmdOpts{env: []string{"SPILLWAY_CONFIG=" + conf}}, "dwstat", "--controller", "unix:"+sock, "pools"); r.code != 0 {
		t.Errorf("dwstat pools against it: %s", r)
	}
	status := string(must(os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/status")))
	if !strings.Contains(status, "\nUid:\t65534\t65534\t65534\t65534\n") || !strings.Contains(status, "\nCapEff:\t0000000000000000\n") {
		t.Errorf("the controller is not nobody without capabilities:\n%s", status)
	}
	for _, p := range []string{filepath.Join(dir, "state"), filepath.Join(dir, "state", "state.db"), filepath.Join(dir, "log", "accounting.log")} {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil || st.Uid != 65534 {
			t.Errorf("%s: owner %d (%v), want nobody", p, st.Uid, err)
		}
	}
	cmd.Process.Kill()
	cmd.Wait()

	evil := filepath.Join(dir, "log", "evil.log")
	os.Symlink("/etc/hostname", evil)
	write(evil)
	r := spillway(t, cmdOpts{}, "controller", "--config", conf)
	if r.code == 0 || !strings.Contains(r.stderr, "symbolic links") {
		t.Errorf("an accounting log that is a link: %s", r)
	}
	var st syscall.Stat_t
	if syscall.Stat("/etc/hostname", &st); st.Uid != 0 {
		t.Errorf("/etc/hostname now belongs to uid %d", st.Uid)
	}
}
