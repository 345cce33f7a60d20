// Package etcdtest starts a real etcd (Debian's etcd-server) for tests, as its own process on
// 127.0.0.1 ports.
package etcdtest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
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
	Endpoint string // http://127.0.0.1:port, or https:// with TLS
	// With TLS: the CA that signed the member's and the client's certificates, and the
	// client's certificate and key (the member requires one: --client-cert-auth).
	CAFile, CertFile, KeyFile string
	tls                       *tls.Config
}

// Options change the member.
type Options struct {
	MaxTxnOps int  // --max-txn-ops; 0 = etcd's default (128)
	TLS       bool // serve clients over TLS and require a client certificate
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
	s := &Server{}
	scheme := "http"
	var tlsArgs []string
	if o.TLS {
		scheme = "https"
		var err error
		if s.tls, tlsArgs, err = s.makeCerts(dir); err != nil {
			return nil, err
		}
	}
	client := scheme + "://127.0.0.1:" + strconv.Itoa(freePort(t))
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
	args = append(args, tlsArgs...)
	cmd := exec.Command(bin, args...)
	log := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	s.Endpoint = client
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: time.Second, Logger: zap.NewNop(), TLS: s.tls})
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

// EnableAuth turns on etcd's authentication with a root user and user, who may read and
// write under prefix only.
func (s *Server) EnableAuth(t testing.TB, user, password, prefix string) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: s.tls})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "root-password"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, user); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, user, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := cli.UserAdd(ctx, user, password); return err },
		func() error { _, err := cli.UserGrantRole(ctx, user, user); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("enabling etcd's authentication, step %d: %v", i+1, err)
		}
	}
}

// makeCerts writes a CA, the member's certificate (127.0.0.1) and a client certificate, and
// returns the client's TLS configuration and the member's flags.
func (s *Server) makeCerts(dir string) (*tls.Config, []string, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test etcd CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name string, block *pem.Block) (string, error) {
		path := filepath.Join(dir, name)
		return path, os.WriteFile(path, pem.EncodeToMemory(block), 0o600)
	}
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return "", "", err
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return "", "", err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return "", "", err
		}
		cert, err := write(name+".pem", &pem.Block{Type: "CERTIFICATE", Bytes: der})
		if err != nil {
			return "", "", err
		}
		keyPath, err := write(name+"-key.pem", &pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
		return cert, keyPath, err
	}
	var serverCert, serverKey string
	if s.CAFile, err = write("ca.pem", &pem.Block{Type: "CERTIFICATE", Bytes: caDER}); err != nil {
		return nil, nil, err
	}
	if serverCert, serverKey, err = leaf("server", 2, x509.ExtKeyUsageServerAuth); err != nil {
		return nil, nil, err
	}
	if s.CertFile, s.KeyFile, err = leaf("client", 3, x509.ExtKeyUsageClientAuth); err != nil {
		return nil, nil, err
	}
	pair, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}},
		[]string{"--cert-file", serverCert, "--key-file", serverKey, "--trusted-ca-file", s.CAFile, "--client-cert-auth"}, nil
}
