package netcfg

import (
	"context"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/testenv"
)

// TestSourceRoutesNeverClobbered: an IPv6 source-specific route (`default
// from 2001:db8:a::/48 via ... table 100`, RTA_SRC, which
// vishvananda/netlink v1.3.1 does not read) is another route than one
// without a from. A config with a default route of its own in that table
// adds it beside the from-route, never replaces it, and deletes only its
// own when the config drops it; the from-route stays byte for byte. A
// route adopt: true names whose kernel copy has a route metric (mtu) is
// not adopted (the replace would drop the mtu): the plan says why.
func TestSourceRoutesNeverClobbered(t *testing.T) {
	node, wan := testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "up0", wan, "eth0")
	run(t, node, "ip link set up0 up", "ip addr add 192.0.2.2/24 dev up0",
		"ip -6 addr add fd00:1::2/64 dev up0 nodad",
		"ip -6 route add default from 2001:db8:a::/48 via fd00:1::1 dev up0 table 100",
		"ip -6 route add 2001:db8:b::/48 via fd00:1::1 dev up0 table 100",
		"ip route add 10.30.0.0/16 via 192.0.2.1 dev up0 mtu 1400 table 100")
	show := func() (string, string) {
		return node.Exec(t, "ip", "-6", "route", "show", "table", "100"), node.Exec(t, "ip", "-4", "route", "show", "table", "100")
	}
	fromRoute := func(s string) string {
		for _, l := range strings.Split(s, "\n") {
			if strings.Contains(l, "from 2001:db8:a::/48") {
				return l
			}
		}
		return ""
	}
	v6before, v4before := show()
	t.Logf("table 100 before:\n%s%s", v6before, v4before)
	from := fromRoute(v6before)
	if from == "" {
		t.Fatalf("no from-route made:\n%s", v6before)
	}

	converge := func(yaml string) Plans {
		t.Helper()
		d := desiredOf(t, node, yaml)
		cv := &Converger{Host: node.Host}
		p, err := cv.Plan(context.Background(), d)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("plan:\n%s", p)
		if r, err := cv.Sync(context.Background(), d); err != nil && !strings.Contains(err.Error(), "mtu") {
			t.Fatalf("sync: %v\n%s", err, r)
		}
		return p
	}
	p := converge(`routing:
  tables:
    - id: 100
      routes:
        - {to: "::/0", via: "fd00:1::1", dev: up0}
        - {to: "2001:db8:b::/48", via: "fd00:1::1", dev: up0, adopt: true}
        - {to: 10.30.0.0/16, via: 192.0.2.1, dev: up0, adopt: true}
`)
	plan := p.Route.String()
	for _, want := range []string{
		"+ route default ::/0 via fd00:1::1 dev up0 table 100 metric 1024",
		"~ route 2001:db8:b::/48 via fd00:1::1 dev up0 table 100 metric 1024 adopt (mark as nodeagent's)",
		"also has mtu, which adopting it (a replace with nodeagent's fields) would drop; left untouched",
	} {
		if !strings.Contains(plan, want) {
			t.Errorf("the plan lacks %q", want)
		}
	}
	v6, v4 := show()
	t.Logf("table 100 after the sync:\n%s%s", v6, v4)
	if got := fromRoute(v6); got != from {
		t.Errorf("the from-route changed: %q, was %q", got, from)
	}
	if !strings.Contains(v6, "default via fd00:1::1 dev up0 proto") || !strings.Contains(v4, "mtu 1400") {
		t.Errorf("nodeagent's default is not beside the from-route, or the mtu route changed:\n%s%s", v6, v4)
	}

	converge(`routing:
  tables:
    - id: 100
      routes:
        - {to: "2001:db8:b::/48", via: "fd00:1::1", dev: up0, adopt: true}
`)
	v6, _ = show()
	t.Logf("table 100 after the config dropped the default:\n%s", v6)
	if got := fromRoute(v6); got != from {
		t.Errorf("the from-route is gone or changed when nodeagent deleted its own default: %q, was %q", got, from)
	}
	if strings.Contains(v6, "default via") {
		t.Errorf("nodeagent's default is still there:\n%s", v6)
	}
}
