package pia

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// testCA is a root for the unit tests' servers.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test root"},
		NotBefore: testCertFrom, NotAfter: testCertUntil, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert, key, pool}
}

func (c *testCA) leaf(t *testing.T, cn string, sans []string, ips []net.IP) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: testCertFrom, NotAfter: testCertUntil, DNSNames: sans, IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// serve runs an HTTPS server with cert and h on loopback; the API dials it
// whatever address it asks for, as it would a PIA server by IP.
func serve(t *testing.T, cert tls.Certificate, h http.HandlerFunc) (*API, *int) {
	hits := new(int)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*hits++
		h(w, r)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are the point
	srv.StartTLS()
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	return &API{Dial: dial, ListURL: "https://127.0.0.1/list", TokenURL: "https://127.0.0.1/token"}, hits
}

func TestAddKeyChecksEveryField(t *testing.T) {
	ca := newTestCA(t)
	mine, _ := wgtypes.GeneratePrivateKey()
	other, _ := wgtypes.GeneratePrivateKey()
	srvKey, _ := wgtypes.GeneratePrivateKey()
	good := map[string]any{"status": "OK", "server_key": srvKey.PublicKey().String(), "server_port": 1337,
		"server_ip": "198.18.1.2", "server_vip": "10.10.0.1", "peer_ip": "10.10.0.3",
		"peer_pubkey": mine.PublicKey().String(), "dns_servers": []string{"10.0.0.243"}}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for a, b := range good {
			m[a] = b
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	tests := []struct {
		name   string
		status int
		body   any // a map is JSON-encoded
		want   string
	}{
		{"good", 200, good, ""},
		{"login failed with 200", 200, map[string]any{"status": "ERROR", "message": "Login failed!"}, "Login failed"},
		{"login failed with 401", 401, map[string]any{"status": "ERROR", "message": "Login failed!"}, "Login failed"},
		{"other status", 200, map[string]any{"status": "ERROR", "message": "nope"}, `status "ERROR"`},
		{"short server key", 200, with("server_key", base64.StdEncoding.EncodeToString([]byte("short"))), "server_key"},
		{"no server key", 200, with("server_key", nil), "server_key"},
		{"port 0", 200, with("server_port", 0), "server_port"},
		{"port 70000", 200, with("server_port", 70000), "server_port"},
		{"server_ip v6", 200, with("server_ip", "2001:db8::1"), "server_ip"},
		{"server_vip garbage", 200, with("server_vip", "ten.ten"), "server_vip"},
		{"peer_ip with a prefix", 200, with("peer_ip", "10.10.0.3/32"), "peer_ip"},
		{"someone else's key", 200, with("peer_pubkey", other.PublicKey().String()), "peer_pubkey"},
		{"bad dns", 200, with("dns_servers", []string{"dns.example"}), "dns_servers"},
		{"not JSON", 200, "<html>oops</html>", "not the JSON expected"},
		{"huge", 200, strings.Repeat("x", maxBody+10), "answer over"},
		{"HTTP 500, not JSON", 500, "boom", "HTTP 500"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _ := serve(t, ca.leaf(t, "amsterdam401", []string{"amsterdam401"}, nil), func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/addKey" || r.URL.Query().Get("pt") != "s3cr3t-t0ken" || r.URL.Query().Get("pubkey") != mine.PublicKey().String() {
					t.Errorf("request %s", r.URL)
				}
				w.WriteHeader(tt.status)
				if m, ok := tt.body.(map[string]any); ok {
					writeTestJSON(w, m)
				} else {
					fmt.Fprint(w, tt.body)
				}
			})
			a.Roots = ca.pool
			reg, err := a.AddKey(context.Background(), "nl", Server{IP: "198.18.1.2", CN: "amsterdam401"}, 1337, "s3cr3t-t0ken", mine.PublicKey())
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if reg.PeerIP.String() != "10.10.0.3" || reg.Endpoint().String() != "198.18.1.2:1337" || reg.ServerVIP.String() != "10.10.0.1" || reg.ServerKey != srvKey.PublicKey().String() {
					t.Errorf("registration %+v", reg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error naming %q", err, tt.want)
			}
			if tt.want == "Login failed" && !errors.Is(err, ErrLoginFailed) {
				t.Errorf("%v is not ErrLoginFailed", err)
			}
			if strings.Contains(err.Error(), "s3cr3t-t0ken") {
				t.Errorf("the error quotes the token: %v", err)
			}
		})
	}
}

func writeTestJSON(w http.ResponseWriter, m map[string]any) {
	var parts []string
	for k, v := range m {
		switch x := v.(type) {
		case string:
			parts = append(parts, fmt.Sprintf("%q:%q", k, x))
		case int:
			parts = append(parts, fmt.Sprintf("%q:%d", k, x))
		case []string:
			q := make([]string, len(x))
			for i, s := range x {
				q[i] = fmt.Sprintf("%q", s)
			}
			parts = append(parts, fmt.Sprintf("%q:[%s]", k, strings.Join(q, ",")))
		}
	}
	fmt.Fprint(w, "{"+strings.Join(parts, ",")+"}")
}

