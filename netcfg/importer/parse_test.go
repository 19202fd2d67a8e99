package importer

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseHook(t *testing.T) {
	for _, c := range []struct {
		line string
		want hookResult
	}{
		{"iptables -t nat -A POSTROUTING -s 10.90.0.0/24 -o enp1s0 -j MASQUERADE",
			hookResult{masq: []masquerade{{"10.90.0.0/24", "enp1s0"}}}},
		{"/usr/sbin/iptables -w -o enp1s0 -j MASQUERADE -t nat -I POSTROUTING 1 --source 10.90.0.0/24",
			hookResult{masq: []masquerade{{"10.90.0.0/24", "enp1s0"}}}},
		{"iptables -t nat -D POSTROUTING -s 10.90.0.0/24 -o enp1s0 -j MASQUERADE", hookResult{}},
		{"iptables -A FORWARD -i wg0 -o enp1s0 -j ACCEPT; iptables -A FORWARD -o wg0 -j ACCEPT",
			hookResult{forward: []forward{{"wg0", "enp1s0"}}, other: []string{"iptables -A FORWARD -o wg0 -j ACCEPT"}}},
		{"iptables -t nat -A POSTROUTING -s 10.90.0.0/24 ! -o wg0 -j MASQUERADE",
			hookResult{other: []string{"iptables -t nat -A POSTROUTING -s 10.90.0.0/24 ! -o wg0 -j MASQUERADE"}}},
		{"iptables -t nat -A POSTROUTING -o enp1s0 -j MASQUERADE",
			hookResult{other: []string{"iptables -t nat -A POSTROUTING -o enp1s0 -j MASQUERADE"}}},
		{`nft add rule ip nat postrouting ip saddr 10.90.0.0/24 oifname "enp1s0" masquerade`,
			hookResult{masq: []masquerade{{"10.90.0.0/24", "enp1s0"}}}},
		{"nft add rule inet filter forward iifname wg0 oifname enp1s0 counter accept",
			hookResult{forward: []forward{{"wg0", "enp1s0"}}}},
		{"sysctl -w net.ipv4.ip_forward=1 && sysctl -q net.ipv6.conf.all.forwarding=1",
			hookResult{sysctls: [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv6.conf.all.forwarding", "1"}}}},
		{"sysctl -w net/ipv4/conf/enp1s0.50/rp_filter=2",
			hookResult{sysctls: [][2]string{{"net.ipv4.conf.enp1s0/50.rp_filter", "2"}}}},
		{"echo 1 > /proc/sys/net/ipv4/ip_forward",
			hookResult{sysctls: [][2]string{{"net.ipv4.ip_forward", "1"}}}},
		{"echo 2 > /proc/sys/net/ipv4/conf/enp1s0.50/rp_filter",
			hookResult{sysctls: [][2]string{{"net.ipv4.conf.enp1s0/50.rp_filter", "2"}}}},
		{"sysctl -w kernel.panic=10", hookResult{other: []string{"sysctl -w kernel.panic=10"}}},
		{"ip route add 10.0.0.0/8 dev wg0", hookResult{other: []string{"ip route add 10.0.0.0/8 dev wg0"}}},
	} {
		got := parseHook(c.line)
		if diff := cmp.Diff(c.want, got, cmp.AllowUnexported(hookResult{}, masquerade{}, forward{})); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.line, diff)
		}
	}
}

func TestRedact(t *testing.T) {
	line := "wg set wg0 peer xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg= preshared-key <(echo 'n/NJ6J8swrn3WtRtb+7PVeyl3l7A3JaoggjZv6DluAM=')"
	got := redact(line)
	if strings.Contains(got, "xTIBA5") || strings.Contains(got, "n/NJ6") {
		t.Errorf("a key survived: %s", got)
	}
	if want := "wg set wg0 peer (key) preshared-key <(echo '(key)')"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// Keys glued to other text are keys too.
	k := "n/NJ6J8swrn3WtRtb+7PVeyl3l7A3JaoggjZv6DluAM="
	for _, line := range []string{"PSK=" + k + "; wg set %i peer P preshared-key <(echo $PSK)", "echo " + k + "|wg pubkey", "echo " + k + ">/run/k", "key=" + k} {
		if got := redact(line); strings.Contains(got, "n/NJ6J8") || !strings.Contains(got, "(key)") {
			t.Errorf("redact(%q) = %q", line, got)
		}
	}
}

func TestIPLinkAdds(t *testing.T) {
	for _, c := range []struct {
		cmd  string
		want []string
	}{
		{"/usr/sbin/ip link add link enp1s0 name enp1s0.50 type vlan id 50", []string{"enp1s0.50"}},
		{"/sbin/ip link add shim50 link enp1s0.50 type macvlan mode bridge", []string{"shim50"}},
		{"-/bin/ip -4 link add dev vl60 link enp1s0 type vlan id 60", []string{"vl60"}},
		{`/bin/sh -c 'ip link add a1 type dummy; ip link set a1 up && ip link add link a1 name a2 type macvlan'`, []string{"a1", "a2"}},
		{"ip link set enp1s0 up", nil},
		{"ip addr add 10.0.0.1/24 dev x", nil},
	} {
		if diff := cmp.Diff(c.want, ipLinkAdds(c.cmd)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", c.cmd, diff)
		}
	}
}

func TestParseWGQuick(t *testing.T) {
	w := ParseWGQuick("wg0", []byte(`# comment at the top
[Interface]
privatekey = kiqhO9HXRnqm4eSI6Icv+qbnnfGAUvevh3txSPGsohI=
Address = 10.90.0.1/24,fd00:90::1/64
Address = 10.90.1.1/24 # the second subnet
Table = vpn
PostUp = iptables -A FORWARD -i %i -j ACCEPT # a shell comment stays
mystery = 1

## Alice
[Peer]
PublicKey = 5RC/XR+nUsU+g0VRAVqGqE2OZGMvrxzhCF3foL+uj9o=
AllowedIPs = 10.90.0.2/32
AllowedIPs = fd00:90::2/128
PersistentKeepalive = off

[Peer]
PublicKey = HxAmFx7OUQAOaEZZM90xradjdZl5yluWiXTJ3E58EQI=
garbage line
`))
	want := WGQuickFile{
		Name:       "wg0",
		PrivateKey: "kiqhO9HXRnqm4eSI6Icv+qbnnfGAUvevh3txSPGsohI=",
		Addresses:  []string{"10.90.0.1/24", "fd00:90::1/64", "10.90.1.1/24"},
		Table:      "vpn",
		Hooks:      []Hook{{When: "PostUp", Command: "iptables -A FORWARD -i %i -j ACCEPT # a shell comment stays"}},
		Peers: []WGPeer{
			{NameHint: "Alice", PublicKey: "5RC/XR+nUsU+g0VRAVqGqE2OZGMvrxzhCF3foL+uj9o=", AllowedIPs: []string{"10.90.0.2/32", "fd00:90::2/128"}},
			{PublicKey: "HxAmFx7OUQAOaEZZM90xradjdZl5yluWiXTJ3E58EQI="},
		},
		Problems: []string{"line 8: unknown key in [Interface]", "line 19: not Key = Value (the line is not shown)"},
	}
	if diff := cmp.Diff(want, w); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestParseWGQuickLineBreaks: a carriage return or a Unicode line
// separator inside a value never reaches the output, where it would end
// a comment line and start config.
func TestParseWGQuickLineBreaks(t *testing.T) {
	w := ParseWGQuick("wg0", []byte("[Interface]\r\nPostUp = logger up\rvlans: []\r\nDNS = 10.0.0.1\u2028firewall: {}\n"))
	for _, v := range append([]string{w.Hooks[0].Command}, w.DNS...) {
		if strings.ContainsAny(v, "\r\n\u2028\u2029") {
			t.Errorf("a line break survived: %q", v)
		}
	}
	if len(w.Hooks) != 1 || w.Hooks[0].Command != "logger up vlans: []" {
		t.Errorf("hooks %q", w.Hooks)
	}
}

func TestBuildOnlyUnknown(t *testing.T) {
	s := Snapshot{Links: []Link{{Name: "enp1s0"}, {Name: "enp1s0.50", Kind: "vlan", Parent: "enp1s0", VLANID: 50}}}
	_, err := Build(s, Options{Only: []string{"enp1s0.5"}})
	if err == nil || !strings.Contains(err.Error(), `did you mean "enp1s0.50"?`) {
		t.Errorf("err = %v", err)
	}
	if _, err := Build(s, Options{Root: "etc/nodeagent"}); err == nil {
		t.Error("a relative root was taken")
	}
}

// TestBuildOddKernel: what the kernel may hold but the config cannot (two
// tables of one name in rt_tables, two routes to one prefix at one metric)
// still gives a config that validates, with comments. eth0 is no link
// the import takes, so its policy routing is named with --only.
func TestBuildOddKernel(t *testing.T) {
	s := Snapshot{
		Links:      []Link{{Name: "eth0", MTU: 1500, Up: true}},
		TableNames: map[int]string{100: "vpn", 101: "vpn"},
		Rules: []Rule{{Priority: 10, Family: "inet", From: "10.0.0.0/8", Table: 101, Action: "table"},
			{Priority: 1000, Family: "inet", Action: "table"},
			{Priority: 2000, Family: "inet", Table: 101, Action: "table", Extra: []string{"uidrange"}}},
		Routes: []Route{
			{Table: 100, To: "0.0.0.0/0", Via: "192.0.2.1", Dev: "eth0", Scope: "global", Type: "unicast", Protocol: 4},
			{Table: 100, To: "0.0.0.0/0", Via: "192.0.2.2", Dev: "eth0", Scope: "global", Type: "unicast", Protocol: 4},
			{Table: 100, To: "10.0.0.0/8", Dev: "eth0", Scope: "link", Type: "unicast", Protocol: 4, Extra: []string{"mtu"}},
		},
	}
	r, err := Build(s, Options{Only: []string{"100", "rules"}})
	if err != nil {
		t.Fatalf("%v\n%s", err, r.Config)
	}
	for _, want := range []string{"- id: 100\n", "- id: 101\n", "table: 101", "# not imported: default via 192.0.2.2 dev eth0 proto static; the table has a route",
		"# not imported: rule 1000: from all lookup 0; a rule that names no table",
		// Without its uidrange the rule would match every user's traffic.
		"# not imported: rule 2000: from all lookup 101; it also matches on uidrange, which nodeagent's rules cannot",
		// Adopting it would drop its mtu.
		"# not imported: 10.0.0.0/8 dev eth0 proto static; it has mtu, which nodeagent's routes do not"} {
		if !strings.Contains(string(r.Config), want) {
			t.Errorf("config lacks %q:\n%s", want, r.Config)
		}
	}
	if strings.Contains(string(r.Config), "name: vpn") {
		t.Errorf("a name two tables share was given to one:\n%s", r.Config)
	}
}

// TestBuildUserspace: a tun link that wgctrl read as a WireGuard device
// (wireguard-go's) is imported and adopted, with a comment; a tun that is
// not WireGuard is left alone.
func TestBuildUserspace(t *testing.T) {
	s := Snapshot{
		Links: []Link{{Name: "wg0", Kind: "tun", MTU: 1420, Up: true, Addresses: []Addr{{Prefix: "10.90.0.1/24", Scope: "global"}}},
			{Name: "tun9", Kind: "tun", MTU: 1500}},
		WireGuard: []WGDevice{{Name: "wg0", PrivateKey: "kiqhO9HXRnqm4eSI6Icv+qbnnfGAUvevh3txSPGsohI=", ListenPort: 51820}},
	}
	r, err := Build(s, Options{Only: []string{"wg0"}})
	if err != nil {
		t.Fatalf("%v\n%s", err, r.Config)
	}
	for _, want := range []string{"- name: wg0\n", "# wg0 is a userspace device", "listenPort: 51820", "addresses: [10.90.0.1/24]", "adopt: true"} {
		if !strings.Contains(string(r.Config), want) {
			t.Errorf("config lacks %q:\n%s", want, r.Config)
		}
	}
	if strings.Contains(string(r.Config), "tun9") {
		t.Errorf("tun9 was imported:\n%s", r.Config)
	}
}

// TestTableNameOwner: a table's name is the config's when nodeagent's own
// rt_tables.d entry gives it (a node nodeagent already runs), and is left
// in the file that gives it otherwise: naming it again would be a write
// on the first plan, not an adoption.
func TestTableNameOwner(t *testing.T) {
	for _, c := range []struct {
		file, want string
	}{
		{ownNamesFile, "      name: vpn\n"},
		{"/etc/iproute2/rt_tables.d/old.conf", "      # /etc/iproute2/rt_tables.d/old.conf names it vpn and stays as it is"},
	} {
		s := Snapshot{
			Links:          []Link{{Name: "eth0", MTU: 1500, Up: true}},
			TableNames:     map[int]string{150: "vpn"},
			TableNameFiles: map[int]string{150: c.file},
			Routes:         []Route{{Table: 150, To: "0.0.0.0/0", Via: "192.0.2.1", Dev: "eth0", Scope: "global", Type: "unicast", Protocol: 4}},
		}
		// eth0 is not imported: --only names the table.
		r, err := Build(s, Options{Only: []string{"vpn"}})
		if err != nil {
			t.Fatalf("%v\n%s", err, r.Config)
		}
		if !strings.Contains(string(r.Config), c.want) {
			t.Errorf("names from %s: config lacks %q:\n%s", c.file, c.want, r.Config)
		}
	}
}
