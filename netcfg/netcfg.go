// Package netcfg turns a config into desired state (desired.go) and
// converges the node to it, one subsystem at a time. Every subsystem has
// the same shape (DESIGN.md §2): a Desired value, Observe from the sync's
// snapshot, a pure MakePlan whose ops are typed, Execute that carries out
// exactly those ops and reports each (plan.Entry), and Apply, which is
// Execute and the state reached. One failing subsystem does not stop the
// others.
package netcfg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/nft"
	"github.com/nodeagent/nodeagent/netcfg/plan"
	"github.com/nodeagent/nodeagent/netcfg/route"
	"github.com/nodeagent/nodeagent/netcfg/sysctl"
	"github.com/nodeagent/nodeagent/netcfg/wg"
)

// Desired is the desired state of every subsystem.
type Desired struct {
	Nft    nft.Desired
	Link   link.Desired
	Sysctl sysctl.Desired
	Route  route.Desired
	WG     wg.Desired
}

// Converger converges one namespace.
type Converger struct {
	Host *host.Host
	Log  *slog.Logger
	// Userspace hosts in-process WireGuard devices where the kernel has
	// none; nil in a one-shot process, which cannot keep them alive.
	Userspace *wg.Userspace
	// Resolver resolves WireGuard endpoint names; nil means the system's.
	Resolver wg.Resolver
	// StateDir is the daemon's state directory (the record of WireGuard
	// peers kept from an adoption); "" keeps no state on disk.
	StateDir string

	wg   *wg.Handle
	poll wg.Poller
}

// WG returns the WireGuard handle, made on first use. It keeps the wgctrl
// client and the endpoint cache from one sync to the next.
func (c *Converger) WG() *wg.Handle {
	if c.wg == nil {
		c.wg = &wg.Handle{Host: c.Host, Userspace: c.Userspace, Resolver: c.Resolver, Log: c.log().With("subsystem", "wireguard"), StateDir: c.StateDir}
	}
	return c.wg
}

// Close releases what the converger opened (not the host handle, and not
// the userspace devices, which outlive a converger).
func (c *Converger) Close() {
	if c.wg != nil {
		c.wg.Close()
	}
}

// Plans holds one plan per subsystem, in the order they are applied:
// nftables first, so the kill switch is armed before anything forwards (its
// rules name interfaces, not links, so they need none to exist); then links
// and WireGuard devices (routes and per-interface sysctls name them),
// sysctls (forwarding before traffic is steered), and routes and rules.
//
// Plans are made once per sync, from one snapshot of the kernel, and Apply
// carries out exactly them: routes and sysctls that name a link the same
// sync creates are planned as changes, and find the link when they are
// applied.
type Plans struct {
	Nft    nft.Plan
	Link   link.Plan
	WG     wg.Plan
	Sysctl sysctl.Plan
	Route  route.Plan
	// Unobserved has one entry per subsystem that could not be read; that
	// subsystem's plan is empty.
	Unobserved plan.Report
	// Held are the changes Hold took out (a fight backed off), reported
	// by Apply as not applied.
	Held plan.Report

	snap        *host.Snapshot
	nftObserved bool // nftables could be read; false: Nft says nothing
}

// Forwarding is what a sync did about packet forwarding while a configured
// kill switch was not in the kernel (nftables failed): it holds back every
// sysctl that would turn forwarding on, and says which forwarding keys were
// on already, unprotected by nftables (the kill-switch table's unreachable
// default still stands behind the policy rule).
type Forwarding struct {
	// KillSwitchDown reports that the kill switch could not be armed.
	KillSwitchDown bool
	// Held are the keys not set, Unprotected the keys that were on.
	Held, Unprotected []string
}

// String says what f means for the node, "" when the kill switch is armed.
func (f Forwarding) String() string {
	if !f.KillSwitchDown {
		return ""
	}
	if len(f.Unprotected) > 0 {
		return fmt.Sprintf("forwarding is on (%s) while the kill switch is not armed: forwarded traffic from the kill-switch sources is held back only by the policy rule's unreachable table", strings.Join(f.Unprotected, ", "))
	}
	return "forwarding is held off until the kill switch is armed"
}

