package route

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/plan"
)

// OpKind says what an Op does; Apply runs kinds in this order. Routes go
// in before the rules that send traffic to their tables, and rules go out
// before their routes, so no rule ever points at a table being filled or
// emptied.
type OpKind int

// The operations, in the order Apply runs them.
const (
	OpWriteTables OpKind = iota
	OpAddRoute
	OpReplaceRoute
	OpAdoptRoute // a foreign route marked adopt: replaced in place with nodeagent's protocol
	OpAddRule
	OpAdoptRule // a foreign rule marked adopt: nodeagent's added beside it, then it deleted
	OpDelRule
	OpDelRoute
	OpRemoveTables
	OpPending  // not applied now: waits for a device
	OpConflict // not applied: a foreign object holds the key
	// OpReleaseRoute hands an adopted route back (nodeagent release): it
	// is replaced in place with protocol boot, what `ip route add` gives.
	OpReleaseRoute
	// OpReleaseRule hands an adopted rule back: a copy without
	// nodeagent's protocol is added beside it, then it is deleted.
	OpReleaseRule
)

// Op is one change to one object.
type Op struct {
	Kind  OpKind
	Route Route
	Old   Route // for replace and adopt: the route as found
	Rule  Rule
	// OldRule is the foreign rule an OpAdoptRule takes over, as found.
	OldRule ObservedRule
	// Present says an OpAdoptRule's rule of nodeagent's is in the kernel
	// already (an adoption interrupted between its add and its delete):
	// only the old rule is left to delete.
	Present bool
	Tables  []byte // for OpWriteTables
	File    string
	Reason  string
}

// Object names what the op is about, for errors and status.
func (o Op) Object() string {
	switch {
	case o.isRule():
		return "rule " + o.Rule.String()
	case o.Kind == OpWriteTables || o.Kind == OpRemoveTables:
		return "file " + o.File
	}
	return "route " + o.Route.String()
}

// isRule says the op is about a rule (a conflict is a rule's when it
// names one: no rule of a config has priority 0).
func (o Op) isRule() bool {
	switch o.Kind {
	case OpAddRule, OpDelRule, OpAdoptRule, OpReleaseRule:
		return true
	case OpConflict:
		return o.Rule.Priority != 0
	}
	return false
}

func (o Op) String() string {
	switch o.Kind {
	case OpAddRoute, OpAddRule, OpWriteTables:
		return "+ " + o.Object()
	case OpReplaceRoute:
		return fmt.Sprintf("~ route %s (was %s)", o.Route, o.Old)
	case OpAdoptRoute:
		if o.Old != o.Route {
			return fmt.Sprintf("~ %s adopt (mark as nodeagent's; was %s)", o.Object(), o.Old)
		}
		return fmt.Sprintf("~ %s adopt (mark as nodeagent's)", o.Object())
	case OpAdoptRule:
		if o.Present {
			return fmt.Sprintf("~ %s adopt (delete the old copy beside nodeagent's)", o.Object())
		}
		return fmt.Sprintf("~ %s adopt (mark as nodeagent's)", o.Object())
	case OpDelRule, OpDelRoute, OpRemoveTables:
		if o.Reason != "" {
			return "- " + o.Object() + ": " + o.Reason
		}
		return "- " + o.Object()
	case OpReleaseRoute, OpReleaseRule:
		s := fmt.Sprintf("~ %s hand back: unmark (protocol boot, as ip route add gives it), and it stays", o.Object())
		if o.Kind == OpReleaseRule {
			s = fmt.Sprintf("~ %s hand back: an unmarked copy (as ip rule add makes it) added beside it, then it deleted", o.Object())
		}
		if o.Reason != "" {
			s += ": " + o.Reason
		}
		return s
	}
	if o.Kind == OpPending {
		return fmt.Sprintf("! %s: pending: %s", o.Object(), o.Reason)
	}
	return fmt.Sprintf("! %s: %s", o.Object(), o.Reason)
}

// Entry is the op as a line of the sync's report.
func (o Op) Entry() plan.Entry {
	kind := plan.KindRoute
	action := plan.Change
	switch {
	case o.isRule():
		kind = plan.KindRule
	case o.Kind == OpWriteTables || o.Kind == OpRemoveTables:
		kind = plan.KindFile
	}
	switch o.Kind {
	case OpAddRoute, OpAddRule, OpWriteTables:
		action = plan.Add
	case OpDelRule, OpDelRoute, OpRemoveTables:
		action = plan.Remove
	case OpPending, OpConflict:
		action = plan.NotApplied
	}
	e := plan.Entry{Subsystem: plan.Routes, Kind: kind, Action: action, Object: o.Object(), Text: o.String(),
		Adopt: o.Kind == OpAdoptRoute || o.Kind == OpAdoptRule}
	switch o.Kind {
	case OpPending:
		e.Err = fmt.Errorf("%s: %w", o.Object(), &host.PendingError{Reason: o.Reason, Missing: o.Route.Dev})
	case OpConflict:
		e.Err = fmt.Errorf("%s: %s", o.Object(), o.Reason)
	}
	return e
}

// Report is the plan as report entries, one per op; ops that cannot be
// applied carry their reason as the error.
func (p Plan) Report() plan.Report { return plan.ReportOf(p.Ops) }

// ReleaseRoute is the op that hands the adopted route r back
// (OpReleaseRoute); why, when not empty, says who takes it back.
func ReleaseRoute(r Route, why string) Op { return Op{Kind: OpReleaseRoute, Route: r, Reason: why} }

