package host

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// CreatingGroup is the link group (IFLA_GROUP) a link carries between its
// creation and LinkMark. The kernel ignores IFLA_IFALIAS when it creates a
// link but honours IFLA_GROUP, so a link is born with this group and then
// marked with the alias (and group 0) in a second message. If nodeagent dies
// in between, the next sync recognises the link as its own by the group
// instead of seeing an unmarked link squatting on a configured name.
const CreatingGroup = 0x6e610001 // "na" + 1

// StagingGroup is the link group of a WireGuard device that nodeagent fills
// under a name of its own while it reads the device's peers at start-up
// (wg.Stager). Such a link is not owned (neither the alias nor
// CreatingGroup), so no sync plans it or deletes it: it becomes the device
// when it is renamed and marked, or is deleted.
const StagingGroup = 0x6e610002 // "na" + 2

// LinkSpec is a link to create.
type LinkSpec struct {
	Name        string
	Kind        string // "vlan", "macvlan" or "wireguard"
	ParentIndex int
	// Index asks the kernel for this ifindex (0: the kernel picks). Choosing
	// it saves a lookup of the new link's index per create.
	Index       int
	MTU         int
	Up          bool
	VLANID      int
	MacvlanMode uint32
	// MAC is the hardware address it is made with; nil: the kernel's
	// (random for a macvlan, the parent's for a VLAN).
	MAC net.HardwareAddr
	// Group is the link group it is born with; 0 means CreatingGroup.
	Group uint32
}

// LinkCreate creates a link in one RTM_NEWLINK message, with
// CreatingGroup as its in-flight mark. It returns the new link as the
// kernel echoes it (NLM_F_ECHO, Linux 6.1 and later: its index and
// hardware address, without a lookup); the zero Link when the kernel
// echoes nothing.
func (h *Host) LinkCreate(s LinkSpec) (Link, error) {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK|unix.NLM_F_ECHO)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(s.Index)
	if s.Up {
		msg.Change, msg.Flags = unix.IFF_UP, unix.IFF_UP
	}
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(s.Name)))
	if s.ParentIndex != 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_LINK, nl.Uint32Attr(uint32(s.ParentIndex))))
	}
	group := s.Group
	if group == 0 {
		group = CreatingGroup
	}
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(group)))
	if s.MTU > 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(s.MTU))))
	}
	if len(s.MAC) > 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_ADDRESS, []byte(s.MAC)))
	}
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated(s.Kind))
	switch s.Kind {
	case "vlan":
		data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
		data.AddRtAttr(nl.IFLA_VLAN_ID, nl.Uint16Attr(uint16(s.VLANID)))
	case "macvlan":
		data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
		data.AddRtAttr(nl.IFLA_MACVLAN_MODE, nl.Uint32Attr(s.MacvlanMode))
	case "wireguard": // configured through wgctrl, not link attributes
	default:
		return Link{}, fmt.Errorf("unknown link kind %q", s.Kind)
	}
	req.AddData(info)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: h.route}
	h.Wrote(1)
	// The echo comes first and ends the read; the acknowledgement after it
	// is passed over by the next request on the socket (its sequence
	// number is this one's). A kernel that does not echo sends only the
	// acknowledgement.
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil || len(msgs) == 0 {
		return Link{}, err
	}
	l, err := parseLink(msgs[0])
	if err != nil || l.Name != s.Name {
		return Link{}, nil
	}
	return l, nil
}

// LinkMark stamps the link with nodeagent's alias and clears the in-flight
// group, in one message.
func (h *Host) LinkMark(index int) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(LinkAlias)))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(0)))
	return h.exec(req)
}

// LinkRenameMark renames the link and stamps it as LinkMark does, in one
// message: a process that dies meanwhile leaves either the unowned link
// under its old name or nodeagent's under the new.
func (h *Host) LinkRenameMark(index int, name string) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(LinkAlias)))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(0)))
	return h.exec(req)
}

func (h *Host) exec(req *nl.NetlinkRequest) error {
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: h.route}
	h.Wrote(1)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// LinkUnmark takes nodeagent's mark off the link (an empty IFLA_IFALIAS
// removes the alias) and clears the in-flight group, in one message: the
// link is then no one's in nodeagent's eyes and stays as it is otherwise
// (nodeagent release hands an adopted link back this way).
func (h *Host) LinkUnmark(index int) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFALIAS, []byte{}))
	req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(0)))
	if err := h.exec(req); err != nil {
		return err
	}
	// Owned's memory lets it go too: a link seen as nodeagent's whose
	// alias went would otherwise still be taken for nodeagent's.
	h.oursMu.Lock()
	delete(h.ours, index)
	h.oursMu.Unlock()
	return nil
}