// TestPinnedCertificates: a PIA server's leaf must come from the root and
// name the cn, in a SAN or (as PIA's long did) only in its subject CN;
// nothing is sent to a server that fails.
func TestPinnedCertificates(t *testing.T) {
	ca, stranger := newTestCA(t), newTestCA(t)
	for _, tt := range []struct {
		name string
		cert tls.Certificate
		ok   bool
	}{
		{"SAN", ca.leaf(t, "amsterdam401", []string{"amsterdam401"}, nil), true},
		{"CN only", ca.leaf(t, "amsterdam401", nil, nil), true},
		{"wrong cn", ca.leaf(t, "rotterdam9", []string{"rotterdam9"}, nil), false},
		{"another CA", stranger.leaf(t, "amsterdam401", []string{"amsterdam401"}, nil), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, hits := serve(t, tt.cert, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{"token":"t"}`) })
			a.Roots = ca.pool
			_, err := a.Token(context.Background(), Creds{Username: "u", Password: "p"}, []Server{{IP: "198.18.1.1", CN: "amsterdam401"}}, 443)
			// The meta server failing, the token host is asked next; it is
			// the same test server, checked with the system's roots.
			if tt.ok != (*hits > 0) {
				t.Errorf("requests that got through: %d (err %v)", *hits, err)
			}
		})
	}
}

func TestTokenAnswers(t *testing.T) {
	ca := newTestCA(t)
	for _, tt := range []struct {
		name, retryAfter string
		status           int
		body             string
		want             string
		wait             time.Duration
		creds            bool
	}{
		{"ok", "", 200, `{"token":"abc"}`, "", 0, false},
		{"401", "", 401, ``, "credentials rejected (HTTP 401)", 0, true},
		{"402", "", 402, ``, "subscription expired (HTTP 402)", 0, true},
		{"429 with Retry-After", "7", 429, `{"status":"error","code":"too_many_attempts"}`, "too many requests (HTTP 429), retrying after 7s", 7 * time.Second, false},
		{"429 without", "", 429, ``, "retrying after 59s", 59 * time.Second, false},
		{"no token", "", 200, `{"status":"OK"}`, "no token in the answer", 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, _ := serve(t, ca.leaf(t, "www", nil, []net.IP{net.IPv4(127, 0, 0, 1)}), func(w http.ResponseWriter, r *http.Request) {
				if err := r.ParseForm(); err != nil || r.PostForm.Get("username") != "u" || r.PostForm.Get("password") != "hunter2" {
					t.Errorf("form %v %v", r.PostForm, err)
				}
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(tt.status)
				fmt.Fprint(w, tt.body)
			})
			a.WebRoots = ca.pool
			tok, err := a.Token(context.Background(), Creds{Username: "u", Password: "hunter2"}, nil, 443)
			if tt.want == "" {
				if err != nil || tok.Value() != "abc" {
					t.Fatalf("token %v, err %v", tok.Value(), err)
				}
				if fmt.Sprint(tok) != "(redacted)" {
					t.Errorf("a token prints as %q", fmt.Sprint(tok))
				}
				return
			}
			var se *StatusError
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want %q", err, tt.want)
			}
			if errors.As(err, &se) && (se.Credentials() != tt.creds || se.RetryAfter != tt.wait) {
				t.Errorf("%v: credentials %v retry after %s", err, se.Credentials(), se.RetryAfter)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Error("the error quotes the password")
			}
		})
	}
}

func TestParseList(t *testing.T) {
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	otherKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	line := []byte(`{"groups":{"wg":[{"name":"wireguard","ports":[1337]}],"meta":[{"name":"meta","ports":[443,8080]}]},"regions":[{"id":"nl_amsterdam","port_forward":true,"servers":{"wg":[{"ip":"198.18.1.2","cn":"amsterdam401"}],"meta":[{"ip":"198.18.1.1","cn":"amsterdam401"}]}},{"id":"us_east","offline":true}]}`)
	sign := func(k *rsa.PrivateKey, b []byte) string {
		sum := sha256.Sum256(b)
		sig, _ := rsa.SignPKCS1v15(rand.Reader, k, crypto.SHA256, sum[:])
		return base64.StdEncoding.EncodeToString(sig)
	}
	body := string(line) + "\n\n" + sign(key, line) + "\n"
	l, err := ParseList([]byte(body), &key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := l.Region("nl_amsterdam"); !ok || !r.PortForward || l.WGPort() != 1337 || l.MetaPort() != 443 {
		t.Errorf("parsed %+v", l)
	}
	if c := l.candidates(true); len(c) != 1 || c[0].ID != "nl_amsterdam" {
		t.Errorf("candidates %+v", c)
	}
	tampered := strings.Replace(body, "198.18.1.2", "198.18.1.9", 1)
	for name, b := range map[string]string{
		"tampered":     tampered,
		"another key":  string(line) + "\n\n" + sign(otherKey, line) + "\n",
		"no signature": string(line),
		"not base64":   string(line) + "\n\n!!!\n",
	} {
		if _, err := ParseList([]byte(b), &key.PublicKey); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The test certificates' validity: from before the rigs' fake clock (set
// in 2026) to long after the real one, so that only a test that means to
// puts a clock outside it.
var (
	testCertFrom  = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	testCertUntil = time.Now().AddDate(20, 0, 0)
)
