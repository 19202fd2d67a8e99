package importer

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The import takes over only what the old setup made: the links and
// WireGuard devices it imports, and the policy routing that belongs to
// them. A table belongs to them when one of its routes goes through an
// imported link or device; a rule when it matches on an imported link
// (iif, oif), on a source or destination inside one's addresses, on an
// imported device's fwmark (wg-quick's full tunnel), or looks up a table
// that belongs to them; a table a rule of theirs looks up belongs to them
// too. --only adds what it names. Everything else is another daemon's
// (a CNI's, Tailscale's, ...): listed as a comment with its likely owner,
// never adopted, so the take-over touches none of it.

// scope is what of the node's policy routing the import takes.
type scope struct {
	tables map[int]bool
	rules  map[int]bool // indexes into Snapshot.Rules
	// why says, per table, what made it the old setup's.
	why map[int]string
}

// importedPrefixes are the networks of the imported links' and devices'
// addresses.
func (b *builder) importedPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for name := range b.used {
		for _, a := range b.links[name].Addresses {
			if p, err := netip.ParsePrefix(a.Prefix); err == nil && !p.Addr().IsLinkLocalUnicast() {
				out = append(out, p.Masked())
			}
		}
	}
	return out
}

// importedMarks are the fwmarks of the imported WireGuard devices.
func (b *builder) importedMarks() map[int]bool {
	out := map[int]bool{}
	for _, d := range b.s.WireGuard {
		if b.used[d.Name] && d.FwMark != 0 {
			out[d.FwMark] = true
		}
	}
	return out
}

// within reports whether p is inside one of nets.
func within(p string, nets []netip.Prefix) bool {
	q, err := netip.ParsePrefix(p)
	if err != nil {
		return false
	}
	for _, n := range nets {
		if n.Addr().Is4() == q.Addr().Is4() && n.Bits() <= q.Bits() && n.Contains(q.Addr()) {
			return true
		}
	}
	return false
}

// markOf is the mark of a rule's fwMark text (0x10 or 0x10/0xff), with
// whether the mask is whole.
func markOf(s string) (mark uint64, whole bool) {
	m, mask, masked := strings.Cut(s, "/")
	v, err := strconv.ParseUint(m, 0, 32)
	if err != nil {
		return 0, false
	}
	if !masked {
		return v, true
	}
	k, err := strconv.ParseUint(mask, 0, 32)
	return v, err == nil && k == 0xffffffff
}

