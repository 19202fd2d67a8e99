package route

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ObservedRoute is a route in a table nodeagent cares about.
type ObservedRoute struct {
	Route
	Owned bool
}

// ObservedRule is one rule of the kernel's.
type ObservedRule struct {
	Rule
	Owned bool
}

// Observed is the routing state that matters: every owned route and rule,
// foreign routes in tables nodeagent manages (to detect conflicts), the
// links routes name, and the rt_tables.d entry.
type Observed struct {
	Routes []ObservedRoute
	Rules  []ObservedRule
	// Links maps the links that routes name (desired or observed) to their
	// index; 0 means the link does not exist.
	Links map[string]int
	// TablesFile is the current content of Desired.TablesFile, nil when
	// absent.
	TablesFile []byte
}

// Observe dumps routes of every table and rules once each, and looks up
// only the links that routes name (not a dump of every link: the link
// subsystem already dumps them, and with a thousand VLANs that dump is most
// of a no-op sync).
func Observe(ctx context.Context, h *host.Host, d Desired) (Observed, error) {
	o := Observed{Links: map[string]int{}}
	for _, r := range d.Routes {
		if r.Dev == "" {
			continue
		}
		if _, seen := o.Links[r.Dev]; seen {
			continue
		}
		l, err := h.NL().LinkByName(r.Dev)
		var nf netlink.LinkNotFoundError
		switch {
		case errors.As(err, &nf):
			o.Links[r.Dev] = 0 // absent: routes on it are pending
		case err != nil:
			return o, fmt.Errorf("link %s: %w", r.Dev, err)
		default:
			o.Links[r.Dev] = l.Attrs().Index
		}
	}
	names := map[int]string{}
	for name, idx := range o.Links {
		if idx != 0 {
			names[idx] = name
		}
	}
	tables := map[int]bool{}
	for _, r := range d.Routes {
		tables[r.Table] = true
	}
	routes, err := host.Retry(func() ([]netlink.Route, error) {
		return h.NL().RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return o, fmt.Errorf("dump routes: %w", err)
	}
	for _, r := range routes {
		owned := int(r.Protocol) == host.Proto
		if !owned && !tables[r.Table] {
			continue
		}
		if _, ok := names[r.LinkIndex]; !ok && r.LinkIndex != 0 {
			// A route on a link no desired route names (an owned route
			// left from an older config): one lookup per such link.
			if l, err := h.NL().LinkByIndex(r.LinkIndex); err == nil {
				names[r.LinkIndex] = l.Attrs().Name
				if _, named := o.Links[l.Attrs().Name]; !named {
					o.Links[l.Attrs().Name] = r.LinkIndex
				}
			}
		}
		or, ok := fromKernelRoute(r, names)
		if !ok {
			continue // multipath or MPLS: never nodeagent's
		}
		o.Routes = append(o.Routes, ObservedRoute{Route: or, Owned: owned})
	}
	rules, err := h.RuleList()
	if err != nil {
		return o, err
	}
	for _, r := range rules {
		if int(r.Protocol) != host.Proto {
			continue // foreign rules are never compared, changed or deleted
		}
		o.Rules = append(o.Rules, ObservedRule{Rule: fromKernelRule(r), Owned: true})
	}
	if d.TablesFile != "" {
		b, err := os.ReadFile(d.TablesFile)
		if err == nil {
			o.TablesFile = b
		} else if !os.IsNotExist(err) {
			return o, fmt.Errorf("read %s: %w", d.TablesFile, err)
		}
	}
	return o, nil
}

func prefixOf(n *net.IPNet, fam int) netip.Prefix {
	if n == nil {
		if fam == unix.AF_INET6 {
			return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	a, _ := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

func addrOf(ip net.IP) netip.Addr {
	if ip == nil {
		return netip.Addr{}
	}
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func fromKernelRoute(r netlink.Route, names map[int]string) (Route, bool) {
	if len(r.MultiPath) > 0 || r.MPLSDst != nil {
		return Route{}, false
	}
	out := Route{
		Table:  r.Table,
		To:     prefixOf(r.Dst, r.Family),
		Type:   uint8(r.Type),
		Via:    addrOf(r.Gw),
		Src:    addrOf(r.Src),
		Metric: uint32(r.Priority),
		Scope:  uint8(r.Scope),
		OnLink: r.Flags&unix.RTNH_F_ONLINK != 0,
	}
	if out.Type == unix.RTN_UNICAST {
		out.Dev = names[r.LinkIndex]
	}
	return out, true
}

func fromKernelRule(r netlink.Rule) Rule {
	out := Rule{
		Priority: r.Priority, Family: r.Family, IIF: r.IifName, OIF: r.OifName,
		Table: r.Table, Suppress: r.SuppressPrefixlen, Action: r.Type, Invert: r.Invert,
	}
	if r.Src != nil {
		out.From = prefixOf(r.Src, r.Family)
	}
	if r.Dst != nil {
		out.To = prefixOf(r.Dst, r.Family)
	}
	if r.Mark != 0 || r.Mask != nil {
		out.HasMark, out.Mark, out.Mask = true, r.Mark, 0xffffffff
		if r.Mask != nil {
			out.Mask = *r.Mask
		}
	}
	if out.Action != unix.FR_ACT_TO_TBL {
		out.Table = 0
	}
	if out.Suppress < 0 {
		out.Suppress = -1
	}
	return out
}
