// Package nft converges nodeagent's own nftables table, inet nodeagent:
// masquerade and SNAT, forward accepts, the forwarding kill switch and TCP
// MSS clamping, with the Observe/MakePlan/Apply shape of every nodeagent
// subsystem (DESIGN.md §2). It talks netlink through
// github.com/google/nftables and never runs the nft binary.
//
// Ownership (DESIGN.md §4): nodeagent owns the tables whose name starts with
// "nodeagent", in any family, and nothing else. Observe reads only those
// (chains of other tables go by in the chain dump and are dropped unread),
// and no message nodeagent sends names another table. The table is created
// without NFT_TABLE_F_OWNER, so the kill switch outlives the daemon.
//
// The ruleset is rendered, desired and observed alike, into nft-like text
// lines: the table, each named object (the kill switch's counter) by type
// and name, each chain with its type, hook, priority and policy, each set
// with its type and flags, each set element and each rule with its
// expressions decoded from what the kernel reports. The observed side is
// read from the kernel on every sync, never remembered, so anything changed
// by hand in the table shows up as a difference, and MakePlan's text is
// that difference. When there is none, nothing is sent.
//
// Apply makes every change of a sync in one netlink transaction, and
// updates the table in place rather than deleting and re-adding it: a
// chain whose rules differ is flushed and refilled, a set gets the elements
// it lacks and loses the ones it should not have, a missing object is
// created (an existing one is never written, so a counter is never reset),
// and whatever is right is not touched. nf_tables commits a batch all or nothing, and a chain's old
// rules and a set's old elements give way to the new ones when the
// generation flips, so the kill switch never has a gap. Deleting and
// re-adding the table in one transaction can leak for a moment (see
// Execute), so it is done only when the kernel refuses the update (a
// firewall that cannot change at all is the worse fault), and then behind
// a standby table holding the kill switch (replaceWhole).
//
// Layout of the table (chains exist only when something needs them):
//
//	counter ks_drops
//	    the kill switch's drops, a named counter object that every
//	    kill-switch rule counts into (see KillSwitchCounter)
//	chain forward { type filter hook forward priority -10; policy accept; }
//	    kill switch drops first, then ct state established,related accept
//	    and the forward accepts: an established connection whose route
//	    moved from the tunnel to the uplink is still dropped
//	chain mssclamp { type filter hook forward priority -150; policy accept; }
//	    tcp flags syn tcp option maxseg size set rt mtu, in and out of the
//	    listed interfaces
//	chain prerouting { type nat hook prerouting priority -100; policy accept; }
//	    a forwarded port's DNAT, and DNS of redirected sources DNATed to
//	    their tunnel's resolver (sources in dns_<resolver>)
//	chain postrouting { type nat hook postrouting priority 100; policy accept; }
//	    masquerade and snat
//	chain input { type filter hook input priority -10; policy accept; }
//	    IPv6 DNS for the node arriving by the redirected sources' links
//	    (dns6_in) dropped
//	chain output { type filter hook output priority -10; policy accept; }
//	    the node's ICMP errors about kill-switch sources' flows kept off
//	    other interfaces
//
// Sources and interface lists are sets, so a thousand sources are one rule:
// kill-switch entries with the same allowOut list share sets ks_<list>_v4,
// ks_<list>_v6 and ks_<list>_out (ks_tun0_v4 for allowOut [tun0]),
// masquerade entries with the same out interface share masq_<out>_v4 and
// masq_<out>_v6, and SNAT entries with the same out interface and address
// share snat_<out>_<address>.
package nft

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// TableName is the name of nodeagent's table. Every table whose name starts
// with it is nodeagent's.
const TableName = "nodeagent"

// KillSwitchComment is the comment on every kill-switch drop rule.
const KillSwitchComment = "nodeagent kill switch"

// DNSGuardComment is the comment on the rules dropping IPv6 DNS for the
// node from the links of redirected DNS sources (DNSRedirect.In).
const DNSGuardComment = "nodeagent dns guard"

