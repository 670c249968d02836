package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// Certs are PEM files of a throw-away CA, a server certificate it signed (for "localhost" and
// 127.0.0.1) and a client certificate it signed, for TLS and mutual-TLS tests.
type Certs struct {
	CAFile, ServerCertFile, ServerKeyFile, ClientCertFile, ClientKeyFile string
	// OtherCAFile is a CA that signed neither certificate (a client trusting it must fail).
	OtherCAFile string
}

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// serial numbers the certificates (unique within a test binary).
var serial int64

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

// issue creates a key and a certificate from template, signed by parent (self-signed when nil),
// and writes them to certPath and keyPath.
func issue(template *x509.Certificate, parent *issuer, certPath, keyPath string) (*issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	template.SerialNumber = big.NewInt(atomic.AddInt64(&serial, 1))
	template.NotBefore = time.Now().Add(-time.Hour)
	template.NotAfter = time.Now().Add(24 * time.Hour)
	signer, signerKey := template, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, template, signer, &key.PublicKey, signerKey)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if keyPath != "" {
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, err
		}
		if err := writePEM(keyPath, "EC PRIVATE KEY", keyDER); err != nil {
			return nil, err
		}
	}
	return &issuer{cert: cert, key: key}, nil
}

// NewCerts writes a CA, a server and a client certificate into dir.
func NewCerts(dir string) (*Certs, error) {
	c := &Certs{
		CAFile:         filepath.Join(dir, "ca.pem"),
		ServerCertFile: filepath.Join(dir, "server.pem"),
		ServerKeyFile:  filepath.Join(dir, "server.key"),
		ClientCertFile: filepath.Join(dir, "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "client.key"),
		OtherCAFile:    filepath.Join(dir, "other-ca.pem"),
	}
	caTemplate := func(name string) *x509.Certificate {
		return &x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true,
			BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	}
	ca, err := issue(caTemplate("moebatch test CA"), nil, c.CAFile, "")
	if err != nil {
		return nil, err
	}
	if _, err := issue(caTemplate("another CA"), nil, c.OtherCAFile, ""); err != nil {
		return nil, err
	}
	server := &x509.Certificate{Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if _, err := issue(server, ca, c.ServerCertFile, c.ServerKeyFile); err != nil {
		return nil, err
	}
	client := &x509.Certificate{Subject: pkix.Name{CommonName: "moebatch test client"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if _, err := issue(client, ca, c.ClientCertFile, c.ClientKeyFile); err != nil {
		return nil, err
	}
	return c, nil
}

// ServerTLS is the server's TLS configuration; with requireClientCert, clients must present a
// certificate signed by the CA (mutual TLS).
func (c *Certs) ServerTLS(requireClientCert bool) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.ServerCertFile, c.ServerKeyFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if requireClientCert {
		pemData, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pemData)
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
