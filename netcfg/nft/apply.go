package nft

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/nodeagent/nodeagent/netcfg/host"
)

// Apply carries out p in one nftables transaction (one batch, one Flush)
// and returns the state it reached. When p is empty it sends nothing.
//
// The table is updated in place, never deleted and re-added: a table,
// chain or set that is right is left alone, a set whose elements differ
// gets exactly the missing elements added and the extra ones deleted, and
// a chain whose rules differ is flushed and refilled in the same
// transaction. nf_tables commits a batch all or nothing, and a packet sees
// a chain's old rules or its new ones and a set's old elements or its new
// ones, switched together when the generation flips. That is not true of
// objects created in the batch: deleting and re-adding the table (or a
// set) in one transaction leaks, measured under a flood on Linux 6.18 (a
// set created in a transaction can miss lookups for a moment after the
// commit), so the kill switch's chain and sets are never replaced while
// they are in use. A chain or set whose declaration is wrong (changed by
// hand) has to be replaced; a table nodeagent no longer wants is deleted.
//
// Apply works from p.Observed: if the table was changed since, the
// transaction may fail, and nothing of it is applied; the next sync
// observes again. The kill switch counts into a named counter object
// (KillSwitchCounter), which refilling a chain does not touch and Apply
// never writes once it exists, so no count is carried over or lost. Tables
// owned by another process (NFT_TABLE_F_OWNER) are left out and reported.
func Apply(ctx context.Context, h *host.Host, p Plan) (Observed, error) {
	if p.Empty() {
		return p.Observed, nil
	}
	if err := ctx.Err(); err != nil {
		return p.Observed, err
	}
	var errs []error
	conflict := map[tableKey]bool{}
	for _, op := range p.Ops {
		if op.Kind == OpConflict {
			conflict[tableKey{op.Family, op.Table}] = true
			errs = append(errs, fmt.Errorf("%s: %s", op.Object(), op.Reason))
		}
	}
	var want, have []Table
	for _, t := range p.Desired.Tables() {
		if !conflict[tableKey{t.Family, t.Name}] {
			want = append(want, t)
		}
	}
	for _, t := range p.Observed.Tables {
		if !conflict[tableKey{t.Family, t.Name}] {
			have = append(have, t)
		}
	}
	if len(want) == 0 && len(have) == 0 {
		return p.Observed, errors.Join(errs...)
	}
	c, err := dial(h)
	if err != nil {
		return p.Observed, errors.Join(append(errs, err)...)
	}
	defer c.close()
	h.Wrote(1) // one transaction
	if err := c.update(want, have); err != nil {
		errs = append(errs, err)
	}
	obs, err := c.observe()
	if err != nil {
		errs = append(errs, err)
	}
	return obs, errors.Join(errs...)
}