// KillSwitchCounter is the named counter object every kill-switch drop
// rule counts into (`counter name "ks_drops"`); Observe reports it as
// Observed.KillSwitchDrops.
//
// A named counter is table-level state: flushing and refilling the forward
// chain, which every change of its rules does, leaves it alone, so no drop
// goes uncounted across a refill. An anonymous counter in the rule would be
// created anew with the rule, and carrying its value over means reading it
// at Observe and writing it back at the commit, losing whatever was counted
// in between. The object is created with the first kill-switch rule, never
// written again (so never reset), and goes when the kill switch or the
// table does; if deleted by hand it is recreated, from zero.
//
// There is one for the whole kill switch, not one per group of sources:
// groups are keyed by their allowOut lists, so a config change that edits
// a list renames the group, and a per-group counter would go with the old
// name, taking its drops out of the total that status reports.
const KillSwitchCounter = "ks_drops"

// Chain priorities.
//
// The forward chain runs at filter-10: before iptables-nft's FORWARD, k3s,
// flannel and docker, which all hook forward at priority 0, and after
// conntrack (-200), which `ct state` needs. The priority does not decide
// whether the kill switch holds: a drop in any base chain ends the packet
// whatever the other chains say, and an accept only ends the chain it is
// in. Running first means the kill switch's counter sees every leaking
// packet, even one another table would drop later, and two chains at one
// hook and priority run in an order nobody chose.
//
// The MSS clamp runs at mangle (-150), where packets are rewritten before
// the filter chains look at them. It is a chain of its own because an
// accept in the forward chain would end that chain before a clamp rule
// placed after it ran.
//
// Destination NAT (a forwarded port, DNS sent to a tunnel's resolver) runs
// at dstnat (-100), as nft's own prerouting nat chains do.
const (
	ForwardPriority = -10
	ManglePriority  = -150
	SrcNATPriority  = 100
	DstNATPriority  = -100
)

// Chain names.
const (
	forwardChain     = "forward"
	outputChain      = "output"
	inputChain       = "input"
	mssChain         = "mssclamp"
	postroutingChain = "postrouting"
	preroutingChain  = "prerouting"
)

// nftTableFOwner is NFT_TABLE_F_OWNER (Linux 5.12): a table only the
// netlink socket that created it may change, and which goes with it.
const nftTableFOwner = 0x2

// Masquerade rewrites the source of traffic from From leaving by Out to
// Out's address.
type Masquerade struct {
	From netip.Prefix
	Out  string
}

// SNAT rewrites the source of traffic from From leaving by Out to To.
type SNAT struct {
	From netip.Prefix
	Out  string
	To   netip.Addr
}

// Forward accepts forwarded traffic coming in by In and leaving by Out.
//
// An accept in nodeagent's forward chain ends that chain only: a packet is
// still evaluated by every other base chain at the forward hook, and a drop
// in another table (iptables-nft's FORWARD with policy drop, say) still
// drops it. Forward opens nodeagent's own chain, not the node.
type Forward struct {
	In, Out string
}

// KillSwitch lets forwarded traffic whose source is in From leave only by
// the AllowOut interfaces; everything else from From is dropped and
// counted.
type KillSwitch struct {
	From     netip.Prefix
	AllowOut []string
	// AllowTo are destinations From may reach by any interface (the LAN
	// behind the node, for remote-access clients whose internet leaves by
	// the tunnel); those of From's family count.
	AllowTo []netip.Prefix
}

// PortForward sends TCP and UDP for Port arriving on In to To:ToPort, and
// accepts it in nodeagent's forward chain: a VPN provider's forwarded port
// delivered to a host behind the tunnel. Nothing else arriving on In is
// opened.
type PortForward struct {
	In     string
	Port   uint16
	To     netip.Addr // IPv4
	ToPort uint16
}

