package piastub

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// The stub as PIA's own clients see it: each test is a client in a
// namespace of its own, linked to the stub as the WAN namespace of a lab
// is, speaking the protocol of ../shared/PIA.md.

// client is a namespace linked to the stub (100.64.0.1, a route to Prefix).
func client(t *testing.T, s *Stub) *testenv.NetNS {
	t.Helper()
	c := testenv.NewNetNS(t)
	s.ConnectTo(t, c)
	return c
}

// httpsTo is an HTTPS client in ns that sends every request to dial (as
// curl --connect-to does), checking the server against roots with the
// request's host name.
func httpsTo(ns *testenv.NetNS, dial string, roots []byte) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(roots)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return ns.Host.DialContext(ctx, network, dial)
		},
		TLSClientConfig: &tls.Config{RootCAs: pool},
	}}
}

func getToken(t *testing.T, c *http.Client, u string, s *Stub) string {
	t.Helper()
	resp, err := c.PostForm(u, url.Values{"username": {s.opts.Username}, "password": {s.opts.Password}})
	if err != nil {
		t.Fatalf("token from %s: %v", u, err)
	}
	defer resp.Body.Close()
	var body struct{ Token string }
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK || body.Token == "" {
		t.Fatalf("token from %s: HTTP %d, %v, %+v", u, resp.StatusCode, err, body)
	}
	return body.Token
}

// addKeyAnswer is addKey's answer (PIA.md §3).
type addKeyAnswer struct {
	Status     string   `json:"status"`
	ServerKey  string   `json:"server_key"`
	ServerPort int      `json:"server_port"`
	ServerIP   string   `json:"server_ip"`
	ServerVIP  string   `json:"server_vip"`
	PeerIP     string   `json:"peer_ip"`
	PeerPubkey string   `json:"peer_pubkey"`
	DNSServers []string `json:"dns_servers"`
}

// addKey registers key at cn, dialled at ip:port.
func addKey(ns *testenv.NetNS, s *Stub, ip string, port int, cn, tok string, key wgtypes.Key) (addKeyAnswer, error) {
	c := httpsTo(ns, net.JoinHostPort(ip, strconv.Itoa(port)), s.root.pem)
	u := fmt.Sprintf("https://%s:%d/addKey?pt=%s&pubkey=%s", cn, port, url.QueryEscape(tok), url.QueryEscape(key.String()))
	resp, err := c.Get(u)
	if err != nil {
		return addKeyAnswer{}, err
	}
	defer resp.Body.Close()
	var a addKeyAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return a, fmt.Errorf("HTTP %d: %v", resp.StatusCode, err)
	}
	if a.Status != "OK" || a.PeerPubkey != key.String() {
		return a, fmt.Errorf("HTTP %d: %+v", resp.StatusCode, a)
	}
	return a, nil
}

