package agent

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
	"github.com/nodeagent/nodeagent/testenv/piastub"
)

// TestPIAReservedPrefixes: what the provider may not take from PIA is
// filled from the node's addresses (its uplink's, its VLAN's, loopback),
// leaving out the tunnel's own address, and from the config
// (TestReservedPrefixesFromConfig has the whole list); a running tunnel
// keeps its registration through a reload that reads them again.
func TestPIAReservedPrefixes(t *testing.T) {
	l := piastub.NewLab(t, piastub.Options{}, "stub_ams")
	r := startPIA(t, l, fastPIA)
	waitHealthy(t, r, 60*time.Second)
	tu := tunnel(r)
	c, err := config.Load(l.Config)
	if err != nil {
		t.Fatal(err)
	}
	setups := readPIA(c, Options{Config: l.Config, StateDir: l.StateDir}, l.Node.Host, fastPIA)
	got := setups[l.Dev].cfg.Reserved
	t.Logf("reserved: %v", got)
	for _, want := range []string{"10.10.50.1/32", "192.0.2.1/32", "fd00:50::1/128", "2001:db8:1::1/128", "127.0.0.1/32", "10.10.50.0/24"} {
		if !slices.Contains(got, netip.MustParsePrefix(want)) {
			t.Errorf("%s is not reserved", want)
		}
	}
	peer := netip.MustParseAddr(tu.PeerIP)
	for _, p := range got {
		if p.Bits() == 0 || p.Contains(peer) || p.Contains(netip.MustParseAddr(tu.ServerVIP)) || p.Contains(pia.DefaultDNS) {
			t.Errorf("%s is reserved: it holds every address, or the tunnel's own (%s, %s, %s)", p, peer, tu.ServerVIP, pia.DefaultDNS)
		}
	}
	// A reload (the prefixes read again) leaves the tunnel alone.
	if res := r.d.Reload(t.Context()); !res.Applied {
		t.Fatalf("reload: %+v", res)
	}
	time.Sleep(2 * time.Second)
	if after := tunnel(r); !after.Healthy || !after.RegisteredSince.Equal(*tu.RegisteredSince) || l.Stub.AddKeys() != 1 {
		t.Errorf("after a reload: %+v, %d addKey requests", after, l.Stub.AddKeys())
	}
}
