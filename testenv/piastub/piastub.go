// Package piastub is a stand-in for Private Internet Access, built from
// ../shared/PIA.md (PIA's protocol as its own clients speak it), never
// from nodeagent's client: the www token host (its own web CA), the signed
// server list, meta servers (token on 443, both routes), WireGuard servers
// answering addKey on 1337 with leaves from a test "PIA root" naming their
// cn, and behind each of those a real WireGuard peer (the kernel's where
// it has WireGuard, else wireguard-go) that routes to an "internet"
// namespace with masquerade. Faults can be injected: a server restart, a
// server that stops answering, token expiry, 401/402/429, addKey "Login
// failed", a tampered list, a slow API.
package piastub

import (
	"context"
	"crypto/rsa"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Layout of the stub's addresses. The node reaches them through the WAN
// namespace, which routes Prefix to the stub.
var (
	// Prefix holds every address the stub answers on.
	Prefix = netip.MustParsePrefix("198.18.0.0/15")
	// WWW is the token and list host.
	WWW = netip.MustParseAddr("198.18.0.10")
	// Exit is the stub's address towards the internet: what the far side
	// sees of a tunnelled packet.
	Exit = netip.MustParseAddr("203.0.113.1")
	// Far is the host in the internet namespace.
	Far = netip.MustParseAddr("203.0.113.10")
	// MetaPorts are the ports every meta server answers on, as the list's
	// groups.meta says (PIA.md §2).
	MetaPorts = []int{443, 8080}
	// WebNames are the names the www host's certificate carries: PIA's
	// token and list hosts, which PIA's clients (its scripts among them)
	// reach it by, and the stub's own.
	WebNames = []string{"www.privateinternetaccess.com", "serverlist.piaservers.net", "www.piastub.test"}
)

// WGPort is the port of every WireGuard server, the list's groups.wg and
// addKey's server_port: addKey on TCP, WireGuard on UDP (PIA.md §2, §3).
const WGPort = 1337

// listenBase is the first of the ports the servers' WireGuard devices
// listen on inside the stub's namespace (one each; WGPort is DNATed).
const listenBase = 41337

// RegionSpec is one region of the list.
type RegionSpec struct {
	ID          string
	PortForward bool
	Offline     bool
	Servers     []ServerSpec
}

// ServerSpec is one physical server of a region (a meta and a WireGuard
// address, one cn).
type ServerSpec struct {
	CN string
	// CNOnly gives the server a leaf naming its cn in the subject CN only
	// (no SAN), as PIA's long were.
	CNOnly bool
	// WrongCN gives it a leaf (from the PIA root) naming another host.
	WrongCN bool
	// OtherCA gives it a leaf naming its cn signed by a CA that is not
	// the PIA root.
	OtherCA bool
}

// Options configure a stub.
type Options struct {
	Regions []RegionSpec
	// Username and Password are the one account (default p1234567,
	// hunter2-stub).
	Username, Password string
	// DevicePrefix starts the names of the servers' WireGuard devices
	// (default psrv); userspace devices' sockets are global.
	DevicePrefix string
}

// DefaultRegions: two port-forwarding servers in stub_ams, one server in
// stub_nyc (no port forwarding), and an offline region.
func DefaultRegions() []RegionSpec {
	return []RegionSpec{
		{ID: "stub_ams", PortForward: true, Servers: []ServerSpec{{CN: "amsterdam401"}, {CN: "amsterdam402"}}},
		{ID: "stub_nyc", Servers: []ServerSpec{{CN: "newyork403"}}},
		{ID: "stub_gone", Offline: true, Servers: []ServerSpec{{CN: "gone404"}}},
	}
}

// Stub is a running PIA stand-in.
type Stub struct {
	t    testing.TB
	NS   *testenv.NetNS // the stub's own namespace
	Inet *testenv.NetNS // the "internet": Far lives there
	opts Options

	root, web, stranger *ca
	listKey             *rsa.PrivateKey
	listKeyPEM          []byte
	Servers             []*Server
	regions             []RegionSpec

	mu sync.Mutex
	// from counts requests by client address and path (From).
	from     map[string]map[string]int
	counts   map[string]int
	times    map[string][]time.Time
	tokens   map[string]time.Time // token -> expiry
	tokenTTL time.Duration
	// faults
	tokenStatus int
	retryAfter  string
	loginFailed int
	tamper      bool
	slow        time.Duration
	servers     []*http.Server
	// retirers are replaced keys waiting for their successor's answer to
	// get through; added to under mu, and only before stopped is closed.
	retirers sync.WaitGroup
	// port forwarding
	payloads         map[string]*payload
	bound            map[int]*bound
	bindTTL          time.Duration
	payloadTTL       time.Duration
	bindUnauthorized int
	refuseBinds      bool
	stopped          chan struct{}
}

// Start builds the stub's namespaces, servers and WireGuard peers. It is
// torn down when the test ends.
func Start(t testing.TB, o Options) *Stub {
	t.Helper()
	if len(o.Regions) == 0 {
		o.Regions = DefaultRegions()
	}
	if o.DevicePrefix == "" {
		o.DevicePrefix = "psrv"
	}
	if o.Username == "" {
		o.Username, o.Password = "p1234567", "hunter2-stub"
	}
	s := &Stub{t: t, opts: o, NS: testenv.NewNetNS(t), Inet: testenv.NewNetNS(t),
		root: newCA("stub PIA root"), web: newCA("stub web CA"), stranger: newCA("a stranger CA"),
		counts: map[string]int{}, times: map[string][]time.Time{}, tokens: map[string]time.Time{}, tokenTTL: 24 * time.Hour, regions: o.Regions,
		payloads: map[string]*payload{}, bound: map[int]*bound{}, bindTTL: 15 * time.Minute, payloadTTL: 60 * 24 * time.Hour,
		stopped: make(chan struct{})}
	s.listKey, s.listKeyPEM = newListKey()
	t.Cleanup(s.stop)

	s.NS.Veth(t, "inet0", s.Inet, "eth0")
	run(t, s.NS, "ip addr add "+Exit.String()+"/24 dev inet0",
		"nft add table ip stubnat",
		"nft add chain ip stubnat post { type nat hook postrouting priority 100 ; }",
		"nft add rule ip stubnat post oifname inet0 ip saddr 10.0.0.0/8 masquerade",
		"nft add chain ip stubnat pre { type nat hook prerouting priority -100 ; }",
		"nft add table inet stubfault",
		"nft add chain inet stubfault in { type filter hook input priority -10 ; }",
		"ip addr add "+WWW.String()+"/32 dev lo")
	run(t, s.Inet, "ip addr add "+Far.String()+"/24 dev eth0")
	Sysctl(t, s.NS, "net/ipv4/ip_forward", "1")

	s.serve(WWW, 443, s.webTLS(), s.wwwMux())
	k := 0
	for ri, r := range o.Regions {
		for si, spec := range r.Servers {
			if ri > 250 || si > 126 || k > 240 {
				t.Fatalf("piastub: too many regions or servers for its address plan (region %d, server %d)", ri, si)
			}
			srv := &Server{stub: s, Spec: spec, Region: r.ID, index: k,
				Meta: netip.AddrFrom4([4]byte{198, 18, byte(ri + 1), byte(2*si + 1)}),
				WG:   netip.AddrFrom4([4]byte{198, 18, byte(ri + 1), byte(2*si + 2)}),
				VIP:  netip.AddrFrom4([4]byte{10, byte(10 + k), 0, 1}),
				Port: WGPort, listenPort: listenBase + k, peers: map[string]*peer{}, retiring: map[wgtypes.Key]*peer{}}
			srv.pool = newPeerPool(netip.PrefixFrom(srv.VIP, 16), srv.VIP, func(a netip.Addr) bool { return slices.Contains(DNSServers, a) })
			run(t, s.NS, "ip addr add "+srv.Meta.String()+"/32 dev lo", "ip addr add "+srv.WG.String()+"/32 dev lo")
			srv.startWireGuard()
			cert := srv.leaf()
			for _, p := range MetaPorts {
				s.serve(srv.Meta, p, s.serverTLS(srv, cert), srv.metaMux())
			}
			s.serve(srv.WG, WGPort, s.serverTLS(srv, cert), srv.wgMux())
			s.serve(srv.VIP, 19999, s.serverTLS(srv, cert), srv.pfMux())
			s.serve(srv.WG, 19999, s.serverTLS(srv, cert), srv.pfMux())
			s.Servers = append(s.Servers, srv)
			k++
		}
	}
	s.startDNS()
	go s.expireBinds(s.stopped)
	return s
}

func run(t testing.TB, ns *testenv.NetNS, lines ...string) {
	t.Helper()
	for _, l := range lines {
		ns.Exec(t, strings.Fields(l)...)
	}
}

// Sysctl writes /proc/sys/key in ns (busybox's sysctl in the VM may lack
// the flags a script would use).
func Sysctl(t testing.TB, ns *testenv.NetNS, key, value string) {
	t.Helper()
	err := ns.Host.Do(func() error { return os.WriteFile("/proc/sys/"+key, []byte(value), 0o644) })
	if err != nil {
		t.Fatalf("sysctl %s in %s: %v", key, ns.Name, err)
	}
}

// serve runs an HTTPS server on addr:port inside the stub's namespace.
func (s *Stub) serve(addr netip.Addr, port int, tc *tls.Config, h http.Handler) {
	l, err := s.NS.Host.Listen("tcp", netip.AddrPortFrom(addr, uint16(port)).String())
	if err != nil {
		s.t.Fatalf("piastub: listen %s:%d: %v", addr, port, err)
	}
	hs := &http.Server{Handler: s.slowly(h), TLSConfig: tc, ReadHeaderTimeout: 10 * time.Second,
		// Refused handshakes are what the bad-certificate tests provoke.
		ErrorLog: log.New(io.Discard, "", 0),
		// addKey watches its answer get through on the connection.
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) }}
	s.mu.Lock()
	s.servers = append(s.servers, hs)
	s.mu.Unlock()
	go hs.Serve(tls.NewListener(l, tc))
}