func newKey(t *testing.T) wgtypes.Key {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func eventually(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tunnel is a client's userspace WireGuard device in ns (the host kernel
// has no wireguard module; the stub's own devices are userspace there too).
type tunnel struct {
	ns  *testenv.NetNS
	dev string
}

func newTunnel(t *testing.T, ns *testenv.NetNS) *tunnel {
	t.Helper()
	var b [3]byte
	rand.Read(b[:])
	tu := &tunnel{ns: ns, dev: "pstc" + hex.EncodeToString(b[:])}
	us := wg.NewUserspace(nil)
	if err := us.Start(ns.Host, tu.dev, 1420); err != nil {
		t.Fatalf("client device: %v", err)
	}
	t.Cleanup(us.Close)
	return tu
}

// connect configures the device as PIA's connect script does from an
// addKey answer: address peer_ip, the server's key at server_ip:server_port,
// allowed IPs 0.0.0.0/0, keepalive 25 s.
func (tu *tunnel) connect(t *testing.T, priv wgtypes.Key, a addKeyAnswer) {
	t.Helper()
	sk, err := wgtypes.ParseKey(a.ServerKey)
	if err != nil {
		t.Fatalf("server_key: %v", err)
	}
	ka := 25 * time.Second
	cfg := wgtypes.Config{PrivateKey: &priv, ReplacePeers: true, Peers: []wgtypes.PeerConfig{{
		PublicKey: sk, Endpoint: &net.UDPAddr{IP: net.ParseIP(a.ServerIP), Port: a.ServerPort},
		PersistentKeepaliveInterval: &ka, ReplaceAllowedIPs: true,
		AllowedIPs: []net.IPNet{{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}},
	}}}
	if err := tu.ns.Host.Do(func() error {
		c, err := wgctrl.New()
		if err != nil {
			return err
		}
		defer c.Close()
		return c.ConfigureDevice(tu.dev, cfg)
	}); err != nil {
		t.Fatalf("configure %s: %v", tu.dev, err)
	}
	tu.ns.TryExec("ip", "addr", "flush", "dev", tu.dev)
	tu.ns.Exec(t, "ip", "addr", "add", a.PeerIP+"/32", "dev", tu.dev)
	tu.ns.TryExec("ip", "route", "del", a.ServerVIP+"/32")
	tu.ns.Exec(t, "ip", "route", "add", a.ServerVIP+"/32", "dev", tu.dev)
}

// peer is the client device's one peer as wgctrl sees it.
func (tu *tunnel) peer(t *testing.T) wgtypes.Peer {
	t.Helper()
	var p wgtypes.Peer
	if err := tu.ns.Host.Do(func() error {
		c, err := wgctrl.New()
		if err != nil {
			return err
		}
		defer c.Close()
		d, err := c.Device(tu.dev)
		if err != nil {
			return err
		}
		if len(d.Peers) != 1 {
			return fmt.Errorf("%d peers", len(d.Peers))
		}
		p = d.Peers[0]
		return nil
	}); err != nil {
		t.Fatalf("%s: %v", tu.dev, err)
	}
	return p
}

// pings reports whether an echo to addr from ns comes back.
func pings(ns *testenv.NetNS, addr string) bool {
	_, err := ns.TryExec("ping", "-c", "1", "-W", "1", addr)
	return err == nil
}

// serverPeers are the public keys on srv's WireGuard device, as the device
// itself has them.
func serverPeers(t *testing.T, srv *Server) []wgtypes.Peer {
	t.Helper()
	var peers []wgtypes.Peer
	if err := srv.stub.NS.Host.Do(func() error {
		c, err := wgctrl.New()
		if err != nil {
			return err
		}
		defer c.Close()
		d, err := c.Device(srv.dev)
		if err != nil {
			return err
		}
		peers = d.Peers
		return nil
	}); err != nil {
		t.Fatalf("%s: %v", srv.dev, err)
	}
	return peers
}

func oneServer(cn string) Options {
	return Options{Regions: []RegionSpec{{ID: "stub_ams", PortForward: true, Servers: []ServerSpec{{CN: cn}}}}}
}

// PIA's connect script, run again with a tunnel up, asks addKey for a new
// key through that tunnel (wg-quick routes everything into it). The stub
// must answer before the new key ends the old registration, or the answer
// never gets back.
func TestAddKeyAnswersThroughTheOldTunnel(t *testing.T) {
	s := Start(t, oneServer("amsterdam401"))
	srv := s.Servers[0]
	c := client(t, s)
	www := httpsTo(c, WWW.String()+":443", s.web.pem)
	tok := getToken(t, www, "https://"+WWW.String()+"/api/client/v2/token", s)

	k1 := newKey(t)
	a1, err := addKey(c, s, srv.WG.String(), 1337, srv.Spec.CN, tok, k1.PublicKey())
	if err != nil {
		t.Fatalf("first addKey: %v", err)
	}
	tu := newTunnel(t, c)
	tu.connect(t, k1, a1)
	eventually(t, "the server's address inside the tunnel answering", 10*time.Second, func() bool { return pings(c, a1.ServerVIP) })

	// From now on addKey is reachable through the tunnel only: the API's
	// TCP goes into it (the tunnel's own UDP does not), and the stub
	// drops the API's TCP from anywhere but its tunnels.
	c.Exec(t, "ip", "route", "add", "default", "dev", tu.dev, "src", a1.PeerIP, "table", "100")
	c.Exec(t, "ip", "rule", "add", "to", a1.ServerIP, "ipproto", "tcp", "dport", "1337", "table", "100")
	s.NS.Exec(t, "nft", "add", "rule", "inet", "stubfault", "in", "iifname", "wan0", "tcp", "dport", "1337", "drop")

	k2 := newKey(t)
	a2, err := addKey(c, s, srv.WG.String(), 1337, srv.Spec.CN, tok, k2.PublicKey())
	if err != nil {
		t.Fatalf("addKey through the tunnel of the key it replaces got no answer: %v", err)
	}
	if a2.PeerIP == a1.PeerIP {
		t.Errorf("the new key got the old key's address %s", a2.PeerIP)
	}
	// The answer is through; now the first registration ends (PIA.md §3).
	eventually(t, "the old key removed from the server's device", 10*time.Second, func() bool {
		p := serverPeers(t, srv)
		return len(p) == 1 && p[0].PublicKey == k2.PublicKey()
	})
	if n := srv.Peers(); n != 1 {
		t.Errorf("the stub counts %d registrations of the one account, want 1", n)
	}
	// And the new key's tunnel works, as the script's wg-quick up needs.
	tu.connect(t, k2, a2)
	eventually(t, "the new key's tunnel answering", 10*time.Second, func() bool { return pings(c, a2.ServerVIP) })
}

// listJSON is the part of the server list the tests read.
type listJSON struct {
	Groups  map[string][]struct{ Ports []int } `json:"groups"`
	Regions []struct {
		ID      string                               `json:"id"`
		Servers map[string][]struct{ IP, CN string } `json:"servers"`
	} `json:"regions"`
}

// getList fetches the list through c and checks its signature.
func getList(t *testing.T, c *http.Client, u string, s *Stub) (listJSON, []byte) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	line, sig, ok := strings.Cut(string(body), "\n\n")
	if !ok || resp.StatusCode != http.StatusOK {
		t.Fatalf("list: HTTP %d, %q", resp.StatusCode, body)
	}
	blk, _ := pem.Decode(s.listKeyPEM)
	pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	rawSig, err := base64.StdEncoding.DecodeString(strings.TrimSpace(sig))
	if err != nil {
		t.Fatalf("list signature: %v", err)
	}
	sum := sha256.Sum256([]byte(line))
	if err := rsa.VerifyPKCS1v15(pub.(*rsa.PublicKey), crypto.SHA256, sum[:], rawSig); err != nil {
		t.Fatalf("list signature: %v", err)
	}
	var l listJSON
	if err := json.Unmarshal([]byte(line), &l); err != nil {
		t.Fatalf("list: %v", err)
	}
	return l, []byte(line)
}

// Every port the list advertises answers, on every server it lists, as
// PIA's clients use it: the meta ports the token, the WireGuard port
// addKey over TCP and WireGuard over UDP (server_port, which PIA's
// script makes the endpoint, is the list's port), and nothing is listed
// that the stub does not serve.
func TestListAdvertisesWhatIsServed(t *testing.T) {
	s := Start(t, Options{})
	c := client(t, s)
	www := httpsTo(c, WWW.String()+":443", s.web.pem)
	l, line := getList(t, www, "https://"+WWW.String()+"/vpninfo/servers/v6", s)
	if len(line) <= 1000 {
		t.Errorf("the list's JSON line is %d bytes; PIA's get_region.sh refuses one under 1000", len(line))
	}
	port := func(group string) []int {
		if len(l.Groups[group]) != 1 || len(l.Groups[group][0].Ports) == 0 {
			t.Fatalf("groups.%s: %+v", group, l.Groups[group])
		}
		return l.Groups[group][0].Ports
	}
	metaPorts, wgPorts := port("meta"), port("wg")
	if len(wgPorts) != 1 || wgPorts[0] != 1337 {
		t.Errorf("groups.wg ports %v, PIA's are [1337]", wgPorts)
	}
	tok := getToken(t, www, "https://"+WWW.String()+"/api/client/v2/token", s)
	servers := 0
	for _, r := range l.Regions {
		for kind := range r.Servers {
			if kind != "meta" && kind != "wg" {
				t.Errorf("region %s lists %q servers, which the stub does not serve", r.ID, kind)
			}
		}
		for _, m := range r.Servers["meta"] {
			for _, p := range metaPorts {
				mc := httpsTo(c, net.JoinHostPort(m.IP, strconv.Itoa(p)), s.root.pem)
				if _, err := mc.PostForm(fmt.Sprintf("https://%s:%d/api/client/v2/token", m.CN, p), nil); err != nil {
					t.Errorf("meta %s (%s) on port %d the list advertises: %v", m.CN, m.IP, p, err)
				}
			}
		}
		for _, w := range r.Servers["wg"] {
			servers++
			priv := newKey(t)
			a, err := addKey(c, s, w.IP, wgPorts[0], w.CN, tok, priv.PublicKey())
			if err != nil {
				t.Errorf("addKey at %s (%s) on port %d the list advertises: %v", w.CN, w.IP, wgPorts[0], err)
				continue
			}
			if a.ServerIP != w.IP || a.ServerPort != wgPorts[0] {
				t.Errorf("%s: addKey says server_ip:server_port %s:%d, the list %s:%d", w.CN, a.ServerIP, a.ServerPort, w.IP, wgPorts[0])
			}
			tu := newTunnel(t, c)
			tu.connect(t, priv, a)
			eventually(t, w.CN+"'s WireGuard at "+net.JoinHostPort(a.ServerIP, strconv.Itoa(a.ServerPort)), 10*time.Second, func() bool {
				return pings(c, a.ServerVIP)
			})
			if ep := tu.peer(t).Endpoint.String(); ep != net.JoinHostPort(a.ServerIP, strconv.Itoa(a.ServerPort)) {
				// The stub's devices are the product's userspace ones on
				// this kernel; its bind's choice of source address is the
				// product's (netcfg/wg), not the stub's.
				t.Logf("%s: dialled at %s:%d, WireGuard answered from %s", w.CN, a.ServerIP, a.ServerPort, ep)
			}
			c.Exec(t, "ip", "route", "del", a.ServerVIP+"/32")
		}
	}
	if servers != len(s.Servers) {
		t.Errorf("the list has %d WireGuard servers, the stub runs %d", servers, len(s.Servers))
	}
}

// Peer addresses are never the server's own (server_vip), nor the
// prefix's first or last, nor an address ending .0 or .255, nor the
// stub's resolvers, however many registrations come.
func TestPeerAddressesNeverCollide(t *testing.T) {
	s := Start(t, oneServer("amsterdam401"))
	srv := s.Servers[0]
	c := client(t, s)
	www := httpsTo(c, WWW.String()+":443", s.web.pem)
	tok := getToken(t, www, "https://"+WWW.String()+"/api/client/v2/token", s)
	var last wgtypes.Key
	var lastIP string
	seen := map[string]bool{}
	for i := range 600 {
		k := newKey(t).PublicKey()
		a, err := addKey(c, s, srv.WG.String(), 1337, srv.Spec.CN, tok, k)
		if err != nil {
			t.Fatalf("registration %d: %v", i+1, err)
		}
		ip, err := netip.ParseAddr(a.PeerIP)
		if err != nil {
			t.Fatalf("registration %d: peer_ip %q: %v", i+1, a.PeerIP, err)
		}
		vip := netip.MustParseAddr(a.ServerVIP)
		b := ip.As4()
		switch {
		case ip == vip:
			t.Fatalf("registration %d: peer_ip %s is server_vip", i+1, ip)
		case !netip.PrefixFrom(vip, 16).Masked().Contains(ip) || b[3] == 0 || b[3] == 255:
			t.Fatalf("registration %d: peer_ip %s is not a host address beside server_vip %s", i+1, ip, vip)
		case ip == DNSServers[0] || ip == DNSServers[1]:
			t.Fatalf("registration %d: peer_ip %s is a resolver's", i+1, ip)
		case a.PeerIP == lastIP:
			t.Fatalf("registration %d: peer_ip %s is the previous key's", i+1, ip)
		}
		seen[a.PeerIP] = true
		last, lastIP = k, a.PeerIP
	}
	if len(seen) != 600 {
		t.Errorf("600 registrations got %d distinct addresses; a /16 has room for each", len(seen))
	}
	eventually(t, "the device left with the last key alone", 10*time.Second, func() bool {
		p := serverPeers(t, srv)
		return len(p) == 1 && p[0].PublicKey == last && len(p[0].AllowedIPs) == 1 && p[0].AllowedIPs[0].String() == lastIP+"/32"
	})
}

// The www host's certificate names PIA's own host names, so a client that
// resolves them to the stub (and trusts the stub's web CA) needs no relay.
func TestWebCertificateNamesPIAHosts(t *testing.T) {
	s := Start(t, oneServer("amsterdam401"))
	c := client(t, s)
	www := httpsTo(c, WWW.String()+":443", s.web.pem)
	for _, name := range []string{"www.privateinternetaccess.com", "serverlist.piaservers.net"} {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(s.web.pem)
		err := c.Host.Do(func() error {
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", WWW.String()+":443", &tls.Config{RootCAs: pool, ServerName: name})
			if err != nil {
				return err
			}
			return conn.Close()
		})
		if err != nil {
			t.Errorf("TLS to the www host as %s: %v", name, err)
		}
	}
	// What PIA's get_token.sh and get_region.sh ask, by those names.
	if tok := getToken(t, www, "https://www.privateinternetaccess.com/api/client/v2/token", s); len(tok) < 32 {
		t.Errorf("token %q", tok)
	}
	if l, _ := getList(t, www, "https://serverlist.piaservers.net/vpninfo/servers/v6", s); len(l.Regions) != 1 {
		t.Errorf("list by name: %d regions, want 1", len(l.Regions))
	}
}
