package host

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ifaProto is IFA_PROTO (linux/if_addr.h, Linux 6.1), which
// vishvananda/netlink v1.3 neither sends nor parses; addresses are therefore
// read and written here with raw rtnetlink messages.
const ifaProto = 11

// Addr is an interface address as the kernel reports it.
type Addr struct {
	LinkIndex int
	Prefix    netip.Prefix
	Scope     uint8
	Flags     uint32
	Proto     uint8
}

// Owned reports whether the address carries nodeagent's IFA_PROTO mark.
func (a Addr) Owned() bool { return a.Proto == Proto }

// AddrList dumps every IPv4 and IPv6 address in the namespace.
func (h *Host) AddrList() ([]Addr, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	req.AddData(nl.NewIfAddrmsg(unix.AF_UNSPEC))
	h.Dumped(DumpAddresses)
	out, err := dump(h, req, unix.RTM_NEWADDR, parseAddr)
	if err != nil {
		return nil, fmt.Errorf("dump addresses: %w", err)
	}
	return out, nil
}

// dumpAttempts is how often a dump the kernel reports as interrupted is
// tried again before giving up.
const dumpAttempts = 5

// dump runs a dump request on the handle's socket and parses every reply
// of type typ; the first parse error ends it. A dump that the kernel marks
// interrupted (NLM_F_DUMP_INTR: the table changed while it was read, as
// when IPv6 finishes DAD on a new link) is incomplete, so it is run again.
func dump[T any](h *Host, req *nl.NetlinkRequest, typ uint16, parse func([]byte) (T, error)) ([]T, error) {
	return dumpOn(h, h.route, req, typ, parse)
}

// dumpOn is dump on the socket sock.
func dumpOn[T any](h *Host, sock *nl.SocketHandle, req *nl.NetlinkRequest, typ uint16, parse func([]byte) (T, error)) ([]T, error) {
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: sock}
	var err error
	for range dumpAttempts {
		var out []T
		var perr error
		err = req.ExecuteIter(unix.NETLINK_ROUTE, typ, func(m []byte) bool {
			v, err := parse(m)
			if err != nil {
				perr = err
				return false
			}
			out = append(out, v)
			return true
		})
		if err == nil {
			err = perr
		}
		if !errors.Is(err, nl.ErrDumpInterrupted) {
			return out, err
		}
	}
	return nil, err
}

// Retry runs a read that may fail with an interrupted dump (vishvananda's
// list calls return nl.ErrDumpInterrupted) until it completes.
func Retry[T any](list func() (T, error)) (T, error) {
	var v T
	var err error
	for range dumpAttempts {
		if v, err = list(); !errors.Is(err, nl.ErrDumpInterrupted) {
			return v, err
		}
	}
	return v, err
}

func parseAddr(m []byte) (Addr, error) {
	if len(m) < unix.SizeofIfAddrmsg {
		return Addr{}, fmt.Errorf("short ifaddrmsg")
	}
	msg := nl.DeserializeIfAddrmsg(m)
	a := Addr{LinkIndex: int(msg.Index), Scope: msg.Scope, Flags: uint32(msg.Flags)}
	attrs, err := nl.ParseRouteAttr(m[unix.SizeofIfAddrmsg:])
	if err != nil {
		return Addr{}, err
	}
	var local, address []byte
	for _, at := range attrs {
		switch at.Attr.Type {
		case unix.IFA_LOCAL:
			local = at.Value
		case unix.IFA_ADDRESS:
			address = at.Value
		case unix.IFA_FLAGS:
			if len(at.Value) >= 4 {
				a.Flags = nl.NativeEndian().Uint32(at.Value)
			}
		case ifaProto:
			if len(at.Value) >= 1 {
				a.Proto = at.Value[0]
			}
		}
	}
	// IPv4 reports the local address in IFA_LOCAL (IFA_ADDRESS is the peer
	// on point-to-point links); IPv6 only sends IFA_ADDRESS.
	raw := local
	if raw == nil {
		raw = address
	}
	ip, ok := netip.AddrFromSlice(raw)
	if !ok {
		return Addr{}, fmt.Errorf("bad address attribute %x", raw)
	}
	a.Prefix = netip.PrefixFrom(ip.Unmap(), int(msg.Prefixlen))
	return a, nil
}

// AddrAdd adds p to the link with nodeagent's IFA_PROTO mark (ignored by
// kernels before 6.1, where ownership falls back to owning the link).
func (h *Host) AddrAdd(linkIndex int, p netip.Prefix) error {
	return h.addrMsg(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK, linkIndex, p)
}

// AddrDel removes p from the link. An address that is already gone is
// success: deletion is idempotent.
func (h *Host) AddrDel(linkIndex int, p netip.Prefix) error {
	err := h.addrMsg(unix.RTM_DELADDR, unix.NLM_F_ACK, linkIndex, p)
	if err == unix.EADDRNOTAVAIL || err == unix.ENODEV {
		return nil
	}
	return err
}

func (h *Host) addrMsg(typ, flags, linkIndex int, p netip.Prefix) error {
	family := unix.AF_INET6
	if p.Addr().Is4() {
		family = unix.AF_INET
	}
	req := nl.NewNetlinkRequest(typ, flags)
	msg := nl.NewIfAddrmsg(family)
	msg.Index = uint32(linkIndex)
	msg.Prefixlen = uint8(p.Bits())
	req.AddData(msg)
	ip := p.Addr().AsSlice()
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, ip))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, ip))
	if family == unix.AF_INET && p.Bits() < 31 {
		req.AddData(nl.NewRtAttr(unix.IFA_BROADCAST, broadcast(p)))
	}
	if typ == unix.RTM_NEWADDR {
		req.AddData(nl.NewRtAttr(ifaProto, []byte{Proto}))
	}
	return h.exec(req)
}

func broadcast(p netip.Prefix) []byte {
	b := p.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(b[:]) | (1<<(32-p.Bits()) - 1)
	binary.BigEndian.PutUint32(b[:], v)
	return b[:]
}
