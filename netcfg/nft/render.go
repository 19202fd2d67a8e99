package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// This file renders tables into nft-like text, one line per table, chain,
// set, set element and rule. Desired and observed tables go through the same
// functions, and the lines are what MakePlan compares: two rules are the
// same when they render the same. The renderer recognises the expression
// sequences nodeagent builds and prints them as nft does; anything else is
// printed field by field, so a difference in any field shows.

// familyName is the nft keyword of a table family.
func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family%d", f)
}

// header renders the table line: its flags, if any.
func (t Table) header() string {
	if t.Flags == 0 {
		return "table"
	}
	var flags []string
	if t.Flags&unix.NFT_TABLE_F_DORMANT != 0 {
		flags = append(flags, "dormant")
	}
	if t.Flags&nftTableFOwner != 0 {
		flags = append(flags, "owner")
	}
	if rest := t.Flags &^ (unix.NFT_TABLE_F_DORMANT | nftTableFOwner); rest != 0 {
		flags = append(flags, fmt.Sprintf("%#x", rest))
	}
	return "table flags " + strings.Join(flags, ",")
}

// hookName is the nft keyword of an inet-family hook.
func hookName(h nftables.ChainHook) string {
	switch h {
	case unix.NF_INET_PRE_ROUTING:
		return "prerouting"
	case unix.NF_INET_LOCAL_IN:
		return "input"
	case unix.NF_INET_FORWARD:
		return "forward"
	case unix.NF_INET_LOCAL_OUT:
		return "output"
	case unix.NF_INET_POST_ROUTING:
		return "postrouting"
	}
	return strconv.Itoa(int(h))
}

// header renders a chain's declaration.
func (c Chain) header() string {
	if c.Hooknum == nil {
		return "chain " + c.Name + " {}"
	}
	hook := hookName(*c.Hooknum)
	prio := 0
	if c.Priority != nil {
		prio = int(*c.Priority)
	}
	policy := "accept"
	if c.Policy != nil && *c.Policy == nftables.ChainPolicyDrop {
		policy = "drop"
	}
	return fmt.Sprintf("chain %s { type %s hook %s priority %d; policy %s; }", c.Name, c.Type, hook, prio, policy)
}

// objTypeNames are the nft keywords of object types.
var objTypeNames = map[nftables.ObjType]string{
	nftables.ObjTypeCounter: "counter", nftables.ObjTypeQuota: "quota", nftables.ObjTypeCtHelper: "ct helper",
	nftables.ObjTypeLimit: "limit", nftables.ObjTypeConnLimit: "connlimit", nftables.ObjTypeTunnel: "tunnel",
	nftables.ObjTypeCtTimeout: "ct timeout", nftables.ObjTypeSecMark: "secmark", nftables.ObjTypeCtExpect: "ct expectation",
	nftables.ObjTypeSynProxy: "synproxy",
}

// header renders an object's declaration: its type and name. What it holds
// (a counter's counts) is not rendered: it changes with the traffic, and
// nodeagent never writes it.
func (o Object) header() string {
	typ, ok := objTypeNames[o.Type]
	if !ok {
		typ = fmt.Sprintf("object type %d", o.Type)
	}
	return typ + " " + o.Name
}

// header renders a set's declaration.
func (s Set) header() string {
	typ := s.KeyType.Name
	if s.KeyType.Bytes != standardKeyLen(s.KeyType.Name) {
		typ = fmt.Sprintf("%s len %d", s.KeyType.Name, s.KeyType.Bytes)
	}
	var flags []string
	for _, f := range []struct {
		on   bool
		name string
	}{{s.Anonymous, "anonymous"}, {s.Constant, "constant"}, {s.Interval, "interval"}, {s.IsMap, "map"},
		{s.HasTimeout, "timeout"}, {s.Dynamic, "dynamic"}, {s.Concatenation, "concat"}} {
		if f.on {
			flags = append(flags, f.name)
		}
	}
	if len(flags) == 0 {
		return fmt.Sprintf("set %s { type %s; }", s.Name, typ)
	}
	return fmt.Sprintf("set %s { type %s; flags %s; }", s.Name, typ, strings.Join(flags, ","))
}

