package nft

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/nodeagent/nodeagent/netcfg/plan"
)

// OpKind says what an Op does to the kernel. Each op carries the
// nftables objects it writes; Apply compiles exactly the ops into one
// transaction.
type OpKind int

// The kinds of op.
const (
	OpAddTable    OpKind = iota // a table and everything in it
	OpDelTable                  // a nodeagent* table the config no longer wants
	OpTableFlags                // NEWTABLE on the existing table (a dormant table wakes)
	OpDelObject                 // a named object nodeagent does not want
	OpAddObject                 // a missing object (a counter is never replaced)
	OpDelSet                    // an unwanted set
	OpAddSet                    // a missing set, with its elements (Replace: deleted first)
	OpSetElements               // elements deleted from and added to an existing set
	OpDelChain                  // an unwanted chain: flushed, deleted
	OpAddChain                  // a missing chain with its rules (Replace: flushed and deleted first)
	OpRefillChain               // a chain flushed and filled with its rules (Policy: its policy too)
	OpChainPolicy               // a chain whose policy alone differs
	OpConflict                  // a table nodeagent may not replace
)

// Line is one line the op shows in the plan: a rendered object that is
// added or removed ("chain forward: ip saddr @ks0_v4 ... drop").
type Line struct {
	Action plan.Action
	Text   string
}

// Op is one change to one object of a table.
type Op struct {
	Kind   OpKind
	Family nftables.TableFamily
	Table  string
	// What the op writes: the whole table for OpAddTable; the object, the
	// set (its elements for OpAddSet) or the chain (its rules for
	// OpAddChain and OpRefillChain) otherwise.
	Whole Table
	Obj   Object
	Set   Set
	Chain Chain
	// DelElements and AddElements are OpSetElements' change.
	DelElements, AddElements []nftables.SetElement
	// Replace: OpAddSet or OpAddChain replaces an object declared
	// differently, deleted in the same transaction. Policy: OpRefillChain
	// also sets the chain's policy.
	Replace, Policy bool
	// Lines are what the plan shows of the op, in order.
	Lines  []Line
	Reason string // for OpConflict
}

// Object names the table the op is about, for errors and status.
func (o Op) Object() string {
	return fmt.Sprintf("nft table %s %s", familyName(o.Family), o.Table)
}

// String is the op's plan lines: "+ " or "- ", "nft", the family, the
// table and the rendered object, or "! " and the reason for a conflict.
// An op that changes what the kernel holds without changing a rendered
// line (a chain refilled because a set its rules use is replaced) shows
// none.
func (o Op) String() string {
	var b strings.Builder
	for i, l := range o.Lines {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(o.line(l))
	}
	return b.String()
}

func (o Op) line(l Line) string {
	where := fmt.Sprintf("nft %s %s %s", familyName(o.Family), o.Table, l.Text)
	if o.Kind == OpConflict {
		return fmt.Sprintf("! %s: %s", where, o.Reason)
	}
	return string(l.Action) + " " + where
}

// Entries are the op's lines as report entries.
func (o Op) Entries() []plan.Entry {
	out := make([]plan.Entry, 0, len(o.Lines))
	for _, l := range o.Lines {
		e := plan.Entry{Subsystem: plan.Nftables, Kind: plan.KindNftables, Action: l.Action, Object: o.Object(), Text: o.line(l)}
		if o.Kind == OpConflict {
			e.Action = plan.NotApplied
			e.Err = fmt.Errorf("%s: %s", o.Object(), o.Reason)
		}
		out = append(out, e)
	}
	return out
}

// Plan is the difference between the desired and the observed tables, as
// the ops that take one to the other. It is empty when they render the
// same.
type Plan struct {
	plan.Ops[Op]
	Desired  Desired
	Observed Observed
}

// Report is the plan as report entries, one per line; a conflict carries
// its reason as the error.
func (p Plan) Report() plan.Report {
	var r plan.Report
	for _, o := range p.Ops {
		r = append(r, o.Entries()...)
	}
	return r
}

// String is the plan text, one line per rendered object.
func (p Plan) String() string { return p.Report().String() }

type tableKey struct {
	family nftables.TableFamily
	name   string
}

