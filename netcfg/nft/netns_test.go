package nft_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg/nft"
	"github.com/nodeagent/nodeagent/testenv"
)

// TestMasqueradeRemoteAccess is the remote-access VPN: a client behind wg0
// reaches the LAN, which has no route back to 10.90.0.0/24, masqueraded to
// the node's LAN address.
func TestMasqueradeRemoteAccess(t *testing.T) {
	client, node, lan := testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "wg0", client, "eth0")
	node.Veth(t, "enp1s0", lan, "eth0")
	run(t, client, "ip addr add 10.90.0.2/24 dev eth0", "ip route add default via 10.90.0.1")
	run(t, node, "ip addr add 10.90.0.1/24 dev wg0", "ip addr add 192.168.2.10/24 dev enp1s0",
		"sysctl -w net.ipv4.ip_forward=1")
	run(t, lan, "ip addr add 192.168.2.20/24 dev eth0")
	atLan := nftCounters(t, lan, "ip saddr 192.168.2.10 icmp type echo-request", "ip saddr 10.90.0.2")

	// Without nodeagent's table the client's packets arrive unmasqueraded
	// and the replies have no way back: the lab can tell the difference.
	if _, err := client.TryExec("ping", "-c", "1", "-W", "1", "192.168.2.20"); err == nil {
		t.Fatal("ping worked before masquerading: the lab proves nothing")
	}
	if got := atLan(); got[0] != 0 || got[1] == 0 {
		t.Fatalf("before masquerading lan counted %v, want [0 >0]", got)
	}
	before := atLan()

	d := parse(t, "firewall:\n  masquerade: [{from: 10.90.0.0/24, out: enp1s0}]\n")
	p := converge(t, node, d)
	want := "+ nft inet nodeagent table\n" +
		"+ nft inet nodeagent set masq_enp1s0_v4 { type ipv4_addr; flags interval; }\n" +
		"+ nft inet nodeagent set masq_enp1s0_v4: element 10.90.0.0/24\n" +
		"+ nft inet nodeagent chain postrouting { type nat hook postrouting priority 100; policy accept; }\n" +
		"+ nft inet nodeagent chain postrouting: ip saddr @masq_enp1s0_v4 oifname \"enp1s0\" masquerade\n"
	if diff := cmp.Diff(want, p.String()); diff != "" {
		t.Errorf("plan (-want +got):\n%s", diff)
	}
	if out, err := client.TryExec("ping", "-c", "3", "-i", "0.2", "-W", "1", "192.168.2.20"); err != nil {
		t.Fatalf("client cannot reach the lan through the masquerade: %v\n%s", err, out)
	}
	got := atLan()
	if fromNode, fromClient := got[0]-before[0], got[1]-before[1]; fromNode < 3 || fromClient != 0 {
		t.Fatalf("lan saw %d echo requests from 192.168.2.10 (want >= 3) and %d packets from 10.90.0.2 (want 0)", fromNode, fromClient)
	}
	if p := nft.MakePlan(d, observe(t, node)); !p.Empty() {
		t.Fatalf("not converged after apply:\n%s", p)
	}
}

