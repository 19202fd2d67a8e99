package link

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/testenv"
	"github.com/vishvananda/netlink"
)

// These tests need 8021q and dummy, which the host kernel here lacks: they
// run in the VM tier (make test-vm) and skip elsewhere with that reason.

func dummyTrunk(t testing.TB) *testenv.NetNS {
	t.Helper()
	testenv.RequireModule(t, "8021q")
	testenv.RequireModule(t, "dummy")
	ns := testenv.NewNetNS(t)
	la := netlink.NewLinkAttrs()
	la.Name = "trunk0"
	if err := ns.NL.LinkAdd(&netlink.Dummy{LinkAttrs: la}); err != nil {
		t.Fatalf("dummy trunk: %v", err)
	}
	l, _ := ns.NL.LinkByName("trunk0")
	if err := ns.NL.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	return ns
}

func vlan(id int, mtu int, addrs ...string) Link {
	l := Link{Name: fmt.Sprintf("trunk0.%d", id), Kind: VLAN, Parent: "trunk0", VLANID: id, MTU: mtu, Up: true}
	for _, a := range addrs {
		l.Addrs = append(l.Addrs, netip.MustParsePrefix(a))
	}
	return l
}

func index(t *testing.T, ns *testenv.NetNS, name string) int {
	t.Helper()
	l, err := ns.NL.LinkByName(name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return l.Attrs().Index
}

func TestVLANLifecycle(t *testing.T) {
	ns := dummyTrunk(t)
	d := Desired{Links: []Link{vlan(50, 1500, "10.10.50.1/24"), vlan(60, 1400, "10.10.60.1/24", "fd00:60::1/64")}, DAD: fastDAD}
	mustSync(t, ns.Host, d)
	for _, l := range d.Links {
		nl, err := ns.NL.LinkByName(l.Name)
		if err != nil {
			t.Fatalf("%s missing: %v", l.Name, err)
		}
		v, ok := nl.(*netlink.Vlan)
		if !ok || v.VlanId != l.VLANID || v.Attrs().MTU != l.MTU || v.Attrs().Alias != host.LinkAlias || v.Attrs().Flags&net.FlagUp == 0 {
			t.Fatalf("%s: got %#v", l.Name, nl.Attrs())
		}
		for _, a := range l.Addrs {
			assertMarkedAddr(t, ns, v.Attrs().Index, a.String())
		}
	}

	// A second apply performs zero netlink writes.
	assertNoop(t, ns, d)

	// Changing the MTU is an in-place change: same ifindex, one op.
	idx50, idx60 := index(t, ns, "trunk0.50"), index(t, ns, "trunk0.60")
	d.Links[0].MTU = 1300
	p := mustSync(t, ns.Host, d)
	if got := p.String(); got != "~ link trunk0.50 mtu 1500 -> 1300\n" {
		t.Fatalf("mtu change plan:\n%s", got)
	}
	if index(t, ns, "trunk0.50") != idx50 {
		t.Fatal("mtu change recreated the link")
	}

	// Removing one VLAN from the config deletes only it.
	d.Links = d.Links[1:]
	p = mustSync(t, ns.Host, d)
	if got := p.String(); got != "- link trunk0.50 (vlan 50 on trunk0)\n" {
		t.Fatalf("removal plan:\n%s", got)
	}
	if _, err := ns.NL.LinkByName("trunk0.50"); err == nil {
		t.Fatal("trunk0.50 still exists")
	}
	if index(t, ns, "trunk0.60") != idx60 {
		t.Fatal("trunk0.60 was recreated")
	}
	assertNoop(t, ns, d)

	// Changing the VLAN id recreates the link.
	d.Links[0].VLANID = 61
	mustSync(t, ns.Host, d)
	if nl, _ := ns.NL.LinkByName("trunk0.60"); nl.(*netlink.Vlan).VlanId != 61 {
		t.Fatal("vlan id not changed")
	}
}

func TestVLANMTUAboveParentIsRefused(t *testing.T) {
	ns := dummyTrunk(t)
	_, err := syncOnce(t, ns.Host, Desired{Links: []Link{vlan(50, 9000)}})
	if err == nil || !strings.Contains(err.Error(), "mtu 9000 is above parent trunk0's mtu 1500") {
		t.Fatalf("want an mtu error, got %v", err)
	}
	if _, err := ns.NL.LinkByName("trunk0.50"); err == nil {
		t.Fatal("link created anyway")
	}
}

func TestVLANForeignObjectsSurvive(t *testing.T) {
	ns := dummyTrunk(t)
	trunk, _ := ns.NL.LinkByName("trunk0")
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex = "trunk0.70", trunk.Attrs().Index
	if err := ns.NL.LinkAdd(&netlink.Vlan{LinkAttrs: la, VlanId: 70}); err != nil {
		t.Fatal(err)
	}
	if err := ns.NL.AddrAdd(trunk, &netlink.Addr{IPNet: mustCIDR("192.168.2.10/24")}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, ns, "trunk0", "trunk0.70")
	check := func(stage string) {
		t.Helper()
		if diff := cmp.Diff(before, snapshot(t, ns, "trunk0", "trunk0.70")); diff != "" {
			t.Fatalf("%s changed foreign objects (-before +after):\n%s", stage, diff)
		}
	}
	d := Desired{Links: []Link{vlan(50, 0, "10.10.50.1/24"), vlan(60, 0, "10.10.60.1/24")}, DAD: fastDAD}
	mustSync(t, ns.Host, d)
	check("apply")
	d.Links[0].MTU = 1400
	d.Links[1].Addrs = []netip.Prefix{netip.MustParsePrefix("10.10.60.2/24")}
	mustSync(t, ns.Host, d)
	check("config change")
	mustSync(t, ns.Host, Desired{})
	check("teardown")
	if _, err := ns.NL.LinkByName("trunk0.50"); err == nil {
		t.Fatal("teardown left trunk0.50")
	}
}

func TestUnmarkedVLANIsAConflict(t *testing.T) {
	ns := dummyTrunk(t)
	trunk, _ := ns.NL.LinkByName("trunk0")
	la := netlink.NewLinkAttrs()
	la.Name, la.ParentIndex = "trunk0.50", trunk.Attrs().Index
	if err := ns.NL.LinkAdd(&netlink.Vlan{LinkAttrs: la, VlanId: 50}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, ns, "trunk0.50")
	_, err := syncOnce(t, ns.Host, Desired{Links: []Link{vlan(50, 1400, "10.10.50.1/24")}})
	if err == nil || !strings.Contains(err.Error(), "link trunk0.50: exists and was not created by nodeagent") {
		t.Fatalf("want a conflict, got %v", err)
	}
	if diff := cmp.Diff(before, snapshot(t, ns, "trunk0.50")); diff != "" {
		t.Fatalf("conflicting link changed (-before +after):\n%s", diff)
	}
}

// benchVLANs is how many VLANs the converge benchmark creates
// (go test -args -vlans=N; through the VM runner: vmtest ... -args -vlans=N).
var benchVLANs = flag.Int("vlans", 1000, "VLANs the converge benchmark creates")

func benchDesired(n int, dad bool) Desired {
	var d Desired
	for i := 1; i <= n; i++ {
		d.Links = append(d.Links, Link{
			Name: fmt.Sprintf("v%d", i), Kind: VLAN, Parent: "trunk0", VLANID: i, Up: true,
			Addrs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 1}), 24)},
		})
	}
	if dad {
		d.DAD = fastDAD
	}
	return d
}

