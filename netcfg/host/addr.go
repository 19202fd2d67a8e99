package host

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ifaProto is IFA_PROTO (linux/if_addr.h, Linux 6.1), which
// vishvananda/netlink v1.3 neither sends nor parses; addresses are therefore
// read and written here with raw rtnetlink messages.
const ifaProto = 11

// Forever is the lifetime of an address that does not expire
// (INFINITY_LIFE_TIME).
const Forever = ^uint32(0)

// Addr is an interface address as the kernel reports it.
type Addr struct {
	LinkIndex int
	Prefix    netip.Prefix
	Scope     uint8
	Flags     uint32
	Proto     uint8
	// ValidLft and PreferredLft are the seconds left of its lifetimes
	// (IFA_CACHEINFO), Forever for an address that does not expire.
	ValidLft, PreferredLft uint32
	// Metric is its prefix route's metric (IFA_RT_PRIORITY), 0 when unset.
	Metric uint32
}

// Owned reports whether the address carries nodeagent's IFA_PROTO mark.
func (a Addr) Owned() bool { return a.Proto == Proto }

// requestFlags are the IFA_F_* flags a program asks for when it adds an
// address; nodeagent asks for none of them. The other flags are the
// kernel's own state (permanent, secondary, tentative, deprecated,
// dadfailed, optimistic during DAD) and say nothing of who added it.
const requestFlags = unix.IFA_F_NODAD | unix.IFA_F_HOMEADDRESS | unix.IFA_F_MANAGETEMPADDR |
	unix.IFA_F_NOPREFIXROUTE | unix.IFA_F_MCAUTOJOIN

// Form says how the address differs from the form nodeagent gives the
// addresses it adds (no request flags, lifetimes forever, no metric),
// in `ip addr` words: "noprefixroute", "valid_lft 300sec", "metric 400".
// It is empty for an address in nodeagent's form, whoever marked it: the
// IFA_PROTO mark is Owned's business.
func (a Addr) Form() []string {
	var out []string
	for _, f := range []struct {
		flag uint32
		name string
	}{
		{unix.IFA_F_NOPREFIXROUTE, "noprefixroute"},
		{unix.IFA_F_NODAD, "nodad"},
		{unix.IFA_F_HOMEADDRESS, "home"},
		{unix.IFA_F_MANAGETEMPADDR, "mngtmpaddr"},
		{unix.IFA_F_MCAUTOJOIN, "autojoin"},
	} {
		if a.Flags&f.flag != 0 {
			out = append(out, f.name)
		}
	}
	if a.ValidLft != Forever {
		out = append(out, fmt.Sprintf("valid_lft %dsec", a.ValidLft))
	} else if a.PreferredLft != Forever {
		out = append(out, fmt.Sprintf("preferred_lft %dsec", a.PreferredLft))
	}
	if a.Metric != 0 {
		out = append(out, fmt.Sprintf("metric %d", a.Metric))
	}
	return out
}

