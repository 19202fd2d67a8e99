package piastub

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Server is one physical PIA server of the stub: a meta address (token on
// the meta ports), a WireGuard address (addKey on TCP 1337, WireGuard on
// UDP Port) and a real WireGuard device whose address is VIP.
type Server struct {
	stub   *Stub
	Spec   ServerSpec
	Region string
	index  int
	Meta   netip.Addr
	WG     netip.Addr
	VIP    netip.Addr // server_vip: 10.(10+index).0.1
	// Port is the WireGuard UDP port (server_port): the list's, 1337, as
	// at PIA. The devices of every server share the stub's namespace, so
	// each listens on a port of its own (listenPort) and WG:Port is
	// DNATed to it.
	Port       int
	listenPort int

	dev      string
	kernel   bool
	us       *wg.Userspace
	key      wgtypes.Key
	pool     *peerPool
	peers    map[string]*peer      // account -> its key on this server
	retiring map[wgtypes.Key]*peer // keys replaced, removed once the answer is through
	busyNext int                   // binds to answer 409
}

type peer struct {
	key wgtypes.Key
	ip  netip.Addr
}

// inUse reports whether a is a peer's address, current or retiring.
// s.mu is held.
func (srv *Server) inUse(a netip.Addr) bool {
	for _, p := range srv.peers {
		if p.ip == a {
			return true
		}
	}
	for _, p := range srv.retiring {
		if p.ip == a {
			return true
		}
	}
	return false
}

// leaf is the server's certificate as its spec says.
func (srv *Server) leaf() (cert tlsCert) {
	s, spec := srv.stub, srv.Spec
	switch {
	case spec.OtherCA:
		return s.stranger.leaf(spec.CN, []string{spec.CN}, nil)
	case spec.WrongCN:
		return s.root.leaf("someone-else999", []string{"someone-else999"}, nil)
	case spec.CNOnly:
		return s.root.leaf(spec.CN, nil, nil)
	}
	return s.root.leaf(spec.CN, []string{spec.CN}, nil)
}

// startWireGuard creates the server's WireGuard device in the stub's
// namespace: the kernel's where it has the module, else wireguard-go.
func (srv *Server) startWireGuard() {
	s := srv.stub
	var b [2]byte
	rand.Read(b[:])
	srv.dev = fmt.Sprintf("%s%d-%s", s.opts.DevicePrefix, srv.index, hex.EncodeToString(b[:]))
	srv.kernel = testenv.HasModule("wireguard")
	if srv.kernel {
		la := netlink.NewLinkAttrs()
		la.Name = srv.dev
		if err := s.NS.NL.LinkAdd(&netlink.Wireguard{LinkAttrs: la}); err != nil {
			s.t.Fatalf("piastub: %s: %v", srv.dev, err)
		}
	} else {
		srv.us = wg.NewUserspace(nil)
		if err := srv.us.Start(s.NS.Host, srv.dev, 1420); err != nil {
			s.t.Fatalf("piastub: %s: %v", srv.dev, err)
		}
	}
	srv.newKey(true)
	run(s.t, s.NS, "ip addr add "+srv.VIP.String()+"/16 dev "+srv.dev, "ip link set "+srv.dev+" up",
		fmt.Sprintf("nft add rule ip stubnat pre ip daddr %s udp dport %d dnat to %s:%d", srv.WG, srv.Port, srv.WG, srv.listenPort))
}

func (srv *Server) stopWireGuard() {
	if srv.us != nil {
		srv.us.Close()
	}
}

// client is a wgctrl client in the stub's namespace.
func (srv *Server) configure(cfg wgtypes.Config) error {
	return srv.stub.NS.Host.Do(func() error {
		c, err := wgctrl.New()
		if err != nil {
			return err
		}
		defer c.Close()
		return c.ConfigureDevice(srv.dev, cfg)
	})
}

// newKey gives the server a new key and drops every peer: a restart.
// The listen port is set only at the start (bind): set again, the same
// port makes wireguard-go close its sockets and bind anew, which can fail
// with EADDRINUSE while the old socket is still going, leaving a server
// with no socket at all, which is not a restart PIA has.
func (srv *Server) newKey(bind bool) {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		srv.stub.t.Fatal(err)
	}
	cfg := wgtypes.Config{PrivateKey: &k, ReplacePeers: true}
	if bind {
		port := srv.listenPort
		cfg.ListenPort = &port
	}
	if err := srv.configure(cfg); err != nil {
		srv.stub.t.Fatalf("piastub: configure %s: %v", srv.dev, err)
	}
	srv.key = k
}

