package link

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/arp"
)

// TestClaimTiming: an address with a claim of its own (a role's gateway
// address) is probed and announced at the claim's timing, with DAD off for
// the rest of the link: taken by another host, it is refused within the
// claim's short wait; free, it is added and announced (the neighbour's
// ARP cache moves to us), while the link's other address is added
// unprobed.
func TestClaimTiming(t *testing.T) {
	node, other := trunkPair(t)
	other.Exec(t, "ip", "addr", "add", "10.10.50.1/24", "dev", "wire0")
	gw := netip.MustParsePrefix("10.10.50.1/24")
	d := Desired{Links: []Link{shim("10.10.50.3/24", gw.String())},
		Claim: map[netip.Addr]arp.Config{gw.Addr(): {Probes: 1, Interval: 50 * time.Millisecond, Wait: 200 * time.Millisecond, Announcements: 2}}}
	start := time.Now()
	_, err := syncOnce(t, node.Host, d)
	var ce *arp.ConflictError
	if !errors.As(err, &ce) || ce.IP != gw.Addr() {
		t.Fatalf("claim of a taken address: %v; want a conflict on %s", err, gw.Addr())
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the refused claim took %s; the claim's timing is 1 probe and 200ms", took)
	}
	if out := node.Exec(t, "ip", "-br", "addr", "show", "dev", "shim0"); !strings.Contains(out, "10.10.50.3/24") || strings.Contains(out, "10.10.50.1/24") {
		t.Errorf("shim0 after the refused claim: %s", out)
	}

	// The other host lets it go, and knows us by another address first.
	other.Exec(t, "ip", "addr", "del", "10.10.50.1/24", "dev", "wire0")
	other.Exec(t, "ip", "addr", "add", "10.10.50.9/24", "dev", "wire0")
	other.Exec(t, "ip", "neigh", "replace", "10.10.50.1", "lladdr", "02:00:00:00:00:01", "dev", "wire0", "nud", "stale")
	mustSync(t, node.Host, d)
	if out := node.Exec(t, "ip", "-br", "addr", "show", "dev", "shim0"); !strings.Contains(out, "10.10.50.1/24") {
		t.Fatalf("shim0 after the free claim: %s", out)
	}
	mac := node.Exec(t, "cat", "/sys/class/net/shim0/address")
	waitUntil := time.Now().Add(5 * time.Second)
	for {
		out := other.Exec(t, "ip", "neigh", "show", "10.10.50.1", "dev", "wire0")
		if strings.Contains(out, strings.TrimSpace(mac)) {
			break
		}
		if time.Now().After(waitUntil) {
			t.Fatalf("the neighbour still has %q for 10.10.50.1; the claim's announcements should have moved it to %s", out, mac)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
