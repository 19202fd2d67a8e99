package release

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// TestParseUnit: the ip commands of a unit's Exec lines, as the seeds'
// old setup writes them (the package test's vlan50.service among them),
// give what `ip ... add` would fail on while it exists; replace, another
// namespace's commands and non-Exec lines give nothing.
func TestParseUnit(t *testing.T) {
	unit := `[Unit]
Description=VLAN 50 on the trunk (the old way)
# ExecStart=/sbin/ip link add commented name out0 type dummy
[Service]
Type=oneshot
ExecStart=/sbin/ip link add link enp7s0 name enp7s0.50 type vlan id 50
ExecStart=/sbin/ip addr add 10.10.50.1/24 dev enp7s0.50 noprefixroute
ExecStart=/sbin/ip -6 addr add fd50::1/64 dev enp7s0.50 nodad
ExecStart=/sbin/ip route add 10.20.0.0/16 via 10.10.50.254 dev enp7s0.50 src 10.10.50.1
ExecStart=/sbin/ip -6 route add 2001:db8:b::/48 via fd50::fe dev enp7s0.50 table 100
ExecStart=/sbin/ip rule add from 10.10.50.0/24 table 150 priority 1000
ExecStart=/sbin/ip route add default via 192.0.2.1 dev up0 table vlan50-egress
ExecStart=-/sbin/ip route add unreachable default metric 4000 table 150
ExecStartPost=/bin/sh -c 'ip link add shim50 link enp7s0.50 type macvlan mode bridge && ip r a 10.30.0.0/16 dev shim50; ip ru add pref 1001 to 10.40.0.0/16 lookup 151'
ExecStart=/sbin/ip route replace 10.50.0.0/16 dev up0
ExecStart=/sbin/ip -n wan link add wg9 type wireguard
ExecStart=/sbin/ip -6 rule add from 2001:db8:a::/48 table 100
ExecStop=/sbin/ip link del enp7s0.50
`
	got := parseUnit(unit, map[string]int{"vlan50-egress": 150})
	v4 := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	want := unitMakes{
		Links: []string{"enp7s0.50", "shim50"},
		Routes: []routeKey{
			{Table: unix.RT_TABLE_MAIN, To: v4("10.20.0.0/16")},
			{Table: 100, To: v4("2001:db8:b::/48"), Metric: 1024},
			{Table: 150, To: v4("0.0.0.0/0")},
			{Table: 150, To: v4("0.0.0.0/0"), Metric: 4000},
			{Table: unix.RT_TABLE_MAIN, To: v4("10.30.0.0/16")},
		},
		Rules: []ruleKey{
			{Family: unix.AF_INET, Priority: 1000, From: v4("10.10.50.0/24"), Table: 150},
			{Family: unix.AF_INET, Priority: 1001, To: v4("10.40.0.0/16"), Table: 151},
			{Family: unix.AF_INET6, Priority: -1, From: v4("2001:db8:a::/48"), Table: 100},
		},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("parseUnit (-want +got):\n%s", diff)
	}
}

// TestParseRouteEdges: destinations without a prefix length are host
// routes, an unknown table name matches no table, and a malformed metric
// is no route.
func TestParseRouteEdges(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want routeKey
		ok   bool
	}{
		{[]string{"192.0.2.7", "dev", "up0"}, routeKey{Table: 254, To: netip.MustParsePrefix("192.0.2.7/32")}, true},
		{[]string{"default", "via", "192.0.2.1", "table", "nosuch"}, routeKey{Table: -2, To: netip.MustParsePrefix("0.0.0.0/0")}, true},
		{[]string{"blackhole", "10.0.0.0/8", "metric", "x"}, routeKey{}, false},
		{[]string{"via", "inet6", "fe80::1", "dev", "x"}, routeKey{}, false},
	} {
		got, ok := parseRoute(tc.args, 0, nil)
		if ok != tc.ok || ok && got != tc.want {
			t.Errorf("parseRoute(%q) = %+v, %v; want %+v, %v", tc.args, got, ok, tc.want, tc.ok)
		}
	}
}
