package link

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/vishvananda/netlink"
)

// fastDAD keeps probing real but short for tests.
var fastDAD = &arp.Config{Probes: 2, Interval: 20 * time.Millisecond, Wait: 150 * time.Millisecond, Announcements: 1}

func syncOnce(t *testing.T, h *host.Host, d Desired) (Plan, error) {
	t.Helper()
	ctx := context.Background()
	o, err := Observe(ctx, h.Snapshot(), d)
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	p := MakePlan(d, o)
	_, rep := Apply(ctx, h.Snapshot(), p)
	err = rep.Err()
	return p, err
}

func mustSync(t *testing.T, h *host.Host, d Desired) Plan {
	t.Helper()
	p, err := syncOnce(t, h, d)
	if err != nil {
		t.Fatalf("apply:\n%s\nerror: %v", p, err)
	}
	return p
}

// assertNoop proves a sync of d changes nothing: an empty plan, no write
// through the handle and no rtnetlink notification in the namespace.
func assertNoop(t *testing.T, ns *testenv.NetNS, d Desired) {
	t.Helper()
	mon := ns.NewMonitor(t)
	before := ns.Host.Writes()
	p := mustSync(t, ns.Host, d)
	n, msgs := mon.Stop()
	if !p.Empty() || ns.Host.Writes() != before || n != 0 {
		t.Fatalf("second sync was not a no-op: plan %q, %d writes, %d notifications %v", p, ns.Host.Writes()-before, n, msgs)
	}
}

// snapshot is what must stay untouched: `ip -d link` and `ip addr` of the
// named links.
func snapshot(t *testing.T, ns *testenv.NetNS, names ...string) string {
	t.Helper()
	var b strings.Builder
	for _, n := range names {
		b.WriteString(ns.Exec(t, "ip", "-d", "link", "show", "dev", n))
		b.WriteString(ns.Exec(t, "ip", "addr", "show", "dev", n))
	}
	// Counters and timers move by themselves; ownership and config do not.
	return stripVolatile(b.String())
}

// volatile is what the kernel changes by itself: the promiscuity counter
// it raises on a parent when a macvlan on it comes up, and the IPv6 DAD
// state of link-local addresses. Neither is configuration.
var volatile = regexp.MustCompile(`promiscuity \d+|tentative `)

