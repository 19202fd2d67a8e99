package agent

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/config"
)

// TestReservedPrefixesFromConfig: what would clash is kept from PIA's
// addresses (the node's and the config's addresses exactly, what dev's
// kill-switch table routes elsewhere, the redirected and kill-switch
// sources, where the port goes); what merely contains PIA's network is
// not (the node's subnets, other tables' routes, rules, masquerade
// sources, other peers' allowed IPs, a route through dev), or a node on a
// 10.0.0.0/24 LAN could never register (PIA's resolver is 10.0.0.243).
func TestReservedPrefixesFromConfig(t *testing.T) {
	c, err := config.Parse("nodeagent.yaml", []byte(`
vlans:
  - {name: enp1s0.50, parent: enp1s0, id: 50, addresses: [10.10.50.1/24]}
macvlans:
  - {name: shim, parent: enp1s0.50, addresses: [10.10.51.3/32]}
wireguard:
  - name: wg-home
    privateKeyFile: /etc/wg/home.key
    addresses: [10.99.0.1/24]
    peers:
      - {publicKey: "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=", allowedIPs: [10.98.0.0/16]}
  - name: wgpia0
    pia:
      region: nl_amsterdam
      credentialsFile: /etc/nodeagent/pia.cred
      portForward: {enabled: true, to: 10.10.50.20}
      dns: {for: [10.10.52.0/24]}
routing:
  tables:
    - id: 150
      killSwitch: true
      routes:
        - {to: default, dev: wgpia0}
        - {to: 10.0.0.0/8, dev: wgpia0}
        - {to: 10.10.53.0/24, dev: enp1s0.50}
  rules:
    - {priority: 1000, from: 10.10.48.0/20, table: 150}
    - {priority: 1001, to: 10.10.55.0/24, table: 150}
firewall:
  masquerade:
    - {from: 10.10.56.0/24, out: wgpia0}
  snat:
    - {from: 10.10.57.0/24, out: enp1s0, to: 192.0.2.9}
  killSwitch:
    - {from: 10.10.58.0/24, allowOut: [wgpia0]}
checks:
  arpReachable: [10.10.59.9]
`))
	if err != nil {
		t.Fatal(err)
	}
	node := map[string][]netip.Prefix{
		"lo":     {netip.MustParsePrefix("127.0.0.1/8")},
		"uplink": {netip.MustParsePrefix("192.168.1.10/24")},
		"wgpia0": {netip.MustParsePrefix("10.10.0.3/32")},
	}
	node["uplink"] = append(node["uplink"], netip.MustParsePrefix("10.0.0.5/24"))
	got := reservedPrefixes(c, "wgpia0", node)
	for _, want := range []string{"127.0.0.1/32", "192.168.1.10/32", "10.0.0.5/32", "10.10.50.1/32", "10.10.51.3/32", "10.99.0.1/32",
		"10.10.50.20/32", "10.10.52.0/24", "10.10.53.0/24", "192.0.2.9/32", "10.10.58.0/24", "10.10.59.9/32"} {
		if !slices.Contains(got, netip.MustParsePrefix(want)) {
			t.Errorf("%s is not reserved", want)
		}
	}
	for _, not := range []string{"0.0.0.0/0", "10.0.0.0/8", "10.10.0.3/32", "10.0.0.0/24", "192.168.1.0/24", "10.10.50.0/24",
		"10.98.0.0/16", "10.10.48.0/20", "10.10.55.0/24", "10.10.56.0/24", "10.10.57.0/24"} {
		if slices.Contains(got, netip.MustParsePrefix(not)) {
			t.Errorf("%s is reserved", not)
		}
	}
	for _, pia := range []string{"10.0.0.243", "10.0.0.242", "10.10.0.3", "10.10.0.1"} {
		a := netip.MustParseAddr(pia)
		if i := slices.IndexFunc(got, func(p netip.Prefix) bool { return p.Contains(a) }); i >= 0 {
			t.Errorf("PIA's %s is refused by %s", a, got[i])
		}
	}
	if !slices.IsSortedFunc(got, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) }) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Errorf("not sorted or not unique: %v", got)
	}
}
