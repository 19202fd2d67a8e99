package nft

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/plan"
)

// Apply carries out p (Execute) and returns the state it reached, read
// again after the transaction, with the report of every line.
func Apply(ctx context.Context, s *host.Snapshot, p Plan) (Observed, plan.Report) {
	return plan.Applied(plan.Nftables, Execute(ctx, s, p), p.Observed, func() (Observed, error) { return Observe(ctx, s.After(), p.Desired) })
}

// Execute compiles exactly p's ops into one nftables transaction (one
// batch, one Flush) and reports every line; when p has nothing to write it
// sends nothing.
//
// The table is updated in place, never deleted and re-added: MakePlan
// leaves alone what is right, gives a set whose elements differ exactly
// the missing elements and deletes the extra ones, flushes and refills a
// chain whose rules differ, and replaces a chain or set whose declaration
// is wrong (changed by hand). nf_tables commits a batch all or nothing, and
// a packet sees a chain's old rules or its new ones and a set's old
// elements or its new ones, switched together when the generation flips.
// That is not true of objects created in the batch: deleting and re-adding
// the table (or a set) in one transaction leaks, measured under a flood on
// Linux 6.18 (a set created in a transaction can miss lookups for a moment
// after the commit), so the kill switch's chain and sets are never
// replaced while they are in use. A table nodeagent no longer wants is
// deleted.
//
// The ops are queued in the order the kernel needs them, table by table:
// chains emptied or deleted, then objects, then sets, then chains filled,
// so that nothing refers to what is gone. If the kernel refuses the
// transaction (the table changed since it was observed, or holds what
// cannot be diffed), nothing of it is applied, and the table is at once
// replaced whole in a second transaction (replaceWhole), reported as one
// more entry (Replaced): a refused diff would otherwise be refused again
// at every sync, and every later change of the firewall lost. Only when
// that fails too do the ops fail, with both of the kernel's reasons. The kill switch counts into a named counter
// object (KillSwitchCounter), which refilling a chain does not touch and
// Execute never writes once it exists, so no count is carried over or lost.
// Tables owned by another process (NFT_TABLE_F_OWNER) are left out and
// reported.
func Execute(ctx context.Context, s *host.Snapshot, p Plan) plan.Report {
	h := s.Host()
	r := p.Report()
	if !r.Writes() {
		return r
	}
	if err := ctx.Err(); err != nil {
		r.Fail(err)
		return r
	}
	// Which report entries each op's lines are, to fail them together.
	var ops []int
	var names []string
	seen := map[tableKey]bool{}
	for i, o := range p.Ops {
		if o.Kind == OpConflict {
			continue
		}
		ops = append(ops, i)
		if k := (tableKey{o.Family, o.Table}); !seen[k] {
			seen[k] = true
			names = append(names, familyName(o.Family)+" "+o.Table)
		}
	}
	if len(ops) == 0 {
		return r
	}
	failOps := func(err error) {
		n := 0
		for _, o := range p.Ops {
			if o.Kind != OpConflict {
				r[n : n+len(o.Lines)].Fail(err)
			}
			n += len(o.Lines)
		}
	}
	obj := "nft table " + strings.Join(names, ", ")
	c, err := dial(h)
	if err != nil {
		failOps(fmt.Errorf("%s: %w", obj, err))
		return r
	}
	defer c.close()
	b := &batch{c: c.nft}
	b.compile(p.Ops, ops)
	if b.err != nil {
		// Nothing was sent; the queued messages go with the conn.
		failOps(fmt.Errorf("%s: %w", obj, b.err))
		return r
	}
	h.Wrote(1) // one transaction
	if err := c.nft.Flush(); err != nil {
		// The update was refused as a whole (the table changed since it
		// was observed, or holds what the kernel will not diff): replace
		// the table whole, once, rather than send the same refused diff
		// at every sync while every later change is lost.
		h.Wrote(1)
		if rerr := replaceWhole(c.nft, p, ops); rerr != nil {
			failOps(fmt.Errorf("%s: transaction: %w; replacing the table whole failed too: %v", obj, err, rerr))
			return r
		}
		r = append(r, plan.Entry{Subsystem: plan.Nftables, Kind: plan.KindNftables, Action: plan.Change, Object: obj,
			Text: fmt.Sprintf("~ %s: %s (the update failed: %v)", obj, replacedText, err)})
	}
	return r
}

