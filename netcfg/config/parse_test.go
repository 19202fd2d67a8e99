package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const testFile = "nodeagent.yaml"

// parseTest parses src without looking at files on disk.
func parseTest(t *testing.T, src string) (*Config, error) {
	t.Helper()
	return ParseWith(testFile, []byte(src), Options{SkipFileChecks: true})
}

// errorStrings returns each FieldError of err formatted, in order.
func errorStrings(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var list ErrorList
	if !errors.As(err, &list) {
		t.Fatalf("error is %T, not ErrorList: %v", err, err)
	}
	var out []string
	for _, e := range list {
		out = append(out, e.Error())
	}
	return out
}

func TestParseInvalid(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want string // a substring of the error, file:line: field: msg
	}{
		// Unknown fields, at every level.
		{"unknown top-level field", "vlan: []\n",
			`nodeagent.yaml:1: vlan: unknown field (did you mean "vlans"?)`},
		{"unknown field in list item", "vlans:\n  - name: enp1s0.50\n    parent: enp1s0\n    id: 50\n    mtuu: 1500\n",
			`nodeagent.yaml:5: vlans[0].mtuu: unknown field (did you mean "mtu"?)`},
		{"unknown field in nested struct", "wireguard:\n  - name: wg-pia\n    pia:\n      region: nl\n      credentialsFile: /etc/x\n      portforwarding: true\n",
			`nodeagent.yaml:6: wireguard[0].pia.portforwarding: unknown field (did you mean "portForward"?)`},
		{"unknown field without suggestion", "routing:\n  zebra: 1\n",
			`nodeagent.yaml:2: routing.zebra: unknown field`},

		// Types and YAML structure.
		{"string for int", "vlans:\n  - name: enp1s0.50\n    parent: enp1s0\n    id: \"50\"\n",
			`nodeagent.yaml:4: vlans[0].id: expected an integer, got "50"`},
		{"float for int", "routing:\n  rules:\n    - priority: 1.5\n      table: 254\n",
			`nodeagent.yaml:3: routing.rules[0].priority: expected an integer, got 1.5`},
		{"mapping for list", "vlans:\n  name: enp1s0.50\n",
			`nodeagent.yaml:2: vlans: expected a list, got a mapping`},
		{"list for string", "node:\n  name: [a, b]\n",
			`nodeagent.yaml:2: node.name: expected a string, got a list`},
		{"yes is not a bool", "macvlans:\n  - name: shim\n    parent: eth0\n    adopt: yes\n",
			`nodeagent.yaml:4: macvlans[0].adopt: expected true or false, got "yes"`},
		{"duration without unit", "dad:\n  interval: 1\n",
			`nodeagent.yaml:2: dad.interval: expected a duration like 1s or 500ms, got "1"`},
		{"duplicate key", "node:\n  name: a\n  name: b\n",
			`nodeagent.yaml:3: node.name: duplicate key (first set on line 2)`},
		{"top level is a list", "- vlans\n",
			`nodeagent.yaml:1: expected a mapping, got a list`},
		{"second document", "node: {}\n---\nvlans: []\n",
			`nodeagent.yaml:3: a second YAML document`},
		{"syntax error", "vlans:\n\t- name: a\n",
			`nodeagent.yaml:2: invalid YAML: found character that cannot start any token`},
		{"unknown anchor", "vlans: *nope\n",
			`nodeagent.yaml:1: invalid YAML: unknown anchor 'nope' referenced`},

		// VLANs.
		{"vlan id too big", "vlans:\n  - name: enp1s0.50\n    parent: enp1s0\n    id: 4095\n",
			`nodeagent.yaml:4: vlans[0].id: 4095 is outside 1-4094`},
		{"vlan id zero", "vlans:\n  - name: enp1s0.50\n    parent: enp1s0\n    id: 0\n",
			`nodeagent.yaml:4: vlans[0].id: 0 is outside 1-4094`},
		{"vlan id missing", "vlans:\n  - name: enp1s0.50\n    parent: enp1s0\n",
			`nodeagent.yaml:2: vlans[0].id: required (1-4094)`},
		{"vlan parent missing", "vlans:\n  - name: enp1s0.50\n    id: 50\n",
			`nodeagent.yaml:2: vlans[0].parent: required`},
		{"vlan name missing", "vlans:\n  - parent: enp1s0\n    id: 50\n",
			`nodeagent.yaml:2: vlans[0].name: required`},
		{"interface name too long", "vlans:\n  - name: enp1s0.50-downloads\n    parent: enp1s0\n    id: 50\n",
			`nodeagent.yaml:2: vlans[0].name: "enp1s0.50-downloads" is 19 bytes; interface names are at most 15`},
		{"interface name with slash", "vlans:\n  - name: enp1s0/50\n    parent: enp1s0\n    id: 50\n",
			`nodeagent.yaml:2: vlans[0].name: "enp1s0/50" contains '/', which interface names may not`},
		{"interface name with colon", "vlans:\n  - name: \"eth0:1\"\n    parent: enp1s0\n    id: 50\n",
			`nodeagent.yaml:2: vlans[0].name: "eth0:1" contains ':', which interface names may not`},
		{"interface name with space", "vlans:\n  - name: \"vlan 50\"\n    parent: enp1s0\n    id: 50\n",
			`nodeagent.yaml:2: vlans[0].name: "vlan 50" contains whitespace, which interface names may not`},
		{"interface name dotdot", "vlans:\n  - name: \"..\"\n    parent: enp1s0\n    id: 50\n",
			`nodeagent.yaml:2: vlans[0].name: ".." is not a valid interface name`},
		{"duplicate vlan on parent", "vlans:\n  - {name: a, parent: enp1s0, id: 50}\n  - {name: b, parent: enp1s0, id: 50}\n",
			`nodeagent.yaml:3: vlans[1].id: VLAN 50 on enp1s0 is already declared at vlans[0].id (line 2)`},
		{"bad address", "vlans:\n  - {name: a, parent: enp1s0, id: 50, addresses: [10.10.50.300/24]}\n",
			`nodeagent.yaml:2: vlans[0].addresses[0]: "10.10.50.300/24" is not an address with a prefix length, like 10.10.50.1/24`},
		{"address without prefix length", "vlans:\n  - name: a\n    parent: enp1s0\n    id: 50\n    addresses:\n      - 10.10.50.1\n",
			`nodeagent.yaml:6: vlans[0].addresses[0]: "10.10.50.1" has no prefix length; write it like 10.10.50.1/32`},
		{"mtu too small", "vlans:\n  - {name: a, parent: enp1s0, id: 50, mtu: 60}\n",
			`nodeagent.yaml:2: vlans[0].mtu: 60 is outside 68-65535`},
		{"parent loop", "vlans:\n  - {name: a, parent: b, id: 50}\n  - {name: b, parent: a, id: 51}\n",
			`nodeagent.yaml:2: vlans[0].parent: parents form a loop: a -> b -> a`},

		// Macvlans and link-wide rules.
		{"macvlan mtu above vlan parent", "vlans:\n  - {name: enp1s0.50, parent: enp1s0, id: 50, mtu: 1500}\nmacvlans:\n  - name: vlan50-shim\n    parent: enp1s0.50\n    mtu: 9000\n",
			`nodeagent.yaml:6: macvlans[0].mtu: mtu 9000 is above parent enp1s0.50's mtu 1500`},
		{"macvlan mode", "macvlans:\n  - {name: shim, parent: eth0, mode: bridged}\n",
			`nodeagent.yaml:2: macvlans[0].mode: "bridged" is not one of bridge, private, vepa, passthru`},
		{"macvlan parent missing", "macvlans:\n  - name: shim\n",
			`nodeagent.yaml:2: macvlans[0].parent: required`},
		{"macvlan on wireguard", "wireguard:\n  - name: wg0\nmacvlans:\n  - {name: shim, parent: wg0}\n",
			`nodeagent.yaml:4: macvlans[0].parent: wg0 is a WireGuard interface`},
		{"duplicate link name", "vlans:\n  - {name: wg0, parent: enp1s0, id: 50}\nwireguard:\n  - name: wg0\n",
			`nodeagent.yaml:4: wireguard[0].name: duplicate link name "wg0"; first declared at vlans[0].name (line 2)`},
		{"duplicate address", "vlans:\n  - {name: a, parent: enp1s0, id: 50, addresses: [10.10.50.1/24]}\nmacvlans:\n  - {name: b, parent: a, addresses: [10.10.50.1/32]}\n",
			`nodeagent.yaml:4: macvlans[0].addresses[0]: 10.10.50.1 is already assigned at vlans[0].addresses[0] (line 2)`},

		// WireGuard.
		{"wireguard name missing", "wireguard:\n  - listenPort: 51820\n",
			`nodeagent.yaml:2: wireguard[0].name: required`},
		{"wireguard implementation", "wireguard:\n  - {name: wg0, implementation: kmod}\n",
			`nodeagent.yaml:2: wireguard[0].implementation: "kmod" is not one of auto, kernel, userspace`},
		{"listen port", "wireguard:\n  - name: wg0\n    listenPort: 70000\n",
			`nodeagent.yaml:3: wireguard[0].listenPort: 70000 is outside 0-65535`},
		{"relative key file", "wireguard:\n  - name: wg0\n    privateKeyFile: keys/wg0.key\n",
			`nodeagent.yaml:3: wireguard[0].privateKeyFile: "keys/wg0.key" is not an absolute path`},
		{"shared peersDir", "wireguard:\n  - {name: wg0, peersDir: /etc/nodeagent/peers.d}\n  - {name: wg1, peersDir: /etc/nodeagent/peers.d/}\n",
			`nodeagent.yaml:3: wireguard[1].peersDir: /etc/nodeagent/peers.d/ is also the peersDir of wireguard[0].peersDir (line 2) (a peer file there would be a peer of both): each device needs a register of its own; give each a directory of its own, side by side (/etc/nodeagent/peers.d/DEVICE)`},
		{"peersDir inside another's", "wireguard:\n  - {name: wg0, peersDir: /etc/nodeagent/peers.d}\n  - {name: wg1, peersDir: /etc/nodeagent/peers.d/wg1}\n",
			`nodeagent.yaml:3: wireguard[1].peersDir: /etc/nodeagent/peers.d/wg1 is inside /etc/nodeagent/peers.d, the peersDir of wireguard[0].peersDir (line 2): each device needs a register of its own`},
		{"peersDir holding another's", "wireguard:\n  - {name: wg0, peersDir: /etc/nodeagent/peers.d/wg0}\n  - {name: wg1, peersDir: /etc/nodeagent/peers.d}\n",
			`nodeagent.yaml:3: wireguard[1].peersDir: /etc/nodeagent/peers.d holds /etc/nodeagent/peers.d/wg0, the peersDir of wireguard[0].peersDir (line 2): each device needs a register of its own`},
		{"bad public key", "wireguard:\n  - name: wg0\n    peers:\n      - publicKey: abc\n",
			`nodeagent.yaml:4: wireguard[0].peers[0].publicKey: "abc" is not a WireGuard key`},
		{"duplicate public key", "wireguard:\n  - name: wg0\n    peers:\n      - publicKey: " + testKey + "\n      - publicKey: " + testKey + "\n",
			`nodeagent.yaml:5: wireguard[0].peers[1].publicKey: duplicate peer public key; first at wireguard[0].peers[0].publicKey (line 4)`},
		{"endpoint without port", "wireguard:\n  - name: wg0\n    peers:\n      - publicKey: " + testKey + "\n        endpoint: vpn.example.org\n",
			`nodeagent.yaml:5: wireguard[0].peers[0].endpoint: "vpn.example.org" is not host:port`},
		{"keepalive", "wireguard:\n  - name: wg0\n    peers:\n      - publicKey: " + testKey + "\n        persistentKeepalive: -1\n",
			`nodeagent.yaml:5: wireguard[0].peers[0].persistentKeepalive: -1 is outside 0-65535`},
		{"allowedIPs with host bits", "wireguard:\n  - name: wg0\n    peers:\n      - publicKey: " + testKey + "\n        allowedIPs: [10.90.0.2/24]\n",
			`nodeagent.yaml:5: wireguard[0].peers[0].allowedIPs[0]: "10.90.0.2/24" has host bits set; did you mean 10.90.0.0/24?`},
		{"pia without region", "wireguard:\n  - name: wg-pia\n    pia:\n      credentialsFile: /etc/nodeagent/pia.cred\n",
			`nodeagent.yaml:3: wireguard[0].pia.region: required`},
		{"pia with peers", "wireguard:\n  - name: wg-pia\n    pia: {region: nl, credentialsFile: /etc/x}\n    peers:\n      - publicKey: " + testKey + "\n",
			`nodeagent.yaml:4: wireguard[0].peers: a PIA tunnel gets its peer from PIA`},
		{"pia with addresses", "wireguard:\n  - name: wg-pia\n    addresses: [10.8.0.2/32]\n    pia: {region: nl, credentialsFile: /etc/x}\n",
			`nodeagent.yaml:3: wireguard[0].addresses: a PIA tunnel gets its address from PIA's addKey; remove addresses or pia`},
		{"pia with peersDir", "wireguard:\n  - name: wg-pia\n    peersDir: /etc/nodeagent/peers.d\n    pia: {region: nl, credentialsFile: /etc/x}\n",
			`nodeagent.yaml:3: wireguard[0].peersDir: a PIA tunnel gets its peer from PIA's addKey; remove peersDir or pia`},
		{"pia with listenPort", "wireguard:\n  - name: wg-pia\n    listenPort: 51820\n    pia: {region: nl, credentialsFile: /etc/x}\n",
			`nodeagent.yaml:3: wireguard[0].listenPort: a PIA tunnel only connects out`},
		{"pia region not an id", "wireguard:\n  - name: wg-pia\n    pia:\n      region: Amsterdam NL\n      credentialsFile: /etc/x\n",
			`nodeagent.yaml:4: wireguard[0].pia.region: "Amsterdam NL" is not a PIA region id`},
		{"pia server list not https", "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      serverList: http://serverlist.piaservers.net/vpninfo/servers/v6\n",
			`nodeagent.yaml:6: wireguard[0].pia.serverList: "http://serverlist.piaservers.net/vpninfo/servers/v6" is not an https URL`},
		{"pia port forward to v6", "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      portForward: {enabled: true, to: \"fd00::1\"}\n",
			`nodeagent.yaml:6: wireguard[0].pia.portForward.to: fd00::1: PIA forwards IPv4 only`},
		{"pia port forward to without routing", "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      portForward: {enabled: true, to: 10.10.50.10}\n",
			`nodeagent.yaml:6: wireguard[0].pia.portForward.to: 10.10.50.10 is not in a subnet routed through the tunnel (no routing.rules send any source to a killSwitch table with a route by wg-pia)`},
		{"pia port forward to outside the routed subnet", "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      portForward: {enabled: true, to: 10.10.60.10}\nrouting:\n  tables: [{id: 150, killSwitch: true, routes: [{to: default, dev: wg-pia}]}]\n  rules: [{priority: 1000, from: 10.10.50.0/24, table: 150}]\n",
			`wireguard[0].pia.portForward.to: 10.10.60.10 is not in a subnet routed through the tunnel (the sources routed through wg-pia's kill-switch table are 10.10.50.0/24)`},
		{"pia dns.for outside the routed sources", "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      dns:\n        for:\n          - 10.10.50.0/24\n          - 10.10.0.0/16\nrouting:\n  tables: [{id: 150, killSwitch: true, routes: [{to: default, dev: wg-pia}]}]\n  rules: [{priority: 1000, from: 10.10.50.0/24, table: 150}]\n",
			`nodeagent.yaml:9: wireguard[0].pia.dns.for[1]: 10.10.0.0/16 is not within a source routed through the tunnel (the sources routed through wg-pia's kill-switch table are 10.10.50.0/24): its DNS, sent to PIA's resolver, would leave by the uplink in plaintext`},
		{"pia onChange relative", "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      portForward:\n        enabled: true\n        onChange: [qbt-set-port]\n",
			`wireguard[0].pia.portForward.onChange[0]: "qbt-set-port" is not an absolute path`},
		{"pia toPort without to", "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      portForward: {enabled: true, toPort: 8080}\n",
			`wireguard[0].pia.portForward.toPort: needs to (the address the port is forwarded to)`},
		{"pia portForward not a bool", "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      portForward: yes please\n",
			`wireguard[0].pia.portForward.enabled: expected true or false`},
		{"pia dns v6", "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      dns: {for: [\"fd00:50::/64\"]}\n",
			`wireguard[0].pia.dns.for[0]: fd00:50::/64: PIA's resolvers are IPv4 only`},
		{"pia relative caFile", "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      caFile: pia.crt\n",
			`nodeagent.yaml:6: wireguard[0].pia.caFile: "pia.crt" is not an absolute path`},

		// Routing.
		{"reserved table", "routing:\n  tables:\n    - id: 254\n",
			`nodeagent.yaml:3: routing.tables[0].id: table 254 (main) is reserved; rules may use it by number without declaring it`},
		{"table id missing", "routing:\n  tables:\n    - name: egress\n",
			`nodeagent.yaml:3: routing.tables[0].id: required`},
		{"duplicate table id", "routing:\n  tables:\n    - id: 150\n    - id: 150\n",
			`nodeagent.yaml:4: routing.tables[1].id: duplicate table id 150; first declared at routing.tables[0].id (line 3)`},
		{"duplicate table name", "routing:\n  tables:\n    - {id: 150, name: egress}\n    - {id: 151, name: egress}\n",
			`nodeagent.yaml:4: routing.tables[1].name: duplicate table name "egress"; first declared at routing.tables[0].name (line 3)`},
		{"undeclared table", "routing:\n  rules:\n    - priority: 1000\n      from: 10.10.50.0/24\n      table: 150\n",
			`nodeagent.yaml:5: routing.rules[0].table: table 150 is not declared in routing.tables`},
		{"rule without table", "routing:\n  rules:\n    - priority: 1000\n      from: 10.10.50.0/24\n",
			`nodeagent.yaml:3: routing.rules[0].table: required`},
		{"duplicate priority", "routing:\n  rules:\n    - {priority: 1000, table: 254}\n    - {priority: 1000, table: 253}\n",
			`nodeagent.yaml:4: routing.rules[1].priority: duplicate priority 1000; first used at routing.rules[0].priority (line 3)`},
		{"rule priority missing", "routing:\n  rules:\n    - table: 254\n",
			`nodeagent.yaml:3: routing.rules[0].priority: required`},
		{"bad fwmark", "routing:\n  rules:\n    - {priority: 10, fwmark: 0xzz, table: 254}\n",
			`nodeagent.yaml:3: routing.rules[0].fwMark: invalid fwMark "0xzz": use 0x10, 0x10/0xff or a decimal number`},
		{"bad rule action", "routing:\n  rules:\n    - {priority: 10, action: drop}\n",
			`nodeagent.yaml:3: routing.rules[0].action: "drop" is not one of table, unreachable, blackhole, prohibit`},
		{"rule from with host bits", "routing:\n  rules:\n    - {priority: 10, from: 10.10.50.1/24, table: 254}\n",
			`nodeagent.yaml:3: routing.rules[0].from: "10.10.50.1/24" has host bits set; did you mean 10.10.50.0/24?`},
		{"route type", "routing:\n  tables:\n    - id: 150\n      routes:\n        - {to: default, dev: wg0, type: local}\n",
			`nodeagent.yaml:5: routing.tables[0].routes[0].type: "local" is not one of unicast, unreachable, blackhole, prohibit`},
		{"route scope", "routing:\n  tables:\n    - id: 150\n      routes:\n        - to: default\n          dev: wg0\n          scope: site\n",
			`nodeagent.yaml:7: routing.tables[0].routes[0].scope: "site" is not one of global, link, host`},
		{"route to bad cidr", "routing:\n  tables:\n    - id: 150\n      routes:\n        - {to: 10.10.50.0/33, dev: wg0}\n",
			`nodeagent.yaml:5: routing.tables[0].routes[0].to: "10.10.50.0/33" is not a CIDR prefix`},
		{"route via family", "routing:\n  tables:\n    - id: 150\n      routes:\n        - {to: 10.10.0.0/16, via: \"fe80::1\"}\n",
			`nodeagent.yaml:5: routing.tables[0].routes[0].via: fe80::1 and 10.10.0.0/16 are different address families`},
		{"route without via or dev", "routing:\n  tables:\n    - id: 150\n      routes:\n        - to: default\n",
			`nodeagent.yaml:5: routing.tables[0].routes[0]: a unicast route needs via, dev or both`},

		// Firewall.
		{"masquerade from", "firewall:\n  masquerade:\n    - {from: 10.10.50.0, out: wg-pia}\n",
			`nodeagent.yaml:3: firewall.masquerade[0].from: "10.10.50.0" has no prefix length; write it like 10.10.50.0/32`},
		{"masquerade out", "firewall:\n  masquerade:\n    - {from: 10.10.50.0/24}\n",
			`nodeagent.yaml:3: firewall.masquerade[0].out: required`},
		{"kill switch without allowOut", "firewall:\n  killSwitch:\n    - from: 10.10.50.0/24\n",
			`nodeagent.yaml:3: firewall.killSwitch[0].allowOut: required`},
		{"mss clamp name", "firewall:\n  mssClamp: [wireguard-pia-tunnel]\n",
			`nodeagent.yaml:2: firewall.mssClamp[0]: "wireguard-pia-tunnel" is 20 bytes`},
		{"snat family", "firewall:\n  snat:\n    - {from: 10.10.50.0/24, out: wg0, to: \"fd00::1\"}\n",
			`nodeagent.yaml:3: firewall.snat[0].to: fd00::1 and 10.10.50.0/24 are different address families`},
		{"snat without to", "firewall:\n  snat:\n    - {from: 10.10.50.0/24, out: wg0}\n",
			`nodeagent.yaml:3: firewall.snat[0].to: required`},
		{"snat to a prefix", "firewall:\n  snat:\n    - {from: 10.10.50.0/24, out: wg0, to: 192.0.2.1/32}\n",
			`nodeagent.yaml:3: firewall.snat[0].to: "192.0.2.1/32" is not an IP address`},
		{"snat of masqueraded traffic", "firewall:\n  masquerade:\n    - {from: 10.10.50.0/24, out: wg0}\n  snat:\n    - {from: 10.10.50.0/24, out: wg0, to: 192.0.2.1}\n",
			`nodeagent.yaml:5: firewall.snat[0]: traffic from 10.10.50.0/24 out wg0 is already masqueraded at firewall.masquerade[0] (line 3)`},
		{"forward without in", "firewall:\n  forward:\n    - {out: enp1s0}\n",
			`nodeagent.yaml:3: firewall.forward[0].in: required`},
		{"duplicate forward", "firewall:\n  forward:\n    - {in: wg0, out: enp1s0}\n    - {in: wg0, out: enp1s0}\n",
			`nodeagent.yaml:4: firewall.forward[1]: duplicate forward in wg0 out enp1s0; first at firewall.forward[0] (line 3)`},

		// Sysctls.
		{"sysctl outside net", "sysctls:\n  kernel.panic: \"10\"\n",
			`nodeagent.yaml:2: sysctls.kernel.panic: "kernel.panic" is outside net.*`},
		{"sysctl empty value", "sysctls:\n  net.ipv4.ip_forward: \"\"\n",
			`nodeagent.yaml:2: sysctls.net.ipv4.ip_forward: value is empty`},
		{"sysctl bad key", "sysctls:\n  net.ipv4..ip_forward: \"1\"\n",
			`nodeagent.yaml:2: sysctls.net.ipv4..ip_forward: "net.ipv4..ip_forward" is not a sysctl key`},

		// Kubernetes.
		{"forbidden kubernetes.io label", "kubernetes:\n  labels:\n    node-role.kubernetes.io/gateway: \"true\"\n",
			`nodeagent.yaml:3: kubernetes.labels["node-role.kubernetes.io/gateway"]: label key "node-role.kubernetes.io/gateway" is in the reserved kubernetes.io/k8s.io namespace; the NodeRestriction admission plugin forbids`},
		{"forbidden node-restriction label", "kubernetes:\n  labels:\n    node-restriction.kubernetes.io/pia: \"true\"\n",
			`nodeagent.yaml:3: kubernetes.labels["node-restriction.kubernetes.io/pia"]: label key "node-restriction.kubernetes.io/pia" is in node-restriction.kubernetes.io/`},
		{"forbidden k8s.io label", "kubernetes:\n  labels:\n    x.k8s.io/a: b\n",
			`nodeagent.yaml:3: kubernetes.labels["x.k8s.io/a"]: label key "x.k8s.io/a" is in the reserved kubernetes.io/k8s.io namespace`},
		{"label key syntax", "kubernetes:\n  labels:\n    homelab.example/-bad: \"true\"\n",
			`nodeagent.yaml:3: kubernetes.labels["homelab.example/-bad"]: label key "homelab.example/-bad": name "-bad" must be alphanumerics`},
		{"label prefix uppercase", "kubernetes:\n  labels:\n    Homelab.Example/x: \"true\"\n",
			`nodeagent.yaml:3: kubernetes.labels["Homelab.Example/x"]: label key "Homelab.Example/x": prefix "Homelab.Example" must be a lowercase DNS subdomain`},
		{"label value syntax", "kubernetes:\n  labels:\n    homelab.example/x: \"yes please\"\n",
			`nodeagent.yaml:3: kubernetes.labels["homelab.example/x"]: label value "yes please" must be alphanumerics`},
		{"conditional label without when", "kubernetes:\n  conditionalLabels:\n    - {key: homelab.example/egress-gateway, value: \"true\"}\n",
			`nodeagent.yaml:3: kubernetes.conditionalLabels[0].when: required`},
		{"conditional label bad when", "kubernetes:\n  conditionalLabels:\n    - key: homelab.example/egress-gateway\n      value: \"true\"\n      when: wg-pia-healthy\n",
			`nodeagent.yaml:5: kubernetes.conditionalLabels[0].when: "wg-pia-healthy" is not a condition nodeagent reports; use wireguard/<interface>/healthy, vlan/<name>/up, checks/arp-reachable or converged`},
		{"conditional label unknown condition", "wireguard:\n  - name: wg-pia\nkubernetes:\n  conditionalLabels:\n    - {key: homelab.example/egress-gateway, value: \"true\", when: wireguard/wg-pia/up}\n",
			`nodeagent.yaml:5: kubernetes.conditionalLabels[0].when: "wireguard/wg-pia/up" is not a condition nodeagent reports`},
		{"conditional label bad segment", "kubernetes:\n  conditionalLabels:\n    - {key: homelab.example/egress-gateway, value: \"true\", when: wireguard//healthy}\n",
			`nodeagent.yaml:3: kubernetes.conditionalLabels[0].when: "wireguard//healthy" is not a condition; use`},
		{"conditional label undeclared vlan", "kubernetes:\n  conditionalLabels:\n    - {key: homelab.example/vlan50, value: \"true\", when: vlan/enp1s0.50/up}\n",
			`nodeagent.yaml:3: kubernetes.conditionalLabels[0].when: no VLAN "enp1s0.50" is declared`},
		{"conditional label arp check without addresses", "kubernetes:\n  conditionalLabels:\n    - {key: homelab.example/vip, value: \"true\", when: checks/arp-reachable}\n",
			`nodeagent.yaml:3: kubernetes.conditionalLabels[0].when: checks.arpReachable lists no addresses`},
		{"conditional label forbidden prefix", "kubernetes:\n  conditionalLabels:\n    - {key: node-role.kubernetes.io/egress, value: \"true\", when: converged}\n",
			`nodeagent.yaml:3: kubernetes.conditionalLabels[0].key: label key "node-role.kubernetes.io/egress" is in the reserved kubernetes.io/k8s.io namespace`},
		{"conditional label also static", "kubernetes:\n  labels: {homelab.example/gw: \"true\"}\n  conditionalLabels:\n    - {key: homelab.example/gw, value: \"true\", when: converged}\n",
			`nodeagent.yaml:4: kubernetes.conditionalLabels[0].key: "homelab.example/gw" is also a static label`},
		{"duplicate conditional label", "kubernetes:\n  conditionalLabels:\n    - {key: homelab.example/gw, value: \"true\", when: converged}\n    - {key: homelab.example/gw, value: \"false\", when: converged}\n",
			`nodeagent.yaml:4: kubernetes.conditionalLabels[1].key: duplicate conditional label "homelab.example/gw"; first at kubernetes.conditionalLabels[0].key (line 3)`},
		{"label value too long", "kubernetes:\n  labels:\n    homelab.example/x: " + strings.Repeat("a", 64) + "\n",
			`nodeagent.yaml:3: kubernetes.labels["homelab.example/x"]: label value "` + strings.Repeat("a", 64) + `" is longer than 63 characters`},
		{"label name too long", "kubernetes:\n  labels:\n    homelab.example/" + strings.Repeat("a", 64) + ": x\n",
			`: name is longer than 63 characters`},
		{"label node-restriction subdomain", "kubernetes:\n  labels:\n    a.node-restriction.kubernetes.io/x: y\n",
			`label key "a.node-restriction.kubernetes.io/x" is in node-restriction.kubernetes.io/`},
		{"label kubernetes.io without subdomain", "kubernetes:\n  labels:\n    kubernetes.io/role: gateway\n",
			`label key "kubernetes.io/role" is in the reserved kubernetes.io/k8s.io namespace`},
		{"hold negative", "kubernetes:\n  labels: {homelab.example/x: y}\n  hold: -1s\n",
			`nodeagent.yaml:3: kubernetes.hold: -1s is outside 0s-1h`},
		{"hold too long", "kubernetes:\n  hold: 2h\n",
			`nodeagent.yaml:2: kubernetes.hold: 2h0m0s is outside 0s-1h`},
		{"conditional label undeclared tunnel", "kubernetes:\n  conditionalLabels:\n    - key: homelab.example/egress-gateway\n      value: \"true\"\n      when: wireguard/wg-pia/healthy\n",
			`nodeagent.yaml:5: kubernetes.conditionalLabels[0].when: no WireGuard interface "wg-pia" is declared`},
		{"conditional label without value", "wireguard:\n  - name: wg-pia\nkubernetes:\n  conditionalLabels:\n    - key: homelab.example/egress-gateway\n      when: wireguard/wg-pia/healthy\n",
			`nodeagent.yaml:5: kubernetes.conditionalLabels[0].value: required`},
		{"relative kubeconfig", "kubernetes:\n  kubeconfig: kubelet.kubeconfig\n",
			`nodeagent.yaml:2: kubernetes.kubeconfig: "kubelet.kubeconfig" is not an absolute path`},

		// Checks and DAD.
		{"arp check ipv6", "checks:\n  arpReachable: [\"fd00::20\"]\n",
			`nodeagent.yaml:2: checks.arpReachable[0]: fd00::20 is not an IPv4 address`},
		{"arp check not an address", "checks:\n  arpReachable:\n    - 192.168.2.0/24\n",
			`nodeagent.yaml:3: checks.arpReachable[0]: "192.168.2.0/24" is not an IP address`},
		{"dad probes", "dad:\n  probes: 11\n",
			`nodeagent.yaml:2: dad.probes: 11 is outside 1-10`},
		{"dad interval", "dad:\n  interval: 20s\n",
			`nodeagent.yaml:2: dad.interval: 20s is outside 1ms-10s`},
		{"dad wait", "dad:\n  wait: 100us\n",
			`nodeagent.yaml:2: dad.wait: 100µs is outside 1ms-10s`},
		{"dad announcements", "dad:\n  announcements: 11\n",
			`nodeagent.yaml:2: dad.announcements: 11 is outside 0-10`},
		{"node name", "node:\n  name: Node_1\n",
			`nodeagent.yaml:2: node.name: "Node_1" is not a valid node name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseTest(t, tt.src)
			if err == nil {
				t.Fatalf("Parse succeeded; want error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error:\n%v\nwant it to contain:\n%s", err, tt.want)
			}
			if c == nil || c.File != testFile {
				t.Errorf("Parse returned config %+v; want one with File %q", c, testFile)
			}
		})
	}
	if len(tests) < 30 {
		t.Errorf("only %d invalid cases", len(tests))
	}
}

// testKey is a syntactically valid WireGuard public key.
const testKey = "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg="

func TestParseReportsEveryError(t *testing.T) {
	src := `vlans:
  - name: enp1s0.50
    parent: enp1s0
    id: 5000
    mtuu: 1500
  - name: enp1s0.50
    parent: enp1s0
    id: "51"
routing:
  tables:
    - id: 150
  rules:
    - priority: 1000
      from: 10.10.50.0/24
      table: 151
kubernetes:
  labels:
    kubernetes.io/role: gateway
`
	_, err := parseTest(t, src)
	want := []string{
		`nodeagent.yaml:4: vlans[0].id: 5000 is outside 1-4094`,
		`nodeagent.yaml:5: vlans[0].mtuu: unknown field (did you mean "mtu"?)`,
		`nodeagent.yaml:6: vlans[1].name: duplicate link name "enp1s0.50"; first declared at vlans[0].name (line 2)`,
		`nodeagent.yaml:8: vlans[1].id: expected an integer, got "51"`,
		`nodeagent.yaml:15: routing.rules[0].table: table 151 is not declared in routing.tables (declare it, or use main 254, default 253 or local 255)`,
		`nodeagent.yaml:18: kubernetes.labels["kubernetes.io/role"]: label key "kubernetes.io/role" is in the reserved kubernetes.io/k8s.io namespace; the NodeRestriction admission plugin forbids a node's own identity from setting it, so nodeagent could never apply it (use your own prefix, like homelab.example/)`,
	}
	if diff := cmp.Diff(want, errorStrings(t, err)); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	if got, wantJoined := err.Error(), strings.Join(want, "\n"); got != wantJoined {
		t.Errorf("Error() =\n%s\nwant\n%s", got, wantJoined)
	}
}

