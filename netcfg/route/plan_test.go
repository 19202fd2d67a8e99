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
