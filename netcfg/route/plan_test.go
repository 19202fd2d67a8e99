package route

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

func TestMakePlan(t *testing.T) {
	pfx := netip.MustParsePrefix
	dflt := Route{Table: 150, To: pfx("0.0.0.0/0"), Type: unix.RTN_UNICAST, Dev: "wg-pia", Scope: unix.RT_SCOPE_LINK}
	kill := Route{Table: 150, To: pfx("0.0.0.0/0"), Type: unix.RTN_UNREACHABLE, Metric: KillSwitchMetric}
	rule := Rule{Priority: 1000, Family: unix.AF_INET, From: pfx("10.10.50.0/24"), Table: 150, Action: unix.FR_ACT_TO_TBL, Suppress: -1}
	links := map[string]int{"wg-pia": 5, "enp1s0.50": 4}
	owned := func(rs ...Route) []ObservedRoute {
		var out []ObservedRoute
		for _, r := range rs {
			out = append(out, ObservedRoute{Route: r, Owned: true})
		}
		return out
	}
	tests := []struct {
		name string
		d    Desired
		o    Observed
		want string
	}{
		{"cold start: routes before rules", Desired{Routes: []Route{dflt, kill}, Rules: []Rule{rule}}, Observed{Links: links},
			"+ route default dev wg-pia table 150 scope link\n+ route unreachable default table 150 metric 4294967295\n+ rule 1000: from 10.10.50.0/24 lookup 150\n"},
		{"converged", Desired{Routes: []Route{dflt, kill}, Rules: []Rule{rule}},
			Observed{Links: links, Routes: owned(dflt, kill), Rules: []ObservedRule{{Rule: rule, Owned: true}}}, ""},
		{"tunnel device missing: pending, kill switch stays", Desired{Routes: []Route{dflt, kill}},
			Observed{Links: map[string]int{}, Routes: owned(kill)},
			"! route default dev wg-pia table 150 scope link: pending: device wg-pia does not exist yet\n"},
		{"changed route is replaced", Desired{Routes: []Route{func() Route { r := dflt; r.Dev = "enp1s0.50"; return r }()}},
			Observed{Links: links, Routes: owned(dflt)},
			"~ route default dev enp1s0.50 table 150 scope link (was default dev wg-pia table 150 scope link)\n"},
		{"foreign route on the key is a conflict", Desired{Routes: []Route{dflt}},
			Observed{Links: links, Routes: []ObservedRoute{{Route: func() Route { r := dflt; r.Dev = "enp1s0.50"; return r }()}}},
			"! route default dev wg-pia table 150 scope link: a route not created by nodeagent holds this key (default dev enp1s0.50 table 150 scope link); left untouched\n"},
		{"teardown: rules go before routes", Desired{},
			Observed{Links: links, Routes: owned(dflt, kill), Rules: []ObservedRule{{Rule: rule, Owned: true}}},
			"- rule 1000: from 10.10.50.0/24 lookup 150\n- route default dev wg-pia table 150 scope link\n- route unreachable default table 150 metric 4294967295\n"},
		{"rule change: new added before old removed", Desired{Rules: []Rule{func() Rule { r := rule; r.Table = 151; return r }()}},
			Observed{Links: links, Rules: []ObservedRule{{Rule: rule, Owned: true}}},
			"+ rule 1000: from 10.10.50.0/24 lookup 151\n- rule 1000: from 10.10.50.0/24 lookup 150\n"},
		{"foreign route marked adopt: replaced in place", Desired{Routes: []Route{dflt, kill}, AdoptRoutes: map[Route]bool{dflt: true, kill: true}},
			Observed{Links: links, Routes: []ObservedRoute{{Route: dflt}, {Route: kill}}},
			"~ route default dev wg-pia table 150 scope link adopt (mark as nodeagent's)\n~ route unreachable default table 150 metric 4294967295 adopt (mark as nodeagent's)\n"},
		{"foreign route marked adopt that differs: still replaced in place", Desired{Routes: []Route{dflt}, AdoptRoutes: map[Route]bool{dflt: true}},
			Observed{Links: links, Routes: []ObservedRoute{{Route: func() Route { r := dflt; r.Dev = "enp1s0.50"; return r }()}}},
			"~ route default dev wg-pia table 150 scope link adopt (mark as nodeagent's; was default dev enp1s0.50 table 150 scope link)\n"},
		{"foreign route not marked: a conflict as before", Desired{Routes: []Route{dflt, kill}, AdoptRoutes: map[Route]bool{kill: true}},
			Observed{Links: links, Routes: []ObservedRoute{{Route: dflt}, {Route: kill}}},
			"~ route unreachable default table 150 metric 4294967295 adopt (mark as nodeagent's)\n! route default dev wg-pia table 150 scope link: a route not created by nodeagent holds this key (default dev wg-pia table 150 scope link); left untouched\n"},
		{"owned route marked adopt: nothing to do", Desired{Routes: []Route{dflt, kill}, AdoptRoutes: map[Route]bool{dflt: true, kill: true}},
			Observed{Links: links, Routes: append(owned(dflt, kill), ObservedRoute{Route: kill})}, ""},
		{"marked route that does not exist: added", Desired{Routes: []Route{dflt}, AdoptRoutes: map[Route]bool{dflt: true}},
			Observed{Links: links}, "+ route default dev wg-pia table 150 scope link\n"},
		{"foreign rule marked adopt: after the routes", Desired{Routes: []Route{dflt}, Rules: []Rule{rule}, AdoptRoutes: map[Route]bool{dflt: true}, AdoptRules: map[Rule]bool{rule: true}},
			Observed{Links: links, Routes: []ObservedRoute{{Route: dflt}}, Rules: []ObservedRule{{Rule: rule}}},
			"~ route default dev wg-pia table 150 scope link adopt (mark as nodeagent's)\n~ rule 1000: from 10.10.50.0/24 lookup 150 adopt (mark as nodeagent's)\n"},
		{"foreign rule not marked: ours added beside it", Desired{Rules: []Rule{rule}},
			Observed{Links: links, Rules: []ObservedRule{{Rule: rule}}},
			"+ rule 1000: from 10.10.50.0/24 lookup 150\n"},
		{"marked rule that does not exist: added", Desired{Rules: []Rule{rule}, AdoptRules: map[Rule]bool{rule: true}},
			Observed{Links: links}, "+ rule 1000: from 10.10.50.0/24 lookup 150\n"},
		{"owned rule marked adopt: nothing to do", Desired{Rules: []Rule{rule}, AdoptRules: map[Rule]bool{rule: true}},
			Observed{Links: links, Rules: []ObservedRule{{Rule: rule, Owned: true, Proto: 147}}}, ""},
		{"interrupted adoption: the old rule, first in the list, is deleted", Desired{Rules: []Rule{rule}, AdoptRules: map[Rule]bool{rule: true}},
			Observed{Links: links, Rules: []ObservedRule{{Rule: rule}, {Rule: rule, Owned: true, Proto: 147}}},
			"~ rule 1000: from 10.10.50.0/24 lookup 150 adopt (delete the old copy beside nodeagent's)\n"},
		{"interrupted adoption: an old rule without a protocol behind ours is left", Desired{Rules: []Rule{rule}, AdoptRules: map[Rule]bool{rule: true}},
			Observed{Links: links, Rules: []ObservedRule{{Rule: rule, Owned: true, Proto: 147}, {Rule: rule}}}, ""},
		{"interrupted adoption: an old rule with a protocol of its own is deleted wherever it is", Desired{Rules: []Rule{rule}, AdoptRules: map[Rule]bool{rule: true}},
			Observed{Links: links, Rules: []ObservedRule{{Rule: rule, Owned: true, Proto: 147}, {Rule: rule, Proto: unix.RTPROT_BOOT}}},
			"~ rule 1000: from 10.10.50.0/24 lookup 150 adopt (delete the old copy beside nodeagent's)\n"},
		{"foreign rule marked adopt behind another rule at its priority: a conflict, left as it is", Desired{Rules: []Rule{rule}, AdoptRules: map[Rule]bool{rule: true}},
			Observed{Links: links, Rules: []ObservedRule{{Rule: rule, Shadowed: true}}},
			"! rule 1000: from 10.10.50.0/24 lookup 150: another rule at this priority comes before it in the kernel's list, which deleting the old rule could hit; left as it is (give the other rule a priority of its own)\n"},
		{"tables file written, then left alone", Desired{Tables: []Table{{ID: 150, Name: "vlan50-egress"}}, TablesFile: "/x/nodeagent.conf"}, Observed{Links: links},
			"+ file /x/nodeagent.conf\n"},
		{"tables file current", Desired{Tables: []Table{{ID: 150, Name: "vlan50-egress"}}, TablesFile: "/x/nodeagent.conf"},
			Observed{Links: links, TablesFile: TablesFileContent([]Table{{ID: 150, Name: "vlan50-egress"}})}, ""},
		{"tables file removed with the last name", Desired{TablesFile: "/x/nodeagent.conf"},
			Observed{Links: links, TablesFile: []byte("x")}, "- file /x/nodeagent.conf\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, MakePlan(tt.d, tt.o).String()); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAdoptionReport: adoptions are reported as such, so a plan of nothing
// else (the first of a config from nodeagent import) can be told apart.
func TestAdoptionReport(t *testing.T) {
	pfx := netip.MustParsePrefix
	kill := Route{Table: 150, To: pfx("0.0.0.0/0"), Type: unix.RTN_UNREACHABLE, Metric: KillSwitchMetric}
	rule := Rule{Priority: 1000, Family: unix.AF_INET, From: pfx("10.10.50.0/24"), Table: 150, Action: unix.FR_ACT_TO_TBL, Suppress: -1}
	d := Desired{Routes: []Route{kill}, Rules: []Rule{rule}, AdoptRoutes: map[Route]bool{kill: true}, AdoptRules: map[Rule]bool{rule: true}}
	p := MakePlan(d, Observed{Routes: []ObservedRoute{{Route: kill}}, Rules: []ObservedRule{{Rule: rule}}})
	r := p.Report()
	if len(r) != 2 || !r.OnlyAdoptions() {
		t.Fatalf("adoptions not reported as such: %+v", r)
	}
	for _, e := range r {
		if e.Action != '~' || e.Err != nil {
			t.Errorf("adoption entry %+v: want a change without error", e)
		}
	}
	if r[1].Kind != "rule" || r[1].Object != "rule "+rule.String() {
		t.Errorf("rule adoption entry names %s %q", r[1].Kind, r[1].Object)
	}
	p = MakePlan(Desired{Routes: []Route{kill}, Rules: []Rule{rule}, AdoptRules: d.AdoptRules}, Observed{Rules: []ObservedRule{{Rule: rule}}})
	if r := p.Report(); r.OnlyAdoptions() {
		t.Errorf("a plan that adds a route reads as only adoptions:\n%s", r)
	}
}
