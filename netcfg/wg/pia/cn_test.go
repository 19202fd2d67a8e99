package pia

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestValidCN(t *testing.T) {
	for cn, ok := range map[string]bool{
		"amsterdam401": true, "someone-else999": true, "a.b-c.d9": true, "A1": true, strings.Repeat("a", 63): true,
		"": false, "a b": false, "x%zz": false, "a?b": false, "a/b": false, "a:1": false, "u@h": false, "a_b": false,
		"-a": false, "a-": false, "a..b": false, ".a": false, "a.": false, strings.Repeat("a", 64): false,
		strings.Repeat("a.", 127) + "a": false, "amsterdam401\n": false,
	} {
		if ValidCN(cn) != ok {
			t.Errorf("ValidCN(%q) = %v, want %v", cn, !ok, ok)
		}
	}
}

// TestListDropsBadServers (issue 29 §2): a cn from the list was used
// unchecked. A server whose cn is not a DNS host name, or whose IP is not
// a unicast IPv4 address (a name would be resolved), is dropped when the
// list is loaded, fetched or read from the cache alike; so is a region
// whose id is not a plain name.
func TestListDropsBadServers(t *testing.T) {
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	line := `{"groups":{},"regions":[{"id":"nl","servers":{` +
		`"wg":[{"ip":"198.18.1.2","cn":"amsterdam401"},{"ip":"198.18.1.3","cn":"bad cn"},{"ip":"198.18.1.4","cn":"x%zz"},{"ip":"evil.example","cn":"ok402"},{"ip":"127.0.0.1","cn":"ok403"}],` +
		`"meta":[{"ip":"198.18.1.1","cn":"amsterdam401"},{"ip":"198.18.1.5","cn":""}]}},` +
		`{"id":"a b","servers":{"wg":[{"ip":"198.18.2.2","cn":"fine404"}]}}]}`
	for name, load := range map[string]func() (*List, error){
		"parsed": func() (*List, error) { return ParseList([]byte(signListLine(key, line)), &key.PublicKey) },
		"cached": func() (*List, error) {
			s := Store{Dir: t.TempDir()}
			l, err := ParseList([]byte(signListLine(key, line)), &key.PublicKey)
			if err != nil {
				return nil, err
			}
			if err := s.SaveList("https://list.example/v6", l); err != nil {
				return nil, err
			}
			l, _, err = s.LoadList("https://list.example/v6", &key.PublicKey)
			return l, err
		},
	} {
		l, err := load()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		r, ok := l.Region("nl")
		if !ok || len(r.Servers["wg"]) != 1 || r.Servers["wg"][0].CN != "amsterdam401" || len(r.Servers["meta"]) != 1 {
			t.Errorf("%s: region nl has %+v", name, r.Servers)
		}
		if _, ok := l.Region("a b"); ok || len(l.Regions) != 1 || l.Dropped != 6 {
			t.Errorf("%s: regions %d, dropped %d; want 1 and 6", name, len(l.Regions), l.Dropped)
		}
	}
}