func stripVolatile(s string) string {
	var out []string
	for _, l := range strings.Split(volatile.ReplaceAllString(s, ""), "\n") {
		if strings.Contains(l, "valid_lft") {
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

func trunkPair(t *testing.T) (node, other *testenv.NetNS) {
	node, other = testenv.NewNetNS(t), testenv.NewNetNS(t)
	node.Veth(t, "trunk0", other, "wire0")
	return node, other
}

func shim(addrs ...string) Link {
	l := Link{Name: "shim0", Kind: Macvlan, Parent: "trunk0", Mode: "bridge", Up: true}
	for _, a := range addrs {
		l.Addrs = append(l.Addrs, netip.MustParsePrefix(a))
	}
	return l
}

func TestMacvlanShimConvergesAndIsIdempotent(t *testing.T) {
	node, _ := trunkPair(t)
	d := Desired{Links: []Link{shim("10.10.50.3/32", "fd00:50::3/128")}, DAD: fastDAD}
	mustSync(t, node.Host, d)

	l, err := node.NL.LinkByName("shim0")
	if err != nil {
		t.Fatal(err)
	}
	if l.Type() != "macvlan" || l.Attrs().Alias != host.LinkAlias || l.Attrs().Flags&net.FlagUp == 0 {
		t.Fatalf("shim0: type %s alias %q flags %v", l.Type(), l.Attrs().Alias, l.Attrs().Flags)
	}
	assertMarkedAddr(t, node, l.Attrs().Index, "10.10.50.3/32")
	assertNoop(t, node, d)

	// Teardown removes it.
	mustSync(t, node.Host, Desired{})
	if _, err := node.NL.LinkByName("shim0"); err == nil {
		t.Fatal("shim0 survived teardown")
	}
}

func TestDuplicateAddressDetection(t *testing.T) {
	node, other := trunkPair(t)
	owner, err := other.NL.LinkByName("wire0")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.NL.AddrAdd(owner, &netlink.Addr{IPNet: mustCIDR("10.10.50.100/24")}); err != nil {
		t.Fatal(err)
	}
	d := Desired{Links: []Link{shim("10.10.50.100/24", "10.10.50.101/24")}, DAD: fastDAD}
	_, err = syncOnce(t, node.Host, d)
	if err == nil {
		t.Fatal("claiming an address another host owns succeeded")
	}
	mac := owner.Attrs().HardwareAddr.String()
	if !strings.Contains(err.Error(), mac) || !strings.Contains(err.Error(), "10.10.50.100") {
		t.Fatalf("error does not name the answering MAC %s: %v", mac, err)
	}
	out := node.Exec(t, "ip", "-4", "addr", "show", "dev", "shim0")
	if strings.Contains(out, "10.10.50.100") {
		t.Fatalf("conflicting address was added:\n%s", out)
	}
	if !strings.Contains(out, "10.10.50.101/24") {
		t.Fatalf("the free address was not added:\n%s", out)
	}
}

// assertMarkedAddr checks that the address is on the link with nodeagent's
// IFA_PROTO (the iproute2 in Debian 12 does not print it).
func assertMarkedAddr(t *testing.T, ns *testenv.NetNS, index int, addr string) {
	t.Helper()
	addrs, err := ns.Host.AddrList()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if a.LinkIndex == index && a.Prefix.String() == addr {
			if !a.Owned() {
				t.Fatalf("%s is not marked: proto %d", addr, a.Proto)
			}
			return
		}
	}
	t.Fatalf("%s is not on link %d: %v", addr, index, addrs)
}

func mustCIDR(s string) *net.IPNet {
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}

func TestUnmarkedLinkIsAConflict(t *testing.T) {
	node, _ := trunkPair(t)
	trunk, _ := node.NL.LinkByName("trunk0")
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex = "shim0", trunk.Attrs().Index
	if err := node.NL.LinkAdd(&netlink.Macvlan{LinkAttrs: la, Mode: netlink.MACVLAN_MODE_PRIVATE}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, node, "shim0")
	_, err := syncOnce(t, node.Host, Desired{Links: []Link{shim("10.10.50.3/32")}, DAD: fastDAD})
	if err == nil || !strings.Contains(err.Error(), "link shim0: exists and was not created by nodeagent") {
		t.Fatalf("want a conflict naming shim0, got %v", err)
	}
	if diff := cmp.Diff(before, snapshot(t, node, "shim0")); diff != "" {
		t.Fatalf("foreign shim0 changed (-before +after):\n%s", diff)
	}
	// Teardown leaves it too.
	mustSync(t, node.Host, Desired{})
	if diff := cmp.Diff(before, snapshot(t, node, "shim0")); diff != "" {
		t.Fatalf("teardown changed foreign shim0 (-before +after):\n%s", diff)
	}
}

func TestAdoptTakesOverAMatchingLink(t *testing.T) {
	node, _ := trunkPair(t)
	trunk, _ := node.NL.LinkByName("trunk0")
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex = "shim0", trunk.Attrs().Index
	if err := node.NL.LinkAdd(&netlink.Macvlan{LinkAttrs: la, Mode: netlink.MACVLAN_MODE_BRIDGE}); err != nil {
		t.Fatal(err)
	}
	planted, _ := node.NL.LinkByName("shim0")
	idx := planted.Attrs().Index
	l := shim("10.10.50.3/32")
	l.Adopt = true
	d := Desired{Links: []Link{l}}
	mustSync(t, node.Host, d)
	got, _ := node.NL.LinkByName("shim0")
	if got.Attrs().Index != idx || got.Attrs().Alias != host.LinkAlias {
		t.Fatalf("adopted link: index %d (was %d), alias %q", got.Attrs().Index, idx, got.Attrs().Alias)
	}
	assertNoop(t, node, d)
}

func TestForeignLinksAndAddressesSurvive(t *testing.T) {
	node, _ := trunkPair(t)
	trunk, _ := node.NL.LinkByName("trunk0")
	// Planted first: a macvlan nodeagent did not create, on the same parent,
	// and an address on the trunk it did not add.
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex = "podshim", trunk.Attrs().Index
	if err := node.NL.LinkAdd(&netlink.Macvlan{LinkAttrs: la, Mode: netlink.MACVLAN_MODE_BRIDGE}); err != nil {
		t.Fatal(err)
	}
	if err := node.NL.AddrAdd(trunk, &netlink.Addr{IPNet: mustCIDR("192.168.2.10/24")}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, node, "trunk0", "podshim")
	check := func(stage string) {
		t.Helper()
		if diff := cmp.Diff(before, snapshot(t, node, "trunk0", "podshim")); diff != "" {
			t.Fatalf("%s changed foreign objects (-before +after):\n%s", stage, diff)
		}
	}
	mustSync(t, node.Host, Desired{Links: []Link{shim("10.10.50.3/32")}, DAD: fastDAD})
	check("apply")
	changed := shim("10.10.50.4/32")
	changed.MTU = 1400
	mustSync(t, node.Host, Desired{Links: []Link{changed}, DAD: fastDAD})
	check("config change")
	mustSync(t, node.Host, Desired{})
	check("teardown")
}

func TestInterruptedCreateIsAdopted(t *testing.T) {
	node, _ := trunkPair(t)
	trunk, _ := node.NL.LinkByName("trunk0")
	// What a kill -9 between create and mark leaves behind: the link with
	// its in-flight group and no alias. One is still wanted, one is not.
	for _, name := range []string{"shim0", "stale0"} {
		la := netlink.NewLinkAttrs()
		la.Name, la.ParentIndex = name, trunk.Attrs().Index
		if err := node.NL.LinkAdd(&netlink.Macvlan{LinkAttrs: la, Mode: netlink.MACVLAN_MODE_BRIDGE}); err != nil {
			t.Fatal(err)
		}
		l, _ := node.NL.LinkByName(name)
		if err := node.NL.LinkSetGroup(l, host.CreatingGroup); err != nil {
			t.Fatal(err)
		}
	}
	d := Desired{Links: []Link{shim("10.10.50.3/32")}}
	p := mustSync(t, node.Host, d)
	for _, want := range []string{"~ link shim0 mark (its creation was interrupted)", "- link stale0 (macvlan on trunk0)"} {
		if !strings.Contains(p.String(), want) {
			t.Fatalf("plan lacks %q:\n%s", want, p)
		}
	}
	l, err := node.NL.LinkByName("shim0")
	if err != nil || l.Attrs().Alias != host.LinkAlias || l.Attrs().Group != 0 {
		t.Fatalf("shim0 not marked: %v %+v", err, l)
	}
	if _, err := node.NL.LinkByName("stale0"); err == nil {
		t.Fatal("stale0 survived")
	}
	assertNoop(t, node, d)
}

// BenchmarkNoopSync1000Macvlans measures, on the host kernel, the no-op sync
// of 1000 owned links with an address each: the same observe-and-plan path
// as the VLAN benchmark, which only runs under TCG (the host has no 8021q),
// where every syscall is many times slower. Run with -benchtime=1x.
func BenchmarkNoopSync1000Macvlans(b *testing.B) {
	const n = 1000
	for i := 0; i < b.N; i++ {
		node, peer := testenv.NewNetNS(b), testenv.NewNetNS(b)
		node.Veth(b, "trunk0", peer, "wire0")
		var d Desired
		for j := 1; j <= n; j++ {
			d.Links = append(d.Links, Link{
				Name: fmt.Sprintf("m%d", j), Kind: Macvlan, Parent: "trunk0", Mode: "bridge", Up: true,
				Addrs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(j >> 8), byte(j), 1}), 24)},
			})
		}
		ctx := context.Background()
		sync := func() (Plan, time.Duration) {
			start := time.Now()
			o, err := Observe(ctx, node.Host.Snapshot(), d)
			if err != nil {
				b.Fatal(err)
			}
			p := MakePlan(d, o)
			if _, rep := Apply(ctx, node.Host.Snapshot(), p); rep.Err() != nil {
				err := rep.Err()
				b.Fatal(err)
			}
			return p, time.Since(start)
		}
		_, cold := sync()
		before := node.Host.Writes()
		var best time.Duration
		for j := 0; j < 5; j++ {
			p, took := sync()
			if !p.Empty() {
				b.Fatalf("no-op sync planned:\n%s", p)
			}
			if best == 0 || took < best {
				best = took
			}
		}
		writes := node.Host.Writes() - before
		b.ReportMetric(cold.Seconds()*1000, "cold-ms")
		b.ReportMetric(float64(best.Microseconds())/1000, "noop-ms")
		b.ReportMetric(float64(writes), "noop-writes")
		where := "the host kernel"
		if testenv.InVM() {
			where = "the VM's kernel (TCG)"
		}
		fmt.Printf("\n%d macvlans + %d addresses on %s: cold %.0f ms, no-op sync %.1f ms (target <= 50 ms), %d writes (target 0)\n\n",
			n, n, where, cold.Seconds()*1000, float64(best.Microseconds())/1000, writes)
	}
}

