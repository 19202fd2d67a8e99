package agent

import (
	"slices"

	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/route"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"golang.org/x/sys/unix"
)

// piaSourceRules adds, for each PIA device that has its address from PIA
// (addKey's peer_ip), a rule sending whatever the node itself sends from
// that address to the device's kill-switch table: its echo replies, TCP
// resets and ICMP errors for what arrives through the tunnel. By the main
// table they would leave by the uplink, outside the tunnel, with the
// tunnel's address as their source.
//
// The rule takes the priority of the config's first rule into that table
// (so it sits with the rules the operator wrote for the tunnel), and
// follows the address when PIA gives another. A device whose kill-switch
// table no rule leads to gets none: the config does not route through it.
func piaSourceRules(c *config.Config, des netcfg.Desired) netcfg.Desired {
	var add []route.Rule
	for _, w := range c.WireGuard {
		if w.PIA == nil {
			continue
		}
		i := slices.IndexFunc(des.WG.Devices, func(d wg.Device) bool { return d.Name == w.Name })
		if i < 0 || len(des.WG.Devices[i].Addrs) == 0 {
			continue
		}
		table, prio := 0, 0
		for _, t := range c.Routing.Tables {
			if t.KillSwitch && slices.ContainsFunc(t.Routes, func(r config.Route) bool { return r.Dev == w.Name }) {
				table = t.ID
				break
			}
		}
		for _, r := range c.Routing.Rules {
			if table != 0 && r.Table == table && (prio == 0 || r.Priority < prio) {
				prio = r.Priority
			}
		}
		if prio == 0 {
			continue
		}
		for _, a := range des.WG.Devices[i].Addrs {
			if !a.Addr().Is4() {
				continue
			}
			add = append(add, route.Rule{Priority: prio, Family: unix.AF_INET, From: a.Masked(), Table: table,
				Suppress: -1, Action: unix.FR_ACT_TO_TBL})
		}
	}
	if len(add) > 0 {
		des.Route.Rules = append(slices.Clone(des.Route.Rules), add...)
	}
	return des
}