// Empty reports whether no subsystem has anything to do or report.
func (p Plans) Empty() bool {
	return p.Nft.Empty() && p.Link.Empty() && p.WG.Empty() && p.Sysctl.Empty() && p.Route.Empty() && len(p.Unobserved) == 0 && len(p.Held) == 0
}

// Report is the dry run: every subsystem's entries, in the order they are
// applied (what could not be observed is in Unobserved). Ops that cannot
// be applied carry why as their error.
func (p Plans) Report() plan.Report {
	var r plan.Report
	r = append(r, p.Nft.Report()...)
	r = append(r, p.Link.Report()...)
	r = append(r, p.WG.Report()...)
	r = append(r, p.Sysctl.Report()...)
	return append(r, p.Route.Report()...)
}

// String is the dry-run text of every subsystem, one line per object.
func (p Plans) String() string { return p.Report().String() }

// Touches reports whether applying p changes links, routes, rules,
// nftables or WireGuard devices: what safe apply guards.
func (p Plans) Touches() bool {
	return p.Nft.Report().Writes() || p.Link.Report().Writes() || p.Route.Report().Writes() || p.WG.Writes()
}

// Plan observes the kernel once (one snapshot, shared by the subsystems
// that read the same dumps) and returns what a sync would change. A
// subsystem that cannot be observed is reported, in the error and in
// Unobserved; the others are planned. A peer whose expiry has passed is
// planned out of its device (Desired.At).
func (c *Converger) Plan(ctx context.Context, d Desired) (Plans, error) {
	d = d.At(time.Now())
	snap := c.Host.Snapshot()
	p := Plans{snap: snap}
	var errs []error
	unobserved := func(sub string, err error) {
		err = fmt.Errorf("%s: %w", sub, err)
		errs = append(errs, err)
		p.Unobserved = append(p.Unobserved, plan.Failure(sub, err))
	}
	if o, err := nft.Observe(ctx, snap, d.Nft); err != nil {
		unobserved(plan.Nftables, err)
	} else {
		p.Nft = nft.MakePlan(d.Nft, o)
		p.nftObserved = true
	}
	if o, err := link.Observe(ctx, snap, d.Link); err != nil {
		unobserved(plan.Links, err)
	} else {
		p.Link = link.MakePlan(d.Link, o)
	}
	if wp, err := c.poll.Plan(ctx, c.WG(), snap, d.WG); err != nil {
		unobserved(plan.WireGuard, err)
	} else {
		p.WG = wp
	}
	coming := p.coming()
	if o, err := sysctl.Observe(ctx, snap, d.Sysctl); err != nil {
		unobserved(plan.Sysctls, err)
	} else {
		o.Coming = coming
		p.Sysctl = sysctl.MakePlan(d.Sysctl, o)
	}
	if o, err := route.Observe(ctx, snap, d.Route); err != nil {
		unobserved(plan.Routes, err)
	} else {
		o.Coming = coming
		p.Route = route.MakePlan(d.Route, o)
	}
	return p, errors.Join(errs...)
}

// coming are the links and devices the link and WireGuard plans create.
func (p Plans) coming() []string {
	var out []string
	for _, o := range p.Link.Ops {
		if o.Kind == link.OpCreateLink {
			out = append(out, o.Link)
		}
	}
	for _, o := range p.WG.Ops {
		if o.Kind == wg.OpCreateDevice {
			out = append(out, o.Device)
		}
	}
	return out
}

// PlanWG observes and plans the WireGuard subsystem alone: the kernel sends
// no notification when a peer is changed by hand, so the daemon polls this.
func (c *Converger) PlanWG(ctx context.Context, d Desired) (wg.Plan, error) {
	return c.poll.Plan(ctx, c.WG(), c.Host.Snapshot(), d.At(time.Now()).WG)
}