// Restart is a server restart at PIA: a new server key, every peer gone.
func (srv *Server) Restart() {
	s := srv.stub
	s.mu.Lock()
	defer s.mu.Unlock()
	srv.newKey(false)
	srv.peers = map[string]*peer{}
	srv.retiring = map[wgtypes.Key]*peer{}
	srv.forgetPorts()
}

// PublicKey is the server's current WireGuard public key.
func (srv *Server) PublicKey() wgtypes.Key {
	s := srv.stub
	s.mu.Lock()
	defer s.mu.Unlock()
	return srv.key.PublicKey()
}

// Peers is how many peers the server's device has.
func (srv *Server) Peers() int {
	s := srv.stub
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(srv.peers)
}

// StopUDP makes the server's WireGuard stop answering (its UDP port is
// dropped, after the DNAT: by the device's own port); its API still
// answers.
func (srv *Server) StopUDP() {
	srv.fault("udp dport " + strconv.Itoa(srv.listenPort) + " drop")
}

// Down makes the server answer nothing at all, API included.
func (srv *Server) Down() {
	srv.StopUDP()
	srv.fault("ip daddr { " + srv.Meta.String() + ", " + srv.WG.String() + " } drop")
}

// MetaDown makes the server's meta address answer nothing (a region whose
// meta server is unreachable loses the latency race).
func (srv *Server) MetaDown() {
	srv.fault("ip daddr " + srv.Meta.String() + " drop")
}

// Up undoes StopUDP, Down and MetaDown.
func (srv *Server) Up() {
	s := srv.stub
	out := s.NS.Exec(s.t, "nft", "-a", "list", "chain", "inet", "stubfault", "in")
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, `comment "`+srv.dev+`"`) {
			if i := strings.LastIndex(line, "# handle "); i >= 0 {
				s.NS.Exec(s.t, "nft", "delete", "rule", "inet", "stubfault", "in", "handle", strings.TrimSpace(line[i+len("# handle "):]))
			}
		}
	}
}

func (srv *Server) fault(rule string) {
	s := srv.stub
	s.NS.Exec(s.t, append([]string{"nft", "add", "rule", "inet", "stubfault", "in"}, append(strings.Fields(rule), "comment", `"`+srv.dev+`"`)...)...)
}

// metaMux is a meta server: the token on both routes.
func (srv *Server) metaMux() http.Handler {
	s := srv.stub
	m := http.NewServeMux()
	m.HandleFunc("POST /api/client/v2/token", func(w http.ResponseWriter, r *http.Request) {
		s.count("http:" + srv.Spec.CN)
		s.count("token:meta:" + srv.Spec.CN)
		s.tokenV2(w, r)
	})
	m.HandleFunc("GET /authv3/generateToken", func(w http.ResponseWriter, r *http.Request) {
		s.count("http:" + srv.Spec.CN)
		s.count("generateToken:" + srv.Spec.CN)
		u, p, ok := r.BasicAuth()
		if st := s.tokenFault(w); st != 0 {
			return
		}
		if !ok || !s.account(u, p) {
			http.Error(w, `{"status":"ERROR","message":"authentication failed"}`, http.StatusUnauthorized)
			return
		}
		writeJSON(w, map[string]string{"status": "OK", "token": s.issue()})
	})
	return m
}

// wgMux is a WireGuard server's API: addKey.
func (srv *Server) wgMux() http.Handler {
	s := srv.stub
	m := http.NewServeMux()
	m.HandleFunc("GET /addKey", func(w http.ResponseWriter, r *http.Request) {
		s.count("http:" + srv.Spec.CN)
		s.count("addKey:" + srv.Spec.CN)
		q := r.URL.Query()
		status, answer, old := srv.addKey(q.Get("pt"), q.Get("pubkey"))
		body, _ := json.Marshal(answer)
		body = append(body, '\n')
		// A length, not chunks: the answer is whole once flushed, before
		// the handler returns.
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(status)
		w.Write(body)
		if old == nil {
			return
		}
		// The new key ends the account's old registration (PIA.md §3), but
		// only once the answer is through: PIA's connect script, run with
		// its tunnel up, asks through that very tunnel.
		http.NewResponseController(w).Flush()
		conn, _ := r.Context().Value(connKey{}).(net.Conn)
		s.mu.Lock()
		select {
		case <-s.stopped:
			// Stopping: the device goes with every peer on it.
			s.mu.Unlock()
			return
		default:
		}
		s.retirers.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.retirers.Done()
			srv.retire(conn, old)
		}()
	})
	return m
}