// replacedText marks the report entry of a table replaced whole (Replaced).
const replacedText = "replaced whole in one transaction"

// Replaced returns the lines of r that say a table was replaced whole
// because its update failed: what status shows of it.
func Replaced(r plan.Report) []string {
	var out []string
	for _, e := range r {
		if e.Subsystem == plan.Nftables && e.Err == nil && strings.Contains(e.Text, replacedText) {
			out = append(out, strings.TrimPrefix(e.Text, "~ "))
		}
	}
	return out
}

// replaceWhole deletes every table p's ops at ids touch and adds back the
// ones p wants, whole: the fallback when the update in place was refused.
//
// Deleting and re-adding a table in one transaction is all or nothing, yet
// it leaks: the new table's sets can miss lookups for a moment after the
// commit (measured: about one datagram of a UDP flood per replacement,
// TestReplaceWholeUnderFlood). So the kill switch is held by a standby
// table first: standbyName, holding the wanted table's filter chains
// (the kill switch and the DNS guard) and their sets and counter, added in
// a transaction of its own and given standbySettle to settle. Then the
// table is replaced, given as long, and the standby deleted. A drop in
// either table drops the packet, so while the new table's sets settle the
// standby's hold. The kill switch's counter is carried over from what was
// observed; what the standby counted goes with it.
func replaceWhole(c *nftables.Conn, p Plan, ids []int) error {
	want := map[tableKey]Table{}
	for _, t := range p.Desired.Tables() {
		want[tableKey{t.Family, t.Name}] = t
	}
	have := map[tableKey]Table{}
	for _, t := range p.Observed.Tables {
		have[tableKey{t.Family, t.Name}] = t
	}
	var keys []tableKey
	done := map[tableKey]bool{}
	for _, i := range ids {
		k := tableKey{p.Ops[i].Family, p.Ops[i].Table}
		if !done[k] {
			done[k] = true
			keys = append(keys, k)
		}
	}
	// 1. The standbys, settled.
	var standbys []*nftables.Table
	b := &batch{c: c}
	for _, k := range keys {
		if t, ok := want[k]; ok && k.name != standbyName {
			if sb, ok := standby(t); ok {
				tbl := &nftables.Table{Family: sb.Family, Name: sb.Name}
				c.AddTable(tbl)
				c.DelTable(tbl) // one left by a replacement cut short
				b.addTable(sb)
				standbys = append(standbys, tbl)
			}
		}
	}
	if b.err != nil {
		return b.err
	}
	if len(standbys) > 0 {
		if err := c.Flush(); err != nil {
			return fmt.Errorf("standby table: %w", err)
		}
		time.Sleep(standbySettle)
	}
	// 2. The tables, replaced.
	for _, k := range keys {
		tbl := &nftables.Table{Family: k.family, Name: k.name}
		// Add first: nft's idiom for deleting a table that may be gone.
		c.AddTable(tbl)
		c.DelTable(tbl)
		t, ok := want[k]
		if !ok {
			continue
		}
		for j, ob := range t.Objects {
			for _, ho := range have[k].Objects {
				if ho.Type == ob.Type && ho.Name == ob.Name {
					t.Objects[j].Counter = ho.Counter
				}
			}
		}
		b.addTable(t)
	}
	if b.err != nil {
		return b.err
	}
	err := c.Flush()
	// 3. The standbys go, whether or not the replacement took: the table
	// is then as it was before.
	if len(standbys) > 0 {
		if err == nil {
			time.Sleep(standbySettle)
		}
		for _, tbl := range standbys {
			c.AddTable(tbl)
			c.DelTable(tbl)
		}
		if serr := c.Flush(); serr != nil && err == nil {
			err = fmt.Errorf("delete the standby table: %w", serr)
		}
	}
	return err
}

// standbyName is the table that holds the kill switch while replaceWhole
// replaces nodeagent's table. It is nodeagent's (its name starts with
// TableName), and one left behind is deleted by the next sync, as a table
// the config does not want.
const standbyName = TableName + "-standby"

// standbySettle is how long a table created in a transaction is given
// before another transaction relies on it.
const standbySettle = 50 * time.Millisecond

