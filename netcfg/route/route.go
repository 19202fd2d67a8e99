// Package route converges policy routing: routing tables (with an
// rt_tables.d entry naming them), routes in them, and rules, with the
// Observe/MakePlan/Apply shape of every nodeagent subsystem.
//
// Ownership: routes carry nodeagent's route protocol (host.Proto) and rules
// its FRA_PROTOCOL. Only those are ever changed or deleted; a foreign route
// with the key of a desired one is a conflict, and foreign rules, even at a
// priority nodeagent also uses, are left alone.
//
// Adoption is the one exception, and it is explicit per object: a desired
// route or rule the config marks adopt: true (Desired.AdoptRoutes,
// Desired.AdoptRules) takes over the foreign one it names, without a packet
// taking another path meanwhile. A route is replaced in place
// (NLM_F_REPLACE) with nodeagent's protocol, also when its other fields
// differ from the desired ones; it is never deleted first. A rule is
// make-before-break: nodeagent's rule is added at the same priority, behind
// the old one, before the old one is deleted by its own protocol (see
// adoptRule). A marked object that does not exist yet is simply added, and
// one nodeagent already owns needs nothing: the mark is a no-op then.
//
// A kill-switch table gets `unreachable default` (IPv4 and IPv6) at the
// highest metric, so a missing tunnel device leaves the table unreachable
// instead of empty: traffic sent to it never falls through to the main table.
package route

import (
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/sys/unix"
)

// KillSwitchMetric is the metric of a kill-switch table's unreachable
// default: the highest there is, so any real default wins over it.
const KillSwitchMetric = 0xffffffff

// Table is a routing table nodeagent names.
type Table struct {
	ID   int
	Name string
}

// Route is one route. Every field is explicit (scope and IPv6 metric
// resolved the way the kernel reports them) so that desired and observed
// routes compare with ==.
type Route struct {
	Table  int
	To     netip.Prefix
	Type   uint8 // unix.RTN_UNICAST, RTN_UNREACHABLE, RTN_BLACKHOLE, RTN_PROHIBIT
	Via    netip.Addr
	Dev    string
	Src    netip.Addr
	Metric uint32
	Scope  uint8
	OnLink bool
}

// Rule is one policy routing rule.
type Rule struct {
	Priority int
	Family   int // unix.AF_INET or AF_INET6
	From, To netip.Prefix
	IIF, OIF string
	Mark     uint32
	Mask     uint32
	HasMark  bool
	Table    int
	Suppress int   // suppress_prefixlength, -1 for none
	Action   uint8 // unix.FR_ACT_TO_TBL, FR_ACT_UNREACHABLE, FR_ACT_BLACKHOLE, FR_ACT_PROHIBIT
	Invert   bool
}

// Desired is the whole desired state of this subsystem.
type Desired struct {
	Tables []Table
	Routes []Route
	Rules  []Rule
	// AdoptRoutes are the desired routes (members of Routes) that take over
	// a foreign route with their key; AdoptRules the desired rules that
	// take over a foreign rule just like them. They are kept beside Routes
	// and Rules, which compare with the kernel's by ==.
	AdoptRoutes map[Route]bool
	AdoptRules  map[Rule]bool
	// TablesFile is the rt_tables.d entry that names the tables for `ip`;
	// "" leaves it alone.
	TablesFile string
}

func family(p netip.Prefix) int {
	if p.Addr().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

var typeName = map[uint8]string{
	unix.RTN_UNICAST: "unicast", unix.RTN_UNREACHABLE: "unreachable",
	unix.RTN_BLACKHOLE: "blackhole", unix.RTN_PROHIBIT: "prohibit",
}

var scopeName = map[uint8]string{
	unix.RT_SCOPE_UNIVERSE: "global", unix.RT_SCOPE_LINK: "link", unix.RT_SCOPE_HOST: "host",
}

// key is the kernel's identity of a route: a second route with the same key
// replaces it rather than standing beside it.
func (r Route) key() string {
	return fmt.Sprintf("%d|%s|%d", r.Table, r.To, r.Metric)
}

func (r Route) String() string {
	var b strings.Builder
	if r.Type != unix.RTN_UNICAST {
		b.WriteString(typeName[r.Type] + " ")
	}
	if r.To.Bits() == 0 {
		if r.To.Addr().Is4() {
			b.WriteString("default")
		} else {
			b.WriteString("default ::/0")
		}
	} else {
		b.WriteString(r.To.String())
	}
	if r.Via.IsValid() {
		fmt.Fprintf(&b, " via %s", r.Via)
	}
	if r.Dev != "" {
		fmt.Fprintf(&b, " dev %s", r.Dev)
	}
	if r.Src.IsValid() {
		fmt.Fprintf(&b, " src %s", r.Src)
	}
	fmt.Fprintf(&b, " table %d", r.Table)
	if r.Metric != 0 {
		fmt.Fprintf(&b, " metric %d", r.Metric)
	}
	if r.Scope != unix.RT_SCOPE_UNIVERSE && r.To.Addr().Is4() {
		fmt.Fprintf(&b, " scope %s", scopeName[r.Scope])
	}
	if r.OnLink {
		b.WriteString(" onlink")
	}
	return b.String()
}

var actionName = map[uint8]string{
	unix.FR_ACT_UNREACHABLE: "unreachable", unix.FR_ACT_BLACKHOLE: "blackhole", unix.FR_ACT_PROHIBIT: "prohibit",
}

func (r Rule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d:", r.Priority)
	if r.Family == unix.AF_INET6 {
		b.WriteString(" ipv6")
	}
	if r.Invert {
		b.WriteString(" not")
	}
	if r.From.IsValid() {
		fmt.Fprintf(&b, " from %s", r.From)
	} else {
		b.WriteString(" from all")
	}
	if r.To.IsValid() {
		fmt.Fprintf(&b, " to %s", r.To)
	}
	if r.HasMark {
		fmt.Fprintf(&b, " fwmark %#x/%#x", r.Mark, r.Mask)
	}
	if r.IIF != "" {
		fmt.Fprintf(&b, " iif %s", r.IIF)
	}
	if r.OIF != "" {
		fmt.Fprintf(&b, " oif %s", r.OIF)
	}
	if r.Action == unix.FR_ACT_TO_TBL {
		fmt.Fprintf(&b, " lookup %d", r.Table)
	} else {
		b.WriteString(" " + actionName[r.Action])
	}
	if r.Suppress >= 0 {
		fmt.Fprintf(&b, " suppress_prefixlength %d", r.Suppress)
	}
	return b.String()
}