// TestGratuitousARPAnnouncesTheAddress checks that a claimed address is
// announced: a neighbour that learns from gratuitous ARP (arp_accept) has
// the shim's MAC for it without ever asking. (With announcements off the
// neighbour never learns it: the probes' sender address is 0.0.0.0.)
func TestGratuitousARPAnnouncesTheAddress(t *testing.T) {
	node, other := trunkPair(t)
	other.Exec(t, "sysctl", "-qw", "net.ipv4.conf.wire0.arp_accept=1")
	other.Exec(t, "ip", "addr", "add", "10.10.50.20/24", "dev", "wire0")
	mustSync(t, node.Host, Desired{Links: []Link{shim("10.10.50.3/24")}, DAD: fastDAD})
	l, err := node.NL.LinkByName("shim0")
	if err != nil {
		t.Fatal(err)
	}
	mac := l.Attrs().HardwareAddr.String()
	deadline := time.Now().Add(3 * time.Second)
	for {
		out := other.Exec(t, "ip", "neigh", "show", "10.10.50.3", "dev", "wire0")
		if strings.Contains(out, mac) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the neighbour never learned 10.10.50.3 is at %s: %q", mac, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A macvlan whose parent is a macvlan is put by the kernel on that
// macvlan's own parent (macvlan_common_newlink takes the lower device's
// real device): the link reads back with the trunk as its parent. It
// must still converge, not be deleted and made again on every sync.
func TestMacvlanOnMacvlanConverges(t *testing.T) {
	node, _ := trunkPair(t)
	outer := shim("10.10.50.3/32")
	inner := Link{Name: "shim1", Kind: Macvlan, Parent: "shim0", Mode: "bridge", Up: true, Addrs: []netip.Prefix{netip.MustParsePrefix("10.10.50.4/32")}}
	d := Desired{Links: []Link{outer, inner}, DAD: fastDAD}
	mustSync(t, node.Host, d)
	l, err := node.NL.LinkByName("shim1")
	if err != nil {
		t.Fatal(err)
	}
	trunk, _ := node.NL.LinkByName("trunk0")
	if l.Attrs().ParentIndex != trunk.Attrs().Index {
		t.Fatalf("shim1's parent is index %d; the kernel was expected to put it on trunk0 (%d)", l.Attrs().ParentIndex, trunk.Attrs().Index)
	}
	assertNoop(t, node, d)
	// And a foreign macvlan on the trunk, named as the parent, too.
	node.Exec(t, "ip", "link", "add", "other0", "link", "trunk0", "type", "macvlan", "mode", "bridge")
	on := Link{Name: "shim2", Kind: Macvlan, Parent: "other0", Mode: "bridge", Up: true}
	d2 := Desired{Links: []Link{outer, inner, on}, DAD: fastDAD}
	mustSync(t, node.Host, d2)
	assertNoop(t, node, d2)
	// A real change of parent is still one: shim1 moved onto the trunk
	// itself is where it is already, and onto another trunk is not.
	moved := inner
	moved.Parent = "trunk0"
	assertNoop(t, node, Desired{Links: []Link{outer, moved, on}, DAD: fastDAD})
}
