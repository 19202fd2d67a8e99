package link

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// MakePlan computes the ops that take o to d. It is a pure function.
func MakePlan(d Desired, o Observed) Plan {
	var ops []Op
	want := map[string]Link{}
	for _, l := range d.Links {
		want[l.Name] = l
	}
	for _, name := range slices.Sorted(maps.Keys(o.Links)) {
		ol := o.Links[name]
		if _, ok := want[name]; !ok && ol.Owned && ours(ol.Kind) {
			ops = append(ops, Op{Kind: OpDeleteLink, Link: name, Old: ol})
		}
	}
	waiting := waitingForParent(d, o)
	for _, l := range d.Links {
		if parent, ok := waiting[l.Name]; ok {
			ops = append(ops, Op{Kind: OpPending, Link: l.Name, Desired: l, Reason: fmt.Sprintf("parent %s does not exist", parent), Wait: parent})
			continue
		}
		ops = append(ops, planLink(l, want, o)...)
	}
	slices.SortStableFunc(ops, func(a, b Op) int {
		if a.Kind != b.Kind {
			return int(a.Kind) - int(b.Kind)
		}
		return order(a) - order(b)
	})
	return Plan{Ops: ops, Desired: d, Observed: o}
}

// order sorts ops of one kind: children are deleted before their parents
// and created after them; an MTU is lowered on children first and raised
// on parents first, so a child's MTU never exceeds its parent's.
func order(o Op) int {
	depth := 0
	if o.Desired.Kind == Macvlan || o.Old.Kind == string(Macvlan) {
		depth = 1
	}
	switch o.Kind {
	case OpDeleteLink:
		return -depth
	case OpSetMTU:
		if o.Desired.MTU < o.Old.MTU {
			return -10 - depth
		}
	}
	return depth
}

func ours(kind string) bool { return kind == string(VLAN) || kind == string(Macvlan) }

func planLink(l Link, want map[string]Link, o Observed) []Op {
	conflict := func(format string, a ...any) []Op {
		return []Op{{Kind: OpConflict, Link: l.Name, Desired: l, Reason: fmt.Sprintf(format, a...)}}
	}
	parentMTU, parentKnown := 0, false
	if p, ok := want[l.Parent]; ok && p.MTU != 0 {
		parentMTU, parentKnown = p.MTU, true
	} else if op, ok := o.Links[l.Parent]; ok {
		parentMTU, parentKnown = op.MTU, true
	}
	if l.MTU != 0 && parentKnown && l.MTU > parentMTU {
		return conflict("mtu %d is above parent %s's mtu %d", l.MTU, l.Parent, parentMTU)
	}
	create := func() []Op {
		ops := []Op{{Kind: OpCreateLink, Link: l.Name, Desired: l}}
		for _, a := range l.Addrs {
			ops = append(ops, Op{Kind: OpAddAddr, Link: l.Name, Addr: a})
		}
		return ops
	}
	ol, exists := o.Links[l.Name]
	if !exists {
		return create()
	}
	var ops []Op
	if diff := differs(l, kernelParent(l, want, o), ol); !ol.Owned {
		if !l.Adopt {
			return conflict("exists and was not created by nodeagent; left untouched (set adopt: true to take it over)")
		}
		if diff != "" {
			return conflict("exists but cannot be adopted: %s", diff)
		}
		ops = append(ops, Op{Kind: OpAdoptLink, Link: l.Name, Desired: l, Old: ol})
	} else if diff != "" {
		return append([]Op{{Kind: OpDeleteLink, Link: l.Name, Old: ol, Reason: "recreate: " + diff}}, create()...)
	} else if ol.Interrupted {
		ops = append(ops, Op{Kind: OpAdoptLink, Link: l.Name, Desired: l, Old: ol})
	}
	if cur := o.MACs[ol.Index]; l.MAC != nil && !bytes.Equal(cur, l.MAC) {
		ops = append(ops, Op{Kind: OpSetMAC, Link: l.Name, Desired: l, Old: ol, OldMAC: cur})
	}
	if l.MTU != 0 && l.MTU != ol.MTU {
		ops = append(ops, Op{Kind: OpSetMTU, Link: l.Name, Desired: l, Old: ol})
	}
	if l.Up != ol.Up {
		ops = append(ops, Op{Kind: OpSetUp, Link: l.Name, Desired: l, Old: ol})
	}
	// A link has a handful of addresses: scanning beats building maps, and
	// this runs for every link on every sync.
	var kept []string
	for _, a := range l.Addrs {
		i := slices.IndexFunc(ol.Addrs, func(o ObservedAddr) bool { return o.Prefix == a })
		if i < 0 {
			ops = append(ops, Op{Kind: OpAddAddr, Link: l.Name, Addr: a})
			continue
		}
		oa := ol.Addrs[i]
		if l.Adopt && !oa.ours() {
			// Never delete to adopt: marked in place where the kernel
			// can, else taken as it is.
			if why := notInPlace(oa); why != "" {
				kept = append(kept, fmt.Sprintf("%s (%s)", oa.Prefix, why))
				continue
			}
			op, _ := reown(l.Name, ol, oa)
			op.InPlace = true
			ops = append(ops, op)
			continue
		}
		if op, ok := reown(l.Name, ol, oa); ok {
			ops = append(ops, op)
		}
	}
	if len(kept) > 0 && !ol.Owned {
		for i := range ops {
			if ops[i].Kind == OpAdoptLink {
				ops[i].Kept = kept
			}
		}
	}
	for _, a := range ol.Addrs {
		if a.Owned && !slices.Contains(l.Addrs, a.Prefix) {
			ops = append(ops, Op{Kind: OpDelAddr, Link: l.Name, Addr: a.Prefix})
		}
	}
	return ops
}

