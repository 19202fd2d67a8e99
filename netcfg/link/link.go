// Package link converges VLAN sub-interfaces and macvlan host shims and
// their addresses, with the Observe/Plan/Apply shape every nodeagent
// subsystem has (DESIGN.md §2).
//
// Ownership: a link is nodeagent's when its IFLA_IFALIAS is host.LinkAlias.
// A configured name that exists without the mark is a conflict and is never
// modified unless the config says adopt. Addresses are nodeagent's when they
// carry IFA_PROTO host.Proto; on kernels before 6.1, which drop IFA_PROTO,
// the global addresses of owned links are treated as owned.
//
// A configured address present in another form is not nodeagent's, even
// with the right prefix: NetworkManager, reapplying a link it took as
// "connected (externally)", deletes the address and adds the same prefix
// back with noprefixroute and no mark. The plan re-owns such an address
// (OpReownAddr): it gives it nodeagent's mark and form, in place where the
// kernel can (host.Host.AddrReown), and the op is a repair of an address.
//
// The rule for an address without the mark in the plain kernel form (no
// IFA_PROTO, no request flags, lifetimes forever, no metric: what
// `ip addr add` without options makes, and how an address configured
// before nodeagent ran looks) is that it is never deleted to be marked:
// it gets the mark in place, with one NLM_F_REPLACE message that changes
// nothing else, where the kernel sets IFA_PROTO that way (IPv6 from Linux
// 6.1, IPv4 from 6.4). Where it does not (IPv4 before 6.4: 6.1, as in
// Debian 12), such an address is accepted as it stands on an owned link
// and on one being adopted: no op, and, carrying no mark, it is not
// deleted when the config drops it. An address in any other form is
// re-owned on an owned link, by deleting and adding it when the kernel
// cannot change its form in place (noprefixroute on IPv4), except on a
// link the config marks adopt: true, where nothing is ever deleted to be
// adopted: what a replace cannot fix is kept as it is, and the adoption's
// plan line says so (NetworkManager's noprefixroute address, whose
// deletion would take the routes with it as their src).
package link

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/plan"
)

// Kind is a link type this subsystem manages.
type Kind string

// The link kinds this subsystem creates. Other subsystems own other kinds
// (WireGuard owns its own links), so a marked link of another kind is never
// touched here.
const (
	VLAN    Kind = "vlan"
	Macvlan Kind = "macvlan"
)

// Link is one desired link.
type Link struct {
	Name   string
	Kind   Kind
	Parent string
	VLANID int    // VLAN only
	Mode   string // macvlan only: bridge, private, vepa, passthru
	MTU    int    // 0: not managed
	Up     bool
	Addrs  []netip.Prefix
	Adopt  bool
	// MAC (macvlan only) is the configured hardware address: the link is
	// made with it and kept at it. Nil: made with the host's StableMAC
	// for its name, and left as it is once made.
	MAC net.HardwareAddr
}

// Desired is the whole desired state of this subsystem.
type Desired struct {
	Links []Link
	// DAD configures duplicate-address detection; nil turns it off.
	DAD *arp.Config
	// Claim is, per address, the detection and announcements its claim
	// takes instead of DAD's: a role's gateway address, which must move
	// between nodes within a second or two and be announced so that
	// neighbours follow (agent/gateway). Used whether DAD is on or off.
	Claim map[netip.Addr]arp.Config
}

// ObservedLink is one link as the kernel has it.
type ObservedLink struct {
	Index  int
	Name   string
	Kind   string // kernel link type: vlan, macvlan, veth, dummy, ...
	Parent string // name of the lower link, "" when none
	VLANID int
	Mode   string
	MTU    int
	Up     bool
	Owned  bool
	// Interrupted reports a link nodeagent created but did not get to mark:
	// it still has host.CreatingGroup and no alias; or one that is
	// nodeagent's for another reason, Remark (host.Owned).
	Interrupted bool
	Remark      string
	Addrs       []ObservedAddr
	// AltNames are its alternative names (the neighbour checks read them:
	// networkd's Name= matches them too).
	AltNames []string
}

// ObservedAddr is one address on an observed link.
type ObservedAddr struct {
	Prefix netip.Prefix
	// Owned: it carries nodeagent's mark (or, before Linux 6.1, it is a
	// global address of an owned link).
	Owned bool
	// Form is how it differs from the form nodeagent gives its addresses
	// (host.Addr.Form: "noprefixroute", "valid_lft 300sec"); empty when
	// it has that form.
	Form []string
	// Flags are its IFA_F_* flags, which tell AddrReown whether a replace
	// can fix it in place.
	Flags uint32
	// Markable: the kernel can put nodeagent's mark on it in place
	// (host.Host.AddrMarkInPlace).
	Markable bool
}

// ours reports whether the address is nodeagent's in nodeagent's form.
func (a ObservedAddr) ours() bool { return a.Owned && len(a.Form) == 0 }