// PollWG is the daemon's WireGuard drift poll: only the devices whose
// digest moved since a poll last found them converged, and those always
// names, are observed and planned (see wg.Poller); looked is false when
// none was. With nothing changed it walks no peer and allocates nothing.
func (c *Converger) PollWG(ctx context.Context, d Desired, always map[string]bool) (p wg.Plan, looked bool, err error) {
	return c.poll.Poll(ctx, c.WG(), d.At(time.Now()).WG, always)
}

// WGEventDriven reports whether the WireGuard poll of d may wait for
// Userspace.Changed instead of a timer (wg.Poller.EventDriven): every
// device is this process's, in userspace, and was last found converged.
func (c *Converger) WGEventDriven(d Desired, always map[string]bool) bool {
	return c.poll.EventDriven(c.WG(), d.At(time.Now()).WG, always)
}

// Result is what Apply did: the report of every op, and the desired state
// planned against the state reached (empty when the sync converged; its
// Observed fields are the post state).
type Result struct {
	Report plan.Report
	// Applied is what was carried out: p, with forwarding held where the
	// kill switch was down.
	Applied    Plans
	Post       Plans
	Forwarding Forwarding
}

// Apply carries out exactly p, subsystem by subsystem, and returns what
// became of every op and the state reached. One failing subsystem does not
// stop the others. The state reached is read once, from one snapshot taken
// after every write (each kind of kernel dump at most once more), for the
// subsystems that wrote; the others' is what p was planned from.
//
// The one change Apply makes to p: while a configured kill switch could not
// be armed (nftables could not be read, or its transaction failed), sysctl
// ops that would turn forwarding on are held, reported as failed with why.
func (c *Converger) Apply(ctx context.Context, p Plans) Result {
	snap := p.snap
	if snap == nil {
		snap = c.Host.Snapshot()
	}
	var res Result
	res.Report = append(res.Report, p.Unobserved...)
	res.Report = append(res.Report, p.Held...)
	wrote := map[string]bool{}
	run := func(sub string, r plan.Report) plan.Report {
		if r.Writes() {
			wrote[sub] = true
		}
		res.Report = append(res.Report, r...)
		return r
	}
	rn := run(plan.Nftables, nft.Execute(ctx, snap, p.Nft))
	armed := p.nftObserved && !slices.ContainsFunc(rn, plan.Entry.Failed)
	run(plan.Links, link.Execute(ctx, snap, p.Link))
	run(plan.WireGuard, wg.Execute(ctx, c.WG(), snap, p.WG))
	sp := p.Sysctl
	if len(p.Nft.Desired.KillSwitch) > 0 && !armed {
		// The policy rule and the kill-switch table's unreachable default
		// are applied as usual (they are the other layer); forwarding is
		// not turned on while nftables cannot hold the traffic back.
		res.Forwarding.KillSwitchDown = true
		sp, res.Forwarding.Held = sp.HoldForwarding("the kill switch is not armed (nftables failed), so forwarding stays off until it is")
		on, err := sysctl.ForwardingOn(ctx, snap, sp.Desired)
		if err != nil {
			res.Report = append(res.Report, plan.Failure(plan.Sysctls, fmt.Errorf("sysctls: %w", err)))
		}
		res.Forwarding.Unprotected = on
	}
	run(plan.Sysctls, sysctl.Execute(ctx, snap, sp))
	run(plan.Routes, route.Execute(ctx, snap, p.Route))
	res.Applied = p
	res.Applied.Sysctl = sp
	res.Post = c.after(ctx, p, snap.After(), wrote, &res.Report)
	c.logReport(res.Report)
	return res
}

