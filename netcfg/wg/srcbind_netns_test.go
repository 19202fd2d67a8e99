package wg_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
)

// natCase is one way a client behind NAT reaches the node: the address it
// dials is one the node's kernel would not pick as the source of its
// answers.
type natCase struct {
	name    string
	dialled string // the node address the client's peer endpoint names
	primary string // the address the node's kernel picks towards the router
	router  string // the router's address on the node's link
	saddr   string // nft's match for the source address: ip saddr, ip6 saddr
}

var natCases = []natCase{
	{"v4 secondary", "192.168.2.11", "192.168.2.10", "192.168.2.1", "ip saddr"},
	{"v4 other interface", "172.16.5.1", "192.168.2.10", "192.168.2.1", "ip saddr"},
	{"v6 secondary", "fd00:2::11", "fd00:2::10", "fd00:2::1", "ip6 saddr"},
	{"v6 other interface", "fd00:5::1", "fd00:2::10", "fd00:2::1", "ip6 saddr"},
}

// natLab is client -- router (masquerade) -- node, and a fourth namespace
// behind the node's second link. The node's uplink eth0 has a primary and a
// secondary address per family; eth1 has one more, routed to by the router
// through the node.
type natLab struct {
	client, router, node *testenv.NetNS
}

func newNATLab(t *testing.T) *natLab {
	t.Helper()
	n := &natLab{client: testenv.NewNetNS(t), router: testenv.NewNetNS(t), node: testenv.NewNetNS(t)}
	side := testenv.NewNetNS(t)
	n.client.Veth(t, "eth0", n.router, "eth0")
	n.router.Veth(t, "eth1", n.node, "eth0")
	n.node.Veth(t, "eth1", side, "eth0")
	run := func(ns *testenv.NetNS, cmds ...string) {
		for _, c := range cmds {
			ns.Exec(t, strings.Fields(c)...)
		}
	}
	run(n.client,
		"ip addr add 10.0.0.2/24 dev eth0",
		"ip addr add fd00:c::2/64 dev eth0 nodad",
		"ip route add default via 10.0.0.1",
		"ip -6 route add default via fd00:c::1")
	run(n.router,
		"sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1",
		"ip addr add 10.0.0.1/24 dev eth0",
		"ip addr add fd00:c::1/64 dev eth0 nodad",
		"ip addr add 192.168.2.1/24 dev eth1",
		"ip addr add fd00:2::1/64 dev eth1 nodad",
		"ip route add 172.16.5.0/24 via 192.168.2.10",
		"ip -6 route add fd00:5::/64 via fd00:2::10")
	// The IPv6 kernel answers from the address added last: the secondary
	// goes first.
	run(n.node,
		"ip addr add 192.168.2.10/24 dev eth0",
		"ip addr add 192.168.2.11/24 dev eth0",
		"ip addr add fd00:2::11/64 dev eth0 nodad",
		"ip addr add fd00:2::10/64 dev eth0 nodad",
		"ip addr add 172.16.5.1/24 dev eth1",
		"ip addr add fd00:5::1/64 dev eth1 nodad")
	return n
}

// nat makes the router masquerade what the client sends towards the node
// (conntrack then matches only answers from the address the client
// dialled), and count the node's WireGuard datagrams as they reach the
// router, by whether they come from the dialled address.
func (n *natLab) nat(t *testing.T, c natCase) {
	t.Helper()
	rules := fmt.Sprintf(`table inet natlab {
	counter from_dialled {}
	counter from_other {}
	chain pre {
		type filter hook prerouting priority raw; policy accept;
		iifname "eth1" udp sport 51820 %[1]s %[2]s counter name "from_dialled"
		iifname "eth1" udp sport 51820 %[1]s != %[2]s counter name "from_other"
	}
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "eth1" masquerade
	}
}
`, c.saddr, c.dialled)
	f := filepath.Join(t.TempDir(), "router.nft")
	if err := os.WriteFile(f, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	n.router.Exec(t, "nft", "-f", f)
}

var nftPackets = regexp.MustCompile(`packets (\d+)`)

// counted returns how many of the node's WireGuard datagrams reached the
// router from the dialled address and from any other.
func (n *natLab) counted(t *testing.T) (dialled, other int) {
	t.Helper()
	get := func(name string) int {
		out := n.router.Exec(t, "nft", "list", "counter", "inet", "natlab", name)
		m := nftPackets.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("nft counter %s:\n%s", name, out)
		}
		v, _ := strconv.Atoi(m[1])
		return v
	}
	return get("from_dialled"), get("from_other")
}