// Plain reports whether the address has the form the kernel gives one
// added with no options (`ip addr add 192.0.2.1/24 dev eth0`): no
// IFA_PROTO, no request flags, lifetimes forever, no metric. That is how
// an address configured before nodeagent ran usually looks.
func (a Addr) Plain() bool { return a.Proto == 0 && len(a.Form()) == 0 }

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
	a := Addr{LinkIndex: int(msg.Index), Scope: msg.Scope, Flags: uint32(msg.Flags), ValidLft: Forever, PreferredLft: Forever}
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
		case unix.IFA_CACHEINFO:
			// struct ifa_cacheinfo: ifa_prefered, ifa_valid, cstamp, tstamp.
			if len(at.Value) >= 8 {
				a.PreferredLft = nl.NativeEndian().Uint32(at.Value[0:4])
				a.ValidLft = nl.NativeEndian().Uint32(at.Value[4:8])
			}
		case unix.IFA_RT_PRIORITY:
			if len(at.Value) >= 4 {
				a.Metric = nl.NativeEndian().Uint32(at.Value)
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

// replaceSetsProto4 reports whether an NLM_F_REPLACE of an existing IPv4
// address takes the IFA_PROTO it carries. Before "net: ipv4: Allow
// changing IPv4 address protocol" (Petr Machata, posted to net-next on
// 2023-03-21 while 6.3 was in its release candidates, so first released in
// 6.4) inet_rtm_newaddr kept the old one; IPv6 took it from 6.1, where
// IFA_PROTO came. The in-place marks are read back, so a kernel that does
// otherwise is found out, never trusted.
var replaceSetsProto4 = sync.OnceValue(func() bool { return kernelAtLeast(6, 4) })

// AddrMarkInPlace reports whether the kernel puts nodeagent's IFA_PROTO
// mark on an existing address of p's family in place, without removing it.
func (h *Host) AddrMarkInPlace(p netip.Prefix) bool {
	return h.AddrProto && (!p.Addr().Is4() || replaceSetsProto4())
}

// AddrReown gives a, an address present on its link without nodeagent's
// mark or in another form (Form), nodeagent's mark and form, and reports
// whether that was done in place. With inPlaceOnly it never deletes the
// address: what a replace cannot fix is an error.
//
// In place is an RTM_NEWADDR with NLM_F_REPLACE: the address never leaves
// the link. What the kernel updates that way depends on its version
// (inet_rtm_newaddr, inet6_addr_modify): IPv6 takes the new IFA_PROTO,
// flags and lifetimes but keeps a non-zero metric; IPv4 takes the
// lifetimes and metric, takes IFA_PROTO only from Linux 6.4 on (6.1, as
// in Debian 12, keeps the old one), and never changes the flags, so an
// IPv4 address with noprefixroute is not even tried in place. The result
// is read back, and what the replace did not fix is deleted and added
// again in two consecutive messages, with nothing (no duplicate-address
// detection: the address was on this link until then) in between.
func (h *Host) AddrReown(a Addr, inPlaceOnly bool) (inPlace bool, err error) {
	p := a.Prefix
	if !p.Addr().Is4() || a.Flags&requestFlags == 0 {
		if err := h.addrMsg(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK, a.LinkIndex, p); err != nil {
			return false, err
		}
		now, err := h.addrOn(a.LinkIndex, p)
		if err != nil {
			return false, err
		}
		if now != nil && (now.Owned() || !h.AddrProto) && len(now.Form()) == 0 {
			return true, nil
		}
	}
	if inPlaceOnly {
		return false, fmt.Errorf("the kernel did not mark %s in place; left as it is", p)
	}
	if err := h.AddrDel(a.LinkIndex, p); err != nil {
		return false, err
	}
	return false, h.AddrAdd(a.LinkIndex, p)
}

// AddrUnmark takes nodeagent's IFA_PROTO mark off the address p of the
// link, in place (one RTM_NEWADDR with NLM_F_REPLACE carrying IFA_PROTO 0
// and the address's own flags, lifetimes and metric, so that nothing else
// changes), and reports whether it is unmarked now: the address is read
// back. It never deletes the address. A kernel that does not take a new
// IFA_PROTO on a replace (IPv4 before Linux 6.4) leaves the mark, and
// AddrUnmark says so with false and no error; an address that is gone, or
// has no mark, is unmarked already.
func (h *Host) AddrUnmark(linkIndex int, p netip.Prefix) (bool, error) {
	cur, err := h.addrOn(linkIndex, p)
	if err != nil || cur == nil || cur.Proto != Proto {
		return err == nil, err
	}
	req := addrRequest(unix.RTM_NEWADDR, unix.NLM_F_REPLACE|unix.NLM_F_ACK, linkIndex, cur.Scope, p)
	req.AddData(nl.NewRtAttr(ifaProto, []byte{0}))
	if f := cur.Flags & requestFlags; f != 0 {
		req.AddData(nl.NewRtAttr(unix.IFA_FLAGS, nl.Uint32Attr(f)))
	}
	if cur.ValidLft != Forever || cur.PreferredLft != Forever {
		ci := make([]byte, 16)
		nl.NativeEndian().PutUint32(ci[0:], cur.PreferredLft)
		nl.NativeEndian().PutUint32(ci[4:], cur.ValidLft)
		req.AddData(nl.NewRtAttr(unix.IFA_CACHEINFO, ci))
	}
	if cur.Metric != 0 {
		req.AddData(nl.NewRtAttr(unix.IFA_RT_PRIORITY, nl.Uint32Attr(cur.Metric)))
	}
	if err := h.exec(req); err != nil {
		return false, err
	}
	now, err := h.addrOn(linkIndex, p)
	if err != nil {
		return false, err
	}
	return now == nil || now.Proto != Proto, nil
}

// addrOn reads the address p of the link, nil when it has none: a dump
// of that link's addresses of p's family, which the kernel filters itself
// on a socket with strict checking.
func (h *Host) addrOn(linkIndex int, p netip.Prefix) (*Addr, error) {
	family := unix.AF_INET6
	if p.Addr().Is4() {
		family = unix.AF_INET
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	msg := nl.NewIfAddrmsg(family)
	sock := h.route
	if h.strict != nil {
		msg.Index = uint32(linkIndex)
		sock = h.strict
	}
	req.AddData(msg)
	h.Dumped(DumpAddresses)
	addrs, err := dumpOn(h, sock, req, unix.RTM_NEWADDR, parseAddr)
	if err != nil {
		return nil, fmt.Errorf("read back address %s: %w", p, err)
	}
	for _, a := range addrs {
		if a.LinkIndex == linkIndex && a.Prefix == p {
			return &a, nil
		}
	}
	return nil, nil
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
	req := addrRequest(typ, flags, linkIndex, 0, p)
	if typ == unix.RTM_NEWADDR {
		req.AddData(nl.NewRtAttr(ifaProto, []byte{Proto}))
	}
	return h.exec(req)
}

// addrRequest is an address message for p on the link, with its local
// address, and its broadcast for an IPv4 prefix shorter than /31.
func addrRequest(typ, flags, linkIndex int, scope uint8, p netip.Prefix) *nl.NetlinkRequest {
	family := unix.AF_INET6
	if p.Addr().Is4() {
		family = unix.AF_INET
	}
	req := nl.NewNetlinkRequest(typ, flags)
	msg := nl.NewIfAddrmsg(family)
	msg.Index = uint32(linkIndex)
	msg.Prefixlen = uint8(p.Bits())
	msg.Scope = scope
	req.AddData(msg)
	ip := p.Addr().AsSlice()
	req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, ip))
	req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, ip))
	if family == unix.AF_INET && p.Bits() < 31 {
		req.AddData(nl.NewRtAttr(unix.IFA_BROADCAST, broadcast(p)))
	}
	return req
}

func broadcast(p netip.Prefix) []byte {
	b := p.Masked().Addr().As4()
	v := binary.BigEndian.Uint32(b[:]) | (1<<(32-p.Bits()) - 1)
	binary.BigEndian.PutUint32(b[:], v)
	return b[:]
}
