package pia

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/wg"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// TestAddKeyRefusesAddresses (issue 29 §2): addKey's addresses were only
// checked to be IPv4, so loopback, the unspecified address, multicast,
// the limited broadcast and link-local (the cloud metadata address) were
// all taken for peer_ip, server_vip and dns_servers. Each is refused now,
// in each field, as are more than MaxDNSServers resolvers (4,500 made a
// state file too big to read back).
func TestAddKeyRefusesAddresses(t *testing.T) {
	ca := newTestCA(t)
	mine, _ := wgtypes.GeneratePrivateKey()
	bad := map[string]string{"127.0.0.1": "loopback", "0.0.0.0": "unspecified", "224.0.0.1": "multicast",
		"255.255.255.255": "broadcast", "169.254.169.254": "link-local", "240.0.0.7": "reserved"}
	many := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("10.%d.%d.%d", i/62500, i/250%250, i%250+1)
		}
		return out
	}
	type tc struct {
		name   string
		change map[string]any
		want   string // "" accepted
	}
	var tests []tc
	for addr, why := range bad {
		tests = append(tests,
			tc{"peer_ip " + addr, map[string]any{"peer_ip": addr}, "peer_ip is not valid (" + why},
			tc{"server_vip " + addr, map[string]any{"server_vip": addr}, "server_vip is not valid (" + why},
			tc{"server_ip " + addr, map[string]any{"server_ip": addr}, "server_ip is not valid (" + why},
			tc{"dns_servers " + addr, map[string]any{"dns_servers": []string{"10.0.0.243", addr}}, "dns_servers is not valid (" + addr + ": " + why})
	}
	tests = append(tests,
		tc{"8 resolvers", map[string]any{"dns_servers": many(8)}, ""},
		tc{"9 resolvers", map[string]any{"dns_servers": many(9)}, "dns_servers lists 9 resolvers, over the 8 allowed"},
		tc{"4500 resolvers", map[string]any{"dns_servers": many(4500)}, "dns_servers lists 4500 resolvers"},
		tc{"server_vip is peer_ip", map[string]any{"server_vip": "10.10.0.3"}, "server_vip, peer_ip and server_ip are not three addresses"},
		tc{"resolver is peer_ip", map[string]any{"dns_servers": []string{"10.10.0.3"}}, "10.10.0.3 is the tunnel's own or the server's address"},
		tc{"server_ip not the listed one", map[string]any{"server_ip": "192.168.2.50"}, "server_ip 192.168.2.50 is not the listed server's 198.18.1.2"},
		tc{"good", nil, ""})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _ := serve(t, ca.leaf(t, "amsterdam401", []string{"amsterdam401"}, nil), func(w http.ResponseWriter, r *http.Request) {
				w.Write(addKeyAnswer(mine.PublicKey(), tt.change))
			})
			a.Roots = ca.pool
			reg, err := a.AddKey(context.Background(), "nl", testServer, 1337, "s3cr3t-t0ken", mine.PublicKey())
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if err := reg.check(); err != nil {
					t.Errorf("accepted, but check says %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v (registration %+v), want an error with %q", err, reg, tt.want)
			}
		})
	}
}

// TestRegistrationInNodePrefixRefused (issue 29 §2): an address inside a
// prefix the node has or its config names (the node's own VLAN address,
// 10.10.50.1 in 10.10.50.0/24) is refused in peer_ip, server_vip and
// dns_servers: the provider does not register, and says why.
func TestRegistrationInNodePrefixRefused(t *testing.T) {
	reserved := []netip.Prefix{netip.MustParsePrefix("10.10.50.0/24"), netip.MustParsePrefix("192.0.2.0/24")}
	for _, tt := range []struct {
		field string
		value any
	}{
		{"peer_ip", "10.10.50.1"},
		{"server_vip", "10.10.50.1"},
		{"dns_servers", []string{"10.0.0.243", "10.10.50.1"}},
		{"peer_ip", "192.0.2.77"},
	} {
		t.Run(fmt.Sprintf("%s %v", tt.field, tt.value), func(t *testing.T) {
			var r *rig
			r = newRig(t, rigOptions{reserved: reserved}, func(w http.ResponseWriter, req *http.Request) {
				switch req.URL.Path {
				case "/token":
					fmt.Fprint(w, `{"token":"s3cr3t-t0ken"}`)
				case "/addKey":
					w.Write(addKeyAnswer(r.key.PublicKey(), map[string]any{tt.field: tt.value}))
				}
			})
			for range 3 { // token, region, addKey: the loop's passes
				r.step(Observation{}, 5)
			}
			s := r.p.Status()
			if r.hits.count("/addKey") != 1 || r.p.Registration() != nil || !strings.Contains(s.LastError, "which the node uses") {
				t.Fatalf("addKey %d times, registration %+v, last error %q", r.hits.count("/addKey"), r.p.Registration(), s.LastError)
			}
			if d := r.p.Device(wg.Device{Name: "wgpia0"}); len(d.Addrs) != 0 || len(d.Peers) != 0 {
				t.Errorf("the device got %v and %d peers", d.Addrs, len(d.Peers))
			}
		})
	}
}