func (s *Stub) stop() {
	close(s.stopped)
	s.mu.Lock()
	servers := s.servers
	s.servers = nil
	s.mu.Unlock()
	for _, hs := range servers {
		hs.Close()
	}
	s.retirers.Wait()
	for _, srv := range s.Servers {
		srv.stopWireGuard()
	}
}

// slowly delays every answer by the Slow fault. It also counts every
// request by the client's address and path (From).
func (s *Stub) slowly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		s.mu.Lock()
		d := s.slow
		if s.from == nil {
			s.from = map[string]map[string]int{}
		}
		if s.from[host] == nil {
			s.from[host] = map[string]int{}
		}
		s.from[host][r.URL.Path]++
		s.mu.Unlock()
		if d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// connKey is the request context's key of its connection.
type connKey struct{}

// webTLS is the www host's: a leaf of the stub's web CA naming WebNames
// and WWW, so that a client resolving PIA's host names to WWW and
// trusting that CA reaches it as it would PIA.
func (s *Stub) webTLS() *tls.Config {
	cert := s.web.leaf(WebNames[0], WebNames, []net.IP{WWW.AsSlice()})
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// serverTLS serves cert and counts handshakes by the SNI the client sent.
func (s *Stub) serverTLS(srv *Server, cert tls.Certificate) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) {
		s.count("tls:" + srv.Spec.CN)
		if hi.ServerName != "" && hi.ServerName != srv.Spec.CN {
			s.count("tls-wrong-sni:" + srv.Spec.CN)
		}
		return &cert, nil
	}}
}

