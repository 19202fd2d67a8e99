package nft

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/google/nftables/expr"
)

// TestNamesUniqueInEveryShape renders thousands of Desired values of every
// shape the config can give (several kill switches with overlapping
// allowOut lists, several PIA devices sharing a resolver, masquerade and
// SNAT on names that differ only in characters a set name cannot hold, v4
// and v6 mixed) and checks that the table's sets, chains and objects have
// unique names without addSet's last-resort renaming, and that every
// lookup names a set of the table. Two sets of one name in a batch are
// one set to the kernel, and every later diff of it fails (issue 29 §1).
func TestNamesUniqueInEveryShape(t *testing.T) {
	ifnames := []string{"wg-pia", "wg_pia", "wg.pia", "wg+pia", "a", "a_b", "a-b", "b", "enp1s0", "enp1s0.50",
		"vlan50-shim", "wg-pia2", "0123456789abcde", "0123456789abcdf", "ks", "_v4", "x_out"}
	v4 := []string{"10.10.50.0/24", "10.10.70.0/24", "10.10.50.0/25", "192.168.1.10/32", "0.0.0.0/0", "10.0.0.0/8"}
	v6 := []string{"fd00:50::/64", "fd00:70::/64", "::/0", "fd00:50::1/128"}
	resolvers := []string{"10.0.0.243", "10.0.0.242", "10.0.0.243", "10.99.0.2"}
	r := rand.New(rand.NewPCG(29, 1))
	pick := func(xs []string) string { return xs[r.IntN(len(xs))] }
	pfx := func() netip.Prefix {
		if r.IntN(3) == 0 {
			return netip.MustParsePrefix(pick(v6))
		}
		return netip.MustParsePrefix(pick(v4))
	}
	list := func() []string {
		out := make([]string, 1+r.IntN(3))
		for i := range out {
			out[i] = pick(ifnames)
		}
		return out
	}
	for i := range 5000 {
		var d Desired
		for range r.IntN(4) {
			d.KillSwitch = append(d.KillSwitch, KillSwitch{From: pfx(), AllowOut: list()})
		}
		for range r.IntN(4) {
			d.Masquerade = append(d.Masquerade, Masquerade{From: pfx(), Out: pick(ifnames)})
		}
		for range r.IntN(3) {
			p := pfx()
			to := netip.MustParseAddr("100.64.0.1")
			if p.Addr().Is6() {
				to = netip.MustParseAddr("fd00::1")
			}
			d.SNAT = append(d.SNAT, SNAT{From: p, Out: pick(ifnames), To: to})
		}
		for range r.IntN(3) {
			d.Forward = append(d.Forward, Forward{In: pick(ifnames), Out: pick(ifnames)})
		}
		if r.IntN(2) == 0 {
			d.MSSClamp = list()
		}
		for range r.IntN(3) {
			d.PortForward = append(d.PortForward, PortForward{In: pick(ifnames), Port: uint16(40000 + r.IntN(3)),
				To: netip.MustParseAddr("10.10.50.10"), ToPort: 8080})
		}
		// One redirect per PIA device; devices share resolvers.
		for range r.IntN(4) {
			var from []netip.Prefix
			for range 1 + r.IntN(2) {
				from = append(from, netip.MustParsePrefix(pick(v4)))
			}
			d.DNS = append(d.DNS, DNSRedirect{From: from, To: netip.MustParseAddr(pick(resolvers))})
		}
		if d.Empty() {
			continue
		}
		b := d.build()
		if b.renamed != 0 {
			t.Fatalf("shape %d: %d set(s) renamed: two groups arrived at one name\n%+v", i, b.renamed, d)
		}
		sets := map[string]bool{}
		for _, s := range b.t.Sets {
			if sets[s.Name] {
				t.Fatalf("shape %d: set %s twice\n%+v", i, s.Name, d)
			}
			if len(s.Name) > 64 {
				t.Fatalf("shape %d: set name %q longer than nft takes", i, s.Name)
			}
			sets[s.Name] = true
		}
		chains := map[string]bool{}
		for _, c := range b.t.Chains {
			if chains[c.Name] {
				t.Fatalf("shape %d: chain %s twice", i, c.Name)
			}
			chains[c.Name] = true
			for _, rl := range c.Rules {
				for _, e := range rl.Exprs {
					if l, ok := e.(*expr.Lookup); ok && !sets[l.SetName] {
						t.Fatalf("shape %d: chain %s looks up set %s, which the table lacks", i, c.Name, l.SetName)
					}
				}
			}
		}
		objs := map[string]bool{}
		for _, o := range b.t.Objects {
			k := o.header()
			if objs[k] {
				t.Fatalf("shape %d: %s twice", i, k)
			}
			objs[k] = true
		}
	}
}

// TestDNSSourcesOfOneResolverShareOneSet: two PIA devices given the same
// resolver have their sources in one set, named after it.
func TestDNSSourcesOfOneResolverShareOneSet(t *testing.T) {
	p := netip.MustParsePrefix
	to := netip.MustParseAddr("10.0.0.243")
	d := Desired{DNS: []DNSRedirect{{From: []netip.Prefix{p("10.10.50.0/24")}, To: to}, {From: []netip.Prefix{p("10.10.60.0/24")}, To: to}}}
	tb := d.Tables()[0]
	if len(tb.Sets) != 1 || tb.Sets[0].Name != "dns_10_0_0_243" {
		t.Fatalf("sets %v, want one, dns_10_0_0_243", tb.Sets)
	}
	want := intervalElements(false, []netip.Prefix{p("10.10.50.0/24"), p("10.10.60.0/24")})
	if len(tb.Sets[0].Elements) != len(want) {
		t.Fatalf("set has %d elements, want %d (both devices' sources)", len(tb.Sets[0].Elements), len(want))
	}
	if n := len(chainOf(&tb, preroutingChain).Rules); n != 2 {
		t.Fatalf("%d prerouting rules, want 2 (udp and tcp to the one resolver)", n)
	}
}
