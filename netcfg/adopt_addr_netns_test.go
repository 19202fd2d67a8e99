package netcfg

import (
	"context"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/testenv"
)

// TestAdoptNeverDeletesAnAddress is NetworkManager's form taken over
// (issue 40): a link whose address NetworkManager made with noprefixroute
// (its own prefix route beside it, at a metric) and a route with that
// address as its src, adopted by a config marking the link adopt: true.
// Deleting the address to give it nodeagent's form would take the src
// route with it (the kernel drops the routes of an address it deletes),
// and nodeagent does not put back routes it does not own: so the address
// is never deleted. An IPv4 address whose flags the kernel cannot change
// in place is taken as it is (the plan says so); an IPv6 one is marked in
// place. `ip monitor` shows no Deleted line at all, and the routes are
// there after.
func TestAdoptNeverDeletesAnAddress(t *testing.T) {
	node, lan := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "trunk0", lan, "eth0")
	// A macvlan stands in for the VLAN (no 8021q on the host kernel).
	run(t, node, "ip link add link trunk0 name mv50 type macvlan mode bridge", "ip link set trunk0 up", "ip link set mv50 up",
		"ip addr add 10.10.50.1/24 dev mv50 noprefixroute",
		"ip route add 10.10.50.0/24 dev mv50 proto kernel scope link src 10.10.50.1 metric 400",
		"ip route add 10.20.0.0/16 via 10.10.50.254 dev mv50 src 10.10.50.1",
		"ip -6 addr add fd00:50::1/64 dev mv50 noprefixroute nodad")
	routesBefore := node.Exec(t, "ip", "route", "show")

	const yaml = `macvlans:
  - {name: mv50, parent: trunk0, mode: bridge, addresses: [10.10.50.1/24, "fd00:50::1/64"], adopt: true}
dad: {disabled: true}
`
	d := desiredOf(t, node, yaml)
	cv := &Converger{Host: node.Host}
	ctx := context.Background()
	p, err := cv.Plan(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plan:\n%s", p)
	plan := p.Link.String()
	if !strings.Contains(plan, "10.10.50.1/24 (noprefixroute: the kernel cannot change an IPv4 address's flags in place)") {
		t.Errorf("the plan does not say the IPv4 address is kept as it is:\n%s", plan)
	}
	if !strings.Contains(plan, "~ adopt address fd00:50::1/64 on mv50 (mark as nodeagent's in place") {
		t.Errorf("the plan does not mark the IPv6 address in place:\n%s", plan)
	}
	if !p.Link.Report().OnlyAdoptions() {
		t.Errorf("the plan is not only adoptions:\n%s", plan)
	}

	node.WaitDAD(t)
	mon := startIPMonitor(t, node, "address", "route")
	if r, err := cv.Sync(ctx, d); err != nil {
		t.Fatalf("sync: %v\n%s", err, r)
	}
	lines := mon.stop(t)
	t.Logf("ip monitor address route during the sync (%d lines):\n%s", len(lines), strings.Join(lines, "\n"))
	for _, l := range lines {
		if strings.HasPrefix(l, "Deleted") {
			t.Errorf("deleted during the adoption: %s", l)
		}
	}
	if got := node.Exec(t, "ip", "route", "show"); got != routesBefore {
		t.Errorf("the main table changed:\nbefore:\n%safter:\n%s", routesBefore, got)
	}
	v4 := node.Exec(t, "ip", "-4", "addr", "show", "dev", "mv50")
	v6 := node.Exec(t, "ip", "-6", "addr", "show", "dev", "mv50")
	t.Logf("after:\n%s%s", v4, v6)
	if !strings.Contains(v4, "10.10.50.1/24") || !strings.Contains(v4, "noprefixroute") {
		t.Errorf("the IPv4 address is not there as it was:\n%s", v4)
	}
	// iproute2 6.1 does not print IFA_PROTO: read it.
	addrs, err := node.Host.AddrList()
	if err != nil {
		t.Fatal(err)
	}
	marked := map[string]bool{}
	for _, a := range addrs {
		marked[a.Prefix.String()] = a.Owned()
	}
	if !strings.Contains(v6, "fd00:50::1/64") || strings.Contains(v6, "noprefixroute") || !marked["fd00:50::1/64"] {
		t.Errorf("the IPv6 address is not there in nodeagent's form, marked (%v):\n%s", marked, v6)
	}
	if marked["10.10.50.1/24"] {
		t.Errorf("the IPv4 address was marked, which a replace cannot do without changing its flags")
	}
	if p, err := cv.Plan(ctx, d); err != nil || !p.Empty() {
		t.Errorf("plan after the adoption is not empty (%v):\n%s", err, p)
	}
}
