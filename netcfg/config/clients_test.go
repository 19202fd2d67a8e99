package config

import (
	"slices"
	"strings"
	"testing"
)

// clientsBase is the seeds' remote-access device with clients leaving by
// the PIA tunnel under the VLAN's kill switch: what README's remote-access
// section documents.
const clientsBase = `wireguard:
  - name: wg-pia
    pia: {region: auto, credentialsFile: /etc/nodeagent/pia.cred}
  - name: wg0
    privateKeyFile: /etc/nodeagent/keys/wg0.key
    listenPort: 51820
    addresses: [10.90.0.1/24, "fd00:90::1/64"]
    peersDir: /etc/nodeagent/peers.d
    clients:
      endpoint: vpn.example.org:51820
      allowedIPs: [10.90.0.0/24, 192.168.2.0/24]
      dns: [192.168.2.1]
      egress:
        - {via: wg-pia, pool: 10.90.0.128/25}
routing:
  tables:
    - id: 150
      killSwitch: true
      routes: [{to: default, dev: wg-pia}, {to: 192.168.2.0/24, dev: enp1s0}]
  rules:
    - {priority: 1002, from: 10.90.0.128/25, table: 150}
firewall:
  masquerade:
    - {from: 10.90.0.0/24, out: enp1s0}
    - {from: 10.90.0.128/25, out: wg-pia}
  killSwitch:
    - {from: 10.90.0.128/25, allowOut: [wg-pia], allowTo: [192.168.2.0/24]}
`

func TestClientsConfig(t *testing.T) {
	c, err := parseTest(t, clientsBase)
	if err != nil {
		t.Fatal(err)
	}
	cl := c.WireGuard[1].Clients
	if cl.Endpoint != "vpn.example.org:51820" || cl.ClientKeepalive() != DefaultClientKeepalive || cl.Egress[0].Via != "wg-pia" {
		t.Errorf("clients read as %+v", cl)
	}
	for _, tc := range []struct{ from, to, want string }{
		{"      endpoint: vpn.example.org:51820\n", "", "wireguard[1].clients.endpoint: required"},
		{"vpn.example.org:51820", "vpn.example.org", `wireguard[1].clients.endpoint: "vpn.example.org" is not host:port`},
		{"dns: [192.168.2.1]", "dns: [192.168.2.1/24]", "wireguard[1].clients.dns[0]:"},
		{"{via: wg-pia, pool: 10.90.0.128/25}", "{via: wg0, pool: 10.90.0.128/25}", `wireguard[1].clients.egress[0].via: "wg0" is not a PIA device`},
		{"{via: wg-pia, pool: 10.90.0.128/25}", "{via: wg-pia, pool: 10.91.0.0/25}", "wireguard[1].clients.egress[0].pool: 10.91.0.0/25 is not inside the device's subnets"},
		{"{via: wg-pia, pool: 10.90.0.128/25}", "{via: wg-pia, pool: \"fd00:90::/65\"}", "a pool is IPv4"},
		{"    - {priority: 1002, from: 10.90.0.128/25, table: 150}\n", "    - {priority: 1002, from: 10.10.50.0/24, table: 150}\n",
			"wireguard[1].clients.egress[0].pool: 10.90.0.128/25 is not routed through wg-pia's kill switch"},
		{"    - {from: 10.90.0.128/25, out: wg-pia}\n", "", "10.90.0.128/25 is not masqueraded out wg-pia"},
		{"    - {from: 10.90.0.128/25, allowOut: [wg-pia], allowTo: [192.168.2.0/24]}\n", "    - {from: 10.10.50.0/24, allowOut: [wg-pia]}\n", "10.90.0.128/25 has no kill switch"},
		{"allowOut: [wg-pia], allowTo", "allowOut: [wg-pia, enp1s0], allowTo", "allows out by more than wg-pia"},
		{"allowTo: [192.168.2.0/24]", "allowTo: [0.0.0.0/0]", "firewall.killSwitch[0].allowTo[0]: 0.0.0.0/0 lets the traffic go anywhere"},
		{"allowTo: [192.168.2.0/24]", "allowTo: [\"fd00::/8\"]", "firewall.killSwitch[0].allowTo[0]: fd00::/8 and from 10.90.0.128/25 are different address families"},
		{"    peersDir: /etc/nodeagent/peers.d\n", "", "wireguard[1].clients: needs peersDir"},
	} {
		src := strings.Replace(clientsBase, tc.from, tc.to, 1)
		if src == clientsBase {
			t.Fatalf("%q is not in the base config", tc.from)
		}
		_, err := parseTest(t, src)
		got := errorStrings(t, err)
		if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("%q -> %q: errors %q, want one with %q", tc.from, tc.to, got, tc.want)
		}
	}
}

func TestPeerExpires(t *testing.T) {
	base := "wireguard:\n  - name: wg0\n    privateKeyFile: /k\n    peers:\n      - publicKey: xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\n        disabled: true\n"
	if _, err := parseTest(t, base+"        expires: 2027-01-31T18:00:00Z\n"); err != nil {
		t.Fatal(err)
	}
	_, err := parseTest(t, base+"        expires: 30d\n")
	if got := errorStrings(t, err); len(got) != 1 || !strings.Contains(got[0], `wireguard[0].peers[0].expires: "30d" is not an RFC 3339 time`) {
		t.Errorf("errors %q", got)
	}
}
