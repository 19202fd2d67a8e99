package host_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/testenv"
)

// TestRouteList: the routes of a protocol in any table and every route of
// the tables asked for, each once, v4 and v6, tables above 255 included;
// nothing else.
func TestRouteList(t *testing.T) {
	ns := testenv.NewNetNS(t)
	for _, c := range [][]string{
		{"link", "add", "d0", "type", "veth", "peer", "name", "d1"},
		{"link", "set", "d0", "up"},
		{"route", "add", "10.1.0.0/24", "dev", "d0", "table", "150", "proto", "147"},
		{"route", "add", "10.2.0.0/24", "dev", "d0", "table", "150"},
		{"route", "add", "10.3.0.0/24", "dev", "d0", "proto", "147"},
		{"route", "add", "10.4.0.0/24", "dev", "d0"},
		{"route", "add", "10.5.0.0/24", "dev", "d0", "table", "1500"},
		{"route", "add", "10.6.0.0/24", "dev", "d0", "table", "160"},
		{"-6", "route", "add", "fd00:1::/64", "dev", "d0", "table", "150", "proto", "147"},
	} {
		ns.Exec(t, append([]string{"ip"}, c...)...)
	}
	rs, err := ns.Host.RouteList(147, []int{150, 1500})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rs {
		got = append(got, r.Dst.String())
	}
	slices.Sort(got)
	want := []string{"10.1.0.0/24", "10.2.0.0/24", "10.3.0.0/24", "10.5.0.0/24", "fd00:1::/64"}
	if !slices.Equal(got, want) {
		t.Errorf("routes %v; want %v", got, want)
	}
}

// TestRouteListFromAndExtra: RouteListAll reads what vishvananda/netlink
// does not: an IPv6 route's source prefix (RTA_SRC) and the route metrics
// and other attributes nodeagent's routes cannot say.
func TestRouteListFromAndExtra(t *testing.T) {
	ns := testenv.NewNetNS(t)
	for _, c := range [][]string{
		{"link", "add", "d0", "type", "veth", "peer", "name", "d1"},
		{"link", "set", "d0", "up"},
		{"-6", "addr", "add", "fd00:1::2/64", "dev", "d0", "nodad"},
		{"-6", "route", "add", "default", "from", "2001:db8:a::/48", "via", "fd00:1::1", "dev", "d0", "table", "100"},
		{"-6", "route", "add", "default", "via", "fd00:1::1", "dev", "d0", "table", "100"},
		{"route", "add", "10.7.0.0/16", "dev", "d0", "mtu", "1400", "advmss", "1300", "table", "100"},
		{"route", "add", "10.8.0.0/16", "dev", "d0", "realm", "5", "table", "100"},
	} {
		ns.Exec(t, append([]string{"ip"}, c...)...)
	}
	rs, err := ns.Host.RouteListAll()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range rs {
		if r.Table != 100 {
			continue
		}
		k := "default"
		if r.Dst != nil {
			k = r.Dst.String()
		}
		if r.From.IsValid() {
			k += " from " + r.From.String()
		}
		got[k] = strings.Join(r.Extra, ",")
	}
	want := map[string]string{"default from 2001:db8:a::/48": "", "default": "", "10.7.0.0/16": "advmss,mtu", "10.8.0.0/16": "realm"}
	if !maps.Equal(got, want) {
		t.Errorf("table 100 read as %v; want %v", got, want)
	}
}