func TestExampleHomelab(t *testing.T) {
	path := filepath.Join("..", "..", "examples", "homelab.yaml")
	c, err := LoadWith(path, Options{SkipFileChecks: true})
	if err != nil {
		t.Fatalf("LoadWith(%s): %v", path, err)
	}
	if c.File != path {
		t.Errorf("File = %q; want %q", c.File, path)
	}
	// Spot-check that the example says what its comments say.
	if len(c.VLANs) != 1 || c.VLANs[0].Name != "enp1s0.50" || c.VLANs[0].ID != 50 || c.Checks.ARPReachable != nil {
		t.Errorf("VLANs = %+v", c.VLANs)
	}
	if len(c.WireGuard) != 2 || c.WireGuard[0].PIA == nil || !c.WireGuard[0].PIA.PortForward.Enabled || c.WireGuard[1].ListenPort != 51820 {
		t.Errorf("WireGuard = %+v", c.WireGuard)
	}
	wantRules := []Rule{{Priority: 1000, From: "10.10.50.0/24", Table: 150, Action: "table"}, {Priority: 1002, From: "10.90.0.128/25", Table: 150, Action: "table"}}
	if cl := c.WireGuard[1].Clients; cl == nil || cl.Endpoint == "" || len(cl.Egress) != 1 {
		t.Errorf("wg0 clients = %+v", cl)
	}
	if diff := cmp.Diff(wantRules, c.Routing.Rules); diff != "" {
		t.Errorf("rules (-want +got):\n%s", diff)
	}
	if err := c.Validate(Options{SkipFileChecks: true}); err != nil {
		t.Errorf("Validate after Parse: %v", err)
	}
}