// TestNoSecretInErrors (issue 29 §2): a cn with a space or '%' made
// http.NewRequest fail with a url.Error quoting the whole URL (the token;
// for bindPort the payload and signature), which reached the log and
// status. No request is made to a server whose cn is not a host name, and
// no error of any request path quotes the URL: not one built from a bad
// cn, not one from a connection that fails.
func TestNoSecretInErrors(t *testing.T) {
	const token, payload, signature, password = "s3cr3t-t0ken", "cGF5bG9hZC1zZWNyZXQ=", "c2lnbmF0dXJlLXNlY3JldA==", "hunter2"
	secrets := []string{token, payload, signature, password, "list-s3cr3t"}
	check := func(t *testing.T, what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error", what)
			return
		}
		for _, s := range secrets {
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: the error quotes %q: %v", what, s, err)
			}
		}
	}
	ca := newTestCA(t)
	vip := netip.MustParseAddr("10.10.0.1")
	sig := Signature{Payload: payload, Signature: signature}
	ctx := context.Background()
	pub := [32]byte{1}
	for _, cn := range []string{"a b", "x%zz", "a?b", "a/b", ""} {
		t.Run("cn "+cn, func(t *testing.T) {
			a, hits := serve(t, ca.leaf(t, "amsterdam401", []string{"amsterdam401"}, []net.IP{net.IPv4(127, 0, 0, 1)}), func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusInternalServerError)
			})
			a.Roots, a.WebRoots = ca.pool, ca.pool
			s := Server{IP: "198.18.1.2", CN: cn}
			_, err := a.AddKey(ctx, "nl", s, 1337, token, pub)
			check(t, "addKey", err)
			_, err = a.GetSignature(ctx, a.Dial, cn, vip, token)
			check(t, "getSignature", err)
			check(t, "bindPort", a.BindPort(ctx, a.Dial, cn, vip, sig))
			// A meta server with a bad cn is skipped; the token host
			// answers (500 here).
			_, err = a.Token(ctx, Creds{Username: "u", Password: password}, []Server{s}, 443)
			check(t, "token", err)
			if *hits != 1 {
				t.Errorf("%d requests reached a server; want 1 (the token host's)", *hits)
			}
		})
	}
	// Connections that fail once made: http.Client's errors quote the URL.
	t.Run("connection closed", func(t *testing.T) {
		a, _ := serve(t, ca.leaf(t, "amsterdam401", []string{"amsterdam401"}, []net.IP{net.IPv4(127, 0, 0, 1)}), func(w http.ResponseWriter, r *http.Request) {
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
		})
		a.Roots, a.WebRoots = ca.pool, ca.pool
		a.ListURL = "https://127.0.0.1/list?k=list-s3cr3t"
		_, err := a.AddKey(ctx, "nl", testServer, 1337, token, pub)
		check(t, "addKey", err)
		_, err = a.GetSignature(ctx, a.Dial, testServer.CN, vip, token)
		check(t, "getSignature", err)
		check(t, "bindPort", a.BindPort(ctx, a.Dial, testServer.CN, vip, sig))
		_, err = a.Token(ctx, Creds{Username: "u", Password: password}, []Server{{IP: "198.18.1.1", CN: "amsterdam401"}}, 443)
		check(t, "token", err)
		_, err = a.List(ctx)
		check(t, "list", err)
	})
}

// TestSavedBadCN (issue 29 §2): the state file's cn is checked as the
// list's is: a saved registration or signature naming no host is not
// used, and the error says so without its token or payload.
func TestSavedBadCN(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	reg := goodReg(time.Now())
	reg.Server.CN = "a b"
	sig := &Signature{Payload: "cGF5bG9hZC1zZWNyZXQ=", Signature: "c2lnbmF0dXJlLXNlY3JldA==", Port: 47047, Server: "x%zz", At: time.Now()}
	if err := s.Save("wgpia0", Saved{Token: "s3cr3t-t0ken", TokenAt: time.Now(), Reg: reg, PF: &SavedPF{Sig: sig, Port: 47047}}); err != nil {
		t.Fatal(err)
	}
	v, err := s.Load("wgpia0")
	if v.Reg != nil || v.PF == nil || v.PF.Sig != nil || v.PF.Port != 47047 || v.Token.Value() != "s3cr3t-t0ken" {
		t.Errorf("loaded %+v (registration %v, port forwarding %+v)", v, v.Reg, v.PF)
	}
	if err == nil || !strings.Contains(err.Error(), "cn is not a host name") {
		t.Fatalf("error %v", err)
	}
	for _, secret := range []string{"s3cr3t-t0ken", "cGF5bG9hZC1zZWNyZXQ=", "c2lnbmF0dXJlLXNlY3JldA=="} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error quotes a secret: %v", err)
		}
	}
}

