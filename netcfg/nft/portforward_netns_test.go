package nft_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/nft"
	"github.com/nodeagent/nodeagent/testenv"
)

// listenIn opens a TCP listener and a UDP socket on addr inside ns; each
// reports the first peer that reached it.
func listenIn(t *testing.T, ns *testenv.NetNS, addr string) (tcp, udp <-chan string) {
	t.Helper()
	tc, uc := make(chan string, 1), make(chan string, 1)
	l, err := ns.Host.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen %s in %s: %v", addr, ns.Name, err)
	}
	pc, err := ns.Host.ListenPacket("udp", addr)
	if err != nil {
		t.Fatalf("listen %s in %s: %v", addr, ns.Name, err)
	}
	t.Cleanup(func() { l.Close(); pc.Close() })
	go func() {
		if c, err := l.Accept(); err == nil {
			tc <- c.RemoteAddr().String()
			c.Close()
		}
	}()
	go func() {
		b := make([]byte, 64)
		if _, from, err := pc.ReadFrom(b); err == nil {
			uc <- from.String()
		}
	}()
	return tc, uc
}

// sendFrom opens a TCP connection and sends a UDP datagram from ns to addr.
func sendFrom(t *testing.T, ns *testenv.NetNS, addr string) {
	t.Helper()
	ns.Host.Do(func() error {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
		}
		if c, err := net.Dial("udp", addr); err == nil {
			c.Write([]byte("x"))
			c.Close()
		}
		return nil
	})
}

func got(ch <-chan string) string {
	select {
	case s := <-ch:
		return s
	case <-time.After(2 * time.Second):
		return ""
	}
}

// TestPortForwardAndDNSRedirect: a forwarded port arriving on the tunnel
// reaches the host it is forwarded to (TCP and UDP, at the configured
// port), nothing else arriving on it does, DNS from the VLAN to any
// address goes to the tunnel's resolver; a new port replaces the old one
// in one transaction, and a converged table plans nothing.
func TestPortForwardAndDNSRedirect(t *testing.T) {
	client, node, far := testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "vlan50", client, "eth0")
	node.Veth(t, "tun0", far, "eth0")
	run(t, client, "ip addr add 10.10.50.20/24 dev eth0", "ip route add default via 10.10.50.1")
	run(t, node, "ip addr add 10.10.50.1/24 dev vlan50", "ip addr add 10.99.0.1/30 dev tun0",
		"ip route add default via 10.99.0.2", "sysctl -w net.ipv4.ip_forward=1")
	run(t, far, "ip addr add 10.99.0.2/30 dev eth0", "ip route add 10.10.50.0/24 via 10.99.0.1")
	d := nft.Desired{
		PortForward: []nft.PortForward{{In: "tun0", Port: 47047, To: netip.MustParseAddr("10.10.50.20"), ToPort: 8080}},
		DNS:         []nft.DNSRedirect{{From: []netip.Prefix{netip.MustParsePrefix("10.10.50.0/24")}, To: netip.MustParseAddr("10.99.0.2")}},
	}
	p := converge(t, node, d)
	for _, want := range []string{
		`+ nft inet nodeagent chain prerouting { type nat hook prerouting priority -100; policy accept; }`,
		`+ nft inet nodeagent chain prerouting: iifname "tun0" meta l4proto tcp th dport 47047 dnat ip to 10.10.50.20:8080`,
		`+ nft inet nodeagent chain prerouting: iifname "tun0" meta l4proto udp th dport 47047 dnat ip to 10.10.50.20:8080`,
		`+ nft inet nodeagent chain prerouting: ip saddr @dns_10_99_0_2 meta l4proto udp th dport 53 dnat ip to 10.99.0.2`,
		`+ nft inet nodeagent chain forward: iifname "tun0" ip daddr 10.10.50.20 meta l4proto tcp th dport 8080 accept`,
	} {
		if !strings.Contains(p.String(), want+"\n") {
			t.Errorf("plan lacks %q:\n%s", want, p)
		}
	}
	if again := nft.MakePlan(d, observe(t, node)); !again.Empty() {
		t.Fatalf("converged, yet the plan is:\n%s", again)
	}
	// nft(8) reads the rules as nodeagent meant them.
	listed := node.Exec(t, "nft", "list", "chain", "inet", "nodeagent", "prerouting")
	for _, want := range []string{`iifname "tun0" tcp dport 47047 meta nfproto ipv4 dnat ip to 10.10.50.20:8080`, `ip saddr @dns_10_99_0_2 udp dport 53 meta nfproto ipv4 dnat ip to 10.99.0.2`} {
		if !strings.Contains(listed, want) {
			t.Errorf("nft list lacks %q:\n%s", want, listed)
		}
	}

	// The forwarded port reaches the client at 8080, TCP and UDP.
	tcp, udp := listenIn(t, client, "10.10.50.20:8080")
	sendFrom(t, far, "10.99.0.1:47047")
	if a, b := got(tcp), got(udp); !strings.HasPrefix(a, "10.99.0.2:") || !strings.HasPrefix(b, "10.99.0.2:") {
		t.Errorf("forwarded port: TCP from %q, UDP from %q; want both from the far side", a, b)
	}
	// Another port arriving on the tunnel is not forwarded.
	tcp2, udp2 := listenIn(t, client, "10.10.50.20:8081")
	sendFrom(t, far, "10.99.0.1:8081")
	sendFrom(t, far, "10.99.0.1:47048")
	if a, b := got(tcp2), got(udp2); a != "" || b != "" {
		t.Errorf("a port not forwarded reached the client: TCP %q, UDP %q", a, b)
	}
	// DNS from the client, to any address, reaches the tunnel's resolver.
	dnsT, dnsU := listenIn(t, far, "10.99.0.2:53")
	sendFrom(t, client, "192.0.2.53:53")
	if a, b := got(dnsT), got(dnsU); !strings.HasPrefix(a, "10.10.50.20:") || !strings.HasPrefix(b, "10.10.50.20:") {
		t.Errorf("DNS: TCP from %q, UDP from %q at the resolver; want both from the client", a, b)
	}

	// A new port: the old rule goes in the same transaction.
	d.PortForward[0].Port = 51000
	mon := newNftMonitor(t, node)
	p = converge(t, node, d)
	mon.Stop()
	if !strings.Contains(p.String(), "dport 47047") || !strings.Contains(p.String(), "dport 51000") {
		t.Errorf("plan of the port change:\n%s", p)
	}
	if listed := node.Exec(t, "nft", "list", "chain", "inet", "nodeagent", "prerouting"); strings.Contains(listed, "47047") || !strings.Contains(listed, "51000") {
		t.Errorf("after the change:\n%s", listed)
	}
}

