package nft_test

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/nodeagent/nodeagent/netcfg/nft"
	"github.com/nodeagent/nodeagent/testenv"
)

// twoTunnels is two PIA devices whose DNS goes to the same resolver (PIA
// hands every tunnel the same ones), each with its kill switch.
func twoTunnels(extra ...string) nft.Desired {
	p := netip.MustParsePrefix
	res := netip.MustParseAddr("10.0.0.243")
	d := nft.Desired{
		KillSwitch: []nft.KillSwitch{{From: p("10.10.50.0/24"), AllowOut: []string{"wg-pia"}}, {From: p("10.10.60.0/24"), AllowOut: []string{"wg-pia2"}}},
		DNS:        []nft.DNSRedirect{{From: []netip.Prefix{p("10.10.50.0/24")}, To: res}, {From: []netip.Prefix{p("10.10.60.0/24")}, To: res}},
	}
	for _, e := range extra {
		d.KillSwitch = append(d.KillSwitch, nft.KillSwitch{From: p(e), AllowOut: []string{"wg-pia"}})
	}
	return d
}

// TestTwoTunnelsOneResolverKeepConverging is issue 29 §1 as reported: two
// devices with the same resolver, synced, then a kill-switch source added
// by a reload. The second sync must apply (it failed with ENOENT for ever
// when both redirects had a set of one name), the prefix must be in the
// kernel, and nothing must be left to do.
func TestTwoTunnelsOneResolverKeepConverging(t *testing.T) {
	ns := testenv.NewNetNS(t)
	converge(t, ns, twoTunnels())
	d := twoTunnels("10.10.70.0/24")
	converge(t, ns, d)
	out := ns.Exec(t, "nft", "list", "table", "inet", "nodeagent")
	if !strings.Contains(out, "10.10.70.0/24") {
		t.Fatalf("10.10.70.0/24 not in the kill switch after the reload:\n%s", out)
	}
	if !strings.Contains(out, "10.10.50.0/24, 10.10.60.0/24") {
		t.Fatalf("the resolver's set lacks a device's sources:\n%s", out)
	}
	if p := nft.MakePlan(d, observe(t, ns)); !p.Empty() {
		t.Fatalf("not converged after the sync:\n%s", p)
	}
}

// TestRefusedUpdateReplacesTableWhole: an update the kernel refuses (here
// the table was changed by hand between observe and apply, so an element
// the plan deletes is gone: ENOENT) is followed in the same sync by one
// transaction replacing the table whole. The report says so, the table is
// what the config wants, and the kill switch's count is kept.
func TestRefusedUpdateReplacesTableWhole(t *testing.T) {
	ns := testenv.NewNetNS(t)
	converge(t, ns, twoTunnels("10.10.70.0/24", "10.10.80.0/24"))
	// Seven drops, counted by hand into the kill switch's counter.
	ns.Exec(t, "nft", "add", "chain", "inet", "nodeagent", "count7")
	ns.Exec(t, "nft", "add", "rule", "inet", "nodeagent", "count7", "counter", "name", "ks_drops")
	ns.Exec(t, "nft", "add", "rule", "inet", "nodeagent", "output", "meta", "l4proto", "udp", "udp", "dport", "9", "jump", "count7")
	for range 7 {
		sendUDP(t, ns, "127.0.0.1:9")
	}
	d := twoTunnels("10.10.70.0/24")
	o, err := nft.Observe(context.Background(), ns.Host.Snapshot(), d)
	if err != nil {
		t.Fatal(err)
	}
	if o.KillSwitchDrops.Packets != 7 {
		t.Fatalf("counted %d by hand, want 7", o.KillSwitchDrops.Packets)
	}
	p := nft.MakePlan(d, o)
	if !strings.Contains(p.String(), "- nft inet nodeagent set ks_wg-pia_v4: element 10.10.80.0/24") {
		t.Fatalf("the plan does not delete 10.10.80.0/24:\n%s", p)
	}
	// Changed behind the plan's back: the delete it carries is refused.
	ns.Exec(t, "nft", "delete", "element", "inet", "nodeagent", "ks_wg-pia_v4", "{", "10.10.80.0/24", "}")
	_, rep := nft.Apply(context.Background(), ns.Host.Snapshot(), p)
	if err := rep.Err(); err != nil {
		t.Fatalf("apply failed although the table could be replaced: %v", err)
	}
	rs := nft.Replaced(rep)
	if len(rs) != 1 || !strings.Contains(rs[0], "nft table inet nodeagent: replaced whole in one transaction (the update failed:") {
		t.Fatalf("the report does not say the table was replaced: %q\n%s", rs, rep)
	}
	if post := nft.MakePlan(d, observe(t, ns)); !post.Empty() {
		t.Fatalf("not converged after the replacement:\n%s", post)
	}
	if got := observe(t, ns).KillSwitchDrops.Packets; got != 7 {
		t.Fatalf("kill switch counter %d after the replacement, want 7 (carried over)", got)
	}
}

func sendUDP(t *testing.T, ns *testenv.NetNS, addr string) {
	t.Helper()
	ns.Host.Do(func() error {
		c, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	})
}
