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
	"net/netip"
	"strings"

	"github.com/nodeagent/nodeagent/netcfg/arp"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/host"
	"github.com/nodeagent/nodeagent/netcfg/link"
)

// Desired is the desired state of every subsystem.
type Desired struct {
	Link link.Desired
}

// FromConfig derives the desired state from a validated config.
func FromConfig(c *config.Config) (Desired, error) {
	var d Desired
	var errs []error
	prefixes := func(owner string, ss []string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: address %q: %w", owner, s, err))
				continue
			}
			out = append(out, p)
		}
		return out
	}
	for _, v := range c.VLANs {
		d.Link.Links = append(d.Link.Links, link.Link{
			Name: v.Name, Kind: link.VLAN, Parent: v.Parent, VLANID: v.ID, MTU: v.MTU,
			Up: v.IsUp(), Addrs: prefixes(v.Name, v.Addresses), Adopt: v.Adopt,
		})
	}
	for _, m := range c.Macvlans {
		mode := m.Mode
		if mode == "" {
			mode = "bridge"
		}
		d.Link.Links = append(d.Link.Links, link.Link{
			Name: m.Name, Kind: link.Macvlan, Parent: m.Parent, Mode: mode, MTU: m.MTU,
			Up: m.IsUp(), Addrs: prefixes(m.Name, m.Addresses), Adopt: m.Adopt,
		})
	}
	if !c.DAD.Disabled {
		d.Link.DAD = &arp.Config{
			Probes: c.DAD.Probes, Interval: c.DAD.Interval, Wait: c.DAD.Wait,
			Announcements: c.DAD.Announcements,
		}
	}
	return d, errors.Join(errs...)
}

// Converger converges one namespace.
type Converger struct {
	Host *host.Host
	Log  *slog.Logger
}

// Plans holds one plan per subsystem.
type Plans struct {
	Link link.Plan
}

// Empty reports whether no subsystem has anything to do.
func (p Plans) Empty() bool { return p.Link.Empty() }

// String is the dry-run text of every subsystem, one line per object.
func (p Plans) String() string {
	var b strings.Builder
	b.WriteString(p.Link.String())
	return b.String()
}

// Plan observes the kernel and returns what a sync would change.
func (c *Converger) Plan(ctx context.Context, d Desired) (Plans, error) {
	var p Plans
	lo, err := link.Observe(ctx, c.Host, d.Link)
	if err != nil {
		return p, fmt.Errorf("links: %w", err)
	}
	p.Link = link.MakePlan(d.Link, lo)
	return p, nil
}

// Sync observes, plans and applies every subsystem once. The plans are
// returned so callers can show what was done.
func (c *Converger) Sync(ctx context.Context, d Desired) (Plans, error) {
	p, err := c.Plan(ctx, d)
	if err != nil {
		return p, err
	}
	if p.Empty() {
		return p, nil
	}
	for _, o := range p.Link.Ops {
		c.log().Info("change", "subsystem", "link", "op", o.String())
	}
	if _, err := link.Apply(ctx, c.Host, p.Link); err != nil {
		return p, fmt.Errorf("links: %w", err)
	}
	return p, nil
}

// Teardown removes everything nodeagent owns, in the reverse order of
// creation. Foreign objects are never touched.
func (c *Converger) Teardown(ctx context.Context) (Plans, error) {
	return c.Sync(ctx, Desired{})
}

func (c *Converger) log() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}