// reown is the op that makes oa, a configured address found on ol, nodeagent's
// again, and whether one is needed (the rule is in the package comment):
// an address in another form always, one without the mark only where
// the kernel marks it in place. An address without the mark in the plain
// form on a link being adopted is adopted: marked, nothing else.
func reown(link string, ol ObservedLink, oa ObservedAddr) (Op, bool) {
	if oa.ours() || (len(oa.Form) == 0 && !oa.Markable) {
		return Op{}, false
	}
	op := Op{Kind: OpReownAddr, Link: link, Addr: oa.Prefix, OldAddr: oa}
	why := slices.Clone(oa.Form)
	if !oa.Owned {
		why = append(why, "not ours")
	}
	op.Reason = strings.Join(why, ", ")
	op.Adopt = !ol.Owned && len(oa.Form) == 0
	return op, true
}

// notInPlace says why the kernel cannot give oa, an address not nodeagent's
// or not in its form, nodeagent's mark and form with one replace, which
// never takes it off the link (host.Host.AddrReown says what a replace
// changes): "" when it can. IPv6 takes a new mark, flags and lifetimes
// but keeps a metric; IPv4 takes lifetimes and a metric, a mark only from
// Linux 6.4, and never new flags.
func notInPlace(oa ObservedAddr) string {
	var flags []string
	for _, f := range oa.Form {
		if !strings.Contains(f, " ") { // a flag: noprefixroute, nodad, ...
			flags = append(flags, f)
		}
	}
	metric := slices.ContainsFunc(oa.Form, func(f string) bool { return strings.HasPrefix(f, "metric ") })
	switch {
	case oa.Prefix.Addr().Is4() && len(flags) > 0:
		return strings.Join(flags, ", ") + ": the kernel cannot change an IPv4 address's flags in place"
	case oa.Prefix.Addr().Is6() && metric:
		return "a metric, which the kernel keeps through a replace"
	case !oa.Owned && !oa.Markable && oa.Prefix.Addr().Is4():
		return "the kernel marks an IPv4 address in place only from Linux 6.4"
	case !oa.Owned && !oa.Markable:
		return "the kernel cannot mark it in place (no IFA_PROTO before Linux 6.1)"
	}
	return ""
}

// waitingForParent returns the desired links that cannot be created yet,
// with the missing parent each waits for: a parent that neither exists nor
// will be created by this sync, directly or further up (a shim on a VLAN
// whose trunk is missing waits too).
func waitingForParent(d Desired, o Observed) map[string]string {
	want := map[string]Link{}
	for _, l := range d.Links {
		want[l.Name] = l
	}
	waiting := map[string]string{}
	var missing func(name string, depth int) string
	missing = func(name string, depth int) string {
		if _, ok := o.Links[name]; ok {
			return ""
		}
		l, ok := want[name]
		if !ok || depth > len(d.Links) {
			return name
		}
		return missing(l.Parent, depth+1)
	}
	for _, l := range d.Links {
		if _, ok := o.Links[l.Name]; ok {
			continue
		}
		if m := missing(l.Parent, 0); m != "" {
			waiting[l.Name] = m
		}
	}
	return waiting
}

// kernelParent is the parent l reads back with once made: its Parent,
// except for a macvlan on a macvlan, which the kernel puts on that
// macvlan's own lower device (macvlan_common_newlink), so that it reads
// back as a sibling. Compared with its Parent, it would be made again on
// every sync.
func kernelParent(l Link, want map[string]Link, o Observed) string {
	if l.Kind != Macvlan {
		return l.Parent
	}
	if p, ok := o.Links[l.Parent]; ok {
		if p.Kind == string(Macvlan) && p.Parent != "" {
			return p.Parent
		}
		return l.Parent
	}
	if p, ok := want[l.Parent]; ok && p.Kind == Macvlan {
		return p.Parent // made by this sync, on its parent
	}
	return l.Parent
}

// differs says why an existing link cannot become l, whose parent reads
// back as parent (kernelParent), by changing it in place, or "" when it
// can.
func differs(l Link, parent string, ol ObservedLink) string {
	switch {
	case ol.Kind != string(l.Kind):
		return fmt.Sprintf("it is a %s, not a %s", ol.Kind, l.Kind)
	case ol.Parent != parent && parent == l.Parent:
		return fmt.Sprintf("parent %s -> %s", ol.Parent, l.Parent)
	case ol.Parent != parent:
		return fmt.Sprintf("parent %s -> %s (%s's parent: a macvlan on a macvlan is on that one's parent)", ol.Parent, parent, l.Parent)
	case l.Kind == VLAN && ol.VLANID != l.VLANID:
		return fmt.Sprintf("vlan id %d -> %d", ol.VLANID, l.VLANID)
	case l.Kind == Macvlan && ol.Mode != l.Mode:
		return fmt.Sprintf("mode %s -> %s", ol.Mode, l.Mode)
	}
	return ""
}
