// Package mungetest runs real munged daemons for tests: each with its own socket, key, log
// and pid files in a test's directory, killed when the test ends.
package mungetest

import (
	"crypto/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Start runs a munged named name with the key in dir (made by the first call in dir, so every
// daemon started in one dir shares the cluster's key) until the test ends, and returns its
// socket.
func Start(t testing.TB, dir, name string) string {
	t.Helper()
	if _, err := exec.LookPath("munged"); err != nil {
		t.Fatal("munged is missing: scripts/install-deps --test installs Debian's munge")
	}
	keyPath := filepath.Join(dir, "munge.key")
	if _, err := os.Stat(keyPath); err != nil {
		key := make([]byte, 1024)
		rand.Read(key)
		if err := os.WriteFile(keyPath, key, 0o400); err != nil {
			t.Fatal(err)
		}
	}
	sock := filepath.Join(dir, name+".sock")
	cmd := exec.Command("munged", "-F", "-f", "--socket="+sock, "--key-file="+keyPath,
		"--log-file="+filepath.Join(dir, name+".log"), "--pid-file="+filepath.Join(dir, name+".pid"),
		"--seed-file="+filepath.Join(dir, name+".seed"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return sock
		}
		if time.Now().After(deadline) {
			t.Fatal("munged did not open its socket within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
