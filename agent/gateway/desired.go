package gateway

import (
	"errors"
	"net"
	"net/netip"
	"slices"

	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// Gate returns des as the role has it now: with the gateway addresses on
// the role's link, claimed at the role's probe timing, while Want says so;
// without the role's WireGuard devices while it does not (their routes
// then wait, and the kill-switch tables, rules and nftables kill switch,
// which stay, hold the VLAN's traffic back).
func (r *Role) Gate(des netcfg.Desired) netcfg.Desired {
	want := r.Want()
	if want {
		des.Link.Links = slices.Clone(des.Link.Links)
		for i, l := range des.Link.Links {
			if l.Name != r.cfg.Role.Link {
				continue
			}
			l.Addrs = slices.Clone(l.Addrs)
			for _, p := range r.addrs {
				if !slices.Contains(l.Addrs, p) {
					l.Addrs = append(l.Addrs, p)
				}
			}
			des.Link.Links[i] = l
		}
		p := r.cfg.Role.Probe
		claim := make(map[netip.Addr]arp.Config, len(r.v4)+len(des.Link.Claim))
		for a, c := range des.Link.Claim {
			claim[a] = c
		}
		for _, a := range r.v4 {
			claim[a] = arp.Config{Probes: p.Probes, Interval: p.Interval, Wait: p.Wait, Announcements: p.Announcements}
		}
		des.Link.Claim = claim
		return des
	}
	if len(r.cfg.Role.WireGuard) > 0 {
		des.WG.Devices = slices.DeleteFunc(slices.Clone(des.WG.Devices), func(d wg.Device) bool {
			return slices.Contains(r.cfg.Role.WireGuard, d.Name)
		})
	}
	return des
}

// Moves reports whether the WireGuard device dev moves with the role.
func (r *Role) Moves(dev string) bool { return slices.Contains(r.cfg.Role.WireGuard, dev) }

// SyncedFrom tells the role what a sync left (Synced): whether every
// gateway address is on the link, and who answered for one when its claim
// was refused.
func (r *Role) SyncedFrom(res netcfg.Result) {
	present := len(r.addrs) > 0
	l, ok := res.Post.Link.Observed.Links[r.cfg.Role.Link]
	for _, p := range r.addrs {
		if !ok || !slices.ContainsFunc(l.Addrs, func(a link.ObservedAddr) bool { return a.Prefix == p }) {
			present = false
		}
	}
	var conflict net.HardwareAddr
	for _, e := range res.Report {
		if e.Subsystem != plan.Links {
			continue
		}
		var ce *arp.ConflictError
		if errors.As(e.Err, &ce) && ce.Link == r.cfg.Role.Link && slices.Contains(r.v4, ce.IP) {
			conflict = ce.MAC
		}
	}
	r.Synced(present, conflict)
}
