package nft

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables/expr"
	"github.com/nodeagent/nodeagent/testenv"
)

// FullDesired (exported to the package's external tests) is every kind of firewall entry, as netcfg derives it from
// the config the other tests write as fullConfig.
func FullDesired() Desired {
	p := netip.MustParsePrefix
	return Desired{
		Masquerade: []Masquerade{{From: p("10.10.50.0/24"), Out: "tun0"}, {From: p("fd00:50::/64"), Out: "tun0"}, {From: p("10.90.0.0/24"), Out: "uplink"}},
		SNAT:       []SNAT{{From: p("10.91.0.0/24"), Out: "uplink", To: netip.MustParseAddr("192.0.2.1")}},
		Forward:    []Forward{{In: "wg0", Out: "uplink"}},
		KillSwitch: []KillSwitch{{From: p("10.10.50.0/24"), AllowOut: []string{"tun0"}}, {From: p("fd00:50::/64"), AllowOut: []string{"tun0"}}},
		MSSClamp:   []string{"tun0"},
	}
}

func observeIn(t *testing.T, ns *testenv.NetNS) Observed {
	t.Helper()
	o, err := Observe(context.Background(), ns.Host.Snapshot(), Desired{})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestFailedTransactionChangesNothing checks a claim Apply rests on: a
// batch that changes set elements, empties a chain, refills it and then
// fails part way is rolled back whole, and the table is as it was.
func TestFailedTransactionChangesNothing(t *testing.T) {
	ns := testenv.NewNetNS(t)
	d := FullDesired()
	p := MakePlan(d, observeIn(t, ns))
	if _, rep := Apply(context.Background(), ns.Host.Snapshot(), p); rep.Err() != nil {
		err := rep.Err()
		t.Fatal(err)
	}
	before := ns.Exec(t, "nft", "-j", "list", "table", "inet", "nodeagent")

	changed := FullDesired()
	changed.Masquerade[2].From = netip.MustParsePrefix("10.80.0.0/24")
	want := changed.Tables()
	// A kill-switch rule whose lookup names no set, queued last: by then
	// the batch has changed a set's elements and emptied and refilled
	// chains.
	bad := Rule{Exprs: append(slices.Clone(want[0].Chains[0].Rules[0].Exprs[:3]),
		&expr.Lookup{SourceRegister: 1, SetName: "no-such-set"}, &expr.Verdict{Kind: expr.VerdictDrop})}
	last := &want[0].Chains[len(want[0].Chains)-1]
	last.Rules = append(last.Rules, bad)
	have := observeIn(t, ns)
	bp := Plan{Ops: Diff(want[0], have.Tables[0]), Desired: changed, Observed: have}
	// The batch as Execute compiles it, sent once (Execute would follow a
	// refusal with a replacement of the table).
	c, err := dial(ns.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	b := &batch{c: c.nft}
	ids := make([]int, len(bp.Ops))
	for i := range ids {
		ids[i] = i
	}
	b.compile(bp.Ops, ids)
	if b.err != nil {
		t.Fatal(b.err)
	}
	err = c.nft.Flush()
	if err == nil {
		t.Fatal("a rule looking up a set that does not exist was accepted")
	}
	t.Logf("failed as expected: %v", err)
	if diff := cmp.Diff(before, ns.Exec(t, "nft", "-j", "list", "table", "inet", "nodeagent")); diff != "" {
		t.Fatalf("a failed transaction changed the table (-before +after):\n%s", diff)
	}
	if p := MakePlan(d, observeIn(t, ns)); !p.Empty() {
		t.Fatalf("not the old ruleset after a failed transaction:\n%s", p)
	}
}