// update takes the tables from have to want in one transaction.
func (c *conn) update(want, have []Table) error {
	b := &batch{c: c.nft}
	haveBy := map[tableKey]Table{}
	for _, t := range have {
		haveBy[tableKey{t.Family, t.Name}] = t
	}
	wanted := map[tableKey]bool{}
	var names []string
	for _, t := range want {
		k := tableKey{t.Family, t.Name}
		wanted[k] = true
		names = append(names, familyName(t.Family)+" "+t.Name)
		cur, ok := haveBy[k]
		if !ok {
			b.addTable(t)
			continue
		}
		b.updateTable(t, cur)
	}
	for _, t := range have {
		if !wanted[tableKey{t.Family, t.Name}] {
			names = append(names, familyName(t.Family)+" "+t.Name)
			tbl := &nftables.Table{Family: t.Family, Name: t.Name}
			// Add first: nft's idiom for deleting a table that may have
			// gone since it was observed.
			b.c.AddTable(tbl)
			b.c.DelTable(tbl)
		}
	}
	obj := "nft table " + strings.Join(names, ", ")
	if b.err != nil {
		// Nothing was sent; the queued messages go with the conn.
		return fmt.Errorf("%s: %w", obj, b.err)
	}
	if err := c.nft.Flush(); err != nil {
		return fmt.Errorf("%s: transaction: %w", obj, err)
	}
	return nil
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

// updateTable queues what takes the observed table cur to t, and nothing
// for what is already right.
func (b *batch) updateTable(t, cur Table) {
	tbl := &nftables.Table{Family: t.Family, Name: t.Name}
	if t.Flags != cur.Flags {
		// NEWTABLE on an existing table updates its flags: a dormant table
		// wakes up.
		b.c.AddTable(tbl)
	}
	haveSets := map[string]Set{}
	for _, s := range cur.Sets {
		haveSets[s.Name] = s
	}
	haveChains := map[string]Chain{}
	for _, ch := range cur.Chains {
		haveChains[ch.Name] = ch
	}
	wantSets := map[string]Set{}
	for _, s := range t.Sets {
		wantSets[s.Name] = s
	}
	wantChains := map[string]bool{}
	for _, ch := range t.Chains {
		wantChains[ch.Name] = true
	}

	// Sets to delete: unwanted, or declared differently (replaced). Rules
	// that look them up must go in the same transaction, so their chains
	// are refilled.
	var delSets []string
	for _, s := range cur.Sets {
		w, ok := wantSets[s.Name]
		if s.Anonymous {
			continue // bound to a rule; goes with it
		}
		if !ok || w.header() != s.header() {
			delSets = append(delSets, s.Name)
		}
	}
	// Objects to delete: unwanted (a counter is never replaced: one that
	// is wanted is left as it is). Rules that refer to them must go first,
	// so their chains are refilled too.
	delObjs := objectDiff(t.Objects, cur.Objects)
	refill := map[string]bool{}
	for _, ch := range cur.Chains {
		for _, r := range ch.Rules {
			if slices.ContainsFunc(delSets, r.looksUp) || slices.ContainsFunc(delObjs, r.refersTo) {
				refill[ch.Name] = true
			}
		}
	}

	// 1. Empty the chains whose rules change, and delete the chains not
	// wanted or declared differently.
	replaceChain := map[string]bool{}
	for _, ch := range cur.Chains {
		nc := &nftables.Chain{Name: ch.Name, Table: tbl}
		if !wantChains[ch.Name] {
			b.c.FlushChain(nc)
			b.c.DelChain(nc)
			continue
		}
		var w Chain
		for _, x := range t.Chains {
			if x.Name == ch.Name {
				w = x
			}
		}
		switch {
		case !sameHook(w.Chain, ch.Chain):
			replaceChain[ch.Name] = true
			b.c.FlushChain(nc)
			b.c.DelChain(nc)
		case refill[ch.Name] || !slices.Equal(ruleStrings(w.Rules), ruleStrings(ch.Rules)):
			refill[ch.Name] = true
			b.c.FlushChain(nc)
		}
	}

	// 2. Objects: delete the unwanted, once no rule refers to them, and
	// add the missing.
	for _, o := range delObjs {
		b.c.DeleteObject(&nftables.NamedObj{Table: tbl, Name: o.Name, Type: o.Type})
	}
	for _, o := range objectDiff(cur.Objects, t.Objects) {
		b.addObject(tbl, o)
	}

	// 3. Sets: delete, add, and update elements in place.
	for _, name := range delSets {
		b.c.DelSet(&nftables.Set{Name: name, Table: tbl})
	}
	for _, s := range t.Sets {
		cur, ok := haveSets[s.Name]
		if !ok || slices.Contains(delSets, s.Name) {
			b.addSet(tbl, s)
			continue
		}
		ns := s.Set
		ns.Table = tbl
		del, add := elementDiff(cur.Elements, s.Elements)
		if len(del) > 0 {
			if err := b.c.SetDeleteElements(&ns, del); err != nil {
				b.fail(fmt.Errorf("set %s: %w", s.Name, err))
			}
		}
		if len(add) > 0 {
			if err := b.c.SetAddElements(&ns, add); err != nil {
				b.fail(fmt.Errorf("set %s: %w", s.Name, err))
			}
		}
	}

	// 4. Chains: add the new ones, update policies, refill rules.
	for _, ch := range t.Chains {
		cur, ok := haveChains[ch.Name]
		switch {
		case !ok || replaceChain[ch.Name]:
			b.addRules(tbl, b.addChain(tbl, ch), ch.Rules)
		case refill[ch.Name]:
			b.addRules(tbl, b.addChainIfPolicy(tbl, ch, cur), ch.Rules)
		default:
			b.addChainIfPolicy(tbl, ch, cur)
		}
	}
}

// addChainIfPolicy queues an update of ch's policy when cur's differs
// (NEWCHAIN on an existing base chain may change its policy, not its hook)
// and returns the chain to add rules to.
func (b *batch) addChainIfPolicy(tbl *nftables.Table, ch, cur Chain) *nftables.Chain {
	if ch.header() != cur.header() {
		return b.addChain(tbl, ch)
	}
	nc := ch.Chain
	nc.Table = tbl
	return &nc
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
