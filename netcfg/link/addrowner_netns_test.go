package link

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mdarp "github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/nodeagent/nodeagent/testenv"
)

// addrOf reads the address p of the link called name, failing the test
// when it is not there.
func addrOf(t *testing.T, ns *testenv.NetNS, name string, p string) host.Addr {
	t.Helper()
	l, err := ns.NL.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := ns.Host.AddrList()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if a.LinkIndex == l.Attrs().Index && a.Prefix.String() == p {
			return a
		}
	}
	t.Fatalf("%s is not on %s: %v", p, name, addrs)
	return host.Addr{}
}

// assertOurs fails unless the address is nodeagent's, in nodeagent's form.
func assertOurs(t *testing.T, ns *testenv.NetNS, name, p string) {
	t.Helper()
	if a := addrOf(t, ns, name, p); !a.Owned() || len(a.Form()) != 0 {
		t.Fatalf("%s on %s: proto %d, flags %#x, form %v; want nodeagent's mark and form", p, name, a.Proto, a.Flags, a.Form())
	}
}

// reownEntries returns the report's re-own lines, checking that each is a
// write of an address (what the drift metrics count as a repair of kind
// "address").
func reownEntries(t *testing.T, r plan.Report) []string {
	t.Helper()
	var out []string
	for _, e := range r {
		if !strings.Contains(e.Text, "re-own") && !strings.Contains(e.Text, "adopt address") {
			continue
		}
		if e.Kind != plan.KindAddress || !e.Writes() || e.Err != nil {
			t.Errorf("re-own entry %q: kind %q, writes %v, err %v", e.Text, e.Kind, e.Writes(), e.Err)
		}
		out = append(out, e.Text)
	}
	return out
}

// syncReport is syncOnce returning the whole report.
func syncReport(t *testing.T, h *host.Host, d Desired) (Plan, plan.Report) {
	t.Helper()
	o, err := Observe(t.Context(), h.Snapshot(), d)
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	p := MakePlan(d, o)
	_, rep := Apply(t.Context(), h.Snapshot(), p)
	if err := rep.Err(); err != nil {
		t.Fatalf("apply:\n%s\nerror: %v", p, err)
	}
	return p, rep
}

// NetworkManager, reapplying a link it took as "connected (externally)",
// deletes nodeagent's address and adds the same prefix in its own form:
// noprefixroute (with a prefix route of its own at metric 400) and no
// mark. The next sync re-owns it: nodeagent's mark back, noprefixroute
// gone, one address op that counts as a repair. Then the same for a plain address without the mark (as
// `ip addr add` makes it), which this kernel marks in place.
func TestReownAddressInNetworkManagersForm(t *testing.T) {
	node, _ := trunkPair(t)
	d := Desired{Links: []Link{shim("10.10.50.3/24", "fd00:50::3/64")}, DAD: fastDAD}
	mustSync(t, node.Host, d)
	assertOurs(t, node, "shim0", "10.10.50.3/24")
	assertOurs(t, node, "shim0", "fd00:50::3/64")

	node.Exec(t, "sh", "-c", strings.Join([]string{
		"ip addr del 10.10.50.3/24 dev shim0",
		"ip addr add 10.10.50.3/24 dev shim0 noprefixroute",
		"ip route add 10.10.50.0/24 dev shim0 proto static metric 400",
		"ip addr del fd00:50::3/64 dev shim0",
		"ip addr add fd00:50::3/64 dev shim0 noprefixroute",
	}, " && "))
	if a := addrOf(t, node, "shim0", "10.10.50.3/24"); a.Owned() || !slices.Contains(a.Form(), "noprefixroute") {
		t.Fatalf("the planted address is not in NetworkManager's form: proto %d form %v", a.Proto, a.Form())
	}
	mon := node.NewMonitor(t)
	start := time.Now()
	p, rep := syncReport(t, node.Host, d)
	took := time.Since(start)
	_, msgs := mon.Stop()
	got := reownEntries(t, rep)
	want := []string{
		"~ re-own address 10.10.50.3/24 on shim0 (noprefixroute, not ours)",
		"~ re-own address fd00:50::3/64 on shim0 (noprefixroute, not ours)",
	}
	if !slices.Equal(got, want) || len(rep) != 2 {
		t.Fatalf("plan:\n%s\nwant exactly the re-owns %q", p, want)
	}
	t.Logf("re-own of both addresses: sync took %s; notifications %v", took, msgs)
	assertOurs(t, node, "shim0", "10.10.50.3/24")
	assertOurs(t, node, "shim0", "fd00:50::3/64")
	routes := node.Exec(t, "ip", "route", "show", "dev", "shim0")
	if !strings.Contains(routes, "10.10.50.0/24 proto kernel scope link src 10.10.50.3") {
		t.Errorf("the kernel's prefix route for the re-owned address is missing:\n%s", routes)
	}
	// Deleting the IPv4 address makes the kernel drop the routes through
	// the link that lived on it, NetworkManager's among them: the price of
	// the only way to clear an IPv4 address's noprefixroute.
	t.Logf("routes through shim0 after the re-own:\n%s", routes)
	if r6 := node.Exec(t, "ip", "-6", "route", "show", "dev", "shim0"); !strings.Contains(r6, "fd00:50::/64 proto kernel") {
		t.Errorf("the kernel's IPv6 prefix route for the re-owned address is missing:\n%s", r6)
	}
	// IPv4 keeps its flags on a replace: that one was deleted and added;
	// IPv6 was changed in place. Either way, no probe: the address was on
	// the link all along.
	if n := countOf(msgs, "DELADDR"); n != 1 {
		t.Errorf("want one address deleted (the IPv4 one, whose flags a replace cannot clear), got %d: %v", n, msgs)
	}
	assertNoop(t, node, d)

	// A plain address without the mark: where the kernel can, marked in
	// place (the skip, on 6.1, is of this part alone).
	t.Run("plain address marked in place", func(t *testing.T) {
		if !node.Host.AddrMarkInPlace(netip.MustParsePrefix("10.10.50.3/24")) {
			t.Skip("this kernel does not mark an IPv4 address in place (before 6.3): a plain address is accepted as it is")
		}
		node.Exec(t, "sh", "-c", "ip addr del 10.10.50.3/24 dev shim0 && ip addr add 10.10.50.3/24 dev shim0")
		mon := node.NewMonitor(t)
		p, rep := syncReport(t, node.Host, d)
		_, msgs := mon.Stop()
		if got := reownEntries(t, rep); !slices.Equal(got, []string{"~ re-own address 10.10.50.3/24 on shim0 (not ours)"}) {
			t.Fatalf("plan for a plain address without the mark:\n%s", p)
		}
		if n := countOf(msgs, "DELADDR"); n != 0 {
			t.Errorf("marking a plain address deleted it: %v", msgs)
		}
		assertOurs(t, node, "shim0", "10.10.50.3/24")
		assertNoop(t, node, d)
	})
}