// ReleaseRule is the op that hands the adopted rule r back
// (OpReleaseRule); why, when not empty, says who takes it back.
func ReleaseRule(r Rule, why string) Op { return Op{Kind: OpReleaseRule, Rule: r, Reason: why} }

// Plan is an ordered list of ops.
type Plan struct {
	plan.Ops[Op]
	Desired  Desired
	Observed Observed
}

// TablesFileContent renders the rt_tables.d entry for tables.
func TablesFileContent(tables []Table) []byte {
	var b bytes.Buffer
	b.WriteString("# Written by nodeagent from /etc/nodeagent/nodeagent.yaml; do not edit.\n")
	for _, t := range tables {
		if t.Name != "" {
			fmt.Fprintf(&b, "%d\t%s\n", t.ID, t.Name)
		}
	}
	return b.Bytes()
}

// MakePlan computes the ops that take o to d. It is a pure function.
func MakePlan(d Desired, o Observed) Plan {
	var ops []Op
	if d.TablesFile != "" {
		want := TablesFileContent(d.Tables)
		hasNames := slices.ContainsFunc(d.Tables, func(t Table) bool { return t.Name != "" })
		switch {
		case hasNames && !bytes.Equal(o.TablesFile, want):
			ops = append(ops, Op{Kind: OpWriteTables, File: d.TablesFile, Tables: want})
		case !hasNames && o.TablesFile != nil:
			ops = append(ops, Op{Kind: OpRemoveTables, File: d.TablesFile})
		}
	}

	have := map[string]ObservedRoute{}
	for _, r := range o.Routes {
		// An owned route wins the key over a foreign one: it is what to
		// compare against.
		if prev, ok := have[r.key()]; !ok || (!prev.Owned && r.Owned) {
			have[r.key()] = r
		}
	}
	wanted := map[string]bool{}
	for _, r := range d.Routes {
		wanted[r.key()] = true
		cur, exists := have[r.key()]
		switch {
		case r.Dev != "" && o.Links[r.Dev] == 0 && !slices.Contains(o.Coming, r.Dev):
			ops = append(ops, Op{Kind: OpPending, Route: r, Reason: fmt.Sprintf("device %s does not exist yet", r.Dev)})
		case !exists:
			ops = append(ops, Op{Kind: OpAddRoute, Route: r})
		case !cur.Owned && d.AdoptRoutes[r] && len(cur.Extra) > 0:
			ops = append(ops, Op{Kind: OpConflict, Route: r, Reason: fmt.Sprintf("the route there (%s) also has %s, which adopting it (a replace with nodeagent's fields) would drop; left untouched", cur.Route, strings.Join(cur.Extra, ", "))})
		case !cur.Owned && d.AdoptRoutes[r]:
			ops = append(ops, Op{Kind: OpAdoptRoute, Route: r, Old: cur.Route})
		case !cur.Owned:
			ops = append(ops, Op{Kind: OpConflict, Route: r, Reason: fmt.Sprintf("a route not created by nodeagent holds this key (%s); left untouched", cur.Route)})
		case cur.Route != r:
			ops = append(ops, Op{Kind: OpReplaceRoute, Route: r, Old: cur.Route})
		}
	}
	for _, r := range o.Routes {
		if r.Owned && !wanted[r.key()] {
			ops = append(ops, Op{Kind: OpDelRoute, Route: r.Route})
		}
	}

	// Foreign rules are observed only for adoption: they are never
	// compared with desired ones otherwise.
	// Rules are observed in the kernel's list order, which is the order
	// a rule delete searches.
	haveRule := map[Rule]int{} // owned rule -> its place in the list
	foreign := map[Rule]int{}  // the first foreign rule just like a desired one
	for i, r := range o.Rules {
		m := haveRule
		if !r.Owned {
			m = foreign
		}
		if _, ok := m[r.Rule]; !ok {
			m[r.Rule] = i
		}
	}
	wantRule := map[Rule]bool{}
	for _, r := range d.Rules {
		wantRule[r] = true
		at, have := haveRule[r]
		old, found := foreign[r]
		adopt := d.AdoptRules[r] && found && !o.Rules[old].Shadowed
		switch {
		case d.AdoptRules[r] && found && o.Rules[old].Shadowed:
			ops = append(ops, Op{Kind: OpConflict, Rule: r, Reason: "another rule at this priority comes before it in the kernel's list, which deleting the old rule could hit; left as it is (give the other rule a priority of its own)"})
		case adopt && !have:
			ops = append(ops, Op{Kind: OpAdoptRule, Rule: r, OldRule: o.Rules[old]})
		case !have:
			ops = append(ops, Op{Kind: OpAddRule, Rule: r})
		case adopt && (o.Rules[old].Proto != 0 || old < at):
			// Ours is there and so is the old one: an adoption was
			// interrupted after its add. The old one is deleted only when
			// the delete cannot hit ours: it has a protocol of its own,
			// or comes first in the list, where a delete without one
			// matches.
			ops = append(ops, Op{Kind: OpAdoptRule, Rule: r, OldRule: o.Rules[old], Present: true})
		}
	}
	for _, r := range o.Rules {
		if r.Owned && !wantRule[r.Rule] {
			ops = append(ops, Op{Kind: OpDelRule, Rule: r.Rule})
		}
	}
	slices.SortStableFunc(ops, func(a, b Op) int { return int(a.Kind) - int(b.Kind) })
	return Plan{Ops: ops, Desired: d, Observed: o}
}