// after plans the desired state against the state reached: subsystems
// that wrote are observed again, from one snapshot; the others' state is
// what p was planned from.
func (c *Converger) after(ctx context.Context, p Plans, snap *host.Snapshot, wrote map[string]bool, r *plan.Report) Plans {
	post := Plans{snap: snap, nftObserved: p.nftObserved}
	fail := func(sub string, err error) {
		*r = append(*r, plan.Failure(sub, fmt.Errorf("%s: observe after apply: %w", sub, err)))
	}
	no, lo, wo, so, ro := p.Nft.Observed, p.Link.Observed, p.WG.Observed, p.Sysctl.Observed, p.Route.Observed
	var err error
	if wrote[plan.Nftables] {
		if no, err = nft.Observe(ctx, snap, p.Nft.Desired); err != nil {
			fail(plan.Nftables, err)
			no = p.Nft.Observed
		}
	}
	if wrote[plan.Links] || wrote[plan.WireGuard] {
		if lo, err = link.Observe(ctx, snap, p.Link.Desired); err != nil {
			fail(plan.Links, err)
			lo = p.Link.Observed
		}
		if wo, err = wg.Observe(ctx, c.WG(), snap, p.WG.Desired); err != nil {
			fail(plan.WireGuard, err)
			wo = p.WG.Observed
		}
	}
	// Sysctls and routes depend on the links too (keys of new interfaces,
	// routes on new devices).
	if wrote[plan.Sysctls] || wrote[plan.Links] || wrote[plan.WireGuard] {
		if so, err = sysctl.Observe(ctx, snap, p.Sysctl.Desired); err != nil {
			fail(plan.Sysctls, err)
			so = p.Sysctl.Observed
		}
	}
	if wrote[plan.Routes] || wrote[plan.Links] || wrote[plan.WireGuard] {
		if ro, err = route.Observe(ctx, snap, p.Route.Desired); err != nil {
			fail(plan.Routes, err)
			ro = p.Route.Observed
		}
	}
	so.Coming, ro.Coming = nil, nil
	post.Nft = nft.MakePlan(p.Nft.Desired, no)
	post.Link = link.MakePlan(p.Link.Desired, lo)
	post.WG = wg.MakePlan(p.WG.Desired, wo)
	post.Sysctl = sysctl.MakePlan(p.Sysctl.Desired, so)
	post.Route = route.MakePlan(p.Route.Desired, ro)
	return post
}

// Sync plans and applies once, for the one-shot commands and tests, and
// returns the plans it carried out and every op's error joined (Split
// tells pending and skipped objects from failures).
func (c *Converger) Sync(ctx context.Context, d Desired) (Plans, error) {
	// Every subsystem that could not be observed is in the report too.
	p, _ := c.Plan(ctx, d)
	res := c.Apply(ctx, p)
	return res.Applied, res.Report.Err()
}

// maxLoggedChanges is how many changes of one kind a sync logs one by one
// at info.
const maxLoggedChanges = 20

// logReport logs the changes of a report, one line per change, at info;
// what was not applied goes at debug (the caller reports it: status, the
// exit code), since logged at every sync it would drown the changes.
//
// At info, a kind of object with more than maxLoggedChanges changes in the
// sync (5000 register peers at start-up) has its first ones listed and the
// rest counted in one line: thousands of lines would bury everything else
// in the journal, and journald drops a service's lines past its rate
// limit. At debug every change is listed.
func (c *Converger) logReport(r plan.Report) {
	log := c.log()
	all := log.Enabled(context.Background(), slog.LevelDebug)
	type kind struct{ sub, kind string }
	logged := map[kind]int{}
	var order []kind
	for _, e := range r {
		if !e.Writes() {
			log.Debug("not applied", "subsystem", e.Subsystem, "op", e.Text)
			continue
		}
		if !all {
			k := kind{e.Subsystem, e.Kind}
			n := logged[k]
			if n == 0 {
				order = append(order, k)
			}
			logged[k] = n + 1
			if n >= maxLoggedChanges {
				continue
			}
		}
		log.Info("change", "subsystem", e.Subsystem, "op", e.Text)
	}
	for _, k := range order {
		if n := logged[k]; n > maxLoggedChanges {
			log.Info("changes not listed", "subsystem", k.sub, "kind", k.kind, "count", n-maxLoggedChanges,
				"of", n, "hint", "--log-level debug lists every change; nodeagent plan prints what a sync would change")
		}
	}
}