// buildScope decides which tables and rules the import takes.
func (b *builder) buildScope() scope {
	sc := scope{tables: map[int]bool{}, rules: map[int]bool{}, why: map[int]string{}}
	b.piaTables = map[int]bool{}
	piaMark := b.piaMark()
	for _, r := range b.s.Routes {
		if reservedTableNames[r.Table] != "" || r.Table == 0 || r.Protocol == protoKernel {
			continue
		}
		if b.used[r.Dev] && !sc.tables[r.Table] {
			sc.tables[r.Table] = true
			sc.why[r.Table] = fmt.Sprintf("its routes go through %s, which is imported", r.Dev)
		}
		// The VLAN's table into PIA's tunnel (not wg-quick's own table of
		// the full tunnel, which goes with it).
		if b.pia != "" && r.Dev == b.pia && r.Table != piaMark {
			sc.tables[r.Table] = true
			sc.why[r.Table] = fmt.Sprintf("its routes go through %s, PIA's tunnel, which nodeagent's replaces", r.Dev)
			b.piaTables[r.Table] = true
		}
	}
	for _, id := range b.routeTables() {
		if b.only != nil && b.selected(strconv.Itoa(id), b.s.TableNames[id]) {
			sc.tables[id] = true
			sc.why[id] = "named by --only"
		}
	}
	nets, marks := b.importedPrefixes(), b.importedMarks()
	// wg-quick's full tunnel: `not fwmark T lookup T` and, one priority
	// ahead of it, `lookup main suppress_prefixlength 0`.
	wgQuickPrio := map[int]bool{}
	ruleOurs := func(r Rule) bool {
		switch {
		case b.used[r.IIF] || b.used[r.OIF]:
			return true
		case r.From != "" && within(r.From, nets), r.To != "" && within(r.To, nets):
			return true
		case r.Action == "table" && sc.tables[r.Table] && reservedTableNames[r.Table] == "":
			return true
		case r.FwMark != "":
			m, whole := markOf(r.FwMark)
			return whole && marks[int(m)]
		}
		return false
	}
	for _, r := range b.s.Rules {
		if m, whole := markOf(r.FwMark); r.FwMark != "" && whole && marks[int(m)] {
			wgQuickPrio[r.Priority-1] = true
		}
	}
	for changed := true; changed; {
		changed = false
		for i, r := range b.s.Rules {
			if sc.rules[i] || isDefaultRule(r) {
				continue
			}
			if b.selected("rules") && b.only != nil || ruleOurs(r) {
				sc.rules[i] = true
				changed = true
				if r.Action == "table" && reservedTableNames[r.Table] == "" && !sc.tables[r.Table] {
					sc.tables[r.Table] = true
					sc.why[r.Table] = fmt.Sprintf("rule %d, which is the old setup's, looks it up", r.Priority)
				}
			}
		}
	}
	for i, r := range b.s.Rules {
		if !sc.rules[i] && wgQuickPrio[r.Priority] && r.Action == "table" && r.Table == 254 && r.SuppressPrefixLength != nil && *r.SuppressPrefixLength == 0 {
			sc.rules[i] = true
		}
		if sc.rules[i] && r.Action == "table" && b.piaTables[r.Table] && r.From != "" && !slices.Contains(b.piaSources, r.From) {
			b.piaSources = append(b.piaSources, r.From)
		}
	}
	return sc
}

// piaWGQuick names a rule or table wg-quick made for the full tunnel of
// PIA's scripts ("" when it is not): it goes with `wg-quick down`.
func (b *builder) piaWGQuick(table int, r *Rule) string {
	mark := b.piaMark()
	if b.pia == "" || mark == 0 {
		return ""
	}
	what := fmt.Sprintf("wg-quick's, for the full tunnel of PIA's %s: it goes with `wg-quick down %s`", b.pia, b.pia)
	switch {
	case r == nil && table == mark:
		return what
	case r == nil:
		return ""
	case r.Table == mark || r.FwMark != "" && markIs(r.FwMark, mark):
		return what
	case r.Table == 254 && r.SuppressPrefixLength != nil && *r.SuppressPrefixLength == 0 && slices.ContainsFunc(b.s.Rules, func(o Rule) bool { return o.Priority == r.Priority+1 && o.Table == mark }):
		return what
	}
	return ""
}

func markIs(s string, mark int) bool {
	m, whole := markOf(s)
	return whole && int(m) == mark
}