// addKey registers key (base64) for the account whose token is tok. It
// returns the HTTP status and body to answer, and the peer the new key
// replaces, if any: still on the device, to be retired.
func (srv *Server) addKey(tok, key64 string) (int, any, *peer) {
	s := srv.stub
	s.mu.Lock()
	defer s.mu.Unlock()
	_, valid := s.validToken(tok)
	if s.loginFailed > 0 {
		s.loginFailed--
		valid = false
	}
	if !valid {
		// As PIA: an HTTP 200 whose body says the login failed.
		return http.StatusOK, map[string]string{"status": "ERROR", "message": "Login failed!"}, nil
	}
	kb, err := base64.StdEncoding.DecodeString(key64)
	if err != nil || len(kb) != 32 {
		return http.StatusBadRequest, map[string]string{"status": "ERROR", "message": "Invalid pubkey"}, nil
	}
	key := wgtypes.Key(kb)
	acct := s.opts.Username
	cur := srv.peers[acct]
	if cur != nil && cur.key == key {
		// The same key again: the same registration.
		return http.StatusOK, srv.answer(cur), nil
	}
	ip, ok := srv.pool.next(srv.inUse)
	if !ok {
		return http.StatusServiceUnavailable, map[string]string{"status": "ERROR", "message": "No free address"}, nil
	}
	// The key may be one being retired, registered again: it is current
	// again, and its pending retirement is void.
	delete(srv.retiring, key)
	cfg := wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: key, ReplaceAllowedIPs: true,
		AllowedIPs: []net.IPNet{{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}}}}}
	if err := srv.configure(cfg); err != nil {
		return http.StatusInternalServerError, map[string]string{"status": "ERROR", "message": "internal"}, nil
	}
	p := &peer{key, ip}
	srv.peers[acct] = p
	if cur != nil {
		srv.retiring[cur.key] = cur
	}
	return http.StatusOK, srv.answer(p), cur
}

// answer is addKey's answer for p. s.mu is held.
func (srv *Server) answer(p *peer) map[string]any {
	return map[string]any{
		"status": "OK", "server_key": srv.key.PublicKey().String(), "server_port": srv.Port,
		"server_ip": srv.WG.String(), "server_vip": srv.VIP.String(), "peer_ip": p.ip.String(),
		"peer_pubkey": p.key.String(), "dns_servers": []string{DNSServers[0].String(), DNSServers[1].String()},
	}
}

// retire removes old from the device once its peer on c has acknowledged
// every byte written to c (the addKey answer), or after retireWait, or at
// once if c cannot tell. A key registered again meanwhile stays.
func (srv *Server) retire(c net.Conn, old *peer) {
	s := srv.stub
	deadline := time.Now().Add(retireWait)
	for time.Now().Before(deadline) {
		if n, err := unacked(c); err != nil || n == 0 {
			break
		}
		select {
		case <-s.stopped:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if srv.retiring[old.key] != old {
		return
	}
	delete(srv.retiring, old.key)
	// An error here is a device already gone (the stub stopping).
	srv.configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: old.key, Remove: true}}})
}

// retireWait bounds how long a replaced key outlives its successor's
// answer when the client does not acknowledge it.
const retireWait = 5 * time.Second

// unacked is how many bytes written to c its peer has not acknowledged
// (SIOCOUTQ: unsent and unacknowledged).
func unacked(c net.Conn) (int, error) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, fmt.Errorf("%T has no socket", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var ierr error
	if err := raw.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil {
		return 0, err
	}
	return n, ierr
}

// wwwMux is the www host: the token and the server list.
func (s *Stub) wwwMux() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("POST /api/client/v2/token", func(w http.ResponseWriter, r *http.Request) {
		s.count("token:www")
		s.tokenV2(w, r)
	})
	m.HandleFunc("GET /vpninfo/servers/v6", func(w http.ResponseWriter, r *http.Request) {
		s.count("list")
		w.Write(s.list())
	})
	return m
}

// tokenFault answers with the injected token status, if any, and
// reports it.
func (s *Stub) tokenFault(w http.ResponseWriter) int {
	s.mu.Lock()
	st, ra := s.tokenStatus, s.retryAfter
	s.mu.Unlock()
	if st == 0 {
		return 0
	}
	if ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	w.WriteHeader(st)
	if st == http.StatusTooManyRequests {
		w.Write([]byte(`{"status":"error","code":"too_many_attempts"}`))
	}
	return st
}

// tokenV2 is POST /api/client/v2/token: username and password as a
// multipart form, an urlencoded form or JSON.
func (s *Stub) tokenV2(w http.ResponseWriter, r *http.Request) {
	if s.tokenFault(w) != 0 {
		return
	}
	var u, p string
	ct := r.Header.Get("Content-Type")
	switch {
	case strings.HasPrefix(ct, "application/json"):
		var body struct{ Username, Password string }
		if json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&body) == nil {
			u, p = body.Username, body.Password
		}
	case strings.HasPrefix(ct, "multipart/form-data"):
		if r.ParseMultipartForm(4096) == nil {
			u, p = r.FormValue("username"), r.FormValue("password")
		}
	default:
		r.Body = http.MaxBytesReader(w, r.Body, 4096)
		if r.ParseForm() == nil {
			u, p = r.PostForm.Get("username"), r.PostForm.Get("password")
		}
	}
	if !s.account(u, p) {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	writeJSON(w, map[string]string{"token": s.issue()})
}

