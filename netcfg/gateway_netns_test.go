package netcfg

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/testenv"
)

// converge parses yaml as nodeagent.yaml and syncs ns to it once.
func converge(t *testing.T, ns *testenv.NetNS, yaml string) (Plans, error) {
	t.Helper()
	cv := &Converger{Host: ns.Host}
	return cv.Sync(context.Background(), desiredOf(t, ns, yaml))
}

// desiredOf parses yaml as nodeagent.yaml (no file checks) and derives
// the desired state for ns.
func desiredOf(t *testing.T, ns *testenv.NetNS, yaml string) Desired {
	t.Helper()
	c, err := config.ParseWith("nodeagent.yaml", []byte(yaml), config.Options{SkipFileChecks: true})
	if err != nil {
		t.Fatalf("config:\n%v", err)
	}
	d, err := FromConfig(c, tablesFile(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// tablesFile is where a test's rt_tables.d entry goes: one per namespace,
// the same across syncs, never the host's /etc.
func tablesFile(t *testing.T, ns *testenv.NetNS) string {
	dir := filepath.Join(os.TempDir(), ns.Name+"-rt_tables.d")
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "nodeagent.conf")
}

func mustConverge(t *testing.T, ns *testenv.NetNS, yaml string) Plans {
	t.Helper()
	p, err := converge(t, ns, yaml)
	if _, skipped, failed := Split(err); len(failed)+len(skipped) > 0 {
		t.Fatalf("sync:\n%s\nerror: %v", p, err)
	}
	return p
}

// run runs an `ip`-style setup line in ns, e.g. "ip addr add ...".
func run(t *testing.T, ns *testenv.NetNS, lines ...string) {
	t.Helper()
	for _, l := range lines {
		ns.Exec(t, strings.Fields(l)...)
	}
}

// countFrom installs an nft counter at the earliest hook of ns for packets
// whose source is in the given prefixes, and returns a func reading it.
func countFrom(t *testing.T, ns *testenv.NetNS, v4, v6 string) func() int {
	t.Helper()
	run(t, ns, "nft add table inet count",
		"nft add chain inet count pre { type filter hook prerouting priority -400 ; }",
		"nft add rule inet count pre ip saddr "+v4+" counter",
		"nft add rule inet count pre ip6 saddr "+v6+" counter")
	re := regexp.MustCompile(`packets (\d+)`)
	return func() int {
		total := 0
		for _, m := range re.FindAllStringSubmatch(ns.Exec(t, "nft", "list", "chain", "inet", "count", "pre"), -1) {
			n, _ := strconv.Atoi(m[1])
			total += n
		}
		return total
	}
}

// ping sends a few echo requests and ignores whether replies come: the
// far side's counters are what the tests assert.
func ping(ns *testenv.NetNS, args ...string) {
	ns.TryExec(append([]string{"ping", "-c", "3", "-i", "0.2", "-W", "1"}, args...)...)
}

const gatewayConfig = `
sysctls:
  net.ipv4.ip_forward: "1"
  net.ipv6.conf.all.forwarding: "1"
routing:
  tables:
    - id: 150
      name: vlan50-egress
      killSwitch: true
      routes:
        - {to: default, via: 10.99.0.2, dev: tun0}
        - {to: "::/0", via: "fd00:99::2", dev: tun0}
        - {to: 10.10.50.0/24, dev: vlan50}
        - {to: "fd00:50::/64", dev: vlan50}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
    - {priority: 1001, from: "fd00:50::/64", table: 150}
`

// gatewayLab builds the PIA gateway scenario: lan clients behind vlan50 on
// node, whose main default goes to wan and whose tunnel (a veth standing in
// for wg-pia) goes to tun. Both wan and tun own the destination address.
func gatewayLab(t *testing.T) (lan, node, wan, tun *testenv.NetNS) {
	lan, node, wan, tun = testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "vlan50", lan, "eth0")
	node.Veth(t, "uplink", wan, "eth0")
	node.Veth(t, "tun0", tun, "eth0")
	run(t, lan, "ip addr add 10.10.50.20/24 dev eth0", "ip addr add fd00:50::20/64 dev eth0 nodad",
		"ip route add default via 10.10.50.1", "ip -6 route add default via fd00:50::1")
	run(t, node, "ip addr add 10.10.50.1/24 dev vlan50", "ip addr add fd00:50::1/64 dev vlan50 nodad",
		"ip addr add 192.0.2.1/24 dev uplink", "ip addr add 2001:db8:1::1/64 dev uplink nodad",
		"ip route add default via 192.0.2.2", "ip -6 route add default via 2001:db8:1::2")
	addTunnel(t, node, tun)
	for _, far := range []*testenv.NetNS{wan, tun} {
		run(t, far, "ip addr add 198.51.100.10/32 dev lo", "ip addr add 2001:db8:2::10/128 dev lo")
	}
	run(t, wan, "ip addr add 192.0.2.2/24 dev eth0", "ip addr add 2001:db8:1::2/64 dev eth0 nodad",
		"ip route add 10.10.50.0/24 via 192.0.2.1", "ip -6 route add fd00:50::/64 via 2001:db8:1::1")
	return
}

func addTunnel(t *testing.T, node, tun *testenv.NetNS) {
	run(t, node, "ip addr add 10.99.0.1/30 dev tun0", "ip addr add fd00:99::1/64 dev tun0 nodad")
	run(t, tun, "ip addr add 10.99.0.2/30 dev eth0", "ip addr add fd00:99::2/64 dev eth0 nodad",
		"ip route add 10.10.50.0/24 via 10.99.0.1", "ip -6 route add fd00:50::/64 via fd00:99::1")
}

func TestGatewayEgressThroughTunnelFailsClosed(t *testing.T) {
	lan, node, wan, tun := gatewayLab(t)
	atWan := countFrom(t, wan, "10.10.50.0/24", "fd00:50::/64")
	atTun := countFrom(t, tun, "10.10.50.0/24", "fd00:50::/64")
	mustConverge(t, node, gatewayConfig)
	for _, ns := range []*testenv.NetNS{lan, node, tun} {
		ns.WaitDAD(t) // IPv6 neighbours answer once link-local DAD is done
	}

	// 1. VLAN traffic leaves through the tunnel; the node's own traffic
	// still uses the main table.
	ping(lan, "198.51.100.10")
	ping(lan, "2001:db8:2::10")
	if got := atTun(); got < 6 {
		t.Fatalf("%d packets from lan reached tun, want >= 6", got)
	}
	if got := atWan(); got != 0 {
		t.Fatalf("%d packets from lan leaked to wan", got)
	}
	if out := node.Exec(t, "ip", "route", "get", "198.51.100.10"); !strings.Contains(out, "via 192.0.2.2 dev uplink") {
		t.Fatalf("node's own traffic does not use the main table: %s", out)
	}
	if _, err := node.TryExec("ping", "-c", "1", "-W", "2", "198.51.100.10"); err != nil {
		t.Fatalf("node cannot reach wan through main: %v", err)
	}

	// 5. A second sync writes nothing.
	mon := node.NewMonitor(t)
	before := node.Host.Writes()
	if p := mustConverge(t, node, gatewayConfig); !p.Empty() {
		t.Fatalf("second sync planned:\n%s", p)
	}
	if n, msgs := mon.Stop(); n != 0 || node.Host.Writes() != before {
		t.Fatalf("second sync: %d writes, %d notifications %v", node.Host.Writes()-before, n, msgs)
	}

	// 2. The tunnel device disappears: the table is unreachable at once,
	// without a sync, and nothing leaks to wan, v4 or v6.
	run(t, node, "ip link del tun0")
	for _, get := range [][]string{
		{"ip", "route", "get", "198.51.100.10", "from", "10.10.50.20", "iif", "vlan50"},
		{"ip", "-6", "route", "get", "2001:db8:2::10", "from", "fd00:50::20", "iif", "vlan50"},
	} {
		out, _ := node.TryExec(get...)
		// The kernel answers an unreachable route with EHOSTUNREACH (v4) or
		// ENETUNREACH (v6), or prints the route as unreachable.
		if !strings.Contains(out, "unreachable") && !strings.Contains(out, "No route to host") && !strings.Contains(out, "Network is unreachable") {
			t.Fatalf("%s: %s", strings.Join(get, " "), out)
		}
	}
	ping(lan, "198.51.100.10")
	ping(lan, "2001:db8:2::10")
	// A sync while the tunnel is gone reports the tunnel routes as pending
	// and fails nothing; the kill switch stays.
	p, err := converge(t, node, gatewayConfig)
	pending, skipped, failed := Split(err)
	if len(failed) > 0 || len(skipped) > 0 || len(pending) != 2 || !strings.Contains(p.String(), "pending: device tun0 does not exist yet") {
		t.Fatalf("sync without tunnel: pending %v, failed %v\n%s", pending, failed, p)
	}
	ping(lan, "198.51.100.10")
	if got := atWan(); got != 0 {
		t.Fatalf("%d packets from lan leaked to wan with the tunnel gone", got)
	}

	// The tunnel comes back: the next sync restores the path.
	tunNS := testenv.NewNetNS(t)
	node.Veth(t, "tun0", tunNS, "eth0")
	addTunnel(t, node, tunNS)
	run(t, tunNS, "ip addr add 198.51.100.10/32 dev lo")
	atTun2 := countFrom(t, tunNS, "10.10.50.0/24", "fd00:50::/64")
	mustConverge(t, node, gatewayConfig)
	ping(lan, "198.51.100.10")
	if got := atTun2(); got < 3 {
		t.Fatalf("%d packets reached the new tunnel after the sync, want >= 3", got)
	}
	if got := atWan(); got != 0 {
		t.Fatalf("%d packets leaked to wan", got)
	}
}

// foreignState is `ip rule` and every route of every table, without
// nodeagent's own (proto 147) lines.
func foreignState(t *testing.T, ns *testenv.NetNS) string {
	t.Helper()
	var keep []string
	for _, cmd := range [][]string{
		{"ip", "-d", "-4", "rule", "show"}, {"ip", "-d", "-6", "rule", "show"},
		{"ip", "-4", "route", "show", "table", "all"}, {"ip", "-6", "route", "show", "table", "all"},
	} {
		for _, l := range strings.Split(ns.Exec(t, cmd...), "\n") {
			// proto kernel routes are the kernel's own, derived from addresses
			// and forwarding (IPv6 subnet-router anycast appears when
			// forwarding is turned on); they are nobody's configuration.
			if l != "" && !strings.Contains(l, "proto 147") && !strings.Contains(l, "proto kernel") {
				keep = append(keep, l)
			}
		}
	}
	return strings.Join(keep, "\n")
}

func TestForeignRulesAndRoutesUntouched(t *testing.T) {
	_, node, _, _ := gatewayLab(t)
	run(t, node,
		"ip rule add priority 1000 from 10.20.0.0/16 lookup 200 proto static", // a priority nodeagent uses too
		"ip rule add priority 900 fwmark 0x10 lookup 201",
		"ip -6 rule add priority 1001 from fd00:60::/64 lookup 200 proto static",
		"ip route add 203.0.113.0/24 via 192.0.2.2 proto static",
		"ip route add 10.10.60.0/24 dev vlan50 table 150 proto static", // inside nodeagent's table
		"ip route add default via 192.0.2.2 table 200 proto static",
		"ip -6 route add 2001:db8:9::/64 via 2001:db8:1::2 table 150 proto static")
	before := foreignState(t, node)
	check := func(stage string) {
		t.Helper()
		if diff := cmp.Diff(before, foreignState(t, node)); diff != "" {
			t.Fatalf("%s changed foreign rules or routes (-before +after):\n%s", stage, diff)
		}
	}
	mustConverge(t, node, gatewayConfig)
	check("apply")
	changed := strings.Replace(gatewayConfig, "priority: 1000", "priority: 1002", 1)
	changed = strings.Replace(changed, "{to: 10.10.50.0/24, dev: vlan50}", "{to: 10.10.50.0/24, dev: vlan50, metric: 10}", 1)
	mustConverge(t, node, changed)
	check("config change")
	if out := node.Exec(t, "ip", "rule", "show", "priority", "1000"); strings.Contains(out, "lookup 150") {
		t.Fatalf("old rule left behind:\n%s", out)
	}
	cv := &Converger{Host: node.Host}
	if _, err := cv.Teardown(context.Background(), tablesFile(t, node), nil); err != nil {
		t.Fatal(err)
	}
	check("teardown")
	if out := node.Exec(t, "ip", "route", "show", "table", "all", "proto", "147"); out != "" {
		t.Fatalf("teardown left nodeagent routes:\n%s", out)
	}
	if out := node.Exec(t, "ip", "-d", "rule", "show"); strings.Contains(out, "proto 147") {
		t.Fatalf("teardown left nodeagent rules:\n%s", out)
	}
}

func TestReturnPathOnNonGatewayNode(t *testing.T) {
	gw, node, wan := testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "vlan50", gw, "eth0")
	node.Veth(t, "uplink", wan, "eth0")
	run(t, node, "ip addr add 10.10.50.5/24 dev vlan50", "ip addr add 192.0.2.5/24 dev uplink", "ip route add default via 192.0.2.6")
	run(t, wan, "ip addr add 192.0.2.6/24 dev eth0")
	// gw is the PIA gateway; 203.0.113.7 is a remote client reaching the
	// node through it (a forwarded port).
	run(t, gw, "ip addr add 10.10.50.1/24 dev eth0", "ip addr add 203.0.113.7/32 dev lo")
	atWan := countFrom(t, wan, "10.10.50.0/24", "fd00:50::/64")
	if _, err := gw.TryExec("ping", "-c", "1", "-W", "1", "-I", "203.0.113.7", "10.10.50.5"); err == nil {
		t.Fatal("reply found its way back before the return path was configured: the lab proves nothing")
	}
	mustConverge(t, node, `
routing:
  tables:
    - id: 150
      routes: [{to: default, via: 10.10.50.1, dev: vlan50}]
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
`)
	if out := node.Exec(t, "ip", "route", "get", "203.0.113.7", "from", "10.10.50.5"); !strings.Contains(out, "via 10.10.50.1 dev vlan50") {
		t.Fatalf("reply route: %s", out)
	}
	before := atWan()
	if out, err := gw.TryExec("ping", "-c", "2", "-W", "2", "-I", "203.0.113.7", "10.10.50.5"); err != nil {
		t.Fatalf("the reply did not come back through the VLAN side: %v\n%s", err, out)
	}
	if got := atWan() - before; got != 0 {
		t.Fatalf("%d replies went out the main default", got)
	}
}