// standardKeyLen is the key length of the set types nodeagent uses, 0 for
// others.
func standardKeyLen(typ string) uint32 {
	switch typ {
	case "ipv4_addr":
		return 4
	case "ipv6_addr":
		return 16
	case "ifname":
		return unix.IFNAMSIZ
	}
	return 0
}

// elements renders a set's elements, sorted: an interval set of addresses
// as the ranges it matches (a prefix where the range is one), an ifname set
// as quoted names.
func (s Set) elements() []string {
	var out []string
	switch {
	case s.Interval && (s.KeyType.Name == "ipv4_addr" || s.KeyType.Name == "ipv6_addr"):
		out = intervals(s.Elements)
	default:
		for _, e := range s.Elements {
			k := keyString(s.KeyType.Name, e.Key)
			if len(e.KeyEnd) > 0 {
				k += "-" + keyString(s.KeyType.Name, e.KeyEnd)
			}
			if e.IntervalEnd {
				k += " interval-end"
			}
			if len(e.Val) > 0 {
				k += fmt.Sprintf(" : %#x", e.Val)
			}
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func keyString(typ string, k []byte) string {
	switch typ {
	case "ipv4_addr", "ipv6_addr":
		if a, ok := netip.AddrFromSlice(k); ok {
			return a.String()
		}
	case "ifname":
		if n, ok := ifnameString(k); ok {
			return strconv.Quote(n)
		}
	}
	return fmt.Sprintf("%#x", k)
}

// intervals renders the elements of an interval set of addresses as the
// ranges they match. Elements are ordered by key; a start element runs to
// the interval end that follows it, or, when none does, to the top of the
// address space. An interval end with no start before it (nft puts one at
// address zero) matches nothing and is not shown.
func intervals(all []nftables.SetElement) []string {
	els := sortedElements(all)
	var out []string
	for i, e := range els {
		if e.IntervalEnd {
			continue
		}
		lo, ok := netip.AddrFromSlice(e.Key)
		if !ok {
			out = append(out, fmt.Sprintf("%#x", e.Key))
			continue
		}
		var hi netip.Addr
		switch {
		case len(e.KeyEnd) > 0:
			hi, _ = netip.AddrFromSlice(e.KeyEnd)
		case i+1 < len(els) && els[i+1].IntervalEnd:
			end, _ := netip.AddrFromSlice(els[i+1].Key)
			hi = end.Prev()
		case i+1 < len(els):
			// Another start before any end: the kernel matches up to it.
			out = append(out, lo.String()+"-(unterminated)")
			continue
		default:
			hi = lastAddr(netip.PrefixFrom(lo, 0))
		}
		out = append(out, rangeString(lo, hi))
	}
	return out
}

// sortedElements returns els ordered by key, an interval end before a
// start at the same key (it closes the range before).
func sortedElements(els []nftables.SetElement) []nftables.SetElement {
	out := make([]nftables.SetElement, len(els))
	for i, j := range sortedIndex(els) {
		out[i] = els[j]
	}
	return out
}

func compareElements(a, b *nftables.SetElement) int {
	if c := bytes.Compare(a.Key, b.Key); c != 0 {
		return c
	}
	switch {
	case a.IntervalEnd == b.IntervalEnd:
		return bytes.Compare(a.KeyEnd, b.KeyEnd)
	case a.IntervalEnd:
		return -1
	}
	return 1
}

// rangeString renders lo-hi as a prefix when it is one: when the two
// differ in their last n bits only, all zeros in lo and all ones in hi.
func rangeString(lo, hi netip.Addr) string {
	if !hi.IsValid() || hi.Less(lo) || lo.BitLen() != hi.BitLen() {
		return lo.String() + "-?"
	}
	a, b := lo.AsSlice(), hi.AsSlice()
	common := 0
	for common < len(a)*8 && a[common/8]&(0x80>>(common%8)) == b[common/8]&(0x80>>(common%8)) {
		common++
	}
	for i := common; i < len(a)*8; i++ {
		bit := byte(0x80 >> (i % 8))
		if a[i/8]&bit != 0 || b[i/8]&bit == 0 {
			return lo.String() + "-" + hi.String()
		}
	}
	return netip.PrefixFrom(lo, common).String()
}

func ifnameString(b []byte) (string, bool) {
	n := bytes.TrimRight(b, "\x00")
	if len(n) == 0 || bytes.IndexByte(n, 0) >= 0 || len(b) != unix.IFNAMSIZ {
		return "", false
	}
	return string(n), true
}

// String renders the rule as nft prints it, comment included.
func (r Rule) String() string {
	s := renderExprs(r.Exprs)
	if len(r.UserData) > 0 {
		if c, ok := commentOf(r.UserData); ok {
			s += " comment " + strconv.Quote(c)
		} else {
			s += fmt.Sprintf(" userdata %#x", r.UserData)
		}
	}
	return strings.TrimSpace(s)
}

// commentOf returns the comment of a rule's user data when the user data is
// exactly one comment (libnftnl's TLV: type 0, length, NUL-terminated text).
func commentOf(ud []byte) (string, bool) {
	if len(ud) < 3 || ud[0] != 0 || int(ud[1]) != len(ud)-2 || ud[len(ud)-1] != 0 {
		return "", false
	}
	return string(ud[2 : len(ud)-1]), true
}

// renderExprs decompiles an expression list. It matches the sequences
// nodeagent builds at each position and falls back to one expression at a
// time, printed with all its fields.
func renderExprs(es []any) string {
	var out []string
	for i := 0; i < len(es); {
		s, n := match(es[i:])
		if n == 0 {
			s, n = single(es[i]), 1
		}
		out = append(out, s)
		i += n
	}
	return strings.Join(out, " ")
}

// match recognises a multi-expression sequence at the start of es and
// returns its text and length, or 0.
func match(es []any) (string, int) {
	at := func(i int) any {
		if i < len(es) {
			return es[i]
		}
		return nil
	}
	// dnat ip to A[:P], behind its meta nfproto ipv4 guard.
	if m, ok := at(0).(*expr.Meta); ok && isLoad(m, expr.MetaKeyNFPROTO) {
		c, ok1 := at(1).(*expr.Cmp)
		im, ok2 := at(2).(*expr.Immediate)
		if ok1 && ok2 && isCmp(c, expr.CmpOpEq, 1) && c.Data[0] == unix.NFPROTO_IPV4 && im.Register == 1 && len(im.Data) == 4 {
			a, _ := netip.AddrFromSlice(im.Data)
			port, n := "", 3
			if ip, ok := at(3).(*expr.Immediate); ok && ip.Register == 2 && len(ip.Data) == 2 {
				port, n = fmt.Sprintf(":%d", binary.BigEndian.Uint16(ip.Data)), 4
			}
			if nat, ok := at(n).(*expr.NAT); ok && isDNAT(nat, port != "") {
				return "dnat ip to " + a.String() + port, n + 1
			}
		}
	}
	// meta nfproto ipvX; payload saddr/daddr; lookup or cmp.
	if m, ok := at(0).(*expr.Meta); ok && isLoad(m, expr.MetaKeyNFPROTO) {
		c, ok1 := at(1).(*expr.Cmp)
		p, ok2 := at(2).(*expr.Payload)
		if ok1 && ok2 && isCmp(c, expr.CmpOpEq, 1) && isLoadPayload(p, expr.PayloadBaseNetworkHeader) {
			var field string
			switch {
			case c.Data[0] == unix.NFPROTO_IPV4 && p.Offset == 12 && p.Len == 4:
				field = "ip saddr"
			case c.Data[0] == unix.NFPROTO_IPV4 && p.Offset == 16 && p.Len == 4:
				field = "ip daddr"
			case c.Data[0] == unix.NFPROTO_IPV6 && p.Offset == 8 && p.Len == 16:
				field = "ip6 saddr"
			case c.Data[0] == unix.NFPROTO_IPV6 && p.Offset == 24 && p.Len == 16:
				field = "ip6 daddr"
			}
			if field != "" {
				if rhs, ok := matchRHS(at(3), int(p.Len), func(b []byte) string {
					a, _ := netip.AddrFromSlice(b)
					return a.String()
				}); ok {
					return field + " " + rhs, 4
				}
			}
		}
	}
	// meta nfproto ipvX meta l4proto icmp[v6] @th,O,L; lookup or cmp.
	if m, ok := at(0).(*expr.Meta); ok && isLoad(m, expr.MetaKeyNFPROTO) {
		c, ok1 := at(1).(*expr.Cmp)
		m2, ok2 := at(2).(*expr.Meta)
		c2, ok3 := at(3).(*expr.Cmp)
		p, ok4 := at(4).(*expr.Payload)
		if ok1 && ok2 && ok3 && ok4 && isCmp(c, expr.CmpOpEq, 1) && isLoad(m2, expr.MetaKeyL4PROTO) && isCmp(c2, expr.CmpOpEq, 1) &&
			isLoadPayload(p, expr.PayloadBaseTransportHeader) && (p.Len == 4 || p.Len == 16) {
			l4 := map[byte]string{unix.IPPROTO_ICMP: "icmp", unix.IPPROTO_ICMPV6: "ipv6-icmp"}[c2.Data[0]]
			fam := map[byte]string{unix.NFPROTO_IPV4: "ipv4", unix.NFPROTO_IPV6: "ipv6"}[c.Data[0]]
			if rhs, ok := matchRHS(at(5), int(p.Len), func(b []byte) string {
				a, _ := netip.AddrFromSlice(b)
				return a.String()
			}); ok && l4 != "" && fam != "" {
				return fmt.Sprintf("meta nfproto %s meta l4proto %s @th,%d,%d %s", fam, l4, p.Offset*8, p.Len*8, rhs), 6
			}
		}
	}
	// meta nfproto ipvX, by itself (before another match).
	if m, ok := at(0).(*expr.Meta); ok && isLoad(m, expr.MetaKeyNFPROTO) {
		if c, ok := at(1).(*expr.Cmp); ok && isCmp(c, expr.CmpOpEq, 1) {
			if fam := map[byte]string{unix.NFPROTO_IPV4: "ipv4", unix.NFPROTO_IPV6: "ipv6"}[c.Data[0]]; fam != "" {
				return "meta nfproto " + fam, 2
			}
		}
	}
	// iifname/oifname; lookup or cmp.
	if m, ok := at(0).(*expr.Meta); ok && (isLoad(m, expr.MetaKeyIIFNAME) || isLoad(m, expr.MetaKeyOIFNAME)) {
		field := "iifname"
		if m.Key == expr.MetaKeyOIFNAME {
			field = "oifname"
		}
		if rhs, ok := matchRHS(at(1), unix.IFNAMSIZ, func(b []byte) string {
			if n, ok := ifnameString(b); ok {
				return strconv.Quote(n)
			}
			return fmt.Sprintf("%#x", b)
		}); ok {
			return field + " " + rhs, 2
		}
	}
	// ct state X.
	if ct, ok := at(0).(*expr.Ct); ok && ct.Key == expr.CtKeySTATE && ct.Register == 1 && !ct.SourceRegister && ct.Direction == 0 {
		b, ok1 := at(1).(*expr.Bitwise)
		c, ok2 := at(2).(*expr.Cmp)
		if ok1 && ok2 && isMaskTest(b, c, 4) {
			return "ct state " + ctStates(binary.NativeEndian.Uint32(b.Mask)), 3
		}
	}
	// meta l4proto P th dport N.
	if m, ok := at(0).(*expr.Meta); ok && isLoad(m, expr.MetaKeyL4PROTO) {
		c, ok1 := at(1).(*expr.Cmp)
		p, ok2 := at(2).(*expr.Payload)
		c2, ok3 := at(3).(*expr.Cmp)
		if ok1 && ok2 && ok3 && isCmp(c, expr.CmpOpEq, 1) && isLoadPayload(p, expr.PayloadBaseTransportHeader) &&
			p.Offset == 2 && p.Len == 2 && isCmp(c2, expr.CmpOpEq, 2) {
			proto := map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[c.Data[0]]
			if proto == "" {
				proto = fmt.Sprint(c.Data[0])
			}
			return fmt.Sprintf("meta l4proto %s th dport %d", proto, binary.BigEndian.Uint16(c2.Data)), 4
		}
	}
	// tcp flags X.
	if m, ok := at(0).(*expr.Meta); ok && isLoad(m, expr.MetaKeyL4PROTO) {
		c, ok1 := at(1).(*expr.Cmp)
		p, ok2 := at(2).(*expr.Payload)
		b, ok3 := at(3).(*expr.Bitwise)
		c2, ok4 := at(4).(*expr.Cmp)
		if ok1 && ok2 && ok3 && ok4 && isCmp(c, expr.CmpOpEq, 1) && c.Data[0] == unix.IPPROTO_TCP &&
			isLoadPayload(p, expr.PayloadBaseTransportHeader) && p.Offset == 13 && p.Len == 1 && isMaskTest(b, c2, 1) {
			if b.Mask[0] == tcpSYN {
				return "tcp flags syn", 5
			}
			return fmt.Sprintf("tcp flags & %#02x != 0", b.Mask[0]), 5
		}
	}
	// tcp option maxseg size set rt mtu.
	if rt, ok := at(0).(*expr.Rt); ok && rt.Key == expr.RtTCPMSS && rt.Register == 1 {
		bo, ok1 := at(1).(*expr.Byteorder)
		x, ok2 := at(2).(*expr.Exthdr)
		if ok1 && ok2 && *bo == (expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2}) &&
			*x == (expr.Exthdr{Op: expr.ExthdrOpTcpopt, Type: 2, Offset: 2, Len: 2, SourceRegister: 1}) {
			return "tcp option maxseg size set rt mtu", 3
		}
	}
	// snat ip to A.
	if im, ok := at(0).(*expr.Immediate); ok && im.Register == 1 {
		n, ok1 := at(1).(*expr.NAT)
		a, ok2 := netip.AddrFromSlice(im.Data)
		// The kernel reports the address register as both the minimum and
		// the maximum when only the minimum was given.
		if ok1 && ok2 && (n.RegAddrMax == 0 || n.RegAddrMax == 1) &&
			*n == (expr.NAT{Type: expr.NATTypeSourceNAT, Family: n.Family, RegAddrMin: 1, RegAddrMax: n.RegAddrMax}) {
			switch {
			case a.Is4() && n.Family == unix.NFPROTO_IPV4:
				return "snat ip to " + a.String(), 2
			case a.Is6() && n.Family == unix.NFPROTO_IPV6:
				return "snat ip6 to " + a.String(), 2
			}
		}
	}
	return "", 0
}

// matchRHS renders the right-hand side of a match on register 1 holding n
// bytes: a set lookup or an equality.
func matchRHS(e any, n int, value func([]byte) string) (string, bool) {
	switch x := e.(type) {
	case *expr.Lookup:
		if x.SourceRegister == 1 && !x.IsDestRegSet && x.DestRegister == 0 {
			if x.Invert {
				return "!= @" + x.SetName, true
			}
			return "@" + x.SetName, true
		}
	case *expr.Cmp:
		if x.Register == 1 && len(x.Data) == n {
			switch x.Op {
			case expr.CmpOpEq:
				return value(x.Data), true
			case expr.CmpOpNeq:
				return "!= " + value(x.Data), true
			}
		}
	}
	return "", false
}

// isDNAT reports whether n is nodeagent's IPv4 DNAT to the address in
// register 1 and, withPort, the port in register 2. The kernel reports a
// minimum register given alone as the maximum too.
func isDNAT(n *expr.NAT, withPort bool) bool {
	want := expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegAddrMax: n.RegAddrMax}
	if withPort {
		want.RegProtoMin, want.RegProtoMax, want.Specified = 2, n.RegProtoMax, true
		if n.RegProtoMax != 0 && n.RegProtoMax != 2 {
			return false
		}
	}
	return (n.RegAddrMax == 0 || n.RegAddrMax == 1) && *n == want
}

func isLoad(m *expr.Meta, key expr.MetaKey) bool {
	return m.Key == key && m.Register == 1 && !m.SourceRegister
}

func isCmp(c *expr.Cmp, op expr.CmpOp, n int) bool {
	return c.Op == op && c.Register == 1 && len(c.Data) == n
}

func isLoadPayload(p *expr.Payload, base expr.PayloadBase) bool {
	return *p == expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: base, Offset: p.Offset, Len: p.Len}
}