// TestAnswersFromDialledAddressBehindNAT: a client behind a masquerading
// router dials the node's WireGuard port on an address that is not the one
// the node's kernel would answer from (a secondary address on the uplink,
// an address on another link; IPv4 and IPv6). The handshake completes,
// pings pass, every datagram the node sends leaves from the dialled
// address, and the client's peer endpoint stays on it. With wireguard-go's
// default bind (UDP GRO on) the node answered from its primary address, the
// router's conntrack did not match, and no handshake completed (issue 29
// §8). The kernel implementation runs where the kernel has WireGuard (the
// VM tier) and must do the same.
func TestAnswersFromDialledAddressBehindNAT(t *testing.T) {
	for _, impl := range impls(t) {
		for _, c := range natCases {
			t.Run(impl+"/"+c.name, func(t *testing.T) {
				l := newLab(t)
				n := newNATLab(t)
				if out := n.node.Exec(t, "ip", "route", "get", c.router); !strings.Contains(out, " src "+c.primary+" ") {
					t.Fatalf("the node's kernel would not answer the router from %s, so the test proves nothing:\n%s", c.primary, out)
				}
				n.nat(t, c)

				kn, pn := l.key("node")
				kc, pc := l.key("client")
				nn, nc := devName("wgn"), devName("wgc")
				endpoint := netip.AddrPortFrom(netip.MustParseAddr(c.dialled), 51820).String()
				dn := l.desired(tunnelYAML(nn, impl, kn, 51820, "10.77.0.1/24", pc, "10.77.0.2/32", "", ""))
				dc := l.desired(tunnelYAML(nc, wg.ImplUserspace, kc, 51821, "10.77.0.2/24", pn, "10.77.0.1/32", endpoint, ""))
				l.sync(l.handle(n.node), dn, false)
				l.sync(l.handle(n.client), dc, false)

				// The first ping starts the handshake.
				deadline := time.Now().Add(20 * time.Second)
				for !handshaken(t, n.client, nc) {
					if time.Now().After(deadline) {
						dialled, other := n.counted(t)
						t.Fatalf("no handshake in 20s; the node's datagrams reached the router %d times from %s (dialled), %d times from elsewhere", dialled, c.dialled, other)
					}
					n.client.TryExec("ping", "-c", "1", "-W", "1", "10.77.0.1")
				}
				out, err := n.client.TryExec("ping", "-c", "14", "-i", "0.2", "-W", "2", "10.77.0.1")
				if err != nil || !strings.Contains(out, "14 received") {
					t.Errorf("pings across the tunnel: %v\n%s", err, out)
				}

				dialled, other := n.counted(t)
				if dialled == 0 || other != 0 {
					t.Errorf("the node's datagrams reached the router %d times from %s (dialled), %d times from elsewhere; want all from the dialled address", dialled, c.dialled, other)
				}
				if got := wgEndpoint(t, n.client, nc); got != endpoint {
					t.Errorf("client's endpoint for the node is %s; want %s, the address it dialled", got, endpoint)
				}
				// The node sees the client as the router's masquerade
				// address: the answers really crossed the NAT.
				if got, err := netip.ParseAddrPort(wgEndpoint(t, n.node, nn)); err != nil || got.Addr().String() != c.router {
					t.Errorf("node's endpoint for the client is %v (%v); want the router's %s", got, err, c.router)
				}
			})
		}
	}
}

// handshaken reports whether device name in ns has completed a handshake
// with its one peer.
func handshaken(t *testing.T, ns *testenv.NetNS, name string) bool {
	t.Helper()
	f := strings.Fields(ns.Exec(t, "wg", "show", name, "latest-handshakes"))
	return len(f) == 2 && f[1] != "0"
}

// wgEndpoint returns the endpoint of device name's one peer, as wg(8)
// shows it.
func wgEndpoint(t *testing.T, ns *testenv.NetNS, name string) string {
	t.Helper()
	out := ns.Exec(t, "wg", "show", name, "endpoints")
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("wg show %s endpoints:\n%s", name, out)
	}
	return f[1]
}
