package kubetest

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
	"time"
)

// pki is a throwaway CA with the server's certificates in dir.
type pki struct {
	dir   string
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
	caPEM []byte
}

// newPKI makes a CA, the API server's serving certificate (127.0.0.1,
// localhost) and the service-account key pair, all in dir.
func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: ca key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "nodeagent-test-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: ca: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: ca: %w", err)
	}
	p := &pki{dir: dir, ca: ca, caKey: key, caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	if err := os.WriteFile(p.file("ca.crt"), p.caPEM, 0o644); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}

	cert, certKey, err := p.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, err
	}
	if err := p.write("serving", cert, certKey); err != nil {
		return nil, err
	}

	sa, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: service account key: %w", err)
	}
	saDER, err := x509.MarshalECPrivateKey(sa)
	if err != nil {
		return nil, fmt.Errorf("pki: service account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("pki: service account key: %w", err)
	}
	if err := os.WriteFile(p.file("sa.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}), 0o600); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if err := os.WriteFile(p.file("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	return p, nil
}

func (p *pki) file(name string) string { return filepath.Join(p.dir, name) }

// clientCert returns a PEM certificate and key for user cn in groups (the
// certificate's O), as the API server's x509 authenticator reads them.
func (p *pki) clientCert(cn string, groups []string) (cert, key []byte, err error) {
	return p.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// issue signs tmpl with the CA and returns PEM certificate and key.
func (p *pki) issue(tmpl *x509.Certificate) (cert, key []byte, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: key for %s: %w", tmpl.Subject.CommonName, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, fmt.Errorf("pki: serial: %w", err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	kDER, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: key for %s: %w", tmpl.Subject.CommonName, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kDER}), nil
}

func (p *pki) write(name string, cert, key []byte) error {
	if err := os.WriteFile(p.file(name+".crt"), cert, 0o644); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if err := os.WriteFile(p.file(name+".key"), key, 0o600); err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	return nil
}