func (s *Stub) count(k string) {
	s.mu.Lock()
	s.counts[k]++
	s.times[k] = append(s.times[k], time.Now())
	s.mu.Unlock()
}

// Times is when each request of kind k (as Count names them) came.
func (s *Stub) Times(k string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.times[k]...)
}

// TokenTimes is when every token request came, at any host, in order.
func (s *Stub) TokenTimes() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Time
	for k, ts := range s.times {
		if strings.HasPrefix(k, "token:") || strings.HasPrefix(k, "generateToken:") {
			out = append(out, ts...)
		}
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// Count is how many requests of kind k the stub has had: "token:www",
// "token:meta:CN", "generateToken:CN", "list", "addKey:CN", "tls:CN" (TLS
// handshakes), "http:CN" (requests that got past TLS at that server).
func (s *Stub) Count(k string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[k]
}

// From is the requests that came from the client address addr (a
// node's uplink, or its tunnel address for port forwarding), by path:
// "/gtoken/generateToken", "/vpninfo/servers/v6", "/addKey", ...
func (s *Stub) From(addr string) map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for k, v := range s.from[addr] {
		out[k] = v
	}
	return out
}

// Counts is every count.
func (s *Stub) Counts() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.counts))
	for k, v := range s.counts {
		out[k] = v
	}
	return out
}

