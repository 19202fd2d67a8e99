package host

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// RouteList reads the IPv4 and IPv6 routes nodeagent looks at: every
// route of protocol proto, in any table, and every route of the tables
// given. The kernel filters them (NETLINK_GET_STRICT_CHK, Linux 4.20 and
// later: one request for the protocol, one per table), so the thousands
// of local and connected routes of a node with many links are neither
// sent nor parsed; where it cannot, one dump of every table is filtered
// here, by each message's header before its attributes are parsed. It
// counts as one routes dump: one read of the routing state.
//
// Routes are read as vishvananda/netlink reads them (Src is the preferred
// source, Dst nil for a default route); a multipath route comes back with
// MultiPath set to a non-nil, empty slice (nodeagent never makes them).
// Route.From and Route.Extra say what that library does not read.
func (h *Host) RouteList(proto uint8, tables []int) ([]Route, error) {
	h.Dumped(DumpRoutes)
	want := map[int]bool{}
	for _, t := range tables {
		want[t] = true
	}
	keep := func(table int, p uint8) bool { return p == proto || want[table] }
	var out []Route
	collect := func(sock *nl.SocketHandle, msg *nl.RtMsg, extra []byte) error {
		req := nl.NewNetlinkRequest(unix.RTM_GETROUTE, unix.NLM_F_DUMP)
		req.AddData(msg)
		if extra != nil {
			req.AddData(nl.NewRtAttr(unix.RTA_TABLE, extra))
		}
		_, err := dumpOn(h, sock, req, unix.RTM_NEWROUTE, func(m []byte) (struct{}, error) {
			r, ok, err := parseRoute(m, keep)
			if err == nil && ok {
				out = append(out, r)
			}
			return struct{}{}, err
		})
		return err
	}
	if h.strict == nil {
		if err := collect(h.route, nl.NewRtMsg(), nil); err != nil {
			return nil, fmt.Errorf("dump routes: %w", err)
		}
		return out, nil
	}
	// Only the fields filtered on are set: nl.NewRtMsg fills in a table,
	// a protocol and a type, which a strict socket would filter on too.
	msg := &nl.RtMsg{RtMsg: unix.RtMsg{Family: unix.AF_UNSPEC, Protocol: proto}}
	if err := collect(h.strict, msg, nil); err != nil {
		return nil, fmt.Errorf("dump routes of protocol %d: %w", proto, err)
	}
	owned := len(out)
	for _, t := range tables {
		msg := &nl.RtMsg{RtMsg: unix.RtMsg{Family: unix.AF_UNSPEC}}
		var extra []byte
		if t < 256 {
			msg.Table = uint8(t)
		} else {
			msg.Table = unix.RT_TABLE_COMPAT
			extra = nl.Uint32Attr(uint32(t))
		}
		if err := collect(h.strict, msg, extra); err != nil {
			return nil, fmt.Errorf("dump routes of table %d: %w", t, err)
		}
	}
	// A route of the protocol in one of the tables came back twice.
	seen := map[string]bool{}
	dedup := out[:0]
	for i, r := range out {
		k := routeKey(r)
		if i >= owned && seen[k] {
			continue
		}
		seen[k] = true
		dedup = append(dedup, r)
	}
	return dedup, nil
}

// RouteListAll reads every IPv4 and IPv6 route of every table (local
// included), with From and Extra, in the kernel's dump order: what
// `nodeagent import` reads a node with. It counts as one routes dump.
func (h *Host) RouteListAll() ([]Route, error) {
	h.Dumped(DumpRoutes)
	var out []Route
	req := nl.NewNetlinkRequest(unix.RTM_GETROUTE, unix.NLM_F_DUMP)
	req.AddData(nl.NewRtMsg())
	_, err := dumpOn(h, h.route, req, unix.RTM_NEWROUTE, func(m []byte) (struct{}, error) {
		r, ok, err := parseRoute(m, func(int, uint8) bool { return true })
		if err == nil && ok {
			out = append(out, r)
		}
		return struct{}{}, err
	})
	if err != nil {
		return nil, fmt.Errorf("dump routes: %w", err)
	}
	return out, nil
}

// Route is a kernel route as RouteList reads it: what vishvananda/netlink
// reads, and what that library (v1.3.1) does not.
type Route struct {
	netlink.Route
	// From is the route's source prefix (RTA_SRC, `ip -6 route add ...
	// from 2001:db8:a::/48`: an IPv6 source-specific route), invalid for
	// none. Such a route is not the same route as one without a from, and
	// nodeagent never makes one.
	From netip.Prefix
	// Extra names what else the route has that nodeagent's routes cannot
	// say (route metrics such as mtu or advmss, tos, realm, an
	// encapsulation, a via of another family, MPLS), in a fixed order;
	// replacing the route with nodeagent's fields would drop them.
	Extra []string
}