func TestKeyFilePermissions(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("secret\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // umask may have narrowed it
			t.Fatal(err)
		}
		return p
	}
	open := write("open.key", 0o644)
	closed := write("closed.key", 0o600)
	groupOnly := write("group.psk", 0o640)
	missing := filepath.Join(dir, "missing.key")
	linked := filepath.Join(dir, "linked.key")
	os.Symlink(closed, linked)
	notRoot := write("user.key", 0o600)
	chowned := os.Geteuid() == 0 && os.Chown(notRoot, 1000, 1000) == nil

	tests := []struct {
		name string
		src  string
		opts Options
		want []string
	}{
		{
			name: "symlinked key",
			src:  "wireguard:\n  - name: wg0\n    privateKeyFile: " + linked + "\n",
			want: []string{"nodeagent.yaml:3: wireguard[0].privateKeyFile: " + linked + " is a symbolic link, which is not followed here; name the file itself"},
		},
		{
			name: "world readable private key",
			src:  "wireguard:\n  - name: wg0\n    privateKeyFile: " + open + "\n",
			want: []string{"nodeagent.yaml:3: wireguard[0].privateKeyFile: " + open + " is readable by group or others (mode 0644); chmod 600 it"},
		},
		{
			name: "owner-only private key",
			src:  "wireguard:\n  - name: wg0\n    privateKeyFile: " + closed + "\n",
		},
		{
			name: "missing key is not an error",
			src:  "wireguard:\n  - name: wg0\n    privateKeyFile: " + missing + "\n",
		},
		{
			name: "group readable preshared key and credentials",
			src: "wireguard:\n  - name: wg0\n    privateKeyFile: " + missing + "\n    peers:\n      - publicKey: " + testKey + "\n        presharedKeyFile: " + groupOnly + "\n" +
				"  - name: wg-pia\n    privateKeyFile: " + missing + "\n    pia:\n      region: nl\n      credentialsFile: " + open + "\n",
			want: []string{
				"nodeagent.yaml:6: wireguard[0].peers[0].presharedKeyFile: " + groupOnly + " is readable by group or others (mode 0640); chmod 600 it",
				"nodeagent.yaml:11: wireguard[1].pia.credentialsFile: " + open + " is readable by group or others (mode 0644); chmod 600 it",
			},
		},
		{
			name: "directory",
			src:  "wireguard:\n  - name: wg0\n    privateKeyFile: " + dir + "\n",
			want: []string{"nodeagent.yaml:3: wireguard[0].privateKeyFile: " + dir + " is not a regular file (a directory)"},
		},
		{
			name: "skipped",
			src:  "wireguard:\n  - name: wg0\n    privateKeyFile: " + open + "\n",
			opts: Options{SkipFileChecks: true},
		},
	}
	if chowned {
		tests = append(tests, struct {
			name string
			src  string
			opts Options
			want []string
		}{
			name: "key owned by a user",
			src:  "wireguard:\n  - name: wg0\n    privateKeyFile: " + notRoot + "\n",
			want: []string{"nodeagent.yaml:3: wireguard[0].privateKeyFile: " + notRoot + " is owned by uid 1000, not root; whoever owns a key file can replace the key (chown root it)"},
		})
	} else {
		t.Log("not root: the key-owner case needs chown and runs in CI")
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseWith(testFile, []byte(tt.src), tt.opts)
			if diff := cmp.Diff(tt.want, errorStrings(t, err)); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}

	// Parse, without options, looks at the files.
	if _, err := Parse(testFile, []byte("wireguard:\n  - name: wg0\n    privateKeyFile: "+open+"\n")); err == nil {
		t.Error("Parse accepted a world-readable key file")
	}
}