// Observed is the kernel state that matters to this subsystem: every link
// nodeagent owns (including ones whose creation was interrupted) and every
// link the desired state names, as a link or a parent.
type Observed struct {
	Links map[string]ObservedLink
	// MaxIndex is the highest ifindex in the namespace; new links ask for
	// the ones above it.
	MaxIndex int
	// MACs are the hardware addresses of the observed links, by index,
	// for duplicate-address detection.
	MACs map[int]net.HardwareAddr
}

// Action is the first column of a plan line.
type Action byte

// Plan line actions, as in `nodeagent plan`.
const (
	Add    Action = '+'
	Change Action = '~'
	Remove Action = '-'
	Fail   Action = '!'
)

// OpKind says what an Op does.
type OpKind int

// The operations a plan is made of, in the order Apply runs them.
const (
	OpDeleteLink OpKind = iota // removed from config, or recreated
	OpRenameLink               // nodeagent's link renamed by another program: its name given back
	OpCreateLink
	OpAdoptLink
	OpSetMAC
	OpSetMTU
	OpSetUp
	OpDelAddr
	OpReownAddr // present in another form or without the mark: made nodeagent's
	OpAddAddr
	OpPending  // not applied now: waits for its parent to appear
	OpConflict // not applied: reported as a failure for its object
	// OpReleaseLink hands an adopted link back (nodeagent release): its
	// mark and that of its addresses are taken off, and it stays as it is.
	OpReleaseLink
)

// Op is one change to one object.
type Op struct {
	Kind    OpKind
	Link    string
	Desired Link             // for create, adopt, MTU, up
	Old     ObservedLink     // for delete and change
	OldMAC  net.HardwareAddr // for a MAC change
	Addr    netip.Prefix     // for address ops
	OldAddr ObservedAddr     // for a re-own: the address as it was found
	Adopt   bool             // for a re-own: marks a plain address on a link being adopted
	// InPlace: a re-own that never deletes the address (an adopt: true
	// link's): what one replace cannot fix is left as it is.
	InPlace bool
	// Kept are, for an adoption, the configured addresses taken as they
	// are, with why ("noprefixroute: the kernel cannot change an IPv4
	// address's flags in place"): the plan says which.
	Kept   []string
	Reason string // for conflicts and recreations; for a release, who takes it back
	Wait   string // for pending: the parent it waits for
}

// Release is the op that hands the adopted link ol back (OpReleaseLink):
// why says who takes it back, for the plan line.
func Release(ol ObservedLink, why string) Op {
	return Op{Kind: OpReleaseLink, Link: ol.Name, Old: ol, Reason: why}
}

// releasedAddrs are the addresses a release unmarks (those with the
// mark), and those it cannot: IPv4 before Linux 6.4, where the kernel
// takes no new IFA_PROTO in place and release deletes nothing.
func releasedAddrs(ol ObservedLink) (unmark, kept []netip.Prefix) {
	for _, a := range ol.Addrs {
		switch {
		case !a.Owned:
		case a.Markable:
			unmark = append(unmark, a.Prefix)
		default:
			kept = append(kept, a.Prefix)
		}
	}
	return unmark, kept
}

// Action returns the op's plan symbol.
func (o Op) Action() Action {
	switch o.Kind {
	case OpCreateLink, OpAddAddr:
		return Add
	case OpDeleteLink, OpDelAddr:
		return Remove
	case OpConflict, OpPending:
		return Fail
	}
	return Change
}

// Entry is the op as a line of the sync's report.
func (o Op) Entry() plan.Entry {
	kind := plan.KindLink
	if o.Kind == OpAddAddr || o.Kind == OpDelAddr || o.Kind == OpReownAddr {
		kind = plan.KindAddress
	}
	e := plan.Entry{Subsystem: plan.Links, Kind: kind, Action: plan.Action(o.Action()), Object: o.Object(), Text: o.String(),
		Adopt: (o.Kind == OpAdoptLink && !o.Old.Interrupted) || (o.Kind == OpReownAddr && (o.Adopt || o.InPlace))}
	switch o.Kind {
	case OpConflict:
		e.Err = fmt.Errorf("%s: %s", o.Object(), o.Reason)
	case OpPending:
		e.Err = fmt.Errorf("%s: %w", o.Object(), &host.PendingError{Reason: o.Reason, Missing: o.Wait})
	}
	return e
}

// Report is the plan as report entries, one per op; ops that cannot be
// applied carry their reason as the error.
func (p Plan) Report() plan.Report { return plan.ReportOf(p.Ops) }

// Object names the kernel object the op is about, for errors and status.
func (o Op) Object() string {
	switch o.Kind {
	case OpAddAddr, OpDelAddr, OpReownAddr:
		return fmt.Sprintf("address %s on %s", o.Addr, o.Link)
	}
	return "link " + o.Link
}