// isMaskTest reports whether b and c test register 1 (n bytes) for any bit
// of b's mask: reg & mask ^ 0 != 0.
func isMaskTest(b *expr.Bitwise, c *expr.Cmp, n int) bool {
	zero := make([]byte, n)
	return b.SourceRegister == 1 && b.DestRegister == 1 && int(b.Len) == n && len(b.Mask) == n &&
		bytes.Equal(b.Xor, zero) && isCmp(c, expr.CmpOpNeq, n) && bytes.Equal(c.Data, zero)
}

func ctStates(mask uint32) string {
	var names []string
	for _, s := range []struct {
		bit  uint32
		name string
	}{{expr.CtStateBitINVALID, "invalid"}, {expr.CtStateBitESTABLISHED, "established"},
		{expr.CtStateBitRELATED, "related"}, {expr.CtStateBitNEW, "new"}, {expr.CtStateBitUNTRACKED, "untracked"}} {
		if mask&s.bit != 0 {
			names = append(names, s.name)
			mask &^= s.bit
		}
	}
	if mask != 0 {
		names = append(names, fmt.Sprintf("%#x", mask))
	}
	return strings.Join(names, ",")
}

// single renders one expression on its own.
func single(e any) string {
	switch x := e.(type) {
	case *expr.Counter:
		return "counter"
	case *expr.Objref:
		if typ, ok := objTypeNames[nftables.ObjType(x.Type)]; ok && x.Name != "" {
			return typ + " name " + strconv.Quote(x.Name)
		}
	case *expr.Verdict:
		switch x.Kind {
		case expr.VerdictAccept:
			return "accept"
		case expr.VerdictDrop:
			return "drop"
		case expr.VerdictReturn:
			return "return"
		case expr.VerdictContinue:
			return "continue"
		case expr.VerdictJump:
			return "jump " + x.Chain
		case expr.VerdictGoto:
			return "goto " + x.Chain
		}
	case *expr.Masq:
		if *x == (expr.Masq{}) {
			return "masquerade"
		}
	case *expr.Lookup:
		// SetID ties a lookup to a set in one batch; the kernel does not
		// report it.
		return fmt.Sprintf("[lookup %+v]", expr.Lookup{SourceRegister: x.SourceRegister, DestRegister: x.DestRegister,
			IsDestRegSet: x.IsDestRegSet, SetName: x.SetName, Invert: x.Invert})
	case Unknown:
		return fmt.Sprintf("[%s %#x]", x.Name, x.Data)
	}
	v := reflect.ValueOf(e)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	return fmt.Sprintf("[%s %+v]", strings.ToLower(v.Type().Name()), v.Interface())
}
