package netcfg

import (
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/nodeagent/nodeagent/netcfg/route"
	"golang.org/x/sys/unix"
)

// Guarded returns whether an entry of p is the kill switch's: nftables
// (the kill switch is in nodeagent's table), a route of a kill-switch
// table (one with the unreachable default at route.KillSwitchMetric) or a
// rule into one. Those are repaired at once, however often: a fight over
// them is never backed off.
func (p Plans) Guarded() func(plan.Entry) bool {
	kill := map[int]bool{}
	for _, r := range p.Route.Desired.Routes {
		if r.Type == unix.RTN_UNREACHABLE && r.Metric == route.KillSwitchMetric {
			kill[r.Table] = true
		}
	}
	objs := map[string]bool{}
	for _, o := range p.Route.Ops {
		if kill[o.Route.Table] || kill[o.Rule.Table] {
			objs[o.Object()] = true
		}
	}
	return func(e plan.Entry) bool {
		return e.Subsystem == plan.Nftables || e.Kind == plan.KindNftables || (e.Subsystem == plan.Routes && objs[e.Object])
	}
}

// Hold takes out of p the changes held says to hold (a fight: agent/fight
// backs off an object another program keeps changing), never the kill
// switch's (Guarded), and returns the rest and the held ones as entries
// that did not apply, with why.
func (p Plans) Hold(held func(plan.Entry) bool, why string) (Plans, plan.Report) {
	guarded := p.Guarded()
	h := func(e plan.Entry) bool { return !guarded(e) && held(e) }
	var out, r plan.Report
	p.Link.Ops, r = plan.Hold(p.Link.Ops, h, why)
	out = append(out, r...)
	p.WG.Ops, r = plan.Hold(p.WG.Ops, h, why)
	out = append(out, r...)
	p.Sysctl.Ops, r = plan.Hold(p.Sysctl.Ops, h, why)
	out = append(out, r...)
	p.Route.Ops, r = plan.Hold(p.Route.Ops, h, why)
	out = append(out, r...)
	p.Held = append(p.Held, out...)
	return p, out
}