func countOf(msgs []string, typ string) int {
	n := 0
	for _, m := range msgs {
		if strings.HasPrefix(m, typ) {
			n++
		}
	}
	return n
}

// arpCapture counts, on a link of a namespace, the ARP probes and
// gratuitous announcements a given sender sends, per address: what went
// on the wire, not what the sender meant to send.
type arpCapture struct {
	pc     *packet.Conn
	from   net.HardwareAddr
	mu     sync.Mutex
	probes map[netip.Addr]int
	annc   map[netip.Addr]int
	done   chan struct{}
}

func captureARP(t *testing.T, ns *testenv.NetNS, link string, from net.HardwareAddr) *arpCapture {
	t.Helper()
	l, err := ns.NL.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	ifi := &net.Interface{Index: l.Attrs().Index, Name: link, HardwareAddr: l.Attrs().HardwareAddr}
	c := &arpCapture{from: from, probes: map[netip.Addr]int{}, annc: map[netip.Addr]int{}, done: make(chan struct{})}
	err = ns.Host.Do(func() error {
		c.pc, err = packet.Listen(ifi, packet.Raw, 0x0806, nil)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		buf := make([]byte, 1500)
		for {
			n, _, err := c.pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var f ethernet.Frame
			var p mdarp.Packet
			if f.UnmarshalBinary(buf[:n]) != nil || p.UnmarshalBinary(f.Payload) != nil {
				continue
			}
			if p.Operation != mdarp.OperationRequest || p.SenderHardwareAddr.String() != c.from.String() {
				continue
			}
			c.mu.Lock()
			switch {
			case p.SenderIP.IsUnspecified():
				c.probes[p.TargetIP]++
			case p.SenderIP == p.TargetIP:
				c.annc[p.TargetIP]++
			}
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() { c.pc.Close(); <-c.done })
	return c
}

// take returns the probes and announcements counted for ip since the last
// take, after letting frames in flight arrive.
func (c *arpCapture) take(ip netip.Addr) (probes, announcements int) {
	time.Sleep(100 * time.Millisecond)
	c.mu.Lock()
	defer c.mu.Unlock()
	probes, announcements = c.probes[ip], c.annc[ip]
	delete(c.probes, ip)
	delete(c.annc, ip)
	return probes, announcements
}

// A re-add of an address that was nodeagent's moments ago sends one probe
// (claims.go), where the first claim sends the configured three; the
// announcement still follows. The one probe finds a host that took the
// address meanwhile, and from then on that address gets the full
// detection, even when it was nodeagent's moments ago. Probes are counted
// on the wire, at the trunk's far end.
func TestReaddOfRecentAddressIsQuick(t *testing.T) {
	node, other := trunkPair(t)
	dad := &arp.Config{Probes: 3, Interval: time.Second, Wait: 200 * time.Millisecond, Announcements: 1}
	d := Desired{Links: []Link{shim("10.10.50.3/24")}, DAD: dad}
	ip := netip.MustParseAddr("10.10.50.3")
	cap := captureARP(t, other, "wire0", node.Host.StableMAC("shim0"))
	time.Sleep(50 * time.Millisecond)

	mustSync(t, node.Host, d)
	if probes, annc := cap.take(ip); probes != dad.Probes || annc != dad.Announcements {
		t.Fatalf("first claim: %d probes and %d announcements on the wire, want %d and %d", probes, annc, dad.Probes, dad.Announcements)
	}
	assertOurs(t, node, "shim0", "10.10.50.3/24")

	var took []time.Duration
	for i := range 5 {
		node.Exec(t, "ip", "addr", "del", "10.10.50.3/24", "dev", "shim0")
		start := time.Now()
		p := mustSync(t, node.Host, d)
		took = append(took, time.Since(start))
		if !strings.Contains(p.String(), "+ address 10.10.50.3/24 on shim0") {
			t.Fatalf("re-add %d: plan:\n%s", i, p)
		}
		if probes, annc := cap.take(ip); probes != 1 || annc != dad.Announcements {
			t.Errorf("re-add %d: %d probes and %d announcements on the wire, want 1 and %d", i, probes, annc, dad.Announcements)
		}
		assertOurs(t, node, "shim0", "10.10.50.3/24")
	}
	slices.Sort(took)
	t.Logf("re-add of a recent address (sync only, no debounce; configured detection 3 probes 1s apart): median %s, max %s, %v", took[len(took)/2], took[len(took)-1], took)

	// Someone takes the address meanwhile: the one probe finds it.
	node.Exec(t, "ip", "addr", "del", "10.10.50.3/24", "dev", "shim0")
	other.Exec(t, "ip", "addr", "add", "10.10.50.3/24", "dev", "wire0")
	_, err := syncOnce(t, node.Host, d)
	var ce *arp.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("a re-add of an address another host took: want a conflict, got %v", err)
	}
	if probes, _ := cap.take(ip); probes != 1 {
		t.Errorf("the re-add that found the conflict sent %d probes, want 1", probes)
	}
	// Released: the claim after a conflict is a full one.
	other.Exec(t, "ip", "addr", "del", "10.10.50.3/24", "dev", "wire0")
	mustSync(t, node.Host, d)
	if probes, annc := cap.take(ip); probes != dad.Probes || annc != dad.Announcements {
		t.Errorf("claim after a conflict: %d probes and %d announcements, want %d and %d", probes, annc, dad.Probes, dad.Announcements)
	}
	// And so is every re-add after it, the conflict being remembered.
	node.Exec(t, "ip", "addr", "del", "10.10.50.3/24", "dev", "shim0")
	mustSync(t, node.Host, d)
	if probes, _ := cap.take(ip); probes != dad.Probes {
		t.Errorf("re-add of an address once in conflict: %d probes, want the full %d", probes, dad.Probes)
	}
	assertOurs(t, node, "shim0", "10.10.50.3/24")
}

// A new address and a re-added one on the same link in one sync: the
// re-add takes its one probe and is added first, the new one takes the
// full detection.
func TestReaddBesideANewClaim(t *testing.T) {
	node, other := trunkPair(t)
	dad := &arp.Config{Probes: 3, Interval: 300 * time.Millisecond, Wait: 200 * time.Millisecond, Announcements: 1}
	d := Desired{Links: []Link{shim("10.10.50.3/24")}, DAD: dad}
	cap := captureARP(t, other, "wire0", node.Host.StableMAC("shim0"))
	mustSync(t, node.Host, d)
	old, fresh := netip.MustParseAddr("10.10.50.3"), netip.MustParseAddr("10.10.50.4")
	cap.take(old)

	node.Exec(t, "ip", "addr", "del", "10.10.50.3/24", "dev", "shim0")
	d2 := Desired{Links: []Link{shim("10.10.50.3/24", "10.10.50.4/24")}, DAD: dad}
	mustSync(t, node.Host, d2)
	if probes, annc := cap.take(old); probes != 1 || annc != 1 {
		t.Errorf("the re-added address: %d probes, %d announcements; want 1 and 1", probes, annc)
	}
	if probes, annc := cap.take(fresh); probes != dad.Probes || annc != 1 {
		t.Errorf("the new address: %d probes, %d announcements; want %d and 1", probes, annc, dad.Probes)
	}
	assertOurs(t, node, "shim0", "10.10.50.3/24")
	assertOurs(t, node, "shim0", "10.10.50.4/24")
}
