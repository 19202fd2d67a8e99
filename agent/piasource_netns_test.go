package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// TestPIATunnelAddressStaysInTunnel: what the node itself sends from its
// PIA tunnel address (peer_ip) — echo replies, resets and ICMP errors for
// what arrives through the tunnel — leaves by the tunnel, never by the
// uplink. Before, the main table routed it out of the uplink: the WAN saw
// packets with the tunnel's address as their source. A packet sent from
// peer_ip takes the route a reply from it would.
func TestPIATunnelAddressStaysInTunnel(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	r := startPIA(t, l, pia.Timers{})
	waitHealthy(t, r, 60*time.Second)
	peer := tunnel(r).PeerIP
	l.WAN.Exec(t, "nft", "add", "table", "inet", "peerleak")
	l.WAN.Exec(t, "nft", "add", "chain", "inet", "peerleak", "pre", "{ type filter hook prerouting priority -400 ; }")
	l.WAN.Exec(t, "nft", "add", "rule", "inet", "peerleak", "pre", "ip", "saddr", peer, "counter", "comment", `"peer"`)

	if out := l.Node.Exec(t, "ip", "route", "get", piastub.Far.String(), "from", peer); !strings.Contains(out, "dev "+l.Dev) {
		t.Errorf("a packet from the tunnel address %s to the far side is routed\n%s\nwant by %s", peer, out, l.Dev)
	}
	if out := l.Node.Exec(t, "ip", "rule", "show", "priority", "1000"); !strings.Contains(out, "from "+peer+" lookup") {
		t.Errorf("no rule for the tunnel address %s:\n%s", peer, out)
	}
	if _, err := l.Node.TryExec("ping", "-c", "3", "-i", "0.2", "-W", "1", "-I", peer, piastub.Far.String()); err != nil {
		t.Errorf("the node cannot reach the far side from its tunnel address: %v", err)
	}
	if n := piastub.Count(t, l.WAN, "peerleak", "pre", "peer"); n != 0 {
		t.Errorf("the WAN saw %d packet(s) from the tunnel address %s, outside the tunnel", n, peer)
	}
}