// standby is t's filter chains (the kill switch, its ICMP rules, the DNS
// guard) with the sets and objects they use, as a table of its own; false
// when t has none.
func standby(t Table) (Table, bool) {
	sb := Table{Family: t.Family, Name: standbyName}
	used := map[string]bool{}
	for _, ch := range t.Chains {
		if ch.Type != nftables.ChainTypeFilter || ch.Name == mssChain {
			continue
		}
		sb.Chains = append(sb.Chains, ch)
		for _, r := range ch.Rules {
			for _, e := range r.Exprs {
				if l, ok := e.(*expr.Lookup); ok {
					used[l.SetName] = true
				}
			}
		}
	}
	if len(sb.Chains) == 0 {
		return Table{}, false
	}
	for _, st := range t.Sets {
		if used[st.Name] {
			sb.Sets = append(sb.Sets, st)
		}
	}
	sb.Objects = t.Objects
	return sb, true
}

// compile queues the ops at ids, table by table, in the order the kernel
// needs them.
func (b *batch) compile(all []Op, ids []int) {
	var order []tableKey
	byTable := map[tableKey][]Op{}
	for _, i := range ids {
		o := all[i]
		k := tableKey{o.Family, o.Table}
		if _, ok := byTable[k]; !ok {
			order = append(order, k)
		}
		byTable[k] = append(byTable[k], o)
	}
	for _, k := range order {
		tops := byTable[k]
		tbl := &nftables.Table{Family: k.family, Name: k.name}
		phase := func(kinds ...OpKind) []Op {
			var out []Op
			for _, o := range tops {
				if slices.Contains(kinds, o.Kind) {
					out = append(out, o)
				}
			}
			return out
		}
		for _, o := range phase(OpAddTable) {
			b.addTable(o.Whole)
		}
		for range phase(OpTableFlags) {
			// NEWTABLE on an existing table updates its flags: a dormant
			// table wakes up.
			b.c.AddTable(tbl)
		}
		// 1. Empty the chains whose rules change, and delete the chains
		// not wanted or declared differently.
		for _, o := range phase(OpDelChain, OpAddChain, OpRefillChain) {
			if o.Kind == OpAddChain && !o.Replace {
				continue
			}
			nc := &nftables.Chain{Name: o.Chain.Name, Table: tbl}
			b.c.FlushChain(nc)
			if o.Kind != OpRefillChain {
				b.c.DelChain(nc)
			}
		}
		// 2. Objects: delete the unwanted, once no rule refers to them,
		// and add the missing.
		for _, o := range phase(OpDelObject) {
			b.c.DeleteObject(&nftables.NamedObj{Table: tbl, Name: o.Obj.Name, Type: o.Obj.Type})
		}
		for _, o := range phase(OpAddObject) {
			b.addObject(tbl, o.Obj)
		}
		// 3. Sets: delete, add, and update elements in place.
		for _, o := range phase(OpDelSet, OpAddSet) {
			if (o.Kind == OpDelSet && !o.Set.Anonymous) || (o.Kind == OpAddSet && o.Replace) {
				b.c.DelSet(&nftables.Set{Name: o.Set.Name, Table: tbl})
			}
		}
		for _, o := range phase(OpAddSet, OpSetElements) {
			if o.Kind == OpAddSet {
				b.addSet(tbl, o.Set)
				continue
			}
			ns := o.Set.Set
			ns.Table = tbl
			if len(o.DelElements) > 0 {
				if err := b.c.SetDeleteElements(&ns, o.DelElements); err != nil {
					b.fail(fmt.Errorf("set %s: %w", o.Set.Name, err))
				}
			}
			if len(o.AddElements) > 0 {
				if err := b.c.SetAddElements(&ns, o.AddElements); err != nil {
					b.fail(fmt.Errorf("set %s: %w", o.Set.Name, err))
				}
			}
		}
		// 4. Chains: add the new ones, refill rules, update policies.
		for _, o := range phase(OpAddChain, OpRefillChain, OpChainPolicy) {
			switch {
			case o.Kind == OpAddChain:
				b.addRules(tbl, b.addChain(tbl, o.Chain), o.Chain.Rules)
			case o.Kind == OpRefillChain && o.Policy:
				b.addRules(tbl, b.addChain(tbl, o.Chain), o.Chain.Rules)
			case o.Kind == OpRefillChain:
				nc := o.Chain.Chain
				nc.Table = tbl
				b.addRules(tbl, &nc, o.Chain.Rules)
			default:
				b.addChain(tbl, o.Chain)
			}
		}
		for range phase(OpDelTable) {
			// Add first: nft's idiom for deleting a table that may have
			// gone since it was observed.
			b.c.AddTable(tbl)
			b.c.DelTable(tbl)
		}
	}
}