// TestMSSClamp sends TCP SYNs both ways through tun0 (MTU 1380) and checks
// the MSS that arrives. `rt mtu` is the smaller MTU of the routes to the
// packet's destination and back to its source, so a SYN is clamped to
// tun0's MTU going out by tun0 (the oifname rule) and coming in by it (the
// iifname rule), though it leaves by vlan50 (MTU 1400).
func TestMSSClamp(t *testing.T) {
	client, node, far := testenv.NewNetNS(t), testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "vlan50", client, "eth0")
	node.Veth(t, "tun0", far, "eth0")
	run(t, client, "ip link set eth0 mtu 1400", "ip addr add 10.10.50.20/24 dev eth0", "ip addr add fd00:50::20/64 dev eth0 nodad",
		"ip route add default via 10.10.50.1", "ip -6 route add default via fd00:50::1")
	run(t, node, "ip link set vlan50 mtu 1400", "ip link set tun0 mtu 1380",
		"ip addr add 10.10.50.1/24 dev vlan50", "ip addr add fd00:50::1/64 dev vlan50 nodad",
		"ip addr add 10.99.0.1/30 dev tun0", "ip addr add fd00:99::1/64 dev tun0 nodad",
		"ip route add default via 10.99.0.2", "ip -6 route add default via fd00:99::2",
		"sysctl -w net.ipv4.ip_forward=1", "sysctl -w net.ipv6.conf.all.forwarding=1")
	run(t, far, "ip addr add 10.99.0.2/30 dev eth0", "ip addr add fd00:99::2/64 dev eth0 nodad",
		"ip addr add 198.51.100.10/32 dev lo", "ip addr add 2001:db8:2::10/128 dev lo",
		"ip route add 10.10.50.0/24 via 10.99.0.1", "ip -6 route add fd00:50::/64 via fd00:99::1")
	for _, ns := range []*testenv.NetNS{client, node, far} {
		ns.WaitDAD(t)
	}
	// SYN MSS as sent: client 1400-40 (v4) and 1400-60 (v6), far 1500-40
	// and 1500-60. Clamped to tun0's 1380 either way: 1340 and 1320.
	atFar := nftCounters(t, far,
		"ip saddr 10.10.50.20 tcp flags syn tcp option maxseg size 1340",
		"ip saddr 10.10.50.20 tcp flags syn tcp option maxseg size != 1340",
		"ip6 saddr fd00:50::20 tcp flags syn tcp option maxseg size 1320",
		"ip6 saddr fd00:50::20 tcp flags syn tcp option maxseg size != 1320")
	atClient := nftCounters(t, client,
		"ip saddr 10.99.0.2 tcp flags syn tcp option maxseg size 1340",
		"ip saddr 10.99.0.2 tcp flags syn tcp option maxseg size != 1340",
		"ip6 saddr fd00:99::2 tcp flags syn tcp option maxseg size 1320",
		"ip6 saddr fd00:99::2 tcp flags syn tcp option maxseg size != 1320")
	syn := func() {
		synFrom(t, client, "198.51.100.10:9")
		synFrom(t, client, "[2001:db8:2::10]:9")
		synFrom(t, far, "10.10.50.20:9")
		synFrom(t, far, "[fd00:50::20]:9")
	}

	// Unclamped first: the SYNs arrive with the MSS they were sent with.
	syn()
	if got := append(atFar(), atClient()...); !cmp.Equal(got, []int{0, 1, 0, 1, 0, 1, 0, 1}) {
		t.Fatalf("before clamping: counters %v, want every SYN unclamped", got)
	}
	converge(t, node, parse(t, "firewall:\n  mssClamp: [tun0]\n"))
	syn()
	if got := append(atFar(), atClient()...); !cmp.Equal(got, []int{1, 1, 1, 1, 1, 1, 1, 1}) {
		t.Fatalf("after clamping: counters %v, want one clamped SYN each way and family", got)
	}
}

// synFrom opens (and closes) a TCP connection from ns: one SYN, answered by
// an RST or not at all.
func synFrom(t *testing.T, ns *testenv.NetNS, addr string) {
	t.Helper()
	err := ns.Host.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, ns.Name, err)
	}
}

// fullConfig uses every kind of firewall entry.
const fullConfig = `
firewall:
  masquerade: [{from: 10.10.50.0/24, out: tun0}, {from: "fd00:50::/64", out: tun0}, {from: 10.90.0.0/24, out: uplink}]
  snat: [{from: 10.91.0.0/24, out: uplink, to: 192.0.2.1}]
  forward: [{in: wg0, out: uplink}]
  killSwitch: [{from: 10.10.50.0/24, allowOut: [tun0]}, {from: "fd00:50::/64", allowOut: [tun0]}]
  mssClamp: [tun0]
`

