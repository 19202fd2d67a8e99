package nft

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/nodeagent/nodeagent/netcfg/plan"
)

// OpKind says what an Op does.
type OpKind int

// The kinds of op. A plan's ops only describe the difference; Apply
// replaces whole tables (see the package comment).
const (
	OpDel      OpKind = iota // an observed line the desired table lacks
	OpAdd                    // a desired line the kernel lacks
	OpConflict               // a table nodeagent may not replace
)

// Op is one line of difference: a table, chain, set, set element or rule
// that is to be added or removed.
type Op struct {
	Kind   OpKind
	Family nftables.TableFamily
	Table  string
	// Line is the rendered object: "table", "counter ks_drops",
	// "chain forward { ... }", "set ks0_v4 { ... }",
	// "set ks0_v4: element 10.10.50.0/24",
	// "chain forward: ip saddr @ks0_v4 ... drop".
	Line   string
	Reason string // for OpConflict
}

// Object names the table the op is about, for errors and status.
func (o Op) Object() string {
	return fmt.Sprintf("nft table %s %s", familyName(o.Family), o.Table)
}

// String is the op's plan line: "+ " or "- ", "nft", the family, the table
// and the rendered object, or "! " and the reason for a conflict.
func (o Op) String() string {
	where := fmt.Sprintf("nft %s %s %s", familyName(o.Family), o.Table, o.Line)
	switch o.Kind {
	case OpAdd:
		return "+ " + where
	case OpDel:
		return "- " + where
	}
	return fmt.Sprintf("! %s: %s", where, o.Reason)
}

// Plan is the difference between the desired and the observed tables,
// line by line. It is empty when they render the same.
type Plan struct {
	plan.Ops[Op]
	Desired  Desired
	Observed Observed
}

type tableKey struct {
	family nftables.TableFamily
	name   string
}

// MakePlan compares the tables d wants with the tables observed, line by
// line. It is a pure function. A table d does not want is one line, its
// removal; a table owned by another process (NFT_TABLE_F_OWNER) is a
// conflict.
func MakePlan(d Desired, o Observed) Plan {
	var ops []Op
	have := map[tableKey]Table{}
	for _, t := range o.Tables {
		have[tableKey{t.Family, t.Name}] = t
	}
	want := map[tableKey]bool{}
	for _, t := range d.Tables() {
		k := tableKey{t.Family, t.Name}
		want[k] = true
		cur, exists := have[k]
		switch {
		case exists && cur.Flags&nftTableFOwner != 0:
			ops = append(ops, Op{Kind: OpConflict, Family: t.Family, Table: t.Name, Line: cur.header(),
				Reason: "owned by another process's netlink socket (NFT_TABLE_F_OWNER); left untouched"})
		case exists:
			ops = append(ops, diffTable(t, cur, true)...)
		default:
			ops = append(ops, diffTable(t, Table{}, false)...)
		}
	}
	for _, t := range o.Tables {
		k := tableKey{t.Family, t.Name}
		switch {
		case want[k]:
		case t.Flags&nftTableFOwner != 0:
			ops = append(ops, Op{Kind: OpConflict, Family: t.Family, Table: t.Name, Line: t.header(),
				Reason: "owned by another process's netlink socket (NFT_TABLE_F_OWNER); left untouched"})
		default:
			ops = append(ops, Op{Kind: OpDel, Family: t.Family, Table: t.Name, Line: t.header()})
		}
	}
	return Plan{Ops: ops, Desired: d, Observed: o}
}

// diffTable lists the lines of want and have that differ: the table line,
// then objects, then sets (declaration, elements), then chains
// (declaration, rules).
// exists says whether have was observed at all.
func diffTable(want, have Table, exists bool) []Op {
	var ops []Op
	add := func(kind OpKind, l string) {
		ops = append(ops, Op{Kind: kind, Family: want.Family, Table: want.Name, Line: l})
	}
	if !exists {
		add(OpAdd, want.header())
	} else if want.header() != have.header() {
		add(OpDel, have.header())
		add(OpAdd, want.header())
	}

	for _, o := range objectDiff(want.Objects, have.Objects) {
		add(OpDel, o.header())
	}
	for _, o := range objectDiff(have.Objects, want.Objects) {
		add(OpAdd, o.header())
	}

	haveSets := map[string]Set{}
	for _, s := range have.Sets {
		haveSets[s.Name] = s
	}
	wantSets := map[string]bool{}
	for _, s := range want.Sets {
		wantSets[s.Name] = true
		cur, ok := haveSets[s.Name]
		if !ok || cur.header() != s.header() {
			if ok {
				add(OpDel, cur.header())
			}
			add(OpAdd, s.header())
		}
		var del, ins []string
		if !sameElements(cur.Elements, s.Elements) {
			del, ins = setDiff(cur.elements(), s.elements())
		}
		for _, e := range del {
			add(OpDel, "set "+s.Name+": element "+e)
		}
		for _, e := range ins {
			add(OpAdd, "set "+s.Name+": element "+e)
		}
	}
	for _, s := range have.Sets {
		if !wantSets[s.Name] {
			add(OpDel, s.header())
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
		if !ok || cur.header() != c.header() {
			if ok {
				add(OpDel, cur.header())
			}
			add(OpAdd, c.header())
		}
		for _, d := range seqDiff(ruleStrings(cur.Rules), ruleStrings(c.Rules)) {
			add(d.kind, "chain "+c.Name+": "+d.s)
		}
	}
	for _, c := range have.Chains {
		if !wantChains[c.Name] {
			add(OpDel, c.header())
			for _, r := range c.Rules {
				add(OpDel, "chain "+c.Name+": "+r.String())
			}
		}
	}
	return ops
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
	kind OpKind
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
			out = append(out, seqOp{OpDel, a[i]})
			i++
		default:
			out = append(out, seqOp{OpAdd, b[j]})
			j++
		}
	}
	return out
}
