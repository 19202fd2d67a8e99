package piastub

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Port forwarding as PIA.md §4 describes it: getSignature and bindPort on
// 19999 of server_vip (and server_ip), answered only to the server's own
// tunnel peers; a bound port is DNATed from the stub's exit address to the
// peer, and dropped when not bound again within the bind TTL.

type payload struct {
	port    int
	sig     string
	expires time.Time
	server  *Server
}

type bound struct {
	peer  netip.Addr
	until time.Time
}

// pfMux is the port-forwarding API of srv.
func (srv *Server) pfMux() http.Handler {
	s := srv.stub
	m := http.NewServeMux()
	inside := func(w http.ResponseWriter, r *http.Request) bool {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		a, _ := netip.ParseAddr(host)
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, p := range srv.peers {
			if p.ip == a {
				return true
			}
		}
		http.Error(w, "Unauthorized client", http.StatusUnauthorized)
		return false
	}
	m.HandleFunc("GET /getSignature", func(w http.ResponseWriter, r *http.Request) {
		s.count("getSignature:" + srv.Spec.CN)
		if !inside(w, r) {
			return
		}
		tok := r.URL.Query().Get("token")
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.validToken(tok); !ok {
			writeJSON(w, map[string]string{"status": "ERROR", "message": "Invalid token"})
			return
		}
		port := s.freePort()
		exp := time.Now().Add(s.payloadTTL).UTC()
		raw, _ := json.Marshal(map[string]any{"token": tok, "port": port, "expires_at": exp.Format(time.RFC3339Nano)})
		pl := base64.StdEncoding.EncodeToString(raw)
		var sig [64]byte
		rand.Read(sig[:])
		p := &payload{port: port, sig: base64.StdEncoding.EncodeToString(sig[:]), expires: exp, server: srv}
		s.payloads[pl] = p
		writeJSON(w, map[string]string{"status": "OK", "payload": pl, "signature": p.sig})
	})
	m.HandleFunc("GET /bindPort", func(w http.ResponseWriter, r *http.Request) {
		s.count("bindPort:" + srv.Spec.CN)
		if !inside(w, r) {
			return
		}
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		peer, _ := netip.ParseAddr(host)
		q := r.URL.Query()
		s.mu.Lock()
		defer s.mu.Unlock()
		p, ok := s.payloads[q.Get("payload")]
		switch {
		case s.refuseBinds:
			http.Error(w, "Service Unavailable", http.StatusServiceUnavailable)
			return
		case s.bindUnauthorized > 0:
			s.bindUnauthorized--
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		case !ok || p.sig != q.Get("signature") || p.server != srv:
			w.WriteHeader(http.StatusBadRequest)
			writeJSON(w, map[string]string{"status": "ERROR", "message": "Invalid payload or signature"})
			return
		case time.Now().After(p.expires):
			w.WriteHeader(http.StatusBadRequest)
			writeJSON(w, map[string]string{"status": "ERROR", "message": "Payload expired"})
			return
		case srv.busyNext > 0:
			srv.busyNext--
			w.WriteHeader(http.StatusConflict)
			writeJSON(w, map[string]string{"status": "ERROR", "message": fmt.Sprintf("Port %d is busy. Please use another server", p.port)})
			return
		}
		if b, ok := s.bound[p.port]; !ok || b.peer != peer {
			s.forward(p.port, peer)
		}
		s.bound[p.port] = &bound{peer: peer, until: time.Now().Add(s.bindTTL)}
		writeJSON(w, map[string]string{"status": "OK", "message": "port scheduled for add"})
	})
	return m
}

// freePort picks a port no payload holds. s.mu is held.
func (s *Stub) freePort() int {
	for {
		n, _ := rand.Int(rand.Reader, big.NewInt(50000))
		port := 10000 + int(n.Int64())
		used := false
		for _, p := range s.payloads {
			used = used || p.port == port
		}
		if !used {
			return port
		}
	}
}

