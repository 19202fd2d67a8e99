package route

import (
	"bytes"
	"fmt"
	"slices"

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
	OpAddRule
	OpDelRule
	OpDelRoute
	OpRemoveTables
	OpPending  // not applied now: waits for a device
	OpConflict // not applied: a foreign object holds the key
)

// Op is one change to one object.
type Op struct {
	Kind   OpKind
	Route  Route
	Old    Route // for replace
	Rule   Rule
	Tables []byte // for OpWriteTables
	File   string
	Reason string
}

// Object names what the op is about, for errors and status.
func (o Op) Object() string {
	switch o.Kind {
	case OpAddRule, OpDelRule:
		return "rule " + o.Rule.String()
	case OpWriteTables, OpRemoveTables:
		return "file " + o.File
	}
	return "route " + o.Route.String()
}

func (o Op) String() string {
	switch o.Kind {
	case OpAddRoute, OpAddRule, OpWriteTables:
		return "+ " + o.Object()
	case OpReplaceRoute:
		return fmt.Sprintf("~ route %s (was %s)", o.Route, o.Old)
	case OpDelRule, OpDelRoute, OpRemoveTables:
		return "- " + o.Object()
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
	switch o.Kind {
	case OpAddRule, OpDelRule:
		kind = plan.KindRule
	case OpWriteTables, OpRemoveTables:
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
	e := plan.Entry{Subsystem: plan.Routes, Kind: kind, Action: action, Object: o.Object(), Text: o.String()}
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

	haveRule := map[Rule]bool{}
	for _, r := range o.Rules {
		haveRule[r.Rule] = true
	}
	wantRule := map[Rule]bool{}
	for _, r := range d.Rules {
		wantRule[r] = true
		if !haveRule[r] {
			ops = append(ops, Op{Kind: OpAddRule, Rule: r})
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