// routeKey tells one kernel route from another, for RouteList's dedup.
func routeKey(r Route) string {
	return fmt.Sprintf("%d|%d|%v|%v|%d|%d|%d|%v|%v|%d", r.Family, r.Table, r.Dst, r.From, r.Priority, r.Type, r.Tos, r.Gw, r.Src, r.LinkIndex)
}

// rtaxNames are the route metrics (RTAX_*, linux/rtnetlink.h) by number,
// as ip-route(8) names them.
var rtaxNames = map[uint16]string{
	unix.RTAX_LOCK: "lock", unix.RTAX_MTU: "mtu", unix.RTAX_WINDOW: "window", unix.RTAX_RTT: "rtt",
	unix.RTAX_RTTVAR: "rttvar", unix.RTAX_SSTHRESH: "ssthresh", unix.RTAX_CWND: "cwnd", unix.RTAX_ADVMSS: "advmss",
	unix.RTAX_REORDERING: "reordering", unix.RTAX_HOPLIMIT: "hoplimit", unix.RTAX_INITCWND: "initcwnd",
	unix.RTAX_FEATURES: "features", unix.RTAX_RTO_MIN: "rto_min", unix.RTAX_INITRWND: "initrwnd",
	unix.RTAX_QUICKACK: "quickack", unix.RTAX_CC_ALGO: "congctl", unix.RTAX_FASTOPEN_NO_COOKIE: "fastopen_no_cookie",
}

func parseRoute(m []byte, keep func(int, uint8) bool) (Route, bool, error) {
	if len(m) < unix.SizeofRtMsg {
		return Route{}, false, fmt.Errorf("short rtmsg")
	}
	msg := nl.DeserializeRtMsg(m)
	if msg.Family != unix.AF_INET && msg.Family != unix.AF_INET6 {
		return Route{}, false, nil
	}
	table := int(msg.Table)
	if table != unix.RT_TABLE_COMPAT && !keep(table, msg.Protocol) {
		return Route{}, false, nil // the common case: no attribute parsed
	}
	attrs, err := nl.ParseRouteAttr(m[unix.SizeofRtMsg:])
	if err != nil {
		return Route{}, false, err
	}
	native := nl.NativeEndian()
	r := Route{Route: netlink.Route{
		Family: int(msg.Family), Table: table, Type: int(msg.Type), Protocol: netlink.RouteProtocol(msg.Protocol),
		Scope: netlink.Scope(msg.Scope), Flags: int(msg.Flags), Tos: int(msg.Tos),
	}}
	var metrics []string
	var other []string
	for _, a := range attrs {
		v := a.Value
		switch a.Attr.Type {
		case unix.RTA_SRC:
			// The kernel sends it only for a source prefix of nonzero
			// length (rtm_src_len): vishvananda/netlink drops it.
			if ip, ok := netip.AddrFromSlice(v); ok {
				if p, err := ip.Unmap().Prefix(int(msg.Src_len)); err == nil && msg.Src_len > 0 {
					r.From = p
				}
			}
		case unix.RTA_METRICS:
			if ms, err := nl.ParseRouteAttr(v); err == nil {
				for _, mm := range ms {
					if n, ok := rtaxNames[mm.Attr.Type&^unix.NLA_F_NESTED]; ok {
						metrics = append(metrics, n)
					} else {
						metrics = append(metrics, fmt.Sprintf("metric %d", mm.Attr.Type))
					}
				}
			}
		case unix.RTA_FLOW:
			other = append(other, "realm")
		case unix.RTA_ENCAP:
			other = append(other, "encap")
		case unix.RTA_VIA:
			other = append(other, "via (another family)")
		case unix.RTA_NEWDST:
			other = append(other, "mpls")
		case unix.RTA_TABLE:
			r.Table = int(native.Uint32(v))
		case unix.RTA_DST:
			r.Dst = &net.IPNet{IP: net.IP(append([]byte(nil), v...)), Mask: net.CIDRMask(int(msg.Dst_len), 8*len(v))}
		case unix.RTA_PREFSRC:
			r.Src = net.IP(append([]byte(nil), v...))
		case unix.RTA_GATEWAY:
			r.Gw = net.IP(append([]byte(nil), v...))
		case unix.RTA_OIF:
			r.LinkIndex = int(native.Uint32(v))
		case unix.RTA_PRIORITY:
			r.Priority = int(native.Uint32(v))
		case unix.RTA_MULTIPATH:
			r.MultiPath = []*netlink.NexthopInfo{}
		}
	}
	if table == unix.RT_TABLE_COMPAT && !keep(r.Table, msg.Protocol) {
		return Route{}, false, nil
	}
	if len(metrics)+len(other) > 0 || msg.Tos != 0 {
		slices.Sort(metrics)
		r.Extra = metrics
		if msg.Tos != 0 {
			r.Extra = append(r.Extra, "tos")
		}
		r.Extra = append(r.Extra, other...)
	}
	return r, true, nil
}