// Teardown removes everything nodeagent owns, in the reverse order of
// creation: rules and routes, WireGuard devices, links, and the nftables
// table last, so the kill switch holds to the end. A step that fails stops
// the teardown there: the steps after it (above all the kill switch) stay
// in place, and the error says what failed. Foreign objects are never
// touched. Sysctls are left as they are: there is no record of what they
// were before. guard, when set, sees the plan before anything changes; an
// error from it stops the teardown there.
func (c *Converger) Teardown(ctx context.Context, tablesFile string, guard func(Plans) error) (Plans, error) {
	p, err := c.TeardownPlan(ctx, tablesFile)
	if err == nil && guard != nil {
		err = guard(p)
	}
	if err != nil {
		// Something could not be read: removing the rest blind could
		// take the kill switch away before what it protects.
		return p, fmt.Errorf("teardown stopped before changing anything: %w", err)
	}
	return p, c.ExecuteTeardown(ctx, p)
}

// TeardownPlan is what Teardown would do: every object nodeagent owns,
// removed (the plan of a config that declares nothing). An error says
// what could not be read; that subsystem's plan is empty then.
func (c *Converger) TeardownPlan(ctx context.Context, tablesFile string) (Plans, error) {
	var d Desired
	d.Route.TablesFile = tablesFile
	return c.Plan(ctx, d)
}

// ExecuteTeardown carries out p, a TeardownPlan (or one made from it, as
// nodeagent release makes: some removals replaced by hand-backs), in
// Teardown's order: routes and rules, WireGuard devices, links, and the
// nftables tables last. A step that fails stops it there, and the error
// names what is left in place.
func (c *Converger) ExecuteTeardown(ctx context.Context, p Plans) error {
	snap := p.snap
	if snap == nil {
		snap = c.Host.Snapshot()
	}
	steps := []struct {
		name  string
		empty bool
		apply func() plan.Report
	}{
		{plan.Routes, p.Route.Empty(), func() plan.Report { return route.Execute(ctx, snap, p.Route) }},
		{plan.WireGuard, p.WG.Empty(), func() plan.Report { return wg.Execute(ctx, c.WG(), snap, p.WG) }},
		{plan.Links, p.Link.Empty(), func() plan.Report { return link.Execute(ctx, snap, p.Link) }},
		{plan.Nftables, p.Nft.Empty(), func() plan.Report { return nft.Execute(ctx, snap, p.Nft) }},
	}
	for i, st := range steps {
		if st.empty {
			continue
		}
		r := st.apply()
		c.logReport(r)
		if err := r.Err(); err != nil {
			var left []string
			for _, later := range steps[i+1:] {
				if !later.empty {
					left = append(left, later.name)
				}
			}
			if len(left) > 0 {
				return fmt.Errorf("%w\nstopped at %s; left in place: %s", err, st.name, strings.Join(left, ", "))
			}
			return err
		}
	}
	return nil
}

// Split sorts the leaves of a sync error into objects that wait for another
// (pending, to be converged by a later sync), entries left out of an object
// that was converged without them (skipped: a bad peer file) and real
// failures.
func Split(err error) (pending, skipped, failed []error) {
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		var pe *host.PendingError
		var se *host.SkippedError
		switch {
		case errors.As(e, &pe):
			pending = append(pending, e)
		case errors.As(e, &se):
			skipped = append(skipped, e)
		default:
			failed = append(failed, e)
		}
	}
	walk(err)
	return pending, skipped, failed
}

func (c *Converger) log() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}

// Repairs counts the objects r changed, by kind: a link recreated (deleted
// and created) is one link, and nodeagent's nftables table is one object
// however many of its lines changed (it is written in one transaction).
// Entries that only report are not counted, nor the rt_tables.d file.
func Repairs(r plan.Report) map[string]int {
	seen := map[string]map[string]bool{}
	for _, e := range r {
		if !e.Writes() || e.Kind == plan.KindFile {
			continue
		}
		if seen[e.Kind] == nil {
			seen[e.Kind] = map[string]bool{}
		}
		seen[e.Kind][e.Object] = true
	}
	out := make(map[string]int, len(seen))
	for k, objs := range seen {
		out[k] = len(objs)
	}
	return out
}
