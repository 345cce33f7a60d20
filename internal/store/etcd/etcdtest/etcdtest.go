// Package etcdtest starts a real etcd (Debian's etcd-server) for tests, as its own process on
// 127.0.0.1 ports.
package etcdtest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// RequireEnv makes a missing etcd a failure instead of a skip (scripts/test-all sets it,
// after scripts/install-deps --test installed etcd-server).
const RequireEnv = "SPILLWAY_REQUIRE_ETCD"

// Server is a running etcd.
type Server struct {
	Endpoint string // http://127.0.0.1:port
	cmd      *exec.Cmd
	log      *bytes.Buffer
}

// Options change the member's limits.
type Options struct {
	MaxTxnOps int // --max-txn-ops; 0 = etcd's default (128)
}

// Binary finds etcd, or skips the test (fails it when RequireEnv is set).
func Binary(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("etcd")
	if err != nil {
		if _, serr := os.Stat("/usr/bin/etcd"); serr == nil {
			return "/usr/bin/etcd"
		}
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("etcd is not installed and %s=1: scripts/install-deps --test installs it (Debian: apt-get install etcd-server)", RequireEnv)
		}
		t.Skipf("etcd is not installed (Debian: apt-get install etcd-server, or scripts/install-deps --test); set %s=1 to make this a failure", RequireEnv)
	}
	return path
}

// freePort asks the kernel for a port nobody listens on.
func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startAttempts is how often Start tries new ports when another process took the ones it
// picked between picking and etcd binding them.
const startAttempts = 3

// readyPolls bounds the wait for a started etcd to answer (100 ms apart).
const readyPolls = 600

// Start runs etcd with its data under a temporary directory until the test ends.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	bin := Binary(t)
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		s, err := start(t, bin, o)
		if err == nil {
			return s
		}
		lastErr = err
	}
	t.Fatal(lastErr)
	return nil
}

func start(t testing.TB, bin string, o Options) (*Server, error) {
	dir := t.TempDir()
	client := "http://127.0.0.1:" + strconv.Itoa(freePort(t))
	peer := "http://127.0.0.1:" + strconv.Itoa(freePort(t))
	args := []string{
		"--name", "test", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "test=" + peer, "--initial-cluster-state", "new",
		"--log-level", "warn",
	}
	if o.MaxTxnOps > 0 {
		args = append(args, "--max-txn-ops", strconv.Itoa(o.MaxTxnOps))
	}
	cmd := exec.Command(bin, args...)
	log := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s := &Server{Endpoint: client, cmd: cmd, log: log}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		cmd.Process.Kill()
		<-exited
		return nil, err
	}
	defer cli.Close()
	for i := 0; ; i++ {
		select {
		case <-exited:
			return nil, fmt.Errorf("etcd exited at start:\n%s", log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Get(ctx, "probe")
		cancel()
		if err == nil {
			break
		}
		if i == readyPolls {
			cmd.Process.Kill()
			<-exited
			return nil, fmt.Errorf("etcd did not answer on %s: %v\n%s", client, err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	})
	return s, nil
}

// Log is what etcd printed so far.
func (s *Server) Log() string { return s.log.String() }