// DNSRedirect sends DNS (UDP and TCP port 53, to any address) from From to
// the resolver To: a VLAN's DNS kept inside its tunnel.
//
// The redirect is IPv4, and IPv6 DNS to the node itself is delivered
// locally, where neither it nor the kill switch (forward hook) looks: the
// hosts of From would be answered by the node's own resolver. In lists
// the links those hosts reach the node by; IPv6 DNS arriving on them for
// the node is dropped in the input hook.
type DNSRedirect struct {
	From []netip.Prefix // IPv4
	To   netip.Addr     // IPv4
	In   []string
}

// Desired is the whole desired state of this subsystem. The zero value
// wants no table at all.
type Desired struct {
	Masquerade []Masquerade
	SNAT       []SNAT
	Forward    []Forward
	KillSwitch []KillSwitch
	// MSSClamp lists interfaces whose forwarded TCP SYNs, in and out, get
	// their MSS lowered to what the route's MTU allows.
	MSSClamp    []string
	PortForward []PortForward
	DNS         []DNSRedirect
}

// Equal reports whether d and e want the same ruleset entries in the same
// order.
func (d Desired) Equal(e Desired) bool {
	return slices.Equal(d.Masquerade, e.Masquerade) && slices.Equal(d.SNAT, e.SNAT) &&
		slices.Equal(d.Forward, e.Forward) && slices.Equal(d.MSSClamp, e.MSSClamp) &&
		slices.Equal(d.PortForward, e.PortForward) &&
		slices.EqualFunc(d.DNS, e.DNS, func(a, b DNSRedirect) bool {
			return a.To == b.To && slices.Equal(a.From, b.From) && slices.Equal(a.In, b.In)
		}) &&
		slices.EqualFunc(d.KillSwitch, e.KillSwitch, func(a, b KillSwitch) bool {
			return a.From == b.From && slices.Equal(a.AllowOut, b.AllowOut) && slices.Equal(a.AllowTo, b.AllowTo)
		})
}

// Empty reports whether d wants no table.
func (d Desired) Empty() bool {
	return len(d.Masquerade)+len(d.SNAT)+len(d.Forward)+len(d.KillSwitch)+len(d.MSSClamp)+len(d.PortForward)+len(d.DNS) == 0
}

// Table is one nftables table as nodeagent renders it: desired (built from
// Desired) or observed (read from the kernel).
type Table struct {
	Family nftables.TableFamily
	Name   string
	Flags  uint32
	// Objects are the table's named stateful objects: the kill switch's
	// counter, and whatever was added by hand.
	Objects []Object
	Sets    []Set
	Chains  []Chain
}

// Object is a named stateful object of a table. Objects are told apart by
// type and name, as the kernel does.
type Object struct {
	Type nftables.ObjType
	Name string
	// Counter is a counter object's packets and bytes: what the kernel
	// reports for an observed one, the starting value for a desired one.
	// Neither is part of the object's rendering, so counting is no change.
	Counter Counter
}

// Set is a named set and its elements. Set.Table is not used.
type Set struct {
	nftables.Set
	Elements []nftables.SetElement
}

// Chain is a chain and its rules, in order. Chain.Table is not used.
type Chain struct {
	nftables.Chain
	Rules []Rule
}

// Rule is one rule. Exprs holds expr.Any values, and, in observed rules,
// Unknown for expressions nodeagent cannot decode.
type Rule struct {
	Exprs    []any
	UserData []byte
	// Handle is the kernel's handle of an observed rule, 0 for a desired one.
	Handle uint64
}

// Unknown is an expression of a kind nodeagent does not decode, kept as
// the kernel reported it so that it still counts as a difference.
type Unknown struct {
	Name string
	Data []byte
}

// Counter is a packet and byte count.
type Counter struct {
	Packets, Bytes uint64
}

// Tables renders d into the tables it wants: none for an empty Desired,
// else inet nodeagent. It is deterministic: equal Desired values render
// equal tables.
func (d Desired) Tables() []Table {
	if d.Empty() {
		return nil
	}
	return []Table{d.build().t}
}