// A signature is the shape of another daemon's rule or table, as its
// source installs it. The shapes are taken from the sources, not guessed:
//
//   - Cilium (cilium/cilium, pkg/datapath/linux/linux_defaults,
//     pkg/proxy/routes.go, pkg/datapath/linux/node.go): the kernel's
//     local-table rule moved from 0 to 100 ("from all lookup local", proto
//     kernel); the L7 proxy's rules 9 (fwmark 0x200/0xf00 lookup 2004) and
//     10 (fwmark 0xa00/0xf00 or 0xb00/0xf00 lookup 2005) and their tables
//     (2004: local default dev lo; 2005: via cilium_host); WireGuard's
//     rule 1 and table 201, IPsec's table 200, VTEP's rule 112 and table
//     202, endpoint routing at 20, 110 and 111; Cilium installs its rules
//     and routes with protocol kernel (RTProto), so networkd leaves them.
//   - Tailscale (tailscale/tailscale, wgengine/router/osrouter/
//     router_linux.go, tsconst/linuxfw.go): rules at 5200 + 10, 30, 50
//     and 70 (fwmark 0x80000/0xff0000 lookup main, lookup default,
//     unreachable; lookup 52), and table 52 through tailscale0.
//   - kube-router (cloudnativelabs/kube-router, pkg/routes/pbr.go,
//     pkg/controllers/proxy/network_services_controller.go): table 77
//     (kube-router) looked up from the pod CIDRs, table 78
//     (kube-router-dsr) by fwmark at 32764, table 79 (external_ip) from
//     all at 32765.
//   - Docker (moby/moby, daemon/libnetwork/drivers/bridge): no rules and
//     no tables; its bridges docker0, br-<network id> and docker_gwbridge,
//     and the main table's routes through them.
type signature struct {
	owner, what string
	rule        func(Rule) bool
	table       func(id int, name string) bool
}

var tailscalePrios = map[int]bool{5210: true, 5230: true, 5250: true, 5270: true}

var signatures = []signature{
	{owner: "Cilium", what: "the kernel's local-table rule, which Cilium moves from 0 to 100 to put its own ahead of it",
		rule: func(r Rule) bool {
			return r.Priority == 100 && r.Action == "table" && r.Table == 255 && r.From == "" && r.To == "" && r.FwMark == "" && r.IIF == "" && r.OIF == ""
		}},
	{owner: "Cilium", what: "its L7 proxy's",
		rule: func(r Rule) bool {
			return (r.Priority == 9 && r.FwMark == "0x200/0xf00" && r.Table == 2004) ||
				(r.Priority == 10 && (r.FwMark == "0xa00/0xf00" || r.FwMark == "0xb00/0xf00") && r.Table == 2005)
		},
		table: func(id int, _ string) bool { return id == 2004 || id == 2005 }},
	{owner: "Cilium", what: "its WireGuard encryption's",
		rule:  func(r Rule) bool { return r.Priority == 1 && r.Table == 201 },
		table: func(id int, _ string) bool { return id == 201 }},
	{owner: "Cilium", what: "its IPsec's",
		rule:  func(r Rule) bool { return r.Table == 200 && r.FwMark != "" },
		table: func(id int, _ string) bool { return id == 200 }},
	{owner: "Cilium", what: "its VTEP's",
		rule:  func(r Rule) bool { return r.Priority == 112 && r.Table == 202 },
		table: func(id int, _ string) bool { return id == 202 }},
	{owner: "Cilium", what: "its endpoint routing's",
		rule: func(r Rule) bool {
			return (r.Priority == 20 || r.Priority == 110 || r.Priority == 111) && r.Protocol == protoKernel
		}},
	{owner: "Tailscale", what: "its policy routing (5200 and up)",
		rule: func(r Rule) bool {
			return tailscalePrios[r.Priority] && (r.FwMark == "0x80000/0xff0000" || r.Table == 52)
		},
		table: func(id int, _ string) bool { return id == 52 }},
	{owner: "kube-router", what: "its pod networks' policy routing (table 77, kube-router)",
		rule:  func(r Rule) bool { return r.Table == 77 },
		table: func(id int, name string) bool { return id == 77 || name == "kube-router" }},
	{owner: "kube-router", what: "its DSR services' (table 78, kube-router-dsr)",
		rule:  func(r Rule) bool { return r.Table == 78 && r.Priority == 32764 },
		table: func(id int, name string) bool { return id == 78 || name == "kube-router-dsr" }},
	{owner: "kube-router", what: "its external IPs' (table 79, external_ip)",
		rule:  func(r Rule) bool { return r.Table == 79 && r.Priority == 32765 },
		table: func(id int, name string) bool { return id == 79 || name == "external_ip" }},
}