// batch queues messages on c and keeps the first error.
type batch struct {
	c   *nftables.Conn
	err error
}

func (b *batch) fail(err error) {
	if b.err == nil {
		b.err = err
	}
}

// addTable queues t and everything in it: objects, and sets with their
// elements, before the chains whose rules refer to them.
func (b *batch) addTable(t Table) {
	tbl := b.c.AddTable(&nftables.Table{Family: t.Family, Name: t.Name})
	for _, o := range t.Objects {
		b.addObject(tbl, o)
	}
	for _, s := range t.Sets {
		b.addSet(tbl, s)
	}
	for _, ch := range t.Chains {
		b.addRules(tbl, b.addChain(tbl, ch), ch.Rules)
	}
}

// sameHook reports whether a and b have the same type, hook and priority,
// which an existing chain cannot change.
func sameHook(a, b nftables.Chain) bool {
	eq := func(x, y *nftables.ChainHook) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	eqp := func(x, y *nftables.ChainPriority) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.Type == b.Type && eq(a.Hooknum, b.Hooknum) && eqp(a.Priority, b.Priority)
}

// addObject queues the creation of o, holding o.Counter if it is a
// counter. It is only queued for an object that does not exist: NEWOBJ
// on an existing one would update it.
func (b *batch) addObject(tbl *nftables.Table, o Object) {
	var data expr.Any
	switch o.Type {
	case nftables.ObjTypeCounter:
		data = &expr.Counter{Packets: o.Counter.Packets, Bytes: o.Counter.Bytes}
	default:
		b.fail(fmt.Errorf("%s: nodeagent creates no objects of this type", o.header()))
		return
	}
	b.c.AddObj(&nftables.NamedObj{Table: tbl, Name: o.Name, Type: o.Type, Obj: data})
}

func (b *batch) addSet(tbl *nftables.Table, s Set) {
	ns := s.Set
	ns.Table = tbl
	if err := b.c.AddSet(&ns, s.Elements); err != nil {
		b.fail(fmt.Errorf("set %s: %w", s.Name, err))
	}
}

func (b *batch) addChain(tbl *nftables.Table, ch Chain) *nftables.Chain {
	nc := ch.Chain
	nc.Table = tbl
	return b.c.AddChain(&nc)
}

func (b *batch) addRules(tbl *nftables.Table, ch *nftables.Chain, rules []Rule) {
	for _, r := range rules {
		exprs := make([]expr.Any, 0, len(r.Exprs))
		for _, e := range r.Exprs {
			x, ok := e.(expr.Any)
			if !ok {
				b.fail(fmt.Errorf("chain %s: rule %s: %T is not an expression", ch.Name, r, e))
				return
			}
			exprs = append(exprs, x)
		}
		b.c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: exprs, UserData: r.UserData})
	}
}

// looksUp reports whether r looks up the named set.
func (r Rule) looksUp(set string) bool {
	return slices.ContainsFunc(r.Exprs, func(e any) bool {
		l, ok := e.(*expr.Lookup)
		return ok && l.SetName == set
	})
}

// refersTo reports whether r refers to the named object o.
func (r Rule) refersTo(o Object) bool {
	return slices.ContainsFunc(r.Exprs, func(e any) bool {
		ref, ok := e.(*expr.Objref)
		return ok && nftables.ObjType(ref.Type) == o.Type && ref.Name == o.Name
	})
}

// elementDiff returns the elements of have that want lacks and those of
// want that have lacks, compared as the kernel holds them (key, end key,
// interval-end flag).
func elementDiff(have, want []nftables.SetElement) (del, add []nftables.SetElement) {
	key := func(e nftables.SetElement) string {
		return fmt.Sprintf("%x|%x|%v", e.Key, e.KeyEnd, e.IntervalEnd)
	}
	inWant := map[string]bool{}
	for _, e := range want {
		inWant[key(e)] = true
	}
	inHave := map[string]bool{}
	for _, e := range have {
		inHave[key(e)] = true
		if !inWant[key(e)] {
			del = append(del, nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd, IntervalEnd: e.IntervalEnd})
		}
	}
	for _, e := range want {
		if !inHave[key(e)] {
			add = append(add, e)
		}
	}
	return del, add
}