// build renders d into inet nodeagent.
func (d Desired) build() *builder {
	b := &builder{t: Table{Family: nftables.TableFamilyINet, Name: TableName}}

	// Kill switch, grouped by allowOut list (and allowTo, where one is
	// given: a group without one is named as before it existed).
	type ksGroup struct {
		out      []string
		v4, v6   []netip.Prefix
		to4, to6 []netip.Prefix
	}
	ks := map[string]*ksGroup{}
	for _, k := range d.KillSwitch {
		out := sortedUnique(k.AllowOut)
		key := strings.Join(out, "\x00")
		var to4, to6 []netip.Prefix
		for _, p := range k.AllowTo {
			if p.Addr().Is4() {
				to4 = append(to4, p.Masked())
			} else {
				to6 = append(to6, p.Masked())
			}
		}
		slices.SortFunc(to4, comparePrefix)
		slices.SortFunc(to6, comparePrefix)
		for _, p := range slices.Concat(to4, to6) {
			key += "\x00to\x00" + p.String()
		}
		g := ks[key]
		if g == nil {
			g = &ksGroup{out: out, to4: to4, to6: to6}
			ks[key] = g
		}
		if k.From.Addr().Is4() {
			g.v4 = append(g.v4, k.From)
		} else {
			g.v6 = append(g.v6, k.From)
		}
	}
	var fwd, output []Rule
	if len(ks) > 0 {
		b.t.Objects = append(b.t.Objects, Object{Type: nftables.ObjTypeCounter, Name: KillSwitchCounter})
	}
	ksNames := groupNames("ks_", sortedKeys(ks))
	for _, key := range sortedKeys(ks) {
		g := ks[key]
		base := ksNames[key]
		out := b.ifnameSet(base+"_out", g.out)
		for _, fam := range []struct {
			suffix string
			pfx    []netip.Prefix
			to     []netip.Prefix
			v6     bool
		}{{"_v4", g.v4, g.to4, false}, {"_v6", g.v6, g.to6, true}} {
			if len(fam.pfx) == 0 {
				continue
			}
			src := b.prefixSet(base+fam.suffix, fam.v6, fam.pfx)
			drop := []expr.Any{&expr.Objref{Type: unix.NFT_OBJECT_COUNTER, Name: KillSwitchCounter}, &expr.Verdict{Kind: expr.VerdictDrop}}
			var notTo []expr.Any
			if len(fam.to) > 0 {
				// The LAN is reached directly; everything else only by
				// allowOut.
				notTo = daddrInSet(fam.v6, b.prefixSet(base+fam.suffix+"_to", fam.v6, fam.to), true)
			}
			fwd = append(fwd, rule(KillSwitchComment, saddrInSet(fam.v6, src), notTo, oifnameInSet(out, true), drop))
			// An ICMP error the node itself sends about these sources'
			// flows (a reply it could not deliver to a pod, a forwarded
			// port whose pod is gone) quotes the flow's header; by the
			// main table it would leave by the uplink, outside the tunnel,
			// to the far side. It may leave by allowOut, or go back to the
			// sources. The quoted header is matched, not the connection's
			// tuple: google/nftables cannot write or read `ct reply`.
			for _, inner := range []bool{false, true} {
				output = append(output, rule(KillSwitchComment, ctStateRelated(), icmpQuotedAddrInSet(fam.v6, inner, src),
					daddrInSet(fam.v6, src, true), oifnameInSet(out, true), drop))
			}
		}
	}
	if len(d.Forward) > 0 || len(d.PortForward) > 0 {
		fwd = append(fwd, rule("", ctStateEstablishedRelated(), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}))
		seen := map[Forward]bool{}
		for _, f := range d.Forward {
			if seen[f] {
				continue
			}
			seen[f] = true
			fwd = append(fwd, rule("", ifnameIs(expr.MetaKeyIIFNAME, f.In), ifnameIs(expr.MetaKeyOIFNAME, f.Out),
				[]expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}))
		}
	}

	// Forwarded ports: the DNAT in prerouting, the accept here.
	var pre []Rule
	for _, pf := range d.PortForward {
		for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			pre = append(pre, rule("", ifnameIs(expr.MetaKeyIIFNAME, pf.In), l4Dport(proto, pf.Port), dnatTo(pf.To, pf.ToPort)))
			fwd = append(fwd, rule("", ifnameIs(expr.MetaKeyIIFNAME, pf.In), daddrIs(pf.To), l4Dport(proto, pf.ToPort),
				[]expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}))
		}
	}
	// DNS to a tunnel's resolver, sources grouped by resolver: two
	// tunnels given the same resolver (PIA hands every tunnel the same
	// ones) share one set. A source in two groups is sent to the first
	// resolver, by address, as the first DNAT rule that matches decides.
	dns := map[netip.Addr][]netip.Prefix{}
	var resolvers []netip.Addr
	var dnsIn []string
	for _, r := range d.DNS {
		dnsIn = append(dnsIn, r.In...)
		if _, ok := dns[r.To]; !ok {
			resolvers = append(resolvers, r.To)
		}
		dns[r.To] = append(dns[r.To], r.From...)
	}
	slices.SortFunc(resolvers, netip.Addr.Compare)
	for _, to := range resolvers {
		if len(dns[to]) == 0 {
			continue
		}
		src := b.prefixSet("dns_"+strings.ReplaceAll(to.String(), ".", "_"), false, dns[to])
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			pre = append(pre, rule("", saddrInSet(false, src), l4Dport(proto, 53), dnatTo(to, 0)))
		}
	}

	// IPv6 DNS for the node from the redirected sources' links.
	var input []Rule
	if len(dnsIn) > 0 {
		set := b.ifnameSet("dns6_in", sortedUnique(dnsIn))
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			input = append(input, rule(DNSGuardComment, nfproto(unix.NFPROTO_IPV6), ifnameInSetKey(expr.MetaKeyIIFNAME, set, false),
				l4Dport(proto, 53), []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}))
		}
	}

	// MSS clamping.
	var mss []Rule
	if len(d.MSSClamp) > 0 {
		set := b.ifnameSet("mss_if", sortedUnique(d.MSSClamp))
		for _, key := range []expr.MetaKey{expr.MetaKeyOIFNAME, expr.MetaKeyIIFNAME} {
			mss = append(mss, rule("", ifnameInSetKey(key, set, false), tcpFlagsSyn(), clampMSSToRoute()))
		}
	}

	// NAT: SNAT grouped by out interface and address, then masquerade by
	// out interface. The first NAT rule that matches a connection decides,
	// so a fixed SNAT address wins over a masquerade of the same traffic.
	var post []Rule
	type snatKey struct {
		out string
		to  netip.Addr
	}
	snat := map[snatKey][]netip.Prefix{}
	for _, s := range d.SNAT {
		k := snatKey{s.Out, s.To}
		snat[k] = append(snat[k], s.From)
	}
	keys := make([]snatKey, 0, len(snat))
	for k := range snat {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b snatKey) int {
		return cmp.Or(strings.Compare(a.out, b.out), a.to.Compare(b.to))
	})
	var snatKeys []string
	for _, k := range keys {
		snatKeys = append(snatKeys, k.out+"_"+k.to.String())
	}
	snatNames := groupNames("snat_", snatKeys)
	for i, k := range keys {
		v6 := k.to.Is6()
		src := b.prefixSet(snatNames[snatKeys[i]], v6, snat[k])
		post = append(post, rule("", saddrInSet(v6, src), ifnameIs(expr.MetaKeyOIFNAME, k.out), snatTo(k.to)))
	}

	masq := map[string][2][]netip.Prefix{}
	for _, m := range d.Masquerade {
		g := masq[m.Out]
		if m.From.Addr().Is4() {
			g[0] = append(g[0], m.From)
		} else {
			g[1] = append(g[1], m.From)
		}
		masq[m.Out] = g
	}
	masqNames := groupNames("masq_", sortedKeys(masq))
	for _, out := range sortedKeys(masq) {
		for fi, pfx := range masq[out] {
			if len(pfx) == 0 {
				continue
			}
			v6 := fi == 1
			src := b.prefixSet(masqNames[out]+[]string{"_v4", "_v6"}[fi], v6, pfx)
			post = append(post, rule("", saddrInSet(v6, src), ifnameIs(expr.MetaKeyOIFNAME, out), []expr.Any{&expr.Masq{}}))
		}
	}
	// The base chains, in the order they are rendered; only those with
	// rules exist.
	accept := nftables.ChainPolicyAccept
	for _, c := range []struct {
		name  string
		typ   nftables.ChainType
		hook  *nftables.ChainHook
		prio  int32
		rules []Rule
	}{
		{forwardChain, nftables.ChainTypeFilter, nftables.ChainHookForward, ForwardPriority, fwd},
		{mssChain, nftables.ChainTypeFilter, nftables.ChainHookForward, ManglePriority, mss},
		{preroutingChain, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, DstNATPriority, pre},
		{postroutingChain, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, SrcNATPriority, post},
		{inputChain, nftables.ChainTypeFilter, nftables.ChainHookInput, ForwardPriority, input},
		{outputChain, nftables.ChainTypeFilter, nftables.ChainHookOutput, ForwardPriority, output},
	} {
		if len(c.rules) > 0 {
			b.t.Chains = append(b.t.Chains, Chain{Chain: nftables.Chain{
				Name: c.name, Type: c.typ, Hooknum: c.hook,
				Priority: nftables.ChainPriorityRef(nftables.ChainPriority(c.prio)), Policy: &accept,
			}, Rules: c.rules})
		}
	}
	return b
}

