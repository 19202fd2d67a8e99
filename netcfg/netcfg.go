// Package netcfg turns a config into desired state and converges the node
// to it, one subsystem at a time. Every subsystem has the same shape
// (DESIGN.md §2): a Desired value, Observe, a pure MakePlan whose String is
// the dry-run text, and an idempotent Apply that returns what it reached.
// One failing subsystem does not stop the others.
package netcfg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/link"
	"github.com/nodeagent/nodeagent/netcfg/nft"
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

	wg *wg.Handle
}

// WG returns the WireGuard handle, made on first use. It keeps the wgctrl
// client and the endpoint cache from one sync to the next.
func (c *Converger) WG() *wg.Handle {
	if c.wg == nil {
		c.wg = &wg.Handle{Host: c.Host, Userspace: c.Userspace, Resolver: c.Resolver, Log: c.log().With("subsystem", "wireguard")}
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
type Plans struct {
	Nft    nft.Plan
	Link   link.Plan
	WG     wg.Plan
	Sysctl sysctl.Plan
	Route  route.Plan
	// Forwarding is set by a sync whose kill switch could not be armed.
	Forwarding Forwarding

	nftObserved bool // nftables could be read (Plan); false: Nft says nothing
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

// Empty reports whether no subsystem has anything to do.
func (p Plans) Empty() bool {
	return p.Nft.Empty() && p.Link.Empty() && p.WG.Empty() && p.Sysctl.Empty() && p.Route.Empty()
}

// String is the dry-run text of every subsystem, one line per object.
func (p Plans) String() string {
	return p.Nft.String() + p.Link.String() + p.WG.String() + p.Sysctl.String() + p.Route.String()
}

// Plan observes the kernel and returns what a sync would change. A
// subsystem that cannot be observed is reported; the others are planned.
func (c *Converger) Plan(ctx context.Context, d Desired) (Plans, error) {
	var p Plans
	var errs []error
	if o, err := nft.Observe(ctx, c.Host, d.Nft); err != nil {
		errs = append(errs, fmt.Errorf("nftables: %w", err))
	} else {
		p.Nft = nft.MakePlan(d.Nft, o)
		p.nftObserved = true
	}
	if o, err := link.Observe(ctx, c.Host, d.Link); err != nil {
		errs = append(errs, fmt.Errorf("links: %w", err))
	} else {
		p.Link = link.MakePlan(d.Link, o)
	}
	if o, err := wg.Observe(ctx, c.WG(), d.WG); err != nil {
		errs = append(errs, fmt.Errorf("wireguard: %w", err))
	} else {
		p.WG = wg.MakePlan(d.WG, o)
	}
	if o, err := sysctl.Observe(ctx, c.Host, d.Sysctl); err != nil {
		errs = append(errs, fmt.Errorf("sysctls: %w", err))
	} else {
		p.Sysctl = sysctl.MakePlan(d.Sysctl, o)
	}
	if o, err := route.Observe(ctx, c.Host, d.Route); err != nil {
		errs = append(errs, fmt.Errorf("routes: %w", err))
	} else {
		p.Route = route.MakePlan(d.Route, o)
	}
	return p, errors.Join(errs...)
}

// PlanWG observes and plans the WireGuard subsystem alone: the kernel sends
// no notification when a peer is changed by hand, so the daemon polls this.
func (c *Converger) PlanWG(ctx context.Context, d Desired) (wg.Plan, error) {
	o, err := wg.Observe(ctx, c.WG(), d.WG)
	if err != nil {
		return wg.Plan{}, err
	}
	return wg.MakePlan(d.WG, o), nil
}

// Sync observes, plans and applies every subsystem once and returns the
// plans it carried out. One failing subsystem does not stop the others: the
// error joins one error per failed object. Objects that wait for another
// (host.PendingError) are in the error too; Split tells them apart.
func (c *Converger) Sync(ctx context.Context, d Desired) (Plans, error) {
	p, err := c.Plan(ctx, d)
	errs := []error{err}
	for _, sub := range []struct{ name, text string }{
		{"nftables", p.Nft.String()}, {"links", p.Link.String()}, {"wireguard", p.WG.String()},
		{"sysctls", p.Sysctl.String()}, {"routes", p.Route.String()},
	} {
		for _, line := range strings.Split(strings.TrimSpace(sub.text), "\n") {
			switch {
			case line == "":
			case line[0] == '!':
				// Reported by the caller (status, the exit code); logged
				// at every sync it would drown the changes.
				c.log().Debug("not applied", "subsystem", sub.name, "op", line)
			default:
				c.log().Info("change", "subsystem", sub.name, "op", line)
			}
		}
	}
	armed := p.nftObserved
	if !p.Nft.Empty() {
		_, err := nft.Apply(ctx, c.Host, p.Nft)
		errs = append(errs, err)
		armed = armed && err == nil
	}
	if !p.Link.Empty() {
		_, err := link.Apply(ctx, c.Host, p.Link)
		errs = append(errs, err)
	}
	if !p.WG.Empty() {
		_, err := wg.Apply(ctx, c.WG(), p.WG)
		errs = append(errs, err)
	}
	// Sysctls and routes are planned against the links observed before
	// this sync, so what names a link or device this sync creates is
	// re-planned after them.
	if !p.Link.Empty() || p.WG.Writes() {
		if o, err := sysctl.Observe(ctx, c.Host, d.Sysctl); err != nil {
			errs = append(errs, fmt.Errorf("sysctls: %w", err))
			p.Sysctl = sysctl.Plan{}
		} else {
			p.Sysctl = sysctl.MakePlan(d.Sysctl, o)
		}
		if o, err := route.Observe(ctx, c.Host, d.Route); err != nil {
			errs = append(errs, fmt.Errorf("routes: %w", err))
			p.Route = route.Plan{}
		} else {
			p.Route = route.MakePlan(d.Route, o)
		}
	}
	if len(d.Nft.KillSwitch) > 0 && !armed {
		// The policy rule and the kill-switch table's unreachable default
		// are applied as usual (they are the other layer); forwarding is
		// not turned on while nftables cannot hold the traffic back.
		p.Forwarding.KillSwitchDown = true
		p.Sysctl, p.Forwarding.Held = p.Sysctl.HoldForwarding("the kill switch is not armed (nftables failed), so forwarding stays off until it is")
		on, err := sysctl.ForwardingOn(ctx, c.Host, d.Sysctl)
		if err != nil {
			errs = append(errs, fmt.Errorf("sysctls: %w", err))
		}
		p.Forwarding.Unprotected = on
	}
	if !p.Sysctl.Empty() {
		_, err := sysctl.Apply(ctx, c.Host, p.Sysctl)
		errs = append(errs, err)
	}
	if !p.Route.Empty() {
		_, err := route.Apply(ctx, c.Host, p.Route)
		errs = append(errs, err)
	}
	return p, errors.Join(errs...)
}

// Teardown removes everything nodeagent owns, in the reverse order of
// creation: rules and routes, WireGuard devices, links, and the nftables
// table last, so the kill switch holds to the end. A step that fails stops
// the teardown there: the steps after it (above all the kill switch) stay
// in place, and the error says what failed. Foreign objects are never
// touched. Sysctls are left as they are: there is no record of what they
// were before.
func (c *Converger) Teardown(ctx context.Context, tablesFile string) (Plans, error) {
	var d Desired
	d.Route.TablesFile = tablesFile
	p, err := c.Plan(ctx, d)
	if err != nil {
		// Something could not be read: removing the rest blind could
		// take the kill switch away before what it protects.
		return p, fmt.Errorf("teardown stopped before changing anything: %w", err)
	}
	steps := []struct {
		name  string
		empty bool
		apply func() error
	}{
		{"routes", p.Route.Empty(), func() error { _, err := route.Apply(ctx, c.Host, p.Route); return err }},
		{"wireguard", p.WG.Empty(), func() error { _, err := wg.Apply(ctx, c.WG(), p.WG); return err }},
		{"links", p.Link.Empty(), func() error { _, err := link.Apply(ctx, c.Host, p.Link); return err }},
		{"nftables", p.Nft.Empty(), func() error { _, err := nft.Apply(ctx, c.Host, p.Nft); return err }},
	}
	for i, st := range steps {
		if st.empty {
			continue
		}
		if err := st.apply(); err != nil {
			var left []string
			for _, later := range steps[i+1:] {
				if !later.empty {
					left = append(left, later.name)
				}
			}
			if len(left) > 0 {
				return p, fmt.Errorf("%w\nteardown stopped at %s; left in place: %s", err, st.name, strings.Join(left, ", "))
			}
			return p, err
		}
	}
	return p, nil
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

// Kinds of object a plan changes, as Repairs counts them (the metrics'
// drift kinds).
const (
	KindLink          = "link"
	KindAddress       = "address"
	KindRoute         = "route"
	KindRule          = "rule"
	KindNftables      = "nftables"
	KindWireGuardPeer = "wireguard_peer"
	KindSysctl        = "sysctl"
)

// Repairs counts the objects p changes, by kind: a link recreated (deleted
// and created) is one link, a WireGuard device is a link, and nodeagent's
// nftables table is one object however many of its rules and sets changed
// (it is written in one transaction). Ops that only report are not
// counted.
func (p Plans) Repairs() map[string]int {
	seen := map[string]map[string]bool{}
	add := func(kind, object string) {
		if seen[kind] == nil {
			seen[kind] = map[string]bool{}
		}
		seen[kind][object] = true
	}
	for _, o := range p.Link.Ops {
		switch o.Kind {
		case link.OpAddAddr, link.OpDelAddr:
			add(KindAddress, o.Link+" "+o.Addr.String())
		case link.OpPending, link.OpConflict:
		default:
			add(KindLink, o.Link)
		}
	}
	for _, o := range p.WG.Ops {
		switch o.Kind {
		case wg.OpFail:
		case wg.OpAddAddr, wg.OpDelAddr:
			add(KindAddress, o.Device+" "+o.Addr.String())
		case wg.OpAddPeer, wg.OpRemovePeer, wg.OpUpdatePeer:
			add(KindWireGuardPeer, o.Device+" "+o.PeerID.String())
		default:
			add(KindLink, o.Device)
		}
	}
	for _, o := range p.Route.Ops {
		switch o.Kind {
		case route.OpAddRoute, route.OpReplaceRoute, route.OpDelRoute:
			add(KindRoute, o.Object())
		case route.OpAddRule, route.OpDelRule:
			add(KindRule, o.Object())
		}
	}
	for _, o := range p.Nft.Ops {
		if o.Kind != nft.OpConflict {
			add(KindNftables, fmt.Sprint(o.Family, " ", o.Table))
		}
	}
	for _, o := range p.Sysctl.Ops {
		if o.Kind == sysctl.OpSet {
			add(KindSysctl, o.Key)
		}
	}
	out := make(map[string]int, len(seen))
	for k, objs := range seen {
		out[k] = len(objs)
	}
	return out
}
