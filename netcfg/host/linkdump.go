package host

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Link is what nodeagent reads of a link: identity, ownership marks and the
// few attributes its subsystems manage.
type Link struct {
	Index        int
	Name         string
	Kind         string // IFLA_INFO_KIND: vlan, macvlan, veth, wireguard, ...; "" for hardware
	ParentIndex  int
	MTU          int
	Up           bool
	Alias        string
	Group        uint32
	VLANID       int
	MacvlanMode  uint32 // the kernel's MACVLAN_MODE_* value
	HardwareAddr net.HardwareAddr
	// AltNames are its alternative names (IFLA_PROP_LIST): systemd-
	// networkd's Name= matches them as it matches the name.
	AltNames []string
}

// rtextFilterSkipStats is RTEXT_FILTER_SKIP_STATS (linux/rtnetlink.h).
const rtextFilterSkipStats = 1 << 3

// LinkList dumps every link in the namespace. It asks the kernel to leave
// out the statistics and parses only what nodeagent uses: with a thousand
// links the full dump that vishvananda's LinkList parses is several times
// slower, and the no-op sync is mostly this dump.
func (h *Host) LinkList() ([]Link, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(rtextFilterSkipStats)))
	h.Dumped(DumpLinks)
	out, err := dump(h, req, unix.RTM_NEWLINK, parseLink)
	if err != nil {
		return nil, fmt.Errorf("dump links: %w", err)
	}
	return out, nil
}

func parseLink(m []byte) (Link, error) {
	if len(m) < unix.SizeofIfInfomsg {
		return Link{}, fmt.Errorf("short ifinfomsg")
	}
	msg := nl.DeserializeIfInfomsg(m)
	l := Link{Index: int(msg.Index), Up: msg.Flags&unix.IFF_UP != 0}
	attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfInfomsg:])
	if err != nil {
		return l, err
	}
	native := nl.NativeEndian()
	for _, a := range attrs {
		v := a.Value
		switch a.Attr.Type {
		case unix.IFLA_IFNAME:
			l.Name = unix.ByteSliceToString(v)
		case unix.IFLA_MTU:
			l.MTU = int(native.Uint32(v))
		case unix.IFLA_LINK:
			l.ParentIndex = int(native.Uint32(v))
		case unix.IFLA_IFALIAS:
			l.Alias = unix.ByteSliceToString(v)
		case unix.IFLA_GROUP:
			l.Group = native.Uint32(v)
		case unix.IFLA_ADDRESS:
			l.HardwareAddr = net.HardwareAddr(append([]byte(nil), v...))
		case unix.IFLA_PROP_LIST | unix.NLA_F_NESTED, unix.IFLA_PROP_LIST:
			// The kernel marks this nest NLA_F_NESTED (nla_nest_start).
			props, err := nl.ParseRouteAttr(v)
			if err != nil {
				return l, err
			}
			for _, p := range props {
				if p.Attr.Type&nl.NLA_TYPE_MASK == unix.IFLA_ALT_IFNAME {
					l.AltNames = append(l.AltNames, unix.ByteSliceToString(p.Value))
				}
			}
		case unix.IFLA_LINKINFO:
			info, err := nl.ParseRouteAttr(v)
			if err != nil {
				return l, err
			}
			for _, i := range info {
				switch i.Attr.Type {
				case nl.IFLA_INFO_KIND:
					l.Kind = unix.ByteSliceToString(i.Value)
				case nl.IFLA_INFO_DATA:
					data, err := nl.ParseRouteAttr(i.Value)
					if err != nil {
						return l, err
					}
					for _, d := range data {
						switch {
						case l.Kind == "vlan" && d.Attr.Type == nl.IFLA_VLAN_ID:
							l.VLANID = int(native.Uint16(d.Value))
						case l.Kind == "macvlan" && d.Attr.Type == nl.IFLA_MACVLAN_MODE:
							l.MacvlanMode = native.Uint32(d.Value)
						}
					}
				}
			}
		}
	}
	return l, nil
}
