package config

import (
	"net/netip"
	"slices"
	"strings"
)

// piaRouting checks what a PIA device sends through its tunnel against
// the routing, once the whole config is known: its portForward.to, and
// each of its dns.for prefixes, must sit in a source routed through that
// device's kill-switch table (a rule from a prefix holding it, to a
// kill-switch table with a route by the device). Anywhere else, replies
// to the forwarded port would not leave by the tunnel, and DNS sent to
// PIA's resolver would leave by the uplink in plaintext.
//
// The check follows from the rest of the file, so it holds back while the
// file has a root cause to fix first: a key or value that did not decode
// (killswitch: for killSwitch, routng: for routing) or an error in the
// routing or in the device's name or pia section. Otherwise it would
// report the consequence above its cause, which sits further down.
func (v *validator) piaRouting(c *Config) {
	if len(v.bad) > 0 || v.unknownField() || v.failedUnder("routing") {
		return
	}
	for i, w := range c.WireGuard {
		if w.PIA == nil {
			continue
		}
		if wp := indexPath("wireguard", i); v.failedUnder(fieldPath(wp, "name")) || v.failedUnder(fieldPath(wp, "pia")) {
			continue
		}
		tables := map[int]bool{}
		for _, t := range c.Routing.Tables {
			if t.KillSwitch && slices.ContainsFunc(t.Routes, func(r Route) bool { return r.Dev == w.Name }) {
				tables[t.ID] = true
			}
		}
		var via []string
		var routed []netip.Prefix
		for _, r := range c.Routing.Rules {
			if !tables[r.Table] || r.From == "" {
				continue
			}
			via = append(via, r.From)
			if p, err := netip.ParsePrefix(r.From); err == nil {
				routed = append(routed, p.Masked())
			}
		}
		where := "no routing.rules send any source to a killSwitch table with a route by " + w.Name
		if len(via) > 0 {
			where = "the sources routed through " + w.Name + "'s kill-switch table are " + strings.Join(via, ", ")
		}
		holds := func(q netip.Prefix) bool {
			return slices.ContainsFunc(routed, func(p netip.Prefix) bool { return p.Bits() <= q.Bits() && p.Contains(q.Addr()) })
		}
		pp := fieldPath(indexPath("wireguard", i), "pia")
		if to, err := netip.ParseAddr(w.PIA.PortForward.To); err == nil && !holds(netip.PrefixFrom(to, to.BitLen())) {
			v.errorf(fieldPath(fieldPath(pp, "portForward"), "to"),
				"%s is not in a subnet routed through the tunnel (%s): replies to the forwarded port would not leave by it", to, where)
		}
		for j, s := range w.PIA.DNS.For {
			if q, err := netip.ParsePrefix(s); err == nil && q.Addr().Is4() && !holds(q.Masked()) {
				v.errorf(indexPath(fieldPath(fieldPath(pp, "dns"), "for"), j),
					"%s is not within a source routed through the tunnel (%s): its DNS, sent to PIA's resolver, would leave by the uplink in plaintext", s, where)
			}
		}
	}
}

// failedUnder reports whether an error has been recorded at path or below.
func (v *validator) failedUnder(path string) bool {
	for _, e := range v.errs {
		if e.Field == path || strings.HasPrefix(e.Field, path+".") || strings.HasPrefix(e.Field, path+"[") {
			return true
		}
	}
	return false
}

// unknownField reports whether an unknown key was found (the error list
// holds it; it is capped, and a capped list has other errors to fix first).
func (v *validator) unknownField() bool {
	for _, e := range v.errs {
		if strings.HasPrefix(e.Msg, "unknown field") {
			return true
		}
	}
	return false
}