// forward DNATs port (TCP and UDP) from the internet side to peer. s.mu
// is held.
func (s *Stub) forward(port int, peer netip.Addr) {
	s.unforward(port)
	for _, proto := range []string{"tcp", "udp"} {
		s.NS.Exec(s.t, "nft", "add", "rule", "ip", "stubnat", "pre", "iifname", "inet0", proto, "dport", strconv.Itoa(port),
			"dnat", "to", peer.String(), "comment", fmt.Sprintf(`"pf-%d"`, port))
	}
}

// unforward removes port's DNAT. s.mu is held.
func (s *Stub) unforward(port int) {
	out := s.NS.Exec(s.t, "nft", "-a", "list", "chain", "ip", "stubnat", "pre")
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, fmt.Sprintf(`comment "pf-%d"`, port)) {
			if i := strings.LastIndex(line, "# handle "); i >= 0 {
				s.NS.Exec(s.t, "nft", "delete", "rule", "ip", "stubnat", "pre", "handle", strings.TrimSpace(line[i+len("# handle "):]))
			}
		}
	}
	delete(s.bound, port)
}

// expireBinds drops ports not bound again within the bind TTL.
func (s *Stub) expireBinds(stop <-chan struct{}) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		s.mu.Lock()
		for port, b := range s.bound {
			if time.Now().After(b.until) {
				s.unforward(port)
			}
		}
		s.mu.Unlock()
	}
}

// forgetPorts drops srv's payloads and bound ports (a restart). s.mu is
// held.
func (srv *Server) forgetPorts() {
	s := srv.stub
	for k, p := range s.payloads {
		if p.server == srv {
			delete(s.payloads, k)
			if _, ok := s.bound[p.port]; ok {
				s.unforward(p.port)
			}
		}
	}
}

// BindTTL sets how long a bound port stays without another bind
// (default 15 min, as PIA).
func (s *Stub) BindTTL(d time.Duration) {
	s.mu.Lock()
	s.bindTTL = d
	s.mu.Unlock()
}

// PayloadTTL sets how long payloads issued from now on are good for
// (default 60 days).
func (s *Stub) PayloadTTL(d time.Duration) {
	s.mu.Lock()
	s.payloadTTL = d
	s.mu.Unlock()
}

// ExpirePayloads makes every payload issued so far expired.
func (s *Stub) ExpirePayloads() {
	s.mu.Lock()
	for _, p := range s.payloads {
		p.expires = time.Now().Add(-time.Second)
	}
	s.mu.Unlock()
}

// RefuseBinds makes every bind answer 503 while on.
func (s *Stub) RefuseBinds(on bool) {
	s.mu.Lock()
	s.refuseBinds = on
	s.mu.Unlock()
}

// IssuedPorts are the ports of every payload issued, newest last is not
// promised: sorted.
func (s *Stub) IssuedPorts() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for _, p := range s.payloads {
		out = append(out, p.port)
	}
	slices.Sort(out)
	return out
}

// IssuedPayloads are every payload and signature issued (for the secret
// grep).
func (s *Stub) IssuedPayloads() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, p := range s.payloads {
		out = append(out, k, p.sig)
	}
	return out
}

// BindUnauthorized makes the next n binds answer 401.
func (s *Stub) BindUnauthorized(n int) {
	s.mu.Lock()
	s.bindUnauthorized = n
	s.mu.Unlock()
}

// BusyNext makes the server's next n binds answer 409 (the port is busy).
func (srv *Server) BusyNext(n int) {
	srv.stub.mu.Lock()
	srv.busyNext = n
	srv.stub.mu.Unlock()
}

// BoundPorts are the ports forwarded now, with the peer each goes to.
func (s *Stub) BoundPorts() map[int]netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[int]netip.Addr{}
	for p, b := range s.bound {
		out[p] = b.peer
	}
	return out
}
