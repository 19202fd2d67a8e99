package gateway

import (
	"errors"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg"
	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/nodeagent/nodeagent/netcfg/sysctl"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// Gate returns des as the role has it now: with the gateway addresses on
// the role's link, claimed at the role's probe timing, while Want says so;
// without the role's WireGuard devices while it does not (their routes
// then wait, and the kill-switch tables, rules and nftables kill switch,
// which stay, hold the VLAN's traffic back).
func (r *Role) Gate(des netcfg.Desired) netcfg.Desired {
	des.Sysctl = r.quietParents(des)
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

// quietParents is des's sysctls with arp_ignore=1 on each link the config
// makes below the role's link (the VLAN link under the shim): a Linux
// host answers ARP for any of its addresses on every interface the
// request reaches (arp_ignore=0), so without it the VLAN link answers for
// the gateway address with its own MAC beside the shim, and pods may send
// their traffic to the wrong one. A value the config sets is left.
func (r *Role) quietParents(des netcfg.Desired) sysctl.Desired {
	parent := map[string]string{}
	for _, l := range des.Link.Links {
		parent[l.Name] = l.Parent
	}
	out := des.Sysctl
	values := maps.Clone(out.Values)
	if values == nil {
		values = map[string]string{}
	}
	for p := parent[r.cfg.Role.Link]; p != ""; p = parent[p] {
		if _, ours := parent[p]; !ours {
			break // a link the config does not make (the trunk NIC)
		}
		key := "net.ipv4.conf." + strings.ReplaceAll(p, ".", "/") + ".arp_ignore"
		if _, set := values[key]; !set {
			values[key] = "1"
		}
	}
	out.Values = values
	return out
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