func (o Op) String() string {
	var s string
	switch o.Kind {
	case OpDeleteLink:
		s = fmt.Sprintf("link %s (%s)", o.Link, describeObserved(o.Old))
		if o.Reason != "" {
			s += ": " + o.Reason
		}
	case OpCreateLink:
		s = fmt.Sprintf("link %s (%s)", o.Link, describe(o.Desired))
	case OpRenameLink:
		s = fmt.Sprintf("link %s (%s): rename back from %s, which another program named it", o.Link, describe(o.Desired), o.Old.Name)
	case OpAdoptLink:
		if o.Old.Remark != "" {
			s = fmt.Sprintf("link %s mark (%s)", o.Link, o.Old.Remark)
		} else if o.Old.Interrupted {
			s = fmt.Sprintf("link %s mark (its creation was interrupted)", o.Link)
		} else {
			s = fmt.Sprintf("link %s adopt (mark as nodeagent's)", o.Link)
			if len(o.Kept) > 0 {
				s = fmt.Sprintf("link %s adopt (mark as nodeagent's; kept as they are, never deleted to be marked: %s)", o.Link, strings.Join(o.Kept, "; "))
			}
		}
	case OpSetMAC:
		s = fmt.Sprintf("link %s mac %s -> %s", o.Link, o.OldMAC, o.Desired.MAC)
	case OpSetMTU:
		s = fmt.Sprintf("link %s mtu %d -> %d", o.Link, o.Old.MTU, o.Desired.MTU)
	case OpSetUp:
		s = fmt.Sprintf("link %s %s -> %s", o.Link, upDown(o.Old.Up), upDown(o.Desired.Up))
	case OpAddAddr, OpDelAddr:
		s = o.Object()
	case OpReownAddr:
		switch {
		case o.Adopt:
			s = fmt.Sprintf("adopt %s (mark as nodeagent's)", o.Object())
		case o.InPlace:
			s = fmt.Sprintf("adopt %s (mark as nodeagent's in place, was %s)", o.Object(), o.Reason)
		default:
			s = fmt.Sprintf("re-own %s (%s)", o.Object(), o.Reason)
		}
	case OpReleaseLink:
		s = fmt.Sprintf("link %s (%s) hand back: unmark it", o.Link, describeObserved(o.Old))
		unmark, kept := releasedAddrs(o.Old)
		if len(unmark) > 0 {
			s += " and its addresses " + prefixList(unmark)
		}
		s += "; it stays as it is"
		if len(kept) > 0 {
			s += fmt.Sprintf("; %s keeps the mark (the kernel changes an IPv4 address's mark in place only from Linux 6.4, and release deletes nothing)", prefixList(kept))
		}
		if o.Reason != "" {
			s += ": " + o.Reason
		}
	case OpConflict:
		s = fmt.Sprintf("%s: %s", o.Object(), o.Reason)
	case OpPending:
		s = fmt.Sprintf("%s: pending: %s", o.Object(), o.Reason)
	}
	return string(o.Action()) + " " + s
}

func prefixList(ps []netip.Prefix) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return strings.Join(out, ", ")
}

func upDown(up bool) string {
	if up {
		return "up"
	}
	return "down"
}

func describe(l Link) string {
	var b strings.Builder
	if l.Kind == VLAN {
		fmt.Fprintf(&b, "vlan %d on %s", l.VLANID, l.Parent)
	} else {
		fmt.Fprintf(&b, "macvlan %s on %s", l.Mode, l.Parent)
	}
	if l.MTU != 0 {
		fmt.Fprintf(&b, ", mtu %d", l.MTU)
	}
	fmt.Fprintf(&b, ", %s", upDown(l.Up))
	return b.String()
}

func describeObserved(l ObservedLink) string {
	if l.Kind == string(VLAN) {
		return fmt.Sprintf("vlan %d on %s", l.VLANID, l.Parent)
	}
	return fmt.Sprintf("%s on %s", l.Kind, l.Parent)
}

// Plan is an ordered list of ops. The zero Plan changes nothing.
type Plan struct {
	plan.Ops[Op]
	// Desired and Observed are what the plan was made from; Apply uses
	// them to find parents and to observe the result.
	Desired  Desired
	Observed Observed
}

// Deletes returns the links p deletes that exist, ifindex to name: what
// links of other namespaces (pods) may sit on.
func (p Plan) Deletes() map[int]string {
	out := map[int]string{}
	for _, o := range p.Ops {
		if o.Kind == OpDeleteLink && o.Old.Index > 0 {
			out[o.Old.Index] = o.Link
		}
	}
	return out
}

// Conflicts returns the ops that cannot be applied.
func (p Plan) Conflicts() []Op {
	var out []Op
	for _, o := range p.Ops {
		if o.Kind == OpConflict {
			out = append(out, o)
		}
	}
	return out
}

func sortPrefixes(ps []netip.Prefix) {
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
}
