package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/nodeagent/nodeagent/netcfg/config"
)

// FromConfig derives the nftables subsystem's desired state. The config
// is validated already; what fails here is reported, not assumed away.
// Prefixes are masked, so that a source compares as the kernel holds it.
func FromConfig(c config.Firewall) (Desired, error) {
	var d Desired
	var errs []error
	prefix := func(path, s string) (netip.Prefix, bool) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			return p, false
		}
		return p.Masked(), true
	}
	for i, m := range c.Masquerade {
		if p, ok := prefix(fmt.Sprintf("firewall.masquerade[%d].from", i), m.From); ok {
			d.Masquerade = append(d.Masquerade, Masquerade{From: p, Out: m.Out})
		}
	}
	for i, s := range c.SNAT {
		p, ok := prefix(fmt.Sprintf("firewall.snat[%d].from", i), s.From)
		to, err := netip.ParseAddr(s.To)
		if err != nil {
			errs = append(errs, fmt.Errorf("firewall.snat[%d].to: %w", i, err))
			continue
		}
		if ok {
			d.SNAT = append(d.SNAT, SNAT{From: p, Out: s.Out, To: to})
		}
	}
	for _, f := range c.Forward {
		d.Forward = append(d.Forward, Forward{In: f.In, Out: f.Out})
	}
	for i, k := range c.KillSwitch {
		if p, ok := prefix(fmt.Sprintf("firewall.killSwitch[%d].from", i), k.From); ok {
			d.KillSwitch = append(d.KillSwitch, KillSwitch{From: p, AllowOut: slices.Clone(k.AllowOut)})
		}
	}
	d.MSSClamp = slices.Clone(c.MSSClamp)
	return d, errors.Join(errs...)
}