// TestDriftRepairedAndNoopSilent changes nodeagent's table by hand in three
// ways; each is seen by the next nft.Observe, shown by the plan and repaired
// by one nft.Apply. A sync with nothing to do sends nothing at all.
func TestDriftRepairedAndNoopSilent(t *testing.T) {
	ns := testenv.NewNetNS(t)
	d := parse(t, fullConfig)
	converge(t, ns, d)

	handle := regexp.MustCompile(`comment "nodeagent kill switch" # handle (\d+)`).
		FindStringSubmatch(ns.Exec(t, "nft", "-a", "list", "chain", "inet", "nodeagent", "forward"))
	if handle == nil {
		t.Fatal("no kill-switch rule in chain forward")
	}
	for _, tt := range []struct {
		name string
		cmd  string
		want string
	}{
		{"rule deleted", "delete rule inet nodeagent forward handle " + handle[1],
			"+ nft inet nodeagent chain forward: ip saddr @ks_tun0_v4 oifname != @ks_tun0_out counter name \"ks_drops\" drop comment \"nodeagent kill switch\"\n"},
		// The kernel will not delete an object a rule refers to: the
		// chain goes first.
		{"counter deleted by hand", "flush chain inet nodeagent forward; flush chain inet nodeagent output; delete counter inet nodeagent ks_drops",
			"+ nft inet nodeagent counter ks_drops\n" +
				"+ nft inet nodeagent chain forward: ip saddr @ks_tun0_v4 oifname != @ks_tun0_out counter name \"ks_drops\" drop comment \"nodeagent kill switch\"\n" +
				"+ nft inet nodeagent chain forward: ip6 saddr @ks_tun0_v6 oifname != @ks_tun0_out counter name \"ks_drops\" drop comment \"nodeagent kill switch\"\n" +
				"+ nft inet nodeagent chain forward: ct state established,related accept\n" +
				"+ nft inet nodeagent chain forward: iifname \"wg0\" oifname \"uplink\" accept\n" +
				"+ nft inet nodeagent chain output: ct state related meta nfproto ipv4 meta l4proto icmp @th,160,32 @ks_tun0_v4 ip daddr != @ks_tun0_v4 oifname != @ks_tun0_out counter name \"ks_drops\" drop comment \"nodeagent kill switch\"\n" +
				"+ nft inet nodeagent chain output: ct state related meta nfproto ipv4 meta l4proto icmp @th,192,32 @ks_tun0_v4 ip daddr != @ks_tun0_v4 oifname != @ks_tun0_out counter name \"ks_drops\" drop comment \"nodeagent kill switch\"\n" +
				"+ nft inet nodeagent chain output: ct state related meta nfproto ipv6 meta l4proto ipv6-icmp @th,128,128 @ks_tun0_v6 ip6 daddr != @ks_tun0_v6 oifname != @ks_tun0_out counter name \"ks_drops\" drop comment \"nodeagent kill switch\"\n" +
				"+ nft inet nodeagent chain output: ct state related meta nfproto ipv6 meta l4proto ipv6-icmp @th,256,128 @ks_tun0_v6 ip6 daddr != @ks_tun0_v6 oifname != @ks_tun0_out counter name \"ks_drops\" drop comment \"nodeagent kill switch\"\n"},
		{"chain deleted", "flush chain inet nodeagent mssclamp; delete chain inet nodeagent mssclamp",
			"+ nft inet nodeagent chain mssclamp { type filter hook forward priority -150; policy accept; }\n" +
				"+ nft inet nodeagent chain mssclamp: oifname @mss_if tcp flags syn tcp option maxseg size set rt mtu\n" +
				"+ nft inet nodeagent chain mssclamp: iifname @mss_if tcp flags syn tcp option maxseg size set rt mtu\n"},
		{"set flushed", "flush set inet nodeagent ks_tun0_v4",
			"+ nft inet nodeagent set ks_tun0_v4: element 10.10.50.0/24\n"},
		{"element added", "add element inet nodeagent ks_tun0_out { \"uplink\" }",
			"- nft inet nodeagent set ks_tun0_out: element \"uplink\"\n"},
		{"rule added", "insert rule inet nodeagent forward accept",
			"- nft inet nodeagent chain forward: accept\n"},
		{"priority changed", "flush chain inet nodeagent mssclamp; delete chain inet nodeagent mssclamp; " +
			"add chain inet nodeagent mssclamp { type filter hook forward priority 10; policy accept; }",
			"- nft inet nodeagent chain mssclamp { type filter hook forward priority 10; policy accept; }\n" +
				"+ nft inet nodeagent chain mssclamp { type filter hook forward priority -150; policy accept; }\n" +
				"+ nft inet nodeagent chain mssclamp: oifname @mss_if tcp flags syn tcp option maxseg size set rt mtu\n" +
				"+ nft inet nodeagent chain mssclamp: iifname @mss_if tcp flags syn tcp option maxseg size set rt mtu\n"},
		{"policy changed", "add chain inet nodeagent forward { type filter hook forward priority -10; policy drop; }",
			"- nft inet nodeagent chain forward { type filter hook forward priority -10; policy drop; }\n" +
				"+ nft inet nodeagent chain forward { type filter hook forward priority -10; policy accept; }\n"},
		{"table made dormant", "add table inet nodeagent { flags dormant; }",
			"- nft inet nodeagent table flags dormant\n+ nft inet nodeagent table\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ns.Exec(t, "nft", tt.cmd)
			o := observe(t, ns)
			p := nft.MakePlan(d, o)
			if diff := cmp.Diff(tt.want, p.String()); diff != "" {
				t.Fatalf("plan after %q (-want +got):\n%s", tt.cmd, diff)
			}
			mon := newNftMonitor(t, ns)
			o, rep := nft.Apply(context.Background(), ns.Host.Snapshot(), p)
			err := rep.Err()
			if err != nil {
				t.Fatal(err)
			}
			if n := mon.Stop(); n == 0 {
				t.Fatal("the repair caused no nftables notification: the monitor sees nothing")
			}
			if p := nft.MakePlan(d, o); !p.Empty() {
				t.Fatalf("not repaired:\n%s", p)
			}
		})
	}

	// Nothing to do: zero messages, zero writes.
	mon := newNftMonitor(t, ns)
	before := ns.Host.Writes()
	if p := converge(t, ns, d); !p.Empty() {
		t.Fatalf("no-op sync planned:\n%s", p)
	}
	if n := mon.Stop(); n != 0 || ns.Host.Writes() != before {
		t.Fatalf("no-op sync: %d nftables notifications, %d writes; want 0 and 0", n, ns.Host.Writes()-before)
	}
}

