// Package pia is the Private Internet Access provider: PIA's protocol as
// its own clients speak it (../shared/PIA.md), and the state machine that
// keeps one WireGuard tunnel registered with it. It never writes the
// kernel: the daemon's loop steps it, its network calls run off the loop
// with deadlines and hand their results back, and what it decides (the
// tunnel's peer and address) becomes desired state that the WireGuard
// subsystem converges.
package pia

import (
	"context"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/fsafe"
)

// PIA's RSA-4096 root, which signs its meta, WireGuard and port-forwarding
// servers' certificates, and the RSA-2048 key that signs its server list.
// Public data, embedded as the defaults.
var (
	//go:embed ca.rsa.4096.crt
	rootPEM []byte
	//go:embed regions-list.pub.pem
	listKeyPEM []byte
)

// DefaultRoots is a pool holding PIA's root only.
func DefaultRoots() *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(rootPEM)
	return p
}

// DefaultListKey is the key PIA signs its server list with.
func DefaultListKey() *rsa.PublicKey {
	k, err := ParseListKey(listKeyPEM)
	if err != nil {
		panic("pia: the embedded server-list key does not parse: " + err.Error())
	}
	return k
}

// ParseListKey parses an RSA public key in PEM (PKIX or PKCS#1).
func ParseListKey(b []byte) (*rsa.PublicKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM block")
	}
	if k, err := x509.ParsePKIXPublicKey(blk.Bytes); err == nil {
		if rk, ok := k.(*rsa.PublicKey); ok {
			return rk, nil
		}
		return nil, errors.New("not an RSA key")
	}
	return x509.ParsePKCS1PublicKey(blk.Bytes)
}

// pemRules are how the CA and key files a config names are read.
var pemRules = fsafe.Rules{MaxSize: 256 << 10, FollowLinks: true}

// LoadRoots reads a PEM bundle of CA certificates.
func LoadRoots(path string) (*x509.CertPool, error) {
	b, err := fsafe.ReadFile(path, pemRules)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return p, nil
}

// LoadListKey reads the server list's signing key.
func LoadListKey(path string) (*rsa.PublicKey, error) {
	b, err := fsafe.ReadFile(path, pemRules)
	if err != nil {
		return nil, err
	}
	k, err := ParseListKey(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// pinned is the TLS configuration for a PIA server: the cn is sent as SNI
// (PIA's servers choose the certificate by it), the chain must lead to
// roots and nothing else, and the leaf must name cn in a DNS SAN or, as
// PIA's leaves long did, only in its subject CN (which Go's own
// verification no longer accepts). An empty cn names no server: it is
// refused, as is a leaf's empty subject CN (which would otherwise equal
// it).
func pinned(roots *x509.CertPool, cn string, now func() time.Time) *tls.Config {
	return &tls.Config{
		ServerName:         cn,
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, // verified below, against roots only
		VerifyConnection: func(cs tls.ConnectionState) error {
			if cn == "" {
				return errors.New("no server name to check the certificate against")
			}
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no certificate")
			}
			leaf := cs.PeerCertificates[0]
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now()}); err != nil {
				return fmt.Errorf("certificate of %s: %w", cn, err)
			}
			if leaf.VerifyHostname(cn) == nil || leaf.Subject.CommonName != "" && leaf.Subject.CommonName == cn {
				return nil
			}
			return fmt.Errorf("certificate names %q (SANs %v), not %s", leaf.Subject.CommonName, leaf.DNSNames, cn)
		},
	}
}

// DialFunc opens a connection from the node's network namespace (the
// daemon may converge a namespace other than its own, as tests do).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// httpClient is an HTTPS client with the TLS rules tc that connects with
// dial, to the address at (host:port) whatever the URL says when at is
// set: PIA's servers are reached by IP, with their cn as the TLS name.
// Every call is bounded by timeout; nothing is kept alive, redirects are
// refused, and no proxy is used. With b, a request is sent only when b
// has room for it.
func httpClient(tc *tls.Config, dial DialFunc, at string, timeout time.Duration, b *budget) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:        tc,
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		DisableKeepAlives:      true,
		MaxResponseHeaderBytes: 16 << 10,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if at != "" {
				addr = at
			}
			return dial(ctx, network, addr)
		},
	}
	var rt http.RoundTripper = tr
	if b != nil {
		rt = gated{tr, b}
	}
	return &http.Client{Transport: rt, Timeout: timeout, CheckRedirect: func(*http.Request, []*http.Request) error {
		return errors.New("PIA's API does not redirect; refusing to follow")
	}}
}