// TestEveryRouteAndRuleFormRoundTrips applies one of each route and rule
// form the config offers and checks that the kernel reports them back as
// configured: the second sync must plan nothing, or nodeagent would rewrite
// them on every sync.
func TestEveryRouteAndRuleFormRoundTrips(t *testing.T) {
	_, node, _, _ := gatewayLab(t)
	cfg := `
routing:
  tables:
    - id: 150
      name: vlan50-egress
      killSwitch: true
      routes:
        - {to: default, via: 10.99.0.2, dev: tun0}
        - {to: 10.10.50.0/24, dev: vlan50, src: 10.10.50.1}
        - {to: 10.10.51.0/24, via: 10.10.50.30, dev: vlan50, metric: 20, onlink: true}
        - {to: 10.10.52.0/24, type: blackhole}
        - {to: 10.10.53.0/24, type: prohibit, metric: 5}
        - {to: 10.10.54.1/32, dev: vlan50, scope: host}
        - {to: "fd00:51::/64", via: "fd00:50::30", dev: vlan50, metric: 7}
    - id: 1500
      routes:
        - {to: 192.0.2.0/24, dev: uplink}
  rules:
    - {priority: 1000, from: 10.10.50.0/24, table: 150}
    - {priority: 1001, from: "fd00:50::/64", table: 150}
    - {priority: 1002, to: 10.20.0.0/16, table: 1500}
    - {priority: 1003, iif: vlan50, table: 150}
    - {priority: 1004, oif: tun0, table: 150}
    - {priority: 1005, fwmark: "0x10", table: 150}
    - {priority: 1006, fwmark: "0x20/0xf0", table: 150}
    - {priority: 1007, table: 254, suppressPrefixLength: 0}
    - {priority: 1008, from: 10.30.0.0/16, action: unreachable}
    - {priority: 1009, from: 10.31.0.0/16, action: blackhole}
    - {priority: 1010, from: 10.32.0.0/16, action: prohibit}
    - {priority: 1011, from: 10.33.0.0/16, table: 150, invert: true}
`
	p := mustConverge(t, node, cfg)
	if strings.Contains(p.String(), "!") {
		t.Fatalf("first sync could not apply everything:\n%s", p)
	}
	if p := mustConverge(t, node, cfg); !p.Empty() {
		t.Fatalf("the kernel reports something other than what was configured; the second sync plans:\n%s", p)
	}
	out := node.Exec(t, "ip", "-d", "rule", "show")
	for _, want := range []string{"1005:\tfrom all fwmark 0x10 lookup 150 proto 147", "1006:\tfrom all fwmark 0x20/0xf0 lookup 150 proto 147",
		"1007:\tfrom all lookup main suppress_prefixlength 0 proto 147", "1008:\tfrom 10.30.0.0/16 unreachable proto 147",
		"1011:\tnot from 10.33.0.0/16 lookup 150 proto 147"} {
		if !strings.Contains(out, want) {
			t.Errorf("ip rule lacks %q:\n%s", want, out)
		}
	}
}
