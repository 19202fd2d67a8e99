package route

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ObservedRoute is a route in a table nodeagent cares about.
type ObservedRoute struct {
	Route
	Owned bool
	// Extra names what the kernel's route has that Route cannot say
	// (route metrics such as mtu, tos, realm, encap): a replace with
	// nodeagent's fields would drop them, so such a route is not adopted.
	Extra []string
}

// ObservedRule is one rule of the kernel's.
type ObservedRule struct {
	Rule
	Owned bool
	// Proto is the rule's FRA_PROTOCOL: host.Proto for an owned rule; for
	// a foreign one what its maker set (0 from `ip rule add`), which an
	// adoption's delete gives so as to delete it and not nodeagent's.
	Proto uint8
	// Shadowed says a rule at the same priority and family comes before
	// this one in the kernel's list and is not just like it: a delete
	// made from this rule's fields could hit that one, so a foreign rule
	// that is shadowed is not adopted.
	Shadowed bool
}

// Observed is the routing state that matters: every owned route and rule,
// foreign routes in tables nodeagent manages (to detect conflicts), foreign
// rules just like a desired rule marked adopt, the links routes name, and
// the rt_tables.d entry. Rules are in the kernel's list order.
type Observed struct {
	Routes []ObservedRoute
	Rules  []ObservedRule
	// Links maps the links that routes name (desired or observed) to their
	// index; 0 means the link does not exist.
	Links map[string]int
	// TablesFile is the current content of Desired.TablesFile, nil when
	// absent.
	TablesFile []byte
	// Coming are the links another subsystem creates in the same sync
	// (set by the caller, not read from the kernel): routes on them are
	// planned, not pending, and find their index when they are applied.
	Coming []string
}

// Observe dumps routes of every table and rules once each, and finds the
// links routes name in the sync's snapshot s (the link dump the other
// subsystems share, not a lookup per device).
func Observe(ctx context.Context, s *host.Snapshot, d Desired) (Observed, error) {
	h := s.Host()
	o := Observed{Links: map[string]int{}}
	links, err := s.Links()
	if err != nil {
		return o, err
	}
	byName := make(map[string]int, len(links))
	names := make(map[int]string, len(links))
	for _, l := range links {
		byName[l.Name] = l.Index
		names[l.Index] = l.Name
	}
	for _, r := range d.Routes {
		if r.Dev != "" {
			o.Links[r.Dev] = byName[r.Dev] // 0: absent, routes on it are pending
		}
	}
	tables := map[int]bool{}
	for _, r := range d.Routes {
		tables[r.Table] = true
	}
	routes, err := h.RouteList(host.Proto, slices.Sorted(maps.Keys(tables)))
	if err != nil {
		return o, err
	}
	for _, r := range routes {
		owned := int(r.Protocol) == host.Proto
		if !owned && !tables[r.Table] {
			continue
		}
		if r.From.IsValid() {
			// A source-specific route (IPv6 `from`) is another route than
			// one without a from: nodeagent makes none, never compares one
			// with its own, and a route of its own never replaces it.
			continue
		}
		if name, ok := names[r.LinkIndex]; ok {
			// A route on a link no desired route names (an owned route
			// left from an older config).
			if _, named := o.Links[name]; !named {
				o.Links[name] = r.LinkIndex
			}
		}
		or, ok := fromKernelRoute(r.Route, names)
		if !ok {
			continue // multipath or MPLS: never nodeagent's
		}
		o.Routes = append(o.Routes, ObservedRoute{Route: or, Owned: owned, Extra: r.Extra})
	}
	rules, err := h.RuleList()
	if err != nil {
		return o, err
	}
	// earlier holds, per family and priority, the rules met so far in
	// the kernel's list order (the order a rule delete searches).
	type famPrio struct{ fam, prio int }
	type seen struct {
		rule  Rule
		extra bool
	}
	earlier := map[famPrio][]seen{}
	for _, r := range rules {
		kr := fromKernelRule(r)
		extra := len(host.RuleExtraSelectors(r)) > 0
		key := famPrio{r.Family, r.Priority}
		// A delete made from kr's fields matches the first rule at its
		// priority that has them: an earlier rule there that is not
		// exactly kr (another selector, one nodeagent does not model)
		// would be deleted instead.
		shadowed := slices.ContainsFunc(earlier[key], func(e seen) bool { return e.extra || e.rule != kr })
		earlier[key] = append(earlier[key], seen{kr, extra})
		owned := int(r.Protocol) == host.Proto
		if !owned && (!d.AdoptRules[kr] || extra) {
			continue // other foreign rules are never compared, changed or deleted
		}
		o.Rules = append(o.Rules, ObservedRule{Rule: kr, Owned: owned, Proto: r.Protocol, Shadowed: shadowed})
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
	// host.RouteList marks a multipath route with a non-nil, empty
	// MultiPath.
	if r.MultiPath != nil || r.MPLSDst != nil {
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