func TestDefaults(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want *Config
	}{
		{
			name: "empty file",
			src:  "",
			want: &Config{File: testFile, DAD: DAD{Probes: 3, Interval: time.Second, Wait: 2 * time.Second, Announcements: 2}},
		},
		{
			name: "only comments",
			src:  "# nothing here yet\n",
			want: &Config{File: testFile, DAD: DAD{Probes: 3, Interval: time.Second, Wait: 2 * time.Second, Announcements: 2}},
		},
		{
			name: "explicit values are kept",
			src:  "dad:\n  probes: 5\n  interval: 10ms\n  wait: 50ms\n  announcements: 0\n",
			want: &Config{File: testFile, DAD: DAD{Probes: 5, Interval: 10 * time.Millisecond, Wait: 50 * time.Millisecond, Announcements: 0}},
		},
		{
			name: "null is unset",
			src:  "dad:\n  announcements:\n  probes: ~\n",
			want: &Config{File: testFile, DAD: DAD{Probes: 3, Interval: time.Second, Wait: 2 * time.Second, Announcements: 2}},
		},
		{
			name: "kubernetes hold default",
			src:  "kubernetes:\n  labels: {homelab.example/x: y}\n",
			want: &Config{File: testFile, DAD: DAD{Probes: 3, Interval: time.Second, Wait: 2 * time.Second, Announcements: 2},
				Kubernetes: Kubernetes{Labels: map[string]string{"homelab.example/x": "y"}, Hold: DefaultKubernetesHold}},
		},
		{
			name: "kubernetes hold 0 written is kept",
			src:  "kubernetes:\n  labels: {homelab.example/x: y}\n  hold: 0s\n",
			want: &Config{File: testFile, DAD: DAD{Probes: 3, Interval: time.Second, Wait: 2 * time.Second, Announcements: 2},
				Kubernetes: Kubernetes{Labels: map[string]string{"homelab.example/x": "y"}}},
		},
		{
			name: "per-object defaults",
			src: `macvlans:
  - {name: shim, parent: eth0}
  - {name: shim2, parent: eth1, mode: vepa}
wireguard:
  - {name: wg0, privateKeyFile: /k0}
  - {name: wg1, privateKeyFile: /k1, implementation: userspace}
routing:
  tables:
    - id: 150
      routes:
        - {to: default, dev: wg0}
        - {to: 10.0.0.0/8, type: blackhole}
  rules:
    - {priority: 10, table: 150}
    - {priority: 20, action: prohibit}
`,
			want: &Config{
				File: testFile,
				DAD:  DAD{Probes: 3, Interval: time.Second, Wait: 2 * time.Second, Announcements: 2},
				Macvlans: []Macvlan{
					{Name: "shim", Parent: "eth0", Mode: "bridge"},
					{Name: "shim2", Parent: "eth1", Mode: "vepa"},
				},
				WireGuard: []WireGuard{
					{Name: "wg0", PrivateKeyFile: "/k0", Implementation: "auto"},
					{Name: "wg1", PrivateKeyFile: "/k1", Implementation: "userspace"},
				},
				Routing: Routing{
					Tables: []Table{{ID: 150, Routes: []Route{
						{To: "default", Dev: "wg0", Type: "unicast"},
						{To: "10.0.0.0/8", Type: "blackhole"},
					}}},
					Rules: []Rule{
						{Priority: 10, Table: 150, Action: "table"},
						{Priority: 20, Action: "prohibit"},
					},
				},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTest(t, tt.src)
			if err != nil {
				t.Fatal(err)
			}
			// Lines is the decoder's record of where fields were written.
			if diff := cmp.Diff(tt.want, got, cmpopts.IgnoreFields(Config{}, "Lines")); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}

	// A Config built in code gets the same defaults.
	c := &Config{}
	applyDefaults(c, nil)
	if c.DAD.Announcements != DefaultDADAnnouncements || c.Node.Name != "" {
		t.Errorf("applyDefaults(nil positions) = %+v", c)
	}
}

func TestParseValid(t *testing.T) {
	tests := []struct {
		name string
		src  string
	}{
		{"kubelet labels are allowed", `kubernetes:
  labels:
    kubernetes.io/hostname: node1
    topology.kubernetes.io/zone: rack-1
    node.kubernetes.io/gateway: "true"
    sub.kubelet.kubernetes.io/x: ""
    plain: value
`},
		{"rule selectors", `routing:
  rules:
    - {priority: 1, from: all, to: "fd00::/8", table: 254}
    - {priority: 2, fwMark: 0x10/0xff, table: 253}
    - {priority: 3, fwmark: "16", action: unreachable}
    - {priority: 4, iif: wg0, suppressPrefixLength: 0, table: 254}
`},
		{"firewall", `firewall:
  masquerade: [{from: 10.90.0.0/24, out: enp1s0}, {from: "fd00:90::/64", out: enp1s0}]
  snat: [{from: 10.91.0.0/24, out: enp1s0, to: 192.168.2.10}]
  forward: [{in: wg0, out: enp1s0}]
  killSwitch: [{from: 10.10.50.0/24, allowOut: [wg-pia]}, {from: "fd00:50::/64", allowOut: [wg-pia]}]
  mssClamp: [wg-pia]
`},
		{"every condition form", `vlans:
  - {name: enp1s0.50, parent: enp1s0, id: 50}
wireguard:
  - {name: wg-pia, privateKeyFile: /etc/nodeagent/keys/wg-pia.key}
checks:
  arpReachable: [192.168.2.20]
kubernetes:
  hold: 0s
  conditionalLabels:
    - {key: homelab.example/egress-gateway, value: "true", when: wireguard/wg-pia/healthy}
    - {key: homelab.example/vlan50, value: "true", when: vlan/enp1s0.50/up}
    - {key: homelab.example/vip, value: "true", when: checks/arp-reachable}
    - {key: node.kubernetes.io/converged, value: "true", when: converged}
`},
		{"trailing empty document", "node: {name: n1}\n---\n"},
		{"null sections", "vlans:\nrouting:\n"},
		{"ipv6 addresses", "vlans:\n  - {name: a, parent: eth0, id: 7, addresses: [\"fd00::1/64\", 10.0.0.1/24]}\n"},
		{"sysctl with interface name", "sysctls:\n  net.ipv4.conf.enp1s0/50.rp_filter: 2\n  net.ipv6.conf.all.forwarding: \"1\"\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parseTest(t, tt.src); err != nil {
				t.Errorf("Parse: %v", err)
			}
		})
	}
}