// groupNames names the sets of each group (keyed by its interfaces, or
// interface and address) after the key, so that a group's sets keep their
// names when other groups come and go: a set that is replaced rather than
// updated in place can miss lookups for a moment after the commit (see
// Apply). Keys are made of interface names and addresses; a character nft
// would not take in a set name becomes '-', and a key that is too long, or
// collides with another after that, is named by a hash instead.
func groupNames(prefix string, keys []string) map[string]string {
	names := map[string]string{}
	used := map[string]int{}
	for _, k := range keys {
		var b strings.Builder
		for _, r := range strings.ReplaceAll(k, "\x00", "_") {
			switch {
			case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '.':
				b.WriteRune(r)
			default:
				b.WriteByte('-')
			}
		}
		names[k] = prefix + b.String()
		used[names[k]]++
	}
	for _, k := range keys {
		if n := names[k]; used[n] > 1 || len(n) > 48 {
			h := fnv.New64a()
			h.Write([]byte(k))
			names[k] = fmt.Sprintf("%s%016x", prefix, h.Sum64())
		}
	}
	return names
}

// builder collects the sets of the table being built. Set IDs are
// numbered per table: they only tie a lookup to a set added in the same
// transaction.
type builder struct {
	t Table
	// renamed counts the sets addSet had to rename: none, unless a
	// grouping is wrong.
	renamed int
}

