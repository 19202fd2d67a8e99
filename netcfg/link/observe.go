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
// nodeagent owns, every link d names as a link or a parent, and leftovers of
// interrupted creations. It costs one link dump and one address dump.
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
		owned := a.Alias == host.LinkAlias
		if host.IsTempName(a.Name) {
			o.Temps = append(o.Temps, convert(l, byIndex, true))
			continue
		}
		if !owned && !named[a.Name] {
			continue
		}
		o.Links[a.Name] = convert(l, byIndex, owned)
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

func modeValue(s string) netlink.MacvlanMode {
	for k, v := range modeName {
		if v == s {
			return k
		}
	}
	return netlink.MACVLAN_MODE_BRIDGE
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