// MakePlan compares the tables d wants with the tables observed. It is a
// pure function. A table d does not want is one op, its removal; a table
// owned by another process (NFT_TABLE_F_OWNER) is a conflict.
func MakePlan(d Desired, o Observed) Plan {
	var ops []Op
	have := map[tableKey]Table{}
	for _, t := range o.Tables {
		have[tableKey{t.Family, t.Name}] = t
	}
	conflict := func(t Table) Op {
		return Op{Kind: OpConflict, Family: t.Family, Table: t.Name, Lines: []Line{{plan.NotApplied, t.header()}},
			Reason: "owned by another process's netlink socket (NFT_TABLE_F_OWNER); left untouched"}
	}
	want := map[tableKey]bool{}
	for _, t := range soakBreak(d.Tables(), have) {
		k := tableKey{t.Family, t.Name}
		want[k] = true
		cur, exists := have[k]
		switch {
		case exists && cur.Flags&nftTableFOwner != 0:
			ops = append(ops, conflict(cur))
		case exists:
			ops = append(ops, Diff(t, cur)...)
		default:
			ops = append(ops, addTable(t))
		}
	}
	for _, t := range o.Tables {
		k := tableKey{t.Family, t.Name}
		switch {
		case want[k]:
		case t.Flags&nftTableFOwner != 0:
			ops = append(ops, conflict(t))
		default:
			ops = append(ops, Op{Kind: OpDelTable, Family: t.Family, Table: t.Name, Lines: []Line{{plan.Remove, t.header()}}})
		}
	}
	return Plan{Ops: ops, Desired: d, Observed: o}
}

// addTable is the op that creates want whole: its lines are everything in
// it.
func addTable(want Table) Op {
	op := Op{Kind: OpAddTable, Family: want.Family, Table: want.Name, Whole: want}
	add := func(text string) { op.Lines = append(op.Lines, Line{plan.Add, text}) }
	add(want.header())
	for _, o := range want.Objects {
		add(o.header())
	}
	for _, s := range want.Sets {
		add(s.header())
		for _, e := range s.elements() {
			add("set " + s.Name + ": element " + e)
		}
	}
	for _, c := range want.Chains {
		add(c.header())
		for _, r := range c.Rules {
			add("chain " + c.Name + ": " + r.String())
		}
	}
	return op
}

// Diff returns the ops that take the existing table have to want, in plan
// order: the table line, then objects, then sets (declaration, elements),
// then chains (declaration, rules). What is right is left alone: a set
// whose elements differ gets exactly the missing elements added and the
// extra ones deleted, a chain whose rules differ is flushed and refilled,
// and a chain or set whose declaration was changed by hand is replaced.
// The table is never deleted and re-added (see Apply).
func Diff(want, have Table) []Op {
	var ops []Op
	op := func(kind OpKind) *Op {
		ops = append(ops, Op{Kind: kind, Family: want.Family, Table: want.Name})
		return &ops[len(ops)-1]
	}
	line := func(o *Op, a plan.Action, text string) { o.Lines = append(o.Lines, Line{a, text}) }

	if want.header() != have.header() {
		o := op(OpTableFlags)
		line(o, plan.Remove, have.header())
		line(o, plan.Add, want.header())
	}

	// Objects to delete: unwanted (a counter is never replaced: one that is
	// wanted is left as it is). Rules that refer to them go with them, so
	// their chains are refilled.
	delObjs := objectDiff(want.Objects, have.Objects)
	for _, x := range delObjs {
		o := op(OpDelObject)
		o.Obj = x
		line(o, plan.Remove, x.header())
	}
	for _, x := range objectDiff(have.Objects, want.Objects) {
		o := op(OpAddObject)
		o.Obj = x
		line(o, plan.Add, x.header())
	}

	haveSets := map[string]Set{}
	for _, s := range have.Sets {
		haveSets[s.Name] = s
	}
	wantSets := map[string]bool{}
	var delSets []string
	for _, s := range want.Sets {
		wantSets[s.Name] = true
		cur, ok := haveSets[s.Name]
		if !ok || cur.header() != s.header() {
			o := op(OpAddSet)
			o.Set, o.Replace = s, ok
			if ok {
				delSets = append(delSets, s.Name)
				line(o, plan.Remove, cur.header())
			}
			line(o, plan.Add, s.header())
			elementLines(o, cur, s)
			continue
		}
		if sameElements(cur.Elements, s.Elements) {
			continue
		}
		o := op(OpSetElements)
		o.Set = s
		o.DelElements, o.AddElements = elementDiff(cur.Elements, s.Elements)
		elementLines(o, cur, s)
	}
	for _, s := range have.Sets {
		if !wantSets[s.Name] {
			if !s.Anonymous { // an anonymous set is bound to a rule; it goes with it
				delSets = append(delSets, s.Name)
			}
			o := op(OpDelSet)
			o.Set = s
			line(o, plan.Remove, s.header())
		}
	}

	haveChains := map[string]Chain{}
	for _, c := range have.Chains {
		haveChains[c.Name] = c
	}
	wantChains := map[string]bool{}
	for _, c := range want.Chains {
		wantChains[c.Name] = true
		cur, ok := haveChains[c.Name]
		rules := seqDiff(ruleStrings(cur.Rules), ruleStrings(c.Rules))
		var o *Op
		switch {
		case !ok || !sameHook(c.Chain, cur.Chain):
			o = op(OpAddChain)
			o.Replace = ok
			if ok {
				line(o, plan.Remove, cur.header())
			}
			line(o, plan.Add, c.header())
		case len(rules) > 0 || refersToAny(cur.Rules, delSets, delObjs):
			o = op(OpRefillChain)
			if c.header() != cur.header() {
				o.Policy = true
				line(o, plan.Remove, cur.header())
				line(o, plan.Add, c.header())
			}
		case c.header() != cur.header():
			o = op(OpChainPolicy)
			line(o, plan.Remove, cur.header())
			line(o, plan.Add, c.header())
		default:
			continue
		}
		o.Chain = c
		for _, d := range rules {
			line(o, plan.Action(d.kind), "chain "+c.Name+": "+d.s)
		}
	}
	for _, c := range have.Chains {
		if !wantChains[c.Name] {
			o := op(OpDelChain)
			o.Chain = c
			line(o, plan.Remove, c.header())
			for _, r := range c.Rules {
				line(o, plan.Remove, "chain "+c.Name+": "+r.String())
			}
		}
	}
	return ops
}