// ruleOwner names the likely owner of a rule that is not the old setup's.
func ruleOwner(r Rule) string {
	for _, s := range signatures {
		if s.rule != nil && s.rule(r) {
			return s.owner + "'s (" + s.what + ")"
		}
	}
	return ""
}

// tableOwner names the likely owner of a table that is not the old
// setup's, from its id, its name and the links its routes go through.
func (b *builder) tableOwner(id int) string {
	for _, s := range signatures {
		if s.table != nil && s.table(id, b.s.TableNames[id]) {
			return s.owner + "'s (" + s.what + ")"
		}
	}
	for _, r := range b.s.Routes {
		if r.Table == id {
			if o := linkOwner(r.Dev); o != "" {
				return o
			}
		}
	}
	return ""
}

var dockerBridge = regexp.MustCompile(`^(docker0|docker_gwbridge|br-[0-9a-f]{12})$`)

// linkOwner names the likely maker of a link nodeagent does not import,
// by the names their sources give them; "" when none is known.
func linkOwner(name string) string {
	switch {
	case name == "":
		return ""
	case dockerBridge.MatchString(name):
		return "Docker's (its bridge " + name + ")"
	case name == "tailscale0":
		return "Tailscale's (through tailscale0)"
	case slices.Contains([]string{"cilium_host", "cilium_net", "cilium_vxlan", "cilium_geneve", "cilium_wg0"}, name) || strings.HasPrefix(name, "lxc"):
		return "Cilium's (through " + name + ")"
	case name == "kube-bridge" || strings.HasPrefix(name, "tun-"):
		return "kube-router's (through " + name + ")"
	}
	return ""
}

// foreignRule lists a rule that is not the old setup's.
func (b *builder) foreignRule(r Rule) {
	who := cmpOr(b.piaWGQuick(0, &r), ruleOwner(r))
	if who == "" {
		who = "no imported link, address or table of the old setup's; owner not known (--only rules takes every rule)"
	}
	b.foreign = append(b.foreign, fmt.Sprintf("%s%s: %s", ruleText(r), protoSuffix(r.Protocol), who))
}

// foreignTable lists a table that is not the old setup's, with its routes.
func (b *builder) foreignTable(id int) {
	who := cmpOr(b.piaWGQuick(id, nil), b.tableOwner(id))
	if who == "" {
		who = fmt.Sprintf("no route through an imported link, no rule of the old setup's looks it up; owner not known (--only %d takes it)", id)
	}
	name := ""
	if n := b.s.TableNames[id]; n != "" {
		name = " (" + n + ")"
	}
	n := 0
	for _, r := range b.s.Routes {
		if r.Table == id {
			n++
		}
	}
	b.foreign = append(b.foreign, fmt.Sprintf("table %d%s, %d route(s): %s", id, name, n, who))
	for _, r := range b.s.Routes {
		if r.Table == id && r.From != "" {
			b.foreign = append(b.foreign, fmt.Sprintf("  %s: source-specific (from %s), never replaced", routeText(r), r.From))
			b.notes = append(b.notes, fmt.Sprintf("table %d: %s is source-specific (from %s): not imported, left as it is", id, routeText(r), r.From))
		}
	}
}

func protoSuffix(p int) string {
	if p == 0 {
		return ""
	}
	if n := protoNames[p]; n != "" {
		return " proto " + n
	}
	return " proto " + strconv.Itoa(p)
}

// writeForeign writes the comment block listing what the import leaves
// alone, under indent.
func (b *builder) writeForeign(out *strings.Builder, indent string) {
	if len(b.foreign) == 0 {
		return
	}
	out.WriteString(indent + "# Not the old setup's: not imported, never touched by nodeagent (no adopt, and\n")
	out.WriteString(indent + "# nothing of nodeagent's replaces them; a later config does not remove them):\n")
	for _, l := range b.foreign {
		out.WriteString(indent + "#   " + l + "\n")
	}
}
