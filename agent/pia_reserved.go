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
// may not take an address from: the node's addresses' prefixes (those on
// dev itself excepted: its own peer_ip/32), the addresses the config gives
// its links, the destinations of its routes (but a default route, and a
// route through dev: PIA's network is reached by it), its rules' prefixes,
// its firewall's sources and SNAT addresses, the sources of every PIA
// device's DNS redirect and where ports are forwarded to, and the
// addresses the node must resolve by ARP. A prefix of length 0 holds every
// address and is left out.
func reservedPrefixes(c *config.Config, dev string, node map[string][]netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	add := func(s string) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return
			}
			p = netip.PrefixFrom(a, a.BitLen())
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
			add(p.String())
		}
	}
	for _, v := range c.VLANs {
		for _, a := range v.Addresses {
			add(a)
		}
	}
	for _, m := range c.Macvlans {
		for _, a := range m.Addresses {
			add(a)
		}
	}
	for _, w := range c.WireGuard {
		if w.PIA != nil {
			// Every PIA device's, dev's own included: its VLAN's sources
			// and the host its port goes to are not PIA's.
			for _, f := range w.PIA.DNS.For {
				add(f)
			}
			add(w.PIA.PortForward.To)
		}
		if w.Name == dev {
			continue
		}
		for _, a := range w.Addresses {
			add(a)
		}
		for _, p := range w.Peers {
			for _, a := range p.AllowedIPs {
				add(a)
			}
		}
	}
	for _, t := range c.Routing.Tables {
		for _, r := range t.Routes {
			if r.Dev != dev && r.To != "default" {
				add(r.To)
			}
		}
	}
	for _, r := range c.Routing.Rules {
		add(r.From)
		add(r.To)
	}
	for _, m := range c.Firewall.Masquerade {
		add(m.From)
	}
	for _, s := range c.Firewall.SNAT {
		add(s.From)
		add(s.To)
	}
	for _, k := range c.Firewall.KillSwitch {
		add(k.From)
	}
	for _, a := range c.Checks.ARPReachable {
		add(a)
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}
