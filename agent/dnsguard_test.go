package agent

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/nft"
)

// TestGuardDNSLinks: a redirect's guard covers the VLAN and the shim whose
// subnets hold its sources, and the shim's VLAN parent; never the trunk a
// shim sits on directly, nor a link of another subnet.
func TestGuardDNSLinks(t *testing.T) {
	c := &config.Config{
		VLANs: []config.VLAN{{Name: "enp1s0.50", Parent: "enp1s0", ID: 50}, {Name: "enp1s0.60", Parent: "enp1s0", ID: 60, Addresses: []string{"10.10.60.1/24"}}},
		Macvlans: []config.Macvlan{
			{Name: "vlan50-shim", Parent: "enp1s0.50", Addresses: []string{"10.10.50.1/24", "fd00:50::1/64"}},
			{Name: "lan-shim", Parent: "enp1s0", Addresses: []string{"192.168.2.5/24"}},
		},
	}
	p := netip.MustParsePrefix
	n := guardDNS(c, nft.Desired{DNS: []nft.DNSRedirect{
		{From: []netip.Prefix{p("10.10.50.0/25")}, To: netip.MustParseAddr("10.0.0.243")},
		{From: []netip.Prefix{p("192.168.2.0/24"), p("10.10.60.0/24")}, To: netip.MustParseAddr("10.0.0.242")},
		{From: []netip.Prefix{p("172.16.0.0/24")}, To: netip.MustParseAddr("10.0.0.242")},
	}})
	for i, want := range [][]string{{"enp1s0.50", "vlan50-shim"}, {"enp1s0.60", "lan-shim"}, nil} {
		if !slices.Equal(n.DNS[i].In, want) {
			t.Errorf("redirect %d: guard on %q, want %q", i, n.DNS[i].In, want)
		}
	}
}