// setRef names a set and its ID within the batch.
type setRef struct {
	name string
	id   uint32
}

func (b *builder) addSet(s Set) setRef {
	// Names are unique by construction: every kind of group is keyed by
	// what names it, and a key that would collide is hashed (groupNames).
	// Should two groups still arrive at one name, the second is renamed
	// rather than sent: the kernel takes two NEWSETs of one name in a
	// batch as one set, and from then on every diff of it fails (ENOENT),
	// freezing every later change of the table.
	if slices.ContainsFunc(b.t.Sets, func(o Set) bool { return o.Name == s.Name }) {
		base := s.Name
		for n := 2; slices.ContainsFunc(b.t.Sets, func(o Set) bool { return o.Name == s.Name }); n++ {
			s.Name = fmt.Sprintf("%s_%d", base, n)
		}
		b.renamed++
	}
	s.ID = uint32(len(b.t.Sets) + 1)
	b.t.Sets = append(b.t.Sets, s)
	return setRef{s.Name, s.ID}
}

func (b *builder) ifnameSet(name string, names []string) setRef {
	// Host byte order is what nft records for ifname keys; without it nft
	// prints the names as "".
	s := Set{Set: nftables.Set{Name: name, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian}}
	for _, n := range names {
		s.Elements = append(s.Elements, nftables.SetElement{Key: ifname(n)})
	}
	return b.addSet(s)
}