// ipCommands are the iproute2 commands that create what benchDesired(n)
// describes, the baseline nodeagent is measured against.
func ipCommands(n int) []string {
	var cmds []string
	for i := 1; i <= n; i++ {
		cmds = append(cmds,
			fmt.Sprintf("link add link trunk0 name v%d up type vlan id %d", i, i),
			fmt.Sprintf("addr add 10.%d.%d.1/24 dev v%d", i>>8, i&0xff, i))
	}
	return cmds
}

// BenchmarkConverge1000VLANs puts nodeagent's cold converge of N VLANs with
// one address each beside `ip -batch` and one `ip` process per object doing
// the same, and measures the no-op sync of the result. Run it with
// -benchtime=1x (make bench does); each figure is one fresh namespace.
func BenchmarkConverge1000VLANs(b *testing.B) {
	n := *benchVLANs
	for i := 0; i < b.N; i++ {
		var nodeagent, withDAD, batch, perProc, noop time.Duration
		var noopWrites int64
		{
			ns := dummyTrunk(b)
			d := benchDesired(n, false)
			start := time.Now()
			if _, err := benchSync(ns.Host, d); err != nil {
				b.Fatal(err)
			}
			nodeagent = time.Since(start)
			// No-op sync: best of 5 full observe+plan+apply passes.
			before := ns.Host.Writes()
			for j := 0; j < 5; j++ {
				s := time.Now()
				p, err := benchSync(ns.Host, d)
				if err != nil || !p.Empty() {
					b.Fatalf("no-op sync: %v\n%s", err, p)
				}
				if e := time.Since(s); noop == 0 || e < noop {
					noop = e
				}
			}
			noopWrites = ns.Host.Writes() - before
			dropTrunk(b, ns)
		}
		{
			ns := dummyTrunk(b)
			start := time.Now()
			if _, err := benchSync(ns.Host, benchDesired(n, true)); err != nil {
				b.Fatal(err)
			}
			withDAD = time.Since(start)
			dropTrunk(b, ns)
		}
		{
			ns := dummyTrunk(b)
			f, err := os.CreateTemp(b.TempDir(), "batch")
			if err != nil {
				b.Fatal(err)
			}
			f.WriteString(strings.Join(ipCommands(n), "\n") + "\n")
			f.Close()
			start := time.Now()
			if out, err := exec.Command("ip", "-n", ns.Name, "-batch", f.Name()).CombinedOutput(); err != nil {
				b.Fatalf("ip -batch: %v\n%s", err, out)
			}
			batch = time.Since(start)
			dropTrunk(b, ns)
		}
		{
			ns := dummyTrunk(b)
			start := time.Now()
			for _, c := range ipCommands(n) {
				args := append([]string{"-n", ns.Name}, strings.Fields(c)...)
				if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
					b.Fatalf("ip %s: %v\n%s", c, err, out)
				}
			}
			perProc = time.Since(start)
			dropTrunk(b, ns)
		}
		b.ReportMetric(nodeagent.Seconds(), "nodeagent-s")
		b.ReportMetric(withDAD.Seconds(), "nodeagent+dad-s")
		b.ReportMetric(batch.Seconds(), "ip-batch-s")
		b.ReportMetric(perProc.Seconds(), "ip-per-object-s")
		b.ReportMetric(nodeagent.Seconds()/batch.Seconds(), "x-ip-batch")
		b.ReportMetric(perProc.Seconds()/nodeagent.Seconds(), "speedup-vs-per-object")
		b.ReportMetric(float64(noop.Microseconds())/1000, "noop-ms")
		b.ReportMetric(float64(noopWrites), "noop-writes")
		fmt.Printf("\n%d VLANs + %d addresses, cold converge:\n"+
			"  nodeagent            %8.3fs   %.2fx ip -batch (target <= 1.5x)   %.1fx faster than per-object (target >= 10x)\n"+
			"  nodeagent + DAD      %8.3fs   (probes %d x %s, wait %s, all links at once)\n"+
			"  ip -batch            %8.3fs\n"+
			"  ip, one per object   %8.3fs\n"+
			"no-op sync of the same: %.1f ms (target <= 50 ms), %d writes (target 0)\n\n",
			n, n, nodeagent.Seconds(), nodeagent.Seconds()/batch.Seconds(), perProc.Seconds()/nodeagent.Seconds(),
			withDAD.Seconds(), fastDAD.Probes, fastDAD.Interval, fastDAD.Wait,
			batch.Seconds(), perProc.Seconds(), float64(noop.Microseconds())/1000, noopWrites)
	}
}

// dropTrunk deletes the trunk and with it every VLAN on it, so one stage's
// thousand links are gone before the next stage starts.
func dropTrunk(b *testing.B, ns *testenv.NetNS) {
	if l, err := ns.NL.LinkByName("trunk0"); err == nil {
		ns.NL.LinkDel(l)
	}
}

func benchSync(h *host.Host, d Desired) (Plan, error) {
	o, err := Observe(context.Background(), h.Snapshot(), d)
	if err != nil {
		return Plan{}, err
	}
	p := MakePlan(d, o)
	_, rep := Apply(context.Background(), h.Snapshot(), p)
	err = rep.Err()
	return p, err
}