// handles returns the kernel handle of the table and of each counter,
// chain, set and rule in it, by object.
func handles(t *testing.T, ns *testenv.NetNS) map[string]float64 {
	t.Helper()
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(ns.Exec(t, "nft", "-a", "-j", "list", "table", "inet", "nodeagent")), &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, o := range doc.Nftables {
		for kind, v := range o {
			h, _ := v["handle"].(float64)
			switch kind {
			case "table":
				out["table"] = h
			case "chain", "set", "counter":
				out[kind+" "+v["name"].(string)] = h
			case "rule":
				out[fmt.Sprintf("rule %s #%v", v["chain"], h)] = h
			}
		}
	}
	return out
}

// TestConfigChangeUpdatesInPlace: a config change touches exactly what
// changes. New elements go into the existing set; a chain whose rules
// change is refilled, keeping its handle; nothing else is replaced, the
// kill switch's counter object included, until the kill switch goes.
func TestConfigChangeUpdatesInPlace(t *testing.T) {
	ns := testenv.NewNetNS(t)
	converge(t, ns, parse(t, fullConfig))
	before := handles(t, ns)

	moreSources := strings.Replace(fullConfig, "{from: 10.90.0.0/24, out: uplink}", "{from: 10.90.0.0/24, out: uplink}, {from: 10.92.0.0/24, out: uplink}", 1)
	mon := newNftMonitor(t, ns)
	p := converge(t, ns, parse(t, moreSources))
	if diff := cmp.Diff("+ nft inet nodeagent set masq_uplink_v4: element 10.92.0.0/24\n", p.String()); diff != "" {
		t.Fatalf("plan (-want +got):\n%s", diff)
	}
	// The range's start and interval-end elements (one NEWSETELEM each,
	// or one for both) and the transaction's NEWGEN; nothing else.
	if n := mon.Stop(); n < 2 || n > 3 {
		t.Errorf("adding one element caused %d notifications, want 2 or 3", n)
	}
	if diff := cmp.Diff(before, handles(t, ns)); diff != "" {
		t.Fatalf("adding an element replaced objects (-before +after):\n%s", diff)
	}

	moreForward := strings.Replace(moreSources, "forward: [{in: wg0, out: uplink}]", "forward: [{in: wg0, out: uplink}, {in: wg0, out: tun0}]", 1)
	p = converge(t, ns, parse(t, moreForward))
	if diff := cmp.Diff("+ nft inet nodeagent chain forward: iifname \"wg0\" oifname \"tun0\" accept\n", p.String()); diff != "" {
		t.Fatalf("plan (-want +got):\n%s", diff)
	}
	after := handles(t, ns)
	for k, h := range before {
		if strings.HasPrefix(k, "rule forward ") {
			if _, ok := after[k]; ok {
				t.Errorf("%s survived the refill of chain forward", k)
			}
			continue
		}
		if after[k] != h {
			t.Errorf("%s: handle %v, was %v: replaced", k, after[k], h)
		}
	}

	// Without the kill switch, its counter goes in the transaction that
	// removes the rules counting into it.
	noKillSwitch := parse(t, strings.Replace(moreForward, "killSwitch:", "#", 1))
	p = converge(t, ns, noKillSwitch)
	if !strings.Contains(p.String(), "- nft inet nodeagent counter ks_drops\n") {
		t.Fatalf("dropping the kill switch keeps its counter:\n%s", p)
	}
	if p := nft.MakePlan(noKillSwitch, observe(t, ns)); !p.Empty() {
		t.Fatalf("not converged without the kill switch:\n%s", p)
	}
}

