package host

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// RuleList dumps every policy routing rule of both families. It exists
// because vishvananda/netlink v1.3's RuleList drops the rule's action
// (fib_rule_hdr.action), so an `unreachable` rule and a `lookup` rule
// would look alike.
func (h *Host) RuleList() ([]netlink.Rule, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETRULE, unix.NLM_F_DUMP)
	req.AddData(nl.NewRtMsg()) // family AF_UNSPEC: both
	h.Dumped(DumpRules)
	out, err := dump(h, req, unix.RTM_NEWRULE, parseRule)
	if err != nil {
		return nil, fmt.Errorf("dump rules: %w", err)
	}
	return out, nil
}

func parseRule(m []byte) (netlink.Rule, error) {
	if len(m) < unix.SizeofRtMsg {
		return netlink.Rule{}, fmt.Errorf("short fib_rule_hdr")
	}
	// struct fib_rule_hdr has the layout of struct rtmsg, with action
	// where rtmsg has type.
	hdr := nl.DeserializeRtMsg(m)
	r := *netlink.NewRule()
	r.Priority = 0
	r.Family = int(hdr.Family)
	r.Tos = uint(hdr.Tos)
	r.Table = int(hdr.Table)
	r.Type = hdr.Type
	r.Invert = hdr.Flags&netlink.FibRuleInvert != 0
	attrs, err := nl.ParseRouteAttr(m[unix.SizeofRtMsg:])
	if err != nil {
		return r, err
	}
	native := nl.NativeEndian()
	prefix := func(v []byte, bits uint8) *net.IPNet {
		return &net.IPNet{IP: net.IP(v), Mask: net.CIDRMask(int(bits), 8*len(v))}
	}
	for _, a := range attrs {
		v := a.Value
		switch a.Attr.Type {
		case nl.FRA_PRIORITY:
			r.Priority = int(native.Uint32(v))
		case nl.FRA_TABLE:
			r.Table = int(native.Uint32(v))
		case nl.FRA_SRC:
			r.Src = prefix(v, hdr.Src_len)
		case nl.FRA_DST:
			r.Dst = prefix(v, hdr.Dst_len)
		case nl.FRA_IIFNAME:
			r.IifName = unix.ByteSliceToString(v)
		case nl.FRA_OIFNAME:
			r.OifName = unix.ByteSliceToString(v)
		case nl.FRA_FWMARK:
			r.Mark = native.Uint32(v)
		case nl.FRA_FWMASK:
			mask := native.Uint32(v)
			r.Mask = &mask
		case nl.FRA_SUPPRESS_PREFIXLEN:
			r.SuppressPrefixlen = int(int32(native.Uint32(v)))
		case nl.FRA_PROTOCOL:
			r.Protocol = v[0]
		// The selectors nodeagent's rules do not have are read so that
		// such a rule is never taken for one of the config's: see
		// RuleExtraSelectors.
		case nl.FRA_GOTO:
			r.Goto = int(native.Uint32(v))
		case nl.FRA_FLOW:
			r.Flow = int(native.Uint32(v))
		case nl.FRA_TUN_ID:
			if len(v) >= 8 {
				r.TunID = uint(native.Uint64(v))
			}
		case nl.FRA_SUPPRESS_IFGROUP:
			r.SuppressIfgroup = int(int32(native.Uint32(v)))
		case nl.FRA_IP_PROTO:
			r.IPProto = int(v[0])
		case nl.FRA_SPORT_RANGE:
			if len(v) >= 4 {
				r.Sport = netlink.NewRulePortRange(native.Uint16(v), native.Uint16(v[2:]))
			}
		case nl.FRA_DPORT_RANGE:
			if len(v) >= 4 {
				r.Dport = netlink.NewRulePortRange(native.Uint16(v), native.Uint16(v[2:]))
			}
		case nl.FRA_UID_RANGE:
			if len(v) >= 8 {
				r.UIDRange = netlink.NewRuleUIDRange(native.Uint32(v), native.Uint32(v[4:]))
			}
		}
	}
	return r, nil
}

// RuleExtraSelectors names the selectors of r that nodeagent's rules do
// not have (tos, uidrange, ipproto, ports, tun_id, realms,
// suppress_ifgroup, a goto): a rule with any of them is never the config's
// rule, though it looks like one without them, and a rule delete built
// from the config's fields would match it too.
func RuleExtraSelectors(r netlink.Rule) []string {
	var out []string
	add := func(ok bool, name string) {
		if ok {
			out = append(out, name)
		}
	}
	add(r.Tos != 0, "tos")
	add(r.UIDRange != nil, "uidrange")
	add(r.IPProto != 0, "ipproto")
	add(r.Sport != nil, "sport")
	add(r.Dport != nil, "dport")
	add(r.TunID != 0, "tun_id")
	add(r.Flow > 0, "realms")
	add(r.SuppressIfgroup >= 0, "suppress_ifgroup")
	add(r.Goto >= 0, "goto")
	return out
}
