// Package testca makes a certificate authority and a certificate for 127.0.0.1 signed by it,
// for the TLS tests (test support: a site brings its own CA).
package testca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Write writes ca.pem, host.pem and host.key (PEM) into dir, valid for an hour, the host's for
// 127.0.0.1 and localhost, and returns their paths.
func Write(dir string) (ca, cert, key string, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "spillway test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", "", err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", "", "", err
	}
	hostKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", err
	}
	hostTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "spillway test host"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	hostDER, err := x509.CreateCertificate(rand.Reader, hostTmpl, caCert, &hostKey.PublicKey, caKey)
	if err != nil {
		return "", "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(hostKey)
	if err != nil {
		return "", "", "", err
	}
	write := func(name, kind string, der []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err == nil {
			err = os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), mode)
		}
		return p
	}
	ca = write("ca.pem", "CERTIFICATE", caDER, 0o644)
	cert = write("host.pem", "CERTIFICATE", hostDER, 0o644)
	key = write("host.key", "EC PRIVATE KEY", keyDER, 0o600)
	return ca, cert, key, err
}