func (s *Stub) account(u, p string) bool { return u == s.opts.Username && p == s.opts.Password }

// issue makes a token good for the token TTL.
func (s *Stub) issue() string {
	var b [64]byte
	rand.Read(b[:])
	tok := hex.EncodeToString(b[:])
	s.mu.Lock()
	s.tokens[tok] = time.Now().Add(s.tokenTTL)
	s.mu.Unlock()
	return tok
}

// validToken reports whether tok was issued and has not expired. s.mu is
// held.
func (s *Stub) validToken(tok string) (time.Time, bool) {
	exp, ok := s.tokens[tok]
	return exp, ok && time.Now().Before(exp)
}

// IssuedTokens are the tokens the stub issued (for the secret grep: the
// test knows no token otherwise).
func (s *Stub) IssuedTokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for t := range s.tokens {
		out = append(out, t)
	}
	return out
}

// list is the signed server list: one line of compact JSON (over 1000
// bytes with the default regions, as PIA's scripts insist), a blank line,
// and base64 of an RSA PKCS#1 v1.5 SHA-256 signature over exactly that
// line. Its groups are PIA's, every service's ports; its regions list the
// servers the stub runs, meta and wg, and no others, so no client is sent
// to a service the stub lacks (OpenVPN, IKEv2, the proxies). Every server
// answers on every port its groups name (MetaPorts, WGPort).
func (s *Stub) list() []byte {
	type srvJ struct {
		IP string `json:"ip"`
		CN string `json:"cn"`
	}
	type regionJ struct {
		ID          string            `json:"id"`
		Name        string            `json:"name"`
		Country     string            `json:"country"`
		AutoRegion  bool              `json:"auto_region"`
		DNS         string            `json:"dns"`
		PortForward bool              `json:"port_forward"`
		Geo         bool              `json:"geo"`
		Offline     bool              `json:"offline"`
		Servers     map[string][]srvJ `json:"servers"`
	}
	var regions []regionJ
	for _, srv := range s.Servers {
		i := len(regions) - 1
		if i < 0 || regions[i].ID != srv.Region {
			var spec RegionSpec
			for _, r := range s.regions {
				if r.ID == srv.Region {
					spec = r
				}
			}
			regions = append(regions, regionJ{ID: spec.ID, Name: "Stub " + spec.ID, Country: "ZZ", AutoRegion: true,
				DNS: spec.ID + ".piastub.test", PortForward: spec.PortForward, Offline: spec.Offline, Servers: map[string][]srvJ{}})
			i++
		}
		regions[i].Servers["meta"] = append(regions[i].Servers["meta"], srvJ{srv.Meta.String(), srv.Spec.CN})
		regions[i].Servers["wg"] = append(regions[i].Servers["wg"], srvJ{srv.WG.String(), srv.Spec.CN})
	}
	line, _ := json.Marshal(map[string]any{
		"groups": map[string]any{
			"ovpntcp":    []map[string]any{{"name": "openvpn_tcp", "ports": []int{80, 443, 853, 8443}}},
			"ovpnudp":    []map[string]any{{"name": "openvpn_udp", "ports": []int{8080, 853, 123, 53}}},
			"wg":         []map[string]any{{"name": "wireguard", "ports": []int{WGPort}}},
			"ikev2":      []map[string]any{{"name": "ikev2", "ports": []int{500, 4500}}},
			"proxysocks": []map[string]any{{"name": "socks", "ports": []int{1080}}},
			"proxyss":    []map[string]any{{"name": "shadowsocks", "ports": []int{443}}},
			"meta":       []map[string]any{{"name": "meta", "ports": MetaPorts}},
		},
		"regions": regions,
	})
	sum := sha256.Sum256(line)
	sig, err := rsaSign(s.listKey, sum[:])
	if err != nil {
		s.t.Errorf("piastub: sign: %v", err)
	}
	s.mu.Lock()
	tamper := s.tamper
	s.mu.Unlock()
	if tamper {
		line = []byte(strings.Replace(string(line), `"port_forward":true`, `"port_forward":false`, 1))
		line = []byte(strings.Replace(string(line), `198.18.`, `198.19.`, 1))
	}
	return []byte(string(line) + "\n\n" + base64.StdEncoding.EncodeToString(sig) + "\n")
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