func (b *builder) prefixSet(name string, v6 bool, pfx []netip.Prefix) setRef {
	s := Set{Set: nftables.Set{Name: name, KeyType: nftables.TypeIPAddr, Interval: true}}
	if v6 {
		s.KeyType = nftables.TypeIP6Addr
	}
	s.Elements = intervalElements(v6, pfx)
	return b.addSet(s)
}

// intervalElements turns prefixes into the elements of an interval set,
// as nft does: overlapping and adjacent prefixes merged (the kernel rejects
// overlaps), each range a start element and an interval-end element one
// past its last address (none when the range reaches the top of the address
// space), and an interval end at address zero before the first range.
func intervalElements(v6 bool, pfx []netip.Prefix) []nftables.SetElement {
	type span struct{ lo, hi netip.Addr }
	spans := make([]span, 0, len(pfx))
	for _, p := range pfx {
		p = p.Masked()
		spans = append(spans, span{p.Addr(), lastAddr(p)})
	}
	slices.SortFunc(spans, func(a, b span) int { return a.lo.Compare(b.lo) })
	merged := spans[:0]
	for _, s := range spans {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			if next := last.hi.Next(); !next.IsValid() || s.lo.Compare(next) <= 0 {
				if s.hi.Compare(last.hi) > 0 {
					last.hi = s.hi
				}
				continue
			}
		}
		merged = append(merged, s)
	}
	zero := netip.IPv4Unspecified()
	if v6 {
		zero = netip.IPv6Unspecified()
	}
	// One backing array for every key: thousands of sources are thousands
	// of elements.
	size := zero.BitLen() / 8
	keys := make([]byte, 0, (2*len(merged)+1)*size)
	key := func(a netip.Addr) []byte {
		if a.Is4() {
			b := a.As4()
			keys = append(keys, b[:]...)
		} else {
			b := a.As16()
			keys = append(keys, b[:]...)
		}
		return keys[len(keys)-size : len(keys) : len(keys)]
	}
	els := make([]nftables.SetElement, 0, 2*len(merged)+1)
	if len(merged) > 0 && merged[0].lo != zero {
		els = append(els, nftables.SetElement{Key: key(zero), IntervalEnd: true})
	}
	for _, s := range merged {
		els = append(els, nftables.SetElement{Key: key(s.lo)})
		if end := s.hi.Next(); end.IsValid() {
			els = append(els, nftables.SetElement{Key: key(end), IntervalEnd: true})
		}
	}
	return els
}

// lastAddr returns the highest address in p.
func lastAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	if p.Addr().Is4() {
		a := p.Addr().As4()
		for i := p.Bits(); i < 32; i++ {
			a[i/8] |= 0x80 >> (i % 8)
		}
		return netip.AddrFrom4(a)
	}
	a := p.Addr().As16()
	for i := p.Bits(); i < 128; i++ {
		a[i/8] |= 0x80 >> (i % 8)
	}
	return netip.AddrFrom16(a)
}

// ifname is an interface name as the kernel's ifname type holds it:
// IFNAMSIZ bytes, NUL-padded.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func rule(comment string, parts ...[]expr.Any) Rule {
	var r Rule
	for _, p := range parts {
		for _, e := range p {
			r.Exprs = append(r.Exprs, e)
		}
	}
	if comment != "" {
		r.UserData = userdata.AppendString(nil, userdata.TypeComment, comment)
	}
	return r
}

// saddrInSet is `ip saddr @set` or `ip6 saddr @set`, with the meta nfproto
// guard nft adds in an inet table.
func saddrInSet(v6 bool, s setRef) []expr.Any {
	proto, off, n := byte(unix.NFPROTO_IPV4), uint32(12), uint32(4)
	if v6 {
		proto, off, n = unix.NFPROTO_IPV6, 8, 16
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: s.name, SetID: s.id},
	}
}