// TestIPv6DNSForTheNodeDropped (issue 29 §3): a redirected source's host
// sending DNS over IPv6 to the node's own address (global or link-local)
// is not answered by the node's resolver: the input hook drops it on the
// links of the redirect (DNSRedirect.In). IPv6 DNS on another link, and
// other IPv6 traffic on this one, still reach the node.
func TestIPv6DNSForTheNodeDropped(t *testing.T) {
	client, node, other := testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "vlan50", client, "eth0")
	node.Veth(t, "lan", other, "eth0")
	run(t, client, "ip addr add 10.10.50.20/24 dev eth0", "ip -6 addr add fd00:50::20/64 dev eth0 nodad")
	run(t, node, "ip addr add 10.10.50.1/24 dev vlan50", "ip -6 addr add fd00:50::1/64 dev vlan50 nodad",
		"ip -6 addr add fd00:60::1/64 dev lan nodad")
	run(t, other, "ip -6 addr add fd00:60::20/64 dev eth0 nodad")
	d := nft.Desired{DNS: []nft.DNSRedirect{{From: []netip.Prefix{netip.MustParsePrefix("10.10.50.0/24")},
		To: netip.MustParseAddr("10.0.0.243"), In: []string{"vlan50"}}}}
	p := converge(t, node, d)
	for _, want := range []string{
		`+ nft inet nodeagent chain input { type filter hook input priority -10; policy accept; }`,
		`+ nft inet nodeagent chain input: meta nfproto ipv6 iifname @dns6_in meta l4proto udp th dport 53 drop comment "nodeagent dns guard"`,
	} {
		if !strings.Contains(p.String(), want+"\n") {
			t.Errorf("plan lacks %q:\n%s", want, p)
		}
	}
	if again := nft.MakePlan(d, observe(t, node)); !again.Empty() {
		t.Fatalf("converged, yet the plan is:\n%s", again)
	}
	dnsT, dnsU := listenIn(t, node, "[::]:53")
	sendFrom(t, client, "[fd00:50::1]:53")
	if a, b := got(dnsT), got(dnsU); a != "" || b != "" {
		t.Errorf("IPv6 DNS from the redirected VLAN reached the node: TCP from %q, UDP from %q", a, b)
	}
	// Not a blanket drop: DNS from another link, and other ports.
	sendFrom(t, other, "[fd00:60::1]:53")
	if a, b := got(dnsT), got(dnsU); !strings.HasPrefix(a, "[fd00:60::20]:") || !strings.HasPrefix(b, "[fd00:60::20]:") {
		t.Errorf("IPv6 DNS from another link: TCP from %q, UDP from %q; want both", a, b)
	}
	t8, u8 := listenIn(t, node, "[::]:8053")
	sendFrom(t, client, "[fd00:50::1]:8053")
	if a, b := got(t8), got(u8); !strings.HasPrefix(a, "[fd00:50::20]:") || !strings.HasPrefix(b, "[fd00:50::20]:") {
		t.Errorf("other IPv6 traffic from the VLAN: TCP from %q, UDP from %q; want both", a, b)
	}
}