// elementLines adds the lines of the elements that differ between the
// sets have and want, as the kernel renders them.
func elementLines(o *Op, have, want Set) {
	if sameElements(have.Elements, want.Elements) {
		return
	}
	del, ins := setDiff(have.elements(), want.elements())
	for _, e := range del {
		o.Lines = append(o.Lines, Line{plan.Remove, "set " + want.Name + ": element " + e})
	}
	for _, e := range ins {
		o.Lines = append(o.Lines, Line{plan.Add, "set " + want.Name + ": element " + e})
	}
}

// refersToAny reports whether a rule of rules looks up one of the sets or
// refers to one of the objects: deleting those takes the rules with them.
func refersToAny(rules []Rule, sets []string, objs []Object) bool {
	for _, r := range rules {
		if slices.ContainsFunc(sets, r.looksUp) || slices.ContainsFunc(objs, r.refersTo) {
			return true
		}
	}
	return false
}

// objectDiff returns the objects of b that a lacks, by type and name.
func objectDiff(a, b []Object) []Object {
	var out []Object
	for _, o := range b {
		if !slices.ContainsFunc(a, o.sameObject) {
			out = append(out, o)
		}
	}
	return out
}

// sameObject reports whether o and p are the same object: the same type
// and name, whatever they hold.
func (o Object) sameObject(p Object) bool {
	return o.Type == p.Type && o.Name == p.Name
}

// sameElements reports whether a and b hold the same elements as the
// kernel holds them, whatever their order. It spares rendering thousands of
// elements when nothing changed, the common case.
func sameElements(a, b []nftables.SetElement) bool {
	if len(a) != len(b) {
		return false
	}
	ia, ib := sortedIndex(a), sortedIndex(b)
	for k := range ia {
		x, y := &a[ia[k]], &b[ib[k]]
		if compareElements(x, y) != 0 || !bytes.Equal(x.Val, y.Val) {
			return false
		}
	}
	return true
}

// sortedIndex returns the indices of els in element order. Elements as
// built are in order already, and the kernel dumps them in reverse.
func sortedIndex(els []nftables.SetElement) []int {
	idx := make([]int, len(els))
	for i := range idx {
		idx[i] = i
	}
	less := func(i, j int) int { return compareElements(&els[i], &els[j]) }
	if !slices.IsSortedFunc(idx, less) {
		slices.Reverse(idx)
		if !slices.IsSortedFunc(idx, less) {
			slices.SortFunc(idx, less)
		}
	}
	return idx
}

func ruleStrings(rs []Rule) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
	}
	return out
}

// setDiff returns what is only in a and what is only in b; both are
// sorted.
func setDiff(a, b []string) (onlyA, onlyB []string) {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			onlyA = append(onlyA, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			onlyB = append(onlyB, b[j])
			j++
		default:
			i++
			j++
		}
	}
	return onlyA, onlyB
}

type seqOp struct {
	kind plan.Action
	s    string
}

// seqDiff is a line diff of the rule lists a (observed) and b (desired)
// by longest common subsequence, since rule order matters: a rule moved is
// a rule removed and added.
func seqDiff(a, b []string) []seqOp {
	if slices.Equal(a, b) {
		return nil
	}
	// lcs[i][j] is the LCS length of a[i:] and b[j:].
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []seqOp
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			i++
			j++
		case j == len(b) || (i < len(a) && lcs[i+1][j] >= lcs[i][j+1]):
			out = append(out, seqOp{plan.Remove, a[i]})
			i++
		default:
			out = append(out, seqOp{plan.Add, b[j]})
			j++
		}
	}
	return out
}