// nfproto is `meta nfproto P`.
func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func oifnameInSet(s setRef, invert bool) []expr.Any {
	return ifnameInSetKey(expr.MetaKeyOIFNAME, s, invert)
}

func ifnameInSetKey(key expr.MetaKey, s setRef, invert bool) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: s.name, SetID: s.id, Invert: invert},
	}
}

func ifnameIs(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
	}
}

// ctStateEstablishedRelated is `ct state established,related`. The state
// is a host-order bitmask in the register.
func ctStateEstablishedRelated() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// ctStateRelated is `ct state related`: a packet that belongs to another
// connection (an ICMP error about it).
func ctStateRelated() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// icmpQuotedAddrInSet is `meta l4proto icmp @th,160,32 @set` (the source
// address of the IPv4 header an ICMP error quotes after its own 8 bytes),
// with dst `@th,192,32` (its destination), or the ICMPv6 forms
// (`@th,128,128`, `@th,256,128`), with the nfproto guard.
func icmpQuotedAddrInSet(v6, dst bool, s setRef) []expr.Any {
	proto, l4, off, n := byte(unix.NFPROTO_IPV4), byte(unix.IPPROTO_ICMP), uint32(8+12), uint32(4)
	if v6 {
		proto, l4, off, n = unix.NFPROTO_IPV6, unix.IPPROTO_ICMPV6, 8+8, 16
	}
	if dst {
		off += n
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{l4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: s.name, SetID: s.id},
	}
}

// daddrInSet is `ip daddr @set` or `ip6 daddr @set` (`!=` with invert),
// with the meta nfproto guard nft adds in an inet table.
func daddrInSet(v6 bool, s setRef, invert bool) []expr.Any {
	out := saddrInSet(v6, s)
	p, l := *out[2].(*expr.Payload), *out[3].(*expr.Lookup)
	p.Offset += p.Len // the destination follows the source
	l.Invert = invert
	return append(out[:2], &p, &l)
}

// tcpFlagsSyn is `tcp flags syn`: TCP with the SYN bit set.
func tcpFlagsSyn() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{tcpSYN}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0}},
	}
}

const tcpSYN = 0x02

// clampMSSToRoute is `tcp option maxseg size set rt mtu`: the route's MTU
// less the IP and TCP headers, written only when it is lower than the
// option's value (the kernel never raises an MSS).
func clampMSSToRoute() []expr.Any {
	return []expr.Any{
		&expr.Rt{Key: expr.RtTCPMSS, Register: 1},
		&expr.Byteorder{SourceRegister: 1, DestRegister: 1, Op: expr.ByteorderHton, Len: 2, Size: 2},
		&expr.Exthdr{Op: expr.ExthdrOpTcpopt, Type: 2, Offset: 2, Len: 2, SourceRegister: 1},
	}
}

func snatTo(a netip.Addr) []expr.Any {
	fam := uint32(unix.NFPROTO_IPV4)
	if a.Is6() {
		fam = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: a.AsSlice()},
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: fam, RegAddrMin: 1},
	}
}

// l4Dport is `meta l4proto P th dport N`.
func l4Dport(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

// daddrIs is `ip daddr A` (IPv4).
func daddrIs(a netip.Addr) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
	}
}

// dnatTo is `dnat ip to A` or, with a port, `dnat ip to A:P` (IPv4; the
// nfproto guard nft puts before it in an inet table comes first).
func dnatTo(a netip.Addr, port uint16) []expr.Any {
	out := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Immediate{Register: 1, Data: a.AsSlice()},
	}
	nat := &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1}
	if port != 0 {
		out = append(out, &expr.Immediate{Register: 2, Data: binary.BigEndian.AppendUint16(nil, port)})
		nat.RegProtoMin = 2
		nat.Specified = true
	}
	return append(out, nat)
}

func sortedUnique(ss []string) []string {
	if len(ss) == 1 {
		return ss
	}
	out := slices.Clone(ss)
	slices.Sort(out)
	return slices.Compact(out)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// comparePrefix orders prefixes by address, then length.
func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}
