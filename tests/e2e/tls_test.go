package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeTestCA makes a certificate authority and a certificate for 127.0.0.1 signed by it, in
// dir, and returns the paths of the CA, the certificate and its key (PEM).
func writeTestCA(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "spillway test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	hostKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	hostTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "controller"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	caCert, _ := x509.ParseCertificate(caDER)
	hostDER, err := x509.CreateCertificate(rand.Reader, hostTmpl, caCert, &hostKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(hostKey)
	write := func(name, kind string, der []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return write("ca.pem", "CERTIFICATE", caDER, 0o644), write("host.pem", "CERTIFICATE", hostDER, 0o644),
		write("host.key", "EC PRIVATE KEY", keyDER, 0o600)
}

// TestControllerAPIOverTLS: with [tls], the controller's TCP API speaks TLS only: a command
// that trusts the cluster's CA uses it, one that does not is refused with the reason, and the
// shared token never crosses the network in clear.
func TestControllerAPIOverTLS(t *testing.T) {
	requireRoot(t)
	c := newCluster(t)
	ca, cert, key := writeTestCA(t, c.dir)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	token := filepath.Join(c.dir, "token")
	os.WriteFile(token, []byte("tls-test-token\n"), 0o600)
	c.configure("controller", fmt.Sprintf("listen = %q\ntoken_file = %q\n", addr, token))
	c.configure("agent", fmt.Sprintf("token_file = %q\n", token))
	os.WriteFile(c.config, append(must(os.ReadFile(c.config)), []byte(fmt.Sprintf("[tls]\ncert_file = %q\nkey_file = %q\nca_file = %q\n", cert, key, ca))...), 0o644)
	c.startController()
	c.startAgent()

	client := func(name, extra string) string {
		p := filepath.Join(c.dir, name)
		os.WriteFile(p, []byte(fmt.Sprintf("[client]\ncontroller = \"https://%s\"\ntoken_file = %q\nconnect_retries = 1\n%s", addr, token, extra)), 0o644)
		return p
	}
	trusting := client("trusting.toml", fmt.Sprintf("[tls]\nca_file = %q\n", ca))
	r := spillway(t, cmdOpts{env: []string{"SPILLWAY_CONFIG=" + trusting}}, "dwstat", "nodes")
	mustContain(t, r, "storage1 wlm_pool online")
	r = spillway(t, cmdOpts{env: []string{"SPILLWAY_CONFIG=" + client("untrusting.toml", "")}}, "dwstat", "nodes")
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "certificate") {
		t.Errorf("a client that does not trust the CA: %s", r)
	}
	plain := client("plain.toml", "")
	os.WriteFile(plain, []byte(strings.Replace(string(must(os.ReadFile(plain))), "https://", "http://", 1)), 0o644)
	r = spillway(t, cmdOpts{env: []string{"SPILLWAY_CONFIG=" + plain}}, "dwstat", "nodes")
	if r.code == 0 {
		t.Errorf("plain HTTP to the TLS port: %s", r)
	}
	c.assertClean()
}