// AddKeys counts addKey requests at every server.
func (s *Stub) AddKeys() int {
	n := 0
	for _, srv := range s.Servers {
		n += s.Count("addKey:" + srv.Spec.CN)
	}
	return n
}

// Tokens counts token requests at every host.
func (s *Stub) Tokens() int {
	n := s.Count("token:www")
	for _, srv := range s.Servers {
		n += s.Count("token:meta:"+srv.Spec.CN) + s.Count("generateToken:"+srv.Spec.CN)
	}
	return n
}

// TokenStatus makes every token endpoint answer status (0: normal), with
// Retry-After retryAfter for a 429 ("" sends none).
func (s *Stub) TokenStatus(status int, retryAfter string) {
	s.mu.Lock()
	s.tokenStatus, s.retryAfter = status, retryAfter
	s.mu.Unlock()
}

// TokenTTL sets how long tokens issued from now on are good for.
func (s *Stub) TokenTTL(d time.Duration) {
	s.mu.Lock()
	s.tokenTTL = d
	s.mu.Unlock()
}

// ExpireTokens makes every token issued so far invalid.
func (s *Stub) ExpireTokens() {
	s.mu.Lock()
	s.tokens = map[string]time.Time{}
	s.mu.Unlock()
}

// LoginFailed makes the next n addKey requests answer "Login failed!"
// whatever their token.
func (s *Stub) LoginFailed(n int) {
	s.mu.Lock()
	s.loginFailed = n
	s.mu.Unlock()
}

// TamperList serves the list with its JSON changed after signing.
func (s *Stub) TamperList(on bool) {
	s.mu.Lock()
	s.tamper = on
	s.mu.Unlock()
}

// Slow delays every answer of every host by d.
func (s *Stub) Slow(d time.Duration) {
	s.mu.Lock()
	s.slow = d
	s.mu.Unlock()
}

// Files are what a node's config names to trust the stub.
type Files struct {
	CAFile            string // the stub's "PIA root"
	WebCAFile         string // the stub's web CA
	ServerListKeyFile string
	TokenURL          string
	ServerList        string
}

// WriteFiles writes the stub's public PEMs into dir.
func (s *Stub) WriteFiles(dir string) Files {
	f := Files{
		CAFile: filepath.Join(dir, "stub-pia-root.crt"), WebCAFile: filepath.Join(dir, "stub-web-ca.crt"),
		ServerListKeyFile: filepath.Join(dir, "stub-list.pub.pem"),
		TokenURL:          "https://" + WWW.String() + "/api/client/v2/token",
		ServerList:        "https://" + WWW.String() + "/vpninfo/servers/v6",
	}
	for p, b := range map[string][]byte{f.CAFile: s.root.pem, f.WebCAFile: s.web.pem, f.ServerListKeyFile: s.listKeyPEM} {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			s.t.Fatal(err)
		}
	}
	return f
}

// Creds writes the stub's account as a credentials file (0600) at path.
func (s *Stub) Creds(path string) {
	if err := os.WriteFile(path, []byte(s.opts.Username+"\n"+s.opts.Password+"\n"), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

// ConnectTo links the stub to the WAN namespace wan: a veth with
// 100.64.0.1/30 on wan's side, routes both ways (wan reaches Prefix by
// the stub; the stub's default is wan).
func (s *Stub) ConnectTo(t testing.TB, wan *testenv.NetNS) {
	t.Helper()
	wan.Veth(t, "tostub", s.NS, "wan0")
	run(t, wan, "ip addr add 100.64.0.1/30 dev tostub", "ip route add "+Prefix.String()+" via 100.64.0.2")
	run(t, s.NS, "ip addr add 100.64.0.2/30 dev wan0", "ip route add default via 100.64.0.1")
}

func (s *Stub) String() string { return fmt.Sprintf("piastub in %s", s.NS.Name) }