// foreignRuleset is what other software puts in the same namespace:
// iptables-nft's filter table, a k3s-like inet table, and a table with a
// chain at the very hook and priority of nodeagent's forward chain.
const foreignRuleset = `
table ip filter {
	chain INPUT {
		type filter hook input priority filter; policy accept;
	}
	chain FORWARD {
		type filter hook forward priority filter; policy accept;
		iifname "eth9" counter packets 0 bytes 0 drop
		ct state established,related counter packets 0 bytes 0 accept
	}
	chain OUTPUT {
		type filter hook output priority filter; policy accept;
	}
}
table inet k3s-test {
	set pods {
		type ipv4_addr; flags interval;
		elements = { 10.42.0.0/16 }
	}
	chain forward {
		type filter hook forward priority 0; policy accept;
		ip saddr @pods meta mark set 0x4000
		meta mark 0x4000 accept
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr @pods oifname "tun0" masquerade
	}
}
table inet same-prio {
	chain early {
		type filter hook forward priority -10; policy accept;
		oifname "tun0" counter packets 0 bytes 0
	}
}
`

var foreignTables = [][2]string{{"ip", "filter"}, {"inet", "k3s-test"}, {"inet", "same-prio"}}

// TestForeignTablesUntouched plants other software's tables first and
// checks that `nft -j list table` of each is byte for byte the same after
// every step. Nothing is stripped: handles and counters included, since
// nothing touches them (no traffic flows in this namespace).
func TestForeignTablesUntouched(t *testing.T) {
	ns := testenv.NewNetNS(t)
	nftScript(t, ns, foreignRuleset)
	snapshot := func() string {
		var b strings.Builder
		for _, ft := range foreignTables {
			b.WriteString(ns.Exec(t, "nft", "-j", "list", "table", ft[0], ft[1]))
		}
		return b.String()
	}
	before := snapshot()
	check := func(stage string) {
		t.Helper()
		if diff := cmp.Diff(before, snapshot()); diff != "" {
			t.Fatalf("%s changed a foreign table (-before +after):\n%s", stage, diff)
		}
	}
	d := parse(t, fullConfig)
	converge(t, ns, d)
	check("apply")
	changed := parse(t, strings.Replace(fullConfig, "allowOut: [tun0]}, {", "allowOut: [tun0, tun1]}, {", 1))
	if p := converge(t, ns, changed); p.Empty() {
		t.Fatal("config change planned nothing")
	}
	check("config change")
	ns.Exec(t, "nft", "flush chain inet nodeagent forward")
	if p := converge(t, ns, changed); p.Empty() {
		t.Fatal("drift repair planned nothing")
	}
	check("drift repair")
	p := nft.MakePlan(nft.Desired{}, observe(t, ns))
	if diff := cmp.Diff("- nft inet nodeagent table\n", p.String()); diff != "" {
		t.Errorf("teardown plan (-want +got):\n%s", diff)
	}
	if _, rep := nft.Apply(context.Background(), ns.Host.Snapshot(), p); rep.Err() != nil {
		err := rep.Err()
		t.Fatal(err)
	}
	check("teardown")
	if out := ns.Exec(t, "nft", "list", "tables"); strings.Contains(out, "nodeagent") {
		t.Fatalf("teardown left a nodeagent table:\n%s", out)
	}
}

// TestTeardownRemovesEveryNodeagentTable: a nodeagent* table of another
// family (left by an older version, say) is nodeagent's too, and goes.
func TestTeardownRemovesEveryNodeagentTable(t *testing.T) {
	ns := testenv.NewNetNS(t)
	nftScript(t, ns, "table ip nodeagent-old {\n chain c {\n  type filter hook forward priority 0; policy accept;\n }\n}\n"+foreignRuleset)
	d := parse(t, fullConfig)
	p := converge(t, ns, d)
	if !strings.Contains(p.String(), "- nft ip nodeagent-old table\n") {
		t.Fatalf("plan does not remove the stray table:\n%s", p)
	}
	if out := ns.Exec(t, "nft", "list", "tables"); out != "table ip filter\ntable inet k3s-test\ntable inet same-prio\ntable inet nodeagent\n" {
		t.Fatalf("tables after apply:\n%s", out)
	}
	converge(t, ns, nft.Desired{})
	if out := ns.Exec(t, "nft", "list", "tables"); out != "table ip filter\ntable inet k3s-test\ntable inet same-prio\n" {
		t.Fatalf("tables after teardown:\n%s", out)
	}
}

// TestFullConfigTranslation: the desired state the internal tests build by
// hand is what netcfg derives from fullConfig.
func TestFullConfigTranslation(t *testing.T) {
	if diff := cmp.Diff(nft.FullDesired(), parse(t, fullConfig)); diff != "" {
		t.Errorf("(-by hand +from the config):\n%s", diff)
	}
}
