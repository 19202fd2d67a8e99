package host

import (
	"fmt"
	"net"

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
func (h *Host) RouteList(proto uint8, tables []int) ([]netlink.Route, error) {
	h.Dumped(DumpRoutes)
	want := map[int]bool{}
	for _, t := range tables {
		want[t] = true
	}
	keep := func(table int, p uint8) bool { return p == proto || want[table] }
	var out []netlink.Route
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

// routeKey tells one kernel route from another, for RouteList's dedup.
func routeKey(r netlink.Route) string {
	return fmt.Sprintf("%d|%d|%v|%d|%d|%d|%v|%v|%d", r.Family, r.Table, r.Dst, r.Priority, r.Type, r.Tos, r.Gw, r.Src, r.LinkIndex)
}

func parseRoute(m []byte, keep func(int, uint8) bool) (netlink.Route, bool, error) {
	if len(m) < unix.SizeofRtMsg {
		return netlink.Route{}, false, fmt.Errorf("short rtmsg")
	}
	msg := nl.DeserializeRtMsg(m)
	if msg.Family != unix.AF_INET && msg.Family != unix.AF_INET6 {
		return netlink.Route{}, false, nil
	}
	table := int(msg.Table)
	if table != unix.RT_TABLE_COMPAT && !keep(table, msg.Protocol) {
		return netlink.Route{}, false, nil // the common case: no attribute parsed
	}
	attrs, err := nl.ParseRouteAttr(m[unix.SizeofRtMsg:])
	if err != nil {
		return netlink.Route{}, false, err
	}
	native := nl.NativeEndian()
	r := netlink.Route{
		Family: int(msg.Family), Table: table, Type: int(msg.Type), Protocol: netlink.RouteProtocol(msg.Protocol),
		Scope: netlink.Scope(msg.Scope), Flags: int(msg.Flags), Tos: int(msg.Tos),
	}
	for _, a := range attrs {
		v := a.Value
		switch a.Attr.Type {
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
		return netlink.Route{}, false, nil
	}
	return r, true, nil
}