func TestMergeKeys(t *testing.T) {
	src := `vlans:
  - &base
    name: enp1s0.50
    parent: enp1s0
    id: 50
    mtu: 1500
  - <<: *base
    name: enp1s0.51
    id: 51
`
	c, err := parseTest(t, src)
	if err != nil {
		t.Fatal(err)
	}
	want := []VLAN{
		{Name: "enp1s0.50", Parent: "enp1s0", ID: 50, MTU: 1500},
		{Name: "enp1s0.51", Parent: "enp1s0", ID: 51, MTU: 1500},
	}
	if diff := cmp.Diff(want, c.VLANs); diff != "" {
		t.Errorf("VLANs (-want +got):\n%s", diff)
	}
}

func TestValidateWithoutPositions(t *testing.T) {
	c := &Config{
		File:  "built-in",
		VLANs: []VLAN{{Name: "enp1s0.50", Parent: "enp1s0", ID: 4095}},
	}
	want := []string{"built-in: vlans[0].id: 4095 is outside 1-4094"}
	if diff := cmp.Diff(want, errorStrings(t, c.Validate(Options{}))); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}
	if err := (&Config{}).Validate(Options{}); err != nil {
		t.Errorf("empty config: %v", err)
	}
}

func TestFieldErrorFormat(t *testing.T) {
	tests := []struct {
		e    FieldError
		want string
	}{
		{FieldError{File: "f.yaml", Line: 3, Field: "vlans[0].id", Msg: "bad"}, "f.yaml:3: vlans[0].id: bad"},
		{FieldError{File: "f.yaml", Field: "vlans[0].id", Msg: "bad"}, "f.yaml: vlans[0].id: bad"},
		{FieldError{File: "f.yaml", Line: 1, Msg: "bad"}, "f.yaml:1: bad"},
		{FieldError{Field: "x", Msg: "bad"}, "x: bad"},
	}
	for _, tt := range tests {
		if got := tt.e.Error(); got != tt.want {
			t.Errorf("Error() = %q; want %q", got, tt.want)
		}
	}
	var fe *FieldError
	if !errors.As(ErrorList{&tests[0].e}, &fe) || fe.Line != 3 {
		t.Errorf("errors.As(ErrorList) = %v", fe)
	}
}

