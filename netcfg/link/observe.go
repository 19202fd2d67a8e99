package link

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink"
)

// Observe reads the links and addresses that matter to d: every link
// nodeagent owns (marked, or born with host.CreatingGroup and not yet
// marked) and every link d names as a link or a parent. It costs one link
// dump and one address dump.
func Observe(ctx context.Context, h *host.Host, d Desired) (Observed, error) {
	links, err := h.NL().LinkList()
	if err != nil {
		return Observed{}, fmt.Errorf("dump links: %w", err)
	}
	named := map[string]bool{}
	for _, l := range d.Links {
		named[l.Name] = true
		named[l.Parent] = true
	}
	byIndex := make(map[int]string, len(links))
	for _, l := range links {
		byIndex[l.Attrs().Index] = l.Attrs().Name
	}
	o := Observed{Links: map[string]ObservedLink{}}
	keep := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		o.MaxIndex = max(o.MaxIndex, a.Index)
		interrupted := a.Alias != host.LinkAlias && a.Group == host.CreatingGroup
		owned := a.Alias == host.LinkAlias || interrupted
		if !owned && !named[a.Name] {
			continue
		}
		ol := convert(l, byIndex, owned)
		ol.Interrupted = interrupted
		o.Links[a.Name] = ol
		keep[a.Index] = a.Name
	}
	if len(keep) == 0 {
		return o, nil
	}
	addrs, err := h.AddrList()
	if err != nil {
		return Observed{}, err
	}
	for _, a := range addrs {
		name, ok := keep[a.LinkIndex]
		if !ok || a.Prefix.Addr().IsLinkLocalUnicast() {
			continue
		}
		ol := o.Links[name]
		// Before Linux 6.1 the kernel drops IFA_PROTO; then the global
		// addresses of a link nodeagent owns are taken to be its own.
		owned := a.Owned() || (!h.AddrProto && ol.Owned && a.Scope == 0)
		ol.Addrs = append(ol.Addrs, ObservedAddr{Prefix: a.Prefix, Owned: owned})
		o.Links[name] = ol
	}
	return o, nil
}

func convert(l netlink.Link, byIndex map[int]string, owned bool) ObservedLink {
	a := l.Attrs()
	ol := ObservedLink{
		Index:  a.Index,
		Name:   a.Name,
		Kind:   l.Type(),
		Parent: byIndex[a.ParentIndex],
		MTU:    a.MTU,
		Up:     a.Flags&net.FlagUp != 0,
		Owned:  owned,
	}
	switch v := l.(type) {
	case *netlink.Vlan:
		ol.VLANID = v.VlanId
	case *netlink.Macvlan:
		ol.Mode = modeName[v.Mode]
	}
	return ol
}

var modeName = map[netlink.MacvlanMode]string{
	netlink.MACVLAN_MODE_PRIVATE:  "private",
	netlink.MACVLAN_MODE_VEPA:     "vepa",
	netlink.MACVLAN_MODE_BRIDGE:   "bridge",
	netlink.MACVLAN_MODE_PASSTHRU: "passthru",
	netlink.MACVLAN_MODE_SOURCE:   "source",
}

// kernelMode is the kernel's MACVLAN_MODE_* value for a mode name
// (linux/if_link.h; vishvananda's own enum numbers them differently).
func kernelMode(s string) uint32 {
	switch s {
	case "private":
		return 1
	case "vepa":
		return 2
	case "passthru":
		return 8
	case "source":
		return 16
	}
	return 4 // bridge
}

// v4 returns the IPv4 addresses among ps.
func v4(ps []netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for _, p := range ps {
		if p.Addr().Is4() {
			out = append(out, p.Addr())
		}
	}
	return out
}