// TestPinnedRefusesEmptyCN (issue 29 §2): pinned("") accepted a leaf
// from the root whose subject CN is empty (the two empty names compared
// equal). It is refused; the same leaf is refused for a real cn too.
func TestPinnedRefusesEmptyCN(t *testing.T) {
	ca := newTestCA(t)
	empty := ca.leaf(t, "", nil, nil)
	leaf, err := x509.ParseCertificate(empty.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	cs := tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}
	if err := pinned(ca.pool, "", time.Now).VerifyConnection(cs); err == nil {
		t.Error("an empty cn was accepted against a leaf with an empty subject CN")
	}
	if err := pinned(ca.pool, "amsterdam401", time.Now).VerifyConnection(cs); err == nil {
		t.Error("a leaf naming nothing was accepted for amsterdam401")
	}
	named, _ := x509.ParseCertificate(ca.leaf(t, "amsterdam401", nil, nil).Certificate[0])
	if err := pinned(ca.pool, "amsterdam401", time.Now).VerifyConnection(tls.ConnectionState{PeerCertificates: []*x509.Certificate{named}}); err != nil {
		t.Errorf("a CN-only leaf naming the cn: %v", err)
	}
}

// TestStateCapOnWrite (issue 29 §4): the state was read back with a 64 KiB
// cap but written with none: 4,500 resolvers made a 90 KB file the next
// start could not read, losing the registration and the port. Save now
// refuses what Load could not read, leaving the file as it was; the
// largest state the provider can make (every field at its bound) is well
// under the cap and reads back.
func TestStateCapOnWrite(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	now := time.Now().UTC().Truncate(time.Second)
	big := goodReg(now)
	big.Region = strings.Repeat("r", maxRegionID)
	big.Server.CN = strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61)
	big.DNS = nil
	for i := range MaxDNSServers {
		big.DNS = append(big.DNS, netip.AddrFrom4([4]byte{10, 0, 0, byte(200 + i)}))
	}
	sig := &Signature{Payload: Secret(strings.Repeat("p", maxSigField)), Signature: Secret(strings.Repeat("s", maxSigField)), Port: 47047,
		Expires: now.Add(60 * 24 * time.Hour), Server: big.Server.CN, At: now}
	largest := Saved{Token: Secret(strings.Repeat("t", 1024)), TokenAt: now, Reg: big, PF: &SavedPF{Sig: sig, Port: 47047, Notified: 47047}}
	if err := s.Save("wgpia0", largest); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(s.Dir, "wgpia0.json"))
	t.Logf("the largest state: %d bytes (cap %d)", fi.Size(), MaxStateSize)
	v, err := s.Load("wgpia0")
	if err != nil || v.Reg == nil || len(v.Reg.DNS) != MaxDNSServers || v.PF.Sig == nil || v.Token != largest.Token {
		t.Fatalf("the largest state read back as %+v, %v", v, err)
	}
	before, _ := os.ReadFile(filepath.Join(s.Dir, "wgpia0.json"))

	huge := *big
	huge.DNS = nil
	for i := range 4500 {
		huge.DNS = append(huge.DNS, netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
	}
	err = s.Save("wgpia0", Saved{Token: "s3cr3t-t0ken", TokenAt: now, Reg: &huge})
	if err == nil || !strings.Contains(err.Error(), "not written") {
		t.Fatalf("saving 4,500 resolvers: %v, want a refusal", err)
	}
	after, _ := os.ReadFile(filepath.Join(s.Dir, "wgpia0.json"))
	if string(after) != string(before) {
		t.Error("the refused state changed the file")
	}
	if v, err := s.Load("wgpia0"); err != nil || v.Reg == nil || len(v.Reg.DNS) != MaxDNSServers {
		t.Errorf("after the refusal the state reads as %+v, %v", v, err)
	}
}
