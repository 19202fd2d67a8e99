package host

import (
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// LinkFinish renames a freshly created link to its final name, stamps it
// with nodeagent's alias and sets it up or down, all in one RTM_NEWLINK
// message. The kernel ignores IFLA_IFALIAS when a link is created, so a link
// is created under a temporary name first: if nodeagent dies between the
// two messages, what is left is a link with a temporary name (see
// IsTempName) that the next sync removes, never an unmarked link squatting
// on a configured name that would then look foreign.
func (h *Host) LinkFinish(index int, name string, up bool) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	msg.Change = unix.IFF_UP
	if up {
		msg.Flags = unix.IFF_UP
	}
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(LinkAlias)))
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: h.route}
	h.Wrote(1)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("rename to %s and mark: %w", name, err)
	}
	return nil
}

// TempPrefix starts the name of a link between its creation and LinkFinish.
const TempPrefix = "na~"

// IsTempName reports whether name is a temporary name nodeagent gives a link
// it is creating. '~' never appears in a configured name (validation
// rejects it), so such a link is always nodeagent's leftover.
func IsTempName(name string) bool {
	return len(name) > len(TempPrefix) && name[:len(TempPrefix)] == TempPrefix
}
