package netcfg

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/route"
	"golang.org/x/sys/unix"
)

// DefaultTablesFile is where the tables' names are written for `ip`.
const DefaultTablesFile = "/etc/iproute2/rt_tables.d/nodeagent.conf"

var (
	routeTypes  = map[string]uint8{"": unix.RTN_UNICAST, "unicast": unix.RTN_UNICAST, "unreachable": unix.RTN_UNREACHABLE, "blackhole": unix.RTN_BLACKHOLE, "prohibit": unix.RTN_PROHIBIT}
	routeScopes = map[string]uint8{"global": unix.RT_SCOPE_UNIVERSE, "link": unix.RT_SCOPE_LINK, "host": unix.RT_SCOPE_HOST}
	ruleActions = map[string]uint8{"": unix.FR_ACT_TO_TBL, "table": unix.FR_ACT_TO_TBL, "unreachable": unix.FR_ACT_UNREACHABLE, "blackhole": unix.FR_ACT_BLACKHOLE, "prohibit": unix.FR_ACT_PROHIBIT}
)

// routeFromConfig derives the routing subsystem's desired state. The config
// is validated already; what fails here is reported, not assumed away.
//
// Resolved here so that desired routes compare with what the kernel reports:
// "default" is 0.0.0.0/0 unless via or src is IPv6; a unicast route without
// a gateway has scope link (as `ip route add` gives it); an IPv6 metric of 0
// is the kernel's 1024. A rule without from/to is installed for IPv4 and
// IPv6, so a catch-all rule cannot leak the other family to the main table.
func routeFromConfig(c config.Routing, tablesFile string) (route.Desired, error) {
	d := route.Desired{TablesFile: tablesFile}
	var errs []error
	for ti, t := range c.Tables {
		d.Tables = append(d.Tables, route.Table{ID: t.ID, Name: t.Name})
		for ri, r := range t.Routes {
			rt, err := convertRoute(t.ID, r)
			if err != nil {
				errs = append(errs, fmt.Errorf("routing.tables[%d].routes[%d]: %w", ti, ri, err))
				continue
			}
			d.Routes = append(d.Routes, rt)
		}
		if t.KillSwitch {
			for _, dflt := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
				d.Routes = append(d.Routes, route.Route{
					Table: t.ID, To: dflt, Type: unix.RTN_UNREACHABLE, Metric: route.KillSwitchMetric,
				})
			}
		}
	}
	for i, r := range c.Rules {
		rules, err := convertRule(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("routing.rules[%d]: %w", i, err))
			continue
		}
		d.Rules = append(d.Rules, rules...)
	}
	return d, errors.Join(errs...)
}

func convertRoute(table int, r config.Route) (route.Route, error) {
	out := route.Route{Table: table, Dev: r.Dev, Metric: uint32(r.Metric), OnLink: r.OnLink}
	var err error
	if r.Via != "" {
		if out.Via, err = netip.ParseAddr(r.Via); err != nil {
			return out, fmt.Errorf("via: %w", err)
		}
	}
	if r.Src != "" {
		if out.Src, err = netip.ParseAddr(r.Src); err != nil {
			return out, fmt.Errorf("src: %w", err)
		}
	}
	switch r.To {
	case "default", "":
		out.To = netip.MustParsePrefix("0.0.0.0/0")
		if out.Via.Is6() || out.Src.Is6() {
			out.To = netip.MustParsePrefix("::/0")
		}
	default:
		if out.To, err = netip.ParsePrefix(r.To); err != nil {
			return out, fmt.Errorf("to: %w", err)
		}
		out.To = out.To.Masked()
	}
	var ok bool
	if out.Type, ok = routeTypes[r.Type]; !ok {
		return out, fmt.Errorf("type %q", r.Type)
	}
	switch {
	case r.Scope != "":
		out.Scope = routeScopes[r.Scope]
	case out.Type == unix.RTN_UNICAST && !out.Via.IsValid():
		out.Scope = unix.RT_SCOPE_LINK
	default:
		out.Scope = unix.RT_SCOPE_UNIVERSE
	}
	if out.To.Addr().Is6() {
		out.Scope = unix.RT_SCOPE_UNIVERSE // the kernel reports every IPv6 route as global
		if out.Metric == 0 {
			out.Metric = 1024
		}
	}
	if out.Type != unix.RTN_UNICAST {
		out.Dev, out.Via = "", netip.Addr{}
	}
	return out, nil
}

func convertRule(r config.Rule) ([]route.Rule, error) {
	base := route.Rule{Priority: r.Priority, IIF: r.IIF, OIF: r.OIF, Invert: r.Invert, Suppress: -1}
	var ok bool
	if base.Action, ok = ruleActions[r.Action]; !ok {
		return nil, fmt.Errorf("action %q", r.Action)
	}
	if base.Action == unix.FR_ACT_TO_TBL {
		base.Table = r.Table
	}
	if r.SuppressPrefixLength != nil {
		base.Suppress = *r.SuppressPrefixLength
	}
	if r.FwMark != "" {
		m, k, err := config.ParseFwMark(r.FwMark)
		if err != nil {
			return nil, fmt.Errorf("fwmark: %w", err)
		}
		base.HasMark, base.Mark, base.Mask = true, m, k
	}
	parse := func(s string) (netip.Prefix, error) {
		if s == "" || s == "all" || s == "default" {
			return netip.Prefix{}, nil
		}
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	var err error
	if base.From, err = parse(r.From); err != nil {
		return nil, fmt.Errorf("from: %w", err)
	}
	if base.To, err = parse(r.To); err != nil {
		return nil, fmt.Errorf("to: %w", err)
	}
	switch {
	case base.From.IsValid():
		base.Family = familyOf(base.From)
	case base.To.IsValid():
		base.Family = familyOf(base.To)
	default:
		v6 := base
		base.Family, v6.Family = unix.AF_INET, unix.AF_INET6
		return []route.Rule{base, v6}, nil
	}
	return []route.Rule{base}, nil
}

func familyOf(p netip.Prefix) int {
	if p.Addr().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}