// TestSavedRegistrationInNodePrefix: a saved registration that clashes
// with the node's prefixes is not re-adopted at start; one that comes to
// clash while it runs (the config or the node took the prefix) is given
// up, the device losing its peer and address.
func TestSavedRegistrationInNodePrefix(t *testing.T) {
	reserved := []netip.Prefix{netip.MustParsePrefix("10.10.0.0/24")} // holds goodReg's peer_ip and server_vip
	clk := newFakeClock()
	r := newRig(t, rigOptions{saved: Saved{Token: "s3cr3t-t0ken", TokenAt: clk.Now(), Reg: goodReg(clk.Now().Add(-time.Hour))}, reserved: reserved},
		func(http.ResponseWriter, *http.Request) {})
	if r.p.Registration() != nil {
		t.Errorf("re-adopted a registration in %v", reserved)
	}
	r = newRig(t, rigOptions{saved: Saved{Token: "s3cr3t-t0ken", TokenAt: clk.Now(), Reg: goodReg(clk.Now().Add(-time.Hour))}},
		func(http.ResponseWriter, *http.Request) {})
	if r.p.Registration() == nil {
		t.Fatal("did not re-adopt a good saved registration")
	}
	if r.p.SetReserved([]netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}) || r.p.Registration() == nil {
		t.Fatal("gave up a registration that clashes with nothing")
	}
	if !r.p.SetReserved(reserved) || r.p.Registration() != nil {
		t.Fatal("kept a registration inside the node's prefixes")
	}
	if d := r.p.Device(wg.Device{Name: "wgpia0"}); len(d.Addrs) != 0 || len(d.Peers) != 0 {
		t.Errorf("the device kept %v and %d peers", d.Addrs, len(d.Peers))
	}
	if s := r.p.Status(); !strings.Contains(s.LastError, "lies in 10.10.0.0/24") {
		t.Errorf("last error %q", s.LastError)
	}
}

// TestDNSOnlyAfterAProbe (issue 29 §2): the DNS redirect went to the
// registration's first resolver before any probe through the tunnel had
// answered. It goes to DefaultDNS until one of them answers, then to that
// one, and stays there if a later probe finds none.
func TestDNSOnlyAfterAProbe(t *testing.T) {
	clk := newFakeClock()
	reg := goodReg(clk.Now())
	reg.DNS = []netip.Addr{netip.MustParseAddr("10.0.0.242"), netip.MustParseAddr("10.0.0.241")}
	r := newRig(t, rigOptions{saved: Saved{Token: "t", TokenAt: clk.Now(), Reg: reg}}, func(http.ResponseWriter, *http.Request) {})
	r.p.cfg.DNS = true
	if got := r.p.DNS(); got != DefaultDNS {
		t.Fatalf("before any probe answered, DNS goes to %s, want %s", got, DefaultDNS)
	}
	if got := r.p.Status().DNS; got != DefaultDNS {
		t.Errorf("status says %s", got)
	}
	if !r.p.handleDNS(dnsResult{active: netip.MustParseAddr("10.0.0.241")}) || r.p.DNS() != netip.MustParseAddr("10.0.0.241") {
		t.Errorf("after 10.0.0.241 answered: DNS %s", r.p.DNS())
	}
	if r.p.handleDNS(dnsResult{}) || r.p.DNS() != netip.MustParseAddr("10.0.0.241") {
		t.Errorf("after none answered: DNS %s", r.p.DNS())
	}
}
