package agent

import (
	"net"
	"net/netip"
	"slices"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
)

// The prefixes a PIA registration may not take an address from: what the
// node has and what its config names. addKey's peer_ip, server_vip and
// dns_servers become the device's address, the probe's target and the
// VLAN's resolver; one of these would take over an address of the node's
// own (its VLAN address as "PIA's resolver" sends the VLAN's DNS to the
// node).

// nodePrefixes reads the node's addresses, by link name, in h's namespace.
// It opens its own netlink sockets (the standard library's), so it may run
// beside the loop, which owns h's.
func nodePrefixes(h *host.Host) (map[string][]netip.Prefix, error) {
	out := map[string][]netip.Prefix{}
	err := h.Do(func() error {
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, ifi := range ifs {
			addrs, err := ifi.Addrs()
			if err != nil {
				return err
			}
			for _, a := range addrs {
				n, ok := a.(*net.IPNet)
				if !ok {
					continue
				}
				ip, ok := netip.AddrFromSlice(n.IP)
				if !ok {
					continue
				}
				ones, _ := n.Mask.Size()
				out[ifi.Name] = append(out[ifi.Name], netip.PrefixFrom(ip.Unmap(), ones))
			}
		}
		return nil
	})
	return out, err
}

// reservedPrefixes are the prefixes a registration of the PIA device dev
// may not take an address from: where an address would be a real clash,
// not merely inside some network the node knows of.
//
//   - The node's own addresses, each exactly (those on dev excepted: its
//     own peer_ip), and the addresses the config gives its links and other
//     WireGuard devices, and the ARP-checked ones: PIA's resolver at one of
//     them sends the VLAN's DNS to that host.
//   - The destinations dev's kill-switch tables route elsewhere than dev
//     (the VLAN's subnet by its shim): an address there is reached outside
//     the tunnel by exactly the traffic the tunnel is for.
//   - Every PIA device's dns.for sources and portForward.to, and the
//     kill-switch sources.
//
// Not reserved: the node's subnets as such, routes of other tables, rules'
// prefixes, other peers' allowed IPs. PIA's resolvers (10.0.0.243) and
// tunnel addresses (10.x) sit inside many a home network (a 10.0.0.0/24
// LAN, a route or rule for 10.0.0.0/8) without clashing: the kill-switch
// table sends them into the tunnel whatever the main table says, and
// refusing them would stop such a node from ever registering.
func reservedPrefixes(c *config.Config, dev string, node map[string][]netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	add := func(s string, exact bool) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if exact {
			p = netip.PrefixFrom(p.Addr(), p.Addr().BitLen())
		}
		if p.Bits() > 0 {
			out = append(out, p.Masked())
		}
	}
	for name, ps := range node {
		if name == dev {
			continue
		}
		for _, p := range ps {
			add(p.String(), true)
		}
	}
	for _, v := range c.VLANs {
		for _, a := range v.Addresses {
			add(a, true)
		}
	}
	for _, m := range c.Macvlans {
		for _, a := range m.Addresses {
			add(a, true)
		}
	}
	for _, w := range c.WireGuard {
		if w.PIA != nil {
			// Every PIA device's, dev's own included: its VLAN's sources
			// and the host its port goes to are not PIA's.
			for _, f := range w.PIA.DNS.For {
				add(f, false)
			}
			add(w.PIA.PortForward.To, true)
		}
		if w.Name == dev {
			continue
		}
		for _, a := range w.Addresses {
			add(a, true)
		}
	}
	for _, t := range c.Routing.Tables {
		if !t.KillSwitch || !slices.ContainsFunc(t.Routes, func(r config.Route) bool { return r.Dev == dev }) {
			continue
		}
		for _, r := range t.Routes {
			if r.Dev != dev && r.To != "default" {
				add(r.To, false)
			}
		}
	}
	for _, s := range c.Firewall.SNAT {
		add(s.To, true)
	}
	for _, k := range c.Firewall.KillSwitch {
		add(k.From, false)
	}
	for _, a := range c.Checks.ARPReachable {
		add(a, true)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}
