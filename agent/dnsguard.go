package agent

import (
	"net/netip"
	"slices"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/nft"
)

// guardDNS gives each DNS redirect of n the links its sources reach the
// node by (nft.DNSRedirect.In), so that their IPv6 DNS for the node is
// dropped: the redirect is IPv4, and IPv6 DNS to the node's own address is
// delivered locally, past the redirect and the kill switch, to the node's
// resolver.
//
// A source's links are the config's VLANs and macvlan shims holding an
// IPv4 address in a subnet that overlaps one of its prefixes, and the
// VLAN parents of those shims (hosts on the VLAN can also reach the node at
// the VLAN link's own link-local address); a trunk, often the uplink too,
// is never one. A source on no link of the config
// (routed to the node by another router) gets no guard here.
func guardDNS(c *config.Config, n nft.Desired) nft.Desired {
	if len(n.DNS) == 0 {
		return n
	}
	type link struct {
		name, parent string
		subnets      []netip.Prefix
	}
	var links []link
	add := func(name, parent string, addrs []string) {
		l := link{name: name, parent: parent}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a); err == nil && p.Addr().Is4() {
				l.subnets = append(l.subnets, p.Masked())
			}
		}
		links = append(links, l)
	}
	for _, v := range c.VLANs {
		add(v.Name, "", v.Addresses)
	}
	for _, m := range c.Macvlans {
		parent := ""
		if slices.ContainsFunc(c.VLANs, func(v config.VLAN) bool { return v.Name == m.Parent }) {
			parent = m.Parent
		}
		add(m.Name, parent, m.Addresses)
	}
	n.DNS = slices.Clone(n.DNS)
	for i, r := range n.DNS {
		var in []string
		for _, l := range links {
			if slices.ContainsFunc(l.subnets, func(s netip.Prefix) bool {
				return slices.ContainsFunc(r.From, s.Overlaps)
			}) {
				in = append(in, l.name)
				if l.parent != "" {
					in = append(in, l.parent)
				}
			}
		}
		slices.Sort(in)
		n.DNS[i].In = slices.Compact(in)
	}
	return n
}
