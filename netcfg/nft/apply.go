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
// observes again. The kill-switch counters are carried over into refilled
// rules. Tables owned by another process (NFT_TABLE_F_OWNER) are left out
// and reported.
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

// addTable queues t and everything in it: sets with their elements before
// the chains whose rules look them up.
func (b *batch) addTable(t Table) {
	tbl := b.c.AddTable(&nftables.Table{Family: t.Family, Name: t.Name})
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
	refill := map[string]bool{}
	for _, ch := range cur.Chains {
		for _, r := range ch.Rules {
			if slices.ContainsFunc(delSets, r.looksUp) {
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

	// 2. Sets: delete, add, and update elements in place.
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

	// 3. Chains: add the new ones, update policies, refill rules.
	for _, ch := range t.Chains {
		cur, ok := haveChains[ch.Name]
		switch {
		case !ok || replaceChain[ch.Name]:
			b.addRules(tbl, b.addChain(tbl, ch), ch.Rules)
		case refill[ch.Name]:
			nc := b.addChainIfPolicy(tbl, ch, cur)
			b.addRules(tbl, nc, carryCounters(ch.Rules, cur.Rules))
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

// carryCounters returns want with each counter given the packets and bytes
// of the observed rule that renders the same, so that refilling a chain
// does not reset what status reports.
func carryCounters(want, have []Rule) []Rule {
	old := map[string][][]expr.Counter{}
	for _, r := range have {
		var ctrs []expr.Counter
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				ctrs = append(ctrs, *c)
			}
		}
		if len(ctrs) > 0 {
			old[r.String()] = append(old[r.String()], ctrs)
		}
	}
	out := make([]Rule, len(want))
	for i, r := range want {
		out[i] = r
		k := r.String()
		if len(old[k]) == 0 {
			continue
		}
		ctrs := old[k][0]
		old[k] = old[k][1:]
		exprs := make([]any, len(r.Exprs))
		n := 0
		for j, e := range r.Exprs {
			exprs[j] = e
			if _, ok := e.(*expr.Counter); ok && n < len(ctrs) {
				c := ctrs[n]
				exprs[j] = &c
				n++
			}
		}
		out[i].Exprs = exprs
	}
	return out
}
