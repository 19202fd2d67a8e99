package netcfg

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/nodeagent/nodeagent/netcfg/route"
)

// Hold takes out what a fight backs off, but never the kill switch's
// objects: the routes of a kill-switch table and the rules into it are
// repaired at once whatever is asked.
func TestHoldSparesTheKillSwitch(t *testing.T) {
	dflt := netip.MustParsePrefix("0.0.0.0/0")
	ks := route.Route{Table: 150, To: dflt, Type: unix.RTN_UNREACHABLE, Metric: route.KillSwitchMetric}
	other := route.Route{Table: 200, To: dflt, Type: unix.RTN_UNICAST, Dev: "wg1"}
	rule := route.Rule{Priority: 1000, Family: unix.AF_INET, From: netip.MustParsePrefix("10.10.50.0/24"), Table: 150, Suppress: -1, Action: unix.FR_ACT_TO_TBL}
	var p Plans
	p.Route.Desired.Routes = []route.Route{ks, other}
	p.Route.Ops = []route.Op{{Kind: route.OpAddRoute, Route: ks}, {Kind: route.OpAddRoute, Route: other}, {Kind: route.OpAddRule, Rule: rule}}
	p.Link.Ops = []link.Op{{Kind: link.OpAddAddr, Link: "enp7s0.50", Addr: netip.MustParsePrefix("10.10.50.1/24")}}
	kept, held := p.Hold(func(plan.Entry) bool { return true }, "a test")
	if len(kept.Route.Ops) != 2 || kept.Route.Ops[0].Route != ks || kept.Route.Ops[1].Rule != rule {
		t.Errorf("kept routes %v", kept.Route.Ops)
	}
	if len(kept.Link.Ops) != 0 || len(held) != 2 {
		t.Fatalf("kept links %v, held %v", kept.Link.Ops, held)
	}
	for _, e := range held {
		if e.Writes() || !e.Held() || e.Failed() || e.Text[0] != '!' {
			t.Errorf("held entry %+v", e)
		}
	}
	// Apply reports them.
	if kept.Empty() || len(kept.Held) != 2 {
		t.Errorf("the held entries are not in the plans: %v", kept.Held)
	}
}