func TestParentPath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"vlans[1].id", "vlans[1]"},
		{"vlans[1]", "vlans"},
		{"vlans", ""},
		{`kubernetes.labels["a.b/c"]`, "kubernetes.labels"},
		{`kubernetes.labels["x[\"y"]`, "kubernetes.labels"},
		{"sysctls.net.ipv4.ip_forward", "sysctls.net.ipv4"},
	}
	for _, tt := range tests {
		if got := parentPath(tt.in); got != tt.want {
			t.Errorf("parentPath(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseFwMark(t *testing.T) {
	tests := []struct {
		in         string
		mark, mask uint32
		ok         bool
	}{
		{"0x10", 0x10, 0xffffffff, true},
		{"0x10/0xff", 0x10, 0xff, true},
		{"16", 16, 0xffffffff, true},
		{"16/255", 16, 255, true},
		{"0xffffffff", 0xffffffff, 0xffffffff, true},
		{"0x100000000", 0, 0, false},
		{"-1", 0, 0, false},
		{"0x", 0, 0, false},
		{"1_0", 0, 0, false},
		{"0x10/", 0, 0, false},
		{"", 0, 0, false},
	}
	for _, tt := range tests {
		mark, mask, err := ParseFwMark(tt.in)
		if (err == nil) != tt.ok || mark != tt.mark || mask != tt.mask {
			t.Errorf("ParseFwMark(%q) = %#x, %#x, %v; want %#x, %#x, ok %v", tt.in, mark, mask, err, tt.mark, tt.mask, tt.ok)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "nope.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) error = %v; want ErrNotExist", err)
	}
}

// TestPortForwardForms: "portForward: true" is short for {enabled: true};
// the long form carries the delivery.
func TestPortForwardForms(t *testing.T) {
	const base = "wireguard:\n  - name: wg-pia\n    pia:\n      region: auto\n      credentialsFile: /etc/x\n      portForward: "
	c, err := parseTest(t, base+"true\n")
	if err != nil || !c.WireGuard[0].PIA.PortForward.Enabled {
		t.Fatalf("short form: %+v, %v", c, err)
	}
	c, err = parseTest(t, base+"\n        enabled: true\n        onChange: [/usr/local/bin/qbt-set-port, --port]\n      dns: {for: [10.10.50.0/24]}\n"+
		"routing:\n  tables: [{id: 150, killSwitch: true, routes: [{to: default, dev: wg-pia}]}]\n  rules: [{priority: 1000, from: 10.10.50.0/24, table: 150}]\n")
	if err != nil {
		t.Fatal(err)
	}
	if pf := c.WireGuard[0].PIA.PortForward; !pf.Enabled || len(pf.OnChange) != 2 || c.WireGuard[0].PIA.DNS.For[0] != "10.10.50.0/24" {
		t.Errorf("long form: %+v", c.WireGuard[0].PIA)
	}
}

// TestSiblingPeersDirs: devices whose registers sit side by side in
// peers.d (what nodeagent import writes for several) are valid, and so is
// a name that only starts like another's directory.
func TestSiblingPeersDirs(t *testing.T) {
	src := "wireguard:\n  - {name: wg0, peersDir: /etc/nodeagent/peers.d/wg0}\n  - {name: wg1, peersDir: /etc/nodeagent/peers.d/wg1}\n  - {name: wg2, peersDir: /etc/nodeagent/peers.d/wg0-b}\n"
	_, err := ParseWith("nodeagent.yaml", []byte(src), Options{SkipFileChecks: true})
	if err != nil && strings.Contains(err.Error(), "register of its own") {
		t.Errorf("sibling peersDirs refused:\n%v", err)
	}
}
